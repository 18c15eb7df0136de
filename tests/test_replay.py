"""Replay, the DuckDB run store, resume, retention scoring and litellm caching."""

from __future__ import annotations

import asyncio
import json

import pandas as pd
import pytest
from conftest import Scripted, held_by_another_process

from omem_core import Message
from workbench.catalog import DEMO_DATASET, PROJECT_DATASETS
from workbench.datasets import load_conversation
from workbench.replay import ConfigurationError, ReplayConfig, ReplayFailed, replay
from workbench.retention import content_words, newest_tokens, probe_score, summarise
from workbench.runstore import MIGRATIONS, RunStore, RunStoreLocked

TINY = PROJECT_DATASETS / "tiny.jsonl"
SMALL = dict(observation_threshold=40, reflection_threshold=60, last_messages=4)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OMEM_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def store(tmp_path):
    with RunStore(tmp_path / "runs.duckdb") as s:
        yield s


async def test_replay_records_every_step(store: RunStore) -> None:
    conv = load_conversation(TINY)
    result = await replay(conv, ReplayConfig(**SMALL, cache=False), store)
    run = store.run(result.run_id)
    assert run["status"] == "completed" and run["config"]["observation_threshold"] == 40
    assert run["config"]["observer_prompt"]["version"] == "v2" and len(run["config"]["observer_prompt"]["sha256"]) == 64
    steps = store.steps(result.run_id)
    assert list(steps.step) == list(range(6))  # one read before each of the 6 assistant messages
    assert list(steps.message_index) == [1, 3, 5, 7, 9, 11]
    assert (steps.context_tokens == steps.memory_tokens + steps.window_tokens).all()
    assert steps.history_tokens.is_monotonic_increasing
    records = store.records(result.run_id)
    calls = store.model_calls(result.run_id)
    assert len(records) == int(steps.observed.sum() + steps.reflected.sum()) == len(calls)
    assert set(calls.stage) == {"observe", "reflect"} and (calls.cost_usd == 0).all()
    assert (calls.attempts == 1).all() and not calls.trimmed.any()  # the offline reflector fits first time
    assert set(records.record_id) == set(calls.record_id)
    first = records.iloc[0]
    assert json.loads(first.source_ids)[0] == "t1" and first.tokens > 0
    assert result.observer_calls == int((calls.stage == "observe").sum())
    probes = store.probes(result.run_id)
    assert set(probes.method) == {"memory", "full_history", "window_only", "recent_tokens"}
    assert len(probes) == 3 * 4
    assert run["compression"] == pytest.approx(run["full_history_tokens"] / run["final_context_tokens"])
    messages = store.messages(result.run_id)
    assert len(messages) == 12 and messages.content[0].startswith("Sam: ")


async def test_recall_on_every_message(store: RunStore) -> None:
    result = await replay(load_conversation(TINY), ReplayConfig(**SMALL, recall_on="every", cache=False), store)
    assert len(store.steps(result.run_id)) == 12


async def test_steps_match_a_replay_without_recording() -> None:
    conv = load_conversation(DEMO_DATASET)
    config = ReplayConfig(observation_threshold=300, reflection_threshold=600, cache=False)
    with RunStore(":memory:") as store:
        recorded = await replay(conv, config, store)
        stored = store.steps(recorded.run_id)
    plain = await replay(conv, config, None)
    assert plain.run_id is None
    stored = stored.drop(columns="run_id").astype(object).where(stored.drop(columns="run_id").notna(), None)
    assert stored.to_dict("records") == plain.step_rows
    assert plain.summary()["retention"] == recorded.summary()["retention"]


