"""Experiments: launch a dataset × grid of configurations, watch it, resume, list, export, delete."""

import time
from pathlib import Path

import streamlit as st

from workbench import app_data, background, export_html, ui
from workbench import formatting as fmt
from workbench.catalog import DEMO_DATASET, known_datasets
from workbench.datasets import DatasetError
from workbench.errors import WorkbenchError
from workbench.experiments import (
    ExperimentOptions,
    backlog_note,
    blocked_runs,
    config_grid,
    create_experiment,
    experiment_rule,
    estimate_cost,
    estimate_resume,
    higher_limit,
    labels,
    limit_reached,
    name_warning,
    offline_prompt_warning,
    outcome_message,
    per_conversation,
    uneven_note,
    unscored_warning,
)
from workbench.models import usable_models
from workbench.replay import TOKEN_COUNTERS, configuration_problem, stopped_by_dataset
from workbench.rescore import rescore_experiment
from workbench.retention import SCORING, is_earlier

FOLLOW_EVERY_S = 3.0  # while an experiment runs here, the page is drawn again at most this often ...
FOLLOW_SHARE = 0.25  # ... and it spends at most about this share of the time drawing (it slowed the run)

page_started = time.monotonic()
store = ui.get_store()
st.title("Experiments")
st.caption("An experiment replays every conversation of a dataset under every configuration of a grid and "
           "pools the figures per configuration. Tune and Compare read them.")


def launch(experiment_id: str) -> None:
    """Run (or resume) the experiment in a thread of the app's process, then rerun: run in this
    page's script, it stopped when its user opened another page or closed the tab."""
    try:
        background.start(store, experiment_id)
    except background.AlreadyRunning:  # (started from another tab since this one drew it: followed, not an error)
        pass
    except WorkbenchError as exc:
        st.session_state["xp_done"] = ("error", f"The experiment cannot start: {exc}")
    else:
        st.session_state.setdefault("xp_watched", set()).add(experiment_id)  # its outcome is said here, once
        st.session_state.pop(f"xp_confirm_{experiment_id}", None)  # (left ticked, Delete was live when it ended)
    st.rerun()


existing = store.experiments()
if existing.empty and not st.session_state.get("xp_start"):
    # Above the form, not under it: under it, the line from before a click stayed on screen below
    # the first experiment's progress until that experiment ended.
    st.info("No experiments yet: start one below, or with `python -m workbench experiment run`.")

