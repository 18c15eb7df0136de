"""Runs: the run history (filter, open, delete, export)."""

import io
import tempfile
import zipfile
from pathlib import Path

import streamlit as st

from workbench import analysis, app_data, ui
from workbench.retention import SCORING, is_earlier, scoring_rule
from workbench.runstore import RunBusy
from workbench import formatting as fmt

store = ui.get_store()
st.title("Runs")
if st.session_state.get("runs_done"):  # said after the rerun that follows a delete
    st.success(ui.plain(st.session_state.pop("runs_done")))

runs = analysis.runs_with_config(store)
if runs.empty:
    st.info("No runs yet: replay a conversation in the explorer or with `python -m workbench replay`.")
    st.stop()

left, middle, right = st.columns(3)
conversations = left.multiselect("Conversation", sorted(runs.conversation_id.unique()), key="runs_conv")
statuses = middle.multiselect("Status", sorted(runs.status.unique()), key="runs_status")
search = right.text_input("Search labels", key="runs_search")
shown = runs
if conversations:
    shown = shown[shown.conversation_id.isin(conversations)]
if statuses:
    shown = shown[shown.status.isin(statuses)]
if search:
    shown = shown[shown.label.fillna("").str.contains(search, case=False, regex=False)]

shown = shown.assign(status=[app_data.status_text(s, k, n) for s, k, n in zip(shown.status, shown.steps, shown.planned_steps)])
ui.table(shown[["run_id", "created_at", "status", "conversation_id", "observer", "reflector",
                "observation_threshold", "reflection_threshold", "window", "steps", "compression",
                "retention", "cost_usd", "label", "error"]], hide_index=True, key="runs_table")
st.caption(f"{len(shown):,} of {fmt.count(len(runs), 'run')}")
earlier = [r for r, rule in zip(shown.run_id, shown.scoring) if is_earlier(rule)]
if earlier:  # (as `runs` says: their retention is not comparable with the others')
    st.caption(ui.plain(f"{fmt.count(len(earlier), 'run')} scored under an earlier retention rule, not comparable "
                        f"with the others: {', '.join(earlier[:3])}{' …' if len(earlier) > 3 else ''}. To score them "
                        "under the current rule, with no model call: " + fmt.cli_command("rescore --all", store.path)))
if later := [r for r, rule in zip(shown.run_id, shown.scoring) if (scoring_rule(rule) or 0) > SCORING]:
    st.caption(ui.plain(f"{fmt.count(len(later), 'run')} scored under a later retention rule than this version of omem "
                        f"knows (rules 1–{SCORING}), not comparable with the others: {', '.join(later[:3])}"
                        f"{' …' if len(later) > 3 else ''}. Upgrade omem to read them."))

if shown.empty:
    st.stop()
# The run a link names (?run=…, as the explorer's address carries it here), else the run opened on
# the other pages: the picker opened on the newest run while the address named another, and
# "Delete run" deleted a run other than the one just viewed.
if (linked := app_data.linked_step(dict(st.query_params))) and linked[0] != st.session_state.get("_runs_link"):
    st.session_state["_runs_link"] = linked[0]
    if linked[0] in set(runs.run_id):
        ui.open_run(linked[0])
        st.session_state.pop("runs_pick", None)
    else:
        ui.warn_link_run_gone(store, linked[0])
run_id = ui.run_picker(store, "Run", "runs_pick", default=st.session_state.get(ui.RUN_KEY),
                       only=set(shown.run_id))  # acts on the run it shows
if st.query_params.get("run") not in (None, run_id):  # (the address named another run: it names this one)
    st.session_state["_runs_link"] = run_id
    st.query_params.from_dict({"run": run_id})
# One row that wraps (in three equal columns of a 900 px page the labels were cut to "Open in the
# expl…", "Export as Parqu…", and "Delete run" fell to a row of its own under its checkbox).
actions = st.container(horizontal=True, vertical_alignment="center")
if actions.button("Open in the explorer", key=f"runs_open_{run_id}"):
    ui.open_run_at(run_id)  # (as a stored run: not filtered out by the explorer's chosen dataset)
    st.switch_page("workbench/app_pages/explorer.py")

with tempfile.TemporaryDirectory() as folder:
    files = store.export_parquet(run_id, Path(folder))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for file in files:
            archive.write(file, file.name)
actions.download_button("Export as Parquet (zip)", buffer.getvalue(), file_name=f"{run_id}.zip",
                        mime="application/zip", key="runs_export")

# The confirmation belongs to one run: after a delete (or another pick) it starts unticked, so a
# second click can never delete the run shown next.
confirm = actions.checkbox("Confirm delete", key=f"runs_confirm_{run_id}")
if actions.button("Delete run", disabled=not confirm or store.read_only, key=f"runs_delete_{run_id}"):
    try:
        store.delete_run(run_id)
    except RunBusy as exc:  # another process is replaying it: nothing is deleted
        ui.error("", exc)
    else:
        st.session_state.pop(f"runs_confirm_{run_id}", None)
        st.session_state.pop("runs_pick", None)  # (deleted here: not "deleted elsewhere" next time)
        ui.forget_run(run_id)
        st.session_state["runs_done"] = f"Deleted {run_id}."
        st.rerun()
