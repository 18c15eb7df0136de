"""LongMemEval (S, M and oracle files; the published schema).

A JSON list of instances ``{question_id, question_type, question, answer, question_date,
haystack_session_ids, haystack_dates, haystack_sessions, answer_session_ids}``; a session is a
list of turns ``{"role": "user" | "assistant", "content": ..., "has_answer": true?}`` and its date
looks like ``"2023/05/20 (Sat) 02:21"``. Each instance is one conversation named by its
``question_id``, with one probe: category = ``question_type``, evidence = the turns marked
``has_answer``, asked on ``question_date`` (its ``asked_at``). An id ending in ``_abs`` is an abstention question: not scored by word retention
(its answer is kept as the probe's ``reference`` for a judge).

Sessions are replayed in date order (stable for equal dates); a turn is its session's date plus
30 s per position (kept after the previous turn when sessions overlap); a message id is
``<session id>:<turn position>``. The S file is hundreds of MB: instances are read one at a time
(:func:`conversations`), and the registry keeps a byte-offset index so one instance loads alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from .base import EPOCH, ROLES, Conversation, DatasetError, Probe, Turn, finish, require, text_or_none
from .dates import later, parse_datetime
from .source import Element, Source

NAME = "longmemeval"
DESCRIPTION = ("LongMemEval S/M/oracle JSON: a list of instances (`question_id`, `haystack_sessions`, "
               "`haystack_dates`, ...); each instance is one conversation with one probe")
FOLDER = False
ABSTENTION_SUFFIX = "_abs"
ID_KEY = "question_id"  # what names an element before it is built (single-instance loads)


def sniff(source: Source) -> bool:
    first = source.first()
    return isinstance(first, dict) and "question_id" in first and "haystack_sessions" in first


def record_of(source: Source, index: int) -> str:
    return f"line {index}" if source.lines else f"instance {index}"


def _parallel(instance: dict, key: str, count: int, source: Source, record: str) -> list[Any] | None:
    value = instance.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise DatasetError(source.path, record, key, f"expected a list, got {type(value).__name__}")
    if len(value) != count:
        raise DatasetError(source.path, record, key, f"has {len(value)} entries for {count} haystack sessions")
    return value


def conversation(instance: Any, index: int, source: Source) -> Conversation:
    """One instance as a conversation."""
    file, record = source.path, record_of(source, index)
    question_id = str(require(instance, "question_id", file, record, (str, int)))
    question = require(instance, "question", file, record)
    question_type = instance.get("question_type")
    category = question_type if isinstance(question_type, str) and question_type else "uncategorised"
    sessions = require(instance, "haystack_sessions", file, record, list)
    dates = _parallel(instance, "haystack_dates", len(sessions), source, record)
    ids = _parallel(instance, "haystack_session_ids", len(sessions), source, record)
    starts: list[datetime] = []
    names: list[str] = []
    seen: set[str] = set()
    repeated: list[str] = []
    for position in range(len(sessions)):
        starts.append(EPOCH + timedelta(days=position) if dates is None else
                      parse_datetime(dates[position], file, f"{record} session {position}", "haystack_dates"))
        name = f"session-{position}"
        if ids is not None:
            raw = ids[position]
            if not isinstance(raw, (str, int)) or isinstance(raw, bool):
                raise DatasetError(file, f"{record} session {position}", "haystack_session_ids",
                                   f"expected str, got {type(raw).__name__}")
            name = str(raw)
        if name in seen:  # said (its messages were renamed without a word)
            repeated.append(name)
        while name in seen:  # a repeated session id still gives unique message ids
            name += "~"
        seen.add(name)
        names.append(name)
    turns: list[Turn] = []
    evidence: list[str] = []
    previous: datetime | None = None
    for position in sorted(range(len(sessions)), key=starts.__getitem__):
        where = f"{record} session {position}"
        session = sessions[position]
        if not isinstance(session, list):
            raise DatasetError(file, where, "haystack_sessions", f"expected a list of turns, got {type(session).__name__}")
        for number, turn in enumerate(session):
            turn_where = f"{where} turn {number}"
            role = require(turn, "role", file, turn_where)
            if role not in ROLES:
                raise DatasetError(file, turn_where, "role", f"unknown role {role!r}; expected user or assistant")
            text = require(turn, "content", file, turn_where)
            created = later(starts[position], timedelta(seconds=30 * number), file, turn_where, "haystack_dates")
            if previous is not None and created <= previous:
                created = later(previous, timedelta(seconds=1), file, turn_where, "haystack_dates")
            previous = created
            turn_id = f"{names[position]}:{number}"
            if turn.get("has_answer") is True:
                evidence.append(turn_id)
            turns.append(Turn(turn_id, role, text, created))
    answer = text_or_none(instance.get("answer"))
    abstention = question_id.endswith(ABSTENTION_SUFFIX)
    asked = instance.get("question_date")
    asked_at = None if asked is None else parse_datetime(asked, file, record, "question_date")
    probe = Probe(question_id, question, None if abstention else answer, category, tuple(evidence),
                  abstention, answer, asked_at)
    if not turns:
        raise DatasetError(file, record, "haystack_sessions", "has no turns")
    loaded = finish(Conversation(question_id, turns, [probe], str(file), NAME), file)
    if repeated:
        loaded.warnings.append(
            f"{len(repeated)} session{'s' if len(repeated) > 1 else ''} repeat{'' if len(repeated) > 1 else 's'} the "
            f"haystack_session_id of an earlier one (first: {repeated[0]!r}): its messages are named "
            f"{repeated[0] + '~'!r}:0, :1, …")
    if asked_at is not None and dates is not None and starts and asked_at < max(starts):
        latest = dates[starts.index(max(starts))]
        loaded.warnings.append(f"its question_date ({asked}) is before its latest session ({latest}): the "
                               "answerer is told it is asked on a day before what it read")
    return loaded


def conversations(source: Source) -> Iterator[tuple[Element, Conversation]]:
    """Every instance, one at a time, with where its bytes are (for the index)."""
    if not source.lines and source.top() not in ("[", "{"):
        raise DatasetError(source.path, "top level", None, "expected a JSON list of LongMemEval instances")
    for element in source.elements():
        yield element, conversation(element.value, element.index, source)


def load(source: Source) -> list[Conversation]:
    loaded = [c for _, c in conversations(source)]
    if not loaded:
        raise DatasetError(source.path, "top level", None, "has no instances")
    return loaded
