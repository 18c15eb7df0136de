"""Re-scoring recorded runs under the current retention rule, without replaying them.

A run's retention is scored from what the agent saw at the end: the memory of its last read and
the last N messages. Both are in the run store (records, steps, messages), and so are its probes
(question, gold, evidence), so a completed run can be scored again under another rule with no
model call (the dataset is read only for the time offsets of a run recorded before the store kept
them). Before anything is written, the run is scored again under the rule it *was* scored with: every probe's score under every method, and every loss
row, must come out as recorded, or the run is left as it is (its final context could not be
rebuilt exactly). An experiment is re-scored whole or not at all, in one transaction, and then
scores the runs a resume adds under the new rule too: no figure pools two rules.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from .errors import WorkbenchError
from .formatting import share as _share
from .retention import METHODS, SCORING, check_scoring, scoring_rule, stale_runs


class RescoreError(WorkbenchError, ValueError):
    """A run or experiment cannot be re-scored (the message says why); nothing was written."""


@dataclass
class Rescored:
    """One run's figures under ``rule``, checked against what it recorded under ``was``."""

    run_id: str
    conversation_id: str
    was: int
    rule: int
    before: dict[str, float | None]  # retention figures as recorded
    figures: dict[str, Any]  # the new ones (the runs table's columns), ``scoring`` included
    probes: list[dict[str, Any]]  # the probe rows of the word-retention methods
    losses: list[dict[str, Any]] | None  # the loss rows (None: the run recorded none, none written)

    def describe(self) -> str:
        def change(key: str) -> str:
            old, new = self.before.get(key), self.figures.get(key)
            return f"{_share(old)} → {_share(new)}"

        return (f"run {self.run_id} ({self.conversation_id}): retention {change('retention')} under rule {self.rule} "
                f"(was rule {self.was}; full history {change('retention_full_history')}, window only "
                f"{change('retention_window_only')}, recency {change('retention_recent')})")


_FIGURES = ("retention", "retention_full_history", "retention_window_only", "retention_recent")


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _same(a: Any, b: Any) -> bool:
    a, b = _number(a), _number(b)
    return a == b if a is None or b is None else math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _conversation(store: Any, run: dict[str, Any]) -> Any:
    """The run's conversation as it recorded it: its messages, and its probes from its probe rows.

    A message's date is its day at the offset it was written with: recorded with the run since
    offsets were kept; for a run recorded before, taken from its dataset when that still reads
    the same, else UTC (every shipped loader's)."""
    from .datasets import Conversation, Probe, Turn
    from .experiments import _as_written

    messages = store.messages(run["run_id"])
    kept = "utc_offset_s" in messages and bool(messages.utc_offset_s.notna().any())
    times = [_as_written(row.created_at, row.utc_offset_s if kept else None) for row in messages.itertuples()]
    if not kept:
        times = _dataset_times(run, messages) or times
    turns = [Turn(row.message_id, row.role, row.content, when) for row, when in zip(messages.itertuples(), times)]
    rows = store.probes(run["run_id"])
    probes = []
    for row in rows[rows.method == "memory"].itertuples():
        gold = row.gold if isinstance(row.gold, str) else None
        evidence = tuple(json.loads(row.evidence)) if isinstance(row.evidence, str) else ()
        probes.append(Probe(row.probe_id, row.question, gold, row.category, evidence))
    return Conversation(run["conversation_id"], turns, probes, source=run["dataset"])


def _dataset_times(run: dict[str, Any], messages: Any) -> list[Any] | None:
    """The messages' dates as the run's dataset writes them (with their offsets), when it still
    reads as the run recorded it; else ``None``."""
    from .replay import dataset_change

    fmt = run.get("dataset_format")
    conversation = _dataset(str(run["dataset"]), fmt if isinstance(fmt, str) else None).get(run["conversation_id"])
    if conversation is None:  # (moved, edited, unreadable: the store's UTC dates are used)
        return None
    if dataset_change(conversation, messages) is not None:
        return None
    return [turn.created_at for turn in conversation.turns]


@functools.lru_cache(maxsize=4)
def _read_dataset(path: str, fmt: str | None, stamp: tuple[int, int]) -> dict[str, Any]:
    from .datasets import load_dataset

    try:
        return {c.id: c for c in load_dataset(path, fmt)}
    except Exception:  # noqa: BLE001  (unreadable now: the store's dates are used)
        return {}


def _dataset(path: str, fmt: str | None) -> dict[str, Any]:
    """A dataset's conversations by id, read once for all the runs re-scored on it (a large file
    read per run took seconds each); empty when it cannot be read."""
    try:
        info = os.stat(path)
    except OSError:
        return {}
    return _read_dataset(path, fmt, (info.st_mtime_ns, info.st_size))


