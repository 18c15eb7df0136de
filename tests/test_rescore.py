"""Re-scoring recorded runs under the current retention rule, from the run store alone.

A run replayed under rule 1 and re-scored must read exactly as the same replay scored under the
current rule (probe rows, loss rows, figures); a run whose final context cannot be rebuilt is left
as it was; an experiment is re-scored whole or not at all."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from workbench import experiments as ex
from workbench.cli import cli
from workbench.datasets import load_conversation
from workbench.replay import ReplayConfig, replay
from workbench.rescore import RescoreError, rescore_experiment, rescore_run
from workbench.retention import SCORING
from workbench.runstore import RunStore

DEMO = Path(__file__).resolve().parents[1] / "datasets" / "demo.jsonl"
CONFIG = ReplayConfig(observation_threshold=150, reflection_threshold=300, cache=False)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OMEM_CACHE_DIR", str(tmp_path / "cache"))


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def rows(frame, drop=("run_id",)):
    return frame.drop(columns=list(drop)).sort_values(list(frame.columns[1:3])).reset_index(drop=True)


def test_a_run_rescored_reads_as_the_same_replay_scored_under_the_current_rule(tmp_path) -> None:
    """The point of re-scoring: an old (paid) run need not be replayed to be compared with new
    ones. Probe rows, loss rows and figures come out exactly as a replay under the current rule."""
    conversation = load_conversation(DEMO)
    with RunStore(tmp_path / "x.duckdb") as store:
        old = asyncio.run(replay(conversation, CONFIG, store, scoring=1)).run_id
        new = asyncio.run(replay(conversation, CONFIG, store)).run_id
        before = store.run(old)
        assert before["scoring"] == 1 and before["retention_window_only"] > store.run(new)["retention_window_only"]
        rescored = rescore_run(store, old)
        assert store.run(old)["scoring"] == 1  # computed, not written yet
        store.write_rescored([rescored])
        after, fresh = store.run(old), store.run(new)
        assert after["scoring"] == fresh["scoring"] == SCORING
        for key in ("retention", "retention_full_history", "retention_window_only", "retention_recent"):
            assert after[key] == pytest.approx(fresh[key], abs=1e-12), key
        assert rows(store.probes(old)).equals(rows(store.probes(new)))
        assert rows(store.losses(old)).equals(rows(store.losses(new)))
        assert "retention 0.7" in rescored.describe() and "was rule 1" in rescored.describe()
    code, out, _ = invoke("rescore", "--all", "--db", str(tmp_path / "x.duckdb"))
    assert code == 0 and "nothing to re-score" in out


def test_a_run_whose_final_context_cannot_be_rebuilt_is_left_as_it_was(tmp_path) -> None:
    """Re-scoring trusts the store only when scoring it again under its own rule gives back every
    recorded score: a record edited since (or a context the store cannot rebuild) leaves the run
    untouched, with the reason."""
    import duckdb

    db = tmp_path / "x.duckdb"
    with RunStore(db) as store:
        run_id = asyncio.run(replay(load_conversation(DEMO), CONFIG, store, scoring=1)).run_id
        probes = rows(store.probes(run_id))
    con = duckdb.connect(str(db))  # the memory's notes emptied behind the store's back
    con.execute("UPDATE records SET text = '- nothing' WHERE run_id = ?", [run_id])
    con.close()
    with RunStore(db) as store:
        with pytest.raises(RescoreError, match=r"could not be rebuilt exactly.*probe score\(s\) differ"):
            rescore_run(store, run_id)
    code, _, err = invoke("rescore", run_id, "--db", str(db))
    assert code == 1 and "could not be rebuilt exactly" in err and "not re-scored" in err
    with RunStore(db) as store:
        assert store.run(run_id)["scoring"] == 1 and rows(store.probes(run_id)).equals(probes)


def test_an_experiment_is_rescored_whole_and_scores_its_later_runs_under_the_rule(tmp_path) -> None:
    """An experiment recorded under rule 1 is re-scored in one write, all its completed runs and
    the rule it scores a resume's runs under; if one run cannot be, none is. One of its runs alone
    is refused (it would pool two rules)."""
    import duckdb

    db = tmp_path / "x.duckdb"
    grid = [CONFIG, dataclasses.replace(CONFIG, observation_threshold=300, reflection_threshold=600)]
    with RunStore(db) as store:
        options = dataclasses.asdict(ex.ExperimentOptions(concurrency=1))
        del options["scoring"]  # as recorded before there were rules
        old = store.create_experiment(name=None, dataset=str(DEMO), dataset_format=None,
                                      conversations=[c.id for c in ex.list_conversations(DEMO)],
                                      configs=[{"label": ex.labels([c.to_json() for c in grid])[i], "config": c.to_json()}
                                               for i, c in enumerate(grid)], options=options)
        new = ex.create_experiment(store, dataset=DEMO, grid=grid, options=ex.ExperimentOptions(concurrency=1))
        for experiment_id in (old, new):
            assert asyncio.run(ex.run_experiment(store, experiment_id)).status == "completed"
        old_runs = store.experiment_runs(old)
        assert set(old_runs.scoring) == {1}
        with pytest.raises(RescoreError, match=f"belongs to experiment {old}.*rescore --experiment {old}"):
            from workbench.rescore import rescore_runs

            rescore_runs(store, [old_runs.run_id.iloc[0]])
    broken = old_runs.run_id.iloc[1]
    con = duckdb.connect(str(db))
    content = con.execute("SELECT content FROM messages WHERE run_id = ? ORDER BY idx DESC LIMIT 1", [broken]).fetchall()
    con.execute("UPDATE messages SET content = 'changed' WHERE run_id = ? AND content = ?", [broken, content[0][0]])
    con.close()
    code, out, err = invoke("rescore", "--experiment", old, "--db", str(db))
    assert code == 1 and f"experiment {old} was not re-scored" in err
    with RunStore(db) as store:  # nothing written: not even the runs that could be
        assert set(store.experiment_runs(old).scoring) == {1}
        assert ex.report(store, old)["scoring"] == 1
    con = duckdb.connect(str(db))
    con.execute("UPDATE messages SET content = ? WHERE run_id = ? AND content = 'changed'", [content[0][0], broken])
    con.close()
    code, out, err = invoke("rescore", "--all", "--db", str(db))
    assert code == 0, err
    assert f"experiment {old}: 2 completed runs re-scored under rule {SCORING}" in out
    with RunStore(db) as store:
        assert set(store.experiment_runs(old).scoring) == {SCORING}
        assert json.loads(json.dumps(store.experiment(old)["options"]))["scoring"] == SCORING
        a, b = ex.summarise(store, old), ex.summarise(store, new)
        assert [s.retention for s in a] == pytest.approx([s.retention for s in b], abs=1e-12)
        assert rescore_experiment(store, old) == []  # already under the rule: nothing to do
    code, out, _ = invoke("experiment", "show", old, "--db", str(db))
    assert code == 0 and "scored under rule 1" not in out


def old_experiment(db: Path) -> str:
    """An experiment on the demo recorded as before there were rules: its runs scored under rule 1."""
    grid = [CONFIG, dataclasses.replace(CONFIG, observation_threshold=300, reflection_threshold=600)]
    options = dataclasses.asdict(ex.ExperimentOptions(concurrency=1))
    del options["scoring"]
    with RunStore(db) as store:
        experiment_id = store.create_experiment(
            name="before the rule", dataset=str(DEMO), dataset_format=None,
            conversations=[c.id for c in ex.list_conversations(DEMO)],
            configs=[{"label": ex.labels([c.to_json() for c in grid])[i], "config": c.to_json()}
                     for i, c in enumerate(grid)], options=options)
        assert asyncio.run(ex.run_experiment(store, experiment_id)).status == "completed"
    return experiment_id


def test_the_app_says_which_figures_are_under_an_earlier_rule_and_rescores_them(db: Path) -> None:
    """The Experiments page says so before any figure, and its button re-scores the experiment
    (then says nothing more); Compare's pair of configurations and the list say so too."""
    from apptest import PAGES, action, app

    from workbench.export_html import experiment_html, run_html

    experiment_id = old_experiment(db)
    with RunStore(db) as store:  # the exports for stakeholders say it too
        assert "scored under rule 1" in experiment_html(store, experiment_id)
        assert "scored under rule 1" in run_html(store, store.experiment_runs(experiment_id).run_id.iloc[0])
    at = app("experiments")
    warnings = [w.value for w in at.warning]
    assert any("scored under rule 1" in w.replace("\\", "") for w in warnings), warnings
    assert any(experiment_id in c.value.replace("\\", "") for c in at.caption)  # the list's note
    at.switch_page(PAGES.format("runs")).run()
    assert not at.exception and any("2 runs scored under an earlier retention rule" in c.value.replace("\\", "")
                                    for c in at.caption)
    for page in ("compare", "tune"):
        at.switch_page(PAGES.format(page)).run()
        assert not at.exception and any("scored under rule 1" in w.value.replace("\\", "") for w in at.warning), page
    at.switch_page(PAGES.format("experiments")).run()
    action(at, "xp_rescore").click().run()
    assert not at.exception, at.exception
    assert [s.value for s in at.success] == ["2 completed runs re-scored under rule 2: the figures below are under it."]
    assert not any("scored under rule" in w.value.replace("\\", "") for w in at.warning)
    with RunStore(db) as store:
        assert set(store.experiment_runs(experiment_id).scoring) == {SCORING}


