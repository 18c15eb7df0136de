"""Dataset loaders: the project's format, public formats, and clear errors on bad input."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.catalog import DEMO_DATASET, PROJECT_DATASETS
from workbench.datasets import (
    FORMATS,
    REGISTRY,
    DatasetError,
    detect_format,
    get_format,
    list_conversations,
    load_conversation,
    load_dataset,
    markdown_table,
    parse_datetime,
)
from workbench.datasets.source import Source
from workbench.retention import content_words, probe_score

ROOT = Path(__file__).resolve().parents[1]

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
        ("{not json\n", "line 1 column 2", None, "invalid JSON"),
        (line() + '{"role": "user", "content": "unclosed\n', "line 2 column 29", None,
         "invalid JSON: Unterminated string starting at column 29"),
        (line(role="robot"), "line 1", "role", "unknown role 'robot'"),
        (line(content=...), "line 1", "content", "missing"),
        (line(content=None), "line 1", "content", "is null; expected str"),  # was "missing": it is there
        (line(timestamp=True), "line 1", "timestamp", "expected str or int or float, got bool"),
        (line(timestamp="yesterday"), "line 1", "timestamp", "unrecognised date-time 'yesterday'"),
        (line(timestamp="yesterday"), "line 1", "timestamp", "or a Unix time as a JSON number"),  # (accepted too)
        # (a Unix time in quotes: "unrecognised" and a list of forms that never named Unix time)
        (line(timestamp="1704067300"), "line 1", "timestamp",
         "'1704067300' looks like a Unix time written as text: write it as a JSON number (1704067300, no quotes)"),
        (line(timestamp="2024"), "line 1", "timestamp", "unrecognised date-time '2024'"),  # a year, not Unix time
        (line(content=5), "line 1", "content", "expected str"),
        # the file's lines, which an editor goes to (it said "conversation 'c', its 2nd message")
        (line() + line(), "line 2", "id", "duplicate message id 'm1' (line 1 has it too)"),
        (line(type="poll"), "line 1", "type", "unknown record type"),
        ("\n\n", "file", None, "the file is empty"),
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


def test_a_line_with_a_question_and_a_message_must_say_which_it_is(tmp_path) -> None:
    """Such a line was read as a probe: its message (role, content, timestamp) was dropped without
    a word, and a file of one such line said only "has no messages"."""
    both = line(type=..., question="x") + line(id="m2", role="assistant", content="ok", timestamp="2024-01-01T10:01:00Z")
    with pytest.raises(DatasetError, match=r"line 1: field 'type': missing: the line has a question and a "
                                           r"message's role; say \"type\": \"message\" or \"probe\""):
        load_conversation(write(tmp_path, "c.jsonl", both))
    said = line(type="message", question="x") + line(id="m2", role="assistant", content="ok",
                                                      timestamp="2024-01-01T10:01:00Z")
    assert [t.id for t in load_conversation(write(tmp_path, "d.jsonl", said)).turns] == ["m1", "m2"]


def test_invalid_utf8_is_a_dataset_error(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(line().encode() + b'{"x": "\xff\xfe"}\n')
    with pytest.raises(DatasetError, match="line 2.*UTF-8"):
        load_dataset(path, "omem")


def test_half_a_character_is_replaced_and_said_not_a_crash_of_the_run_store(tmp_path) -> None:
    """Valid JSON can spell half an emoji (a lone "\\ud83d"): the text loaded, and a replay then
    failed with a DuckDB traceback, its JSON line missing and an experiment "failed" with no reason."""
    sharegpt = write(tmp_path, "s.json", r'[{"id": "s\ud800", "conversations": ['
                     r'{"from": "human", "value": "my cat \ud83d is Tom"},'
                     r'{"from": "gpt", "value": "a pair \ud83d\ude00 stays whole"}]}]')
    conv = load_conversation(sharegpt)
    assert conv.id == "s\ufffd" and conv.turns[0].text == "my cat \ufffd is Tom"  # (its ids hold its id)
    assert conv.turns[1].text == "a pair \U0001f600 stays whole"
    assert [w for w in conv.warnings if "half a character" in w] == [
        "4 texts hold half a character (a lone UTF-16 surrogate, such as an emoji cut in two; first: the "
        "conversation id), replaced by U+FFFD '\ufffd'"]
    omem = write(tmp_path, "c.jsonl", line(content=r"bad \udc00").replace("\\\\", "\\")
                 + r'{"type": "probe", "conversation_id": "c", "id": "p1", "question": "q \ud800?", "answer": "a"}'
                 + "\n")
    conv = load_conversation(omem)
    assert conv.turns[0].text == "bad \ufffd" and conv.probes[0].question == "q \ufffd?"
    assert "2 texts hold half a character" in conv.warnings[-1]
    assert "first: message 'm1' field 'text'" in conv.warnings[-1]


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
    calls = write(tmp_path, "f.json", json.dumps([{"id": "f", "conversations": [
        {"from": "human", "value": "weather?"}, {"from": "function_call", "value": '{"name": "weather"}'},
        {"from": "observation", "value": "rain"}, {"from": "gpt", "value": "It rains."}]}]))
    assert [t.role for t in load_dataset(calls, "sharegpt")[0].turns] == ["user", "assistant", "tool", "assistant"]
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


def test_an_agent_chat_keeps_its_tool_calls_and_reads_newer_roles(tmp_path) -> None:
    """An OpenAI agent log: the assistant's turn that only calls a tool (content null) was read as
    an empty message, so memory never heard what the agent did; a "developer" (OpenAI's newer
    system role) or "function" message stopped the load with "unknown role"."""
    chat = write(tmp_path, "agent.jsonl", json.dumps({"id": "a", "messages": [
        {"role": "developer", "content": "You book trips."},
        {"role": "user", "content": "Find me a flight to Porto on Friday."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "search_flights", "arguments": "{\"to\": \"OPO\", \"day\": \"Friday\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "TP 1947 at 09:40, 120 EUR"},
        {"role": "assistant", "content": "Booking it.", "function_call": {"name": "book", "arguments": {"flight": "TP 1947"}}},
        {"role": "function", "name": "book", "content": "confirmed"}]}) + "\n")
    turns = load_dataset(chat, "openai")[0].turns
    assert [t.role for t in turns] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    no_content = write(tmp_path, "agent2.json", json.dumps({"messages": [  # OpenAI may leave "content" out
        {"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]}]}))
    assert load_dataset(no_content, "openai")[0].turns[1].text == "[tool call: ping({})]"
    assert turns[2].text == '[tool call: search_flights({"to": "OPO", "day": "Friday"})]'
    assert turns[4].text == 'Booking it.\n[tool call: book({"flight": "TP 1947"})]'
    bad = write(tmp_path, "bad.jsonl", json.dumps({"messages": [{"role": "bot", "content": "x"}]}) + "\n")
    with pytest.raises(DatasetError, match="unknown role 'bot' \\(expected one of user, assistant, system, developer"):
        load_dataset(bad, "openai")


def test_a_chatgpt_export_is_read_along_the_branch_the_user_kept(tmp_path) -> None:
    """Every node was read in create_time order: a reply regenerated away was replayed as if said,
    and a message with a null create_time (common for system nodes) sorted first, dated 1970."""
    def node(key, parent, role, text, when):
        return {"id": key, "parent": parent, "message": {"id": key, "author": {"role": role}, "create_time": when,
                                                        "content": {"content_type": "text", "parts": [text]}}}

    mapping = {"root": {"id": "root", "parent": None, "message": None},
               "u1": node("u1", "root", "user", "My flat is in Porto.", 1700000000),
               "a1": node("a1", "u1", "assistant", "Lisbon is nice.", 1700000010),  # regenerated away
               "a2": node("a2", "u1", "assistant", "Porto, noted.", None),
               "u2": node("u2", "a2", "user", "Thanks", 1700000030)}
    path = write(tmp_path, "conversations.json", json.dumps([{"title": "t", "mapping": mapping, "current_node": "u2"}]))
    turns = load_conversation(path).turns
    assert [t.id for t in turns] == ["u1", "a2", "u2"]
    assert [t.created_at.isoformat() for t in turns] == ["2023-11-14T22:13:20+00:00"] * 2 + ["2023-11-14T22:13:50+00:00"]
    other = write(tmp_path, "c2.json", json.dumps([{"title": "t", "mapping": mapping}]))  # no current_node
    assert [t.id for t in load_conversation(other).turns] == ["u1", "a2", "u2"]  # the path to the newest message
    undated = {k: {**n, "message": {**n["message"], "create_time": None}} if n["message"] else n for k, n in mapping.items()}
    del undated["a1"]
    undated["u1"] = {**undated["u1"], "message": {**undated["u1"]["message"], "create_time": 1700000000}}
    bare = write(tmp_path, "c3.json", json.dumps([{"title": "t", "mapping": undated}]))  # its newest reply undated
    assert [t.id for t in load_conversation(bare).turns] == ["u1", "a2", "u2"]  # a leaf's branch, not u1 alone
    millis = {**mapping, "u2": node("u2", "a2", "user", "Thanks", 1700000030000)}  # milliseconds
    ms = write(tmp_path, "c4.json", json.dumps([{"title": "t", "mapping": millis, "current_node": "u2"}]))
    assert load_conversation(ms).turns[-1].created_at.isoformat() == "2023-11-14T22:13:50+00:00"


def test_a_chatgpt_exports_empty_messages_are_said_to_be_skipped(tmp_path) -> None:
    """A 50-message export showed "48 messages" with no word of the empty and whitespace-only
    ones; the system node and hidden context messages every export has are not counted."""
    def node(key, parent, role, text, hidden=False):
        return {"id": key, "parent": parent,
                "message": {"id": key, "author": {"role": role}, "create_time": 1700000000,
                            "metadata": {"is_visually_hidden_from_conversation": hidden},
                            "content": {"content_type": "text", "parts": [text]}}}

    mapping = {"root": {"id": "root", "parent": None, "message": None},
               "s": node("s", "root", "system", ""), "h": node("h", "s", "user", "", hidden=True),
               "u1": node("u1", "h", "user", "Hello"), "a1": node("a1", "u1", "assistant", "   "),
               "u2": node("u2", "a1", "user", ""), "a2": node("a2", "u2", "assistant", "Hi")}
    path = write(tmp_path, "conversations.json", json.dumps([{"title": "t", "mapping": mapping, "current_node": "a2"}]))
    conversation = load_conversation(path)
    assert [t.id for t in conversation.turns] == ["u1", "a2"]
    assert conversation.warnings == ["2 messages with no text were skipped (first: 'a1')"]


def test_chat_timestamps_read_unix_time_and_an_undated_message_sits_among_its_neighbours(tmp_path) -> None:
    """A numeric timestamp was ignored without a word; a message without one was dated 2024-01-01
    plus a minute per message even between messages of June."""
    path = write(tmp_path, "o.json", json.dumps([{"id": "x", "messages": [
        {"role": "user", "content": "a", "timestamp": "2024-06-01T10:00:00Z"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c", "created_at": 1717236000}]}]))  # 2024-06-01T10:00:00Z
    turns = load_conversation(path).turns
    assert {t.created_at.isoformat() for t in turns} == {"2024-06-01T10:00:00+00:00"}
    first_undated = write(tmp_path, "p.json", json.dumps({"messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "timestamp": 1717236000000}]}))
    assert {t.created_at.isoformat() for t in load_conversation(first_undated).turns} == {"2024-06-01T10:00:00+00:00"}
    undated = write(tmp_path, "q.json", json.dumps({"messages": [{"role": "user", "content": "a"},
                                                                 {"role": "assistant", "content": "b"}]}))
    assert [t.created_at.isoformat() for t in load_conversation(undated).turns] == \
        ["2024-01-01T00:00:00+00:00", "2024-01-01T00:01:00+00:00"]  # none dated: a minute apart, as before
    blank = write(tmp_path, "b.json", json.dumps({"messages": [  # an empty timestamp is no timestamp (as before)
        {"role": "user", "content": "a", "timestamp": "", "created_at": "2024-06-01T10:00:00Z"}]}))
    assert load_conversation(blank).turns[0].created_at.isoformat() == "2024-06-01T10:00:00+00:00"
    omem = write(tmp_path, "o.jsonl", line(timestamp=1717236000))  # the project's format reads Unix time too
    assert load_conversation(omem).turns[0].created_at.isoformat() == "2024-06-01T10:00:00+00:00"
    bad = write(tmp_path, "r.json", json.dumps({"messages": [{"role": "user", "content": "a", "timestamp": True}]}))
    with pytest.raises(DatasetError, match="message 0: field 'timestamp': expected a date-time string or Unix time"):
        load_conversation(bad)


def test_a_message_dated_before_the_one_before_it_is_reported_when_loaded(tmp_path) -> None:
    """A replay failed on it at a step that depends on the thresholds (or not at all): the load says so."""
    path = write(tmp_path, "c.jsonl", "".join(line(id=f"m{i}", timestamp=f"2024-01-01T0{h}:00:00Z")
                                             for i, h in enumerate([1, 3, 2, 4])))
    conv = load_conversation(path)
    assert [t.id for t in conv.turns] == ["m0", "m1", "m2", "m3"]  # kept as written: memory orders by time
    assert len(conv.warnings) == 1 and conv.warnings[0].startswith(
        "1 message is dated before the message before it in the file (first: 'm2', 2024-01-01T02:00:00+00:00, "
        "after 'm1', 2024-01-01T03:00:00+00:00)")


@pytest.mark.parametrize("fmt, key, message", [("openai", "role", {"role": "user", "content": 7}),
                                                ("sharegpt", "from", {"from": "human", "value": 7}),
                                                ("openai", "role", {"role": "user", "content": {"text": "x"}})])
def test_a_message_whose_text_is_no_text_is_named_not_read_as_empty(tmp_path, fmt, key, message) -> None:
    """A number or an object where the text goes was read as an empty message (a replay then
    reported a history of 0 tokens)."""
    text_key = "content" if fmt == "openai" else "value"
    other = {key: "assistant" if fmt == "openai" else "gpt", text_key: "ok"}
    record = {"messages": [message, other]} if fmt == "openai" else {"id": "c", "conversations": [message, other]}
    bad = write(tmp_path, "chat.json", json.dumps([record]))
    with pytest.raises(DatasetError, match=f"chat.json: conversation 0 message 0: field '{text_key}': "
                                           "expected text or a list of content parts, got (int|dict)"):
        load_dataset(bad, fmt)
    null = {key: message[key], text_key: None}  # no text (an assistant's tool call): allowed
    record = {"messages": [null, other]} if fmt == "openai" else {"id": "c", "conversations": [null, other]}
    assert [t.text for t in load_dataset(write(tmp_path, "ok.json", json.dumps([record])), fmt)[0].turns][-1] == "ok"


def test_unrecognised_format_says_so(tmp_path) -> None:
    with pytest.raises(DatasetError, match="format not recognised"):
        load_dataset(write(tmp_path, "x.json", json.dumps({"hello": 1})))
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(tmp_path / "missing.json")
    with pytest.raises(DatasetError, match="unknown format"):
        load_dataset(write(tmp_path, "y.jsonl", line()), "csv")


def test_a_folder_that_is_no_dataset_names_what_inside_could_be(tmp_path) -> None:
    """A folder given for the file inside it (LoCoMo ships as ``locomo-dev/locomo-dev.json``), or
    for a folder of datasets of different kinds: the error names them."""
    holder = tmp_path / "locomo"
    holder.mkdir()
    write(holder, "conv.jsonl", line())
    write(holder, "user.json", json.dumps({"hello": 1}))  # JSON, but no dataset: never offered
    write(holder, "notes.txt", "not data")
    (holder / "chat1").mkdir()
    write(holder / "chat1", "chat.json", "[]")
    (holder / "empty").mkdir()
    with pytest.raises(DatasetError) as caught:
        load_dataset(holder)
    assert str(caught.value).endswith("give one of these as the dataset instead: chat1/, conv.jsonl")
    assert "holds BEAM chat folders (chat1/) and dataset files of its own (conv.jsonl)" in str(caught.value)
    with pytest.raises(DatasetError, match=r"move those files out to read the chats as one dataset\)$"):
        load_dataset(holder, "beam")  # (it said "holds no chat.json, nor folders that do")
    (holder / "conv.jsonl").unlink()
    (holder / "chat1" / "chat.json").unlink()
    with pytest.raises(DatasetError) as caught:
        load_dataset(holder)
    assert "instead" not in str(caught.value)  # nothing to suggest
    assert str(caught.value).endswith("its JSON files (user.json) are in none of the formats read: "
                                      + ", ".join(FORMATS))


def test_a_folder_of_dataset_folders_names_each_of_them(tmp_path) -> None:
    """``../shared/datasets`` given by path: only ``memorybank/`` was offered, not ``locomo-dev/``
    (one dataset file beside its licence) nor ``beam-100k-dev/`` (a folder of chat folders)."""
    import shutil

    top = tmp_path / "datasets"
    shutil.copytree(PROJECT_DATASETS / "samples" / "beam-sample", top / "beam-dev" / "1")
    (top / "lme").mkdir()
    write(top / "lme", "lme.json", (SAMPLES / "longmemeval-sample.json").read_text())
    write(top / "lme", "LICENSE.txt", "terms")
    (top / "docs").mkdir()
    write(top / "docs", "about.json", json.dumps({"not": "a dataset"}))
    with pytest.raises(DatasetError) as caught:
        load_dataset(top)
    assert str(caught.value).endswith("give one of these as the dataset instead: beam-dev/, lme/")


def test_a_file_named_chat_json_is_read_by_its_content(tmp_path) -> None:
    """BEAM names its chats chat.json, and any file of that name was read as BEAM: a ShareGPT
    export saved as chat.json failed with "batch 0: field 'turns': missing"."""
    share = write(tmp_path, "chat.json", json.dumps([{"id": "y", "conversations": [
        {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}]))
    assert detect_format(share) == "sharegpt" and load_conversation(share).turns[1].text == "a"
    beam_copy = tmp_path / "beam" / "chat.json"  # BEAM's own still is BEAM
    beam_copy.parent.mkdir()
    beam_copy.write_text((PROJECT_DATASETS / "samples" / "beam-sample" / "chat.json").read_text())
    assert detect_format(beam_copy) == "beam"
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "chat.json").write_text(json.dumps([{"batch": 1}]))  # no format's: BEAM's loader says what is missing
    with pytest.raises(DatasetError, match="field 'turns': missing"):
        load_dataset(odd / "chat.json")


def test_files_of_folder_formats_are_offered_and_a_format_given_picks_the_file(tmp_path) -> None:
    """Found in review: a file in a folder format's layout (a BEAM chat.json copied as another
    name) was said to be "in none of the formats read"; and a folder of BEAM chats beside a
    LongMemEval file no longer read that file when --format longmemeval named it."""
    import shutil

    holder = tmp_path / "holder"
    holder.mkdir()
    write(holder, "chat-copy.json", (PROJECT_DATASETS / "samples" / "beam-sample" / "chat.json").read_text())
    with pytest.raises(DatasetError) as caught:
        load_dataset(holder)
    assert str(caught.value).endswith("give one of these as the dataset instead: chat-copy.json")
    mixed = tmp_path / "mixed"
    shutil.copytree(PROJECT_DATASETS / "samples" / "beam-sample", mixed / "1")
    write(mixed, "lme.json", (SAMPLES / "longmemeval-sample.json").read_text())
    with pytest.raises(DatasetError, match="holds BEAM chat folders"):
        load_dataset(mixed)  # which one is meant is not clear…
    assert [c.id for c in load_dataset(mixed, "longmemeval")][:1] == ["omem-lme-001"]  # …unless a format says


def test_a_folder_of_beam_chats_is_one_dataset_and_the_published_layout_loads(tmp_path) -> None:
    """BEAM publishes ``chats/100K/<n>/chat.json`` with ``probing_questions/probing_questions.json``
    in a folder: the folder of chats was "format not recognised" (an experiment over BEAM meant
    one per chat, never pooled), and a chat in that layout loaded with no probes, silently."""
    import shutil

    sample = PROJECT_DATASETS / "samples" / "beam-sample"
    chats = tmp_path / "chats" / "100K"
    for name in ("2", "10", "1"):
        shutil.copytree(sample, chats / name)
    (chats / "1" / "probing_questions").mkdir()
    (chats / "1" / "probing_questions.json").rename(chats / "1" / "probing_questions" / "probing_questions.json")
    (chats / "10" / "probing_questions.json").unlink()
    (chats / "notes").mkdir()  # a folder that is no chat is not one
    write(chats, "meta.json", json.dumps({"size": "100K", "chats": 3}))  # JSON beside them, no dataset
    assert detect_format(chats) == "beam"
    loaded = load_dataset(chats)
    assert [c.id for c in loaded] == ["beam-1", "beam-2", "beam-10"]  # number order, not text order
    [alone] = load_dataset(sample)
    assert [p.id for p in loaded[0].probes] == [p.id for p in alone.probes] and alone.probes
    assert [t.text for t in loaded[1].turns] == [t.text for t in alone.turns]
    assert not loaded[0].warnings and not loaded[1].warnings
    assert loaded[2].probes == [] and "no probing questions" in loaded[2].warnings[0]
    assert [c.id for c in list_conversations(chats)] == ["beam-1", "beam-2", "beam-10"]
    assert load_conversation(chats, "beam-10").id == "beam-10"


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
    whole = load_dataset(shared_datasets / "beam-100k-dev")  # the folder of chats: one dataset
    assert [c.id for c in whole] == ["beam-1", "beam-2", "beam-3"]
    for chat, pooled in zip(("1", "2", "3"), whole):
        [conv] = load_dataset(shared_datasets / "beam-100k-dev" / chat)
        assert len(conv.turns) > 150 and len(conv.probes) == 20
        assert (pooled.turns, pooled.probes) == (conv.turns, conv.probes)
        abstention = [p for p in conv.probes if p.category == "abstention"]
        assert len(abstention) == 2 and all(p.abstention and p.gold is None and p.reference for p in abstention)
        assert all(p.gold for p in conv.probes if p not in abstention)
        assert sum(1 for p in conv.probes if p.evidence) >= 10
        assert "->->" not in conv.turns[0].text
        times = [t.created_at for t in conv.turns]
        assert times == sorted(times)
        assert not [w for w in conv.warnings if "time_anchor" in w]  # every anchor of the dev chats is read


def test_a_beam_time_anchor_that_is_not_a_date_is_said(tmp_path) -> None:
    """It was skipped without a word (the clock ran on from the last anchor read)."""
    chat = json.loads((SAMPLES / "beam-sample" / "chat.json").read_text(encoding="utf-8"))
    chat[0]["turns"][0][0]["time_anchor"] = "Febuary-30-2024"
    folder = tmp_path / "b"
    folder.mkdir()
    (folder / "chat.json").write_text(json.dumps(chat), encoding="utf-8")
    [conv] = load_dataset(folder)
    assert conv.turns[0].created_at.date().isoformat() == "2024-03-04"  # the batch's anchor stands
    assert [w for w in conv.warnings if w.startswith("1 time_anchor")] == [
        "1 time_anchor is not a date and was skipped (first: batch 0 turn 0 message 0: 'Febuary-30-2024'): "
        "the clock ran on from the last one read"]


def test_memorybank(shared_datasets: Path) -> None:
    conversations = load_dataset(shared_datasets / "memorybank")
    assert len(conversations) >= 10
    emily = next(c for c in conversations if c.id == "memorybank-Emily")
    assert emily.turns[0].speaker == "Emily" and len(emily.probes) > 0
    assert all(p.gold is None for p in emily.probes)
    assert all(c.id == c.id.strip() for c in conversations)


def test_memorybank_questions_for_a_user_not_in_the_bank_are_said(tmp_path) -> None:
    """Probing questions for a name the bank does not hold were dropped without a word."""
    bank = tmp_path / "mb"
    bank.mkdir()
    (bank / "memory_bank_en.json").write_text(json.dumps({"Ann": {"history": {"2023-05-01": [
        {"query": "I adopted a cat", "response": "Lovely!"}]}}}), encoding="utf-8")
    (bank / "probing_questions_en.jsonl").write_text(json.dumps({"Ann": ["Which pet?"], "Zed": ["Where?", "Who?"]})
                                                     + "\n", encoding="utf-8")
    [ann] = load_dataset(bank)
    assert [p.question for p in ann.probes] == ["Which pet?"]
    assert ann.warnings == ["probing_questions_en.jsonl asks 2 questions of 1 user not in memory_bank_en.json "
                            "('Zed'): left out"]


# -- the registry and the README ----------------------------------------------------------------

README = PROJECT_DATASETS / "README.md"
SAMPLES = PROJECT_DATASETS / "samples"


def test_the_readme_table_is_the_registry() -> None:
    text = README.read_text(encoding="utf-8")
    table = text.split("<!-- formats:start", 1)[1].split("-->", 1)[1].split("<!-- formats:end -->", 1)[0]
    assert table.strip() == markdown_table()
    assert FORMATS == tuple(f.name for f in REGISTRY) and len(set(FORMATS)) == len(FORMATS)
    for fmt in REGISTRY:
        assert fmt.description and "\n" not in fmt.description and "|" not in fmt.description
        assert f"### `{fmt.name}`" in text, f"datasets/README.md has no section for {fmt.name}"
    assert {f.name for f in REGISTRY if f.folder} == {"beam", "memorybank"}


def readme_examples() -> dict[str, list[dict[str, str]]]:
    """Per format section, its examples: groups of ``{file name: text}`` (a folder format's files
    form one example)."""
    sections = re.split(r"^### `(\w+)`$", README.read_text(encoding="utf-8"), flags=re.M)
    examples: dict[str, list[dict[str, str]]] = {}
    for name, body in zip(sections[1::2], sections[2::2]):
        blocks = dict(re.findall(r"^```jsonl? ([\w.-]+)\n(.*?)^```$", body, flags=re.M | re.S))
        examples[name] = [blocks] if get_format(name).folder else [{k: v} for k, v in blocks.items()]
    return examples


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_readme_example_loads_by_detection(tmp_path, fmt) -> None:
    examples = readme_examples()[fmt]
    assert examples, f"no example for {fmt}"
    for number, files in enumerate(examples):
        folder = tmp_path / f"{fmt}-{number}"
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text, encoding="utf-8")
        path = folder if get_format(fmt).folder else folder / next(iter(files))
        assert detect_format(path) == fmt
        conversations = load_dataset(path)
        assert conversations and all(c.turns and c.format == fmt and not c.warnings for c in conversations)


def test_every_registry_format_loads_its_own_kind_only(tmp_path) -> None:
    """Each sniff says yes to its own example and no to the others' (detection is unambiguous)."""
    examples = readme_examples()
    for fmt in FORMATS:
        for number, files in enumerate(examples[fmt]):
            folder = tmp_path / f"{fmt}-{number}"
            folder.mkdir()
            for name, text in files.items():
                (folder / name).write_text(text, encoding="utf-8")
            path = folder if get_format(fmt).folder else folder / next(iter(files))
            saying_yes = [f.name for f in REGISTRY if f.sniff(Source(path))]
            assert saying_yes == [fmt], (fmt, number, saying_yes)


