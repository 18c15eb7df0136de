"""The observation port (``ObservationStore``), its optional capabilities, and the in-memory default.

A store implements the three methods of :class:`ObservationStore`. It may add capabilities that
the wrapper uses when present (each is a ``runtime_checkable`` Protocol, so
``isinstance(store, Leases)`` tells):

* :class:`RecentRecords` — ``list_recent``: reads stay flat in the thread's history;
* :class:`Leases` — ``try_lease`` / ``release_lease``: processes sharing the store run a thread's
  pass once;
* :class:`DeleteEpochs` — ``delete_epoch`` / ``save_unless_deleted``: a delete made anywhere is
  never undone by a pass still in flight elsewhere.
"""

from __future__ import annotations

import builtins
import itertools
from collections import OrderedDict
from typing import Protocol, runtime_checkable

from .memory import SyncClosing
from .messages import ObservationRecord, check_text, check_thread_id, shown_id


@runtime_checkable
class ObservationStore(Protocol):
    """Where observation and reflection records live. Every method is async.

    * ``list(thread_id)``: the thread's records in creation order;
    * ``save(record)``: append one record. Saving a record whose id is already saved with the
      same thread and ``source_ids`` is a no-op (a pass that ran twice); the same id with other
      sources is a ``ValueError`` (records are never edited);
    * ``delete_by_thread(thread_id)``: drop the thread's records.
    """

    async def list(self, thread_id: str) -> list[ObservationRecord]: ...

    async def save(self, record: ObservationRecord) -> None: ...

    async def delete_by_thread(self, thread_id: str) -> None: ...


@runtime_checkable
class RecentRecords(Protocol):
    """Optional capability: the part of ``list`` a read needs, so that reads stay flat.

    ``list_recent(thread_id)`` returns, in creation order, the observations older than the newest
    reflection that it does not cover, followed by the suffix of ``list(thread_id)`` that starts at
    the newest reflection or the newest observation, whichever is older. Without a reflection it is
    the whole list. A view of the thread (:func:`omem_core.planning.view_of`) is then the same from
    either read, and the read stays flat however old an uncovered observation is.
    """

    async def list_recent(self, thread_id: str) -> builtins.list[ObservationRecord]: ...


@runtime_checkable
class Leases(Protocol):
    """Optional capability: one holder at a time runs a thread's pass (across processes).

    ``try_lease(thread_id, holder, ttl)`` takes the lease for ``ttl`` seconds, or renews it when
    ``holder`` already has it, and returns ``False`` when another holder's lease is still live.
    ``release_lease(thread_id, holder)`` gives it back (a no-op if ``holder`` lost it).
    """

    async def try_lease(self, thread_id: str, holder: str, ttl: float) -> bool: ...

    async def release_lease(self, thread_id: str, holder: str) -> None: ...


@runtime_checkable
class DeleteEpochs(Protocol):
    """Optional capability: deletes that an in-flight pass (in any process) cannot undo.

    ``delete_epoch(thread_id)`` returns an int that identifies the thread's current incarnation;
    ``delete_by_thread`` ends that incarnation, and a later incarnation of the same thread id never
    gets the same number. ``save_unless_deleted(record, epoch)`` saves ``record`` and returns
    ``True`` only if the thread is still in incarnation ``epoch``, checked in the same transaction
    as the save; otherwise it saves nothing and returns ``False``.

    A pass reads the epoch *before* it reads the messages it condenses, so a record is saved only
    if no delete happened in between.
    """

    async def delete_epoch(self, thread_id: str) -> int: ...

    async def save_unless_deleted(self, record: ObservationRecord, epoch: int) -> bool: ...


def check_record(record: object) -> ObservationRecord:
    """``record`` if it is a storable ``ObservationRecord`` (valid Unicode text), else a clear error."""
    if not isinstance(record, ObservationRecord):
        raise TypeError(f"save takes an ObservationRecord, got {type(record).__name__}")
    what = f"record {shown_id(record.id)}"
    for name in ("id", "thread_id", "text"):
        check_text(getattr(record, name), what, name)
    if record.resource_id is not None:
        check_text(record.resource_id, what, "resource_id")
    for source in record.source_ids:
        check_text(source, what, "source_ids")
    return record


def already_saved(existing: ObservationRecord, record: ObservationRecord) -> bool:
    """Whether saving ``record`` over ``existing`` (same id) is a no-op, or raise ``ValueError``."""
    if existing.thread_id == record.thread_id and existing.source_ids == record.source_ids:
        return True
    if existing.thread_id != record.thread_id:
        raise ValueError(f"record id {record.id!r} is already used by a record of thread {existing.thread_id!r}; "
                         "give each record its own id")
    raise ValueError(f"record {record.id!r} is already saved with other sources; records are never edited")


