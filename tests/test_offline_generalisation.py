"""Round 2 of the offline model ``omem/extractive``: behaviour that must hold on conversations it
has never seen (conversations written here, called through litellm like production).

Each test fails when the heuristic it covers is switched off (``algorithm.DISABLED``) or broken.
"""

from __future__ import annotations

from datetime import timedelta

import litellm
import pytest

import omem_core
from omem_core import Message
from omem_core.extractive import algorithm
from omem_core.extractive.algorithm import reflect, split_sentences, tidy
from omem_core.prompts import OBSERVER_PROMPT, render_message_line, render_observer_input

from conftest import T0


def line(i: int, role: str, content: str) -> Message:
    return Message(id=f"m{i}", thread_id="t", role=role, content=content, created_at=T0 + timedelta(minutes=i))


async def observe(messages: list[Message], target: int) -> str:
    response = await litellm.acompletion(
        model="omem/extractive",
        messages=[{"role": "system", "content": OBSERVER_PROMPT.text},
                  {"role": "user", "content": render_observer_input(messages, target_tokens=target)}],
    )
    return response.choices[0].message.content


@pytest.fixture(autouse=True)
def all_heuristics_on():
    algorithm.DISABLED.clear()
    yield
    algorithm.DISABLED.clear()


# Two people in a two-person chat, saying facts of the same shape; the loaders give the second
# one the ``assistant`` role.
FACTS_A = ["I keep a cello in the attic.", "I grow basil on the balcony.", "I knit scarves for the winter market.",
           "I ride a tandem bike with my cousin.", "I collect postcards from harbour towns."]
FACTS_B = ["I keep a banjo in the garage.", "I grow tomatoes in the greenhouse.", "I sew quilts for the spring fair.",
           "I paddle a kayak with my neighbour.", "I collect stamps from mountain villages."]


def kept(text: str, facts: list[str]) -> int:
    return sum(1 for fact in facts if fact.rstrip(".") in text)


async def test_both_speakers_of_a_human_chat_weigh_alike() -> None:
    chat = [line(2 * i + k, role, f"{name}: {facts[i]}")
            for i in range(5) for k, (role, name, facts) in enumerate((("user", "Ann", FACTS_A), ("assistant", "Bea", FACTS_B)))]
    text = await observe(chat, 45)
    a, b = kept(text, FACTS_A), kept(text, FACTS_B)
    assert 0 < a + b < 10  # the target forces a choice
    assert abs(a - b) <= 1, text
    swapped = [line(i, "assistant" if m.role == "user" else "user", m.content) for i, m in enumerate(chat)]
    assert await observe(swapped, 45) == text  # the role changes nothing


async def test_lower_case_speaker_names_are_speakers() -> None:
    chat = [line(0, "user", "elise: I adopted a greyhound called Biscuit."),
            line(1, "assistant", "marc: My sister moved to Lisbon in June."),
            line(2, "user", "elise: Biscuit sleeps on the sofa all day.")]
    text = await observe(chat, 200)
    bullets = [row for row in text.splitlines() if row.startswith("- ")]
    assert bullets and all(row.startswith(("- elise: ", "- marc: ")) for row in bullets), text
    assert "Assistant" not in text and "User" not in text


async def test_a_capitalised_label_word_is_not_a_speaker_unless_it_repeats() -> None:
    chat = [line(0, "user", "My sister Anika visits on 14 July, she is allergic to peanuts."),
            line(1, "assistant", "Noted: plan peanut-free meals while Anika is in town.")]
    text = await observe(chat, 200)
    assert "- Assistant: Noted: plan peanut-free meals" in text and "- Noted:" not in text, text
    # the same word starting several messages of a segment is someone's name after all
    chat = [line(0, "user", "Update: the flight to Oslo moved to Friday."),
            line(1, "assistant", "Update: the hotel in Bergen is booked.")]
    text = await observe(chat, 200)
    assert "- Update: The flight to Oslo moved to Friday." in text, text


