"""The offline built-in model ``omem/extractive``, called through litellm like any model."""

from __future__ import annotations

from datetime import date

import litellm
import pytest

import omem_core
from omem_core.extractive.algorithm import annotate_relative_dates, estimate_tokens, reflect, resolve_relative, tidy
from omem_core.prompts import OBSERVER_PROMPT, REFLECTOR_PROMPT, render_observer_input

from conftest import T0, msg

SEGMENT = [
    msg(0, "Caroline: I went to the LGBTQ support group yesterday and it was so powerful."),
    msg(1, "Melanie: Wow, that's great! Thanks for sharing."),
    msg(2, "Caroline: I'm planning to study counseling at Boston University next month. My budget is $12,000."),
    msg(3, "Melanie: Cool!"),
    msg(4, "Caroline: My dog Max turned 3 last Friday."),
]


async def call(content: str) -> litellm.ModelResponse:
    return await litellm.acompletion(
        model=omem_core.OFFLINE_MODEL,
        messages=[{"role": "system", "content": OBSERVER_PROMPT.text}, {"role": "user", "content": content}],
    )


async def test_a_message_of_emoji_alone_is_noted_as_it_was_said() -> None:
    """It was noted as "- User: ." (its content gone), though a segment is never left without a note."""
    response = await call(render_observer_input([msg(0, "🎉🎉🎉 " * 30)], target_tokens=40))
    bullet = response.choices[0].message.content.splitlines()[-1]
    assert bullet.startswith("- User: 🎉🎉🎉")


async def test_observer_keeps_names_numbers_and_resolves_dates() -> None:
    response = await call(render_observer_input(SEGMENT, target_tokens=120))
    text = response.choices[0].message.content
    assert "Boston University" in text and "$12,000" in text and "Max" in text
    assert "yesterday (29 February 2024)" in text  # T0 is 1 March 2024 (leap year)
    assert "last Friday (23 February 2024)" in text
    assert "Cool!" not in text and "Thanks for sharing" not in text  # filler dropped
    lines = text.splitlines()
    assert lines[0] == "1 March 2024"  # one date heading, then a bullet per message
    assert all(line.startswith("- Caroline: ") for line in lines[1:])
    assert response.usage.prompt_tokens > response.usage.completion_tokens > 0
    assert response._hidden_params.get("response_cost") == 0.0


async def test_deterministic_byte_for_byte() -> None:
    content = render_observer_input(SEGMENT, target_tokens=60)
    first = (await call(content)).choices[0].message.content
    second = litellm.completion(model="omem/extractive", messages=[{"role": "user", "content": content}])
    assert first == second.choices[0].message.content


async def test_observer_respects_target_length() -> None:
    long = [msg(i, f"Speaker{i % 3}: Fact number {i} about Project Apollo costs {i * 100} dollars. " * 3) for i in range(40)]
    content = render_observer_input(long, target_tokens=150)
    text = (await call(content)).choices[0].message.content
    assert estimate_tokens(text) <= 150 + 10


def test_reflector_deduplicates_newest_wins_and_fits() -> None:
    reflection = "1 May 2023\n- Ann: Ann lives in Paris with her cat Tom.\n2 May 2023\n- Ann: Ann likes jazz."
    notes = "- (9 June 2023) Ann: Ann lives in Paris with her cat Tom and her dog Rex.\n10 June 2023\n- Ann: Ann likes jazz."
    merged = reflect(reflection, notes, 500)
    assert merged.splitlines() == [
        "9 June 2023",
        "- Ann: Ann lives in Paris with her cat Tom and her dog Rex.",
        "10 June 2023",
        "- Ann: Ann likes jazz.",
    ]
    many = "\n".join(f"- ({i % 28 + 1} May 2023) Bob: Bob bought item {i} for {i} dollars in Rome." for i in range(200))
    tight = reflect("", many, 300)
    assert estimate_tokens(tight) <= 300
    assert tight.count("\n") >= 10  # kept as many bullets as fit


async def test_reflector_through_litellm_routes_on_layout() -> None:
    from omem_core.prompts import render_reflector_input
    from omem_core import ObservationRecord

    obs = [ObservationRecord(id=f"o{i}", thread_id="t", resource_id=None, created_at=T0, kind="observation",
                             source_ids=("m",), text=f"1 March 2024\n- Ann: note {i} about Rome.") for i in range(3)]
    content = render_reflector_input(None, obs, target_tokens=500)
    response = await litellm.acompletion(model="omem/extractive",
                                         messages=[{"role": "system", "content": REFLECTOR_PROMPT.text},
                                                   {"role": "user", "content": content}])
    assert response.choices[0].message.content.count("note") == 3


