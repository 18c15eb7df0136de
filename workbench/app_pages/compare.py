"""Compare: two configurations of an experiment (figures with CIs, probes × configurations grid,
loss funnel, memory and prompt diffs); two stored runs or two fresh replays as secondary modes."""

import json

import streamlit as st

from workbench import analysis, app_data, charts, ui
from workbench import formatting as fmt
from workbench.experiments import conversation_tally, summaries_of, tally_text
from workbench.retention import scoring_note
from workbench.stats import MIN_PAIRED

store = ui.get_store()
st.title("Compare")

st.sidebar.header("Compare")
MODES = ["Two configurations of an experiment", "Pick two stored runs", "Run two configurations"]
ui.kept("cmp_mode", MODES)  # (each picker of this page comes back as it was left, from another page)
mode = st.sidebar.radio("What", MODES, key="cmp_mode")


def experiment_comparison() -> None:
    experiment_id = ui.experiment_picker(store, "Experiment", "cmp_xp", container=st.sidebar)
    if experiment_id is None:
        st.info("No experiments yet: start one on the Experiments page, or compare two stored runs "
                "(sidebar).")
        st.stop()
    tables = ui.experiment_tables(store, experiment_id)
    experiment = tables["experiment"]
    labels = [entry["label"] for entry in experiment["configs"]]
    configs = {entry["label"]: entry["config"] for entry in experiment["configs"]}
    if len(labels) < 2:
        st.info("This experiment has one configuration: there is nothing to compare it with.")
        st.stop()
    pair = st.session_state.pop("cmp_xp_pair", None)  # a point clicked in Tune
    if pair and all(p in labels for p in pair):
        st.session_state["cmp_xp_a"], st.session_state["cmp_xp_b"] = pair
    # A link names the pair too (?experiment=…&a=…&b=…), followed once: a comparison can be sent or
    # bookmarked (a reload showed the newest experiment's first two configurations).
    linked = (st.query_params.get("a"), st.query_params.get("b"))
    if any(linked) and linked != st.session_state.get("_cmp_xp_link"):
        st.session_state["_cmp_xp_link"] = linked
        for key, value in zip(("cmp_xp_a", "cmp_xp_b"), linked):
            if value in labels:
                st.session_state[key] = value
            elif value:
                st.warning(ui.plain(f"The link names configuration {value!r}, which {experiment_id} does not have: "
                                    "another is shown."))
    for key, other in (("cmp_xp_a", "cmp_xp_b"), ("cmp_xp_b", "cmp_xp_a")):
        ui.kept(key, labels)  # (back from another page: the pair picked before, not the first two)
        if st.session_state.get(key) not in labels:  # (another experiment's: the first the other side is not)
            st.session_state[key] = next(x for x in labels if x != st.session_state.get(other))
    a = st.sidebar.selectbox("Configuration A", labels, key="cmp_xp_a")
    ui.whole_label(st.sidebar, a)
    b = st.sidebar.selectbox("Configuration B", labels, key="cmp_xp_b")
    ui.whole_label(st.sidebar, b)
    if (st.query_params.get("a"), st.query_params.get("b")) != (a, b):  # the address names the pair shown
        st.session_state["_cmp_xp_link"] = (a, b)
        st.query_params["a"], st.query_params["b"] = a, b
    summaries, probes, losses, runs = (tables[k] for k in ("summaries", "probes", "losses", "runs"))
    # The conversations with a run of A and of B first (the charts and memories need both: the
    # first listed had none of A after its run was deleted, and those sections were left out
    # without a word); the others say which side they lack.
    lacking = {c: [n for n, label in (("A", a), ("B", b))
                   if not ((runs.config_label == label) & (runs.conversation_id == c)).any()]
               for c in experiment["conversations"]} if not runs.empty else {c: ["A", "B"] for c in experiment["conversations"]}
    conversations = sorted(experiment["conversations"], key=lambda c: bool(lacking[c]))
    # (a new widget for another experiment's conversations: the browser kept showing the old one's)
    conversation = ui.choice(st.sidebar, "Conversation (charts and memories)", conversations, key="cmp_xp_conv",
                             format_func=lambda c: f"{c} (no run of {' and '.join(lacking[c])})" if lacking[c] else c) \
        if len(conversations) > 1 else conversations[0]

    st.text(f"{experiment_id} · A = {a} · B = {b}")
    running = ui.running_notice(store, experiment, runs)  # (partial figures read as final: "CI excludes 0: yes")
    none_yet = running and app_data.completed_pairs(runs) == 0  # (no probes is not "nothing completed")
    # (while it runs, what is missing is not replayed yet: it said "these conversations have no probes"
    # and "it did not run, or was deleted … Resume the experiment")
    YET = "no run of the experiment has completed yet (it is running: the page follows it)"
    if a == b:
        st.warning("A and B are the same configuration.")
    shared, note = app_data.pair_conversations(runs, a, b)
    if note:  # figures of A on some conversations beside B's on others would not compare
        st.warning(ui.plain(note))
        if not shared:
            st.stop()
        summaries = summaries_of(experiment, runs, probes, losses, conversations=shared)
        probes, losses = probes[probes.conversation_id.isin(shared)], losses[losses.conversation_id.isin(shared)]
    note = app_data.offline_prompt_note(configs[a], configs[b])
    if note:
        st.warning(note)
    ui.rule_warning(experiment, runs)
    if not probes.empty:
        tally = conversation_tally(probes, a, b)
        st.info(ui.plain("Retention, B vs A (paired over the probes both scored): "
                         + app_data.verdict(probes, a, b) + tally_text(a, b, tally)))

    st.subheader("Figures")
    table = app_data.figures_comparison(summaries, probes, a, b)
    shown = table.assign(differs=table.differs.map({True: "yes", False: ""})).rename(
        columns={"differs": "CI excludes 0", "95% CI of B − A": "95% CI", "A": f"A · {a}", "B": f"B · {b}"})
    highlight = table.differs.tolist()
    # The difference and its interval first (what a comparison is read for; they ran off a 900 px
    # page behind two columns as wide as their headers), then A and B in narrow columns: hovering
    # a header shows its whole label. The row names stay pinned.
    right = dict(alignment="right")
    ui.figures(shown.style.apply(lambda row: ["background-color: #ffeaa7; font-weight: 600"
                                              if highlight[row.name] else "" for _ in row], axis=1),
               hide_index=True, key="cmp_xp_figures", height=35 * (len(shown) + 1) + 3,
               column_order=["figure", "B − A", "95% CI", "probes", f"A · {a}", f"B · {b}", "CI excludes 0"],
               column_config={"figure": st.column_config.Column(pinned=True),  # (as wide as its longest name)
                              "B − A": st.column_config.Column(width=64, **right),
                              "95% CI": st.column_config.Column(width=122, help="95% interval of B − A "
                                                                "(paired bootstrap over probes)", **right),
                              "probes": st.column_config.Column(width=64, help="Probes both configurations "
                                                                "scored: the pairs behind the difference", **right),
                              f"A · {a}": st.column_config.Column(width=80, help=ui.plain(f"A · {a}"), **right),
                              f"B · {b}": st.column_config.Column(width=80, help=ui.plain(f"B · {b}"), **right),
                              "CI excludes 0": st.column_config.Column(width=100)})
    listed, scored = app_data.probe_counts(probes, [a, b])
    unscored = (f"; the other {listed - scored:,} have no gold answer or their evidence is still in the final window"
                if listed > scored else "")
    if scored:
        st.caption(f"Retention pools the {fmt.count(scored, 'probe')} scored (they have a gold answer and their "
                   f"evidence has left the window{unscored}). Highlighted: "
                   "a difference whose 95% interval excludes zero (paired bootstrap over probes; fewer than "
                   f"{MIN_PAIRED} pairs get no interval).")
    else:  # ("Retention pools the 0 probes scored")
        st.caption("No probe is scored, so retention is not compared: " + (
            f"none of the {fmt.count(listed, 'probe')} has a gold answer the word score reads with its evidence out "
            "of the window." if listed else YET + "." if none_yet else "these conversations have no probes."))

    pick = {}
    for name, label in (("A", a), ("B", b)):
        mine = runs[(runs.config_label == label) & (runs.conversation_id == conversation)]
        pick[name] = mine.run_id.iloc[-1] if not mine.empty else None
    if all(pick.values()):
        info = {n: store.run(r) for n, r in pick.items()}
        steps = {n: store.steps(r) for n, r in pick.items()}
        calls = {n: store.model_calls(r) for n, r in pick.items()}
        for n in ("A", "B"):
            if info[n]["status"] != "completed":
                ui.error(f"**{n} on {ui.plain(conversation)} "
                         f"{app_data.status_text(info[n]['status'], info[n]['steps'], info[n]['planned_steps'])}**: ",
                         info[n]["error"] or "")
        st.subheader(ui.plain(f"Token volumes and thresholds on {conversation} (A and B on the same y scales)"))
        volumes = {n: charts.volumes_chart(steps[n]) for n in pick}
        top_v = app_data.shared_range(*[steps[n].history_tokens for n in pick])[1]
        charts.share_y(*volumes.values(), top=top_v)
        top_t = max(app_data.shared_range(*[steps[n].backlog_tokens for n in pick],
                                          *[steps[n].unreflected_tokens for n in pick])[1],
                    1.1 * max(configs[a]["reflection_threshold"], configs[b]["reflection_threshold"]))
        top_t = max([top_t] + [float(c.volume_before.max()) * 1.08 for c in calls.values()
                               if not c.empty and c.volume_before.notna().any()])
        thresholds = {n: charts.thresholds_chart(steps[n], configs[label]["observation_threshold"],
                                                 configs[label]["reflection_threshold"], calls=calls[n], top=top_t)
                      for n, label in (("A", a), ("B", b))}  # (labels placed for the shared scale)
        charts.share_y(*thresholds.values(), top=top_t)
        for title, figures in (("token volumes", volumes), ("thresholds and passes", thresholds)):
            # Side by side when the page is wide enough, one under the other when not (two columns
            # of a 900 px page cut the titles and printed the threshold labels over the passes).
            row = st.container(horizontal=True)
            for n, label in (("A", a), ("B", b)):
                figures[n].update_layout(title=dict(text=f"{n} · {app_data.html_text(label)}: {title}",
                                                    font=dict(size=14)))
                row.plotly_chart(figures[n], key=f"cmp_xp_{title}_{n}", width=charts.SIDE_BY_SIDE_WIDTH)
        # The charts' "compression at step N" (what the agent saw at its last read) beside the run's
        # (the whole conversation after its last message) read as two answers unexplained. (The
        # figures above pool every conversation: the note names the one charted.)
        notes = [f"{n} on {conversation}: {note}" for n in ("A", "B")
                 if (note := app_data.compression_note(info[n], steps[n]))]
        if notes:
            st.caption(ui.plain(" ".join(notes)))

    st.subheader("Probes × configurations")
    ordered = list(dict.fromkeys([a, b, *labels]))  # A and B first, as in the figures above
    grid = app_data.probe_grid(probes, losses, ordered)
    if grid.empty:
        st.info(ui.plain(f"No probes to show: {YET}.") if none_yet else
                "This experiment's conversations have no scored probes.")
    else:
        differs_only = st.toggle("Only probes whose scores differ", key="cmp_xp_differs",
                                 help="Probes the configurations score differently, by any amount")
        view = app_data.grid_view(grid, ordered, differs_only=differs_only)
        listed, scored = app_data.probe_counts(probes, ordered)
        differs, flips = app_data.grid_differences(grid, ordered)
        st.caption(f"{len(view):,} of {fmt.count(len(grid), 'probe')} shown: {int(differs.sum()):,} scored "
                   f"differently, {int(flips.sum()):,} of them kept by one configuration and lost by another"
                   + (f"; {listed - scored:,} without a gold answer or with their evidence still in the window "
                      + ("are left out here (they score alike: not scored)" if differs_only else
                         "are listed as not scored") if listed > scored
                      else "")
                   + ". Each cell: the probe's score with that configuration and, when lost, the stage and step "
                   "where its answer was lost. Select a cell to open that run at that step.")
        widths = app_data.text_widths(view[ordered])  # a cell reads whole: "lost 0.00 at r…" hid the stage and step
        # The cells compared next to the question they answer (after five other columns they ran off
        # the page's edge, at 900 px entirely)
        event = st.dataframe(view, hide_index=True, key="cmp_xp_grid", on_select="rerun",
                             column_order=["question", *ordered, "gold", "category", "conversation", "probe"],
                             selection_mode="single-cell", column_config={
                                 **{label: st.column_config.TextColumn(width=widths.get(label)) for label in ordered},
                                 "question": st.column_config.TextColumn(width="medium", pinned=True),
                                 "conversation": st.column_config.TextColumn(width="small"),
                                 "category": st.column_config.TextColumn(width="small")})
        cells = (event.selection.get("cells") if event and event.selection else None) or []
        if cells:
            position, column = cells[0]
            if column in ordered and position < len(view):
                target = app_data.grid_target(grid, view.index[position], column)
                if target:
                    ui.open_run_at(*target, why=app_data.grid_reason(grid, view.index[position], column))
                    st.switch_page("workbench/app_pages/explorer.py")
        if not view.empty:
            left, middle = st.columns([3, 2])
            # A picker per experiment, whose options name the probe itself (conversation and id),
            # never a row number: after a switch of experiment the browser kept showing the old
            # experiment's probe while the row number it kept opened another probe's run.
            rows = {f"{r.conversation} · {r.probe}": i for i, r in view.iterrows()}
            questions = {key: f"{key} · {view.at[i, 'question']}" for key, i in rows.items()}
            # (a new widget when the toggle or another grid changes the options: see ui.choice)
            row = rows[ui.choice(left, "Probe", list(rows), key=f"cmp_xp_probe_{experiment_id}",
                                 format_func=questions.get)]
            # A until another is picked here: it kept the A of its first draw, so after A changed,
            # "Open run" opened a configuration that was neither A nor B.
            if st.session_state.get("cmp_xp_cell_config") in (None, st.session_state.get("_cmp_xp_cell_a")):
                st.session_state["cmp_xp_cell_config"] = a
            st.session_state["_cmp_xp_cell_a"] = a
            label = ui.choice(middle, "Configuration", ordered, key="cmp_xp_cell_config")
            target = app_data.grid_target(grid, row, label)
            where = "at the step its evidence was lost" if target and target[1] is not None else "at its last step"
            # On a row of its own: in a sixth of a 900 px page its label read "Op…".
            if st.button("Open run", key=f"cmp_xp_open_{experiment_id}", disabled=target is None, help=f"Opens the run {where}"):
                ui.open_run_at(*target, why=app_data.grid_reason(grid, row, label))
                st.switch_page("workbench/app_pages/explorer.py")

    st.subheader("Loss funnel")
    funnel = app_data.funnel_table(summaries, ordered)
    if funnel.empty or not int(funnel.iloc[0].sum()):
        st.info(ui.plain(f"No funnel to draw: {YET}.") if none_yet else
                "No probe with evidence and a gold answer: no funnel to draw.")
    else:
        said = int(funnel.iloc[0].max())
        st.caption(f"{said:,} scored probes have evidence named by the dataset (the messages that hold the "
                   "answer); the funnel follows them from evidence said to visible at the end. A scored probe "
                   "without evidence has no path to follow and is not counted here.")
        note = app_data.funnel_note(summaries, ordered)
        if note:
            st.caption(ui.plain(note))
        st.plotly_chart(charts.funnel_chart(funnel), key="cmp_xp_funnel")
        ui.figures(funnel, key="cmp_xp_funnel_table")

    if not all(pick.values()) and running:
        st.info(ui.plain(f"No run of {' and '.join(n for n, r in pick.items() if r is None)} on {conversation} yet "
                         "(the experiment is running): its charts and final memories follow when it is replayed."))
    elif not all(pick.values()):
        st.info(ui.plain(f"No run of {' and '.join(n for n, r in pick.items() if r is None)} on {conversation} (it did "
                         "not run, or was deleted): its charts and final memories need a run of A and of B. Pick "
                         "another conversation in the sidebar, or Resume the experiment to replay it."))
    st.subheader("Final memories")
    if all(pick.values()):
        texts = {}
        for n, label in (("A", a), ("B", b)):
            texts[n] = app_data.final_memory(steps[n], store.records(pick[n]), store.messages(pick[n]),
                                             int(configs[label]["last_messages"]))
        diff = app_data.text_diff(texts["A"], texts["B"], f"A · {a}", f"B · {b}")
        st.caption(ui.plain(f"What the agent saw as memory after the last message of {conversation}: "
                            "a line diff (- only in A, + only in B)."))
        ui.diff_block(diff, empty="The two memories are identical.")
        left, right = st.columns(2)
        for column, n in ((left, "A"), (right, "B")):
            with column.expander(f"{n}: the whole memory"):
                ui.text_block(texts[n] or "(no memory)")
    st.subheader("Prompts")
    for name in ("observer", "reflector"):
        (va, ta), (vb, tb) = app_data.prompt_of(configs[a], name), app_data.prompt_of(configs[b], name)
        if ta == tb:
            st.text(f"{name.capitalize()} prompt: the same text in A and B ({va}).")
        else:
            st.text(f"{name.capitalize()} prompt: A uses {va}, B uses {vb}:")
            ui.diff_block(app_data.text_diff(ta, tb, f"A · {name} {va}", f"B · {name} {vb}"), empty="(no difference)")
    st.stop()


