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

A pass is a sequence of named steps: :meth:`~ObservationalMemoryStore._observe` /
:meth:`~ObservationalMemoryStore._reflect` build the request, ``_call_and_fit`` calls the model and
keeps its output within bounds, ``_save_unless_deleted`` saves the record only if the thread was
not deleted (here or, with the delete-epoch capability, anywhere) and the pass still holds its
lease, and ``_report`` tells ``on_event``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect as _inspect
import json
import logging
import numbers
import os
import socket
import time
import unicodedata
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import litellm

from ._env import call_secrets, error_text, redact_secrets
from .errors import CompactionError, Stage
from .extractive import trim
from .memory import MAX_LAST, InMemoryMemoryStore, MemoryStore, check_read, check_store, close_stores, positive_seconds, whole_number
from .messages import Message, ObservationRecord, check_batch, check_message, check_thread_id
from .observations import (
    DeleteEpochs,
    Leases,
    ObservationStore,
    RecentRecords,
    create_in_memory_observation_store,
)
from .planning import (
    MEMORY_MESSAGE_PREFIX,
    MemoryView,
    cut_middle,
    observer_target_tokens,
    reflector_target_tokens,
    render_memory,
    segment_budget,
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
    unescape_structure,
)
from .tokens import TokenCounter, heuristic_count

logger = logging.getLogger("omem_core")

DEFAULT_THRESHOLDS: Mapping[str, int] = {"observation": 1000, "reflection": 2000}

DEFAULT_MAX_INPUT_TOKENS = 16_000
"""The observer's input cap: a single message larger than this is sent as its head and tail around
an explicit omission marker. 16k tokens (plus prompt and output) fits every common hosted model
(GPT-4o mini, Claude, Gemini, Llama 3.1, Mistral) with room to spare."""

OBSERVATION_TRIM_RATIO = 4
"""An observation longer than this many times its target length is cut to the target (no model)."""

TIGHTEN_ATTEMPTS = 2
"""Extra requests made to a reflector whose reflection exceeds the reflection threshold."""

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
    """The output was cut to fit without a model call: a reflection still over the threshold
    after the tightening requests, or an observation over 4x its target length."""
    backlog_volume: int | None = None
    """The backlog after this pass: the volume of the messages older than the window that no
    observation covers, which the agent sees nowhere."""
    skipped: str | None = None
    """Why a pass whose model call succeeded saved nothing: the thread was deleted meanwhile, the
    pass lost its lease (noticed by its renewal, or at the save when another pass saved a record
    meanwhile), or a message was saved inside its segment. ``None`` otherwise."""
    calls: tuple[CallTrace, ...] = ()
    """Every model call the pass made, in order: the exact messages sent and the raw reply."""


@dataclass(frozen=True, slots=True)
class CallTrace:
    """One ``litellm.acompletion`` call of a pass: the messages exactly as sent, and the reply's
    text exactly as received (``None`` when the call failed: ``error`` says why)."""

    messages: tuple[dict[str, str], ...]
    response: str | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ThreadState:
    """A side-effect-free snapshot of one thread, as a cursorless read of ``last`` would see it."""

    thread_id: str
    window: tuple[Message, ...]
    cursor: str | None
    backlog: tuple[Message, ...]
    backlog_volume: int
    """Volume of the messages older than the window that no observation covers: what the agent
    sees nowhere. With ``max_backlog`` set, the observer takes larger segments while it is over."""
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
    late: tuple[Message, ...] = ()
    """Messages older than the cursor that no observation covers (saved behind the cursor
    without going through this wrapper, which refuses that): they are never observed."""

    @property
    def context(self) -> list[Message]:
        """What the agent would get from a read that ran no pass: memory message + window."""
        head = [self.memory_message] if self.memory_message is not None else []
        return head + list(self.window)


EventCallback = Callable[[CompactionEvent], Awaitable[None] | None]


CURSOR_LEASE_TTL = 30.0  # seconds: a cursor lease covers one check and one write, never a model call
# Seconds the last cancelled reader of a pass waits for it to give its lease back (see _run_shared):
# a release is one quick write; a model call slow to stop, or a database away, is not waited out.
LEASE_WIND_DOWN_S = 2.0


_RESERVED = "\u0001"  # starts every lease key that is not a thread id itself


def _pass_key(thread_id: str) -> str:
    """The key of a thread's pass lease: its id (as stores have always held it), unless the id
    starts with U+0001, which the keys below start with: then one no cursor key can equal."""
    return f"{_RESERVED}pass{_RESERVED}{thread_id}" if thread_id.startswith(_RESERVED) else thread_id


def _cursor_key(thread_id: str) -> str:
    """The key of a thread's cursor lease: one no thread's pass key can equal (it was the id and
    ``\x01cursor``, which a thread named that way held as its pass lease)."""
    return f"{_RESERVED}cursor{_RESERVED}{thread_id}"


def leased_thread(key: str) -> str:
    """The thread a lease key (:func:`_pass_key`, :func:`_cursor_key`) is for: what a lease store's
    error names."""
    for kind in ("cursor", "pass"):
        if key.startswith(prefix := f"{_RESERVED}{kind}{_RESERVED}"):
            return key[len(prefix):]
    return key


async def _try_lease(leases: Leases, key: str, holder: str, ttl: float) -> bool:
    """``leases.try_lease``, safe under cancellation: an attempt cancelled mid-way is let finish
    and, if it took the lease, gives it back (else the lease would block every process until it
    expired)."""
    attempt = asyncio.ensure_future(leases.try_lease(key, holder, ttl))
    try:
        return await asyncio.shield(attempt)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            if await attempt:
                await leases.release_lease(key, holder)
        raise


OTHER_LOOP = (
    "this observational-memory store is in use by another event loop that is still running (another "
    "thread). Its in-process coordination (one pass per thread at a time, deletes never undone) belongs "
    "to one event loop: create one store per thread or event loop. To share one memory between threads "
    "or processes, give each its own wrapper over the same SQLite or PostgreSQL stores."
)


