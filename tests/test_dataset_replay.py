"""The new formats end to end: a LongMemEval-schema file and a REALTALK-style chat load by
detection, replay, and have their probes scored (abstention probes left to a judge)."""

from __future__ import annotations

import asyncio

from workbench.catalog import PROJECT_DATASETS, known_datasets
from workbench.datasets import load_conversation
from workbench.replay import ReplayConfig, replay
from workbench.runstore import RunStore

SAMPLES = PROJECT_DATASETS / "samples"


def replayed(tmp_path, path, conversation_id=None):
    """(Window 2: the samples are short, and a probe is scored once its evidence has left the window.)"""
    conversation = load_conversation(path, conversation_id)
    with RunStore(tmp_path / "runs.duckdb") as store:
        result = asyncio.run(replay(conversation, ReplayConfig(cache=False, last_messages=2), store))
        probes = store.probes(result.run_id)
    assert result.status == "completed" and result.steps > 0
    return conversation, result, probes


def test_a_longmemeval_instance_replays_with_its_probe_scored(tmp_path) -> None:
    conversation, result, probes = replayed(tmp_path, SAMPLES / "longmemeval-sample.json", "omem-lme-001")
    assert conversation.format == "longmemeval"
    assert result.retention is not None and result.retention.scored == 1
    assert list(result.retention.per_category) == ["single-session-user"]
    assert set(probes.category) == {"single-session-user"} and probes.score.notna().all()


def test_a_longmemeval_abstention_is_replayed_but_not_scored_by_words(tmp_path) -> None:
    _, result, probes = replayed(tmp_path, SAMPLES / "longmemeval-sample.json", "omem-lme-004_abs")
    assert len(probes) > 0 and probes.score.isna().all() and probes.gold.isna().all()
    assert result.retention is None or result.retention.scored == 0


def test_a_realtalk_style_chat_replays_with_named_categories_scored(tmp_path) -> None:
    conversation, result, probes = replayed(tmp_path, SAMPLES / "realtalk-sample.json")
    assert conversation.format == "locomo" and len(conversation.probes) == 3
    assert result.retention is not None and result.retention.scored == 3
    assert set(result.retention.per_category) == {"multi-hop", "temporal", "open-domain"}
    assert probes.score.notna().all()


def test_the_samples_are_in_the_catalog_with_their_formats() -> None:
    formats = {e.name: e.format for e in known_datasets() if e.origin == "project"}
    assert formats["longmemeval-sample"] == "longmemeval" and formats["realtalk-sample"] == "locomo"
    assert formats["beam-sample"] == "beam"