with st.expander("New experiment", expanded=existing.empty):
    entries = known_datasets()
    names = [f"{e.name} ({e.origin})" for e in entries] + [ui.BY_PATH]
    default = next((i for i, e in enumerate(entries) if e.path == DEMO_DATASET), 0)
    # The form's values outlive a visit to another page (persist_state: without it, a grid set up, a
    # look at Tune, and the next Start launched the demo's defaults); its defaults are set here once
    # (set again on every run, each rerun sent the browser every value), a kept value that no longer
    # fits dropped.
    if st.session_state.get("xp_dataset") not in names:
        st.session_state["xp_dataset"] = names[default]
    choice = st.selectbox("Dataset", names, key="xp_dataset", persist_state="session")
    if choice == ui.BY_PATH:
        typed = st.text_input("Path", key="xp_path", persist_state="session", placeholder="/data/locomo10.json").strip()
        dataset, dataset_format = (Path(typed).expanduser() if typed else None), None
    else:
        entry = entries[names.index(choice)]
        dataset, dataset_format = entry.path, entry.format
    listed = []
    if dataset is not None:
        try:
            listed = ui._listing(str(dataset), dataset_format, ui._stamp(Path(dataset)))
        except DatasetError as exc:
            ui.error("Cannot read the dataset: ", exc)
    ids = [c.id for c in listed]
    if (kept := [c for c in st.session_state.get("xp_conversations", []) if c in ids]) != \
            st.session_state.get("xp_conversations", []):
        st.session_state["xp_conversations"] = kept  # (of another dataset: gone)
    chosen = st.multiselect("Conversations (all when none is chosen)", ids, key="xp_conversations",
                            persist_state="session")
    # Rows of two for what holds chips (models, prompts: in a third of a 900 px page a model's
    # chip read "o.. ×"), rows of three aligned at the bottom (a label that wraps to two lines
    # left its box lower than its neighbours').
    left, right = st.columns(2)
    models = usable_models()
    st.session_state.setdefault("xp_observers", models[:1])
    st.session_state.setdefault("xp_reflectors", models[:1])
    # (a model typed in before is an option again: a kept value must be one)
    observers = left.multiselect("Observer models", list(dict.fromkeys([*models, *st.session_state["xp_observers"]])),
                                 key="xp_observers", persist_state="session", accept_new_options=True)
    reflectors = right.multiselect("Reflector models",
                                   list(dict.fromkeys([*models, "none", *st.session_state["xp_reflectors"]])),
                                   key="xp_reflectors", persist_state="session", accept_new_options=True)
    is_demo = dataset is not None and Path(dataset) == DEMO_DATASET
    # Thresholds around the demo's scaled ones (300 / 600) or the library's defaults (1000 / 2000),
    # set again when the dataset switches between the two kinds (through the widgets' state: a
    # browser keeps a text box's own value unless the app sets it).
    defaults = ("150,300,600", "600") if is_demo else ("500,1000,2000", "2000")
    if st.session_state.get("xp_defaults") != defaults or "xp_obs" not in st.session_state:
        st.session_state["xp_defaults"] = defaults
        st.session_state["xp_obs"], st.session_state["xp_ref"] = defaults
    first, second, third = st.columns(3, vertical_alignment="bottom")
    obs_text = first.text_input("Observation thresholds", key="xp_obs", persist_state="session",
                                help="Comma-separated token volumes")
    ref_text = second.text_input("Reflection thresholds", key="xp_ref", persist_state="session")
    st.session_state.setdefault("xp_win", "10")
    win_text = third.text_input("Windows (last messages)", key="xp_win", persist_state="session")
    problems, grid = [], []
    values = {}
    for label, text in (("Observation thresholds", obs_text), ("Reflection thresholds", ref_text),
                        ("Windows", win_text)):
        try:
            values[label] = app_data.parse_values(text)
        except ValueError as exc:
            problems.append(f"{label}: {exc}")
            ui.error("", problems[-1])  # (under its field: at the form's end it was below the fold)
        else:
            if len(values[label]) < len(app_data.split_list(text)):  # ("300,300": one run, said nowhere)
                st.caption(ui.plain(f"{label}: a value given twice counts once "
                                    f"({', '.join(map(str, values[label]))})."))
    observer_prompts = ui.prompt_choices(store, "observer")
    reflector_prompts = ui.prompt_choices(store, "reflector")
    left, right = st.columns(2)
    for key, versions in (("xp_oprompts", observer_prompts), ("xp_rprompts", reflector_prompts)):
        kept = [v for v in st.session_state.get(key, list(versions)[:1]) if v in versions] or list(versions)[:1]
        if kept != st.session_state.get(key):
            st.session_state[key] = kept  # (a version deleted since: the default)
    picked_op = left.multiselect("Observer prompts", list(observer_prompts), key="xp_oprompts", persist_state="session")
    picked_rp = right.multiselect("Reflector prompts", list(reflector_prompts), key="xp_rprompts",
                                  persist_state="session")
    first, second, third = st.columns(3, vertical_alignment="bottom")
    counter = first.selectbox("Token counter", TOKEN_COUNTERS, key="xp_counter", persist_state="session")
    st.session_state.setdefault("xp_backlog", "off")
    st.session_state.setdefault("xp_concurrency", 2.0)  # (a real number: see ui.WHOLE)
    st.session_state.setdefault("xp_max_cost", 0.0)
    backlog_text = second.text_input("Backlog ceilings (tokens, or off)", key="xp_backlog", persist_state="session",
                                     help="Opt-in, comma-separated: past a ceiling the observer takes larger "
                                          "segments until the backlog is under it again. 'off, 2000' compares both.")
    # (the numbers unbounded, then checked: a value typed outside a field's bounds was dropped with only
    # a red outline, and the experiment started with the last one: a cost limit among them)
    concurrency = third.number_input("Runs at once", step=1.0, format=ui.WHOLE, key="xp_concurrency",
                                     persist_state="session",
                                     help="1 to 16. Offline replays run in worker processes; remote ones as parallel "
                                          "calls")
    backlogs = []
    try:
        backlogs = app_data.parse_backlogs(backlog_text)
    except ValueError as exc:
        problems.append(f"Backlog ceilings: {exc}")
        ui.error("", problems[-1])
    left, right = st.columns(2, vertical_alignment="bottom")
    max_cost = left.number_input("Cost limit (USD, 0 for none)", step=1.0, key="xp_max_cost",
                                 persist_state="session")
    if st.session_state.pop("xp_clear_name", False):  # (started: the name is the new experiment's now)
        st.session_state["xp_name"] = ""
    name = right.text_input("Name (optional)", key="xp_name", persist_state="session")
    if same_name := name_warning(store, name):
        st.warning(ui.plain(app_data.as_sentence(same_name)))

    shown_problems = len(problems)
    if not 1 <= concurrency <= 16 or concurrency != int(concurrency):  # (not int(inf) first)
        problems.append(f"runs at once must be a whole number from 1 to 16, not {fmt.typed(concurrency)}")
    if max_cost < 0:
        problems.append(f"the cost limit must be 0 (none) or more USD, not {fmt.display(max_cost)}")
    if not observers or not reflectors or not picked_op or not picked_rp:
        problems.append("choose at least one observer, reflector and prompt of each kind")
    if not problems:
        try:
            grid = config_grid(observers=observers, reflectors=[None if r == "none" else r for r in reflectors],
                               observation=values["Observation thresholds"],
                               reflection=values["Reflection thresholds"], windows=values["Windows"],
                               observer_prompts=[observer_prompts[v] for v in picked_op],
                               reflector_prompts=[reflector_prompts[v] for v in picked_rp], token_counter=counter,
                               max_backlogs=backlogs)
        except WorkbenchError as exc:
            problems.append(str(exc))
    for problem in problems[shown_problems:]:
        ui.error("", problem)
    conversations = [c for c in listed if not chosen or c.id in chosen]
    if grid and conversations:
        # As the CLI does: say before the start which configurations cannot run here (and why);
        # they make no call, so the estimate leaves them out.
        blocked = {name: configuration_problem(c) for name, c in zip(labels([c.to_json() for c in grid]), grid)}
        runnable = [c for c, problem in zip(grid, blocked.values()) if not problem]
        blocked = {name: problem for name, problem in blocked.items() if problem}
        cost = estimate_cost([c.tokens for c in conversations], runnable)
        offline = all(c.observer.startswith("omem/") and (c.reflector or "omem/").startswith("omem/")
                      for c in runnable)
        priced = "free (built-in offline model)" if offline else app_data.estimate_text(cost)
        st.info(ui.plain(f"{fmt.count(len(conversations) * len(grid), 'run')}: "
                         f"{fmt.count(len(conversations), 'conversation')} × "
                         f"{fmt.count(len(grid), 'configuration')}. Estimated cost: {priced}."))
        if cost is None and max_cost:
            st.warning("The cost limit counts only the calls whose price litellm knows: a model here has an "
                       "unknown price, so the limit may not stop this experiment.")
        if warning := offline_prompt_warning(grid):
            st.warning(warning[:1].upper() + warning[1:].replace("--observer/--reflector", "observer/reflector"))
        if unscored := unscored_warning(conversations):
            st.warning(ui.plain(app_data.as_sentence(unscored)))
        if len(blocked) == len(grid):
            problems.append("no configuration can run here: " + "; ".join(sorted(set(blocked.values()))))
            ui.error("**Nothing to start.** ", problems[-1])
        elif blocked:
            ui.warning(f"**{fmt.count(len(blocked), 'configuration')} cannot run here** and will be recorded "
                       "as failed: ", "; ".join(f"{n}: {p}" for n, p in blocked.items()))
    start = st.button("Start experiment", type="primary", key="xp_start",
                      disabled=bool(problems) or not grid or not conversations or store.read_only)
    signature = repr((dataset, dataset_format, grid, chosen, concurrency, max_cost))
    if start and app_data.repeated_start(st.session_state.get("_xp_started"), signature, time.monotonic()):
        st.toast("Started once: a second click on Start experiment within a few seconds is ignored.")
    elif start:
        st.session_state["_xp_started"] = (signature, time.monotonic())
        try:
            options = ExperimentOptions(concurrency=int(concurrency), max_cost=float(max_cost) or None)
            experiment_id = create_experiment(store, dataset=dataset, grid=grid, options=options,
                                              conversations=chosen or None, dataset_format=dataset_format,
                                              name=name.strip() or None)
        except WorkbenchError as exc:
            ui.error("The experiment cannot start: ", exc)
        else:
            st.session_state[ui.EXPERIMENT_KEY] = experiment_id  # the picker shows it after the rerun
            # (kept, the name would be warned about as taken: by the experiment just started)
            st.session_state["xp_clear_name"] = True
            launch(experiment_id)

