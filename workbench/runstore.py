"""The DuckDB run store: every replay step, record, model call and probe score.

Schema (created on first use, migrated in place; see ``docs/run-store.md``):

* ``runs``         one row per replay: dataset, conversation, config (JSON), status, figures;
* ``messages``     the replayed conversation, so a run is self-contained;
* ``steps``        one row per cursorless read: volumes, cursor, whether observe/reflect fired;
* ``records``      observation/reflection records (also the ``ObservationStore`` of the run);
* ``model_calls``  one row per compaction call, with tokens, latency, cost, cache hit, error;
* ``probes``       one row per probe and scoring method (memory, baselines, LLM judge);
* ``probe_losses`` one row per probe with evidence: where its answer was lost (``workbench.losses``);
* ``prompts``      saved prompt versions (name, version, sha256, text);
* ``experiments``  one row per experiment (dataset × configurations); its runs carry ``experiment_id``.

Migrations are append-only SQL scripts recorded in ``omem_schema``. The file is opened for each
operation (or ``session()``) and closed after it, so several processes take turns on it; a writer
that finds it busy waits (bounded) and then raises :class:`RunStoreLocked` with what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import unicodedata
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pandas as pd

from .errors import WorkbenchError
from .formatting import DEFAULT_DB, cli_command, not_text, printable, whole_text
from .interrupts import wait_cap

# The runs as read: a run that did not complete (interrupted, failed by a bug, still running) has
# its call figures written only at a normal end, so they are counted from its recorded calls (the
# explorer said "Model calls 0 / 0" beside 47 recorded calls). The cost follows the end of a run's
# rule: unknown when a call that answered has no price; a failed call adds nothing.
_RUNS = """
SELECT runs.* REPLACE (
    CASE WHEN c.run_id IS NULL THEN runs.observer_calls ELSE c.observer_calls END AS observer_calls,
    CASE WHEN c.run_id IS NULL THEN runs.reflector_calls ELSE c.reflector_calls END AS reflector_calls,
    CASE WHEN c.run_id IS NULL THEN runs.cache_hits ELSE c.cache_hits END AS cache_hits,
    CASE WHEN c.run_id IS NULL THEN runs.input_tokens ELSE c.input_tokens END AS input_tokens,
    CASE WHEN c.run_id IS NULL THEN runs.output_tokens ELSE c.output_tokens END AS output_tokens,
    CASE WHEN c.run_id IS NULL THEN runs.cost_usd ELSE c.cost_usd END AS cost_usd,
    -- a run scored by an omem older than rule numbers, written into a file already migrated: rule 1
    coalesce(runs.scoring, CASE WHEN runs.retention IS NOT NULL THEN 1 END) AS scoring)
FROM runs LEFT JOIN (
    SELECT run_id,
           count(*) FILTER (WHERE stage = 'observe') AS observer_calls,
           count(*) FILTER (WHERE stage = 'reflect') AS reflector_calls,
           count(*) FILTER (WHERE cache_hit) AS cache_hits,
           CAST(coalesce(sum(input_tokens), 0) AS BIGINT) AS input_tokens,
           CAST(coalesce(sum(output_tokens), 0) AS BIGINT) AS output_tokens,
           CASE WHEN bool_or(coalesce(error, '') = '' AND (cost_usd IS NULL OR isnan(cost_usd))) THEN NULL
                ELSE coalesce(sum(cost_usd) FILTER (WHERE NOT isnan(cost_usd)), 0) END AS cost_usd
    FROM model_calls
    WHERE run_id IN (SELECT run_id FROM runs WHERE status <> 'completed')
    GROUP BY run_id
) AS c ON c.run_id = runs.run_id AND runs.status <> 'completed'"""

if TYPE_CHECKING:  # omem_core imports litellm (seconds): quick CLI paths never load it
    from omem_core import ObservationRecord, Prompt

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

_M003 = """
ALTER TABLE runs ADD COLUMN planned_steps INTEGER;   -- memory reads the whole replay makes
ALTER TABLE runs ADD COLUMN owner_host VARCHAR;      -- the process running it: a dead owner ...
ALTER TABLE runs ADD COLUMN owner_pid INTEGER;       -- ... makes a 'running' run 'interrupted'
ALTER TABLE runs ADD COLUMN owner_token VARCHAR;     -- pid + process start time (pid reuse)
"""

_M004 = """
CREATE TABLE experiments (
    experiment_id VARCHAR PRIMARY KEY,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    name VARCHAR,
    dataset VARCHAR NOT NULL,
    dataset_format VARCHAR,
    conversations JSON NOT NULL,      -- the conversation ids replayed
    configs JSON NOT NULL,            -- [{"label", "config"}], the grid in order
    options JSON NOT NULL,            -- concurrency, max_cost, rpm, num_retries, traces, judge, answerer
    status VARCHAR NOT NULL,          -- running | completed | failed | interrupted | stopped
    error VARCHAR,
    elapsed_s DOUBLE,
    owner_host VARCHAR,
    owner_pid INTEGER,
    owner_token VARCHAR
);
ALTER TABLE runs ADD COLUMN experiment_id VARCHAR;
ALTER TABLE runs ADD COLUMN config_label VARCHAR;          -- the configuration's label in its experiment
ALTER TABLE runs ADD COLUMN blind_spot_tokens DOUBLE;      -- mean backlog outside the window per read
ALTER TABLE runs ADD COLUMN blind_spot_max BIGINT;
ALTER TABLE runs ADD COLUMN input_tokens BIGINT;
ALTER TABLE runs ADD COLUMN output_tokens BIGINT;
ALTER TABLE runs ADD COLUMN model_latency_ms DOUBLE;
ALTER TABLE steps ADD COLUMN window_ids JSON;              -- what the agent saw at this read
ALTER TABLE steps ADD COLUMN memory_ids JSON;
ALTER TABLE model_calls ADD COLUMN request JSON;           -- the exact messages sent (size-capped)
ALTER TABLE model_calls ADD COLUMN response VARCHAR;       -- the raw reply (size-capped)
CREATE TABLE probe_losses (
    run_id VARCHAR NOT NULL,
    probe_id VARCHAR NOT NULL,
    category VARCHAR,
    evidence JSON,
    in_window_at_end BOOLEAN,
    observation_ids JSON,
    observation_score DOUBLE,
    observed BOOLEAN,
    reflection_score DOUBLE,
    reflected BOOLEAN,
    visible_score DOUBLE,
    visible BOOLEAN,
    lost_at VARCHAR,                  -- observation | reflection | end | NULL (kept)
    lost_step INTEGER,
    PRIMARY KEY (run_id, probe_id)
);
"""

_M005 = """
ALTER TABLE runs ADD COLUMN judge_calls INTEGER;       -- answerer + judge calls of LLM-judged accuracy
ALTER TABLE runs ADD COLUMN judge_cost_usd DOUBLE;     -- their cost; NULL when a model's price is unknown
ALTER TABLE experiments ADD COLUMN other_cost_usd DOUBLE DEFAULT 0;  -- spent by calls no run records: ...
ALTER TABLE experiments ADD COLUMN other_cost_unknown BOOLEAN DEFAULT false;  -- ... (replaced runs, failed judging)
"""

# The retention scoring rule a run's figures were computed with (workbench.retention.SCORING_RULES):
# the runs scored before it was recorded were scored with rule 1; NULL is a run not scored (yet).
_M006 = """
ALTER TABLE runs ADD COLUMN scoring INTEGER;
UPDATE runs SET scoring = 1 WHERE retention IS NOT NULL;
"""

_M007 = """
ALTER TABLE messages ADD COLUMN IF NOT EXISTS utc_offset_s INTEGER;  -- the offset its date was written with (its day)
"""

MIGRATIONS: list[tuple[int, str, str]] = [(1, "initial", _M001), (2, "reflection tightening", _M002),
                                          (3, "run owners and planned steps", _M003),
                                          (4, "experiments, loss attribution, traces", _M004),
                                          (5, "judging calls and cost", _M005),
                                          (6, "retention scoring rule", _M006),
                                          (7, "message time offsets", _M007)]


def _known_schema(versions: set[int], path: str, *, read_only: bool = False) -> None:
    """Refuse a file a newer omem has migrated: its tables may mean what this one cannot read, and
    this one's writes (a rule-less run, say) would corrupt its figures. Read-only, refuse one an
    older omem left behind too: it cannot be migrated, and this one's queries name newer columns."""
    newer = sorted(v for v in versions if v > len(MIGRATIONS))
    if newer:
        raise RunStoreError(f"{path} has run-store schema version {newer[-1]}, written by a newer omem (this one knows "
                            f"versions up to {len(MIGRATIONS)}): upgrade omem to use it; the file was not changed")
    if read_only and len(versions) < len(MIGRATIONS):
        raise RunStoreError(f"{path} has run-store schema version {max(versions, default=0)}, from an older omem (this "
                            f"one reads version {len(MIGRATIONS)}): open it once for writing (any command of this "
                            "omem) to upgrade it")