if mode == MODES[0]:
    experiment_comparison()

run_a = run_b = None
if mode == MODES[2]:
    conversation = ui.dataset_picker("cmp")
    left, right = st.columns(2)
    with left.expander("Configuration A", expanded=True):
        config_a = ui.config_form(store, "cmp_a", conversation, container=st)
    with right.expander("Configuration B", expanded=True):
        config_b = ui.config_form(store, "cmp_b", conversation, container=st)
    if config_a is not None and config_b is not None and config_a.to_json() == config_b.to_json():
        st.warning("Configurations A and B are the same: both runs would replay alike. Change a setting on one "
                   "side to compare.")
    elif config_a is not None and config_b is not None and \
            (ignored := app_data.offline_prompt_note(config_a.to_json(), config_b.to_json())):
        st.warning(ui.plain(ignored))  # before the runs, as the Experiments form says it (it came after them)
    if st.button("Run both", type="primary", key="cmp_run",
                 disabled=conversation is None or store.read_only or config_a is None or config_b is None):
        result_a = ui.run_replay(store, conversation, config_a)  # labelled by their configuration: "A" and
        result_b = ui.run_replay(store, conversation, config_b)  # "B" mean nothing outside this page
        if result_a and result_b and result_a.run_id and result_b.run_id:
            st.session_state["cmp_pair"] = (result_a.run_id, result_b.run_id)
    run_a, run_b = st.session_state.get("cmp_pair", (None, None))
