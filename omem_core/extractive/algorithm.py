"""The offline compaction baseline: salience-scored sentence extraction.

This is a deterministic, model-free baseline, not a language model. It cannot paraphrase,
infer or answer; it keeps the sentences that look most informative and tidies them:

* **observe**: split each message into sentences and clauses (a clause that starts with its own
  subject), tidy them (openers, emoji, caption boilerplate), keep a short sentence that points
  back with the one before it, and keep the pieces that add the most new information per token
  within the target length — each content word counts once, names and numbers most, common
  English words least (:func:`rarity`), questions and pleasantries down, whoever said them — as
  dated bullets under ``8 May 2023`` headings, ``- Caroline: …``, in conversation order;
  relative dates ("yesterday", "last Friday", "two weeks ago") get the absolute date from the
  message's timestamp appended in parentheses;
* **reflect**: merge the current reflection's bullets with the new notes, drop near-duplicates
  (the newer wording wins), then, when the result is over the target length, keep the clauses
  that add the most new information per token the same way, old and new notes alike.

It writes a note for every segment that has a message (the most salient sentence when none
clears the bar, the message's first words when it has no sentence), and reflects any non-empty
notes into a non-empty reflection: a short or odd message can never leave it with nothing to say.
It reads the layout by its outermost tags and its last ``Target length`` line, and restores the
text that :func:`omem_core.prompts.escape_structure` escaped, so message text cannot confuse it.

Same input, same output, byte for byte.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import re
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from collections.abc import Callable

from ..planning import OMISSION
from ..tokens import _encoding
from .lexicon import ABBREVIATIONS, FILLER_WORDS, GENERIC_WORDS, LABEL_WORDS, MONTHS, STOP_WORDS, WEEKDAYS

#: Heuristics switched off, by name (empty in normal use). Only ``bench/bench_quality.py
#: --ablation`` sets it, to measure what each heuristic is worth; see docs/offline-model.md.
DISABLED: set[str] = set()


def on(name: str) -> bool:
    return name not in DISABLED

_HEADER = re.compile(
    r"^\[(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})[^\]]*\]\s+(?P<role>[a-z]+):\s?(?P<content>.*)$"
)
_SPEAKER = re.compile(r"^(?P<name>[A-Z][\w'’.-]*(?: [A-Z][\w'’.-]*){0,2}):\s+(?P<rest>.+)$")
_WORD = re.compile(r"[^\W\d_](?:[^\W\d_]|['’-])*|\d+(?:[.,:/]\d+)*")  # "Zürich", "Inês", "mom's", 4.5
_TARGET = re.compile(r"Target length: at most (\d+) tokens")
_BULLET = re.compile(r"^-\s+(?:\((?P<date>[^)]*)\)\s+)?(?P<body>.+)$")
_DATE_HEADING = re.compile(r"^(?:#+\s*)?(?:\*\*)?(?P<date>\d{1,2} [A-Z][a-z]+ \d{4}):?(?:\*\*)?:?$")


def estimate_tokens(text: str) -> int:
    return -(-len(text) // 4)


def content_words(text: str) -> list[str]:
    return [w for w in (t.lower() for t in _WORD.findall(text)) if w not in STOP_WORDS]


def human_date(day: date) -> str:
    return f"{day.day} {MONTHS[day.month - 1].capitalize()} {day.year}"


# -- relative dates -------------------------------------------------------------------------

_NUMBER_WORDS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "a couple of": 2, "a few": 3, "few": 3,
}
_RELATIVE = re.compile(
    r"\b(?P<phrase>yesterday|today|tonight|this morning|this afternoon|this evening|tomorrow"
    r"|last night|(?:last|next|this) (?:week|weekend|month|year)"
    r"|(?:last|next|this) (?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
    r"|(?P<n>\d+|a couple of|a few|few|an?|one|two|three|four|five|six|seven|eight|nine|ten)"
    r" (?P<unit>day|week|month|year)s? ago)\b",
    re.IGNORECASE,
)


def _shift_month(day: date, months: int) -> tuple[int, int]:
    index = day.year * 12 + day.month - 1 + months
    return index // 12, index % 12 + 1


def resolve_relative(phrase: str, anchor: date, n: str | None = None, unit: str | None = None) -> str:
    """The absolute date (or period) a relative phrase means on ``anchor``."""
    p = phrase.lower()
    if p in ("yesterday", "last night"):
        return human_date(anchor - timedelta(days=1))
    if p in ("today", "tonight", "this morning", "this afternoon", "this evening"):
        return human_date(anchor)
    if p == "tomorrow":
        return human_date(anchor + timedelta(days=1))
    if unit is not None and n is not None:
        count = int(n) if n.isdigit() else _NUMBER_WORDS.get(n.lower(), 1)
        unit = unit.lower()
        if unit == "day":
            return human_date(anchor - timedelta(days=count))
        if unit == "week":
            return f"the week of {human_date(anchor - timedelta(weeks=count))}"
        if unit == "month":
            y, m = _shift_month(anchor, -count)
            return f"{MONTHS[m - 1].capitalize()} {y}"
        return str(anchor.year - count)
    which, _, what = p.partition(" ")
    step = {"last": -1, "next": 1, "this": 0}[which]
    if what in WEEKDAYS:
        target = WEEKDAYS.index(what)
        delta = target - anchor.weekday()
        if step < 0:
            delta = delta - 7 if delta >= 0 else delta
        elif step > 0:
            delta = delta + 7 if delta <= 0 else delta
        return human_date(anchor + timedelta(days=delta))
    if what == "week":
        return f"the week of {human_date(anchor + timedelta(weeks=step))}"
    if what == "weekend":
        saturday = anchor + timedelta(days=(5 - anchor.weekday()) % 7)
        if step < 0:
            saturday -= timedelta(days=7)
        elif step > 0 and saturday - anchor < timedelta(days=2):
            saturday += timedelta(days=7)
        return f"the weekend of {human_date(saturday)}"
    if what == "month":
        y, m = _shift_month(anchor, step)
        return f"{MONTHS[m - 1].capitalize()} {y}"
    return str(anchor.year + step)


def annotate_relative_dates(text: str, anchor: date) -> str:
    def repl(match: re.Match[str]) -> str:
        resolved = resolve_relative(match["phrase"], anchor, match["n"], match["unit"])
        return f"{match['phrase']} ({resolved})"

    return _RELATIVE.sub(repl, text)


# -- sentence salience ----------------------------------------------------------------------


def sentence_score(sentence: str, *, role: str = "user") -> float:
    words = _WORD.findall(sentence)
    if not words:
        return -10.0
    lowered = [w.lower() for w in words]
    proper = sum(
        1
        for i, w in enumerate(words)
        if i > 0 and w[0].isupper() and lowered[i] not in STOP_WORDS and lowered[i] not in FILLER_WORDS
    )
    numbers = sum(1 for w in words if w[0].isdigit())
    dates = sum(1 for w in lowered if w in MONTHS or w in WEEKDAYS) + len(_RELATIVE.findall(sentence))
    first_person = sum(1 for w in lowered if w in ("i", "my", "we", "our", "i'm", "i've", "me"))
    content = [w for w in lowered if w not in STOP_WORDS]
    filler = sum(1 for w in content if w in FILLER_WORDS)
    score = (
        2.0 * min(proper, 4)
        + 2.0 * min(numbers, 3)
        + 1.5 * min(dates, 2)
        + 0.5 * min(first_person, 2)
        + 0.25 * min(len(content), 12)
        - 1.5 * filler
    )
    if len(content) < 3:
        score -= 2.0
    if sentence.rstrip().endswith("?"):
        score -= 1.5
    if role == "assistant" and not on("role_neutral"):
        score -= 0.5
    return score / math.sqrt(1 + len(words) / 12)


# Openers dropped from the start of a sentence. Interjections and connectives go whether or not
# punctuation follows ("Oh I went" -> "I went"); words that can also start a meaningful phrase
# ("Great job on the cake", "Well done", "So much fun") go only when punctuation marks them as an
# opener ("Great, I went" -> "I went").
_INTERJECTION = re.compile(
    r"^(?:(?:(?:oh+|wow|woah|whoa|yeah|yep|yup|hey|hi|hello|haha+|ha|hahaha|lol|btw|anyway|also|plus|"
    r"and|but|ah+|aw+|omg|gosh|hmm+|um+|uh+|by the way|oh my gosh|oh my god|on another note)\b[,!.:;-]*"
    r"|(?:ok|okay|well|so|cool|nice|great|awesome|man|dude|sure|yes|right|alright|totally|"
    r"absolutely|amazing|wonderful)[,!.:;-]+)\s+)+",
    re.IGNORECASE,
)
_OLD_INTERJECTION = re.compile(
    r"^(?:(?:oh|wow|woah|whoa|yeah|yep|yup|hey|hi|haha|hahaha|lol|ok|okay|well|so|btw|anyway|"
    r"also|plus|and|but|ah|aw|aww|omg|gosh|man|dude|hmm|um|uh|cool|nice|great|awesome|"
    r"by the way|oh my gosh|oh wow|on another note)\b[,!.:-]*\s+)+",
    re.IGNORECASE,
)
_CAPTION = re.compile(r"\[shares an image: (?:a (?:photo|photography|picture|close up|closeup) of )?", re.IGNORECASE)
# Emoji with what joins and modifies them: zero-width joiners inside a sequence ("👨‍👩‍👧"), variation
# selectors, keycaps, skin tones, flags (regional indicators) and tag sequences. A joiner outside
# an emoji sequence is left alone (scripts such as Devanagari and Persian use it in words).
_EMOJI_CHAR = "\U0001F1E6-\U0001F1FF\U0001F300-\U0001FAFF\u2600-\u27BF\u2B50\u2B55\u2B1B\u2B1C"
_EMOJI = re.compile(f"(?:[{_EMOJI_CHAR}][\u200D\uFE0E\uFE0F\u20E3\U000E0020-\U000E007F]*|[\uFE0E\uFE0F\u20E3])+")
_SPACES = re.compile(r"\s{2,}")
# emoji go with the spaces before them when punctuation follows: "two cats 🐱🐱." is "two cats.",
# not "two cats ." (one match per run of emoji, then a look at the next character: a lookahead in
# the pattern failed at every position of a long run, quadratic in its length)
_SPACED_EMOJI = re.compile(rf"\s*(?:{_EMOJI.pattern})")
_STOPS = frozenset(".,!?;:")
_WORDLIKE = re.compile(r"\w")


def _emoji_before_stops(text: str) -> str:
    return _SPACED_EMOJI.sub(lambda m: "" if m.string[m.end():m.end() + 1] in _STOPS else m.group(), text)


def tidy(sentence: str) -> str:
    """The sentence without openers, emoji and caption boilerplate ("Oh wow, I went…" → "I went…").
    A sentence of emoji alone keeps them: "🎉🎉🎉" is what was said (it read "." once removed)."""
    text = _SPACES.sub(" ", _EMOJI.sub(" ", _emoji_before_stops(sentence))).strip()
    if not _WORDLIKE.search(text):
        return _SPACES.sub(" ", sentence).strip()
    text = _CAPTION.sub("[image: ", text)
    stripped = (_INTERJECTION if on("openers") else _OLD_INTERJECTION).sub("", text)
    if stripped and len(_WORD.findall(stripped)) >= 2:
        text = stripped[0].upper() + stripped[1:]
    return text.strip()


# After . ! ? and a space, before a capital of any script ("Она", "Émile"), a letter of a script
# without case, or a digit (checked in split_sentences: the capital was [A-Z], and a Russian or
# Arabic message stayed one sentence). Not after
# the 。 of Chinese or Japanese: with no space between words, a sentence there is one word to the
# selection, and a message cut into such sentences kept only its first at any target.
_BOUNDARY = re.compile(r"[.!?]+[\"'”’»)\]]*\s+(?=[\"'“«(\[¿¡]?\w)|\s+/\s+")
_OPENERS = "\"'“«([¿¡"
_LAST_TOKEN = re.compile(r"(\S+)$")


def _not_an_end(text: str, boundary: re.Match[str], start: int) -> bool:
    """Whether the full stop at ``boundary`` ends an abbreviation ("St.", "Dr.", "e.g."), an
    initial ("J."), or a list number ("4." starting a sentence or following a colon)."""
    if not boundary.group().startswith(".") or boundary.group().startswith("..") or not on("split"):
        return False
    token = _LAST_TOKEN.search(text, start, boundary.start())
    if token is None:
        return False
    word = token.group(1).lstrip("\"'“(").rstrip(".")
    lowered = word.lower()
    if lowered in ABBREVIATIONS or "." in lowered.strip("."):  # "St.", "U.S.", "a.m."
        return lowered != "no" or text[boundary.end():boundary.end() + 1].isdigit()
    if len(word) == 1 and word.isupper():  # an initial: "J. K. Rowling"
        return True
    if word.isdigit() and len(word) <= 2:  # "4." as a list marker, not "I turned 30."
        before = text[start:token.start()].rstrip()
        return not before or before.endswith((":", ".", "!", "?", "/"))
    return False


def _capital_or_digit(char: str) -> bool:
    """A letter that is not lower case (a capital, or a letter of a script without case: Arabic,
    Hebrew, Devanagari), or an ASCII digit ("¹" and "①" start no sentence, as before)."""
    return char in "0123456789" or (char.isalpha() and not char.islower())


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: split after . ! ? before a capital or a digit, and at the `` / ``
    that stands for a line break — but not after an abbreviation, an initial or a list number."""
    pieces: list[str] = []
    start = 0
    for boundary in _BOUNDARY.finditer(text):
        if boundary.group()[0] in ".!?" and not _capital_or_digit(text[boundary.end():].lstrip(_OPENERS)[:1]):
            continue
        if _not_an_end(text, boundary, start):
            continue
        end = boundary.start() if boundary.group().strip() == "/" else boundary.end()
        pieces.append(text[start:end])
        start = boundary.end()
    pieces.append(text[start:])
    return [p.strip() for p in pieces if p and p.strip()]


