"""A persistent backend for litellm's own response cache, chosen per run.

litellm's caching (``litellm.cache = Cache(...)``, ``caching=True`` per call) decides what is a
repeat call and serves it; this module only gives it somewhere durable to keep answers, so a
re-run of the same configuration in a new process costs no new model calls. It plugs into
litellm's ``BaseCache`` extension point and stores JSON in stdlib ``sqlite3`` files (WAL mode,
safe for several processes).

``litellm.cache`` is process-wide, but the *file* is not: each call names its cache file in
litellm's per-call cache controls (``cache={"use-cache": True, CACHE_FILE_KEY: path}``, see
:func:`completion_kwargs`), and the backend routes on it. Two replays in one process (or two
tests) with different cache directories never share answers, whatever ran before them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from .errors import WorkbenchError

CACHE_FILE_KEY = "omem-cache-file"
RPM_KEY = "omem-rpm"  # optional requests-per-minute limit for the calls that reach the model
GATE_ONLY_KEY = "omem-gate-only"  # the rate limit without the cache: nothing is read, stored or shared
CACHE_FILE_NAME = "litellm-cache.sqlite"
SHARE_WAIT_S = 900.0  # the longest a call waits for an identical one in flight


class CacheUnavailable(WorkbenchError):
    """The cache folder cannot be created or written."""


def default_cache_dir() -> Path:
    """``$OMEM_CACHE_DIR``, else ``~/.cache/omem`` (read at each call, never frozen at import)."""
    return Path(os.environ.get("OMEM_CACHE_DIR") or Path.home() / ".cache" / "omem")


def default_cache_path() -> Path:
    return default_cache_dir() / CACHE_FILE_NAME


def _stored_key(key: str, model: object = None) -> str:
    """The key a cache entry is written under: a digest of litellm's key, which can quote the
    call's server address whole (and a key given in it, ``?key=…``) — never written to the file.
    (Entries written under the raw keys before are not read: among them, offline-model replies
    that were un-escaped by the model, where the wrapper now does it for every model.)

    An offline model's (``omem/…``) key also holds a digest of its code: its answers change with
    omem's version, where a remote model's name stays; an older omem's answers were served to a
    newer one, so a replay or a benchmark showed what the old code wrote."""
    # (litellm's sync get_cache passes no model: a sync completion(caching=True) of the offline model
    # never hits; the workbench calls acompletion only, whose get and set both pass it)
    if isinstance(model, str) and model.startswith("omem/"):
        from omem_core.extractive.algorithm import code_version

        key = f"{key}\noffline model code {code_version()}"
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _connect(path: Path) -> sqlite3.Connection:
    """A connection to the cache file, created in WAL mode if new (an experiment's workers may
    create the same file at once: :func:`omem_core.sqlite.use_wal` waits for each other)."""
    from omem_core.sqlite import use_wal  # here, not at import: quick CLI paths never load omem_core

    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        use_wal(con)
        con.execute("CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
                    "created REAL NOT NULL, ttl REAL)")
    except sqlite3.Error:
        con.close()
        raise
    return con


def prepare_cache(folder: str | Path | None = None) -> Path:
    """The cache file for ``folder`` (default :func:`default_cache_dir`), created and checked
    writable now, so a replay fails before it starts rather than caching nothing in silence."""
    path = Path(folder if folder is not None else default_cache_dir()) / CACHE_FILE_NAME
    try:
        con = _connect(path)
        try:
            con.execute("INSERT OR REPLACE INTO cache VALUES (?, '1', ?, 0)", [PROBE_KEY, time.time()])
        finally:
            con.close()
    except (OSError, sqlite3.Error) as exc:
        raise CacheUnavailable(
            f"the model-call cache folder {path.parent} cannot be written ({exc}); set OMEM_CACHE_DIR "
            "to a writable folder, or replay without the cache (--no-cache)") from exc
    return path


PROBE_KEY = "omem:probe"  # the row prepare_cache writes to check the file is writable: not an answer


def cache_summary(folder: str | Path | None = None) -> dict[str, Any]:
    """What the model-call cache of ``folder`` (default :func:`default_cache_dir`) holds: its
    ``path``, whether it ``exists``, its ``answers``, ``bytes`` (with its WAL) and the ``oldest`` and
    ``newest`` answers' times (epoch seconds). Reads the file only (no model library is loaded)."""
    path = Path(folder if folder is not None else default_cache_dir()) / CACHE_FILE_NAME
    summary: dict[str, Any] = {"path": str(path), "exists": path.is_file(), "answers": 0, "bytes": 0,
                               "oldest": None, "newest": None}
    if not summary["exists"]:
        return summary
    summary["bytes"] = sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.is_file())
    try:
        # (a URI from the resolved path: "?", "#" or "%" in a folder's name are escaped)
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            row = con.execute("SELECT count(*), min(created), max(created) FROM cache WHERE key != ?",
                              [PROBE_KEY]).fetchone()
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise CacheUnavailable(f"the model-call cache {path} cannot be read ({exc})") from exc
    summary.update(answers=int(row[0]), oldest=row[1], newest=row[2])
    return summary