else:
    runs = store.runs()
    if len(runs) < 2:
        st.info("Compare needs two stored runs: run two configurations here, or replays in the explorer.")
        st.stop()
    ids = list(runs.run_id)
    default_a, default_b = app_data.default_run_pair(runs)
    run_a = ui.run_picker(store, "Run A", "cmp_a_pick", default=default_a, container=st.sidebar, keep=True)
    run_b = ui.run_picker(store, "Run B", "cmp_b_pick", default=default_b, container=st.sidebar, keep=True)

if not run_a or not run_b:
    st.info("Choose or run two configurations.")
    st.stop()
if run_a == run_b:
    st.warning("Run A and run B are the same run.")

info_a, info_b = store.run(run_a), store.run(run_b)
for name, info in (("A", info_a), ("B", info_b)):
    if info["status"] != "completed":  # its figures cover a prefix only: never compared as if final
        ui.error(f"**Run {name} {app_data.status_text(info['status'], info['steps'], info['planned_steps'])}**: its "
                 "figures describe only the part replayed. ", info["error"] or "")
if info_a["conversation_id"] != info_b["conversation_id"]:
    st.warning("The two runs replayed different conversations; their figures are not directly comparable.")
if mode != MODES[2] and (note := app_data.offline_prompt_note(info_a["config"], info_b["config"])):
    st.warning(note)  # (as for an experiment's pair; said above the form when it ran them)
