"""Readable pages: the unfinished-experiment banner, tables' key columns first, charts that fit a
narrow page and labels that keep off the markers, one-value colour bars, repeated sweeps."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from apptest import action, app

from workbench import app_data, charts
from workbench.replay import ReplayConfig
from workbench.runstore import RunStore


# -- the unfinished experiment's banner ------------------------------------------------------------

def test_banner_is_sentences_and_points_to_the_resume_button() -> None:
    error = ("the process that ran it (pid 3988) stopped; finish it with: python -m workbench experiment "
             "resume exp-1")
    prefix, detail, suffix = app_data.unfinished_banner("exp-1", "interrupted", 12, 90, error, resumable=True)
    assert prefix == "**This experiment was interrupted** (12 of 90 runs completed). "
    assert detail == "The process that ran it (pid 3988) stopped."  # capital after the full stop
    assert "finish it with" not in detail and "python -m" not in detail
    assert suffix.startswith(" To finish it, press **Resume** below")
    assert "`python -m workbench experiment resume exp-1`" in suffix  # the command second
    # The other stored reasons read as sentences too; a read-only store offers no button.
    for stored, sentence in (("stopped before the end; finish it with: python -m workbench experiment resume x",
                              "Stopped before the end."),
                             ("the cost limit of $1.0000 was reached ($1.2000 spent); finish it with: "
                              "python -m workbench experiment resume x",
                              "The cost limit of $1.0000 was reached ($1.2000 spent)."),
                             ("no run completed (each configuration's error is listed with it)",
                              "No run completed (each configuration's error is listed with it)."),
                             (None, ""), ("", "")):
        _, detail, suffix = app_data.unfinished_banner("x", "stopped", 0, 2, stored, resumable=False)
        assert detail == sentence and suffix == ""
    # The app's run store named, so the command works pasted in a terminal (a path with a backtick fenced)
    suffix = app_data.unfinished_banner("exp-1", "interrupted", 1, 2, "", resumable=True, db="/data/my runs.duckdb")[2]
    assert "`python -m workbench experiment resume exp-1 --db '/data/my runs.duckdb'`" in suffix
    suffix = app_data.unfinished_banner("exp-1", "interrupted", 1, 2, "", resumable=True, db="/d/a`b.duckdb")[2]
    assert "``python -m workbench experiment resume exp-1 --db '/d/a`b.duckdb'``" in suffix
    # An id is never Markdown.
    assert "*" not in app_data.unfinished_banner("a*b`c", "failed", 0, 1, "", resumable=True)[2].split("`")[1]


def test_the_experiments_page_banner_reads_right(db: Path) -> None:
    from omem_core.prompts import BUILTIN_PROMPTS
    from workbench.experiments import ExperimentOptions, config_grid, create_experiment

    grid = config_grid(observers=["omem/extractive"], reflectors=["omem/extractive"], observation=[150],
                       reflection=[600], windows=[10], observer_prompts=[BUILTIN_PROMPTS["observer"][0]],
                       reflector_prompts=[BUILTIN_PROMPTS["reflector"][0]], max_backlogs=[None])
    demo = Path(__file__).resolve().parents[1] / "datasets" / "demo.jsonl"
    with RunStore(db) as s:
        experiment_id = create_experiment(s, dataset=demo, grid=grid, options=ExperimentOptions(concurrency=1))
        s.finish_experiment(experiment_id, "interrupted", "stopped before the end; finish it with: python -m "
                            f"workbench experiment resume {experiment_id}", 0.0)
    at = app("experiments")
    [banner] = [e.value.replace("\\", "") for e in at.warning if "This experiment was interrupted" in e.value]
    assert ". Stopped before the end. To finish it, press **Resume** below" in banner, banner
    assert ". stopped" not in banner and "finish it with:" not in banner
    assert not action(at, "xp_resume").disabled


# -- tables: what people compare by comes first ----------------------------------------------------

def test_key_figures_come_first() -> None:
    columns = ["configuration", "completed", "not completed", "probes", "retention", "95% CI", "compression",
               "vs recency", "blind-spot tokens", "observer calls", "reflector calls", "tokens in", "tokens out",
               "cost", "ms per call"]
    order = app_data.key_first(columns, app_data.SUMMARY_FIRST)
    assert order[:7] == ["configuration", "retention", "95% CI", "compression", "cost", "observer calls",
                         "reflector calls"]
    assert sorted(order) == sorted(columns)  # nothing lost, nothing added
    assert app_data.key_first(["b", "a"], ("a", "missing")) == ["a", "b"]


# -- charts ------------------------------------------------------------------------------------------

def _steps(backlog: list[int], unreflected: list[int], observed: list[bool], reflected: list[bool]) -> pd.DataFrame:
    n = len(backlog)
    return pd.DataFrame({"step": list(range(n)), "backlog_tokens": backlog, "unreflected_tokens": unreflected,
                         "observed": observed, "reflected": reflected})


def test_threshold_labels_keep_off_the_pass_markers() -> None:
    # A pass marker sits just over the line it crossed: labels go under their lines (over it, they
    # hid the markers at 900 px), at the end with fewer markers in the label's box.
    n = 40
    backlog = [160 if i >= 20 and i % 2 == 0 else 50 for i in range(n)]
    steps = _steps(backlog, [0] * n, [b > 150 for b in backlog], [False] * n)
    figure = charts.thresholds_chart(steps, 150, 2000)
    labels = {a.text: a for a in figure.layout.annotations if "threshold" in a.text}
    assert labels["observation threshold 150"].yanchor == "top"  # under its line, clear of the markers over it
    assert labels["observation threshold 150"].xanchor == "right"
    assert labels["observation threshold 150"].bgcolor  # readable where it cannot avoid a marker
    # Markers just under a line (observe passes under the reflection threshold, in the right part
    # of the chart only): that label takes the left end.
    high = [1950 if i >= 20 and i % 2 == 0 else 50 for i in range(n)]
    steps = _steps(high, [0] * n, [b > 300 for b in high], [False] * n)
    labels = {a.text: a for a in charts.thresholds_chart(steps, 300, 2000).layout.annotations
              if "threshold" in a.text}
    assert (labels["reflection threshold 2000"].yanchor, labels["reflection threshold 2000"].xanchor) == ("top", "left")
    # No marker near the line: the right end, as before.
    quiet = _steps([10] * n, [0] * n, [False] * n, [False] * n)
    assert {a.text: a.xanchor for a in charts.thresholds_chart(quiet, 150, 2000).layout.annotations
            if "threshold" in a.text} == {"observation threshold 150": "right", "reflection threshold 2000": "right"}


def test_label_side_counts_markers_in_the_label_box() -> None:
    passes = pd.DataFrame({"step": [90, 95, 5], "tokens": [105, 108, 300]})
    assert charts.label_side("observation threshold 100", 100, True, passes, (0, 100), 1000) == "left"
    assert charts.label_side("observation threshold 100", 100, False, passes, (0, 100), 1000) == "right"
    assert charts.label_side("x", 100, True, passes.iloc[:0], (0, 100), 1000) == "right"
    # The current step's dotted line (the last step, where the explorer opens) crossed the labels at
    # the right end: they take the left one, unless the step is there too.
    assert charts.label_side("observation threshold 100", 100, False, passes, (0, 100), 1000, step=100) == "left"
    assert charts.label_side("observation threshold 100", 100, False, passes, (0, 100), 1000, step=2) == "right"
    assert charts.label_side("observation threshold 100", 100, False, passes, (0, 100), 1000, step=50) == "right"


def test_funnel_labels_wrap_level_and_counts_do_not_pile_up() -> None:
    stages = ["evidence said", "observed with the answer", "survived reflection", "visible at the end"]
    many = pd.DataFrame({f"obs {i}": [22, 17, 16, 16] for i in range(6)}, index=stages)
    figure = charts.funnel_chart(many)
    assert figure.layout.xaxis.tickangle == 0
    assert list(figure.data[0].x) == ["evidence said", "observed with<br>the answer", "survived<br>reflection",
                                      "visible at the<br>end"]
    assert all(bar.textposition == "none" for bar in figure.data)  # six groups: the table has the counts
    few = charts.funnel_chart(many.iloc[:, :2])
    assert all(bar.textposition == "outside" for bar in few.data)
    assert charts.wrap("<b>x</b> y") == "&lt;b&gt;x&lt;/b&gt; y"  # dataset text stays text
    # Every configuration its own colour (of eight, two pairs were drawn alike: the palette had six)
    for n in (6, 8, 12):
        grid = pd.DataFrame({f"obs {i}": [22, 17, 16, 16] for i in range(n)}, index=stages)
        assert len({bar.marker.color for bar in charts.funnel_chart(grid).data}) == n


def test_one_value_draws_no_colour_bar() -> None:
    one = pd.DataFrame({"run_id": ["r1"], "compression": [5.2], "retention": [0.7], "observation_threshold": [300],
                        "reflection_threshold": [600], "window": [10]})
    [_, points] = charts.pareto_chart(one).data
    assert not points.marker.showscale  # (a bar from 299.6 to 300.4 meant nothing)
    two = pd.concat([one, one.assign(run_id="r2", observation_threshold=150, compression=4.0)])
    assert charts.pareto_chart(two).data[1].marker.showscale
    assert charts.heatmap(one, "retention").data[0].showscale is False
    assert charts.heatmap(two, "compression").data[0].showscale is True


# -- a sweep run twice -------------------------------------------------------------------------------

def test_already_swept_finds_identical_configurations() -> None:
    grid = [ReplayConfig(observation_threshold=o, reflection_threshold=600) for o in (150, 300)]
    stored = json.dumps(grid[1].to_json() | {"cache": False, "timeout": 30})  # not what makes a run differ
    runs = pd.DataFrame({"config": [stored, json.dumps(grid[0].to_json())], "status": ["completed", "failed"]})
    assert app_data.already_swept(runs, grid) == [1]  # a failed run is no reason to skip
    assert app_data.already_swept(runs.iloc[:0], grid) == []
    other_window = [ReplayConfig(observation_threshold=300, reflection_threshold=600, last_messages=20)]
    assert app_data.already_swept(runs, other_window) == []
    assert "Nothing new to run" in app_data.sweep_skip_note(1, 1)
    assert app_data.sweep_skip_note(1, 3).startswith("1 of the 3 configurations already have a completed run")


def test_running_a_sweep_again_says_so_and_records_no_duplicate(db: Path) -> None:
    at = app("tune")
    at.sidebar.radio(key="tune_mode").set_value("Sweep one conversation").run()
    at.sidebar.text_input(key="tune_obs").set_value("300")
    at.sidebar.text_input(key="tune_ref").set_value("600").run()
    at.sidebar.button(key="tune_run").click().run()
    assert not at.exception, at.exception
    assert len(RunStore(db).runs()) == 1
    at.sidebar.button(key="tune_run").click().run()
    assert not at.exception, at.exception
    assert len(RunStore(db).runs()) == 1  # not silently a second, identical run
    assert any("Nothing new to run" in i.value for i in at.info), [i.value for i in at.info]
    # One run: the chart has no colour bar for its one threshold.
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    runs_trace = next(t for t in spec["data"] if t.get("name") == "runs")
    assert not runs_trace["marker"].get("showscale")
    # Asked for, it runs again.
    at.sidebar.checkbox(key="tune_again").check().run()
    at.sidebar.button(key="tune_run").click().run()
    assert len(RunStore(db).runs()) == 2
    # A new configuration: once swept, the sidebar counts what is left (found in Chromium: it still
    # said "1 run" to make, counted before the sweep)
    at.sidebar.checkbox(key="tune_again").uncheck().run()
    at.sidebar.text_input(key="tune_obs").set_value("150").run()
    assert any(c.value == "1 run with the built-in offline model" for c in at.sidebar.caption)
    at.sidebar.button(key="tune_run").click().run()
    assert len(RunStore(db).runs()) == 3
    assert any(c.value.startswith("0 runs with the built-in offline model (1 of the 1 configuration already swept")
               for c in at.sidebar.caption), [c.value for c in at.sidebar.caption]



def test_the_app_script_imported_by_a_fork_server_runs_nothing(db: Path) -> None:
    """Streamlit runs app.py as ``__main__``, and a process pool's fork server (an experiment
    started from the app) imports ``__main__``'s file as ``__mp_main__``: the whole app ran there
    headless, logging 22 "missing ScriptRunContext" warnings per experiment."""
    import runpy

    script = Path(__file__).resolve().parents[1] / "app.py"
    imported = runpy.run_path(str(script), run_name="__mp_main__")
    assert "pages" not in imported  # the body (page config, navigation) did not run
    assert [t.value for t in app().title] == ["Replay explorer"]  # as Streamlit runs it, it does