def shifted_demo(tmp_path: Path) -> Path:
    """The demo written at +09:00 (its mornings are the evening before in UTC, so a message's day
    depends on the offset), with a message and a probe whose answer is that message's day, and a
    system message of the conversation's own in the final window holding another probe's answer."""
    lines = DEMO.read_text(encoding="utf-8").replace('Z"', '+09:00"').splitlines()
    messages = [json.loads(line) for line in lines if json.loads(line)["type"] == "message"]
    first, last = messages[0], messages[-1]
    conversation = first["conversation_id"]
    at = next(i for i, m in enumerate(messages) if m["id"] == "s4-1")  # 27 February, 07:45 (26th in UTC)
    lines.insert(at + 1, json.dumps({"type": "message", "conversation_id": conversation, "id": "kitten",
                                     "role": "user", "content": "I adopted a kitten called Zorba.",
                                     "timestamp": messages[at]["timestamp"].replace("07:45", "07:46")}))
    lines.insert(len(messages) + 1, json.dumps({
        "type": "message", "conversation_id": conversation, "id": "sys-1", "role": "system",
        "content": "Reminder for the assistant: Priya's locker code is 4471.",
        "timestamp": last["timestamp"].replace("07:14", "07:20")}))
    lines.append(json.dumps({"type": "probe", "conversation_id": conversation, "id": "day",
                             "question": "When did Priya adopt Zorba?", "answer": "27 February 2024",
                             "evidence": ["kitten"], "category": "temporal"}))
    lines.append(json.dumps({"type": "probe", "conversation_id": conversation, "id": "code",
                             "question": "What is Priya's locker code?", "answer": "4471",
                             "evidence": [first["id"]], "category": "single-hop"}))
    lines.append(json.dumps({"type": "probe", "conversation_id": conversation, "id": "asked",
                             "question": "When did Priya ask what her flat costs from July?", "answer": "3 June 2024",
                             "evidence": [first["id"]], "category": "temporal"}))  # (a window message's day)
    path = tmp_path / "shifted.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_rescored_run_dates_messages_as_written_and_keeps_the_conversations_system_messages(tmp_path) -> None:
    """The store keeps instants: a message written at 08:30+09:00 is the evening before in UTC, and
    re-scoring dated it so (a date answer rebuilt wrong, or the run refused); the conversation's own
    system message in the window was taken for the memory and dropped (the run refused). A run
    recorded before offsets were kept takes them from its dataset when it still reads the same."""
    import duckdb

    data = shifted_demo(tmp_path)
    conversation = load_conversation(data)
    db = tmp_path / "x.duckdb"
    with RunStore(db) as store:
        fresh = asyncio.run(replay(conversation, CONFIG, store)).run_id
        runs = [asyncio.run(replay(conversation, CONFIG, store, scoring=1)).run_id for _ in range(2)]
    con = duckdb.connect(str(db))  # the second one as recorded before offsets were kept
    con.execute("UPDATE messages SET utc_offset_s = NULL WHERE run_id = ?", [runs[1]])
    con.close()
    with RunStore(db) as store:
        for run_id in runs:
            store.write_rescored([rescore_run(store, run_id)])
            assert rows(store.probes(run_id)).equals(rows(store.probes(fresh))), run_id
            assert rows(store.losses(run_id)).equals(rows(store.losses(fresh))), run_id
        scores = store.probes(fresh).set_index(["probe_id", "method"]).score
        assert scores["day", "full_history"] == 1.0  # "27 February 2024", the day it was written (the 26th in UTC)
        assert scores["code", "window_only"] == 1.0  # (said by the system message in the window)
        assert scores["asked", "window_only"] == 1.0  # the window's messages dated as written too