if note := scoring_note([info_a.get("scoring"), info_b.get("scoring")]):
    st.warning(ui.plain(app_data.as_sentence(note)))

st.subheader("Figures")
table = analysis.comparison_shown(analysis.compare_runs(store, run_a, run_b))
# Each setting has a row of its own: the label restating them all only ran past the column's edge.
# A run's own name (its experiment's label for it, or one given at replay) stays.
names = [app_data.run_name(info) for info in (info_a, info_b)]
if any(names):
    for column, name in zip(table.columns, names):
        table.at["configuration", column] = fmt.display(name)
else:
    table = table.drop(index="configuration")
table.columns = [f"A · {run_a}", f"B · {run_b}"] if run_a != run_b else [f"A · {run_a}"]
ui.figures(table, key="cmp_table", height=35 * (len(table) + 1) + 3,
           column_config={"_index": st.column_config.Column(width="medium")})  # row names read whole

steps_a, steps_b = store.steps(run_a), store.steps(run_b)
for title, build in (
    ("Token volumes", lambda steps, info: charts.volumes_chart(steps)),
    ("Thresholds and passes", lambda steps, info: charts.thresholds_chart(  # drawn as in the explorer
        steps, info["config"]["observation_threshold"], info["config"]["reflection_threshold"],
        calls=store.model_calls(info["run_id"]))),
):
    st.subheader(title)
    row = st.container(horizontal=True)  # (wraps on a narrow page, as above)
    for steps, info, name in ((steps_a, info_a, "A"), (steps_b, info_b, "B")):
        if steps.empty:  # (an empty plot with a y axis from -1 to 4 said nothing)
            row.caption(f"{name}: no memory read was recorded, so there is nothing to draw.")
            continue
        figure = build(steps, info)
        figure.update_layout(title=f"{name}: {title.lower()}")
        row.plotly_chart(figure, key=f"cmp_{title}_{name}", width=charts.SIDE_BY_SIDE_WIDTH)

