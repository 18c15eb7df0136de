"""Experiments: a dataset × a grid, one scheduler, figures with intervals, loss attribution.

Offline runs go through worker processes and the built-in model; the remote path (shared calls,
retries, rate limits, timeouts, cost) is in ``test_remote.py`` against a real HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import priced_scripted_model
from workbench import experiments as ex
from workbench.cli import cli
from workbench.replay import ReplayConfig
from workbench.runstore import RunStore
from workbench.stats import bootstrap_ci, paired_difference

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "datasets" / "demo.jsonl"
LONGMEMEVAL = ROOT / "datasets" / "samples" / "longmemeval-sample.json"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OMEM_CACHE_DIR", str(tmp_path / "cache"))


def test_an_offline_experiment_in_worker_processes_matches_single_replays(tmp_path) -> None:
    db = str(tmp_path / "x.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(LONGMEMEVAL), "--observation-threshold", "20,40",
                            "--reflection-threshold", "60", "--window", "2", "--concurrency", "2", "--json",
                            "--db", db)
    assert code == 0, err
    data = json.loads(out.strip().splitlines()[-1])
    assert set(data) >= {"experiment_id", "dataset", "conversations", "elapsed_s", "configs", "comparisons"}
    [first, second] = data["configs"]
    assert [first["label"], second["label"]] == ["obs 20", "obs 40"]
    conversations = len(data["conversations"])
    assert conversations >= 2 and first["runs"] == second["runs"] == conversations and first["failed"] == 0
    for c in data["configs"]:
        assert set(c) >= {"label", "config", "runs", "failed", "probes", "retention", "retention_ci95", "compression",
                          "recency_ratio", "blind_spot_tokens", "observer_calls", "reflector_calls", "cost_usd"}
        assert c["cost_usd"] == 0.0 and c["observer_calls"] > 0 and c["compression"] > 1
    [comparison] = data["comparisons"]
    assert comparison["a"] == "obs 20" and comparison["b"] == "obs 40" and comparison["verdict"]
    # Each run is exactly what a single replay of that pair records (the worker changes nothing).
    with RunStore(db) as store:
        runs = store.experiment_runs(data["experiment_id"])
        assert len(runs) == 2 * conversations and set(runs.status) == {"completed"}
        some = runs.iloc[0]
        from workbench.datasets import load_conversation
        from workbench.replay import replay

        alone = asyncio.run(replay(load_conversation(LONGMEMEVAL, some.conversation_id),
                                   ReplayConfig.from_json(json.loads(some.config)), store))
        assert alone.compression == pytest.approx(some.compression)
        assert store.steps(alone.run_id).backlog_tokens.tolist() == store.steps(some.run_id).backlog_tokens.tolist()
        assert store.records(alone.run_id).text.tolist() == store.records(some.run_id).text.tolist()


def test_pooled_figures_intervals_and_the_funnel_are_computed_from_the_recorded_probes(tmp_path) -> None:
    with RunStore(tmp_path / "x.duckdb") as store:
        grid = [ReplayConfig(observation_threshold=150, reflection_threshold=300),
                ReplayConfig(observation_threshold=600, reflection_threshold=1200)]
        experiment_id = ex.create_experiment(store, dataset=DEMO, grid=grid,
                                             options=ex.ExperimentOptions(concurrency=1))
        outcome = asyncio.run(ex.run_experiment(store, experiment_id))
        assert outcome.status == "completed" and outcome.runs == 2 and outcome.failed == 0
        summaries = ex.summarise(store, experiment_id)
        probes = store.experiment_probes(experiment_id)
        losses = store.experiment_losses(experiment_id)
        for summary in summaries:
            mine = probes[(probes.config_label == summary.label) & (probes.method == "memory") & probes.score.notna()]
            assert summary.probes == len(mine) == 22
            assert summary.retention == pytest.approx(mine.score.mean())
            assert summary.retention_ci95 == bootstrap_ci(mine.score.tolist())
            low, high = summary.retention_ci95
            assert low <= summary.retention <= high
            funnel = summary.funnel
            assert funnel["said"] >= funnel["observed"] >= funnel["reflected"] >= funnel["visible"]
            assert funnel["said"] == len(losses[losses.config_label == summary.label]) > 0
            # "visible at the end" in the funnel agrees with the word-retention score of each probe
            visible = losses[(losses.config_label == summary.label) & losses.visible]
            scored = mine.set_index("probe_id").score
            assert all(scored[p] >= 0.5 for p in visible.probe_id)
            # and every probe retention counts as kept (with evidence) is in the funnel's last stage
            # or in the count of those visible by another route: the two figures reconcile.
            with_evidence = mine[mine.probe_id.isin(set(losses[losses.config_label == summary.label].probe_id))]
            assert funnel["visible"] + funnel["visible_elsewhere"] == int((with_evidence.score >= 0.5).sum())
        # lost probes say where (and, for a lost observation or reflection, at which step)
        lost = losses[losses.lost_at.notna()]
        assert set(lost.lost_at) <= {"observation", "reflection", "end"}


def test_an_experiment_scores_every_run_with_the_rule_it_started_with(tmp_path) -> None:
    """The retention rule changed (a date counts only beside its question's words): an experiment
    recorded before rules had numbers was scored under rule 1, so the runs a resume adds are scored
    under rule 1 too (one experiment never pools two rules) and its report says so; a new
    experiment records the current rule; every run records the rule it was scored with."""
    import dataclasses

    from workbench.retention import SCORING

    db = tmp_path / "x.duckdb"
    with RunStore(db) as store:
        grid = [ReplayConfig(observation_threshold=150, reflection_threshold=300)]
        new = ex.create_experiment(store, dataset=DEMO, grid=grid, options=ex.ExperimentOptions(concurrency=1))
        options = dataclasses.asdict(ex.ExperimentOptions(concurrency=1))
        del options["scoring"]  # as recorded before the rule was
        old = store.create_experiment(name=None, dataset=str(DEMO), dataset_format=None,
                                      conversations=[c.id for c in ex.list_conversations(DEMO)],
                                      configs=[{"label": "obs 150", "config": grid[0].to_json()}], options=options)
        for experiment_id in (new, old):
            assert asyncio.run(ex.run_experiment(store, experiment_id)).status == "completed"
        new_runs, old_runs = store.experiment_runs(new), store.experiment_runs(old)
        assert set(new_runs.scoring) == {SCORING} and set(old_runs.scoring) == {1}
        # the same replays, scored two ways: rule 1 credited the window every message's date
        assert old_runs.retention_window_only.sum() > new_runs.retention_window_only.sum()
        assert (ex.report(store, new)["scoring"], ex.report(store, old)["scoring"]) == (SCORING, 1)
        # one of its runs resumed on its own (`replay --resume`) is scored under the experiment's rule too
        from workbench.datasets import load_conversation
        from workbench.replay import replay

        run_id = old_runs.run_id.iloc[0]
        store.set_status(run_id, "failed", "a test")
        store.update_run(run_id, scoring=None)
        asyncio.run(replay(load_conversation(DEMO, old_runs.conversation_id.iloc[0]),
                           ReplayConfig.from_json(json.loads(old_runs.config.iloc[0])), store, resume=run_id))
        assert store.run(run_id)["status"] == "completed" and store.run(run_id)["scoring"] == 1
    code, out, _ = invoke("experiment", "show", old, "--db", str(db))
    assert code == 0 and "scored under rule 1" in out
    code, out, _ = invoke("experiment", "show", new, "--db", str(db))
    assert code == 0 and "scored under rule" not in out
    code, _, err = invoke("compare", old_runs.run_id.iloc[0], new_runs.run_id.iloc[0], "--db", str(db))
    assert code == 0 and "scored under different rules: A under rule 1" in err


def test_the_same_scores_give_the_same_interval_whatever_order_they_were_read_in(tmp_path) -> None:
    """The bootstrap draws by position, and the probes came ordered by run id (random): identical
    experiments printed [0.721, 0.801] and [0.722, 0.800]."""
    with RunStore(tmp_path / "x.duckdb") as store:
        grid = [ReplayConfig(observation_threshold=150, reflection_threshold=300)]
        experiment_id = ex.create_experiment(store, dataset=DEMO, grid=grid,
                                             options=ex.ExperimentOptions(concurrency=1))
        asyncio.run(ex.run_experiment(store, experiment_id))
        tables = (store.experiment(experiment_id), store.experiment_runs(experiment_id),
                  store.experiment_probes(experiment_id), store.experiment_losses(experiment_id))
    experiment, runs, probes, losses = tables
    [first] = ex.summaries_of(experiment, runs, probes, losses)
    for seed in range(3):
        [again] = ex.summaries_of(experiment, runs, probes.sample(frac=1, random_state=seed), losses)
        assert again.retention_ci95 == first.retention_ci95 and again.per_category == first.per_category


@pytest.mark.parametrize("concurrency", [1, 2])  # in this process, and in worker processes
def test_progress_follows_the_runs_in_flight_not_only_the_finished_ones(tmp_path, shared_datasets,
                                                                        concurrency) -> None:
    """Found in the app: an experiment's bar stayed at 0% for the whole of its runs (it moved only
    when a run finished: minutes on BEAM). Between finished runs the progress reports how far the
    runs in flight are through their messages; the bar never goes back."""
    reports: list[ex.Progress] = []
    with RunStore(tmp_path / "x.duckdb") as store:
        grid = [ReplayConfig(observation_threshold=o) for o in (500, 1000)]
        experiment_id = ex.create_experiment(store, dataset=shared_datasets / "locomo-dev" / "locomo-dev.json",
                                             grid=grid, conversations=["conv-26"],
                                             options=ex.ExperimentOptions(concurrency=concurrency))
        outcome = asyncio.run(ex.run_experiment(store, experiment_id, progress=reports.append))
    assert outcome.status == "completed"
    moving = [p for p in reports if not p.finished]
    assert moving and all(1 <= p.in_flight <= concurrency and 0 < p.running < p.in_flight for p in moving)
    assert all(p.label in ("obs 500", "obs 1000") and p.conversation_id == "conv-26" for p in moving)
    assert any(0 < p.fraction < 0.5 for p in moving)  # before the first run finished, the bar moved
    fractions = [p.fraction for p in reports]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert [p.done for p in reports if p.finished] == [1, 2]


def test_runs_replayed_and_waiting_to_be_written_are_not_counted_in_progress(tmp_path) -> None:
    """Short runs end in the worker processes faster than this process writes them: the progress
    counted every run replayed and not yet written as in flight ("26 in progress, 31% through
    their messages" at a concurrency of 2). They are counted apart, as being recorded."""
    reports: list[ex.Progress] = []
    with RunStore(tmp_path / "x.duckdb") as store:
        grid = [ReplayConfig(observation_threshold=o, reflection_threshold=r) for o in (100, 150, 200, 300)
                for r in (400, 800)]
        experiment_id = ex.create_experiment(store, dataset=LONGMEMEVAL, grid=grid,
                                             options=ex.ExperimentOptions(concurrency=2))
        outcome = asyncio.run(ex.run_experiment(store, experiment_id, progress=reports.append))
    assert outcome.status == "completed" and outcome.runs == reports[-1].total == 32
    assert all(p.in_flight <= 2 and p.done + p.recording + p.in_flight <= p.total for p in reports)
    fractions = [p.fraction for p in reports]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    from workbench.app_data import progress_text

    assert progress_text(None, experiment_id) == (0.0, f"Starting {experiment_id}: reading the dataset and starting "
                                                      "the workers (10-20 s)…")  # (not only "Starting …")
    waiting = ex.Progress(6, 32, 0, 0.0, "obs 100", "c", "completed", 1.0, in_flight=2, running=0.5, recording=24)
    assert progress_text(waiting, experiment_id) == (
        (6 + 24 + 0.5) / 32, "6 of 32 runs to replay done · 2 in progress, 25% through their messages · 24 replayed, "
        "being recorded · last finished: obs 100 on c (completed), about 4 s left")
    # runs that did not complete are counted among those done, and said to be (" · 3 not completed"
    # beside "3 of 6 done", with 0 completed, read as three more)
    unrunnable = ex.Progress(3, 6, 3, 0.0, "obs 100", "c", "failed", 1.0)
    assert progress_text(unrunnable, experiment_id)[1].startswith("3 of 6 runs to replay done (all of them not completed)")
    some = ex.Progress(4, 6, 1, 0.0, "obs 100", "c", "completed", 1.0)
    assert progress_text(some, experiment_id)[1].startswith("4 of 6 runs to replay done (1 of them not completed) · last")


def test_a_running_experiments_header_counts_its_completed_runs_as_they_are_written(tmp_path) -> None:
    """The app's header of an experiment running in its process said the count of the page's last
    draw ("0 of 12 runs completed") beside a bar at "6 of 12 runs to replay done". It is counted
    from the progress, and equals the completed runs in the store at each report, on a resume too
    (the bar's total is then the runs left, not the grid)."""
    from workbench.app_data import running_status

    seen: list[tuple[str, int]] = []
    with RunStore(tmp_path / "x.duckdb") as store:
        grid = [ReplayConfig(observation_threshold=o) for o in (100, 150, 200)]
        experiment_id = ex.create_experiment(store, dataset=LONGMEMEVAL, grid=grid,
                                             options=ex.ExperimentOptions(concurrency=1))
        asyncio.run(ex.run_experiment(store, experiment_id))
        runs = store.runs()
        planned = len(runs)
        for run_id in runs.run_id[:2]:
            store.delete_run(run_id)

        def check(p: ex.Progress) -> None:
            completed = int((store.runs().status == "completed").sum())
            seen.append((running_status(planned - 2, planned, p), completed))

        asyncio.run(ex.run_experiment(store, experiment_id, progress=check))
    assert planned >= 3 and len(seen) >= 2
    assert all(said == f"running · {completed} of {planned} runs completed" for said, completed in seen), seen
    assert seen[-1][1] == planned
    assert running_status(planned - 2, planned, None) == f"running · {planned - 2} of {planned} runs completed"


def test_an_experiment_says_which_configurations_fell_behind_and_what_bounds_it(tmp_path) -> None:
    """Found by a walkthrough: on BEAM at obs 1000 the blind spot grew to 52k tokens, and only a
    run's own page said so; the experiment's figures (what users decide on) said nothing of it nor of
    the backlog ceiling that bounds it. `experiment show`, its JSON and its HTML export say it."""
    import html

    from workbench.catalog import DEMO_DATASET
    from workbench.export_html import experiment_html

    db = tmp_path / "x.duckdb"
    small = dict(observation_threshold=20, reflection_threshold=80, last_messages=2)
    with RunStore(db) as store:
        grid = [ReplayConfig(**small), ReplayConfig(**small, max_backlog=60), ReplayConfig()]
        experiment_id = ex.create_experiment(store, dataset=DEMO_DATASET, grid=grid,
                                             options=ex.ExperimentOptions(concurrency=1))
        asyncio.run(ex.run_experiment(store, experiment_id))
        summaries = ex.summarise(store, experiment_id)
        note = ex.report(store, experiment_id)["backlog_note"]
        page = experiment_html(store, experiment_id)
    behind, ceiling, default = summaries
    assert behind.blind_spot_tokens > ex.BEHIND * 20 and default.blind_spot_tokens < 1000  # (the defaults keep up)
    assert note.startswith("The observer fell behind under 1 configuration")
    assert f"{behind.label}: {behind.blind_spot_tokens:,.0f} tokens" in note and "--max-backlog" in note
    assert ceiling.label not in note and default.label not in note  # a ceiling set: it is bounded
    assert note in html.unescape(page)
    code, out, _ = invoke("experiment", "show", experiment_id, "--db", str(db))
    assert code == 0 and "The observer fell behind under 1 configuration" in " ".join(out.split())
    assert ex.backlog_note([ceiling, default]) is None


def test_the_cost_estimate_is_not_below_what_the_calls_it_estimates_cost(tmp_path, shared_datasets) -> None:
    """The estimate (notes a fifth of their input, reflections writing 0.55 of their threshold)
    came in below the cost of the calls made: $0.0358 against $0.0401 on LoCoMo at gpt-4o-mini's
    prices. Checked here on the offline model's recorded calls, priced as gpt-4o-mini's."""
    import litellm

    info = litellm.get_model_info("gpt-4o-mini")
    price_in, price_out = info["input_cost_per_token"], info["output_cost_per_token"]
    with RunStore(tmp_path / "x.duckdb") as store:
        grid = [ReplayConfig(observation_threshold=o, reflection_threshold=2000) for o in (1000, 500)]
        experiment_id = ex.create_experiment(store, dataset=shared_datasets / "locomo-dev" / "locomo-dev.json",
                                             grid=grid, conversations=["conv-26"],
                                             options=ex.ExperimentOptions(concurrency=1))
        asyncio.run(ex.run_experiment(store, experiment_id))
        runs = store.experiment_runs(experiment_id)
        tokens = [int(t) for t in runs.full_history_tokens[:1]]
        for run in runs.itertuples():
            config = json.loads(run.config)
            calls = store.model_calls(run.run_id)
            spent = float((calls.input_tokens * price_in + calls.output_tokens * price_out).sum())
            priced = ReplayConfig(observer="gpt-4o-mini", reflector="gpt-4o-mini",
                                  observation_threshold=config["observation_threshold"],
                                  reflection_threshold=config["reflection_threshold"])
            assert ex.estimate_cost(tokens, [priced]) >= spent


def test_the_judge_reads_the_final_context_word_retention_scores(scripted, tmp_path) -> None:
    """The judged context was the last read's window, taken before the conversation's last
    messages were saved, while word retention scores the final one: 1–2 probes per LoCoMo
    conversation were judged on a context without their answer."""
    prompts = []

    def answer(messages):
        prompt = messages[-1]["content"]
        prompts.append(prompt)
        return "CORRECT" if prompt.startswith("You grade answers") else "I don't know"

    scripted.default = answer
    code, out, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"),
                            "--answerer", "scripted/model", "--judge", "scripted/model", "--concurrency", "1",
                            "--window", "2", "--yes", "--db", str(tmp_path / "x.duckdb"))
    assert code == 0, err
    asked = [p for p in prompts if not p.startswith("You grade answers")]
    assert len(asked) == 3 and all("Your vet is Dr. Okafor." in p for p in asked)  # the last message
    # In a window of 10, the evidence of 2 of them is still in it: word retention leaves those
    # unscored, and the judge asks only the others (the same probes).
    prompts.clear()
    code, out, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"),
                            "--answerer", "scripted/model", "--judge", "scripted/model", "--concurrency", "1",
                            "--json", "--yes", "--db", str(tmp_path / "y.duckdb"))
    assert code == 0, err
    asked = [p for p in prompts if not p.startswith("You grade answers")]
    [config] = json.loads(out.strip().splitlines()[-1])["configs"]
    assert len(asked) == config["probes"] < 3



