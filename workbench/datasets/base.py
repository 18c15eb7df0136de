"""What every format loads into (:class:`Conversation`, :class:`Turn`, :class:`Probe`), the one
error type (:class:`DatasetError`), and the checks all loaders share."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import WorkbenchError
from ..formatting import whole_text

if TYPE_CHECKING:
    from omem_core import Message

ROLES = ("user", "assistant", "system", "tool")
EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)  # the clock of formats without dates


class DatasetError(WorkbenchError, ValueError):
    """A dataset file that cannot be read, with where and what."""

    def __init__(self, file: str | Path, record: str, field: str | None, problem: str) -> None:
        self.file, self.record, self.field, self.problem = str(file), record, field, problem
        if record == "file" and not field:  # "x.jsonl: the file is empty", not "x.jsonl: file: is empty"
            super().__init__(f"{file}: the file {problem}")
            return
        where = f"{file}: {record}" + (f": field {field!r}" if field else "")
        super().__init__(f"{where}: {problem}")


class ConversationNotFound(DatasetError):
    """A conversation id the dataset does not hold (a refused option, where one is given)."""


def ordinal(number: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``11th``: a position counted in the loaded conversation, said
    so that it cannot be read as one of the file's 0-based JSON positions (``sample 0``)."""
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


class EmptyConversation(DatasetError):
    """A conversation with no messages: a file of many skips it (with a warning); one asked for
    by id, or a file of it alone, is this error."""

    def __init__(self, file: str | Path, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        super().__init__(file, f"conversation {conversation_id!r}", None, "has no messages")


def skip_empty(conversations: list[Conversation], empty: list[str]) -> list[Conversation]:
    """A file's conversations once those with no messages (``empty``: their ids) are left out —
    real exports hold empty chats ("New chat" opened and left) — the first one saying so."""
    if empty and conversations:
        conversations[0].warnings.append(
            f"{len(empty)} conversation{'s' if len(empty) > 1 else ''} of this file with no messages "
            f"{'were' if len(empty) > 1 else 'was'} skipped (first: {empty[0]!r})")
    return conversations


@dataclass(frozen=True, slots=True)
class Turn:
    """One message of a dataset conversation."""

    id: str
    role: str
    text: str
    created_at: datetime
    speaker: str | None = None

    @property
    def content(self) -> str:
        """The message as the agent stores it: ``Speaker: text`` when a speaker is named."""
        return f"{self.speaker}: {self.text}" if self.speaker else self.text

    def to_message(self, thread_id: str) -> Message:
        from omem_core import Message  # here, not at the top: loading datasets needs no litellm

        return Message(id=self.id, thread_id=thread_id, role=self.role, content=self.content,
                       created_at=self.created_at)


@dataclass(frozen=True, slots=True)
class Probe:
    """A question about the conversation, with its gold answer and evidence message ids.

    ``gold`` is what word retention scores; ``None`` leaves the probe unscored by words.
    ``category`` is a name (``"temporal"``, ``"knowledge-update"``, …) where the format has one.
    An ``abstention`` probe asks about something the conversation never says: the right answer
    is to decline, so it has no gold; its ``reference`` (the dataset's answer text, when there is
    one) is kept for a judge model. ``asked_at`` is when the question is asked, where the format
    says (LongMemEval's ``question_date``): a judge's answerer is told the date, so "how many days
    ago…" has an answer.
    """

    id: str
    question: str
    gold: str | None
    category: str
    evidence: tuple[str, ...] = ()
    abstention: bool = False
    reference: str | None = None
    asked_at: datetime | None = None


@dataclass
class Conversation:
    id: str
    turns: list[Turn]
    probes: list[Probe] = field(default_factory=list)
    source: str = ""
    format: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def dangling_evidence(self) -> int:
        return sum(1 for w in self.warnings if w.startswith("evidence"))


@dataclass(frozen=True, slots=True)
class ConversationInfo:
    """What a listing shows of a conversation without holding it: see ``list_conversations``."""

    id: str
    messages: int
    probes: int
    scored_probes: int  # probes with a gold answer word retention can score (one with a word in it)
    tokens: int  # estimated: characters / 4
    format: str

    @classmethod
    def of(cls, conversation: Conversation) -> ConversationInfo:
        from ..retention import content_words  # (what the score looks for: "" or "!!!" gives it nothing)

        return cls(conversation.id, len(conversation.turns), len(conversation.probes),
                   sum(1 for p in conversation.probes if p.gold is not None and content_words(p.gold)),
                   rough_tokens(conversation.turns), conversation.format)


def rough_tokens(turns: Sequence[Turn]) -> int:
    """Messages' tokens as listings and cost estimates count them: 4 characters a token."""
    return sum(len(t.content) for t in turns) // 4


def require(obj: Any, key: str, file: Path, record: str, kind: type | tuple[type, ...] = str) -> Any:
    """``obj[key]``, checked to be present and of type ``kind``; else a :class:`DatasetError`."""
    if not isinstance(obj, dict):
        raise DatasetError(file, record, None, f"expected a JSON object, got {type(obj).__name__}")
    names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
    if key not in obj:
        raise DatasetError(file, record, key, "missing")
    value = obj[key]
    if value is None:
        raise DatasetError(file, record, key, f"is null; expected {names}")
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DatasetError(file, record, key, f"expected {names}, got {type(value).__name__}")
    return value


def text_or_none(value: Any) -> str | None:
    """A gold answer as text (some datasets give numbers, or a list of answers: its items joined
    by commas, never Python's ``['x', 'y']``); ``None`` stays ``None``."""
    if isinstance(value, (list, tuple)):
        return ", ".join(str(item) for item in value if item is not None) or None
    return None if value is None else str(value)


def _whole_unicode(value: Any) -> tuple[Any, int]:
    """``value`` with each lone surrogate (half an emoji: JSON's ``"\\ud83d"`` alone decodes to
    one) replaced by U+FFFD, and how many were; a pair left as two code points is joined back.
    No store and no UTF-8 file can hold one: a replay failed on it with a DuckDB traceback."""
    if isinstance(value, tuple):
        fixed = [_whole_unicode(v) for v in value]
        return tuple(v for v, _ in fixed), sum(n for _, n in fixed)
    if not isinstance(value, str):
        return value, 0
    joined = whole_text(value)
    return joined, joined.count("\ufffd") - value.count("\ufffd")


def _replace_lone_surrogates(conversation: Conversation) -> None:
    """:func:`_whole_unicode` over every text of ``conversation``, said in its warnings."""
    replaced: list[str] = []

    def whole(obj: Any, names: Sequence[str], where: str) -> Any:
        changes = {}
        for name in names:
            fixed, count = _whole_unicode(getattr(obj, name))
            if count:
                changes[name] = fixed
                replaced.append(f"{where} field {name!r}")
        return dataclasses.replace(obj, **changes) if changes else obj

    conversation.id, count = _whole_unicode(conversation.id)
    if count:
        replaced.append("the conversation id")
    conversation.turns = [whole(t, ("id", "role", "text", "speaker"), f"message {t.id!r}")
                          for t in conversation.turns]
    conversation.probes = [whole(p, ("id", "question", "gold", "category", "evidence", "reference"),
                                 f"probe {p.id!r}") for p in conversation.probes]
    if replaced:
        conversation.warnings.append(
            f"{len(replaced)} text{'s hold' if len(replaced) > 1 else ' holds'} half a character (a lone UTF-16 "
            f"surrogate, such as an emoji cut in two; first: {replaced[0]}), replaced by U+FFFD '\ufffd'")


def finish(conversation: Conversation, file: Path, *, turn_records: Sequence[str] | None = None,
           probe_records: Sequence[str] | None = None) -> Conversation:
    """Check a loaded conversation: messages exist, ids are unique; evidence pointing nowhere is
    dropped, counted and reported in ``warnings``, as are messages dated before the one before them.
    ``turn_records``/``probe_records``: where each message and probe is in the file (``line 4``),
    for errors a user can go to; else they are named by their place in the conversation."""
    if not conversation.turns:
        raise EmptyConversation(file, conversation.id)
    _replace_lone_surrogates(conversation)
    if not conversation.id.strip():  # it names the thread, and a run; the library refuses a blank one
        raise DatasetError(file, f"conversation {conversation.id!r}", "conversation_id", "is blank")
    def turn_record(index: int) -> str:
        return (turn_records[index - 1] if turn_records else
                f"conversation {conversation.id!r}, its {ordinal(index)} message")

    def probe_record(number: int) -> str:
        return (probe_records[number - 1] if probe_records else
                f"conversation {conversation.id!r}, its {ordinal(number)} probe")

    seen: dict[str, int] = {}
    previous: Turn | None = None
    early: list[tuple[Turn, Turn]] = []  # (a message, the one before it in the file, dated later)
    for index, turn in enumerate(conversation.turns, start=1):  # in replay order, not the file's
        if not turn.id.strip():
            raise DatasetError(file, turn_record(index), "id", "is blank")
        if previous is not None and turn.created_at < previous.created_at:
            early.append((turn, previous))
        previous = turn
        if turn.id in seen:
            first = (turn_records[seen[turn.id] - 1] if turn_records else f"its {ordinal(seen[turn.id])} message")
            raise DatasetError(file, turn_record(index), "id", f"duplicate message id {turn.id!r} ({first} has it too)")
        seen[turn.id] = index
    if blank := [turn.id for turn in conversation.turns if not turn.text.strip()]:  # (replayed without a word)
        conversation.warnings.append(
            f"{len(blank)} message{'s are' if len(blank) > 1 else ' is'} blank (no text, or only spaces), replayed as "
            f"{'they are' if len(blank) > 1 else 'it is'} (first: {blank[0]!r})")
    if early:
        # Said up front: a replay fails on such a message only once the part of the thread it is
        # dated in has been condensed, which depends on the thresholds.
        turn, before = early[0]
        conversation.warnings.append(
            f"{len(early)} message{'s are' if len(early) > 1 else ' is'} dated before the message before it in the "
            f"file (first: {turn.id!r}, {turn.created_at.isoformat()}, after {before.id!r}, "
            f"{before.created_at.isoformat()}): memory orders messages by time, and a replay fails at such a "
            "message if the part of the conversation it is dated in has already been condensed")
    probe_ids: dict[str, int] = {}
    for number, probe in enumerate(conversation.probes, start=1):
        if probe.id in probe_ids:  # (a replay's probe table is keyed by it: it failed at the end)
            first = (probe_records[probe_ids[probe.id] - 1] if probe_records
                     else f"its {ordinal(probe_ids[probe.id])} probe")
            raise DatasetError(file, probe_record(number), "id", f"duplicate probe id {probe.id!r} ({first} has it too)")
        probe_ids[probe.id] = number
    probes = []
    for probe in conversation.probes:
        kept = tuple(e for e in probe.evidence if e in seen)
        for missing in (e for e in probe.evidence if e not in seen):
            conversation.warnings.append(
                f"evidence {missing!r} of probe {probe.id!r} points to no message")
        probes.append(dataclasses.replace(probe, evidence=kept))
    conversation.probes = probes
    return conversation