async def test_unknown_offline_model_is_a_clear_error() -> None:
    with pytest.raises(Exception, match="omem/extractive"):
        await litellm.acompletion(model="omem/abstractive", messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "phrase, expected",
    [
        ("yesterday", "29 February 2024"),
        ("tomorrow", "2 March 2024"),
        ("last week", "the week of 23 February 2024"),
        ("next month", "April 2024"),
        ("last year", "2023"),
        ("last Friday", "23 February 2024"),  # 1 March 2024 is a Friday
        ("next Friday", "8 March 2024"),
        ("this Sunday", "3 March 2024"),
        ("last weekend", "the weekend of 24 February 2024"),
    ],
)
def test_relative_dates(phrase: str, expected: str) -> None:
    assert resolve_relative(phrase, date(2024, 3, 1)) == expected


def test_n_units_ago() -> None:
    assert annotate_relative_dates("I moved here 3 years ago.", date(2024, 3, 1)) == "I moved here 3 years ago (2021)."
    assert annotate_relative_dates("two days ago we met", date(2024, 3, 1)) == "two days ago (28 February 2024) we met"


async def test_the_offline_model_drives_the_wrapper_end_to_end() -> None:
    store = omem_core.create_observational_memory_store(
        observer="omem/extractive", reflector="omem/extractive", thresholds={"observation": 60, "reflection": 80}
    )
    memory = omem_core.Memory(store, last_messages=3)
    for i in range(60):
        await memory.save_messages([msg(i, f"Speaker: On day {i} I visited museum number {i} in Vienna with Clara.")])
        await memory.recall("t")
    records = await store.observations.list("t")
    assert {r.kind for r in records} == {"observation", "reflection"}
    context = await memory.recall("t")
    assert context[0].role == "system" and "Vienna" in context[0].content


@pytest.mark.parametrize(
    ("sentence", "expected"),
    [
        ("Oh wow, I went to Paris yesterday!", "I went to Paris yesterday!"),
        ("BTW, Yeah, my dog is called Max.", "My dog is called Max."),
        ("Cheers! [shares an image: a photo of two glasses of champagne]", "Cheers! [image: two glasses of champagne]"),
        ("Love it 😍 so much", "Love it so much"),
        ("Just like you!🌟 [shares an image: a photography of a book]", "Just like you! [image: a book]"),
        ("Oh wow!", "Oh wow!"),  # nothing would be left: kept as is
        ("Well-known bakers sell bread.", "Well-known bakers sell bread."),  # a word, not an opener
        # an emoji sequence goes whole: no zero-width joiner, skin tone, flag or keycap is left
        ("We hiked 🏃🏽\u200d♀️ for 1️⃣ day 👨\u200d👩\u200d👧 in 🇵🇹 Sintra", "We hiked for 1 day in Sintra"),
        ("नमस\u200dते Ravi", "नमस\u200dते Ravi"),  # a joiner inside a word of another script stays
        # found by a walkthrough: "two cats ." and, for emoji alone, "."
        ("I live in Tokyo 🗼 and I have two cats 🐱🐱.", "I live in Tokyo and I have two cats."),
        ("So fun 🎉, right?", "So fun, right?"),
        ("🎉🎉🎉 🎉🎉🎉", "🎉🎉🎉 🎉🎉🎉"),  # what was said, kept: nothing else would be left
    ],
)
def test_tidy_drops_openers_emoji_and_caption_boilerplate(sentence: str, expected: str) -> None:
    assert tidy(sentence) == expected


def test_reflector_reads_markdown_date_headings_a_real_model_may_write() -> None:
    notes = "## 8 May 2023\n- Ann: moved to Oslo.\n**9 May 2023**\n- Bob: has 3 cats."
    assert reflect("", notes, 100) == "8 May 2023\n- Ann: moved to Oslo.\n9 May 2023\n- Bob: has 3 cats."


def test_the_offline_models_cache_version_follows_what_its_answers_depend_on() -> None:
    """Found by a review: the cache key's digest covered the model's package only; switching a
    heuristic off (the bench's ablations) or running without the word-rarity vocabulary changes
    its answers for the same input, and the cache served one for the other."""
    from omem_core.extractive import algorithm

    before = algorithm.code_version()
    algorithm.DISABLED.add("pleasantries")
    try:
        assert algorithm.code_version() != before
    finally:
        algorithm.DISABLED.discard("pleasantries")
    assert algorithm.code_version() == before