def test_the_blind_spot_is_a_mean_over_every_read_of_every_conversation(tmp_path) -> None:
    """As docs/experiments.md defines it; it was a mean of the runs' means (255.2 where every
    read gives 256.4 on LoCoMo), which counts a short conversation as much as a long one."""
    import pandas as pd

    with RunStore(tmp_path / "x.duckdb") as store:
        grid = [ReplayConfig(observation_threshold=40, reflection_threshold=2000, last_messages=2)]
        experiment_id = ex.create_experiment(store, dataset=LONGMEMEVAL, grid=grid,
                                             options=ex.ExperimentOptions(concurrency=1))
        asyncio.run(ex.run_experiment(store, experiment_id))
        runs = store.experiment_runs(experiment_id)
        reads = pd.concat([store.steps(r) for r in runs.run_id])
        [summary] = ex.summarise(store, experiment_id)
    assert runs.steps.nunique() > 1  # conversations of different lengths
    assert summary.blind_spot_tokens == pytest.approx(reads.backlog_tokens.mean())


def test_paired_comparison_verdicts() -> None:
    same = {str(i): float(i % 2) for i in range(40)}
    assert paired_difference("a", "b", same, same).verdict() == "no detectable difference: 0.000 [0.000, 0.000]"
    better = {k: min(1.0, v + 0.5) for k, v in same.items()}
    diff = paired_difference("v1", "v2", same, better)
    assert diff.detectable and diff.verdict().startswith("v2 keeps 0.250 more [")
    worse = paired_difference("v2", "v1", better, same)
    assert worse.verdict().startswith("v2 keeps 0.250 more [")  # the same finding, whichever is a
    noisy = {str(i): float(i % 3 == 0) for i in range(12)}
    shifted = {str(i): float(i % 4 == 0) for i in range(12)}
    assert paired_difference("a", "b", noisy, shifted).verdict().startswith("no detectable difference")
    assert paired_difference("a", "b", {}, {}).verdict() == "not enough shared probes to compare"
    # Two probes that agree: no zero-width interval read as certainty, and never "detectable"
    few = paired_difference("a", "b", {"p1": 0.0, "p2": 0.0}, {"p1": 0.2, "p2": 0.2})
    assert few.ci95 is None and not few.detectable and few.probes == 2
    assert few.verdict() == "too few shared probes for an interval: +0.200 on 2 (an interval needs 10)"
    ten = {str(i): 0.0 for i in range(10)}
    assert paired_difference("a", "b", ten, {k: 0.5 for k in ten}).detectable  # from 10 on, an interval
    # a configuration's own interval (pooled, per category) follows the same rule
    assert bootstrap_ci([0.2, 0.2]) is None and bootstrap_ci([1.0] * 9 + [0.0]) is not None
    # An interval that reaches 0 ends at an unsigned 0; one stopping just short of it says on which side.
    from workbench.stats import PairedDifference

    assert PairedDifference("a", "b", 9, -0.045, (-0.091, 0.0)).verdict() == \
        "no detectable difference: -0.045 [-0.091, 0.000]"
    assert PairedDifference("a", "b", 9, 0.03, (0.0004, 0.06)).verdict() == "b keeps 0.030 more [0.0004, 0.060]"
    # a keeps more: a size, never a plus sign beside the table's negative b − a
    assert PairedDifference("a", "b", 9, -0.03, (-0.06, -0.0004)).verdict() == "a keeps 0.030 more [0.0004, 0.060]"


def test_a_killed_experiment_is_resumed_without_redoing_finished_runs(tmp_path) -> None:
    import os
    import signal
    import subprocess
    import sys

    db = tmp_path / "x.duckdb"
    command = [sys.executable, "-m", "workbench", "experiment", "run", "--dataset", str(DEMO),
               "--observation-threshold", "150,300,600", "--concurrency", "1", "--db", str(db)]
    worker = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMEM_DB_WAIT": "30"})
    try:
        for line in worker.stderr:  # "[1/3] priya-lisbon · obs 150 …" once the first run is written
            if line.startswith("[1/3]"):
                break
        os.kill(worker.pid, signal.SIGKILL)  # no chance to say anything
    finally:
        worker.kill()
        worker.wait()
    with RunStore(db) as store:  # the dead owner is noticed on the next open
        [experiment] = store.experiments().to_dict("records")
        experiment_id = experiment["experiment_id"]
        assert experiment["status"] == "interrupted" and "experiment resume" in experiment["error"]
        first = store.experiment_runs(experiment_id)
        assert list(first.status) == ["completed"]  # whole runs only: the one in flight left nothing
        # the two runs never started count as not completed (not only the recorded failures)
        assert (experiment["planned_runs"], experiment["runs"], experiment["unfinished_runs"]) == (3, 1, 2)
        from workbench.app_data import experiment_label, experiments_table

        listed = experiments_table(store.experiments())  # the app says so too
        assert listed["completed"].tolist() == [1] and listed["not completed"].tolist() == [2]
        # (it read "1 run, 2 not completed": as if the one run recorded had not completed)
        assert "1 of 3 runs completed" in experiment_label(experiment)
        # its grid in a few words: experiments alike in their labels ("obs 150") differ in it (found by
        # a newcomer: the app's ref 600 and the CLI's ref 2000 looked the same in every list)
        grid = " · ".join(experiment_label(experiment).split(" · ")[1:4])
        assert grid == "obs 150/300/600 · ref 2000 · window 10", experiment_label(experiment)
        assert listed["grid"].tolist() == [grid]
    code, out, _ = invoke("experiment", "list", "--db", str(db))
    header, row = out.splitlines()[:2]
    assert code == 0 and row.split()[header.split().index("not")] == "2"  # "not completed" (two words)
    code, out, err = invoke("experiment", "show", experiment_id, "--db", str(db))
    assert code == 0 and "the figures below come from the 1 of 3 planned runs that completed" in " ".join(out.split())
    # its time up to its last recorded run is counted, and said to be (it read "elapsed time not
    # recorded", then a resume's total left that part out without a word)
    crashed = experiment["elapsed_s"]
    assert crashed > 0 and "its elapsed time counts up to there" in experiment["error"]
    from workbench.formatting import display

    assert f"{display(crashed)} s;" in out and "elapsed time not recorded" not in out
    # the hint names the run store given: pasted as printed, it resumes this experiment
    assert f"finish it with: python -m workbench experiment resume {experiment_id} --db {db}\n" in err
    assert f"finish it with: python -m workbench experiment resume {experiment_id} --db {db}" in experiment["error"]
    code, out, err = invoke("experiment", "resume", experiment_id, "--json", "--db", str(db))
    assert code == 0, err
    resumed = json.loads(out.strip().splitlines()[-1])["elapsed_s"]
    with RunStore(db) as store:
        assert store.experiment(experiment_id)["elapsed_s"] == pytest.approx(resumed) and resumed > crashed
        runs = store.experiment_runs(experiment_id)
        assert len(runs) == 3 and set(runs.status) == {"completed"}
        assert first.run_id[0] in set(runs.run_id)  # the finished run was kept, not replayed
        assert store.experiment(experiment_id)["status"] == "completed"
    assert [c["runs"] for c in json.loads(out.strip().splitlines()[-1])["configs"]] == [1, 1, 1]


