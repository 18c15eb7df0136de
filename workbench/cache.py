"""A persistent backend for litellm's own response cache.

litellm's caching (``litellm.cache = Cache(...)``, ``caching=True`` per call) decides what is a
repeat call and serves it; this module only gives it somewhere durable to keep answers, so a
re-run of the same configuration in a new process costs no new model calls. It plugs into
litellm's ``BaseCache`` extension point and stores JSON in a stdlib ``sqlite3`` file (WAL mode,
safe for several processes).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from litellm.caching.base_cache import BaseCache


def default_cache_path() -> Path:
    folder = os.environ.get("OMEM_CACHE_DIR") or str(Path.home() / ".cache" / "omem")
    return Path(folder) / "litellm-cache.sqlite"


class SQLiteCache(BaseCache):
    """litellm cache backend in one SQLite file."""

    def __init__(self, path: str | Path | None = None) -> None:
        super().__init__(default_ttl=0)
        self.path = Path(path) if path is not None else default_cache_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._con() as con:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
                        "created REAL NOT NULL, ttl REAL)")

    def _con(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        return con

    def set_cache(self, key: str, value: Any, **kwargs: Any) -> None:
        ttl = kwargs.get("ttl")
        self._con().execute("INSERT OR REPLACE INTO cache VALUES (?, ?, ?, ?)",
                            [key, json.dumps(value, default=str), time.time(), ttl])

    def get_cache(self, key: str, **kwargs: Any) -> Any:
        row = self._con().execute("SELECT value, created, ttl FROM cache WHERE key = ?", [key]).fetchone()
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
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None


def enable_litellm_cache(path: str | Path | None = None) -> None:
    """Turn on litellm's response cache with the persistent backend (idempotent).

    The cache is opt-in per call (``caching=True``). A cache the user already configured on
    ``litellm.cache`` is left alone.
    """
    import litellm
    from litellm.caching.caching import Cache, CacheMode

    if litellm.cache is not None:
        return
    # Opt-in only: calls that pass caching=True (the workbench's) use it; other litellm calls in
    # the same process are not cached behind their back.
    cache = Cache(type="local", mode=CacheMode.default_off)
    cache.cache = SQLiteCache(path)
    litellm.cache = cache