def clear_cache(folder: str | Path | None = None) -> int:
    """Delete every answer of the model-call cache of ``folder`` and give its space back; the
    number of answers deleted. A replay running meanwhile keeps working (it asks the model again)."""
    path = Path(folder if folder is not None else default_cache_dir()) / CACHE_FILE_NAME
    if not path.is_file():
        return 0
    try:
        con = sqlite3.connect(path, timeout=30, isolation_level=None)
        try:
            deleted = con.execute("DELETE FROM cache WHERE key != ?", [PROBE_KEY]).rowcount
            con.execute("VACUUM")
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise CacheUnavailable(f"the model-call cache {path} cannot be cleared ({exc})") from exc
    return int(deleted)


class RateLimiter:
    """At most ``rpm`` acquisitions in any ``period`` seconds (60: requests per minute), as a
    sliding log; async, and shared by every event loop and thread of the process (the app runs
    each experiment in a thread with its own loop: an ``asyncio.Lock`` made on the first loop
    raised "bound to a different event loop" on the next, and litellm then called the model
    without waiting)."""

    def __init__(self, rpm: float, period: float = 60.0) -> None:
        self.rpm = rpm
        self.period = period
        self._times: list[float] = []
        self._mutex = threading.Lock()  # (held only to read and write the log, never across an await)

    async def acquire(self) -> None:
        while True:
            with self._mutex:
                now = time.monotonic()
                self._times = [t for t in self._times if now - t < self.period]
                if len(self._times) < self.rpm:
                    self._times.append(now)
                    return
                wait = self.period - (now - self._times[0]) + 0.001
            await asyncio.sleep(wait)