# -- dates ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    ("2024-02-05T08:30:00Z", "2024-02-05T08:30:00+00:00"),
    ("2024-02-05T08:30:00+02:00", "2024-02-05T08:30:00+02:00"),
    ("2024-02-05 08:30", "2024-02-05T08:30:00+00:00"),
    ("2024-02-05", "2024-02-05T00:00:00+00:00"),
    ("1:56 pm on 8 May, 2023", "2023-05-08T13:56:00+00:00"),
    ("12:05 am on 1 January, 2024", "2024-01-01T00:05:00+00:00"),
    ("12:30 PM on 3 Sept, 2022", "2022-09-03T12:30:00+00:00"),
    ("08.05.2023, 13:56:07", "2023-05-08T13:56:07+00:00"),
    ("8.5.2023 13:56", "2023-05-08T13:56:00+00:00"),
    ("2023/05/20 (Sat) 02:21", "2023-05-20T02:21:00+00:00"),
    ("2023/05/20 (saturday) 02:21", "2023-05-20T02:21:00+00:00"),
    ("2023/06/01 (Thurs) 10:00", "2023-06-01T10:00:00+00:00"),
    ("2023/05/20 02:21", "2023-05-20T02:21:00+00:00"),
    ("March-15-2024", "2024-03-15T00:00:00+00:00"),
    ("Mar-15-2024", "2024-03-15T00:00:00+00:00"),
    (1709287200, "2024-03-01T10:00:00+00:00"),  # Unix time: a number was an error, or (chat formats) ignored
    (1709287200000, "2024-03-01T10:00:00+00:00"),  # in milliseconds
    (1700000000.5, "2023-11-14T22:13:20.500000+00:00"),  # ChatGPT's create_time
])
def test_one_date_parser_reads_every_form(value, expected) -> None:
    assert parse_datetime(value, "f.json", "record", "when").isoformat() == expected


