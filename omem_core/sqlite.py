"""SQLite adapters for both ports (Python's standard ``sqlite3``; no new dependency).

One file can hold both stores. WAL mode, a versioned schema (``PRAGMA user_version``, migrated
on open), and indexes that keep a cursorless recall, a paging read and ``list_recent``
independent of the thread's length::

    from omem_core import Memory, create_observational_memory_store
    from omem_core.sqlite import SQLiteMemoryStore, SQLiteObservationStore

    store = create_observational_memory_store(
        SQLiteMemoryStore("memory.db"), observer="omem/extractive",
        observations=SQLiteObservationStore("memory.db"))

Queries are short local reads and writes, so they run inline on the event loop.
"""

from __future__ import annotations

import builtins

import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from .messages import Message, ObservationRecord

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

_MIGRATIONS: list[str] = [
    # 1: messages, working memory, records
    """
    CREATE TABLE IF NOT EXISTS omem_messages (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        thread_id TEXT NOT NULL,
        id TEXT NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        created_at TEXT NOT NULL,
        created_us INTEGER NOT NULL,
        resource_id TEXT,
        UNIQUE (thread_id, id)
    );
    CREATE INDEX IF NOT EXISTS omem_messages_order ON omem_messages (thread_id, created_us, seq);
    CREATE TABLE IF NOT EXISTS omem_working_memory (
        thread_id TEXT PRIMARY KEY,
        text TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS omem_records (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        thread_id TEXT NOT NULL,
        resource_id TEXT,
        created_at TEXT NOT NULL,
        kind TEXT NOT NULL,
        source_ids TEXT NOT NULL,
        text TEXT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS omem_records_thread ON omem_records (thread_id, seq);
    CREATE INDEX IF NOT EXISTS omem_records_kind ON omem_records (thread_id, kind, seq);
    """,
    # 2: leases, so that one process at a time runs a thread's compaction pass
    """
    CREATE TABLE IF NOT EXISTS omem_leases (
        thread_id TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        expires_at REAL NOT NULL
    );
    """,
]


def _micros(value: datetime) -> int:
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