# A clause boundary inside a sentence: a semicolon, a spaced dash or ", and/but/so" before a clause
# that starts with its own subject, so it reads on its own ("I ran a charity race last Saturday –
# it was really rewarding"); "a gift from my grandma - a necklace" and "- which …" stay whole.
_CLAUSE = re.compile(
    r"(?:;|\s[–—-]|,\s+(?:and|but|so))\s+(?=(?:i|we|he|she|they|it|you|my|our|his|her|their|this|that|"
    r"there|i'm|it's|that's|we're|they're|i've|we've|i'd|i'll)\b)", re.IGNORECASE)


def split_clauses(sentence: str) -> list[tuple[str, str]]:
    """``(separator before, clause)`` pieces of a sentence, split at a clause boundary (above) when
    both sides have at least three words and it is not inside parentheses or quotes; the first
    piece's separator is empty. Joined back in order they give the sentence."""
    if not on("clauses"):
        return [("", sentence)]
    pieces: list[tuple[str, str]] = []
    start, separator = 0, ""
    for boundary in _CLAUSE.finditer(sentence):
        left, right = sentence[start:boundary.start()], sentence[boundary.end():]
        if len(_WORD.findall(left)) < 3 or len(_WORD.findall(right)) < 3:
            continue
        before = sentence[:boundary.start()]
        if before.count("(") > before.count(")") or before.count("[") > before.count("]"):
            continue  # inside brackets: "(the week of 24 April 2023)", "[image: …; …]"
        if before.count('"') % 2 or before.count("“") > before.count("”"):
            continue  # inside a quotation
        pieces.append((separator, left))
        start, separator = boundary.end(), boundary.group()
    pieces.append((separator, sentence[start:]))
    return pieces


