"""Replay explorer: run or open a replay, then walk it step by step."""

import json

import streamlit as st

from workbench import analysis, charts, ui

store = ui.get_store()

st.sidebar.header("Replay")
mode = st.sidebar.radio("Source", ["Run a replay", "Open a stored run"], key="ex_mode", horizontal=True)
if mode == "Run a replay":
    conversation = ui.dataset_picker("ex")
    config = ui.config_form(store, "ex", conversation)
    start = st.sidebar.button("Run replay", type="primary", key="ex_run", disabled=conversation is None)
    if store.read_only:
        st.sidebar.caption("Replays are disabled: the run store is a read-only snapshot.")
    if start and conversation is not None:
        result = ui.run_replay(store, conversation, config)
        if result is not None and result.run_id:
            ui.open_run(result.run_id)
    elif store.runs().empty and conversation is not None and not store.read_only:
        # A fresh store: replay the demo on the built-in model so there is something to explore.
        result = ui.run_replay(store, conversation, config)
        if result is not None and result.run_id:
            ui.open_run(result.run_id)
else:
    picked = ui.run_picker(store, "Run", "ex_open", default=st.session_state.get(ui.RUN_KEY),
                           container=st.sidebar)
    if picked:
        ui.open_run(picked)

stored = store.runs()
run_id = st.session_state.get(ui.RUN_KEY)
if (run_id is None or stored.query("run_id == @run_id").empty) and not stored.empty:
    run_id = stored.run_id.iloc[0]  # the newest run, until another is opened
if run_id is None:
    st.title("Replay explorer")
    st.info("Run a replay from the sidebar, or open a stored run.")
    st.stop()

run = store.run(run_id)
config = run["config"]
steps = store.steps(run_id)
records = store.records(run_id)
messages = store.messages(run_id)
calls = store.model_calls(run_id)

st.title("Replay explorer")
st.text(f"Run {run_id} · {run['conversation_id']} · {run['label'] or ''}")
if run["status"] != "completed":
    st.error(f"Run status: {run['status']}. {run['error'] or ''}")

cols = st.columns(6)
cols[0].metric("Messages", run["messages"])
cols[1].metric("Memory reads", int(run["steps"] or 0))
cols[2].metric("Observer / reflector calls", f"{run['observer_calls'] or 0} / {run['reflector_calls'] or 0}")
cols[3].metric("Compression", f"{run['compression']:.1f}x" if run["compression"] else "–",
               help="Full-history tokens / what the agent sees after the last message (memory + window). "
                    "The chart's figure is the same ratio at the chosen step.")
cols[4].metric("Retention", f"{run['retention']:.2f}" if run["retention"] is not None else "–",
               help="Share of gold-answer words visible at the end (memory + window)")
cols[5].metric("Cost", f"${run['cost_usd']:.4f}" if run["cost_usd"] is not None else "–")

if steps.empty:
    st.warning("This run recorded no steps yet.")
    st.stop()
for note in analysis.findings(steps, config["observation_threshold"], calls):
    st.warning(note)

last = int(steps.step.max())
step = st.slider("Step (memory read)", 0, last, last, key=f"ex_step_{run_id}")
row = steps[steps.step == step].iloc[0]

left, right = st.columns(2)
left.plotly_chart(charts.cursor_chart(steps, int(run["messages"]), step), key="ex_cursor")
right.plotly_chart(charts.thresholds_chart(steps, config["observation_threshold"], config["reflection_threshold"],
                                           step), key="ex_thresholds")
st.plotly_chart(charts.volumes_chart(steps, step), key="ex_volumes")

st.subheader(f"At step {step}")
st.write(analysis.narrate(row, steps[steps.step == step - 1].iloc[0] if step > 0 else None, records))
figures = st.columns(5)
figures[0].metric("History", f"{int(row.history_tokens):,} tok")
figures[1].metric("Agent context", f"{int(row.context_tokens):,} tok")
figures[2].metric("Backlog", f"{int(row.backlog_tokens):,} tok")
figures[3].metric("Unreflected", f"{int(row.unreflected_tokens):,} tok")
figures[4].metric("Cursor", f"message {int(row.cursor_index) + 1}" if row.cursor_index >= 0 else "none")

timeline, seen = st.tabs(["Observations and reflections", "What the agent sees"])
with timeline:
    written = analysis.records_at(records, step)
    if written.empty:
        st.info("Nothing has been written yet at this step.")
    cost_of = {r.record_id: r for _, r in calls.iterrows() if r.record_id}
    for _, record in written.iloc[::-1].iterrows():
        call = cost_of.get(record.record_id)
        detail = (f" · {int(call.input_tokens or 0)}→{int(call.output_tokens or 0)} tokens · "
                  f"{call.latency_ms:.0f} ms" + (f" · ${call.cost_usd:.5f}" if call.cost_usd else "")
                  + (" · cache hit" if call.cache_hit else "")
                  + (f" · {int(call.attempts)} calls (tightened)" if (call.get("attempts") or 1) > 1 else "")
                  + (" · trimmed to the threshold" if bool(call.get("trimmed")) else "")) if call is not None else ""
        sources = json.loads(record.source_ids)
        with st.expander(f"{record.kind.capitalize()} written at step {int(record.step)} · "
                         f"{len(sources)} sources · {int(record.tokens or 0)} tokens{detail}",
                         expanded=bool(record.step == step)):
            ui.text_block(record.text)
            if record.kind == "observation":
                if st.toggle("Show the source messages", key=f"ex_src_{record.record_id}"):
                    st.dataframe(analysis.sources_of(record, messages)[["message_id", "role", "content", "created_at"]],
                                 hide_index=True)
            else:
                st.caption(f"Covers {len(sources)} observations.")
with seen:
    memory, window = analysis.visible_at(row, records, messages, int(config["last_messages"]))
    st.caption("The derived system message, then the window, exactly as the model gets them.")
    st.markdown("**system** (memory)")
    ui.text_block(memory or "(no memory yet)")
    for _, message in window.iterrows():
        st.text(f"{message.role} · {message.message_id}")
        ui.text_block(message.content)

probes = store.probes(run_id)
if not probes.empty:
    st.subheader("Retention per probe category")
    st.dataframe(analysis.retention_table(probes), key="ex_retention")
    with st.expander("Every probe"):
        st.dataframe(probes[probes.method == "memory"][["probe_id", "category", "question", "gold", "score",
                                                        "evidence_in_window"]], hide_index=True)
