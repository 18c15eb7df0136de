"""Compaction quality of the offline model on the shared datasets, against the baselines.

    python bench/bench_quality.py [--observation 1000 --reflection 2000 --window 10] [--ablation] [--frontier]

For each LoCoMo conversation and BEAM chat: compression (full-history tokens / final context
tokens) and model-free retention (share of each gold answer's content words visible at the end)
for the memory, the full history, the window only, and the newest-K-tokens baseline (K = the final
context size), overall and per category. Then, side by side: LoCoMo retention of facts said in
the first vs the last third of each conversation and of facts said by speaker A vs speaker B, and
the BEAM chats' blind spot (backlog outside the window) with and without ``max_backlog``.
``--ablation`` replays LoCoMo and BEAM once per heuristic of the offline model switched off;
``--frontier`` prints what the same sentence selection keeps at each memory size when run once
over a whole conversation (no observe/reflect cascade): not a bound, a reference line; beside it
the same selection told which words the gold answers hold (answer-aware), the one place here that
reads probes while compacting, as a reference for how much of the gap is choosing what to keep.
Nothing else here reads probes while compacting.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import defaultdict
from dataclasses import replace

from omem_core import token_counter
from omem_core.extractive import algorithm
from omem_core.prompts import render_message_line, unescape_structure
from workbench.catalog import shared_datasets_dir
from workbench.datasets import Conversation, load_dataset
from workbench.replay import ReplayConfig, replay
from workbench.retention import Scorer, Visible, content_words, evidence_in_window, newest_tokens


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


def probe_rows(conversation: Conversation, result, window: int) -> list[dict]:
    """Per scored probe: memory and equal-size recency scores, where its evidence was said (the
    latest evidence turn as a fraction of the conversation) and by whom (the roles of its turns).
    A probe whose evidence is all in the final ``window`` messages is not scored, as in a replay."""
    count = token_counter("heuristic")
    scorer = Scorer(conversation)
    history = [t.to_message(conversation.id) for t in conversation.turns]
    memory = Visible(result.context)
    recent = Visible(newest_tokens(history, result.final_context_tokens, count))
    index = {t.id: i for i, t in enumerate(conversation.turns)}
    role = {t.id: t.role for t in conversation.turns}
    rows = []
    in_window = {t.id for t in conversation.turns[-window:]}
    for probe in conversation.probes:
        score = scorer.score(probe, memory)
        evidence = [e for e in probe.evidence if e in index]
        if score is None or not evidence or evidence_in_window(probe, in_window):
            continue
        rows.append({"probe": f"{conversation.id}/{probe.id}", "memory": score, "recent": scorer.score(probe, recent),
                     "position": max(index[e] for e in evidence) / len(conversation.turns),
                     "roles": {role[e] for e in evidence}})
    return rows


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def fairness(rows: list[dict]) -> dict[str, float]:
    """Retention of the facts said in the first and the last third, and by speaker A (the loader's
    ``user``) and speaker B (``assistant``), with probe counts."""
    groups = {"first third": [r for r in rows if r["position"] < 1 / 3],
              "last third": [r for r in rows if r["position"] >= 2 / 3],
              "speaker A": [r for r in rows if r["roles"] == {"user"}],
              "speaker B": [r for r in rows if r["roles"] == {"assistant"}]}
    out = {name: mean([r["memory"] for r in group]) for name, group in groups.items()}
    out.update({f"{name} n": len(group) for name, group in groups.items()})
    return out


def locomo_figures(conversations: list[Conversation], config: ReplayConfig, *, cuts: bool = True) -> dict:
    """Pooled retention, compression and recency ratio at the end (and over the stopping points)."""
    rows, compressions = [], []
    for conversation in conversations:
        result = asyncio.run(replay(conversation, config, None))
        compressions.append(result.compression)
        rows.extend(probe_rows(conversation, result, config.last_messages))
    figures = {"retention": mean([r["memory"] for r in rows]), "recent": mean([r["recent"] for r in rows]),
               "compression": mean(compressions), "min compression": min(compressions), **fairness(rows)}
    figures["ratio"] = figures["retention"] / figures["recent"]
    if cuts:
        cut_rows = []
        for conversation in conversations:
            for prefix in prefixes(conversation):
                cut_rows.extend(probe_rows(prefix, asyncio.run(replay(prefix, config, None)), config.last_messages))
        figures["ratio over cuts"] = sum(r["memory"] for r in cut_rows) / sum(r["recent"] for r in cut_rows)
        figures["cut rows"] = cut_rows
    return figures


def paired_ratio_ci(base: list[dict], other: list[dict], replicates: int = 2000) -> tuple[float, float]:
    """95% interval of ``ratio(other) - ratio(base)`` over the stopping points. What is resampled is
    the *probe*, with all its rows (one per stopping point that has it), drawn the same for both
    configurations: a probe's scores at the six points are not independent draws."""
    import numpy as np

    if [r["probe"] for r in base] != [r["probe"] for r in other]:
        raise ValueError("the two replays scored different probes; they cannot be paired")
    probes = sorted({r["probe"] for r in base})
    index = {probe: i for i, probe in enumerate(probes)}
    totals = np.zeros((4, len(probes)))  # memory and recent of base, then of other, summed per probe
    for row_a, row_b in zip(base, other):
        i = index[row_a["probe"]]
        totals[:, i] += (row_a["memory"], row_a["recent"], row_b["memory"], row_b["recent"])
    rng = np.random.default_rng(20261203)
    draws = rng.integers(0, len(probes), size=(replicates, len(probes)))
    a_mem, a_rec, b_mem, b_rec = (totals[k][draws].sum(1) for k in range(4))
    low, high = np.percentile(b_mem / b_rec - a_mem / a_rec, [2.5, 97.5])
    return float(low), float(high)


