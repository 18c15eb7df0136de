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
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

from .memory import SyncClosing, check_read
from .messages import Message, ObservationRecord, check_batch, check_message, check_thread_id, check_working_memory
from .observations import ReflectionCache, already_saved, check_record

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
    # 3: delete epochs (one row per live thread that had a pass; a delete removes it, and
    # AUTOINCREMENT never hands the same number out again), and per reflection the older
    # observations it does not cover (a JSON list of seqs, usually empty), so that list_recent
    # can include them without decoding the reflection's sources
    """
    CREATE TABLE IF NOT EXISTS omem_threads (
        epoch INTEGER PRIMARY KEY AUTOINCREMENT,
        thread_id TEXT NOT NULL UNIQUE
    );
    ALTER TABLE omem_records ADD COLUMN uncovered TEXT;
    UPDATE omem_records SET uncovered = (
        SELECT json_group_array(seq) FROM (
            SELECT o.seq AS seq FROM omem_records AS o
            WHERE o.thread_id = omem_records.thread_id AND o.kind = 'observation' AND o.seq < omem_records.seq
              AND o.id NOT IN (SELECT value FROM json_each(omem_records.source_ids))
            ORDER BY o.seq))
    WHERE kind = 'reflection';
    """,
]


def _micros(value: datetime) -> int:
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def use_wal(con: sqlite3.Connection, wait_s: float = 30.0) -> None:
    """Put ``con``'s database in WAL mode (stored in the file: a no-op once done).

    Processes that open the same new file at once all try this switch, and SQLite fails it at once
    with "database is locked" for all but one — it does not wait on the busy timeout there — so it
    is retried until ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                con.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _rollback(con: sqlite3.Connection) -> None:
    """Roll back the transaction an error ended, if SQLite has not already: after "database or disk
    is full" (or an I/O error) it rolls back by itself, and an unconditional ROLLBACK then raised
    "cannot rollback - no transaction is active" in place of the real error."""
    if con.in_transaction:
        con.execute("ROLLBACK")


class _Database:
    """One connection per store object, serialised by a lock; the schema migrated on open."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.lock = threading.Lock()
        self._closed = False
        try:
            self._con = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:  # sqlite3 names no file ("unable to open database file")
            raise type(exc)(f"cannot open the SQLite file {self.path}: {exc}") from exc
        try:
            self._refuse_newer()  # before the switch to WAL, which is a change to the file
            use_wal(self.con)
            self.con.execute("PRAGMA synchronous=NORMAL")
            self.con.execute("PRAGMA busy_timeout=30000")
            self.migrate()
        except sqlite3.Error as exc:  # "file is not a database", a read-only file, …
            self._con.close()
            raise type(exc)(f"cannot use the SQLite file {self.path}: {exc}") from exc

    @property
    def con(self) -> sqlite3.Connection:
        """The connection; a ``RuntimeError`` naming the file once the store is closed (sqlite3's
        own "Cannot operate on a closed database." named neither the store nor the file)."""
        if self._closed:
            raise RuntimeError(f"this store (SQLite file {self.path}) is closed")
        return self._con

    def _refuse_newer(self) -> None:
        """A ``sqlite3.DatabaseError`` for a newer omem's file: writing it with this one's
        statements could corrupt it."""
        found = self.con.execute("PRAGMA user_version").fetchone()[0]
        if found > len(_MIGRATIONS):
            raise sqlite3.DatabaseError(
                f"its schema is version {found}, written by a newer omem (this one knows versions up to "
                f"{len(_MIGRATIONS)}): upgrade omem to use it; the file was not changed")

    def migrate(self) -> None:
        """Apply the migrations this file lacks. The version is read again under the write lock:
        another process opening the same file may have applied them meanwhile."""
        with self.lock:
            self._refuse_newer()
            for number, script in enumerate(_MIGRATIONS, start=1):
                if number <= self.con.execute("PRAGMA user_version").fetchone()[0]:
                    continue
                self.con.execute("BEGIN IMMEDIATE")
                if number <= self.con.execute("PRAGMA user_version").fetchone()[0]:
                    self.con.execute("COMMIT")  # applied by another process while we waited
                    continue
                try:
                    for statement in filter(str.strip, script.split(";")):
                        self.con.execute(statement)
                    self.con.execute(f"PRAGMA user_version = {number}")
                    self.con.execute("COMMIT")
                except Exception:
                    _rollback(self.con)
                    raise

    def close(self) -> None:
        self._closed = True
        self._con.close()