def test_a_run_that_never_read_its_memory_is_rescored(tmp_path) -> None:
    """A conversation of user messages alone completes with no memory read (no step): re-scoring
    it failed with an IndexError traceback (and `rescore --all` stopped at it)."""
    lines = [json.dumps({"type": "message", "conversation_id": "notes", "id": f"m{i}", "role": "user",
                         "content": text, "timestamp": f"2024-05-0{i + 1}T09:00:00Z"})
             for i, text in enumerate(["My dog is Rex.", "I live in Porto.", "I play the oboe.", "I like figs."])]
    lines.append(json.dumps({"type": "probe", "conversation_id": "notes", "id": "p", "question": "Dog's name?",
                             "answer": "Rex", "evidence": ["m0"]}))
    data = tmp_path / "notes.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = dataclasses.replace(CONFIG, last_messages=1)
    with RunStore(tmp_path / "x.duckdb") as store:
        old = asyncio.run(replay(load_conversation(data), config, store, scoring=1)).run_id
        assert store.steps(old).empty and store.run(old)["retention"] == 0.0  # (nothing observed: no read)
    code, out, err = invoke("rescore", "--all", "--db", str(tmp_path / "x.duckdb"))
    assert code == 0, err
    assert f"run {old} (notes): retention 0.000 → 0.000 under rule 2" in out