class ReflectionCache:
    """Decoded long reflections of a persistent store, by row ``seq`` (the SQLite and PostgreSQL
    adapters share it). A reflection's source list grows with its thread; decoding it on every
    read would make reads grow with the history. Bounded by the source ids held (``max_ids``),
    least recently used out first. Rows are immutable and their ``seq`` never reused, so an entry
    stays valid across processes and hosts."""

    LONG = 512  # a reflection with fewer sources is cheap to decode: not kept

    def __init__(self, max_ids: int) -> None:
        self.max_ids = max_ids
        self._records: OrderedDict[int, ObservationRecord] = OrderedDict()
        self._ids = 0

    def __contains__(self, seq: int) -> bool:
        return seq in self._records

    def get(self, seq: int) -> ObservationRecord | None:
        record = self._records.get(seq)
        if record is not None:
            self._records.move_to_end(seq)
        return record

    def keep(self, seq: int, record: ObservationRecord) -> None:
        if record.kind != "reflection" or not self.LONG <= len(record.source_ids) <= self.max_ids:
            return
        self._records[seq] = record
        self._ids += len(record.source_ids)
        while self._ids > self.max_ids:
            _, evicted = self._records.popitem(last=False)
            self._ids -= len(evicted.source_ids)

    def forget_thread(self, thread_id: str) -> None:
        for seq in [seq for seq, record in self._records.items() if record.thread_id == thread_id]:
            self._ids -= len(self._records.pop(seq).source_ids)


class _ThreadRecords:
    __slots__ = ("records", "ids", "newest_reflection", "newest_observation", "uncovered")

    def __init__(self) -> None:
        self.records: list[ObservationRecord] = []
        self.ids: dict[str, ObservationRecord] = {}
        self.newest_reflection = -1
        self.newest_observation = -1
        self.uncovered: list[int] = []  # the observations before the newest reflection it does not cover


class InMemoryObservationStore(SyncClosing):
    """The default ``ObservationStore``, with the ``list_recent`` and delete-epoch capabilities.

    Records live as long as the process; losing them (a restart) costs correctness nothing: the
    next read re-observes. A deleted thread leaves nothing behind (no tombstone). ``close()``,
    ``with`` and ``async with`` work as for the SQLite store; there is nothing to release.
    """

    def _close(self) -> None:
        pass  # (nothing held: the records live as long as the object)

    def __init__(self) -> None:
        self._threads: dict[str, _ThreadRecords] = {}
        self._epochs: dict[str, int] = {}
        self._serial = itertools.count(1)
        self._owners: dict[str, str] = {}  # record id -> its thread: an id names one record, as in SQL stores

    async def list(self, thread_id: str) -> list[ObservationRecord]:
        check_thread_id(thread_id, "list")
        thread = self._threads.get(thread_id)
        return list(thread.records) if thread else []

    async def list_recent(self, thread_id: str) -> builtins.list[ObservationRecord]:
        check_thread_id(thread_id, "list_recent")
        thread = self._threads.get(thread_id)
        if thread is None:
            return []
        if thread.newest_reflection < 0:
            return list(thread.records)
        start = min(thread.newest_reflection, thread.newest_observation)
        return [thread.records[i] for i in thread.uncovered if i < start] + thread.records[start:]

    async def save(self, record: ObservationRecord) -> None:
        self._save(check_record(record))

    def _save(self, record: ObservationRecord) -> None:
        owner = self._owners.get(record.id)
        if owner is not None and owner != record.thread_id:
            already_saved(self._threads[owner].ids[record.id], record)  # raises: another thread's record
        thread = self._threads.setdefault(record.thread_id, _ThreadRecords())
        existing = thread.ids.get(record.id)
        if existing is not None and already_saved(existing, record):
            return
        self._owners[record.id] = record.thread_id
        thread.ids[record.id] = record
        thread.records.append(record)
        index = len(thread.records) - 1
        if record.kind == "reflection":
            thread.newest_reflection = index
            thread.uncovered = _uncovered(thread.records, record)
        else:
            thread.newest_observation = index

    async def delete_by_thread(self, thread_id: str) -> None:
        check_thread_id(thread_id, "delete_by_thread")
        thread = self._threads.pop(thread_id, None)
        for record_id in thread.ids if thread is not None else ():
            self._owners.pop(record_id, None)
        self._epochs.pop(thread_id, None)

    async def delete_epoch(self, thread_id: str) -> int:
        check_thread_id(thread_id, "delete_epoch")
        epoch = self._epochs.get(thread_id)
        if epoch is None:
            epoch = self._epochs[thread_id] = next(self._serial)
        return epoch

    async def save_unless_deleted(self, record: ObservationRecord, epoch: int) -> bool:
        check_record(record)
        if self._epochs.get(record.thread_id) != epoch:
            return False
        self._save(record)
        return True


def _uncovered(records: builtins.list[ObservationRecord], reflection: ObservationRecord) -> builtins.list[int]:
    """Indexes of the observations before ``reflection`` (the last record) that it does not cover.
    Runs once per saved reflection (its cost is the thread's records, like the reflection's own
    source list)."""
    sources = frozenset(reflection.source_ids)
    return [index for index in range(len(records) - 1)
            if records[index].kind == "observation" and records[index].id not in sources]


def create_in_memory_observation_store() -> ObservationStore:
    """The zero-dependency default ``ObservationStore``."""
    return InMemoryObservationStore()