def _this_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` is the running one. ``False`` for a loop that has stopped (state left by an
    earlier ``asyncio.run``: the caller replaces it); a ``RuntimeError`` (:data:`OTHER_LOOP`) for
    another loop still running, whose locks and tasks cannot be awaited from this one."""
    if loop is asyncio.get_running_loop():
        return True
    if loop.is_running():
        raise RuntimeError(OTHER_LOOP)
    return False


@dataclass(slots=True, weakref_slot=True)
class _Guard:
    """One thread's in-process state: the lock that orders saves and deletes, and how many deletes
    happened. Held weakly by the store, strongly by the plans of passes in flight, so it lives
    exactly as long as someone may compare against it (no per-deleted-thread growth)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    deletes: int = 0
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)


@dataclass(slots=True)
class _Lease:
    lost: bool = False
    taken_at: float = 0.0  # time.monotonic() when the latest successful take or renewal was sent
    lapsed: bool = False  # a renewal came later than the ttl: it may have been another's meanwhile


@dataclass(slots=True)
class _Plan:
    thread_id: str
    last: int
    window: list[Message]
    view: MemoryView
    backlog: list[Message]
    backlog_counts: list[int]
    unreflected_counts: list[int]
    guard: _Guard | None = None  # set for a pass: the thread's guard and its delete count then
    deletes: int = 0
    epoch: int | None = None  # the store's delete epoch, read before the messages
    lease: _Lease | None = None
    newest: str | None = None  # the id of the thread's newest record when planned (then of this pass's)

    @property
    def backlog_volume(self) -> int:
        return sum(self.backlog_counts)

    @property
    def unreflected_volume(self) -> int:
        return sum(self.unreflected_counts)


@dataclass(slots=True)
class _Inflight:
    task: asyncio.Task[list[ObservationRecord]]
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


@dataclass(slots=True)
class _Fit:
    """What ``_call_and_fit`` got so far (filled as it goes, so a failed pass reports it too)."""

    reply: _Reply | None = None
    output_volume: int = 0
    attempts: int = 0
    trimmed: bool = False
    calls: list[CallTrace] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _StageConfig:
    stage: Stage
    model: str
    prompt: Prompt
    threshold: int


@dataclass(frozen=True, slots=True)
class _Request:
    """One pass's request and the figures its event reports."""

    kind: str
    source_ids: tuple[str, ...]
    resource_id: str | None
    content: str
    volume_before: int
    input_volume: int
    volume_after: int  # the stage's pending volume once the record is saved
    backlog_after: int  # the backlog once the record is saved
    limit: int  # an output over this is tightened (reflections) and then trimmed
    trim_to: int
    tighten: bool
    verify: Callable[[], Awaitable[str | None]] | None = None  # why the record may not be saved now, or None


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
        number = whole_number(value)
        if number is None or number < 1:
            raise ValueError(f"threshold {key!r} must be a positive integer, got {value!r}")
        merged[key] = number
    return merged


def _validate_model(role: str, model: object) -> str:
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"{role} must be a litellm model string, got {model!r}")
    try:
        model_name, provider, *_ = litellm.get_llm_provider(model)
    except Exception as exc:
        raise ValueError(
            f"unknown {role} model {model!r}: litellm cannot route it "
            "(use a provider prefix such as 'openai/…', 'anthropic/…', 'ollama/…', or the "
            "offline 'omem/extractive')"
        ) from exc
    from .extractive.provider import MODELS, PROVIDER

    # litellm routes every "omem/…" to the offline provider, which knows only its own models: an
    # unknown one would fail at the first pass, wrapped in litellm's "bug in LiteLLM" banner.
    if model.startswith(f"{PROVIDER}/") and model.split("/", 1)[1] not in MODELS:
        raise ValueError(f"unknown {role} model {model!r}: the offline provider has "
                         + ", ".join(f"{PROVIDER}/{name}" for name in MODELS))
    if not str(model_name).strip():  # ("openai/" was accepted, and failed at the first pass on credentials)
        raise ValueError(f"{role} model {model!r} names a provider ({provider}) but no model: "
                         f"e.g. '{provider}/<model name>'")
    return model


def _positive_int(name: str, value: object, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    number = whole_number(value)
    if number is None or number < 1:
        raise ValueError(f"{name} must be a positive integer (tokens){' or None' if optional else ''}, got {value!r}")
    return number


def _validate_clock(clock: Callable[[], datetime]) -> Callable[[], datetime]:
    if not callable(clock):
        raise TypeError("clock must be a callable returning a timezone-aware datetime")
    now = clock()
    if not isinstance(now, datetime) or now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"clock must return timezone-aware datetimes, got {now!r} "
                         "(use e.g. lambda: datetime.now(timezone.utc))")
    return clock


def _record_id(kind: str, thread_id: str, source_ids: Sequence[str]) -> str:
    """The record's id: a digest of its kind, thread and sources, the same in every process. Ids
    and thread ids may hold any character: parts joined by a unit separator (the ids kept so far)
    unless one holds it, then as JSON behind a record separator, which no join starts with (thread
    ``"a\x1fm0"`` observing ``m1`` had the id of thread ``"a"`` observing ``m0, m1``)."""
    parts = [kind, thread_id, *source_ids]
    text = "\x1f".join(parts) if not any("\x1f" in part for part in parts) else "\x1e" + json.dumps(parts)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"{'obs' if kind == 'observation' else 'ref'}-{digest[:24]}"


def _flatten(pages: list[list[Message]]) -> list[Message]:
    return [message for page in reversed(pages) for message in page]


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
        max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS,
        max_backlog: int | None = None,
    ) -> None:
        self.inner = inner
        self.on_busy = on_busy
        self.lease_ttl = lease_ttl
        self.max_input_tokens = max_input_tokens
        self.max_backlog = max_backlog
        self._holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.observations = observations
        self._recent = observations if isinstance(observations, RecentRecords) else None
        self._leases = observations if isinstance(observations, Leases) else None
        self._epochs = observations if isinstance(observations, DeleteEpochs) else None
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
        self._guards: weakref.WeakValueDictionary[str, _Guard] = weakref.WeakValueDictionary()
        # Leases this process holds but could not give back (the database was away): given back at
        # the next lease taken, so a short outage does not block the thread until they expire.
        self._unreleased: dict[str, str] = {}
        self._closing = False  # close() has begun: no new read, save or delete
        self._orphans_said: set[tuple[str, str]] = set()  # (thread, cursor) not stored, logged once
        self._writing: dict[asyncio.Task[Any], int] = {}  # the tasks saving or deleting through this store
        self._pass_tasks: set[asyncio.Task[list[ObservationRecord]]] = set()  # every pass running (one a delete unlisted too)

    # -- the MemoryStore port ---------------------------------------------------------------

    async def save_messages(self, messages: Sequence[Message]) -> None:
        """Save through to ``inner``, refusing a message dated before the thread's newest observed
        message (it would sort behind the cursor and never be observed): ``ValueError``, and
        nothing of the batch is saved. Re-saving a message that is already stored is allowed.

        No pass can move the cursor between that check and the save: both happen under the
        thread's lock in this process and, when the store has leases, under the thread's short
        *cursor lease*, which a pass holds only while it checks its segment and saves its record.
        So a save never waits for a model call; a pass that planned without the message saves
        nothing (the next read observes it), and one that saved first gets the message refused."""
        self._check_open()
        with self._write():
            await self._save_messages(messages)

    async def _save_messages(self, messages: Sequence[Message]) -> None:
        batch = [check_message(message) for message in check_batch(messages)]
        for message in batch:
            if message.id.startswith(MEMORY_MESSAGE_PREFIX):
                # The memory message a read returns: saved back, it became a message of the
                # thread, and every later read showed two memories, one inside the window.
                raise ValueError(f"message {message.id!r} is the memory message a read returns, not a message "
                                 "of the thread: save only new messages (ids starting with "
                                 f"{MEMORY_MESSAGE_PREFIX!r} are reserved); nothing of the batch was saved")
        threads = sorted({message.thread_id for message in batch})
        # The guards held strongly while in use: the store keeps them weakly.
        guards = [self._guard(thread_id) for thread_id in threads]
        async with contextlib.AsyncExitStack() as held:
            if self._leases is not None:
                for thread_id in threads:  # leases before locks, as a pass takes them
                    await held.enter_async_context(self._cursor_lease(thread_id))
            for guard in guards:
                await held.enter_async_context(guard.lock)
            await self._refuse_late(batch)
            await self.inner.save_messages(batch)

    async def recall(
        self, thread_id: str, *, last: int, before: str | None = None
    ) -> list[Message]:
        """With ``before``: the inner store's page, untouched, with no model call. Without: read
        the window and the backlog; run the due passes (at most one observer and one reflector
        pass, shared with concurrent readers of the thread); return the memory message, if the
        thread has records, ahead of the untouched window. ``last=0`` returns the memory only.

        Raises:
            CompactionError: a due pass failed (it saved nothing; the next read retries).
            KeyError: ``before`` is not a message of the thread.
        """
        self._check_open()
        last = check_read(thread_id, last, before)  # (a plain int: a NumPy one is one for SQL too)
        if before is not None:
            try:
                return await self.inner.recall(thread_id, last=last, before=before)
            except KeyError:
                if isinstance(before, str) and before.startswith(MEMORY_MESSAGE_PREFIX):
                    raise KeyError(
                        f"unknown cursor: {before!r} is the memory message a read puts ahead of its window, not "
                        f"a message of thread {thread_id!r}; page back from the oldest message of the window (the "
                        "first one after the memory message)") from None
                raise
        plan = await self._plan(thread_id, last)
        view = plan.view
        if self._observe_due(plan) or self._reflect_due(plan):
            view = view_of(await self._run_shared(thread_id, last))
        memory = render_memory(view, thread_id, plan.window)
        return ([memory] if memory is not None else []) + plan.window

    async def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's messages and records. A pass in flight for it saves nothing
        afterwards: in this process (a guard checked under the save's lock) and, when the
        observation store has the delete-epoch capability, in any process."""
        self._check_open()
        with self._write():
            await self._delete_thread(thread_id)

    async def _delete_thread(self, thread_id: str) -> None:
        check_thread_id(thread_id, "delete_thread")
        guard = self._guard(thread_id)
        async with guard.lock:
            guard.deletes += 1
            # Records (and the store's epoch) first: a crash half-way never leaves notes of deleted
            # messages; then the messages; then the records again, which also ends any epoch a
            # pass in another process read between the two.
            await self.observations.delete_by_thread(thread_id)
            await self.inner.delete_thread(thread_id)
            await self.observations.delete_by_thread(thread_id)
            # A pass in flight was planned before the delete and will save nothing: a read after
            # it starts its own pass rather than wait for that one.
            self._inflight.pop(thread_id, None)

    async def close(self) -> None:
        """Close the stores this wraps (``inner`` and ``observations``; a store serving both is
        closed once; one without ``close()`` is left alone), after the passes of this event loop
        still in flight have finished, so a model call already paid for still saves its record
        (cancel those reads first not to wait; a model call is bounded by ``timeout``). From the
        start of ``close()`` a new read, save or delete is refused (``RuntimeError``): one that
        started a pass meanwhile would pay for a call whose record could not be saved. A save or a
        delete of this loop already under way is finished first (a delete cut short left the
        thread's messages stored, its records gone), and a read whose pass was waited for gets
        its result (the pass reads the records it leaves, before it ends). A lease
        this store could not give back earlier is given back first, when the database is
        reachable. Idempotent; ``async with`` closes at the end of the block.

        Raises ``RuntimeError`` (nothing closed) while a pass or a save of another event loop that
        is still running (another thread) is under way: close from that loop, or once it returned.
        Raises ``RuntimeError`` when awaited inside one of this store's passes (an async
        ``on_event`` callback): it would wait for that pass, which waits for the callback. From
        a callback, schedule it instead: ``asyncio.get_running_loop().create_task(store.close())``."""
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        if me is not None and me in self._pass_tasks:
            raise RuntimeError("close() was awaited inside a pass of this store (an on_event callback): it would "
                               "wait for that pass to end, and the pass waits for the callback. Schedule it from "
                               "the callback instead (asyncio.get_running_loop().create_task(store.close())), "
                               "or close after the read returns")
        others = [task for task in (*self._pass_tasks, *self._writing)
                  if task.get_loop() is not loop and not task.done() and task.get_loop().is_running()]
        if others:  # (closing its stores under it failed its pass after the call was paid, its lease kept)
            raise RuntimeError(OTHER_LOOP + " Close it from the event loop whose pass or write is under way, "
                                            "or once that has returned.")
        self._closing = True
        while True:
            running = [task for task in self._pass_tasks if task.get_loop() is loop]
            if running:
                await asyncio.wait(running)
            elif any(task is not me and task.get_loop() is loop for task in self._writing):
                await asyncio.sleep(0.005)  # (a few store round trips)
            else:
                break
        if self._leases is not None and self._unreleased:
            await self._release_unreleased()
        await close_stores(self.inner, self.observations)

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """Count a save or delete as in flight, by its task (``close()`` waits for those of its loop,
        not for its own: a store that closes the wrapper from inside a save would wait forever)."""
        task = asyncio.current_task()
        assert task is not None
        self._writing[task] = self._writing.get(task, 0) + 1
        try:
            yield
        finally:
            self._writing[task] -= 1
            if not self._writing[task]:
                del self._writing[task]

    def _check_open(self) -> None:
        if self._closing:
            raise RuntimeError("this observational memory store is closed (or closing): open its stores again "
                               "and wrap them anew")

    async def __aenter__(self) -> ObservationalMemoryStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:
        # The working-memory capability of ``inner`` passes through unchanged (and is absent
        # when ``inner`` lacks it, so ``hasattr`` checks stay truthful).
        if name in _WORKING_MEMORY and "inner" in self.__dict__:
            method = getattr(self.__dict__["inner"], name)

            @functools.wraps(method)
            async def checked(*args: Any, **kwargs: Any) -> Any:  # (refused after close(), as every call is)
                self._check_open()
                result = method(*args, **kwargs)
                return await result if _inspect.isawaitable(result) else result
            return checked
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- inspection -------------------------------------------------------------------------

    async def inspect(self, thread_id: str, *, last: int) -> ThreadState:
        """The thread's state as a cursorless read of ``last`` would find it. No model call,
        no write: what is due is reported, not done. It also lists every record and audits the
        history behind the cursor for messages no observation covers (``late``), so its cost
        grows with the thread; reads do not do this."""
        self._check_open()  # (it went through after close(): a store closed under it raised its own error)
        last = check_read(thread_id, last)  # (a plain int: a NumPy one is one for SQL too)
        plan = await self._plan(thread_id, last, peek=True)
        records = await self.observations.list(thread_id)
        observe_due = self._observe_due(plan)
        segment: tuple[str, ...] = ()
        if observe_due:
            count = segment_length(plan.backlog_counts, self._segment_budget(plan))
            segment = tuple(message.id for message in plan.backlog[:count])
        memory = render_memory(plan.view, thread_id, plan.window)
        window_volume = sum(self._count([m.content for m in plan.window])) if plan.window else 0
        memory_volume = self._count([memory.content])[0] if memory is not None else 0
        late: tuple[Message, ...] = ()
        if plan.view.cursor is not None:
            observed = {i for r in records if r.kind == "observation" for i in r.source_ids}
            try:
                behind, _ = await self._page_back(thread_id, plan.view.cursor, None, max(64, len(observed) + 1))
            except KeyError:  # the cursor message is not stored (see _segment_changed), or deleted meanwhile
                behind = []
            late = tuple(m for m in behind if m.id not in observed)
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
            late=late,
        )

    # -- planning (reads only) --------------------------------------------------------------

    async def _recent_records(self, thread_id: str) -> list[ObservationRecord]:
        if self._recent is not None:
            return list(await self._recent.list_recent(thread_id))
        return await self.observations.list(thread_id)

    def _guard(self, thread_id: str) -> _Guard:
        guard = self._guards.get(thread_id)
        if guard is not None and not _this_loop(guard.loop):
            # A stopped loop's guard (asyncio.run per call). A pass of that loop may be suspended,
            # not ended (run_until_complete returned mid-pass): counted as a delete for it, so if
            # it ever resumes it saves nothing, whatever this loop deletes meanwhile.
            guard.deletes += 1
            guard = None
        if guard is None:
            guard = self._guards[thread_id] = _Guard()
        return guard

    async def _plan(self, thread_id: str, last: int, *, lease: _Lease | None = None,
                    for_pass: bool = False, peek: bool = False) -> _Plan:
        """What a read of ``last`` sees. For a pass, the delete guard and epoch are read first,
        so that a delete after this point keeps the pass from saving. ``peek``: read an inner
        wrapper without running its passes (:meth:`_peek`), for what must call no model."""
        guard = self._guard(thread_id) if for_pass else None
        deletes = guard.deletes if guard is not None else 0
        epoch = await self._epochs.delete_epoch(thread_id) if for_pass and self._epochs is not None else None
        window = await self._read_inner(thread_id, last, peek=peek)
        records = await self._recent_records(thread_id)
        view = view_of(records)
        backlog = await self._backlog(thread_id, window, view.cursor, last)
        return _Plan(
            thread_id=thread_id,
            last=last,
            window=window,
            view=view,
            backlog=backlog,
            backlog_counts=self._count([m.content for m in backlog]),
            unreflected_counts=self._count([r.text for r in view.unreflected]),
            guard=guard,
            deletes=deletes,
            epoch=epoch,
            lease=lease,
            newest=records[-1].id if records else None,
        )

    async def _read_inner(self, thread_id: str, last: int, *, peek: bool = False) -> list[Message]:
        """The inner store's cursorless read of ``last``; with ``peek``, an inner wrapper's without
        its passes: saving and :meth:`inspect` call no model, whatever is stacked below."""
        if peek and isinstance(self.inner, ObservationalMemoryStore):
            return await self.inner._peek(thread_id, last)
        return await self.inner.recall(thread_id, last=last)

    async def _peek(self, thread_id: str, last: int) -> list[Message]:
        """What :meth:`recall` would return if no pass were due: the memory as recorded now, then
        the window. No model call, no write."""
        plan = await self._plan(thread_id, last, peek=True)
        memory = render_memory(plan.view, thread_id, plan.window)
        return ([memory] if memory is not None else []) + plan.window

    async def _backlog(
        self, thread_id: str, window: list[Message], cursor: str | None, last: int
    ) -> list[Message]:
        """Messages older than the window and newer than the cursor, oldest first."""
        if last > 0 and not window:
            return []  # an empty thread
        if cursor is not None and any(m.id == cursor for m in window):
            return []
        size = max(64, min(2 * last, MAX_LAST))
        if last == 0:
            backlog, _ = await self._page_back(thread_id, None, cursor, size)
            return backlog
        for anchor in window:  # the window's oldest stored message
            try:
                backlog, _ = await self._page_back(thread_id, anchor.id, cursor, size)
                return backlog
            except KeyError:
                # Not a stored message: one the inner store puts ahead of its window (an inner
                # wrapper's memory message, a RAG store's context), or the thread was deleted
                # since the window was read (then no message is found, and the backlog is empty).
                continue
        return []

    async def _page_back(
        self, thread_id: str, before: str | None, cursor: str | None, size: int
    ) -> tuple[list[Message], Message | None]:
        """The messages older than ``before`` (``None``: the thread's end) and newer than
        ``cursor`` (``None``: all), oldest first, and the cursor message if it was met.

        Pages back with growing pages, so the cost follows the span, not the history.
        """
        pages: list[list[Message]] = []
        first = True
        while True:
            try:
                page = await self.inner.recall(thread_id, last=size, before=before)
            except KeyError:
                if first:
                    raise  # ``before`` is not a stored message of the thread
                return [], None  # a message just read is gone: the thread was deleted meanwhile
            if first and before is None:
                page = await self._stored_part(thread_id, page)
            first = False
            if cursor is not None:
                for index in range(len(page) - 1, -1, -1):
                    if page[index].id == cursor:
                        pages.append(page[index + 1 :])
                        return _flatten(pages), page[index]
            pages.append(page)
            if len(page) < size:
                return _flatten(pages), None
            before = page[0].id
            size = min(size * 2, MAX_LAST)

    async def _stored_part(self, thread_id: str, page: list[Message]) -> list[Message]:
        """A cursorless read of the inner store without the messages it put ahead of the
        thread's own (an inner wrapper's memory message, a RAG store's context): those are no
        cursor to page back from. One paging read to tell; more only when the inner store adds."""
        for index, message in enumerate(page):
            try:
                await self.inner.recall(thread_id, last=0, before=message.id)
            except KeyError:
                continue
            return page[index:]
        return []

    def _count(self, texts: list[str]) -> list[int]:
        """``count_tokens(texts)``, checked: one non-negative int per text, or ``ValueError``."""
        if not texts:
            return []
        try:
            counts = self.count_tokens(texts)
        except Exception as exc:  # (a bare ZeroDivisionError from recall did not say whose it was)
            raise ValueError(f"count_tokens raised {type(exc).__name__}: {exc}") from exc
        if type(counts) is not list and (not isinstance(counts, Sequence) or isinstance(counts, (str, bytes))):
            raise ValueError(f"count_tokens must return a list of ints, got {type(counts).__name__}")
        if len(counts) != len(texts):
            raise ValueError(
                f"count_tokens returned {len(counts)} counts for {len(texts)} texts"
            )
        if all(type(value) is int and value >= 0 for value in counts):  # the usual case, fast
            return list(counts)
        for index, value in enumerate(counts):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"count_tokens returned {value!r} for text {index}: each count must be a "
                                 "non-negative integer")
        return [int(value) for value in counts]

    def _segment_budget(self, plan: _Plan) -> int:
        return segment_budget(plan.backlog_volume, self.observer.threshold, self.max_backlog, self.max_input_tokens)

    def _observe_due(self, plan: _Plan) -> bool:
        return plan.backlog_volume > self.observer.threshold

    def _reflect_due(self, plan: _Plan) -> bool:
        return self.reflector is not None and plan.unreflected_volume > self.reflector.threshold

    async def _refuse_late(self, batch: list[Message]) -> None:
        """``ValueError`` if a message of ``batch`` is dated before its thread's newest observed
        message and is not already stored. Costs one newest-message read per thread and save;
        more (a page back to the cursor, as a read does) only for an out-of-order message."""
        oldest: dict[str, Message] = {}
        for message in batch:
            if message.thread_id not in oldest or message.created_at < oldest[message.thread_id].created_at:
                oldest[message.thread_id] = message
        for thread_id, first in oldest.items():
            newest = await self._read_inner(thread_id, 1, peek=True)  # (an inner wrapper puts its memory first)
            if not newest or first.created_at >= newest[-1].created_at:
                continue  # in time order: the usual case
            view = view_of(await self._recent_records(thread_id))
            if view.cursor is None:
                continue
            _, cursor = await self._page_back(thread_id, None, view.cursor, 64)
            if cursor is None:
                continue
            for message in batch:
                if message.thread_id != thread_id or message.created_at >= cursor.created_at:
                    continue
                try:
                    await self.inner.recall(thread_id, last=0, before=message.id)
                    continue  # already stored: the inner store checks it is the same message
                except KeyError:
                    pass
                raise ValueError(
                    f"message {message.id!r} of thread {thread_id!r} is dated {message.created_at.isoformat()}, "
                    f"before the newest observed message {cursor.id!r} ({cursor.created_at.isoformat()}): that "
                    "part of the thread is already condensed, so it would never be observed. Save messages in "
                    f"time order, or date it at or after {cursor.created_at.isoformat()}.")

    # -- passes -----------------------------------------------------------------------------

    async def _run_shared(self, thread_id: str, last: int) -> list[ObservationRecord]:
        """Run the due passes once per thread at a time; concurrent readers wait for it. Returns
        the thread's recent records as the pass left them.

        A cancelled waiter leaves the pass running for the others; when the last waiter is
        cancelled, the pass is cancelled too (cancellation propagates into the model call).
        """
        entry = self._inflight.get(thread_id)
        if entry is not None and not _this_loop(entry.task.get_loop()):
            entry = None  # a pass of an event loop that has stopped (asyncio.run per request): not ours to wait for
        if entry is not None and entry.task is asyncio.current_task():  # (it hung for ever, then every read and close)
            raise RuntimeError(
                f"a read of thread {thread_id!r} was awaited inside that thread's own pass (an on_event callback): it "
                "would wait for the pass, and the pass waits for the callback. Read it after the read that ran the "
                "pass returns, or schedule it from the callback (asyncio.get_running_loop().create_task(...))")
        if entry is None:
            self._check_open()  # (a read that began before close(): no new pass whose record it could not save)
            entry = _Inflight(asyncio.ensure_future(self._compact(thread_id, last)))
            self._inflight[thread_id] = entry
            self._pass_tasks.add(entry.task)

            def _done(task: asyncio.Task[list[ObservationRecord]], entry: _Inflight = entry) -> None:
                self._pass_tasks.discard(task)
                if self._inflight.get(thread_id) is entry:
                    del self._inflight[thread_id]
                if not task.cancelled():
                    task.exception()  # retrieved: waiters re-raise it

            entry.task.add_done_callback(_done)
        entry.waiters += 1
        try:
            records = await asyncio.shield(entry.task)
        except asyncio.CancelledError:
            entry.waiters -= 1
            if entry.waiters == 0 and not entry.task.done():
                # Nobody waits any more: unlist it first so a later read starts afresh.
                if self._inflight.get(thread_id) is entry:
                    del self._inflight[thread_id]
                if not entry.task.cancelling():
                    # (once: at asyncio.run's end every task is cancelled, this pass too, and a
                    # second cancellation here cut its lease release short, left running unawaited)
                    entry.task.cancel()
                if self._leases is not None:
                    # ... and, with a lease store, waited for as it winds down (it gives its lease
                    # back): returning at once let asyncio.run's shutdown after a Ctrl-C cancel that
                    # release, and the lease kept every other process's read of the thread waiting
                    # for its whole ttl. Briefly: a cancelled read (wait_for's timeout) stays prompt.
                    await asyncio.wait({entry.task}, timeout=LEASE_WIND_DOWN_S)
            raise
        entry.waiters -= 1
        return records

    async def _compact(self, thread_id: str, last: int) -> list[ObservationRecord]:
        """Plan afresh (the guard and epoch first) and run what is still due, holding the
        thread's lease when the store has leases; then the thread's recent records, read here
        so that ``close()``, which waits for this pass, never closes the stores under the read
        that will render them (it did: "closed" after PostgreSQL's pool timeout)."""
        # (``peek``: the read that found this pass due already ran an inner wrapper's passes; a
        # second cursorless read of it here ran them again, two inner passes for one read)
        if self._leases is None:
            plan = await self._plan(thread_id, last, for_pass=True, peek=True)
            if self._observe_due(plan) or self._reflect_due(plan):
                await self._passes(plan)
            return await self._recent_records(thread_id)
        async with self._lease(thread_id) as lease:
            if lease is not None:  # (None: another process is compacting; render what exists, on_busy="render")
                plan = await self._plan(thread_id, last, lease=lease, for_pass=True, peek=True)
                if self._observe_due(plan) or self._reflect_due(plan):  # another process may have done it
                    await self._passes(plan)
        return await self._recent_records(thread_id)

    @contextlib.asynccontextmanager
    async def _lease(self, thread_id: str) -> AsyncIterator[_Lease | None]:
        """Hold the thread's lease (renewed every third of ``lease_ttl`` while the pass runs), or
        yield ``None`` when another holder has it and ``on_busy`` is ``"render"``."""
        leases = self._leases
        assert leases is not None
        # A holder per pass: a pass started after a delete, while the stale one still runs, must
        # not renew (and then lose, when the stale one releases it) that pass's lease.
        key, holder, delay = _pass_key(thread_id), f"{self._holder}:{uuid.uuid4().hex[:8]}", 0.02
        await self._release_unreleased()
        while True:
            sent = time.monotonic()  # (the lease runs from no earlier than this)
            if await _try_lease(leases, key, holder, self.lease_ttl):
                break
            if self.on_busy == "render":
                yield None
                return
            await asyncio.sleep(delay)  # "wait": poll until the holder finishes or its lease expires
            delay = min(delay * 2, 0.5)
        lease = _Lease(taken_at=sent)
        renewer = asyncio.ensure_future(self._renew(leases, key, holder, lease))
        try:
            yield lease
        finally:
            renewer.cancel()
            await asyncio.shield(self._release(key, holder))

    @contextlib.asynccontextmanager
    async def _cursor_lease(self, thread_id: str) -> AsyncIterator[None]:
        """Hold the thread's cursor lease, in any process: a pass while it checks its segment and
        saves its record, a save while it checks the cursor and saves its messages. Short (no
        renewal), apart from the pass's own lease, and a holder of its own each time."""
        leases = self._leases
        assert leases is not None
        key, holder, delay = _cursor_key(thread_id), f"{self._holder}:{uuid.uuid4().hex[:8]}", 0.02
        await self._release_unreleased()
        while not await _try_lease(leases, key, holder, CURSOR_LEASE_TTL):
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        try:
            yield
        finally:
            await asyncio.shield(self._release(key, holder))

    async def _release(self, key: str, holder: str) -> None:
        """Give a lease back. When that fails (the database is away), the failure is logged, never
        raised over the outcome of the work done under the lease, and the release is retried
        before this store takes its next lease (:meth:`_release_unreleased`)."""
        assert self._leases is not None
        try:
            await self._leases.release_lease(key, holder)
        except Exception as exc:
            logger.warning("omem: giving back the lease %r failed (%s: %s); retried before this store's next lease",
                           key, type(exc).__name__, exc)
            self._unreleased[key] = holder

    async def _release_unreleased(self) -> None:
        """Retry the releases that failed (in order; stop at the first that fails again)."""
        assert self._leases is not None
        for key, holder in list(self._unreleased.items()):
            try:
                await self._leases.release_lease(key, holder)
            except Exception:
                return  # still away: this read's own lease attempt reports it
            if self._unreleased.get(key) == holder:
                del self._unreleased[key]

    async def _renew(self, leases: Leases, key: str, holder: str, lease: _Lease) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            sent = time.monotonic()
            if sent - lease.taken_at >= self.lease_ttl:
                lease.lapsed = True  # (renewed or not, another holder may have had it in between)
            try:
                renewed = await leases.try_lease(key, holder, self.lease_ttl)
            except Exception:  # a failed renewal is a lost lease, never a crashed read
                logger.exception("omem: renewing the pass lease %r failed", key)
                renewed = False
            if not renewed:
                lease.lost = True
                return
            lease.taken_at = sent

    async def _passes(self, plan: _Plan) -> None:
        """At most one observer pass, then at most one reflector pass (on what it left)."""
        observed: tuple[ObservationRecord, int] | None = None
        if self._observe_due(plan):
            observed = await self._observe(plan)
            if observed is None:
                return  # saved nothing (deleted, lease lost, segment changed): the next read redoes it
        await self._reflect(plan, observed)

    async def _observe(self, plan: _Plan) -> tuple[ObservationRecord, int] | None:
        """Condense the oldest segment of the backlog into one observation."""
        count = segment_length(plan.backlog_counts, self._segment_budget(plan))
        segment = plan.backlog[:count]
        volume = sum(plan.backlog_counts[:count])
        sent = [message if tokens <= self.max_input_tokens else
                replace(message, content=cut_middle(message.content, self.max_input_tokens, self._count_one))
                for message, tokens in zip(segment, plan.backlog_counts[:count])]
        sent_volume = sum(self._count([m.content for m in sent]))
        target = observer_target_tokens(sent_volume)

        async def unchanged() -> str | None:
            return await self._segment_changed(plan, segment)

        return await self._stage(self.observer, plan, _Request(
            kind="observation",
            source_ids=tuple(m.id for m in segment),
            resource_id=segment[-1].resource_id,
            content=render_observer_input(sent, target_tokens=target),
            volume_before=plan.backlog_volume,
            input_volume=volume,
            volume_after=plan.backlog_volume - volume,
            backlog_after=plan.backlog_volume - volume,
            limit=OBSERVATION_TRIM_RATIO * target,
            trim_to=target,
            tighten=False,
            verify=unchanged,
        ))

    async def _reflect(self, plan: _Plan, observed: tuple[ObservationRecord, int] | None) -> None:
        """Merge the newest reflection with every unreflected observation, if they are over the
        reflection threshold."""
        unreflected = list(plan.view.unreflected)
        counts = list(plan.unreflected_counts)
        if observed is not None:
            unreflected.append(observed[0])
            counts.append(observed[1])
        volume = sum(counts)
        if self.reflector is None or volume <= self.reflector.threshold:
            return
        reflection = plan.view.reflection
        reflection_volume = self._count([reflection.text])[0] if reflection is not None else 0
        backlog = plan.backlog_volume - (sum(plan.backlog_counts[: len(observed[0].source_ids)]) if observed else 0)
        await self._stage(self.reflector, plan, _Request(
            kind="reflection",
            source_ids=(reflection.source_ids if reflection is not None else ()) + tuple(r.id for r in unreflected),
            resource_id=unreflected[-1].resource_id,
            content=render_reflector_input(
                reflection, unreflected,
                target_tokens=reflector_target_tokens(self.reflector.threshold, volume + reflection_volume)),
            volume_before=volume,
            input_volume=volume + reflection_volume,
            volume_after=0,
            backlog_after=backlog,
            limit=self.reflector.threshold,
            trim_to=self.reflector.threshold,
            tighten=True,
        ))

    async def _stage(self, config: _StageConfig, plan: _Plan, request: _Request
                     ) -> tuple[ObservationRecord, int] | None:
        """Call and fit, save unless deleted, report; the saved record and its volume, or ``None``."""
        started = time.perf_counter()
        fit = _Fit()
        record: ObservationRecord | None = None
        error: CompactionError | None = None
        other: Exception | None = None
        skipped: str | None = None
        try:
            await self._call_and_fit(config, plan.thread_id, request, fit)
            assert fit.reply is not None
            record = ObservationRecord(
                id=_record_id(request.kind, plan.thread_id, request.source_ids),
                thread_id=plan.thread_id,
                resource_id=request.resource_id,
                created_at=self._clock(),
                kind=request.kind,  # type: ignore[arg-type]
                source_ids=request.source_ids,
                text=fit.reply.text,
            )
            skipped = await self._save_unless_deleted(plan, record, request.verify)
            if skipped is not None:
                record = None
        except CompactionError as exc:
            error = exc
        except Exception as exc:  # the store's own (a database gone mid-pass), a token counter's: raised as they
            other = exc  # are, after the report (a call made and paid for went unreported: no cost, no trace)
            record = None
        reply = fit.reply
        await self._report(CompactionEvent(
            thread_id=plan.thread_id,
            stage=config.stage,
            model=config.model,
            prompt_version=config.prompt.version,
            prompt_sha256=config.prompt.sha256,
            source_ids=request.source_ids,
            volume_before=request.volume_before,
            volume_after=request.volume_before if record is None else request.volume_after,
            input_volume=request.input_volume,
            output_volume=fit.output_volume,
            tokens_in=reply.tokens_in if reply else None,
            tokens_out=reply.tokens_out if reply else None,
            latency_ms=(time.perf_counter() - started) * 1000,
            cost_usd=reply.cost_usd if reply else None,
            cache_hit=reply.cache_hit if reply else False,
            error=(str(error) if error is not None
                   else redact_secrets(f"{type(other).__name__}: {other}", call_secrets(self.completion_kwargs))
                   if other is not None else None),
            record=record,
            attempts=max(fit.attempts, 1),
            trimmed=fit.trimmed,
            backlog_volume=plan.backlog_volume if record is None and config.stage == "observe"
            else request.backlog_after,
            skipped=skipped,
            calls=tuple(fit.calls),
        ))
        if error is not None:
            raise error
        if other is not None:
            raise other
        return (record, fit.output_volume) if record is not None else None

    async def _call_and_fit(self, config: _StageConfig, thread_id: str, request: _Request, fit: _Fit) -> None:
        """One model call, and the output kept within ``request.limit``: a reflection over it is
        sent back up to ``TIGHTEN_ATTEMPTS`` times with a stronger target; whatever is still
        over is trimmed deterministically (no model) to ``request.trim_to``."""
        fit.attempts = 1
        fit.reply = await self._complete(config, thread_id, request.content, fit.calls)
        fit.output_volume = self._output_volume(config, thread_id, fit.reply.text)
        limit = request.limit
        while request.tighten and fit.output_volume > limit and fit.attempts <= TIGHTEN_ATTEMPTS:
            tighten = render_tighten_input(
                fit.reply.text, draft_tokens=fit.output_volume, limit_tokens=limit,
                target_tokens=max(1, int(limit * 0.8**fit.attempts)),
            )
            fit.attempts += 1  # counted before the call, so a failed request is counted too
            fit.reply = fit.reply.plus(await self._complete(config, thread_id, tighten, fit.calls))
            fit.output_volume = self._output_volume(config, thread_id, fit.reply.text)
        if fit.output_volume > limit:
            text = trim(fit.reply.text, request.trim_to, lambda texts: [self._output_volume(config, thread_id, texts[0])])
            fit.reply = replace(fit.reply, text=text)
            fit.trimmed = True
            fit.output_volume = self._output_volume(config, thread_id, text)

    def _output_volume(self, config: _StageConfig, thread_id: str, text: str) -> int:
        try:
            return self._count([text])[0]
        except Exception as exc:
            raise CompactionError(stage=config.stage, model=config.model, thread_id=thread_id,
                                  reason=f"count_tokens failed on the model's output: {type(exc).__name__}: {exc}"
                                  ) from exc

    def _count_one(self, text: str) -> int:
        return self._count([text])[0]

    async def _segment_changed(self, plan: _Plan, segment: list[Message]) -> str | None:
        """Why the record of ``segment`` may not be saved: its messages are gone (the thread was
        deleted, perhaps by another process) or a message was saved inside it while the model
        ran; ``None`` when the messages from the cursor to the segment's end are still exactly it."""
        try:
            before = await self.inner.recall(plan.thread_id, last=len(segment), before=segment[-1].id)
        except KeyError:
            return "the thread was deleted during the pass"  # (its segment's newest message is gone)
        expected = ([plan.view.cursor] if plan.view.cursor is not None else []) + [m.id for m in segment[:-1]]
        ids = [m.id for m in before]
        same = ids == expected[-len(segment):] if len(expected) >= len(segment) else ids == expected
        if not same and plan.view.cursor is not None and ids == [m.id for m in segment[:-1]] \
                and not await self._stored(plan.thread_id, plan.view.cursor):
            # The newest observed message is not in the inner store (records kept across a restart
            # whose messages were not, as with records in a file over the in-memory message store):
            # every stored message is unobserved, and the segment rightly starts the thread. (This
            # refused every pass for ever, each one's model call paid for.)
            self._warn_orphan_cursor(plan.thread_id, plan.view.cursor)
            return None
        return None if same else "a message was saved inside the segment during the pass; the next read observes it"

    async def _stored(self, thread_id: str, message_id: str) -> bool:
        """Whether ``message_id`` is a stored message of the thread (a read of none before it)."""
        try:
            await self.inner.recall(thread_id, last=0, before=message_id)
        except KeyError:
            return False
        return True

    def _warn_orphan_cursor(self, thread_id: str, cursor: str) -> None:
        if (thread_id, cursor) in self._orphans_said:
            return
        self._orphans_said.add((thread_id, cursor))
        logger.warning("omem: thread %r's newest observed message %r is not in the message store (its records were "
                       "kept and its messages were not?): the messages stored now are observed as new, after the "
                       "notes already recorded", thread_id, cursor)

    async def _save_unless_deleted(
        self, plan: _Plan, record: ObservationRecord, verify: Callable[[], Awaitable[str | None]] | None
    ) -> str | None:
        """Save ``record`` unless the pass is stale; ``None`` when saved, else why not."""
        guard = plan.guard
        assert guard is not None
        async with contextlib.AsyncExitStack() as held:
            if self._leases is not None:  # a save, here or elsewhere, takes it too
                await held.enter_async_context(self._cursor_lease(plan.thread_id))
            await held.enter_async_context(guard.lock)  # a delete in this process takes the same lock
            if guard.deletes != plan.deletes:
                return "the thread was deleted during the pass"
            if plan.lease is not None and plan.lease.lost:
                return "the pass lost its lease (another process may run it)"
            if plan.lease is not None and (plan.lease.lapsed
                                           or time.monotonic() - plan.lease.taken_at > self.lease_ttl / 2):
                # A lease that may have lapsed while this process was stalled (the renewer, every
                # third of the ttl, had no chance to notice): another process may have taken it,
                # run the pass on another segment and saved. Saving this one after it would move
                # the cursor back. Checked here, under the cursor lease every save takes, so no
                # record can land between check and save; only then (a lease renewed within half
                # its ttl is still this pass's: no extra read on the usual save).
                if (stale := await self._saved_since(plan)) is not None:
                    return stale or "the pass lost its lease, and another pass saved a record meanwhile"
            if verify is not None and (changed := await verify()) is not None:
                return changed
            if self._leases is None:
                # Another wrapper over the same lease-less store (in memory, DuckDB: one built per
                # request over global stores) may have run a pass of this thread meanwhile, on a
                # segment of its own (other thresholds): saved after it, this record overlapped
                # it. Checked last, next to the save (those stores answer without suspending).
                # Always: checked only while several wrappers were alive, a pass whose rival's
                # wrapper was collected meanwhile (its request over) saved an overlapping note.
                if (stale := await self._saved_since(plan)) is not None:
                    return stale or "another pass saved a record meanwhile (another wrapper over the same stores)"
            if plan.epoch is not None:
                assert self._epochs is not None
                if not await self._epochs.save_unless_deleted(record, plan.epoch):
                    return "the thread was deleted during the pass"
            else:
                await self.observations.save(record)
        plan.newest = record.id  # (what a reflection after it in this pass expects to find)
        return None

    async def _saved_since(self, plan: _Plan) -> str | None:
        """``None`` when the thread's newest record is still the one this pass began from; else
        why not: "" (another pass saved a record), or that the thread was deleted."""
        records = await self._recent_records(plan.thread_id)
        if not records and plan.newest is not None:
            return "the thread was deleted during the pass"
        return None if (records[-1].id if records else None) == plan.newest else ""

    async def _report(self, event: CompactionEvent) -> None:
        """Tell ``on_event``; an exception there is logged and never changes the read's outcome."""
        if self.on_event is None:
            return
        try:
            result = self.on_event(event)
            if _inspect.isawaitable(result):
                await result
        except Exception:
            logger.exception("omem: the on_event callback raised after the %s pass of thread %r; ignored",
                             event.stage, event.thread_id)

    async def _complete(self, config: _StageConfig, thread_id: str, user_content: str,
                        trace: list[CallTrace]) -> _Reply:
        """One model call through litellm; appends what was sent and received to ``trace``."""
        messages = [
            {"role": "system", "content": config.prompt.text},
            {"role": "user", "content": user_content},
        ]

        def failure(reason: str, response: str | None = None) -> CompactionError:
            # A provider's error may quote the key it was sent (the environment's, or one in
            # completion_kwargs): never carried any further.
            secrets = call_secrets(self.completion_kwargs)
            reason, response = redact_secrets(reason, secrets), response and redact_secrets(response, secrets)
            trace.append(CallTrace(tuple(messages), response, reason))
            return CompactionError(
                stage=config.stage, model=config.model, thread_id=thread_id, reason=reason
            )

        try:
            # (a task of its own, cancelled at the timeout: since Python 3.12 wait_for runs a bare
            # coroutine in the calling task and cancels nothing that a cache layer could see)
            response = await asyncio.wait_for(
                asyncio.ensure_future(litellm.acompletion(model=config.model, messages=messages,
                                                          **self.completion_kwargs)),
                timeout=self.timeout,
            )
        except asyncio.TimeoutError as exc:
            raise failure(f"timed out after {self.timeout} s") from exc
        except Exception as exc:
            error = failure(error_text(exc))
            # A cause that quotes a secret stays out of the chain (a logged traceback prints it).
            raise error from (exc if redact_secrets(str(exc), call_secrets(self.completion_kwargs)) == str(exc)
                              else None)
        try:
            text = response.choices[0].message.content
        except (AttributeError, IndexError) as exc:
            raise failure("the response has no message content") from exc
        if text is not None and not isinstance(text, str):
            raise failure(f"the response's message content is not text (a {type(text).__name__})")
        if text is None or _blank(text):
            raise failure("the model returned empty output", text)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # (a provider that cut an emoji's UTF-16 pair in two)
            raise failure(f"the model's output is not valid Unicode (a lone surrogate at position {exc.start}); "
                          "nothing was saved", text.encode("utf-8", "backslashreplace").decode()) from None
        trace.append(CallTrace(tuple(messages), text))
        usage = getattr(response, "usage", None)
        hidden = getattr(response, "_hidden_params", None) or {}
        cost = hidden.get("response_cost")
        return _Reply(
            # The input wrote a "<" that would open or close a layout tag as "&lt;"; a model that
            # copies text faithfully copies that too: undone here, once, so notes keep what was
            # said (and are not escaped again, one "amp;" more, by every reflection).
            text=unescape_structure(text.strip()),
            tokens_in=getattr(usage, "prompt_tokens", None),
            tokens_out=getattr(usage, "completion_tokens", None),
            cost_usd=float(cost) if isinstance(cost, (int, float)) else None,
            cache_hit=bool(hidden.get("cache_hit")),
        )


def _blank(text: str) -> bool:
    """Whether ``text`` shows nothing: whitespace, invisible format characters (zero-width
    spaces and joiners, a byte-order mark) and control characters (NUL, escape) only."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Cf", "Cc") for ch in text)


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
    max_input_tokens: int | None = None,
    max_backlog: int | None = None,
) -> ObservationalMemoryStore:
    """Wrap ``inner`` (default ``InMemoryMemoryStore()``) with observational memory.

    Args:
        observer: litellm model string for observation passes, e.g. ``"gpt-4o-mini"`` or the
            offline ``"omem/extractive"``.
        reflector: litellm model string for reflection passes; without it observations just
            accumulate. It is asked for about 55% of its input, at most the reflection
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
        on_event: called with a :class:`CompactionEvent` after every pass (sync or async),
            inside the read that ran it: an exception it raises is logged and ignored, and it
            must not await ``close()`` of this store (awaited directly it is refused; through
            ``gather``/``wait_for`` it would wait for its own pass): schedule it as a task.
        completion_kwargs: extra keyword arguments for every ``litellm.acompletion`` call
            (``temperature``, ``api_base``, ``caching``, …), the observer's and the reflector's
            alike, the offline model's too (litellm's ``mock_response`` replaces its output).
        clock: returns the timezone-aware ``created_at`` of new records (default: now, UTC).
        on_busy: when the observation store is shared between processes (it has the lease
            capability, like ``omem_core.sqlite.SQLiteObservationStore``) and another process
            is compacting the thread: ``"wait"`` for it, then render its result (default), or
            ``"render"`` what exists now without waiting.
        lease_ttl: seconds a process's lease lasts (finite); the holder renews it every third of
            that while its pass runs, however long the model takes, so a crashed holder blocks
            others at most this long.
        max_input_tokens: the observer's input cap: a single message larger than this is sent
            as its head and tail around an explicit ``[... N tokens of this message omitted ...]``
            marker. Default ``None``: 16,000 tokens (which fits common models), or the observation
            threshold when that is larger. A value given must be at least the observation threshold.
        max_backlog: opt-in backlog ceiling (tokens). When the backlog (messages older than the
            window that no observation covers) exceeds it, the one observer pass of a read takes
            a larger oldest segment — the threshold plus the excess, at most ``max_input_tokens``
            — so the backlog stops growing when reads add more than one segment. Default ``None``:
            a segment is at most the observation threshold (or one larger message).

    Raises:
        ValueError: invalid thresholds, timeout, lease, input cap or backlog ceiling, a clock that
            returns naive datetimes, a model string litellm cannot route, an ``on_busy`` other
            than ``"wait"``/``"render"``, or ``completion_kwargs`` that set ``model``/``messages``.
        TypeError: ``inner`` or ``observations`` is not a store (a path, a class), or
            ``count_tokens`` or ``on_event`` is not callable, or ``count_tokens`` is async.
    """
    if inner is not None:
        check_store(inner, MemoryStore, "inner")
    if observations is not None:
        check_store(observations, ObservationStore, "observations")
    if timeout is not None:
        positive_seconds("timeout", timeout)
    if count_tokens is not None and not callable(count_tokens):
        raise TypeError("count_tokens must be a callable (texts) -> counts")
    if count_tokens is not None and _inspect.iscoroutinefunction(count_tokens):
        raise TypeError("count_tokens must be a plain (synchronous) function (texts) -> counts, not an async one: "
                        "token counting runs inside the read's planning, which does not await it")
    if on_event is not None and not callable(on_event):
        raise TypeError(f"on_event must be a callable (event) -> None (sync or async), got {type(on_event).__name__}")
    if completion_kwargs is not None and not (isinstance(completion_kwargs, Mapping)
                                              and all(isinstance(key, str) for key in completion_kwargs)):
        raise TypeError("completion_kwargs must be a mapping of litellm argument names to values, got "
                        f"{type(completion_kwargs).__name__} {str(completion_kwargs)[:60]!r}")
    if completion_kwargs and {"model", "messages"} & set(completion_kwargs):
        raise ValueError("completion_kwargs cannot set 'model' or 'messages'")
    if on_busy not in ("wait", "render"):
        raise ValueError(f"on_busy must be 'wait' or 'render', got {on_busy!r}")
    lease_ttl = positive_seconds("lease_ttl", lease_ttl)
    cap = _positive_int("max_input_tokens", max_input_tokens, optional=True)  # (plain ints: a NumPy one too)
    max_backlog = _positive_int("max_backlog", max_backlog, optional=True)
    merged = _validate_thresholds(thresholds)
    # (by default the cap grows with the threshold: a threshold of 30,000 tokens was refused until
    # max_input_tokens was raised too, though nothing asked for a cap)
    max_input_tokens = max(DEFAULT_MAX_INPUT_TOKENS, merged["observation"]) if cap is None else cap
    if merged["observation"] > max_input_tokens:
        raise ValueError(f"the observation threshold ({merged['observation']}) exceeds max_input_tokens "
                         f"({max_input_tokens}): a segment would not fit the observer's input; raise max_input_tokens")
    return ObservationalMemoryStore(
        inner if inner is not None else InMemoryMemoryStore(),
        observer=_validate_model("observer", observer),
        reflector=_validate_model("reflector", reflector) if reflector is not None else None,
        thresholds=merged,
        count_tokens=count_tokens or heuristic_count,
        observations=observations if observations is not None else create_in_memory_observation_store(),
        observer_prompt=as_prompt(observer_prompt, OBSERVER_PROMPT),
        reflector_prompt=as_prompt(reflector_prompt, REFLECTOR_PROMPT),
        timeout=timeout,
        on_event=on_event,
        completion_kwargs=completion_kwargs or {},
        clock=_validate_clock(clock) if clock is not None else (lambda: datetime.now(timezone.utc)),
        on_busy=on_busy,
        lease_ttl=lease_ttl,
        max_input_tokens=max_input_tokens,
        max_backlog=max_backlog,
    )


__all__ = [
    "CompactionEvent",
    "ObservationalMemoryStore",
    "ThreadState",
    "create_observational_memory_store",
]
