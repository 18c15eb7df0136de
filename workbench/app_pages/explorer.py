"""Replay explorer: run or open a replay, then walk it step by step."""

import json
import time

import streamlit as st

from workbench import analysis, app_data, charts, ui
from workbench import formatting as fmt
from workbench.datasets import DatasetError, load_conversation
from workbench.replay import ReplayConfig, stopped_by_dataset
from workbench.retention import earlier_rule_note, is_earlier

store = ui.get_store()

# A link to a run at a step (the address this page keeps: ?run=…&step=…) opens it there.
if (note := app_data.link_note(dict(st.query_params))) and note != st.session_state.get("_ex_link_note"):
    st.session_state["_ex_link_note"] = note  # (said once, as the link is followed once)
    st.warning(ui.plain(note))
if (linked := app_data.linked_step(dict(st.query_params))) and linked != st.session_state.get("_ex_link"):
    st.session_state["_ex_link"] = linked
    if linked[0] in set(store.runs().run_id):
        ui.open_run_at(*linked)
    else:
        ui.warn_link_run_gone(store, linked[0])

st.sidebar.header("Replay")
mode = st.sidebar.radio("Source", ["Run a replay", "Open a stored run"], key="ex_mode", horizontal=True)
conversation = None
if mode == "Run a replay":
    conversation = ui.dataset_picker("ex")
    config = ui.config_form(store, "ex", conversation)
    start = st.sidebar.button("Run replay", type="primary", key="ex_run",
                              disabled=conversation is None or store.read_only or config is None)
    if conversation is not None and config is not None and (priced := app_data.replay_cost_text(conversation, config)):
        st.sidebar.caption(priced)  # before the click, as the CLI asks before a paid replay
    if store.read_only:
        st.sidebar.caption("Replays are off: the run store is a read-only snapshot.")
    if start and conversation is not None and config is not None:
        signature, now = repr((conversation.source, conversation.id, config)), time.monotonic()
        if app_data.repeated_start(st.session_state.get("_ex_started"), signature, now):
            # A double click: never a second replay. The first click's run (one that was not in the
            # store before it, of this conversation and configuration) is resumed when the second
            # click's rerun stopped it, else opened; any other run is left alone.
            first = app_data.first_clicks_run(store.runs(), st.session_state.get("_ex_before", set()),
                                              conversation, config.to_json(), store.run)
            if first is not None and first["status"] == "interrupted":
                st.session_state["_ex_started"] = (signature, now)
                result = ui.run_replay(store, conversation, config, resume=first["run_id"])
                if result is not None and result.run_id:
                    ui.open_run(result.run_id)
            else:
                st.sidebar.info("Replayed once: a second click on Run replay within a few seconds is ignored.")
                if first is not None:
                    ui.open_run(first["run_id"])
        else:
            st.session_state["_ex_started"] = (signature, now)
            st.session_state["_ex_before"] = set(store.runs().run_id)
            result = ui.run_replay(store, conversation, config)
            if result is not None and result.run_id:
                ui.open_run(result.run_id)
    elif not store.read_only and app_data.replays_the_demo_unasked(
            (known := store.runs()).empty, conversation, config, st.session_state.get("_ex_demo_replayed", False)):
        # A fresh store: replay the demo on the built-in model so there is something to explore.
        st.session_state["_ex_demo_replayed"] = True
        result = ui.run_replay(store, conversation, config)
        if result is not None and result.run_id:
            ui.open_run(result.run_id)
    elif not store.read_only and not st.session_state.get("_ex_demo_replayed", False) and (
            unfinished := app_data.demo_to_finish(store, known, conversation, config)):
        # The first visit's demo, cut short (its tab closed while it replayed): finished now.
        st.session_state["_ex_demo_replayed"] = True
        result = ui.run_replay(store, conversation, config, resume=unfinished)
        if result is not None and result.run_id:
            ui.open_run(result.run_id)
else:
    picked = ui.run_picker(store, "Run", "ex_open", default=st.session_state.get(ui.RUN_KEY),
                           container=st.sidebar)
    if picked:
        ui.open_run(picked)