class _Database:
    """One connection per store object, serialised by a lock; the schema migrated on open."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.lock = threading.Lock()
        self.con = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute("PRAGMA synchronous=NORMAL")
        self.con.execute("PRAGMA busy_timeout=30000")
        self.migrate()

    def migrate(self) -> None:
        with self.lock:
            version = self.con.execute("PRAGMA user_version").fetchone()[0]
            for number, script in enumerate(_MIGRATIONS, start=1):
                if number <= version:
                    continue
                self.con.execute("BEGIN IMMEDIATE")
                try:
                    for statement in filter(str.strip, script.split(";")):
                        self.con.execute(statement)
                    self.con.execute(f"PRAGMA user_version = {number}")
                    self.con.execute("COMMIT")
                except Exception:
                    self.con.execute("ROLLBACK")
                    raise

    def close(self) -> None:
        self.con.close()


def schema_version(path: str | Path) -> int:
    with sqlite3.connect(str(path)) as con:
        return int(con.execute("PRAGMA user_version").fetchone()[0])


class SQLiteMemoryStore:
    """A ``MemoryStore`` in one SQLite file, with the working-memory capability.

    Ordered by ``created_at`` then insertion, like ``InMemoryMemoryStore``; re-saving an identical
    message is a no-op, a different one with the same id a ``ValueError``.
    """

    def __init__(self, path: str | Path) -> None:
        self._db = _Database(path)

    def close(self) -> None:
        self._db.close()

    async def save_messages(self, messages: Sequence[Message]) -> None:
        db = self._db
        with db.lock:
            db.con.execute("BEGIN IMMEDIATE")
            try:
                for message in messages:
                    if not isinstance(message, Message):
                        raise TypeError(f"save_messages takes Message objects, got {type(message).__name__}")
                    row = db.con.execute(
                        "SELECT role, content, created_at, resource_id FROM omem_messages "
                        "WHERE thread_id = ? AND id = ?", (message.thread_id, message.id)).fetchone()
                    if row is not None:
                        if self._message(message.thread_id, message.id, *row) != message:
                            raise ValueError(f"message {message.id!r} is already saved in thread "
                                             f"{message.thread_id!r} with other fields; messages are immutable")
                        continue
                    db.con.execute(
                        "INSERT INTO omem_messages (thread_id, id, role, content, created_at, created_us, resource_id) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (message.thread_id, message.id, message.role, message.content,
                         message.created_at.isoformat(), _micros(message.created_at), message.resource_id))
                db.con.execute("COMMIT")
            except BaseException:
                db.con.execute("ROLLBACK")
                raise

    @staticmethod
    def _message(thread_id: str, message_id: str, role: str, content: str, created_at: str,
                 resource_id: str | None) -> Message:
        return Message(id=message_id, thread_id=thread_id, role=role, content=content,
                       created_at=datetime.fromisoformat(created_at), resource_id=resource_id)

    async def recall(self, thread_id: str, *, last: int, before: str | None = None) -> list[Message]:
        if last < 0:
            raise ValueError(f"last must be >= 0, got {last}")
        db = self._db
        with db.lock:
            if before is not None:
                cursor = db.con.execute("SELECT created_us, seq FROM omem_messages WHERE thread_id = ? AND id = ?",
                                        (thread_id, before)).fetchone()
                if cursor is None:
                    raise KeyError(f"unknown cursor: no message {before!r} in thread {thread_id!r}")
                rows = db.con.execute(
                    "SELECT id, role, content, created_at, resource_id FROM omem_messages "
                    "WHERE thread_id = ? AND (created_us, seq) < (?, ?) "
                    "ORDER BY created_us DESC, seq DESC LIMIT ?", (thread_id, cursor[0], cursor[1], last)).fetchall()
            else:
                rows = db.con.execute(
                    "SELECT id, role, content, created_at, resource_id FROM omem_messages WHERE thread_id = ? "
                    "ORDER BY created_us DESC, seq DESC LIMIT ?", (thread_id, last)).fetchall()
        return [self._message(thread_id, *row) for row in reversed(rows)]

    async def delete_thread(self, thread_id: str) -> None:
        db = self._db
        with db.lock:
            db.con.execute("BEGIN IMMEDIATE")
            db.con.execute("DELETE FROM omem_messages WHERE thread_id = ?", (thread_id,))
            db.con.execute("DELETE FROM omem_working_memory WHERE thread_id = ?", (thread_id,))
            db.con.execute("COMMIT")

    async def get_working_memory(self, thread_id: str) -> str | None:
        with self._db.lock:
            row = self._db.con.execute("SELECT text FROM omem_working_memory WHERE thread_id = ?",
                                       (thread_id,)).fetchone()
        return row[0] if row else None

    async def update_working_memory(self, thread_id: str, text: str) -> None:
        with self._db.lock:
            self._db.con.execute("INSERT INTO omem_working_memory VALUES (?, ?) "
                                 "ON CONFLICT (thread_id) DO UPDATE SET text = excluded.text", (thread_id, text))


class SQLiteObservationStore:
    """An ``ObservationStore`` in one SQLite file, with the ``list_recent`` capability and the lease
    capability (``try_lease``/``release_lease``) that lets processes sharing the file run each
    thread's compaction pass exactly once."""

    def __init__(self, path: str | Path) -> None:
        self._db = _Database(path)

    def close(self) -> None:
        self._db.close()

    @staticmethod
    def _record(row: tuple) -> ObservationRecord:
        record_id, thread_id, resource_id, created_at, kind, source_ids, text = row
        return ObservationRecord(id=record_id, thread_id=thread_id, resource_id=resource_id,
                                 created_at=datetime.fromisoformat(created_at), kind=kind,
                                 source_ids=tuple(json.loads(source_ids)), text=text)

    _COLUMNS = "id, thread_id, resource_id, created_at, kind, source_ids, text"

    async def list(self, thread_id: str) -> list[ObservationRecord]:
        with self._db.lock:
            rows = self._db.con.execute(f"SELECT {self._COLUMNS} FROM omem_records WHERE thread_id = ? ORDER BY seq",
                                        (thread_id,)).fetchall()
        return [self._record(row) for row in rows]

    async def list_recent(self, thread_id: str) -> builtins.list[ObservationRecord]:
        with self._db.lock:
            newest = {kind: self._db.con.execute(  # two index lookups, not a scan of the thread
                "SELECT max(seq) FROM omem_records WHERE thread_id = ? AND kind = ?", (thread_id, kind)).fetchone()[0]
                for kind in ("reflection", "observation")}
            start = 0
            if newest["reflection"] is not None:
                start = min(v for v in newest.values() if v is not None)
            rows = self._db.con.execute(
                f"SELECT {self._COLUMNS} FROM omem_records WHERE thread_id = ? AND seq >= ? ORDER BY seq",
                (thread_id, start)).fetchall()
        return [self._record(row) for row in rows]

    async def save(self, record: ObservationRecord) -> None:
        if not isinstance(record, ObservationRecord):
            raise TypeError(f"save takes an ObservationRecord, got {type(record).__name__}")
        try:
            with self._db.lock:
                self._db.con.execute(
                    f"INSERT INTO omem_records ({self._COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (record.id, record.thread_id, record.resource_id, record.created_at.isoformat(), record.kind,
                     json.dumps(list(record.source_ids)), record.text))
        except sqlite3.IntegrityError as exc:
            raise ValueError(f"record {record.id!r} is already saved; records are never edited") from exc

    async def delete_by_thread(self, thread_id: str) -> None:
        with self._db.lock:
            self._db.con.execute("DELETE FROM omem_records WHERE thread_id = ?", (thread_id,))

    # -- the lease capability: cross-process dedup of compaction passes -------------------------

    async def try_lease(self, thread_id: str, holder: str, ttl: float) -> bool:
        """Take (or renew) the thread's lease for ``ttl`` seconds unless another live holder has it.

        A holder that crashed stops renewing; its lease expires and the next caller takes it.
        """
        db = self._db
        now = time.time()
        with db.lock:
            db.con.execute("BEGIN IMMEDIATE")
            try:
                row = db.con.execute("SELECT holder, expires_at FROM omem_leases WHERE thread_id = ?",
                                     (thread_id,)).fetchone()
                if row is not None and row[0] != holder and row[1] > now:
                    db.con.execute("COMMIT")
                    return False
                db.con.execute("INSERT INTO omem_leases VALUES (?, ?, ?) ON CONFLICT (thread_id) DO UPDATE "
                               "SET holder = excluded.holder, expires_at = excluded.expires_at",
                               (thread_id, holder, now + ttl))
                db.con.execute("COMMIT")
                return True
            except BaseException:
                db.con.execute("ROLLBACK")
                raise

    async def release_lease(self, thread_id: str, holder: str) -> None:
        with self._db.lock:
            self._db.con.execute("DELETE FROM omem_leases WHERE thread_id = ? AND holder = ?", (thread_id, holder))