existing = store.experiments()
here = set(background.running())  # (a resume is "running" here before its thread claims it in the store)
if here and not existing.empty:
    existing.loc[existing.experiment_id.isin(here), ["status", "error"]] = ["running", None]
for watched in sorted(st.session_state.get("xp_watched", set())):  # experiments this session started
    ended = background.job(watched)
    # (running when this run looked: said once a run sees it ended, not lost to the rerun its end makes)
    if watched in here or (ended is not None and ended.alive):
        continue
    st.session_state["xp_watched"].discard(watched)
    if ended is not None and ended.outcome is not None:
        named = existing.loc[existing.experiment_id == watched, "name"]
        st.session_state["xp_done"] = outcome_message(watched, ended.outcome, named.iloc[0] if len(named) else None)
    elif ended is not None and ended.error:
        st.session_state["xp_done"] = ("warning" if ended.stop_asked else "error", ended.error)
if st.session_state.get("xp_done"):  # (before the stop below: deleting the last experiment said nothing)
    kind, text = st.session_state.pop("xp_done")
    {"success": st.success, "warning": st.warning, "error": st.error}[kind](ui.plain(text))
if existing.empty:
    st.stop()

st.subheader("Experiments")
listing = app_data.sortable(app_data.experiments_numbers(existing), app_data.EXPERIMENTS_FORMATS)
ui.figures(listing, hide_index=True, key="xp_table", column_order=app_data.key_first(listing.columns, app_data.EXPERIMENTS_FIRST))
if earlier := [e for e, o in zip(existing.experiment_id, existing.options) if is_earlier(experiment_rule(o))]:
    st.caption(ui.plain(f"Scored under an earlier retention rule, not comparable with the others: {', '.join(earlier)} "
                        "(each can be re-scored on its page)."))
