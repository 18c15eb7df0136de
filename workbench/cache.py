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

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from .errors import WorkbenchError

CACHE_FILE_KEY = "omem-cache-file"
CACHE_FILE_NAME = "litellm-cache.sqlite"


class CacheUnavailable(WorkbenchError):
    """The cache folder cannot be created or written."""


def default_cache_dir() -> Path:
    """``$OMEM_CACHE_DIR``, else ``~/.cache/omem`` (read at each call, never frozen at import)."""
    return Path(os.environ.get("OMEM_CACHE_DIR") or Path.home() / ".cache" / "omem")


def default_cache_path() -> Path:
    return default_cache_dir() / CACHE_FILE_NAME


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=30, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
                "created REAL NOT NULL, ttl REAL)")
    return con


def prepare_cache(folder: str | Path | None = None) -> Path:
    """The cache file for ``folder`` (default :func:`default_cache_dir`), created and checked
    writable now, so a replay fails before it starts rather than caching nothing in silence."""
    path = Path(folder if folder is not None else default_cache_dir()) / CACHE_FILE_NAME
    try:
        con = _connect(path)
        try:
            con.execute("INSERT OR REPLACE INTO cache VALUES ('omem:probe', '1', ?, 0)", [time.time()])
        finally:
            con.close()
    except (OSError, sqlite3.Error) as exc:
        raise CacheUnavailable(
            f"the model-call cache folder {path.parent} cannot be written ({exc}); set OMEM_CACHE_DIR "
            "to a writable folder, or replay without the cache (--no-cache)") from exc
    return path


class SQLiteCache:
    """litellm cache backend: one SQLite file per cache folder, named by each call."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.default_path = Path(path) if path is not None else None
        self._local = threading.local()

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
        ttl = kwargs.get("ttl")
        self._con(self._path(kwargs)).execute("INSERT OR REPLACE INTO cache VALUES (?, ?, ?, ?)",
                                              [key, json.dumps(value, default=str), time.time(), ttl])

    def get_cache(self, key: str, **kwargs: Any) -> Any:
        row = self._con(self._path(kwargs)).execute(
            "SELECT value, created, ttl FROM cache WHERE key = ?", [key]).fetchone()
        if row is None:
            return None
        value, created, ttl = row
        if ttl is not None and time.time() > created + float(ttl):
            return None
        return json.loads(value)

    async def async_set_cache(self, key: str, value: Any, **kwargs: Any) -> None:
        self.set_cache(key, value, **kwargs)

    async def async_set_cache_pipeline(self, cache_list: list[tuple[str, Any]], **kwargs: Any) -> None:
        for key, value in cache_list:
            self.set_cache(key, value, **kwargs)

    async def async_get_cache(self, key: str, **kwargs: Any) -> Any:
        return self.get_cache(key, **kwargs)

    async def batch_cache_write(self, key: str, value: Any, **kwargs: Any) -> None:
        self.set_cache(key, value, **kwargs)

    async def disconnect(self) -> None:
        for con in (getattr(self._local, "connections", None) or {}).values():
            con.close()
        self._local.connections = {}


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
    return isinstance(getattr(litellm.cache, "cache", None), SQLiteCache)


def completion_kwargs(path: Path) -> dict[str, Any]:
    """The per-call arguments that make litellm serve and store answers in the file ``path``."""
    return {"caching": True, "cache": {"use-cache": True, CACHE_FILE_KEY: str(path)}}


__all__ = ["CACHE_FILE_KEY", "CacheUnavailable", "SQLiteCache", "completion_kwargs", "default_cache_dir",
           "default_cache_path", "enable_litellm_cache", "prepare_cache"]
