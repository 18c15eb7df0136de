"""Compare two configurations on the same conversation."""

import json

import streamlit as st

from workbench import analysis, charts, ui
from workbench import formatting as fmt

store = ui.get_store()
st.title("Compare")

st.sidebar.header("Compare")
mode = st.sidebar.radio("Runs", ["Pick two stored runs", "Run two configurations"], key="cmp_mode")
run_a = run_b = None
if mode == "Run two configurations":
    conversation = ui.dataset_picker("cmp")
    left, right = st.columns(2)
    with left.expander("Configuration A", expanded=True):
        config_a = ui.config_form(store, "cmp_a", conversation, container=st)
    with right.expander("Configuration B", expanded=True):
        config_b = ui.config_form(store, "cmp_b", conversation, container=st)
    if st.button("Run both", type="primary", key="cmp_run", disabled=conversation is None or store.read_only):
        result_a = ui.run_replay(store, conversation, config_a, label="A · " + config_a.label())
        result_b = ui.run_replay(store, conversation, config_b, label="B · " + config_b.label())
        if result_a and result_b and result_a.run_id and result_b.run_id:
            st.session_state["cmp_pair"] = (result_a.run_id, result_b.run_id)
    run_a, run_b = st.session_state.get("cmp_pair", (None, None))
else:
    runs = store.runs()
    if len(runs) < 2:
        st.info("Compare needs two stored runs: run two configurations here, or replays in the explorer.")
        st.stop()
    ids = list(runs.run_id)
    run_a = ui.run_picker(store, "Run A", "cmp_a_pick", default=ids[1], container=st.sidebar)
    run_b = ui.run_picker(store, "Run B", "cmp_b_pick", default=ids[0], container=st.sidebar)

if not run_a or not run_b:
    st.info("Choose or run two configurations.")
    st.stop()
if run_a == run_b:
    st.warning("Run A and run B are the same run.")

info_a, info_b = store.run(run_a), store.run(run_b)
for name, info in (("A", info_a), ("B", info_b)):
    if info["status"] != "completed":  # its figures cover a prefix only: never compared as if final
        ui.error(f"**Run {name} {fmt.progress(info['status'], info['steps'], info['planned_steps'])}**: its "
                 "figures describe only the part replayed. ", info["error"] or "")
if info_a["conversation_id"] != info_b["conversation_id"]:
    st.warning("The two runs replayed different conversations; their figures are not directly comparable.")

st.subheader("Figures")
table = analysis.compare_runs(store, run_a, run_b).map(analysis.display)
table.columns = [f"A · {run_a}", f"B · {run_b}"] if run_a != run_b else [f"A · {run_a}"]
st.dataframe(table, key="cmp_table", height=35 * (len(table) + 1) + 3)

steps_a, steps_b = store.steps(run_a), store.steps(run_b)
for title, build in (
    ("Token volumes", lambda steps, info: charts.volumes_chart(steps)),
    ("Thresholds and passes", lambda steps, info: charts.thresholds_chart(
        steps, info["config"]["observation_threshold"], info["config"]["reflection_threshold"])),
):
    st.subheader(title)
    left, right = st.columns(2)
    for column, steps, info, name in ((left, steps_a, info_a, "A"), (right, steps_b, info_b, "B")):
        figure = build(steps, info)
        figure.update_layout(title=f"{name}: {title.lower()}")
        column.plotly_chart(figure, key=f"cmp_{title}_{name}")

st.subheader("Probes one keeps and the other loses")
diff = analysis.probe_diff(store, run_a, run_b)
if diff.empty:
    st.info("No probe is kept by one run and lost by the other (or the conversation has no probes).")
else:
    diff = diff.assign(kept_by=diff.kept_by.map({run_a: "A", run_b: "B"}))
    st.dataframe(diff[["kept_by", "category", "question", "gold", "score_a", "score_b"]], hide_index=True,
                 key="cmp_diff")

st.subheader("What each wrote")
left, right = st.columns(2)
for column, run_id, name in ((left, run_a, "A"), (right, run_b, "B")):
    records = store.records(run_id)
    column.markdown(f"**{name}** · {len(records)} records")
    for _, record in records.iterrows():
        with column.expander(f"{record.kind} at step {int(record.step)} · "
                             f"{len(json.loads(record.source_ids))} sources · {int(record.tokens or 0)} tokens"):
            ui.text_block(record.text)