@pytest.mark.parametrize("value", ["yesterday", "13:56 pm on 8 May, 2023", "1:56 pm on 8 Maytember, 2023",
                                   "31.02.2023, 10:00:00", "2023/13/01 (Sat) 02:21",
                                   "2023/05/20 (Sun) 02:21", "2023/05/20 (Xyz) 02:21", "", "2023-05-08T25:00", True, None, [2023],
                                   10**20])
def test_unreadable_dates_name_file_record_field_and_value(value) -> None:
    with pytest.raises(DatasetError) as caught:
        parse_datetime(value, "f.json", "sample 0 session_1 turn 2", "date_time")
    error = caught.value
    assert (error.file, error.record, error.field) == ("f.json", "sample 0 session_1 turn 2", "date_time")
    assert repr(value) in str(error) if isinstance(value, (str, int)) and not isinstance(value, bool) else \
        "expected a date-time string or Unix time" in str(error)


# -- LongMemEval ----------------------------------------------------------------------------------

LME_SAMPLE = SAMPLES / "longmemeval-sample.json"


def lme_instance(**fields) -> dict:
    base = {"question_id": "q1", "question_type": "temporal-reasoning", "question": "When?", "answer": "May",
            "question_date": "2023/06/01 (Thu) 10:00", "haystack_session_ids": ["a", "b"],
            "haystack_dates": ["2023/05/01 (Mon) 09:00", "2023/05/02 (Tue) 09:00"],
            "haystack_sessions": [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
                                  [{"role": "user", "content": "it was May", "has_answer": True}]],
            "answer_session_ids": ["b"]}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not ...}