st.subheader("Probes one keeps and the other loses")
diff = analysis.probe_diff(store, run_a, run_b)
if info_a["conversation_id"] != info_b["conversation_id"]:  # (no probe in common: not an agreement)
    st.info("The two runs replayed different conversations: they share no probe to compare.")
elif diff.empty:
    st.info("No probe is kept by one run and lost by the other (or the conversation has no probes).")
else:
    diff = diff.assign(kept_by=diff.kept_by.map({run_a: "A", run_b: "B"}),
                       category=diff.category.map(app_data.category_name))
    st.dataframe(diff[["kept_by", "category", "question", "gold", "score_a", "score_b"]].rename(
        columns={"kept_by": "kept by", "score_a": "score A", "score_b": "score B"}), hide_index=True, key="cmp_diff")

st.subheader("What each wrote")
left, right = st.columns(2)
for column, run_id, name in ((left, run_a, "A"), (right, run_b, "B")):
    records = store.records(run_id)
    column.markdown(f"**{name}** · {fmt.count(len(records), 'record')}")
    for _, record in records.iterrows():
        with column.expander(f"{record.kind} at step {int(record.step)} · "
                             f"{fmt.count(len(json.loads(record.source_ids)), 'source')} · "
                             f"{fmt.count(int(record.tokens or 0), 'token')}"):
            ui.text_block(record.text)
