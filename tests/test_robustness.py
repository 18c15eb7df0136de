"""Bad input and secrets: fuzzed dataset files, and API keys that must never be stored."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from workbench.catalog import DEMO_DATASET, PROJECT_DATASETS
from workbench.datasets import FORMATS, DatasetError, list_conversations, load_conversation, load_dataset
from workbench.replay import ConfigurationError, ReplayConfig, replay
from workbench.runstore import RunStore

VALID = (PROJECT_DATASETS / "tiny.jsonl").read_bytes()
LONGMEMEVAL = (PROJECT_DATASETS / "samples" / "longmemeval-sample.json").read_bytes()
REALTALK = (PROJECT_DATASETS / "samples" / "realtalk-sample.json").read_bytes()
LOCOMO_LIKE = json.dumps([{"sample_id": "s", "qa": [{"question": "q", "answer": "a", "evidence": ["D1:1"],
                                                       "category": 1}],
                           "conversation": {"speaker_a": "A", "speaker_b": "B",
                                            "session_1_date_time": "1:56 pm on 8 May, 2023",
                                            "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"}]}}]).encode()
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)


def mutate(data: bytes, cut: int, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data[: cut % (len(data) + 1)])
    for position, value in flips:
        if out:
            out[position % len(out)] = value
    return bytes(out)


def only_dataset_errors(path: Path, fmt: str | None) -> None:
    """Every entry point (whole file, listing, one conversation) fails only with a DatasetError
    naming the file and the record. Any other exception fails the test: it would escape to the
    user as a crash."""
    for read in (load_dataset, list_conversations, load_conversation):
        try:
            read(path, format=fmt)
        except DatasetError as exc:
            assert str(path) in str(exc) and exc.record  # names the file and the record


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=st.sampled_from([VALID, LOCOMO_LIKE, LONGMEMEVAL, REALTALK]), cut=st.integers(0, 8000),
       flips=st.lists(st.tuples(st.integers(0, 8000), st.integers(0, 255)), max_size=6),
       fmt=st.sampled_from([None, *FORMATS]))
def test_truncated_and_corrupted_files_raise_only_dataset_errors(tmp_path, source, cut, flips, fmt) -> None:
    path = tmp_path / ("f.jsonl" if source is VALID else "f.json")
    path.write_bytes(mutate(source, cut, flips))
    only_dataset_errors(path, fmt)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.dictionaries(st.sampled_from(["conversation_id", "id", "role", "content", "timestamp",
                                                         "type", "question", "answer", "evidence", "speaker"]),
                                        JSON_VALUES, max_size=8), min_size=1, max_size=5),
       fmt=st.sampled_from([None, "omem", "openai", "sharegpt"]))
@example(records=[{"id": None, "type": [], "conversation_id": ""}], fmt=None)  # a list as a type was a TypeError
@example(records=[{"conversation_id": "c", "type": {"a": 1}}], fmt="omem")
def test_wrong_types_raise_only_dataset_errors(tmp_path, records, fmt) -> None:
    path = tmp_path / "typed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    only_dataset_errors(path, fmt)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=JSON_VALUES, fmt=st.sampled_from([None, *FORMATS]))
def test_arbitrary_json_documents_raise_only_dataset_errors(tmp_path, document, fmt) -> None:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(document))
    only_dataset_errors(path, fmt)


DEEP = "[" * 600 + "1" + "]" * 600
FOUND_BY_FUZZING = [  # (file, content, format, what the error says): each was a crash, not a DatasetError
    ("a.jsonl", '{"conversation_id": "c", "id": "m", "role": "user", "content": "x", "timestamp": ' + "1" * 4301 + "}\n",
     None, r"line 1: invalid JSON: a number of more than 4,300 digits"),
    ("a.json", "[" + "1" * 4301 + "]", None, r"line 1 column 2: invalid JSON: a number of more than 4,300 digits"),
    ("a.json", '{"x": ' + "1" * 4301 + "}", None, r"top level: invalid JSON: a number of more than 4,300 digits"),
    ("chat.json", '[{"time_anchor": "9999-12-31T23:59:59", "turns": [[{"role": "user", "id": 0, "content": "hi"}]]}]',
     "beam", r"field 'time_anchor': dated 9999-12-31 23:59:59: too close to the end of year 9999"),
    ("lme.json", json.dumps([{"question_id": "q", "question": "q?", "answer": "a", "haystack_session_ids": ["s"],
                              "haystack_dates": ["9999/12/31 23:59"], "haystack_sessions": [
                                  [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                   {"role": "user", "content": "c"}]]}]),
     "longmemeval", r"session 0 turn 2: field 'haystack_dates': dated 9999-12-31 23:59:00: too close"),
    ("lme.json", json.dumps([{"question_id": "q", "question": "q?", "answer": "a", "haystack_session_ids": ["s", "t"],
                              "haystack_dates": ["9999/12/31 23:59:59"] * 2,
                              "haystack_sessions": [[{"role": "user", "content": "a"}],
                                                    [{"role": "user", "content": "b"}]]}]),
     "longmemeval", r"turn 0: field 'haystack_dates': dated 9999-12-31 23:59:59: too close"),
    ("locomo.json", json.dumps([{"conversation": {"speaker_a": "A", "speaker_b": "B",
                                                  "session_1_date_time": "9999-12-31T23:59:59",
                                                  "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"},
                                                                {"speaker": "B", "dia_id": "D1:2", "text": "yo"}]}}]),
     "locomo", r"session_1 turn 1: field 'session_1_date_time': dated 9999-12-31 23:59:59: too close"),
    ("mb.json", json.dumps({"U": {"history": {"9999-12-31": [{"query": "q", "response": "r"}] * 451}}}),
     "memorybank", r"item 450: field '9999-12-31': dated 9999-12-31 09:00:00: too close"),
]


@pytest.mark.parametrize("name, content, fmt, said", FOUND_BY_FUZZING)
def test_inputs_found_by_fuzzing_are_dataset_errors(tmp_path, name, content, fmt, said) -> None:
    path = tmp_path / name
    path.write_text(content)
    for read in (load_dataset, list_conversations, load_conversation):
        with pytest.raises(DatasetError, match=said):
            read(path, format=fmt)


def test_odd_but_readable_values_found_by_fuzzing_load(tmp_path) -> None:
    """A LoCoMo session or category number of 4,301 digits (int() refuses it), BEAM evidence ids
    nested 600 deep, a ShareGPT tools string nested 1,000 deep: each crashed the loader; each is
    read now."""
    long = "1" * 4301
    sample = {"sample_id": "s", "qa": [{"question": "q", "answer": "a", "category": long}],
              "conversation": {"speaker_a": "A", "speaker_b": "B", "session_1_date_time": "1:56 pm on 8 May, 2023",
                               "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"}],
                               f"session_{long}_date_time": "1:56 pm on 9 May, 2023",
                               f"session_{long}": [{"speaker": "B", "dia_id": "D9:1", "text": "later"}]}}
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([sample]))
    [conversation] = load_dataset(path, format="locomo")
    assert [t.id for t in conversation.turns] == ["D1:1", "D9:1"] and conversation.probes[0].category == long
    folder = tmp_path / "beam" / "1"
    folder.mkdir(parents=True)
    (folder / "chat.json").write_text(json.dumps([{"time_anchor": "2024-01-01", "turns": [
        [{"role": "user", "id": 1, "content": "I moved to Lisbon."}]]}]))
    (folder / "probing_questions.json").write_text(
        '{"information_extraction": [{"question": "Where?", "answer": "Lisbon", "source_chat_ids": ' + DEEP + "}]}")
    [chat] = load_dataset(tmp_path / "beam", format="beam")
    assert chat.probes[0].evidence == ("1",)
    shared = tmp_path / "sharegpt.json"
    shared.write_text(json.dumps([{"tools": "[" * 1000 + "]" * 1000, "conversations": [{"from": "human", "value": "hi"}]}]))
    [talk] = load_dataset(shared, format="sharegpt")
    assert [t.text for t in talk.turns if t.role == "user"] == ["hi"]


def test_a_sharegpt_message_with_no_text_does_not_shift_the_others(tmp_path) -> None:
    """Found by fuzzing: an empty message skipped, the function-call rewrite paired messages and
    turns by position, so the answer after a call read as the call and its text was lost."""
    path = tmp_path / "calls.json"
    path.write_text(json.dumps([{"conversations": [
        {"from": "human", "value": ""},
        {"from": "function_call", "value": json.dumps({"name": "f", "arguments": {"a": 1}})},
        {"from": "gpt", "value": "the answer is 42"}]}]))
    [conversation] = load_dataset(path, format="sharegpt")
    assert [t.text for t in conversation.turns] == ['[tool call: f({"a": 1})]', "the answer is 42"]


def test_huge_fields_are_read(tmp_path) -> None:
    line = {"conversation_id": "c", "id": "m1", "role": "user", "content": "x" * 5_000_000,
            "timestamp": "2024-01-01T00:00:00Z"}
    path = tmp_path / "huge.jsonl"
    path.write_text(json.dumps(line) + "\n")
    [conversation] = load_dataset(path)
    assert len(conversation.turns[0].text) == 5_000_000


def test_a_message_longer_than_the_trace_cap_is_replayed_and_its_trace_stays_json(tmp_path) -> None:
    """The trace of a call was cut as text at 64,000 characters, which is no longer JSON: the
    batch's insert failed at the end and the run stayed 'interrupted', on resume too."""
    from workbench.app_data import trace_attempts
    from workbench.recorder import TRACE_CAP

    turns = [("user", "A plain sentence about the garden. " * 3000), ("assistant", "ok"), ("user", "and?"),
             ("assistant", "done \"quoted\" \\ and a tab\t")]
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"conversation_id": "c", "id": f"m{i}", "role": role, "content": text,
                                        "timestamp": f"2024-01-01T00:0{i}:00Z"}) + "\n"
                            for i, (role, text) in enumerate(turns)))
    db = tmp_path / "r.duckdb"
    with RunStore(db) as store:
        result = asyncio.run(replay(load_conversation(path), ReplayConfig(last_messages=1, cache=False), store))
    assert result.status == "completed"
    with RunStore(db) as store:
        assert store.run(result.run_id)["status"] == "completed"
        calls = store.model_calls(result.run_id)
    assert len(calls) and all(len(text) <= TRACE_CAP for text in calls.request)
    [attempt] = trace_attempts(calls.iloc[0].to_dict())
    sent = attempt["messages"][-1]["content"]  # the observer's input: cut, and says by how much
    assert sent.endswith("more characters not stored]") and "A plain sentence about the garden." in sent