stored = store.runs()
opened = st.session_state.get(ui.RUN_KEY)
if opened is not None and mode == "Run a replay" and opened not in set(stored.run_id):
    # (the other mode's run picker says so itself) Said, never a silent switch to another run.
    st.warning(ui.plain(f"Run {opened} is no longer in the run store (deleted elsewhere); the newest run of "
                        "the conversation chosen is shown instead."))
    st.session_state.pop(ui.RUN_KEY)
if conversation is not None:
    chosen = [conversation.source, conversation.id]
    if st.session_state.get("ex_chosen") not in (None, chosen):
        # Another dataset or conversation was chosen: from now on this page shows its runs only,
        # never a run of something else as if it belonged to it.
        st.session_state["ex_scope"] = chosen
        st.session_state.pop(ui.RUN_KEY, None)
    st.session_state["ex_chosen"] = chosen
scope = st.session_state.get("ex_scope") if mode == "Run a replay" else None
if scope:
    stored = stored[(stored.dataset == scope[0]) & (stored.conversation_id == scope[1])]
run_id = st.session_state.get(ui.RUN_KEY)
if (run_id is None or stored.query("run_id == @run_id").empty) and not stored.empty:
    # The newest completed run, until another is opened: the run "Open a stored run" starts on too
    # (this mode showed the newest run of any status, a failed one's "no steps", and the other mode
    # another run).
    completed = stored[stored.status == "completed"]
    run_id = (completed if not completed.empty else stored).run_id.iloc[0]
if run_id is None or stored.query("run_id == @run_id").empty:
    st.title("Replay explorer")
    if conversation is not None:
        st.info(ui.plain(f"No run of {conversation.id} yet: press Run replay in the sidebar."))
    else:
        st.info("Run a replay from the sidebar, or open a stored run.")
    st.stop()

run = store.run(run_id)
chosen_config = config.to_json() if mode == "Run a replay" and config is not None else None  # (the sidebar's)
config = run["config"]
steps = store.steps(run_id)
records = store.records(run_id)
messages = store.messages(run_id)
calls = store.model_calls(run_id)
done = run["status"] == "completed"

st.title("Replay explorer")
st.text(f"Run {run_id} · {run['conversation_id']} · {run['label'] or ''}")
opened_for = st.session_state.get(ui.OPENED_FOR_KEY)
if opened_for and opened_for[0] == run_id and opened_for[1]:  # (the probe a user came from Compare for)
    st.info(ui.plain(opened_for[1]))
elif opened_for:  # another run is shown now: the note is not about it (nor about this run, later)
    st.session_state.pop(ui.OPENED_FOR_KEY)
if conversation is not None and [run["dataset"], run["conversation_id"]] != [conversation.source, conversation.id]:
    st.caption(ui.plain(f"This stored run replayed {run['conversation_id']}; {conversation.id}, chosen in the "
                        "sidebar, is replayed when you press Run replay."))
elif chosen_config is not None and (note := app_data.settings_note(config, chosen_config)):
    st.caption(ui.plain(note))
if not done:
    where = app_data.state_phrase(run)  # "was interrupted at step 11 of 208"
    scope = ("nothing was replayed. " if not run["steps"] else
             "the figures below describe the part replayed, not the whole conversation. ")
    if run["status"] == "failed":
        ui.error(f"**This run {where}** — {scope}", f"Error: {run['error']}" if run["error"] else "")
    else:  # stopped on purpose (Ctrl-C, a closed page) or still going: no error, and the note is not one
        note = str(run["error"] or "")
        ui.warning(f"**This run {where}** — {scope}", note[:1].upper() + note[1:])
    # Resumed here as with `replay --resume` (an experiment's runs are finished by its own Resume,
    # a running one by its process; a message of the dataset refused stops a resume there again).
    if run["status"] in ("interrupted", "failed") and app_data.missing(run.get("experiment_id")) \
            and not store.read_only and not stopped_by_dataset(run["error"]):
        models = {config.get("observer"), config.get("reflector")} - {None}
        paid = sorted(m for m in models if not str(m).startswith("omem/"))
        if st.button("Resume this run", key=f"ex_resume_{run_id}",
                     help="Continue from its last recorded step with the configuration it was recorded with"
                          + (f"; it calls {', '.join(paid)} again, which may be paid" if paid else "")):
            try:
                again = load_conversation(run["dataset"], run["conversation_id"], run["dataset_format"])
            except (DatasetError, OSError) as exc:
                ui.error("Cannot resume: its dataset cannot be read here: ", exc)
            else:
                resumed = ui.run_replay(store, again, ReplayConfig.from_json(config), resume=run_id)
                if resumed is not None and resumed.status == "completed":  # (a failure's error stays shown)
                    st.session_state.pop(f"ex_step_{run_id}", None)  # at its new end, as after a fresh run
                    st.session_state.pop(f"_kept_ex_step_{run_id}", None)
                    st.rerun()