def test_a_configuration_that_cannot_run_is_listed_with_its_error(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, out, err = invoke("experiment", "run", "--dataset", str(DEMO), "--observer", "omem/extractive,gpt-4o-mini",
                            "--concurrency", "1", "--json", "--db", str(tmp_path / "x.duckdb"))
    assert code == 1  # not every run finished
    data = json.loads(out.strip().splitlines()[-1])
    good, bad = data["configs"]
    assert good["runs"] == 1 and good["failed"] == 0
    assert bad["runs"] == 0 and bad["failed"] == 1 and "missing OPENAI_API_KEY" in bad["errors"][0]
    assert data["comparisons"][0]["verdict"] == "not enough shared probes to compare"
    assert data["status"] == "completed" and data["failed_runs"] == 1
    assert data["status_text"] == "completed; 1 of 2 runs failed"


def test_an_experiment_that_finished_with_failed_runs_says_so_and_resume_retries_them(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    db = str(tmp_path / "x.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(DEMO), "--observer", "omem/extractive,gpt-4o-mini",
                            "--concurrency", "1", "--db", db)
    assert code == 1
    # No question about paying: the paid configuration cannot run, so nothing will be spent.
    assert "warning: obs model gpt-4o-mini cannot run here and will be recorded as failed" in err
    assert "cost free" in err and "Start?" not in err
    experiment_id = out.split()[1]
    assert f"experiment {experiment_id} (completed; 1 of 2 runs failed): 1 conversation of" in out
    # A label longer than its column is written whole on a line of its own; the table fits 100 columns.
    assert "\nobs model omem/extractive\n" in out and max(len(line) for line in out.splitlines()) <= 100
    # The failed run cannot replay here either: a resume would be refused, so the hint says why first
    # (it said "replay the runs that did not complete with: … resume", which then refused).
    assert (f"the runs that did not complete cannot replay here (gpt-4o-mini: missing OPENAI_API_KEY in the "
            f"environment); once that is fixed, replay them with: python -m workbench experiment resume "
            f"{experiment_id}") in " ".join(err.split())
    with RunStore(db) as store:
        [failed_before] = store.experiment_runs(experiment_id).query("status != 'completed'").run_id
    # The key is still missing: the resume says why nothing can run (not "nothing to resume", nor
    # a retry that fails again and replaces the run's recorded error).
    code, out, err = invoke("experiment", "resume", experiment_id, "--db", db)
    assert code == 1 and "nothing to resume" not in err and "no run left can replay here" in err
    assert "missing OPENAI_API_KEY" in err
    with RunStore(db) as store:
        runs = store.experiment_runs(experiment_id)
        assert len(runs) == 2 and failed_before in set(runs.run_id)  # kept as it was
        assert store.experiment(experiment_id)["status"] == "completed"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-a-real-key")  # set since: it can replay, show says how
    code, _, err = invoke("experiment", "show", experiment_id, "--db", db)
    assert code == 0 and "cannot replay here" not in err
    assert f"replay the runs that did not complete with: python -m workbench experiment resume {experiment_id}" in err
    monkeypatch.delenv("OPENAI_API_KEY")
    # `runs` with that failed run (a long status and configuration) still fits 100 columns: the
    # configuration goes on a line of its own, indented.
    code, out, _ = invoke("runs", "--db", db)
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 100
    assert "\n    obs model gpt-4o-mini" in out
    # runs --json tells the runs of experiments apart (it had no experiment, dataset, cost or time)
    listed = {r["run_id"]: r for r in json.loads(invoke("runs", "--json", "--db", db)[1])}
    assert {listed[r]["experiment_id"] for r in runs.run_id} == {experiment_id}
    assert listed[failed_before]["error"] and listed[failed_before]["dataset"].endswith("demo.jsonl")
    assert all(r["created_at"][:4].isdigit() and "T" in r["created_at"] for r in listed.values())
    assert {"config_label", "cost_usd", "planned_steps", "observer_calls"} <= set(listed[failed_before])
    code, out, err = invoke("experiment", "run", "--dataset", str(DEMO), "--concurrency", "1", "--db", db)
    done_id = out.split()[1]
    code, out, err = invoke("experiment", "resume", done_id, "--db", db)
    assert code == 0 and f"every run of experiment {done_id} is already completed: nothing to resume" in err
    code, out, _ = invoke("experiment", "resume", done_id, "--json", "--db", db)  # (it printed no JSON at all)
    assert code == 0 and json.loads(out.strip().splitlines()[-1]) == {"experiment_id": done_id, "status": "completed",
                                                                      "resumed": False}
    # Interrupted after its last run (say while judging): resume finishes it, it is not "nothing to resume".
    with RunStore(db) as store:
        store.finish_experiment(done_id, "interrupted", "stopped before the end", 0.0)
    code, out, err = invoke("experiment", "resume", done_id, "--db", db)
    assert code == 0 and "nothing to resume" not in err
    with RunStore(db) as store:
        assert store.experiment(done_id)["status"] == "completed"


def test_experiment_list_show_compare_and_export(tmp_path) -> None:
    db = str(tmp_path / "x.duckdb")
    code, out, _ = invoke("experiment", "run", "--dataset", str(DEMO), "--observation-threshold", "150,600",
                          "--concurrency", "1", "--name", "thresholds", "--json", "--db", db)
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    code, out, _ = invoke("experiment", "list", "--db", db)
    assert code == 0 and experiment_id in out and "thresholds" in out
    assert out.split()[:8] == ["experiment", "status", "name", "dataset", "planned", "recorded", "not", "completed"]
    assert out.splitlines()[1].split()[3] == "demo"  # a known dataset by its name, not its path
    code, out, _ = invoke("experiment", "show", experiment_id, "--db", db)
    assert code == 0 and "obs 150" in out and "obs 600" in out and "95% CI" in out and "nan" not in out.lower()
    assert max(len(line) for line in out.splitlines()) <= 100  # fits a 100-column terminal with short labels
    assert "obs 150 vs obs 600 (obs 600 minus obs 150):" in " ".join(out.split())  # as `compare` words it
    # the per-category figures and the loss funnel, in the text as in --json (docs list them there)
    code, raw, _ = invoke("experiment", "show", experiment_id, "--json", "--db", db)
    first = json.loads(raw.strip().splitlines()[-1])["configs"][0]
    shown = " ".join(out.split())
    for category, figures in first["per_category"].items():
        if figures["probes"]:
            assert f"{category} {figures['retention']:.3f}" in shown
    funnel = first["funnel"]
    assert funnel["said"] and (f"evidence said {funnel['said']} → observed with the answer {funnel['observed']} → "
                               f"survived reflection {funnel['reflected']} → visible at the end {funnel['visible']}"
                               in shown)
    code, out, _ = invoke("experiment", "compare", experiment_id, "--a", "obs 600", "--b", "obs 150", "--db", db)
    assert code == 0 and "obs 600 vs obs 150 on 22 shared probes (obs 150 minus obs 600):" in out
    # a verdict naming the better one gives an unsigned size: no "b minus a" beside it to contradict
    from workbench.cli import _comparison_line
    from workbench.stats import PairedDifference

    worse = PairedDifference("obs 500", "obs 1000", 584, -0.018, (-0.031, -0.006))
    assert _comparison_line("obs 500", "obs 1000", worse.verdict(), not worse.detectable) == \
        "obs 500 vs obs 1000: obs 500 keeps 0.018 more [0.006, 0.031]"
    # a label it does not have, or one side twice, is a refused option (exit 2, as the README says;
    # it was 1, a failure's), naming the option
    code, _, err = invoke("experiment", "compare", experiment_id, "--a", "obs 999", "--db", db)
    assert code == 2 and "no configuration 'obs 999'" in err and "--a" in err
    code, _, err = invoke("experiment", "compare", experiment_id, "--a", "1", "--b", "obs 150", "--db", db)
    assert code == 2 and "both sides are 'obs 150'" in err
    code, out, _ = invoke("experiment", "export", experiment_id, "--parquet", str(tmp_path / "out"), "--db", db)
    import pandas as pd

    assert code == 0 and len(pd.read_parquet(tmp_path / "out" / "runs.parquet")) == 2
    # the format read is recorded when it was detected, not left null
    assert pd.read_parquet(tmp_path / "out" / "experiments.parquet").dataset_format.tolist() == ["omem"]
    assert len(pd.read_parquet(tmp_path / "out" / "probe_losses.parquet")) > 0
    # SPEC lists export among the experiment commands with --json: one object, each file's table
    # and rows (it was "No such option"); an error ends stdout with a JSON answer too
    code, out, _ = invoke("experiment", "export", experiment_id, "--parquet", str(tmp_path / "out2"), "--json", "--db", db)
    answer = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and answer["status"] == "completed" and answer["experiment_id"] == experiment_id
    assert answer["folder"] == str(tmp_path / "out2")
    files = {f["table"]: f for f in answer["files"]}
    assert files["runs"]["rows"] == 2 == len(pd.read_parquet(files["runs"]["path"]))
    assert files["probe_losses"]["rows"] == len(pd.read_parquet(tmp_path / "out" / "probe_losses.parquet"))
    code, out, _ = invoke("experiment", "export", experiment_id, "--parquet", str(tmp_path / "out2"), "--json", "--db", db)
    assert code == 2 and "already holds" in json.loads(out.strip().splitlines()[-1])["error"]
    run_id = pd.read_parquet(files["runs"]["path"]).run_id[0]
    code, out, _ = invoke("export", run_id, "--parquet", str(tmp_path / "one"), "--json", "--db", db)
    answer = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and answer["run_id"] == run_id
    assert {f["table"]: f["rows"] for f in answer["files"]}["runs"] == 1
    code, _, err = invoke("experiment", "show", "exp-nope", "--db", db)
    assert code == 1 and "no experiment exp-nope" in err


def test_a_resume_whose_runs_cannot_run_here_is_refused_not_called_free(tmp_path, monkeypatch) -> None:
    """Found by a walkthrough: resuming a paid experiment without its key said "cost free", asked
    nothing, replayed the runs into failures and replaced their recorded errors."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    db = str(tmp_path / "x.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"), "--observer",
                            "omem/extractive,gpt-4o-mini", "--reflector", "none", "--window", "2", "--json", "--db", db)
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    with RunStore(db) as store:
        before = store.experiment_runs(experiment_id)[["run_id", "status", "error"]].to_dict("records")
    assert code == 1 and [r["status"] for r in before].count("failed") == 1
    code, out, err = invoke("experiment", "resume", experiment_id, "--db", db)
    assert code == 1 and "no run left can replay here: " in err and "OPENAI_API_KEY" in err
    assert "cost free" not in err
    with RunStore(db) as store:  # nothing replayed, nothing replaced
        assert store.experiment_runs(experiment_id)[["run_id", "status", "error"]].to_dict("records") == before


def test_show_says_what_the_probes_column_counts(tmp_path) -> None:
    """Found by a walkthrough: "152" probes for a conversation of 199 questions, with nothing saying
    the others have no gold answer (or evidence still in the window)."""
    db = str(tmp_path / "x.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "samples" / "longmemeval-sample.json"),
                            "--observation-threshold", "20", "--window", "2", "--json", "--db", db)
    data = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and data["configs"][0]["probes"] == 3
    code, out, err = invoke("experiment", "show", data["experiment_id"], "--db", db)
    assert "probes: those scored, of 4 probes the conversations ask (1 without a gold answer" in " ".join(out.split())


def test_a_name_given_twice_is_warned_about(tmp_path) -> None:
    """Two experiments under one name read the same in the list and the pickers: nothing said so."""
    db = str(tmp_path / "x.duckdb")
    args = ["experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"), "--window", "2",
            "--name", "baseline", "--json", "--db", db]
    code, out, err = invoke(*args)
    first = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    assert code == 0 and "exists already" not in err
    code, out, err = invoke(*args)
    assert code == 0 and f"warning: an experiment named 'baseline' exists already ({first})" in err


def test_a_value_given_twice_in_a_grid_is_said_to_count_once(tmp_path) -> None:
    """Found by a new user: `--observation-threshold 1000,1000` became one configuration without a word."""
    db = str(tmp_path / "x.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"), "--window", "2",
                            "--observation-threshold", "30,60,30", "--observer", "omem/extractive,omem/extractive",
                            "--json", "--db", db)
    assert code == 0, err
    assert "note: --observation-threshold 30,60,30 repeats a value: each counts once (30, 60)" in err
    assert "note: --observer omem/extractive,omem/extractive repeats a value: each counts once (omem/extractive)" in err
    with RunStore(db) as store:
        assert len(store.experiment(json.loads(out.strip().splitlines()[-1])["experiment_id"])["configs"]) == 2


def test_a_grid_option_given_twice_joins_its_values(tmp_path) -> None:
    """Found by a new user: `--observation-threshold 500 --observation-threshold 600` ran "obs 600"
    alone, the first value dropped without a word (click keeps the last of a repeated option)."""
    db = str(tmp_path / "x.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"),
                            "--observation-threshold", "30", "--observation-threshold", "60,90", "--window", "2",
                            "--window", "3", "--max-backlog", "off", "--max-backlog", "500", "--json", "--db", db)
    assert code == 0, err
    with RunStore(db) as store:
        configs = [c["config"] for c in store.experiment(json.loads(out.strip().splitlines()[-1])["experiment_id"])[
            "configs"]]
    assert sorted({c["observation_threshold"] for c in configs}) == [30, 60, 90]
    assert sorted({c["last_messages"] for c in configs}) == [2, 3]
    assert {c.get("max_backlog") for c in configs} == {None, 500} and len(configs) == 12
    # the same in a sweep; a value repeated across the options is noted, as within one
    code, out, err = invoke("sweep", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"), "--observation-threshold",
                            "30", "--observation-threshold", "30", "--observation-threshold", "60",
                            "--reflection-threshold", "600", "--json", "--db", db)
    assert code == 0, err
    assert "note: --observation-threshold 30,30,60 repeats a value: each counts once (30, 60)" in err
    assert len(json.loads(out.strip().splitlines()[-1])["runs"]) == 2


def test_a_grid_in_a_few_words_names_its_models_apart() -> None:
    """Found by a newcomer: "obs model omem/extractive/openai/gpt-4o-mini" read as one model (model
    names hold "/"), and a grid of one paid model listed as "obs 50 · window 10", as if offline."""
    def config(observer: str, reflector: str | None = "omem/extractive", observation: int = 50) -> dict:
        return ReplayConfig(observer=observer, reflector=reflector, observation_threshold=observation).to_json()

    assert ex.grid_summary([config("omem/extractive"), config("openai/gpt-4o-mini")]) == \
        "obs model omem/extractive, openai/gpt-4o-mini · obs 50 · ref 2000 · window 10"
    assert ex.grid_summary([config("openai/my-local-llm", None)]) == \
        "obs model openai/my-local-llm · obs 50 · window 10"
    assert ex.grid_summary([config("omem/extractive", observation=o) for o in (50, 100)]) == \
        "obs 50/100 · ref 2000 · window 10"  # (the offline model: not named, as before)


def test_labels_name_only_what_varies() -> None:
    grid = [ReplayConfig(observation_threshold=o, reflection_threshold=r).to_json() for o in (500, 1000)
            for r in (1000, 2000)]
    assert ex.labels(grid) == ["obs 500 · ref 1000", "obs 500 · ref 2000", "obs 1000 · ref 1000", "obs 1000 · ref 2000"]
    assert ex.labels(grid[:1]) == ["obs 500 · ref 1000 · window 10"]  # one configuration: what it is
    paid = ReplayConfig(observer="gpt-4o-mini", reflector="gpt-4o").to_json()  # and a model not the offline one
    assert ex.labels([paid]) == ["obs model gpt-4o-mini · ref model gpt-4o · obs 1000 · ref 2000 · window 10"]
    # No reflector, no reflection threshold named as if it applied (the runs table says it too).
    alone = ReplayConfig(reflector=None, observation_threshold=300).to_json()
    assert ex.labels([alone]) == ["obs 300 · window 10"]
    from workbench.app_data import short_config

    assert short_config({"config": alone}) == "obs 300 · no reflector · window 10"
    # nor in a grid that mixes it with configurations that have one (it read "ref model none · obs
    # 300 · ref 2000", a threshold it never used)
    mixed = [alone, *(ReplayConfig(observation_threshold=300, reflection_threshold=r).to_json() for r in (1000, 2000))]
    assert ex.labels(mixed) == ["ref model none", "ref model omem/extractive · ref 1000",
                                "ref model omem/extractive · ref 2000"]
    # Only the built-in model goes unnamed: a typo of it shows.
    typo = ReplayConfig(observer="omem/extractivX").to_json()
    assert short_config({"config": typo}).startswith("omem/extractivX · obs 1000 · ref 2000 · window 10")
    # Prompt versions and a token counter other than the defaults are named (found by a walkthrough:
    # runs that differ only in their prompt read alike in every picker and in `runs`)
    from omem_core.prompts import BUILTIN_PROMPTS, OBSERVER_PROMPT_V1
    from workbench.models import DEFAULT_PROMPT_VERSIONS

    assert DEFAULT_PROMPT_VERSIONS == {name: versions[0].version for name, versions in BUILTIN_PROMPTS.items()}
    assert short_config({"config": ReplayConfig().to_json()}) == "obs 1000 · ref 2000 · window 10"
    older = ReplayConfig(observer_prompt=OBSERVER_PROMPT_V1, token_counter="o200k_base").to_json()
    assert short_config({"config": older}) == "obs 1000 · ref 2000 · window 10 · prompts v1/v2 · o200k_base"
    older_alone = ReplayConfig(observer_prompt=OBSERVER_PROMPT_V1, reflector=None).to_json()
    assert short_config({"config": older_alone}) == "obs 1000 · no reflector · window 10 · prompts v1/–"


@pytest.mark.parametrize("verdict, score", [("**CORRECT**", 1.0), ("Verdict: Correct.", 1.0), ("INCORRECT", 0.0),
                                            ("**Incorrect** - it names another dog", 0.0), ("WRONG", 0.0),
                                            # negated or partial verdicts read as CORRECT (found by a researcher)
                                            ("Not correct.", 0.0), ("The answer is not correct", 0.0),
                                            ("not entirely correct: the year is missing", 0.0),
                                            ("Partially correct, but missing the date", 0.0),
                                            ("It isn't correct", 0.0), ("Correct, not wrong", 1.0),
                                            # review: Markdown inside, other negations, explanations
                                            ("**Not** correct", 0.0), ("not *correct*", 0.0),
                                            ("cannot be correct", 0.0), ("doesn't seem correct", 0.0),
                                            ("The correct answer is Paris; the candidate says London. WRONG", 0.0),
                                            ("WRONG - the correct answer is 2019", 0.0),
                                            ("Not only correct but complete", 1.0), ("not wrong", 1.0),
                                            ("## Final verdict\nCORRECT", 1.0),
                                            # no verdict: not scored (it was a silent 0)
                                            ("I cannot tell", None), ("", None)])
def test_the_judges_verdict_is_read_whatever_its_markdown(verdict, score) -> None:
    """A judge that answered "**CORRECT**" was scored wrong (only a bare first word was read)."""
    from conftest import scripted_provider

    from workbench.datasets import load_conversation
    from workbench.judge import judge_probes

    probes = load_conversation(ROOT / "datasets" / "tiny.jsonl").probes[:1]
    with scripted_provider() as scripted:
        scripted.default = lambda messages: verdict if messages[-1]["content"].startswith("You grade") else "x"
        [row] = asyncio.run(judge_probes(probes, "no context", answerer="scripted/model", judge="scripted/model"))
    assert row["score"] == score if score is not None else row["score"] is None


def test_the_judge_grades_abstention_probes_by_declining() -> None:
    """Abstention probes have no gold (word retention skips them); the judge grades them: the right
    answer is to decline."""
    from conftest import scripted_provider

    from workbench.datasets import load_conversation
    from workbench.judge import judge_probes

    conversation = load_conversation(LONGMEMEVAL, "omem-lme-004_abs")
    [probe] = conversation.probes
    assert probe.abstention and probe.gold is None

    def reply(messages):
        prompt = messages[-1]["content"]
        if prompt.startswith("You grade answers"):
            gold, answer = prompt.split("Gold answer:")[1].split("Candidate answer:")
            return "CORRECT" if "does not contain" in gold and "don't know" in answer else "WRONG"
        return "I don't know"

    with scripted_provider() as scripted:
        scripted.default = reply
        [row] = asyncio.run(judge_probes(conversation.probes, "no context", answerer="scripted/model",
                                         judge="scripted/model"))
    assert row["probe_id"] == probe.id and row["score"] == 1.0 and row["answer"] == "I don't know"
    from workbench.judge import abstention_gold

    assert probe.reference and abstention_gold(probe).endswith("The dataset's note: " + probe.reference)
    graded = []
    with scripted_provider() as scripted:
        scripted.default = lambda messages: graded.append(messages[-1]["content"]) or "CORRECT"
        asyncio.run(judge_probes(conversation.probes, "no context", answerer="scripted/model", judge="scripted/model"))
    assert probe.reference in graded[-1]  # the judge reads the dataset's own note on what was never said


def test_the_answerer_is_told_the_date_a_question_is_asked_on() -> None:
    """LongMemEval's question_date was not read: "how many days ago did I…" was asked with no
    date, so a temporal question had no answer however good the memory."""
    from conftest import scripted_provider

    from workbench.datasets import load_conversation
    from workbench.judge import judge_probes

    asked = []

    def reply(messages):
        prompt = messages[-1]["content"]
        if not prompt.startswith("You grade answers"):
            asked.append(prompt)
        return "CORRECT"

    dated = load_conversation(LONGMEMEVAL, "omem-lme-001").probes  # question_date 2023/06/12 (Mon) 20:15
    undated = load_conversation(ROOT / "datasets" / "tiny.jsonl").probes[:1]
    with scripted_provider() as scripted:
        scripted.default = reply
        asyncio.run(judge_probes(dated + undated, "memory", answerer="scripted/model", judge="scripted/model",
                                 concurrency=1))
    assert "Today's date: 2023-06-12 (Monday) 20:15\nQuestion: " + dated[0].question in asked[0]
    assert "Today's date" not in asked[1] and "Question: " + undated[0].question in asked[1]


def test_judging_is_priced_asked_about_counted_cleaned_of_keys_and_a_failure_is_a_failure(
        scripted, tmp_path, monkeypatch) -> None:
    """An experiment's judge calls were left out of the estimate (a paid judge over an offline grid
    read "free" and started unasked), out of the cost and the cost limit; the answerer's text was
    stored with the API key it quoted; a judge that failed left a traceback and an experiment
    marked "interrupted" with no reason."""
    secret = "sk-test-SECRET1234567890"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    graded = []

    def reply(messages):
        prompt = messages[-1]["content"]
        if not prompt.startswith("You grade answers"):
            return f"Sent with Bearer {secret}: I don't know"
        graded.append(prompt)
        if len(graded) == 2:
            raise RuntimeError(f"502 from the provider (Authorization: Bearer {secret})")
        return "CORRECT"

    scripted.default = reply
    db = tmp_path / "x.duckdb"
    with priced_scripted_model() as model:
        args = ["experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"), "--window", "2",
                "--answerer", model, "--judge", model, "--concurrency", "1", "--json", "--db", str(db)]
        declined = CliRunner().invoke(cli, args, input="n\n", catch_exceptions=False)
        assert declined.exit_code == 1 and "judging included" in declined.stderr and "cost about $" in declined.stderr
        assert json.loads(declined.stdout.strip().splitlines()[-1])["status"] == "failed" and not graded
        code, out, err = invoke(*args, "--yes")
        assert code == 1
        ending = json.loads(out.strip().splitlines()[-1])
        assert ending["status"] == "failed" and "judging failed: the judge model scripted/priced failed" in err
        assert ending["spent_usd"] > 0  # the judging's calls before the failure were paid for (offline replays: $0)
        assert "[OPENAI_API_KEY]" in err and secret not in out + err
        experiment_id = ending["experiment_id"]
        with RunStore(str(db)) as store:
            assert store.experiment(experiment_id)["status"] == "failed"
        with RunStore(str(db)) as store:  # a judge that cannot be called here: refused before anything runs
            store.update_experiment_options(experiment_id, judge="nosuchprovider/judge")
        code, out, err = invoke("experiment", "resume", experiment_id, "--json", "--db", str(db))
        assert code == 1 and "cannot judge here: nosuchprovider/judge" in err
        with RunStore(str(db)) as store:
            store.update_experiment_options(experiment_id, judge=model)
        # the judging still owed is paid work: estimated and asked about (a resume started unasked)
        declined = CliRunner().invoke(cli, ["experiment", "resume", experiment_id, "--db", str(db)], input="n\n")
        assert declined.exit_code == 1 and "not resumed" in declined.stderr
        assert "0 runs left to replay, 1 run to judge; cost about $" in declined.stderr
        code, out, err = invoke("experiment", "resume", experiment_id, "--yes", "--json", "--db", str(db))
        assert code == 0, err
        [config] = json.loads(out.strip().splitlines()[-1])["configs"]
    with RunStore(str(db)) as store:
        [run] = store.experiment_runs(experiment_id).itertuples()
        answers = store.probes(run.run_id).query("method == 'llm_judge'")
        assert len(answers) and all("[OPENAI_API_KEY]" in a and secret not in a for a in answers.answer)
        assert run.judge_calls == 2 * len(answers) and run.judge_cost_usd > 0
    assert config["judge_calls"] == run.judge_calls and config["cost_usd"] == pytest.approx(run.judge_cost_usd)
    assert config["judged_accuracy"] == 1.0
    assert json.loads(out.strip().splitlines()[-1])["spent_usd"] == pytest.approx(config["cost_usd"] + ending["spent_usd"])
    assert secret.encode() not in db.read_bytes()


def test_what_failed_and_replaced_runs_spent_stays_counted(scripted, tmp_path) -> None:
    """A failed run's calls were paid for, but the totals counted completed runs only, and a resume
    deleted the failed run with its cost: the money disappeared from the record."""
    db = tmp_path / "x.duckdb"
    scripted.replies = ["- a", "- b", RuntimeError("rate limited")]
    with priced_scripted_model() as model:
        args = ["--dataset", str(ROOT / "datasets" / "tiny.jsonl"), "--observer", model, "--reflector", "none",
                "--observation-threshold", "30", "--window", "2", "--concurrency", "1", "--no-cache", "--json",
                "--db", str(db)]
        code, out, err = invoke("experiment", "run", *args, "--yes")
        first = json.loads(out.strip().splitlines()[-1])
        assert code == 1 and first["configs"][0]["failed"] == 1
        with RunStore(str(db)) as store:
            [failed] = store.experiment_runs(first["experiment_id"]).itertuples()
        assert failed.status == "failed" and failed.cost_usd > 0
        assert first["spent_usd"] == pytest.approx(failed.cost_usd)  # (the table's cost: completed runs only)
        code, out, err = invoke("experiment", "resume", first["experiment_id"], "--yes", "--json", "--db", str(db))
        assert code == 0, err
        again = json.loads(out.strip().splitlines()[-1])
        code, shown, _ = invoke("experiment", "show", first["experiment_id"], "--db", str(db))
    completed = again["configs"][0]["cost_usd"]
    assert completed > 0 and again["spent_usd"] == pytest.approx(completed + failed.cost_usd)
    code, out, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"), "--observer",
                            "scripted/model", "--reflector", "none", "--observation-threshold", "30", "--window", "2",
                            "--yes", "--json", "--db", str(db))
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["spent_usd"] is None  # a price unknown: not "$0"
    assert "spent in all: $" in shown and "runs a resume replaced included" in " ".join(shown.split())


def test_a_run_whose_only_call_failed_cost_nothing_not_an_unknown_amount(scripted, tmp_path) -> None:
    """A failed call has no price and no usage: a run whose first observer call failed recorded
    its cost as unknown, and one such run made the whole experiment's spend "unknown"."""
    scripted.replies = [RuntimeError("rate limited")]
    with priced_scripted_model() as model:
        code, out, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"),
                                "--observer", model, "--reflector", "none", "--observation-threshold", "30",
                                "--window", "2", "--concurrency", "1", "--no-cache", "--yes", "--json",
                                "--db", str(tmp_path / "x.duckdb"))
    ending = json.loads(out.strip().splitlines()[-1])
    assert code == 1 and ending["configs"][0]["failed"] == 1 and "rate limited" in ending["configs"][0]["errors"][0]
    with RunStore(str(tmp_path / "x.duckdb")) as store:
        [failed] = store.experiment_runs(ending["experiment_id"]).itertuples()
    assert failed.status == "failed" and failed.observer_calls == 1 and failed.cost_usd == 0.0
    assert ending["spent_usd"] == 0.0
    scripted.replies = [RuntimeError("rate limited")]
    with priced_scripted_model() as model:  # a replay says so at its end as well
        code, out, err = invoke("replay", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"), "--observer", model,
                                "--reflector", "none", "--observation-threshold", "30", "--window", "2",
                                "--no-cache", "--yes", "--json", "--db", str(tmp_path / "x.duckdb"))
    replayed = json.loads(out.strip().splitlines()[-1])
    assert code == 1 and replayed["status"] == "failed" and replayed["observer_calls"] == 1
    assert replayed["cost_usd"] == 0.0


