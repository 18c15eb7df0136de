"""The observation port (``ObservationStore``) and its in-memory default."""

from __future__ import annotations

import builtins

from typing import Protocol, runtime_checkable

from .messages import ObservationRecord


@runtime_checkable
class ObservationStore(Protocol):
    """Where observation and reflection records live. Every method is async.

    * ``list(thread_id)``: the thread's records in creation order;
    * ``save(record)``: append one record;
    * ``delete_by_thread(thread_id)``: drop the thread's records.

    Optional capability, used by the wrapper when present so that a read stays flat in the
    thread's history: ``list_recent(thread_id)`` returns the suffix of ``list(thread_id)`` that
    starts at the newest reflection or at the newest observation, whichever is older (the whole
    list when there is no reflection).
    """

    async def list(self, thread_id: str) -> list[ObservationRecord]: ...

    async def save(self, record: ObservationRecord) -> None: ...

    async def delete_by_thread(self, thread_id: str) -> None: ...


class _ThreadRecords:
    __slots__ = ("records", "ids", "newest_reflection", "newest_observation")

    def __init__(self) -> None:
        self.records: list[ObservationRecord] = []
        self.ids: set[str] = set()
        self.newest_reflection = -1
        self.newest_observation = -1


class InMemoryObservationStore:
    """The default ``ObservationStore``: records live as long as the process.

    Losing them (a restart) costs correctness nothing: the next read re-observes.
    """

    def __init__(self) -> None:
        self._threads: dict[str, _ThreadRecords] = {}

    async def list(self, thread_id: str) -> list[ObservationRecord]:
        thread = self._threads.get(thread_id)
        return list(thread.records) if thread else []

    async def list_recent(self, thread_id: str) -> builtins.list[ObservationRecord]:
        thread = self._threads.get(thread_id)
        if thread is None:
            return []
        if thread.newest_reflection < 0:
            return list(thread.records)
        start = thread.newest_reflection
        if 0 <= thread.newest_observation < start:
            start = thread.newest_observation
        return thread.records[start:]

    async def save(self, record: ObservationRecord) -> None:
        if not isinstance(record, ObservationRecord):
            raise TypeError(f"save takes an ObservationRecord, got {type(record).__name__}")
        thread = self._threads.setdefault(record.thread_id, _ThreadRecords())
        if record.id in thread.ids:
            raise ValueError(f"record {record.id!r} is already saved; records are never edited")
        thread.ids.add(record.id)
        thread.records.append(record)
        if record.kind == "reflection":
            thread.newest_reflection = len(thread.records) - 1
        else:
            thread.newest_observation = len(thread.records) - 1

    async def delete_by_thread(self, thread_id: str) -> None:
        self._threads.pop(thread_id, None)


def create_in_memory_observation_store() -> ObservationStore:
    """The zero-dependency default ``ObservationStore``."""
    return InMemoryObservationStore()
