"""Traces: the exact request and raw response of any observer/reflector call, with its figures."""

import streamlit as st

from workbench import app_data, ui
from workbench import formatting as fmt

store = ui.get_store()
st.title("Traces")
st.caption("Every compaction call a run made: the messages sent to the model, exactly, and its raw reply.")

# A link to a call (the address this page keeps: ?run=…&call=…) opens it, as the explorer's do a step.
query = dict(st.query_params)
if (note := app_data.link_note(query, "call")) and note != st.session_state.get("_tr_link_note"):
    st.session_state["_tr_link_note"] = note  # (said once, as the link is followed once)
    st.warning(ui.plain(note))
linked_call = None  # (the call a link just named: said when the run has no such call)
if (linked := app_data.linked_step(query, "call")) and linked != st.session_state.get("_tr_link"):
    st.session_state["_tr_link"] = linked
    if linked[0] in set(store.runs().run_id):
        st.session_state[ui.TRACE_KEY] = linked
        st.session_state.pop("tr_run", None)
        st.session_state.pop("tr_call", None)
        linked_call = linked[1]
    else:
        ui.warn_link_run_gone(store, linked[0])

wanted = st.session_state.get(ui.TRACE_KEY)
default_run = wanted[0] if wanted else st.session_state.get(ui.RUN_KEY)
run_id = ui.run_picker(store, "Run", "tr_run", default=default_run, container=st.sidebar)
if run_id is None:
    st.info("No runs yet: replay a conversation in the explorer, or run an experiment.")
    st.stop()
run = store.run(run_id)
calls = store.model_calls(run_id)
st.text(f"Run {run_id} · {run['conversation_id']} · {app_data.config_sentence(run['config'], app_data.run_name(run))}")
if calls.empty:
    if run["status"] == "completed":
        st.info("This run made no model calls (nothing was old enough to compact).")
    else:  # (a run refused before its first call read as one with nothing to compact)
        where = app_data.state_phrase(run)
        (ui.error if run["status"] == "failed" else ui.warning)(
            f"**This run {where}** before any model call. ", f"Error: {run['error']}" if run["error"] else "")
    if query != {"run": run_id}:  # (the address named the run shown before)
        st.session_state["_tr_link"] = (run_id, None)
        st.query_params.from_dict({"run": run_id})
    st.stop()

ui.figures(app_data.sortable(app_data.calls_numbers(calls), app_data.CALLS_FORMATS), hide_index=True,
           key="tr_table")  # figures sort by value (as text past the Styler limit)
seqs = [int(s) for s in calls.seq]
labels = {int(r["seq"]): app_data.call_label(r) for r in calls.to_dict("records")}
index = seqs.index(wanted[1]) if wanted and wanted[0] == run_id and wanted[1] in seqs else 0
# The explorer's step on this run, when it moved since this page last followed it: the call made at
# that step or the last one before it (it opened call 1 whatever step the explorer showed).
explorer_step = st.session_state.get(f"_kept_ex_step_{run_id}")
if linked_call is None and isinstance(explorer_step, int) and \
        st.session_state.get("_tr_step") != (run_id, explorer_step):
    st.session_state["_tr_step"] = (run_id, explorer_step)
    if (at := app_data.call_at_step(calls, explorer_step)) is not None:
        index = seqs.index(at)
        st.session_state.pop("tr_call", None)
if linked_call is not None and linked_call not in seqs:
    st.warning(f"Call {linked_call:,} of the link is not one of this run's calls ({seqs[0]:,} to {seqs[-1]:,}): "
               "its first call is shown.")
seq = st.selectbox("Call", seqs, index=index, format_func=labels.get, key="tr_call")
st.session_state[ui.TRACE_KEY] = (run_id, seq)
if query != {"run": run_id, "call": str(seq)}:  # the address names the call shown: a link to it
    st.session_state["_tr_link"] = (run_id, seq)
    st.query_params.from_dict({"run": run_id, "call": str(seq)})
call = calls[calls.seq == seq].iloc[0].to_dict()

figures = ui.MetricRow()
figures.metric("Tokens in", fmt.display(call["input_tokens"]))
figures.metric("Tokens out", fmt.display(call["output_tokens"]))
figures.metric("Latency", fmt.MISSING if app_data.missing(call["latency_ms"])
                  else f"{fmt.tokens(call['latency_ms'])} ms")  # (whole milliseconds, with separators)
figures.metric("Cost", fmt.money(call["cost_usd"], 6))
figures.metric("Cache hit", fmt.MISSING if app_data.missing(call["cache_hit"]) else
                  ("yes" if call["cache_hit"] else "no"))
figures.metric("Waiting (tokens)", f"{fmt.display(call['volume_before'])} → {fmt.display(call['volume_after'])}",
                  help="Backlog (observe) or unreflected notes (reflect) before and after the pass, in tokens")
st.text(f"{call['stage']} · {call['model']} · prompt {call['prompt_version']} · "
        f"{fmt.count(0 if fmt.missing(call['source_count']) else int(call['source_count']), 'source')} · "
        f"step {fmt.display(call['step'])}")
if not app_data.missing(call.get("error")):
    ui.error("**This call failed:** ", call["error"])
if not app_data.missing(call.get("step")) and st.button("Open this step in the explorer", key=f"tr_open_{run_id}"):
    ui.open_run_at(run_id, int(call["step"]))
    st.switch_page("workbench/app_pages/explorer.py")

attempts = app_data.trace_attempts(call)
if not attempts:
    st.info("No trace was stored for this call (the run was recorded without traces, or before they existed).")
for attempt in attempts:
    if len(attempts) > 1:
        st.subheader(f"Attempt {attempt['attempt']} of {len(attempts)}")
    left, right = st.columns(2)
    with left:
        st.markdown("**Request** (the messages sent)")
        for message in attempt["messages"] or []:
            st.text(str(message.get("role", "?")))
            ui.text_block(str(message.get("content", "")), height=300 if len(str(message.get("content", ""))) > 2000
                          else None)
        if attempt["messages"] is None:
            st.caption("Not stored.")
    with right:
        st.markdown("**Raw response**")
        ui.text_block(attempt["response"] if attempt["response"] is not None else "(not stored)")