def schema_version(path: str | Path) -> int:
    """The schema version of the SQLite file at ``path`` (0: not an omem file yet), read without
    creating it (a missing file is a ``FileNotFoundError``) or changing it."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no SQLite file at {path}")
    con = sqlite3.connect(str(path))  # (read-only, it left -wal and -shm files beside a WAL file)
    try:
        return int(con.execute("PRAGMA user_version").fetchone()[0])
    finally:
        con.close()


class SQLiteMemoryStore(SyncClosing):
    """A ``MemoryStore`` in one SQLite file, with the working-memory capability.

    Ordered by ``created_at`` then insertion, like ``InMemoryMemoryStore``; re-saving an identical
    message is a no-op, a different one with the same id a ``ValueError``.
    """

    def __init__(self, path: str | Path) -> None:
        self._db = _Database(path)

    def _close(self) -> None:
        self._db.close()

    async def save_messages(self, messages: Iterable[Message]) -> None:
        messages = check_batch(messages)  # read twice below: a generator would be empty the second time
        for message in messages:
            check_message(message)  # the whole batch first, the same checks as the in-memory store
        db = self._db
        with db.lock:
            db.con.execute("BEGIN IMMEDIATE")
            try:
                for message in messages:
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
                _rollback(db.con)
                raise

    @staticmethod
    def _message(thread_id: str, message_id: str, role: str, content: str, created_at: str,
                 resource_id: str | None) -> Message:
        return Message(id=message_id, thread_id=thread_id, role=role, content=content,
                       created_at=datetime.fromisoformat(created_at), resource_id=resource_id)

    async def recall(self, thread_id: str, *, last: int, before: str | None = None) -> list[Message]:
        last = check_read(thread_id, last, before)  # (a plain int: a NumPy one is one for SQL too)
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
        check_thread_id(thread_id, "delete_thread")
        db = self._db
        with db.lock:
            db.con.execute("BEGIN IMMEDIATE")
            try:
                db.con.execute("DELETE FROM omem_messages WHERE thread_id = ?", (thread_id,))
                db.con.execute("DELETE FROM omem_working_memory WHERE thread_id = ?", (thread_id,))
                db.con.execute("COMMIT")
            except BaseException:  # (left open, it held the file's write lock for every process)
                _rollback(db.con)
                raise

    async def get_working_memory(self, thread_id: str) -> str | None:
        check_thread_id(thread_id, "get_working_memory")
        with self._db.lock:
            row = self._db.con.execute("SELECT text FROM omem_working_memory WHERE thread_id = ?",
                                       (thread_id,)).fetchone()
        return row[0] if row else None

    async def update_working_memory(self, thread_id: str, text: str) -> None:
        check_working_memory(thread_id, text)
        with self._db.lock:
            self._db.con.execute("INSERT INTO omem_working_memory VALUES (?, ?) "
                                 "ON CONFLICT (thread_id) DO UPDATE SET text = excluded.text", (thread_id, text))


class SQLiteObservationStore(SyncClosing):
    """An ``ObservationStore`` in one SQLite file, with the ``list_recent`` capability, the lease
    capability (``try_lease``/``release_lease``) that lets processes sharing the file run each
    thread's compaction pass exactly once, and the delete-epoch capability
    (``delete_epoch``/``save_unless_deleted``) that keeps a delete made by any process from being
    undone by a pass still in flight in another.

    ``cache_ids`` bounds the decoded long reflections kept in memory (counted in source ids): a
    reflection's source list grows with the thread, and decoding it on every read would make
    reads grow with the history. Rows are immutable and their ``seq`` is never reused, so the
    cache is valid across processes.
    """

    def __init__(self, path: str | Path, *, cache_ids: int = 500_000) -> None:
        self._db = _Database(path)
        self._cache = ReflectionCache(cache_ids)

    def _close(self) -> None:
        self._db.close()

    _COLUMNS = "id, thread_id, resource_id, created_at, kind, source_ids, text"
    _LIGHT = ("seq, id, thread_id, resource_id, created_at, kind, "
              "CASE WHEN kind = 'reflection' THEN NULL ELSE source_ids END, text")

    def _records(self, rows: builtins.list[tuple]) -> builtins.list[ObservationRecord]:
        """Records from ``_LIGHT`` rows; a reflection's source list is decoded once per process
        (then served from the cache). Call with the lock held."""
        records = []
        for seq, record_id, thread_id, resource_id, created_at, kind, source_ids, text in rows:
            if kind == "reflection":
                cached = self._cache.get(seq)
                if cached is not None:
                    records.append(cached)
                    continue
                source_ids = self._db.con.execute("SELECT source_ids FROM omem_records WHERE seq = ?",
                                                  (seq,)).fetchone()[0]
            record = ObservationRecord(id=record_id, thread_id=thread_id, resource_id=resource_id,
                                       created_at=datetime.fromisoformat(created_at), kind=kind,
                                       source_ids=tuple(json.loads(source_ids)), text=text)
            self._cache.keep(seq, record)
            records.append(record)
        return records

    async def list(self, thread_id: str) -> list[ObservationRecord]:
        check_thread_id(thread_id, "list")
        with self._db.lock:
            rows = self._db.con.execute(f"SELECT {self._LIGHT} FROM omem_records WHERE thread_id = ? ORDER BY seq",
                                        (thread_id,)).fetchall()
            return self._records(rows)

    async def list_recent(self, thread_id: str) -> builtins.list[ObservationRecord]:
        check_thread_id(thread_id, "list_recent")
        con = self._db.con
        with self._db.lock:  # index lookups, not a scan of the thread
            reflection = con.execute("SELECT seq, uncovered FROM omem_records WHERE thread_id = ? AND "
                                     "kind = 'reflection' ORDER BY seq DESC LIMIT 1", (thread_id,)).fetchone()
            start, uncovered = 0, []
            if reflection is not None:
                observation = con.execute("SELECT max(seq) FROM omem_records WHERE thread_id = ? AND "
                                          "kind = 'observation'", (thread_id,)).fetchone()[0]
                start = min(v for v in (reflection[0], observation) if v is not None)
                uncovered = [seq for seq in json.loads(reflection[1] or "[]") if seq < start]
            rows = [con.execute(f"SELECT {self._LIGHT} FROM omem_records WHERE seq = ?", (seq,)).fetchone()
                    for seq in uncovered]
            rows += con.execute(f"SELECT {self._LIGHT} FROM omem_records WHERE thread_id = ? AND seq >= ? "
                                "ORDER BY seq", (thread_id, start)).fetchall()
            return self._records(rows)

    async def save(self, record: ObservationRecord) -> None:
        await self.save_unless_deleted(record, None)

    async def save_unless_deleted(self, record: ObservationRecord, epoch: int | None) -> bool:
        """Save ``record`` if its thread is still in incarnation ``epoch`` (``None``: always), in
        one transaction with that check; ``False`` when it was deleted meanwhile."""
        check_record(record)
        con = self._db.con
        with self._db.lock:
            con.execute("BEGIN IMMEDIATE")
            try:
                if epoch is not None:
                    row = con.execute("SELECT epoch FROM omem_threads WHERE thread_id = ?",
                                      (record.thread_id,)).fetchone()
                    if row is None or row[0] != epoch:
                        con.execute("ROLLBACK")
                        return False
                existing = con.execute(f"SELECT {self._COLUMNS} FROM omem_records WHERE id = ?",
                                       (record.id,)).fetchone()
                if existing is not None:
                    already_saved(self._record(existing), record)  # a no-op, or ValueError
                    con.execute("ROLLBACK")
                    return True
                uncovered = None
                if record.kind == "reflection":
                    sources = frozenset(record.source_ids)
                    uncovered = json.dumps([seq for seq, record_id in con.execute(
                        "SELECT seq, id FROM omem_records WHERE thread_id = ? AND kind = 'observation' "
                        "ORDER BY seq", (record.thread_id,)) if record_id not in sources])
                con.execute(
                    f"INSERT INTO omem_records ({self._COLUMNS}, uncovered) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (record.id, record.thread_id, record.resource_id, record.created_at.isoformat(), record.kind,
                     json.dumps(list(record.source_ids)), record.text, uncovered))
                con.execute("COMMIT")
                return True
            except BaseException:
                _rollback(con)
                raise

    @staticmethod
    def _record(row: tuple) -> ObservationRecord:
        record_id, thread_id, resource_id, created_at, kind, source_ids, text = row
        return ObservationRecord(id=record_id, thread_id=thread_id, resource_id=resource_id,
                                 created_at=datetime.fromisoformat(created_at), kind=kind,
                                 source_ids=tuple(json.loads(source_ids)), text=text)

    async def delete_by_thread(self, thread_id: str) -> None:
        """Drop the thread's records and end its incarnation (a pass in flight anywhere then
        saves nothing), in one transaction. Nothing about the thread is kept."""
        check_thread_id(thread_id, "delete_by_thread")
        con = self._db.con
        with self._db.lock:
            con.execute("BEGIN IMMEDIATE")
            try:
                con.execute("DELETE FROM omem_records WHERE thread_id = ?", (thread_id,))
                con.execute("DELETE FROM omem_threads WHERE thread_id = ?", (thread_id,))
                # Leases a crashed process left (they name their thread): expired, so no one's.
                con.execute("DELETE FROM omem_leases WHERE expires_at <= ?", (time.time(),))
                con.execute("COMMIT")
            except BaseException:
                _rollback(con)
                raise
            self._cache.forget_thread(thread_id)

    async def delete_epoch(self, thread_id: str) -> int:
        check_thread_id(thread_id, "delete_epoch")
        con = self._db.con
        with self._db.lock:
            row = con.execute("SELECT epoch FROM omem_threads WHERE thread_id = ?", (thread_id,)).fetchone()
            if row is None:
                con.execute("INSERT OR IGNORE INTO omem_threads (thread_id) VALUES (?)", (thread_id,))
                row = con.execute("SELECT epoch FROM omem_threads WHERE thread_id = ?", (thread_id,)).fetchone()
            return int(row[0])

    # -- the lease capability: cross-process dedup of compaction passes -------------------------

    async def try_lease(self, thread_id: str, holder: str, ttl: float) -> bool:
        """Take (or renew) the thread's lease for ``ttl`` seconds unless another live holder has it.

        A holder that crashed stops renewing; its lease expires and the next caller takes it.
        """
        check_thread_id(thread_id, "try_lease")
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
                _rollback(db.con)
                raise

    async def release_lease(self, thread_id: str, holder: str) -> None:
        check_thread_id(thread_id, "release_lease")
        with self._db.lock:
            self._db.con.execute("DELETE FROM omem_leases WHERE thread_id = ? AND holder = ?", (thread_id, holder))
