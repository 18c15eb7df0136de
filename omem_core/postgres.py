"""PostgreSQL adapters for both ports: one memory shared by processes on many hosts.

Needs the ``postgres`` extra (``pip install -e ".[postgres]"``: psycopg 3 and psycopg-pool); the
rest of ``omem_core`` never imports psycopg. Both stores may share one database (and one schema)::

    from omem_core import Memory, create_observational_memory_store
    from omem_core.postgres import PostgresMemoryStore, PostgresObservationStore

    dsn = "postgresql://omem@db.internal:5432/omem"
    store = create_observational_memory_store(
        PostgresMemoryStore(dsn), observer="gpt-4o-mini", observations=PostgresObservationStore(dsn))

Each store holds one psycopg ``AsyncConnectionPool``, opened on first use in the running event
loop. A store serves one event loop at a time: a call from another loop is a clear
``RuntimeError`` while the first runs (or is stopped with the pool on it); after it is closed
(``asyncio.run`` ended, closing the pool) the next loop opens a pool of its own. The schema is
versioned (table ``omem_schema``) and migrated on first use under a transaction-level advisory
lock, so hosts starting together migrate it once. Indexes keep a
cursorless recall, a paging read and ``list_recent`` independent of the thread's length.

Across hosts (see ``docs/storage.md``):

* **Leases are rows** (``omem_leases``: holder, expiry) taken and renewed with one atomic
  ``INSERT … ON CONFLICT DO UPDATE … WHERE expired or mine``, with the expiry on the *server's*
  clock, so hosts' clock skew does not matter. Rows, not advisory locks: a session advisory lock
  would pin one pooled connection for the whole model call and vanish silently with it; a row
  lease needs no connection while the model runs, survives a reconnect, and is renewed by the
  wrapper (a holder that crashed blocks others at most ``lease_ttl``).
* **Delete epochs** (``omem_threads``: an identity number per thread incarnation, never reused).
  ``save_unless_deleted`` locks the thread's epoch row ``FOR SHARE`` in the save's transaction; a
  delete removes that row first, then the records, so a save either commits before the delete
  (and the delete removes its record) or sees the row gone and saves nothing.

An unreachable database is a :class:`DatabaseUnavailableError` naming the host, port and
database (never the password); a server that refuses the connection (password, role, database)
is a :class:`DatabaseRefusedError`, not retried. Every write is one transaction, so nothing is
half-saved. Once
the server is back, a pool still waiting out its reconnect back-off (it served no call for a
whole ``timeout``; one test connection tells, shared by the calls that time out together) is
replaced by a fresh one, so the store's first call after an outage works; a
merely busy pool is never replaced, so a store holds at most ``max_size`` connections.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import threading
import warnings
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("omem_core.postgres needs psycopg 3 and psycopg-pool: "
                      "pip install 'omem[postgres]' (or: pip install 'psycopg[binary]' psycopg-pool)") from exc

# The pool logs every failed connection attempt ("error connecting in 'omem'…": ten in a few
# seconds of an outage); in an application that configured no logging, Python's last-resort
# handler printed them all to stderr, beside the DatabaseUnavailableError that already says it.
# A NullHandler stops only that fallback: configured logging still receives them.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())

from .memory import check_read, positive_seconds
from .messages import (Message, ObservationRecord, check_batch, check_message, check_thread_id, check_working_memory,
                       shown_id)
from .observations import ReflectionCache, already_saved, check_record

__all__ = ["DatabaseRefusedError", "DatabaseUnavailableError", "PostgresMemoryStore", "PostgresObservationStore", "schema_version"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# Long reflections' source lists are fetched once per process and cached (rows are immutable and
# identity numbers never reused); shorter ones come with every read.
_LONG = ReflectionCache.LONG  # sources of reflections this long are read apart (and cached)

_MIGRATIONS: list[str] = [
    # 1: everything the SQLite adapter reached in its three versions. Text that may hold any
    # Unicode (message content, record and working-memory text) is UTF-8 in bytea: PostgreSQL's
    # text cannot hold NUL, and the in-memory and SQLite stores accept it.
    """
    CREATE TABLE IF NOT EXISTS {s}omem_messages (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        thread_id text NOT NULL,
        id text NOT NULL,
        role text NOT NULL,
        content bytea NOT NULL,
        created_at text NOT NULL,
        created_us bigint NOT NULL,
        resource_id text,
        UNIQUE (thread_id, id)
    );
    CREATE INDEX IF NOT EXISTS omem_messages_order ON {s}omem_messages (thread_id, created_us, seq);
    CREATE TABLE IF NOT EXISTS {s}omem_working_memory (
        thread_id text PRIMARY KEY,
        text bytea NOT NULL
    );
    CREATE TABLE IF NOT EXISTS {s}omem_records (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id text NOT NULL UNIQUE,
        thread_id text NOT NULL,
        resource_id text,
        created_at text NOT NULL,
        kind text NOT NULL CHECK (kind IN ('observation', 'reflection')),
        source_ids text[] NOT NULL,
        n_sources integer NOT NULL,
        text bytea NOT NULL,
        uncovered bigint[]
    );
    CREATE INDEX IF NOT EXISTS omem_records_thread ON {s}omem_records (thread_id, seq);
    CREATE INDEX IF NOT EXISTS omem_records_kind ON {s}omem_records (thread_id, kind, seq);
    CREATE TABLE IF NOT EXISTS {s}omem_leases (
        thread_id text PRIMARY KEY,
        holder text NOT NULL,
        expires_at timestamptz NOT NULL
    );
    CREATE TABLE IF NOT EXISTS {s}omem_threads (
        epoch bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        thread_id text NOT NULL UNIQUE
    );
    """,
]


class DatabaseUnavailableError(ConnectionError):
    """The database could not be reached (or the connection broke during a call). The message
    names the host, port and database, never the password. The call's transaction did not
    commit, so nothing of it was saved (a break during the commit itself may have completed it;
    retrying is safe: saving an identical message or record again is a no-op)."""


class DatabaseRefusedError(Exception):
    """The server answered and refused the connection for a reason that retrying does not mend:
    wrong password, unknown role, a role that may not log in, a database that does not exist, no
    ``pg_hba.conf`` entry for this client. Not a ``ConnectionError`` (an application retrying on
    :class:`DatabaseUnavailableError` would retry a configuration error forever). The message
    names the host, port and database, never the password; nothing of the call was saved."""


# libpq's messages for a connection the server refused on purpose (psycopg gives no SQLSTATE for
# a failed connection, only libpq's text; a server configured for another language words them
# differently, and they stay DatabaseUnavailableError: retried, as before).
# (Not LDAP/PAM/RADIUS "authentication failed": an outage of that service reads the same.)
_REFUSALS = ("password authentication failed", "peer authentication failed", "ident authentication failed",
             "no pg_hba.conf entry", "is not permitted to log in", "permission denied for database",
             "does not exist")
# libpq's own, before the server is asked: configuration too
_CLIENT_REFUSALS = ("no password supplied", "ssl was required")
DOWN_WAIT_S = 0.2  # how long a call waits for the pool once the server was found unreachable


def _refused(exc: BaseException) -> bool:
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = getattr(exc, "sqlstate", None)
    if state is not None:  # (should psycopg give one for a failed connection)
        return state.startswith("28") or state == "3D000"
    text = " ".join(str(exc).split()).lower()
    if any(marker in text for marker in _CLIENT_REFUSALS):
        return True
    return "fatal" in text and any(marker in text for marker in _REFUSALS)  # FATAL: the server's refusal


def _micros(value: datetime) -> int:
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@contextlib.contextmanager
def _index_limit(what: Callable[[], str]) -> Iterator[None]:
    """PostgreSQL's btree index holds at most 2,704 bytes per entry (a thread id and a message id
    together, compressed): a longer one failed with psycopg's "index row size … exceeds btree
    version 4 maximum", naming neither the message nor the field. A ``ValueError`` naming them;
    nothing of the call is saved (its transaction is rolled back). SQLite and the in-memory stores
    have no such limit."""
    try:
        yield
    except psycopg.errors.ProgramLimitExceeded as exc:
        said = exc.diag.message_primary or str(exc).splitlines()[0]
        raise ValueError(f"{what()}: too long for PostgreSQL's index (an entry holds at most 2,704 bytes, "
                         f"the index's own overhead included: ids of a few hundred bytes are safe); use "
                         f"shorter ids, or a hash of them. Nothing was saved. ({said})") from None


def _longest(messages: Sequence[Message]) -> str:
    worst = max(messages, key=lambda m: len(m.thread_id.encode()) + len(m.id.encode()))
    return (f"message {shown_id(worst.id)} of thread {shown_id(worst.thread_id)}: its thread_id and id are "
            f"{len(worst.thread_id.encode()):,} + {len(worst.id.encode()):,} bytes")


def _no_nul(value: str | None, what: str, field: str) -> None:
    if value is not None and "\x00" in value:
        raise ValueError(f"{what}: {field} contains a NUL character, which PostgreSQL text cannot store")


def _unstorable(key: object) -> bool:
    """A key with a NUL, which no row can hold (saving it is refused): a read of it finds nothing
    and a delete of it deletes nothing, as for any unknown thread (psycopg raised ``DataError``)."""
    return isinstance(key, str) and "\x00" in key


def _describe(dsn: str) -> tuple[str, str | None]:
    """``host:port, database 'x'`` for messages, and the password (to scrub it from any error)."""
    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        raise ValueError("not a valid PostgreSQL connection string (libpq key=value or a postgresql:// URL); "
                         "it is not repeated here because it may hold a password") from None
    for given in str(params.get("port") or "").split(","):  # libpq takes one per host; empty: the default
        number = given.strip()
        if number and not (number.isascii() and number.isdigit() and 1 <= int(number) <= 65535):
            # (libpq would say so only when connecting, which retry logic reads as an outage.) The
            # value is not repeated: a password with an unencoded "/" or "@" is read as the port.
            raise ValueError("the connection string's port is not a port number (1-65535); in a "
                             "postgresql:// URL, a password holding / @ ? or # must be percent-encoded")
    host = params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST") or "localhost"
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    database = params.get("dbname") or os.environ.get("PGDATABASE") or params.get("user") or os.environ.get(
        "PGUSER") or "(default)"
    place = f"socket directory {host}, port {port}" if str(host).startswith("/") else f"{host}:{port}"
    password = params.get("password") or os.environ.get("PGPASSWORD")
    return f"{place}, database {database!r}", None if password is None else str(password)


def _quote(name: str) -> str:
    if not name or "\x00" in name:
        raise ValueError(f"schema must be a non-empty name without NUL, got {name!r}")
    return '"' + name.replace('"', '""') + '"'


def _connection_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is about the connection (unreachable, broken, server shutting down) rather
    than about the statement."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith(("08", "57P"))


class _Database:
    """One pool, on one event loop at a time (claimed under a thread lock, so two loops starting
    together cannot both open one), the schema migrated once per process, errors made clear."""

    def __init__(self, dsn: str, *, schema: str | None, min_size: int, max_size: int, timeout: float,
                 connect_timeout: float) -> None:
        if not isinstance(dsn, str):
            raise TypeError(f"dsn must be a str, got {type(dsn).__name__}")
        self.where, self._password = _describe(dsn)
        self._dsn = dsn
        self.schema = schema
        self.prefix = _quote(schema) + "." if schema is not None else ""
        if not (isinstance(min_size, int) and isinstance(max_size, int) and 0 <= min_size <= max_size and max_size >= 1):
            raise ValueError(f"need 0 <= min_size <= max_size and max_size >= 1, got {min_size}, {max_size}")
        self._sizes = (min_size, max_size)
        self._timeout = positive_seconds("timeout", timeout)  # (0 failed every call as "no pooled connection")
        connect_timeout = positive_seconds("connect_timeout", connect_timeout)
        self._connect: dict[str, Any] = {"autocommit": True}
        given = conninfo_to_dict(dsn)
        if "connect_timeout" not in given:
            self._connect["connect_timeout"] = max(1, int(connect_timeout))
        if not any(key.startswith("keepalives") for key in given):
            # A server host that vanishes (power, network) is noticed on an idle or waiting
            # connection after about a minute, not the OS default of hours. (A server process
            # that is frozen while its host answers TCP is not: see docs/storage.md.)
            self._connect.update(keepalives=1, keepalives_idle=30, keepalives_interval=10, keepalives_count=3)
        self._claim = threading.Lock()  # guards _loop, _pool and _closed against other threads
        self._pool: AsyncConnectionPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None
        self._migrated = False
        self._closed = False
        self._sentinel: asyncio.Task | None = None
        self._made: weakref.WeakSet | None = None  # the current pool's connections (to close what it leaves)
        self._lent: set[int] = set()  # id() of the connections this store's calls hold right now
        # Pools whose sentinel is cancelled on purpose (replaced, or the store closed); any other
        # cancellation of a sentinel is its loop ending (asyncio.run's end), and no pool is
        # opened on that loop again: one opened then (a lease given back late) was left pending.
        self._retired: set[int] = set()
        self._ending: weakref.WeakSet = weakref.WeakSet()
        self._in_use: dict[int, int] = {}  # id(pool) -> connections of that pool this store holds
        self._handouts = 0  # connections handed over to this store's calls, by any of its pools
        # The last test connection found the server unreachable (no answer from it), and no
        # connection was handed over since: a call waits for the pool briefly (DOWN_WAIT_S), not
        # its whole ``timeout``, before the shared test says why it gives none.
        self._down = False
        self._probes: dict[int, asyncio.Future] = {}  # id(pool) -> the test of why it gives no connection

    def q(self, text: str) -> str:
        return text.replace("{s}", self.prefix)

    def _reason(self, exc: BaseException) -> str:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if self._password:
            reason = reason.replace(self._password, "***")
        return reason

    def unavailable(self, exc: BaseException) -> DatabaseUnavailableError | DatabaseRefusedError:
        if _refused(exc):
            return DatabaseRefusedError(
                f"PostgreSQL at {self.where} refused the connection: {self._reason(exc)}; check the DSN's "
                "user, password and database and the server's pg_hba.conf (retrying will not help); "
                "nothing of this call was saved")
        return DatabaseUnavailableError(
            f"PostgreSQL at {self.where} is unreachable or the connection broke: {self._reason(exc)}; "
            "nothing of this call was saved (its transaction did not commit)")

    async def _direct(self) -> psycopg.AsyncConnection:
        try:
            return await psycopg.AsyncConnection.connect(self._dsn, **self._connect)
        except psycopg.OperationalError as exc:
            raise self.unavailable(exc) from None

    def _closed_error(self) -> RuntimeError:
        return RuntimeError(f"this store ({self.where}) is closed")

    def _enter(self, loop: asyncio.AbstractEventLoop) -> list[psycopg.AsyncConnection]:
        """Make ``loop`` the store's loop, or say why it cannot be: another loop that is not
        closed still owns the store (running in another thread, perhaps opening its pool right
        now; or stopped with the pool's connections on it). Returns the connections a closed
        loop's pool left open (a loop closed without ``asyncio.run``'s cancelling): to close."""
        with self._claim:
            if self._closed:
                raise self._closed_error()
            old = self._loop
            if old is loop:
                return []
            if old is not None and not old.is_closed():
                if old.is_running():
                    raise RuntimeError(
                        f"this store ({self.where}) is in use by an event loop running in another thread; a "
                        "store serves one event loop at a time (make one store per thread, or close it there first)")
                if self._pool is not None and not self._pool.closed:
                    raise RuntimeError(
                        f"this store ({self.where}) holds its connections on an event loop that is stopped but "
                        "not closed; a store serves one event loop at a time: close the store on that loop "
                        "(loop.run_until_complete(store.close())), or close that loop first")
            # No loop yet, or the old one is closed (asyncio.run closed the pool at its end, or
            # the loop was closed with the pool open: its connections are closed here).
            left = _left_open(self._made)
            self._opening, self._loop, self._pool, self._sentinel = asyncio.Lock(), loop, None, None
            self._probes, self._made = {}, None
            return left

    async def pool(self) -> AsyncConnectionPool:
        loop = asyncio.get_running_loop()
        pool = self._pool
        if pool is not None and self._loop is loop and not pool.closed:
            return pool
        if loop in self._ending:
            raise RuntimeError(f"this store ({self.where}) opens no connection on an event loop that is ending "
                               "(asyncio.run is finishing: its pool was closed)")
        await _close_all(self._enter(loop))
        assert self._opening is not None
        async with self._opening:
            if self._closed:  # closed while this call waited for the lock
                raise self._closed_error()
            if self._pool is not None and self._pool.closed:  # closed by someone else (its sentinel cancelled)
                self._pool, self._sentinel = None, None
            if self._pool is None:
                if not self._migrated:
                    con = await self._direct()  # a clear error now if the database is unreachable
                    try:
                        await migrate(con, self.schema)
                    except psycopg.OperationalError as exc:  # the connection broke during the migration
                        if _connection_failure(exc):
                            raise self.unavailable(exc) from None
                        raise
                    finally:
                        with contextlib.suppress(Exception):
                            await con.close()
                    self._migrated = True
                if self._closed:
                    raise self._closed_error()
                min_size, max_size = self._sizes
                made: weakref.WeakSet = weakref.WeakSet()

                async def remember(con: psycopg.AsyncConnection) -> None:
                    made.add(con)

                pool = AsyncConnectionPool(self._dsn, min_size=min_size, max_size=max_size, open=False,
                                           kwargs=self._connect, timeout=self._timeout,
                                           check=self._check, configure=remember, name="omem")
                try:
                    await pool.open(wait=True, timeout=self._connect.get("connect_timeout", 10) + 5)
                except BaseException as exc:  # a timeout, or this call cancelled: never leave it open
                    closing = loop.create_task(pool.close(timeout=1.0))
                    with contextlib.suppress(BaseException):
                        await asyncio.shield(closing)
                    if isinstance(exc, PoolTimeout):
                        raise self.unavailable(exc) from None
                    raise
                with self._claim:  # close() from another thread either sees this pool or is seen here
                    keep = not self._closed and self._loop is loop
                    if keep:
                        self._pool, self._made = pool, made
                        self._sentinel = loop.create_task(
                            _close_when_cancelled(pool, made, self._lent, self._retired, self._ending),
                            name="omem: close the pool at loop end")
                if not keep:  # close() ran while this pool was opening: never leave it open
                    await pool.close()
                    if self._closed:
                        raise self._closed_error()
                    raise RuntimeError(f"this store ({self.where}) was taken over by another event loop while "
                                       "this one (stopped meanwhile) opened its pool; a store serves one event "
                                       "loop at a time")
            pool = self._pool
        if pool is None:  # closed from another thread just now
            raise self._closed_error()
        return pool

    async def _check(self, con: psycopg.AsyncConnection) -> None:
        """The pool's check of a connection it is handing over, counted once it passed: a pool
        that hands connections over is busy, not stalled (a broken one it discards is neither)."""
        await AsyncConnectionPool.check_connection(con)
        self._handouts += 1
        self._down = False

    def _busy_error(self) -> DatabaseUnavailableError:
        return DatabaseUnavailableError(
            f"PostgreSQL at {self.where}: no pooled connection within {self._timeout:g} s "
            f"(pool max_size {self._sizes[1]}); nothing of this call was saved")

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        replaced = False  # a stalled pool was replaced for this call (once at most)
        moves = 0  # pools closed under this call while it waited (replaced for other calls)
        while True:
            pool = await self.pool()
            entered = False
            served = self._handouts
            # After the server was found unreachable (and nothing served since), the pool is asked
            # briefly: an idle connection it holds still serves at once, and an outage no longer
            # costs every call the whole timeout before the test below says so.
            wait = min(self._timeout, DOWN_WAIT_S) if self._down else None
            try:
                try:
                    async with pool.connection(timeout=wait) as con:
                        entered = True
                        self._in_use[id(pool)] = self._in_use.get(id(pool), 0) + 1
                        self._lent.add(id(con))
                        yield con
                finally:
                    if entered:  # counted until the connection is back in its pool
                        self._lent.discard(id(con))
                        self._in_use[id(pool)] -= 1
                        if not self._in_use[id(pool)]:
                            del self._in_use[id(pool)]
                return
            except PoolClosed as exc:
                if self._closed:
                    raise self._closed_error() from None
                if entered or moves >= 3:
                    raise self.unavailable(exc) from None
                moves += 1  # the pool was replaced while this call waited on it
            except (PoolTimeout, psycopg.OperationalError) as exc:
                if not _connection_failure(exc):
                    raise
                if entered or not isinstance(exc, PoolTimeout):
                    raise self.unavailable(exc) from None
                if self._closed:
                    raise self._closed_error() from None
                if self._pool is not pool and moves < 3:  # replaced while this call waited
                    moves += 1
                    continue
                # Busy or stalled? A pool that handed any call a connection while this one waited,
                # or whose every connection this store holds, is busy: say so, without dialling
                # the server (under load that would add clients beyond the pool).
                if replaced or self._handouts != served or self._in_use.get(id(pool), 0) >= self._sizes[1]:
                    raise self._busy_error() from None
                verdict = await self._probe(pool)
                if isinstance(verdict, BaseException):
                    raise self.unavailable(verdict) from None
                if verdict != "replaced":
                    raise self._busy_error() from None
                replaced = True

    async def _probe(self, pool: AsyncConnectionPool) -> BaseException | str:
        """Why does ``pool`` give no connection? One test connection per pool, however many calls
        ask at once (they share its verdict): the server's error if it is unreachable; ``"busy"``
        if the pool handed a connection over meanwhile; else the server answers while the pool
        waits out the reconnect back-off it grew while the server was away (up to a minute after a
        minute's outage), and it is ``"replaced"`` by a fresh pool that connects now."""
        key = id(pool)
        task = self._probes.get(key)
        if task is None:
            task = asyncio.ensure_future(self._test_and_replace(pool))
            self._probes[key] = task

            def forget(done: asyncio.Future) -> None:
                if self._probes.get(key) is done:
                    del self._probes[key]
                if not done.cancelled():
                    done.exception()  # retrieved, even when every asker was cancelled

            task.add_done_callback(forget)
        return await asyncio.shield(task)

    async def _test_and_replace(self, pool: AsyncConnectionPool) -> BaseException | str:
        before = self._handouts
        try:
            direct = await psycopg.AsyncConnection.connect(self._dsn, **self._connect)
        except psycopg.OperationalError as failure:
            # (a server that answered — full, refusing — is not down: its pool may still serve)
            self._down = "fatal" not in str(failure).lower()
            return failure
        self._down = False
        await direct.close()
        if self._handouts != before or self._in_use.get(id(pool), 0):
            return "busy"  # it handed a connection over during the test (a late one, not a stalled one)
        await self._replace(pool)
        return "replaced"

    async def _replace(self, stalled: AsyncConnectionPool) -> None:
        """Drop ``stalled`` (the next call opens a new pool) and close it in the background: its
        waiting calls see ``PoolClosed`` and move to the new one; its leased connections are
        closed when given back."""
        assert self._opening is not None
        async with self._opening:
            if self._pool is stalled:
                self._pool = None
                sentinel, self._sentinel = self._sentinel, None
                if sentinel is not None:
                    self._retired.add(id(stalled))
                    sentinel.cancel()  # closes the stalled pool

    async def close(self) -> None:
        with self._claim:
            self._closed = True
            pool, self._pool = self._pool, None
            sentinel, self._sentinel = self._sentinel, None
            loop, made = self._loop, self._made
        if pool is None or loop is None:
            return
        self._retired.add(id(pool))
        if loop is asyncio.get_running_loop():
            await _close_pool(pool, sentinel)
            return
        if loop.is_closed():  # asyncio.run closed the pool at its end; a loop merely closed did not
            await _close_all(_left_open(made))
            return
        # The pool lives on a loop in another thread: it can only be closed there.
        try:
            future = asyncio.run_coroutine_threadsafe(_close_pool(pool, sentinel), loop)
        except RuntimeError:  # that loop closed just now (asyncio.run closed the pool at its end)
            return
        if loop.is_running():
            wait = max(1.0, self._timeout)
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), wait)
                return
            except asyncio.TimeoutError:
                why = f"did not run it within {wait:g} s"
        else:
            why = "is stopped"
        warnings.warn(
            f"closing this store ({self.where}): the event loop its pool lives on (in another thread) {why}; "
            "the pool's connections close when that loop runs again (the store itself is closed now)",
            RuntimeWarning, stacklevel=3)