_END = re.compile(r"(?:[.!?…。！？]['\"”’»)\]」』）]*|\])$")


def join_clauses(pieces: list[tuple[int, int, str, str]]) -> str:
    """Render chosen ``(sentence, clause, separator before, text)`` pieces in order: neighbouring
    clauses of one sentence keep their separator; a run that stops before its sentence's end gets
    a full stop, and one that starts after its sentence's start a capital."""
    out: list[str] = []
    previous: tuple[int, int] | None = None
    for sentence, clause, separator, text in pieces:
        if previous is not None and previous == (sentence, clause - 1):
            out[-1] = out[-1] + separator + text
        else:
            if out and not _END.search(out[-1]):
                out[-1] = out[-1].rstrip(",;:–—- ") + "."
            out.append(text[:1].upper() + text[1:] if clause else text)
        previous = (sentence, clause)
    if out and not _END.search(out[-1]):
        out[-1] = out[-1].rstrip(",;:–—- ") + "."
    return " ".join(out)


@functools.cache
def _vocabulary():  # type: ignore[no-untyped-def]
    """cl100k's encoder, or None when it cannot be loaded (no cached file and no network)."""
    try:
        return _encoding("cl100k_base")
    except RuntimeError:
        return None


@functools.lru_cache(maxsize=65536)
def rarity(word: str) -> float:
    """How specific an English word is (0.5–1.2), from the tokenizer's vocabulary: cl100k merges
    frequent words first, so a word's token id grows as it gets rarer ("time" 892 → 0.5,
    "journal" 8486 → 0.8, "violin" 63137 → 1.0), and a word it splits into pieces ("lasagna",
    "kundalini") is rarer still (1.2). A general English frequency scale, not a word list, and
    not read from any conversation. "mom's" weighs as "mom", "well-known" as its rarer part. When
    the vocabulary cannot be loaded (tiktoken has no cached cl100k and no network; omem points
    tiktoken at the copy litellm ships), every word weighs 1."""
    vocabulary = _vocabulary()
    if vocabulary is None:
        return 1.0
    word = re.sub(r"['’]s$", "", word)
    parts = [part for part in re.split(r"['’-]", word) if part]
    if len(parts) > 1:
        return max(rarity(part) for part in parts)
    ids = vocabulary.encode_ordinary(" " + (parts[0] if parts else word))
    if len(ids) > 1:
        return 1.2
    # log10(id) from 3 (the ~1,000 most common) to 4.5 (~30,000th) maps to 0.5 .. 1.0
    position = (math.log10(max(ids[0], 1)) - 3.0) / 1.5
    return 0.5 + 0.5 * min(1.0, max(0.0, position))