def test_a_resume_started_while_an_experiment_is_rescored_leaves_it_under_one_rule(tmp_path) -> None:
    """Re-scoring checked that the experiment was not running before scoring its runs, then wrote
    the new rule without looking again: a resume started in between wrote its runs under rule 1 into
    an experiment recorded under rule 2, which pooled both and which no command would repair. The
    write now checks again, in its transaction; and an experiment with a run under an earlier rule
    than its own is found and repaired by ``rescore --all``."""
    from workbench.rescore import earlier_runs

    db = tmp_path / "x.duckdb"
    experiment_id = old_experiment(db)
    with RunStore(db) as store:
        runs = store.experiment_runs(experiment_id)
        done = [rescore_run(store, run_id) for run_id in runs.run_id]
        store.claim_experiment(experiment_id)  # a resume starts meanwhile (it reads the rule after this)
        with pytest.raises(Exception, match="while it was being re-scored: nothing was re-scored"):
            store.write_rescored(done, experiment_id=experiment_id, rule=SCORING)
        assert ex.experiment_rule(store.experiment(experiment_id)["options"]) == 1
        assert set(store.experiment_runs(experiment_id).scoring) == {1}
        store.finish_experiment(experiment_id, "completed", None, 0.0)
        # One of its runs completed under rule 1 meanwhile (here: was not among those scored).
        with pytest.raises(Exception, match="while it was being re-scored"):
            store.write_rescored(done[:1], experiment_id=experiment_id, rule=SCORING)
        assert set(store.experiment_runs(experiment_id).scoring) == {1}
        # An experiment left mixed by that race before this check: its rule says 2, a run says 1.
        store.write_rescored(done[:1])
        store.update_experiment_options(experiment_id, scoring=SCORING)
        assert sorted(store.experiment_runs(experiment_id).scoring) == [1, SCORING]
        assert earlier_runs(store) == ([experiment_id], [])
    code, out, _ = invoke("experiment", "show", experiment_id, "--db", str(db))  # its pooled figures say so
    assert code == 0 and f"1 run of this experiment is scored under rule 1 while it is under rule {SCORING}" in out
    assert f"rescore --experiment {experiment_id}" in out
    code, out, err = invoke("rescore", "--all", "--db", str(db))
    assert code == 0, err
    assert f"experiment {experiment_id}: 1 completed run re-scored under rule {SCORING}" in out
    with RunStore(db) as store:
        assert set(store.experiment_runs(experiment_id).scoring) == {SCORING}
        assert earlier_runs(store) == ([], [])