def test_a_long_trace_in_chinese_keeps_as_much_text_as_one_in_english() -> None:
    """The cut was counted in characters of the message but measured in escaped JSON (6
    characters per Chinese one): a 20,000-character Chinese message kept only 200 of them."""
    from workbench.recorder import TRACE_CAP, _capped

    kept = {}
    for name, char in (("english", "z"), ("chinese", "花")):
        text = _capped([[{"role": "user", "content": char * 100_000}]])
        assert len(text) <= TRACE_CAP
        [[message]] = json.loads(text)
        kept[name] = message["content"].count(char)
        assert message["content"].endswith(f"{100_000 - kept[name]:,} more characters not stored]")
    assert kept["chinese"] == kept["english"] > 60_000


def test_a_trace_of_many_medium_strings_keeps_the_start_of_each() -> None:
    """One string was cut per round, for 64 rounds: a trace of 500 strings of 1,000 characters
    was dropped whole."""
    from workbench.recorder import TRACE_CAP, _capped

    replies = [f"reply {i}: " + "x" * 1_000 for i in range(500)]
    text = _capped(replies)
    assert len(text) <= TRACE_CAP
    stored = json.loads(text)
    assert len(stored) == 500
    assert all(s.startswith(f"reply {i}: x") and s.endswith("more characters not stored]")
               for i, s in enumerate(stored))
    assert _capped(["short", "replies"]) == '["short", "replies"]'  # what fits is stored as it is
    assert "not stored" in json.loads(_capped(["y" * 200] * 5_000))  # too many to keep: a note
    # a text barely over the common length is not "cut" into a longer one (the note has a length):
    # 1,400 short replies beside one huge one fit once only the huge one is cut
    stored = json.loads(_capped(["a" * 41] * 1_400 + ["b" * 70_000]))
    assert stored[:1_400] == ["a" * 41] * 1_400 and stored[-1].endswith("more characters not stored]")