_BACK_REFERENCE = frozenset(("it", "that", "this", "they", "them", "he", "she", "him", "her", "there", "those", "these",
                             "it's", "it'll", "that's", "they're", "they've", "he's", "she's", "there's"))


def with_context(sentences: list[str]) -> list[str]:
    """Sentences, each short one that points back ("We won it by a tight score.", "That was the
    best part.") joined to the sentence before it in the same message, so a note never keeps
    "it" without what "it" is."""
    if not on("context"):
        return sentences
    out: list[str] = []
    joined = False  # the last sentence of ``out`` already has one joined to it: no chains
    for sentence in sentences:
        words = [w.lower().replace("’", "'") for w in _WORD.findall(sentence)]
        if (out and not joined and len(words) <= 8 and _BACK_REFERENCE & set(words)
                and not sentence.rstrip().endswith("?")):
            out[-1] = f"{out[-1]} {sentence}"
            joined = True
        else:
            out.append(sentence)
            joined = False
    return out


def word_weights(sentence: str) -> dict[str, float]:
    """Information carried by each content word: names and numbers weigh most (2.5), then dates
    (1.5), then other words by how specific they are (:func:`rarity`, 0.5–1.2), so a sentence's
    specific words ("violin", "lasagna") carry it rather than common ones ("time", "feel")."""
    weights: dict[str, float] = {}
    words = _WORD.findall(sentence)
    for i, word in enumerate(words):
        lowered = word.lower()
        if lowered in STOP_WORDS or lowered in FILLER_WORDS or len(lowered) < 2 and not lowered.isdigit():
            continue
        if word[0].isdigit():
            weight = 2.5
        elif lowered in MONTHS or lowered in WEEKDAYS:
            weight = 1.5
        elif word[0].isupper() and (i > 0 or word.isupper()):
            weight = 2.5
        elif on("rarity"):
            weight = rarity(lowered)
        else:
            weight = 1.0
        weights[lowered] = max(weights.get(lowered, 0.0), weight)
    return weights