def test_the_judging_estimate_errs_high_without_a_reflector() -> None:
    """Without a reflector the notes are not bounded by the thresholds: the estimate capped the
    answerer's context at them anyway."""
    from workbench.datasets.base import ConversationInfo

    info = ConversationInfo("c", messages=400, probes=10, scored_probes=10, tokens=40_000, format="omem")
    with priced_scripted_model() as model:
        bounded = ex.estimate_judging([info], [ReplayConfig(observation_threshold=500, reflection_threshold=500)],
                                      model, model)
        unbounded = ex.estimate_judging([info], [ReplayConfig(observation_threshold=500, reflection_threshold=500,
                                                              reflector=None)], model, model)
    assert unbounded >= 10 * 40_000 * 1e-3 > bounded  # every probe may read the whole conversation


def test_the_backlog_ceiling_is_a_grid_dimension(tmp_path) -> None:
    # one message observed per read while two arrive: without a ceiling the backlog keeps growing
    code, out, err = invoke("experiment", "run", "--dataset", str(DEMO), "--observation-threshold", "20",
                            "--max-backlog", "off,200", "--window", "2", "--concurrency", "1", "--json",
                            "--db", str(tmp_path / "x.duckdb"))
    assert code == 0, err
    off, capped = json.loads(out.strip().splitlines()[-1])["configs"]
    assert [off["label"], capped["label"]] == ["max backlog off", "max backlog 200"]
    assert capped["config"]["max_backlog"] == 200 and off["config"]["max_backlog"] is None
    assert capped["blind_spot_tokens"] < off["blind_spot_tokens"]  # the ceiling keeps the blind spot down