# (the picker's label said "interrupted" for the experiment resuming here, as the list did before)
experiment_id = ui.experiment_picker(store, "Experiment", "xp_pick", frame=existing)
tables = ui.experiment_tables(store, experiment_id)
experiment, runs = tables["experiment"], tables["runs"]
planned = len(experiment["conversations"]) * len(experiment["configs"])
done = app_data.completed_pairs(runs)
pending = planned - done

# Failed runs stopped by a message of the dataset (dated behind what was already observed): a resume
# replays them to that message again (the CLI said so; the app offered Resume, which failed them again)
by_dataset = 0 if runs.empty else sum(status == "failed" and stopped_by_dataset(error)
                                      for status, error in zip(runs.status, runs.error))
AGAIN = "stopped on a message of the dataset dated behind what was already observed, and would stop there again"
resuming = experiment_id in here  # running in a thread of this process (started by any session)
where = fmt.short_path(experiment["dataset"])
if resuming:
    @st.fragment(run_every=1)
    def header() -> None:  # (follows the bar below: the page itself is drawn again only every few seconds)
        current = background.job(experiment_id)
        status = app_data.running_status(done, planned, current.progress if current is not None else None)
        st.text(f"{experiment_id} · {status} · {where}")
    header()
else:
    st.text(f"{experiment_id} · {app_data.experiment_status(experiment, runs)} · {where}")