def test_a_lone_surrogate_in_a_long_trace_keeps_it_under_the_cap_and_storable(tmp_path) -> None:
    """A lone surrogate (UTF-8 cannot hold it) made the whole trace JSON fall back to escapes, six
    times longer than measured: the trace ran past the cap (64,810 characters here), and DuckDB's
    JSON column rejects one anyway. It is replaced by U+FFFD; a split surrogate pair is joined."""
    from workbench.recorder import TRACE_CAP, _capped

    text = _capped(["\ud800"] + ["花" * 1_000] * 200)
    assert len(text) <= TRACE_CAP
    stored = json.loads(text)
    assert stored[0] == "\ufffd" and stored[1].startswith("花" * 40)
    assert json.loads(_capped(["\ud83d\ude00 ok"])) == ["😀 ok"]
    with RunStore(tmp_path / "s.duckdb") as store:  # what is capped is what DuckDB accepts
        run_id = store.create_run(dataset="d", dataset_format="jsonl", conversation_id="c", config={},
                                  messages=[])
        store.add_steps(run_id, [], [{"step": 0, "stage": "observe", "model": "m", "request": text,
                                      "response": _capped(["\udfff"])}])
        [call] = store.model_calls(run_id).to_dict("records")
    assert json.loads(call["request"])[0] == "\ufffd" and json.loads(call["response"]) == ["\ufffd"]