RUN_TABLES = ("probe_losses", "probes", "model_calls", "records", "steps", "messages", "runs")


class RunStoreError(WorkbenchError, RuntimeError):
    """The run store cannot be opened, read or written as asked."""


class RunStoreLocked(RunStoreError):
    """The DuckDB file is held read-write by another process (longer than we were willing to wait)."""


class RunBusy(RunStoreError):
    """The run or experiment is being replayed by another live process: it cannot be resumed or
    deleted from here until that process ends."""


class RunDeleted(RunStoreError):
    """The run (or its experiment) was deleted while it was being written: its writer stops."""


def _live_owner(cur: duckdb.DuckDBPyConnection, table: str, key: str, value: str) -> int | None:
    """The pid of another process of this host that is running ``value`` now, else ``None``."""
    rows = cur.execute(f"SELECT status, owner_host, owner_pid, owner_token FROM {table} WHERE {key} = ?",
                       [value]).fetchall()
    if not rows:
        return None
    status, host, pid, token = rows[0]
    if status != "running" or host != socket.gethostname() or pid is None or int(pid) == os.getpid():
        return None
    return int(pid) if process_alive(int(pid), token) else None


def _where(dataset: str) -> str:
    """A dataset's path as recorded: absolute, so that a resume (or the app) started in another
    folder finds it again and knows it for the same file."""
    return os.path.abspath(dataset) if dataset else dataset


def _require_run(cur: duckdb.DuckDBPyConnection, run_id: str, path: str) -> None:
    if not cur.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchall():
        raise RunDeleted(f"run {run_id} was deleted from {path} while it was being replayed; nothing more of it "
                         "is written")


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _insert_many(cur: duckdb.DuckDBPyConnection, table: str, columns: list[str], rows: list[list[Any]],
                 *, verb: str = "INSERT") -> None:
    """Insert many rows in one statement (DuckDB's executemany runs row by row): a VALUES list for
    a few rows, a registered Arrow table for many."""
    names = ", ".join(columns)
    if len(rows) <= 20:
        placeholders = "(" + ", ".join("?" * len(columns)) + ")"
        cur.execute(f"{verb} INTO {table} ({names}) VALUES " + ", ".join([placeholders] * len(rows)),
                    [value for row in rows for value in row])
        return
    import pyarrow as pa

    # Arrow, not pandas: no per-column type guessing, and DuckDB scans it without a copy.
    cur.register("_omem_rows", pa.Table.from_pydict({c: [r[i] for r in rows] for i, c in enumerate(columns)}))
    try:
        cur.execute(f"{verb} INTO {table} ({names}) SELECT {names} FROM _omem_rows").fetchall()
    finally:
        with contextlib.suppress(duckdb.Error):  # (in a failed transaction it fails too: the first error is the one)
            cur.unregister("_omem_rows")


def _interrupted_query(exc: BaseException) -> bool:
    """A statement DuckDB stopped because the process got SIGINT (it raises this instead of
    KeyboardInterrupt: a Ctrl-C during a write would otherwise read as a failed write)."""
    return isinstance(exc, duckdb.InterruptException) or (
        isinstance(exc, RuntimeError) and "query interrupted" in str(exc).lower())


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "lock" in text or "conflicting" in text or "already open" in text


# No network here, and a file that is not a run store must never make DuckDB fetch an extension
# (a SQLite file given as --db would otherwise try to install the sqlite scanner).
_DUCKDB_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}

DEFAULT_WAIT_S = 60.0  # how long an operation waits for a file another process is using


def default_wait_s() -> float:
    """``$OMEM_DB_WAIT`` seconds, else 60."""
    try:
        return float(os.environ.get("OMEM_DB_WAIT") or DEFAULT_WAIT_S)
    except ValueError:
        raise RunStoreError(f"OMEM_DB_WAIT must be a number of seconds, got {os.environ['OMEM_DB_WAIT']!r}") from None


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(16)
    except OSError:
        return b""


# Files DuckDB (2.x) opens as a database of views over their content, where writes then go to
# memory and vanish: a dataset given as --db ran and failed later with "Table runs does not exist".
_DATA_FILES = {b"PAR1": "a Parquet file"}
_DATA_SUFFIXES = {".json": "a JSON file", ".jsonl": "a JSON Lines file", ".ndjson": "a JSON Lines file",
                  ".csv": "a CSV file", ".tsv": "a TSV file", ".parquet": "a Parquet file", ".txt": "a text file"}


def not_a_run_store(path: str) -> str | None:
    """Why the existing, non-empty file ``path`` is no DuckDB database (read from its first bytes:
    every DuckDB file has ``DUCK`` at byte 8), or ``None`` when it may be one."""
    head = _head(path)
    if not head or head[8:12] == b"DUCK":
        return None
    return _describe_unreadable(path, None)


def _describe_unreadable(path: str, exc: Exception | None) -> str:
    head = _head(path)
    advice = "Pass --db with another file (or set OMEM_DB); the file was not changed"
    if head.startswith(b"SQLite format 3"):  # DuckDB's own message would suggest installing an extension
        return f"cannot open {path}: it is a SQLite database, not a DuckDB run store. {advice}."
    if head[8:12] == b"DUCK" or head.startswith(b"DUCK"):
        what = "a DuckDB file that is truncated or corrupt"
    else:
        kind = _DATA_FILES.get(head[:4]) or _DATA_SUFFIXES.get(Path(path).suffix.lower())
        what = (f"{kind}, not a DuckDB run store (a dataset is given with --dataset)" if kind else
                "not a DuckDB run store (or a truncated or corrupt one)")
    if exc is None:
        return f"cannot open {path}: it is {what}. {advice}."
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot open {path}: it is {what}. {advice}. (DuckDB: {first_line})"


