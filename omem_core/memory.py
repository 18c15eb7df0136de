"""The memory port (``MemoryStore``), its in-memory default, and the ``Memory`` facade."""

from __future__ import annotations

import inspect
import math
import numbers
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .messages import Message, check_batch, check_message, check_text, check_thread_id, check_working_memory


@runtime_checkable
class MemoryStore(Protocol):
    """Where a conversation's messages live. Every method is async.

    ``recall`` is the single query entry:

    * without ``before``: the newest ``last`` messages of the thread, oldest first;
    * with ``before`` (a message id, the cursor): the newest ``last`` messages strictly older
      than that message, oldest first.

    An unknown thread gives ``[]``; an unknown cursor id raises ``KeyError``.

    A store may also offer the *working-memory capability*: ``get_working_memory(thread_id)``
    and ``update_working_memory(thread_id, text)``.
    """

    async def save_messages(self, messages: Sequence[Message]) -> None: ...

    async def recall(
        self, thread_id: str, *, last: int, before: str | None = None
    ) -> list[Message]: ...

    async def delete_thread(self, thread_id: str) -> None: ...


class Closed:
    """What a store's synchronous ``close()`` returns: nothing to wait for, so ignoring it is fine,
    and ``await store.close()`` works too, as it does for the PostgreSQL stores (whose ``close()``
    is a coroutine), so code can close any store the same way."""

    __slots__ = ()

    def __await__(self):  # type: ignore[no-untyped-def]
        return iter(())


async def close_stores(*stores: object) -> None:
    """Close each distinct store that has a ``close()`` (awaited when it returns an awaitable),
    every one even when an earlier one fails; then raise the first failure. A store given twice
    (one SQLite file object serving both ports) is closed once."""
    failures: list[BaseException] = []
    seen: set[int] = set()
    for store in stores:
        if store is None or id(store) in seen or not callable(getattr(store, "close", None)):
            continue
        seen.add(id(store))
        try:
            result = store.close()  # type: ignore[attr-defined]
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            failures.append(exc)
    if failures:
        raise failures[0]


class SyncClosing:
    """``close()`` (returning :class:`Closed`) plus ``with`` and ``async with`` for a store whose
    resources close synchronously (SQLite, DuckDB)."""

    def _close(self) -> None:
        raise NotImplementedError

    def close(self) -> Closed:
        """Close the store's connection (idempotent). Returns an awaitable: ``store.close()`` and
        ``await store.close()`` both work."""
        self._close()
        return Closed()

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    async def __aenter__(self):  # type: ignore[no-untyped-def]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._close()


def check_store(value: object, protocol: type, name: str) -> None:
    """A ``TypeError`` naming ``name`` unless ``value`` has ``protocol``'s methods: a path or a
    connection passed where a store goes failed only at the first read, as an ``AttributeError``
    (and a store class, not an instance of it, at its first call, missing ``self``)."""
    names = sorted(n for n in vars(protocol) if not n.startswith("_") and callable(getattr(protocol, n)))
    methods = ", ".join(names)
    if isinstance(value, type):
        if all(callable(getattr(value, n, None)) for n in names):  # a store class: its instance was meant
            raise TypeError(f"{name} must be {_article(protocol)} {protocol.__name__} instance, got the class "
                            f"{value.__name__} itself: create one first, e.g. {value.__name__}(...)")
        raise TypeError(f"{name} must be {_article(protocol)} {protocol.__name__} (an object with {methods}), "
                        f"got the class {value.__name__}")
    if not isinstance(value, protocol):
        sqlite = "SQLiteMemoryStore" if protocol.__name__ == "MemoryStore" else "SQLiteObservationStore"
        hint = (f" (for a SQLite file use omem_core.sqlite.{sqlite}(path))"
                if isinstance(value, (str, bytes)) or hasattr(value, "__fspath__") else "")
        raise TypeError(f"{name} must be {_article(protocol)} {protocol.__name__} (an object with {methods}), "
                        f"got {type(value).__name__} {value!r:.80}{hint}")
    for method in names:
        if kind := _not_awaitable(getattr(value, method)):
            # (it passed, then failed at its first call with Python's "object NoneType can't be used in
            # 'await' expression", after a plain save_messages had saved: an error for a batch it kept)
            raise TypeError(f"{name}.{method} of {type(value).__name__} is {kind}, but a store's methods are "
                            f"awaited: declare it 'async def {method}' returning its result (a plain method that "
                            "returns an awaitable says so with its return annotation, '-> Awaitable[...]')")