def test_an_experiment_no_configuration_can_run_is_refused_before_it_starts(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    db = tmp_path / "x.duckdb"
    code, _, err = invoke("experiment", "run", "--dataset", str(DEMO), "--observer", "gpt-4o-mini", "--db", str(db))
    assert code == 1 and "no configuration can run here: gpt-4o-mini: missing OPENAI_API_KEY" in err
    assert "Start?" not in err
    with RunStore(db) as store:
        assert store.experiments().empty  # nothing recorded


def test_comparing_a_configuration_with_itself_is_refused(tmp_path) -> None:
    db = str(tmp_path / "x.duckdb")
    code, out, _ = invoke("experiment", "run", "--dataset", str(DEMO), "--observation-threshold", "150,600",
                          "--concurrency", "1", "--json", "--db", db)
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    code, _, err = invoke("experiment", "compare", experiment_id, "--a", "obs 150", "--b", "obs 150", "--db", db)
    assert code == 2 and "name two different configurations" in err  # (a refused option)


def test_workers_are_never_forked_from_a_threaded_process() -> None:
    """The app's Streamlit server runs threads: forking it could deadlock a worker on a lock another
    thread held, so workers then come from a fork server; a single-threaded CLI forks directly."""
    import threading

    from workbench.experiments import _pool_context

    assert _pool_context().get_start_method() == ("fork" if threading.active_count() == 1 else "forkserver")
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert _pool_context().get_start_method() == "forkserver"
    finally:
        release.set()
        other.join()


def test_a_call_the_cost_limit_cancelled_before_it_started_is_not_reported_as_a_warning() -> None:
    """litellm makes its call's coroutine in a thread and awaits it on the loop; cancelled in
    between, that coroutine was never started (nothing sent). Only that message is silenced."""
    import subprocess
    import sys

    script = """
import gc, workbench.experiments
async def acompletion(): pass
acompletion.__qualname__ = "OpenAIChatCompletion.acompletion"
dropped = acompletion(); del dropped; gc.collect()
async def mine(): pass
dropped = mine(); del dropped; gc.collect()
"""
    import os

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "default"})  # (whatever the caller's filters)
    assert done.returncode == 0, done.stderr
    assert "acompletion' was never awaited" not in done.stderr
    assert "coroutine 'mine' was never awaited" in done.stderr  # any other such bug still shows


def test_an_experiment_deleted_while_it_runs_writes_no_more_runs(tmp_path) -> None:
    """Deleted from another session of the app (this process) while its grid runs: the next run's
    write stops the experiment with an error saying so, instead of leaving runs tagged with an
    experiment that no longer exists (listed nowhere)."""
    from omem_core.prompts import BUILTIN_PROMPTS
    from workbench.runstore import RunDeleted

    grid = ex.config_grid(observers=["omem/extractive"], reflectors=["omem/extractive"], observation=[150, 300, 600],
                          reflection=[600], windows=[10], observer_prompts=[BUILTIN_PROMPTS["observer"][0]],
                          reflector_prompts=[BUILTIN_PROMPTS["reflector"][0]])
    with RunStore(tmp_path / "x.duckdb") as store:
        experiment_id = ex.create_experiment(store, dataset=DEMO, grid=grid,
                                             options=ex.ExperimentOptions(concurrency=1))

        def progress(p) -> None:
            if p.done == 1:
                store.delete_experiment(experiment_id)

        with pytest.raises(RunDeleted, match=f"experiment {experiment_id} was deleted"):
            asyncio.run(ex.run_experiment(store, experiment_id, progress=progress))
        assert store.runs().empty and store.experiments().empty


def test_a_long_dataset_path_is_printed_whole(tmp_path) -> None:
    """`experiment show` wraps its header at 100 columns, but never inside a path (it broke one at a
    hyphen, so it could not be copied)."""
    import shutil

    folder = tmp_path / ("a-long-folder-name-" * 5 + "end")
    folder.mkdir()
    dataset = folder / "tiny.jsonl"
    shutil.copy(ROOT / "datasets" / "tiny.jsonl", dataset)
    db = str(tmp_path / "x.duckdb")
    code, out, _ = invoke("experiment", "run", "--dataset", str(dataset), "--concurrency", "1", "--json", "--db", db)
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    code, out, _ = invoke("experiment", "show", experiment_id, "--db", db)
    from workbench.formatting import short_path

    shown = short_path(dataset)  # (relative when shorter: the clone may sit beside pytest's folder)
    assert code == 0 and len(shown) > 100 and shown in out


def test_two_ctrl_cs_stop_an_experiment_at_once_and_it_resumes(tmp_path) -> None:
    """Ctrl-C twice in a terminal (SIGINT to the whole process group, workers included): the
    scheduler used to wait for the workers' runs in flight, and hung for good in the pool's exit
    on the second one. It stops at once, with the experiment interrupted and resumable."""
    import os
    import signal
    import subprocess
    import sys
    import time

    db = tmp_path / "cc.duckdb"
    command = [sys.executable, "-m", "workbench", "experiment", "run", "--dataset", str(DEMO),
               "--observation-threshold", "40,60,80,100,120,140,160,180", "--window", "2",
               "--concurrency", "2", "--no-cache", "--db", str(db)]
    worker = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)  # its own process group, as a terminal's job
    try:
        for line in worker.stderr:
            if line.startswith("[1/8]"):
                break
        os.killpg(worker.pid, signal.SIGINT)
        time.sleep(0.5)
        os.killpg(worker.pid, signal.SIGINT)
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    err = worker.stderr.read()
    assert worker.returncode in (130, -signal.SIGINT), err
    assert "Traceback" not in err and "LoggingWorker" not in err, err
    with RunStore(db) as store:
        [experiment] = store.experiments().to_dict("records")
        assert experiment["status"] == "interrupted" and 0 < experiment["runs"] < 8
    code, _, err = invoke("experiment", "resume", experiment["experiment_id"], "--db", str(db))
    assert code == 0, err
    with RunStore(db) as store:
        assert store.experiments().unfinished_runs.tolist() == [0]


def test_ctrl_c_held_down_stops_an_experiment_quietly_and_ends_its_workers(tmp_path) -> None:
    """Ctrl-C held down (SIGINT every few ms to the whole process group) from the first one until
    the process is gone. Landing in the store's closing or in Python's shutdown, one printed an
    "Exception ignored ... KeyboardInterrupt" traceback; landing while the scheduler ended its
    workers, one left them running for good after it had exited. Neither happens, and the
    experiment is recorded as interrupted and resumes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    db = tmp_path / "cc.duckdb"
    log = tmp_path / "stderr.txt"
    command = [sys.executable, "-m", "workbench", "experiment", "run", "--dataset", str(DEMO),
               "--observation-threshold", "40,60,80,100,120,140,160,180", "--window", "2", "--concurrency", "2",
               "--no-cache", "--db", str(db)]
    with log.open("w") as stderr:  # (a file, not a pipe: workers left behind would hold a pipe open)
        worker = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
                                  start_new_session=True)  # its own process group, as a terminal's job
    group = worker.pid
    try:
        deadline = time.monotonic() + 120
        while "[1/8]" not in log.read_text() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        while worker.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGINT)
            time.sleep(0.002)
        time.sleep(0.5)  # (a killed worker is reaped by init)
        left = []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, 0)
            listing = subprocess.run(["ps", "-o", "stat=,pid=,cmd=", "-g", str(group)], capture_output=True, text=True)
            left = [line for line in listing.stdout.splitlines() if not line.startswith("Z")]  # (zombies: ended)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        worker.wait()
    err = log.read_text()
    assert worker.returncode in (130, -signal.SIGINT), err
    assert "Traceback" not in err and "Exception ignored" not in err and "KeyboardInterrupt" not in err, err
    assert not left, f"worker processes outlived the scheduler: {left}"
    with RunStore(db) as store:
        [experiment] = store.experiments().to_dict("records")
    # What the command said is what the store holds. A first Ctrl-C that lands after the last run
    # was written (a slow poll of the log on a loaded machine) finds the experiment complete: that
    # outcome is accepted only when the command and the store both say so. (One landing while
    # finished runs were written used to let every run finished with it be written, up to the
    # experiment's end: see test_an_experiment_stops_writing_finished_runs_at_the_first_ctrl_c.)
    if experiment["status"] == "completed":
        assert "had completed" in err and experiment["runs"] == 8, err
    else:
        assert experiment["status"] == "interrupted" and "interrupted: finished runs are kept" in err, err
        code, _, out = invoke("experiment", "resume", experiment["experiment_id"], "--db", str(db))
        assert code == 0, out


def test_an_experiment_with_a_deleted_run_says_it_is_missing_and_resume_replays_it(tmp_path) -> None:
    """A run deleted from a completed experiment left it 'completed' with every configuration at
    '0 not completed', and its figures quietly pooled over fewer conversations."""
    from workbench.app_data import summary_table

    db = str(tmp_path / "m.duckdb")
    code, out, _ = invoke("experiment", "run", "--dataset", str(DEMO), "--observation-threshold", "150,600",
                          "--concurrency", "1", "--json", "--db", db)
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    with RunStore(db) as store:
        runs = store.experiment_runs(experiment_id)
        gone = runs[runs.config_label == "obs 600"].run_id.iloc[0]
    assert invoke("delete", gone, "--yes", "--db", db)[0] == 0
    code, out, err = invoke("experiment", "show", experiment_id, "--json", "--db", db)
    data = json.loads(out.strip().splitlines()[-1])
    assert data["status_text"] == "completed; 1 of 2 runs missing" and data["missing_runs"] == 1
    assert [(c["label"], c["runs"], c["missing"]) for c in data["configs"]] == [("obs 150", 1, 0), ("obs 600", 0, 1)]
    code, out, err = invoke("experiment", "show", experiment_id, "--db", db)
    assert "(completed; 1 of 2 runs missing)" in out and "experiment resume" in err
    assert [line.split()[2] for line in out.splitlines()
            if line.startswith("obs ") and " vs " not in line and not line.endswith(":")] == \
        ["1/1", "0/1"]  # done, of the runs planned (a line "obs 150:" heads its breakdown)
    with RunStore(db) as store:
        table = summary_table(ex.summarise(store, experiment_id))
    assert table["not completed"].tolist() == [0, 1]  # the app's table
    code, out, _ = invoke("experiment", "list", "--db", db)  # the list said 'completed' with no word of it
    assert code == 0 and "completed; 1 of 2 runs missing" in out
    with RunStore(db) as store:
        from workbench.app_data import experiments_table

        assert experiments_table(store.experiments())["status"].tolist() == ["completed; 1 of 2 runs missing"]
    assert invoke("experiment", "resume", experiment_id, "--db", db)[0] == 0
    with RunStore(db) as store:
        assert ex.report(store, experiment_id)["status_text"] == "completed"


def test_an_experiment_over_prompt_versions_on_the_offline_model_is_warned_about(tmp_path) -> None:
    """The app warned that the built-in model ignores prompt text; `experiment run` did not."""
    code, out, err = invoke("experiment", "run", "--dataset", str(DEMO), "--observer-prompt", "v1,v2",
                            "--reflector-prompt", "v1,v2", "--concurrency", "1", "--db", str(tmp_path / "m.duckdb"))
    assert code == 0 and "differ in observer and reflector prompt versions, but the built-in offline model" in \
        " ".join(err.split())
    code, out, err = invoke("experiment", "run", "--dataset", str(DEMO), "--observation-threshold", "150,600",
                            "--concurrency", "1", "--db", str(tmp_path / "n.duckdb"))
    assert code == 0 and "ignores prompt text" not in err


def test_a_paid_experiment_asks_first_with_json_too(tmp_path, monkeypatch) -> None:
    """docs/experiments.md: the CLI asks before a paid experiment and `--yes` skips the question;
    `--json` skipped it too, so a scripted paid grid started without a word."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")  # the run must not start at all
    db = tmp_path / "paid.duckdb"
    result = CliRunner().invoke(cli, ["experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"),
                                      "--observer", "openai/gpt-4o-mini", "--reflector", "none", "--json",
                                      "--db", str(db)], input="n\n", catch_exceptions=False)
    assert "Start?" in result.stderr and result.exit_code == 1
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["status"] == "failed" and "--yes" in answer["error"]
    with RunStore(db) as store:
        assert store.experiments().empty