class SQLiteCache:
    """litellm cache backend: one SQLite file per cache folder, named by each call.

    It is also the gate in front of the model, since litellm asks it before every cached call:

    * **Shared calls.** A call whose identical twin (same cache key) is in flight waits for it and
      is served its answer (a cache hit) instead of calling the model again, so configurations
      that make the same observer calls at the same time pay once. If the first call fails, the
      waiters call the model themselves.
    * **Rate limit.** With ``cache={..., RPM_KEY: n}``, the calls that will reach the model take a
      slot of an ``n`` requests-per-minute limiter (one per model and limit).
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.default_path = Path(path) if path is not None else None
        self._local = threading.local()
        # Per event loop and cache key (the app runs experiments in threads, each on its loop: one
        # loop's leader released another loop's future, from the wrong thread, and left its own)
        self._inflight: dict[tuple[asyncio.AbstractEventLoop, str], asyncio.Future] = {}
        self._leaders: dict[str, tuple[asyncio.AbstractEventLoop, str]] = {}  # litellm_call_id -> what it leads
        self._limiters: dict[tuple[str, float], RateLimiter] = {}
        self.shared = 0  # calls served by an identical call in flight

    def _path(self, kwargs: dict[str, Any]) -> Path:
        control = kwargs.get("cache") or {}
        named = control.get(CACHE_FILE_KEY) if isinstance(control, dict) else None
        return Path(named) if named else (self.default_path or default_cache_path())

    def _con(self, path: Path) -> sqlite3.Connection:
        connections = getattr(self._local, "connections", None)
        if connections is None:
            connections = self._local.connections = {}
        con = connections.get(path)
        if con is None:
            con = connections[path] = _connect(path)
        return con

    def set_cache(self, key: str, value: Any, **kwargs: Any) -> None:
        """Keep ``value`` under ``key``; a secret of the environment that it quotes (a reply that
        echoes the key) is written as the variable's name, as the run store writes it."""
        from omem_core._env import redact_secrets  # (litellm is loaded: this is one of its calls)

        if _gate_only(kwargs):
            return
        ttl = kwargs.get("ttl")
        self._con(self._path(kwargs)).execute("INSERT OR REPLACE INTO cache VALUES (?, ?, ?, ?)",
                                              [_stored_key(key, kwargs.get("model")), redact_secrets(json.dumps(value, default=str)),
                                               time.time(), ttl])

    def get_cache(self, key: str, **kwargs: Any) -> Any:
        if _gate_only(kwargs):
            return None
        row = self._con(self._path(kwargs)).execute(
            "SELECT value, created, ttl FROM cache WHERE key = ?", [_stored_key(key, kwargs.get("model"))]).fetchone()
        if row is None:
            return None
        value, created, ttl = row
        if ttl is not None and time.time() > created + float(ttl):
            return None
        return json.loads(value)

    async def async_set_cache(self, key: str, value: Any, **kwargs: Any) -> None:
        self.set_cache(key, value, **kwargs)
        if not _gate_only(kwargs):
            self._release((asyncio.get_running_loop(), key), value)

    def _release(self, slot: tuple[asyncio.AbstractEventLoop, str], value: Any) -> None:
        future = self._inflight.pop(slot, None)
        if future is not None and not future.done():
            future.set_result(value)
        for call_id in [c for c, s in self._leaders.items() if s == slot]:
            del self._leaders[call_id]

    def release_failed(self, call_id: str | None) -> None:
        """The call ``call_id`` failed: its waiters call the model themselves."""
        slot = self._leaders.pop(call_id, None) if call_id else None
        if slot is not None:
            self._release(slot, None)

    def release_later(self, call_id: str | None, delay: float = 2.0) -> None:
        """The call ``call_id`` succeeded: its answer reaches the cache in a moment (litellm writes
        it in a background task). Should it never (an answer litellm does not cache), the
        waiters are released after ``delay`` seconds to call the model themselves."""
        key = self._leaders.get(call_id) if call_id else None
        if key is not None:
            asyncio.get_running_loop().call_later(delay, self.release_failed, call_id)

    async def async_set_cache_pipeline(self, cache_list: list[tuple[str, Any]], **kwargs: Any) -> None:
        for key, value in cache_list:
            self.set_cache(key, value, **kwargs)

    async def async_get_cache(self, key: str, **kwargs: Any) -> Any:
        if _gate_only(kwargs):  # (--no-cache with --rpm: it was ignored, every call went out at once)
            await self._limit(kwargs)
            return None
        found = self.get_cache(key, **kwargs)
        if found is not None:
            return found
        loop = asyncio.get_running_loop()
        slot = (loop, key)
        twin = self._inflight.get(slot)
        if twin is not None and not twin.done():
            try:
                found = await asyncio.wait_for(asyncio.shield(twin), SHARE_WAIT_S)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001  (then this call goes to the model)
                found = None
            if found is not None:
                self.shared += 1
                return found
        future = self._inflight[slot] = loop.create_future()
        if (leader := asyncio.current_task()) is not None:
            # A leader cancelled (the library's timeout, which runs each call as a task of its own,
            # or Stop) is reported to no callback: its waiters, and every later identical call of
            # the loop, waited for it until their own timeout (SHARE_WAIT_S without one) rather than
            # calling the model. (Its exception is not read here: asyncio's "never retrieved" stays.)
            def gone(task: asyncio.Task[Any], slot: tuple = slot, future: asyncio.Future = future) -> None:
                if self._inflight.get(slot) is future and task.cancelled():
                    self._release(slot, None)

            leader.add_done_callback(gone)
            future.add_done_callback(lambda _: leader.remove_done_callback(gone))
        call_id = kwargs.get("litellm_call_id")
        if call_id:
            self._leaders[str(call_id)] = slot
        await self._limit(kwargs)
        return None

    async def _limit(self, kwargs: dict[str, Any]) -> None:
        """A slot of the call's requests-per-minute limiter, if it names one (one per model and limit)."""
        control = kwargs.get("cache") or {}
        rpm = control.get(RPM_KEY) if isinstance(control, dict) else None
        if rpm:
            model = str(kwargs.get("model"))
            limiter = self._limiters.setdefault((model, float(rpm)), RateLimiter(float(rpm)))
            await limiter.acquire()

    async def batch_cache_write(self, key: str, value: Any, **kwargs: Any) -> None:
        self.set_cache(key, value, **kwargs)

    async def disconnect(self) -> None:
        for con in (getattr(self._local, "connections", None) or {}).values():
            con.close()
        self._local.connections = {}