def beam_figures(conversations: list[Conversation], config: ReplayConfig, max_backlog: int | None) -> dict:
    """Pooled retention, compression, recency ratio and blind spot (mean and max backlog outside
    the window over every read) of the BEAM chats, with ``max_backlog`` (None: off)."""
    config = replace(config, max_backlog=max_backlog)
    results = [asyncio.run(replay(c, config, None)) for c in conversations]
    scored = sum(r.retention.scored for r in results)
    backlog = [row["backlog_tokens"] for r in results for row in r.step_rows]
    retention = sum(r.retention.retention * r.retention.scored for r in results) / scored
    recent = sum(r.retention.recent_tokens * r.retention.scored for r in results) / scored
    return {"retention": retention, "ratio": retention / recent,
            "compression": mean([r.compression for r in results]),
            "blind spot mean": mean(backlog), "blind spot max": max(backlog),
            "per chat max": [max(row["backlog_tokens"] for row in r.step_rows) for r in results]}


HEURISTICS = {
    "role_neutral": "assistant lines weigh as much as user lines",
    "position_fair": "reflection weighs old and new notes alike",
    "rarity": "common words weigh less (tokenizer vocabulary rank)",
    "clauses": "a clause with its own subject is a unit",
    "context": "a short sentence pointing back joined to the one before",
    "pleasantries": "sentences with no specific word never picked",
    "split": "no split after abbreviations, initials, list numbers",
    "openers": "openers that can start a phrase kept unless punctuated",
    "speakers": "lower-case speaker names recognised",
}


def answer_weights(conversation: Conversation) -> dict[str, float]:
    """Each gold answer's content words, weighing 10 split among the words of its answer: what an
    observer would weigh if it knew every question that will be asked (a reference, never a model)."""
    weights: dict[str, float] = defaultdict(float)
    for probe in conversation.probes:
        words = content_words(probe.gold) if probe.gold and probe.evidence else set()
        for word in words:
            weights[word] += 10.0 / len(words)
    return weights