def test_streamlit_stopping_the_script_interrupts_an_experiment_not_fails_it(tmp_path) -> None:
    """Closing the browser tab during an experiment started in the app: Streamlit raises its
    StopException in the script, and the experiment read 'failed' with "StopException: " as
    its reason."""
    from streamlit.runtime.scriptrunner_utils.exceptions import StopException

    def progress(p) -> None:
        if p.done == 1:
            raise StopException()

    with RunStore(tmp_path / "x.duckdb") as store:
        grid = [ReplayConfig(observation_threshold=150, reflection_threshold=300),
                ReplayConfig(observation_threshold=600, reflection_threshold=1200)]
        experiment_id = ex.create_experiment(store, dataset=DEMO, grid=grid,
                                             options=ex.ExperimentOptions(concurrency=1))
        with pytest.raises(StopException):
            asyncio.run(ex.run_experiment(store, experiment_id, progress=progress))
        experiment = store.experiment(experiment_id)
        assert experiment["status"] == "interrupted", experiment["error"]
        assert experiment["error"].startswith("stopped before the end; finish it with")


def test_rows_pooled_over_different_conversations_are_said_not_to_rank(tmp_path) -> None:
    """An experiment with a run missing: one row pooled two conversations, the other one, and the
    table could rank them against the paired verdict printed below it; the HTML export still
    headed them "pooled over every probe of every conversation"."""
    from workbench.export_html import experiment_html

    db = str(tmp_path / "u.duckdb")
    two = [c.id for c in ex.list_conversations(LONGMEMEVAL)][:2]
    code, out, _ = invoke("experiment", "run", "--dataset", str(LONGMEMEVAL), "--conversation", two[0],
                          "--conversation", two[1], "--observation-threshold", "150,600", "--concurrency", "1",
                          "--json", "--db", db)
    data = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and data["uneven_note"] is None  # every configuration on both conversations
    with RunStore(db) as store:
        runs = store.experiment_runs(data["experiment_id"])
        gone = runs[runs.config_label == "obs 600"].run_id.iloc[0]
    assert invoke("delete", gone, "--yes", "--db", db)[0] == 0
    code, out, _ = invoke("experiment", "show", data["experiment_id"], "--db", db)
    assert "cannot be ranked against each other" in " ".join(out.split())
    with RunStore(db) as store:
        assert "cannot be ranked" in ex.report(store, data["experiment_id"])["uneven_note"]
        page = experiment_html(store, data["experiment_id"])
    assert "cannot be ranked" in page and "of every conversation" not in page


def test_a_conversation_named_twice_is_replayed_once_and_an_unknown_one_refused_before_the_plan(tmp_path) -> None:
    """`--conversation X --conversation X` replayed X twice, pooled its probes twice (a narrower
    interval) and then read "completed; 1 of 2 runs missing"; an unknown id was refused only
    after "1 run: 1 conversation × 1 configuration" had been announced."""
    db = str(tmp_path / "d.duckdb")
    first = ex.list_conversations(LONGMEMEVAL)[0].id
    code, out, err = invoke("experiment", "run", "--dataset", str(LONGMEMEVAL), "--conversation", first,
                            "--conversation", first, "--json", "--db", db)
    data = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and data["conversations"] == [first] and data["status_text"] == "completed"
    assert (data["planned_runs"], data["completed_runs"]) == (1, 1) and "1 conversation" in err
    code, out, err = invoke("experiment", "run", "--dataset", str(LONGMEMEVAL), "--conversation", "nope",
                            "--db", db)
    assert code == 2 and "no conversation 'nope'" in err and "--conversation" in err and "1 run" not in err
    # --judge without --answerer: refused as an option (it was exit 1, "judge and answerer go together")
    code, out, err = invoke("experiment", "run", "--dataset", str(LONGMEMEVAL), "--judge", "omem/extractive",
                            "--db", db)
    assert code == 2 and "--judge and --answerer go together: --answerer is the model that answers" in err


@pytest.mark.parametrize("start", ["fork", "forkserver"])  # the CLI's and the app's
def test_workers_end_when_the_scheduler_is_killed(tmp_path, start) -> None:
    """`kill -TERM` (or -9) of `experiment run --concurrency 2` left both workers replaying,
    ~300 MB each, re-parented to init, until killed by hand."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "scheduler.py"
    script.write_text(
        "import multiprocessing, os, sys, time\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from workbench.experiments import _worker_init\n"
        "from workbench.runstore import process_token\n"
        "if __name__ == '__main__':\n"
        "    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(sys.argv[1]),\n"
        "                               initializer=_worker_init, initargs=(os.getpid(), process_token()))\n"
        "    print(pool.submit(os.getpid).result(), flush=True)\n"
        "    pool.submit(time.sleep, 120)\n"
        "    time.sleep(120)\n")
    scheduler = subprocess.Popen([sys.executable, str(script), start], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        worker = int(scheduler.stdout.readline())  # (the scheduler's own sleep bounds this wait)
        os.kill(scheduler.pid, signal.SIGKILL)
        scheduler.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.kill(worker, 0)
                with open(f"/proc/{worker}/stat") as stat:  # (an exited orphan init has not reaped yet)
                    if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except (ProcessLookupError, FileNotFoundError):
                break
            time.sleep(0.1)
        else:
            os.kill(worker, signal.SIGKILL)
            pytest.fail("the worker outlived its scheduler")
    finally:
        scheduler.kill()


@pytest.mark.parametrize("as_json", [False, True])
def test_experiment_run_prints_the_datasets_warnings_once_per_conversation(tmp_path, as_json) -> None:
    """`replay` printed "evidence 'nope' of probe 'q9' points to no message"; `experiment run`
    on the same file printed nothing, so the probe silently counted for less."""
    lines = (ROOT / "datasets" / "tiny.jsonl").read_text().splitlines()
    lines.append(json.dumps({"type": "probe", "conversation_id": "tiny", "id": "q9", "question": "Where?",
                             "answer": "Lisbon", "evidence": ["nope"], "category": "single-hop"}))
    data = tmp_path / "warned.jsonl"
    data.write_text("\n".join(lines) + "\n")
    code, out, err = invoke("experiment", "run", "--dataset", str(data), "--observation-threshold", "150,600",
                            "--concurrency", "1", "--db", str(tmp_path / "w.duckdb"), *(["--json"] if as_json else []))
    assert code == 0, err
    warned = [line for line in err.splitlines() if line.startswith("warning: tiny: ")]
    assert len(warned) == 1 and "'nope'" in warned[0] and "q9" in warned[0]  # once, not per configuration


def test_the_apps_banner_after_an_experiment_mentions_the_datasets_warnings() -> None:
    outcome = ex.ExperimentOutcome("exp-1", "completed", None, 1.0, 2, 0, 0.0,
                                   {"tiny": ["evidence 'nope' of probe 'q9' points to no message"]})
    kind, sentence = ex.outcome_message("exp-1", outcome)
    assert kind == "warning" and "1 warning on 1 conversation" in sentence and "'nope'" in sentence
    # an experiment given a name is called by it (it was named by its id alone)
    assert ex.outcome_message("exp-1", outcome, "thresholds")[1].startswith("thresholds (exp-1) completed: ")
    # no name (the list's NaN): its id alone (Chromium: "nan (exp-…) completed: 64 runs")
    assert ex.outcome_message("exp-1", outcome, float("nan"))[1].startswith("exp-1 completed: ")
    # the cost limit's stop is no failure: a warning, as Resume finishes it (it was red, "…s. the cost limit")
    stopped = ex.ExperimentOutcome("exp-1", "stopped", "the cost limit of $0.0200 was reached", 2.5, 0, 0, 0.03)
    assert ex.outcome_message("exp-1", stopped) == (
        "warning", "exp-1 stopped: 0 runs replayed in 2.5 s. The cost limit of $0.0200 was reached")


def test_an_experiment_on_questions_without_answers_says_retention_cannot_be_scored(tmp_path) -> None:
    """MemoryBank's probes are questions only: an experiment gave 'probes 0' and a dash for
    retention everywhere, with nothing saying why."""
    lines = [line for line in (ROOT / "datasets" / "tiny.jsonl").read_text().splitlines()
             if json.loads(line)["type"] != "probe"]
    lines.append(json.dumps({"type": "probe", "conversation_id": "tiny", "id": "q1", "question": "Dog?",
                             "answer": None, "evidence": ["t1"]}))
    data = tmp_path / "questions.jsonl"
    data.write_text("\n".join(lines) + "\n")
    code, _, err = invoke("experiment", "run", "--dataset", str(data), "--db", str(tmp_path / "q.duckdb"))
    assert code == 0 and "warning: retention cannot be scored on 1 conversation here: its 1 probe has no" in err
    code, _, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"),
                          "--db", str(tmp_path / "t.duckdb"))
    assert code == 0 and "cannot be scored" not in err


def test_a_ctrl_c_under_json_still_ends_stdout_with_one_json_object(tmp_path) -> None:
    """README: with --json the last stdout line is one JSON object, a failure's too; a Ctrl-C
    left stdout empty (exit 130)."""
    import signal
    import subprocess
    import sys
    import time

    db = tmp_path / "j.duckdb"
    log = tmp_path / "stderr.txt"
    command = [sys.executable, "-m", "workbench", "experiment", "run", "--dataset", str(DEMO),
               "--observation-threshold", ",".join(str(n) for n in range(40, 400, 10)), "--window", "2",
               "--concurrency", "1", "--no-cache", "--json", "--db", str(db)]
    with log.open("w") as stderr:
        worker = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
    deadline = time.monotonic() + 120
    while "experiment exp-" not in log.read_text() and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    worker.send_signal(signal.SIGINT)
    out, _ = worker.communicate(timeout=120)
    answer = json.loads(out.strip().splitlines()[-1])
    assert worker.returncode == 130, (worker.returncode, log.read_text())  # 36 runs: not all done in 0.5 s
    assert answer["status"] == "interrupted" and answer["experiment_id"].startswith("exp-")
    assert "experiment resume" in answer["error"]


def test_a_configuration_can_be_named_without_the_separator_or_by_its_number() -> None:
    """`experiment compare --a "obs 300 ref 1000"` was refused: only the exact label with its
    U+00B7 separators was accepted."""
    names = ["obs 300 · ref 1000", "obs 300 · ref 4000", "obs 1000 · ref 1000"]
    assert ex.resolve_label(names, "obs 300 ref 1000", "exp-1") == "obs 300 · ref 1000"
    assert ex.resolve_label(names, "OBS 1000  ·  REF 1000", "exp-1") == "obs 1000 · ref 1000"
    assert ex.resolve_label(names, "2", "exp-1") == "obs 300 · ref 4000"
    with pytest.raises(ex.ExperimentError, match=r"no configuration '4' in exp-1; it has \(number, label\): "
                                                 r"1 obs 300 · ref 1000, 2 obs 300 · ref 4000"):
        ex.resolve_label(names, "4", "exp-1")


def test_an_unanswered_start_question_under_json_ends_stdout_with_json(tmp_path, monkeypatch) -> None:
    """`< /dev/null`: click's prompt aborted and stdout stayed empty; a model whose price
    litellm does not know started without the question at all."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    for model in ("openai/gpt-4o-mini", "openai/omem-no-such-price-model"):
        db = tmp_path / f"{model.split('/')[1]}.duckdb"
        result = CliRunner().invoke(cli, ["experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"),
                                          "--observer", model, "--reflector", "none", "--json", "--db", str(db)],
                                    input="", catch_exceptions=False)
        assert "Start?" in result.stderr and result.exit_code == 1, (model, result.stderr)
        answer = json.loads(result.stdout.strip().splitlines()[-1])
        assert answer["status"] == "failed" and "--yes" in answer["error"]
        with RunStore(db) as store:
            assert store.experiments().empty


