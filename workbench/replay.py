"""Replay a conversation through ``omem_core.Memory`` and record every step.

Each message is saved in order; before each assistant message (or every message, with
``recall_on="every"``) the replay makes the cursorless recall an agent would make, then records
the thread's state through the library's public ``inspect`` and event callback, never by patching
it. With a :class:`~workbench.runstore.RunStore` everything lands in DuckDB through a
:class:`~workbench.recorder.RunRecorder` (the run's records are its ``ObservationStore``), so an
interrupted run keeps what it recorded and :func:`replay` with ``resume=RUN_ID`` continues from
the last recorded step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omem_core import (
    OBSERVER_PROMPT,
    OFFLINE_MODEL,
    REFLECTOR_PROMPT,
    CompactionError,
    InMemoryMemoryStore,
    Memory,
    Message,
    Prompt,
    create_observational_memory_store,
    token_counter,
)

from omem_core.wrapper import DEFAULT_MAX_INPUT_TOKENS as OBSERVER_INPUT_CAP

from .cache import RPM_KEY, completion_kwargs, enable_litellm_cache, gate_kwargs, prepare_cache
from .datasets import Conversation
from .errors import ConfigurationError, WorkbenchError
from .formatting import cli_command, default_run_label, not_text, printable
from .interrupts import ctrl_c_held_back, stopping
from .retention import SCORING, RetentionSummary, check_scoring, score_retention
from .losses import attribute_losses
from .recorder import MemoryRecorder, RunRecorder
from .runstore import RunDeleted, RunStore, RunStoreError, new_run_id

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
    max_backlog: int | None = None  # opt-in backlog ceiling (tokens): see create_observational_memory_store

    def __post_init__(self) -> None:
        for name in ("observation_threshold", "reflection_threshold", "last_messages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
        if self.token_counter not in TOKEN_COUNTERS:
            raise ConfigurationError(
                f"token_counter must be one of {', '.join(TOKEN_COUNTERS)}, got {self.token_counter!r}")
        if self.max_backlog is not None and (isinstance(self.max_backlog, bool) or not isinstance(self.max_backlog, int)
                                             or self.max_backlog < 1):
            raise ConfigurationError(f"max_backlog must be a positive integer (tokens) or None, got {self.max_backlog!r}")
        if self.recall_on not in ("assistant", "every"):
            raise ConfigurationError(f"recall_on must be 'assistant' or 'every', got {self.recall_on!r}")
        if self.observation_threshold > OBSERVER_INPUT_CAP:
            # (the library takes a larger cap, but a replay would then send the observer segments
            # larger than common models accept: refused here, before a failed run is recorded)
            raise ConfigurationError(
                f"observation_threshold must be at most {OBSERVER_INPUT_CAP:,} tokens (the workbench's limit, sized "
                f"for common models: each segment sent to the observer is one threshold's worth), got "
                f"{self.observation_threshold:,}")
        if self.timeout is not None and (isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float))
                                         or not math.isfinite(self.timeout) or self.timeout <= 0):
            raise ConfigurationError(f"timeout must be a positive number of seconds or None, got {self.timeout!r}")

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
        """The run's label when none is given (:func:`workbench.formatting.default_run_label`)."""
        return default_run_label(self.to_json())  # type: ignore[return-value]  (every setting is there)


