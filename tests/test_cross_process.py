"""Several real processes sharing one SQLite file: exactly one runs a thread's pass."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import msg, ones

from omem_core import create_observational_memory_store
from omem_core.sqlite import SQLiteMemoryStore, SQLiteObservationStore

WORKER = textwrap.dedent('''
    import asyncio, json, sys, time
    from pathlib import Path
    import omem_core
    import litellm
    from litellm import CustomLLM, ModelResponse
    from omem_core.sqlite import SQLiteMemoryStore, SQLiteObservationStore

    db, calls, go, on_busy = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]

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
        store = omem_core.create_observational_memory_store(
            SQLiteMemoryStore(db), observer="slow/model", thresholds={"observation": 5},
            count_tokens=lambda texts: [1] * len(texts), observations=SQLiteObservationStore(db),
            on_busy=on_busy)
        while not go.exists():
            await asyncio.sleep(0.005)
        got = await store.recall("t", last=2)
        print(json.dumps({"memory": got[0].content if got[0].role == "system" else None}))

    asyncio.run(main())
''')


def start_workers(tmp_path: Path, count: int, on_busy: str) -> tuple[list[subprocess.Popen], Path, Path]:
    db, calls, go = tmp_path / "shared.db", tmp_path / "calls.log", tmp_path / "go"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    asyncio.run(SQLiteMemoryStore(db).save_messages([msg(i) for i in range(12)]))  # one pass due
    workers = [subprocess.Popen([sys.executable, str(script), str(db), str(calls), str(go), on_busy],
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


def test_processes_sharing_a_file_run_the_pass_exactly_once(tmp_path) -> None:
    workers, calls, go = start_workers(tmp_path, 4, "wait")
    time.sleep(4)  # let every worker import and open the file
    go.touch()
    outputs = finish(workers)
    assert calls.read_text().count("call") == 1
    assert [o["memory"] for o in outputs] == ["- the one note"] * 4  # the waiters rendered its result
    records = asyncio.run(SQLiteObservationStore(tmp_path / "shared.db").list("t"))
    assert len(records) == 1 and records[0].source_ids == ("m0", "m1", "m2", "m3", "m4")


def test_render_setting_does_not_wait(tmp_path) -> None:
    workers, calls, go = start_workers(tmp_path, 3, "render")
    time.sleep(4)
    go.touch()
    outputs = finish(workers)
    assert calls.read_text().count("call") == 1
    memories = [o["memory"] for o in outputs]
    assert memories.count("- the one note") >= 1 and set(memories) <= {"- the one note", None}


async def test_a_crashed_holder_blocks_only_until_its_lease_expires(tmp_path, scripted) -> None:
    db = tmp_path / "crash.db"
    observations = SQLiteObservationStore(db)
    assert await observations.try_lease("t", "crashed-process", ttl=0.6)  # never released
    store = create_observational_memory_store(SQLiteMemoryStore(db), observer="scripted/model",
                                              thresholds={"observation": 5}, count_tokens=ones,
                                              observations=observations)
    await store.save_messages([msg(i) for i in range(12)])
    started = time.perf_counter()
    got = await store.recall("t", last=2)
    waited = time.perf_counter() - started
    assert got[0].content == "- noted" and scripted.started == 1
    assert 0.4 < waited < 5
    assert await observations.try_lease("t", "other", ttl=1)  # the pass released its lease


DELETE_WORKER = textwrap.dedent('''
    import asyncio, sys, time
    from pathlib import Path
    import omem_core, litellm
    from litellm import CustomLLM, ModelResponse
    from omem_core.sqlite import SQLiteMemoryStore, SQLiteObservationStore

    db, started, release = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])

    class Gated(CustomLLM):
        async def acompletion(self, model, messages, *args, **kwargs):
            started.touch()
            while not release.exists():
                await asyncio.sleep(0.01)
            r = ModelResponse(choices=[{"message": {"role": "assistant", "content": "- the deleted secret"}}])
            r.usage = litellm.Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
            return r

    litellm.custom_provider_map.append({"provider": "gated", "custom_handler": Gated()})

    async def main():
        store = omem_core.create_observational_memory_store(
            SQLiteMemoryStore(db), observer="gated/model", thresholds={"observation": 5},
            count_tokens=lambda texts: [1] * len(texts), observations=SQLiteObservationStore(db))
        await store.recall("t", last=2)
        print("done", flush=True)

    asyncio.run(main())
''')


async def test_a_delete_is_not_undone_by_another_process_in_flight_pass(tmp_path, scripted) -> None:
    db, started, release = tmp_path / "shared.db", tmp_path / "started", tmp_path / "release"
    script = tmp_path / "delete_worker.py"
    script.write_text(DELETE_WORKER)
    here = create_observational_memory_store(SQLiteMemoryStore(db), observer="scripted/model",
                                             thresholds={"observation": 5}, count_tokens=ones,
                                             observations=SQLiteObservationStore(db))
    await here.save_messages([msg(i) for i in range(12)])
    worker = subprocess.Popen([sys.executable, str(script), str(db), str(started), str(release)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.time() + 60
        while not started.exists():  # the other process's pass is waiting for its model
            assert worker.poll() is None and time.time() < deadline, worker.stderr.read() if worker.stderr else ""
            await asyncio.sleep(0.02)
        await here.delete_thread("t")
        await here.save_messages([msg(i, f"a new conversation {i}") for i in range(4)])  # the id reused
        release.touch()
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err[-2000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    assert await here.observations.list("t") == []
    got = await here.recall("t", last=5)
    assert all("secret" not in m.content for m in got)