def test_configuration_names_that_are_ambiguous_or_odd_digits_get_clear_errors() -> None:
    names = ["obs 300 · ref 1000", "OBS 300 · REF 1000", "obs 500"]
    with pytest.raises(ex.ExperimentError, match="matches 2 configurations"):
        ex.resolve_label(names, "obs 300 ref 1000", "exp-1")
    with pytest.raises(ex.ExperimentError, match="no configuration '²'"):  # "²".isdigit(): int() raised
        ex.resolve_label(names, "²", "exp-1")
    assert ex.resolve_label(names, " 3 ", "exp-1") == "obs 500"


def test_the_unscored_warning_reads_right_for_several_conversations() -> None:
    from workbench.datasets.base import ConversationInfo

    infos = [ConversationInfo(f"c{i}", 10, 2, 0, 100, "omem") for i in range(2)]
    assert ex.unscored_warning(infos).startswith("retention cannot be scored on 2 conversations here: their 4 "
                                                 "probes have no gold answer")
    assert ex.unscored_warning([ConversationInfo("c", 10, 2, 1, 100, "omem"), *infos]) is None


def test_figures_per_conversation_show_the_spread_the_pooled_interval_does_not(tmp_path) -> None:
    """The pooled interval resamples probes, so with few conversations it is narrower than the
    spread between them (LoCoMo dev: 0.704 [0.676, 0.733] pooled, 0.658 to 0.836 by conversation):
    `experiment show` printed no figure per conversation, in text or JSON, although the stats
    module pointed readers to them."""
    db = str(tmp_path / "x.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(LONGMEMEVAL), "--observation-threshold", "20,40",
                            "--reflection-threshold", "60", "--window", "2", "--json", "--db", db)
    assert code == 0, err
    data = json.loads(out.strip().splitlines()[-1])
    rows = data["per_conversation"]
    assert [(r["label"], r["conversation_id"]) for r in rows] == [
        (c["label"], conversation) for c in data["configs"] for conversation in data["conversations"]]
    with RunStore(db) as store:
        probes = store.experiment_probes(data["experiment_id"])
        runs = store.experiment_runs(data["experiment_id"])
    memory = probes[(probes.method == "memory") & probes.score.notna()]
    for row in rows:
        mine = memory[(memory.config_label == row["label"]) & (memory.conversation_id == row["conversation_id"])]
        [run] = runs[(runs.config_label == row["label"]) & (runs.conversation_id == row["conversation_id"])].itertuples()
        assert row["status"] == "completed" and row["probes"] == len(mine)
        assert row["retention"] == (pytest.approx(mine.score.mean()) if len(mine) else None)
        assert row["compression"] == pytest.approx(run.full_history_tokens / run.final_context_tokens)
    for c in data["configs"]:  # the conversations' probes are the pooled ones
        assert sum(r["probes"] for r in rows if r["label"] == c["label"]) == c["probes"]
    [comparison] = data["comparisons"]
    by = {(r["label"], r["conversation_id"]): r["retention"] for r in rows}
    scored = [c for c in data["conversations"] if by[("obs 20", c)] is not None and by[("obs 40", c)] is not None]
    assert sum(comparison["conversations"].values()) == len(scored) >= 2
    assert comparison["conversations"]["a_higher"] == sum(by[("obs 20", c)] > by[("obs 40", c)] + 0.0005 for c in scored)
    assert comparison["conversations"] == ex.conversation_tally(probes, "obs 20", "obs 40")
    code, out, _ = invoke("experiment", "show", data["experiment_id"], "--db", db)
    text = " ".join(out.split())
    assert code == 0 and text.count("by conversation") == 3  # each configuration, and the comparison
    first = next(r for r in rows if r["label"] == "obs 20" and r["retention"] is not None)
    assert f"{first['conversation_id']} {first['retention']:.3f} ({first['probes']} probe" in text
    assert f"by conversation ({len(scored)} scored by both)" in text
    code, out, _ = invoke("experiment", "compare", data["experiment_id"], "--db", db)
    assert code == 0 and f"by conversation ({len(scored)} scored by both)" in " ".join(out.split())
    from workbench.export_html import experiment_html  # and the stakeholders' export

    with RunStore(db) as store:
        page = experiment_html(store, data["experiment_id"])
    assert "Retention per conversation" in page and f"by conversation ({len(scored)} scored by both)" in page
    assert f">{first['retention']:.3f}<" in page  # a cell of the table


def test_experiment_compare_sets_the_two_configurations_figures_side_by_side(tmp_path) -> None:
    """`experiment compare` printed the retention difference only ("Print JSON instead of a
    table" said its --help): compression, cost and the blind spot, what a threshold trades
    retention for, were in `show` only. Both rows are on the conversations both completed, as the
    paired difference is."""
    db = str(tmp_path / "x.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(LONGMEMEVAL), "--observation-threshold", "20,40",
                            "--reflection-threshold", "60", "--window", "2", "--json", "--db", db)
    assert code == 0, err
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    with RunStore(db) as store:
        runs = store.experiment_runs(experiment_id)
        conversations = list(dict.fromkeys(runs.conversation_id))
        assert len(conversations) >= 3
        dropped = runs[(runs.config_label == "obs 40") & (runs.conversation_id == conversations[0])].run_id.iloc[0]
        store.delete_run(dropped)  # obs 40 now lacks a conversation obs 20 completed
        runs = store.experiment_runs(experiment_id)
        probes = store.experiment_probes(experiment_id)
    code, raw, err = invoke("experiment", "compare", experiment_id, "--json", "--db", db)
    assert code == 0, err
    data = json.loads(raw.strip().splitlines()[-1])
    shared = conversations[1:]
    assert data["shared_conversations"] == shared
    rows = {row["label"]: row for row in data["configs"]}
    assert list(rows) == ["obs 20", "obs 40"]
    for label, row in rows.items():
        done = runs[(runs.config_label == label) & (runs.status == "completed") & runs.conversation_id.isin(shared)]
        mine = probes[(probes.config_label == label) & (probes.method == "memory") & probes.score.notna()
                      & probes.conversation_id.isin(shared)]
        assert row["runs"] == len(shared) and row["probes"] == len(mine)
        assert row["retention"] == pytest.approx(mine.score.mean())
        assert row["compression"] == pytest.approx(done.full_history_tokens.sum() / done.final_context_tokens.sum())
        assert row["observer_calls"] == done.observer_calls.sum()
    code, out, err = invoke("experiment", "compare", experiment_id, "--db", db)
    assert code == 0, err
    text = " ".join(out.split())
    assert f"obs 20 completed {len(conversations)} and obs 40 {len(shared)} of the experiment's {len(conversations)} " \
           f"conversations: both rows are on the {len(shared)} both completed" in text
    header = next(line for line in out.splitlines() if line.startswith("configuration"))
    assert header.split()[:5] == ["configuration", "done", "probes", "retention", "95%"] and "compr" in header
    for label, row in rows.items():
        [line] = [line for line in out.splitlines() if line.startswith(label + " ") and " vs " not in line]
        assert f"{row['retention']:.3f}" in line and f"{row['compression']:.1f}x" in line
        assert line.split()[2] == f"{len(shared)}/{len(shared)}"
    assert "obs 20 vs obs 40 on" in text  # the paired difference, below the rows


def test_experiment_compare_says_the_offline_model_ignores_the_prompts_it_compares(tmp_path) -> None:
    """The app's Compare page said that two prompt versions on the offline model compare nothing;
    `experiment compare` printed "no detectable difference" as a finding."""
    db = str(tmp_path / "x.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(DEMO), "--observation-threshold", "150",
                            "--observer-prompt", "v1,v2", "--concurrency", "1", "--json", "--db", db)
    assert code == 0, err
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    code, _, err = invoke("experiment", "compare", experiment_id, "--db", db)
    assert code == 0 and "note: they differ in observer prompt versions, which the built-in offline model " \
                         "ignores" in " ".join(err.split())


def test_the_tally_by_conversation_pairs_the_probes_both_scored() -> None:
    """With windows of different sizes the configurations score different probes (those whose
    evidence is still in the larger window are not scored): the tally compared each one's own
    mean, and said A higher where, on the probes both scored, B was (review)."""
    import pandas as pd

    rows = []
    for conversation, a_scores, b_scores in (
            ("c1", {"p1": 0.5, "p2": 0.5, "p3": 1.0}, {"p1": 0.6, "p2": 0.6}),  # A's own mean is higher (p3)
            ("c2", {"p1": 1.0, "p2": 0.0}, {"p1": 1.0, "p2": 0.0}),
            ("c3", {"p1": 0.9}, {"p1": 0.2, "p2": 1.0})):
        for label, scores in (("A", a_scores), ("B", b_scores)):
            rows += [{"config_label": label, "conversation_id": conversation, "probe_id": probe, "method": "memory",
                      "score": score} for probe, score in scores.items()]
            rows.append({"config_label": label, "conversation_id": conversation, "probe_id": "px",
                         "method": "recent_tokens", "score": 1.0})  # another method: not counted
    probes = pd.DataFrame(rows)
    assert ex.conversation_tally(probes, "A", "B") == {"a_higher": 1, "b_higher": 1, "equal": 1}
    assert ex.conversation_tally(probes, "B", "A") == {"a_higher": 1, "b_higher": 1, "equal": 1}
    assert ex.tally_text("A", "B", {"a_higher": 1, "b_higher": 1, "equal": 1}) == \
        "; by conversation (3 scored by both): A higher on 1, B higher on 1, equal on 1"
    assert ex.conversation_tally(probes.iloc[0:0], "A", "B") == {"a_higher": 0, "b_higher": 0, "equal": 0}


def test_the_per_conversation_table_says_when_configurations_scored_different_probes() -> None:
    from workbench.app_data import conversation_numbers

    def row(label, conversation, probes, retention, status="completed"):
        return {"label": label, "conversation_id": conversation, "status": status, "probes": probes,
                "retention": retention, "compression": 5.0}

    same = conversation_numbers([row("w4", "c1", 10, 0.5), row("w40", "c1", 10, 0.6), row("w4", "c2", 3, 0.1),
                                 row("w40", "c2", 0, None, "failed"), row("w4", "c3", 0, None, "running"),
                                 row("w40", "c3", 0, None, "missing")])
    assert same.columns.tolist() == ["conversation", "probes scored", "w4", "w40"]
    # (a conversation no run completed yet: no count — "0" read as a conversation without questions)
    assert same["probes scored"].tolist()[:2] == [10, 3] and pd.isna(same["probes scored"][2])
    differ = conversation_numbers([row("w4", "c1", 12, 0.5), row("w40", "c1", 10, 0.6)])
    assert differ.columns.tolist() == ["conversation", "probes scored (most)", "w4", "w40"]
    assert differ["probes scored (most)"].tolist() == [12]


def test_an_experiment_is_not_resumed_on_a_dataset_edited_since_its_runs(tmp_path) -> None:
    """Its runs left would replay the new file and be pooled with runs of the old one."""
    data = tmp_path / "tiny.jsonl"
    original = (ROOT / "datasets" / "tiny.jsonl").read_text(encoding="utf-8")
    data.write_text(original, encoding="utf-8")
    db = str(tmp_path / "x.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(data), "--observation-threshold", "30,60",
                            "--window", "2", "--concurrency", "1", "--json", "--db", db)
    assert code == 0, err
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    with RunStore(db) as store:
        kept, gone = store.experiment_runs(experiment_id).run_id
        store.delete_run(gone)  # one run left to replay
        store.finish_experiment(experiment_id, "interrupted", "stopped for the test", 0.0)
    data.write_text(original.replace("puzzle toys", "chew toys"), encoding="utf-8")
    code, out, err = invoke("experiment", "resume", experiment_id, "--json", "--db", db)
    assert code == 1 and json.loads(out.strip().splitlines()[-1])["status"] == "failed"
    assert (f"experiment {experiment_id} cannot be resumed: conversation 'tiny' changed in {data} since this "
            "experiment replayed it (its message 3 ('t3') has another text than the run recorded)") in err
    assert "start a new experiment" in err and "left to replay" not in err  # refused before the plan
    with RunStore(db) as store:
        with pytest.raises(ex.ExperimentError, match="cannot be resumed"):  # the app's Resume too
            asyncio.run(ex.run_experiment(store, experiment_id))
        assert list(store.experiment_runs(experiment_id).run_id) == [kept]
        assert store.experiment(experiment_id)["status"] == "interrupted"
    data.write_text(original, encoding="utf-8")
    code, out, err = invoke("experiment", "resume", experiment_id, "--json", "--db", db)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["status"] == "completed", err


