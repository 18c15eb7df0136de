"""What a replay writes to the run store, in one place.

A :class:`RunRecorder` owns one run of a run store: it buffers step rows together with the
records written and the model calls made during those steps, and writes each batch in one
transaction; :meth:`finish` stores the figures and the final status. :class:`MemoryRecorder` is the
same interface keeping everything in memory (a replay without a store, or an experiment's worker
process, whose run the scheduler writes in one go: :meth:`MemoryRecorder.payload`), so the replay
loop has no "is there a store?" branches.

Records are written with their step's batch, not one by one: a hard kill loses at most the
unflushed batch, and a resume recomputes it from the last recorded step (with litellm's cache on,
the repeated model calls cost nothing).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omem_core import CompactionEvent, ObservationRecord, create_in_memory_observation_store
from omem_core._env import environment_secrets, redact_secrets
from omem_core.observations import InMemoryObservationStore

from .formatting import whole_text
from .runstore import RunStore

TokenCounter = Callable[[list[str]], list[int]]


def call_row(step: int, event: CompactionEvent) -> dict[str, Any]:
    """One ``model_calls`` row for a compaction event."""
    return {
        "step": step, "stage": event.stage, "model": event.model,
        "prompt_version": event.prompt_version, "prompt_sha256": event.prompt_sha256,
        "source_count": len(event.source_ids), "volume_before": event.volume_before,
        "volume_after": event.volume_after, "input_tokens": event.tokens_in,
        "output_tokens": event.tokens_out, "latency_ms": event.latency_ms, "cost_usd": event.cost_usd,
        "cache_hit": event.cache_hit, "error": event.error,
        "record_id": event.record.id if event.record else None,
        "attempts": event.attempts, "trimmed": event.trimmed,
        # the pass's model calls (one, or more when a reflection was sent back to tighten):
        # JSON lists, one entry per call, of the exact messages sent and the raw replies
        "request": _capped([list(c.messages) for c in event.calls]) if event.calls else None,
        "response": _capped([c.response if c.error is None else f"[error] {c.error}"
                             for c in event.calls]) if event.calls else None,
    }


TRACE_CAP = 64_000  # characters kept of a call's request or response
_MIN_KEEP = 40  # below this a cut string says nothing: the whole trace is dropped instead


def _capped(value: Any) -> str | None:
    """``value`` (a call's messages or replies) as JSON of at most :data:`TRACE_CAP` characters
    that is still JSON (the column is JSON, and the trace view reads it).

    Every string longer than one common length is cut to it, ending with how much of it was not
    stored; that length is the largest that fits, found by bisection on the JSON's own length
    (so a message in Chinese keeps as many characters as one in English, and a trace of many
    medium strings keeps the start of each). When even strings of :data:`_MIN_KEEP` characters
    do not fit (thousands of them), the trace is replaced by a note of its size. Cutting the
    JSON text itself made the batch's insert fail, and the run with it.

    Each string is made storable first (see :func:`_storable`), so the cap holds for what is
    stored and a cut never falls inside a secret."""
    value = _storable(value)
    text = _dumps(value)
    if len(text) <= TRACE_CAP:
        return text
    strings = _strings(value)
    sizes = [len(_dumps(s)) for s in strings]
    overhead = len(text) - sum(sizes)  # brackets, keys, commas: what no cut changes

    def size(keep: int) -> int:
        return overhead + sum(len(_dumps(_cut(s, keep))) if _cuts(s, keep) else n for s, n in zip(strings, sizes))

    low, high = _MIN_KEEP, max((len(s) for s in strings), default=0)
    if high <= low or size(low) > TRACE_CAP:
        return _dumps(f"[a trace of {len(text):,} characters, not stored]")
    while high - low > 1:  # size(low) fits, size(high) does not (high is the uncut value)
        middle = (low + high) // 2
        low, high = (middle, high) if size(middle) <= TRACE_CAP else (low, middle)
    return _dumps(_cut_all(value, low))


def _dumps(value: Any) -> str:
    """JSON as stored: non-ASCII text as itself, not as 6-character escapes."""
    return json.dumps(value, ensure_ascii=False)


def _storable(value: Any, secrets: list[tuple[str, str]] | None = None) -> Any:
    """A copy of ``value`` whose strings have any secret of the environment redacted and any lone
    surrogate (which UTF-8, and so DuckDB's JSON column, cannot hold) replaced by U+FFFD.

    Both happened after the cap: a redacted trace could exceed it and a cut could fall inside a
    key, storing its first characters; a lone surrogate was stored as an escape six times its
    length, measured as one character, so the trace ran past the cap."""
    if secrets is None:
        secrets = environment_secrets()
    if isinstance(value, str):
        return whole_text(redact_secrets(value, secrets))
    if isinstance(value, dict):  # (keys too: a key is as free to hold a secret or a surrogate)
        return {_storable(key, secrets): _storable(item, secrets) for key, item in value.items()}
    if isinstance(value, (list, tuple)):  # (JSON writes a tuple as a list anyway)
        return [_storable(item, secrets) for item in value]
    return value


def _cut(text: str, keep: int) -> str:
    return text[:keep] + f"\n[… {len(text) - keep:,} more characters not stored]"


def _cuts(text: str, keep: int) -> bool:
    """Whether cutting ``text`` at ``keep`` shortens it (the note of what was cut has a length)."""
    return len(text) > keep and len(_cut(text, keep)) < len(text)


def _strings(value: Any) -> list[str]:
    """Every string in a JSON-like value."""
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return [found for item in items for found in _strings(item)]


def _cut_all(value: Any, keep: int) -> Any:
    """A copy of ``value`` with every string that cutting at ``keep`` shortens cut to it."""
    if isinstance(value, str):
        return _cut(value, keep) if _cuts(value, keep) else value
    if isinstance(value, dict):
        return {key: _cut_all(item, keep) for key, item in value.items()}
    if isinstance(value, list):
        return [_cut_all(item, keep) for item in value]
    return value


@dataclass
class MemoryRecorder:
    """Keeps the whole run in memory: steps, records, model calls, probe scores, loss rows."""

    run_id: str | None = None
    step: int = 0
    count_tokens: TokenCounter | None = None
    observations: Any = field(default_factory=create_in_memory_observation_store)
    events: list[CompactionEvent] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    losses: list[dict[str, Any]] = field(default_factory=list)
    status: str | None = None
    error: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)

    def on_event(self, event: CompactionEvent) -> None:
        self.events.append(event)
        self.calls.append(call_row(self.step, event))

    def record_step(self, row: dict[str, Any]) -> None:
        self.steps.append(row)
        self.step = row["step"] + 1

    def save_probes(self, rows: list[dict[str, Any]], methods: Sequence[str]) -> None:
        self.probes = [r for r in self.probes if r["method"] not in methods] + list(rows)

    def save_losses(self, rows: list[dict[str, Any]]) -> None:
        self.losses = list(rows)

    def flush(self) -> None:
        pass

    def session(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def finish(self, status: str, error: str | None, figures: dict[str, Any]) -> None:
        self.status, self.error, self.figures = status, error, dict(figures)

    def recorded_calls(self) -> list[dict[str, Any]]:
        return self.calls

    def recorded_steps(self) -> list[dict[str, Any]]:
        return self.steps

    async def payload(self, thread_id: str, **run: Any) -> dict[str, Any]:
        """The whole run as plain data (picklable), for :meth:`RunStore.write_run`."""
        return {"run": {**run, "status": self.status, "error": self.error, "steps": self.step, **self.figures},
                "steps": self.steps, "records": await self.records(thread_id), "calls": self.calls,
                "probes": self.probes, "losses": self.losses}

    async def records(self, thread_id: str) -> list[dict[str, Any]]:
        """The run's records as ``records`` rows (step written, tokens)."""
        written = {c["record_id"]: c["step"] for c in self.calls if c["record_id"]}
        rows = []
        for record in await self.observations.list(thread_id):
            tokens = self.count_tokens([record.text])[0] if self.count_tokens else None
            rows.append({"record": record, "step": written.get(record.id), "tokens": tokens})
        return rows


NullRecorder = MemoryRecorder  # the name replay() used before experiments


class ExperimentRecorder(MemoryRecorder):
    """An experiment's run in memory: reports each call's cost as it happens (for the cost limit)
    and keeps or drops the call traces."""

    def __init__(self, *, on_cost: Callable[[float | None], None] | None = None, traces: bool = True) -> None:
        """``on_cost``: told each paid call's cost, and ``None`` for a call whose price is unknown
        (a failed call has none)."""
        super().__init__()
        self._on_cost = on_cost
        self._traces = traces

    def on_event(self, event: CompactionEvent) -> None:
        super().on_event(event)
        if not self._traces:
            self.calls[-1]["request"] = self.calls[-1]["response"] = None
        if self._on_cost is not None and event.cost_usd:
            self._on_cost(float(event.cost_usd))
        elif self._on_cost is not None and event.cost_usd is None and event.error is None:
            self._on_cost(None)


class RunRecorder:
    """Writes one run of ``store``: steps, records and model calls in batches of ``flush_every``
    steps (or every ``flush_seconds``, whichever comes first)."""

    def __init__(self, store: RunStore, run_id: str, count_tokens: TokenCounter, *, flush_every: int = 1000,
                 flush_seconds: float = 5.0, step: int = 0, create: dict[str, Any] | None = None) -> None:
        """``create``: the new run's ``create_run`` arguments, written with the first batch (a
        short run is then one open of the file); ``None`` for a run already in the store."""
        self.store = store
        self.run_id = run_id
        self.step = step  # the step the next read belongs to
        self.flush_every = flush_every
        self.flush_seconds = flush_seconds  # slow models: progress reaches the file at least this often
        self._flushed_at = time.monotonic()
        self._count = count_tokens
        self._create = create
        self._steps: list[dict[str, Any]] = []
        self._records: list[dict[str, Any]] = []
        self._calls: list[dict[str, Any]] = []
        self.events: list[CompactionEvent] = []  # this process's, for what each read fired
        # what the run recorded before this process (a resume), then what it records now
        self._all_calls = [] if create else store.model_calls(run_id).to_dict("records")
        self._all_steps = [] if create else store.steps(run_id)[["step", "backlog_tokens"]].to_dict("records")
        self.observations = RunObservationStore(self, [] if create else store.load_records(run_id))
        # the run's time before this process (a resume), then counted here: written with every
        # batch, so a run whose process was killed keeps the time up to its last batch (a resumed
        # run's elapsed time was its last part's alone)
        before = None if create else store.run(run_id).get("elapsed_s")
        self.elapsed_before = 0.0 if before is None or before != before else float(before)
        self._started = time.perf_counter()

    def elapsed(self) -> float:
        """The run's time so far: before this process (a resume) and in it."""
        return self.elapsed_before + time.perf_counter() - self._started

    def on_event(self, event: CompactionEvent) -> None:
        self.events.append(event)
        row = call_row(self.step, event)
        self._calls.append(row)
        self._all_calls.append(row)

    def add_record(self, record: ObservationRecord) -> None:
        self._records.append({"record": record, "step": self.step, "tokens": self._count([record.text])[0]})

    def record_step(self, row: dict[str, Any]) -> None:
        self._steps.append(row)
        self._all_steps.append(row)
        self.step = row["step"] + 1
        if len(self._steps) >= self.flush_every or time.monotonic() - self._flushed_at >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered (the run itself first, if new) in one open of the file."""
        if self._create is None and not (self._steps or self._records or self._calls):
            return
        with self.store.session():
            if self._create is not None:
                self.store.create_run(run_id=self.run_id, **self._create)
                self._create = None
            self.store.add_steps(self.run_id, self._steps, self._calls, self._records, elapsed_s=self.elapsed())
        self._steps, self._records, self._calls = [], [], []
        self._flushed_at = time.monotonic()

    def session(self) -> contextlib.AbstractContextManager[Any]:
        """One open of the run store for several writes (the end of a run)."""
        return self.store.session()

    def save_probes(self, rows: list[dict[str, Any]], methods: Sequence[str]) -> None:
        self.flush()
        self.store.replace_probes(self.run_id, rows, methods)

    def save_losses(self, rows: list[dict[str, Any]]) -> None:
        self.flush()
        self.store.replace_losses(self.run_id, rows)

    def finish(self, status: str, error: str | None, figures: dict[str, Any]) -> None:
        self.flush()
        self.store.update_run(self.run_id, **{"elapsed_s": self.elapsed(), **figures})
        self.store.set_status(self.run_id, status, error)

    def finish_unwritten(self, status: str, error: str | None) -> None:
        """The run's end when its buffered batch cannot be written: the batch is dropped (its
        steps are after the last recorded one, which a resume recomputes) and the status set, so
        the run reads ``failed`` with its error instead of staying ``running`` (then shown as
        interrupted)."""
        self._steps, self._records, self._calls = [], [], []
        self.flush()  # the run itself, if it was never written
        self.store.set_status(self.run_id, status, error)

    def settle(self, status: str, error: str | None) -> None:
        """The run's end after an error of the run store itself: its status only, now or at the
        store's next open of the file (see ``RunStore.settle_run``), if the run was written."""
        if self._create is None:
            self.store.settle_run(self.run_id, status, error)

    def recorded_calls(self) -> list[dict[str, Any]]:
        """Every model call of the run (a resumed run's earlier calls included)."""
        return self._all_calls

    def recorded_steps(self) -> list[dict[str, Any]]:
        """Every step of the run (earlier ones with ``step`` and ``backlog_tokens`` only)."""
        return self._all_steps


class RunObservationStore:
    """The library's ``ObservationStore`` port for one recorded run.

    Reads are served from an in-memory mirror (loaded from the run store at start, so a resumed
    run sees what it had written); a save goes to the mirror and to the recorder's next batch.
    """

    def __init__(self, recorder: RunRecorder, existing: Sequence[ObservationRecord] = ()) -> None:
        self._recorder = recorder
        self._mirror = InMemoryObservationStore()
        self._pending = list(existing)

    async def _load(self) -> None:
        pending, self._pending = self._pending, []
        for record in pending:
            await self._mirror.save(record)

    async def list(self, thread_id: str) -> list[ObservationRecord]:
        await self._load()
        return await self._mirror.list(thread_id)

    async def list_recent(self, thread_id: str) -> list[ObservationRecord]:
        await self._load()
        return await self._mirror.list_recent(thread_id)

    async def save(self, record: ObservationRecord) -> None:
        await self._load()
        await self._mirror.save(record)
        self._recorder.add_record(record)

    async def delete_by_thread(self, thread_id: str) -> None:
        await self._load()
        self._recorder.flush()
        self._recorder.store.delete_records(self._recorder.run_id, thread_id)
        await self._mirror.delete_by_thread(thread_id)


__all__ = ["ExperimentRecorder", "MemoryRecorder", "NullRecorder", "RunObservationStore", "RunRecorder", "call_row"]
