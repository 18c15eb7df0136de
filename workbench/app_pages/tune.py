"""Tune: a threshold sweep, shown as compression vs retention and a heatmap."""

import asyncio

import streamlit as st

from workbench import analysis, charts, ui
from workbench import formatting as fmt
from workbench.replay import ReplayConfig, run_sweep

store = ui.get_store()
st.title("Tune thresholds")

st.sidebar.header("Sweep")
conversation = ui.dataset_picker("tune")


def _grid(label: str, default: str, key: str) -> list[int]:
    text = st.sidebar.text_input(label, default, key=key, help="Comma-separated values")
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        st.sidebar.error(f"{label}: whole numbers separated by commas")
        return []
    if any(v < 1 for v in values):
        st.sidebar.error(f"{label}: values must be positive")
        return []
    return values


observation = _grid("Observation thresholds", "150,300,600", "tune_obs")
reflection = _grid("Reflection thresholds", "300,600,1200", "tune_ref")
windows = _grid("Windows", "10", "tune_win")
concurrency = st.sidebar.slider("Runs at once", 1, 8, 2, key="tune_conc")
grid = [ReplayConfig(observation_threshold=o, reflection_threshold=r, last_messages=w)
        for o in observation for r in reflection for w in windows]
st.sidebar.caption(f"{len(grid)} runs with the built-in offline model")

if st.sidebar.button("Run sweep", type="primary", key="tune_run",
                     disabled=conversation is None or not grid or store.read_only):
    bar = st.progress(0.0, text="Sweeping…")

    def done(finished, total, config, result):
        bar.progress(finished / total, text=f"{finished}/{total} runs")

    asyncio.run(run_sweep(conversation, grid, store, concurrency, on_done=done))
    bar.empty()

runs = analysis.runs_with_config(store)
if conversation is not None:
    runs = runs[(runs.conversation_id == conversation.id) & (runs.dataset == conversation.source)]
failed = runs[runs.status != "completed"]
runs = runs[runs.status == "completed"]
if not failed.empty:  # never just fewer points: say which configurations did not finish, and why
    st.warning(f"{len(failed)} configuration(s) did not finish and are not drawn:")
    st.dataframe(failed.assign(
        status=[fmt.progress(s, k, n) for s, k, n in zip(failed.status, failed.steps, failed.planned_steps)],
        configuration=failed.label)[["run_id", "status", "configuration", "error"]],
        hide_index=True, key="tune_failed")
if runs.empty:
    st.info("No completed runs for this conversation yet: run a sweep from the sidebar.")
    st.stop()

st.caption("Each point is a run; click one to open it in the replay explorer.")
event = st.plotly_chart(charts.pareto_chart(runs), key="tune_pareto", on_select="rerun", selection_mode="points")
points = (event.selection.points if event and event.selection else []) or []
if points:
    picked = points[0].get("customdata")
    if picked:
        ui.open_run(picked[0] if isinstance(picked, list) else picked)
        st.switch_page("workbench/app_pages/explorer.py")

left, right = st.columns(2)
if runs.retention.notna().any():
    left.plotly_chart(charts.heatmap(runs, "retention"), key="tune_heat_retention")
right.plotly_chart(charts.heatmap(runs, "compression"), key="tune_heat_compression")
st.dataframe(runs[["run_id", "observation_threshold", "reflection_threshold", "window", "compression", "retention",
                   "observer_calls", "reflector_calls"]], hide_index=True, key="tune_table")