def new_run_id() -> str:
    """A fresh run id: the UTC time, then six random hex digits (sortable, unique)."""
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


_RECORD_COLUMNS = ["step", "record_id", "thread_id", "resource_id", "kind", "source_ids", "text", "tokens",
                   "created_at"]
_LOSS_COLUMNS = ["probe_id", "category", "evidence", "in_window_at_end", "observation_ids", "observation_score",
                 "observed", "reflection_score", "reflected", "visible_score", "visible", "lost_at", "lost_step"]


def _record_values(row: dict[str, Any]) -> list[Any]:
    """A ``records`` row (without run_id and seq) from ``{"record", "step", "tokens"}``."""
    record = row["record"]
    return [row["step"], record.id, record.thread_id, record.resource_id, record.kind,
            json.dumps(list(record.source_ids)), redact_secrets(record.text), row["tokens"], record.created_at]


def _other_cost(experiment_id: str, cost_usd: float, unknown: bool) -> tuple[str, list[Any]]:
    """The statement that adds to an experiment's ``other_cost_usd`` (and its price unknown)."""
    return ("UPDATE experiments SET other_cost_usd = coalesce(other_cost_usd, 0) + ?, "
            "other_cost_unknown = coalesce(other_cost_unknown, false) OR ? WHERE experiment_id = ?",
            [cost_usd, unknown, experiment_id])


def _add_other_cost(cur: duckdb.DuckDBPyConnection, experiment_id: str, cost_usd: float, unknown: bool) -> None:
    cur.execute(*_other_cost(experiment_id, cost_usd, unknown))


def _redacted_answer(row: dict[str, Any]) -> dict[str, Any]:
    """A probe row with a model's answer cleaned of secrets (an answerer may quote its key)."""
    return {**row, "answer": redact_secrets(row["answer"])} if row.get("answer") else row


def redact_secrets(text: Any) -> Any:
    """``text`` with any secret of the environment it quotes redacted (the library's
    ``redact_secrets``, imported only when there is text to write: quick paths skip litellm).
    Errors, model replies and requests, and the notes made of them are written through it: a
    provider that quotes the key it was sent never puts it in the file. Half a character (a lone
    surrogate, which DuckDB refuses: an error quoting one was lost with the write that failed on
    it) becomes U+FFFD."""
    if not isinstance(text, str) or not text:
        return text
    from omem_core._env import redact_secrets as redact

    return whole_text(redact(text))


def _calls(calls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**c, **{key: redact_secrets(c[key]) for key in ("error", "request", "response") if c.get(key)}}
            for c in calls]


def _insert_dicts(cur: duckdb.DuckDBPyConnection, table: str, run_id: str, rows: Sequence[dict[str, Any]],
                  *, verb: str = "INSERT") -> None:
    """Rows given as dicts (one key order for all), each prefixed with ``run_id``; none: nothing.
    An ``error`` is stored with any secret of the environment it quotes redacted."""
    if rows and "error" in rows[0]:
        rows = [{**row, "error": redact_secrets(row["error"])} for row in rows]
    if rows:
        _insert_many(cur, table, ["run_id", *rows[0]], [[run_id, *row.values()] for row in rows], verb=verb)


