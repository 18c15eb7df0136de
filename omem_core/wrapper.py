"""The observational-memory wrapper: a ``MemoryStore`` that compacts inside cursorless reads.

A cursorless ``recall(thread_id, last=N)`` does, in order:

1. read the window (the newest N messages) and the thread's recent records;
2. page back from the window to the newest observed message: that span is the *backlog*
   (coverage is a prefix of the thread, so the cost grows with window + backlog only);
3. observe: if the backlog's volume exceeds the observation threshold, one observer pass on the
   oldest segment saves one observation;
4. reflect: if a reflector is set and the unreflected observations exceed the reflection
   threshold, one reflector pass merges the current reflection with all of them;
5. render: one ``system`` message (reflection, then unreflected observations, oldest first) ahead
   of the untouched window.

A paging read (``before=``) is the inner store's answer, untouched, with zero model calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import uuid
import inspect as _inspect
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import litellm

from .errors import CompactionError, Stage
from .memory import InMemoryMemoryStore, MemoryStore
from .messages import Message, ObservationRecord
from .observations import ObservationStore, create_in_memory_observation_store
from .planning import (
    MemoryView,
    observer_target_tokens,
    reflector_target_tokens,
    render_memory,
    segment_length,
    view_of,
)
from .prompts import (
    OBSERVER_PROMPT,
    REFLECTOR_PROMPT,
    Prompt,
    as_prompt,
    render_observer_input,
    render_reflector_input,
    render_tighten_input,
)
from .tokens import TokenCounter, heuristic_count

DEFAULT_THRESHOLDS: Mapping[str, int] = {"observation": 1000, "reflection": 2000}

_WORKING_MEMORY = ("get_working_memory", "update_working_memory")


@dataclass(frozen=True, slots=True)
class CompactionEvent:
    """One observer or reflector pass, reported to ``on_event`` whether it succeeded or not.

    ``volume_before``/``volume_after`` are the stage's pending volume around the pass: the
    backlog for ``observe``, the unreflected observations for ``reflect``. ``input_volume`` is the
    volume condensed (segment or reflection + observations), ``output_volume`` the new record's.
    """

    thread_id: str
    stage: Stage
    model: str
    prompt_version: str
    prompt_sha256: str
    source_ids: tuple[str, ...]
    volume_before: int
    volume_after: int
    input_volume: int
    output_volume: int
    tokens_in: int | None
    tokens_out: int | None
    latency_ms: float
    cost_usd: float | None
    cache_hit: bool
    error: str | None
    record: ObservationRecord | None
    attempts: int = 1
    """Model calls the pass made: 1, plus one per tightening request when a reflection came back
    over the reflection threshold."""
    trimmed: bool = False
    """The reflection was still over the threshold after the tightening requests and was cut to fit
    by dropping its least informative sentences (deterministic, no model call)."""


@dataclass(frozen=True, slots=True)
class ThreadState:
    """A side-effect-free snapshot of one thread, as a cursorless read of ``last`` would see it."""

    thread_id: str
    window: tuple[Message, ...]
    cursor: str | None
    backlog: tuple[Message, ...]
    backlog_volume: int
    window_volume: int
    unreflected_volume: int
    reflection: ObservationRecord | None
    unreflected: tuple[ObservationRecord, ...]
    records: tuple[ObservationRecord, ...]
    observe_due: bool
    reflect_due: bool
    next_segment_ids: tuple[str, ...]
    memory_volume: int
    memory_message: Message | None

    @property
    def context(self) -> list[Message]:
        """What the agent would get from a read that ran no pass: memory message + window."""
        head = [self.memory_message] if self.memory_message is not None else []
        return head + list(self.window)


EventCallback = Callable[[CompactionEvent], Awaitable[None] | None]


@dataclass(slots=True)
class _Plan:
    generation: int  # the thread's delete counter when the plan was read
    last: int
    window: list[Message]
    view: MemoryView
    backlog: list[Message]
    backlog_counts: list[int]
    unreflected_counts: list[int]

    @property
    def backlog_volume(self) -> int:
        return sum(self.backlog_counts)

    @property
    def unreflected_volume(self) -> int:
        return sum(self.unreflected_counts)


@dataclass(slots=True)
class _Inflight:
    task: asyncio.Task[None]
    waiters: int = 0


@dataclass(frozen=True, slots=True)
class _Reply:
    text: str
    tokens_in: int | None
    tokens_out: int | None
    cost_usd: float | None
    cache_hit: bool

    def plus(self, other: _Reply) -> _Reply:
        """``other``'s text with both calls' usage summed (unknown stays unknown)."""

        def add(a: float | None, b: float | None) -> Any:
            return None if a is None or b is None else a + b

        return _Reply(other.text, add(self.tokens_in, other.tokens_in), add(self.tokens_out, other.tokens_out),
                      add(self.cost_usd, other.cost_usd), self.cache_hit and other.cache_hit)


TIGHTEN_ATTEMPTS = 2
"""Extra requests made to a reflector whose reflection exceeds the reflection threshold."""


@dataclass(frozen=True, slots=True)
class _StageConfig:
    stage: Stage
    model: str
    prompt: Prompt
    threshold: int


def _validate_thresholds(thresholds: Mapping[str, int] | None) -> dict[str, int]:
    merged = dict(DEFAULT_THRESHOLDS)
    if thresholds is None:
        return merged
    if not isinstance(thresholds, Mapping):
        raise TypeError(f"thresholds must be a mapping, got {type(thresholds).__name__}")
    for key, value in thresholds.items():
        if key not in DEFAULT_THRESHOLDS:
            raise ValueError(
                f"unknown threshold {key!r}; expected 'observation' and/or 'reflection'"
            )
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"threshold {key!r} must be a positive integer, got {value!r}")
        merged[key] = value
    return merged


def _validate_model(role: str, model: object) -> str:
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"{role} must be a litellm model string, got {model!r}")
    try:
        litellm.get_llm_provider(model)
    except Exception as exc:
        raise ValueError(
            f"unknown {role} model {model!r}: litellm cannot route it "
            "(use a provider prefix such as 'openai/…', 'anthropic/…', 'ollama/…', or the "
            "offline 'omem/extractive')"
        ) from exc
    return model


def _record_id(kind: str, thread_id: str, source_ids: Sequence[str]) -> str:
    digest = hashlib.sha256("\x1f".join([kind, thread_id, *source_ids]).encode()).hexdigest()
    return f"{'obs' if kind == 'observation' else 'ref'}-{digest[:24]}"


class ObservationalMemoryStore:
    """A ``MemoryStore`` that compacts older messages inside cursorless reads.

    Build it with :func:`create_observational_memory_store`.
    """

    def __init__(
        self,
        inner: MemoryStore,
        *,
        observer: str,
        reflector: str | None,
        thresholds: Mapping[str, int],
        count_tokens: TokenCounter,
        observations: ObservationStore,
        observer_prompt: Prompt,
        reflector_prompt: Prompt,
        timeout: float | None,
        on_event: EventCallback | None,
        completion_kwargs: Mapping[str, Any],
        clock: Callable[[], datetime],
        on_busy: str = "wait",
        lease_ttl: float = 120.0,
    ) -> None:
        self.inner = inner
        self.on_busy = on_busy
        self.lease_ttl = lease_ttl
        self._holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.observations = observations
        self.observer = _StageConfig("observe", observer, observer_prompt, thresholds["observation"])
        self.reflector = (
            _StageConfig("reflect", reflector, reflector_prompt, thresholds["reflection"])
            if reflector is not None
            else None
        )
        self.thresholds = dict(thresholds)
        self.count_tokens = count_tokens
        self.timeout = timeout
        self.on_event = on_event
        self.completion_kwargs = dict(completion_kwargs)
        self._clock = clock
        self._inflight: dict[str, _Inflight] = {}
        self._generation: dict[str, int] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    # -- the MemoryStore port ---------------------------------------------------------------

    async def save_messages(self, messages: Sequence[Message]) -> None:
        await self.inner.save_messages(messages)

    async def recall(
        self, thread_id: str, *, last: int, before: str | None = None
    ) -> list[Message]:
        if before is not None:
            return await self.inner.recall(thread_id, last=last, before=before)
        plan = await self._plan(thread_id, last)
        if self._observe_due(plan) or self._reflect_due(plan):
            await self._run_shared(thread_id, plan)
            view = view_of(await self._recent_records(thread_id))
        else:
            view = plan.view
        memory = render_memory(view, thread_id)
        return ([memory] if memory is not None else []) + plan.window

    async def delete_thread(self, thread_id: str) -> None:
        async with self._lock(thread_id):
            self._generation[thread_id] = self._generation.get(thread_id, 0) + 1
            await self.inner.delete_thread(thread_id)
            await self.observations.delete_by_thread(thread_id)

    def __getattr__(self, name: str) -> Any:
        # The working-memory capability of ``inner`` passes through unchanged (and is absent
        # when ``inner`` lacks it, so ``hasattr`` checks stay truthful).
        if name in _WORKING_MEMORY and "inner" in self.__dict__:
            return getattr(self.__dict__["inner"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- inspection -------------------------------------------------------------------------

    async def inspect(self, thread_id: str, *, last: int) -> ThreadState:
        """The thread's state as a cursorless read of ``last`` would find it. No model call,
        no write: what is due is reported, not done."""
        plan = await self._plan(thread_id, last)
        records = await self.observations.list(thread_id)
        observe_due = self._observe_due(plan)
        segment: tuple[str, ...] = ()
        if observe_due:
            count = segment_length(plan.backlog_counts, self.observer.threshold)
            segment = tuple(message.id for message in plan.backlog[:count])
        memory = render_memory(plan.view, thread_id)
        window_volume = sum(self.count_tokens([m.content for m in plan.window])) if plan.window else 0
        memory_volume = self.count_tokens([memory.content])[0] if memory is not None else 0
        return ThreadState(
            thread_id=thread_id,
            window=tuple(plan.window),
            cursor=plan.view.cursor,
            backlog=tuple(plan.backlog),
            backlog_volume=plan.backlog_volume,
            window_volume=window_volume,
            unreflected_volume=plan.unreflected_volume,
            reflection=plan.view.reflection,
            unreflected=plan.view.unreflected,
            records=tuple(records),
            observe_due=observe_due,
            reflect_due=self._reflect_due(plan),
            next_segment_ids=segment,
            memory_volume=memory_volume,
            memory_message=memory,
        )

    # -- planning (reads only) --------------------------------------------------------------

    async def _recent_records(self, thread_id: str) -> list[ObservationRecord]:
        recent = getattr(self.observations, "list_recent", None)
        if recent is not None:
            return list(await recent(thread_id))
        return await self.observations.list(thread_id)

    async def _plan(self, thread_id: str, last: int) -> _Plan:
        generation = self._generation.get(thread_id, 0)
        window = await self.inner.recall(thread_id, last=last)
        view = view_of(await self._recent_records(thread_id))
        backlog = await self._backlog(thread_id, window, view.cursor, last)
        return _Plan(
            generation=generation,
            last=last,
            window=window,
            view=view,
            backlog=backlog,
            backlog_counts=self._count([m.content for m in backlog]),
            unreflected_counts=self._count([r.text for r in view.unreflected]),
        )

    async def _backlog(
        self, thread_id: str, window: list[Message], cursor: str | None, last: int
    ) -> list[Message]:
        """Messages older than the window and newer than the cursor, oldest first.

        Pages back from the window with growing pages until the cursor (or the thread's start)
        is reached, so the cost follows the backlog, not the history.
        """
        if not window or (cursor is not None and any(m.id == cursor for m in window)):
            return []
        pages: list[list[Message]] = []
        before = window[0].id
        size = max(64, 2 * last)
        while True:
            page = await self.inner.recall(thread_id, last=size, before=before)
            if cursor is not None:
                for index in range(len(page) - 1, -1, -1):
                    if page[index].id == cursor:
                        pages.append(page[index + 1 :])
                        return [m for chunk in reversed(pages) for m in chunk]
            pages.append(page)
            if len(page) < size:
                return [m for chunk in reversed(pages) for m in chunk]
            before = page[0].id
            size *= 2

    def _count(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        counts = list(self.count_tokens(texts))
        if len(counts) != len(texts):
            raise ValueError(
                f"count_tokens returned {len(counts)} counts for {len(texts)} texts"
            )
        return counts

    def _observe_due(self, plan: _Plan) -> bool:
        return plan.backlog_volume > self.observer.threshold

    def _reflect_due(self, plan: _Plan) -> bool:
        return self.reflector is not None and plan.unreflected_volume > self.reflector.threshold

    # -- passes -----------------------------------------------------------------------------

    def _lock(self, thread_id: str) -> asyncio.Lock:
        lock = self._locks.get(thread_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[thread_id] = lock
        return lock

    async def _run_shared(self, thread_id: str, plan: _Plan) -> None:
        """Run the due passes once per thread at a time; concurrent readers wait for it.

        A cancelled waiter leaves the pass running for the others; when the last waiter is
        cancelled, the pass is cancelled too (cancellation propagates into the model call).
        """
        entry = self._inflight.get(thread_id)
        if entry is None:
            entry = _Inflight(asyncio.ensure_future(self._compact(thread_id, plan)))
            self._inflight[thread_id] = entry

            def _done(task: asyncio.Task[None], entry: _Inflight = entry) -> None:
                if self._inflight.get(thread_id) is entry:
                    del self._inflight[thread_id]
                if not task.cancelled():
                    task.exception()  # retrieved: waiters re-raise it

            entry.task.add_done_callback(_done)
        entry.waiters += 1
        try:
            await asyncio.shield(entry.task)
        except asyncio.CancelledError:
            entry.waiters -= 1
            if entry.waiters == 0 and not entry.task.done():
                # Nobody waits any more: unlist it first so a later read starts afresh.
                if self._inflight.get(thread_id) is entry:
                    del self._inflight[thread_id]
                entry.task.cancel()
            raise
        entry.waiters -= 1

    async def _compact(self, thread_id: str, plan: _Plan) -> None:
        try_lease = getattr(self.observations, "try_lease", None)
        if try_lease is None:
            return await self._passes(thread_id, plan)
        # Processes sharing the store: one holds the thread's lease and runs the pass.
        delay = 0.02
        while not await try_lease(thread_id, self._holder, self.lease_ttl):
            if self.on_busy == "render":
                return  # render what exists; a later read compacts
            await asyncio.sleep(delay)  # "wait": poll until the holder finishes or its lease expires
            delay = min(delay * 2, 0.5)
        try:
            fresh = await self._plan(thread_id, plan.last)  # another process may have done it
            if fresh.generation == plan.generation and (self._observe_due(fresh) or self._reflect_due(fresh)):
                await self._passes(thread_id, fresh)
        finally:
            await self.observations.release_lease(thread_id, self._holder)  # type: ignore[attr-defined]

    async def _passes(self, thread_id: str, plan: _Plan) -> None:
        generation = plan.generation
        unreflected = list(plan.view.unreflected)
        unreflected_counts = list(plan.unreflected_counts)
        if self._observe_due(plan):
            count = segment_length(plan.backlog_counts, self.observer.threshold)
            segment = plan.backlog[:count]
            segment_volume = sum(plan.backlog_counts[:count])
            record, volume = await self._pass(
                self.observer,
                thread_id=thread_id,
                generation=generation,
                kind="observation",
                source_ids=tuple(m.id for m in segment),
                resource_id=segment[-1].resource_id,
                user_content=render_observer_input(
                    segment, target_tokens=observer_target_tokens(segment_volume)
                ),
                volume_before=plan.backlog_volume,
                input_volume=segment_volume,
                volume_after_without_output=plan.backlog_volume - segment_volume,
            )
            if record is None:
                return
            unreflected.append(record)
            unreflected_counts.append(volume)
        volume = sum(unreflected_counts)
        if self.reflector is None or volume <= self.reflector.threshold:
            return
        reflection = plan.view.reflection
        reflection_volume = self._count([reflection.text])[0] if reflection is not None else 0
        covered = (reflection.source_ids if reflection is not None else ()) + tuple(
            r.id for r in unreflected
        )
        await self._pass(
            self.reflector,
            thread_id=thread_id,
            generation=generation,
            kind="reflection",
            source_ids=covered,
            resource_id=unreflected[-1].resource_id,
            user_content=render_reflector_input(
                reflection, unreflected,
                target_tokens=reflector_target_tokens(self.reflector.threshold, volume + reflection_volume),
            ),
            volume_before=volume,
            input_volume=volume + reflection_volume,
            volume_after_without_output=0,
            limit=self.reflector.threshold,
        )

    async def _pass(
        self,
        config: _StageConfig,
        *,
        thread_id: str,
        generation: int,
        kind: str,
        source_ids: tuple[str, ...],
        resource_id: str | None,
        user_content: str,
        volume_before: int,
        input_volume: int,
        volume_after_without_output: int,
        limit: int | None = None,
    ) -> tuple[ObservationRecord | None, int]:
        """One model call and, if it succeeds and the thread still exists, one saved record.

        With a ``limit`` (the reflection threshold), an output over it is sent back up to
        ``TIGHTEN_ATTEMPTS`` times with a stronger target; if it still does not fit, its least
        informative sentences are dropped until it does, so a reflection never exceeds the limit.
        """
        started = time.perf_counter()
        reply: _Reply | None = None
        record: ObservationRecord | None = None
        error: CompactionError | None = None
        output_volume = 0
        attempts, trimmed = 0, False
        try:
            reply = await self._complete(config, thread_id, user_content)
            attempts = 1
            output_volume = self._count([reply.text])[0]
            while limit is not None and output_volume > limit and attempts <= TIGHTEN_ATTEMPTS:
                request = render_tighten_input(
                    reply.text, draft_tokens=output_volume, limit_tokens=limit,
                    target_tokens=max(1, int(limit * 0.8**attempts)),
                )
                attempts += 1  # counted before the call, so a failed request is counted too
                reply = reply.plus(await self._complete(config, thread_id, request))
                output_volume = self._count([reply.text])[0]
            if limit is not None and output_volume > limit:
                reply = _Reply(self._trim(reply.text, limit), reply.tokens_in, reply.tokens_out,
                               reply.cost_usd, reply.cache_hit)
                trimmed = True
                output_volume = self._count([reply.text])[0]
            record = ObservationRecord(
                id=_record_id(kind, thread_id, source_ids),
                thread_id=thread_id,
                resource_id=resource_id,
                created_at=self._clock(),
                kind=kind,  # type: ignore[arg-type]
                source_ids=source_ids,
                text=reply.text,
            )
            async with self._lock(thread_id):
                if self._generation.get(thread_id, 0) != generation:
                    record = None  # the thread was deleted while the model was thinking
                else:
                    await self.observations.save(record)
        except CompactionError as exc:
            error = exc
        latency_ms = (time.perf_counter() - started) * 1000
        if self.on_event is not None:
            result = self.on_event(
                CompactionEvent(
                    thread_id=thread_id,
                    stage=config.stage,
                    model=config.model,
                    prompt_version=config.prompt.version,
                    prompt_sha256=config.prompt.sha256,
                    source_ids=source_ids,
                    volume_before=volume_before,
                    volume_after=volume_before if record is None else volume_after_without_output,
                    input_volume=input_volume,
                    output_volume=output_volume,
                    tokens_in=reply.tokens_in if reply else None,
                    tokens_out=reply.tokens_out if reply else None,
                    latency_ms=latency_ms,
                    cost_usd=reply.cost_usd if reply else None,
                    cache_hit=reply.cache_hit if reply else False,
                    error=str(error) if error is not None else None,
                    record=record,
                    attempts=max(attempts, 1),
                    trimmed=trimmed,
                )
            )
            if _inspect.isawaitable(result):
                await result
        if error is not None:
            raise error
        return record, output_volume

    def _trim(self, text: str, limit: int) -> str:
        """``text`` cut to at most ``limit`` tokens (by this store's counter) with the offline
        reflector's sentence selection; deterministic, no model call. If no whole sentence fits,
        the longest prefix of words that does."""
        from .extractive.algorithm import reflect

        target = limit
        while target >= 1:
            trimmed = reflect("", text, target)
            if trimmed.strip() and self._count([trimmed])[0] <= limit:
                return trimmed
            target = int(target * 0.8)
        words = text.split()
        low, high = 1, len(words)  # the longest prefix that fits (at least one word)
        while low < high:
            middle = (low + high + 1) // 2
            if self._count([" ".join(words[:middle])])[0] <= limit:
                low = middle
            else:
                high = middle - 1
        return " ".join(words[:low])

    async def _complete(self, config: _StageConfig, thread_id: str, user_content: str) -> _Reply:
        def failure(reason: str) -> CompactionError:
            return CompactionError(
                stage=config.stage, model=config.model, thread_id=thread_id, reason=reason
            )

        messages = [
            {"role": "system", "content": config.prompt.text},
            {"role": "user", "content": user_content},
        ]
        try:
            response = await asyncio.wait_for(
                litellm.acompletion(model=config.model, messages=messages, **self.completion_kwargs),
                timeout=self.timeout,
            )
        except asyncio.TimeoutError as exc:
            raise failure(f"timed out after {self.timeout} s") from exc
        except Exception as exc:
            raise failure(f"{type(exc).__name__}: {exc}") from exc
        try:
            text = response.choices[0].message.content
        except (AttributeError, IndexError) as exc:
            raise failure("the response has no message content") from exc
        if not isinstance(text, str) or not text.strip():
            raise failure("the model returned empty output")
        usage = getattr(response, "usage", None)
        hidden = getattr(response, "_hidden_params", None) or {}
        cost = hidden.get("response_cost")
        return _Reply(
            text=text.strip(),
            tokens_in=getattr(usage, "prompt_tokens", None),
            tokens_out=getattr(usage, "completion_tokens", None),
            cost_usd=float(cost) if isinstance(cost, (int, float)) else None,
            cache_hit=bool(hidden.get("cache_hit")),
        )


def create_observational_memory_store(
    inner: MemoryStore | None = None,
    *,
    observer: str,
    reflector: str | None = None,
    thresholds: Mapping[str, int] | None = None,
    count_tokens: TokenCounter | None = None,
    observations: ObservationStore | None = None,
    observer_prompt: Prompt | str | None = None,
    reflector_prompt: Prompt | str | None = None,
    timeout: float | None = None,
    on_event: EventCallback | None = None,
    completion_kwargs: Mapping[str, Any] | None = None,
    clock: Callable[[], datetime] | None = None,
    on_busy: str = "wait",
    lease_ttl: float = 120.0,
) -> ObservationalMemoryStore:
    """Wrap ``inner`` (default ``InMemoryMemoryStore()``) with observational memory.

    Args:
        observer: litellm model string for observation passes, e.g. ``"gpt-4o-mini"`` or the
            offline ``"omem/extractive"``.
        reflector: litellm model string for reflection passes; without it observations just
            accumulate. It is asked for about half of its input, at most the reflection
            threshold; a longer reflection is sent back to it twice to be shortened, then trimmed
            without a model, so a reflection never exceeds the threshold.
        thresholds: ``{"observation": 1000, "reflection": 2000}`` (estimated tokens, the
            defaults); a pass runs when its pending volume *exceeds* the threshold.
        count_tokens: ``(texts) -> counts``, one per text; default ``ceil(len(text) / 4)``.
            See :func:`omem_core.token_counter` for tiktoken.
        observations: where records live (default in-memory).
        observer_prompt / reflector_prompt: a :class:`Prompt` or plain text (system message)
            replacing the versioned defaults.
        timeout: seconds allowed to each compaction model call; exceeded → ``CompactionError``.
        on_event: called with a :class:`CompactionEvent` after every pass (sync or async).
        completion_kwargs: extra keyword arguments for every ``litellm.acompletion`` call
            (``temperature``, ``api_base``, ``caching``, …).
        clock: returns the timezone-aware ``created_at`` of new records (default: now, UTC).
        on_busy: when the observation store is shared between processes (it has the lease
            capability, like ``omem_core.sqlite.SQLiteObservationStore``) and another process
            is compacting the thread: ``"wait"`` for it, then render its result (default), or
            ``"render"`` what exists now without waiting.
        lease_ttl: seconds a process's lease lasts; a crashed holder blocks others at most this
            long. It must exceed ``timeout``; a read can make up to four calls (observe, reflect,
            two tightening requests), so keep it above four times ``timeout``.

    Raises:
        ValueError: invalid thresholds, timeout, or a model string litellm cannot route.
    """
    if timeout is not None and (isinstance(timeout, bool) or not timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if count_tokens is not None and not callable(count_tokens):
        raise TypeError("count_tokens must be a callable (texts) -> counts")
    if completion_kwargs and {"model", "messages"} & set(completion_kwargs):
        raise ValueError("completion_kwargs cannot set 'model' or 'messages'")
    if on_busy not in ("wait", "render"):
        raise ValueError(f"on_busy must be 'wait' or 'render', got {on_busy!r}")
    if isinstance(lease_ttl, bool) or not lease_ttl > 0:
        raise ValueError(f"lease_ttl must be a positive number of seconds, got {lease_ttl!r}")
    if timeout is not None and lease_ttl <= timeout:
        raise ValueError(f"lease_ttl ({lease_ttl} s) must exceed timeout ({timeout} s): a lease that expires "
                         "while its holder still waits for the model lets another process run the same pass")
    return ObservationalMemoryStore(
        inner if inner is not None else InMemoryMemoryStore(),
        observer=_validate_model("observer", observer),
        reflector=_validate_model("reflector", reflector) if reflector is not None else None,
        thresholds=_validate_thresholds(thresholds),
        count_tokens=count_tokens or heuristic_count,
        observations=observations if observations is not None else create_in_memory_observation_store(),
        observer_prompt=as_prompt(observer_prompt, OBSERVER_PROMPT),
        reflector_prompt=as_prompt(reflector_prompt, REFLECTOR_PROMPT),
        timeout=timeout,
        on_event=on_event,
        completion_kwargs=completion_kwargs or {},
        clock=clock or (lambda: datetime.now(timezone.utc)),
        on_busy=on_busy,
        lease_ttl=lease_ttl,
    )


__all__ = [
    "CompactionEvent",
    "ObservationalMemoryStore",
    "ThreadState",
    "create_observational_memory_store",
]
