"""Experiments: a dataset (all of its conversations, or chosen ones) × a grid of configurations.

Each (conversation, configuration) pair is one run, linked to its experiment. One scheduler runs
them all under one concurrency limit:

* replays on the built-in offline model are CPU-bound: they run in worker processes (a process
  pool of ``concurrency`` workers); each worker replays into memory and hands the whole run back;
* replays on remote models wait on the network: they run as asyncio tasks in this process, with
  identical concurrent calls shared (see :class:`workbench.cache.SQLiteCache`), litellm's retries
  (``num_retries``) and an optional requests-per-minute limit.

Either way this process is the only writer of the run store: each finished run is written in one
transaction, so an interrupted experiment holds whole runs only, and :func:`run_experiment` on an
existing experiment (``experiment resume``) replays exactly the pairs that have no completed run.
A cost limit (``max_cost``) stops the experiment cleanly (status ``stopped``), also resumable.

Figures per configuration (:func:`summarise`) pool every probe of every conversation; intervals
are bootstrap intervals over probes (:mod:`workbench.stats` says what is resampled).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .datasets import load_conversation, list_conversations
from .errors import WorkbenchError
from .formatting import cli_command, count, not_text, printable
from .formatting import missing as is_missing
from .interrupts import ctrl_c_held_back, stopping
from .losses import STAGES, funnel
from .retention import SCORING, check_scoring, earlier_rule_note, is_earlier, scoring_rule, stale_runs
from .models import OFFLINE_MODEL
from .stats import bootstrap_ci, paired_difference

OFFLINE_PREFIX = "omem/"

# The cost limit cancels the runs in flight. litellm makes its async call's coroutine in a worker
# thread (``run_in_executor``) and awaits it back on the loop; a call cancelled between the two
# drops a coroutine that was never started, and Python reports it when it is collected. Nothing was
# sent, so nothing is lost: that one message is noise on the experiment's stderr.
warnings.filterwarnings("ignore", message=r"coroutine '\w+\.acompletion' was never awaited", category=RuntimeWarning)


class ExperimentError(WorkbenchError, ValueError):
    """An experiment that cannot start or continue (no configurations, unknown conversation, …)."""


@dataclass(frozen=True)
class ExperimentOptions:
    """How an experiment runs (stored with it, so a resume runs the same way)."""

    concurrency: int = 2
    max_cost: float | None = None  # USD; the experiment stops cleanly when its calls cost more
    rpm: float | None = None  # requests per minute reaching each model (remote models)
    num_retries: int = 2  # litellm's retries with backoff on rate limits and transient errors
    timeout: float | None = None  # seconds per compaction call
    traces: bool = True  # store each call's request and raw response (size-capped)
    cache: bool = True  # litellm's cache (also what shares identical concurrent calls)
    api_base: str | None = None  # a self-hosted OpenAI-compatible server, for every remote call
    judge: str | None = None
    answerer: str | None = None
    # the retention scoring rule every run is scored with (workbench.retention.SCORING_RULES): the
    # current one for a new experiment; an experiment recorded before rules had numbers used rule 1
    scoring: int = SCORING

    @classmethod
    def stored(cls, options: dict[str, Any]) -> ExperimentOptions:
        """The options an experiment was recorded with (one recorded before the scoring rule was
        is scored with rule 1, as its first runs were)."""
        return cls(**{"scoring": 1, **options})

    def __post_init__(self) -> None:
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ExperimentError(f"concurrency must be a positive integer, got {self.concurrency!r}")
        if self.max_cost is not None and not self.max_cost > 0:
            raise ExperimentError(f"max_cost must be a positive number of USD, got {self.max_cost!r}")
        if self.rpm is not None and not self.rpm > 0:
            raise ExperimentError(f"rpm must be positive, got {self.rpm!r}")
        if bool(self.judge) != bool(self.answerer):
            raise ExperimentError("judge and answerer go together")
        try:
            check_scoring(self.scoring)
        except ValueError as exc:
            raise ExperimentError(str(exc)) from None

    def completion_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"num_retries": self.num_retries}
        if self.api_base:
            extra["api_base"] = self.api_base
        if self.rpm:
            from .cache import RPM_KEY

            extra["cache"] = {RPM_KEY: self.rpm}
        return extra


# -- the grid ------------------------------------------------------------------------------------

def config_grid(*, observers: Sequence[str], reflectors: Sequence[str | None], observation: Sequence[int],
                reflection: Sequence[int], windows: Sequence[int], observer_prompts: Sequence[Any],
                reflector_prompts: Sequence[Any], token_counter: str = "heuristic",
                timeout: float | None = None, cache: bool = True,
                max_backlogs: Sequence[int | None] = (None,)) -> list[Any]:
    """Every combination, in a stable order (models, thresholds, window, prompts, backlog ceiling).
    Without a reflector (``None``), the reflection thresholds and reflector prompts change nothing:
    such a configuration is made once, with the first of each (not once per value, the same
    replay run several times under different names)."""
    from .replay import ReplayConfig

    grid, seen = [], set()
    for o, r, ot, rt, w, op, rp, mb in itertools.product(observers, reflectors, observation, reflection, windows,
                                                          observer_prompts, reflector_prompts, max_backlogs):
        if r is None:
            rt, rp = reflection[0], reflector_prompts[0]
        config = ReplayConfig(observer=o, reflector=r, observation_threshold=ot, reflection_threshold=rt,
                              last_messages=w, token_counter=token_counter, observer_prompt=op, reflector_prompt=rp,
                              timeout=timeout, cache=cache, max_backlog=mb)
        key = json.dumps(config.to_json(), sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            grid.append(config)
    if not grid:
        raise ExperimentError("the grid is empty: give at least one value for every setting")
    return grid


_LABEL_PARTS = (
    ("observer", lambda c: c["observer"], "obs model {}"),
    ("reflector", lambda c: c.get("reflector") or "none", "ref model {}"),
    ("observation", lambda c: c["observation_threshold"], "obs {}"),
    ("reflection", lambda c: c["reflection_threshold"], "ref {}"),
    ("window", lambda c: c["last_messages"], "window {}"),
    ("observer_prompt", lambda c: c["observer_prompt"]["version"], "obs prompt {}"),
    ("reflector_prompt", lambda c: c["reflector_prompt"]["version"], "ref prompt {}"),
    ("token_counter", lambda c: c["token_counter"], "{}"),
    ("max_backlog", lambda c: c.get("max_backlog") or "off", "max backlog {}"),
)


def other_settings(configs: Sequence[dict[str, Any]], leave_out: Sequence[str] = ("observation", "reflection")
                   ) -> list[str]:
    """Per configuration, what varies across the grid apart from the settings ``leave_out`` names
    ("window 10 · obs model omem/extractive"); ``""`` for each when nothing else varies."""
    return _naming(configs, [(name, get, fmt) for name, get, fmt in _LABEL_PARTS if name not in leave_out])


_REFLECTOR_ONLY = ("reflection", "reflector_prompt")  # settings a configuration without a reflector has no use for


def _naming(configs: Sequence[dict[str, Any]], parts: Sequence[tuple], *, every: bool = False) -> list[str]:
    """Each configuration named by ``parts`` that vary across ``configs`` (all of them: ``every``).
    A configuration without a reflector is not named by a reflection threshold or reflector
    prompt, which change nothing for it ("ref model none · obs 500", not "… · ref 2000")."""
    def used(name: str, config: dict[str, Any]) -> bool:
        return name not in _REFLECTOR_ONLY or config.get("reflector") is not None

    shown = [(name, get, fmt) for name, get, fmt in parts
             if every or len({str(get(c)) for c in configs if used(name, c)}) > 1]
    return [" · ".join(fmt.format(get(c)) for name, get, fmt in shown if used(name, c)) for c in configs]


def grid_summary(configs: Sequence[dict[str, Any]]) -> str:
    """A whole grid in a few words, for lists that show experiments side by side: its thresholds
    and window (each value once, ``/`` between), and whatever else varies ("obs 150/300/600 · ref
    600 · window 10"). Experiments labelled by what varies within them ("obs 150") looked alike
    across experiments whose fixed settings differ (the app's reflection threshold, the CLI's)."""
    if not configs:
        return ""
    always = ("observation", "reflection", "window")
    parts = []
    for name, get, fmt in _LABEL_PARTS:
        used = [c for c in configs if name not in _REFLECTOR_ONLY or c.get("reflector") is not None]
        values = list(dict.fromkeys(str(get(c)) for c in used))
        # A model other than the offline one is named even when it does not vary (a paid experiment
        # read as an offline one), and models are listed with commas: their names hold "/".
        other_model = name in ("observer", "reflector") and values not in (["none"], [OFFLINE_MODEL])
        if values and (name in always or len(values) > 1 or other_model):
            parts.append(fmt.format((", " if name in ("observer", "reflector") else "/").join(values)))
    return " · ".join(parts)


def labels(configs: Sequence[dict[str, Any]]) -> list[str]:
    """Short labels naming only what varies across the grid ("obs 500 · ref 1000"); a grid of one
    configuration is named by its thresholds and window ("obs 1000 · ref 2000 · window 10")."""
    if len(configs) == 1:  # (no reflector: no reflection threshold to name)
        config = configs[0]
        names = ["observation", "window"] if config.get("reflector") is None else ["observation", "reflection", "window"]
        # a model other than the offline one is named too: a paid experiment's runs read as offline ones
        if config["observer"] != OFFLINE_MODEL:
            names.append("observer")
        if config.get("reflector") not in (None, OFFLINE_MODEL, config["observer"]):
            names.append("reflector")
        return _naming(configs, [p for p in _LABEL_PARTS if p[0] in names], every=True)
    named = other_settings(configs, leave_out=())
    return named if any(named) else [f"config {i + 1}" for i in range(len(configs))]


# -- cost ----------------------------------------------------------------------------------------

def _price(model: str) -> tuple[float, float] | None:
    if model.startswith(OFFLINE_PREFIX):
        return (0.0, 0.0)
    import litellm

    try:
        entry = litellm.get_model_info(model)
    except Exception:
        return None
    return float(entry.get("input_cost_per_token") or 0.0), float(entry.get("output_cost_per_token") or 0.0)


def estimate_cost(conversation_tokens: Sequence[int], grid: Sequence[Any]) -> float | None:
    """A rough estimate in USD before anything runs (``None`` when a model's price is unknown),
    meant to err high: every message is observed once (its tokens plus the prompt, in segments
    of the threshold), notes are the length the observer is asked for (30% of a segment, at least
    48 tokens), and each reflection re-reads twice its threshold and writes the whole of it. A
    model that writes longer than asked, or a reflection sent back to tighten, costs more."""
    total = 0.0
    prompt_overhead = 600
    for config in grid:
        observer = _price(config.observer)
        reflector = _price(config.reflector) if config.reflector else (0.0, 0.0)
        if observer is None or reflector is None:
            return None
        threshold = max(config.observation_threshold, 1)
        for tokens in conversation_tokens:
            calls = max(1, -(-tokens // threshold))
            notes = max(0.3 * tokens, 48 * calls)
            total += (tokens + calls * prompt_overhead) * observer[0] + notes * observer[1]
            if config.reflector:
                reflections = max(1, int(notes // max(config.reflection_threshold, 1)))
                total += reflections * (2 * config.reflection_threshold + prompt_overhead) * reflector[0]
                total += reflections * config.reflection_threshold * reflector[1]
    return total


def estimate_judging(conversations: Sequence[Any], grid: Sequence[Any], answerer: str, judge: str) -> float | None:
    """A rough estimate in USD of LLM-judged accuracy over ``conversations`` (``ConversationInfo``s)
    for each configuration of ``grid`` (``None`` when a model's price is unknown), meant to err
    high: every probe is asked (two calls), the answerer reading a final context as large as the
    memory can be (both thresholds; without a reflector, the whole conversation) plus the window,
    or the whole conversation when smaller."""
    from .judge import probe_tokens

    answering, grading = _price(answerer), _price(judge)
    if answering is None or grading is None:
        return None
    total = 0.0
    for config in grid:
        for info in conversations:
            per_message = info.tokens / max(info.messages, 1)
            # (without a reflector nothing bounds the notes: they can grow with the conversation)
            context = info.tokens if config.reflector is None else min(
                info.tokens, config.observation_threshold + config.reflection_threshold
                + per_message * config.last_messages)
            answer_in, answer_out, judge_in, judge_out = probe_tokens(int(context))
            total += info.probes * (answer_in * answering[0] + answer_out * answering[1]
                                    + judge_in * grading[0] + judge_out * grading[1])
    return total


def limit_reached(store: Any, experiment_id: str, max_cost: float | None = None) -> tuple[float, float] | None:
    """``(spent, limit)`` when the experiment has already spent its cost limit (``max_cost`` if
    given, else its own) and paid work is left, else ``None``: a resume would stop again at its
    first paid call, after paying for it (a resume of an experiment stopped by its limit, the limit
    left as it was, spent more and stopped again)."""
    limit = max_cost if max_cost is not None else store.experiment(experiment_id)["options"].get("max_cost")
    if not limit:
        return None
    spent = _spent(store, experiment_id)
    if spent < limit or estimate_resume(store, experiment_id)[2] == 0:
        return None
    return spent, float(limit)


def higher_limit(spent: float, limit: float) -> float:
    """A round cost limit to suggest after ``limit`` was spent: twice it or 1.5x the spend,
    rounded up to one significant digit (0.075 → 0.08)."""
    higher = max(2 * limit, spent * 1.5)
    exponent = math.floor(math.log10(higher))
    return round(math.ceil(higher / 10**exponent - 1e-9) * 10**exponent, max(0, -exponent))


def blocked_runs(store: Any, experiment_id: str) -> tuple[dict[str, str], bool]:
    """Per configuration label of the runs a resume would replay, why it cannot run here (a
    provider key unset since, a model unknown), and whether that is every one of them: such a
    resume is refused, since it would only replay them into failures."""
    from .replay import ReplayConfig, configuration_problem

    problems = {t.label: configuration_problem(ReplayConfig.from_json(t.config))
                for t in pending_tasks(store, experiment_id)}
    blocked = {label: problem for label, problem in problems.items() if problem}
    return blocked, bool(problems) and len(blocked) == len(problems)


def _plus(total: float | None, part: float | None) -> float | None:
    """A sum of estimates in which an unknown one (``None``) makes the whole unknown."""
    return None if total is None or part is None else total + part


def estimate_resume(store: Any, experiment_id: str) -> tuple[int, int, float | None]:
    """What a resume has left to do: the runs to replay (``pending_tasks``), the runs to judge
    (those, and the completed runs not yet judged, when the experiment has a judge) and a rough
    estimate in USD of all those calls, as :func:`estimate_cost` and :func:`estimate_judging` err
    high; ``None`` when a model's price is unknown."""
    from .replay import ReplayConfig, configuration_problem

    experiment = store.experiment(experiment_id)
    options = experiment["options"]
    tasks = pending_tasks(store, experiment_id)
    listed = {c.id: c for c in list_conversations(experiment["dataset"], experiment["dataset_format"])}
    total: float | None = 0.0
    for task in tasks:
        info = listed.get(task.conversation_id)
        config = ReplayConfig.from_json(task.config)
        if info is None or configuration_problem(config):  # (refused without a call, or said by the resume)
            continue
        total = _plus(total, estimate_cost([info.tokens], [config]))
    owed: list[tuple[str, dict[str, Any]]] = []
    judge, answerer = options.get("judge"), options.get("answerer")
    if judge and answerer:
        runs = store.experiment_runs(experiment_id)
        unjudged = runs[(runs.status == "completed") & runs.judge_calls.isna()]
        configs = {entry["label"]: entry["config"] for entry in experiment["configs"]}
        owed = [(t.conversation_id, t.config) for t in tasks] + [
            (r.conversation_id, configs[r.config_label]) for r in unjudged.itertuples() if r.config_label in configs]
        for conversation_id, config in owed:
            if conversation_id in listed:
                total = _plus(total, estimate_judging([listed[conversation_id]], [ReplayConfig.from_json(config)],
                                                      answerer, judge))
    return len(tasks), len(owed), total


# -- running ---------------------------------------------------------------------------------------

@dataclass
class Progress:
    """What the scheduler reports after each finished run."""

    done: int
    total: int
    failed: int
    cost_usd: float
    label: str
    conversation_id: str
    status: str
    elapsed_s: float
    warnings: tuple[str, ...] = ()  # the dataset's for this conversation, with its first run only
    # Between finished runs, reports on the runs in flight (``finished`` False; ``label`` and
    # ``conversation_id`` then name the run that moved): how many, and how far through their
    # messages together (a sum of fractions), so a bar moves during long runs.
    in_flight: int = 0
    running: float = 0.0
    finished: bool = True
    # Runs replayed (in a worker process) and waiting for this process to write them: a short
    # conversation's runs end faster than they are written, and were counted in flight ("26 in
    # progress" at a concurrency of 2).
    recording: int = 0

    @property
    def eta_s(self) -> float | None:
        return self.elapsed_s / self.done * (self.total - self.done) if self.done else None

    @property
    def fraction(self) -> float:
        """How far the whole experiment is, counting the runs in flight by their messages replayed."""
        return min(1.0, (self.done + self.recording + self.running) / max(self.total, 1))


@dataclass
class Task:
    conversation_id: str
    index: int  # the configuration's position in the grid
    label: str
    config: dict[str, Any]
    scoring: int = SCORING  # the experiment's retention scoring rule


def experiment_rule(options: str | dict[str, Any]) -> int:
    """The retention scoring rule an experiment's runs are scored under, from its recorded options
    (as :meth:`RunStore.experiment` reads them, or as listed: JSON text). Read, not checked: a
    later rule than this version knows (a newer omem's experiment) is listed and said, not an error;
    resuming such an experiment is (:meth:`ExperimentOptions.stored`)."""
    recorded = (json.loads(options) if isinstance(options, str) else options).get("scoring", 1)
    return scoring_rule(recorded) or 1


def rule_note(experiment: dict[str, Any], runs: pd.DataFrame) -> tuple[str | None, bool]:
    """What to say of the rule an experiment's figures are scored under (``None``: the current rule
    for every run), and whether ``rescore`` would bring them to the current rule: its recorded rule
    is an earlier one, or a run of it is under another rule than its own (one that completed while
    it was re-scored, before that was checked), so its pooled figures mix two rules."""
    recorded = experiment_rule(experiment["options"])
    if mixed := stale_runs(runs, recorded):
        rules = sorted({scoring_rule(r) for r in runs[runs.run_id.isin(mixed)].scoring})
        return (f"{count(len(mixed), 'run')} of this experiment {'is' if len(mixed) == 1 else 'are'} scored under rule "
                f"{', '.join(map(str, rules))} while it is under rule {recorded}: its pooled retention mixes two rules",
                True)
    return earlier_rule_note(recorded), is_earlier(recorded)


def pending_tasks(store: Any, experiment_id: str) -> list[Task]:
    """The (conversation, configuration) pairs without a completed run, in a stable order."""
    experiment = store.experiment(experiment_id)
    runs = store.experiment_runs(experiment_id)
    done = {(r.conversation_id, r.config_label) for r in runs.itertuples() if r.status == "completed"}
    scoring = experiment_rule(experiment["options"])
    tasks = []
    for conversation_id in experiment["conversations"]:
        for index, entry in enumerate(experiment["configs"]):
            if (conversation_id, entry["label"]) not in done:
                tasks.append(Task(conversation_id, index, entry["label"], entry["config"], scoring))
    return tasks


def status_text(status: str, failed: int, planned: int, missing: int = 0) -> str:
    """An experiment's status as people read it: ``completed`` only when every run completed;
    a grid that finished with failed runs says how many (``completed; 1 of 4 runs failed``), and
    one whose runs were deleted since, how many are missing."""
    if status != "completed" or not (failed or missing):
        return status
    of = f"of {count(planned, 'run')}"
    if failed and missing:
        return f"completed; {failed} {of} failed, {missing} missing"
    return f"completed; {failed} {of} failed" if failed else f"completed; {missing} {of} missing"


def offline_prompt_roles(configs: Sequence[dict[str, Any]]) -> list[str]:
    """The roles (``observer``, ``reflector``) whose prompt text differs between ``configs``
    (configuration dicts, as ``ReplayConfig.to_json`` writes them) while every model in that role
    is the built-in offline one, which ignores prompt text: comparing them compares nothing."""
    roles = []
    for role in ("observer", "reflector"):
        used = [c for c in configs if c.get(role) is not None]
        texts = {str((c.get(f"{role}_prompt") or {}).get("text") or "") for c in used}
        if len(texts) > 1 and all(str(c[role]).startswith(OFFLINE_PREFIX) for c in used):
            roles.append(role)
    return roles


def offline_prompt_warning(grid: Sequence[Any]) -> str | None:
    """A warning when configurations differ in a prompt only the built-in offline model reads
    (:func:`offline_prompt_roles`); ``None`` when that is not so."""
    roles = offline_prompt_roles([c.to_json() for c in grid])
    if not roles:
        return None
    return (f"these configurations differ in {' and '.join(roles)} prompt versions, but the built-in offline model "
            "ignores prompt text: their figures differ by the other settings only. Comparing prompts needs an "
            "LLM (a real --observer/--reflector model).")


def listed_status(row: Any) -> str:
    """:func:`status_text` for a row of ``RunStore.experiments()`` (its counts of runs recorded,
    failed and planned): ``completed; 1 of 4 runs missing`` once a run was deleted since."""
    planned, runs, failed = (int(row.get(k) or 0) for k in ("planned_runs", "runs", "failed_runs"))
    return status_text(str(row["status"]), failed, planned, max(0, planned - runs))


def outcome_message(experiment_id: str, outcome: ExperimentOutcome, name: str | None = None) -> tuple[str, str]:
    """``(kind, sentence)`` for the app's banner after a start or a resume: ``success`` only when
    every run replayed completed; ``warning`` when some failed; ``error`` when none did, or it was
    interrupted or failed.
    An experiment given a ``name`` is called by it (its id after it); a ``stopped`` one (its cost
    limit) is a ``warning``: nothing failed, Resume with a higher limit finishes it."""
    if name and not is_missing(name):  # (a list's missing name is NaN: "nan (exp-…) completed")
        experiment_id = f"{name} ({experiment_id})"
    runs = f"{count(outcome.runs, 'run')} replayed in {outcome.elapsed_s:.1f} s"
    if outcome.warnings:
        noted = sum(len(w) for w in outcome.warnings.values())
        first = next(iter(outcome.warnings.items()))
        runs += (f" (the dataset gave {count(noted, 'warning')} on {count(len(outcome.warnings), 'conversation')}, "
                 f"e.g. {first[0]}: {first[1][0]})")
        if outcome.status == "completed" and not outcome.failed:
            return "warning", f"{experiment_id} completed: {runs}."
    if outcome.status == "completed" and not outcome.failed:
        return "success", f"{experiment_id} completed: {runs}."
    failed = f"{outcome.failed} of them did not complete (listed below with their errors)"
    if outcome.status == "completed":
        return "warning", f"{experiment_id} completed with failures: {runs}; {failed}."
    kind = "warning" if outcome.status == "stopped" else "error"  # (the cost limit's stop is no failure)
    error = outcome.error[:1].upper() + outcome.error[1:] if outcome.error else ""
    return kind, f"{experiment_id} {outcome.status}: {runs}" + (f"; {failed}" if outcome.failed else "") + (
        f". {error}" if error else ".")


def dataset_changed(store: Any, experiment_id: str) -> str | None:
    """Why the experiment's runs left to replay cannot join its recorded ones: a conversation of
    theirs that its dataset no longer holds as the experiment's runs recorded it (a resume on an
    edited file mixed runs of two versions of a conversation in one pooled figure), or ``None``."""
    from .replay import dataset_change

    experiment = store.experiment(experiment_id)
    runs = store.experiment_runs(experiment_id)
    for conversation_id in sorted({t.conversation_id for t in pending_tasks(store, experiment_id)}):
        for run_id in runs.run_id[runs.conversation_id == conversation_id]:
            recorded = store.messages(run_id)
            if recorded.empty:  # (a configuration refused up front records no message)
                continue
            try:
                conversation = load_conversation(experiment["dataset"], conversation_id, experiment["dataset_format"])
            except WorkbenchError:
                break  # (gone or unreadable: the resume says so; the other conversations are still compared)
            if (changed := dataset_change(conversation, recorded)) is not None:
                return (f"conversation {conversation_id!r} changed in {conversation.source} since this experiment "
                        f"replayed it ({changed}); its runs left would not be comparable with those recorded: "
                        "start a new experiment")
            break
    return None


def _clear_unfinished(store: Any, experiment_id: str) -> None:
    """Runs of the experiment that did not complete are replaced by the resume's new runs (what
    they spent stays counted in the experiment's ``other_cost_usd``)."""
    store.replace_unfinished_runs(experiment_id)


_progress_queue: Any = None  # in a worker process: where its runs report how far they are
PROGRESS_EVERY_S = 0.25  # at most this often per run (a LoCoMo run reads ~200 times a second)


def _run_key(task: Task) -> tuple[int, str]:
    return task.index, task.conversation_id


def _throttled(report: Callable[[tuple[int, str], float], None], task: Task) -> Callable[[int, int, str], None]:
    """A replay's ``progress`` callback that reports ``(run key, fraction of messages replayed)``
    at its first message and then at most every :data:`PROGRESS_EVERY_S`."""
    last = [float("-inf")]

    def progress(done: int, total: int, _: str) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S and done < total:
            last[0] = now
            report(_run_key(task), done / max(total, 1))

    return progress


def _replay_one(dataset: str, dataset_format: str | None, task: Task, extra: dict[str, Any],
                cache_dir: str | None, traces: bool) -> dict[str, Any]:
    """One run in memory (in a worker process or this one): its whole payload, never raising for
    a model failure (the payload says ``failed``)."""
    queue = _progress_queue
    on_progress = None if queue is None else _throttled(lambda key, fraction: queue.put((key, fraction)), task)
    try:
        return asyncio.run(_replay_one_async(dataset, dataset_format, task, extra, cache_dir, traces,
                                             on_progress=on_progress))
    finally:
        if queue is not None:  # its end, through the queue its reports took: before the next run's first
            queue.put((_run_key(task), None))  # (by the future alone it could come after: 3 "in flight" of 2)


async def _replay_one_async(dataset: str, dataset_format: str | None, task: Task, extra: dict[str, Any],
                            cache_dir: str | None, traces: bool, on_cost: Callable[[float | None], None] | None = None,
                            on_progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    from omem_core import token_counter

    from .recorder import ExperimentRecorder
    from .replay import ConfigurationError, ReplayConfig, ReplayFailed, _conversation_rows, planned_reads, replay

    conversation = load_conversation(dataset, task.conversation_id, dataset_format)
    config = ReplayConfig.from_json(task.config)
    recorder = ExperimentRecorder(on_cost=on_cost, traces=traces)
    started = time.perf_counter()
    try:
        await replay(conversation, config, recorder=recorder, cache_dir=cache_dir, completion_extra=extra,
                     progress=on_progress, scoring=task.scoring)
    except ReplayFailed:
        pass  # the recorder holds the partial run, status failed
    except ConfigurationError as exc:
        recorder.finish("failed", str(exc), {})
    count = token_counter(config.token_counter)
    messages = _conversation_rows(conversation, count([t.content for t in conversation.turns])
                                  if conversation.turns else [])
    payload = await recorder.payload(
        conversation.id, dataset=printable(conversation.source or ""), dataset_format=conversation.format,
        conversation_id=conversation.id, label=task.label, config=config.to_json(), config_label=task.label,
        planned_steps=planned_reads(conversation, config))
    payload["run"]["elapsed_s"] = time.perf_counter() - started
    payload["messages"] = messages
    payload["warnings"] = list(conversation.warnings)
    return payload


@dataclass
class ExperimentOutcome:
    experiment_id: str
    status: str  # completed | stopped | interrupted | failed
    error: str | None
    elapsed_s: float
    runs: int
    failed: int
    cost_usd: float
    warnings: dict[str, list[str]] = field(default_factory=dict)  # the loader's, per conversation


def _all_offline(configs: Sequence[dict[str, Any]]) -> bool:
    return all(c["observer"].startswith(OFFLINE_PREFIX) and (c.get("reflector") is None or
                                                             c["reflector"].startswith(OFFLINE_PREFIX))
               for c in configs)


def _worker_init(scheduler_pid: int | None = None, scheduler_token: str | None = None,
                 progress_queue: Any = None) -> None:
    """A worker forked from the scheduler (or a fork server): it inherits the imported modules (no
    3-second litellm import per worker), but not the scheduler's running event loop. It ends
    itself within a second of the scheduler's death (a SIGTERM or SIGKILL gives the scheduler no
    chance to stop it: workers were left replaying, ~300 MB each, for no one)."""
    import signal
    import threading

    global _progress_queue
    _progress_queue = progress_queue
    if scheduler_pid is not None:
        threading.Thread(target=_exit_with, args=(scheduler_pid, scheduler_token), daemon=True,
                         name="omem-worker-watchdog").start()

    asyncio.events._set_running_loop(None)
    # Ctrl-C in a terminal reaches the whole process group: the scheduler alone handles it (it
    # stops the workers), so a worker never dies mid-task with a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import omem_core  # noqa: F401  (already imported when forked; imported here when spawned)

    from .cache import forget_connections

    forget_connections()  # SQLite connections must not cross a fork: the worker opens its own


def _exit_with(scheduler_pid: int, scheduler_token: str | None, every_s: float = 0.5) -> None:
    """Watch the scheduler from a worker: once it is gone — ended, a zombie its parent has not
    reaped, or its pid reused by another process — end the worker at once, mid-task or not. (The
    scheduler itself, not the worker's parent: under ``forkserver`` that is the fork server.)"""
    from .runstore import process_alive

    while True:
        time.sleep(every_s)
        if not process_alive(scheduler_pid, scheduler_token):
            os._exit(1)


def _pool_context() -> Any:
    """How worker processes start. ``fork`` from a single-threaded scheduler (the CLI): workers
    start at once with the parent's imports. From a threaded one (the app's Streamlit server) a
    fork can deadlock on a lock another thread holds, so a ``forkserver`` is used: a fresh
    single-threaded process that imports the engine once and forks the workers. ``spawn`` where
    neither exists."""
    import multiprocessing
    import threading

    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["omem_core", "workbench.experiments", "workbench.replay"])
        return context
    return multiprocessing.get_context("spawn")


def unscored_warning(conversations: Sequence[Any]) -> str | None:
    """When no probe of ``conversations`` (``ConversationInfo``s) has a gold answer (MemoryBank's
    questions, for one), retention cannot be scored: the sentence that says so before the start,
    else ``None``."""
    probes = sum(c.probes for c in conversations)
    if not conversations or any(c.scored_probes for c in conversations):
        return None
    several = len(conversations) > 1
    held = (f"{'their' if several else 'its'} {count(probes, 'probe')} {'has' if probes == 1 else 'have'} no gold "
            "answer" if probes else "they hold no probes" if several else "it holds no probes")
    return (f"retention cannot be scored on {count(len(conversations), 'conversation')} here: {held}; the "
            "figures will be compression, blind spot, calls and cost")


def name_warning(store: Any, name: str | None) -> str | None:
    """When experiments already carry ``name``, the sentence that says so (the list and pickers
    would show two experiments under one name), else ``None``."""
    if not name or not name.strip():
        return None
    existing = store.experiments()
    taken = [] if existing.empty else list(existing[existing.name == name.strip()].experiment_id)
    if not taken:
        return None
    return (f"an experiment named {name.strip()!r} exists already ({', '.join(taken)}): both will be listed under "
            "that name, told apart only by their ids")


def choose_conversations(ids: Sequence[str], conversations: Sequence[str] | None, dataset: str | Path) -> list[str]:
    """The conversations an experiment replays: ``conversations`` (each once, in the order
    given; an id named twice would count its probes twice) or every id of the dataset; an
    unknown id is an ``ExperimentError`` that lists the known ones."""
    chosen = list(dict.fromkeys(conversations)) if conversations else list(ids)
    unknown = [c for c in chosen if c not in set(ids)]
    if unknown:
        raise ExperimentError(f"no conversation {', '.join(map(repr, unknown))} in {dataset}; "
                              f"it has: {', '.join(ids[:20])}{' …' if len(ids) > 20 else ''}")
    return chosen


def redact_secrets(text: str) -> str:
    from .runstore import redact_secrets as redact  # (imports litellm's side only when there is text)

    return redact(text)


def restore_secrets(text: str) -> str:
    """The inverse of ``redact_secrets`` for the environment of this process: each ``[NAME]`` of
    a secret-looking variable that is set is its value again (a server address recorded with its
    key as ``?key=[OPENAI_API_KEY]`` is usable by a resume, without the key ever being stored)."""
    from omem_core._env import environment_secrets

    for value, name in environment_secrets():
        text = text.replace(f"[{name}]", value)
    return text


def create_experiment(store: Any, *, dataset: str | Path, grid: Sequence[Any], options: ExperimentOptions,
                      conversations: Sequence[str] | None = None, dataset_format: str | None = None,
                      name: str | None = None) -> str:
    """Record a new experiment (nothing runs yet): the dataset's conversations (all, or the ids
    given, checked), the grid with a short label per configuration, and the options."""
    listed = list_conversations(dataset, dataset_format)
    chosen = choose_conversations([c.id for c in listed], conversations, dataset)
    # The format read, given or detected (recorded, and exported, rather than null when detected).
    formats = {c.format for c in listed}
    dataset_format = dataset_format or (formats.pop() if len(formats) == 1 else None)
    configs = [c.to_json() for c in grid]
    names = labels(configs)
    if len(set(names)) != len(names):
        raise ExperimentError("the grid holds the same configuration twice")
    for what, text in (("the dataset's path", str(dataset)), ("the name", name)):
        if not_text(text):  # (DuckDB refused it with its own error; a file of a folder: its run says so)
            raise ExperimentError(f"{what} '{printable(text)}' is not UTF-8 text, which the run store keeps "
                                  "(rename the file, or give UTF-8 text)")
    return store.create_experiment(name=name, dataset=str(dataset), dataset_format=dataset_format,
                                   conversations=chosen,
                                   configs=[{"label": n, "config": c} for n, c in zip(names, configs)],
                                   options=asdict(dataclasses.replace(  # (a key in the address: its name)
                                       options, api_base=options.api_base and redact_secrets(options.api_base))))


async def run_experiment(store: Any, experiment_id: str, *, progress: Callable[[Progress], None] | None = None,
                         cache_dir: str | Path | None = None) -> ExperimentOutcome:
    """Run (or finish) an experiment: every pair without a completed run, under one concurrency
    limit, this process writing every run. Configurations whose models cannot be used here are
    recorded as failed runs at once (with the reason), without stopping the others."""
    from .replay import ReplayConfig, configuration_problem, planned_reads

    experiment = store.experiment(experiment_id)
    options = ExperimentOptions.stored(experiment["options"])
    if options.api_base:  # recorded with any key in it written as its variable's name
        options = dataclasses.replace(options, api_base=restore_secrets(options.api_base))
    if (changed := dataset_changed(store, experiment_id)) is not None:
        raise ExperimentError(f"experiment {experiment_id} cannot be resumed: {changed}")
    if (reached := limit_reached(store, experiment_id)) is not None:
        raise ExperimentError(f"experiment {experiment_id} has spent ${reached[0]:.4f} of its ${reached[1]:.4f} cost "
                              "limit: a resume would stop again at its first paid call; give it a higher limit")
    store.claim_experiment(experiment_id)
    _clear_unfinished(store, experiment_id)
    tasks = pending_tasks(store, experiment_id)
    started = time.perf_counter()
    dataset, dataset_format = experiment["dataset"], experiment["dataset_format"]
    extra = options.completion_extra()
    folder = str(cache_dir) if cache_dir is not None else None
    state = {"done": 0, "failed": 0, "cost": _spent(store, experiment_id)}
    stop = asyncio.Event()

    warned: dict[str, list[str]] = {}

    flight: dict[tuple[int, str], float] = {}  # runs in flight: how far through their messages
    labels = {_run_key(t): t.label for t in tasks}

    def report(task: Task, status: str, warnings: Sequence[str] = ()) -> None:
        state["done"] += 1
        state["failed"] += status != "completed"
        flight.pop(_run_key(task), None)
        replayed.discard(_run_key(task))
        new = () if task.conversation_id in warned else tuple(warnings)
        if new:
            warned[task.conversation_id] = list(new)
        if progress is not None:
            progress(Progress(state["done"], len(tasks), state["failed"], state["cost"], task.label,
                              task.conversation_id, status, time.perf_counter() - started, new,
                              in_flight=len(flight), running=sum(flight.values()), recording=len(replayed)))

    def moved(key: tuple[int, str], fraction: float | None) -> None:
        """A run in flight replayed more of its messages; ``None``: its replay ended, its write is
        next (said with the next report: called from a future's callback, where a progress
        callback's error would go unseen). A late report of a run replayed or written is dropped."""
        if key not in labels or key in finished_keys or key in replayed:
            return
        if fraction is None:
            flight.pop(key, None)
            replayed.add(key)
            return
        flight[key] = fraction
        if progress is not None:
            progress(Progress(state["done"], len(tasks), state["failed"], state["cost"], labels[key], key[1],
                              "running", time.perf_counter() - started, in_flight=len(flight),
                              running=sum(flight.values()), finished=False, recording=len(replayed)))

    finished_keys: set[tuple[int, str]] = set()
    replayed: set[tuple[int, str]] = set()  # replayed in a worker, not yet written

    def add_cost(amount: float) -> None:
        state["cost"] += amount
        if options.max_cost is not None and state["cost"] > options.max_cost:
            stop.set()

    # What each run in flight has paid so far ([known cost, a price unknown]), until it is written:
    # a run cut off (the cost limit, Ctrl-C, the app's Stop) records nothing, and its calls were
    # left out of the experiment's spend ("$0.0202 spent" at the stop, "$0.0060" in `show`).
    unrecorded: dict[tuple[int, str], list] = {}

    def cost_of(task: Task) -> Callable[[float | None], None]:
        entry = unrecorded.setdefault(_run_key(task), [0.0, False])

        def paid(amount: float | None) -> None:
            if amount is None:
                entry[1] = True
            else:
                entry[0] += amount
                add_cost(amount)
        return paid

    cut_off = [0.0, False]  # what runs cut off paid: recorded with the experiment's end (one write)

    def count_unrecorded() -> tuple[float, bool]:
        for key, entry in unrecorded.items():
            if key not in finished_keys:
                cut_off[0] += entry[0]
                cut_off[1] = cut_off[1] or entry[1]
        unrecorded.clear()
        return cut_off[0], cut_off[1]

    def write(payload: dict[str, Any], task: Task) -> None:
        messages = payload.pop("messages")
        warnings = payload.pop("warnings", [])
        payload["run"]["experiment_id"] = experiment_id
        store.write_run(payload, messages=messages)
        finished_keys.add(_run_key(task))  # (after the write: a run whose write failed is counted as cut off)
        report(task, payload["run"]["status"], warnings)

    # Configurations that cannot run here fail at once, for every conversation, with the reason.
    problems: dict[int, str | None] = {}
    runnable = []
    for task in tasks:
        if task.index not in problems:
            problems[task.index] = configuration_problem(ReplayConfig.from_json(task.config))
        if problems[task.index] is None:
            runnable.append(task)
            continue
        conversation = load_conversation(dataset, task.conversation_id, dataset_format)
        write({"run": {"dataset": printable(conversation.source or ""), "dataset_format": conversation.format,
                       "conversation_id": conversation.id, "label": task.label, "config": task.config,
                       "config_label": task.label, "status": "failed", "steps": 0,
                       "planned_steps": planned_reads(conversation, ReplayConfig.from_json(task.config)),
                       "error": f"cannot replay: {problems[task.index]}"},
               "messages": []}, task)

    status, error = "completed", None
    try:
        if runnable and _all_offline([t.config for t in runnable]) and options.concurrency > 1:
            await _run_in_processes(runnable, options, dataset, dataset_format, extra, folder, write, moved)
        elif runnable:
            await _run_in_tasks(runnable, options, dataset, dataset_format, extra, folder, write, cost_of, stop,
                                moved)
        if state["done"] and state["failed"] == state["done"] and not stop.is_set() and not _any_completed(
                store, experiment_id):  # (a resume whose retries all failed keeps the runs completed before)
            status, error = "failed", "no run completed (each configuration's error is listed with it)"
        if stop.is_set():
            status, error = "stopped", (f"the cost limit of ${options.max_cost:.4f} was reached "
                                        f"(${state['cost']:.4f} spent); finish it with: "
                                        + cli_command(f"experiment resume {experiment_id}", store.path))
    except BaseException as exc:
        # Ctrl-C, a cancelled task, Streamlit stopping the script (its StopException when the
        # tab closes is a BaseException too): interrupted, as a replay reads them
        interrupted = not isinstance(exc, Exception) or isinstance(exc, asyncio.CancelledError)
        with ctrl_c_held_back(), (stopping() if interrupted else contextlib.nullcontext()):
            # (a second Ctrl-C left the experiment 'running'; a held run store is waited for briefly)
            store.finish_experiment(experiment_id, "interrupted" if interrupted else "failed",
                                    ("stopped before the end" if interrupted else f"{type(exc).__name__}: {exc}")
                                    + "; finish it with: " + cli_command(f"experiment resume {experiment_id}", store.path),
                                    time.perf_counter() - started, other_cost=count_unrecorded())
        raise
    count_unrecorded()  # (runs the cost limit cut off: recorded with the end, below)
    if status == "completed" and options.judge and options.answerer:
        from .judge import JudgeFailed

        try:
            await _judge_experiment(store, experiment_id, options, add_cost, stop)
        except JudgeFailed as exc:
            status, error = "failed", (f"judging failed: {exc}; the runs and the runs already judged are kept: "
                                       "finish with: " + cli_command(f"experiment resume {experiment_id}", store.path))
        except BaseException:
            with ctrl_c_held_back(), stopping():
                store.finish_experiment(experiment_id, "interrupted", "stopped while judging; finish it with: "
                                        + cli_command(f"experiment resume {experiment_id}", store.path),
                                        time.perf_counter() - started, other_cost=count_unrecorded())
            raise
        if stop.is_set() and status == "completed":
            status, error = "stopped", (f"the cost limit of ${options.max_cost:.4f} was reached while judging "
                                        f"(${state['cost']:.4f} spent); finish it with: "
                                        + cli_command(f"experiment resume {experiment_id}", store.path))
    elapsed = time.perf_counter() - started
    store.finish_experiment(experiment_id, status, error, elapsed, other_cost=count_unrecorded())
    return ExperimentOutcome(experiment_id, status, error, elapsed, state["done"], state["failed"], state["cost"],
                             warned)


def _any_completed(store: Any, experiment_id: str) -> bool:
    return bool((store.experiment_runs(experiment_id).status == "completed").any())


def _spent(store: Any, experiment_id: str) -> float:
    """What the experiment's priced calls have cost so far: every run's (failed ones too), their
    judging, and calls no run records (runs a resume replaced, judging that failed part-way)."""
    return _spent_of(store.experiment(experiment_id), store.experiment_runs(experiment_id))


def _spent_of(experiment: dict[str, Any], runs: pd.DataFrame) -> float:
    """:func:`_spent` from the experiment's row and its runs (a page has them already)."""
    other = experiment.get("other_cost_usd")
    other = 0.0 if is_missing(other) else float(other)
    if runs.empty:
        return other
    return float(runs.cost_usd.dropna().sum() + runs.judge_cost_usd.dropna().sum()) + other


def spent_usd(store: Any, experiment_id: str) -> float | None:
    """:func:`_spent`, or ``None`` when some call's price is unknown (a partial sum would read
    as the whole)."""
    return spent_of(store.experiment(experiment_id), store.experiment_runs(experiment_id))


def spent_of(experiment: dict[str, Any], runs: pd.DataFrame) -> float | None:
    """:func:`spent_usd` from the experiment's row and its runs (``experiment_runs``)."""
    calls = runs.observer_calls.fillna(0) + runs.reflector_calls.fillna(0)
    unknown = (bool(experiment.get("other_cost_unknown")) or bool((runs.cost_usd.isna() & (calls > 0)).any())
               or bool((runs.judge_cost_usd.isna() & (runs.judge_calls.fillna(0) > 0)).any()))
    return None if unknown else _spent_of(experiment, runs)


POOL_END_S = 5.0  # how long a stop waits for a process pool to end once its workers are killed


async def _run_in_processes(tasks: Sequence[Task], options: ExperimentOptions, dataset: str,
                            dataset_format: str | None, extra: dict[str, Any], folder: str | None,
                            write: Callable[[dict[str, Any], Task], None],
                            moved: Callable[[tuple[int, str], float | None], None] | None = None) -> None:
    """Offline replays: CPU-bound, one worker process per slot; this process writes. The workers
    say how far their runs are through a queue this process reads between writes; a run whose
    replay ended is reported (``None``) until it is written."""
    import queue as queues

    from .runstore import process_token

    loop = asyncio.get_running_loop()
    context = _pool_context()
    reports = context.Queue() if moved is not None else None
    pool = ProcessPoolExecutor(max_workers=min(options.concurrency, len(tasks)), mp_context=context,
                               initializer=_worker_init,
                               initargs=(os.getpid(), process_token(), reports))
    pending = {loop.run_in_executor(pool, _replay_one, dataset, dataset_format, task, extra, folder,
                                    options.traces): task for task in tasks}
    if moved is not None:
        for future, task in pending.items():
            future.add_done_callback(lambda f, key=_run_key(task): None if f.cancelled() else moved(key, None))

    async def relay() -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            latest: dict[tuple[int, str], float | None] = {}
            with contextlib.suppress(queues.Empty, OSError, EOFError, ValueError):
                while True:
                    key, fraction = reports.get_nowait()
                    latest.pop(tuple(key), None)  # (ordered by last report: a run's end before the next's start)
                    latest[tuple(key)] = fraction
            for key, fraction in latest.items():
                moved(key, fraction)

    relaying = asyncio.ensure_future(relay()) if reports is not None else None
    try:
        await _collect(pending, write)
        await _stop_relay(relaying, raising=True)  # (a progress callback's error is the experiment's)
    except BaseException:
        # Stopped (Ctrl-C, an error): the runs in flight are dropped, not waited for (a resume
        # replays them), and the workers are ended now. Waiting on them here, a second Ctrl-C
        # left the process hung for good in the pool's exit; one landing in this block left the
        # workers running after the scheduler had gone.
        with ctrl_c_held_back():
            # A worker killed half-way through sending a run (a payload outgrows a pipe's 64 KiB: it
            # is sent in several writes) left the pool's manager thread waiting for the rest for
            # ever, as this process holds the pipe's write end too: the thread never ended, and the
            # interpreter's exit joins it (the app's server did not exit after such a Stop). With
            # that end closed, the workers' death is an end of file; the thread reads the pool as
            # broken, fails the runs not done and ends. Waited for (briefly) before the runs are
            # cancelled: a run cancelled first made it raise InvalidStateError half-way (3.11).
            manager = getattr(pool, "_executor_manager_thread", None)
            with contextlib.suppress(AttributeError, OSError):
                pool._result_queue._writer.close()  # (only the workers write to it)
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.kill()
            if manager is not None:
                manager.join(POOL_END_S)
            for future in pending:
                future.cancel()
            pool.shutdown(wait=False, cancel_futures=True)
            if reports is not None:
                reports.close()  # (its pipes, in a long-lived app process)
        await _stop_relay(relaying, raising=False)  # (the error already raised stands)
        raise
    pool.shutdown(wait=True)
    if reports is not None:  # (after the workers ended: none writes to it any more)
        reports.close()


async def _stop_relay(relaying: asyncio.Future | None, *, raising: bool) -> None:
    """Stop the progress relay; ``raising``: re-raise what ended it (a progress callback's error,
    e.g. Streamlit stopping the script) instead of leaving it unseen. A cancellation of the
    caller itself still reaches it (asyncio.wait does not swallow it)."""
    if relaying is None:
        return
    relaying.cancel()
    await asyncio.wait([relaying])
    if raising and not relaying.cancelled() and relaying.exception() is not None:
        raise relaying.exception()
    if not relaying.cancelled():
        relaying.exception()  # (retrieved: no "exception was never retrieved" at exit)


async def _collect(pending: dict[Any, Task], write: Callable[[dict[str, Any], Task], None]) -> None:
    """Write each finished run as it comes, yielding to the loop after each: a Ctrl-C's cancel
    lands at the next yield, so runs finished together were all written before it (a batch, or
    the whole experiment's last ones, ran to its end). The runs not yet written are left pending
    (``pending`` is emptied as they are written) for the caller to drop; a resume replays them."""
    while pending:
        done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for finished in done:
            write(finished.result(), pending.pop(finished))
            await asyncio.sleep(0)


async def _run_in_tasks(tasks: Sequence[Task], options: ExperimentOptions, dataset: str,
                        dataset_format: str | None, extra: dict[str, Any], folder: str | None,
                        write: Callable[[dict[str, Any], Task], None],
                        cost_of: Callable[[Task], Callable[[float | None], None]],
                        stop: asyncio.Event, moved: Callable[[tuple[int, str], float], None] | None = None) -> None:
    """Remote replays (or one at a time): asyncio tasks in this process under one semaphore;
    ``cost_of(task)`` is told each of the task's calls' cost as it is paid (``None``: unknown)."""
    gate = asyncio.Semaphore(options.concurrency)

    async def one(task: Task) -> None:
        async with gate:
            if stop.is_set():
                return
            payload = await _replay_one_async(dataset, dataset_format, task, extra, folder, options.traces, cost_of(task),
                                              on_progress=_throttled(moved, task) if moved is not None else None)
        if payload["run"]["status"] == "interrupted":
            return  # cancelled by the cost limit: replayed again by a resume
        write(payload, task)

    running = [asyncio.ensure_future(one(task)) for task in tasks]
    stopper = asyncio.ensure_future(stop.wait())
    try:
        pending = set(running)
        while pending:
            done, pending = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stopper)
            for finished in done - {stopper}:
                finished.result()
            if stop.is_set():
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                break
    finally:
        stopper.cancel()
        for task in running:
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # retrieved: Streamlit's stop raised in several at once logged "never retrieved"


def judging_inputs(store: Any, run_id: str) -> tuple[list[Any], str]:
    """What judging a completed stored run asks about: the probes whose evidence left the window,
    and the final context as text (memory + the last N messages, as word retention scores it)."""
    from . import judge as judging
    from .retention import render_context

    run = store.run(run_id)
    conversation = load_conversation(run["dataset"], run["conversation_id"], run["dataset_format"])
    return judging.left_the_window(store, run_id, conversation.probes), render_context(_final_context(store, run_id))


async def judge_stored_run(store: Any, run_id: str, *, answerer: str, judge: str,
                           completion_kwargs: dict[str, Any] | None = None,
                           spent: Callable[[float | None], None] | None = None) -> list[dict[str, Any]]:
    """LLM-judged accuracy of a completed stored run (``answerer`` answers each probe from the
    final context, ``judge`` grades it), recorded with the run with its calls and cost; ``spent``
    is told each call's cost as it is paid (``None``: a price unknown). Raises ``JudgeFailed``
    when a call fails: nothing judged is recorded (the calls made were paid for all the same)."""
    from . import judge as judging

    probes, context = judging_inputs(store, run_id)
    costs: list[float | None] = []

    def paid(cost: float | None) -> None:
        costs.append(cost)
        if spent is not None:
            spent(cost)

    rows = await judging.judge_probes(probes, context, answerer=answerer, judge=judge,
                                      completion_kwargs=completion_kwargs, spent=paid)
    store.record_judging(run_id, rows, len(costs), judging.total_cost(costs))
    return rows


async def _judge_experiment(store: Any, experiment_id: str, options: ExperimentOptions,
                            add_cost: Callable[[float], None], stop: asyncio.Event) -> None:
    """LLM-judged accuracy for every completed run not judged yet (answerer + judge over the final
    context), each run's calls and cost recorded with it and counted against the cost limit (which
    stops the judging between runs)."""
    from . import judge as judging

    runs = store.experiment_runs(experiment_id)
    for run in runs[runs.status == "completed"].itertuples():
        if stop.is_set():
            return
        if pd.notna(run.judge_calls) or not store.probes(run.run_id).query("method == 'llm_judge'").empty:
            continue
        costs: list[float | None] = []

        def spent(cost: float | None) -> None:
            costs.append(cost)
            if cost:
                add_cost(cost)

        try:
            await judge_stored_run(store, run.run_id, answerer=options.answerer, judge=options.judge,
                                   completion_kwargs=options.completion_extra(), spent=spent)
        except BaseException:  # the calls made were paid for: counted, though no run records them
            if costs:
                with ctrl_c_held_back():
                    store.add_other_cost(experiment_id, judging.known_cost(costs), None in costs)
            raise


def _as_written(value: Any, offset: Any = None) -> Any:
    """A stored message time at the UTC offset its date was written with (DuckDB hands TIMESTAMPTZ
    back in the machine's zone, and a message's date is its day there: 23:30 on 2 May at -05:00 is
    3 May in UTC). A run recorded before offsets were kept: UTC, as every shipped loader reads."""
    from datetime import timedelta, timezone

    stamp = pd.Timestamp(value)
    stamp = stamp.tz_convert("UTC") if stamp.tzinfo is not None else stamp.tz_localize("UTC")
    when = stamp.to_pydatetime()
    if offset is None or is_missing(offset):
        return when
    return when.astimezone(timezone(timedelta(seconds=int(offset))))


def _final_context(store: Any, run_id: str) -> list[Any]:
    """What the agent would see at the end of a run, as word retention scores it: the memory of
    the last step (no pass runs after it) and the last N messages of the conversation (not the
    last step's window, read before the last messages were saved)."""
    from datetime import datetime, timezone

    from omem_core import Message

    steps = store.steps(run_id)
    messages = store.messages(run_id).set_index("message_id")
    records = store.records(run_id).set_index("record_id")
    ids = json.loads(steps.iloc[-1].memory_ids or "[]") if not steps.empty else []  # (no read: no memory)
    memory = "\n\n".join(records.loc[i, "text"] for i in ids if i in records.index)
    out = []
    if memory:
        out.append(Message(id="memory", thread_id="t", role="system", content=memory,
                           created_at=datetime.now(timezone.utc)))
    window = int(store.run(run_id)["config"]["last_messages"])
    for message_id, row in (messages.iloc[-window:] if window else messages.iloc[:0]).iterrows():
        out.append(Message(id=message_id, thread_id="t", role=row.role, content=row.content,
                           created_at=_as_written(row.created_at, getattr(row, "utc_offset_s", None))))
    return out


# -- figures ---------------------------------------------------------------------------------------

@dataclass
class ConfigSummary:
    label: str
    config: dict[str, Any]
    runs: int
    failed: int
    probes: int
    retention: float | None
    retention_ci95: tuple[float, float] | None
    compression: float | None
    recency_ratio: float | None
    blind_spot_tokens: float | None
    observer_calls: int
    reflector_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    latency_ms_per_call: float | None
    per_category: dict[str, dict[str, Any]] = field(default_factory=dict)
    funnel: dict[str, int] = field(default_factory=dict)
    judged_accuracy: float | None = None
    judge_unscored: int = 0  # judge replies that named no verdict (not scored)
    judge_calls: int = 0  # answerer + judge calls (their cost is in cost_usd)
    errors: list[str] = field(default_factory=list)
    missing: int = 0  # planned runs with no record: never started (an interrupted grid), or deleted

    @property
    def not_completed(self) -> int:
        return self.failed + self.missing

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["retention_ci95"] = list(self.retention_ci95) if self.retention_ci95 else None
        return out


def _total_cost(done: pd.DataFrame) -> float | None:
    """What the completed runs' calls cost, judging included; ``None`` when a price is unknown."""
    if not len(done) or done.cost_usd.isna().any():
        return None
    judged = done[done.judge_calls.fillna(0) > 0]
    if judged.judge_cost_usd.isna().any():
        return None
    return float(done.cost_usd.sum() + judged.judge_cost_usd.sum())


def _mean(values: pd.Series) -> float | None:
    values = values.dropna()
    return float(values.mean()) if len(values) else None


def _per_read(runs: pd.DataFrame) -> float | None:
    """The mean blind spot over every read of ``runs`` (each run's mean weighed by its reads),
    not a mean of the runs' means, which counts a short conversation as much as a long one."""
    known = runs[runs.blind_spot_tokens.notna() & runs.steps.notna() & (runs.steps > 0)]
    reads = float(known.steps.sum())
    return float((known.blind_spot_tokens * known.steps).sum() / reads) if reads else None


def probe_scores(probes: pd.DataFrame, method: str = "memory") -> dict[tuple[str, str], float]:
    """``(conversation, probe) -> score`` for one scoring method (scored probes only)."""
    rows = probes[(probes.method == method) & probes.score.notna()]
    return {(r.conversation_id, r.probe_id): float(r.score) for r in rows.itertuples()}


def summarise(store: Any, experiment_id: str) -> list[ConfigSummary]:
    """Figures per configuration, pooled over the experiment's conversations."""
    return summaries_of(store.experiment(experiment_id), store.experiment_runs(experiment_id),
                        store.experiment_probes(experiment_id), store.experiment_losses(experiment_id))


def per_conversation(experiment: dict, runs: pd.DataFrame, probes: pd.DataFrame) -> list[dict[str, Any]]:
    """Each configuration's figures on each conversation (configurations, then conversations, in
    the experiment's order): the spread between conversations, which the pooled interval (a
    bootstrap over probes) does not show. A pair without a completed run has its status and no
    figures."""
    memory = probes[(probes.method == "memory") & probes.score.notna()] if not probes.empty else probes
    scores = {key: group.score for key, group in memory.groupby(["config_label", "conversation_id"])} \
        if not memory.empty else {}
    # One pass over the runs (a grid of 12 over 500 conversations is 6,000 pairs): the last run of
    # each pair, and its last completed one.
    last: dict[tuple[str, str], Any] = {}
    completed: dict[tuple[str, str], Any] = {}
    for run in runs.itertuples(index=False):
        key = (run.config_label, run.conversation_id)
        last[key] = run
        if run.status == "completed":
            completed[key] = run
    rows = []
    for entry in experiment["configs"]:
        label = entry["label"]
        for conversation_id in experiment["conversations"]:
            key = (label, conversation_id)
            run = completed.get(key)
            row: dict[str, Any] = {"label": label, "conversation_id": conversation_id,
                                   "status": "completed" if run is not None else
                                   (str(last[key].status) if key in last else "missing"),
                                   "probes": 0, "retention": None, "compression": None}
            if run is None and key in last and not is_missing(last[key].error):
                row["error"] = str(last[key].error)  # (why it did not complete)
            if run is not None:
                score = scores.get(key)
                row["probes"] = int(len(score)) if score is not None else 0
                row["retention"] = float(score.mean()) if score is not None and len(score) else None
                history, context = run.full_history_tokens, run.final_context_tokens
                row["compression"] = (float(history / context) if not is_missing(history)
                                      and not is_missing(context) and context else None)
            rows.append(row)
    return rows


def conversation_tally(probes: pd.DataFrame, a: str, b: str) -> dict[str, int]:
    """On how many conversations ``a``'s retention is higher, ``b``'s is, or they are equal (within
    0.0005), each over the probes both scored there, as the paired comparison pairs them (with
    windows of different sizes they score different probes): whether a pooled difference holds
    across conversations or comes from one of them. ``probes``: ``experiment_probes``."""
    tally = {"a_higher": 0, "b_higher": 0, "equal": 0}
    if probes.empty:
        return tally
    memory = probes[(probes.method == "memory") & probes.score.notna()]
    sides = [memory[memory.config_label == label].set_index(["conversation_id", "probe_id"]).score.rename(side)
             for label, side in ((a, "a"), (b, "b"))]
    paired = pd.concat(sides, axis=1, join="inner")
    for first, second in paired.groupby(level=0).mean().itertuples(index=False):
        tally["equal" if abs(first - second) < 0.0005 else "a_higher" if first > second else "b_higher"] += 1
    return tally


def tally_text(a: str, b: str, tally: dict[str, int] | None) -> str:
    """"; by conversation (4 scored by both): obs 500 higher on 3, obs 2000 higher on 1": whether a
    pooled difference holds conversation by conversation (:func:`conversation_tally`). Empty with
    fewer than two conversations scored by both."""
    if not tally or sum(tally.values()) < 2:
        return ""
    total = sum(tally.values())
    parts = [f"{label} higher on {n}" for label, n in ((a, tally["a_higher"]), (b, tally["b_higher"])) if n]
    if tally["equal"]:
        parts.append(f"equal on {tally['equal']}")
    return f"; by conversation ({total} scored by both): " + ", ".join(parts)


def shared_conversations(runs: pd.DataFrame, labels: Sequence[str]) -> list[str]:
    """The conversations every one of ``labels`` completed (in the runs' order)."""
    done = runs[runs.status == "completed"]
    sets = [set(done[done.config_label == label].conversation_id) for label in labels]
    common = set.intersection(*sets) if sets else set()
    return [c for c in dict.fromkeys(runs.conversation_id) if c in common]


def summaries_of(experiment: dict, runs: pd.DataFrame, probes: pd.DataFrame, losses: pd.DataFrame,
                 conversations: Collection[str] | None = None) -> list[ConfigSummary]:
    """:func:`summarise` from the experiment's tables, on ``conversations`` only when given (so
    two configurations are set side by side on the same conversations when one of them did not
    complete them all)."""
    scope = list(conversations) if conversations is not None else list(experiment["conversations"])
    if conversations is not None:
        keep = set(conversations)
        runs, probes, losses = (frame[frame.conversation_id.isin(keep)] for frame in (runs, probes, losses))
    # The bootstrap draws by position: the same scores give the same interval only in one order.
    probes = probes.sort_values(["conversation_id", "probe_id", "method"], kind="stable")
    # Each table split by configuration once (a filter per configuration was quadratic: 8 s for a
    # grid of 200 on the demo, redone at every run written while the Experiments page followed it).
    runs_of, probes_of, losses_of = ({label: group for label, group in frame.groupby("config_label", sort=False)}
                                     for frame in (runs, probes, losses))
    out = []
    for entry in experiment["configs"]:
        label = entry["label"]
        mine = runs_of.get(label, runs.iloc[0:0])
        done = mine[mine.status == "completed"]
        scores = probes_of.get(label, probes.iloc[0:0])
        memory = scores[(scores.method == "memory") & scores.score.notna()]
        recent = scores[(scores.method == "recent_tokens") & scores.score.notna()]
        retention = _mean(memory.score)
        recent_mean = _mean(recent.score)
        history, context = done.full_history_tokens.sum(), done.final_context_tokens.sum()
        calls = int(done.observer_calls.fillna(0).sum() + done.reflector_calls.fillna(0).sum())
        latency = float(done.model_latency_ms.fillna(0).sum()) / calls if calls else None
        per_category = {}
        for category, group in memory.groupby(memory.category.fillna("uncategorised")):
            per_category[str(category)] = {"probes": int(len(group)), "retention": float(group.score.mean()),
                                           "retention_ci95": bootstrap_ci(group.score.tolist())}
        judged = scores[(scores.method == "llm_judge") & scores.score.notna()]
        out.append(ConfigSummary(
            label=label, config=entry["config"], runs=int(len(done)), failed=int(len(mine) - len(done)),
            missing=max(0, len(scope) - int(mine.conversation_id.nunique())),
            probes=int(len(memory)), retention=retention, retention_ci95=bootstrap_ci(memory.score.tolist()),
            compression=float(history / context) if len(done) and context else None,
            recency_ratio=(retention / recent_mean) if retention is not None and recent_mean else None,
            blind_spot_tokens=_per_read(done),
            observer_calls=int(done.observer_calls.fillna(0).sum()),
            reflector_calls=int(done.reflector_calls.fillna(0).sum()),
            input_tokens=int(done.input_tokens.fillna(0).sum()), output_tokens=int(done.output_tokens.fillna(0).sum()),
            cost_usd=_total_cost(done),
            judge_calls=int(done.judge_calls.fillna(0).sum()),
            latency_ms_per_call=latency, per_category=per_category,
            funnel=funnel(losses_of.get(label, losses.iloc[0:0]).to_dict("records")),
            judged_accuracy=_mean(judged.score),
            judge_unscored=int(((scores.method == "llm_judge") & scores.score.isna()).sum()),
            errors=_errors_by_conversation(mine[mine.status != "completed"]),
        ))
    return out


def _errors_by_conversation(failed: pd.DataFrame) -> list[str]:
    """A configuration's errors, each once, with the conversations it ended (``conv-26: …``;
    ``conv-26, conv-30 and 2 more: …``): an error alone did not say which run it was."""
    where: dict[str, list[str]] = {}
    for run in failed.itertuples():
        if not is_missing(run.error):
            named = where.setdefault(str(run.error), [])
            if run.conversation_id not in named:
                named.append(str(run.conversation_id))
    out = []
    for error, conversations in sorted(where.items()):
        named = ", ".join(conversations[:2]) + (f" and {len(conversations) - 2} more" if len(conversations) > 2 else "")
        out.append(f"{named}: {error}")
    return out


def resolve_label(names: Sequence[str], given: str, experiment_id: str) -> str:
    """The configuration ``given`` names: its label exactly, or typed without the "·"
    separators or in another case ("obs 300 ref 1000"), or its position in the grid from 1."""
    if given in names:
        return given

    def loose(label: str) -> str:
        return " ".join(label.replace("·", " ").casefold().split())

    matches = [n for n in names if loose(n) == loose(given)]
    listed = ", ".join(f"{i} {n}" for i, n in enumerate(names, 1))
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ExperimentError(f"{given!r} matches {len(matches)} configurations of {experiment_id}: give the exact "
                              f"label or the number (number, label): {listed}")
    number = given.strip()
    if number.isascii() and number.isdecimal() and 1 <= int(number) <= len(names):
        return names[int(number) - 1]
    raise ExperimentError(f"no configuration {given!r} in {experiment_id}; it has (number, label): {listed}")


def compare(store: Any, experiment_id: str, a: str, b: str) -> Any:
    """The paired difference in retention, ``b`` minus ``a``, on the probes both scored; ``a``
    and ``b`` as :func:`resolve_label` reads them."""
    experiment = store.experiment(experiment_id)
    names = [entry["label"] for entry in experiment["configs"]]
    a, b = (resolve_label(names, label, experiment_id) for label in (a, b))
    if a == b:
        raise ExperimentError(f"both sides are {a!r}: name two different configurations")
    probes = store.experiment_probes(experiment_id)
    return paired_difference(a, b, probe_scores(probes[probes.config_label == a]),
                             probe_scores(probes[probes.config_label == b]))


def status_phrase(status: str) -> str:
    """``status`` as the rest of "This experiment …": "failed", "was interrupted", "is running"."""
    return {"failed": "failed", "interrupted": "was interrupted", "stopped": "was stopped",
            "running": "is running", "completed": "completed"}.get(status, f"is {status}")


def uneven_note(runs: Any) -> str | None:
    """When the configurations completed different sets of conversations (an interrupted grid,
    a run deleted), their pooled rows cover different probes and cannot be ranked against each
    other: the sentence that says so, else ``None``. ``runs``: ``RunStore.experiment_runs``."""
    done = runs[runs.status == "completed"]
    if done.empty:
        return None
    covered = done.groupby("config_label").conversation_id.agg(frozenset)
    if covered.nunique() < 2:
        return None
    return ("The configurations completed different conversations, so their rows pool different probes and "
            "cannot be ranked against each other; the paired comparisons use only the conversations both "
            "completed.")


BEHIND = 2.0  # a mean blind spot over this many observation thresholds: the observer fell behind


def backlog_note(summaries: Sequence[ConfigSummary]) -> str | None:
    """The configurations whose observer fell behind on the experiment's conversations, when any
    did, and what bounds it: their blind spot (messages neither in memory nor in the window)
    averages over :data:`BEHIND` times their observation threshold, with no backlog ceiling. A
    segment is at most the threshold, so reads that add more leave a backlog that keeps growing
    (52k tokens at the end of a BEAM chat at obs 1000); the runs' pages said so, one conversation
    at a time, and the experiment's pages never did."""
    behind = [s for s in summaries
              if s.blind_spot_tokens is not None and not s.config.get("max_backlog")
              and s.blind_spot_tokens > BEHIND * int(s.config.get("observation_threshold") or 0) > 0]
    if not behind:
        return None
    said = "; ".join(f"{s.label}: {s.blind_spot_tokens:,.0f} tokens, "
                     f"{s.blind_spot_tokens / int(s.config['observation_threshold']):.0f}x its observation threshold"
                     for s in behind[:4]) + (f"; and {len(behind) - 4} more" if len(behind) > 4 else "")
    return (f"The observer fell behind under {count(len(behind), 'configuration')}: a read observes at most one "
            f"segment, so on these conversations the blind spot (messages neither in memory nor in the window, "
            f"invisible to the agent) grew; it averages, per read, {said}. A backlog ceiling bounds it (the "
            "Experiments page's \"Backlog ceilings\", --max-backlog, max_backlog in the library): past it, a read "
            "observes a larger segment. Compare with the same configuration under a ceiling.")


def config_figures(summary: ConfigSummary) -> dict[str, Any]:
    """One configuration's pooled figures as ``report()`` (and `experiment compare --json`) give them."""
    keys = ("label", "config", "runs", "failed", "missing", "probes", "retention", "retention_ci95", "compression",
            "recency_ratio", "blind_spot_tokens", "observer_calls", "reflector_calls", "cost_usd")
    figures = summary.to_json()
    return {k: figures[k] for k in keys} | {
        "per_category": summary.per_category, "funnel": summary.funnel, "judged_accuracy": summary.judged_accuracy,
        "judge_unscored": summary.judge_unscored, "judge_calls": summary.judge_calls, "errors": summary.errors}


def report(store: Any, experiment_id: str) -> dict[str, Any]:
    """The ``--json`` summary: the experiment, every configuration's figures, and each
    configuration compared with the first (the baseline)."""
    experiment = store.experiment(experiment_id)
    summaries = summarise(store, experiment_id)
    runs, probes = store.experiment_runs(experiment_id), store.experiment_probes(experiment_id)
    conversations = per_conversation(experiment, runs, probes)
    comparisons = []
    if len(summaries) > 1:
        base = summaries[0].label
        for other in summaries[1:]:
            diff = compare(store, experiment_id, base, other.label)
            comparisons.append({"a": base, "b": other.label, "retention_diff": diff.difference,
                                "ci95": list(diff.ci95) if diff.ci95 else None, "verdict": diff.verdict(),
                                "detectable": diff.detectable,
                                "conversations": conversation_tally(probes, base, other.label)})
    failed = sum(s.failed for s in summaries)
    missing = sum(s.missing for s in summaries)
    from .errors import stopped_by_dataset

    # the failed runs a resume would replay to the same end: stopped by a message of the dataset
    refused = sum(row["status"] == "failed" and stopped_by_dataset(row.get("error")) for row in conversations)
    planned = len(experiment["conversations"]) * len(experiment["configs"])
    done = runs[runs.status == "completed"]
    scoring_note, rescorable = rule_note(experiment, runs)
    return {
        "experiment_id": experiment_id, "name": experiment["name"], "status": experiment["status"],
        # why it stopped, as recorded (a Ctrl-C, the cost limit, an error of its own; None when it completed)
        "error": None if is_missing(experiment.get("error")) else str(experiment["error"]),
        "status_text": status_text(experiment["status"], failed, planned, missing), "failed_runs": failed,
        "dataset_failed_runs": refused,
        "missing_runs": missing,
        "planned_runs": planned, "completed_runs": int(len(done)),
        "completed_conversations": int(done.conversation_id.nunique()),
        "dataset": experiment["dataset"], "conversations": experiment["conversations"],
        # (None: never measured — its process died before any part of it ended)
        "elapsed_s": None if is_missing(experiment["elapsed_s"]) else float(experiment["elapsed_s"]),
        "configs": [config_figures(s) for s in summaries],
        "comparisons": comparisons, "uneven_note": uneven_note(runs), "backlog_note": backlog_note(summaries),
        "per_conversation": conversations,
        # every call paid for: completed runs (the configurations' cost_usd), failed and replaced ones
        "spent_usd": spent_usd(store, experiment_id),
        # the retention scoring rule of every run (workbench.retention.SCORING_RULES)
        "scoring": experiment_rule(experiment["options"]),
        # what to say of it (None: every run under the current rule), and whether rescore brings it there
        "scoring_note": scoring_note, "rescorable": rescorable,
    }


def export_parquet(store: Any, experiment_id: str, folder: str | Path) -> list[Path]:
    """The experiment and all of its runs' tables, one Parquet file per table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .runstore import RUN_TABLES

    store.experiment(experiment_id)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with store.session() as cur:
        tables = {"experiments": "SELECT * FROM experiments WHERE experiment_id = $1"}
        for table in RUN_TABLES:
            tables[table] = (f"SELECT t.* FROM {table} t WHERE t.run_id IN "
                             "(SELECT run_id FROM runs WHERE experiment_id = $1)")
        for table, sql in tables.items():
            rows: pa.Table = cur.sql(sql, params=[experiment_id]).to_arrow_table()
            target = out / f"{table}.parquet"
            pq.write_table(rows, target)
            written.append(target)
    return written


__all__ = ["ConfigSummary", "ExperimentError", "ExperimentOptions", "ExperimentOutcome", "experiment_rule", "Progress", "STAGES",
           "choose_conversations", "compare", "config_figures", "config_grid", "create_experiment", "estimate_cost", "estimate_judging",
           "export_parquet", "labels",
           "pending_tasks", "report", "resolve_label", "run_experiment", "status_phrase", "summarise",
           "uneven_note", "unscored_warning", "backlog_note"]