async def test_a_lone_label_in_an_ordinary_chat_stays_text() -> None:
    chat = [line(0, "user", "note: the build server in Oslo is down since Monday."), line(1, "assistant", "Noted, thanks.")]
    text = await observe(chat, 200)
    assert "- User: Note: the build server" in text  # the label kept as text (capitalised like any sentence)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("We met on Clinton St. in the rain. It was late.", ["We met on Clinton St. in the rain.", "It was late."]),
        ("I asked Dr. Patel about it. She agreed.", ["I asked Dr. Patel about it.", "She agreed."]),
        ("My plan: 1. Rent a van. 2. Pack the books. 3. Drive north.",
         ["My plan: 1. Rent a van.", "2. Pack the books.", "3. Drive north."]),
        ("J. R. R. Tolkien is my favourite.", ["J. R. R. Tolkien is my favourite."]),
        ("I turned 30. Then I moved to Leeds.", ["I turned 30.", "Then I moved to Leeds."]),
        ("It is No. 5 on the list. No. I never went.", ["It is No. 5 on the list.", "No.", "I never went."]),
        ("The U.S. Open starts soon. Tickets sold out.", ["The U.S. Open starts soon.", "Tickets sold out."]),
        ("first line / second line", ["first line", "second line"]),
        # capitals of any script (a Russian message was one sentence: its note kept it whole, three
        # times over its target)
        ("Маша живёт в Порту. Она работает в порту. Ей 34 года!",
         ["Маша живёт в Порту.", "Она работает в порту.", "Ей 34 года!"]),
        ("Élise est partie. Émile reste ici. ¿Vienes? Sí.", ["Élise est partie.", "Émile reste ici.", "¿Vienes?", "Sí."]),
        ("Wait. then it rained.", ["Wait. then it rained."]),  # (a lower-case letter starts no sentence)
        ("ذهبت إلى السوق. اشتريت خبزا.", ["ذهبت إلى السوق.", "اشتريت خبزا."]),  # (a script without case)
        ("See note. ¹ Footnote. ① Then.", ["See note. ¹ Footnote. ① Then."]),
    ],
)
def test_sentences_split_around_abbreviations_initials_and_list_numbers(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


async def test_a_message_in_another_script_is_cut_to_its_target_by_sentences() -> None:
    content = ("Моя сестра Мария живёт в Порту и работает инженером. Она переехала туда в прошлом году. "
               "По выходным она играет на скрипке в оркестре. Её собаку зовут Бублик.")
    assert content in await observe([line(0, "user", content)], 10_000)
    cut = (await observe([line(0, "user", content)], 25)).split("- User: ", 1)[1]
    assert cut.endswith(".") and len(cut) < len(content) / 2 and cut in content  # whole sentences left out
    # Chinese and Japanese, with no space between words, are kept or left a message at a time
    japanese = "私の姉は大阪に住んでいます。姉は毎朝公園を走ります。"
    assert japanese in await observe([line(0, "user", japanese)], 10_000)


async def test_an_abbreviation_does_not_cut_a_kept_sentence() -> None:
    text = await observe([line(0, "user", "Ann: I opened a bakery on Clinton St. Louis helped me paint it.")], 200)
    assert "I opened a bakery on Clinton St. Louis helped me paint it." in text


@pytest.mark.parametrize(
    ("sentence", "expected"),
    [
        ("Great job on the cake!", "Great job on the cake!"),
        ("Well done on the race.", "Well done on the race."),
        ("So much fun at the lake!", "So much fun at the lake!"),
        ("Great, I finally sold the car.", "I finally sold the car."),
        ("Oh I finally sold the car.", "I finally sold the car."),
    ],
)
def test_openers_go_only_when_they_are_openers(sentence: str, expected: str) -> None:
    assert tidy(sentence) == expected


async def test_specific_common_nouns_beat_generic_chatter() -> None:
    chat = [line(0, "user", "Ann: It was really a great time, we had so much fun and everyone felt happy together."),
            line(1, "assistant", "Bea: I practise violin and cook lasagna with sage.")]
    text = await observe(chat, 20)
    assert "violin" in text and "great time" not in text, text


async def test_pleasantries_are_not_notes_but_a_segment_of_them_still_gets_one() -> None:
    chat = [line(0, "user", "Ann: See ya later!"), line(1, "assistant", "Bea: Take care, talk soon!"),
            line(2, "user", "Ann: My cousin Theo starts at the conservatory in Ghent next month.")]
    text = await observe(chat, 200)
    assert "See ya" not in text and "Take care" not in text and "Theo" in text
    only = await observe(chat[:2], 200)
    assert only.strip() and ("See ya" in only or "Take care" in only)


@pytest.mark.parametrize("content", ["ok", "!!!", "🙂", "See ya later!", "?", "   ", "haha lol"])
async def test_never_empty_for_a_non_empty_segment(content: str) -> None:
    assert (await observe([line(0, "user", content), line(1, "assistant", content)], 48)).strip()


def test_reflection_keeps_old_and_new_notes_alike() -> None:
    towns = ["Arles", "Bergen", "Cadiz", "Dover", "Evora", "Faro", "Ghent", "Hull", "Ibiza", "Jena", "Kiel", "Lund",
             "Metz", "Nice", "Oban", "Pula", "Riga", "Sion", "Tours", "Ulm", "Vigo", "Wick", "Ypres", "Zadar"]
    things = ["kettle", "lamp", "rug", "clock", "vase", "chair", "desk", "mirror", "quilt", "bench", "stool", "crate",
              "basket", "easel", "loom", "piano", "sofa", "trunk", "drum", "globe", "harp", "kayak", "sled", "tent"]
    old = "\n".join(f"{i + 1} May 2023\n- Ann: Ann bought a {things[i]} in {towns[i]}." for i in range(12))
    new = "\n".join(f"{i + 1} June 2023\n- Ann: Ann bought a {things[i]} in {towns[i]}." for i in range(12, 24))
    merged = reflect(old, new, 140)
    kept_old = sum(1 for i in range(12) if towns[i] in merged)
    kept_new = sum(1 for i in range(12, 24) if towns[i] in merged)
    assert 4 <= kept_old + kept_new < 24
    assert abs(kept_old - kept_new) <= 1, merged
    assert all(row.startswith(("- ", "1", "2", "3", "4", "5", "6", "7", "8", "9")) for row in merged.splitlines())


def test_notes_stay_dated_sentences() -> None:
    chat = [line(i, "user" if i % 2 == 0 else "assistant", f"{'Ann' if i % 2 == 0 else 'Bea'}: {fact}")
            for i, fact in enumerate(FACTS_A + FACTS_B)]
    text = litellm.completion(model="omem/extractive", messages=[
        {"role": "user", "content": render_observer_input(chat, target_tokens=60)}]).choices[0].message.content
    rows = text.splitlines()
    assert rows[0] == "1 March 2024"
    assert all(row.startswith(("- Ann: ", "- Bea: ")) and row.endswith(".") for row in rows[1:])


def test_offline_model_is_registered() -> None:
    assert omem_core.OFFLINE_MODEL == "omem/extractive"


# -- round 2, second pass: clauses, word rarity, context ----------------------------------------


@pytest.mark.parametrize(
    ("sentence", "pieces"),
    [
        ("I ran a charity race in Leeds last Saturday – it was long and exhausting.",
         ["I ran a charity race in Leeds last Saturday", "it was long and exhausting."]),
        ("I moved the piano upstairs, but it still sounds out of tune.",
         ["I moved the piano upstairs", "it still sounds out of tune."]),
        # no subject of its own after the mark: one piece, so no fragment reads on its own
        ("This necklace is special to me - a gift from my grandma in Sweden.",
         ["This necklace is special to me - a gift from my grandma in Sweden."]),
        ("I started running again - which clears my head before work.",
         ["I started running again - which clears my head before work."]),
        ("We bought bread, cheese, and apples for the picnic.", ["We bought bread, cheese, and apples for the picnic."]),
        ("It rained (we stayed in; it was cold) all weekend.", ["It rained (we stayed in; it was cold) all weekend."]),
    ],
)
def test_clauses_split_only_where_each_reads_on_its_own(sentence: str, pieces: list[str]) -> None:
    assert [clause for _, clause in algorithm.split_clauses(sentence)] == pieces
    assert "".join(separator + clause for separator, clause in algorithm.split_clauses(sentence)) == sentence


async def test_a_clause_is_kept_without_the_rest_of_its_sentence() -> None:
    chat = [line(0, "user", "Ann: I ran a charity race in Leeds last Saturday – it was long and hard and tiring but "
                            "good fun overall for everyone who came along."),
            line(1, "assistant", "Bea: My brother Piotr fixes old radios in Gdansk.")]
    text = await observe(chat, 30)
    assert "- Ann: I ran a charity race in Leeds last Saturday" in text and "tiring" not in text, text
    assert all(row.endswith(".") for row in text.splitlines() if row.startswith("- ")), text


def test_rarer_words_weigh_more() -> None:
    assert algorithm.rarity("time") < algorithm.rarity("journal") < algorithm.rarity("violin") < algorithm.rarity("kundalini")
    assert algorithm.word_weights("a good time with the violin")["violin"] > algorithm.word_weights("a good time")["time"]


async def test_a_sentence_of_specific_words_beats_one_of_common_words_of_the_same_length() -> None:
    # Three content words each, the same number of characters; the common one first (it would win a tie).
    common = "Ann: We painted the house and the school."
    specific = "Bea: We painted the yurts and the kayaks."
    assert len(common) - len(common.split(":")[0]) == len(specific) - len(specific.split(":")[0])
    text = await observe([line(0, "user", common), line(1, "assistant", specific)], 12)
    assert "yurts" in text and "house" not in text, text


@pytest.mark.parametrize(
    ("sentences", "expected"),
    [
        (["We played the final in Hull.", "We won it by a tight score."], ["We played the final in Hull. We won it by a tight score."]),
        (["I baked a lemon cake.", "That was the best part."], ["I baked a lemon cake. That was the best part."]),
        (["I baked a lemon cake.", "Did you like it?"], ["I baked a lemon cake.", "Did you like it?"]),  # a question stays apart
        (["It rained all day in Bergen."], ["It rained all day in Bergen."]),  # nothing before it in the message
        (["I baked a lemon cake.", "My sister Ines brought the plates and the candles for it."],
         ["I baked a lemon cake.", "My sister Ines brought the plates and the candles for it."]),  # long: says enough alone
    ],
)
def test_a_short_sentence_pointing_back_keeps_what_it_points_to(sentences: list[str], expected: list[str]) -> None:
    assert algorithm.with_context(sentences) == expected


async def test_a_note_never_keeps_it_without_what_it_is() -> None:
    # The first sentence is said elsewhere too, so alone "We won it …" would be the cheap new fact.
    chat = [line(0, "assistant", "Bea: Our team played the regional final in Hull on Sunday."),
            line(1, "user", "Ann: Our team played the regional final in Hull on Sunday. We won it by a tight score.")]
    text = await observe(chat, 30)
    assert all("Sunday. We won it" in row for row in text.splitlines() if "We won it" in row), text


def test_a_reflection_of_notes_that_add_little_is_never_empty() -> None:
    assert reflect("", "1 May 2023\n- User: Ann.", 5).strip()
    assert reflect("1 May 2023\n- User: Ok.", "2 May 2023\n- Assistant: Fine.", 3).strip()


def test_pointing_back_joins_one_sentence_not_a_chain() -> None:
    assert algorithm.with_context(["I baked a cake.", "It was sweet.", "It was tart.", "It was big."]) == [
        "I baked a cake. It was sweet.", "It was tart. It was big."]


def test_words_with_accents_are_words() -> None:
    assert algorithm.content_words("Zürich café Inês") == ["zürich", "café", "inês"]
    assert "zürich" in algorithm.word_weights("We moved to Zürich in May") and algorithm.word_weights(
        "We moved to Zürich in May")["zürich"] == 2.5  # a name, not the fragment "rich"


async def test_a_joined_sentence_loses_its_opener_too() -> None:
    text = await observe([line(0, "user", "Ann: I'm a big fan of pottery in Leeds. Plus, making it is so calming.")], 200)
    assert "pottery in Leeds. Making it is so calming." in text and "Plus" not in text, text


def test_observe_can_be_told_what_each_word_is_worth() -> None:
    # The research hook behind the bench's answer-aware line: the same selection, other weights.
    block = "\n".join(render_message_line(m) for m in [
        line(0, "user", "Ann: We painted the yurts and the kayaks in Oslo."),
        line(1, "assistant", "Bea: I play the violin."),
    ])
    default = algorithm.observe(block, 12)
    told = algorithm.observe(block, 12, weigh=lambda sentence: {"violin": 10.0} if "violin" in sentence else {})
    assert "yurts" in default and "violin" not in default, default
    assert "violin" in told and "yurts" not in told, told