@dataclass
class ReplayResult:
    run_id: str | None
    status: str  # completed | failed | interrupted
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
    planned_steps: int | None = None
    step_rows: list[dict[str, Any]] = field(default_factory=list, repr=False)
    context: list[Message] = field(default_factory=list, repr=False)  # what the agent sees at the end

    @property
    def partial(self) -> bool:
        """The figures describe the prefix replayed before a failure or an interruption."""
        return self.status != "completed"

    @classmethod
    def rejected(cls, run_id: str | None, conversation: Conversation, error: str) -> ReplayResult:
        """A run refused before its first step (see :class:`ConfigurationError`)."""
        return cls(run_id=run_id, status="failed", messages=len(conversation.turns), steps=0, observer_calls=0,
                   reflector_calls=0, cache_hits=0, full_history_tokens=0, final_context_tokens=0,
                   compression=None, retention=None, cost_usd=None, elapsed_s=0.0, error=error)

    def summary(self) -> dict[str, Any]:
        """The figures the CLI prints with ``--json`` (for a resumed run: the whole run)."""
        out: dict[str, Any] = {
            "run_id": self.run_id, "status": self.status, "messages": self.messages, "steps": self.steps,
            "planned_steps": self.planned_steps, "partial": self.partial,
            "observer_calls": self.observer_calls, "reflector_calls": self.reflector_calls,
            "cache_hits": self.cache_hits, "full_history_tokens": self.full_history_tokens,
            "final_context_tokens": self.final_context_tokens, "compression": self.compression,
            "cost_usd": self.cost_usd, "elapsed_s": round(self.elapsed_s, 3), "error": self.error,
        }
        if self.retention is not None:
            out["probes_in_window"] = self.retention.in_window  # (not scored: nothing had to survive yet)
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



# (in errors.py, which imports nothing: `experiment show` imported this module, and litellm with it,
# for this test alone, 5-12 s of a 0.2 s command)
from .errors import REFUSED, stopped_by_dataset  # noqa: E402, F401  (re-exported: the pages import it here)


class ReplayFailed(WorkbenchError):
    """A compaction call failed (or the replay was stopped by an error) mid-run; ``result`` holds
    the partial figures and the run stays resumable."""

    def __init__(self, result: ReplayResult, *, resumable: bool = True) -> None:
        self.result = result
        # False when the dataset itself stopped the run (a message dated behind what was already
        # observed): a resume would stop at the same message, so no hint offers one.
        self.resumable = resumable
        super().__init__(result.error)


def _offset(when: Any) -> int | None:
    """The UTC offset a date was written with, in seconds (a date's day depends on it; the store
    keeps instants)."""
    offset = when.utcoffset() if hasattr(when, "utcoffset") else None
    return None if offset is None else int(offset.total_seconds())


def _conversation_rows(conversation: Conversation, counts: list[int]) -> list[dict[str, Any]]:
    return [
        {"idx": i, "message_id": t.id, "role": t.role, "speaker": t.speaker, "content": t.content,
         "created_at": t.created_at, "tokens": n, "utc_offset_s": _offset(t.created_at)}
        for i, (t, n) in enumerate(zip(conversation.turns, counts))
    ]


def dataset_change(conversation: Conversation, recorded: Any) -> str | None:
    """How ``conversation`` (as its dataset reads now) differs from the messages a run recorded
    when it started (``RunStore.messages``), or ``None``. A run resumed on an edited file went on
    with the new messages after the old ones and read "completed" with figures of neither."""
    turns = conversation.turns
    if len(recorded) != len(turns):
        return f"it has {len(turns)} messages, the run recorded {len(recorded)}"
    for turn, row in zip(turns, recorded.itertuples()):
        when = row.created_at.to_pydatetime() if hasattr(row.created_at, "to_pydatetime") else row.created_at
        if (turn.id, turn.role, turn.content) != (row.message_id, row.role, row.content) or turn.created_at != when:
            what = ("id" if turn.id != row.message_id else "role" if turn.role != row.role
                    else "text" if turn.content != row.content else "date")
            return f"its message {row.idx + 1} ({row.message_id!r}) has another {what} than the run recorded"
    return None


def resume_refusal(conversation: Conversation, store: RunStore, run_id: str) -> str | None:
    """Why run ``run_id`` cannot be resumed on ``conversation`` as its dataset reads now (see
    :func:`dataset_change`), or ``None``."""
    recorded = store.messages(run_id)
    if recorded.empty:  # (a run refused before its first step records no message: nothing to compare)
        return None
    changed = dataset_change(conversation, recorded)
    if changed is None:
        return None
    return (f"run {run_id} cannot be resumed: conversation {conversation.id!r} changed in {conversation.source} "
            f"since the run started ({changed}); start a new replay of it")


