"""Several real processes sharing one SQLite file, or one PostgreSQL database (two processes stand
for two hosts: they share nothing but the database): exactly one runs a thread's pass."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import msg, ones, run_together

from omem_core import create_observational_memory_store
from omem_core.sqlite import SQLiteMemoryStore, SQLiteObservationStore

# How a worker process opens the shared storage: argv[1] is the adapter, argv[2] the SQLite file
# or the PostgreSQL DSN, argv[3] the PostgreSQL schema; the worker's own arguments follow.
OPEN = textwrap.dedent('''
    def open_stores(kind, where, schema):
        if kind == "postgres":
            from omem_core.postgres import PostgresMemoryStore, PostgresObservationStore
            return PostgresMemoryStore(where, schema=schema), PostgresObservationStore(where, schema=schema)
        from omem_core.sqlite import SQLiteMemoryStore, SQLiteObservationStore
        return SQLiteMemoryStore(where), SQLiteObservationStore(where)
''')


class Shared:
    """The storage the processes share: one SQLite file, or one schema of the test server."""

    def __init__(self, kind: str, tmp_path: Path, space=None) -> None:
        self.kind, self.space = kind, space
        self.db = tmp_path / "shared.db"

    @property
    def argv(self) -> list[str]:
        if self.kind == "postgres":
            return ["postgres", self.space.dsn, self.space.schema]
        return ["sqlite", str(self.db), "-"]

    def stores(self):
        """(inner, observations) opened afresh in this process."""
        if self.kind == "postgres":
            return self.space.memory(), self.space.observations()  # closed after the test
        return SQLiteMemoryStore(self.db), SQLiteObservationStore(self.db)


@pytest.fixture(params=["sqlite", "postgres"])
def shared(request, tmp_path) -> Shared:
    return Shared(request.param, tmp_path, request.getfixturevalue("pg") if request.param == "postgres" else None)

WORKER = textwrap.dedent('''
    import asyncio, json, sys, time
    from pathlib import Path
    import omem_core
    import litellm
    from litellm import CustomLLM, ModelResponse
    kind, where, schema = sys.argv[1:4]
    calls, go, on_busy = Path(sys.argv[4]), Path(sys.argv[5]), sys.argv[6]

    class Slow(CustomLLM):
        async def acompletion(self, model, messages, *args, **kwargs):
            with calls.open("a") as f:
                f.write("call\\n")
            await asyncio.sleep(0.4)
            r = ModelResponse(choices=[{"message": {"role": "assistant", "content": "- the one note"}}])
            r.usage = litellm.Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
            return r

    litellm.custom_provider_map.append({"provider": "slow", "custom_handler": Slow()})

    async def main():
        inner, observations = open_stores(kind, where, schema)
        store = omem_core.create_observational_memory_store(
            inner, observer="slow/model", thresholds={"observation": 5},
            count_tokens=lambda texts: [1] * len(texts), observations=observations,
            on_busy=on_busy)
        while not go.exists():
            await asyncio.sleep(0.005)
        got = await store.recall("t", last=2)
        print(json.dumps({"memory": got[0].content if got[0].role == "system" else None}))

    asyncio.run(main())
''')


async def _seed(shared: Shared) -> None:
    inner, observations = shared.stores()
    await inner.save_messages([msg(i) for i in range(12)])  # one pass due
    await observations.list("t")  # both stores' schema ready before the workers start
    for store in (inner, observations):
        if hasattr(store, "close"):
            result = store.close()
            if asyncio.iscoroutine(result):
                await result


def start_workers(tmp_path: Path, count: int, on_busy: str,
                  shared: Shared) -> tuple[list[subprocess.Popen], Path, Path]:
    calls, go = tmp_path / "calls.log", tmp_path / "go"
    script = tmp_path / "worker.py"
    script.write_text(WORKER.replace("async def main", OPEN + "\nasync def main", 1))
    asyncio.run(_seed(shared))
    workers = [subprocess.Popen([sys.executable, str(script), *shared.argv, str(calls), str(go), on_busy],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=Path(__file__).resolve().parents[1]) for _ in range(count)]
    return workers, calls, go


def finish(workers: list[subprocess.Popen]) -> list[dict]:
    outputs = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err[-2000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    return outputs


def test_processes_sharing_a_file_run_the_pass_exactly_once(tmp_path, shared) -> None:
    workers, calls, go = start_workers(tmp_path, 4, "wait", shared)
    time.sleep(4)  # let every worker import and open the file
    go.touch()
    outputs = finish(workers)
    assert calls.read_text().count("call") == 1
    assert [o["memory"] for o in outputs] == ["- the one note"] * 4  # the waiters rendered its result
    records = asyncio.run(shared.stores()[1].list("t"))
    assert len(records) == 1 and records[0].source_ids == ("m0", "m1", "m2", "m3", "m4")


def test_render_setting_does_not_wait(tmp_path, shared) -> None:
    workers, calls, go = start_workers(tmp_path, 3, "render", shared)
    time.sleep(4)
    go.touch()
    outputs = finish(workers)
    assert calls.read_text().count("call") == 1
    memories = [o["memory"] for o in outputs]
    assert memories.count("- the one note") >= 1 and set(memories) <= {"- the one note", None}


async def test_a_crashed_holder_blocks_only_until_its_lease_expires(tmp_path, scripted, shared) -> None:
    inner, observations = shared.stores()
    assert await observations.try_lease("t", "crashed-process", ttl=0.6)  # never released
    store = create_observational_memory_store(inner, observer="scripted/model",
                                              thresholds={"observation": 5}, count_tokens=ones,
                                              observations=observations)
    await store.save_messages([msg(i) for i in range(12)])
    started = time.perf_counter()
    got = await store.recall("t", last=2)
    waited = time.perf_counter() - started
    assert got[0].content == "- noted" and scripted.started == 1
    assert 0.4 < waited < 5
    assert await observations.try_lease("t", "other", ttl=1)  # the pass released its lease


# A worker whose pass waits inside its model call until ``release`` exists: awaiting (``{wait}``
# "await asyncio.sleep(0.01)"), or with its whole event loop stalled ("time.sleep(0.01)": no lease
# renewal meanwhile). It prints why each of its passes saved nothing.
WORKER_IN_MODEL = textwrap.dedent('''
    import asyncio, json, sys, time
    from pathlib import Path
    import omem_core, litellm
    from litellm import CustomLLM, ModelResponse
    kind, where, schema = sys.argv[1:4]
    started, release = Path(sys.argv[4]), Path(sys.argv[5])

    class Gated(CustomLLM):
        async def acompletion(self, model, messages, *args, **kwargs):
            started.touch()
            while not release.exists():
                {wait}
            r = ModelResponse(choices=[{{"message": {{"role": "assistant", "content": "- the secret note"}}}}])
            r.usage = litellm.Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
            return r

    litellm.custom_provider_map.append({{"provider": "gated", "custom_handler": Gated()}})

    async def main():
        inner, observations = open_stores(kind, where, schema)
        events = []
        store = omem_core.create_observational_memory_store(
            inner, observer="gated/model", thresholds={{"observation": 5}}, lease_ttl={lease_ttl},
            count_tokens=lambda texts: [1] * len(texts), observations=observations, on_event=events.append)
        await store.recall("t", last=2)
        print(json.dumps({{"skipped": [e.skipped for e in events]}}), flush=True)

    asyncio.run(main())
''')


@contextlib.asynccontextmanager
async def worker_in_its_model(tmp_path: Path, shared: Shared, observation: int, *, wait: str, lease_ttl: float = 120):
    """This process's wrapper over the shared storage (12 messages saved), and another process
    (:data:`WORKER_IN_MODEL`) started and waiting inside its model call: yields
    ``(here, release, finish)``; touch ``release`` to let the model answer, then ``await finish()``
    for the worker's stdout."""
    started, release = tmp_path / "started", tmp_path / "release"
    script = tmp_path / "worker_in_model.py"
    script.write_text(WORKER_IN_MODEL.format(wait=wait, lease_ttl=lease_ttl).replace(
        "async def main", OPEN + "\nasync def main", 1))
    inner, observations = shared.stores()
    here = create_observational_memory_store(inner, observer="scripted/model",
                                             thresholds={"observation": observation}, count_tokens=ones,
                                             observations=observations)
    await here.save_messages([msg(i) for i in range(12)])
    worker = subprocess.Popen([sys.executable, str(script), *shared.argv, str(started), str(release)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])

    async def finish() -> str:
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err[-2000:]
        return out

    try:
        deadline = time.time() + 60
        while not started.exists():  # the other process's pass is waiting for its model
            assert worker.poll() is None and time.time() < deadline, worker.stderr.read() if worker.stderr else ""
            await asyncio.sleep(0.02)
        yield here, release, finish
    finally:
        if worker.poll() is None:
            worker.kill()