# (before any figure: read first, they were taken for figures under the current rule)
if rescored := st.session_state.pop("xp_rescored", None):
    st.success(rescored)
if ui.rule_warning(experiment, runs):
    if st.button(f"Re-score under rule {SCORING}", key=f"xp_rescore_{experiment_id}", disabled=resuming,
                 help="Scores its completed runs again from the run store, with no model call, and its later runs "
                      "under the same rule. Each run is first checked to give back its recorded scores under its "
                      "own rule; if any does not, nothing is changed and the reason is shown."):
        try:
            done = rescore_experiment(store, experiment_id)
        except WorkbenchError as exc:  # (a run that cannot be re-scored: nothing was changed)
            ui.error("**Not re-scored:** ", exc)
        else:
            st.session_state["xp_rescored"] = (f"{fmt.count(len(done), 'completed run')} re-scored under rule "
                                               f"{SCORING}: the figures below are under it.")
            st.rerun()
if resuming:
    seen = background.job(experiment_id)
    seen_done = seen.progress.done if seen is not None and seen.progress is not None else 0
    drawn_at = time.monotonic()

    @st.fragment(run_every=1)
    def follow() -> None:  # the thread's progress, and the page again once it ends
        current = background.job(experiment_id)
        if current is None or not current.alive:
            st.rerun()
        every = max(FOLLOW_EVERY_S, st.session_state.get("xp_draw_s", 0.0) / FOLLOW_SHARE)
        if current.progress is not None and current.progress.done != seen_done and time.monotonic() - drawn_at >= every:
            # A run was written: the page again (the picker's "2 of 32 runs completed", Resume's
            # "30 left" and the figures stayed as the page last drew them, beside "4 of 32 done"),
            # at most every few seconds (short runs are written several a second).
            st.rerun()
        fraction, text = app_data.progress_text(current.progress, experiment_id)
        st.progress(fraction, text=ui.plain(text))
        if current.stop_asked:
            st.caption("Stopping: the runs in flight are dropped (Resume replays them).")
        elif st.button("Stop", key=f"xp_stop_{experiment_id}", help="Stop the experiment: the runs it finished are kept, and "
                                                   "Resume finishes it"):
            background.stop(experiment_id)
            st.caption("Stopping: the runs in flight are dropped (Resume replays them).")
        else:
            st.caption("It runs in the app's process: other pages can be opened, and this tab closed, meanwhile.")
    follow()
elif experiment["status"] == "running":  # (in another process: the CLI)
    st.progress(done / max(planned, 1), text=f"{done} of {planned} runs completed")
    st.caption("It runs in another process (the CLI, or another app): followed here as its runs are recorded; "
               "stop it where it runs (Ctrl-C), then Resume here if you like.")
    drawn_at = time.monotonic()

    @st.fragment(run_every=3)
    @ui.guarded
    def watch() -> None:  # another process (the CLI) runs it: follow its progress
        every = max(FOLLOW_EVERY_S, st.session_state.get("xp_draw_s", 0.0) / FOLLOW_SHARE)
        if app_data.redraw_for_other_process(store, experiment_id, done, time.monotonic() - drawn_at >= every):
            st.rerun()  # (it ended, or a run was recorded: the bar, the figures and the counts stayed as first drawn)
    watch()
elif experiment["status"] != "completed":
    prefix, detail, suffix = app_data.unfinished_banner(
        experiment_id, experiment["status"], done, planned, experiment.get("error"),
        resumable=not store.read_only and not 0 < pending <= by_dataset, db=store.path)  # (an unfinished experiment resumes: its last runs, or its end)
    # (an experiment interrupted, by its user's Stop too, or stopped by its cost limit is no error: red
    # said so, as runs once did)
    (st.error if experiment["status"] == "failed" else st.warning)(prefix + ui.plain(detail) + suffix)