def test_longmemeval_sample_loads_by_detection() -> None:
    assert detect_format(LME_SAMPLE) == "longmemeval"
    conversations = {c.id: c for c in load_dataset(LME_SAMPLE)}
    assert list(conversations) == ["omem-lme-001", "omem-lme-002", "omem-lme-003", "omem-lme-004_abs"]
    pottery = conversations["omem-lme-001"]
    [probe] = pottery.probes
    assert (probe.id, probe.category, probe.gold) == ("omem-lme-001", "single-session-user", "Clayworks studio on Elm Street")
    assert probe.evidence == ("sess-a2:0",) and "Clayworks" in next(t.text for t in pottery.turns if t.id == "sess-a2:0")
    assert [t.role for t in pottery.turns[:2]] == ["user", "assistant"] and pottery.turns[0].speaker is None
    assert pottery.turns[0].created_at.isoformat() == "2023-05-02T09:10:00+00:00"
    assert probe.asked_at.isoformat() == "2023-06-12T20:15:00+00:00"  # question_date: when it is asked
    # sessions replay in date order even when the file lists them otherwise
    commute = conversations["omem-lme-002"]
    assert [t.id for t in commute.turns] == ["sess-b1:0", "sess-b1:1", "sess-b2:0", "sess-b2:1"]
    assert commute.probes[0].category == "knowledge-update" and set(commute.probes[0].evidence) == {"sess-b1:0", "sess-b2:0"}
    assert conversations["omem-lme-003"].probes[0].gold == "7"  # a numeric answer is text
    for conversation in conversations.values():
        times = [t.created_at for t in conversation.turns]
        assert times == sorted(times) and len(set(times)) == len(times)


def test_longmemeval_abstention_is_not_scored_by_words() -> None:
    [probe] = load_conversation(LME_SAMPLE, "omem-lme-004_abs").probes
    assert probe.abstention and probe.gold is None and "did not mention" in probe.reference
    assert probe_score(probe.gold, content_words(probe.reference or "")) is None  # unscored, not 0 or 1
    scored = load_conversation(LME_SAMPLE, "omem-lme-001").probes[0]
    assert not scored.abstention and probe_score(scored.gold, content_words(scored.reference or "")) == 1.0


@pytest.mark.parametrize("instance, record, field, problem", [
    (lme_instance(haystack_dates=["2023/05/01 (Mon) 09:00"]), "instance 0", "haystack_dates", "has 1 entries for 2"),
    (lme_instance(haystack_dates=["2023/05/01 (Mon) 09:00", "next week"]), "instance 0 session 1",
     "haystack_dates", "unrecognised date-time 'next week'"),
    (lme_instance(haystack_sessions=[[{"role": "user", "content": "hi"}], [{"role": "bot", "content": "x"}]]),
     "instance 0 session 1 turn 0", "role", "unknown role 'bot'"),
    (lme_instance(haystack_sessions=[[{"role": "user", "content": "hi"}], [{"role": "user"}]]),
     "instance 0 session 1 turn 0", "content", "missing"),
    (lme_instance(haystack_sessions=[[{"role": "user", "content": "hi"}], "oops"]), "instance 0 session 1",
     "haystack_sessions", "expected a list of turns"),
    (lme_instance(question=...), "instance 0", "question", "missing"),
    (lme_instance(haystack_sessions=[[], []]), "instance 0", "haystack_sessions", "has no turns"),
    (lme_instance(question_date="soon"), "instance 0", "question_date", "unrecognised date-time 'soon'"),
    # a weekday that contradicts its date: one of the two is mistyped (it was accepted, unchecked)
    (lme_instance(haystack_dates=["2023/05/01 (Mon) 09:00", "2023/05/02 (Wed) 09:00"]), "instance 0 session 1",
     "haystack_dates", "date-time '2023/05/02 (Wed) 09:00': (Wed) contradicts the date: 2023-05-02 is a Tuesday"),
    (lme_instance(question_date="2023/06/01 (Fri) 10:00"), "instance 0", "question_date", "is a Thursday"),
])
def test_bad_longmemeval_instances_name_file_record_and_field(tmp_path, instance, record, field, problem) -> None:
    path = write(tmp_path, "lme.json", json.dumps([instance]))
    with pytest.raises(DatasetError) as caught:
        load_dataset(path)
    error = caught.value
    assert (error.file, error.record, error.field) == (str(path), record, field) and problem in str(error)


def test_longmemeval_optional_fields_and_repeated_session_ids(tmp_path) -> None:
    bare = lme_instance(haystack_session_ids=..., haystack_dates=..., question_type=..., answer=...)
    repeated = lme_instance(question_id=7, haystack_session_ids=["a", "a"])
    path = write(tmp_path, "lme.json", json.dumps([bare, repeated]))
    first, second = load_dataset(path)
    assert first.probes[0].category == "uncategorised" and first.probes[0].gold is None
    bare_date = load_dataset(write(tmp_path, "undated.json", json.dumps([lme_instance(question_date=...)])))
    assert bare_date[0].probes[0].asked_at is None and first.probes[0].asked_at is not None
    assert not bare_date[0].warnings and not load_dataset(write(tmp_path, "ok.json", json.dumps([lme_instance()])))[0].warnings
    # asked before what it is about was said: the answerer would be told a date before what it read
    [early] = load_dataset(write(tmp_path, "early.json", json.dumps([lme_instance(question_date="2023/05/01 (Mon) 12:00")])))
    assert early.warnings == ["its question_date (2023/05/01 (Mon) 12:00) is before its latest session "
                              "(2023/05/02 (Tue) 09:00): the answerer is told it is asked on a day before what it read"]
    assert [t.id for t in first.turns] == ["session-0:0", "session-0:1", "session-1:0"]
    assert second.id == "7" and len({t.id for t in second.turns}) == 3 and second.probes[0].evidence
    assert second.warnings == ["1 session repeats the haystack_session_id of an earlier one (first: 'a'): its "
                               "messages are named 'a~':0, :1, …"]  # (renamed without a word)
    assert not first.warnings


def test_longmemeval_lines_file_loads_too(tmp_path) -> None:
    path = write(tmp_path, "lme.jsonl", "".join(json.dumps(lme_instance(question_id=f"q{i}")) + "\n" for i in range(3)))
    assert detect_format(path) == "longmemeval"
    assert [c.id for c in load_dataset(path)] == ["q0", "q1", "q2"]
    assert load_conversation(path, "q2").id == "q2"
    with pytest.raises(DatasetError, match="line 2: field 'question'"):
        load_dataset(write(tmp_path, "bad.jsonl", "\n" + json.dumps(lme_instance(question=5)) + "\n"))


# -- LoCoMo variants (REALTALK) -------------------------------------------------------------------

REALTALK_SAMPLE = SAMPLES / "realtalk-sample.json"


def test_realtalk_style_chat_loads_by_detection() -> None:
    assert detect_format(REALTALK_SAMPLE) == "locomo"
    [conv] = load_dataset(REALTALK_SAMPLE)
    assert conv.id == "realtalk-sample" and conv.format == "locomo" and conv.warnings == []
    turns = {t.id: t for t in conv.turns}
    # speaker 1 is the user whatever the case of the turn's speaker; the name is the header's
    assert [(turns[i].role, turns[i].speaker) for i in ("D1:1", "D1:2", "D1:4")] == [
        ("assistant", "Ravi"), ("user", "Noa"), ("user", "Noa")]
    assert turns["D1:1"].text == "hey! did the allotment application go through?"  # clean_text, not text
    assert turns["D2:2"].text == "oh nice, how long is she staying?"  # text when there is no clean_text
    assert "[shares an image: a small garden plot" in turns["D2:3"].text
    assert turns["D1:2"].created_at.isoformat() == "2024-02-03T18:06:40+00:00"  # its own date_time
    assert [(p.category, p.gold is not None, p.evidence) for p in conv.probes] == [
        ("multi-hop", True, ("D1:2",)), ("temporal", True, ("D2:1",)), ("open-domain", True, ("D2:3", "D1:2"))]


def test_locomo_variant_shapes(tmp_path) -> None:
    flat = {"name": {"speaker_1": "ann", "speaker_2": "Bo"}, "session_1_date_time": "01.03.2024, 10:00:00",
            "session_1": [{"speaker": "ANN", "dia_id": "D1:1", "text": "hi"}, {"speaker": "bo", "dia_id": "D1:2", "text": "yo"}],
            "events_session_1": [1, 2, 3], "qa": [{"question": "q", "answer": 3, "evidence": ["D1:1"], "category": "2"}]}
    [conv] = load_dataset(write(tmp_path, "flat.json", json.dumps(flat)))
    assert [(t.role, t.speaker) for t in conv.turns] == [("user", "ann"), ("assistant", "Bo")]
    assert conv.turns[1].created_at.isoformat() == "2024-03-01T10:00:30+00:00"  # session time + 30 s
    assert (conv.probes[0].category, conv.probes[0].gold) == ("temporal", "3")
    odd = {**flat, "qa": [{"question": "q", "answer": "a", "category": c} for c in ("¹", "9", 7, "other", None)]}
    assert [p.category for p in load_dataset(write(tmp_path, "odd.json", json.dumps(odd)))[0].probes] == [
        "¹", "9", "7", "other", "uncategorised"]
    wrapped = {"sample_id": "w", "conversation": flat, "qa": flat["qa"]}
    assert load_dataset(write(tmp_path, "wrapped.json", json.dumps([wrapped])))[0].id == "w"
    nameless = {k: v for k, v in flat.items() if k != "name"}
    with pytest.raises(DatasetError, match="sample 0: field 'speaker_a': missing: name the speakers"):
        load_dataset(write(tmp_path, "nameless.json", json.dumps(nameless)), "locomo")
    undated = {**flat, "session_1_date_time": None}
    with pytest.raises(DatasetError, match="sample 0: field 'session_1_date_time': missing"):
        load_dataset(write(tmp_path, "undated.json", json.dumps(undated)))
    bad_turn_date = json.loads(json.dumps(flat))
    bad_turn_date["session_1"][1]["date_time"] = "1.3.2024 at ten"
    with pytest.raises(DatasetError, match="sample 0 session_1 turn 1: field 'date_time': unrecognised date-time"):
        load_dataset(write(tmp_path, "bad.json", json.dumps(bad_turn_date)))


