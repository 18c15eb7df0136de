"""Experiments, measured side by side in one run.

    python bench/bench_experiments.py [--quick] [--skip-offline] [--skip-remote] [--skip-recording]

1. **Offline scheduler.** The 4 dev LoCoMo conversations × 9 configurations (observation 500/1000/2000
   × reflection 1000/2000/4000) with concurrency 2 (worker processes) against the same runs one
   after another in this process. Target: parallel ≤ 0.65x serial on the project's 2-core machine.
   ``--quick``: 2 conversations × 4 configurations.
2. **Remote scheduler.** A scripted OpenAI-compatible server on 127.0.0.1 answering each call in
   500 ms; 16 configurations (4 observation × 4 reflection thresholds, so groups of four make the same
   observer calls) of the demo conversation with concurrency 16. The lower bound is the longer of the
   longest chain of calls one run makes (× 0.5 s) and the calls that reach the model × 0.5 s / 16.
   Target: wall ≤ 1.3x that bound, and identical concurrent calls counted once at the server.
3. **Recording overhead.** One LoCoMo conversation replayed into a DuckDB run store against the same
   replay kept in memory. Target: ≤ 1.3x.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import omem_core  # noqa: E402,F401  (litellm's offline environment first)

from workbench import experiments as ex  # noqa: E402
from workbench.catalog import DEMO_DATASET, shared_datasets_dir  # noqa: E402
from workbench.datasets import list_conversations, load_conversation  # noqa: E402
from workbench.replay import ReplayConfig, replay  # noqa: E402
from workbench.runstore import RunStore  # noqa: E402

LOCOMO = shared_datasets_dir() / "locomo-dev" / "locomo-dev.json"


def offline(quick: bool) -> None:
    if not LOCOMO.exists():
        print(f"1. offline scheduler: skipped ({LOCOMO} is absent)")
        return
    conversations = [c.id for c in list_conversations(LOCOMO)][: 2 if quick else 4]
    thresholds = ((500, 1000), (2000, 4000)) if quick else ((500, 1000, 2000), (1000, 2000, 4000))
    grid = [ReplayConfig(observation_threshold=o, reflection_threshold=r) for o in thresholds[0] for r in thresholds[1]]
    times = {}
    with tempfile.TemporaryDirectory() as folder:
        for concurrency in (1, 2):
            with RunStore(Path(folder) / f"c{concurrency}.duckdb") as store:
                experiment_id = ex.create_experiment(store, dataset=LOCOMO, grid=grid, conversations=conversations,
                                                     options=ex.ExperimentOptions(concurrency=concurrency, cache=False))
                started = time.perf_counter()
                outcome = asyncio.run(ex.run_experiment(store, experiment_id))
                times[concurrency] = time.perf_counter() - started
                assert outcome.status == "completed" and outcome.failed == 0, outcome
                figures = {s.label: s.retention for s in ex.summarise(store, experiment_id)}
            if concurrency == 1:
                serial_figures = figures
            else:
                assert figures.keys() == serial_figures.keys() and all(  # equal up to summation order
                    abs(figures[k] - serial_figures[k]) < 1e-9 for k in figures), \
                    f"worker processes changed the figures: {figures} vs {serial_figures}"
    runs = len(conversations) * len(grid)
    ratio = times[2] / times[1]
    print(f"1. offline scheduler, {len(conversations)} conversations × {len(grid)} configurations = {runs} runs")
    print(f"   serial (concurrency 1, in process): {times[1]:7.1f} s")
    print(f"   parallel (concurrency 2, workers):  {times[2]:7.1f} s   ratio {ratio:.2f} "
          f"(target <= 0.65: {'met' if ratio <= 0.65 else 'NOT met'}); identical figures")


def remote() -> None:
    from openai_server import OpenAIServer

    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-not-a-secret")
    delay = 0.5

    def reply(body: dict) -> str:
        return "- note " + str(abs(hash(json.dumps(body["messages"], sort_keys=True))) % 10_000)

    grid = [ReplayConfig(observer="openai/gpt-4o-mini", reflector="openai/gpt-4o-mini", observation_threshold=o,
                         reflection_threshold=r) for o in (200, 300, 400, 600) for r in (300, 500, 700, 900)]
    with tempfile.TemporaryDirectory() as folder, OpenAIServer(reply=reply, delay=delay) as server:
        os.environ["OMEM_CACHE_DIR"] = str(Path(folder) / "cache")
        with RunStore(Path(folder) / "r.duckdb") as store:
            experiment_id = ex.create_experiment(
                store, dataset=DEMO_DATASET, grid=grid,
                options=ex.ExperimentOptions(concurrency=16, api_base=server.url, num_retries=0))
            started = time.perf_counter()
            outcome = asyncio.run(ex.run_experiment(store, experiment_id))
            wall = time.perf_counter() - started
            assert outcome.status == "completed" and outcome.failed == 0, outcome
            runs = store.experiment_runs(experiment_id)
            chains = [int((store.model_calls(r).cache_hit == False).sum()) for r in runs.run_id]  # noqa: E712
            made = [len(store.model_calls(r)) for r in runs.run_id]
    reached = len(server.ok())
    bodies = [json.dumps(r.body["messages"], sort_keys=True) for r in server.ok()]
    bound = max(max(made) * delay, reached * delay / 16)
    ratio = wall / bound
    print(f"2. remote scheduler, {len(grid)} configurations of the demo, concurrency 16, {delay * 1000:.0f} ms per call")
    print(f"   calls made by the runs: {sum(made)}; reached the server: {reached} "
          f"({len(set(bodies))} distinct: {'each once' if len(bodies) == len(set(bodies)) else 'DUPLICATES'})")
    print(f"   longest chain {max(made)} calls, lower bound {bound:.1f} s, wall {wall:.1f} s: ratio {ratio:.2f} "
          f"(target <= 1.3: {'met' if ratio <= 1.3 else 'NOT met'})")
    del chains


def recording() -> None:
    dataset = LOCOMO if LOCOMO.exists() else DEMO_DATASET
    conversation = load_conversation(dataset)
    config = ReplayConfig(cache=False)
    plain, recorded = [], []
    with tempfile.TemporaryDirectory() as folder:
        for i in range(3):
            started = time.perf_counter()
            asyncio.run(replay(conversation, config))
            plain.append(time.perf_counter() - started)
            with RunStore(Path(folder) / f"r{i}.duckdb") as store:
                started = time.perf_counter()
                asyncio.run(replay(conversation, config, store))
                recorded.append(time.perf_counter() - started)
    ratio = statistics.median(recorded) / statistics.median(plain)
    print(f"3. recording overhead, {conversation.id} ({len(conversation.turns)} messages), median of 3")
    print(f"   in memory {statistics.median(plain):.2f} s, into DuckDB {statistics.median(recorded):.2f} s: "
          f"ratio {ratio:.2f} (target <= 1.3: {'met' if ratio <= 1.3 else 'NOT met'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-offline", action="store_true")
    parser.add_argument("--skip-remote", action="store_true")
    parser.add_argument("--skip-recording", action="store_true")
    args = parser.parse_args()
    if not args.skip_offline:
        offline(args.quick)
    if not args.skip_remote:
        remote()
    if not args.skip_recording:
        recording()


if __name__ == "__main__":
    main()