async def test_model_error_marks_the_run_failed_and_resume_continues(store: RunStore, scripted: Scripted) -> None:
    conv = load_conversation(DEMO_DATASET)
    scripted.replies = ["- n1", "- n2", RuntimeError("provider down")]
    config = ReplayConfig(observer="scripted/model", reflector=None, observation_threshold=200, cache=False)
    with pytest.raises(ReplayFailed, match="provider down") as caught:
        await replay(conv, config, store)
    run_id = caught.value.result.run_id
    run = store.run(run_id)
    assert run["status"] == "failed" and "provider down" in run["error"]
    kept = store.steps(run_id)
    assert len(kept) > 0 and len(store.records(run_id)) == 2  # no partial record
    calls = store.model_calls(run_id)
    assert calls.error.notna().sum() == 1 and calls.record_id.isna().sum() == 1

    resumed = await replay(conv, config, store, resume=run_id)
    assert resumed.status == "completed" and store.run(run_id)["status"] == "completed"
    steps = store.steps(run_id)
    assert list(steps.step) == list(range(len(steps)))  # no gap, no duplicate
    assert len(steps) == 100
    records = store.records(run_id)
    assert records.record_id.is_unique
    # Compared with an uninterrupted run: the same records, byte for byte.
    with RunStore(":memory:") as fresh:
        scripted.replies = ["- n1", "- n2"]
        clean = await replay(conv, config, fresh)
        assert list(fresh.records(clean.run_id).text) == list(records.text)
        assert list(fresh.records(clean.run_id).source_ids) == list(records.source_ids)


async def test_a_resumed_runs_elapsed_time_counts_its_time_before_the_resume(store: RunStore,
                                                                             scripted: Scripted) -> None:
    """A resumed run's elapsed time was its last part's alone (its other figures are the whole
    run's), and a run that stopped recorded none: the time before a resume, or before a killed
    process's last batch of steps, is kept."""
    conv = load_conversation(DEMO_DATASET)
    scripted.replies = ["- n1", RuntimeError("provider down")]
    config = ReplayConfig(observer="scripted/model", reflector=None, observation_threshold=200, cache=False)
    with pytest.raises(ReplayFailed) as caught:
        await replay(conv, config, store)
    run_id = caught.value.result.run_id
    assert store.run(run_id)["elapsed_s"] > 0  # (it was NULL: "–" in the app)
    with store.session() as cur:  # a first part of 1,000 s, as a long replay's would be
        cur.execute("UPDATE runs SET elapsed_s = 1000 WHERE run_id = ?", [run_id])
    scripted.replies = ["- n2"]
    resumed = await replay(conv, config, store, resume=run_id)
    assert resumed.status == "completed" and 1000 < resumed.elapsed_s < 1100
    assert store.run(run_id)["elapsed_s"] == pytest.approx(resumed.elapsed_s)
    assert resumed.summary()["elapsed_s"] == round(resumed.elapsed_s, 3)