def _final_state(store: Any, run_id: str, context: list[Any], window: list[Any]) -> tuple[list[Any], Any]:
    """The records and the end state loss attribution reads (window, reflection, unreflected
    notes, context), from the last read's memory ids."""
    steps = store.steps(run_id)
    records = store.load_records(run_id)
    by_id = {r.id: r for r in records}
    ids = json.loads(steps.iloc[-1].memory_ids or "[]") if not steps.empty else []
    shown = [by_id[i] for i in ids if i in by_id]
    reflection = shown[0] if shown and shown[0].kind == "reflection" else None
    unreflected = shown[1:] if reflection is not None else shown
    return records, SimpleNamespace(window=window, reflection=reflection, unreflected=unreflected, context=context)


class _Rows:
    """What ``score_retention`` would save (it is given a recorder)."""

    rows: list[dict[str, Any]]

    def save_probes(self, rows: list[dict[str, Any]], methods: Sequence[str]) -> None:
        self.rows = list(rows)


def rescore_run(store: Any, run_id: str, rule: int = SCORING) -> Rescored:
    """``run_id`` scored under ``rule`` from the store alone, after checking that scoring it
    under the rule it recorded gives back every recorded probe score and loss row. Writes nothing
    (:meth:`RunStore.write_rescored` does); :class:`RescoreError` when it cannot be re-scored."""
    from omem_core import token_counter

    from .experiments import _final_context
    from .losses import attribute_losses
    from .retention import score_retention

    check_scoring(rule)
    run = store.run(run_id)
    was = scoring_rule(run.get("scoring"))
    if run["status"] == "running":
        raise RescoreError(f"run {run_id} is running: re-score it once it has completed (if it completes under an "
                           "earlier rule)")
    if run["status"] != "completed":
        raise RescoreError(f"run {run_id} is {run['status']}: only a completed run has figures to re-score (resume "
                           "it: it is scored under its rule when it completes)")
    if was is None:
        raise RescoreError(f"run {run_id} has no retention figures to re-score (no probe of its conversation "
                           "could be scored)")
    if was > SCORING:
        raise RescoreError(f"run {run_id} is scored under rule {was}, a later rule than this version of omem knows "
                           f"(rules 1–{SCORING}): upgrade omem to read it")
    experiment = run.get("experiment_id")
    # what to do instead when it cannot be re-scored: an experiment's run keeps its experiment's rule
    instead = (f"replay it to score it under rule {rule}" if not (isinstance(experiment, str) and experiment) else
               f"this run of experiment {experiment} stays under rule {was}; to have its figures under rule {rule}, "
               "run the experiment again as a new one (experiment run)")
    conversation = _conversation(store, run)
    stored = _final_context(store, run_id)
    # the last N messages (the conversation's own system messages among them), dated as written
    shown = min(int(run["config"]["last_messages"]), len(conversation.turns))
    window = [t.to_message(conversation.id) for t in conversation.turns[len(conversation.turns) - shown:]]
    context = stored[:len(stored) - shown] + window  # (the memory, if any, then the window)
    budget = int(run["final_context_tokens"])
    count = token_counter(run["config"].get("token_counter", "heuristic"))
    recorded = store.probes(run_id)
    recorded = {(r.probe_id, r.method): r.score for r in recorded.itertuples() if r.method in METHODS}
    records, state = _final_state(store, run_id, context, window)
    calls = store.model_calls(run_id)
    written = {c.record_id: int(c.step) for c in calls.itertuples()
               if isinstance(c.record_id, str) and c.record_id and _number(c.step) is not None}

    def score(under: int) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
        rows = _Rows()
        summary = score_retention(conversation, context, window, budget, count, rows, under)
        return summary, rows.rows, attribute_losses(conversation, records, state, (), written, under)

    _, old_rows, old_losses = score(was)
    rebuilt = {(r["probe_id"], r["method"]): r["score"] for r in old_rows}
    if set(rebuilt) != set(recorded) or not all(_same(rebuilt[k], recorded[k]) for k in recorded):
        differ = sorted(k for k in set(rebuilt) | set(recorded)
                        if k not in rebuilt or k not in recorded or not _same(rebuilt[k], recorded[k]))
        probe, method = first = differ[0]
        was_then, now = _share(_number(recorded.get(first))), _share(_number(rebuilt.get(first)))
        raise RescoreError(f"run {run_id} cannot be re-scored: its final context could not be rebuilt exactly from "
                           f"the store (scored again under rule {was}, {len(differ)} probe score(s) differ from what "
                           f"it recorded, first {probe!r} by {method}: recorded {was_then}, rebuilt {now}); {instead}")
    stored_losses = store.losses(run_id)
    if not stored_losses.empty:
        kept = {row.probe_id: row for row in stored_losses.itertuples()}
        if len(kept) != len(old_losses):
            raise RescoreError(f"run {run_id} cannot be re-scored: its loss attribution could not be rebuilt exactly "
                               f"from the store ({len(kept)} rows recorded, {len(old_losses)} rebuilt); {instead}")
        for row in old_losses:
            old = kept.get(row["probe_id"])
            if old is None or not all(_same(row[k], getattr(old, k)) for k in
                                      ("observation_score", "reflection_score", "visible_score", "lost_step")) \
                    or (row["lost_at"] or None) != (old.lost_at if isinstance(old.lost_at, str) else None):
                raise RescoreError(f"run {run_id} cannot be re-scored: its loss attribution could not be rebuilt "
                                   f"exactly from the store (probe {row['probe_id']!r}); {instead}")
    summary, rows, losses = score(rule)
    figures: dict[str, Any] = {"scoring": rule}
    if summary.scored:
        figures.update(retention=summary.retention, retention_full_history=summary.full_history,
                       retention_window_only=summary.window_only, retention_recent=summary.recent_tokens)
    else:
        figures.update({key: None for key in _FIGURES})
    return Rescored(run_id, run["conversation_id"], was, rule, {k: _number(run.get(k)) for k in _FIGURES}, figures,
                    rows, None if stored_losses.empty else losses)