async def _close_pool(pool: AsyncConnectionPool, sentinel: asyncio.Task | None) -> None:
    if sentinel is not None:
        sentinel.cancel()
        with contextlib.suppress(BaseException):
            await sentinel  # closes the pool
    with contextlib.suppress(Exception):
        await pool.close()


def _left_open(made: weakref.WeakSet | None) -> list[psycopg.AsyncConnection]:
    return [con for con in list(made or ()) if not con.closed]


async def _close_all(connections: Any) -> None:
    """Close each connection still open; no round trip to the server (it only closes the socket)."""
    for con in connections:
        if not con.closed:
            with contextlib.suppress(Exception):
                await con.close()


DRAIN_S = 2.0  # seconds a pool ending with its loop waits for the calls that hold its connections


async def _close_when_cancelled(pool: AsyncConnectionPool, made: weakref.WeakSet, lent: set[int],
                                retired: set[int], ending: weakref.WeakSet) -> None:
    """Live as long as the event loop and close ``pool`` when cancelled: ``asyncio.run`` cancels
    every task at its end, and psycopg-pool's connection attempts swallow that cancellation and
    reschedule themselves, so a pool left open by its owner would keep the loop (and the
    process) from ever finishing.

    At the end of ``asyncio.run`` the pool's worker tasks are cancelled together with this one, and
    psycopg-pool's ``close()`` then stops on their cancellation before it closes the idle
    connections (they stayed open on the server): whichever of the pool's connections is still
    open afterwards, and not held by a call (the pool closes those when they are given back), is
    closed here, with no round trip to the server, so this never waits on it.

    Cancelled by the loop's end (not replaced, nor closed by its store), it first lets the other
    cancelled tasks wind down for up to :data:`DRAIN_S` while they hold connections (a pass giving
    its lease back), and marks the loop as ending: the store opens no new pool on it (one opened
    then was left pending, its tasks "destroyed but pending" and a page of errors at exit)."""
    try:
        await asyncio.Event().wait()
    finally:
        loop = asyncio.get_running_loop()
        if id(pool) in retired:
            retired.discard(id(pool))
        else:
            ending.add(loop)
            deadline = loop.time() + DRAIN_S
            with contextlib.suppress(BaseException):
                for _ in range(5):  # (the other cancelled tasks start their clean-up)
                    await asyncio.sleep(0)
                while lent and loop.time() < deadline:
                    await asyncio.sleep(0.01)
        held = _left_open(made)  # strong references: psycopg-pool's close() may drop its own midway
        with contextlib.suppress(BaseException):
            await pool.close(timeout=1.0)
        await _close_all(con for con in held if id(con) not in lent)