def _spread(count: int) -> Callable[[int], tuple[float, int]]:
    """A sort key visiting ``0..count-1`` in a spread-out order (bit-reversed positions)."""
    bits = max(1, (count - 1).bit_length())

    def key(index: int) -> tuple[float, int]:
        reversed_bits = int(format(index, f"0{bits}b")[::-1], 2)
        return (reversed_bits, index)

    return key


def greedy_cover(units: list[tuple[dict[str, float], int, float]], budget: int,
                 covered: set[str] | None = None, *, min_gain: float = 1.0) -> list[int]:
    """Pick units (word weights, token cost, multiplier) maximising newly covered information per
    token until ``budget`` is spent: a sentence that only repeats what is already kept gains
    nothing, and one that adds less than ``min_gain`` is not worth a line. Returns the chosen
    indexes in the order they were picked; deterministic."""
    covered = set(covered or ())
    chosen: list[int] = []
    remaining = set(range(len(units)))
    # Ties go to positions spread over the input (1/2, 1/4, 3/4, …) rather than the oldest first.
    order = sorted(range(len(units)), key=_spread(len(units))) if on("position_fair") else list(range(len(units)))
    used = 0
    while remaining:
        best, best_value = -1, 0.0
        for index in (i for i in order if i in remaining):
            weights, cost, multiplier = units[index]
            if used + cost > budget and chosen:
                continue
            gain = sum(w for word, w in weights.items() if word not in covered) * multiplier
            if gain < min_gain:
                continue
            value = gain / max(cost, 1)
            if value > best_value:
                best, best_value = index, value
        if best < 0:
            break
        chosen.append(best)
        remaining.discard(best)
        used += units[best][1]
        covered.update(units[best][0])
    return chosen


_FIRST_PERSON = frozenset(("i", "my", "me", "mine", "i'm", "i've", "i'll", "i'd", "we", "our", "us", "we're", "we've"))

# -- observe --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Candidate:
    message: int
    position: int
    text: str
    score: float
    cost: int
    sentence: int = 0
    clause: int = 0
    separator: str = ""
    question: bool = False


_NAME_PREFIX = re.compile(r"^(?P<name>[^\W\d_][\w'’.-]*(?: [^\W\d_][\w'’.-]*){0,2}):\s+(?P<rest>.+)$")


def _pleasantry(sentence: str) -> bool:
    """A sentence with no specific word: every content word is generic ("See ya later!",
    "Weddings truly are the best!" has one, "weddings", and a short exclamation of praise)."""
    words = _WORD.findall(sentence)
    specific = [w for w in words if w.lower() not in STOP_WORDS and w.lower() not in FILLER_WORDS
                and w.lower() not in GENERIC_WORDS and not w[0].isdigit()]
    if not specific:
        return True
    return sentence.rstrip().endswith("!") and len(specific) <= 1 and len(words) <= 6 and not (
        _FIRST_PERSON & {w.lower().replace("’", "'") for w in words})


def parse_messages(block: str) -> list[tuple[date, str, str]]:
    """``(day, "role|speaker", text)`` per rendered message line; unparsable lines are skipped.

    A message that starts ``Name: `` names its speaker. A capitalised name counts on its own
    unless it is a label word ("Noted: …", "Update: …"); a label word or a lower-case name
    ("elise: hi") counts when the same prefix starts another message of the segment or every
    message of the segment starts with a name, so "note: the server is down" in one message of
    an ordinary chat stays text."""
    rows = []
    for line in block.splitlines():
        match = _HEADER.match(line.strip())
        if match is None:
            continue
        day = date(int(match["y"]), int(match["m"]), int(match["d"]))
        rows.append((day, match["role"], match["content"].strip()))
    prefixes = [_NAME_PREFIX.match(content) for _, _, content in rows]
    names = [m["name"] if m is not None and m["name"].lower() not in STOP_WORDS else None for m in prefixes]
    seen: dict[str, int] = {}
    for name in names:
        if name is not None:
            seen[name.lower()] = seen.get(name.lower(), 0) + 1
    all_named = bool(rows) and all(n is not None for n in names)
    parsed = []
    for (day, role, content), name, prefix in zip(rows, names, prefixes):
        speaker = role.capitalize()
        repeated = seen[name.lower()] >= 2 if name is not None else False
        if name is not None and prefix is not None and (
            (_SPEAKER.match(content) is not None and (name.lower() not in LABEL_WORDS or repeated))
            or (on("speakers") and (repeated or all_named))
        ):
            speaker, content = name, prefix["rest"]
        parsed.append((day, f"{role}|{speaker}", content))
    return parsed


