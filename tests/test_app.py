"""The Streamlit app, headless with streamlit.testing.v1.AppTest: every page, on a fresh store."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from workbench.runstore import RunStore

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PROJECT_DEMO = Path(__file__).resolve().parents[1] / "datasets" / "demo.jsonl"
PAGES = "workbench/app_pages/{}.py"


@pytest.fixture
def db(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "app.duckdb"
    monkeypatch.setenv("OMEM_DB", str(path))
    monkeypatch.setenv("OMEM_CACHE_DIR", str(tmp_path / "cache"))
    return path


def app(page: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    if page is not None:
        at.switch_page(PAGES.format(page)).run()
    assert not at.exception, at.exception
    return at


def spec(at: AppTest, index: int) -> dict:
    return json.loads(at.get("plotly_chart")[index].proto.spec)


def trace(figure: dict, name: str) -> dict:
    """A named trace with its arrays decoded (plotly ships numpy arrays as base64 ``bdata``)."""
    found = next(t for t in figure["data"] if t.get("name") == name)
    return {k: decode(v) for k, v in found.items()}


def decode(value):
    if isinstance(value, dict) and "bdata" in value:
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        return array.reshape(value["shape"]).tolist() if "shape" in value else array.tolist()
    return value


def store(db: Path) -> RunStore:
    return RunStore(db)


def test_explorer_on_a_fresh_store_replays_the_demo_and_charts_match(db: Path) -> None:
    at = app()
    s = store(db)
    runs = s.runs()
    assert len(runs) == 1 and runs.conversation_id[0] == "priya-lisbon" and runs.status[0] == "completed"
    run_id = runs.run_id[0]
    steps = s.steps(run_id)
    # The charts show the stored figures, not recomputed ones.
    cursor, thresholds, volumes = spec(at, 0), spec(at, 1), spec(at, 2)
    assert trace(volumes, "full history")["y"] == list(steps.history_tokens)
    assert trace(volumes, "window")["y"] == list(steps.window_tokens)
    assert trace(thresholds, "backlog")["y"] == list(steps.backlog_tokens)
    assert trace(thresholds, "observe pass")["x"] == list(steps[steps.observed].step)
    assert trace(cursor, "observed up to (cursor)")["y"] == list(steps.cursor_index + 1)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Compression"] == f"{runs.compression[0]:.1f}x"
    assert metrics["Memory reads"] == str(len(steps))
    # Record and message text is shown as text (code blocks), never as HTML.
    assert at.code and not at.get("html")


def test_explorer_sidebar_and_slider_change_what_is_shown(db: Path) -> None:
    at = app()
    at.sidebar.number_input(key="ex_obs_300").set_value(150)
    at.sidebar.number_input(key="ex_window").set_value(6)
    at.sidebar.button(key="ex_run").click().run()
    assert not at.exception
    runs = store(db).runs()
    assert len(runs) == 2
    newest = store(db).run(runs.run_id[0])
    assert newest["config"]["observation_threshold"] == 150 and newest["config"]["last_messages"] == 6
    thresholds = spec(at, 1)
    assert any(shape.get("y0") == 150 for shape in thresholds["layout"]["shapes"])
    slider = at.slider[0]
    slider.set_value(3).run()
    assert any(h.value == "At step 3" for h in at.subheader)
    volumes = spec(at, 2)
    assert any(shape.get("x0") == 3 for shape in volumes["layout"]["shapes"])


def test_a_provider_error_is_shown_and_the_recorded_steps_are_kept(db: Path, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OMEM_MODELS", "gpt-4o-mini")
    at = app()
    at.sidebar.selectbox(key="ex_observer").set_value("gpt-4o-mini").run()
    assert any("gpt-4o-mini" in w.value and "OPENAI_API_KEY" in w.value for w in at.sidebar.warning)
    at.sidebar.button(key="ex_run").click().run()
    assert not at.exception
    assert at.error and "observe pass failed" in at.error[0].value and "gpt-4o-mini" in at.error[0].value
    runs = store(db).runs()
    failed = runs[runs.status == "failed"].iloc[0]
    assert store(db).steps(failed.run_id).shape[0] > 0  # what was recorded before the error is kept
    assert store(db).records(failed.run_id).empty


def test_explorer_opens_a_stored_run(db: Path) -> None:
    at = app()
    first = store(db).runs().run_id[0]
    at.sidebar.radio(key="ex_mode").set_value("Open a stored run").run()
    assert not at.exception
    assert at.sidebar.selectbox(key="ex_open").value == first


def test_explorer_warns_when_the_observer_falls_behind(db: Path) -> None:
    import asyncio

    from workbench.datasets import load_conversation
    from workbench.replay import ReplayConfig, replay

    conversation = load_conversation(Path(__file__).resolve().parents[1] / "datasets" / "tiny.jsonl")
    with RunStore(db) as s:  # one message per observe pass, two new messages per read
        asyncio.run(replay(conversation, ReplayConfig(observation_threshold=1, last_messages=2, cache=False), s))
    at = app()
    assert any("observer is falling behind" in w.value for w in at.warning)


def test_explorer_shows_a_reflection_that_had_to_be_tightened(db: Path) -> None:
    import asyncio

    from conftest import scripted_provider

    from workbench.datasets import load_conversation
    from workbench.replay import ReplayConfig, replay

    def reply(messages: list[dict]) -> str:
        content = messages[-1]["content"]
        if "Your reflection was" in content:
            return "- Sam: short."
        if "<observations>" in content:
            return "- Sam: " + "a long merged note " * 30  # about 150 tokens, over the threshold of 60
        return "- Sam: " + "observed " * 20

    conversation = load_conversation(Path(__file__).resolve().parents[1] / "datasets" / "tiny.jsonl")
    with scripted_provider() as scripted, RunStore(db) as s:
        scripted.default = reply
        config = ReplayConfig(observer="scripted/model", reflector="scripted/model", observation_threshold=20,
                              reflection_threshold=60, last_messages=2, cache=False)
        result = asyncio.run(replay(conversation, config, s))
        assert result.reflector_calls >= 1
    at = app()
    assert any("reflections came back over the reflection threshold" in w.value for w in at.warning)
    labels = [e.label for e in at.expander]
    assert any(label.startswith("Reflection") and "2 calls (tightened)" in label for label in labels)


def test_compare_two_configurations(db: Path) -> None:
    at = app("compare")
    at.sidebar.radio(key="cmp_mode").set_value("Run two configurations").run()
    at.number_input(key="cmp_a_obs_300").set_value(150)
    at.number_input(key="cmp_b_obs_300").set_value(600)
    at.button(key="cmp_run").click().run()
    assert not at.exception
    runs = store(db).runs()
    assert len(runs) == 3  # the explorer's demo run, then A and B
    table = at.dataframe[0].value
    assert list(table.columns) == [f"A · {runs.run_id[1]}", f"B · {runs.run_id[0]}"]
    assert table.loc["observation threshold"].astype(int).tolist() == [150, 600]
    assert len(at.get("plotly_chart")) == 4


def test_tune_sweep_runs_the_grid_and_plots_every_run(db: Path) -> None:
    at = app("tune")
    at.sidebar.text_input(key="tune_obs").set_value("150,300")
    at.sidebar.text_input(key="tune_ref").set_value("400")
    at.sidebar.button(key="tune_run").click().run()
    assert not at.exception
    runs = store(db).runs()
    assert len(runs) == 3
    pareto = spec(at, 0)
    assert sorted(trace(pareto, "runs")["customdata"]) == sorted(runs.run_id)


def test_prompts_save_a_version(db: Path) -> None:
    at = app("prompts")
    at.text_area(key="pr_text_observer_v2").set_value("Write short dated notes.")
    at.text_input(key="pr_new_observer").set_value("v2-short").run()
    at.button(key="pr_save").click().run()
    assert not at.exception and at.success
    saved = store(db).prompts()
    assert list(saved.version) == ["v2-short"] and saved.text[0] == "Write short dated notes."
    at.text_area(key="pr_text_observer_v2").set_value("Something else.")
    at.button(key="pr_save").click().run()
    assert at.error and "already exists" in at.error[0].value


def test_runs_page_filters_and_deletes(db: Path) -> None:
    at = app("runs")
    assert "1 of 1 runs" in at.caption[0].value
    at.checkbox(key="runs_confirm").check().run()
    at.button(key="runs_delete").click().run()
    assert not at.exception
    assert store(db).runs().empty


def test_presentation_steps_forward(db: Path) -> None:
    at = app("present")
    first = at.subheader[0].value
    assert first.startswith("Step 0:")
    at.button(key="pres_next").click().run()
    assert at.subheader[0].value.startswith("Step 1:")
    assert {m.label for m in at.metric} >= {"Compression", "Facts retained"}


def test_a_store_held_by_another_process_opens_read_only(db: Path) -> None:
    from conftest import held_by_another_process

    import asyncio

    from workbench.datasets import load_conversation
    from workbench.replay import ReplayConfig, replay

    with RunStore(db) as writer:  # a run recorded earlier
        asyncio.run(replay(load_conversation(PROJECT_DEMO), ReplayConfig(cache=False), writer))
    with held_by_another_process(db):
        at = AppTest.from_file(APP, default_timeout=120)
        at.run()
        assert not at.exception
        assert any("Read-only snapshot" in w.value and "another process" in w.value for w in at.warning)
        assert at.metric  # the stored run is shown from the snapshot
        at.sidebar.button(key="ex_run").click().run()
        assert at.error and "read-only" in at.error[0].value
        for page in ("runs", "compare", "present"):
            at.switch_page(PAGES.format(page)).run()
            assert not at.exception
    assert len(RunStore(db).runs()) == 1  # the original was never written
