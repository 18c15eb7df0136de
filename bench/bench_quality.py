"""Compaction quality of the offline model on the shared datasets, against the baselines.

    python bench/bench_quality.py [--observation 1000 --reflection 2000 --window 10]

For each LoCoMo conversation and BEAM chat: compression (full-history tokens / final context
tokens) and model-free retention (share of each gold answer's content words visible at the end)
for the memory, the full history, the window only, and the newest-K-tokens baseline (K = the final
context size), overall and per category. Nothing here reads probes while compacting.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import defaultdict
from dataclasses import replace

from workbench.catalog import shared_datasets_dir
from workbench.datasets import Conversation, load_dataset
from workbench.replay import ReplayConfig, replay


CUTS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def prefixes(conversation: Conversation) -> list[Conversation]:
    """The conversation stopped at each fraction in CUTS, with the probes whose evidence has been
    said by then. The end of a conversation is one phase of the observe/reflect cycle; replaying
    these shows the figures do not depend on it (the offline model is deterministic, so a prefix
    replays exactly as the start of the whole conversation)."""
    out = []
    for fraction in CUTS:
        turns = conversation.turns[: max(1, int(len(conversation.turns) * fraction))]
        said = {t.id for t in turns}
        probes = [p for p in conversation.probes if p.evidence and set(p.evidence) <= said]
        out.append(replace(conversation, turns=turns, probes=probes))
    return out


def run(config: ReplayConfig) -> None:
    shared = shared_datasets_dir()
    if not shared.is_dir():
        sys.exit(f"needs ../shared/datasets (looked in {shared})")
    suites = {
        "locomo-dev": load_dataset(shared / "locomo-dev" / "locomo-dev.json"),
        "beam-100k-dev": [c for chat in ("1", "2", "3") for c in load_dataset(shared / "beam-100k-dev" / chat)],
    }
    print(f"offline model, thresholds {config.observation_threshold}/{config.reflection_threshold}, "
          f"window {config.last_messages}, recall before {config.recall_on} message(s)\n")
    for suite, conversations in suites.items():
        print(f"== {suite}")
        print(f"{'conversation':<14} {'history':>8} {'context':>8} {'memory':>7} {'max mem':>7} {'compr':>6} {'ret':>6} "
              f"{'full':>6} {'window':>6} {'recent':>6} {'ret/full':>8} {'ret/recent':>10}")
        pooled: dict[str, list[float]] = defaultdict(list)
        categories: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for conversation in conversations:
            result = asyncio.run(replay(conversation, config, None))
            r = result.retention
            memory = result.context[0].content if result.context and result.context[0].role == "system" else ""
            print(f"{conversation.id:<14} {result.full_history_tokens:>8,} {result.final_context_tokens:>8,} "
                  f"{-(-len(memory) // 4):>7,} {max(row['memory_tokens'] for row in result.step_rows):>7,} "
                  f"{result.compression:>5.1f}x {r.retention:>6.3f} {r.full_history:>6.3f} "
                  f"{r.window_only:>6.3f} {r.recent_tokens:>6.3f} {r.relative:>8.3f} "
                  f"{r.retention / r.recent_tokens if r.recent_tokens else float('nan'):>10.2f}")
            pooled["compression"].append(result.compression)
            for category, figures in r.per_category.items():
                for method in ("memory", "full_history", "window_only", "recent_tokens"):
                    categories[category][method].extend([figures[method]] * int(figures["probes"]))
            for method, value in (("memory", r.retention), ("full_history", r.full_history),
                                  ("window_only", r.window_only), ("recent_tokens", r.recent_tokens)):
                pooled[method].extend([value] * r.scored)
        mean = {k: sum(v) / len(v) for k, v in pooled.items()}
        print(f"{'mean':<14} {'':>8} {'':>8} {'':>7} {'':>7} {mean['compression']:>5.1f}x {mean['memory']:>6.3f} "
              f"{mean['full_history']:>6.3f} {mean['window_only']:>6.3f} {mean['recent_tokens']:>6.3f} "
              f"{mean['memory'] / mean['full_history']:>8.3f} {mean['memory'] / mean['recent_tokens']:>10.2f}"
              "   (retention pooled over probes)")
        print("per category (probe-weighted): memory / full / window / recent")
        for category in sorted(categories):
            m = {k: sum(v) / len(v) for k, v in categories[category].items()}
            count = len(categories[category]["memory"])
            print(f"  {category:<26} {m['memory']:.3f} / {m['full_history']:.3f} / {m['window_only']:.3f} / "
                  f"{m['recent_tokens']:.3f}  ({count} probes)")
        if suite.startswith("locomo"):
            print("at 50%, 60%, ..., 100% of each conversation (probes whose evidence was said by then):")
            mine = theirs = scored = 0.0
            ratios = []
            for conversation in conversations:
                results = [asyncio.run(replay(prefix, config, None)) for prefix in prefixes(conversation)]
                print(f"  {conversation.id:<12} compression " + " ".join(f"{r.compression:>5.1f}x" for r in results)
                      + "   retention " + " ".join(f"{r.retention.retention:.3f}" for r in results))
                for r in results:
                    ratios.append(r.compression)
                    mine += r.retention.retention * r.retention.scored
                    theirs += r.retention.recent_tokens * r.retention.scored
                    scored += r.retention.scored
            print(f"  pooled over all points: retention {mine / scored:.3f}, recency of equal size "
                  f"{theirs / scored:.3f} ({mine / theirs:.2f}x), compression {min(ratios):.1f}x-{max(ratios):.1f}x")
        if suite.startswith("beam"):
            longest = max(conversations, key=lambda c: sum(len(t.text) for t in c.turns))
            result = asyncio.run(replay(longest, config, None))
            rows = result.step_rows
            marks = [rows[min(len(rows) - 1, round(len(rows) * k / 10) - 1)] for k in range(1, 11)]
            print(f"bounded memory on the longest chat ({longest.id}, {result.full_history_tokens:,} tokens): "
                  "memory tokens at each tenth of the chat")
            print("  history  " + " ".join(f"{r['history_tokens']:>7,}" for r in marks))
            print("  memory   " + " ".join(f"{r['memory_tokens']:>7,}" for r in marks))
            print("  reflect. " + " ".join(f"{r['reflection_tokens']:>7,}" for r in marks))
            print(f"  max memory {max(r['memory_tokens'] for r in rows):,}, max reflection "
                  f"{max(r['reflection_tokens'] for r in rows):,} (reflection threshold {config.reflection_threshold:,}); "
                  f"backlog at the end {rows[-1]['backlog_tokens']:,} tokens")
        print()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--observation", type=int, default=1000)
    parser.add_argument("--reflection", type=int, default=2000)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--recall-on", choices=("assistant", "every"), default="assistant",
                        help="recall before each assistant message (default) or before every message")
    args = parser.parse_args()
    run(ReplayConfig(observation_threshold=args.observation, reflection_threshold=args.reflection,
                     last_messages=args.window, recall_on=args.recall_on, cache=False))
