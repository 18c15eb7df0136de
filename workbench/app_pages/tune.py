"""Tune: an experiment's pooled retention vs compression (Pareto with CIs), threshold heatmaps and
failed configurations; a quick sweep of one conversation as a secondary mode."""

import asyncio

import pandas as pd
import streamlit as st

from workbench import analysis, app_data, charts, ui
from workbench import formatting as fmt
from workbench.experiments import backlog_note, shared_conversations, summaries_of, uneven_note
from workbench.replay import ReplayConfig, run_sweep

store = ui.get_store()
st.title("Tune thresholds")

ui.kept("tune_mode", ["An experiment", "Sweep one conversation"])  # (as it was left, from another page)
mode = st.sidebar.radio("Source", ["An experiment", "Sweep one conversation"], key="tune_mode")
if mode == "An experiment":
    experiment_id = ui.experiment_picker(store, "Experiment", "tune_exp", container=st.sidebar)
    if experiment_id is None:
        st.info("No experiments yet: start one on the Experiments page (a dataset × a grid of thresholds), "
                "or sweep one conversation from the sidebar.")
        if st.button("Go to Experiments", key="tune_go_exp"):
            st.switch_page("workbench/app_pages/experiments.py")
        st.stop()
    tables = ui.experiment_tables(store, experiment_id)
    experiment, summaries, runs = tables["experiment"], tables["summaries"], tables["runs"]
    st.text(f"{experiment_id} · {fmt.short_path(experiment['dataset'])} · "
            f"{fmt.count(len(experiment['conversations']), 'conversation')} × "
            f"{fmt.count(len(experiment['configs']), 'configuration')} · {app_data.experiment_status(experiment, runs)}")
    ui.rule_warning(experiment, runs)  # (as its page says)
    failed = app_data.failed_configs(runs)
    if not failed.empty:  # never just fewer points: say which configurations did not finish, and why
        st.warning(f"{fmt.count(len(failed), 'run')} did not complete (listed below). Each configuration's "
                   "figures pool only its completed runs; a configuration with none is not drawn.")
        st.dataframe(failed, hide_index=True, key="tune_xp_failed")
    if spent := app_data.spent_note(experiment, runs, summaries):
        st.caption(spent)
    running = ui.running_notice(store, experiment, runs)  # (it said "never started, or deleted: Resume")
    unrecorded = sum(s.missing for s in summaries)
    if unrecorded and not running:  # an interrupted grid (or deleted runs): the points stand on fewer conversations
        done = sum(s.runs for s in summaries)
        planned = len(experiment["conversations"]) * len(experiment["configs"])
        st.warning(f"{fmt.count(unrecorded, 'planned run')} {'has' if unrecorded == 1 else 'have'} no record "
                   f"(never started, or deleted): the figures below come from {done} of {planned} runs. "
                   "Resume the experiment on the Experiments page to complete them.")
    if uneven_note(runs):
        # Rows pooled over different conversations would rank on different probes (a configuration
        # whose run on a hard conversation failed would lead): drawn on those every one completed.
        drawn = [s.label for s in summaries if s.runs]
        common = shared_conversations(runs, drawn)
        if common:
            summaries = summaries_of(experiment, runs, tables["probes"], tables["losses"], conversations=common)
            st.warning(ui.plain(f"The configurations completed different conversations: the chart, heatmaps and "
                                f"table below use the {fmt.count(len(common), 'conversation')} every one of them "
                                f"completed ({', '.join(common)}), so the points rank on the same probes."))
        else:
            st.warning(ui.plain(uneven_note(runs) + " No conversation was completed by every configuration."))
    if behind := backlog_note(summaries):
        st.warning(ui.plain(behind))
    points = app_data.pareto_points(summaries)
    if points.empty:
        st.info("No configuration has both retention and compression yet (a dataset whose probes have no gold "
                "answer, or no probes, gives compression only).")
    else:
        st.caption("Each point is a configuration: retention pooled over every probe of every conversation, with "
                   "its 95% bootstrap interval; the dotted line is the Pareto front. Click a point to compare it "
                   "with the best-retention configuration (the best with the next best).")
        event = st.plotly_chart(charts.experiment_pareto_chart(points), key="tune_xp_pareto", on_select="rerun",
                                selection_mode="points")
        chosen = (event.selection.points if event and event.selection else []) or []
        if chosen and chosen[0].get("customdata"):
            label = chosen[0]["customdata"]
            label = label[0] if isinstance(label, list) else label
            pair = app_data.compare_pair(points, label)
            if pair is None:
                st.info(ui.plain(f"{label} is the only configuration with a point: nothing to compare it with."))
            else:
                st.session_state["cmp_xp_pair"] = pair
                st.session_state["cmp_mode"] = "Two configurations of an experiment"
                st.switch_page("workbench/app_pages/compare.py")
    cells = app_data.threshold_cells(summaries)
    settings = list(dict.fromkeys(cells.settings))
    gridded = cells.observation_threshold.nunique() > 1 or cells.reflection_threshold.nunique() > 1
    # (only with thresholds to map: a grid of prompts alone showed the picker and no heatmap under it)
    if len(settings) > 1 and gridded:  # one heatmap per combination of the other settings: a cell never averages two
        setting = st.selectbox("Heatmaps for", settings, key="tune_xp_settings",
                               help="What varies in the grid besides the two thresholds")
        cells = cells[cells.settings == setting]
    if cells.observation_threshold.nunique() > 1 or cells.reflection_threshold.nunique() > 1:
        # Side by side when the page is wide enough, one under the other when not (in two
        # columns of a narrow page the cells' figures printed over each other).
        heatmaps = st.container(horizontal=True)
        shared = cells.settings.iloc[0]
        if cells.retention.notna().any():
            heatmaps.plotly_chart(charts.heatmap(cells, "retention", settings=shared), key="tune_xp_heat_retention",
                              width=430)
        if cells.compression.notna().any():
            heatmaps.plotly_chart(charts.heatmap(cells, "compression", settings=shared),
                               key="tune_xp_heat_compression", width=430)
    st.subheader("Figures per configuration")
    summary = app_data.sortable(app_data.summary_numbers(summaries), app_data.SUMMARY_FORMATS)  # sorts by value
    ui.figures(summary, hide_index=True, key="tune_xp_table",
               column_order=app_data.key_first(summary.columns, app_data.SUMMARY_FIRST),
               column_config={"configuration": st.column_config.Column(pinned=True)})
    categories = {s.label: {app_data.category_name(k): fmt.share(v["retention"], 3) for k, v in s.per_category.items()}
                  for s in summaries}
    if any(categories.values()):
        st.subheader("Retention per probe category")
        ui.figures(app_data.clean(pd.DataFrame(categories)), key="tune_xp_categories")
    st.stop()

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