async def test_a_replay_with_a_model_without_its_key_is_recorded_as_failed(tmp_path, monkeypatch) -> None:
    """Refused before any call (the CLI, an API caller), and recorded failed, never left running."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with RunStore(tmp_path / "r.duckdb") as runs_store:
        with pytest.raises(ConfigurationError, match="gpt-4o-mini: missing OPENAI_API_KEY"):
            await replay(load_conversation(DEMO_DATASET), ReplayConfig(observer="gpt-4o-mini"), runs_store)
        [row] = runs_store.runs().itertuples()
        assert row.status == "failed" and row.steps == 0 and "OPENAI_API_KEY" in row.error


async def test_repeated_configuration_is_served_from_litellm_cache(store: RunStore, scripted: Scripted) -> None:
    conv = load_conversation(TINY)
    config = ReplayConfig(observer="scripted/model", reflector=None, **SMALL)
    first = await replay(conv, config, store)
    calls_made = len(scripted.calls)
    assert calls_made == first.observer_calls > 0 and first.cache_hits == 0
    second = await replay(conv, config, store)
    assert len(scripted.calls) == calls_made  # no new model call
    assert second.cache_hits == second.observer_calls == first.observer_calls
    assert store.run(second.run_id)["cache_hits"] == second.cache_hits


def test_schema_is_versioned_and_migrations_are_idempotent(tmp_path) -> None:
    path = tmp_path / "r.duckdb"
    with RunStore(path) as s:
        assert s.schema_version() == len(MIGRATIONS)
    with RunStore(path) as s:  # reopening runs no migration twice
        assert s.schema_version() == len(MIGRATIONS)
        assert s.runs().empty


def test_a_version_1_store_is_upgraded_and_keeps_its_rows(tmp_path) -> None:
    import duckdb

    path = tmp_path / "v1.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE omem_schema (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMPTZ)")
    con.execute(MIGRATIONS[0][2])
    con.execute("INSERT INTO omem_schema VALUES (1, 'initial', now())")
    con.execute("INSERT INTO model_calls (run_id, seq, stage, model) VALUES ('old', 0, 'reflect', 'm')")
    con.execute("INSERT INTO runs (run_id, created_at, updated_at, dataset, conversation_id, config, status, "
                "messages) VALUES ('old', now(), now(), 'd', 'c', '{}', 'running', 3)")
    con.execute("INSERT INTO runs (run_id, created_at, updated_at, dataset, conversation_id, config, status, "
                "messages, retention) VALUES ('scored', now(), now(), 'd', 'c', '{}', 'completed', 3, 0.5)")
    con.execute("INSERT INTO runs (run_id, created_at, updated_at, dataset, conversation_id, config, status, "
                "messages) VALUES ('no probes', now(), now(), 'd', 'c', '{}', 'completed', 3)")
    con.close()
    with RunStore(path) as s:
        assert s.schema_version() == len(MIGRATIONS) == 7
        # a run scored before the rule was recorded was scored with rule 1; one not scored has none
        assert s.run("scored")["scoring"] == 1 and pd.isna(s.run("old")["scoring"])
        assert pd.isna(s.run("no probes")["scoring"])  # completed with nothing to score: no rule
        [row] = s.model_calls("old").to_dict("records")
        assert row["stage"] == "reflect" and row["attempts"] == 1 and row["trimmed"] == False  # noqa: E712
        run = s.run("old")  # an old 'running' row names no owner: nothing says it died, so it stays
        assert run["status"] == "running" and run["owner_pid"] is None


def test_a_file_held_by_another_process_gets_a_clear_message(tmp_path) -> None:
    path = tmp_path / "held.duckdb"
    RunStore(path).close()
    waits = []
    with held_by_another_process(path), pytest.raises(RunStoreLocked, match="is open in another process"):
        RunStore(path, wait_s=0.5, on_wait=waits.append)
    assert len(waits) == 1 and "waiting for" in waits[0]  # said once, while it waited


def test_export_parquet(store: RunStore, tmp_path) -> None:
    import pandas as pd

    result = asyncio.run(replay(load_conversation(TINY), ReplayConfig(**SMALL, cache=False), store))
    written = store.export_parquet(result.run_id, tmp_path / "out")
    assert {p.name for p in written} >= {"runs.parquet", "steps.parquet", "records.parquet"}
    assert len(pd.read_parquet(tmp_path / "out" / "steps.parquet")) == 6


def test_retention_reads_words_of_every_script() -> None:
    """The scorer read only a-z and 0-9: a gold answer in Cyrillic or Chinese was left unscored,
    "Zürich" became {"z", "rich"} and was "retained" by "The rich man from Zagreb, z"."""
    assert content_words("Zürich, São Paulo, naïve café") == {"zürich", "são", "paulo", "naïve", "café"}
    assert probe_score("Миша", content_words("Мой кот Миша")) == 1.0
    assert probe_score("Zürich", content_words("The rich man from Zagreb, z")) == 0.0
    assert probe_score("ｃａｆé", content_words("café")) == 1.0  # NFKC: full-width and composed forms
    assert probe_score("STRASSE", content_words("Straße")) == 1.0  # case folding, not lower()
    assert probe_score("Istanbul", content_words("İstanbul")) == 1.0
    assert content_words("I don’t like snake_case") == {"like", "snake", "case"}  # (t and don: stop words)
    # a word keeps its combining marks (they split Devanagari, Hebrew and Arabic words into letters)
    assert content_words("हिन्दी भाषा") == {"हिन्दी", "भाषा"} and content_words("שָׁלוֹם") == {"שָׁלוֹם"}
    assert probe_score("हिन्दी", content_words("नदी किनारे")) == 0.0
    # no segmenter: a Han character is a word, a katakana run one word, hiragana is not read
    assert probe_score("東京", content_words("我住在東京")) == 1.0
    assert content_words("コーヒー・ショップに行った") == {"コーヒー", "ショップ", "行"}
    assert probe_score("スミス", content_words("ミスをした")) == 0.0
    assert probe_score("すし", content_words("しかし、すみません")) is None  # unscored, not matched on kana


def test_retention_scoring_rules() -> None:
    assert content_words("The 7 May, 2023 trip to Boston!") == {"7", "may", "2023", "trip", "boston"}
    assert probe_score("Boston University", {"boston"}) == 0.5
    assert probe_score(None, {"x"}) is None and probe_score("the of", {"x"}) is None
    from datetime import datetime, timezone

    history = [Message(id=str(i), thread_id="t", role="user", content="x" * 40,
                       created_at=datetime(2024, 1, 1, tzinfo=timezone.utc)) for i in range(10)]
    assert [m.id for m in newest_tokens(history, 25, lambda ts: [10] * len(ts))] == ["8", "9"]
    rows = [
        {"probe_id": "a", "method": m, "category": "x", "score": s}
        for m, s in (("memory", 1.0), ("full_history", 1.0), ("window_only", 0.0), ("recent_tokens", 0.5))
    ] + [{"probe_id": "b", "method": "memory", "category": "y", "score": 0.0}]  # incomplete: ignored
    summary = summarise(rows)
    assert summary.retention == 1.0 and summary.recent_tokens == 0.5 and summary.scored == 1
    assert summary.relative == 1.0 and list(summary.per_category) == ["x"]


def test_invalid_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="observation_threshold"):
        ReplayConfig(observation_threshold=0)
    with pytest.raises(ValueError, match="token_counter"):
        ReplayConfig(token_counter="words")


def test_replays_every_shared_dataset(shared_datasets, tmp_path) -> None:
    from workbench.catalog import known_datasets
    from workbench.datasets import load_dataset

    entries = [e for e in known_datasets() if e.origin == "shared"]
    assert {e.format for e in entries} == {"locomo", "beam", "memorybank"}
    with RunStore(tmp_path / "all.duckdb") as store:
        for entry in entries:
            conv = load_dataset(entry.path, entry.format)[0]
            result = asyncio.run(replay(conv, ReplayConfig(cache=False), store))
            assert result.status == "completed" and result.steps > 0
            if any(p.gold for p in conv.probes):
                assert result.retention is not None and result.retention.scored > 0
        assert len(store.runs()) == len(entries)


def test_findings_flag_an_observer_that_falls_behind_and_tightened_reflections() -> None:
    import pandas as pd

    from workbench.analysis import findings

    def steps(backlog: list[int]) -> pd.DataFrame:
        return pd.DataFrame({"step": range(len(backlog)), "backlog_tokens": backlog,
                             "history_tokens": [1500 * (i + 1) for i in range(len(backlog))]})

    [note] = findings(steps([0, 800, 1500, 2600, 3900, 5200]), 1000)
    assert "falling behind" in note and "5,200 tokens" in note and "1,500 tokens per read" in note
    assert "set a backlog ceiling (--max-backlog" in note  # the remedy made for exactly this
    [note] = findings(steps([0, 800, 1500, 2600, 3900, 5200]), 1000, max_backlog=4000)
    assert "lower the backlog ceiling (4,000 tokens in this run" in note and "set a backlog" not in note
    assert "read memory more often" in note
    [note] = findings(steps([0, 800, 1500, 2600, 3900, 5200]), 1000, recall_on="every")
    assert "read memory more often" not in note  # it already read before every message
    assert "Raise the observation threshold well above that (segments are whole messages), or set a backlog" in note
    assert findings(steps([0, 900, 400, 950, 300, 700]), 1000) == []  # keeps up: nothing to say
    assert findings(steps([0, 9000, 6000, 5000, 4000, 3500]), 1000) == []  # catching up

    calls = pd.DataFrame({"stage": ["observe", "reflect", "reflect", "reflect"], "attempts": [1, 1, 2, 3],
                          "trimmed": [False, False, False, True]})
    [note] = findings(steps([0, 0, 0, 0]), 1000, calls)
    assert note.startswith("2 of 3 reflections came back over the reflection threshold and were sent back")
    assert "1 still did not fit and was trimmed to it without a model (its least" in note
    one = pd.DataFrame({"stage": ["reflect"], "attempts": [2], "trimmed": [False]})
    assert findings(steps([0, 0, 0, 0]), 1000, one) == [  # "1 of 1 reflections … 0 still did not fit and were"
        "1 of 1 reflection came back over the reflection threshold and was sent back to be shortened; it then fit."]

    # a reflection threshold below one observer pass's output: memory squeezed below a single note
    writes = pd.DataFrame({"stage": ["observe", "observe", "observe"], "output_tokens": [120, 140, 160]})
    [note] = findings(steps([0, 0, 0, 0]), 500, writes, reflection_threshold=10)
    assert note.startswith("The reflection threshold (10 tokens) is below what one observer pass writes (about 140")
    assert findings(steps([0, 0, 0, 0]), 500, writes, reflection_threshold=600) == []
    assert findings(steps([0, 0, 0, 0]), 500, writes) == []  # no reflector: nothing to say


def test_a_replay_in_which_nothing_was_observed_says_so_beside_its_figures(tmp_path) -> None:
    """A conversation below the observation threshold: the explorer showed "Model calls 0",
    "Compression 4.0x" and "Retention 1.000" without a word that the memory never ran (the 4x is
    only the messages left out of the window)."""
    from workbench.analysis import findings

    conversation = load_conversation(DEMO_DATASET)
    with RunStore(tmp_path / "r.duckdb") as store:
        quiet = asyncio.run(replay(conversation, ReplayConfig(observation_threshold=16_000, cache=False), store))
        busy = asyncio.run(replay(conversation, ReplayConfig(observation_threshold=300, reflection_threshold=600,
                                                             cache=False), store))
        [note] = findings(store.steps(quiet.run_id), 16_000, store.model_calls(quiet.run_id))
        assert quiet.compression > 1 and note.startswith("Nothing was observed: the backlog (messages older than ")
        assert "never reached the observation threshold (16,000 tokens), so no model ran" in note
        assert not any(n.startswith("Nothing was observed") for n in findings(store.steps(busy.run_id), 300))
        # not of a run still going or failed (its first call may be what failed), nor beside an observer call
        steps = store.steps(quiet.run_id)
        assert not any(n.startswith("Nothing was observed") for n in findings(steps, 16_000, complete=False))
        import pandas as pd

        failed_call = pd.DataFrame({"stage": ["observe"], "attempts": [1], "trimmed": [False]})
        assert not any(n.startswith("Nothing was observed") for n in findings(steps, 16_000, failed_call))


def test_figures_are_displayed_as_people_read_them() -> None:
    import numpy as np

    from workbench.analysis import display

    assert display(5.336322869955157) == "5.336" and display(np.float64(0.7613636)) == "0.761"
    assert display(3570) == display(np.int64(3570)) == display(3570.0) == "3,570"
    assert display(0.000123) == "0.00012" and display(None) == display(float("nan")) == "–"
    assert display("v2") == "v2" and display(np.bool_(True)) == "True"


def test_the_explorer_shows_the_window_recall_returned(tmp_path) -> None:
    """Steps record what the agent saw; the explorer shows exactly recall's answer, even when a
    message's timestamp puts it earlier in the thread than its place in the file."""
    import json

    from omem_core import Memory, create_observational_memory_store
    from workbench.analysis import visible_at

    hours = [1, 2, 3, 4, 5, 6, 3, 8]  # message 6 is dated between messages 2 and 3
    path = tmp_path / "shuffled.jsonl"
    path.write_text("".join(json.dumps({"conversation_id": "c", "id": f"m{i}", "role": ("user", "assistant")[i % 2],
                                        "content": f"message {i}", "timestamp": f"2024-01-01T0{h}:30:00+00:00"}) + "\n"
                            for i, h in enumerate(hours)))
    conversation = load_conversation(path)
    config = ReplayConfig(observation_threshold=1000, reflection_threshold=2000, last_messages=3, cache=False)
    with RunStore(tmp_path / "r.duckdb") as store:
        result = asyncio.run(replay(conversation, config, store))
        steps, records, messages = store.steps(result.run_id), store.records(result.run_id), store.messages(result.run_id)
    last = steps.iloc[-1]  # the read before m7
    _, window = visible_at(last, records, messages, config.last_messages)

    async def agent_view():  # the same conversation, read as the agent did before m7
        agent = Memory(create_observational_memory_store(observer=config.observer), last_messages=3)
        await agent.save_messages([t.to_message("c") for t in conversation.turns[:7]])
        return await agent.recall("c")

    seen = [m.id for m in asyncio.run(agent_view())]
    assert seen == ["m3", "m4", "m5"]  # recall orders by time: m6 is dated among the older messages
    assert list(window.message_id) == seen  # not the file's last three, m4, m5, m6