def test_a_trace_keys_and_tuples_are_cleaned_as_its_strings_are(monkeypatch) -> None:
    """Only strings in lists and dict values were cleaned: a lone surrogate in a key (a tool's
    argument name, say) made the whole batch's insert fail, and a secret in a tuple was stored."""
    from workbench.recorder import _capped

    key = "sk-abcdefghijklmnop"
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    stored = json.loads(_capped({"name\udc80": ("quoting " + key, "\ud800")}))
    assert stored == {"name\ufffd": [stored["name\ufffd"][0], "\ufffd"]}
    assert key not in stored["name\ufffd"][0] and "[ANTHROPIC_" in stored["name\ufffd"][0]


def test_a_secret_is_redacted_before_the_cap_so_a_cut_never_keeps_part_of_it(monkeypatch) -> None:
    """Secrets were redacted in the capped JSON: a cut falling inside a key stored its first
    characters (and the redacted trace could run past the cap)."""
    from workbench.recorder import TRACE_CAP, _capped

    key = "sk-abcdefghijklmnop"
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    text = _capped(["x" * 40 + key + "y" * 100] * 700)
    assert len(text) <= TRACE_CAP
    assert "sk-abc" not in text and "[ANTHROPIC_" in text  # (the redaction may itself be cut)
    assert key not in _capped([f"a short reply quoting {key}"])


def test_a_run_whose_last_batch_cannot_be_written_reads_failed_not_interrupted(tmp_path, monkeypatch) -> None:
    """When the run store rejected the last batch, recording the failure flushed the same batch
    again, failed too, and the run stayed 'running' (shown as interrupted, as if the process died)."""
    import duckdb

    db = tmp_path / "r.duckdb"
    with RunStore(db) as store:
        def rejected(*args, **kwargs):
            raise duckdb.ConversionException("Conversion Error: rejected for the test")

        monkeypatch.setattr(store, "add_steps", rejected)
        with pytest.raises(duckdb.ConversionException):
            asyncio.run(replay(load_conversation(DEMO_DATASET), ReplayConfig(cache=False), store))
        monkeypatch.undo()
        [run] = store.runs().to_dict("records")
        assert run["status"] == "failed" and "rejected for the test" in run["error"]


def test_a_run_store_held_by_another_process_is_waited_for_once_not_again_to_record_the_failure(
        tmp_path) -> None:
    """After a batch could not be written because another process held the file, recording the
    failure opened the file again (and waited again), then dropped the batch and waited a third
    time to set the status: three waits of --wait for one error."""
    from conftest import held_by_another_process
    from workbench.runstore import RunStoreLocked

    db = tmp_path / "r.duckdb"
    waits: list[str] = []
    store = RunStore(db, wait_s=0.3, on_wait=waits.append)
    with held_by_another_process(db), pytest.raises(RunStoreLocked):
        asyncio.run(replay(load_conversation(DEMO_DATASET), ReplayConfig(cache=False), store))
    assert len(waits) == 1
    assert store.runs().empty  # nothing half-written once the file is free again