def test_an_error_quoting_half_a_character_is_recorded_not_lost(tmp_path) -> None:
    """An experiment that failed on a lone surrogate was left "failed" with no reason: the write of
    its error, which quoted the character, failed as well."""
    with RunStore(tmp_path / "x.duckdb") as store:
        experiment_id = ex.create_experiment(store, dataset=DEMO, grid=[ReplayConfig()],
                                             options=ex.ExperimentOptions(concurrency=1))
        store.finish_experiment(experiment_id, "failed", "InvalidInputException: 'bad \ud800 x'", 0.0)
        assert store.experiment(experiment_id)["error"] == "InvalidInputException: 'bad \ufffd x'"


def test_a_resume_compares_every_conversation_and_a_run_that_recorded_nothing_is_not_a_change(tmp_path,
                                                                                               monkeypatch) -> None:
    """Review: one conversation gone from the file stopped the comparison of the others; a run
    refused up front (no message recorded) read as "the dataset changed (0 messages recorded)"."""
    from workbench.datasets import load_conversation
    from workbench.replay import resume_refusal

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    tiny = (ROOT / "datasets" / "tiny.jsonl").read_text(encoding="utf-8")
    data = tmp_path / "two.jsonl"
    data.write_text(tiny.replace('"tiny"', '"a"') + tiny.replace('"tiny"', '"b"'), encoding="utf-8")
    db = str(tmp_path / "x.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(data), "--observer", "omem/extractive,gpt-4o-mini",
                            "--window", "2", "--observation-threshold", "30", "--concurrency", "1", "--json",
                            "--db", db)
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    with RunStore(db) as store:
        runs = store.experiment_runs(experiment_id)
        refused = runs[runs.status == "failed"].run_id.iloc[0]
        assert store.messages(refused).empty
        assert resume_refusal(load_conversation(data, "a"), store, refused) is None
        data.write_text(tiny.replace('"tiny"', '"b"').replace("puzzle toys", "chew toys"), encoding="utf-8")
        said = ex.dataset_changed(store, experiment_id)
    assert said is not None and said.startswith("conversation 'b' changed in")


def test_a_stop_raised_in_several_runs_at_once_is_not_logged_as_never_retrieved(tmp_path, scripted, caplog) -> None:
    """Streamlit stops a script by raising in it: with runs in flight side by side, each one's
    progress report raised, and asyncio logged "Task exception was never retrieved" per run."""
    import gc
    import logging

    class Stop(BaseException):
        pass

    def progress(report: ex.Progress) -> None:
        if not report.finished:
            raise Stop()

    scripted.delay = 0.05
    with RunStore(tmp_path / "x.duckdb") as store:
        grid = [ReplayConfig(observer="scripted/model", reflector=None, observation_threshold=o)
                for o in (100, 200, 300)]
        experiment_id = ex.create_experiment(store, dataset=DEMO, grid=grid, options=ex.ExperimentOptions(concurrency=3))
        with caplog.at_level(logging.ERROR, logger="asyncio"), pytest.raises(Stop):
            asyncio.run(ex.run_experiment(store, experiment_id, progress=progress))
        gc.collect()
        assert store.experiment(experiment_id)["status"] == "interrupted"
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()], caplog.text


BACKGROUND_EXIT = '''
import sys, time
from workbench import background
from workbench.experiments import ExperimentOptions, config_grid, create_experiment
from workbench.runstore import RunStore
from omem_core.prompts import BUILTIN_PROMPTS

if __name__ == "__main__":  # (the worker processes import this module)
    store = RunStore(sys.argv[1])
    grid = config_grid(observers=["omem/extractive"], reflectors=["omem/extractive"],
                       observation=list(range(100, 2100, 100)), reflection=[600], windows=[4],
                       observer_prompts=[BUILTIN_PROMPTS["observer"][0]],
                       reflector_prompts=[BUILTIN_PROMPTS["reflector"][0]], max_backlogs=[None])
    experiment_id = create_experiment(store, dataset=sys.argv[2], grid=grid, options=ExperimentOptions(concurrency=2))
    background.start(store, experiment_id)
    while background.job(experiment_id).progress is None:  # (under way, its worker processes up)
        time.sleep(0.1)
    print(experiment_id, flush=True)
'''


def test_the_process_exit_stops_an_experiment_running_in_the_background(tmp_path) -> None:
    """Review: an app server stopped mid-experiment either waited for the process pool's queued
    runs (minutes) or was aborted mid-write ("terminate called … FATAL: exception not rethrown"):
    the exit now stops it as Stop does, recorded interrupted, what finished kept."""
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(BACKGROUND_EXIT)
    db = tmp_path / "x.duckdb"
    done = subprocess.run([sys.executable, str(script), str(db), str(ROOT / "datasets" / "demo.jsonl")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FATAL" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    experiment_id = done.stdout.split()[0]
    with RunStore(db) as store:
        experiment = store.experiment(experiment_id)
        assert experiment["status"] == "interrupted" and len(store.experiment_runs(experiment_id)) < 20


HALF_SENT = """
import os, struct, sys, threading, time
from pathlib import Path
from workbench import background
from workbench import experiments as ex

REAL, FLAG = ex._replay_one, Path(sys.argv[2])  # (the workers get the same sys.argv)


def half_sent(*args, **kwargs):
    # The first run is killed half-way through sending its result, as a Stop can land: a run's
    # payload (67-210 KB for the demo) outgrows a pipe's buffer and is sent in several writes.
    results = sys._getframe(1).f_locals["result_queue"]  # (concurrent.futures.process._process_worker)
    with results._wlock:  # (as SimpleQueue.put)
        if FLAG.exists():
            return REAL(*args, **kwargs)
        os.write(results._writer.fileno(), struct.pack("!i", 1 << 20) + b"x" * 1000)
        FLAG.write_text(str(os.getpid()))
        time.sleep(600)


def script():  # in a thread, as Streamlit runs a page: Start, Stop, Resume, Stop
    from omem_core.prompts import BUILTIN_PROMPTS
    from workbench.runstore import RunStore

    store = RunStore(sys.argv[1])
    grid = ex.config_grid(observers=["omem/extractive"], reflectors=["omem/extractive"],
                          observation=[150, 300, 600, 1200], reflection=[600], windows=[10],
                          observer_prompts=[BUILTIN_PROMPTS["observer"][0]],
                          reflector_prompts=[BUILTIN_PROMPTS["reflector"][0]], max_backlogs=[None])
    xid = ex.create_experiment(store, dataset=sys.argv[3], grid=grid, options=ex.ExperimentOptions(concurrency=2))
    background.start(store, xid)
    while not FLAG.exists():
        time.sleep(0.05)
    time.sleep(0.5)  # (the pool's manager thread has read the start of the message)
    background.stop(xid)
    background.wait(xid)
    background.start(store, xid)
    for _ in range(1200):  # (a minute at most: a resume that fails before its first report is stopped too)
        if background.job(xid).progress is not None:
            break
        time.sleep(0.05)
    background.stop(xid)
    background.wait(xid)
    print(xid, flush=True)


if __name__ == "__main__":  # (the worker processes import this module)
    ex._replay_one = half_sent  # (pickled by reference: __main__.half_sent in the workers)
    runner = threading.Thread(target=script, name="ScriptRunner.scriptThread")
    runner.start()
    runner.join()
"""


def test_a_stop_that_kills_a_worker_half_way_through_sending_a_run_lets_the_process_exit(tmp_path) -> None:
    """Review: after a Stop (then Resume) in the app, the server no longer exited on SIGTERM or
    Ctrl-C: a worker killed half-way through sending its run left the process pool's manager
    thread reading the rest of the message for ever (this process held the pipe's write end too),
    and the interpreter's exit joins that thread. The pool now ends, and so does the process."""
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "half_sent.py"
    script.write_text(HALF_SENT)
    db = tmp_path / "x.duckdb"
    process = subprocess.Popen([sys.executable, str(script), str(db), str(tmp_path / "flag"),
                                str(ROOT / "datasets" / "demo.jsonl")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    try:
        out, err = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # (its fork server and workers too)
        out, err = process.communicate()
        pytest.fail(f"the process did not exit after Stop, Resume, Stop: {out[-500:]} {err[-2000:]}")
    assert process.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "never retrieved" not in err, err[-3000:]
    with RunStore(db) as store:
        assert store.experiment(out.split()[0])["status"] in ("interrupted", "completed")  # (the Resume may end first)


def test_an_experiment_whose_end_cannot_be_written_does_not_stay_running_in_a_long_lived_process(tmp_path) -> None:
    """When the file was held by another process past the wait as the experiment's end was
    written, it stayed 'running' under its own process: in the app (one process for hours) it read
    as running until a restart, and Resume said it was already running. The end is written at the
    store's next open of the file, once it is free: what finished kept, its elapsed time too."""
    from conftest import held_by_another_process
    from workbench.runstore import RunStoreLocked

    db = tmp_path / "x.duckdb"
    store = RunStore(db, wait_s=0.3)
    grid = [ReplayConfig(observation_threshold=150, reflection_threshold=300),
            ReplayConfig(observation_threshold=600, reflection_threshold=1200)]
    experiment_id = ex.create_experiment(store, dataset=DEMO, grid=grid, options=ex.ExperimentOptions(concurrency=1))
    holding = contextlib.ExitStack()

    def progress(p: ex.Progress) -> None:
        if p.finished and p.done == p.total:  # the last run is written: its end is next
            holding.enter_context(held_by_another_process(db))

    with holding, pytest.raises(RunStoreLocked):
        asyncio.run(ex.run_experiment(store, experiment_id, progress=progress))
    # The file is free again; a store the app opened since (its cache cleared: "Try the file again")
    # writes the end too (one kept on the store whose write failed was never written by another).
    del store
    again = RunStore(db)
    experiment = again.experiment(experiment_id)
    assert experiment["status"] == "completed" and experiment["elapsed_s"] > 0
    assert set(again.experiment_runs(experiment_id).status) == {"completed"}
    assert asyncio.run(ex.run_experiment(again, experiment_id)).status == "completed"  # (not "already running")


def test_a_resume_of_an_experiment_that_spent_its_limit_is_refused_before_any_call(scripted, tmp_path) -> None:
    """Resumed with the limit it had spent, an experiment stopped by its cost limit made a paid
    call, spent more, and stopped again ("resume --help" says it needs a higher one). Refused
    before any call now, with the command that raises the limit; a higher limit resumes it."""
    db = tmp_path / "x.duckdb"
    with priced_scripted_model() as model:  # $0.025 a call
        code, out, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"), "--observer",
                                model, "--reflector", "none", "--observation-threshold", "30", "--window", "2",
                                "--concurrency", "1", "--no-cache", "--max-cost", "0.03", "--yes", "--json",
                                "--db", str(db))
        stopped = json.loads(out.strip().splitlines()[-1])
        assert stopped["status"] == "stopped", err
        calls = len(scripted.calls)
        for extra in ((), ("--max-cost", "0.04")):  # (0.04: still spent, past 0.05)
            code, out, err = invoke("experiment", "resume", stopped["experiment_id"], *extra, "--yes", "--db", str(db))
            assert code == 1 and len(scripted.calls) == calls
            assert "has spent $0.0500 of its $0.0" in err and "--max-cost 0.08 " in err
        with RunStore(str(db)) as store:
            assert store.experiment(stopped["experiment_id"])["status"] == "stopped"  # (untouched)
        code, out, err = invoke("experiment", "resume", stopped["experiment_id"], "--max-cost", "10", "--yes",
                                "--db", str(db))
        assert code == 0, err
        assert len(scripted.calls) > calls
        with RunStore(str(db)) as store:  # the app's Resume, on the limit it spent: refused, as the CLI's
            code, out, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"),
                                    "--observer", model, "--reflector", "none", "--observation-threshold", "30",
                                    "--window", "2", "--concurrency", "1", "--no-cache", "--max-cost", "0.03",
                                    "--yes", "--json", "--db", str(db))
        again = json.loads(out.strip().splitlines()[-1])["experiment_id"]
        with RunStore(str(db)) as store, pytest.raises(ex.ExperimentError, match="give it a higher limit"):
            asyncio.run(ex.run_experiment(store, again))


def test_experiment_show_names_the_experiment(tmp_path) -> None:
    """Found by a walkthrough: `experiment show` printed the id and never the name it was run under."""
    db = str(tmp_path / "named.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"),
                            "--name", "shorter windows", "--window", "2", "--concurrency", "1", "--json", "--db", db)
    assert code == 0, err
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    code, out, err = invoke("experiment", "show", experiment_id, "--db", db)
    assert code == 0, err
    assert out.startswith(f"experiment {experiment_id} 'shorter windows' (completed")


def test_the_probe_footnote_names_only_the_reasons_that_apply(tmp_path) -> None:
    """Found by a walkthrough: on MemoryBank (no gold answers) it said "the others' evidence was
    still in the final window" when there were no others."""
    db = str(tmp_path / "foot.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(ROOT / "datasets" / "tiny.jsonl"),
                            "--concurrency", "1", "--db", db)  # window 10: two probes' evidence stays in it
    assert code == 0, err
    assert "probes: those scored, of 3 probes the conversations ask (2 whose evidence was still in the final window)" \
        in " ".join(out.split())