cols = ui.MetricRow()
cols.metric("Messages", app_data.messages_text(run, steps))
cols.metric("Memory reads", fmt.display(run["steps"]) if done
               else f"{fmt.display(run['steps'])} of {fmt.display(run['planned_steps'])}")
cols.metric("Model calls", f"{fmt.display(run['observer_calls'])} / {fmt.display(run['reflector_calls'])}",
               help="Observer calls / reflector calls")
# A run that did not finish may have no whole-run compression: then the figure is the one at its
# last memory read (what the volumes chart marks there), never a bare "–" beside a chart saying 1.3x.
at_last_read = app_data.last_read_compression(run, steps)
cols.metric("Compression" + ("" if done else " (partial)"),
            fmt.ratio(run["compression"] if at_last_read is None else at_last_read),
            help=(f"At the last memory read (step {int(steps.step.max())}): history tokens so far / what the "
                  "agent saw then. The run did not finish, so there is no whole-conversation figure."
                  if at_last_read is not None else
                  "Full-history tokens / what the agent sees after the last message (memory + window). "
                  "The chart's figure is the same ratio at the chosen step."))
cols.metric("Retention", fmt.share(run["retention"]),
               help="Share of gold-answer words visible at the end (memory + window); scored on completed "
                    "runs only")
blind = run.get("blind_spot_tokens")
cols.metric("Blind spot", fmt.tokens(blind) + ("" if fmt.missing(blind) else " tok"),
               help="Mean backlog per read: tokens of messages that have left the window but are not observed "
                    "yet, so the agent sees them neither verbatim nor as notes (max "
                    f"{fmt.display(run.get('blind_spot_max'))})")
cols.metric("Cost", fmt.money(run["cost_usd"]))

end_note = app_data.compression_note(run, steps)
if end_note:
    st.caption(ui.plain(end_note))
if earlier := earlier_rule_note(run.get("scoring")):  # (a run scored before the rule changed, or by a newer omem)
    owner = run.get("experiment_id")
    how = (f"rescore --experiment {owner}" if isinstance(owner, str) and owner else f"rescore {run['run_id']}")
    st.caption(ui.plain(app_data.as_sentence(earlier) + (
        " To score it under the current rule, with no model call: " + fmt.cli_command(how, store.path)
        if is_earlier(run.get("scoring")) else "")))

if steps.empty:
    st.warning("This run recorded no steps yet." if run["status"] == "running" else
               "This run recorded no steps." if done else
               "This run recorded no steps: it ended before its first memory read (the error above says why).")
    st.stop()
for note in app_data.run_findings(run, steps, calls):
    st.warning(note)

last = int(steps.step.max())
step_key = f"ex_step_{run_id}"
ui.kept(step_key)  # (back from another page: the step left, not the last)
if step_key not in st.session_state or not 0 <= st.session_state[step_key] <= last:
    if st.session_state.get(step_key, -1) > last and st.session_state.get("_ex_link") == (run_id, st.session_state[step_key]):
        # (a link past the run's end: said, as a step that is no number is, not opened at the last without a word)
        st.warning(f"Step {st.session_state[step_key]:,} of the link is past this run's last step ({last:,}): the run "
                   "opens at its last step.")
    st.session_state[step_key] = last