def _conversation_runs():
    runs = analysis.runs_with_config(store)
    if conversation is not None:
        runs = runs[(runs.conversation_id == conversation.id) & (runs.dataset == conversation.source)]
    return runs


# A configuration already replayed on this conversation would replay the same way again (the
# offline model is deterministic): skipped unless asked for, and said so either way.
previous = _conversation_runs()
if "experiment_id" in previous:
    previous = previous[previous.experiment_id.isna()]
repeated = app_data.already_swept(previous, grid)
again = st.sidebar.checkbox("Replay configurations already swept", key="tune_again", disabled=not repeated,
                            help="Each would record a second, identical run of this conversation")
todo = grid if again else [c for i, c in enumerate(grid) if i not in set(repeated)]
st.sidebar.caption(f"{fmt.count(len(todo), 'run')} with the built-in offline model"
                   + (f" ({len(repeated)} of the {fmt.count(len(grid), 'configuration')} already swept: "
                      + ("run again)" if again else "skipped)") if repeated else ""))

if st.sidebar.button("Run sweep", type="primary", key="tune_run",
                     disabled=conversation is None or not grid or store.read_only):
    if repeated and not again:
        st.session_state["tune_skip_note"] = app_data.sweep_skip_note(len(repeated), len(grid))
    if todo:
        bar = st.progress(0.0, text="Sweeping…")

        def done(finished, total, config, result):
            bar.progress(finished / total, text=f"{finished}/{total} runs")

        asyncio.run(run_sweep(conversation, todo, store, concurrency, on_done=done))
        bar.empty()
        st.rerun()  # the sidebar's count of runs to make (drawn before the sweep) then counts the runs just made
if note := st.session_state.pop("tune_skip_note", None):
    st.info(note)

runs = _conversation_runs()
if "experiment_id" in runs:  # an experiment's runs are tuned in its own view (the other mode)
    in_experiments = int(runs.experiment_id.notna().sum())
    runs = runs[runs.experiment_id.isna()]
    if in_experiments:
        st.caption(f"{fmt.count(in_experiments, 'run')} of this conversation "
                   f"{'belongs' if in_experiments == 1 else 'belong'} to experiments and "
                   f"{'is' if in_experiments == 1 else 'are'} left out here: choose “An experiment” as the "
                   "source to see them.")
failed = runs[runs.status != "completed"]
runs, earlier = app_data.earlier_rule_runs(runs[runs.status == "completed"])
if earlier:  # (drawn beside the others, their retention read as comparable; a sweep replays them afresh)
    st.caption(ui.plain(f"{fmt.count(earlier, 'run')} of this conversation scored under an earlier retention rule "
                        f"{'is' if earlier == 1 else 'are'} left out here, not comparable with the others: to score "
                        "them under the current rule, with no model call: " + fmt.cli_command("rescore --all", store.path)))
if not failed.empty:  # never just fewer points: say which configurations did not finish, and why
    st.warning(f"{fmt.count(len(failed), 'configuration')} did not finish and "
               f"{'is' if len(failed) == 1 else 'are'} not drawn:")
    st.dataframe(failed.assign(
        status=[app_data.status_text(s, k, n) for s, k, n in zip(failed.status, failed.steps, failed.planned_steps)],
        configuration=failed.label)[["run_id", "status", "configuration", "error"]].rename(columns={"run_id": "run"}),
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
        ui.open_run_at(picked[0] if isinstance(picked, list) else picked)
        st.switch_page("workbench/app_pages/explorer.py")

runs = runs.assign(settings=app_data.run_settings(runs))
settings = list(dict.fromkeys(runs.settings))
cells, setting = runs, ""
if len(settings) > 1:  # one heatmap per combination of the other settings: a cell never averages two
    setting = st.selectbox("Heatmaps for", settings, key="tune_settings",
                           help="What differs between this conversation's runs besides the two thresholds")
    cells = runs[runs.settings == setting]
heatmaps = st.container(horizontal=True)  # (wraps on a narrow page, as above)
if cells.retention.notna().any():
    heatmaps.plotly_chart(charts.heatmap(cells, "retention", settings=setting), key="tune_heat_retention", width=430)
heatmaps.plotly_chart(charts.heatmap(cells, "compression", settings=setting), key="tune_heat_compression", width=430)
columns = ["run_id", "observation_threshold", "reflection_threshold", "window", "compression", "retention",
           "observer_calls", "reflector_calls"]
ui.table(runs[columns + (["settings"] if len(settings) > 1 else [])], hide_index=True, key="tune_table")