async def _shielded(coro: Any) -> Any:
    """Run ``coro`` in its own task; a cancellation of the caller is raised to it at once (the
    task finishes on its own)."""
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # never "exception never retrieved"
        raise


async def migrate(con: psycopg.AsyncConnection, schema: str | None = None) -> int:
    """Bring the schema to the newest version (idempotent; concurrent callers wait on an advisory
    lock and find it done). Returns the version."""
    prefix = _quote(schema) + "." if schema is not None else ""
    # Read first, with no DDL: a schema already current needs no CREATE privilege (an application
    # role granted only USAGE and SELECT/INSERT/UPDATE/DELETE, after an owner migrated, works).
    found = await (await con.execute("SELECT to_regclass(%s)", (f"{prefix}omem_schema",))).fetchone()
    if found is not None and found[0] is not None:
        row = await (await con.execute(f"SELECT max(version) FROM {prefix}omem_schema")).fetchone()
        current = int(row[0]) if row and row[0] is not None else 0
        if current > len(_MIGRATIONS):
            raise ValueError(f"the omem schema{'' if schema is None else ' ' + repr(schema)} is version {current}, "
                             f"written by a newer omem (this one knows versions up to {len(_MIGRATIONS)}): "
                             "upgrade omem to use it; nothing was changed")
        if current == len(_MIGRATIONS):
            return current
    async with con.transaction():
        await con.execute("SELECT pg_advisory_xact_lock(hashtext('omem:migrate:' || coalesce(%s, current_schema())))",
                          (schema,))
        if schema is not None:
            await con.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote(schema)}")
        await con.execute(f"CREATE TABLE IF NOT EXISTS {prefix}omem_schema (version integer NOT NULL)")
        row = await (await con.execute(f"SELECT max(version) FROM {prefix}omem_schema")).fetchone()
        version = int(row[0]) if row and row[0] is not None else 0
        for number, script in enumerate(_MIGRATIONS, start=1):
            if number <= version:
                continue
            await con.execute(script.replace("{s}", prefix))
            await con.execute(f"DELETE FROM {prefix}omem_schema")
            await con.execute(f"INSERT INTO {prefix}omem_schema VALUES (%s)", (number,))
            version = number
    return version