passes = app_data.pass_steps(steps)


def _jump(direction: int) -> None:
    target = app_data.neighbour(passes, st.session_state[step_key], direction)
    if target is not None:
        st.session_state[step_key] = target


# The pass buttons in a row of their own above the slider: beside it, a narrow page cut them to "◀ …".
passes_nav = st.container(horizontal=True)
passes_nav.button("◀ Previous pass", key="ex_prev_pass", on_click=_jump, args=(-1,),
            disabled=app_data.neighbour(passes, st.session_state[step_key], -1) is None)
passes_nav.button("Next pass ▶", key="ex_next_pass", on_click=_jump, args=(1,),
               disabled=app_data.neighbour(passes, st.session_state[step_key], 1) is None)
if last > 0:
    step = st.slider("Step (memory read)", 0, last, key=step_key)
else:  # one read: a slider from 0 to 0 is refused by Streamlit
    step = 0
    st.caption("Step 0: this run made one memory read.")
if gap := app_data.unrecorded_read_note(run, steps):
    st.caption(gap)
row = steps[steps.step == step].iloc[0]
if dict(st.query_params) != {"run": run_id, "step": str(step)}:  # the address names what is shown: a link to it
    # (compared with the address itself: leaving the page cleared it, and coming back to the same
    # step left it bare)
    st.session_state["_ex_link"] = (run_id, step)
    st.query_params.from_dict({"run": run_id, "step": str(step)})

left, right = st.columns(2)
left.plotly_chart(charts.cursor_chart(steps, int(run["messages"]), step), key="ex_cursor")
right.plotly_chart(charts.thresholds_chart(steps, config["observation_threshold"], config["reflection_threshold"],
                                           step, calls=calls), key="ex_thresholds")
st.plotly_chart(charts.volumes_chart(steps, step), key="ex_volumes")

st.subheader(f"At step {step}")
# (step 0 as Presentation words it: "0 tokens instead of 0 (1.0x smaller)" said nothing)
st.write(app_data.step_sentence(row, steps[steps.step == step - 1].iloc[0] if step > 0 else None, records,
                                int(run["messages"])))
figures = ui.MetricRow()
figures.metric("History", f"{int(row.history_tokens):,} tok")
figures.metric("Agent context", f"{int(row.context_tokens):,} tok")
figures.metric("Backlog", f"{int(row.backlog_tokens):,} tok")
figures.metric("Unreflected", f"{int(row.unreflected_tokens):,} tok")
figures.metric("Cursor", f"message {int(row.cursor_index) + 1}" if row.cursor_index >= 0 else "none")

timeline, seen = st.tabs(["Observations and reflections", "What the agent sees"])
with timeline:
    written = analysis.records_at(records, step)
    if written.empty:
        st.info("Nothing has been written yet at this step.")
    cost_of = {r.record_id: r for _, r in calls.iterrows() if r.record_id}
    newest_first = written.iloc[::-1]
    size = 20
    if len(newest_first) > size:
        pages = app_data.page_count(len(newest_first), size)
        page = st.number_input(f"Page (of {pages}, {size} records each, newest first)", 1, pages, 1,
                               key=f"ex_page_{run_id}_{step}")
        newest_first = newest_first.iloc[app_data.page_slice(len(newest_first), int(page), size)]
    for _, record in newest_first.iterrows():
        call = cost_of.get(record.record_id)
        detail = (f" · call: {fmt.display(call.input_tokens)} tokens in, {fmt.display(call.output_tokens)} out · "
                  f"{fmt.number(call.latency_ms, 0)} ms" + (f" · {fmt.money(call.cost_usd, 5)}" if call.cost_usd else "")
                  + (" · cache hit" if call.cache_hit else "")
                  + (f" · {int(call.attempts)} calls (tightened)" if (call.get("attempts") or 1) > 1 else "")
                  + (" · trimmed to the threshold" if bool(call.get("trimmed")) else "")) if call is not None else ""
        sources = json.loads(record.source_ids)
        with st.expander(f"{record.kind.capitalize()} written at step {int(record.step)} · "
                         f"{fmt.count(len(sources), 'source')} · {fmt.count(int(record.tokens or 0), 'token')}{detail}",
                         expanded=bool(record.step == step)):
            ui.text_block(record.text)
            if call is not None and st.button("Trace: the exact request and response", key=f"ex_trace_{record.record_id}"):
                ui.open_trace(run_id, int(call.seq))
                st.switch_page("workbench/app_pages/traces.py")
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


