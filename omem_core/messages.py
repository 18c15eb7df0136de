"""The two record types of the library: conversation messages and derived observation records."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

ROLES = frozenset({"user", "assistant", "system", "tool"})

RecordKind = Literal["observation", "reflection"]


def shown_id(value: object) -> str:
    """``repr(value)``, a long text cut to its first 57 characters and "…" (an error naming a
    3,000-byte id quoted all of it)."""
    if isinstance(value, str) and len(value) > 60:
        return repr(value[:57] + "…")
    return repr(value)


def check_working_memory(thread_id: object, text: object) -> None:
    """The working-memory capability's arguments checked as every adapter stores them: ``str``s of
    valid Unicode (an int was stored as it was by one adapter and raised ``AttributeError`` in
    another; a lone surrogate was stored or raised ``UnicodeEncodeError``)."""
    check_text(thread_id, "working memory", "thread_id")
    check_text(text, f"working memory of thread {thread_id!r}", "text")


def check_thread_id(thread_id: object, what: str) -> None:
    """A ``TypeError`` unless ``thread_id`` is a ``str``, for the operations that take a thread id
    alone: ``delete_thread(5)`` deleted thread ``"5"`` in SQLite (which compares 5 = '5') and did
    nothing elsewhere, silently."""
    if not isinstance(thread_id, str):
        raise TypeError(f"{what}: thread_id must be a str, got {type(thread_id).__name__} {thread_id!r}")
    check_text(thread_id, what, "thread_id")  # (a lone surrogate: no thread has it; SQLite raised
    # UnicodeEncodeError inside delete_thread's transaction and left the whole file locked)


def check_text(value: object, what: str, field: str) -> str:
    """``value`` if it is a ``str`` that can be stored (valid Unicode: no lone surrogate), else a
    ``TypeError``/``ValueError`` naming ``what`` and ``field``. Every adapter applies it the same way."""
    if not isinstance(value, str):
        raise TypeError(f"{what}: {field} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what}: {field} is not valid Unicode (a lone surrogate {value[exc.start]!r} at "
                         f"position {exc.start}); decode the text with errors='replace' first") from None
    return value


def check_batch(messages: object) -> list[Message]:
    """``save_messages``'s argument as a list (any iterable; a store may read it twice), or a
    ``TypeError`` that says how to pass one message (``save_messages(message)`` said only
    "'Message' object is not iterable"). The caller checks each item (:func:`check_message`)."""
    if isinstance(messages, Message):
        raise TypeError("save_messages takes a list of Message objects, got one Message: "
                        "save_messages([message])")
    if isinstance(messages, (str, bytes, dict)):
        raise TypeError(f"save_messages takes a list of Message objects, got a {type(messages).__name__}")
    try:
        batch = list(messages)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"save_messages takes a list of Message objects, got {type(messages).__name__}") from None
    # One id twice in the batch with other fields: said as such (each store said the message was
    # "already saved", when the batch, refused whole, saved nothing). Twice alike is one message.
    first: dict[tuple[str, str], Message] = {}
    for message in batch:
        if isinstance(message, Message) and isinstance(message.id, str) and isinstance(message.thread_id, str):
            earlier = first.setdefault((message.thread_id, message.id), message)
            if earlier is not message and earlier != message:
                raise ValueError(f"message {shown_id(message.id)} is twice in this batch for thread "
                                 f"{shown_id(message.thread_id)}, with other fields; nothing was saved")
    return batch


def check_message(message: object) -> Message:
    """``message`` if it is a storable ``Message``, else a clear error (used by every adapter)."""
    if not isinstance(message, Message):
        raise TypeError(f"save_messages takes Message objects, got {type(message).__name__}")
    what = f"message {shown_id(message.id)}"
    for name in ("id", "thread_id", "role", "content"):
        check_text(getattr(message, name), what, name)
    for name in ("id", "thread_id"):  # a blank id names nothing: a cursor or thread of "" is a bug upstream
        if not getattr(message, name).strip():
            raise ValueError(f"{what}: {name} must not be empty")
    if message.resource_id is not None:
        check_text(message.resource_id, what, "resource_id")
    return message


def _require_aware(value: datetime, what: str) -> datetime:
    """``value`` checked to be timezone-aware, as a plain ``datetime`` with a fixed UTC offset: what
    every store keeps, so a message read back is the message saved. A subclass such as pandas'
    ``Timestamp`` (which may hold nanoseconds no store keeps) becomes one, to the microsecond; a
    zone such as ``ZoneInfo("America/New_York")`` becomes its offset at that time (a time in the
    hour a clock change repeats did not equal itself read back, and saving it again was refused
    as an edit)."""
    if not isinstance(value, datetime):
        raise TypeError(f"{what}: created_at must be a datetime, got {type(value).__name__}")
    offset = value.utcoffset() if value.tzinfo is not None else None
    if offset is None:
        raise ValueError(f"{what}: created_at must be timezone-aware, got {value.isoformat()}")
    if type(value) is not datetime or not isinstance(value.tzinfo, timezone):
        value = datetime(value.year, value.month, value.day, value.hour, value.minute, value.second,
                         value.microsecond, value.tzinfo if isinstance(value.tzinfo, timezone) else timezone(offset))
    return value


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation message. Immutable: nothing in omem edits one.

    Example::

        Message(id="m1", thread_id="t1", role="user", content="hi",
                created_at=datetime.now(timezone.utc))
    """

    id: str
    thread_id: str
    role: str
    content: str
    created_at: datetime
    resource_id: str | None = None

    def __post_init__(self) -> None:
        for name in ("id", "thread_id", "role", "content"):  # (a bad type failed only at save)
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"message {self.id!r}: {name} must be a str, got {type(getattr(self, name)).__name__}")
        if self.resource_id is not None and not isinstance(self.resource_id, str):
            raise TypeError(f"message {self.id!r}: resource_id must be a str or None, got {type(self.resource_id).__name__}")
        if self.role not in ROLES:
            raise ValueError(
                f"message {self.id!r}: role must be one of {sorted(ROLES)}, got {self.role!r}"
            )
        object.__setattr__(self, "created_at", _require_aware(self.created_at, f"message {self.id!r}"))


@dataclass(frozen=True, slots=True)
class ObservationRecord:
    """A derived note. Records are additive: never edited, only deleted with their thread.

    For an observation, ``source_ids`` are the ids of the messages it condenses, oldest first.
    For a reflection, ``source_ids`` are the ids of every observation it covers.
    """

    id: str
    thread_id: str
    resource_id: str | None
    created_at: datetime
    kind: RecordKind
    source_ids: tuple[str, ...]
    text: str

    def __post_init__(self) -> None:
        if self.kind not in ("observation", "reflection"):
            raise ValueError(f"record {self.id!r}: kind must be observation or reflection")
        object.__setattr__(self, "created_at", _require_aware(self.created_at, f"record {self.id!r}"))
        if isinstance(self.source_ids, (str, bytes)):  # ("abc" became ('a', 'b', 'c'))
            raise TypeError(f"record {self.id!r}: source_ids must be a sequence of ids, got a {type(self.source_ids).__name__}")
        if not isinstance(self.source_ids, tuple):
            object.__setattr__(self, "source_ids", tuple(self.source_ids))