def test_locomo_sessions_dated_out_of_their_numbers_order_replay_in_date_order(tmp_path) -> None:
    """LongMemEval's sessions were replayed in date order, LoCoMo's in their numbers' order: a
    session dated before one already condensed failed the replay at its first turn (only warned
    about at load)."""
    import asyncio

    from workbench.replay import ReplayConfig, replay

    def session(number: int, count: int) -> list[dict]:
        return [{"speaker": "Ann" if i % 2 == 0 else "Bo", "dia_id": f"D{number}:{i + 1}",
                 "text": f"In session {number}, Ann talks about her violin lesson number {i} at the old hall."}
                for i in range(count)]

    sample = {"sample_id": "s", "qa": [{"question": "What does Ann play?", "answer": "violin", "evidence": ["D2:1"],
                                        "category": 4}],
              "conversation": {"speaker_a": "Ann", "speaker_b": "Bo",
                               "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": session(1, 12),
                               "session_2_date_time": "1:56 pm on 8 April, 2023", "session_2": session(2, 4),
                               "session_3_date_time": "1:56 pm on 9 May, 2023", "session_3": session(3, 2)}}
    [conversation] = load_dataset(write(tmp_path, "swapped.json", json.dumps([sample])))
    assert [t.id.split(":")[0] for t in conversation.turns] == ["D2"] * 4 + ["D1"] * 12 + ["D3"] * 2
    times = [t.created_at for t in conversation.turns]
    assert times == sorted(times)
    assert conversation.warnings == ["session_2 is dated 2023-04-08 13:56, before session_1 (2023-05-08 13:56): "
                                     "sessions are replayed in date order, not in their numbers' (2 out of place)"]
    result = asyncio.run(replay(conversation, ReplayConfig(observation_threshold=40, reflection_threshold=80,
                                                           last_messages=2, cache=False)))
    assert result.status == "completed" and result.observer_calls > 0


# -- large files: streaming, the index and its cache -----------------------------------------------