_AWAITABLE_ANNOTATIONS = ("Awaitable", "Coroutine", "Future", "Task")


def _not_awaitable(method: object) -> str | None:
    """What ``method`` is when its definition says a call of it cannot be awaited: an async
    generator, or a plain ``def`` whose return annotation names a type that is no awaitable
    (``-> None``, ``-> list[Message]``); else ``None``. Every layer of decorators that keep
    ``__wrapped__`` is looked at, and any one that is ``async`` or says it returns an awaitable
    clears it (a decorator that runs a plain function in a thread); a plain ``def`` without a
    return annotation may forward another store's awaitable, and is taken on trust."""
    layer: object = getattr(method, "__func__", method)
    kind = None
    for _ in range(100):  # (a cycle of __wrapped__ ends here)
        if inspect.iscoroutinefunction(layer):
            return None
        if inspect.isfunction(layer):
            if inspect.isasyncgenfunction(layer):
                kind = kind or "an async generator (it yields)"
            elif "return" in layer.__annotations__:
                returns = layer.__annotations__["return"]
                said = returns if isinstance(returns, str) else getattr(returns, "__name__", "") or repr(returns)
                if any(word in said for word in _AWAITABLE_ANNOTATIONS):
                    return None
                kind = kind or f"a plain function (def, not async def) returning {said}"
        layer = getattr(layer, "__wrapped__", None)
        if layer is None:
            break
    return kind


def _article(protocol: type) -> str:
    return "an" if protocol.__name__[0] in "AEIOU" else "a"