async def test_a_ctrl_c_during_a_pass_gives_its_lease_back(tmp_path, shared) -> None:
    """Found by a walkthrough: Ctrl-C in a process waiting for its pass's model call (asyncio.run
    winding down) left that pass's lease held, so every other process's read of the thread
    waited the lease's whole ttl (two minutes) for a holder that was gone."""
    import signal

    started, release = tmp_path / "started", tmp_path / "release"
    script = tmp_path / "worker_in_model.py"
    script.write_text(WORKER_IN_MODEL.format(wait="await asyncio.sleep(0.01)", lease_ttl=120).replace(
        "async def main", OPEN + "\nasync def main", 1))
    inner, observations = shared.stores()
    await inner.save_messages([msg(i) for i in range(12)])
    worker = subprocess.Popen([sys.executable, str(script), *shared.argv, str(started), str(release)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.time() + 60
        while not started.exists():  # its pass holds the lease and waits for its model
            assert worker.poll() is None and time.time() < deadline, worker.stderr.read() if worker.stderr else ""
            await asyncio.sleep(0.02)
        assert not await observations.try_lease("t", "other", ttl=1)  # (held)
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=60)
        assert "KeyboardInterrupt" in err  # stopped as Ctrl-C stops a program, not killed
    finally:
        if worker.poll() is None:
            worker.kill()
    assert await observations.try_lease("t", "other", ttl=1)  # given back: free at once


async def test_a_delete_is_not_undone_by_another_process_in_flight_pass(tmp_path, scripted, shared) -> None:
    async with worker_in_its_model(tmp_path, shared, 5, wait="await asyncio.sleep(0.01)") as (here, release, finish):
        await here.delete_thread("t")
        await here.save_messages([msg(i, f"a new conversation {i}") for i in range(4)])  # the id reused
        release.touch()
        out = await finish()
    assert await here.observations.list("t") == []
    # its event says why it saved nothing (it said "a message was saved inside the segment")
    assert json.loads(out.strip().splitlines()[-1])["skipped"] == ["the thread was deleted during the pass"]
    got = await here.recall("t", last=5)
    assert all("secret" not in m.content for m in got)


def test_processes_opening_one_new_file_at_once_all_open_it(tmp_path) -> None:
    """Hosts started together open the same new file: each switches it to WAL and migrates it. Both
    steps raced — "database is locked" from the WAL switch, "duplicate column" from a migration
    applied twice — and failed 19 starts of 8 processes out of 20; the version is now read again
    under the write lock and the switch retried."""
    def open_both(path: str) -> None:
        SQLiteMemoryStore(path).close()
        SQLiteObservationStore(path).close()

    for trial in range(10):
        path = str(tmp_path / f"{trial}.db")
        outcomes = run_together(lambda: open_both(path))
        assert outcomes == ["ok"] * 8, outcomes


async def test_a_pass_whose_lease_lapsed_does_not_save_after_another_pass(tmp_path, scripted, shared) -> None:
    """A process whose event loop stalled past ``lease_ttl`` while its model ran (so its renewal
    never noticed) must not save once another process took the lapsed lease and saved a pass of
    its own on a segment cut otherwise: the late record moved the cursor back, and the messages
    between were observed twice."""
    async with worker_in_its_model(tmp_path, shared, 8, wait="time.sleep(0.01)", lease_ttl=0.6) as (here, release,
                                                                                                   finish):
        # (the other process holds the lease and waits for its model, its event loop stalled)
        await asyncio.sleep(1.0)  # past its lease_ttl: the lease lapses unrenewed
        await here.recall("t", last=2)  # takes the lapsed lease: observes m0..m7 (threshold 8)
        release.touch()
        out = await finish()
    records = await here.observations.list("t")
    assert [r.source_ids for r in records] == [tuple(f"m{i}" for i in range(8))]  # nothing observed twice
    [skipped] = json.loads(out.strip().splitlines()[-1])["skipped"]
    assert skipped == "the pass lost its lease, and another pass saved a record meanwhile"
    got = await here.recall("t", last=2)
    assert [m.id for m in got[1:]] == ["m10", "m11"] and "the secret note" not in got[0].content


class Flaky(SQLiteObservationStore):
    """A store whose database goes away for the next ``failures`` lease releases (a PostgreSQL
    server restarting while a pass ends: its save went through, its release did not)."""

    failures = 0

    async def release_lease(self, thread_id: str, holder: str) -> None:
        if self.failures and not thread_id.startswith("\x01"):  # a pass lease (cursor leases start U+0001)
            self.failures -= 1
            raise ConnectionError("the database is unreachable")
        await super().release_lease(thread_id, holder)


async def test_a_lease_not_given_back_during_an_outage_is_given_back_at_the_next_read(tmp_path, scripted) -> None:
    """The release at the end of a pass failed: it raised over a pass that had saved, and the lease
    stayed until it expired, so every read of the thread on every host waited up to ``lease_ttl``
    (120 s by default) after a database blip of a second."""
    observations = Flaky(tmp_path / "s.db")
    store = create_observational_memory_store(SQLiteMemoryStore(tmp_path / "s.db"), observer="scripted/model",
                                              thresholds={"observation": 5}, count_tokens=ones,
                                              observations=observations, on_busy="render")
    await store.save_messages([msg(i) for i in range(8)])
    observations.failures = 1  # the pass's own release
    got = await store.recall("t", last=2)  # saved its note: no error for the release that failed
    assert got[0].content == "- noted" and scripted.started == 1
    await store.save_messages([msg(i) for i in range(8, 14)])  # another pass due
    await store.recall("t", last=2)
    # it ran (on_busy="render" would have rendered without it while the old lease was held)
    assert scripted.started == 2 and len(await observations.list("t")) == 2
    assert await observations.try_lease("t", "another host", ttl=1)  # and the thread is free for others