def test_a_run_scored_by_an_older_omem_into_an_upgraded_file_reads_as_rule_1(tmp_path) -> None:
    """An omem from before rule numbers writes no ``scoring`` into a file this one migrated: the
    run read as "not scored" (no warning, ``rescore`` said it had no figures) although it showed
    retention. A file a newer omem migrated is refused, untouched."""
    import duckdb

    db = tmp_path / "x.duckdb"
    with RunStore(db) as store:
        run_id = asyncio.run(replay(load_conversation(DEMO), CONFIG, store, scoring=1)).run_id
    con = duckdb.connect(str(db))
    con.execute("UPDATE runs SET scoring = NULL WHERE run_id = ?", [run_id])  # as the older omem wrote it
    con.close()
    with RunStore(db) as store:
        assert store.run(run_id)["scoring"] == 1 and list(store.runs().scoring) == [1]
    code, out, err = invoke("rescore", run_id, "--db", str(db))
    assert code == 0, err
    assert "was rule 1" in out
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO omem_schema VALUES (99, 'from the future', now())")
    con.close()
    before = db.read_bytes()
    for read_only in (False, True):
        with pytest.raises(Exception, match="schema version 99, written by a newer omem"):
            RunStore(db, read_only=read_only)
    assert db.read_bytes() == before
    con = duckdb.connect(str(db))  # read-only, a file an older omem left cannot be upgraded: said so
    con.execute("DELETE FROM omem_schema WHERE version > 5")
    con.close()
    with pytest.raises(Exception, match="schema version 5, from an older omem.*open it once for writing"):
        RunStore(db, read_only=True)


def test_a_later_rule_than_this_version_knows_is_said_not_a_crash(tmp_path) -> None:
    """An experiment a newer omem scored under rule 3 crashed ``experiment list`` (an
    ExperimentError from validating its options), made ``rescore --all`` abort, and was called
    "an earlier rule"."""
    from workbench.retention import earlier_rule_note, is_earlier

    db = tmp_path / "x.duckdb"
    experiment_id = old_experiment(db)
    later = SCORING + 1
    import duckdb

    con = duckdb.connect(str(db))  # as a newer omem recorded it
    con.execute("UPDATE runs SET scoring = ? WHERE experiment_id = ?", [later, experiment_id])
    con.close()
    with RunStore(db) as store:
        store.update_experiment_options(experiment_id, scoring=later)
        assert ex.experiment_rule(store.experiment(experiment_id)["options"]) == later
        with pytest.raises(RescoreError, match=f"rule {later}, a later rule than this version"):
            rescore_experiment(store, experiment_id)
    assert not is_earlier(later) and is_earlier(SCORING - 1)
    assert "a later rule than this version of omem knows" in earlier_rule_note(later)
    code, out, err = invoke("experiment", "list", "--db", str(db))
    assert code == 0, err
    assert experiment_id in out and "earlier" not in out  # (nor sent to a rescore that cannot help)
    code, out, err = invoke("experiment", "show", experiment_id, "--db", str(db))
    assert code == 0 and "a later rule than this version of omem knows" in out and "rescore" not in out
    code, out, _ = invoke("rescore", "--all", "--db", str(db))
    assert code == 0 and "nothing to re-score: no run is scored under an earlier rule" in out


def test_an_experiment_can_be_rescored_to_another_known_rule_through_the_api(tmp_path) -> None:
    """``rescore_experiment(store, id, rule=1)`` on an experiment under the current rule moved it
    to rule 1; a change for the command (only earlier rules are offered) made it return [] and
    write nothing, as if done."""
    db = tmp_path / "x.duckdb"
    experiment_id = old_experiment(db)
    with RunStore(db) as store:
        assert len(rescore_experiment(store, experiment_id)) == 2  # to the current rule
        assert len(rescore_experiment(store, experiment_id, rule=1)) == 2  # and back
        assert set(store.experiment_runs(experiment_id).scoring) == {1}
        assert ex.experiment_rule(store.experiment(experiment_id)["options"]) == 1


def test_the_app_offers_no_rescore_for_a_later_rule(db: Path) -> None:
    """The Experiments page offered "Re-score under rule 2" for an experiment a newer omem scored
    under rule 3 (and listed it as under an earlier rule); the button could only fail."""
    import duckdb
    from apptest import PAGES, app

    experiment_id = old_experiment(db)
    con = duckdb.connect(str(db))
    con.execute("UPDATE runs SET scoring = ? WHERE experiment_id = ?", [SCORING + 1, experiment_id])
    con.close()
    with RunStore(db) as store:
        store.update_experiment_options(experiment_id, scoring=SCORING + 1)
    at = app("experiments")
    assert not at.exception, at.exception
    assert any("a later rule than this version of omem knows" in w.value.replace("\\", "") for w in at.warning)
    assert not [b for b in at.button if b.key.startswith("xp_rescore_")]
    assert not any("earlier retention rule" in c.value.replace("\\", "") for c in at.caption)
    at.switch_page(PAGES.format("runs")).run()
    assert not at.exception and any("2 runs scored under a later retention rule" in c.value.replace("\\", "")
                                    for c in at.caption), [c.value for c in at.caption]