def _gate_only(kwargs: dict[str, Any]) -> bool:
    control = kwargs.get("cache")
    return isinstance(control, dict) and bool(control.get(GATE_ONLY_KEY))


def _waiter_release() -> Any:
    """A litellm callback that releases the waiters of a finished call (built on first use)."""
    from litellm.integrations.custom_logger import CustomLogger

    class ReleaseWaiters(CustomLogger):
        async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):  # type: ignore[override]
            backend = _backend()
            if backend is not None:
                backend.release_failed(kwargs.get("litellm_call_id"))

        async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):  # type: ignore[override]
            backend = _backend()
            if backend is not None:
                backend.release_later(kwargs.get("litellm_call_id"))

    return ReleaseWaiters()


def _backend() -> SQLiteCache | None:
    import litellm

    backend = getattr(litellm.cache, "cache", None)
    return backend if isinstance(backend, SQLiteCache) else None


def _backend_class() -> type:
    """``SQLiteCache`` as a subclass of litellm's ``BaseCache`` (built on first use: importing
    litellm takes seconds, and the quick CLI paths never need it)."""
    global _BACKEND
    if _BACKEND is None:
        from litellm.caching.base_cache import BaseCache

        class LitellmSQLiteCache(SQLiteCache, BaseCache):  # type: ignore[misc, valid-type]
            def __init__(self, path: str | Path | None = None) -> None:
                BaseCache.__init__(self, default_ttl=0)
                SQLiteCache.__init__(self, path)

        _BACKEND = LitellmSQLiteCache
    return _BACKEND


_BACKEND: type | None = None


def enable_litellm_cache() -> bool:
    """Install the routing backend as litellm's cache, once per process.

    The cache is opt-in per call (``caching=True``): other litellm calls in the process are not
    cached behind their back. A cache the user configured on ``litellm.cache`` is left alone
    (then the per-call file is ignored). Returns whether ours is in place.
    """
    import litellm
    from litellm.caching.caching import Cache, CacheMode

    if litellm.cache is None:
        cache = Cache(type="local", mode=CacheMode.default_off)
        cache.cache = _backend_class()()
        litellm.cache = cache
        litellm.callbacks.append(_waiter_release())  # appended: a user's callbacks stay
    return isinstance(getattr(litellm.cache, "cache", None), SQLiteCache)


def forget_connections() -> None:
    """Drop (without closing) the cache backend's SQLite connections: for a forked process, which
    must open its own (the parent's stay the parent's). In-flight call sharing starts afresh."""
    import sys

    if "litellm" not in sys.modules:
        return
    backend = _backend()
    if backend is not None:
        backend._local = threading.local()
        backend._inflight.clear()
        backend._leaders.clear()


def gate_kwargs(rpm: float) -> dict[str, Any]:
    """The per-call arguments that take a slot of an ``rpm`` limiter without the cache (a replay
    with the cache off): litellm asks its cache backend before each call only when caching is on,
    so the limit rides on that question, and nothing is read, stored or shared."""
    return {"caching": True, "cache": {"use-cache": True, RPM_KEY: rpm, GATE_ONLY_KEY: True}}


def completion_kwargs(path: Path, *, rpm: float | None = None, api_base: str | None = None) -> dict[str, Any]:
    """The per-call arguments that make litellm serve and store answers in the file ``path``
    (and, with ``rpm``, limit the calls that reach the model).

    litellm's cache key leaves out the server: two OpenAI-compatible servers under one model
    string would share answers, and one that fails every call would replay the other's. So the
    server (``api_base``, else ``$OPENAI_BASE_URL`` / ``$OPENAI_API_BASE``, the order litellm
    follows) names a namespace of its own."""
    control: dict[str, Any] = {"use-cache": True, CACHE_FILE_KEY: str(path)}
    if rpm:
        control[RPM_KEY] = rpm
    server = api_base or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE")
    if server:
        control["namespace"] = "server " + server.rstrip("/")
    return {"caching": True, "cache": control}


__all__ = ["CACHE_FILE_KEY", "RPM_KEY", "CacheUnavailable", "RateLimiter", "SQLiteCache", "completion_kwargs", "default_cache_dir",
           "default_cache_path", "enable_litellm_cache", "prepare_cache"]
