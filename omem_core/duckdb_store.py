"""An ``ObservationStore`` in a DuckDB file (``pip install duckdb``; loaded only when used).

    from omem_core.duckdb_store import DuckDBObservationStore
    store = create_observational_memory_store(inner, observations=DuckDBObservationStore("notes.duckdb"),
                                              observer=model, reflector=model)

It has the ``list_recent`` and delete-epoch capabilities, as the in-memory store has; not the
lease capability. DuckDB lets one process hold a file read-write: the store keeps its file open
and a second process opening it gets an ``OSError`` that says so. For several processes or hosts sharing
notes, use :class:`omem_core.sqlite.SQLiteObservationStore` or
:class:`omem_core.postgres.PostgresObservationStore`.

Records are stored exactly (text, ids, ``created_at`` with its offset, as ISO 8601 text) and in
creation order (a sequence number, not the id). A DuckDB file is also easy to read afterwards:
``SELECT * FROM omem_records``. The schema is versioned (table ``omem_schema``): a file written by a
newer omem is refused with a ``ValueError``, unchanged.
"""

from __future__ import annotations

import builtins
import json
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from .memory import SyncClosing
from .messages import ObservationRecord, check_thread_id
from .observations import already_saved, check_record

_SCHEMA = """
CREATE SEQUENCE IF NOT EXISTS omem_seq START 1;
CREATE TABLE IF NOT EXISTS omem_records (
    seq BIGINT PRIMARY KEY,
    id VARCHAR NOT NULL,
    thread_id VARCHAR NOT NULL,
    resource_id VARCHAR,
    created_at VARCHAR NOT NULL,      -- ISO 8601 with its offset, as given
    kind VARCHAR NOT NULL,
    source_ids VARCHAR NOT NULL,      -- JSON list
    text VARCHAR NOT NULL,
    UNIQUE (thread_id, id)
);
CREATE TABLE IF NOT EXISTS omem_epochs (thread_id VARCHAR PRIMARY KEY, epoch BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS omem_schema (version INTEGER NOT NULL);
"""
SCHEMA_VERSION = 1  # the omem_schema row a file holds (files written before it had none: version 1 too)