def planned_reads(conversation: Conversation, config: ReplayConfig) -> int:
    """How many memory reads the whole replay makes (one per step)."""
    if config.recall_on == "every":
        return len(conversation.turns)
    return sum(1 for t in conversation.turns if t.role == "assistant")


def configuration_problem(config: ReplayConfig) -> str | None:
    """Why ``config`` cannot run here (unknown model, missing provider key), or ``None``.

    Asked of litellm without calling any model, so a replay is refused in a second."""
    from .models import unusable_models

    bad = unusable_models([config.observer, config.reflector])
    if not bad:
        return None
    return "; ".join(f"{s.model}: {s.reason}" for s in bad)


def _start(conversation: Conversation, config: ReplayConfig, store: RunStore | None, resume: str | None,
           label: str | None, counts: list[int], flush_every: int,
           recorder: MemoryRecorder | None) -> tuple[ReplayConfig, Any, int]:
    """The run's recorder and the message index to continue from, after checking the config."""
    if resume is not None:
        if store is None:
            raise ConfigurationError("resume needs the run store that holds the run")
        run = store.run(resume)
        if run["conversation_id"] != conversation.id:
            raise ConfigurationError(
                f"run {resume} replayed conversation {run['conversation_id']!r}, not {conversation.id!r}")
        if (refusal := resume_refusal(conversation, store, resume)) is not None:
            raise ConfigurationError(refusal)
        config = ReplayConfig.from_json(run["config"])
    problem = configuration_problem(config)
    if problem is not None:
        run_id = resume
        if store is not None and resume is None:
            run_id = store.create_run(
                dataset=conversation.source, dataset_format=conversation.format, conversation_id=conversation.id,
                config=config.to_json(), messages=_conversation_rows(conversation, counts),
                label=label or config.label(), planned_steps=planned_reads(conversation, config),
                status="failed", error=problem)
        elif store is not None and resume is not None:
            store.set_status(resume, "failed", problem)
        raise ConfigurationError(f"cannot replay: {problem}", run_id)
    if store is None:
        recorder = recorder if recorder is not None else MemoryRecorder()
        recorder.count_tokens = token_counter(config.token_counter)
        return config, recorder, 0
    if resume is None:
        create = dict(dataset=conversation.source, dataset_format=conversation.format, conversation_id=conversation.id,
                      config=config.to_json(), messages=_conversation_rows(conversation, counts),
                      label=label or config.label(), planned_steps=planned_reads(conversation, config))
        return config, RunRecorder(store, new_run_id(), token_counter(config.token_counter), flush_every=flush_every,
                                   create=create), 0
    steps = store.steps(resume)
    step, start_index = 0, 0
    if not steps.empty:
        step = int(steps.step.iloc[-1]) + 1
        start_index = int(steps.message_index.iloc[-1]) + 1
    # Records and calls newer than the last recorded step (a crash between writes) are recomputed.
    store.discard_after(resume, step - 1)
    store.claim_run(resume)
    recorder = RunRecorder(store, resume, token_counter(config.token_counter), flush_every=flush_every, step=step)
    return config, recorder, start_index


def _experiment_rule(store: RunStore, run_id: str) -> int:
    """The scoring rule of the experiment run ``run_id`` belongs to (the current one for a run of
    no experiment, or an id the store does not hold: the resume's own check says so)."""
    from .experiments import experiment_rule
    from .runstore import UnknownRun

    try:
        owner = store.run(run_id).get("experiment_id")
        if isinstance(owner, str) and owner:
            return experiment_rule(store.experiment(owner)["options"])
    except UnknownRun:
        pass
    return SCORING


