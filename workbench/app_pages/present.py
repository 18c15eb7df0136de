"""Presentation mode: a clean walk through one run for stakeholders."""

import streamlit as st

from workbench import app_data, charts, export_html, ui
from workbench import formatting as fmt
from workbench.retention import earlier_rule_note
from workbench.runstore import RunStoreError

store = ui.get_store()
# A link to a run's presentation (the address this page keeps: ?run=…) opens it.
if (linked := app_data.linked_step(dict(st.query_params))) and linked[0] != st.session_state.get("_pres_link"):
    st.session_state["_pres_link"] = linked[0]
    if linked[0] in set(store.runs().run_id):
        ui.open_run(linked[0])
        st.session_state.pop("pres_run", None)
        if linked[1] is not None:  # (?run=…&step=N: it opened at step 0, the step dropped without a word)
            st.session_state[f"pres_step_{linked[0]}"] = linked[1]
            st.session_state["_pres_linked_step"] = linked
        elif note := app_data.link_note(dict(st.query_params)):
            st.warning(ui.plain(note.replace("opens at its last step", "opens at its first step")))
    else:
        ui.warn_link_run_gone(store, linked[0])
run_id = ui.run_picker(store, "Run to present", "pres_run", default=st.session_state.get(ui.RUN_KEY),
                       container=st.sidebar)
if run_id is not None and dict(st.query_params) != {"run": run_id}:  # the address names the run: a link to it
    st.session_state["_pres_link"] = run_id
    st.query_params.from_dict({"run": run_id})
if run_id is None:
    st.title("Observational memory, step by step")
    st.info("No runs yet: replay a conversation in the explorer first.")
    st.stop()

run = store.run(run_id)
steps = store.steps(run_id)
records = store.records(run_id)
done = run["status"] == "completed"
st.title("Observational memory, step by step")
st.text(f"{run['conversation_id']} · " + app_data.config_sentence(run["config"], app_data.run_name(run)))
if not done:  # never present a run that did not finish as if it had
    said = (f"**Not a finished run: it {app_data.state_phrase(run)}.** "  # "it was interrupted at step 15 of 208"
            "Its figures cover only the part replayed. ")
    if run["status"] == "failed":
        ui.error(said, run["error"] or "")
    else:  # an interrupt is not an error: a warning, its note a sentence
        note = str(run["error"] or "")
        ui.warning(said, note[:1].upper() + note[1:])
if steps.empty:
    st.info("This run has no steps to present.")
    st.stop()

key = f"pres_step_{run_id}"
last = int(steps.step.max())
st.session_state.setdefault(key, 0)
if st.session_state[key] > last:  # (a link past the run's end: said, as the explorer says it)
    if st.session_state.pop("_pres_linked_step", None) == (run_id, st.session_state[key]):
        st.warning(f"Step {st.session_state[key]:,} of the link is past this run's last step ({last:,}): the "
                   "presentation opens at its last step.")
    st.session_state[key] = last
autoplay = st.sidebar.toggle("Autoplay", key="pres_auto")
speed = st.sidebar.slider("Seconds per step", 0.5, 5.0, 1.5, key="pres_speed")

big = ui.MetricRow()  # (in three columns at 900 px: "Compression (pa…")
# An unfinished run may have no whole-run compression: its figure at the last read, as the chart's.
at_last_read = app_data.last_read_compression(run, steps)
big.metric("Compression" + ("" if done else " (partial)"),
           fmt.ratio(run["compression"] if at_last_read is None else at_last_read),
           help=f"At the last memory read (step {int(steps.step.max())}): the run did not finish"
           if at_last_read is not None else "Full history tokens / tokens the agent sees at the end")
big.metric("Answer words retained", fmt.percent_of(run["retention"]),
           help="Mean share of each probe's gold-answer words still visible to the agent at the end (memory + "
                "window), over the probes whose evidence has left the window; completed runs only. A word "
                "count, not a judgement of whether the fact survived (the CLI's --answerer and --judge give that).")