def rescore_runs(store: Any, run_ids: Sequence[str], rule: int = SCORING) -> list[Rescored]:
    """Re-score runs that belong to no experiment (an experiment's are re-scored with it, by
    :func:`rescore_experiment`), each written on its own; runs already under ``rule`` are left.
    Returns the runs re-scored; :class:`RescoreError` for the first that cannot be (those before it
    are written)."""
    done = []
    for run_id in run_ids:
        run = store.run(run_id)
        experiment = run.get("experiment_id")
        if isinstance(experiment, str) and experiment:
            raise RescoreError(f"run {run_id} belongs to experiment {experiment}, whose runs are scored under one "
                               f"rule: re-score the experiment (rescore --experiment {experiment})")
        if scoring_rule(run.get("scoring")) == rule:
            continue
        rescored = rescore_run(store, run_id, rule)
        store.write_rescored([rescored])
        done.append(rescored)
    return done


def rescore_experiment(store: Any, experiment_id: str, rule: int = SCORING) -> list[Rescored]:
    """Re-score every completed run of an experiment scored under another rule than ``rule``, and
    record that its runs are scored under it from now on (a resume's too) — all in one write, or
    nothing when any run cannot be re-scored (:class:`RescoreError` naming it). An empty list when
    it already is, every run included."""
    from .experiments import experiment_rule

    check_scoring(rule)
    experiment = store.experiment(experiment_id)
    recorded = experiment_rule(experiment["options"])
    if recorded > SCORING:
        raise RescoreError(f"experiment {experiment_id} is scored under rule {recorded}, a later rule than this "
                           f"version of omem knows (rules 1–{SCORING}): upgrade omem to read it")
    runs = store.experiment_runs(experiment_id)
    stale = stale_runs(runs, rule)
    if recorded == rule and not stale:
        return []
    if experiment["status"] == "running":
        raise RescoreError(f"experiment {experiment_id} is running: re-score it once it has finished or been "
                           "stopped; nothing was re-scored")
    running = runs[runs.status == "running"]
    if not running.empty:
        raise RescoreError(f"run {running.run_id.iloc[0]} of experiment {experiment_id} is running (resumed on its "
                           "own): re-score the experiment once it has finished; nothing was re-scored")
    try:
        done = [rescore_run(store, run_id, rule) for run_id in stale]
    except RescoreError as exc:
        raise RescoreError(f"experiment {experiment_id} was not re-scored (nothing was written): {exc}") from None
    store.write_rescored(done, experiment_id=experiment_id, rule=rule)
    return done


def earlier_runs(store: Any, rule: int = SCORING) -> tuple[list[str], list[str]]:
    """The experiments with figures under another rule than ``rule`` that can be re-scored (their
    recorded rule, or a run of theirs: one that completed under it while the experiment was
    re-scored, before that could not happen), and the runs of no experiment scored under one. A
    later rule than this version knows (a newer omem's) is left out: it cannot be re-scored here."""
    from .experiments import experiment_rule

    runs = store.runs()
    alone = runs.experiment_id.map(lambda e: not (isinstance(e, str) and e)).astype(bool)
    theirs = runs[~alone]
    mixed = set(theirs[theirs.run_id.isin(stale_runs(theirs, rule))].experiment_id)
    old_experiments = [row.experiment_id for row in store.experiments().itertuples()
                       if rule != experiment_rule(row.options) <= SCORING or row.experiment_id in mixed]
    return old_experiments, stale_runs(runs[alone], rule)


__all__ = ["RescoreError", "Rescored", "earlier_runs", "rescore_experiment", "rescore_run", "rescore_runs"]