def _insert_losses(cur: duckdb.DuckDBPyConnection, run_id: str, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        _insert_many(cur, "probe_losses", ["run_id", *_LOSS_COLUMNS],
                     [[run_id, *[json.dumps(row[c]) if c in ("evidence", "observation_ids") else row[c]
                                 for c in _LOSS_COLUMNS]] for row in rows])


def _stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (Linux; ``None`` elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_token(pid: int | None = None) -> str | None:
    """An identity for a live process that survives pid reuse: pid + its start time (Linux).

    ``None`` where the start time cannot be read (then only the pid is compared)."""
    pid = os.getpid() if pid is None else pid
    fields = _stat(pid)
    try:
        return f"{pid}:{int(fields[19])}" if fields else None  # field 22 of stat: start time in clock ticks
    except (IndexError, ValueError):
        return None


# Claims (resumes) made by this process, per file and run or experiment: an end settled later (see
# RunStore.settle_run) is dropped once it was claimed again, by any store of this process.
_claims: dict[tuple[str, str], int] = {}
_claims_lock = threading.Lock()
# Ends of runs and experiments not yet written, per file, (table, id) -> (statements, claims when
# deferred): written at the next open of the file by any store of this process (RunStore._settle).
_pending: dict[str, dict[tuple[str, str], tuple[list[tuple[str, list[Any]]], int]]] = {}


def _owner() -> list[Any]:
    """This process as the owner of a run or experiment: host, pid, pid + start time."""
    return [socket.gethostname(), os.getpid(), process_token()]


def process_alive(pid: int, token: str | None) -> bool:
    """Whether the process that wrote ``pid``/``token`` is still running on this host (a zombie,
    ended and not yet reaped by its parent, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    fields = _stat(pid)
    if fields and fields[0] == b"Z":
        return False
    current = process_token(pid)
    return token is None or current is None or current == token


def version_problem(version: str) -> str | None:
    """Why ``version`` cannot name a saved prompt version, or ``None``: a comma (the CLI's lists
    split on it: ``sweep --observer-prompt x,y`` asked for "x" and "y"), space around it (``"v2 "``
    read as a second "v2" in the pickers), a control character (a line break read as a space)."""
    if not version.strip():
        return "give it a name"
    if "," in version:
        return "no commas (the CLI's lists of versions split on them)"
    if version != version.strip():
        return "no space before or after it"
    if any(unicodedata.category(ch)[0] == "C" for ch in version):
        return "no control or invisible format characters"
    return None


def _discard_snapshot(connection: duckdb.DuckDBPyConnection, folder: Path) -> None:
    import shutil

    with contextlib.suppress(duckdb.Error):
        connection.close()
    shutil.rmtree(folder, ignore_errors=True)


class RunStore:
    """A DuckDB file of replay runs. ``RunStore(":memory:")`` for a throwaway store.

    The file is opened for each operation and closed after it, so the process holds DuckDB's
    write lock only while it reads or writes: the app, the CLI and notebooks take turns on one
    file. An operation that finds the file held by another process waits up to ``wait_s``
    seconds (default ``$OMEM_DB_WAIT`` or 60; calling ``on_wait(message)`` once), then raises
    :class:`RunStoreLocked`. Group
    several reads under one open with ``with store.session(): ...``.
    """

    def __init__(self, path: str | Path = "runs.duckdb", *, read_only: bool = False,
                 wait_s: float | None = None, on_wait: Callable[[str], None] | None = None) -> None:
        self.path = str(path)
        if not self.path:  # (DuckDB took "" as a database in memory, with no tables: "Table runs does not exist")
            raise RunStoreError("the run store's path is empty: give a file (runs.duckdb), or \":memory:\"")
        if not_text(self.path):
            raise RunStoreError(f"the run store's path '{printable(self.path)}' is not UTF-8 text (DuckDB cannot "
                                "open it): give another")
        self.read_only = read_only
        self.snapshot_of: str | None = None
        self.wait_s = default_wait_s() if wait_s is None else wait_s
        self.on_wait = on_wait
        self._local = threading.local()
        self._write_lock = threading.RLock()
        self._seq: dict[tuple[str, str], int] = {}
        self._keep: duckdb.DuckDBPyConnection | None = None  # ":memory:" and snapshots stay open
        self._discard: Callable[[], Any] | None = None  # a snapshot's: close and remove its copy
        self._file_key = f":memory:{id(self)}" if self.path == ":memory:" else os.path.realpath(self.path)
        if self.path == ":memory:":
            self._keep = self._open()
        elif os.path.isfile(self.path) and (problem := not_a_run_store(self.path)):
            raise RunStoreError(problem)  # (never opened: DuckDB would read a dataset file as views)
        elif not read_only:
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise RunStoreError(f"cannot create the folder of {self.path}: {exc.strerror or exc}") from exc
        with self.session() as cur:
            if not read_only:
                self.migrate()
                self._reap_orphans(cur)
            elif not self._has_table("omem_schema"):
                raise RunStoreError(f"{self.path} is not an omem run store (no omem_schema table)")
            else:
                _known_schema({row[0] for row in cur.execute("SELECT version FROM omem_schema").fetchall()}, self.path,
                              read_only=True)

    @classmethod
    def snapshot(cls, path: str | Path) -> RunStore:
        """A read-only view of a file another process holds: a private copy taken now.

        The original is only read (never locked or written), so it cannot be corrupted; the copy
        shows what had reached the file (and its WAL) when it was taken. The copy (as large as the
        file) lives in a temporary folder that :meth:`close` removes, as does the end of the process
        or the store's garbage collection, whichever comes first.
        """
        import shutil
        import tempfile
        import weakref

        source = Path(path)
        folder = Path(tempfile.mkdtemp(prefix="omem-snapshot-"))
        try:
            target = folder / source.name
            shutil.copy2(source, target)
            wal = source.with_name(source.name + ".wal")
            if wal.exists():
                shutil.copy2(wal, target.with_name(target.name + ".wal"))
            store = cls(target)
            store._keep = store._open()
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        store.read_only = True
        store.snapshot_of = str(source)
        # (Holds the connection, not the store: closes it first, then removes the copy.)
        store._discard = weakref.finalize(store, _discard_snapshot, store._keep, folder)
        return store

    # -- connection ---------------------------------------------------------------------------

    def _open(self) -> duckdb.DuckDBPyConnection:
        allowed = getattr(self._local, "wait_s", None)
        allowed = self.wait_s if allowed is None else allowed
        started = time.monotonic()
        told = False
        delay = 0.02
        while True:
            # Read again at each try: a Ctrl-C pressed during the wait (the likeliest moment, just
            # after "waiting for …") shortens it too, where the key is otherwise ignored.
            cap = wait_cap()
            wait_s = allowed if cap is None else min(allowed, cap)
            deadline = started + wait_s
            try:
                return duckdb.connect(self.path, config=_DUCKDB_CONFIG)
            except duckdb.IOException as exc:
                if not _is_lock_error(exc):
                    raise RunStoreError(_describe_unreadable(self.path, exc)) from exc
                if time.monotonic() >= deadline:
                    raise RunStoreLocked(
                        f"{self.path} is open in another process (a notebook or a program that keeps it "
                        f"open, even read-only) and stayed busy for {wait_s:g} s. Stop that process, "
                        "or pass --db with another file. The app can still show a read-only snapshot."
                    ) from exc
                if not told and self.on_wait is not None:
                    self.on_wait(f"waiting for {self.path}: another process is using it "
                                 f"(up to {wait_s:g} s)")
                    told = True
                time.sleep(min(delay, max(deadline - time.monotonic(), 0)))
                delay = min(delay * 2, 0.5)
            except duckdb.Error as exc:
                raise RunStoreError(_describe_unreadable(self.path, exc)) from exc

    @contextlib.contextmanager
    def session(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One open of the file for everything inside (re-entrant per thread); yields a cursor."""
        cur = getattr(self._local, "cursor", None)
        if cur is not None:
            yield cur
            return
        con = self._keep if self._keep is not None else self._open()
        cur = con.cursor()
        self._local.cursor = cur
        try:
            if _pending.get(self._file_key) and not self.read_only:
                self._settle(cur)
            yield cur
        except (duckdb.IOException, duckdb.SerializationException, duckdb.InternalException) as exc:
            # A file that opened but cannot be read through (truncated, corrupt, disk gone).
            raise RunStoreError(_describe_unreadable(self.path, exc)) from exc
        finally:
            self._local.cursor = None
            cur.close()
            if con is not self._keep:
                con.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """The open cursor of the current session (call inside ``session()``)."""
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            raise RuntimeError("RunStore.cursor() outside a session: use `with store.session() as cur:`")
        return cur

    def close(self) -> None:
        """Close the connection a ``":memory:"`` store or a snapshot keeps open (a snapshot's copy is
        removed); a store on a file holds none between operations. Safe to call twice."""
        if self._discard is not None:
            self._discard()  # (closes the connection too)
        elif self._keep is not None:
            self._keep.close()
        self._keep = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _has_table(self, name: str) -> bool:
        with self.session() as cur:
            return bool(cur.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchall()[0][0])

    def migrate(self) -> None:
        with self.session() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS omem_schema "
                        "(version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMPTZ)")
            done = {row[0] for row in cur.execute("SELECT version FROM omem_schema").fetchall()}
            _known_schema(done, self.path)
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
        with self.session() as cur:
            row = cur.execute("SELECT max(version) FROM omem_schema").fetchall()[0]
        return int(row[0] or 0)

    def _reap_orphans(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Mark ``interrupted`` the runs and experiments left ``running`` by a process of this host
        that is gone (the schema is current here: migrations ran first)."""
        for table, key, resume in (("runs", "run_id", "replay --resume {}"),
                                   ("experiments", "experiment_id", "experiment resume {}")):
            rows = cur.execute(f"SELECT {key}, owner_pid, owner_token FROM {table} WHERE status = 'running' "
                               "AND owner_host = ?", [socket.gethostname()]).fetchall()
            for value, pid, token in rows:
                if pid is None or process_alive(int(pid), token):
                    continue
                done, counted = "", 0.0
                if table == "runs":
                    steps = cur.execute("SELECT steps FROM runs WHERE run_id = ?", [value]).fetchall()[0][0]
                    done = f" after {int(steps or 0)} recorded steps"
                else:  # its time up to its last run recorded since it started (or was resumed: its
                    # updated_at, which nothing else writes while it runs), so that a resume's total
                    # does not leave it out
                    [(counted,)] = cur.execute(
                        "SELECT coalesce(date_diff('millisecond', any_value(e.updated_at), max(r.updated_at)), 0) "
                        "/ 1000.0 FROM experiments e JOIN runs r ON r.experiment_id = e.experiment_id "
                        "AND r.updated_at >= e.updated_at WHERE e.experiment_id = ?", [value]).fetchall()
                    if counted:
                        done = f" after its last recorded run, {float(counted):.1f} s in (its elapsed time counts up to there)"
                cur.execute(f"UPDATE {table} SET status = 'interrupted', error = ?, updated_at = ?, "
                            f"elapsed_s = CASE WHEN ? > 0 THEN coalesce(elapsed_s, 0) + ? ELSE elapsed_s END "
                            f"WHERE {key} = ?",
                            [f"the process that ran it (pid {pid}) stopped{done}; finish it with: "
                             + cli_command(resume.format(value), self.path), _now(), counted, counted, value])

    # -- writing ------------------------------------------------------------------------------

    def _writing(self) -> contextlib.AbstractContextManager[duckdb.DuckDBPyConnection]:
        if self.read_only:
            raise RunStoreError(f"{self.snapshot_of or self.path} is open read-only here: nothing can be written")
        return self.session()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One write transaction: committed at the end, rolled back on any error."""
        with self._write_lock, self._writing() as cur:
            cur.execute("BEGIN TRANSACTION")
            try:
                yield cur
            except BaseException as exc:
                cur.execute("ROLLBACK")
                if _interrupted_query(exc):  # Ctrl-C during a statement: DuckDB took the signal
                    raise KeyboardInterrupt from exc
                raise
            cur.execute("COMMIT")

    def create_run(self, *, dataset: str, dataset_format: str, conversation_id: str, config: dict[str, Any],
                   messages: Sequence[dict[str, Any]], label: str | None = None, planned_steps: int | None = None,
                   status: str = "running", error: str | None = None, run_id: str | None = None) -> str:
        """A new run owned by this process (a dead owner makes it ``interrupted`` on the next open)."""
        run_id = run_id or new_run_id()
        now = _now()
        with self._transaction() as cur:
            cur.execute(
                "INSERT INTO runs (run_id, created_at, updated_at, dataset, dataset_format, conversation_id, "
                "label, config, status, error, messages, planned_steps, owner_host, owner_pid, owner_token) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, now, now, _where(dataset), dataset_format, conversation_id, label,
                 json.dumps(config, sort_keys=True), status, error, len(messages), planned_steps, *_owner()])
            _insert_dicts(cur, "messages", run_id, messages)
        return run_id

    def _claim(self, table: str, key: str, value: str) -> None:
        """This process continues a run or experiment (a resume): ``running`` and owned by us.
        :class:`RunBusy` while another live process of this host runs it (two writers of one run
        would write the same steps twice)."""
        with self._write_lock, self._writing() as cur:
            pid = _live_owner(cur, table, key, value)
            if pid is not None:
                kind = "run" if table == "runs" else "experiment"
                raise RunBusy(f"{kind} {value} is still running in process {pid} on this host: let it finish, "
                              "or stop that process first (it is then marked interrupted and can be resumed)")
            with _claims_lock:  # (with the update: a settle of another store never falls in between)
                cur.execute(f"UPDATE {table} SET status = 'running', error = NULL, owner_host = ?, owner_pid = ?, "
                            f"owner_token = ?, updated_at = ? WHERE {key} = ?", [*_owner(), _now(), value])
                _claims[self._file_key, value] = _claims.get((self._file_key, value), 0) + 1

    def claim_run(self, run_id: str) -> None:
        self._claim("runs", "run_id", run_id)

    def add_steps(self, run_id: str, rows: list[dict[str, Any]], calls: Sequence[dict[str, Any]] = (),
                  records: Sequence[dict[str, Any]] = (), elapsed_s: float | None = None) -> None:
        """Append step rows, the records written and the model calls made during them, in one
        transaction. ``records`` are dicts with ``record`` (an ObservationRecord), ``step`` and
        ``tokens``; ``elapsed_s``, the run's time so far, is written with the steps."""
        if not rows and not calls and not records:
            return
        try:
            with self._transaction() as cur:
                _require_run(cur, run_id, self.path)
                _insert_dicts(cur, "steps", run_id, rows, verb="INSERT OR REPLACE")
                if records:
                    first = self._next_seq(cur, "records", run_id, len(records))
                    _insert_many(cur, "records", ["run_id", "seq", *_RECORD_COLUMNS],
                                 [[run_id, first + i, *_record_values(r)] for i, r in enumerate(records)])
                if calls:
                    first = self._next_seq(cur, "model_calls", run_id, len(calls))
                    _insert_many(cur, "model_calls", ["run_id", "seq", *calls[0]],
                                 [[run_id, first + i, *c.values()] for i, c in enumerate(_calls(calls))])
                if rows:
                    cur.execute("UPDATE runs SET steps = ?, updated_at = ?, elapsed_s = coalesce(?, elapsed_s) "
                                "WHERE run_id = ?", [rows[-1]["step"] + 1, _now(), elapsed_s, run_id])
        except Exception:  # the counted sequences are read again from the file next time
            self._seq.pop(("model_calls", run_id), None)
            self._seq.pop(("records", run_id), None)
            raise

    def _next_seq(self, cur: duckdb.DuckDBPyConnection, table: str, run_id: str, count: int = 1) -> int:
        """The next ``seq`` of ``table`` for a run (read once from DuckDB, then counted here)."""
        key = (table, run_id)
        if key not in self._seq:
            self._seq[key] = cur.execute(
                f"SELECT coalesce(max(seq), 0) FROM {table} WHERE run_id = ?", [run_id]).fetchall()[0][0]
        first = self._seq[key] + 1
        self._seq[key] += count
        return first

    def discard_after(self, run_id: str, step: int) -> int:
        """Drop the records and model calls a run wrote after its last recorded step.

        Records and calls are written with their steps, so only an older store or a crash between
        writes leaves such rows; a resume recomputes them from the same state, so the run ends as
        if never interrupted. Returns how many records were dropped.
        """
        with self._transaction() as cur:
            dropped = cur.execute("SELECT count(*) FROM records WHERE run_id = ? AND step > ?",
                                  [run_id, step]).fetchall()[0][0]
            cur.execute("DELETE FROM records WHERE run_id = ? AND step > ?", [run_id, step])
            cur.execute("DELETE FROM model_calls WHERE run_id = ? AND step > ?", [run_id, step])
        self._seq = {k: v for k, v in self._seq.items() if k[1] != run_id}
        return int(dropped)

    def delete_records(self, run_id: str, thread_id: str) -> None:
        with self._write_lock, self._writing() as cur:
            cur.execute("DELETE FROM records WHERE run_id = ? AND thread_id = ?", [run_id, thread_id])

    def set_status(self, run_id: str, status: str, error: str | None = None) -> None:
        with self._write_lock, self._writing() as cur:
            cur.execute("UPDATE runs SET status = ?, error = ?, updated_at = ? WHERE run_id = ?",
                        [status, redact_secrets(error), _now(), run_id])

    def settle_run(self, run_id: str, status: str, error: str | None = None) -> None:
        """The last word of a run whose writes failed (the file held by another process past the
        wait, unreadable): its status, set now if the file can be written at once, else the next
        time a store of this process opens the file. Only while the run is still ``running`` and
        still this process's, and not resumed since (by any store of this process): one deleted,
        taken over or resumed meanwhile is left alone. Before, such a run stayed ``running`` for as long as
        its process lived, and the app showed it as still running."""
        self._defer_end("runs", run_id, [("UPDATE runs SET status = ?, error = ?, updated_at = ? WHERE run_id = ?",
                                          [status, redact_secrets(error), _now(), run_id])])

    def _defer_end(self, table: str, value: str, statements: list[tuple[str, list[Any]]]) -> None:
        """Write ``statements`` (the end of a run or experiment) now if the file can be written
        at once, else at the next open of the file by any store of this process: see
        :meth:`settle_run`."""
        with self._write_lock:
            with _claims_lock:
                claims = _claims.get((self._file_key, value), 0)
                _pending.setdefault(self._file_key, {})[table, value] = (statements, claims)
            previous = getattr(self._local, "wait_s", None)
            self._local.wait_s = 0.0
            try:
                with self._writing():  # (settled on opening)
                    pass
            except RunStoreError:
                pass  # the file is still held: the next open settles it
            finally:
                self._local.wait_s = previous

    def _settle(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Write the ends deferred by any store of this process for this file (a store the app
        replaced, its cache cleared, held one that no store would ever write)."""
        with self._write_lock:
            with _claims_lock:  # (taken: another store opening the file meanwhile does not write them too)
                pending = _pending.pop(self._file_key, {})
            left = dict(pending)
            try:
                for (table, value), (statements, claims) in pending.items():
                    key = "run_id" if table == "runs" else "experiment_id"
                    with _claims_lock:  # (checked and written as one: see _claim)
                        if _claims.get((self._file_key, value), 0) == claims:  # (else resumed since: its resume's)
                            cur.execute("BEGIN TRANSACTION")
                            try:
                                ours = cur.execute(
                                    f"SELECT count(*) FROM {table} WHERE {key} = ? AND status = 'running' AND "
                                    "owner_host = ? AND owner_pid = ? AND owner_token IS NOT DISTINCT FROM ?",
                                    [value, *_owner()]).fetchall()[0][0]
                                if ours:  # (deleted or taken over since: left alone)
                                    for sql, params in statements:
                                        cur.execute(sql, params)
                            except BaseException:
                                cur.execute("ROLLBACK")
                                raise
                            cur.execute("COMMIT")
                    del left[table, value]
            except duckdb.Error:
                pass  # (tried again at the next open)
            finally:
                if left:
                    with _claims_lock:
                        bucket = _pending.setdefault(self._file_key, {})
                        for item, end in left.items():
                            bucket.setdefault(item, end)

    def update_run(self, run_id: str, **figures: Any) -> None:
        if not figures:
            return
        assignments = ", ".join(f"{key} = ?" for key in figures)
        with self._write_lock, self._writing() as cur:
            _require_run(cur, run_id, self.path)
            cur.execute(f"UPDATE runs SET {assignments}, updated_at = ? WHERE run_id = ?",
                        [*figures.values(), _now(), run_id])

    def replace_probes(self, run_id: str, rows: list[dict[str, Any]], methods: Iterable[str]) -> None:
        with self._transaction() as cur:
            _require_run(cur, run_id, self.path)
            for method in methods:
                cur.execute("DELETE FROM probes WHERE run_id = ? AND method = ?", [run_id, method])
            _insert_dicts(cur, "probes", run_id, [_redacted_answer(row) for row in rows])

    def record_judging(self, run_id: str, rows: list[dict[str, Any]], calls: int, cost_usd: float | None) -> None:
        """A run's LLM-judged probes (method ``llm_judge``) with what judging them took: its
        answerer and judge calls and their cost (``None``: a model's price is unknown)."""
        with self._transaction() as cur:
            _require_run(cur, run_id, self.path)
            cur.execute("DELETE FROM probes WHERE run_id = ? AND method = 'llm_judge'", [run_id])
            _insert_dicts(cur, "probes", run_id, [_redacted_answer(row) for row in rows])
            cur.execute("UPDATE runs SET judge_calls = ?, judge_cost_usd = ?, updated_at = ? WHERE run_id = ?",
                        [calls, cost_usd, _now(), run_id])

    def replace_unfinished_runs(self, experiment_id: str) -> None:
        """Delete the experiment's runs that did not complete (a resume replays them), keeping what
        their calls cost in the experiment's ``other_cost_usd``: that money was spent."""
        with self._transaction() as cur:
            rows = cur.execute(  # (the runs as read: an unfinished run's cost from its recorded calls)
                "SELECT run_id, coalesce(cost_usd, 0) + coalesce(judge_cost_usd, 0), "
                "(cost_usd IS NULL AND coalesce(observer_calls, 0) + coalesce(reflector_calls, 0) > 0) "
                "OR (judge_cost_usd IS NULL AND coalesce(judge_calls, 0) > 0) "
                f"FROM ({_RUNS} WHERE runs.experiment_id = ? AND runs.status <> 'completed')",
                [experiment_id]).fetchall()
            self._delete_runs(cur, [run_id for run_id, _, _ in rows], "replacing it")
            if rows:
                _add_other_cost(cur, experiment_id, sum(float(cost) for _, cost, _ in rows),
                                any(unknown for _, _, unknown in rows))

    def add_other_cost(self, experiment_id: str, cost_usd: float, unknown: bool = False) -> None:
        """Count calls that no run records (judging that failed part-way) in the experiment's
        ``other_cost_usd``; ``unknown``: some of them had no known price."""
        with self._transaction() as cur:
            _add_other_cost(cur, experiment_id, cost_usd, unknown)

    def delete_run(self, run_id: str) -> None:
        """Delete a run and everything recorded of it (:class:`RunBusy` while another live process
        replays it: stop that process first)."""
        with self._transaction() as cur:
            self._delete_runs(cur, [run_id], "deleting it")

    def _delete_runs(self, cur: duckdb.DuckDBPyConnection, run_ids: Sequence[str], doing: str) -> None:
        for run_id in run_ids:  # all checked before any is deleted
            pid = _live_owner(cur, "runs", "run_id", run_id)
            if pid is not None:
                raise RunBusy(f"run {run_id} is being replayed by process {pid} on this host: stop it (or let it "
                              f"finish) before {doing}")
        for run_id in run_ids:
            for table in RUN_TABLES:
                cur.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        gone = set(run_ids)
        self._seq = {k: v for k, v in self._seq.items() if k[1] not in gone}

    def save_prompt(self, prompt: Prompt) -> bool:
        """Save a prompt version (``False``: it was there already, saved or built in, with this
        text: nothing written); a version name already used with other text — a built-in one
        ("v1", "v2") or a saved one — is refused (two texts under one label: the pickers offered
        only the built-in, so the saved text could never be chosen)."""
        from omem_core.prompts import BUILTIN_PROMPTS

        if problem := version_problem(prompt.version):
            raise RunStoreError(f"prompt version {prompt.version!r}: {problem}")
        builtin = {p.version: p for p in BUILTIN_PROMPTS.get(prompt.name, [])}
        if prompt.version in builtin:
            if builtin[prompt.version].sha256 == prompt.sha256:
                return False  # the built-in itself: nothing to save
            raise RunStoreError(f"{prompt.version} is a built-in {prompt.name} prompt version; choose a new "
                                "version name")
        with self._write_lock, self._writing() as cur:
            found = cur.execute("SELECT sha256 FROM prompts WHERE name = ? AND version = ?",
                                [prompt.name, prompt.version]).fetchall()
            existing = found[0] if found else None
            if existing and existing[0] != prompt.sha256:
                raise RunStoreError(f"prompt {prompt.label} already exists with other text; "
                                    "choose a new version name")
            if existing:
                return False
            cur.execute("INSERT INTO prompts VALUES (?, ?, ?, ?, ?)",
                        [prompt.name, prompt.version, prompt.sha256, prompt.text, _now()])
            return True

    def replace_losses(self, run_id: str, rows: Sequence[dict[str, Any]]) -> None:
        """The run's loss-attribution rows (see :mod:`workbench.losses`), replacing earlier ones."""
        with self._transaction() as cur:
            _require_run(cur, run_id, self.path)
            cur.execute("DELETE FROM probe_losses WHERE run_id = ?", [run_id])
            _insert_losses(cur, run_id, rows)

    def write_rescored(self, runs: Sequence[Any], *, experiment_id: str | None = None, rule: int | None = None) -> None:
        """Runs re-scored under another retention rule (:class:`workbench.rescore.Rescored`: their
        word-retention probe rows, loss rows and figures), and with ``experiment_id`` the rule its
        runs are scored under from now on, in one transaction: all of it or nothing."""
        methods = sorted({row["method"] for run in runs for row in run.probes})
        with self._transaction() as cur:
            for run in runs:
                if not cur.execute("SELECT 1 FROM runs WHERE run_id = ?", [run.run_id]).fetchall():
                    raise RunDeleted(f"run {run.run_id} was deleted from {self.path}; nothing was re-scored")
                if methods:
                    cur.execute(f"DELETE FROM probes WHERE run_id = ? AND method IN ({', '.join('?' * len(methods))})",
                                [run.run_id, *methods])
                _insert_dicts(cur, "probes", run.run_id, [_redacted_answer(row) for row in run.probes])
                if run.losses is not None:
                    cur.execute("DELETE FROM probe_losses WHERE run_id = ?", [run.run_id])
                    _insert_losses(cur, run.run_id, run.losses)
                assignments = ", ".join(f"{key} = ?" for key in run.figures)
                cur.execute(f"UPDATE runs SET {assignments}, updated_at = ? WHERE run_id = ?",
                            [*run.figures.values(), _now(), run.run_id])
            if experiment_id is not None:
                found = cur.execute("SELECT options, status FROM experiments WHERE experiment_id = ?",
                                    [experiment_id]).fetchall()
                if not found:
                    raise RunDeleted(f"experiment {experiment_id} was deleted from {self.path}; nothing was re-scored")
                # Checked again here, in the write's transaction: a resume that started (or a run of it
                # that completed) while the runs were being scored would write runs under the old rule
                # into an experiment recorded under the new one.
                ours = {run.run_id for run in runs}
                others = cur.execute("SELECT run_id, status, coalesce(scoring, CASE WHEN retention IS NOT NULL THEN 1 "
                                     "END) FROM runs WHERE experiment_id = ?", [experiment_id]).fetchall()
                moved = [run_id for run_id, status, scoring in others if status == "running" or (
                    status == "completed" and run_id not in ours and scoring is not None and scoring != rule)]
                if found[0][1] == "running" or moved:
                    raise RunBusy(f"experiment {experiment_id} was resumed, or a run of it completed, while it was being "
                                  "re-scored: nothing was re-scored; re-score it once it has finished")
                options = json.loads(found[0][0])
                cur.execute("UPDATE experiments SET options = ?, updated_at = ? WHERE experiment_id = ?",
                            [json.dumps({**options, "scoring": rule}, sort_keys=True), _now(), experiment_id])

    def write_run(self, payload: dict[str, Any], *, messages: Sequence[dict[str, Any]]) -> str:
        """A whole run replayed elsewhere (an experiment's worker), written in one transaction:
        a run is in the store entirely or not at all. Returns its id."""
        run = dict(payload["run"])
        if "dataset" in run:
            run["dataset"] = _where(run["dataset"])
        run_id = new_run_id()
        now = _now()
        columns = ["run_id", "created_at", "updated_at", "messages", "owner_host", "owner_pid", "owner_token"]
        values: list[Any] = [run_id, now, now, len(messages), *_owner()]
        for key, value in run.items():
            columns.append(key)
            values.append(json.dumps(value, sort_keys=True) if key == "config" else
                          redact_secrets(value) if key == "error" else value)
        with self._transaction() as cur:
            experiment_id = run.get("experiment_id")
            if experiment_id is not None and not cur.execute(
                    "SELECT 1 FROM experiments WHERE experiment_id = ?", [experiment_id]).fetchall():
                raise RunDeleted(f"experiment {experiment_id} was deleted from {self.path} while it ran; its "
                                 "remaining runs are not written")
            cur.execute(f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", values)
            _insert_dicts(cur, "messages", run_id, messages)
            _insert_dicts(cur, "steps", run_id, payload.get("steps") or [])
            records = payload.get("records") or []
            if records:
                _insert_many(cur, "records", ["run_id", "seq", *_RECORD_COLUMNS],
                             [[run_id, i + 1, *_record_values(r)] for i, r in enumerate(records)])
            calls = payload.get("calls") or []
            if calls:
                _insert_many(cur, "model_calls", ["run_id", "seq", *calls[0]],
                             [[run_id, i + 1, *c.values()] for i, c in enumerate(_calls(calls))])
            _insert_dicts(cur, "probes", run_id, payload.get("probes") or [])
            _insert_losses(cur, run_id, payload.get("losses") or [])
        return run_id

    # -- experiments --------------------------------------------------------------------------

    def create_experiment(self, *, name: str | None, dataset: str, dataset_format: str | None,
                          conversations: Sequence[str], configs: Sequence[dict[str, Any]],
                          options: dict[str, Any]) -> str:
        experiment_id = "exp-" + new_run_id()
        now = _now()
        with self._write_lock, self._writing() as cur:
            cur.execute("INSERT INTO experiments (experiment_id, created_at, updated_at, name, dataset, dataset_format, "
                        "conversations, configs, options, status, owner_host, owner_pid, owner_token) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?)",
                        [experiment_id, now, now, name, _where(dataset), dataset_format,
                         json.dumps(list(conversations)),
                         json.dumps(list(configs), sort_keys=True), json.dumps(options, sort_keys=True),
                         *_owner()])
        return experiment_id

    def claim_experiment(self, experiment_id: str) -> None:
        self._claim("experiments", "experiment_id", experiment_id)

    def update_experiment_options(self, experiment_id: str, **changes: Any) -> None:
        options = {**self.experiment(experiment_id)["options"], **changes}
        with self._write_lock, self._writing() as cur:
            cur.execute("UPDATE experiments SET options = ?, updated_at = ? WHERE experiment_id = ?",
                        [json.dumps(options, sort_keys=True), _now(), experiment_id])

    def finish_experiment(self, experiment_id: str, status: str, error: str | None, elapsed_s: float,
                          other_cost: tuple[float, bool] | None = None) -> None:
        """Record the experiment's end; ``other_cost`` (amount, a price unknown): what calls no run
        records cost (runs cut off in flight), in the same write (a separate one that failed, the
        run store held, left the experiment "running"). When the file cannot be written (held by
        another process past the wait), the end is written at the next open of the file by a store
        of this process, as :meth:`settle_run` does (it stayed "running" while this process lived: the app's, for
        hours), and the error raised."""
        statements: list[tuple[str, list[Any]]] = []
        if other_cost is not None and (other_cost[0] or other_cost[1]):
            statements.append(_other_cost(experiment_id, float(other_cost[0]), bool(other_cost[1])))
        statements.append(("UPDATE experiments SET status = ?, error = ?, elapsed_s = coalesce(elapsed_s, 0) + ?, "
                           "updated_at = ? WHERE experiment_id = ?",
                           [status, redact_secrets(error), elapsed_s, _now(), experiment_id]))
        try:
            with self._transaction() as cur:
                for sql, params in statements:
                    cur.execute(sql, params)
        except RunStoreError:
            self._defer_end("experiments", experiment_id, statements)
            raise

    def experiment(self, experiment_id: str) -> dict[str, Any]:
        frame = self._df("SELECT * FROM experiments WHERE experiment_id = ?", [experiment_id])
        if frame.empty:
            raise UnknownRun(experiment_id, self.path, kind="experiment")
        row = frame.iloc[0].to_dict()
        for key in ("conversations", "configs", "options"):
            row[key] = json.loads(row[key])
        return row

    def experiments(self) -> pd.DataFrame:
        """Every experiment, newest first, with counts of its runs: ``runs`` recorded, ``failed_runs``
        recorded but not completed, ``planned_runs`` (conversations × configurations) and
        ``unfinished_runs``, the planned ones not completed (failed, or never started: an
        interrupted experiment has runs it never recorded)."""
        frame = self._df("SELECT e.*, (SELECT count(*) FROM runs r WHERE r.experiment_id = e.experiment_id) AS runs, "
                         "(SELECT count(*) FROM runs r WHERE r.experiment_id = e.experiment_id "
                         "AND r.status <> 'completed') AS failed_runs FROM experiments e ORDER BY created_at DESC")
        planned = [len(json.loads(conversations)) * len(json.loads(configs))
                   for conversations, configs in zip(frame.conversations, frame.configs)]
        frame["planned_runs"] = pd.Series(planned, index=frame.index, dtype="int64")
        frame["unfinished_runs"] = (frame.planned_runs - (frame.runs - frame.failed_runs)).clip(lower=0)
        return frame

    def experiment_runs(self, experiment_id: str) -> pd.DataFrame:
        return self._df(_RUNS + " WHERE runs.experiment_id = ? ORDER BY runs.created_at", [experiment_id])

    def experiment_probes(self, experiment_id: str) -> pd.DataFrame:
        return self._df("SELECT r.config_label, r.conversation_id, p.* FROM probes p JOIN runs r USING (run_id) "
                        "WHERE r.experiment_id = ? AND r.status = 'completed' ORDER BY r.config_label, "
                        "r.conversation_id, p.probe_id, p.method", [experiment_id])  # (not by run id: random)

    def experiment_losses(self, experiment_id: str) -> pd.DataFrame:
        return self._df("SELECT r.config_label, r.conversation_id, l.* FROM probe_losses l JOIN runs r USING (run_id) "
                        "WHERE r.experiment_id = ? AND r.status = 'completed' ORDER BY r.config_label, "
                        "r.conversation_id, l.probe_id", [experiment_id])

    def delete_experiment(self, experiment_id: str) -> None:
        """Delete an experiment and its runs (:class:`RunBusy` while another live process runs it)."""
        with self._transaction() as cur:
            pid = _live_owner(cur, "experiments", "experiment_id", experiment_id)
            if pid is not None:
                raise RunBusy(f"experiment {experiment_id} is running in process {pid} on this host: stop it (or "
                              "let it finish) before deleting it")
            ids = [r[0] for r in cur.execute("SELECT run_id FROM runs WHERE experiment_id = ?", [experiment_id]).fetchall()]
            for table in RUN_TABLES:
                cur.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", [ids])
            cur.execute("DELETE FROM experiments WHERE experiment_id = ?", [experiment_id])

    # -- reading ------------------------------------------------------------------------------

    def _df(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        with self.session() as cur:
            return cur.execute(sql, list(params)).df()

    def run(self, run_id: str) -> dict[str, Any]:
        frame = self._df(_RUNS + " WHERE runs.run_id = ?", [run_id])
        if frame.empty:
            raise UnknownRun(run_id, self.path)
        row = frame.iloc[0].to_dict()
        row["config"] = json.loads(row["config"])
        return row

    def runs(self) -> pd.DataFrame:
        return self._df(_RUNS + " ORDER BY runs.created_at DESC")

    def has_run(self, run_id: str) -> bool:
        """Whether the store holds ``run_id`` (a cheap check for a page that follows a run)."""
        return not self._df("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).empty

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

    def losses(self, run_id: str) -> pd.DataFrame:
        return self._df("SELECT * FROM probe_losses WHERE run_id = ? ORDER BY probe_id", [run_id])

    def prompts(self) -> pd.DataFrame:
        return self._df("SELECT * FROM prompts ORDER BY name, created_at")

    def prompt(self, name: str, version: str) -> Prompt:
        from omem_core import Prompt

        with self.session() as cur:
            rows = cur.execute("SELECT text FROM prompts WHERE name = ? AND version = ?",
                               [name, version]).fetchall()
        if not rows:
            raise KeyError(f"no saved prompt {name}@{version}")
        return Prompt(name=name, version=version, text=rows[0][0])

    def load_records(self, run_id: str) -> list[ObservationRecord]:
        from omem_core import ObservationRecord

        with self.session() as cur:
            rows = cur.execute(
                "SELECT record_id, thread_id, resource_id, created_at, kind, source_ids, text FROM records "
                "WHERE run_id = ? ORDER BY seq", [run_id]).fetchall()
        return [ObservationRecord(id=r[0], thread_id=r[1], resource_id=r[2], created_at=r[3], kind=r[4],
                                  source_ids=tuple(json.loads(r[5])), text=r[6]) for r in rows]

    def export_parquet(self, run_id: str, folder: str | Path) -> list[Path]:
        """Write the run's rows of every table as ``folder/<table>.parquet``.

        The paths never enter SQL text (DuckDB's COPY takes no parameter for its target): rows are
        fetched as Arrow tables and written by pyarrow, so any file name works.
        """
        import pyarrow.parquet as pq

        self.run(run_id)
        out = Path(folder)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunStoreError(f"cannot create the export folder {out}: {exc.strerror or exc}") from exc
        written = []
        with self.session() as cur:
            for table in RUN_TABLES:
                target = out / f"{table}.parquet"
                rows = cur.sql(f"SELECT * FROM {table} WHERE run_id = $1", params=[run_id]).to_arrow_table()
                try:
                    pq.write_table(rows, target)
                except OSError as exc:
                    raise RunStoreError(f"cannot write {target}: {exc}") from exc
                written.append(target)
        return written


class UnknownRun(WorkbenchError, KeyError):
    """No run (or experiment) with this id in the store (``str()`` is the plain sentence, without
    KeyError's quotes)."""

    def __init__(self, run_id: str, path: str, *, kind: str = "run") -> None:
        super().__init__(run_id)
        self.run_id = run_id
        listing = "runs" if kind == "run" else "experiment list"
        self.message = (f"no {kind} {run_id} in {path} ({cli_command(listing, path)} lists them"
                        + ("; --db chooses another run store)" if path == DEFAULT_DB else ")"))

    def __str__(self) -> str:
        return self.message