if not resuming:
    @st.fragment(run_every=2)
    def watch_here() -> None:
        """An experiment started, or ended, here from another tab (or this one, shown another
        experiment): the page follows without a click (it showed "interrupted" with Resume live,
        or "running" long after the end)."""
        if set(background.running()) != here:
            st.rerun()
    watch_here()

# One row that wraps (in five equal columns of a 900 px page the labels read "Resu…", "Delet…").
actions = st.container(horizontal=True, vertical_alignment="center")
# (in their experiment mode: the pages keep the mode they were left in, another perhaps)
if actions.button("Tune", key=f"xp_open_tune_{experiment_id}", help="Retention vs compression over the grid"):
    st.session_state["tune_mode"] = "An experiment"
    st.switch_page("workbench/app_pages/tune.py")
if actions.button("Compare", key=f"xp_open_compare_{experiment_id}", help="Two configurations, probe by probe"):
    st.session_state["cmp_mode"] = "Two configurations of an experiment"
    st.switch_page("workbench/app_pages/compare.py")
running = experiment["status"] == "running" and not resuming  # (running in another process)
unfinished = experiment["status"] != "completed" and not running  # (stopped after its last run: resume ends it)
priced, stuck = "", ""  # what resuming should cost, on the button, as the CLI asks before paid work resumes
if pending and not running:
    blocked, every = blocked_runs(store, experiment_id)
    stuck = ("Nothing left can run here: " + "; ".join(sorted(set(blocked.values())))) if every else ""
    if not stuck and by_dataset >= pending:
        stuck = (f"Nothing left can run here: {'the run' if by_dataset == 1 else f'the {by_dataset} runs'} {AGAIN} "
                 "(correct or re-date that message in the dataset, then start a new experiment)")
if (pending or unfinished) and not running:
    try:
        cost = estimate_resume(store, experiment_id)[2]
    except DatasetError:
        cost = 0.0  # (the dataset moved: the resume says so)
    priced = "" if cost == 0 else ", cost unknown" if cost is None else f", {fmt.about_money(cost, 2)}"
# A limit already spent stops a resume at its first paid call (refused): the resume takes a new one.
reached = None
if priced and not running and not resuming and not store.read_only:
    try:
        reached = limit_reached(store, experiment_id)
    except DatasetError:
        pass  # (the dataset moved: the resume says so)
new_limit = None
if reached is not None:
    new_limit = actions.number_input(
        "New cost limit (USD)", value=higher_limit(*reached), step=higher_limit(*reached) / 2,
        format="%.4f", key=f"xp_new_limit_{experiment_id}", width=180,
        help=f"${reached[0]:.4f} of the ${reached[1]:.4f} limit is spent: Resume needs a higher one (0 for none)")
# (no Resume on an experiment with nothing to finish: a greyed "Resume (to finish)" read as if it had)
# (while it runs here, a bare "Resume": greyed, its count of runs left lagged the progress above and
# its price read as still owed)
resume = (pending or unfinished or resuming) and actions.button(
    "Resume" if resuming else f"Resume ({pending} left{priced})" if pending else f"Resume (to finish{priced})",
    key=f"xp_resume_{experiment_id}",
    disabled=running or resuming or store.read_only or bool(stuck),
    help=stuck or ("Running in another process" if running else "Running (Stop ends it)" if resuming else
                   "Paid models: the cost is an estimate meant to err high" if priced else None))
if actions.button("Prepare HTML export", key=f"xp_prepare_{experiment_id}"):
    st.session_state["xp_html"] = (experiment_id, export_html.experiment_html(store, experiment_id))
prepared = st.session_state.get("xp_html")
if prepared and prepared[0] == experiment_id:
    actions.download_button("Download HTML", prepared[1], file_name=f"{experiment_id}.html", mime="text/html",
                               key="xp_download")