def test_a_run_written_whole_is_all_or_nothing(tmp_path) -> None:
    """An experiment's run goes into the store in one transaction: a bad part leaves no trace."""
    from datetime import datetime, timezone

    with RunStore(tmp_path / "r.duckdb") as store:
        payload = {"run": {"dataset": "d", "dataset_format": "omem", "conversation_id": "c", "config": {},
                           "status": "completed", "steps": 1},
                   "records": [{"step": 0}]}  # no record: fails after the run and its messages went in
        messages = [{"idx": 0, "message_id": "m0", "role": "user", "speaker": None, "content": "hi",
                     "created_at": datetime(2024, 1, 1, tzinfo=timezone.utc), "tokens": 1}]
        with pytest.raises(KeyError):
            store.write_run(payload, messages=messages)
        assert store.runs().empty and store._df("SELECT * FROM messages").empty
        payload["records"] = []
        run_id = store.write_run(payload, messages=messages)
        assert list(store.runs().run_id) == [run_id] and len(store.messages(run_id)) == 1


def test_a_probe_is_scored_once_its_evidence_has_left_the_window_and_clock_times_are_not_answers() -> None:
    """SPEC §3: retention is whether the gold answer is visible "once its evidence has left the
    window". A probe whose evidence is all in the final window is scored by no method; a clock time
    in a message's timestamp ("13:05") is no answer to "13"."""
    from datetime import datetime, timedelta, timezone

    from workbench.datasets import Conversation, Probe, Turn
    from workbench.retention import score_retention

    start = datetime(2024, 5, 8, 13, 5, tzinfo=timezone.utc)
    turns = [Turn(f"m{i}", "user" if i % 2 == 0 else "assistant", text, start + timedelta(minutes=i))
             for i, text in enumerate(["My dog is called Biscuit.", "Nice name!", "I moved to Porto.", "Lovely.",
                                       "I have 2 cats.", "Fun."])]
    probes = [Probe("old", "What is the dog called?", "Biscuit", "single", ("m0",)),
              Probe("recent", "How many cats?", "2", "single", ("m4",)),
              Probe("clock", "Which floor?", "13", "single", ("m2",))]
    conversation = Conversation("c", turns, probes)
    history = [t.to_message("c") for t in turns]
    window = history[-2:]  # m4, m5: "recent" is still in view
    summary = score_retention(conversation, window, window, 100, lambda texts: [len(t) // 4 for t in texts])
    assert (summary.scored, summary.in_window) == (2, 1)
    assert summary.full_history == 0.5  # "Biscuit" 1, "13" 0: the 13:05 timestamps do not answer it
    assert summary.retention == 0.0  # only the window is visible: neither answer is


def test_a_date_counts_only_beside_a_distinctive_word_of_its_question() -> None:
    """Rule 1 credited a date's words wherever a date was written: "How many siblings? 2" scored 1.0
    on any conversation with a message dated the 2nd, and window-only scores doubled on LoCoMo. Under
    rule 2 a line's date counts for a question it shares a distinctive word with (not a speaker's
    name, said in most lines); a date written into a line, or in a note under its date heading,
    counts as before."""
    from datetime import datetime, timedelta, timezone

    from omem_core import Message
    from workbench.datasets import Conversation, Probe, Turn
    from workbench.retention import SCORING, Scorer, Visible, score_retention

    start = datetime(2024, 5, 2, 9, 0, tzinfo=timezone.utc)
    texts = ["Ana: I went to a support group today.", "Bo: How was it?", "Ana: Good. I also baked bread.",
             "Bo: Nice.", "Ana: My cat is called Miso.", "Bo: Cute.", "Ana: I read a lot.", "Bo: Me too.",
             "Ana: Bye for now.", "Bo: Bye."]
    turns = [Turn(f"m{i}", "user" if i % 2 == 0 else "assistant", text, start + timedelta(minutes=i))
             for i, text in enumerate(texts)]
    siblings = Probe("siblings", "How many siblings does Ana have?", "2", "single", ("m4",))  # never said
    group = Probe("group", "When did Ana go to the support group?", "2 May 2024", "temporal", ("m0",))
    conversation = Conversation("c", turns, [siblings, group])
    history = [t.to_message("c") for t in turns]
    assert SCORING == 2
    old, new = Scorer(conversation, 1), Scorer(conversation)
    full = Visible(history)
    assert old.score(siblings, full) == 1.0 and new.score(siblings, full) == 0.0  # "ana" is in half the lines
    assert old.score(group, full) == new.score(group, full) == 1.0  # the support group's own line is dated
    # the memory's notes: a line is dated by the heading above it, however the heading is written
    for heading in ("2 May 2024", "## Thursday, 2 May 2024", "**May 2nd, 2024**", "Date: 2024-05-02",
                    "1:56 pm on 2 May, 2024", "Session 3 (2 May 2024)", "- 2 May 2024"):
        notes = Message(id="n", thread_id="c", role="system", created_at=start,
                        content=f"{heading}\n- Ana went to a support group.")
        assert new.score(group, Visible([notes])) == 1.0, heading
        assert new.score(siblings, Visible([notes])) == 0.0
    # a weekday or a number alone is a note, not a heading: it is text, and dates nothing below it
    notes = Message(id="n", thread_id="c", role="system", created_at=start,
                    content="2 May 2024\n- Ana: swims on:\n- Monday\n- 2nd\n- Ana went to a support group.")
    assert new.score(Probe("d", "Which day does Ana swim?", "Monday", "single"), Visible([notes])) == 1.0
    assert new.score(group, Visible([notes])) == 1.0
    # a date stamping a note line is its date, not text for every question
    for line in ("- 2 May 2024: Ana read a book.", "- (2 May 2024) Ana: read a book", "- [Thursday, 2 May 2024] Ana read",
                 "- [2 May 2024 10:00] Ana read"):
        notes = Message(id="n", thread_id="c", role="system", created_at=start, content=line)
        assert old.score(siblings, Visible([notes])) == 1.0 and new.score(siblings, Visible([notes])) == 0.0, line
    # in a short conversation a word said once is distinctive (under 10 messages none was)
    short = Conversation("c", turns[:5], [group])
    assert Scorer(short).score(group, Visible([t.to_message("c") for t in turns[:5]])) == 1.0
    # a note line of a number alone is not a heading; a date written into a line always counts
    notes = Message(id="n", thread_id="c", role="system", created_at=start,
                    content="2 May 2024\n- 42\n- Ana: siblings: 2")
    assert new.score(siblings, Visible([notes])) == 1.0
    assert new.score(Probe("x", "What number?", "42", "single"), Visible([notes])) == 1.0
    # the whole run: a window of two messages dated 2 May no longer answers "2"
    window = history[-2:]
    assert score_retention(conversation, window, window, 100, lambda t: [1] * len(t), rule=1).window_only == 1.0
    assert score_retention(conversation, window, window, 100, lambda t: [1] * len(t)).window_only == 0.0


def test_resuming_a_run_on_a_conversation_that_changed_is_refused(tmp_path) -> None:
    """``replay(resume=…)`` (the app's Resume) went on with whatever the file held now."""
    from workbench.errors import ConfigurationError

    data = tmp_path / "tiny.jsonl"
    data.write_text(TINY.read_text(encoding="utf-8"), encoding="utf-8")
    with RunStore(tmp_path / "x.duckdb") as store:
        done = asyncio.run(replay(load_conversation(data), ReplayConfig(**SMALL), store))
        steps = len(store.steps(done.run_id))
        data.write_text(TINY.read_text(encoding="utf-8").replace("2024-01-10T09:02:00Z", "2024-01-10T09:02:30Z"),
                        encoding="utf-8")
        with pytest.raises(ConfigurationError, match=r"its message 3 \('t3'\) has another date than the run recorded"):
            asyncio.run(replay(load_conversation(data), ReplayConfig(**SMALL), store, resume=done.run_id))
        assert len(store.steps(done.run_id)) == steps and store.run(done.run_id)["status"] == "completed"