def one_shot(locomo: list[Conversation], budget: int, window_size: int, *, answer_aware: bool) -> tuple[float, float, float]:
    """Mean compression, retention and equal-size recency retention of the offline observer run
    once over each whole conversation (all but the window) at ``budget``, the window added."""
    count = token_counter("heuristic")
    scores, recents, compressions = [], [], []
    for conversation in locomo:
        history = [t.to_message(conversation.id) for t in conversation.turns]
        window = history[-window_size:]
        block = "\n".join(render_message_line(m) for m in history[:-window_size])
        gold = answer_weights(conversation)
        weigh = (lambda sentence: {w: gold[w] for w in content_words(sentence) if w in gold}) if answer_aware else None
        notes = unescape_structure(algorithm.observe(block, budget, weigh=weigh))
        size = count([notes])[0] + sum(count([m.content for m in window]))
        compressions.append(sum(count([m.content for m in history])) / size)
        scorer = Scorer(conversation)
        visible = Visible(window, notes=[notes])
        recent = Visible(newest_tokens(history, size, count))
        window_ids = {m.id for m in window}
        for probe in conversation.probes:
            score = scorer.score(probe, visible)
            if score is not None and probe.evidence and not evidence_in_window(probe, window_ids):
                scores.append(score)
                recents.append(scorer.score(probe, recent))
    return mean(compressions), mean(scores), mean(recents)


def frontier(config: ReplayConfig, locomo: list[Conversation]) -> None:
    """What sentence extraction of this kind can reach at each memory size, without the
    observe/reflect cascade: the offline observer run once over each whole conversation (all but
    the window) at a given target, the window added, scored like a replay and against the
    equal-size recency baseline; beside it the same selection with each word weighed by the gold
    answers instead (*answer-aware*: it reads the probes, so it is a reference for how much of the
    gap is what to keep rather than how notes are written, not a model). The replays at several
    thresholds are printed below: their distance to the one-shot line is what the cascade costs."""
    print("== what one-shot extraction reaches at each size (LoCoMo dev; the offline observer over the whole history)")
    print(f"{'target':>8} {'compr':>6} {'ret':>6} {'recent':>6} {'ratio':>6}   answer-aware: {'compr':>6} {'ret':>6} {'ratio':>6}")
    for budget in (1000, 1500, 2000, 2500, 3000, 4000):
        compression, retention, recent = one_shot(locomo, budget, config.last_messages, answer_aware=False)
        aware = one_shot(locomo, budget, config.last_messages, answer_aware=True)
        print(f"{budget:>8,} {compression:>5.1f}x {retention:>6.3f} {recent:>6.3f} {retention / recent:>5.2f}x"
              f"                 {aware[0]:>5.1f}x {aware[1]:>6.3f} {aware[1] / aware[2]:>5.2f}x")
    print("replays (observe/reflect cascade) at other thresholds, window unchanged:")
    for observation, reflection in ((500, 1000), (1000, 2000), (1500, 3000), (2000, 4000)):
        f = locomo_figures(locomo, replace(config, observation_threshold=observation, reflection_threshold=reflection),
                           cuts=False)
        print(f"  {observation:>5}/{reflection:<5} {f['compression']:>5.1f}x {f['retention']:>6.3f} {f['recent']:>6.3f} "
              f"{f['ratio']:>5.2f}x")
    print()


def ablation(config: ReplayConfig, locomo: list[Conversation], beam: list[Conversation]) -> None:
    print("== ablation: each heuristic switched off in turn (LoCoMo at the end and over the stopping points; BEAM)")
    print("   'off - on @cuts' is the change of the recency ratio over the stopping points when the heuristic is")
    print("   switched off, with its paired 95% bootstrap interval over probes (negative: the heuristic helps)")
    print(f"{'switched off':<16} {'ret':>6} {'compr':>6} {'ratio':>6} {'ratio@cuts':>10} {'off - on @cuts (95% CI)':>27} "
          f"{'first':>6} {'last':>6} {'spk A':>6} {'spk B':>6} {'BEAM ret':>8} {'BEAM ratio':>10}")
    base: list[dict] = []
    base_ratio = 0.0
    for name in ("(none)", *HEURISTICS):
        algorithm.DISABLED.clear()
        if name != "(none)":
            algorithm.DISABLED.add(name)
        try:
            f = locomo_figures(locomo, config)
            b = beam_figures(beam, config, None)
        finally:
            algorithm.DISABLED.clear()
        if name == "(none)":
            base, base_ratio, delta = f["cut rows"], f["ratio over cuts"], ""
        else:
            low, high = paired_ratio_ci(base, f["cut rows"])
            delta = f"{f['ratio over cuts'] - base_ratio:+.3f} ({low:+.3f}, {high:+.3f})"
        print(f"{name:<16} {f['retention']:>6.3f} {f['compression']:>5.1f}x {f['ratio']:>5.3f}x "
              f"{f['ratio over cuts']:>9.3f}x {delta:>27} "
              f"{f['first third']:>6.3f} {f['last third']:>6.3f} {f['speaker A']:>6.3f} {f['speaker B']:>6.3f} "
              f"{b['retention']:>8.3f} {b['ratio']:>9.3f}x")
    print()