class DuckDBObservationStore(SyncClosing):
    """An ``ObservationStore`` in one DuckDB file (``":memory:"`` for none), held open by this
    process; ``close()`` (or ``with``) releases it. A file another process holds is an ``OSError``
    that says so."""

    def __init__(self, path: str | Path) -> None:
        try:
            import duckdb  # (the optional driver: only when this store is used)
        except ImportError as exc:
            raise ImportError("DuckDBObservationStore needs the duckdb package: pip install 'omem[duckdb]' "
                              "(or: pip install duckdb)") from exc

        self.path = str(path)
        try:
            with open(self.path, "rb") as handle:
                head = handle.read(12)
        except OSError:  # (absent, or a folder: DuckDB's own error says so)
            head = b""
        if head and head[8:12] != b"DUCK":
            # DuckDB 2 opens a JSON, CSV or Parquet file as a database of views over it: the
            # records would be written to memory and lost when the store closes.
            raise ValueError(f"cannot open {self.path}: it is not a DuckDB database (every DuckDB file has "
                             "'DUCK' at byte 8); give a new or a DuckDB file. The file was not changed.")
        # No extension is ever fetched from the network (this store needs none).
        try:
            self._connection = duckdb.connect(self.path, config={"autoinstall_known_extensions": False,
                                                          "autoload_known_extensions": False})
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise
            raise OSError(f"cannot open the DuckDB file {self.path}: another process holds it (DuckDB lets one "
                          "process open a file for writing). Share observations between processes with "
                          f"the SQLite or PostgreSQL stores. ({exc})") from exc
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._refuse_newer()
            with self._lock:
                self._con.execute(_SCHEMA)
                if self._con.execute("SELECT count(*) FROM omem_schema").fetchone()[0] == 0:
                    self._con.execute("INSERT INTO omem_schema VALUES (?)", [SCHEMA_VERSION])
        except BaseException:
            self._connection.close()
            raise

    def _refuse_newer(self) -> None:
        """A ``ValueError`` for a newer omem's file (before anything is written to it): this one's
        statements could misread or corrupt it."""
        tables = {row[0] for row in self._con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}
        if "omem_schema" not in tables:
            return
        found = self._con.execute("SELECT max(version) FROM omem_schema").fetchone()[0]
        if found is not None and found > SCHEMA_VERSION:
            raise ValueError(f"cannot open {self.path}: its schema is version {found}, written by a newer omem "
                             f"(this one knows versions up to {SCHEMA_VERSION}): upgrade omem to use it; the file "
                             "was not changed")

    @property
    def _con(self) -> Any:
        """The connection; a ``RuntimeError`` naming the file once the store is closed (DuckDB's
        own "Connection already closed!" named neither the store nor the file)."""
        if self._closed:
            raise RuntimeError(f"this store (DuckDB file {self.path}) is closed")
        return self._connection

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            self._connection.close()

    def _rows(self, thread_id: str) -> builtins.list[ObservationRecord]:
        rows = self._con.execute("SELECT id, thread_id, resource_id, created_at, kind, source_ids, text "
                                 "FROM omem_records WHERE thread_id = ? ORDER BY seq", [thread_id]).fetchall()
        return [ObservationRecord(id=i, thread_id=t, resource_id=r, created_at=datetime.fromisoformat(c), kind=k,
                                  source_ids=tuple(json.loads(s)), text=x) for i, t, r, c, k, s, x in rows]

    async def list(self, thread_id: str) -> builtins.list[ObservationRecord]:
        check_thread_id(thread_id, "list")
        with self._lock:
            return self._rows(thread_id)

    async def list_recent(self, thread_id: str) -> builtins.list[ObservationRecord]:
        """What the memory is made of: from the newest reflection (or the newest observation, if
        older) on, plus the observations that reflection left uncovered. Reads the thread's
        records (this store keeps no index of them)."""
        check_thread_id(thread_id, "list_recent")
        with self._lock:
            records = self._rows(thread_id)
        reflections = [i for i, r in enumerate(records) if r.kind == "reflection"]
        if not reflections:
            return records
        newest = reflections[-1]
        observations = [i for i, r in enumerate(records) if r.kind == "observation"]
        start = min(newest, observations[-1]) if observations else newest
        covered = frozenset(records[newest].source_ids)
        uncovered = [r for r in records[:start] if r.kind == "observation" and r.id not in covered]
        return uncovered + records[start:]

    def _save(self, record: ObservationRecord) -> None:
        found = self._con.execute("SELECT thread_id, source_ids FROM omem_records WHERE id = ?",  # (in any thread)
                                  [record.id]).fetchall()
        if found:
            existing = ObservationRecord(id=record.id, thread_id=found[0][0], resource_id=None,
                                         created_at=record.created_at, kind=record.kind,
                                         source_ids=tuple(json.loads(found[0][1])), text="")
            if already_saved(existing, record):
                return
        self._con.execute(
            "INSERT INTO omem_records VALUES (nextval('omem_seq'), ?, ?, ?, ?, ?, ?, ?)",
            [record.id, record.thread_id, record.resource_id, record.created_at.isoformat(), record.kind,
             json.dumps(list(record.source_ids)), record.text])

    async def save(self, record: ObservationRecord) -> None:
        check_record(record)
        with self._lock:
            self._con.execute("BEGIN TRANSACTION")
            try:
                self._save(record)
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
            self._con.execute("COMMIT")

    async def delete_by_thread(self, thread_id: str) -> None:
        check_thread_id(thread_id, "delete_by_thread")
        with self._lock:
            self._con.execute("BEGIN TRANSACTION")
            try:
                self._con.execute("DELETE FROM omem_records WHERE thread_id = ?", [thread_id])
                self._con.execute("DELETE FROM omem_epochs WHERE thread_id = ?", [thread_id])
            except BaseException:  # all or nothing, and the connection usable after
                self._con.execute("ROLLBACK")
                raise
            self._con.execute("COMMIT")

    async def delete_epoch(self, thread_id: str) -> int:
        check_thread_id(thread_id, "delete_epoch")
        with self._lock:
            found = self._con.execute("SELECT epoch FROM omem_epochs WHERE thread_id = ?", [thread_id]).fetchall()
            if found:
                return int(found[0][0])
            epoch = int(self._con.execute("SELECT nextval('omem_seq')").fetchall()[0][0])
            self._con.execute("INSERT INTO omem_epochs VALUES (?, ?)", [thread_id, epoch])
            return epoch

    async def save_unless_deleted(self, record: ObservationRecord, epoch: int) -> bool:
        check_record(record)
        with self._lock:
            self._con.execute("BEGIN TRANSACTION")
            try:
                found = self._con.execute("SELECT epoch FROM omem_epochs WHERE thread_id = ?",
                                          [record.thread_id]).fetchall()
                if not found or int(found[0][0]) != epoch:
                    self._con.execute("ROLLBACK")
                    return False
                self._save(record)
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
            self._con.execute("COMMIT")
            return True


__all__ = ["DuckDBObservationStore"]