calls = [run["observer_calls"], run["reflector_calls"]]
big.metric("Model calls", fmt.display(sum(0 if fmt.missing(c) else int(c) for c in calls)),
           help=f"{fmt.display(run['observer_calls'])} observer and {fmt.display(run['reflector_calls'])} reflector "
                "calls (the explorer's “Model calls” shows them as observer / reflector)")
end_note = app_data.compression_note(run, steps)
if end_note:
    st.caption(ui.plain(end_note))
if unscored := app_data.no_retention_note(run, store.probes(run_id)):
    st.caption(ui.plain(unscored))
if earlier := earlier_rule_note(run.get("scoring")):  # (as the explorer says it)
    st.caption(ui.plain(app_data.as_sentence(earlier)))
for note in app_data.run_findings(run, steps, store.model_calls(run_id)):  # (as the explorer says them)
    st.warning(note)

passes = app_data.pass_steps(steps)


def _move(target: int | None) -> None:
    if target is not None:
        st.session_state[key] = max(0, min(last, target))


total_messages = int(run["messages"])
top = float(max(steps.history_tokens.max(), steps.context_tokens.max())) * 1.08 or 1.0


@st.fragment(run_every=speed if autoplay else None)
def walk() -> None:
    try:  # deleted elsewhere: the whole page again, whose picker says so (Next and Autoplay
        gone = not store.has_run(run_id)  # stepped on through the deleted run's steps)
    except RunStoreError:  # (the store held by a writer: the steps shown are read already, go on)
        gone = False
    if gone:
        st.rerun()
    if autoplay and st.session_state[key] < last:
        st.session_state[key] += 1
    step = st.session_state[key]
    # The buttons are drawn with the step they move from (outside the fragment, Autoplay left them
    # as they were: "Next ▶" still enabled at the last step). One row that wraps: in columns of a
    # 900 px page the labels were cut to "◀…", "Jump to …", "N…".
    nav = st.container(horizontal=True, vertical_alignment="center")
    nav.button("◀ Back", key="pres_back", disabled=step <= 0, on_click=lambda: _move(step - 1))
    nav.button("Next ▶", key="pres_next", disabled=step >= last, on_click=lambda: _move(step + 1))
    nav.button("Jump to next compaction »", key="pres_jump",
               disabled=app_data.next_compaction(steps, step) is None,
               on_click=lambda: _move(app_data.next_compaction(steps, step)))
    row = steps[steps.step == step].iloc[0]
    previous = steps[steps.step == step - 1].iloc[0] if step > 0 else None
    st.progress((step + 1) / (last + 1), text=f"Step {step} of {last}")
    # The step's first sentence as the heading, the rest as text: whole, as a heading, it filled a
    # 900 px screen with seven lines of large type above the chart.
    headline, rest = app_data.headline(app_data.step_sentence(row, previous, records, total_messages))
    st.subheader(headline)
    if rest:
        st.markdown(ui.plain(rest))
    figure = charts.volumes_chart(steps[steps.step <= step], step)
    figure.update_xaxes(range=[-0.5, last + 0.5])  # a stable axis: the whole run's width from step 0
    figure.update_yaxes(range=[0, top])
    st.plotly_chart(figure, key="pres_volumes")
    written = records[records.step == step]
    for _, record in written.iterrows():
        st.markdown(f"**New {record.kind}**")
        ui.text_block(record.text)


walk()

st.divider()
if st.button("Prepare a self-contained HTML file", key=f"pres_prepare_{run_id}",
             help="Charts and text in one file that opens without the app or a network"):
    st.session_state["pres_html"] = (run_id, export_html.run_html(store, run_id))
prepared = st.session_state.get("pres_html")
if prepared and prepared[0] == run_id:
    st.download_button("Download HTML", prepared[1], file_name=f"omem-{run_id}.html", mime="text/html",
                       key="pres_download")
