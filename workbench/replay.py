"""Replay a conversation through ``omem_core.Memory`` and record every step.

Each message is saved in order; before each assistant message (or every message, with
``recall_on="every"``) the replay makes the cursorless recall an agent would make, then records
the thread's state through the library's public ``inspect`` and event callback, never by patching
it. With a :class:`~workbench.runstore.RunStore` everything lands in DuckDB; the run's records
live in the run store itself (its ``ObservationStore``), so an interrupted run keeps what it
recorded and :func:`replay` with ``resume=RUN_ID`` continues from the last recorded step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from omem_core import (
    OBSERVER_PROMPT,
    OFFLINE_MODEL,
    REFLECTOR_PROMPT,
    CompactionError,
    CompactionEvent,
    InMemoryMemoryStore,
    Memory,
    Message,
    Prompt,
    create_in_memory_observation_store,
    create_observational_memory_store,
    token_counter,
)

from .cache import enable_litellm_cache
from .datasets import Conversation
from .retention import (
    METHODS,
    RetentionSummary,
    content_words,
    newest_tokens,
    probe_score,
    render_context,
    summarise,
)
from .runstore import RunObservationStore, RunStore

TOKEN_COUNTERS = ("heuristic", "o200k_base", "cl100k_base")
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class ReplayConfig:
    """What a run is configured with; stored as JSON with the run."""

    observer: str = OFFLINE_MODEL
    reflector: str | None = OFFLINE_MODEL
    observation_threshold: int = 1000
    reflection_threshold: int = 2000
    last_messages: int = 10
    token_counter: str = "heuristic"
    recall_on: str = "assistant"  # "assistant": before each assistant message; "every": every message
    observer_prompt: Prompt = OBSERVER_PROMPT
    reflector_prompt: Prompt = REFLECTOR_PROMPT
    timeout: float | None = None
    cache: bool = True

    def __post_init__(self) -> None:
        for name in ("observation_threshold", "reflection_threshold", "last_messages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.token_counter not in TOKEN_COUNTERS:
            raise ValueError(f"token_counter must be one of {', '.join(TOKEN_COUNTERS)}, got {self.token_counter!r}")
        if self.recall_on not in ("assistant", "every"):
            raise ValueError(f"recall_on must be 'assistant' or 'every', got {self.recall_on!r}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("observer_prompt", "reflector_prompt"):
            prompt: Prompt = getattr(self, key)
            data[key] = {"name": prompt.name, "version": prompt.version, "sha256": prompt.sha256, "text": prompt.text}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayConfig:
        values = dict(data)
        for key in ("observer_prompt", "reflector_prompt"):
            if isinstance(values.get(key), dict):
                p = values[key]
                values[key] = Prompt(name=p["name"], version=p["version"], text=p["text"])
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in values.items() if k in known})

    def label(self) -> str:
        reflector = self.reflector or "none"
        return (f"{self.observer} / {reflector} · obs {self.observation_threshold} · "
                f"ref {self.reflection_threshold} · window {self.last_messages} · "
                f"{self.observer_prompt.version}/{self.reflector_prompt.version}")


@dataclass
class ReplayResult:
    run_id: str | None
    status: str
    messages: int
    steps: int
    observer_calls: int
    reflector_calls: int
    cache_hits: int
    full_history_tokens: int
    final_context_tokens: int
    compression: float | None
    retention: RetentionSummary | None
    cost_usd: float | None
    elapsed_s: float
    error: str | None = None
    step_rows: list[dict[str, Any]] = field(default_factory=list, repr=False)
    context: list[Message] = field(default_factory=list, repr=False)  # what the agent sees at the end

    def summary(self) -> dict[str, Any]:
        """The figures the CLI prints with ``--json``."""
        out: dict[str, Any] = {
            "run_id": self.run_id, "status": self.status, "messages": self.messages, "steps": self.steps,
            "observer_calls": self.observer_calls, "reflector_calls": self.reflector_calls,
            "cache_hits": self.cache_hits, "full_history_tokens": self.full_history_tokens,
            "final_context_tokens": self.final_context_tokens, "compression": self.compression,
            "cost_usd": self.cost_usd, "elapsed_s": round(self.elapsed_s, 3), "error": self.error,
        }
        if self.retention is not None and self.retention.scored:
            out.update(
                retention=self.retention.retention,
                retention_full_history=self.retention.full_history,
                retention_window_only=self.retention.window_only,
                retention_recent_tokens=self.retention.recent_tokens,
                retention_relative=self.retention.relative,
                probes_scored=self.retention.scored,
                retention_per_category=self.retention.per_category,
            )
        return out


class ReplayFailed(RuntimeError):
    def __init__(self, result: ReplayResult) -> None:
        self.result = result
        super().__init__(result.error)


def _conversation_rows(conversation: Conversation, count: Callable[[list[str]], list[int]]) -> list[dict[str, Any]]:
    counts = count([t.content for t in conversation.turns])
    return [
        {"idx": i, "message_id": t.id, "role": t.role, "speaker": t.speaker, "content": t.content,
         "created_at": t.created_at, "tokens": n}
        for i, (t, n) in enumerate(zip(conversation.turns, counts))
    ]


async def replay(
    conversation: Conversation,
    config: ReplayConfig = ReplayConfig(),
    store: RunStore | None = None,
    *,
    resume: str | None = None,
    progress: Progress | None = None,
    label: str | None = None,
    flush_every: int = 100,
) -> ReplayResult:
    """Replay ``conversation`` under ``config``; record into ``store`` when given.

    Raises :class:`ReplayFailed` (carrying the partial result) when a compaction call fails;
    the run is then marked ``failed`` with the error and can be resumed.
    """
    started = time.perf_counter()
    count = token_counter(config.token_counter)
    if config.cache:
        enable_litellm_cache()
    thread = conversation.id
    turns = conversation.turns
    index_of = {t.id: i for i, t in enumerate(turns)}

    run_id: str | None = None
    start_index, step = 0, 0
    if store is not None and resume is not None:
        run = store.run(resume)
        if run["conversation_id"] != conversation.id:
            raise ValueError(f"run {resume} replayed conversation {run['conversation_id']!r}, not {conversation.id!r}")
        config = ReplayConfig.from_json(run["config"])
        count = token_counter(config.token_counter)
        run_id = resume
        steps = store.steps(run_id)
        if not steps.empty:
            last = steps.iloc[-1]
            step = int(last["step"]) + 1
            start_index = int(last["message_index"]) + 1
        # A hard kill can leave records newer than the last recorded step: recompute them (with
        # the litellm cache on, the repeated calls cost nothing).
        store.discard_after(run_id, step - 1)
        store.set_status(run_id, "running")
    elif store is not None:
        run_id = store.create_run(
            dataset=conversation.source, dataset_format=conversation.format, conversation_id=conversation.id,
            config=config.to_json(), messages=_conversation_rows(conversation, count),
            label=label or config.label())

    observations = (RunObservationStore(store, run_id, count_tokens=count) if store is not None and run_id
                    else create_in_memory_observation_store())
    events: list[CompactionEvent] = []
    pending_calls: list[dict[str, Any]] = []

    def on_event(event: CompactionEvent) -> None:
        events.append(event)
        if store is not None and run_id is not None:
            pending_calls.append({
                "step": step, "stage": event.stage, "model": event.model,
                "prompt_version": event.prompt_version, "prompt_sha256": event.prompt_sha256,
                "source_count": len(event.source_ids), "volume_before": event.volume_before,
                "volume_after": event.volume_after, "input_tokens": event.tokens_in,
                "output_tokens": event.tokens_out, "latency_ms": event.latency_ms, "cost_usd": event.cost_usd,
                "cache_hit": event.cache_hit, "error": event.error,
                "record_id": event.record.id if event.record else None,
                "attempts": event.attempts, "trimmed": event.trimmed,
            })

    wrapper = create_observational_memory_store(
        InMemoryMemoryStore(), observer=config.observer, reflector=config.reflector,
        thresholds={"observation": config.observation_threshold, "reflection": config.reflection_threshold},
        count_tokens=count, observations=observations, observer_prompt=config.observer_prompt,
        reflector_prompt=config.reflector_prompt, timeout=config.timeout, on_event=on_event,
        completion_kwargs={"caching": True, "cache": {"use-cache": True}} if config.cache else None,
    )
    memory = Memory(wrapper, last_messages=config.last_messages)
    message_tokens = count([t.content for t in turns]) if turns else []
    history = sum(message_tokens[:start_index])
    if start_index:
        await memory.save_messages([t.to_message(thread) for t in turns[:start_index]])

    pending: list[dict[str, Any]] = []
    all_rows: list[dict[str, Any]] = []

    def flush() -> None:
        """Write buffered step rows and model calls in one transaction (records are already saved)."""
        if store is not None and run_id is not None and (pending or pending_calls):
            store.add_steps(run_id, pending, pending_calls)
        pending.clear()
        pending_calls.clear()

    status, error = "completed", None
    total = len(turns)
    try:
        for i in range(start_index, total):
            turn = turns[i]
            if config.recall_on == "every" or turn.role == "assistant":
                before = len(events)
                if isinstance(observations, RunObservationStore):
                    observations.step = step
                await memory.recall(thread)
                state = await wrapper.inspect(thread, last=config.last_messages)
                fired = [e for e in events[before:] if e.record is not None]
                reflection_tokens = count([state.reflection.text])[0] if state.reflection else 0
                row = {
                    "step": step, "message_index": i, "message_id": turn.id, "history_tokens": history,
                    "window_tokens": state.window_volume, "backlog_tokens": state.backlog_volume,
                    "unreflected_tokens": state.unreflected_volume, "reflection_tokens": reflection_tokens,
                    "memory_tokens": state.memory_volume,
                    "context_tokens": state.memory_volume + state.window_volume,
                    "observed": any(e.stage == "observe" for e in fired),
                    "reflected": any(e.stage == "reflect" for e in fired),
                    "cursor_id": state.cursor,
                    "cursor_index": index_of.get(state.cursor, -1) if state.cursor else -1,
                    "records": len(state.records),
                }
                pending.append(row)
                all_rows.append(row)
                step += 1
                if len(pending) >= flush_every:
                    flush()
            await memory.save_messages([turn.to_message(thread)])
            history += message_tokens[i]
            if progress is not None:
                progress(i + 1, total, f"message {i + 1}/{total}")
    except CompactionError as exc:
        status, error = "failed", str(exc)
    except (KeyboardInterrupt, asyncio.CancelledError):
        flush()
        if store is not None and run_id is not None:
            store.set_status(run_id, "interrupted", "stopped by the user; resume with --resume " + run_id)
        raise
    flush()

    result = await _finish(conversation, config, store, run_id, wrapper, memory, count, events,
                           status, error, started, all_rows, step)
    if status == "failed":
        raise ReplayFailed(result)
    return result


async def _finish(conversation, config, store, run_id, wrapper, memory, count, events, status, error,
                  started, rows, steps) -> ReplayResult:
    thread = conversation.id
    full_history = sum(count([t.content for t in conversation.turns])) if conversation.turns else 0
    state = await wrapper.inspect(thread, last=config.last_messages)
    final_context = state.memory_volume + state.window_volume
    retention = None
    if status == "completed":
        retention = score_retention(conversation, state.context, list(state.window), final_context, count,
                                    store, run_id)
    observer_calls = sum(1 for e in events if e.stage == "observe")
    reflector_calls = sum(1 for e in events if e.stage == "reflect")
    cache_hits = sum(1 for e in events if e.cache_hit)
    costs = [e.cost_usd for e in events if e.cost_usd is not None]
    result = ReplayResult(
        run_id=run_id, status=status, messages=len(conversation.turns), steps=steps,
        observer_calls=observer_calls, reflector_calls=reflector_calls, cache_hits=cache_hits,
        full_history_tokens=full_history, final_context_tokens=final_context,
        compression=(full_history / final_context) if final_context else None,
        retention=retention, cost_usd=sum(costs) if costs else None,
        elapsed_s=time.perf_counter() - started, error=error, step_rows=rows, context=state.context,
    )
    if store is not None and run_id is not None:
        figures: dict[str, Any] = {
            "full_history_tokens": full_history, "final_context_tokens": final_context,
            "compression": result.compression, "elapsed_s": result.elapsed_s,
        }
        calls = store.model_calls(run_id)
        if not calls.empty:
            figures.update(observer_calls=int((calls.stage == "observe").sum()),
                           reflector_calls=int((calls.stage == "reflect").sum()),
                           cache_hits=int(calls.cache_hit.fillna(False).sum()),
                           cost_usd=float(calls.cost_usd.dropna().sum()) if calls.cost_usd.notna().any() else None)
        if retention is not None and retention.scored:
            figures.update(retention=retention.retention, retention_full_history=retention.full_history,
                           retention_window_only=retention.window_only, retention_recent=retention.recent_tokens)
        store.update_run(run_id, **figures)
        store.set_status(run_id, status, error)
    return result


def score_retention(conversation: Conversation, context, window, budget: int, count,
                    store: RunStore | None = None, run_id: str | None = None) -> RetentionSummary:
    """Score every probe against the final context and the three baselines; store the rows."""
    history = [t.to_message(conversation.id) for t in conversation.turns]
    visible = {
        "memory": content_words(render_context(context)),
        "full_history": content_words(render_context(history)),
        "window_only": content_words(render_context(window)),
        "recent_tokens": content_words(render_context(newest_tokens(history, budget, count))),
    }
    window_ids = {m.id for m in window}
    rows = []
    for probe in conversation.probes:
        for method in METHODS:
            rows.append({
                "probe_id": probe.id, "method": method, "question": probe.question, "gold": probe.gold,
                "category": probe.category, "evidence": list(probe.evidence),
                "evidence_in_window": bool(probe.evidence) and all(e in window_ids for e in probe.evidence),
                "score": probe_score(probe.gold, visible[method]), "answer": None,
            })
    if store is not None and run_id is not None:
        import json

        store.replace_probes(run_id, [{**r, "evidence": json.dumps(r["evidence"])} for r in rows], METHODS)
    return summarise(rows)


async def run_sweep(
    conversation: Conversation, grid: list[ReplayConfig], store: RunStore, concurrency: int,
    on_done: Callable[[int, int, ReplayConfig, ReplayResult], None] | None = None,
) -> list[ReplayResult]:
    """Replay every configuration, at most ``concurrency`` at once; a failed run does not stop the
    rest (its result says ``failed``). ``on_done(finished, total, config, result)`` after each."""
    gate = asyncio.Semaphore(concurrency)
    finished = 0

    async def one(config: ReplayConfig) -> ReplayResult:
        nonlocal finished
        async with gate:
            try:
                result = await replay(conversation, config, store)
            except ReplayFailed as exc:
                result = exc.result
        finished += 1
        if on_done is not None:
            on_done(finished, len(grid), config, result)
        return result

    return list(await asyncio.gather(*(one(c) for c in grid)))


__all__ = ["ReplayConfig", "ReplayFailed", "ReplayResult", "replay", "run_sweep", "score_retention"]