async def replay(
    conversation: Conversation,
    config: ReplayConfig = ReplayConfig(),
    store: RunStore | None = None,
    *,
    resume: str | None = None,
    progress: Progress | None = None,
    label: str | None = None,
    flush_every: int = 1000,
    cache_dir: str | Path | None = None,
    recorder: MemoryRecorder | None = None,
    completion_extra: dict[str, Any] | None = None,
    scoring: int | None = None,
) -> ReplayResult:
    """Replay ``conversation`` under ``config``; record into ``store`` when given.

    Before anything runs, the models are checked with litellm (a known provider, its keys in the
    environment) and the cache folder (``cache_dir``, default ``$OMEM_CACHE_DIR`` or
    ``~/.cache/omem``) must be writable: otherwise :class:`ConfigurationError` (the run, when
    recorded, is marked ``failed``). A compaction call that fails mid-run raises
    :class:`ReplayFailed` carrying the partial result (run ``failed``, resumable); a cancellation
    or Ctrl-C marks the run ``interrupted`` and propagates. An error of the run store itself (held
    by another process past the wait, unreadable) writes nothing more: the run stays ``running``,
    read as interrupted once its process ends.

    Without ``store``, the run is kept by ``recorder`` (a :class:`MemoryRecorder`, made here when
    not given): an experiment's worker replays that way and hands the run to the one writer.
    ``completion_extra`` adds litellm arguments to every call (``num_retries``, ``api_base``, …).
    ``scoring`` is the retention scoring rule (:data:`workbench.retention.SCORING_RULES`),
    recorded with the run's figures: by default the current one, or for a resumed run of an
    experiment the experiment's (its runs are scored under one rule).
    """
    if scoring is None:
        scoring = _experiment_rule(store, resume) if store is not None and resume is not None else SCORING
    try:
        check_scoring(scoring)
    except ValueError as exc:
        raise ConfigurationError(f"cannot replay: {exc}") from None
    for what, text in (("the dataset's path", conversation.source), ("the conversation id", conversation.id),
                       ("the label", label), ("the observer", config.observer), ("the reflector", config.reflector)):
        if not_text(text):  # (DuckDB refused it when the run was written, after the model calls)
            raise ConfigurationError(f"cannot replay: {what} '{printable(text)}' is not UTF-8 text, which the run "
                                     "store keeps (rename the file, or give UTF-8 text)")
    started = time.perf_counter()
    count = token_counter(config.token_counter)
    turns = conversation.turns
    message_tokens = count([t.content for t in turns]) if turns else []
    with store.session() if store is not None and resume is not None else contextlib.nullcontext():
        config, recorder, start_index = _start(conversation, config, store, resume, label, message_tokens,
                                               flush_every, recorder)
    if resume is not None:  # the run's own configuration (and token counter) continues
        count = token_counter(config.token_counter)
        message_tokens = count([t.content for t in turns]) if turns else []
    try:
        completion: dict[str, Any] = dict(completion_extra or {})
        if config.cache:
            path = prepare_cache(cache_dir)
            if enable_litellm_cache():
                cache_control = completion_kwargs(path, api_base=completion.get("api_base"))
                cache_control["cache"].update(completion.pop("cache", None) or {})
                completion.update(cache_control)
        elif (rpm := (completion.pop("cache", None) or {}).get(RPM_KEY)) and enable_litellm_cache():
            completion.update(gate_kwargs(rpm))  # (the limit without the cache: it was ignored)
        thread = conversation.id
        index_of = {t.id: i for i, t in enumerate(turns)}
        wrapper = create_observational_memory_store(
            InMemoryMemoryStore(), observer=config.observer, reflector=config.reflector,
            thresholds={"observation": config.observation_threshold, "reflection": config.reflection_threshold},
            count_tokens=count, observations=recorder.observations, observer_prompt=config.observer_prompt,
            reflector_prompt=config.reflector_prompt, timeout=config.timeout, on_event=recorder.on_event,
            completion_kwargs=completion or None, max_backlog=config.max_backlog,
        )
        memory = Memory(wrapper, last_messages=config.last_messages)
    except ValueError as exc:  # the library refused the configuration (e.g. a threshold over max_input_tokens)
        _finish_quietly(recorder, "failed", f"cannot replay: {exc}", exc)
        raise ConfigurationError(f"cannot replay: {exc}", recorder.run_id) from exc
    except BaseException as exc:
        _finish_quietly(recorder, "failed", f"{type(exc).__name__}: {exc}", exc)
        raise
    history = sum(message_tokens[:start_index])
    if start_index:
        await memory.save_messages([t.to_message(thread) for t in turns[:start_index]])

    rows: list[dict[str, Any]] = []
    status, error = "completed", None
    refused = False  # the dataset's own message was refused: not resumable
    total = len(turns)
    try:
        for i in range(start_index, total):
            turn = turns[i]
            if config.recall_on == "every" or turn.role == "assistant":
                step = recorder.step
                before = len(recorder.events)
                await memory.recall(thread)
                state = await wrapper.inspect(thread, last=config.last_messages)
                fired = [e for e in recorder.events[before:] if e.record is not None]
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
                    # what the agent saw at this read, so the app shows it instead of rebuilding it
                    "window_ids": json.dumps([m.id for m in state.window]),
                    "memory_ids": json.dumps(([state.reflection.id] if state.reflection else [])
                                             + [r.id for r in state.unreflected]),
                }
                rows.append(row)
                recorder.record_step(row)
            try:
                await memory.save_messages([turn.to_message(thread)])
            except ValueError as exc:  # refused by the library: a message dated behind what was observed
                status, error = "failed", f"message {turn.id} {REFUSED}: {exc}"
                refused = True
                break
            history += message_tokens[i]
            if progress is not None:
                progress(i + 1, total, f"message {i + 1}/{total}")
    except CompactionError as exc:
        status, error = "failed", str(exc)
    except Exception as exc:  # a bug or an environment problem: the run says so, then it propagates
        _finish_quietly(recorder, "failed", f"{type(exc).__name__}: {exc}", exc)
        raise
    except BaseException:  # Ctrl-C, a cancelled task, Streamlit stopping the script
        with stopping():  # (a held run store is waited for briefly: the key is ignored meanwhile)
            _finish_quietly(recorder, "interrupted", "stopped before the end; resume with: "
                                                     + cli_command(f"replay --resume {recorder.run_id}",
                                                                   store.path if store is not None else "runs.duckdb"))
        raise

    try:
        with recorder.session():  # the end of a run: one open of the run store for all its writes
            result = await _finish(conversation, config, recorder, wrapper, count, status, error, started, rows,
                                   history, planned_reads(conversation, config), scoring)
    except BaseException as exc:
        _finish_quietly(recorder, "failed", f"{type(exc).__name__}: {exc}", exc)
        raise
    if status == "failed":
        raise ReplayFailed(result, resumable=not refused)
    return result


