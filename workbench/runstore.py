"""The DuckDB run store: every replay step, record, model call and probe score.

Schema (version 1, created on first use; see ``docs/run-store.md``):

* ``runs``         one row per replay: dataset, conversation, config (JSON), status, figures;
* ``messages``     the replayed conversation, so a run is self-contained;
* ``steps``        one row per cursorless read: volumes, cursor, whether observe/reflect fired;
* ``records``      observation/reflection records (also the ``ObservationStore`` of the run);
* ``model_calls``  one row per compaction call, with tokens, latency, cost, cache hit, error;
* ``probes``       one row per probe and scoring method (memory, baselines, LLM judge);
* ``prompts``      saved prompt versions (name, version, sha256, text).

Migrations are append-only functions recorded in ``omem_schema``. One connection per process;
each thread gets its own cursor. A file held read-write by another process raises
:class:`RunStoreLocked` with what to do.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from omem_core import ObservationRecord, Prompt
from omem_core.observations import InMemoryObservationStore

_M001 = """
CREATE TABLE runs (
    run_id VARCHAR PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    dataset VARCHAR NOT NULL,
    dataset_format VARCHAR,
    conversation_id VARCHAR NOT NULL,
    label VARCHAR,
    config JSON NOT NULL,
    status VARCHAR NOT NULL,          -- running | completed | failed | interrupted
    error VARCHAR,
    messages INTEGER NOT NULL,
    steps INTEGER DEFAULT 0,
    full_history_tokens BIGINT,
    final_context_tokens BIGINT,
    compression DOUBLE,
    retention DOUBLE,
    retention_full_history DOUBLE,
    retention_window_only DOUBLE,
    retention_recent DOUBLE,
    observer_calls INTEGER DEFAULT 0,
    reflector_calls INTEGER DEFAULT 0,
    cache_hits INTEGER DEFAULT 0,
    cost_usd DOUBLE,
    elapsed_s DOUBLE
);
CREATE TABLE messages (
    run_id VARCHAR NOT NULL,
    idx INTEGER NOT NULL,
    message_id VARCHAR NOT NULL,
    role VARCHAR NOT NULL,
    speaker VARCHAR,
    content VARCHAR NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    tokens INTEGER NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE TABLE steps (
    run_id VARCHAR NOT NULL,
    step INTEGER NOT NULL,
    message_index INTEGER NOT NULL,   -- messages saved before this read
    message_id VARCHAR,               -- the message about to be answered
    history_tokens BIGINT NOT NULL,
    window_tokens BIGINT NOT NULL,
    backlog_tokens BIGINT NOT NULL,
    unreflected_tokens BIGINT NOT NULL,
    reflection_tokens BIGINT NOT NULL,
    memory_tokens BIGINT NOT NULL,
    context_tokens BIGINT NOT NULL,
    observed BOOLEAN NOT NULL,
    reflected BOOLEAN NOT NULL,
    cursor_id VARCHAR,
    cursor_index INTEGER,             -- index of the newest observed message, -1 when none
    records INTEGER NOT NULL,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE records (
    run_id VARCHAR NOT NULL,
    seq INTEGER NOT NULL,
    step INTEGER,
    record_id VARCHAR NOT NULL,
    thread_id VARCHAR NOT NULL,
    resource_id VARCHAR,
    kind VARCHAR NOT NULL,
    source_ids JSON NOT NULL,
    text VARCHAR NOT NULL,
    tokens INTEGER,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (run_id, record_id)
);
CREATE TABLE model_calls (
    run_id VARCHAR NOT NULL,
    seq INTEGER NOT NULL,
    step INTEGER,
    stage VARCHAR NOT NULL,
    model VARCHAR NOT NULL,
    prompt_version VARCHAR,
    prompt_sha256 VARCHAR,
    source_count INTEGER,
    volume_before BIGINT,
    volume_after BIGINT,
    input_tokens BIGINT,
    output_tokens BIGINT,
    latency_ms DOUBLE,
    cost_usd DOUBLE,
    cache_hit BOOLEAN,
    error VARCHAR,
    record_id VARCHAR,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE probes (
    run_id VARCHAR NOT NULL,
    probe_id VARCHAR NOT NULL,
    method VARCHAR NOT NULL,          -- memory | full_history | window_only | recent_tokens | llm_judge
    question VARCHAR NOT NULL,
    gold VARCHAR,
    category VARCHAR,
    evidence JSON,
    evidence_in_window BOOLEAN,
    score DOUBLE,
    answer VARCHAR,
    PRIMARY KEY (run_id, probe_id, method)
);
CREATE TABLE prompts (
    name VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    sha256 VARCHAR NOT NULL,
    text VARCHAR NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (name, version)
);
"""

_M002 = """
ALTER TABLE model_calls ADD COLUMN attempts INTEGER DEFAULT 1;   -- 1 + tightening requests
ALTER TABLE model_calls ADD COLUMN trimmed BOOLEAN DEFAULT false; -- cut to the threshold without a model
"""

MIGRATIONS: list[tuple[int, str, str]] = [(1, "initial", _M001), (2, "reflection tightening", _M002)]


class RunStoreError(RuntimeError):
    pass


class RunStoreLocked(RunStoreError):
    """The DuckDB file is held read-write by another process."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _insert_many(cur: duckdb.DuckDBPyConnection, table: str, columns: list[str], rows: list[list[Any]],
                 *, verb: str = "INSERT") -> None:
    """Insert many rows in one statement (DuckDB's executemany runs row by row): a VALUES list for
    a few rows, a registered DataFrame for many."""
    names = ", ".join(columns)
    if len(rows) <= 20:
        placeholders = "(" + ", ".join("?" * len(columns)) + ")"
        cur.execute(f"{verb} INTO {table} ({names}) VALUES " + ", ".join([placeholders] * len(rows)),
                    [value for row in rows for value in row])
        return
    cur.register("_omem_rows", pd.DataFrame(rows, columns=columns))
    try:
        cur.execute(f"{verb} INTO {table} ({names}) SELECT {names} FROM _omem_rows").fetchall()
    finally:
        cur.unregister("_omem_rows")


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "lock" in text or "conflicting" in text or "already open" in text


class RunStore:
    """A DuckDB file of replay runs. ``RunStore(":memory:")`` for a throwaway store."""

    def __init__(self, path: str | Path = "runs.duckdb", *, read_only: bool = False) -> None:
        self.path = str(path)
        self.read_only = read_only
        self.snapshot_of: str | None = None
        try:
            self._con = duckdb.connect(self.path, read_only=read_only)
        except duckdb.IOException as exc:
            if _is_lock_error(exc):
                raise RunStoreLocked(
                    f"{self.path} is open read-write in another process (the app or a CLI run). "
                    "DuckDB lets only one process write a file: stop the other process, wait for "
                    "it to finish, or pass --db with another file"
                    + ("" if read_only else "; the app can still open it read-only")
                    + f". ({exc})"
                ) from exc
            raise RunStoreError(f"cannot open {self.path}: {exc}") from exc
        except duckdb.Error as exc:
            raise RunStoreError(f"cannot open {self.path}: {exc}") from exc
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._seq: dict[tuple[str, str], int] = {}
        if not read_only:
            self.migrate()
        elif not self._has_table("omem_schema"):
            raise RunStoreError(f"{self.path} is not an omem run store (no omem_schema table)")

    @classmethod
    def snapshot(cls, path: str | Path) -> RunStore:
        """A read-only view of a file another process holds: a private copy taken now.

        The original is only read (never locked or written), so it cannot be corrupted; the copy
        shows what had reached the file (and its WAL) when it was taken.
        """
        import shutil
        import tempfile

        source = Path(path)
        folder = Path(tempfile.mkdtemp(prefix="omem-snapshot-"))
        target = folder / source.name
        shutil.copy2(source, target)
        wal = source.with_name(source.name + ".wal")
        if wal.exists():
            shutil.copy2(wal, target.with_name(target.name + ".wal"))
        store = cls(target)
        store.read_only = True
        store.snapshot_of = str(source)
        return store

    # -- connection ---------------------------------------------------------------------------

    def cursor(self) -> duckdb.DuckDBPyConnection:
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._local.cursor = self._con.cursor()
        return cur

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _has_table(self, name: str) -> bool:
        return bool(self.cursor().execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchall()[0][0])

    def migrate(self) -> None:
        cur = self.cursor()
        cur.execute("CREATE TABLE IF NOT EXISTS omem_schema "
                    "(version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMPTZ)")
        done = {row[0] for row in cur.execute("SELECT version FROM omem_schema").fetchall()}
        for version, name, sql in MIGRATIONS:
            if version in done:
                continue
            cur.execute("BEGIN TRANSACTION")
            try:
                cur.execute(sql)
                cur.execute("INSERT INTO omem_schema VALUES (?, ?, ?)", [version, name, _now()])
                cur.execute("COMMIT")
            except Exception:
                cur.execute("ROLLBACK")
                raise

    def schema_version(self) -> int:
        row = self.cursor().execute("SELECT max(version) FROM omem_schema").fetchall()[0]
        return int(row[0] or 0)

    # -- writing ------------------------------------------------------------------------------

    def create_run(self, *, dataset: str, dataset_format: str, conversation_id: str, config: dict[str, Any],
                   messages: Sequence[dict[str, Any]], label: str | None = None) -> str:
        run_id = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        now = _now()
        with self._write_lock:
            cur = self.cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                cur.execute(
                    "INSERT INTO runs (run_id, created_at, updated_at, dataset, dataset_format, conversation_id, "
                    "label, config, status, messages) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?)",
                    [run_id, now, now, dataset, dataset_format, conversation_id, label,
                     json.dumps(config, sort_keys=True), len(messages)])
                frame = pd.DataFrame(messages, columns=["idx", "message_id", "role", "speaker", "content",
                                                        "created_at", "tokens"])
                frame.insert(0, "run_id", run_id)
                cur.register("_messages", frame)
                cur.execute("INSERT INTO messages SELECT * FROM _messages")
                cur.unregister("_messages")
                cur.execute("COMMIT")
            except Exception:
                cur.execute("ROLLBACK")
                raise
        return run_id

    def add_steps(self, run_id: str, rows: list[dict[str, Any]], calls: list[dict[str, Any]] = ()) -> None:
        """Append step rows and the model calls made during them, in one transaction."""
        if not rows and not calls:
            return
        with self._write_lock:
            cur = self.cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                if rows:
                    _insert_many(cur, "steps", ["run_id", *rows[0]], [[run_id, *r.values()] for r in rows],
                                 verb="INSERT OR REPLACE")
                if calls:
                    first = self._next_seq("model_calls", run_id, len(calls))
                    _insert_many(cur, "model_calls", ["run_id", "seq", *calls[0]],
                                 [[run_id, first + i, *c.values()] for i, c in enumerate(calls)])
                if rows:
                    cur.execute("UPDATE runs SET steps = ?, updated_at = ? WHERE run_id = ?",
                                [rows[-1]["step"] + 1, _now(), run_id])
                cur.execute("COMMIT")
            except Exception:
                cur.execute("ROLLBACK")
                self._seq.pop(("model_calls", run_id), None)
                raise

    def _next_seq(self, table: str, run_id: str, count: int = 1) -> int:
        """The next ``seq`` of ``table`` for a run (read once from DuckDB, then counted here)."""
        key = (table, run_id)
        if key not in self._seq:
            self._seq[key] = self.cursor().execute(
                f"SELECT coalesce(max(seq), 0) FROM {table} WHERE run_id = ?", [run_id]).fetchall()[0][0]
        first = self._seq[key] + 1
        self._seq[key] += count
        return first

    def save_record(self, run_id: str, record: ObservationRecord, *, step: int | None, tokens: int | None) -> None:
        """Write one record at once (autocommit): it survives any interruption from here on."""
        with self._write_lock:
            seq = self._next_seq("records", run_id)
            self.cursor().execute(
                "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, seq, step, record.id, record.thread_id, record.resource_id, record.kind,
                 json.dumps(list(record.source_ids)), record.text, tokens, record.created_at])

    def discard_after(self, run_id: str, step: int) -> int:
        """Drop the records and model calls a run wrote after its last recorded step.

        Only a hard kill leaves such rows (steps are written in batches, records at once); a
        resume recomputes them from the same state, so the run ends as if never interrupted.
        Returns how many records were dropped.
        """
        with self._write_lock:
            cur = self.cursor()
            dropped = cur.execute("SELECT count(*) FROM records WHERE run_id = ? AND step > ?",
                                  [run_id, step]).fetchall()[0][0]
            cur.execute("BEGIN TRANSACTION")
            cur.execute("DELETE FROM records WHERE run_id = ? AND step > ?", [run_id, step])
            cur.execute("DELETE FROM model_calls WHERE run_id = ? AND step > ?", [run_id, step])
            cur.execute("COMMIT")
            self._seq = {k: v for k, v in self._seq.items() if k[1] != run_id}
        return int(dropped)

    def delete_records(self, run_id: str, thread_id: str) -> None:
        with self._write_lock:
            self.cursor().execute("DELETE FROM records WHERE run_id = ? AND thread_id = ?", [run_id, thread_id])

    def set_status(self, run_id: str, status: str, error: str | None = None) -> None:
        with self._write_lock:
            self.cursor().execute("UPDATE runs SET status = ?, error = ?, updated_at = ? WHERE run_id = ?",
                                  [status, error, _now(), run_id])

    def update_run(self, run_id: str, **figures: Any) -> None:
        if not figures:
            return
        assignments = ", ".join(f"{key} = ?" for key in figures)
        with self._write_lock:
            self.cursor().execute(f"UPDATE runs SET {assignments}, updated_at = ? WHERE run_id = ?",
                                  [*figures.values(), _now(), run_id])

    def replace_probes(self, run_id: str, rows: list[dict[str, Any]], methods: Iterable[str]) -> None:
        with self._write_lock:
            cur = self.cursor()
            cur.execute("BEGIN TRANSACTION")
            try:
                for method in methods:
                    cur.execute("DELETE FROM probes WHERE run_id = ? AND method = ?", [run_id, method])
                if rows:
                    frame = pd.DataFrame(rows)
                    frame.insert(0, "run_id", run_id)
                    cur.register("_probes", frame)
                    columns = ", ".join(frame.columns)
                    cur.execute(f"INSERT INTO probes ({columns}) SELECT {columns} FROM _probes")
                    cur.unregister("_probes")
                cur.execute("COMMIT")
            except Exception:
                cur.execute("ROLLBACK")
                raise

    def delete_run(self, run_id: str) -> None:
        with self._write_lock:
            cur = self.cursor()
            cur.execute("BEGIN TRANSACTION")
            for table in ("probes", "model_calls", "records", "steps", "messages", "runs"):
                cur.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            cur.execute("COMMIT")
            self._seq = {k: v for k, v in self._seq.items() if k[1] != run_id}

    def save_prompt(self, prompt: Prompt) -> None:
        with self._write_lock:
            cur = self.cursor()
            found = cur.execute("SELECT sha256 FROM prompts WHERE name = ? AND version = ?",
                                [prompt.name, prompt.version]).fetchall()
            existing = found[0] if found else None
            if existing and existing[0] != prompt.sha256:
                raise RunStoreError(f"prompt {prompt.label} already exists with other text; "
                                    "choose a new version name")
            if not existing:
                cur.execute("INSERT INTO prompts VALUES (?, ?, ?, ?, ?)",
                            [prompt.name, prompt.version, prompt.sha256, prompt.text, _now()])

    # -- reading ------------------------------------------------------------------------------

    def _df(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        return self.cursor().execute(sql, list(params)).df()

    def run(self, run_id: str) -> dict[str, Any]:
        frame = self._df("SELECT * FROM runs WHERE run_id = ?", [run_id])
        if frame.empty:
            raise KeyError(f"no run {run_id!r} in {self.path}")
        row = frame.iloc[0].to_dict()
        row["config"] = json.loads(row["config"])
        return row

    def runs(self) -> pd.DataFrame:
        return self._df("SELECT * FROM runs ORDER BY created_at DESC")

    def steps(self, run_id: str) -> pd.DataFrame:
        return self._df("SELECT * FROM steps WHERE run_id = ? ORDER BY step", [run_id])

    def records(self, run_id: str) -> pd.DataFrame:
        return self._df("SELECT * FROM records WHERE run_id = ? ORDER BY seq", [run_id])

    def model_calls(self, run_id: str) -> pd.DataFrame:
        return self._df("SELECT * FROM model_calls WHERE run_id = ? ORDER BY seq", [run_id])

    def probes(self, run_id: str) -> pd.DataFrame:
        return self._df("SELECT * FROM probes WHERE run_id = ? ORDER BY probe_id, method", [run_id])

    def messages(self, run_id: str) -> pd.DataFrame:
        return self._df("SELECT * FROM messages WHERE run_id = ? ORDER BY idx", [run_id])

    def prompts(self) -> pd.DataFrame:
        return self._df("SELECT * FROM prompts ORDER BY name, created_at")

    def prompt(self, name: str, version: str) -> Prompt:
        rows = self.cursor().execute("SELECT text FROM prompts WHERE name = ? AND version = ?",
                                     [name, version]).fetchall()
        row = rows[0] if rows else None
        if row is None:
            raise KeyError(f"no saved prompt {name}@{version}")
        return Prompt(name=name, version=version, text=row[0])

    def load_records(self, run_id: str) -> list[ObservationRecord]:
        rows = self.cursor().execute(
            "SELECT record_id, thread_id, resource_id, created_at, kind, source_ids, text FROM records "
            "WHERE run_id = ? ORDER BY seq", [run_id]).fetchall()
        return [ObservationRecord(id=r[0], thread_id=r[1], resource_id=r[2], created_at=r[3], kind=r[4],
                                  source_ids=tuple(json.loads(r[5])), text=r[6]) for r in rows]

    def export_parquet(self, run_id: str, folder: str | Path) -> list[Path]:
        self.run(run_id)
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for table in ("runs", "messages", "steps", "records", "model_calls", "probes"):
            target = out / f"{table}.parquet"
            self.cursor().execute(
                f"COPY (SELECT * FROM {table} WHERE run_id = ?) TO '{target.as_posix()}' (FORMAT parquet)",
                [run_id])
            written.append(target)
        return written


@dataclass
class RunObservationStore:
    """The run store as the library's ``ObservationStore`` port, scoped to one run.

    Writes go straight to DuckDB (a record survives any interruption once ``save`` returns);
    reads are served from an in-memory mirror loaded from DuckDB at start, so a replay's reads
    do not query the database. ``step`` is set by the replay before each read.
    """

    store: RunStore
    run_id: str
    step: int | None = None
    count_tokens: Any = None


    def __post_init__(self) -> None:
        self._mirror = InMemoryObservationStore()
        self._loaded: list[ObservationRecord] | None = self.store.load_records(self.run_id)

    async def _ensure_loaded(self) -> None:
        if self._loaded is not None:
            records, self._loaded = self._loaded, None
            for record in records:
                await self._mirror.save(record)

    async def list(self, thread_id: str) -> list[ObservationRecord]:
        await self._ensure_loaded()
        return await self._mirror.list(thread_id)

    async def list_recent(self, thread_id: str) -> list[ObservationRecord]:
        await self._ensure_loaded()
        return await self._mirror.list_recent(thread_id)

    async def save(self, record: ObservationRecord) -> None:
        await self._ensure_loaded()
        tokens = self.count_tokens([record.text])[0] if self.count_tokens else None
        self.store.save_record(self.run_id, record, step=self.step, tokens=tokens)
        await self._mirror.save(record)

    async def delete_by_thread(self, thread_id: str) -> None:
        self.store.delete_records(self.run_id, thread_id)
        await self._mirror.delete_by_thread(thread_id)