def _omission(marker: re.Match[str]) -> str:
    """What stands for the marker of a message cut to fit (:func:`omem_core.planning.cut_middle`):
    a line break, after "…" when the head stops mid-sentence (its words are not a whole sentence)."""
    before = marker.string[: marker.start()].rstrip()
    return " / " if not before or before[-1] in ".!?…" else " … / "


def observe(block: str, target_tokens: int, *, weigh: Callable[[str], dict[str, float]] | None = None) -> str:
    """Dated bullets of the most salient sentences of ``block`` within ``target_tokens``.

    ``weigh`` replaces :func:`word_weights` (a sentence's words and what each is worth) for
    research: ``bench/bench_quality.py --frontier`` passes the gold answers' words to see what
    the same selection keeps when it knows what will be asked."""
    messages = parse_messages(block)
    candidates: list[_Candidate] = []
    for index, (day, who, content) in enumerate(messages):
        role, speaker = who.split("|", 1)
        position = 0
        content = OMISSION.sub(_omission, content)  # a message cut to fit: its head and tail, never the marker
        for number, sentence in enumerate(with_context([tidy(s) for s in split_sentences(content)])):
            text = annotate_relative_dates(sentence, day)
            question = text.rstrip().endswith("?")
            clauses = split_clauses(text)
            for part, (separator, clause) in enumerate(clauses):
                candidates.append(_Candidate(index, position, clause, sentence_score(clause, role=role),
                                             estimate_tokens(clause) + 1, number, part, separator, question))
                position += 1
    # Information-per-token greedy selection: speakers' names are in every bullet already.
    speakers = {word.lower() for _, who, _ in messages for word in who.split("|", 1)[1].split()}
    units = []
    for candidate in candidates:
        multiplier = 0.5 if candidate.question else 1.0
        if messages[candidate.message][1].startswith("assistant|") and not on("role_neutral"):
            multiplier *= 0.8
        if candidate.score <= 0:
            multiplier *= 0.3
        if on("pleasantries") and _pleasantry(candidate.text):
            multiplier = 0.0  # "See ya later!": kept only when nothing else is said
        units.append(((weigh or word_weights)(candidate.text), candidate.cost + 3, multiplier))
    chosen = [candidates[i] for i in greedy_cover(units, target_tokens, speakers)]
    if not chosen and candidates:  # nothing clears the bar: the most salient sentence, cut to fit
        best = max(candidates, key=lambda c: (c.score, -c.message, -c.position))
        cut = first_words(best.text, target_tokens)
        chosen = [_Candidate(best.message, best.position, cut if cut == best.text else f"{cut}…", best.score, best.cost)]
    if not chosen:  # no sentence at all (empty or unreadable messages): say so, never nothing
        if messages:
            day, who, content = messages[0]
            return render_dated([(human_date(day), f"{who.split('|', 1)[1]}: {first_words(content, target_tokens) or '(an empty message)'}")])
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        return f"- {first_words(lines[0], target_tokens)}" if lines else ""
    bullets: dict[int, list[tuple[int, int, str, str]]] = {}
    for c in sorted(chosen, key=lambda c: (c.message, c.position)):
        bullets.setdefault(c.message, []).append((c.sentence, c.clause, c.separator, c.text))
    dated = [(human_date(messages[index][0]), f"{messages[index][1].split('|', 1)[1]}: {join_clauses(pieces)}")
             for index, pieces in bullets.items()]
    return render_dated(dated)


def first_words(text: str, target_tokens: int) -> str:
    """The longest prefix of whole words of ``text`` within ``target_tokens`` (at least one word,
    itself cut to the target when it is longer)."""
    words = text.split()
    kept: list[str] = []
    for word in words:
        if estimate_tokens(" ".join([*kept, word])) > target_tokens:
            break
        kept.append(word)
    if not kept and words:
        return words[0][: max(1, target_tokens * 4)]
    return " ".join(kept)


def render_dated(bullets: list[tuple[str, str]]) -> str:
    """Bullets under a date heading each time the date changes::

        8 May 2023
        - Caroline: went to a support group yesterday (7 May 2023).
        - Melanie: painted a sunrise.
    """
    lines: list[str] = []
    current: str | None = None
    for day, body in bullets:
        if day and day != current:
            lines.append(day)
            current = day
        lines.append(f"- {body}")
    return "\n".join(lines)


# -- reflect --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Bullet:
    order: int
    date: str
    body: str
    words: frozenset[str]


def parse_bullets(text: str) -> list[tuple[str, str]]:
    """``(date, body)`` per bullet; a date comes from a heading line or a ``(date)`` prefix."""
    bullets = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        heading = _DATE_HEADING.match(line)
        if heading is not None:
            current = heading["date"]
            continue
        match = _BULLET.match(line)
        if match is not None:
            bullets.append((match["date"] or current, match["body"].strip()))
        else:
            bullets.append((current, line))
    return bullets