def judged_section(run: dict, run_id: str, probes) -> None:
    """LLM-judged accuracy of the opened run (the CLI's replay --judge, from the app): an answerer
    answers each probe from the final context, a judge grades the answer; the estimate shows
    before the click, and the verdicts join the table above as its "LLM judge" column."""
    import asyncio

    from workbench.experiments import judge_stored_run
    from workbench.judge import JudgeFailed, estimate, unusable
    from workbench.models import usable_models

    judged = probes[probes.method == "llm_judge"]
    title = "LLM-judged accuracy" + (f": {fmt.share(judged.score.mean())}" if judged.score.notna().any() else "")
    with st.expander(title, expanded=False):
        if not judged.empty:
            spent = run.get("judge_cost_usd")
            st.caption(ui.plain(f"Judged: {fmt.count(len(judged), 'probe')}, "
                                f"{fmt.count(int(run.get('judge_calls') or 0), 'call')}, cost "
                                f"{'unknown' if fmt.missing(spent) else fmt.money(spent, 4)}. Judging again "
                                "replaces these verdicts."))
            if unread := int(judged.score.isna().sum()):  # (as the CLI warns: not a measured 0)
                from workbench.judge import unscored_note

                st.warning(unscored_note(unread) + ".")
        models = usable_models()
        left, right = st.columns(2)
        answerer = left.selectbox("Answerer model", models, key="ex_answerer", accept_new_options=True)
        judge = right.selectbox("Judge model", models, key="ex_judge", accept_new_options=True)
        if answerer.startswith("omem/") or judge.startswith("omem/"):  # (the default: said, not an error)
            st.info("The built-in offline model summarises: it cannot answer or grade questions. Choose LLMs "
                    "as answerer and judge (models whose provider key is set, or listed in `$OMEM_MODELS`).")
            return
        if trouble := unusable(answerer, judge):
            ui.error("Cannot judge here: ", trouble)
            return
        try:
            asked, context = ui.judging_inputs(store, run)
        except DatasetError as exc:  # (the dataset moved or changed since the run)
            ui.error("Cannot read the run's conversation: ", exc)
            return
        if not asked:
            st.caption("No probe can be judged: none has left the window with a gold answer or as an "
                       "abstention question.")
            return
        st.caption(ui.plain(f"To judge: {estimate(asked, context, answerer, judge).describe()}."))
        if st.button("Judge this run", key=f"ex_judge_run_{run_id}"):
            with st.spinner(f"Judging {fmt.count(len(asked), 'probe')}…"):
                try:
                    asyncio.run(judge_stored_run(store, run_id, answerer=answerer, judge=judge))
                except JudgeFailed as exc:
                    ui.error("Judging failed (nothing judged was stored): ", exc)
                    return
            st.rerun()


probes = store.probes(run_id)
if not probes.empty:
    st.subheader("Retention per probe category")
    per_category = analysis.retention_table(probes)
    if per_category.empty:  # (an empty table read "empty")
        st.caption(ui.plain(app_data.unscored_sentence(probes)))
    else:
        ui.table(per_category, key="ex_retention", scores=True)
        if note := app_data.beats_history_note(per_category):
            st.caption(note)
    if done and not store.read_only:
        judged_section(run, run_id, probes)
    with st.expander("Every probe"):
        every = probes[probes.method == "memory"][["probe_id", "category", "question", "gold", "score",
                                                   "evidence_in_window"]]
        every = every.iloc[app_data.natural_order(every.probe_id)]  # q2 before q10
        ui.table(every.assign(category=every.category.map(app_data.category_name)), hide_index=True,
                 key="ex_every_probe")