def summary(config: ReplayConfig, locomo: list[Conversation], beam: list[Conversation], max_backlog: int) -> None:
    f = locomo_figures(locomo, config)
    c = fairness(f["cut rows"])
    print("== the round-2 figures side by side")
    print(f"LoCoMo   retention {f['retention']:.3f} at {f['compression']:.1f}x (lowest {f['min compression']:.1f}x), "
          f"{f['ratio']:.2f}x the equal-size recency baseline ({f['recent']:.3f})")
    print(f"         first third {f['first third']:.3f} ({f['first third n']} probes) vs last third "
          f"{f['last third']:.3f} ({f['last third n']}): gap {f['first third'] - f['last third']:+.3f}")
    print(f"         speaker A {f['speaker A']:.3f} ({f['speaker A n']} probes) vs speaker B "
          f"{f['speaker B']:.3f} ({f['speaker B n']}): gap {f['speaker A'] - f['speaker B']:+.3f}")
    print(f"         over the stopping points: {f['ratio over cuts']:.2f}x recency; first third {c['first third']:.3f} "
          f"vs last {c['last third']:.3f} ({c['first third'] - c['last third']:+.3f}); speaker A {c['speaker A']:.3f} "
          f"vs B {c['speaker B']:.3f} ({c['speaker A'] - c['speaker B']:+.3f})")
    for label, ceiling in (("off", None), (f"{max_backlog:,}", max_backlog)):
        b = beam_figures(beam, config, ceiling)
        print(f"BEAM     max_backlog {label:>6}: retention {b['retention']:.3f} at {b['compression']:.1f}x "
              f"({b['ratio']:.2f}x recency); blind spot mean {b['blind spot mean']:,.0f}, max {b['blind spot max']:,} "
              f"tokens (per chat {', '.join(f'{m:,}' for m in b['per chat max'])}; "
              f"{b['blind spot max'] / config.observation_threshold:.1f}x the observation threshold)")
    print()


def run(config: ReplayConfig, *, with_ablation: bool = False, with_frontier: bool = False) -> None:
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
    beam = suites["beam-100k-dev"]
    summary(config, suites["locomo-dev"], beam, config.observation_threshold)
    if with_frontier:
        frontier(config, suites["locomo-dev"])
    if with_ablation:
        ablation(config, suites["locomo-dev"], beam)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--observation", type=int, default=1000)
    parser.add_argument("--reflection", type=int, default=2000)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--recall-on", choices=("assistant", "every"), default="assistant",
                        help="recall before each assistant message (default) or before every message")
    parser.add_argument("--ablation", action="store_true",
                        help="also replay with each heuristic of the offline model switched off (about 2 minutes more)")
    parser.add_argument("--frontier", action="store_true",
                        help="also print what one-shot extraction reaches at each memory size, and the same selection told the answers (about 15 s more)")
    args = parser.parse_args()
    run(ReplayConfig(observation_threshold=args.observation, reflection_threshold=args.reflection,
                     last_messages=args.window, recall_on=args.recall_on, cache=False),
        with_ablation=args.ablation, with_frontier=args.frontier)
