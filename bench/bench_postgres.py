"""Load on the PostgreSQL adapters, measured in one run.

    python bench/bench_postgres.py [--seconds 10] [--processes 4] [--threads 250] [--think 2] [--dsn DSN]

Without ``--dsn`` it starts a throwaway server (Debian's ``initdb``/``pg_ctl``, as the tests do)
and removes it afterwards; with ``--dsn`` it works in a new schema of that database.

1. Many hosts, one database: ``--processes`` OS processes (standing for hosts: they share nothing
   but the database) each run one actor per thread over the same ``--threads`` threads for
   ``--seconds``: save a message, then a cursorless recall through the wrapper (20 ms scripted
   model, observation threshold 4 messages, window 4), then ``--think`` seconds (+-50%, as a
   user would take; ``--think 0`` runs flat out and measures queueing on this machine). Afterwards every thread is checked: every
   message an actor saved is stored (no lost message), and no message is covered by two saved
   observations (no duplicate pass). Save and recall p50/p95 are reported over all processes.
2. Cursorless recall on threads of 1k and 100k messages whose older history is observed (a
   reflection covering the older observations): the wrapper's recall and the plain
   ``PostgresMemoryStore.recall``, medians. Target: 100k <= 2x 1k.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import omem_core  # noqa: E402,F401  (litellm's offline environment first)
from omem_core import Message, ObservationRecord, create_observational_memory_store  # noqa: E402
from omem_core.postgres import PostgresMemoryStore, PostgresObservationStore  # noqa: E402

import litellm  # noqa: E402
from litellm import CustomLLM, ModelResponse  # noqa: E402

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


class Model(CustomLLM):
    calls = 0

    async def acompletion(self, model, messages, *args, **kwargs):  # type: ignore[override]
        Model.calls += 1
        await asyncio.sleep(0.02)
        response = ModelResponse(choices=[{"message": {"role": "assistant", "content": "- a note"}}])
        response.usage = litellm.Usage(prompt_tokens=10, completion_tokens=3, total_tokens=13)
        return response


def register() -> None:
    litellm.custom_provider_map.append({"provider": "bench", "custom_handler": Model()})
    litellm.register_model({"bench/model": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
                                            "cache_creation_input_token_cost": 0.0,
                                            "cache_read_input_token_cost": 0.0,
                                            "litellm_provider": "bench", "mode": "chat"}})


def ones(texts: list[str]) -> list[int]:
    return [1] * len(texts)


# -- 1. processes ------------------------------------------------------------------------------


async def worker(dsn: str, schema: str, process: int, seconds: float, threads: int, start_at: float, out: str,
                 think: float) -> None:
    register()
    inner = PostgresMemoryStore(dsn, schema=schema, max_size=8)
    observations = PostgresObservationStore(dsn, schema=schema, max_size=8)
    skipped: list[str] = []
    store = create_observational_memory_store(
        inner, observer="bench/model", thresholds={"observation": 4}, count_tokens=ones, observations=observations,
        on_event=lambda event: skipped.append(event.skipped) if event.skipped else None)
    await inner.recall("t0", last=1)  # pools open before the clock starts
    await observations.list("t0")
    saved: dict[str, list[str]] = {}
    saves: list[float] = []
    recalls: list[float] = []
    errors: list[str] = []
    await asyncio.sleep(max(0.0, start_at - time.time()))
    deadline = time.perf_counter() + seconds

    async def actor(thread: str) -> None:
        n = 0
        mine = saved.setdefault(thread, [])
        rng = random.Random(f"{process}-{thread}")
        await asyncio.sleep(think * rng.random())  # actors out of step
        while time.perf_counter() < deadline:
            message = Message(id=f"{thread}-p{process}-{n}", thread_id=thread, role="user",
                              content=f"message {n} from process {process}", created_at=datetime.now(timezone.utc))
            n += 1
            try:
                started = time.perf_counter()
                await store.save_messages([message])
                saves.append(time.perf_counter() - started)
                mine.append(message.id)
                started = time.perf_counter()
                await store.recall(thread, last=4)
                recalls.append(time.perf_counter() - started)
                await asyncio.sleep(think * rng.uniform(0.5, 1.5))
            except Exception as exc:  # counted and reported, never hidden
                errors.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(actor(f"t{i}") for i in range(threads)))
    await inner.close()
    await observations.close()
    Path(out).write_text(json.dumps({"saved": saved, "saves": saves, "recalls": recalls, "errors": errors,
                                     "calls": Model.calls, "skipped": skipped}))


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] * 1000 if values else float("nan")


async def check(dsn: str, schema: str, threads: int, saved: dict[str, set[str]]) -> tuple[int, int, int, int]:
    inner = PostgresMemoryStore(dsn, schema=schema)
    observations = PostgresObservationStore(dsn, schema=schema)
    lost = duplicates = records = not_prefix = 0
    for i in range(threads):
        thread = f"t{i}"
        stored = [m.id for m in await inner.recall(thread, last=10_000_000)]
        lost += len(saved.get(thread, set()) - set(stored))
        covered = [s for r in await observations.list(thread) if r.kind == "observation" for s in r.source_ids]
        records += len(covered)
        duplicates += len(covered) - len(set(covered))
        if covered != stored[:len(covered)]:
            not_prefix += 1
    await inner.close()
    await observations.close()
    return lost, duplicates, records, not_prefix


def load(dsn: str, schema: str, processes: int, threads: int, seconds: float, think: float) -> None:
    start_at = time.time() + 8 + 2 * processes  # every process imported and connected by then
    with tempfile.TemporaryDirectory() as folder:
        outs = [os.path.join(folder, f"p{p}.json") for p in range(processes)]
        children = [subprocess.Popen([sys.executable, __file__, "--worker", dsn, schema, str(p), str(seconds),
                                      str(threads), str(start_at), outs[p], str(think)]) for p in range(processes)]
        for child in children:
            if child.wait(timeout=seconds + 300) != 0:
                raise SystemExit(f"a worker process failed ({child.returncode})")
        results = [json.loads(Path(out).read_text()) for out in outs]
    saved: dict[str, set[str]] = {}
    for result in results:
        for thread, ids in result["saved"].items():
            saved.setdefault(thread, set()).update(ids)
    lost, duplicates, covered, not_prefix = asyncio.run(check(dsn, schema, threads, saved))
    saves = [v for r in results for v in r["saves"]]
    recalls = [v for r in results for v in r["recalls"]]
    errors = [e for r in results for e in r["errors"]]
    skipped = [s for r in results for s in r["skipped"]]
    print(f"1. load: {processes} processes x {threads} threads (shared), {seconds:g} s, think time {think:g} s, "
          f"20 ms model, window 4, observation every 4 messages")
    print(f"   saved messages {len(saves):,} ({len(saves) / seconds:,.0f}/s), recalls {len(recalls):,}, model calls "
          f"{sum(r['calls'] for r in results):,} (passes that saved nothing: {len(skipped)}), errors {len(errors)}")
    print(f"   lost messages {lost}, messages covered by two observations (duplicate passes) {duplicates}, "
          f"threads whose coverage is not a prefix {not_prefix} ({covered:,} messages observed)")
    print(f"   save   p50 {pct(saves, 0.5):.1f} ms, p95 {pct(saves, 0.95):.1f} ms")
    print(f"   recall p50 {pct(recalls, 0.5):.1f} ms, p95 {pct(recalls, 0.95):.1f} ms (includes passes and model calls)")
    if errors:
        print("   first error:", errors[0])
    if skipped:
        print("   why passes saved nothing:", sorted(set(skipped)))


# -- 2. flat recall ------------------------------------------------------------------------------


def message(i: int) -> Message:
    return Message(id=f"t-{i}", thread_id="t", role="user" if i % 2 == 0 else "assistant",
                   content=f"message {i}: some chat text here", created_at=T0 + timedelta(seconds=i))


async def observed(dsn: str, schema: str, n: int):
    inner = PostgresMemoryStore(dsn, schema=schema)
    records = PostgresObservationStore(dsn, schema=schema)
    for start in range(0, n, 5000):
        await inner.save_messages([message(i) for i in range(start, min(n, start + 5000))])
    observations = [ObservationRecord(id=f"o{start}", thread_id="t", resource_id=None, created_at=T0,
                                      kind="observation", text="- note",
                                      source_ids=tuple(f"t-{i}" for i in range(start, min(start + 20, n - 30))))
                    for start in range(0, n - 30, 20)]
    for record in observations[:-2]:
        await records.save(record)
    await records.save(ObservationRecord(id="r", thread_id="t", resource_id=None, created_at=T0, kind="reflection",
                                         source_ids=tuple(r.id for r in observations[:-2]), text="- reflection"))
    for record in observations[-2:]:
        await records.save(record)
    async with inner._db.connection() as con:  # fresh statistics, as autovacuum would keep them
        await con.execute(f'ANALYZE "{schema}".omem_messages')
        await con.execute(f'ANALYZE "{schema}".omem_records')
    return inner, records, create_observational_memory_store(inner, observer="bench/model", observations=records)


async def flat(dsn: str) -> None:
    register()
    print("2. cursorless recall (last=10), older history observed, one reflection over it")
    print(f"   {'messages':>9} {'wrapper':>10} {'plain':>10} {'overhead':>10}")
    wrapper_time, overhead = {}, {}
    for n in (1_000, 100_000):
        schema = f"bench_flat_{n}_{uuid.uuid4().hex[:6]}"
        inner, records, store = await observed(dsn, schema, n)
        state = await store.inspect("t", last=10)
        assert not state.observe_due and len(state.unreflected) == 2
        for _ in range(30):
            await store.recall("t", last=10)
        plain, wrapped = [], []
        for _ in range(5):  # interleaved, to share the machine's noise
            for target, samples in ((inner, plain), (store, wrapped)):
                batch = []
                for _ in range(40):
                    start = time.perf_counter()
                    await target.recall("t", last=10)
                    batch.append(time.perf_counter() - start)
                samples.append(statistics.median(batch))
        w, p = statistics.median(wrapped), statistics.median(plain)
        wrapper_time[n], overhead[n] = w, w - p
        print(f"   {n:>9,} {w * 1e3:>8.2f}ms {p * 1e3:>8.2f}ms {(w - p) * 1e3:>8.2f}ms")
        await inner.close()
        await records.close()
    ratio = wrapper_time[100_000] / wrapper_time[1_000]
    print(f"   recall 100k / 1k = {ratio:.2f}x (target <= 2x) {'OK' if ratio <= 2 else 'MISSED'}; "
          f"overhead 100k / 1k = {overhead[100_000] / overhead[1_000]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=250)
    parser.add_argument("--think", type=float, default=2.0, help="seconds between an actor's turns (0: flat out)")
    parser.add_argument("--dsn", help="an existing database (a new schema is used); default: a throwaway server")
    parser.add_argument("--flat-only", action="store_true", help="only the recall figures (2.)")
    parser.add_argument("--load-only", action="store_true", help="only the load figures (1.)")
    arguments = parser.parse_args()
    cluster = None
    dsn = arguments.dsn
    if dsn is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from pg import remove, start_cluster

        cluster = start_cluster()
        dsn = cluster.dsn
    try:
        if not arguments.flat_only:
            load(dsn, f"bench_load_{uuid.uuid4().hex[:6]}", arguments.processes, arguments.threads, arguments.seconds,
                 arguments.think)
        if not arguments.load_only:
            asyncio.run(flat(dsn))
    finally:
        if cluster is not None:
            remove(cluster)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        dsn, schema, process, seconds, threads, start_at, out, think = sys.argv[2:10]
        asyncio.run(worker(dsn, schema, int(process), float(seconds), int(threads), float(start_at), out, float(think)))
    else:
        main()