def test_a_run_stopped_by_a_held_run_store_does_not_stay_running_in_a_long_lived_process(tmp_path) -> None:
    """A run whose batch could not be written (the file held by another process past the wait)
    was left 'running': its owner, the app's process, lives on, so it read as still running until
    the app restarted. Its status is set at the store's next open of the file, once it is free."""
    from conftest import held_by_another_process
    from workbench.runstore import RunStoreLocked

    db = tmp_path / "r.duckdb"
    store = RunStore(db, wait_s=0.3)
    holding = contextlib.ExitStack()

    def progress(done: int, total: int, text: str) -> None:
        if done == 60:  # the run is in the file by now (flushed every 10 steps)
            holding.enter_context(held_by_another_process(db))

    with holding, pytest.raises(RunStoreLocked):
        asyncio.run(replay(load_conversation(DEMO_DATASET), ReplayConfig(cache=False, recall_on="every"), store,
                           progress=progress, flush_every=10))
    [run] = store.runs().to_dict("records")  # the file is free again
    assert run["status"] == "failed" and "RunStoreLocked" in run["error"] and run["steps"] >= 10
    resumed = asyncio.run(replay(load_conversation(DEMO_DATASET), store=store, resume=run["run_id"]))
    assert resumed.status == "completed"

def test_a_snapshot_of_a_held_run_store_is_removed_when_closed_and_when_its_process_ends(tmp_path) -> None:
    """The app's read-only copy of a held file (as large as the file) stayed in the temporary folder
    for good, one more at each "Try the file again" that found the file still held."""
    import os
    import subprocess
    import sys

    from conftest import held_by_another_process

    db = tmp_path / "r.duckdb"
    RunStore(db).create_run(dataset="d", dataset_format="jsonl", conversation_id="c", config={}, messages=[])
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    take = ("import sys; from workbench.runstore import RunStore; s = RunStore.snapshot(sys.argv[1]); "
            "print(len(s.runs()), s.path)")
    with held_by_another_process(db):
        snapshot = RunStore.snapshot(db)
        copy = Path(snapshot.path)
        assert copy.is_file() and copy.parent != db.parent and len(snapshot.runs()) == 1
        snapshot.close()
        assert not copy.parent.exists()
        snapshot.close()  # (twice is harmless)
        # a process that ends without closing its snapshot (the app, stopped) removes it too
        done = subprocess.run([sys.executable, "-c", take, str(db)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TMPDIR": str(scratch)}, check=True)
    count, path = done.stdout.split()
    assert count == "1" and Path(path).is_relative_to(scratch)  # it was taken there, and is gone
    assert list(scratch.iterdir()) == []
    assert len(RunStore(db).runs()) == 1  # the original is untouched


def test_a_failure_settled_later_leaves_alone_a_resume_of_the_run_in_the_same_process(tmp_path) -> None:
    """A failure that could not be written at once (the file held) was set at the store's next
    open even when the run had been resumed meanwhile by another store of the same process (the
    app opens one per page run): the resume, still running, read as failed."""
    from conftest import held_by_another_process

    db = tmp_path / "r.duckdb"
    first = RunStore(db, wait_s=0.3)
    run_id = first.create_run(dataset="d", dataset_format="jsonl", conversation_id="c", config={}, messages=[])
    with held_by_another_process(db):
        first.settle_run(run_id, "failed", "RunStoreLocked: held")  # not written: the file is held
    RunStore(db).claim_run(run_id)  # a resume, in this process, from another store
    [run] = first.runs().to_dict("records")  # the first store opens the file again
    assert run["status"] == "running" and run["error"] is None


def test_a_run_stopped_while_the_store_is_held_waits_briefly_and_still_settles(tmp_path, monkeypatch) -> None:
    """A Ctrl-C's clean-up (the last batch, the status), with the key ignored meanwhile, waited the
    store's full wait (60 s by default) for a file held by another process, which reads as a hung
    command; and when that write failed the run stayed 'running' for as long as its process lived.
    It now waits briefly, and the run reads as interrupted once the file is free."""
    from conftest import held_by_another_process

    from workbench import interrupts
    from workbench.runstore import RunStoreLocked

    monkeypatch.setattr(interrupts, "STOPPING_WAIT_S", 0.4)
    db = tmp_path / "r.duckdb"
    waits: list[str] = []
    store = RunStore(db, wait_s=30, on_wait=waits.append)
    holding = contextlib.ExitStack()

    def progress(done: int, total: int, text: str) -> None:
        if done == 60:  # the run is in the file by now (flushed every 10 steps)
            holding.enter_context(held_by_another_process(db))
            raise KeyboardInterrupt

    with holding, pytest.raises(KeyboardInterrupt):
        asyncio.run(replay(load_conversation(DEMO_DATASET), ReplayConfig(cache=False, recall_on="every"), store,
                           progress=progress, flush_every=10))
    assert waits == [f"waiting for {db}: another process is using it (up to 0.4 s)"]
    [run] = store.runs().to_dict("records")  # the file is free again
    assert run["status"] == "interrupted" and run["steps"] >= 10
    waits.clear()
    with held_by_another_process(db), pytest.raises(RunStoreLocked):
        RunStore(db, wait_s=0.6, on_wait=waits.append).runs()  # elsewhere, the store's own wait
    assert waits == [f"waiting for {db}: another process is using it (up to 0.6 s)"]


SENTINEL = "sk-omem-sentinel-8c1f0e7a"


@contextlib.contextmanager
def openai_compatible_server(reply: str = "- Ann moved to Oslo."):
    """A local OpenAI-compatible chat endpoint that records the ``Authorization`` header of every
    request: the key really travels to a provider, so a leak anywhere downstream is possible."""
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append(self.headers.get("Authorization"))
            body = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini",
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": reply}}],
                               "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


def test_api_keys_never_reach_duckdb_exports_or_output(tmp_path, monkeypatch, capsys) -> None:
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.setenv(variable, SENTINEL)
    monkeypatch.setenv("OMEM_CACHE_DIR", str(tmp_path / "cache"))
    from workbench.datasets import load_conversation

    db = tmp_path / "secret.duckdb"
    with openai_compatible_server() as (base, seen):
        monkeypatch.setenv("OPENAI_API_BASE", base)
        config = ReplayConfig(observer="openai/gpt-4o-mini", reflector="openai/gpt-4o-mini")
        with RunStore(db) as store:
            result = asyncio.run(replay(load_conversation(DEMO_DATASET), config, store))
            store.export_parquet(result.run_id, tmp_path / "export")
    assert seen and set(seen) == {f"Bearer {SENTINEL}"}, "the provider never received the key"
    files = [db, *(tmp_path / "export").iterdir(), *(tmp_path / "cache").rglob("*")]
    for file in files:
        if file.is_file():
            assert SENTINEL.encode() not in file.read_bytes(), f"the key leaked into {file}"
    captured = capsys.readouterr()
    assert SENTINEL not in captured.out + captured.err


@pytest.mark.parametrize("text", ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>"])
def test_html_in_datasets_is_kept_as_text(tmp_path, text) -> None:
    path = tmp_path / "html.jsonl"
    path.write_text(json.dumps({"conversation_id": "c", "id": "m1", "role": "user", "content": text,
                                "timestamp": "2024-01-01T00:00:00Z"}) + "\n")
    [conversation] = load_dataset(path)
    assert conversation.turns[0].text == text  # stored verbatim; the app shows it as text


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


def _replace(node, path, value):
    if not path:
        return value
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[path[0]] = _replace(node[path[0]], path[1:], value)
    return copy


BEAM_CHAT = [{"batch_number": 1, "time_anchor": "March-15-2024",
              "turns": [[{"role": "user", "id": 0, "content": "plan ->-> 1,1", "time_anchor": "March-15-2024"},
                         {"role": "assistant", "id": 1, "content": "ok"}]]}]
BEAM_PROBES = {"information_extraction": [{"question": "q", "answer": "a", "source_chat_ids": [0]}],
               "knowledge_update": [{"question": "q2", "ideal_answer": "b", "source_chat_ids": {"x": [1]}}]}
SHAPES = {
    "locomo": ("f.json", json.loads(LOCOMO_LIKE)),
    "longmemeval": ("f.json", [{"question_id": "q1_abs", "question_type": "single-session-user", "question": "q",
                                "answer": 3, "question_date": "2023/05/20 (Sat) 02:21",
                                "haystack_session_ids": ["s1", "s2"],
                                "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/19 (Fri) 10:00"],
                                "haystack_sessions": [[{"role": "user", "content": "hi", "has_answer": True}],
                                                      [{"role": "assistant", "content": "yo"}]],
                                "answer_session_ids": ["s1"]}]),
    "realtalk": ("f.json", {"name": {"speaker_1": "Ann", "speaker_2": "Bo"},
                            "session_1": [{"clean_text": "hi", "text": "hi!", "speaker": "ann",
                                           "date_time": "08.05.2023, 13:56:00", "dia_id": "D1:1"}],
                            "session_1_date_time": "08.05.2023, 13:56:00",
                            "events_session_1": {"agent_a": [], "agent_b": []},
                            "qa": [{"question": "q", "answer": "a", "evidence": ["D1:1"], "category": 2}]}),
    "openai": ("f.json", [{"id": "c", "messages": [{"role": "user", "content": "hi"},
                                                    {"role": "assistant", "content": [{"type": "text", "text": "yo"}]}]}]),
    "sharegpt": ("f.json", [{"id": "c", "conversations": [{"from": "human", "value": "hi"}]}]),
    "memorybank": ("memory_bank_en.json", {"Ann": {"name": "Ann", "history": {"2023-04-27": [
        {"query": "hi", "response": "hello"}]}}}),
}


FORMAT_OF = {"realtalk": "locomo"}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from([*SHAPES, "beam"]), detect=st.booleans(), data=st.data())
def test_structurally_wrong_records_raise_only_dataset_errors(tmp_path, shape, detect, data) -> None:
    """Replace any one node of a valid document by an arbitrary JSON value; load it as its format
    and by detection."""
    fmt = None if detect else FORMAT_OF.get(shape, shape)
    if shape == "beam":
        which = data.draw(st.sampled_from(["chat", "probes"]))
        chat, probes = BEAM_CHAT, BEAM_PROBES
        target = chat if which == "chat" else probes
        path = data.draw(st.sampled_from(list(_paths(target))))
        mutated = _replace(target, path, data.draw(JSON_VALUES))
        chat, probes = (mutated, probes) if which == "chat" else (chat, mutated)
        folder = tmp_path / "beam"
        folder.mkdir(exist_ok=True)
        (folder / "chat.json").write_text(json.dumps(chat))
        (folder / "probing_questions.json").write_text(json.dumps(probes))
        only_dataset_errors(folder, fmt)
        return
    name, document = SHAPES[shape]
    path = data.draw(st.sampled_from(list(_paths(document))))
    file = tmp_path / name
    file.write_text(json.dumps(_replace(document, path, data.draw(JSON_VALUES))))
    only_dataset_errors(file, fmt)


def test_a_dataset_file_named_in_bytes_that_are_not_utf8_is_refused_before_any_call(tmp_path) -> None:
    """Found by fuzzing: a dataset whose file name is Latin-1 (a lone surrogate once decoded) was
    replayed in full, then DuckDB refused to write the run's path; the app lists such files."""
    import os

    path = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9.jsonl"))
    path.write_bytes(VALID)
    conversation = load_conversation(path)
    with RunStore(tmp_path / "runs.duckdb") as store:
        with pytest.raises(ConfigurationError, match=r"the dataset's path '.*caf\\xe9.jsonl' is not UTF-8 text"):
            asyncio.run(replay(conversation, ReplayConfig(cache=False), store))
        with pytest.raises(ConfigurationError, match=r"the label 'half \\ud83d' is not UTF-8 text"):
            asyncio.run(replay(load_conversation(PROJECT_DATASETS / "tiny.jsonl"), ReplayConfig(cache=False), store,
                               label="half \ud83d"))  # (half an emoji: no byte of a file name)
        assert store.runs().empty  # refused before anything was recorded
        from workbench import experiments as ex

        with pytest.raises(ex.ExperimentError, match=r"the dataset's path '.*caf\\xe9.jsonl' is not UTF-8 text"):
            ex.create_experiment(store, dataset=path, grid=[ReplayConfig()], options=ex.ExperimentOptions())
        assert store.experiments().empty
        # A folder holding such a file: the experiment runs, and that conversation's run says why it failed
        # (its run could not be written: DuckDB refused the path, and the experiment failed with a traceback).
        experiment_id = ex.create_experiment(store, dataset=tmp_path, grid=[ReplayConfig(cache=False)],
                                             options=ex.ExperimentOptions(concurrency=1))
        asyncio.run(ex.run_experiment(store, experiment_id))
        [run] = store.experiment_runs(experiment_id).to_dict("records")
        assert run["status"] == "failed" and "caf\\xe9.jsonl' is not UTF-8 text" in run["error"]