confirm = actions.checkbox("Confirm delete", key=f"xp_confirm_{experiment_id}", disabled=resuming,
                           help="Stop it first" if resuming else None)  # one experiment's only
if actions.button("Delete experiment", key=f"xp_delete_{experiment_id}", disabled=not confirm or store.read_only or resuming):
    try:
        background.delete(store, experiment_id)  # (refused while it runs here)
    except WorkbenchError as exc:  # running, here or in another process (RunBusy): nothing is deleted
        ui.error("", exc)
    else:
        for deleted in runs.run_id:  # (its runs: not "deleted elsewhere" on Traces or the explorer)
            ui.forget_run(deleted)
        st.session_state.pop(ui.EXPERIMENT_KEY, None)
        st.session_state.pop("xp_pick", None)
        st.session_state.pop(f"xp_confirm_{experiment_id}", None)
        st.session_state["xp_done"] = ("success", f"Deleted {experiment_id} and its {fmt.count(len(runs), 'run')}.")
        st.rerun()
if resume and new_limit is not None and (new_limit < 0 or 0 < new_limit <= reached[0]):  # (saved, then refused)
    st.error(f"A new cost limit must be above the ${reached[0]:.4f} already spent (or 0 for none).")
elif resume:
    if new_limit is not None:
        store.update_experiment_options(experiment_id, max_cost=float(new_limit) or None)
    for replaced in runs[runs.status != "completed"].run_id:  # (the resume replaces them: not "deleted
        ui.forget_run(replaced)                               # elsewhere" on Traces or the explorer)
    launch(experiment_id)

summaries = tables["summaries"]
st.subheader("Figures per configuration")
st.caption("Retention pools every probe of the conversations each configuration completed; the interval is a "
           "bootstrap over probes.")
summary = app_data.sortable(app_data.summary_numbers(summaries), app_data.SUMMARY_FORMATS)  # sorts by value
ui.figures(summary, hide_index=True, key="xp_summary", column_order=app_data.key_first(summary.columns, app_data.SUMMARY_FIRST),
           column_config={"configuration": st.column_config.Column(pinned=True)})
if spent := app_data.spent_note(experiment, runs, summaries):
    st.caption(spent)
if uneven := uneven_note(runs):
    st.warning(uneven)
if behind := backlog_note(summaries):
    st.warning(ui.plain(behind))
if len(experiment["conversations"]) > 1:
    st.subheader("Retention per conversation")
    st.caption("The spread between conversations, which the interval above (a bootstrap over probes) does not "
               "show. Probes scored: the questions with a gold answer whose evidence has left the window (fewer "
               "than the dataset's questions). A dash: no run of it completed yet, or it scored no probe.")
    by_conversation = app_data.conversation_numbers(per_conversation(experiment, runs, tables["probes"]))
    ui.figures(app_data.sortable(by_conversation, app_data.conversation_formats(by_conversation)),
               hide_index=True, key="xp_by_conversation", column_config={"conversation": st.column_config.Column(pinned=True)})
failed = app_data.failed_configs(runs)
if not failed.empty:
    # (a Resume greyed out for want of a key said "Resume retries them", the reason in a tooltip)
    retry = (f"{'it' if len(failed) == 1 else 'they'} cannot be retried here: "
             f"{stuck.removeprefix('Nothing left can run here: ')}" if stuck else
             f"Resume retries {'it' if len(failed) == 1 else 'them'}"
             + (f", but {fmt.count(by_dataset, 'run')} {AGAIN}" if by_dataset else ""))
    st.warning(ui.plain(f"{fmt.count(len(failed), 'run')} did not complete and "
                        f"{'is' if len(failed) == 1 else 'are'} left out of the figures ({retry}):"))
    st.dataframe(failed, hide_index=True, key="xp_failed")
with st.expander("The grid"):
    st.dataframe(app_data.config_table(experiment["configs"]), hide_index=True, key="xp_grid")
    st.text("Conversations: " + ", ".join(experiment["conversations"]))
st.session_state["xp_draw_s"] = time.monotonic() - page_started  # (how often to draw it while one runs)