def _finish_quietly(recorder: Any, status: str, error: str, cause: BaseException | None = None) -> None:
    """Record a run's end after an error without hiding that error.

    When the error is the run store's own (held by another process past the wait, unreadable),
    only the status is set: at once if the file is free, else at the store's next open of it,
    and only while the run is still this process's (it stays resumable). Writing nothing left the
    run 'running' for as long as its process lived: the app showed it as still running until
    restarted. A deleted run gets nothing. When the last batch itself cannot be written (its
    content rejected), it is dropped and the run still says how it ended."""
    if isinstance(cause, RunStoreError):
        if not isinstance(cause, RunDeleted):
            with contextlib.suppress(Exception):  # (the file still held, unreadable: it stays as it was)
                getattr(recorder, "settle", lambda *_: None)(status, error)
        return
    try:
        with ctrl_c_held_back():
            recorder.finish(status, error, {})
    except RunDeleted:
        pass
    except RunStoreError:  # (held past the wait: the last batch is dropped, the status set later)
        with contextlib.suppress(Exception):
            getattr(recorder, "settle", lambda *_: None)(status, error)
    except Exception:  # noqa: BLE001  (the original error is what the caller must see)
        try:
            getattr(recorder, "finish_unwritten", lambda *_: None)(status, error)
        except Exception:  # noqa: BLE001  (the run store itself is unreachable)
            pass


