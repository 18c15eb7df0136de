"""Compaction quality of the offline model on the real dev conversations (``../shared/datasets``).

These are the acceptance figures of the compaction-quality issue, checked at the default
thresholds: if a change to the offline model or the read algorithm makes memory keep fewer facts,
compress less, or grow with the conversation, a test here fails. ``bench/bench_quality.py`` prints
the full table (per conversation and category, against the baselines).
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import SHARED_DATASETS

from workbench.datasets import load_dataset
from workbench.replay import ReplayConfig, replay

DEFAULTS = ReplayConfig(cache=False)


@pytest.fixture(scope="module")
def locomo():
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"../shared/datasets is absent ({SHARED_DATASETS}): real-data tests need it")
    shared = SHARED_DATASETS
    conversations = load_dataset(shared / "locomo-dev" / "locomo-dev.json")
    return [asyncio.run(replay(c, DEFAULTS, None)) for c in conversations]


def pooled(results, field: str) -> float:
    total = sum(getattr(r.retention, field) * r.retention.scored for r in results)
    return total / sum(r.retention.scored for r in results)


def test_locomo_retention_and_compression_targets(locomo) -> None:
    memory, full = pooled(locomo, "retention"), pooled(locomo, "full_history")
    recent = pooled(locomo, "recent_tokens")
    assert memory >= 0.65, f"retention {memory:.3f}"
    assert memory >= 0.72 * full, f"retention {memory:.3f} is {memory / full:.1%} of full history"
    assert memory >= 1.5 * recent, f"{memory / recent:.2f}x the recency baseline of equal size"
    for result in locomo:
        assert result.compression >= 5, f"{result.compression:.1f}x"
        # Far above the window alone on every conversation: memory carries what left the window.
        assert result.retention.retention >= 2.5 * result.retention.window_only


def test_memory_stays_bounded_on_the_longest_beam_chat(shared_datasets) -> None:
    chats = [c for n in ("1", "2", "3") for c in load_dataset(shared_datasets / "beam-100k-dev" / n)]
    longest = max(chats, key=lambda c: sum(len(t.text) for t in c.turns))
    result = asyncio.run(replay(longest, DEFAULTS, None))
    memory = [row["memory_tokens"] for row in result.step_rows]
    reflections = [row["reflection_tokens"] for row in result.step_rows]
    threshold = DEFAULTS.reflection_threshold
    assert result.full_history_tokens > 100_000 and result.reflector_calls >= 5
    assert max(reflections) <= threshold  # every reflection fits the reflection threshold
    # reflection + unreflected notes (which reflect once they exceed the threshold) + one note
    assert max(memory) <= 2 * threshold + DEFAULTS.observation_threshold
    half = len(memory) // 2
    assert max(memory[half:]) <= 1.1 * max(memory[:half])  # no growth with the conversation


def test_replay_is_deterministic_byte_for_byte(shared_datasets) -> None:
    conversation = load_dataset(shared_datasets / "locomo-dev" / "locomo-dev.json")[1]
    first, second = (asyncio.run(replay(conversation, DEFAULTS, None)) for _ in range(2))
    assert [m.content for m in first.context] == [m.content for m in second.context]
    assert first.step_rows == second.step_rows
