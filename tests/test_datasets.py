"""Dataset loaders: the project's format, public formats, and clear errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.catalog import DEMO_DATASET, PROJECT_DATASETS
from workbench.datasets import DatasetError, detect_format, load_conversation, load_dataset


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def line(**fields) -> str:
    base = {"type": "message", "conversation_id": "c", "id": "m1", "role": "user", "content": "hi",
            "timestamp": "2024-01-01T10:00:00Z"}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}) + "\n"


def test_project_datasets_load() -> None:
    demo = load_conversation(DEMO_DATASET)
    assert demo.id == "priya-lisbon" and len(demo.turns) == 200 and len(demo.probes) >= 20
    assert demo.turns[0].speaker == "Priya" and demo.turns[0].content.startswith("Priya: ")
    assert all(p.evidence for p in demo.probes) and demo.warnings == []
    # facts are planted early and asked about late: every piece of evidence has left a 10-message
    # window by the end, and most of it sits in the first half of the chat
    position = {t.id: i for i, t in enumerate(demo.turns)}
    evidence = sorted(position[e] for p in demo.probes for e in p.evidence)
    assert evidence[-1] < len(demo.turns) - 30 and evidence[len(evidence) // 2] < len(demo.turns) / 2
    tiny = load_conversation(PROJECT_DATASETS / "tiny.jsonl")
    assert len(tiny.turns) == 12 and len(tiny.probes) == 3


@pytest.mark.parametrize(
    "text, record, field, problem",
    [
        ("{not json\n", "line 1", None, "invalid JSON"),
        (line(role="robot"), "line 1", "role", "unknown role 'robot'"),
        (line(content=...), "line 1", "content", "missing"),
        (line(timestamp="yesterday"), "line 1", "timestamp", "unrecognised date-time 'yesterday'"),
        (line(content=5), "line 1", "content", "expected str"),
        (line() + line(), "conversation 'c' message 1", "id", "duplicate message id 'm1'"),
        (line(type="poll"), "line 1", "type", "unknown record type"),
        ("\n\n", "file", None, "has no records"),
        (json.dumps({"conversation_id": "c", "question": "q", "id": "p"}) + "\n", "conversation 'c'", None,
         "has no messages"),
    ],
)
def test_bad_omem_files_name_file_record_and_field(tmp_path, text, record, field, problem) -> None:
    path = write(tmp_path, "bad.jsonl", text)
    with pytest.raises(DatasetError) as caught:
        load_dataset(path, "omem")
    error = caught.value
    assert error.file == str(path) and error.record == record and error.field == field
    assert problem in str(error) and str(path) in str(error)


def test_invalid_utf8_is_a_dataset_error(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(line().encode() + b'{"x": "\xff\xfe"}\n')
    with pytest.raises(DatasetError, match="line 2.*UTF-8"):
        load_dataset(path, "omem")


def test_dangling_evidence_warns_and_counts(tmp_path) -> None:
    probe = json.dumps({"type": "probe", "conversation_id": "c", "id": "p1", "question": "q?", "answer": "a",
                        "evidence": ["m1", "nowhere"]})
    conv = load_conversation(write(tmp_path, "c.jsonl", line() + probe + "\n"))
    assert conv.dangling_evidence == 1 and "nowhere" in conv.warnings[0]
    assert conv.probes[0].evidence == ("m1",)


def test_openai_and_sharegpt_exports(tmp_path) -> None:
    openai = write(tmp_path, "o.json", json.dumps([{"id": "x", "messages": [
        {"role": "system", "content": "be nice"}, {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        {"role": "assistant", "content": "hi"}]}]))
    assert detect_format(openai) == "openai"
    conv = load_conversation(openai)
    assert [t.role for t in conv.turns] == ["system", "user", "assistant"] and conv.turns[1].text == "hello"
    share = write(tmp_path, "s.json", json.dumps([{"id": "y", "conversations": [
        {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}]))
    assert detect_format(share) == "sharegpt"
    assert [t.role for t in load_conversation(share).turns] == ["user", "assistant"]
    chatgpt = write(tmp_path, "conversations.json", json.dumps([{"title": "t", "id": "z", "mapping": {
        "a": {"id": "a", "message": None},
        "b": {"id": "b", "message": {"id": "b", "author": {"role": "user"}, "create_time": 1700000000,
                                     "content": {"parts": ["first"]}}},
        "c": {"id": "c", "message": {"id": "c", "author": {"role": "assistant"}, "create_time": 1700000060,
                                     "content": {"parts": ["second"]}}}}}]))
    conv = load_conversation(chatgpt)
    assert [t.text for t in conv.turns] == ["first", "second"]
    bad = write(tmp_path, "b.json", json.dumps([{"id": "y", "conversations": [{"from": "alien", "value": "q"}]}]))
    with pytest.raises(DatasetError, match="conversation 0 message 0: field 'from': unknown role 'alien'"):
        load_dataset(bad, "sharegpt")


def test_unrecognised_format_says_so(tmp_path) -> None:
    with pytest.raises(DatasetError, match="format not recognised"):
        load_dataset(write(tmp_path, "x.json", json.dumps({"hello": 1})))
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(tmp_path / "missing.json")
    with pytest.raises(DatasetError, match="unknown format"):
        load_dataset(write(tmp_path, "y.jsonl", line()), "csv")


def test_locomo_errors_name_the_sample_and_field(tmp_path) -> None:
    sample = {"sample_id": "s", "qa": [], "conversation": {"speaker_a": "A", "speaker_b": "B",
              "session_1_date_time": "sometime", "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "x"}]}}
    with pytest.raises(DatasetError, match="sample 0 conversation: field 'session_1_date_time'"):
        load_dataset(write(tmp_path, "l.json", json.dumps([sample])), "locomo")


# -- the real datasets in ../shared -----------------------------------------------------------


def test_locomo_dev(shared_datasets: Path) -> None:
    conversations = load_dataset(shared_datasets / "locomo-dev" / "locomo-dev.json")
    assert [c.id for c in conversations] == ["conv-26", "conv-30", "conv-41", "conv-42"]
    conv = conversations[0]
    first = conv.turns[0]
    assert first.id == "D1:1" and first.speaker == "Caroline" and first.role == "user"
    assert first.created_at.isoformat().startswith("2023-05-08T13:56")
    assert any(t.role == "assistant" and t.speaker == "Melanie" for t in conv.turns)
    assert any("[shares an image:" in t.text for t in conv.turns)
    adversarial = [p for c in conversations for p in c.probes if p.category == "adversarial"]
    assert adversarial and all(p.gold is None and p.abstention for p in adversarial)  # the trap answer is no fact
    assert {p.category for c in conversations for p in c.probes} == {
        "multi-hop", "temporal", "open-domain", "single-hop", "adversarial"}
    scorable = [p for c in conversations for p in c.probes if p.gold]
    assert len(scorable) == 584  # every category 1–4 item (two category-5 items also carry a yes/no `answer`)
    assert sum(c.dangling_evidence for c in conversations) >= 1  # the dataset's malformed ids are counted


def test_beam_dev(shared_datasets: Path) -> None:
    for chat in ("1", "2", "3"):
        [conv] = load_dataset(shared_datasets / "beam-100k-dev" / chat)
        assert len(conv.turns) > 150 and len(conv.probes) == 20
        abstention = [p for p in conv.probes if p.category == "abstention"]
        assert len(abstention) == 2 and all(p.abstention and p.gold is None and p.reference for p in abstention)
        assert all(p.gold for p in conv.probes if p not in abstention)
        assert sum(1 for p in conv.probes if p.evidence) >= 10
        assert "->->" not in conv.turns[0].text
        times = [t.created_at for t in conv.turns]
        assert times == sorted(times)


def test_memorybank(shared_datasets: Path) -> None:
    conversations = load_dataset(shared_datasets / "memorybank")
    assert len(conversations) >= 10
    emily = next(c for c in conversations if c.id == "memorybank-Emily")
    assert emily.turns[0].speaker == "Emily" and len(emily.probes) > 0
    assert all(p.gold is None for p in emily.probes)
    assert all(c.id == c.id.strip() for c in conversations)
