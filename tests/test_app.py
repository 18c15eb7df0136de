"""The Streamlit app, headless with streamlit.testing.v1.AppTest: every page, on a fresh store."""

from __future__ import annotations

import base64
import json
import re
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


def shown(value: str) -> str:
    """What a reader sees of a Markdown body that ui.plain escaped (backslash escapes removed)."""
    return re.sub(r"\\(.)", r"\1", value)


def test_a_model_without_its_key_is_refused_before_the_replay(db: Path, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OMEM_MODELS", "gpt-4o-mini")
    at = app()
    at.sidebar.selectbox(key="ex_observer").set_value("gpt-4o-mini").run()
    assert any("gpt-4o-mini" in shown(w.value) and "OPENAI_API_KEY" in shown(w.value) for w in at.sidebar.warning)
    at.sidebar.button(key="ex_run").click().run()
    assert not at.exception
    assert at.error and "cannot replay: gpt-4o-mini: missing OPENAI_API_KEY" in shown(at.error[0].value)
    runs = store(db).runs()
    failed = runs[runs.observer_calls.isna() | (runs.status == "failed")]
    [row] = runs[runs.status == "failed"].itertuples()
    assert row.steps == 0 and "OPENAI_API_KEY" in row.error  # recorded as failed, never left running
    assert (runs.status != "running").all() and len(failed) == 1


def test_a_provider_error_mid_run_says_where_and_keeps_the_steps(db: Path, monkeypatch) -> None:
    from conftest import scripted_provider

    monkeypatch.setenv("OMEM_MODELS", "scripted/model")
    at = app()
    with scripted_provider() as scripted:
        scripted.replies = ["- Priya: a note.", RuntimeError("rate limited by the provider")]
        at.sidebar.selectbox(key="ex_observer").set_value("scripted/model").run()
        at.sidebar.button(key="ex_run").click().run()
    assert not at.exception
    message = shown(at.error[0].value)
    assert "failed at step" in message and "of 100" in message and "rate limited by the provider" in message
    runs = store(db).runs()
    failed = runs[runs.status == "failed"].iloc[0]
    assert store(db).steps(failed.run_id).shape[0] == failed.steps > 0  # what was recorded is kept
    # the explorer now shows that run, flagged, with its figures marked partial and no NaN
    assert any("This run failed at step" in shown(e.value) for e in at.error)
    assert any(m.label == "Compression (partial)" for m in at.metric)
    assert all("nan" not in str(m.value).lower() for m in at.metric)


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


def test_a_store_held_by_another_process_opens_read_only(db: Path, monkeypatch) -> None:
    from conftest import held_by_another_process

    import asyncio

    from workbench.datasets import load_conversation
    from workbench.replay import ReplayConfig, replay

    monkeypatch.setenv("OMEM_DB_WAIT", "0.5")
    with RunStore(db) as writer:  # a run recorded earlier
        asyncio.run(replay(load_conversation(PROJECT_DEMO), ReplayConfig(cache=False), writer))
    with held_by_another_process(db):
        at = AppTest.from_file(APP, default_timeout=120)
        at.run()
        assert not at.exception
        [notice] = [shown(w.value) for w in at.warning if "Read-only" in shown(w.value)]
        assert notice.startswith("Read-only: another program keeps app.duckdb open") and notice.count(". ") == 0
        assert at.metric  # the stored run is shown from the snapshot
        assert at.sidebar.button(key="ex_run").disabled
        for page in ("runs", "compare", "present", "tune"):
            at.switch_page(PAGES.format(page)).run()
            assert not at.exception
        assert at.sidebar.button(key="tune_run").disabled
    assert len(RunStore(db).runs()) == 1  # the original was never written


def test_the_app_holds_no_lock_between_its_operations(db: Path) -> None:
    """With the app open on the store, a CLI command in another process can write it."""
    import subprocess
    import sys

    at = app()  # replays the demo into db, then idles
    assert at.metric
    command = [sys.executable, "-m", "workbench", "replay", "--db", str(db), "--json", "--no-cache"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=Path(APP).parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["status"] == "completed"
    at.run()  # the app still works and sees both runs
    assert not at.exception and len(store(db).runs()) == 2


def test_uploads_are_keyed_by_content_and_a_dataset_without_probes_says_so(db: Path, tmp_path) -> None:
    from streamlit.testing.v1.element_tree import UnknownElement  # noqa: F401  (AppTest has no uploader API)

    from workbench import ui

    class Upload:
        def __init__(self, name: str, data: bytes) -> None:
            self.name, self._data = name, data

        def getvalue(self) -> bytes:
            return self._data

    line = '{{"conversation_id": "{c}", "id": "m{i}", "role": "{r}", "content": "{t}", "timestamp": "2024-01-0{i}"}}'
    first = "\n".join(line.format(c="first", i=i, r=("user", "assistant")[i % 2], t="hello") for i in range(1, 3))
    second = "\n".join(line.format(c="second", i=i, r=("user", "assistant")[i % 2], t="bye") for i in range(1, 3))
    a = ui._saved_upload(Upload("chat.jsonl", first.encode()))
    b = ui._saved_upload(Upload("chat.jsonl", second.encode()))
    assert a != b and a.read_text() == first and b.read_text() == second  # same name, own files
    assert ui._saved_upload(Upload("other.jsonl", first.encode())).parent == a.parent  # same bytes, same folder

    path = tmp_path / "no-probes.jsonl"
    path.write_text(first)
    at = app()
    assert at.metric  # the demo, replayed on first open
    at.sidebar.selectbox(key="ex_dataset").set_value(ui.BY_PATH).run()
    assert any("Type the path" in i.value for i in at.info)
    at.sidebar.text_input(key="ex_path").set_value(str(path)).run()
    at.sidebar.selectbox(key="ex_format").set_value("omem").run()
    assert not at.exception
    assert any("no probes" in i.value for i in at.sidebar.info)
    assert any("2 messages · 0 probes" in shown(c.value) for c in at.sidebar.caption)
    # the demo run recorded on first open belongs to another conversation: not shown as this one's
    assert any("No run of first yet" in shown(i.value) for i in at.info)
    assert not at.metric


def test_error_banners_show_data_as_text(db: Path, tmp_path) -> None:
    from workbench import ui

    path = tmp_path / "evil.jsonl"
    path.write_text('{"conversation_id": "c", "id": "m1", "role": "![x](http://example.invalid/a.png)", '
                    '"content": "x", "timestamp": "2024-01-01"}\n')
    at = app()
    at.sidebar.selectbox(key="ex_dataset").set_value(ui.BY_PATH).run()
    at.sidebar.text_input(key="ex_path").set_value(str(path)).run()
    [banner] = [e.value for e in at.error if "Cannot read the dataset" in e.value]
    assert "\\!\\[x\\]\\(http\\:" in banner  # every Markdown mark escaped: no image, no link
    assert "unknown role '![x](http://example.invalid/a.png)'" in shown(banner)


def test_failed_configurations_are_listed_never_silently_dropped(db: Path, monkeypatch) -> None:
    import asyncio

    from workbench.datasets import load_conversation
    from workbench.replay import ConfigurationError, ReplayConfig, replay

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    at = app("tune")  # the explorer's demo run is there already
    with RunStore(db) as s, pytest.raises(ConfigurationError):
        asyncio.run(replay(load_conversation(PROJECT_DEMO), ReplayConfig(observer="gpt-4o-mini"), s))
    at.run()
    assert not at.exception
    assert any("1 configuration(s) did not finish" in w.value for w in at.warning)
    failed = at.dataframe[0].value  # the first table on the page: the failed configurations
    assert failed.status.tolist() == ["failed at step 0 of 100"] and "OPENAI_API_KEY" in failed.error[0]
    at.switch_page(PAGES.format("present")).run()
    picked = at.sidebar.selectbox(key="pres_run")
    failed_id = store(db).runs().query("status == 'failed'").run_id[0]
    picked.set_value(failed_id).run()
    assert not at.exception
    assert any("Not a finished run" in e.value for e in at.error)


def test_no_page_shows_nan(db: Path, monkeypatch) -> None:
    import asyncio

    from workbench.datasets import load_conversation
    from workbench.replay import ConfigurationError, ReplayConfig, replay

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    at = app()
    with RunStore(db) as s, pytest.raises(ConfigurationError):  # a run whose figures are all missing
        asyncio.run(replay(load_conversation(PROJECT_DEMO), ReplayConfig(observer="gpt-4o-mini"), s))
    failed_id = store(db).runs().query("status == 'failed'").run_id[0]
    at.sidebar.radio(key="ex_mode").set_value("Open a stored run").run()
    at.sidebar.selectbox(key="ex_open").set_value(failed_id).run()
    texts = []
    for page in (None, "compare", "runs", "present", "tune"):
        if page is not None:
            at.switch_page(PAGES.format(page)).run()
        assert not at.exception
        texts += [str(m.value) for m in at.metric] + [e.value for e in (*at.markdown, *at.caption, *at.error)]
        texts += [o for s in at.selectbox for o in s.options]
    assert not [t for t in texts if re.search(r"\bnan\b|\$nan|nanx", t, re.IGNORECASE)]