def _body_sentences(body: str) -> tuple[str, list[str]]:
    speaker, sep, rest = body.partition(": ")
    if sep and len(speaker) <= 40:
        return speaker + sep, split_sentences(rest)
    return "", split_sentences(body)


def reflect(reflection: str, observations: str, target_tokens: int) -> str:
    """Merge, de-duplicate (newest wording wins) and tighten to ``target_tokens``."""
    merged: list[_Bullet] = []
    for order, (day, body) in enumerate(parse_bullets(reflection) + parse_bullets(observations)):
        words = frozenset(content_words(body))
        if not words:
            continue
        numbers = frozenset(w for w in words if w[0].isdigit())
        for existing in list(merged):
            overlap = len(words & existing.words)
            same_numbers = {w for w in existing.words if w[0].isdigit()} <= numbers
            if overlap == len(existing.words) or (
                same_numbers and overlap / len(words | existing.words) >= 0.7
            ):
                merged.remove(existing)  # the newer bullet says it at least as fully
            elif overlap == len(words):
                words = frozenset()  # an older bullet already says all of this
                break
        if words:
            merged.append(_Bullet(order, day, body, words))
    if not merged:  # notes without a content word ("- ok"): keep the newest line, never nothing
        lines = [line.strip() for line in f"{reflection}\n{observations}".splitlines() if line.strip()]
        return first_words(lines[-1], target_tokens) if lines else ""
    budget = max(1, int(target_tokens * 0.95))

    def size() -> int:
        return estimate_tokens(render_dated([(b.date, b.body) for b in merged]))

    newest = max((b.order for b in merged), default=0) or 1
    if size() > budget:
        # Keep the clauses that add the most new information per token (each bullet's speaker is
        # charged half to every kept clause); old and new notes weigh alike (``position_fair``:
        # the newest wording of a fact already won in the de-duplication above); the result stays
        # in conversation order.
        pieces: list[tuple[int, str, str]] = []  # (bullet index, head, clause)
        parts: list[tuple[int, int, str, str]] = []  # per piece: for join_clauses
        for index, bullet in enumerate(merged):
            head, sentences = _body_sentences(bullet.body)
            for number, sentence in enumerate(sentences or [bullet.body]):
                clauses = split_clauses(sentence)
                for part, (separator, clause) in enumerate(clauses):
                    pieces.append((index, head, clause))
                    parts.append((number, part, separator, clause))
        units = [(word_weights(sentence), estimate_tokens(sentence) + 1 + estimate_tokens(head) // 2,
                  1.0 if on("position_fair") else 1.0 + 0.5 * merged[index].order / newest)
                 for index, head, sentence in pieces]
        candidates = merged

        def rebuild(chosen: list[int]) -> list[_Bullet]:
            members: dict[int, list[int]] = {}
            for piece in sorted(chosen):
                members.setdefault(pieces[piece][0], []).append(piece)
            return [
                _Bullet(candidates[index].order, candidates[index].date,
                        pieces[kept[0]][1] + join_clauses([parts[p] for p in kept]), candidates[index].words)
                for index, kept in members.items()
            ]

        picked = greedy_cover(units, int(budget * 0.93))
        if not picked:  # no clause adds enough ("- User: Ann."): the newest, never nothing
            picked = [len(pieces) - 1]

        merged = rebuild(picked)
        while size() > budget and len(picked) > 1:  # headings cost a little more than estimated; keep one
            picked.pop()  # drop the last, least valuable pick
            merged = rebuild(picked)
    return render_dated([(b.date, b.body) for b in merged])


def _code_digest() -> str:
    """A digest of the code the offline model's answers depend on: this package, and the planning
    and token modules it uses (read at import: what runs, not what the files hold later)."""
    digest = hashlib.sha256()
    here = Path(__file__).parent
    for path in [*sorted(here.glob("*.py")), here.parent / "planning.py", here.parent / "tokens.py"]:
        with contextlib.suppress(OSError):  # (no sources, e.g. a zip import: the version below only)
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        digest.update(version("omem").encode())
    return digest.hexdigest()[:16]


_CODE = _code_digest()


def code_version() -> str:
    """What the offline model's answers depend on besides their input: a digest of its code, whether
    the word-rarity vocabulary could be loaded (without it every word weighs the same) and the
    heuristics switched off (:data:`DISABLED`). A cache of its answers must key on it: answers
    cached by an older omem, or in another environment, were served as this one's."""
    state = f"{_CODE} vocabulary={'no' if _vocabulary() is None else 'yes'} off={','.join(sorted(DISABLED))}"
    return hashlib.sha256(state.encode()).hexdigest()[:16]


def target_from(text: str, default: int) -> int:
    """The layout's target: its *last* ``Target length`` line (message text cannot move it)."""
    matches = _TARGET.findall(text)
    return int(matches[-1]) if matches else default


def section(text: str, tag: str, start: int = 0, end: int | None = None) -> str | None:
    """What lies between the first ``<tag>`` and the last ``</tag>`` of ``text[start:end]``."""
    stop = len(text) if end is None else end
    opening = text.find(f"<{tag}>", start, stop)
    closing = text.rfind(f"</{tag}>", 0, stop)
    if opening < 0 or closing < opening:
        return None
    return text[opening + len(tag) + 2 : closing].strip("\n")