def whole_number(value: object) -> int | None:
    """``value`` as an ``int`` when it is an integer of any kind (a NumPy or pandas one too, as
    a sweep's values are), never a ``bool``; else ``None``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


_WORKING_MEMORY = {"get_working_memory": "_wm_read", "update_working_memory": "_wm_write"}


def _chain(storage: object) -> str:
    """A storage and the stores it wraps, by class: ``ObservationalMemoryStore over SQLiteMemoryStore``
    (the store that lacks a capability is the innermost, not the wrapper a user passed)."""
    names, seen = [type(storage).__name__], {id(storage)}
    while (inner := getattr(storage, "__dict__", {}).get("inner")) is not None and id(inner) not in seen:
        names.append(type(inner).__name__)
        seen.add(id(inner))
        storage = inner
    return " over ".join(names)


def positive_seconds(name: str, value: object) -> float:
    """``value`` as a float when it is a positive, finite number of seconds (not a ``bool``),
    else a ``ValueError`` naming ``name``."""
    seconds = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    if not (math.isfinite(seconds) and seconds > 0):  # (a NumPy number too, as a sweep's values are)
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return seconds


MAX_LAST = 2**62  # more messages than any store holds: a larger ``last`` reads the same


def check_last(last: object) -> int:
    """``last`` if it is a non-negative integer (at most :data:`MAX_LAST`: ``sys.maxsize``, "all
    of them", overflowed a database's 64-bit integer once doubled), else a ``ValueError``."""
    number = whole_number(last)
    if number is None or number < 0:
        raise ValueError(f"last must be a non-negative integer, got {last!r}")
    return min(number, MAX_LAST)


def check_read(thread_id: object, last: object, before: object = None) -> int:
    """``last`` (see :func:`check_last`) once ``thread_id`` is a ``str``, else a ``TypeError``: a
    read of ``None`` or ``123`` returned ``[]`` as if the thread were empty. ``before`` (the
    cursor) must be ``None`` or a ``str``: ``before=3`` matched message ``"3"`` in SQLite, failed
    in SQL in PostgreSQL and was an unknown cursor in memory."""
    if not isinstance(thread_id, str):
        raise TypeError(f"thread_id must be a str, got {type(thread_id).__name__} {thread_id!r}")
    check_text(thread_id, "recall", "thread_id")  # (a lone surrogate: no thread can have it)
    if before is not None:
        if not isinstance(before, str):
            raise TypeError(f"recall: before must be a message id (a str) or None, got {type(before).__name__} {before!r}")
        check_text(before, "recall", "before")
    return check_last(last)


class _Thread:
    """One thread's messages, kept sorted by ``(created_at, insertion number)``.

    Appending in time order (the normal case) is O(1); an out-of-order message is inserted with
    ``bisect`` (a memmove, never a re-sort). A cursor lookup is a dict hit plus a binary search.
    """

    __slots__ = ("keys", "messages", "key_of")

    def __init__(self) -> None:
        self.keys: list[tuple[datetime, int]] = []
        self.messages: list[Message] = []
        self.key_of: dict[str, tuple[datetime, int]] = {}

    def add(self, message: Message, seq: int) -> None:
        key = (message.created_at, seq)
        if not self.keys or key >= self.keys[-1]:
            self.keys.append(key)
            self.messages.append(message)
        else:
            at = bisect_right(self.keys, key)
            self.keys.insert(at, key)
            self.messages.insert(at, message)
        self.key_of[message.id] = key


class InMemoryMemoryStore(SyncClosing):
    """The zero-dependency ``MemoryStore``: ordered by ``created_at``, ties by insertion.

    Saving a message whose id is already stored is a no-op when the message is identical and a
    ``ValueError`` otherwise (messages are immutable). Has the working-memory capability.
    ``close()``, ``with`` and ``async with`` work as for the SQLite store, so code can close any
    store the same way; there is nothing to release, and the messages stay readable.
    """

    def _close(self) -> None:
        pass  # (nothing held: the messages live as long as the object)

    def __init__(self) -> None:
        self._threads: dict[str, _Thread] = {}
        self._working: dict[str, str] = {}
        self._seq = 0

    async def save_messages(self, messages: Sequence[Message]) -> None:
        # Validate the whole batch first, so that a bad message saves nothing (as in SQLite).
        fresh: dict[tuple[str, str], Message] = {}
        for message in check_batch(messages):
            check_message(message)
            thread = self._threads.get(message.thread_id)
            key = thread.key_of.get(message.id) if thread is not None else None
            existing = thread.messages[bisect_left(thread.keys, key)] if thread is not None and key is not None \
                else fresh.get((message.thread_id, message.id))
            if existing is not None:
                if existing != message:
                    raise ValueError(
                        f"message {message.id!r} is already saved in thread "
                        f"{message.thread_id!r} with other fields; messages are immutable"
                    )
                continue
            fresh[(message.thread_id, message.id)] = message
        for message in fresh.values():
            thread = self._threads.get(message.thread_id)
            if thread is None:
                thread = self._threads[message.thread_id] = _Thread()
            self._seq += 1
            thread.add(message, self._seq)

    async def recall(
        self, thread_id: str, *, last: int, before: str | None = None
    ) -> list[Message]:
        last = check_read(thread_id, last, before)  # (a plain int: a NumPy one is one for SQL too)
        thread = self._threads.get(thread_id)
        if before is not None:
            key = thread.key_of.get(before) if thread is not None else None
            if key is None:
                raise KeyError(f"unknown cursor: no message {before!r} in thread {thread_id!r}")
            end = bisect_left(thread.keys, key)  # type: ignore[union-attr]
        elif thread is None:
            return []
        else:
            end = len(thread.messages)
        return thread.messages[max(0, end - last) : end]  # type: ignore[union-attr]

    async def delete_thread(self, thread_id: str) -> None:
        check_thread_id(thread_id, "delete_thread")
        self._threads.pop(thread_id, None)
        self._working.pop(thread_id, None)

    async def get_working_memory(self, thread_id: str) -> str | None:
        check_thread_id(thread_id, "get_working_memory")
        return self._working.get(thread_id)

    async def update_working_memory(self, thread_id: str, text: str) -> None:
        check_working_memory(thread_id, text)
        self._working[thread_id] = text


class Memory:
    """The facade an application holds.

    Example::

        memory = Memory(storage=create_observational_memory_store(observer="omem/extractive"))
        await memory.save_messages([...])
        context = await memory.recall("thread-1")   # memory system message + last 10 messages
    """

    def __init__(self, storage: MemoryStore | None = None, last_messages: int = 10) -> None:
        number = whole_number(last_messages)
        if number is None or number < 1:
            raise ValueError(f"last_messages must be a positive integer, got {last_messages!r}")
        last_messages = number
        if storage is not None:
            check_store(storage, MemoryStore, "storage")
        self.storage: MemoryStore = storage if storage is not None else InMemoryMemoryStore()
        self.last_messages = last_messages

    async def save_messages(self, messages: Iterable[Message]) -> None:
        await self.storage.save_messages(check_batch(messages))  # any iterable; stores may read a batch twice

    async def recall(
        self, thread_id: str, *, before: str | None = None, last: int | None = None
    ) -> list[Message]:
        """``storage.recall`` with ``last`` (default ``last_messages``). ``last=0`` is honoured: no
        window (a wrapped store still returns its memory message)."""
        return await self.storage.recall(
            thread_id, last=self.last_messages if last is None else check_last(last), before=before)

    async def delete_thread(self, thread_id: str) -> None:
        check_thread_id(thread_id, "delete_thread")
        await self.storage.delete_thread(thread_id)

    @property
    def has_working_memory(self) -> bool:
        return hasattr(self.storage, "get_working_memory") and hasattr(
            self.storage, "update_working_memory"
        )

    # The working-memory methods exist when the storage has them (SPEC: "and the working-memory
    # methods when the storage has them"), as on the observational-memory wrapper: without them,
    # ``hasattr(memory, "get_working_memory")`` is False and a call is an AttributeError naming the
    # storage. (Declared for type checkers; looked up in ``__getattr__``.)
    # (``__getattr__`` outside TYPE_CHECKING: seen by a type checker, it made every misspelt
    # attribute of Memory an ``Any``, ``memory.recal(...)`` included)
    if TYPE_CHECKING:
        async def get_working_memory(self, thread_id: str) -> str | None: ...

        async def update_working_memory(self, thread_id: str, text: str) -> None: ...
    else:
        def __getattr__(self, name: str) -> Any:
            if name in _WORKING_MEMORY and "storage" in self.__dict__:
                if not self.has_working_memory:
                    raise AttributeError(f"{_chain(self.storage)} has no working-memory capability: "
                                         f"Memory.{name} exists only over a storage that has it")
                return getattr(self, _WORKING_MEMORY[name])
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # (named apart from the public names: Python's "Did you mean: '_get_working_memory'?" pointed
    # at a private method when the capability is missing)
    async def _wm_read(self, thread_id: str) -> str | None:
        check_thread_id(thread_id, "get_working_memory")
        return await self.storage.get_working_memory(thread_id)  # type: ignore[attr-defined,no-any-return]

    async def _wm_write(self, thread_id: str, text: str) -> None:
        await self.storage.update_working_memory(thread_id, text)  # type: ignore[attr-defined]

    async def close(self) -> None:
        """Close the storage (a wrapped store closes the stores it wraps). Idempotent; ``async
        with Memory(...) as memory:`` closes it at the end of the block."""
        await close_stores(self.storage)

    async def __aenter__(self) -> Memory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