def lme_file(tmp_path: Path, count: int, name: str = "big.json") -> Path:
    instances = [lme_instance(question_id=f"q{i}", question=f"Où {i}? ✓",
                              haystack_sessions=[[{"role": "user", "content": f"naïve café {i} " * (i + 1)}],
                                                 [{"role": "assistant", "content": "ok", "has_answer": True}]])
                 for i in range(count)]
    return write(tmp_path, name, json.dumps(instances, ensure_ascii=False, indent=1))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A private dataset-index cache on disk, used for every file size; the in-process one empty."""
    from workbench.datasets import index

    folder = tmp_path / "cache"
    monkeypatch.setenv("OMEM_CACHE_DIR", str(folder))
    monkeypatch.setattr(index, "MIN_BYTES", 0)
    index.clear_memory()
    yield folder / "datasets"
    index.clear_memory()


def test_listing_builds_an_index_once_and_loads_read_only_their_instance(tmp_path, cache, monkeypatch) -> None:
    from workbench.datasets import index, source

    path = lme_file(tmp_path, 5)
    infos = list_conversations(path)
    assert [i.id for i in infos] == [f"q{i}" for i in range(5)]
    assert infos[3].messages == 2 and infos[3].probes == 1 and infos[3].scored_probes == 1 and infos[3].tokens > 0
    assert len(list(cache.glob("*.json"))) == 1
    index.clear_memory()

    streamed = source.json_array

    def first_element_only(*args, **kwargs):  # detection reads the first instance; nothing more
        for number, element in enumerate(streamed(*args, **kwargs)):
            assert number == 0, "the file was parsed past its first element"
            yield element

    monkeypatch.setattr(source, "json_array", first_element_only)
    assert list_conversations(path) == infos  # from the cache on disk
    for i in (4, 0, 2):  # each instance read alone at its byte offset (non-ASCII text included)
        conv = load_conversation(path, f"q{i}")
        assert conv.id == f"q{i}" and conv.turns[0].text == f"naïve café {i} " * (i + 1)
    with pytest.raises(DatasetError, match="conversation 'q9': not found; available: q0, q1, q2, q3, q4"):
        load_conversation(path, "q9")


def test_an_edited_file_is_indexed_again(tmp_path, cache) -> None:
    path = lme_file(tmp_path, 3)
    assert len(list_conversations(path)) == 3
    lme_file(tmp_path, 4)  # same path, new content
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    assert [i.id for i in list_conversations(path)] == ["q0", "q1", "q2", "q3"]
    assert load_conversation(path, "q3").id == "q3"


def test_an_unwritable_cache_folder_is_no_error(tmp_path, monkeypatch) -> None:
    from workbench.datasets import index

    blocker = write(tmp_path, "not-a-folder", "")
    monkeypatch.setenv("OMEM_CACHE_DIR", str(blocker))
    monkeypatch.setattr(index, "MIN_BYTES", 0)
    index.clear_memory()
    path = lme_file(tmp_path, 3)
    assert [i.id for i in list_conversations(path)] == ["q0", "q1", "q2"]
    assert load_conversation(path, "q1").id == "q1"
    index.clear_memory()


def test_one_instance_loads_without_reading_past_it(tmp_path) -> None:
    good = json.dumps([lme_instance(question_id="first"), lme_instance(question_id="second")])
    path = write(tmp_path, "bad-later.json", good[:-1] + ", {broken}]")
    assert load_conversation(path, "first").id == "first" and load_conversation(path).id == "first"
    assert detect_format(path) == "longmemeval"  # detection reads the first instance only
    with pytest.raises(DatasetError, match=r"line 1 column \d+: invalid JSON"):
        load_dataset(path)
    # a download cut off (no closing "]"): refused, as the listing refuses it (found by a walkthrough:
    # the first instance replayed as if the file were whole); its end is read, not the whole file
    cut = write(tmp_path, "cut.json", good[: len(good) * 3 // 4])
    with pytest.raises(DatasetError, match=r"cut\.json: the file is cut off: it ends before the list's closing"):
        load_conversation(cut, "first")


@settings(max_examples=80, deadline=None)
@given(values=st.lists(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8), max_size=6), indent=st.sampled_from([None, 1]), chunk=st.integers(1, 64), bom=st.booleans())
def test_streamed_elements_match_the_document_and_their_offsets(values, indent, chunk, bom) -> None:
    from workbench.datasets import source

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "list.json"
        text = json.dumps(values, indent=indent, ensure_ascii=False)
        path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
        original = source.CHUNK
        source.CHUNK = chunk  # tiny reads: elements straddle every buffer boundary
        try:
            elements = list(source.json_array(path))
        finally:
            source.CHUNK = original
        assert [e.value for e in elements] == values
        assert [source.read_at(path, e.offset, e.length) for e in elements] == values


@pytest.mark.parametrize("text, record, problem", [
    ('[{"a": 1},\n {"a": }]', "line 2 column 8", "invalid JSON: Expecting value"),
    ('[{"a": 1} {"a": 2}]', "line 1 column 11", "expecting ','"),
    ('[{"a": 1}] x', "line 1 column 12", "extra data"),
    ('[{"a": 1},', "line 1 column 11", "not closed"),
    ('[{"a": "\u00e9', "line 1 column 8", "Unterminated string"),
])
def test_streaming_errors_say_where(tmp_path, text, record, problem) -> None:
    from workbench.datasets.source import json_array

    path = write(tmp_path, "bad.json", text)
    with pytest.raises(DatasetError) as caught:
        list(json_array(path))
    assert caught.value.record == record and problem in str(caught.value)


def test_detection_and_loading_share_one_parse(monkeypatch) -> None:
    from workbench.datasets import source

    parses = []
    whole = source.load_json
    monkeypatch.setattr(source, "load_json", lambda file: parses.append(file) or whole(file))
    [conv] = load_dataset(REALTALK_SAMPLE)  # one JSON object: detection needs all of it
    assert conv.id == "realtalk-sample" and parses == [REALTALK_SAMPLE]


def test_a_folder_listing_sees_a_file_edited_inside_it(tmp_path) -> None:
    folder = tmp_path / "beam"
    folder.mkdir()
    chat = [{"batch_number": 1, "time_anchor": "March-04-2024",
             "turns": [[{"role": "user", "id": 0, "content": "hi"}, {"role": "assistant", "id": 1, "content": "yo"}]]}]
    (folder / "chat.json").write_text(json.dumps(chat))
    assert list_conversations(folder)[0].messages == 2
    chat[0]["turns"][0].append({"role": "user", "id": 2, "content": "and one more message"})
    (folder / "chat.json").write_text(json.dumps(chat))
    os.utime(folder / "chat.json", ns=(time.time_ns(), time.time_ns() + 10_000_000))
    assert list_conversations(folder)[0].messages == 3


def test_reading_datasets_imports_no_model_library() -> None:
    """The CLI's quick paths (``--help``, ``datasets``) list and detect formats: that must not pay
    for importing litellm (seconds)."""
    import subprocess
    import sys

    code = ("import sys, workbench.catalog, workbench.datasets as d; d.load_dataset(sys.argv[1]); "
            "d.list_conversations(sys.argv[2]); print(sorted({'litellm', 'omem_core', 'pandas'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code, str(DEMO_DATASET), str(LME_SAMPLE)], capture_output=True,
                          text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    assert done.stdout.strip() == "[]"


def test_a_blank_id_is_refused_when_the_file_is_read_not_as_a_failed_run(tmp_path) -> None:
    """The library now refuses a message with a blank id or thread (it names nothing); a dataset
    with one must say so when read, before a run is recorded, and say where."""
    line = {"conversation_id": "c", "id": "m1", "role": "user", "content": "hi", "timestamp": "2024-01-01T00:00:00Z"}
    for field, value, said in (("id", " ", "line 1: field 'id': is blank"),
                               ("conversation_id", "", "field 'conversation_id': is blank")):
        path = tmp_path / f"blank-{field}.jsonl"
        path.write_text(json.dumps({**line, field: value}) + "\n")
        with pytest.raises(DatasetError, match=said):
            load_dataset(path)
    unnamed = tmp_path / "sharegpt.json"  # a format whose id is optional: a blank one is numbered
    unnamed.write_text(json.dumps([{"id": "", "conversations": [{"from": "human", "value": "hi"},
                                                                {"from": "gpt", "value": "hello"}]}]))
    assert [c.id for c in load_dataset(unnamed)] == ["conversation-0"]


def test_an_optional_id_that_is_blank_or_null_is_skipped_as_a_missing_one_is(tmp_path) -> None:
    """ShareGPT and OpenAI ids are optional: a blank ``id`` hid the ``conversation_id`` beside
    it, a blank message id made the whole file fail, and a null one became the id "None"."""
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([
        {"id": "", "conversation_id": "trip-planning", "conversations": [
            {"from": "human", "value": "hi", "id": " "}, {"from": "gpt", "value": "hello", "id": None},
            {"from": "human", "value": "thanks", "id": "kept"}]},
        {"id": None, "conversations": [{"from": "human", "value": "hi"}]}]))
    first, second = load_dataset(path)
    assert first.id == "trip-planning" and second.id == "conversation-1"
    assert [t.id for t in first.turns] == ["trip-planning-0", "trip-planning-1", "kept"]
    chatgpt = tmp_path / "conversations.json"  # a ChatGPT export: ids from the message, else its node
    chatgpt.write_text(json.dumps([{"title": "Trip", "id": " ", "mapping": {
        "a": {"id": "node-a", "message": {"id": None, "author": {"role": "user"}, "create_time": 1,
                                          "content": {"parts": ["hi"]}}},
        "b": {"id": "node-b", "message": {"id": "msg-b", "author": {"role": "assistant"}, "create_time": 2,
                                          "content": {"parts": ["hello"]}}}}}]))
    [conversation] = load_dataset(chatgpt)
    assert conversation.id == "Trip" and [t.id for t in conversation.turns] == ["node-a", "msg-b"]


@pytest.mark.parametrize("name", ["empty.json", "empty.jsonl", "blank.jsonl", "empty.txt", "bom.json", "bom.jsonl"])
def test_an_empty_file_reads_the_same_in_every_format(tmp_path, name) -> None:
    """An empty .json said "line 1 column 1: invalid JSON: Expecting value" and an empty .jsonl
    "file: is empty": the same file, told two ways. A file holding only a byte-order mark (what
    some editors save for an empty UTF-8 file) is empty too."""
    path = write(tmp_path, name, {"blank": " \n\n", "bom": "\ufeff\n"}.get(name.split(".")[0], ""))
    for fmt in (None, "openai"):
        with pytest.raises(DatasetError) as caught:
            load_dataset(path, fmt)
        assert str(caught.value) == f"{path}: the file is empty"


def test_an_empty_conversation_is_skipped_with_a_warning_not_the_whole_file(tmp_path) -> None:
    """Real exports hold empty chats ("New chat" opened and left): one made every other
    conversation of the file unloadable ("conversation 'b': has no messages")."""
    path = write(tmp_path, "sg.json", json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "hi"}]},
                                                  {"id": "b", "conversations": []}]))
    [only] = load_dataset(path)
    assert only.id == "a" and only.warnings == ["1 conversation of this file with no messages was skipped (first: 'b')"]
    assert [c.id for c in list_conversations(path)] == ["a"]
    alone = write(tmp_path, "sg2.json", json.dumps([{"id": "b", "conversations": []}]))
    with pytest.raises(DatasetError, match="has no conversations with messages"):
        load_dataset(alone)


def test_duplicate_ids_of_probes_and_of_conversations_are_refused_by_name(tmp_path) -> None:
    """A duplicate probe id crashed the replay at its end (the probes table's key); a duplicate
    conversation id left the second one impossible to choose."""
    lines = (ROOT / "datasets" / "tiny.jsonl").read_text().splitlines()
    probe = next(line for line in lines if '"probe"' in line)
    path = write(tmp_path, "p.jsonl", "\n".join([*lines, probe]) + "\n")
    first = next(n for n, text in enumerate(lines, start=1) if text == probe)
    with pytest.raises(DatasetError, match=rf": line {len(lines) + 1}: field 'id': duplicate probe id 'q1' "
                                           rf"\(line {first} has it too\)"):
        load_conversation(path)
    chats = write(tmp_path, "c.json", json.dumps([{"id": "x", "messages": [{"role": "user", "content": "a"}]},
                                                  {"id": "x", "messages": [{"role": "user", "content": "b"}]}]))
    for read in (load_dataset, list_conversations, lambda p: load_conversation(p, "x")):
        with pytest.raises(DatasetError, match="the 2nd conversation: field 'id': duplicate conversation id 'x' \\(the 1st"):
            read(chats)


def test_positions_in_the_loaded_conversation_cannot_be_read_as_the_files_0_based_ones(tmp_path) -> None:
    """Loaders name JSON positions from 0 ("conversation 0 message 0" is `.[0].messages[0]`), but
    the checks after loading counted from 1 in the same words: "conversation 'c' message 2" was
    the second message, "conversation 2" the second conversation. Those are ordinals now."""
    from workbench.datasets.base import ordinal

    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111, 112)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th", "112th"]
    chats = write(tmp_path, "c.json", json.dumps([
        {"id": "a", "messages": [{"role": "user", "content": "hi"}]},
        {"id": "b", "messages": [{"role": "user", "content": "a", "id": "m"}, {"role": "user", "content": "b", "id": "m"},
                                 {"role": "narrator", "content": "c"}]}]))
    with pytest.raises(DatasetError) as caught:
        load_dataset(chats)
    assert caught.value.record == "conversation 1 message 2"  # a 0-based JSON position: .[1].messages[2]
    chats.write_text(json.dumps([{"id": "b", "messages": [{"role": "user", "content": "a", "id": "m"},
                                                          {"role": "user", "content": "b", "id": "m"}]}]))
    with pytest.raises(DatasetError) as caught:
        load_dataset(chats)
    assert caught.value.record == "conversation 'b', its 2nd message" and "its 1st message has it too" in str(caught.value)
    # One object, not a list: its messages are the top level's (`.messages[1]`), not "conversation 0"'s
    chats.write_text(json.dumps({"id": "b", "messages": [{"role": "user", "content": "a"},
                                                         {"role": "narrator", "content": "c"}]}))
    with pytest.raises(DatasetError) as caught:
        load_dataset(chats)
    assert caught.value.record == "top level message 1"


def test_a_json_lines_file_may_start_with_a_byte_order_mark(tmp_path) -> None:
    text = (ROOT / "datasets" / "tiny.jsonl").read_text()
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    assert len(load_conversation(path).turns) == len(load_conversation(ROOT / "datasets" / "tiny.jsonl").turns)


def test_content_without_plain_text_parts_is_kept(tmp_path) -> None:
    """A voice message (its transcription), a code-interpreter turn and its output, a refusal, an
    image: all read as empty and were dropped or kept blank."""
    def node(key, parent, role, content):
        return {"id": key, "parent": parent, "message": {"id": key, "author": {"role": role},
                                                        "create_time": 1700000000, "content": content}}

    mapping = {"root": {"id": "root", "parent": None, "message": None},
               "v": node("v", "root", "user", {"content_type": "multimodal_text", "parts": [
                   {"content_type": "audio_transcription", "text": "my sister lives in Oslo"},
                   {"content_type": "audio_asset_pointer"}]}),
               "c": node("c", "v", "assistant", {"content_type": "code", "language": "python", "text": "print(2)"}),
               "o": node("o", "c", "tool", {"content_type": "execution_output", "text": "2"}),
               # a browsing result (it was dropped without a word, and a tool message of no text too)
               "b": node("b", "o", "tool", {"content_type": "tether_browsing_display", "result": "Porto flats: 3",
                                            "summary": None}),
               "x": node("x", "b", "tool", {"content_type": "tether_quote", "url": "https://x"}),
               "a": node("a", "x", "assistant", {"content_type": "text", "parts": ["Three flats."]})}
    path = write(tmp_path, "conversations.json", json.dumps([{"title": "t", "mapping": mapping, "current_node": "a"}]))
    conversation = load_conversation(path)
    assert [t.content for t in conversation.turns] == ["my sister lives in Oslo\n[audio]", "print(2)", "2",
                                                       "Porto flats: 3", "Three flats."]
    assert conversation.warnings == ["1 message with no text was skipped (first: 'x')"]
    chat = write(tmp_path, "o.json", json.dumps({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": "data:..."}}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]}]}))
    assert [t.content for t in load_conversation(chat).turns] == ["What is this?\n[image]", "I can't help with that."]


def test_locomo_strangers_empty_turns_and_abstentions_references(tmp_path) -> None:
    """A turn by "Mel" (the speakers are Caroline and Melanie) became the assistant's without a
    word; an empty text said "missing"; a category-5 answer was dropped as reference although
    datasets/README.md says it is kept."""
    def sample(turns, qa=()):
        return [{"sample_id": "s", "qa": list(qa), "conversation": {
            "speaker_a": "Caroline", "speaker_b": "Melanie", "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": turns}}]

    ok = {"speaker": "Caroline", "dia_id": "D1:1", "text": "Hi"}
    stranger = {"speaker": "Mel", "dia_id": "D1:2", "text": "Hey"}
    qa = {"question": "Where?", "answer": "Not mentioned", "category": 5, "evidence": []}
    conversation = load_conversation(write(tmp_path, "a.json", json.dumps(sample([ok, stranger], [qa]))), None, "locomo")
    assert conversation.warnings == ["1 turn by a speaker who is neither 'Caroline' nor 'Melanie' (first: D1:2 ('Mel')) "
                                     "is read as the assistant's"]
    [probe] = conversation.probes
    assert probe.abstention and probe.gold is None and probe.reference == "Not mentioned"
    # A turn with no text and no image is skipped and said, as the chat exports do (a REALTALK file
    # with one blank "clean_text" was unreadable, "field 'text': is empty"; LoCoMo's "   " replayed)
    for n, blank in enumerate(({"text": ""}, {"text": "   "}, {"clean_text": "  "}, {"clean_text": " ", "text": ""})):
        loaded = load_conversation(write(tmp_path, f"b{n}.json", json.dumps(sample(
            [ok, {"speaker": "Melanie", "dia_id": "D1:2", **blank}, {**ok, "dia_id": "D1:3"}]))), None, "locomo")
        assert [t.id for t in loaded.turns] == ["D1:1", "D1:3"], blank
        assert loaded.warnings == ["1 turn with no text (and no image) was skipped (first: D1:2)"], loaded.warnings
    # a skipped blank turn's date_time still dates the undated turn after it (REALTALK's layout)
    dated = [ok, {"speaker": "Melanie", "dia_id": "D1:2", "clean_text": " ", "date_time": "1:00 pm on 9 May, 2023"},
             {**ok, "dia_id": "D1:3"}]
    loaded = load_conversation(write(tmp_path, "d.json", json.dumps(sample(dated))), None, "locomo")
    assert loaded.turns[-1].created_at.isoformat() == "2023-05-09T13:00:00+00:00"
    with pytest.raises(DatasetError, match="turn 1: field 'text': missing"):
        load_dataset(write(tmp_path, "b.json", json.dumps(sample([ok, {"speaker": "Melanie", "dia_id": "D1:2"}]))),
                     "locomo")
    number = {"speaker": "Melanie", "dia_id": "D1:2", "text": 5}  # (it was called "empty" too)
    with pytest.raises(DatasetError, match="turn 1: field 'text': expected str, got int"):
        load_dataset(write(tmp_path, "c.json", json.dumps(sample([ok, number]))), "locomo")


def test_files_that_are_not_what_they_seem_get_a_hint(tmp_path) -> None:
    lines = write(tmp_path, "ft.json", '{"messages": [{"role": "user", "content": "a"}]}\n'
                                       '{"messages": [{"role": "user", "content": "b"}]}\n')
    with pytest.raises(DatasetError, match=r"line 2 column 1: invalid JSON: Extra data \(one JSON value per line is "
                                           r"JSON Lines: name the file \.jsonl\)"):
        list_conversations(lines)
    for text in ("[]", "null"):  # "the file is empty" although it is not
        with pytest.raises(DatasetError, match=r"holds no conversations \(its JSON is empty"):
            list_conversations(write(tmp_path, "e.json", text))


def test_a_zip_given_as_a_dataset_is_named_as_one(tmp_path) -> None:
    import zipfile

    path = tmp_path / "beam1.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("chat.json", "[]")
    with pytest.raises(DatasetError, match="the file is a zip archive: unpack it"):  # it was "byte 11: not valid UTF-8"
        list_conversations(path)


def test_a_gzip_or_a_table_given_as_a_dataset_is_named_as_one(tmp_path) -> None:
    """Found by a researcher: a CSV said "line 1 column 1: invalid JSON" (a gzip, "not valid UTF-8")."""
    import gzip

    packed = tmp_path / "tiny.jsonl.gz"
    packed.write_bytes(gzip.compress((ROOT / "datasets" / "tiny.jsonl").read_bytes()))
    with pytest.raises(DatasetError, match=r"the file is gzip-compressed: decompress it first \(gunzip -k FILE\)"):
        list_conversations(packed)
    table = write(tmp_path, "chats.csv", "role,content\nuser,hi\n")
    with pytest.raises(DatasetError, match=r"the file is a \.csv file: datasets are JSON or JSON Lines, in one of "
                                           r"the formats read \(omem, locomo"):
        load_dataset(table)
    import zipfile

    sheet = tmp_path / "chats.xlsx"  # (a zip inside: it was told to unpack it)
    with zipfile.ZipFile(sheet, "w") as archive:
        archive.writestr("xl/workbook.xml", "<workbook/>")
    with pytest.raises(DatasetError, match=r"the file is a \.xlsx file: datasets are JSON"):
        load_dataset(sheet)


def test_a_database_or_utf16_text_given_as_a_dataset_is_named_as_one(tmp_path) -> None:
    """Found by a new user: an SQLite file given as a dataset said "byte 111: not valid UTF-8"."""
    import sqlite3

    import duckdb

    lite = tmp_path / "chats.db"
    with contextlib.closing(sqlite3.connect(lite)) as db:
        db.execute("create table t (x)")
        db.commit()
    with pytest.raises(DatasetError, match=r"the file is an SQLite database: datasets are JSON or JSON Lines text"):
        load_dataset(lite)
    duck = tmp_path / "runs.duckdb"
    duckdb.connect(str(duck)).close()
    with pytest.raises(DatasetError, match=r"the file is a DuckDB database \(the workbench's run store\?\)"):
        list_conversations(duck)
    ducks = tmp_path / "ducks.jsonl"  # ('DUCK' at byte 8, as in a DuckDB file, but JSON text)
    ducks.write_text((ROOT / "datasets" / "tiny.jsonl").read_text(encoding="utf-8").replace(
        '{"type": "message", "conversation_id": "tiny", "id": "t1"', '{"id": "DUCK-1", "type": "message", '
        '"conversation_id": "tiny"', 1), encoding="utf-8")
    assert ducks.read_bytes()[8:12] == b"DUCK" and load_dataset(ducks)[0].turns[0].id == "DUCK-1"
    wide = tmp_path / "tiny16.jsonl"
    wide.write_text((ROOT / "datasets" / "tiny.jsonl").read_text(encoding="utf-8"), encoding="utf-16")
    with pytest.raises(DatasetError, match=r"the file is UTF-16 text: save it as UTF-8"):
        load_conversation(wide)


def test_a_file_of_a_folder_dataset_given_alone_points_to_its_folder(tmp_path) -> None:
    """Found by a researcher: MemoryBank's probing_questions_en.jsonl given alone said "format not
    recognised"; `{}` said it too, where `[]` said the file holds no conversations."""
    folder = tmp_path / "memorybank"
    folder.mkdir()
    (folder / "memory_bank_en.json").write_text(json.dumps({"Ann": {"history": {"2023-05-01": [
        {"query": "I adopted a beagle.", "response": "Lovely!"}]}}}))
    probes = write(folder, "probing_questions_en.jsonl", json.dumps({"Ann": ["What dog?"]}) + "\n")
    with pytest.raises(DatasetError, match=rf"the file is one file of a memorybank dataset: give its folder "
                                           rf"\({re.escape(str(folder))}\)"):
        load_dataset(probes)
    assert [c.id for c in load_dataset(folder)] == ["memorybank-Ann"]
    with pytest.raises(DatasetError, match=r"holds no conversations \(its JSON is empty: null, \[\] or \{\}\)"):
        load_dataset(write(tmp_path, "empty.json", "{}"))


def test_a_chatgpt_export_folder_reads_its_conversations_file(tmp_path) -> None:
    """A ChatGPT data export unpacks to conversations.json beside user.json, chat.html,
    message_feedback.json…: the folder (and so the app's upload of the export's zip, which it
    unpacks) was "format not recognised"; its one dataset file is read. A folder holding two
    dataset files is still refused, naming them."""
    import zipfile

    from workbench import ui

    node = {"id": "u1", "parent": "root", "message": {"id": "u1", "author": {"role": "user"}, "create_time": 1700000000,
                                                       "content": {"content_type": "text", "parts": ["My flat is in Porto."]}}}
    export = tmp_path / "export"
    export.mkdir()
    write(export, "conversations.json", json.dumps([{"title": "Flat", "id": "c1", "current_node": "u1", "mapping": {
        "root": {"id": "root", "parent": None, "message": None}, "u1": node}}]))
    write(export, "user.json", json.dumps({"id": "user-1", "email": "a@example.com", "chatgpt_plus_user": False}))
    write(export, "message_feedback.json", "[]")
    write(export, "shared_conversations.json", json.dumps([{"id": "s", "conversation_id": "c1", "title": "Flat"}]))
    write(export, "chat.html", "<html></html>")
    assert detect_format(export) == "openai" and detect_format(export / "conversations.json") == "openai"
    [conversation] = load_dataset(export)
    assert conversation.id == "c1" and conversation.turns[0].text == "My flat is in Porto."
    assert [c.id for c in list_conversations(export)] == ["c1"] and load_conversation(export, "c1").turns
    with pytest.raises(DatasetError, match="its conversations.json is not in the locomo format: its content is openai"):
        load_dataset(export, "locomo")
    (export / "conversations.json").rename(export / "conversations.txt")
    with pytest.raises(DatasetError) as caught:  # (its other JSON files are no datasets: not offered)
        load_dataset(export, "locomo")
    assert "is a folder, and the locomo format reads a file; its JSON files (message_feedback.json, " \
           "shared_conversations.json, user.json) are in none of the formats read" in str(caught.value)
    (export / "conversations.txt").rename(export / "conversations.json")

    class Upload:  # what the app's uploader hands over: the export's zip, as downloaded
        name, _data = "chatgpt-export.zip", b""

        def getvalue(self) -> bytes:
            return self._data

    buffer = tmp_path / "export.zip"
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in export.iterdir():
            archive.write(path, path.name)
    upload = Upload()
    upload._data = buffer.read_bytes()
    assert [c.id for c in load_dataset(ui._saved_upload(upload))] == ["c1"]

    write(export, "more.jsonl", json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(DatasetError, match="format not recognised.*conversations.json.*more.jsonl"):
        load_dataset(export)


def test_chat_messages_with_no_text_are_skipped_and_said(tmp_path) -> None:
    """Found by a researcher: a ShareGPT turn with "value": null loaded as an empty message,
    counted among the messages, without a word (ChatGPT exports skip and count them)."""
    chats = write(tmp_path, "share.json", json.dumps([{"id": "s", "conversations": [
        {"from": "human", "value": "I adopted a beagle."}, {"from": "gpt", "value": None},
        {"from": "human", "value": "  "}, {"from": "gpt", "value": "Congratulations!"}]}]))
    [conversation] = load_dataset(chats)
    assert [t.text for t in conversation.turns] == ["I adopted a beagle.", "Congratulations!"]
    assert [t.id for t in conversation.turns] == ["s-0", "s-3"]  # ids by place in the file, as before
    assert conversation.warnings == ["2 messages with no text were skipped (first: 'conversation 0 message 1')"]
    lines = write(tmp_path, "openai.jsonl", json.dumps({"id": "o", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": ""},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]}) + "\n")
    [conversation] = load_dataset(lines)
    assert [t.text for t in conversation.turns] == ["hi", "[tool call: f({})]"]  # a call is not "no text"
    assert len(conversation.warnings) == 1 and "1 message with no text was skipped" in conversation.warnings[0]


def test_sharegpt_function_calling_sets_keep_their_system_prompt_tools_and_calls(tmp_path) -> None:
    """Glaive/xLAM-style ShareGPT: the top-level system prompt and tools were dropped and a call
    stayed raw JSON; they read as the OpenAI format's do."""
    tools = [{"name": "get_weather", "description": "d", "parameters": {}},
             {"type": "function", "function": {"name": "book_table", "parameters": {}}}]
    record = {"id": "g1", "system": "You are a travel helper.", "tools": json.dumps(tools), "conversations": [
        {"from": "human", "value": "Weather in Porto?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Porto"}})},
        {"from": "observation", "value": "{\"temp\": 21}"},
        {"from": "function_call", "value": json.dumps([{"name": "book_table", "arguments": "{\"at\": \"8pm\"}"},
                                                       {"name": "get_weather", "arguments": {"city": "Braga"}}])},
        {"from": "function_call", "value": "I will look it up."},  # not JSON: kept as written
        {"from": "gpt", "value": "21 degrees."}]}
    plain = {"id": "p1", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    first, second = load_dataset(write(tmp_path, "glaive.json", json.dumps([record, plain])))
    assert [(t.id, t.role) for t in first.turns[:2]] == [("g1-system", "system"), ("g1-0", "user")]
    assert first.turns[0].text == "You are a travel helper.\n[tools: get_weather, book_table]"
    assert first.turns[2].text == '[tool call: get_weather({"city": "Porto"})]' and first.turns[2].role == "assistant"
    assert first.turns[3].text == '{"temp": 21}' and first.turns[3].role == "tool"
    assert first.turns[4].text == ('[tool call: book_table({"at": "8pm"})]\n'
                                   '[tool call: get_weather({"city": "Braga"})]')
    assert first.turns[5].text == "I will look it up."
    assert [t.id for t in second.turns] == ["p1-0", "p1-1"]  # without a system prompt, nothing is added
    assert not first.warnings and not second.warnings


def test_sharegpt_tools_that_cannot_be_read_are_said_and_a_system_prompt_comes_once(tmp_path) -> None:
    """A malformed ``tools`` string was dropped without a word; a system prompt given at the top
    and as the first turn too was shown twice."""
    chat = [{"from": "system", "value": "You are a travel helper. "}, {"from": "human", "value": "Porto?"}]
    records = [{"id": "cut", "tools": '[{"name": "get_weather", "parame', "conversations": chat},
               {"id": "odd", "tools": {"name": "get_weather"}, "conversations": chat},
               {"id": "nameless", "tools": [{"description": "d"}], "conversations": chat},
               {"id": "twice", "system": "You are a travel helper.", "tools": [{"name": "get_weather"}],
                "conversations": chat},
               {"id": "none1", "tools": "null", "conversations": chat}, {"id": "none2", "tools": {}, "conversations": chat}]
    cut, odd, nameless, twice, *empty = load_dataset(write(tmp_path, "tools.json", json.dumps(records)))
    assert [c.warnings for c in empty] == [[], []]  # given empty: nothing to say
    assert cut.warnings == ["its 'tools' is not valid JSON ('[{\"name\": \"get_weather\", \"parame'): the tools "
                            "the model could call are not shown"]
    assert odd.warnings == ["its 'tools' is not a list (got dict): the tools the model could call are not shown"]
    assert "names no tool" in nameless.warnings[0]
    assert not twice.warnings
    assert [t.text for t in twice.turns] == ["[tools: get_weather]", "You are a travel helper. ", "Porto?"]


def test_an_undated_turn_among_dated_ones_sits_at_the_turn_before_it(tmp_path) -> None:
    """REALTALK: a turn with "date_time": null was placed 30 s × its position after the session's
    start (18:01:30), before the turns around it (18:07)."""
    turns = [{"speaker": "A", "dia_id": "D1:1", "text": "a", "date_time": "2023-05-08 18:06:00"},
             {"speaker": "B", "dia_id": "D1:2", "text": "b", "date_time": "2023-05-08 18:07:00"},
             {"speaker": "A", "dia_id": "D1:3", "text": "c", "date_time": None},
             {"speaker": "B", "dia_id": "D1:4", "text": "d", "date_time": "2023-05-08 18:09:00"}]
    sample = [{"sample_id": "s", "qa": [], "conversation": {"speaker_a": "A", "speaker_b": "B",
                                                          "session_1_date_time": "2023-05-08 18:00:00",
                                                          "session_1": turns}}]
    conversation = load_conversation(write(tmp_path, "r.json", json.dumps(sample)), None, "locomo")
    assert [t.created_at.strftime("%H:%M") for t in conversation.turns] == ["18:06", "18:07", "18:07", "18:09"]
    assert not conversation.warnings  # (it was also reported as out of order)


def test_a_list_of_answers_is_text_and_the_gold_count_is_what_the_score_can_read(tmp_path) -> None:
    """A gold answer given as a list was stored as Python's "['x', 'y']", and the listing's gold
    column counted answers the word score can never read ("", "!!!"): 24 gold of which 18 scored."""
    lines = [{"conversation_id": "c", "id": f"m{i}", "role": "user", "content": f"message {i}",
              "timestamp": f"2024-05-0{i + 1}T10:00:00Z"} for i in range(3)]
    for n, answer in enumerate([["Lisbon", "Porto"], "", "!!!", 42, "the violin"]):
        lines.append({"conversation_id": "c", "type": "probe", "id": f"q{n}", "question": "?", "answer": answer,
                      "evidence": ["m0"]})
    path = tmp_path / "golds.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    conversation = load_conversation(path)
    assert [p.gold for p in conversation.probes] == ["Lisbon, Porto", "", "!!!", "42", "the violin"]
    [info] = list_conversations(path)
    assert info.probes == 5 and info.scored_probes == 3  # the list, 42 and "the violin"
    assert sum(probe_score(p.gold, set()) is not None for p in conversation.probes) == info.scored_probes


def test_keys_the_omem_format_does_not_read_are_warned_about_once(tmp_path) -> None:
    """Found by a walkthrough: a probe written with "gold" for "answer" loaded as a probe with no
    gold answer, and the replay said only that none had one."""
    path = tmp_path / "gold.jsonl"
    lines = [{"conversation_id": "c", "id": f"m{i}", "role": "user", "content": "I live in Zürich.",
              "timestamp": f"2024-01-01T10:0{i}:00Z", "mood": "fine"} for i in range(3)]
    lines.append({"type": "probe", "conversation_id": "c", "id": "p1", "question": "Where?", "gold": "Zürich"})
    path.write_text("\n".join(json.dumps(line) for line in lines))
    [conversation] = load_dataset(path)
    assert conversation.warnings == [
        "line 1: key 'mood' of a message is not read (a message's keys: type, conversation_id, id, role, "
        "content, timestamp, speaker)",
        "line 4: key 'gold' of a probe is not read (a probe's keys: type, conversation_id, id, question, "
        "answer, evidence, category, abstention)"]
    assert conversation.probes[0].gold is None
    # another conversation of the file with the same key: warned about too (its own replay shows it)
    lines += [dict(line, conversation_id="d") for line in lines]
    path.write_text("\n".join(json.dumps(line) for line in lines))
    assert [len(c.warnings) for c in load_dataset(path)] == [2, 2]


def test_dataset_error_takes_the_keywords_its_docs_name() -> None:
    """datasets/README.md documents ``DatasetError(file, record, field, problem)``; the constructor
    called its third parameter ``field_name``, so the documented keywords raised TypeError."""
    from workbench.datasets import DatasetError

    error = DatasetError(file="chat.jsonl", record="line 3", field="role", problem="is not a known role")
    assert (error.file, error.record, error.field, error.problem) == ("chat.jsonl", "line 3", "role", "is not a known role")
    assert str(error) == "chat.jsonl: line 3: field 'role': is not a known role"


def test_a_blank_message_a_format_keeps_is_said(tmp_path) -> None:
    """Found by a walkthrough: blank messages were refused by one loader, skipped with a warning by
    others, and replayed without a word by the omem format and LoCoMo."""
    path = write(tmp_path, "blank.jsonl", line(id="m1") + line(id="m2", content="   ",
                                                                timestamp="2024-01-01T10:01:00Z")
                 + line(id="m3", content=" \n", timestamp="2024-01-01T10:02:00Z"))
    [conversation] = load_dataset(path)
    assert [t.id for t in conversation.turns] == ["m1", "m2", "m3"]  # kept: the library takes a blank message
    assert conversation.warnings == ["2 messages are blank (no text, or only spaces), replayed as they are "
                                     "(first: 'm2')"]