def between(text: str, tag: str) -> str | None:
    """Kept for callers of the earlier name: :func:`section`."""
    return section(text, tag)


def respond(user_content: str) -> str:
    """The offline model's whole behaviour: route on the input layout of omem's prompts."""
    target = target_from(user_content, 256)
    messages = section(user_content, "messages")
    # Its notes copy the input's text as it is written there (a "<" of a layout tag as "&lt;"), as
    # a faithful model's do: the wrapper undoes that escaping for every model alike.
    if messages is not None:
        return observe(messages, target)
    opening = user_content.find("<observations>")
    observations = section(user_content, "observations", max(opening, 0)) if opening >= 0 else None
    if observations is not None:
        reflection = section(user_content, "reflection", 0, opening) or ""
        return reflect(reflection, observations, target)
    # Any other text: treat it as notes to tighten.
    return reflect("", user_content, target)


TRIM_READS = 32  # characters read per token of the limit: about 8 times what is kept


SENTENCE_MARKS = ("。", "！", "？", ".", "!", "?", "\n")  # where a prefix of unspaced text may end


def trim(text: str, limit: int, count: Callable[[list[str]], list[int]]) -> str:
    """``text`` cut to at most ``limit`` tokens by ``count``, with no model: the reflector's
    sentence selection (the least informative sentences go); if no whole sentence fits, the
    longest prefix of words that does, or for text with no spaces (Japanese, a URL) of characters,
    so the result never exceeds ``limit``. Deterministic. Used by the wrapper to keep an over-long
    reflection (or a runaway observation) within its limit.

    Only the start of a runaway text is read (:data:`TRIM_READS` characters per token of the
    limit, cut at a line or after a sentence): choosing among a megabyte of sentences took more than a minute of CPU,
    holding the event loop and every read waiting on it, to keep a few thousand tokens."""
    budget = max(limit, 1) * TRIM_READS
    if len(text) > budget:
        head = text[:budget]
        line = head.rfind("\n")
        if line > budget // 2:
            text = head[:line]
        else:  # (one long paragraph: cut after a sentence, never mid-sentence as a whole one)
            end = _last_sentence_end(head, budget // 2)
            space = head.rfind(" ", budget // 2)
            text = head[:end] if end is not None else f"{head[:space]}…" if space >= 0 else head
    target = limit
    while target >= 1:
        trimmed = reflect("", text, target)
        if trimmed.strip() and count([trimmed])[0] <= limit:
            return trimmed
        target = int(target * 0.8)
    words = text.split()
    low, high = 1, len(words)  # the longest prefix that fits (at least one word)
    while low < high:
        middle = (low + high + 1) // 2
        if count([" ".join(words[:middle])])[0] <= limit:
            low = middle
        else:
            high = middle - 1
    kept = " ".join(words[:low])
    if count([kept])[0] > limit:  # one "word" over the limit: text with no spaces (Chinese, a URL)
        return _unspaced_prefix("", kept, limit, count)
    if low < len(words) and len(words[low]) > UNSPACED_RUN:
        # The next "word" is a long unspaced run ("- " then Japanese): whole words would keep only
        # the bullet. As much of the run as fits, ended at a sentence mark when there is one.
        return _unspaced_prefix(kept + " ", words[low], limit, count)
    return kept


def _last_sentence_end(text: str, after: int) -> int | None:
    """Where the last whole sentence of ``text`` ends, past ``after``: a boundary as
    :func:`split_sentences` reads one (not "Dr." or "34.5", nor a dot at the very end, which may be
    a cut "34." of "34.5"), else after the last "。", "！" or "？"; ``None`` when there is none."""
    start, end = 0, None
    for boundary in _BOUNDARY.finditer(text):
        if boundary.group().strip() == "/" or _not_an_end(text, boundary, start):
            continue
        start = boundary.end()
        if boundary.start() >= after:
            end = boundary.start() + len(boundary.group().rstrip())
    if end is not None:
        return end
    unspaced = max(text.rfind(mark, after) for mark in ("。", "！", "？"))
    return unspaced + 1 if unspaced >= 0 else None


UNSPACED_RUN = 32  # characters: a "word" this long is text without spaces, cut by characters


def _unspaced_prefix(head: str, run: str, limit: int, count: Callable[[list[str]], list[int]]) -> str:
    """``head`` and the longest prefix of ``run`` that fits ``limit`` with it (at least one
    character), ended after its last sentence mark ("。", ".", …) when one is in its second half."""
    low, high = 1, len(run)
    while low < high:
        middle = (low + high + 1) // 2
        if count([head + run[:middle]])[0] <= limit:
            low = middle
        else:
            high = middle - 1
    part = run[:low]
    end = max(part.rfind(mark, low // 2) for mark in SENTENCE_MARKS)
    return head + (part[: end + 1] if end >= 0 else part)