async def schema_version(dsn: str, *, schema: str | None = None) -> int:
    """The schema version found in the database (0: never migrated)."""
    where, _ = _describe(dsn)
    try:
        con = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split())
        if _refused(exc):
            raise DatabaseRefusedError(f"PostgreSQL at {where} refused the connection: {reason}") from None
        raise DatabaseUnavailableError(f"PostgreSQL at {where} is unreachable: {reason}") from None
    try:
        prefix = _quote(schema) + "." if schema is not None else ""
        found = await (await con.execute("SELECT to_regclass(%s)", (f"{prefix}omem_schema",))).fetchone()
        if found is None or found[0] is None:
            return 0
        row = await (await con.execute(f"SELECT max(version) FROM {prefix}omem_schema")).fetchone()
        return int(row[0]) if row and row[0] is not None else 0
    finally:
        await con.close()


_CLOSING: set[asyncio.Task] = set()  # pools of stores dropped unclosed, closing (a task needs a reference)


def _dropped(db: _Database, name: str) -> None:
    """A store garbage-collected without ``close()``: close its pool on its loop if that still
    runs (else ``asyncio.run``'s end closed it, or ``close()`` from elsewhere was needed and that
    loop is gone), with a ``ResourceWarning``, as Python does for a file left open. Left alone,
    the pool and its tasks were collected with the store while pending: "Task was destroyed but
    it is pending" for each, and its connections were dropped without a goodbye to the server."""
    with db._claim:
        pool, loop = db._pool, db._loop
    if pool is None or pool.closed or loop is None or loop.is_closed():
        return
    when = "now" if loop.is_running() else "when its event loop runs again (it is stopped)"
    warnings.warn(f"{name} was not closed: its connection pool is closed {when} (close the store, or use "
                  "`async with`, when done with it)", ResourceWarning)

    def start() -> None:
        task = loop.create_task(db.close(), name="omem: close a store dropped unclosed")
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)

    with contextlib.suppress(RuntimeError):  # (that loop closed meanwhile: its end closed the pool)
        loop.call_soon_threadsafe(start)


