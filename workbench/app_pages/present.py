"""Presentation mode: a clean walk through one run for stakeholders."""

import streamlit as st

from workbench import analysis, charts, ui

store = ui.get_store()
run_id = ui.run_picker(store, "Run to present", "pres_run", default=st.session_state.get(ui.RUN_KEY),
                       container=st.sidebar)
if run_id is None:
    st.info("No runs yet: replay a conversation in the explorer first.")
    st.stop()

run = store.run(run_id)
steps = store.steps(run_id)
records = store.records(run_id)
if steps.empty:
    st.info("This run has no steps.")
    st.stop()

key = f"pres_step_{run_id}"
last = int(steps.step.max())
st.session_state.setdefault(key, 0)
autoplay = st.sidebar.toggle("Autoplay", key="pres_auto")
speed = st.sidebar.slider("Seconds per step", 0.5, 5.0, 1.5, key="pres_speed")

st.title("Observational memory, step by step")
big = st.columns(3)
big[0].metric("Compression", f"{run['compression']:.1f}x" if run["compression"] else "–",
              help="Full history tokens / tokens the agent sees at the end")
big[1].metric("Facts retained", f"{run['retention']:.0%}" if run["retention"] is not None else "–",
              help="Share of probe answers still visible to the agent at the end")
big[2].metric("Model calls", int((run["observer_calls"] or 0) + (run["reflector_calls"] or 0)))

back, _, forward = st.columns([1, 6, 1])
if back.button("◀ Back", key="pres_back", disabled=st.session_state[key] <= 0):
    st.session_state[key] -= 1
if forward.button("Next ▶", key="pres_next", disabled=st.session_state[key] >= last):
    st.session_state[key] += 1


@st.fragment(run_every=speed if autoplay else None)
def walk() -> None:
    if autoplay and st.session_state[key] < last:
        st.session_state[key] += 1
    step = st.session_state[key]
    row = steps[steps.step == step].iloc[0]
    previous = steps[steps.step == step - 1].iloc[0] if step > 0 else None
    st.progress((step + 1) / (last + 1), text=f"Step {step} of {last}")
    st.subheader(analysis.narrate(row, previous, records))
    st.plotly_chart(charts.volumes_chart(steps[steps.step <= step], step), key="pres_volumes")
    written = records[records.step == step]
    for _, record in written.iterrows():
        st.markdown(f"**New {record.kind}**")
        ui.text_block(record.text)


walk()