async def _finish(conversation, config, recorder, wrapper, count, status, error, started, rows, history,
                  planned, scoring) -> ReplayResult:
    """The run's figures, computed once from what was recorded (a resumed run's earlier steps and
    calls included); for a failed run they describe the prefix replayed (``partial``)."""
    thread = conversation.id
    completed = status == "completed"
    state = await wrapper.inspect(thread, last=config.last_messages)
    final_context = state.memory_volume + state.window_volume
    full_history = (sum(count([t.content for t in conversation.turns])) if conversation.turns else 0) \
        if completed else history
    recorder.flush()
    calls = recorder.recorded_calls()
    retention = None
    if completed:
        retention = score_retention(conversation, state.context, list(state.window), final_context, count,
                                    recorder, scoring)
        records = await recorder.observations.list(thread)
        written = {c["record_id"]: c["step"] for c in calls if c.get("record_id")}
        recorder.save_losses(attribute_losses(conversation, records, state, rows, written, scoring))
    costs = [c["cost_usd"] for c in calls if c.get("cost_usd") is not None and c["cost_usd"] == c["cost_usd"]]
    # A call answered at no known price (a model litellm has no price for) makes the total
    # unknown: a sum of the priced ones would read as the whole cost. A failed call has no
    # answer, no usage and no price: it adds nothing (a run whose only call failed cost $0).
    unpriced = any(not c.get("error") and (c.get("cost_usd") is None or c["cost_usd"] != c["cost_usd"])
                   for c in calls)
    result = ReplayResult(
        run_id=recorder.run_id, status=status, messages=len(conversation.turns), steps=recorder.step,
        observer_calls=sum(1 for c in calls if c["stage"] == "observe"),
        reflector_calls=sum(1 for c in calls if c["stage"] == "reflect"),
        cache_hits=sum(1 for c in calls if c.get("cache_hit") is True),
        full_history_tokens=full_history, final_context_tokens=final_context,
        compression=(full_history / final_context) if final_context else None,
        retention=retention, cost_usd=None if unpriced else float(sum(costs)),
        # (a resumed run: its time before this resume too, as its other figures are the whole run's)
        elapsed_s=getattr(recorder, "elapsed_before", 0.0) + time.perf_counter() - started, error=error,
        planned_steps=planned, step_rows=rows,
        context=state.context,
    )
    backlog = [int(r["backlog_tokens"]) for r in recorder.recorded_steps()]

    def total(key: str) -> int:
        return int(sum(c[key] for c in calls if c.get(key) is not None and c[key] == c[key]))

    figures: dict[str, Any] = {
        "full_history_tokens": full_history, "final_context_tokens": final_context,
        "compression": result.compression, "elapsed_s": result.elapsed_s,
        "observer_calls": result.observer_calls, "reflector_calls": result.reflector_calls,
        "cache_hits": result.cache_hits, "cost_usd": result.cost_usd,
        # the backlog outside the window: in neither memory nor window, what the agent sees nowhere
        "blind_spot_tokens": sum(backlog) / len(backlog) if backlog else None,
        "blind_spot_max": max(backlog) if backlog else None,
        "input_tokens": total("input_tokens"), "output_tokens": total("output_tokens"),
        "model_latency_ms": float(sum(c["latency_ms"] for c in calls if c.get("latency_ms") is not None)),
    }
    if retention is not None and retention.scored:
        figures.update(retention=retention.retention, retention_full_history=retention.full_history,
                       retention_window_only=retention.window_only, retention_recent=retention.recent_tokens,
                       scoring=scoring)
    recorder.finish(status, error, figures)
    return result


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
            except ConfigurationError as exc:
                result = ReplayResult.rejected(exc.run_id, conversation, str(exc))
        finished += 1
        if on_done is not None:
            on_done(finished, len(grid), config, result)
        return result

    return list(await asyncio.gather(*(one(c) for c in grid)))


__all__ = ["ConfigurationError", "ReplayConfig", "ReplayFailed", "ReplayResult", "configuration_problem",
           "planned_reads", "replay", "run_sweep", "score_retention"]  # score_retention: from .retention