class _Store:
    def __init__(self, dsn: str, *, schema: str | None = None, min_size: int = 1, max_size: int = 10,
                 timeout: float = 10.0, connect_timeout: float = 10.0) -> None:
        self._db = _Database(dsn, schema=schema, min_size=min_size, max_size=max_size, timeout=timeout,
                             connect_timeout=connect_timeout)
        self._finalizer = weakref.finalize(self, _dropped, self._db, repr(self))

    def __repr__(self) -> str:  # never the DSN: it may hold a password
        schema = f", schema {self._db.schema!r}" if self._db.schema is not None else ""
        return f"{type(self).__name__}({self._db.where}{schema})"

    async def close(self) -> None:
        """Close the connection pool (the store cannot be used afterwards)."""
        self._finalizer.detach()
        await self._db.close()

    async def __aenter__(self):  # noqa: ANN204
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class PostgresMemoryStore(_Store):
    """A ``MemoryStore`` in PostgreSQL, with the working-memory capability.

    Ordered by ``created_at`` then insertion, like ``InMemoryMemoryStore``; re-saving an identical
    message is a no-op, a different one with the same id a ``ValueError``; a batch is saved whole
    or not at all (one transaction).

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL.
        schema: tables go in this schema (created if missing); default: the connection's
            ``search_path`` (usually ``public``).
        min_size, max_size: the connection pool's bounds.
        timeout: seconds a call waits for a pooled connection.
        connect_timeout: seconds to establish a connection (unless the DSN sets it).
    """

    _COLUMNS = "id, role, content, created_at, resource_id"

    async def save_messages(self, messages: Sequence[Message]) -> None:
        fresh: dict[tuple[str, str], Message] = {}
        messages = check_batch(messages)
        for message in messages:
            check_message(message)  # the whole batch first, the same checks as the other stores
            what = f"message {message.id!r}"
            for name in ("id", "thread_id", "role", "resource_id"):
                _no_nul(getattr(message, name), what, name)
            key = (message.thread_id, message.id)
            earlier = fresh.get(key)
            if earlier is not None:
                if earlier != message:
                    raise self._immutable(message)
                continue
            fresh[key] = message
        if not fresh:
            return
        db = self._db
        threads, ids = [k[0] for k in fresh], [k[1] for k in fresh]
        async with db.connection() as con, con.transaction():
            stored = await self._stored(con, threads, ids)
            for key, message in fresh.items():
                if key in stored and stored[key] != message:
                    raise self._immutable(message)
            new = [m for key, m in fresh.items() if key not in stored]
            if not new:
                return
            with _index_limit(lambda: _longest(new)):
                cursor = await self._insert(con, new)
            inserted = {(t, i) for t, i in await cursor.fetchall()}
            raced = [m for m in new if (m.thread_id, m.id) not in inserted]
            if raced:  # saved meanwhile by another process: identical, or a conflict
                again = await self._stored(con, [m.thread_id for m in raced], [m.id for m in raced])
                for message in raced:
                    if again.get((message.thread_id, message.id)) != message:
                        raise self._immutable(message)

    async def _insert(self, con: psycopg.AsyncConnection, new: Sequence[Message]) -> psycopg.AsyncCursor:
        db = self._db
        return await con.execute(db.q(
                "INSERT INTO {s}omem_messages (thread_id, id, role, content, created_at, created_us, resource_id) "
                "SELECT t, i, r, c, a, u, x FROM unnest(%s::text[], %s::text[], %s::text[], %s::bytea[], %s::text[], "
                "%s::bigint[], %s::text[]) WITH ORDINALITY AS b(t, i, r, c, a, u, x, n) ORDER BY n "
                "ON CONFLICT (thread_id, id) DO NOTHING RETURNING thread_id, id"),
                ([m.thread_id for m in new], [m.id for m in new], [m.role for m in new],
                 [m.content.encode() for m in new], [m.created_at.isoformat() for m in new],
                 [_micros(m.created_at) for m in new], [m.resource_id for m in new]))

    @staticmethod
    def _immutable(message: Message) -> ValueError:
        return ValueError(f"message {message.id!r} is already saved in thread {message.thread_id!r} "
                          "with other fields; messages are immutable")

    async def _stored(self, con: psycopg.AsyncConnection, threads: list[str],
                      ids: list[str]) -> dict[tuple[str, str], Message]:
        cursor = await con.execute(self._db.q(
            f"SELECT thread_id, {self._COLUMNS} FROM {{s}}omem_messages "
            "WHERE (thread_id, id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"), (threads, ids))
        return {(row[0], row[1]): self._message(*row) for row in await cursor.fetchall()}

    @staticmethod
    def _message(thread_id: str, message_id: str, role: str, content: bytes, created_at: str,
                 resource_id: str | None) -> Message:
        return Message(id=message_id, thread_id=thread_id, role=role, content=bytes(content).decode(),
                       created_at=datetime.fromisoformat(created_at), resource_id=resource_id)

    async def recall(self, thread_id: str, *, last: int, before: str | None = None) -> list[Message]:
        last = check_read(thread_id, last, before)  # (a plain int: a NumPy one is one for SQL too)
        if _unstorable(before):
            raise KeyError(f"unknown cursor: no message {before!r} in thread {thread_id!r}")
        if _unstorable(thread_id):
            return []
        db = self._db
        async with db.connection() as con:
            if before is None:
                cursor = await con.execute(db.q(
                    f"SELECT {self._COLUMNS} FROM {{s}}omem_messages WHERE thread_id = %s "
                    "ORDER BY created_us DESC, seq DESC LIMIT %s"), (thread_id, last))
                rows = await cursor.fetchall()
            else:  # one statement: no row at all when the cursor is unknown
                cursor = await con.execute(db.q(
                    f"SELECT m.* FROM (SELECT created_us, seq FROM {{s}}omem_messages "
                    "WHERE thread_id = %(t)s AND id = %(b)s) AS c LEFT JOIN LATERAL ("
                    f"SELECT {self._COLUMNS}, created_us, seq FROM {{s}}omem_messages WHERE thread_id = %(t)s "
                    "AND (created_us, seq) < (c.created_us, c.seq) ORDER BY created_us DESC, seq DESC LIMIT %(n)s"
                    ") AS m ON true"), {"t": thread_id, "b": before, "n": last})
                found = await cursor.fetchall()
                if not found:
                    raise KeyError(f"unknown cursor: no message {before!r} in thread {thread_id!r}")
                rows = [row[:5] for row in found if row[0] is not None]
        return [self._message(thread_id, *row) for row in reversed(rows)]

    async def delete_thread(self, thread_id: str) -> None:
        check_thread_id(thread_id, "delete_thread")
        if _unstorable(thread_id):
            return
        db = self._db
        async with db.connection() as con, con.transaction():
            await con.execute(db.q("DELETE FROM {s}omem_messages WHERE thread_id = %s"), (thread_id,))
            await con.execute(db.q("DELETE FROM {s}omem_working_memory WHERE thread_id = %s"), (thread_id,))

    async def get_working_memory(self, thread_id: str) -> str | None:
        check_thread_id(thread_id, "get_working_memory")
        if _unstorable(thread_id):
            return None
        async with self._db.connection() as con:
            cursor = await con.execute(self._db.q("SELECT text FROM {s}omem_working_memory WHERE thread_id = %s"),
                                       (thread_id,))
            row = await cursor.fetchone()
        return bytes(row[0]).decode() if row else None

    async def update_working_memory(self, thread_id: str, text: str) -> None:
        check_working_memory(thread_id, text)
        _no_nul(thread_id, "working memory", "thread_id")
        size = len(thread_id.encode())
        async with self._db.connection() as con:
            with _index_limit(lambda: f"working memory of thread {shown_id(thread_id)} ({size:,} bytes)"):
                await con.execute(self._db.q(
                    "INSERT INTO {s}omem_working_memory VALUES (%s, %s) "
                    "ON CONFLICT (thread_id) DO UPDATE SET text = excluded.text"), (thread_id, text.encode()))


