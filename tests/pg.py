"""A throwaway PostgreSQL cluster for the tests: Debian's binaries (``initdb`` + ``pg_ctl``) in a
temporary directory, listening on a free port of 127.0.0.1 (and a socket in that directory),
stopped and removed at the end of the session. Without the binaries or psycopg, the tests that
need it are skipped with the reason; nothing is mocked.

Each test gets its own schema (``pg`` fixture), so tests pass in any order; ``pg.fresh()`` gives
another empty schema within a test (as a new SQLite file would).

Also runnable on its own, to get a server for the benches or by hand::

    python tests/pg.py            # prints a DSN, keeps the server until Enter
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


def binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl`` (PATH first, then Debian's layout)."""
    candidates = [shutil.which("pg_ctl")] + sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    for candidate in candidates:
        if candidate:
            folder = Path(os.path.realpath(candidate)).parent
            if (folder / "initdb").exists() and (folder / "postgres").exists():
                return folder
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    bindir: Path
    folder: Path
    port: int = 0

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [str(self.bindir / command[0]), *command[1:]]
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=120)

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        data = self.folder / "data"
        self._run("initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C",
                  "--no-sync")
        error = ""
        for _ in range(5):  # a free port can be taken between the check and the start: try another
            self.port = free_port()
            options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c max_connections=300 "
                       "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=64MB")
            done = self._run("pg_ctl", "-D", str(data), "-l", str(self.folder / "server.log"), "-w", "-t", "60",
                             "-o", options, "start", check=False)
            if done.returncode == 0:
                return
            error = done.stderr + (self.folder / "server.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"PostgreSQL did not start: {error}")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", "fast", "-w", "stop", check=False)


def start_cluster() -> Cluster:
    bindir = binaries()
    if bindir is None:
        raise RuntimeError("PostgreSQL binaries (initdb, pg_ctl) not found")
    # As root the server runs as ``postgres``, which must reach the folder: /tmp, not a private
    # TMPDIR (and a short path, for the socket's name).
    folder = Path(tempfile.mkdtemp(prefix="omem-pg-", dir="/tmp" if os.geteuid() == 0 else None))
    cluster = Cluster(bindir, folder)
    try:
        cluster.start()
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return cluster


def remove(cluster: Cluster) -> None:
    cluster.stop()
    shutil.rmtree(cluster.folder, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """One throwaway server for the session (skipped, with the reason, when it cannot exist)."""
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install -e '.[postgres]'")
    pytest.importorskip("psycopg_pool", reason="psycopg-pool is not installed: pip install -e '.[postgres]'")
    if binaries() is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) not found: apt-get install -y postgresql")
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server as")
        if shutil.which("runuser") is None:
            pytest.skip("running as root and 'runuser' is missing (needed to start the server as 'postgres')")
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        remove(cluster)


_serial = itertools.count()


@dataclass
class Space:
    """One schema of the test server, and the stores made on it (closed after the test)."""

    dsn: str
    schema: str
    made: list[Any] = field(default_factory=list)

    def memory(self, **kwargs: Any):
        from omem_core.postgres import PostgresMemoryStore

        store = PostgresMemoryStore(self.dsn, schema=self.schema, **kwargs)
        self.made.append(store)
        return store

    def observations(self, **kwargs: Any):
        from omem_core.postgres import PostgresObservationStore

        store = PostgresObservationStore(self.dsn, schema=self.schema, **kwargs)
        self.made.append(store)
        return store

    def fresh(self) -> Space:
        """Another, empty schema (its stores are closed with this one's)."""
        other = Space(self.dsn, new_schema(), self.made)
        return other


def new_schema() -> str:
    return f"t{os.getpid()}_{next(_serial)}_{uuid.uuid4().hex[:6]}"


@pytest.fixture
async def pg(pg_cluster: Cluster) -> Any:
    """A fresh schema on the session's server; every store made through it is closed afterwards."""
    space = Space(pg_cluster.dsn, new_schema())
    yield space
    for store in space.made:
        await store.close()


if __name__ == "__main__":
    running = start_cluster()
    try:
        input(f"{running.dsn}\n(Enter stops the server) ")
    finally:
        remove(running)
