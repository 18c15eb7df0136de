"""Server-side render time of every app page (Streamlit's AppTest), on a large run store.

    python bench/bench_app.py [--runs 300] [--steps 10000] [--repeats 3]

The store is synthetic, written straight through RunStore.write_run (no replay): an experiment of
``--runs`` runs (10 configurations × runs/10 conversations, 100 steps, 12 records, 12 model calls
with traces, 20 probes with loss rows each) and one ``--steps``-step run (about a tenth of its
reads compact, with a model call and a record each) that the explorer, Traces and the presentation
open. Target: every page renders in <= 1 s. Figures: the first render of each page in a fresh app
session, then the median of ``--repeats`` reruns.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from omem_core import ObservationRecord  # noqa: E402
from omem_core.prompts import BUILTIN_PROMPTS  # noqa: E402
from workbench.experiments import ExperimentOptions, config_grid, labels  # noqa: E402
from workbench.runstore import RunStore  # noqa: E402

PAGES = ["experiments", "tune", "compare", "explorer", "traces", "present", "runs", "prompts"]
T0 = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)
CATEGORIES = ["multi-hop", "temporal", "open-domain", "single-hop", "adversarial"]


def synthetic_run(conversation: str, steps: int, config: dict, label: str | None, seed: int,
                  records_every: int) -> tuple[dict, list[dict]]:
    """A whole run as RunStore.write_run takes it: steps, records, calls with traces, probes, losses."""
    messages = [{"idx": i, "message_id": f"{conversation}-m{i}", "role": "user" if i % 2 == 0 else "assistant",
                 "speaker": None, "content": f"message {i} of {conversation}: Priya moved to Lisbon on {i % 28 + 1} May.",
                 "created_at": T0 + timedelta(minutes=i), "tokens": 20} for i in range(2 * steps)]
    rows, records, calls = [], [], []
    history, backlog, unreflected, reflection = 0, 0, 0, 0
    memory: list[str] = []
    for step in range(steps):
        history += 40
        backlog += 40 if step > 5 else 0
        observed = step > 5 and step % records_every == 0
        reflected = observed and step % (records_every * 5) == 0
        if observed:
            record_id = f"obs-{seed}-{step}"
            sources = [f"{conversation}-m{i}" for i in range(max(0, 2 * step - 20), 2 * step - 10)]
            records.append({"record": ObservationRecord(id=record_id, thread_id="t", resource_id=None,
                                                        created_at=T0 + timedelta(minutes=2 * step), kind="observation",
                                                        source_ids=tuple(sources), text=f"- Priya: fact {step}."),
                            "step": step, "tokens": 8})
            calls.append({"step": step, "stage": "observe", "model": "omem/extractive", "prompt_version": "v2",
                          "prompt_sha256": "x", "source_count": len(sources), "volume_before": backlog,
                          "volume_after": 40, "input_tokens": backlog + 600, "output_tokens": 8, "latency_ms": 3.0,
                          "cost_usd": 0.0, "cache_hit": False, "error": None, "record_id": record_id, "attempts": 1,
                          "trimmed": False,
                          "request": json.dumps([[{"role": "system", "content": "You are the observer."},
                                                  {"role": "user", "content": "messages " * 200}]]),
                          "response": json.dumps([f"- Priya: fact {step}."])})
            memory.append(record_id)
            unreflected += 8
            backlog = 40
        if reflected:
            unreflected, reflection = 0, 60
        rows.append({"step": step, "message_index": 2 * step + 1, "message_id": f"{conversation}-m{2 * step + 1}",
                     "history_tokens": history, "window_tokens": 400, "backlog_tokens": backlog,
                     "unreflected_tokens": unreflected, "reflection_tokens": reflection,
                     "memory_tokens": unreflected + reflection, "context_tokens": 400 + unreflected + reflection,
                     "observed": observed, "reflected": reflected, "cursor_id": None,
                     "cursor_index": 2 * step - 10 if observed else -1, "records": len(records),
                     "window_ids": json.dumps([f"{conversation}-m{i}" for i in range(max(0, 2 * step - 8), 2 * step + 1)]),
                     "memory_ids": json.dumps(memory[-20:])})
    probes, losses = [], []
    for p in range(20):
        score = float((seed * 7 + p) % 3 != 0)
        category = CATEGORIES[p % 5]
        for method in ("memory", "full_history", "window_only", "recent_tokens"):
            probes.append({"probe_id": f"p{p:02d}", "method": method, "question": f"Where did Priya go ({p})?",
                           "gold": "Lisbon", "category": category, "evidence": json.dumps([f"{conversation}-m{p}"]),
                           "evidence_in_window": False, "score": score if method == "memory" else 1.0,
                           "answer": None})
        losses.append({"probe_id": f"p{p:02d}", "category": category, "evidence": [f"{conversation}-m{p}"],
                       "in_window_at_end": False, "observation_ids": [], "observation_score": score,
                       "observed": bool(score), "reflection_score": score, "reflected": bool(score),
                       "visible_score": score, "visible": bool(score), "lost_at": None if score else "observation",
                       "lost_step": None if score else min(steps - 1, 6 + p)})
    run = {"dataset": str(ROOT / "datasets" / "demo.jsonl"), "dataset_format": "omem", "conversation_id": conversation,
           "label": label, "config": config, "config_label": label, "status": "completed", "steps": steps,
           "planned_steps": steps, "full_history_tokens": history, "final_context_tokens": rows[-1]["context_tokens"],
           "compression": history / rows[-1]["context_tokens"], "retention": sum(
               x["score"] for x in probes if x["method"] == "memory") / 20, "observer_calls": len(calls),
           "reflector_calls": 0, "cache_hits": 0, "cost_usd": 0.0, "elapsed_s": 1.0,
           "blind_spot_tokens": 120.0, "blind_spot_max": 400, "input_tokens": 1000, "output_tokens": 100,
           "model_latency_ms": 30.0}
    return {"run": run, "steps": rows, "records": records, "calls": calls, "probes": probes,
            "losses": losses}, messages


def build(path: Path, runs: int, steps: int) -> str:
    store = RunStore(path)
    grid = config_grid(observers=["omem/extractive"], reflectors=["omem/extractive"],
                       observation=[150, 300, 600, 1200, 2400], reflection=[1000, 4000], windows=[10],
                       observer_prompts=[BUILTIN_PROMPTS["observer"][0]],
                       reflector_prompts=[BUILTIN_PROMPTS["reflector"][0]])
    configs = [c.to_json() for c in grid]
    names = labels(configs)
    conversations = [f"conv-{i:03d}" for i in range(max(1, runs // len(configs)))]
    experiment_id = store.create_experiment(name="bench", dataset=str(ROOT / "datasets" / "demo.jsonl"),
                                            dataset_format="omem", conversations=conversations,
                                            configs=[{"label": n, "config": c} for n, c in zip(names, configs)],
                                            options={**ExperimentOptions().__dict__})
    seed = 0
    for conversation in conversations:
        for name, config in zip(names, configs):
            payload, messages = synthetic_run(conversation, 100, config, name, seed, records_every=8)
            payload["run"]["experiment_id"] = experiment_id
            store.write_run(payload, messages=messages)
            seed += 1
    store.finish_experiment(experiment_id, "completed", None, 10.0)
    payload, messages = synthetic_run("long-chat", steps, configs[0], None, seed, records_every=10)
    store.write_run(payload, messages=messages)  # the newest run: the explorer opens it
    return experiment_id


def main(runs: int, steps: int, repeats: int) -> None:
    from streamlit.testing.v1 import AppTest

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.duckdb"
        started = time.perf_counter()
        build(path, runs, steps)
        store = RunStore(path)
        print(f"store: {len(store.runs())} runs ({runs} in one experiment) + a {steps:,}-step run, "
              f"built in {time.perf_counter() - started:.1f} s")
        os.environ["OMEM_DB"] = str(path)
        os.environ["OMEM_CACHE_DIR"] = str(Path(folder) / "cache")
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
        at.run()  # imports and the first page
        print(f"{'page':<12} {'first (s)':>10} {'rerun median (s)':>17}  target <= 1 s")
        worst = 0.0
        for page in PAGES:
            start = time.perf_counter()
            at.switch_page(f"workbench/app_pages/{page}.py").run()
            first = time.perf_counter() - start
            assert not at.exception, (page, at.exception)
            again = []
            for _ in range(repeats):
                start = time.perf_counter()
                at.run()
                again.append(time.perf_counter() - start)
            median = statistics.median(again)
            worst = max(worst, first, median)
            print(f"{page:<12} {first:>10.2f} {median:>17.2f}  {'ok' if max(first, median) <= 1.0 else 'OVER'}")
        print(f"slowest: {worst:.2f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    main(args.runs, args.steps, args.repeats)
