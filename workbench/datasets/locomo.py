"""LoCoMo-style JSON and its variants.

* LoCoMo (``locomo10.json``): a list of samples ``{sample_id, conversation, qa, ...}``;
  ``conversation`` holds ``speaker_a``, ``speaker_b``, ``session_N`` (lists of turns
  ``{speaker, dia_id, text}``) and ``session_N_date_time`` (``"1:56 pm on 8 May, 2023"``).
* Variants (REALTALK's real chats and the like): one conversation object instead of a list; the
  sessions at its top level instead of under ``conversation``; speakers named in
  ``name: {"speaker_1": ..., "speaker_2": ...}``; the text in ``clean_text`` (``text`` is the
  fallback); a ``date_time`` on every turn (``"08.05.2023, 13:56:00"``); extra fields such as
  ``events_session_N`` ignored. Speaker names match in any case.

``dia_id`` is the message id; the first speaker is the user, the other the assistant, names kept.
A turn without its own ``date_time`` is its session's date-time plus 30 s per position; sessions are
replayed in date order (stable for equal dates; a warning says when that is not their numbers'). Image
turns keep their caption. QA categories are named: 1 multi-hop, 2 temporal, 3 open-domain,
4 single-hop, 5 adversarial; category 5 asks about something the conversation never says (its
``adversarial_answer`` is the trap), so it is an abstention probe with no gold.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from .base import Conversation, DatasetError, Probe, Turn, finish, require, text_or_none
from .dates import later, parse_datetime
from .source import Source

NAME = "locomo"
DESCRIPTION = ("LoCoMo JSON (a list of samples with `conversation` and `qa`) and variants such as "
               "REALTALK's chats (one object, `name.speaker_1`, `clean_text`, per-turn `date_time`)")
FOLDER = False

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
ADVERSARIAL = 5
_SESSION = re.compile(r"session_(\d+)")
_EVIDENCE_ID = re.compile(r"D\d+:\d+")


def _conversation_part(sample: Any) -> dict | None:
    """The object holding the sessions: ``conversation`` (LoCoMo) or the sample itself (variants)."""
    if not isinstance(sample, dict):
        return None
    if isinstance(sample.get("conversation"), dict):
        return sample["conversation"]
    if any(_SESSION.fullmatch(key) for key in sample):
        return sample
    return None


def sniff(source: Source) -> bool:
    first = source.first()
    part = _conversation_part(first)
    if part is None:
        return False
    return "qa" in first or "speaker_a" in part or isinstance(part.get("name"), dict) or isinstance(
        first.get("name"), dict)


def category_name(value: Any) -> str:
    if value is None:
        return "uncategorised"
    if isinstance(value, int) and not isinstance(value, bool):
        return CATEGORIES.get(value, str(value))
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}", value.strip()):  # (4,301 digits: int() refuses)
        return CATEGORIES.get(int(value), value.strip())
    return str(value)


def _speakers(sample: dict, part: dict, source: Source, record: str) -> tuple[str, str | None]:
    if "speaker_a" in part:
        speaker_b = part.get("speaker_b")
        return (require(part, "speaker_a", source.path, f"{record} conversation"),
                speaker_b if isinstance(speaker_b, str) else None)
    names = part.get("name", sample.get("name"))
    if isinstance(names, dict):
        first = require(names, "speaker_1", source.path, f"{record} name")
        second = names.get("speaker_2")
        return first, second if isinstance(second, str) else None
    raise DatasetError(source.path, record, "speaker_a",
                       "missing: name the speakers with speaker_a/speaker_b or name: {speaker_1, speaker_2}")


def _sample(sample: Any, index: int, source: Source, single: bool) -> Conversation:
    file = source.path
    record = f"sample {index}"
    if not isinstance(sample, dict):
        raise DatasetError(file, record, None, f"expected a JSON object, got {type(sample).__name__}")
    part = _conversation_part(sample)
    if part is None:
        raise DatasetError(file, record, "conversation", "missing: expected a `conversation` object or `session_N` lists")
    default_id = file.stem if single else str(index)
    sample_id = sample.get("sample_id", default_id)
    sample_id = str(sample_id) if isinstance(sample_id, (str, int)) and not isinstance(sample_id, bool) else default_id
    speaker_a, speaker_b = _speakers(sample, part, source, record)
    canonical = {name.strip().casefold(): name for name in (speaker_a, speaker_b) if name}
    user = speaker_a.strip().casefold()
    where_part = f"{record} conversation" if part is not sample else record
    # (by number; a number of hundreds of digits, which int() may refuse, after every other)
    sessions = sorted((int(m.group(1)) if len(m.group(1)) <= 100 else 10**100, key)
                      for key in part if (m := _SESSION.fullmatch(key)))
    by_session: list[tuple[str, list[Turn]]] = []
    strangers: list[str] = []  # turns whose speaker is neither of the two named
    blank: list[str] = []  # turns with no text and no image, skipped
    for _, key in sessions:
        turns: list[Turn] = []
        by_session.append((key, turns))
        where = f"{record} {key}"
        session = part[key]
        if not isinstance(session, list):
            raise DatasetError(file, where, key, "expected a list of turns")
        start: datetime | None = None
        if part.get(f"{key}_date_time") is not None:
            start = parse_datetime(part[f"{key}_date_time"], file, where_part, f"{key}_date_time")
        dated: datetime | None = None  # the last turn of this session with its own date_time
        for position, turn in enumerate(session):
            turn_where = f"{where} turn {position}"
            speaker = require(turn, "speaker", file, turn_where)
            text = turn.get("clean_text")
            if not isinstance(text, str) or not text.strip():
                text = turn.get("text")
            if text is not None and not isinstance(text, str):  # (a number was called "empty")
                raise DatasetError(file, turn_where, "text", f"expected str, got {type(text).__name__}")
            text = text if isinstance(text, str) else ""
            caption = turn.get("blip_caption")
            if caption:
                text = f"{text} [shares an image: {caption}]".strip()
            if "text" not in turn and "clean_text" not in turn and not caption:
                raise DatasetError(file, turn_where, "text", "missing")
            if turn.get("date_time") is not None:
                created = parse_datetime(turn["date_time"], file, turn_where, "date_time")
                dated = created
            elif dated is not None:  # an undated turn among dated ones (REALTALK): at the one before it
                created = dated
            elif start is not None:
                created = later(start, timedelta(seconds=30 * position), file, turn_where, f"{key}_date_time")
            else:
                raise DatasetError(file, where_part, f"{key}_date_time",
                                   "missing (and its turns have no date_time)")
            if not text.strip():  # (skipped and said, as the chat exports do: one blank turn of a
                # REALTALK file made it unreadable, the same blank in LoCoMo's "text" was replayed;
                # its date_time, read above, still dates the undated turns after it)
                blank.append(str(turn.get("dia_id") or turn_where))
                continue
            folded = speaker.strip().casefold()
            if speaker_b is not None and folded not in canonical:
                strangers.append(f"{turn.get('dia_id')} ({speaker!r})")
            turns.append(Turn(
                id=require(turn, "dia_id", file, turn_where),
                role="user" if folded == user else "assistant",
                text=text,
                created_at=created,
                speaker=canonical.get(folded, speaker),
            ))
    # Sessions in date order (stable for equal dates), as LongMemEval's: memory orders messages by
    # time, and a session dated before one already condensed failed the replay at its first turn.
    dated_order = sorted((pair for pair in by_session if pair[1]), key=lambda pair: pair[1][0].created_at)
    warnings: list[str] = []
    if blank:
        warnings.append(f"{len(blank)} turn{'s' if len(blank) > 1 else ''} with no text (and no image) "
                        f"{'were' if len(blank) > 1 else 'was'} skipped (first: {blank[0]})")
    moved = [(early, late) for early, late in zip(dated_order, (p for p in by_session if p[1])) if early[0] != late[0]]
    if moved:
        (early, early_turns), (late, late_turns) = moved[0]
        warnings.append(f"{early} is dated {early_turns[0].created_at:%Y-%m-%d %H:%M}, before {late} "
                        f"({late_turns[0].created_at:%Y-%m-%d %H:%M}): sessions are replayed in date order, not in "
                        f"their numbers' ({len(moved)} out of place)")
    turns = [turn for _, session_turns in dated_order for turn in session_turns]
    probes = []
    if strangers:
        warnings.append(f"{len(strangers)} turn{'s' if len(strangers) > 1 else ''} by a speaker who is neither "
                        f"{speaker_a!r} nor {speaker_b!r} (first: {strangers[0]}) "
                        f"{'are' if len(strangers) > 1 else 'is'} read as the assistant's")
    qa_items = sample.get("qa") or []
    if not isinstance(qa_items, list):
        raise DatasetError(file, record, "qa", f"expected a list, got {type(qa_items).__name__}")
    for q_index, qa in enumerate(qa_items):
        where = f"{record} qa {q_index}"
        question = require(qa, "question", file, where)
        code = qa.get("category")
        adversarial = code == ADVERSARIAL or (isinstance(code, str) and code.strip() == str(ADVERSARIAL))
        raw_evidence = qa.get("evidence") or []
        if not isinstance(raw_evidence, list):
            raise DatasetError(file, where, "evidence", f"expected a list, got {type(raw_evidence).__name__}")
        evidence: list[str] = []
        for item in raw_evidence:
            found = _EVIDENCE_ID.findall(str(item))
            if not found:
                warnings.append(f"evidence {item!r} of probe {f'{sample_id}-q{q_index}'!r} is malformed")
            evidence.extend(found)
        probes.append(Probe(
            id=f"{sample_id}-q{q_index}",
            question=question,
            gold=None if adversarial else text_or_none(qa.get("answer")),
            category=category_name(code),
            evidence=tuple(evidence),
            abstention=adversarial,
            reference=text_or_none(qa.get("answer")),  # (an abstention's too, as datasets/README.md says)
        ))
    return finish(Conversation(sample_id, turns, probes, str(file), NAME, warnings), file)


def load(source: Source) -> list[Conversation]:
    top = source.top()
    if top == "{":
        return [_sample(source.document(), 0, source, single=True)]
    if top != "[" or source.lines:
        raise DatasetError(source.path, "top level", None, "expected a list of LoCoMo samples or one conversation object")
    conversations = [_sample(e.value, e.index, source, single=False) for e in source.elements()]
    if not conversations:
        raise DatasetError(source.path, "top level", None, "has no samples")
    return conversations