class PostgresObservationStore(_Store):
    """An ``ObservationStore`` in PostgreSQL with the ``list_recent``, lease and delete-epoch
    capabilities (see the module's docstring), so that wrappers on many hosts sharing the
    database run each thread's pass once and never undo each other's deletes.

    Takes the arguments of :class:`PostgresMemoryStore`, and ``cache_ids``: a bound on the decoded
    long reflections kept in memory (counted in source ids), so a read never re-fetches a
    reflection's whole source list. Rows are immutable and their ``seq`` never reused, so the
    cache is valid across processes and hosts.
    """

    def __init__(self, dsn: str, *, cache_ids: int = 500_000, **kwargs: Any) -> None:
        super().__init__(dsn, **kwargs)
        self._cache = ReflectionCache(cache_ids)

    _COLUMNS = "id, thread_id, resource_id, created_at, kind, source_ids, text"
    _LIGHT = (f"seq, id, thread_id, resource_id, created_at, kind, "
              f"CASE WHEN kind = 'reflection' AND n_sources >= {_LONG} THEN NULL ELSE source_ids END, text")

    async def _records(self, con: psycopg.AsyncConnection,
                       rows: builtins.list[tuple]) -> builtins.list[ObservationRecord] | None:
        """Records from ``_LIGHT`` rows (long reflections' sources from the cache or fetched once);
        ``None`` when one of them was deleted meanwhile (the caller reads again)."""
        # The cached ones taken now: keeping a record below may evict another this read counted on
        # (two long reflections over the cache's size raised KeyError in list()).
        held = {row[0]: self._cache.get(row[0]) for row in rows if row[6] is None}
        missing = [seq for seq, record in held.items() if record is None]
        fetched: dict[int, builtins.list[str]] = {}
        if missing:
            cursor = await con.execute(self._db.q("SELECT seq, source_ids FROM {s}omem_records WHERE seq = ANY(%s)"),
                                       (missing,))
            fetched = dict(await cursor.fetchall())
            if len(fetched) != len(missing):
                return None
        records = []
        for seq, record_id, thread_id, resource_id, created_at, kind, source_ids, text in rows:
            if source_ids is None:
                cached = held[seq]
                if cached is not None:
                    records.append(cached)
                    continue
                source_ids = fetched[seq]
            record = ObservationRecord(id=record_id, thread_id=thread_id, resource_id=resource_id,
                                       created_at=datetime.fromisoformat(created_at), kind=kind,
                                       source_ids=tuple(source_ids), text=bytes(text).decode())
            self._cache.keep(seq, record)
            records.append(record)
        return records

    async def list(self, thread_id: str) -> list[ObservationRecord]:
        check_thread_id(thread_id, "list")
        if _unstorable(thread_id):
            return []
        async with self._db.connection() as con:
            while True:
                cursor = await con.execute(self._db.q(
                    f"SELECT {self._LIGHT} FROM {{s}}omem_records WHERE thread_id = %s ORDER BY seq"), (thread_id,))
                records = await self._records(con, await cursor.fetchall())
                if records is not None:
                    return records

    async def list_recent(self, thread_id: str) -> builtins.list[ObservationRecord]:
        check_thread_id(thread_id, "list_recent")
        if _unstorable(thread_id):
            return []
        # One statement (one snapshot), index lookups only: the newest reflection, the newest
        # observation, the observations the reflection left uncovered, and the suffix.
        query = self._db.q(f"""
            WITH r AS (SELECT seq, uncovered FROM {{s}}omem_records
                       WHERE thread_id = %(t)s AND kind = 'reflection' ORDER BY seq DESC LIMIT 1),
                 o AS (SELECT max(seq) AS seq FROM {{s}}omem_records WHERE thread_id = %(t)s AND kind = 'observation'),
                 s AS (SELECT CASE WHEN EXISTS (SELECT 1 FROM r)
                              THEN least((SELECT seq FROM r), (SELECT seq FROM o)) ELSE 0 END AS start)
            SELECT {self._LIGHT} FROM {{s}}omem_records
            WHERE seq = ANY(coalesce((SELECT uncovered FROM r), '{{}}')) AND seq < (SELECT start FROM s)
            UNION ALL
            SELECT {self._LIGHT} FROM {{s}}omem_records WHERE thread_id = %(t)s AND seq >= (SELECT start FROM s)
            ORDER BY seq""")
        async with self._db.connection() as con:
            while True:
                cursor = await con.execute(query, {"t": thread_id})
                records = await self._records(con, await cursor.fetchall())
                if records is not None:
                    return records

    async def save(self, record: ObservationRecord) -> None:
        await self.save_unless_deleted(record, None)

    async def save_unless_deleted(self, record: ObservationRecord, epoch: int | None) -> bool:
        """Save ``record`` if its thread is still in incarnation ``epoch`` (``None``: always), in
        one transaction with that check (the epoch row locked ``FOR SHARE``, so a delete waits for
        this save and then removes its record, or this save sees the row gone); ``False`` when the
        thread was deleted meanwhile."""
        check_record(record)
        what = f"record {record.id!r}"
        for name in ("id", "thread_id", "resource_id"):
            _no_nul(getattr(record, name), what, name)
        for source in record.source_ids:
            _no_nul(source, what, "source_ids")
        db = self._db
        async with db.connection() as con, con.transaction():
            if epoch is not None:
                cursor = await con.execute(db.q("SELECT epoch FROM {s}omem_threads WHERE thread_id = %s FOR SHARE"),
                                           (record.thread_id,))
                row = await cursor.fetchone()
                if row is None or row[0] != epoch:
                    return False
            existing = await self._existing(con, record.id)
            if existing is not None:
                already_saved(existing, record)  # a no-op, or ValueError
                return True
            uncovered = None
            if record.kind == "reflection":
                cursor = await con.execute(db.q(
                    "SELECT coalesce(array_agg(seq ORDER BY seq), '{}') FROM {s}omem_records "
                    "WHERE thread_id = %s AND kind = 'observation' AND NOT (id = ANY(%s))"),
                    (record.thread_id, list(record.source_ids)))
                uncovered = (await cursor.fetchone())[0]  # type: ignore[index]
            with _index_limit(lambda: f"{record.kind} {shown_id(record.id)} ({len(record.id.encode()):,} bytes) of "
                              f"thread {shown_id(record.thread_id)} ({len(record.thread_id.encode()):,} bytes)"):
                cursor = await con.execute(db.q(
                    f"INSERT INTO {{s}}omem_records ({self._COLUMNS}, n_sources, uncovered) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING RETURNING seq"),
                    (record.id, record.thread_id, record.resource_id, record.created_at.isoformat(), record.kind,
                     list(record.source_ids), record.text.encode(), len(record.source_ids), uncovered))
            if await cursor.fetchone() is None:  # saved meanwhile by another process
                existing = await self._existing(con, record.id)
                assert existing is not None
                already_saved(existing, record)
            return True

    async def _existing(self, con: psycopg.AsyncConnection, record_id: str) -> ObservationRecord | None:
        cursor = await con.execute(self._db.q(f"SELECT {self._COLUMNS} FROM {{s}}omem_records WHERE id = %s"),
                                   (record_id,))
        row = await cursor.fetchone()
        if row is None:
            return None
        record_id, thread_id, resource_id, created_at, kind, source_ids, text = row
        return ObservationRecord(id=record_id, thread_id=thread_id, resource_id=resource_id,
                                 created_at=datetime.fromisoformat(created_at), kind=kind,
                                 source_ids=tuple(source_ids), text=bytes(text).decode())

    async def delete_by_thread(self, thread_id: str) -> None:
        """End the thread's incarnation (its epoch row first: a save holding it ``FOR SHARE``
        commits before this goes on), then drop its records, in one transaction. Nothing about
        the thread is kept."""
        check_thread_id(thread_id, "delete_by_thread")
        if _unstorable(thread_id):
            return
        db = self._db
        async with db.connection() as con, con.transaction():
            await con.execute(db.q("DELETE FROM {s}omem_threads WHERE thread_id = %s"), (thread_id,))
            await con.execute(db.q("DELETE FROM {s}omem_records WHERE thread_id = %s"), (thread_id,))
            # Leases a crashed process left (they name their thread): expired, so no one's.
            await con.execute(db.q("DELETE FROM {s}omem_leases WHERE expires_at <= clock_timestamp()"))
        self._cache.forget_thread(thread_id)

    async def delete_epoch(self, thread_id: str) -> int:
        check_thread_id(thread_id, "delete_epoch")
        _no_nul(thread_id, "delete epoch", "thread_id")
        query = self._db.q(
            "WITH made AS (INSERT INTO {s}omem_threads (thread_id) SELECT %(t)s WHERE NOT EXISTS "
            "(SELECT 1 FROM {s}omem_threads WHERE thread_id = %(t)s) ON CONFLICT (thread_id) DO NOTHING "
            "RETURNING epoch) "
            "SELECT epoch FROM made UNION ALL SELECT epoch FROM {s}omem_threads WHERE thread_id = %(t)s")
        async with self._db.connection() as con:
            while True:  # empty only when another process created it concurrently: read it next time
                with _index_limit(lambda: f"thread {shown_id(thread_id)} ({len(thread_id.encode()):,} bytes), its records"):
                    row = await (await con.execute(query, {"t": thread_id})).fetchone()
                if row is not None:
                    return int(row[0])

    # -- the lease capability: one pass per thread across hosts ----------------------------------

    async def try_lease(self, thread_id: str, holder: str, ttl: float) -> bool:
        """Take (or renew) the thread's lease for ``ttl`` seconds unless another holder's lease
        is live. One atomic statement; the expiry is on the database server's clock.

        The wrapper cancels its renewer while a renewal may be in flight: the statement runs in
        a task of its own, so the cancellation reaches the caller at once and the pooled
        connection is returned cleanly (cancelling inside psycopg-pool's checkout can be lost)."""
        check_thread_id(thread_id, "try_lease")
        if "\x00" in thread_id:  # (a save takes its thread's lease first: named by the thread, not "lease")
            from .wrapper import leased_thread

            _no_nul(thread_id, f"thread {shown_id(leased_thread(thread_id))}", "thread_id")
        return await _shielded(self._try_lease(thread_id, holder, ttl))

    async def _try_lease(self, thread_id: str, holder: str, ttl: float) -> bool:
        def what() -> str:  # (a save takes its thread's lease first: named by the thread)
            from .wrapper import leased_thread

            thread = leased_thread(thread_id)
            return f"thread {shown_id(thread)}: its id is {len(thread.encode()):,} bytes"

        async with self._db.connection() as con:
            with _index_limit(what):
                cursor = await con.execute(self._db.q(
                    "INSERT INTO {s}omem_leases AS l VALUES (%s, %s, clock_timestamp() + make_interval(secs => %s)) "
                    "ON CONFLICT (thread_id) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at "
                    "WHERE l.holder = excluded.holder OR l.expires_at <= clock_timestamp() RETURNING 1"),
                    (thread_id, holder, float(ttl)))
            return await cursor.fetchone() is not None

    async def release_lease(self, thread_id: str, holder: str) -> None:
        check_thread_id(thread_id, "release_lease")
        if _unstorable(thread_id):
            return  # (never taken: taking it is refused)
        await _shielded(self._release_lease(thread_id, holder))

    async def _release_lease(self, thread_id: str, holder: str) -> None:
        async with self._db.connection() as con:
            await con.execute(self._db.q("DELETE FROM {s}omem_leases WHERE thread_id = %s AND holder = %s"),
                              (thread_id, holder))
