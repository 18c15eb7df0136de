"""Replay benchmarks with the offline model, measured side by side in one run.

    python bench/bench_replay.py

LoCoMo conv-41 (663 messages) and BEAM-100K chat 1 from ../shared/datasets, default thresholds
(1000 / 2000), window 10, litellm cache off (every call is computed). Targets: LoCoMo <= 3 s,
BEAM <= 10 s, time per message at BEAM size <= 1.5x LoCoMo's, and replay with DuckDB recording
<= 1.3x the same replay without recording. Medians of --repeats runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from workbench.catalog import shared_datasets_dir
from workbench.datasets import load_conversation
from workbench.replay import ReplayConfig, replay
from workbench.runstore import RunStore


def timed(conversation, record: bool) -> float:
    config = ReplayConfig(cache=False)
    with tempfile.TemporaryDirectory() as folder:
        store = RunStore(Path(folder) / "bench.duckdb") if record else None
        start = time.perf_counter()
        asyncio.run(replay(conversation, config, store))
        elapsed = time.perf_counter() - start
        if store is not None:
            store.close()
    return elapsed


def main(repeats: int) -> None:
    shared = shared_datasets_dir()
    if not shared.is_dir():
        sys.exit(f"needs ../shared/datasets (looked in {shared})")
    cases = {
        "LoCoMo conv-41": load_conversation(shared / "locomo-dev" / "locomo-dev.json", "conv-41"),
        "BEAM-100K chat 1": load_conversation(shared / "beam-100k-dev" / "1"),
    }
    timed(cases["LoCoMo conv-41"], True)  # warm up imports, litellm and DuckDB
    print(f"replay benchmarks, offline model, medians of {repeats}\n")
    print(f"{'conversation':<18} {'messages':>8} {'tokens':>8} {'recorded':>10} {'plain':>9} {'ratio':>6} "
          f"{'per message':>12}")
    per_message = {}
    per_ktoken = {}
    recorded = {}
    for name, conversation in cases.items():
        with_db = statistics.median(timed(conversation, True) for _ in range(repeats))
        without = statistics.median(timed(conversation, False) for _ in range(repeats))
        tokens = sum(len(t.content) for t in conversation.turns) // 4
        per_message[name] = with_db / len(conversation.turns)
        per_ktoken[name] = with_db / tokens * 1000
        recorded[name] = (with_db, without)
        print(f"{name:<18} {len(conversation.turns):>8} {tokens:>8,} {with_db:>9.2f}s {without:>8.2f}s "
              f"{with_db / without:>5.2f}x {per_message[name] * 1000:>10.2f}ms")
    locomo, beam = recorded["LoCoMo conv-41"][0], recorded["BEAM-100K chat 1"][0]
    ratio = per_message["BEAM-100K chat 1"] / per_message["LoCoMo conv-41"]
    worst = max(a / b for a, b in recorded.values())
    token_ratio = per_ktoken["BEAM-100K chat 1"] / per_ktoken["LoCoMo conv-41"]
    print()
    print(f"LoCoMo replay {locomo:.2f} s (target <= 3 s) {'OK' if locomo <= 3 else 'MISSED'}")
    print(f"BEAM replay {beam:.2f} s (target <= 10 s) {'OK' if beam <= 10 else 'MISSED'}")
    print(f"time per message BEAM / LoCoMo = {ratio:.2f}x (target <= 1.5x) {'OK' if ratio <= 1.5 else 'MISSED'}")
    print(f"  (BEAM messages are ~18x longer; per 1,000 tokens: LoCoMo {per_ktoken['LoCoMo conv-41'] * 1000:.1f} ms, "
          f"BEAM {per_ktoken['BEAM-100K chat 1'] * 1000:.1f} ms, ratio {token_ratio:.2f}x)")
    print(f"recording overhead, worst case = {worst:.2f}x (target <= 1.3x) {'OK' if worst <= 1.3 else 'MISSED'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    main(parser.parse_args().repeats)
