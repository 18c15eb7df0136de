"""Load on the SQLite adapters, measured in one run.

    python bench/bench_sqlite.py [--seconds 10]

1. 1,000 threads and 32 concurrent readers against one SQLite file with a 20 ms scripted model,
   for a bounded time: messages are saved and read in a loop; afterwards every thread is checked
   (no error, no lost message, no duplicate pass: every observation covers a distinct segment).
   Recall p50/p95 reported.
2. Per-read overhead of a cursorless recall (wrapper minus plain ``SQLiteMemoryStore.recall``,
   medians) on threads of 1k, 100k and 1M messages whose older history is observed, with a
   reflection that covers every older observation, and one that leaves three uncovered (one
   early, two just before it). Targets: 100k <= 1.5x 1k, 1M <= 2x 1k, both kinds.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import omem_core  # noqa: F401  (litellm's offline environment first)
from omem_core import Message, ObservationRecord, create_observational_memory_store
from omem_core.sqlite import SQLiteMemoryStore, SQLiteObservationStore

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


def message(thread: str, i: int) -> Message:
    return Message(id=f"{thread}-{i}", thread_id=thread, role="user" if i % 2 == 0 else "assistant",
                   content=f"message {i} of {thread}: some chat text here", created_at=T0 + timedelta(seconds=i))


async def load(folder: Path, seconds: float) -> None:
    db = folder / "load.db"
    store = create_observational_memory_store(SQLiteMemoryStore(db), observer="bench/model",
                                              thresholds={"observation": 200},
                                              observations=SQLiteObservationStore(db))
    threads = [f"t{i}" for i in range(1000)]
    saved = {t: 0 for t in threads}
    latencies: list[float] = []
    errors: list[str] = []
    rng = random.Random(1)
    deadline = time.perf_counter() + seconds

    async def reader(worker: int) -> None:
        local = random.Random(worker)
        while time.perf_counter() < deadline:
            thread = threads[local.randrange(len(threads))]
            batch = [message(thread, saved[thread] + k) for k in range(2)]
            saved[thread] += 2
            try:
                await store.save_messages(batch)
                start = time.perf_counter()
                await store.recall(thread, last=10)
                latencies.append(time.perf_counter() - start)
            except Exception as exc:  # counted and reported, never hidden
                errors.append(f"{type(exc).__name__}: {exc}")

    rng.shuffle(threads)
    await asyncio.gather(*(reader(w) for w in range(32)))
    lost = duplicates = 0
    for thread in threads:
        stored = await store.inner.recall(thread, last=100_000)
        if [m.id for m in stored] != [f"{thread}-{i}" for i in range(saved[thread])]:
            lost += 1
        covered = [i for r in await store.observations.list(thread) if r.kind == "observation" for i in r.source_ids]
        if len(covered) != len(set(covered)):
            duplicates += 1
    latencies.sort()
    print(f"1. load: {seconds:.0f} s, 1,000 threads, 32 concurrent readers, 20 ms model")
    print(f"   reads {len(latencies):,}, model calls {Model.calls:,}, errors {len(errors)}, threads with lost "
          f"messages {lost}, threads with a duplicate pass {duplicates}")
    if latencies:
        print(f"   recall p50 {statistics.median(latencies) * 1000:.1f} ms, "
              f"p95 {latencies[int(len(latencies) * 0.95)] * 1000:.1f} ms (includes passes and model calls)")
    if errors:
        print("   first error:", errors[0])


async def observed(folder: Path, n: int, uncovered: bool):
    db = folder / f"flat{n}{'u' if uncovered else ''}.db"
    inner, records = SQLiteMemoryStore(db), SQLiteObservationStore(db)
    for start in range(0, n, 5000):
        await inner.save_messages([message("t", i) for i in range(start, min(n, start + 5000))])
    observations = []
    for start in range(0, n - 30, 20):
        observations.append(ObservationRecord(
            id=f"o{start}", thread_id="t", resource_id=None, created_at=T0, kind="observation",
            source_ids=tuple(f"t-{i}" for i in range(start, min(start + 20, n - 30))), text="- note"))
    left_out = {observations[10].id, observations[-4].id, observations[-3].id} if uncovered else set()
    for record in observations[:-2]:
        await records.save(record)
    await records.save(ObservationRecord(id="r", thread_id="t", resource_id=None, created_at=T0, kind="reflection",
                                         source_ids=tuple(r.id for r in observations[:-2] if r.id not in left_out),
                                         text="- reflection"))
    for record in observations[-2:]:
        await records.save(record)
    return inner, create_observational_memory_store(inner, observer="bench/model", observations=records)


SIZES = (1_000, 100_000, 1_000_000)


async def flat(folder: Path) -> None:
    print("2. cursorless recall overhead (wrapper minus plain recall), SQLite adapters, older history observed")
    print(f"   {'reflection':>20} {'messages':>9} {'wrapper':>10} {'plain':>10} {'overhead':>10}")
    for uncovered in (False, True):
        kind = "leaves 3 uncovered" if uncovered else "covers all older"
        overhead = {}
        for n in SIZES:
            inner, store = await observed(folder, n, uncovered)
            state = await store.inspect("t", last=10)
            assert not state.observe_due and len(state.unreflected) == (5 if uncovered else 2)
            for _ in range(20):
                await store.recall("t", last=10)
            plain, wrapped = [], []
            for _ in range(5):  # interleaved, to share the machine's noise
                for target, samples in ((inner, plain), (store, wrapped)):
                    batch = []
                    for _ in range(60):
                        start = time.perf_counter()
                        await target.recall("t", last=10)
                        batch.append(time.perf_counter() - start)
                    samples.append(statistics.median(batch))
            w, p = statistics.median(wrapped), statistics.median(plain)
            overhead[n] = w - p
            print(f"   {kind:>20} {n:>9,} {w * 1e6:>8.0f}us {p * 1e6:>8.0f}us {overhead[n] * 1e6:>8.0f}us")
        for n, target in ((100_000, 1.5), (1_000_000, 2.0)):
            ratio = overhead[n] / overhead[1_000]
            print(f"   {kind:>20}: overhead {n // 1000:,}k / 1k = {ratio:.2f}x (target <= {target}x) "
                  f"{'OK' if ratio <= target else 'MISSED'}")


def main(seconds: float, flat_only: bool = False) -> None:
    litellm.custom_provider_map.append({"provider": "bench", "custom_handler": Model()})
    litellm.register_model({"bench/model": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
                                            "cache_creation_input_token_cost": 0.0,
                                            "cache_read_input_token_cost": 0.0,
                                            "litellm_provider": "bench", "mode": "chat"}})
    with tempfile.TemporaryDirectory() as folder:
        if not flat_only:
            asyncio.run(load(Path(folder), seconds))
        asyncio.run(flat(Path(folder)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--flat-only", action="store_true", help="only the read-overhead figures (2.)")
    arguments = parser.parse_args()
    main(arguments.seconds, arguments.flat_only)
