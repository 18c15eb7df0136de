"""Pure functions behind the app's experiment pages: tables, grids, diffs, traces, step helpers.

No Streamlit here: every function takes the run store's DataFrames (or the engine's summaries)
and returns plain data, so the pages only lay it out and these are unit-tested without a browser.
Every figure shown goes through :mod:`workbench.formatting` (never ``nan``).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import pandas as pd

from .formatting import DEFAULT_DB, MISSING, about_money, cli_command, count, default_run_label, display, fixed, money, progress, ratio, share, short_path, split_list, tokens, typed
from .formatting import missing as _missing
from .models import DEFAULT_PROMPT_VERSIONS, OFFLINE_MODEL
from .losses import STAGE_NAMES, STAGES
from .retention import is_earlier
from .stats import paired_difference, signed

KEPT = 0.5  # a probe scoring at least this is "kept" (the retention rule's threshold)
LOCOMO_CATEGORIES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop", "5": "adversarial"}


def missing(value: Any) -> bool:
    """:func:`workbench.formatting.missing`, plus pandas' ``NA`` (nullable integer columns)."""
    if value is pd.NA or value is pd.NaT:
        return True
    return _missing(value)


def _value(value: Any) -> Any:
    """``None`` for any missing marker (pandas' NA included), else the value."""
    return None if missing(value) else value


def category_name(value: Any) -> str:
    """A probe category by name: LoCoMo's codes 1–5 named, snake_case read as words
    (``knowledge_update`` → "knowledge update"), a missing one "uncategorised"."""
    if missing(value) or str(value).strip() == "":
        return "uncategorised"
    text = str(value).strip()
    if text.endswith(".0"):
        text = text[:-2]
    return LOCOMO_CATEGORIES.get(text, text.replace("_", " "))


def clean(frame: pd.DataFrame) -> pd.DataFrame:
    """Every missing value shown as an en dash (object columns), so no table says ``nan``."""
    return frame.astype(object).map(lambda v: MISSING if missing(v) else v)


# Stored columns as a table shows them: a header people read and a number format (printf, as
# Streamlit's NumberColumn takes it; ``%,d`` adds thousands separators). Numbers stay numbers, so a
# column still sorts by value; only what is drawn changes.
COLUMNS: dict[str, tuple[str, str | None]] = {
    "run_id": ("run", None), "created_at": ("created", None), "status": ("status", None),
    "conversation_id": ("conversation", None), "probe_id": ("probe", None), "label": ("label", None),
    "observer": ("observer", None), "reflector": ("reflector", None), "error": ("error", None),
    "observation_threshold": ("observation threshold", "%,d"), "reflection_threshold": ("reflection threshold", "%,d"),
    "window": ("window", "%,d"), "steps": ("steps", "%,d"), "planned_steps": ("planned steps", "%,d"),
    "observer_calls": ("observer calls", "%,d"), "reflector_calls": ("reflector calls", "%,d"),
    "input_tokens": ("tokens in", "%,d"), "output_tokens": ("tokens out", "%,d"), "probes": ("probes", "%,d"),
    "compression": ("compression", "%.1fx"), "retention": ("retention", "%.3f"), "score": ("score", "%.3f"),
    "cost_usd": ("cost", "$%.4f"), "latency_ms": ("latency (ms)", "%,.0f"),
    "evidence_in_window": ("evidence in window", None),
}
SCORE_FORMAT = "%.3f"


_FIGURE = re.compile(r"^[+\-−]?[$\[]?[+\-]?\d[\d,]*(\.\d+)?(x|%| ms| s| tok)?( \(partial\))?"
                     r"(, [+\-]?\d[\d,]*(\.\d+)?\])?$")


def figure_columns(frame: pd.DataFrame) -> list[str]:
    """Columns that hold figures (numbers, or numbers shown as text: ``0.795``, ``3.9x``, ``$0.0012``,
    ``[0.727, 1.000]``, ``+138``), to be right-aligned as figures are; a dash counts as a figure."""
    out = []
    for name in frame.columns:
        values = [v for v in frame[name].tolist() if not missing(v) and v != MISSING]
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) or
                          isinstance(v, str) and _FIGURE.match(v) for v in values):
            out.append(str(name))
    return out


def beats_history_note(per_category: pd.DataFrame) -> str | None:
    """Why memory can score above the full history (``analysis.retention_table``'s columns), said
    where it does: it read as an error."""
    if not {"memory", "full history"} <= set(per_category.columns):
        return None
    ahead = [str(c) for c, row in per_category.iterrows()
             if not missing(row["memory"]) and not missing(row["full history"]) and row["memory"] > row["full history"]]
    if not ahead:
        return None
    return (f"Memory scores above the full history on {', '.join(ahead)}: notes write dates out in full "
            "(\"yesterday (7 May 2023)\"), and scoring counts the answer's words, which the raw messages "
            "leave to the reader to work out.")


def natural_order(values: pd.Series) -> list[int]:
    """Positions that sort ``values`` as people read numbered ids: "q2" before "q10"."""
    def key(text: Any) -> list[Any]:
        return [(0, int(part), "") if part.isdigit() else (1, 0, part.casefold())
                for part in re.split(r"(\d+)", str(text)) if part]

    return sorted(range(len(values)), key=lambda i: key(values.iloc[i]))


def unscored_sentence(probes: pd.DataFrame) -> str:
    """Why a run's probes have no retention figure, as a sentence (for an empty per-category table)."""
    memory = probes[probes.method == "memory"] if "method" in probes else probes
    total = len(memory)
    no_gold = int(memory.gold.isna().sum()) if "gold" in memory else 0
    in_window = int(memory.evidence_in_window.fillna(False).astype(bool).sum()) if "evidence_in_window" in memory else 0
    reasons = [f"{no_gold} {'has' if no_gold == 1 else 'have'} no gold answer" if no_gold else "",
               f"{in_window} still {'has its' if in_window == 1 else 'have their'} evidence in the final window"
               if in_window else ""]
    reasons = [r for r in reasons if r]
    return (f"None of the {count(total, 'probe')} could be scored"
            + (f": {' and '.join(reasons)}." if reasons else "."))


def no_retention_note(run: Any, probes: pd.DataFrame) -> str | None:
    """Why a completed run's retention is "–" (no probes; none with a gold answer, MemoryBank's;
    their evidence still in the window), or ``None`` when it has one: the Presentation and its
    HTML export showed the dash with no reason (only the explorer's sidebar said it)."""
    if run.get("status") != "completed" or not missing(run.get("retention")):
        return None
    if probes.empty:
        return "No retention figure: the conversation has no probes."
    return "No retention figure. " + unscored_sentence(probes)


def run_settings(runs: pd.DataFrame) -> list[str]:
    """Per stored run, what differs across ``runs`` besides the two thresholds (window, models,
    prompt versions, backlog ceiling…; ``""`` when nothing does): a heatmap of a conversation's
    runs draws one value, so a cell never averages runs that differ in more than the thresholds."""
    import json

    from .experiments import other_settings
    from .replay import ReplayConfig

    configs = [ReplayConfig.from_json(json.loads(c) if isinstance(c, str) else c).to_json() for c in runs.config]
    return other_settings(configs)


def run_findings(run: dict[str, Any], steps: pd.DataFrame, calls: pd.DataFrame | None) -> list[str]:
    """:func:`analysis.findings` for a stored run, from its configuration: what the explorer,
    the presentation and the HTML export all say (the observer falling behind, reflections
    over their threshold), so a demo never shows a headline figure without them."""
    from .analysis import findings

    config = run["config"]
    return findings(steps, config["observation_threshold"], calls, config.get("max_backlog"),
                    config.get("reflection_threshold") if config.get("reflector") else None,
                    config.get("recall_on"), complete=run.get("status") == "completed")


def text_widths(frame: pd.DataFrame, *, px_per_char: float = 7.5, padding: int = 28, cap: int = 360) -> dict[str, int]:
    """Pixel widths for a table's text columns, wide enough for their longest value and header:
    Streamlit's grid sized them short of their content and cut it (a right-aligned interval
    ``[0.500, 1.000]`` read ``), 1.000]``; labels ``obs 1000 · ref 1``), so two different values
    could look the same."""
    import unicodedata

    def chars(text: str) -> int:  # a wide character (CJK, most emoji) takes two columns
        return len(text) if text.isascii() else sum(2 if unicodedata.east_asian_width(c) in "WF" else 1
                                                    for c in text)

    widths = {}
    for i, name in enumerate(frame.columns):
        column = frame.iloc[:, i]  # (by position: two columns may share a name)
        if pd.api.types.is_numeric_dtype(column) or pd.api.types.is_datetime64_any_dtype(column):
            continue  # (drawn by the grid, which sizes numbers right)
        longest = max([chars(str(name)), *(chars(str(v)) for v in column.tolist() if not missing(v))])
        widths[str(name)] = max(widths.get(str(name), 0), min(cap, int(longest * px_per_char) + padding))
    return widths


def number_text(value: Any, number: str) -> str:
    """``value`` drawn as the printf format ``number`` of :data:`COLUMNS` would draw it (a dash when
    missing), for a number column shown as text."""
    if missing(value):
        return MISSING
    if number == "%,d":
        return f"{int(value):,}"
    if number == "%.1fx":
        return ratio(value)
    if number == "$%.4f":
        return "$" + fixed(value, 4)
    if number == "%,.0f":
        return tokens(value)
    if number == "%.3f":
        return share(value, 3)
    raise ValueError(f"no text form for the number format {number!r}")


def column_spec(frame: pd.DataFrame, *, scores: bool = False) -> dict[str, tuple[str, str | None]]:
    """Header and number format for each of ``frame``'s columns: :data:`COLUMNS` for stored names,
    underscores read as spaces otherwise; ``scores`` formats every other float column as a score."""
    spec = {}
    for name in frame.columns:
        label, number = COLUMNS.get(str(name), (str(name).replace("_", " "), None))
        if number is None and scores and pd.api.types.is_float_dtype(frame[name]):
            number = SCORE_FORMAT
        spec[str(name)] = (label, number)
    return spec


# -- experiments -----------------------------------------------------------------------------------

def experiment_status(experiment: dict[str, Any], runs: pd.DataFrame) -> str:
    """An experiment's status as every page says it: "completed; 1 of 12 runs missing" (runs
    deleted since), "completed; 1 of 4 runs failed", else its status."""
    from .experiments import status_text

    planned = len(experiment["conversations"]) * len(experiment["configs"])
    failed = int((runs.status != "completed").sum()) if not runs.empty else 0
    missing_runs = max(0, planned - completed_pairs(runs) - failed)  # never started, or deleted since
    return status_text(experiment["status"], failed, planned, missing_runs)


def progress_text(p: Any, experiment_id: str) -> tuple[float, str]:
    """A running experiment's progress bar: its fraction and text, from its latest
    ``experiments.Progress`` (``None`` before its first report)."""
    if p is None:
        # (it said only "Starting exp-…" for the 10-16 s a first start takes, which read as stuck)
        return 0.0, f"Starting {experiment_id}: reading the dataset and starting the workers (10-20 s)…"
    eta = f", about {p.eta_s:.0f} s left" if p.eta_s is not None and p.done < p.total else ""
    # (" · 3 not completed" beside "3 of 6 done" read as 3 completed and 3 more that did not)
    failed = (" (all of them not completed)" if p.failed == p.done else f" ({p.failed} of them not completed)") \
        if p.failed else ""
    flying = (f" · {p.in_flight} in progress, {100 * p.running / p.in_flight:.0f}% through their messages"
              if p.in_flight else "")
    if getattr(p, "recording", 0):
        flying += f" · {p.recording} replayed, being recorded"
    last = f" · last finished: {p.label} on {p.conversation_id} ({p.status})" if p.finished else ""
    # (p.total: the runs this start or resume replays, not the grid: "0/39" beside "81 of 120" read as a reset)
    return p.fraction, f"{p.done} of {p.total} runs to replay done{failed}{flying}{last}{eta}"


def running_status(done: int, planned: int, p: Any) -> str:
    """The header of an experiment running in this process: its completed runs counted from its
    latest ``experiments.Progress`` (``p``; ``None`` before the first), as its bar counts them. It
    said the count the page was last drawn with ("0 of 12 runs completed") beside a bar at "6 of 12
    runs to replay done" until the next draw, seconds later. ``done``: the runs completed when the
    page was drawn, ``planned``: the grid's."""
    if p is not None:  # (p.total: the runs this start replays, every pair not completed when it began)
        done = max(done, min(planned, planned - p.total + p.done - p.failed))
    return f"running · {done} of {planned} runs completed"


def spent_note(experiment: dict[str, Any], runs: pd.DataFrame, summaries: Sequence[Any]) -> str | None:
    """What the experiment spent in all, when the configurations' cost column (their completed
    runs) does not say it: failed runs, runs a resume replaced, runs cut off by the cost limit or
    Stop, judging. As ``experiment show`` says it; the app showed only the column ($0.0891 of a
    $0.1353 spend)."""
    from .experiments import spent_of

    spent = spent_of(experiment, runs)  # (from the page's tables: no query of its own at every draw)
    shown = [s.cost_usd for s in summaries]
    if spent is None:
        return ("Spent in all: unknown — a model's price is unknown to litellm, so no total is given (a "
                "partial sum would read as the whole).")
    if not spent or (None not in shown and abs(spent - sum(shown)) <= 1e-9):
        return None
    return (f"Spent in all: {money(spent)} — the cost column counts the completed runs; this also counts the "
            "failed runs, the runs a resume replaced and the calls of runs the cost limit or Stop cut off.")


def _grid_of(configs: Any) -> str:
    """``experiments.grid_summary`` of an experiment's stored ``configs`` (JSON or parsed)."""
    from .experiments import grid_summary

    entries = json.loads(configs) if isinstance(configs, str) else (configs or [])
    return grid_summary([entry["config"] for entry in entries])


def experiment_label(row: Any) -> str:
    """``thresholds · completed · 4 runs · exp-…`` for a picker: what tells experiments apart first
    (its name, else its dataset's file name), the id last (a sidebar cuts the end off)."""
    name = row["name"] if not missing(row.get("name")) else None
    if not name and not missing(row.get("dataset")):
        name = os.path.basename(str(row["dataset"]).rstrip("/\\"))
    planned = 0 if missing(row.get("planned_runs")) else int(row["planned_runs"])
    unfinished = 0 if missing(row.get("unfinished_runs")) else int(row["unfinished_runs"])
    # (it read "1 run, 1 not completed" for 1 of 2 completed: as if the one run had not completed)
    runs = (f"{planned - unfinished} of {planned} runs completed" if unfinished
            else f"{planned} run{'s' if planned != 1 else ''}")
    grid = _grid_of(row["configs"]) if not missing(row.get("configs")) else ""
    parts = [*([name] if name else []), *([grid] if grid else []), str(row["status"]), runs, str(row["experiment_id"])]
    return " · ".join(parts)


def _whole(value: Any) -> Any:
    """A count as it is (an int), a dash when missing."""
    return MISSING if missing(value) else int(value)


EXPERIMENTS_FORMATS = {"conversations": _whole, "configurations": _whole, "completed": _whole,
                      "not completed": _whole, "elapsed (s)": lambda v: MISSING if missing(v) else fixed(v, 1)}


def experiments_numbers(frame: pd.DataFrame) -> pd.DataFrame:
    """The experiments list: counts of conversations and configurations as numbers (NaN where
    there are none); :data:`EXPERIMENTS_FORMATS` says how they read."""
    columns = ["experiment", "name", "grid", "status", "dataset", "conversations", "configurations", "completed",
               "not completed", "elapsed (s)", "created", "error"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    from .experiments import listed_status

    return pd.DataFrame({
        "experiment": frame.experiment_id,
        "name": frame.name,
        "grid": frame.configs.map(_grid_of),
        "status": [listed_status(row) for row in frame.to_dict("records")],
        "dataset": frame.dataset.map(short_path),
        "conversations": frame.conversations.map(lambda c: len(json.loads(c)) if isinstance(c, str) else len(c)),
        "configurations": frame.configs.map(lambda c: len(json.loads(c)) if isinstance(c, str) else len(c)),
        # of the runs planned (the runs recorded beside them read "runs 1, not completed 1" for 1 of 2)
        "completed": frame.planned_runs - frame.unfinished_runs,
        "not completed": frame.unfinished_runs,
        "elapsed (s)": pd.to_numeric(frame.elapsed_s, errors="coerce"),
        "created": frame.created_at.map(lambda v: str(v)[:19]),
        "error": frame.error,
    }, columns=columns)


def experiments_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The experiments list as people read it (text): counts of conversations and configurations, no NaN."""
    return as_text(experiments_numbers(frame), EXPERIMENTS_FORMATS)


def parse_values(text: str, kind: type = int) -> list[Any]:
    """Comma-separated values, deduplicated in the order given (``ValueError`` says what is wrong)."""
    values: list[Any] = []
    for part in split_list(text):
        try:
            value = kind(part)
        except ValueError:
            raise ValueError(f"{part!r} is not a {'whole number' if kind is int else 'value'}") from None
        if kind is int and value < 1:
            raise ValueError(f"{value} must be positive")
        if value not in values:
            values.append(value)
    if not values:
        raise ValueError("give at least one value")
    return values


def parse_backlogs(text: str) -> list[int | None]:
    """Comma-separated backlog ceilings in tokens, ``off`` (or ``none``) for none; ``[None]`` when
    empty (``ValueError`` says what is wrong)."""
    values: list[int | None] = []
    for part in split_list(text):
        if part.lower() in ("off", "none"):
            value = None
        else:
            try:
                value = int(part)
            except ValueError:
                raise ValueError(f"expected token counts or 'off', got {part!r}") from None
            if value < 1:
                raise ValueError(f"{value} must be positive (or 'off')")
        if value not in values:
            values.append(value)
    return values or [None]


# How the summary's figures read: each column's formatter (:mod:`workbench.formatting`).
SUMMARY_FORMATS = {"completed": _whole, "not completed": _whole, "probes": _whole, "retention": share,
                   "compression": ratio, "vs recency": display, "blind-spot tokens": tokens,
                   "observer calls": display, "reflector calls": display, "tokens in": tokens,
                   "tokens out": tokens, "cost": money, "ms per call": tokens}


def summary_numbers(summaries: Sequence[Any]) -> pd.DataFrame:
    """One row per configuration: the experiment's pooled figures as numbers (NaN where there are
    none), the interval as text; :data:`SUMMARY_FORMATS` says how each reads."""
    rows = []
    for s in summaries:
        ci = s.retention_ci95
        rows.append({
            "configuration": s.label,
            "completed": s.runs,
            "not completed": s.not_completed,  # failed, never started, or deleted
            "probes": s.probes,
            "retention": s.retention,
            "95% CI": f"[{share(ci[0], 3)}, {share(ci[1], 3)}]" if ci else MISSING,
            "compression": s.compression,
            "vs recency": s.recency_ratio,
            "blind-spot tokens": s.blind_spot_tokens,
            "observer calls": s.observer_calls,
            "reflector calls": s.reflector_calls,
            "tokens in": s.input_tokens,
            "tokens out": s.output_tokens,
            "cost": s.cost_usd,
            "ms per call": s.latency_ms_per_call,  # whole milliseconds
        })
    columns = ["configuration", *list(SUMMARY_FORMATS)[:4], "95% CI", *list(SUMMARY_FORMATS)[4:]]
    return pd.DataFrame(rows, columns=columns)


def conversation_numbers(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Retention per conversation (rows) and configuration (columns), from
    :func:`experiments.per_conversation`, plus each conversation's scored probes: the spread
    between conversations that the pooled interval does not show. ``None`` where a run did not
    complete or scored no probe."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    conversations = list(dict.fromkeys(r["conversation_id"] for r in rows))
    cell = {(r["label"], r["conversation_id"]): r for r in rows}
    counts = [[cell[(label, c)]["probes"] for label in labels if cell[(label, c)]["status"] == "completed"]
              for c in conversations]
    # Windows of different sizes score different probes (evidence still in the larger window is not
    # scored): then the column says it gives the most any configuration scored.
    probes = "probes scored" if all(len(set(n)) <= 1 for n in counts) else "probes scored (most)"
    # (no completed run: a dash, not 0 — "probes 0" for a conversation of 199 read as one without any)
    table = {"conversation": conversations, probes: [max(n, default=None) for n in counts]}
    for label in labels:
        table[label] = [cell[(label, c)]["retention"] for c in conversations]
    return pd.DataFrame(table, columns=["conversation", probes, *labels])


def conversation_formats(frame: pd.DataFrame) -> dict[str, Any]:
    """How :func:`conversation_numbers`'s columns read: probes whole, retention as a share."""
    return {frame.columns[1]: _whole} | {name: share for name in frame.columns[2:]}


def summary_table(summaries: Sequence[Any]) -> pd.DataFrame:
    """One row per configuration: the experiment's pooled figures as people read them (text)."""
    return as_text(summary_numbers(summaries), SUMMARY_FORMATS)


def as_text(frame: pd.DataFrame, formats: dict[str, Any]) -> pd.DataFrame:
    """``frame`` with each column of ``formats`` drawn by its formatter, no NaN anywhere."""
    out = frame.copy().astype(object)
    for name, form in formats.items():
        if name in out.columns:
            out[name] = frame[name].map(form)
    return clean(out)


def drawn_as_text(column: pd.Series) -> bool:
    """Whether a figure column must be shown as text in ``st.dataframe``: it is not numeric, or it
    has a gap (Streamlit draws a missing number as "None" whatever its format or display text)."""
    return not pd.api.types.is_numeric_dtype(column) or bool(column.isna().any())


def sortable(frame: pd.DataFrame, formats: dict[str, Any]) -> Any:
    """``frame`` to show in ``st.dataframe`` so its figures read as :func:`as_text` draws them yet
    sort by value: a pandas Styler whose display text comes from ``formats`` over numbers kept
    numeric; a column :func:`drawn_as_text` is text (it then sorts as text). Past pandas'
    ``styler.render.max_elements`` cells (262,144: a Traces page of ~22,000 calls) Streamlit refuses
    a Styler, so the whole table is :func:`as_text`."""
    if frame.size > int(pd.get_option("styler.render.max_elements")):
        return as_text(frame, formats)
    shown = frame.copy()
    numeric = {}
    for name, form in formats.items():
        if name not in shown.columns:
            continue
        if drawn_as_text(shown[name]):
            # (all text: a count's ints beside its dash made Arrow fail on the column, logged per draw)
            shown[name] = shown[name].map(lambda v, form=form: str(form(v))).astype(object)
        else:
            numeric[name] = form
    text = [n for n in shown.columns if n not in numeric]
    shown[text] = clean(shown[text])
    return shown.style.format(numeric)


def compare_pair(points: pd.DataFrame, label: str) -> tuple[str, str] | None:
    """The Compare pair for a point clicked on Tune: the best-retention configuration against it,
    or, when it is the best, the next best against it (it was compared with itself when the best
    was also first in the grid); ``None`` when no other configuration has a point."""
    ranked = [str(other) for other in points.sort_values("retention", ascending=False, kind="stable").label]
    other = next((candidate for candidate in ranked if candidate != label), None)
    return None if other is None else (other, label)


def pareto_points(summaries: Sequence[Any]) -> pd.DataFrame:
    """Configurations with both figures: retention (with its CI) and compression, plus thresholds."""
    rows = []
    for s in summaries:
        if s.retention is None or s.compression is None:
            continue
        low, high = s.retention_ci95 if s.retention_ci95 else (s.retention, s.retention)
        rows.append({"label": s.label, "retention": s.retention, "low": low, "high": high,
                     "compression": s.compression, "runs": s.runs, "failed": s.failed,
                     "observation_threshold": s.config.get("observation_threshold"),
                     "reflection_threshold": s.config.get("reflection_threshold"),
                     "window": s.config.get("last_messages")})
    return pd.DataFrame(rows, columns=["label", "retention", "low", "high", "compression", "runs", "failed",
                                       "observation_threshold", "reflection_threshold", "window"])


def threshold_cells(summaries: Sequence[Any]) -> pd.DataFrame:
    """Per configuration: thresholds, the two figures (for the heatmaps) and ``settings``, whatever
    else varies across the grid (window, models, prompts, backlog ceiling; ``""`` when nothing does).
    A heatmap draws one value of ``settings``: a cell never averages configurations that differ."""
    from .experiments import other_settings

    settings = other_settings([s.config for s in summaries])
    rows = [{"observation_threshold": s.config.get("observation_threshold"),
             "reflection_threshold": s.config.get("reflection_threshold"),
             "window": s.config.get("last_messages"), "settings": other,
             "retention": s.retention, "compression": s.compression}
            for s, other in zip(summaries, settings)]
    return pd.DataFrame(rows, columns=["observation_threshold", "reflection_threshold", "window", "settings",
                                       "retention", "compression"])


def failed_configs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs of an experiment that did not complete: configuration, conversation, where, error."""
    columns = ["configuration", "conversation", "status", "error"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    bad = runs[runs.status != "completed"]
    out = pd.DataFrame({"configuration": bad.config_label, "conversation": bad.conversation_id,
                        "status": [progress(s, _value(k), _value(n))
                                   for s, k, n in zip(bad.status, bad.steps, bad.planned_steps)],
                        "error": bad.error}, columns=columns)
    return clean(out.reset_index(drop=True))


def config_table(configs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The grid: one row per configuration with its settings."""
    rows = []
    for entry in configs:
        c = entry["config"]
        rows.append({"configuration": entry["label"], "observer": c.get("observer"),
                     "reflector": c.get("reflector") or "none",
                     "observation threshold": c.get("observation_threshold"),
                     "reflection threshold": c.get("reflection_threshold"), "window": c.get("last_messages"),
                     "observer prompt": (c.get("observer_prompt") or {}).get("version"),
                     "reflector prompt": (c.get("reflector_prompt") or {}).get("version"),
                     "token counter": c.get("token_counter"),
                     "max backlog": f"{c['max_backlog']:,}" if c.get("max_backlog") else "off"})  # (text: not mixed)
    return clean(pd.DataFrame(rows))


# -- comparing two configurations -----------------------------------------------------------------

def _scores(probes: pd.DataFrame, label: str, category: str | None = None) -> dict[tuple[str, str], float]:
    rows = probes[(probes.config_label == label) & (probes.method == "memory") & probes.score.notna()]
    if category is not None:
        rows = rows[rows.category.map(category_name) == category]
    return {(r.conversation_id, r.probe_id): float(r.score) for r in rows.itertuples()}


def pair_conversations(runs: pd.DataFrame, a: str, b: str) -> tuple[list[str], str | None]:
    """The conversations both ``a`` and ``b`` completed, and, when either completed others too, a
    note saying the comparison is on those only (``None`` when they completed the same ones)."""
    from .experiments import shared_conversations

    shared = shared_conversations(runs, [a, b])
    done = runs[runs.status == "completed"]
    counts = {label: done[done.config_label == label].conversation_id.nunique() for label in (a, b)}
    if all(n == len(shared) for n in counts.values()):
        return shared, None
    total = runs.conversation_id.nunique()
    detail = "; ".join(f"{label}: {n} of {total}" for label, n in counts.items())
    if not shared:
        return shared, f"A and B completed no conversation in common ({detail}): there is nothing to compare."
    return shared, (f"A and B did not complete the same conversations ({detail}): every figure on this page "
                    f"is on the {count(len(shared), 'conversation')} both completed ({', '.join(shared)}).")


def figures_comparison(summaries: Sequence[Any], probes: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Figures of configurations ``a`` and ``b`` side by side with ``b − a``; retention (pooled and
    per category) with a paired bootstrap CI and ``differs`` set where that CI excludes zero."""
    by = {s.label: s for s in summaries}
    sa, sb = by[a], by[b]
    rows: list[dict[str, Any]] = []

    def add(name: str, va: Any, vb: Any, shown: Any = display, ci: tuple[float, float] | None = None,
            diff: float | None = None, differs: bool = False, paired: int | None = None) -> None:
        whole = shown is tokens  # (a difference in tokens is a whole number, like the figures)
        if diff is None and not missing(va) and not missing(vb) and not isinstance(va, str):
            diff = float(vb) - float(va)
            whole = whole or (float(va).is_integer() and float(vb).is_integer() and shown is display)
        if diff is None:
            change = MISSING
        elif diff == 0:
            change = "0"  # no sign on nothing ("+0", "+$0" read as a gain)
        elif shown is money:
            change = ("-" if diff < 0 else "+") + money(abs(diff))
        else:
            change = f"{diff:+,.0f}" if whole else signed(diff)
        rows.append({"figure": name, "A": shown(va), "B": shown(vb), "B − A": change,
                     "95% CI of B − A": f"[{signed(ci[0])}, {signed(ci[1])}]" if ci else
                     f"too few ({paired})" if paired else MISSING,
                     "probes": f"{paired:,}" if paired is not None else "", "differs": differs})

    pooled = paired_difference(a, b, _scores(probes, a), _scores(probes, b)) if not probes.empty else None
    add("retention (pooled)", sa.retention, sb.retention, lambda v: share(v, 3),
        pooled.ci95 if pooled else None, pooled.difference if pooled else None, bool(pooled and pooled.detectable),
        pooled.probes if pooled else None)
    categories = sorted(set(sa.per_category) | set(sb.per_category), key=category_name)
    for category in categories:
        name = category_name(category)
        diff = paired_difference(a, b, _scores(probes, a, name), _scores(probes, b, name)) if not probes.empty else None
        add(f"retention · {name}", (sa.per_category.get(category) or {}).get("retention"),
            (sb.per_category.get(category) or {}).get("retention"), lambda v: share(v, 3),
            diff.ci95 if diff else None, diff.difference if diff else None, bool(diff and diff.detectable),
            diff.probes if diff else None)
    add("compression (x)", sa.compression, sb.compression, ratio)  # "5.6x", as every other table
    add("retention vs recency baseline", sa.recency_ratio, sb.recency_ratio)
    add("blind-spot tokens (mean backlog)", sa.blind_spot_tokens, sb.blind_spot_tokens, tokens)
    add("observer calls", sa.observer_calls, sb.observer_calls)
    add("reflector calls", sa.reflector_calls, sb.reflector_calls)
    add("model tokens in", sa.input_tokens, sb.input_tokens)
    add("model tokens out", sa.output_tokens, sb.output_tokens)
    add("cost (USD)", sa.cost_usd, sb.cost_usd, money)
    add("runs completed", sa.runs, sb.runs)
    return pd.DataFrame(rows)


def default_run_pair(runs: pd.DataFrame) -> tuple[str, str]:
    """Two stored runs to compare first (``runs`` newest first): the newest completed run that has
    another completed run of its conversation as B, and the newest such other run as A (runs of
    two conversations are "not directly comparable": the newest run alone, say an upload's, made
    that the first thing shown); failing that, the newest run and the next."""
    done = runs[runs.status == "completed"] if "status" in runs else runs
    pool = done if len(done) >= 2 else runs
    # (in one pass: a loop over the runs filtering all of them took 1.5 s on 3,000 runs, each render)
    shared = pool[pool.conversation_id.duplicated(keep=False)]
    if not shared.empty:  # newest first: B, then the newest other run of its conversation
        b = shared.iloc[0]
        same = shared[(shared.conversation_id == b.conversation_id) & (shared.run_id != b.run_id)]
        return str(same.iloc[0].run_id), str(b.run_id)
    b = pool.iloc[0]
    return str(pool[pool.run_id != b.run_id].iloc[0].run_id), str(b.run_id)


def probe_counts(probes: pd.DataFrame, labels: Sequence[str]) -> tuple[int, int]:
    """``(listed, scored)``: the distinct probes of ``labels``' memory scores, and those of them
    that have a score (a gold answer, and evidence that has left the window); retention pools the
    scored ones, the grid lists them all."""
    if probes.empty:
        return 0, 0
    memory = probes[(probes.method == "memory") & probes.config_label.isin(list(labels))]
    listed = memory.drop_duplicates(["conversation_id", "probe_id"])
    scored = memory[memory.score.notna()].drop_duplicates(["conversation_id", "probe_id"])
    return len(listed), len(scored)


def verdict(probes: pd.DataFrame, a: str, b: str) -> str:
    return paired_difference(a, b, _scores(probes, a), _scores(probes, b)).verdict()


def _with_runs(summaries: Sequence[Any], labels: Sequence[str] | None) -> list[Any]:
    """``summaries`` in the order of ``labels`` (all, by default), without configurations that
    have no completed run."""
    by = {s.label: s for s in summaries}
    chosen = list(summaries) if labels is None else [by[label] for label in labels if label in by]
    return [s for s in chosen if s.runs]


def funnel_table(summaries: Sequence[Any], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Probes reaching each stage (rows: stages by name; columns: configurations with a completed run:
    one with none has no funnel, not a funnel of zeros)."""
    chosen = _with_runs(summaries, labels)
    data = {s.label: [int(s.funnel.get(stage, 0)) for stage in STAGES] for s in chosen}
    return pd.DataFrame(data, index=[STAGE_NAMES[s] for s in STAGES])


DOUBLE_CLICK_S = 3.0  # a second start with the same settings this soon is the same click, twice


def repeated_start(last: Any, signature: str, now: float) -> bool:
    """Whether a start is the second click of a double click: the same settings (``signature``)
    as the start this session made (``last``: ``(signature, time)``) under :data:`DOUBLE_CLICK_S`
    seconds before. A double click on Run replay or Start experiment started everything twice
    (on a paid model, twice the cost)."""
    return (isinstance(last, tuple) and len(last) == 2 and last[0] == signature
            and 0 <= now - last[1] < DOUBLE_CLICK_S)


def first_clicks_run(runs: pd.DataFrame, before: Any, conversation: Any, config: dict[str, Any],
                     stored: Any) -> dict[str, Any] | None:
    """The run a double click's first click started: the newest run of ``conversation`` under
    ``config`` (``stored(run_id)["config"]``) that was not in the store before that click
    (``before``: the run ids then), as ``stored`` gives it; ``None`` when there is none (a run of
    another configuration, tab or command is never taken for it)."""
    new = runs[~runs.run_id.isin(set(before)) & (runs.dataset == conversation.source)
               & (runs.conversation_id == conversation.id)]
    for run_id in new.run_id:  # newest first
        run = stored(run_id)
        if run["config"] == config:
            return run
    return None


def replays_the_demo_unasked(store_empty: bool, conversation: Any, config: Any, done_already: bool) -> bool:
    """Whether the explorer replays on its own, without its button: only the first time in a
    session, on a run store with no run, for the built-in demo on the offline model — so a first
    visit has something to explore. Any other dataset or model waits for its click (it replayed
    whatever was chosen while the store was empty: a paid model too, with no cost shown first)."""
    from .catalog import DEMO_DATASET

    return (store_empty and not done_already and conversation is not None and config is not None
            and conversation.source == str(DEMO_DATASET)
            and config.observer == OFFLINE_MODEL and config.reflector in (OFFLINE_MODEL, None))


def demo_to_finish(store: Any, runs: pd.DataFrame, conversation: Any, config: Any) -> str | None:
    """The demo's run to resume on its own: the store's only run (``runs``), the replay a first
    visit started unasked (the demo on the offline model, this configuration), interrupted (the tab
    was closed while it replayed), and resumable (not when the demo changed since: its refusal was
    then shown on every visit). A first visit cut short otherwise left "interrupted at step 82 of
    100" for good: the store was no longer empty, so the demo never replayed again."""
    from .replay import resume_refusal

    if len(runs) != 1 or runs.status.iloc[0] != "interrupted" or not replays_the_demo_unasked(
            True, conversation, config, False):
        return None
    run = first_clicks_run(runs, set(), conversation, config.to_json(), store.run)
    if run is None or resume_refusal(conversation, store, run["run_id"]) is not None:
        return None
    return str(run["run_id"])


def replay_cost_text(conversation: Any, config: Any) -> str | None:
    """What a replay of ``conversation`` under ``config`` should cost, for beside its Run button
    (``None`` on the offline model, or when the configuration cannot run here: it makes no call)."""
    from .datasets.base import ConversationInfo
    from .experiments import estimate_cost
    from .replay import configuration_problem

    if configuration_problem(config):
        return None
    cost = estimate_cost([ConversationInfo.of(conversation).tokens], [config])
    return None if cost == 0 else f"Estimated cost: {estimate_text(cost, 4)}."


def estimate_text(cost: float | None, digits: int = 2) -> str:
    """A cost estimate as the app words it before paid work (``None``: a price unknown)."""
    return ("unknown (a model's price is not known to litellm)" if cost is None
            else f"{about_money(cost, digits)} (a rough estimate, meant to err high)")


def compression_note(run: dict[str, Any], steps: pd.DataFrame) -> str | None:
    """Why the run's compression and the chart's at the last memory read differ, when they read
    differently: the run's counts the whole conversation after its last message, the chart's what
    the agent saw at that read (messages after it are not in its history yet)."""
    if steps.empty or run.get("status") != "completed" or missing(run.get("compression")):
        return None
    last = steps.iloc[-1]
    if not last.context_tokens:
        return None
    at_read = float(last.history_tokens) / float(last.context_tokens)
    if ratio(at_read) == ratio(run["compression"]):
        return None
    return (f"Compression {ratio(run['compression'])} is for the whole conversation after its last message; "
            f"at the last memory read (step {int(last.step)}) the agent saw {ratio(at_read)} "
            f"({int(last.context_tokens):,} tokens for a history of {int(last.history_tokens):,}), "
            "which the charts show.")


def funnel_note(summaries: Sequence[Any], labels: Sequence[str] | None = None) -> str | None:
    """The probes retention keeps that the funnel does not, per configuration, in one sentence
    (``None`` when there are none): their answer is visible at the end by another route."""
    counts = {s.label: int(s.funnel.get("visible_elsewhere", 0)) for s in _with_runs(summaries, labels)}
    if not any(counts.values()):
        return None
    listed = ", ".join(f"{label}: {n}" for label, n in counts.items())
    return ("Besides the funnel, visible at the end by another route (" + listed + "): the notes on "
            "their evidence lost the answer, but its words are in other notes or the window. "
            "Retention counts these probes as kept; the funnel, which follows the evidence, does not.")


_DIGITS = re.compile(r"\d+")


def natural_key(text: str) -> str:
    """``text`` with each run of digits padded to 20 places, so that text order is natural order
    ("q2" before "q10", "conv-3" before "conv-26")."""
    return _DIGITS.sub(lambda m: m.group().zfill(20), text)


def probe_grid(probes: pd.DataFrame, losses: pd.DataFrame, labels: Sequence[str]) -> pd.DataFrame:
    """Probes × configurations (as prompt-testing tools lay out prompts × test cases).

    One row per (conversation, probe) with its question, gold answer and category; per
    configuration a text cell (``kept 1.00`` / ``lost at observation, step 8``) and, in hidden
    columns ``<label>|score``, ``<label>|run`` and ``<label>|step``, the score, the run and the
    step where that probe's evidence was lost (its evidence step when it was kept)."""
    base_columns = ["conversation", "probe", "category", "question", "gold"]
    memory = probes[(probes.method == "memory")] if not probes.empty else probes
    if memory.empty:
        return pd.DataFrame(columns=base_columns + list(labels))
    # (in natural order: q2 before q10; as text, the Probe picker read q0, q1, q10, q100, q101, …)
    first = memory.drop_duplicates(["conversation_id", "probe_id"]).sort_values(
        ["conversation_id", "probe_id"], key=lambda ids: ids.astype(str).map(natural_key))
    grid = pd.DataFrame({"conversation": first.conversation_id.values, "probe": first.probe_id.values,
                         "category": first.category.map(category_name).values, "question": first.question.values,
                         "gold": first.gold.values})
    keys = list(zip(grid.conversation, grid.probe))
    loss_by = {}
    if not losses.empty:
        loss_by = {(r.config_label, r.conversation_id, r.probe_id): r for r in losses.itertuples()}
    for label in labels:
        mine = memory[memory.config_label == label]
        by_key = {(r.conversation_id, r.probe_id): r for r in mine.itertuples()}
        cells, scores, runs, steps = [], [], [], []
        for key in keys:
            row = by_key.get(key)
            if row is None:
                cells.append(MISSING)
                scores.append(None)
                runs.append(None)
                steps.append(None)
                continue
            loss = loss_by.get((label, *key))
            score = None if missing(row.score) else float(row.score)
            lost_at = None if loss is None or missing(loss.lost_at) else str(loss.lost_at)
            lost_step = None if loss is None or missing(loss.lost_step) else int(loss.lost_step)
            if score is None:
                text = "not scored"
            elif score >= KEPT:
                text = f"kept {score:.2f}"
            else:
                text = f"lost {score:.2f}"
                if lost_at == "observation" and lost_step is None:
                    text += ": no note covers its evidence"  # (still in the backlog at the end)
                elif lost_at:
                    text += f" at {lost_at}" + (f", step {lost_step}" if lost_step is not None else "")
            cells.append(text)
            scores.append(score)
            runs.append(row.run_id)
            steps.append(lost_step)
        grid[label] = cells
        grid[f"{label}|score"] = scores
        grid[f"{label}|run"] = runs
        grid[f"{label}|step"] = steps
    return grid


def linked_step(query: dict[str, Any], key: str = "step") -> tuple[str, int | None] | None:
    """The run and step a link to the explorer names (``?run=…&step=…``; a step that is not a
    whole number is left out, one past the run's end shows its last), or ``None``. ``key``: the
    parameter that names the number (``call`` in a link to Traces)."""
    run = query.get("run")
    if not isinstance(run, str) or not run.strip():
        return None
    step = query.get(key)
    step = step.strip() if isinstance(step, str) else ""
    # (ASCII digits, and few of them: "²" is a digit to isdigit() and not to int(); 5,000 digits
    # exceed int()'s limit)
    return run.strip(), int(step) if step.isascii() and step.isdecimal() and len(step) <= 9 else None


def link_note(query: dict[str, Any], key: str = "step") -> str | None:
    """What the explorer says of a link whose step it cannot follow (``step=-5``, ``step=abc``, a
    step without a run), or ``None``: such a link opened the last step without a word. With
    ``key="call"``, what Traces says of its links' call numbers."""
    step = query.get(key)
    if not isinstance(step, str) or not step.strip():
        return None
    linked = linked_step(query, key)
    if linked is None:
        return f"The link names {key} {step.strip()!r} but no run (?run=…): the {key} is left out."
    if linked[1] is None:
        if key == "call":
            return f"Call {step.strip()!r} of the link is not a call number (1, 2, 3, …): the run's first call is shown."
        return f"Step {step.strip()!r} of the link is not a step number (0, 1, 2, …): the run opens at its last step."
    return None


def replay_progress_text(conversation_id: str, done: int, total: int, message: str) -> str:
    """The replay bar's text. Once every message is replayed the run is scored and recorded, which
    takes seconds on a long conversation: said, where a full bar sat still with no word."""
    text = f"Replaying {conversation_id}: {message}"
    return text + " · scoring the probes and recording the run…" if done >= total else text


def grid_differences(grid: pd.DataFrame, labels: Sequence[str]) -> tuple[pd.Series, pd.Series]:
    """Per probe of the grid: whether the configurations' scores differ (two scored ones at least),
    and whether one keeps it and another loses it (a score either side of :data:`KEPT`)."""
    if grid.empty:
        return pd.Series([], dtype=bool), pd.Series([], dtype=bool)
    scores = [[None if missing(v) else round(float(v), 6) for v in grid[f"{label}|score"]] for label in labels]
    rows = [{v for v in row if v is not None} for row in zip(*scores)]
    differs = pd.Series([len(r) > 1 for r in rows], index=grid.index)
    flips = pd.Series([len({v >= KEPT for v in r}) > 1 for r in rows], index=grid.index)
    return differs, flips


def grid_view(grid: pd.DataFrame, labels: Sequence[str], *, differs_only: bool = False) -> pd.DataFrame:
    """The grid's visible columns; ``differs_only`` keeps the probes whose scores differ between
    the configurations (any difference: one that keeps a probe and another that loses it is only
    part of it, and left a pooled difference of 0.038 on 152 probes shown as 5 probes)."""
    if differs_only and not grid.empty:
        grid = grid[grid_differences(grid, labels)[0].values]
    return grid[["conversation", "probe", "category", "question", "gold", *labels]]


def grid_reason(grid: pd.DataFrame, index: Any, label: str) -> str | None:
    """What a grid cell opened the explorer for, said above the run: the probe, its question and
    gold answer, and what became of it with that configuration."""
    if index not in grid.index:
        return None
    row = grid.loc[index]
    gold = "" if missing(row["gold"]) else f" (gold answer: {row['gold']})"
    return (f"Opened from Compare for probe {row['conversation']} · {row['probe']}: {row['question']}{gold}. "
            f"With {label}: {row[label]}.")


def grid_target(grid: pd.DataFrame, index: Any, label: str) -> tuple[str, int | None] | None:
    """The run and step a grid cell opens: where that probe's evidence was lost (or the run's end)."""
    if index not in grid.index:
        return None
    run = grid.at[index, f"{label}|run"]
    if missing(run):
        return None
    step = grid.at[index, f"{label}|step"]
    return str(run), None if missing(step) else int(step)


def final_memory(steps: pd.DataFrame, records: pd.DataFrame, messages: pd.DataFrame, window: int) -> str:
    """The memory text the agent saw at the run's last read."""
    from .analysis import visible_at

    if steps.empty:
        return ""
    memory, _ = visible_at(steps.iloc[-1], records, messages, window)
    return memory


def text_diff(a: str, b: str, name_a: str = "A", name_b: str = "B") -> str:
    """A unified line diff of two texts (empty when they are equal)."""
    lines = difflib.unified_diff((a or "").splitlines(), (b or "").splitlines(), fromfile=name_a, tofile=name_b,
                                 lineterm="", n=2)
    return "\n".join(lines)


def prompt_of(config: dict[str, Any], name: str) -> tuple[str, str]:
    """``(version, text)`` of the observer or reflector prompt a configuration used."""
    prompt = config.get(f"{name}_prompt") or {}
    return str(prompt.get("version") or MISSING), str(prompt.get("text") or "")


def offline_prompt_note(config_a: dict[str, Any], config_b: dict[str, Any]) -> str | None:
    """A plain warning when two configurations differ in a prompt that an offline model reads:
    the built-in model ignores prompt text, so comparing prompts needs an LLM."""
    from .experiments import offline_prompt_roles

    notes = offline_prompt_roles([config_a, config_b])
    if not notes:
        return None
    return (f"The {' and '.join(notes)} prompts differ, but the built-in offline "
            "model ignores prompt text: any difference here comes from other settings. Comparing prompt "
            "versions needs an LLM (choose a real observer/reflector model).")


def shared_range(*series: pd.Series) -> list[float]:
    """A y range covering every series (for side-by-side charts on one scale)."""
    top = max([float(s.max()) for s in series if len(s) and not missing(s.max())] or [1.0])
    return [0.0, top * 1.08 or 1.0]


# -- traces ----------------------------------------------------------------------------------------

CALLS_FORMATS = {"tokens in": tokens, "tokens out": tokens,
                 "latency (ms)": tokens,  # whole milliseconds, with separators
                 "cost": lambda v: money(v, 6)}


def calls_numbers(calls: pd.DataFrame) -> pd.DataFrame:
    """One row per compaction call, its figures as numbers (:data:`CALLS_FORMATS` says how they read)."""
    columns = ["call", "step", "stage", "model", "prompt", "tokens in", "tokens out", "latency (ms)", "cost",
               "cache hit", "attempts", "error"]
    if calls.empty:
        return pd.DataFrame(columns=columns)
    return pd.DataFrame({
        "call": calls.seq.astype(int), "step": calls.step, "stage": calls.stage, "model": calls.model,
        "prompt": calls.prompt_version, "tokens in": calls.input_tokens, "tokens out": calls.output_tokens,
        "latency (ms)": calls.latency_ms, "cost": calls.cost_usd,
        "cache hit": calls.cache_hit.map(lambda v: MISSING if missing(v) else ("yes" if bool(v) else "no")),
        "attempts": calls.attempts if "attempts" in calls else 1,
        "error": calls.error,
    }, columns=columns)


def calls_table(calls: pd.DataFrame) -> pd.DataFrame:
    """One row per compaction call, as people read it (text)."""
    return as_text(calls_numbers(calls), CALLS_FORMATS)


def call_at_step(calls: pd.DataFrame, step: int) -> int | None:
    """The ``seq`` of the first model call made at ``step`` (a pass runs inside the read of its
    step; a reflection may follow an observation there), else of the last one before it, else of
    the first call; ``None`` without calls."""
    if calls.empty:
        return None
    steps = pd.to_numeric(calls.step, errors="coerce")
    at, before = calls[steps == step], calls[steps < step]
    chosen = at.seq.iloc[0] if not at.empty else before.seq.iloc[-1] if not before.empty else calls.seq.iloc[0]
    return int(chosen)


def call_label(row: Any) -> str:
    return (f"call {int(row['seq'])} · step {display(row['step'])} · {row['stage']} · {row['model']}"
            + (" · error" if not missing(row.get("error")) else ""))


def trace_attempts(call: Any) -> list[dict[str, Any]]:
    """The exact requests sent and raw replies of one call: one entry per attempt (a reflection
    sent back to be shortened is a second attempt). ``messages`` is a list of role/content dicts
    (or ``None`` when the request was not stored); ``response`` the raw text."""
    def load(value: Any) -> Any:
        if missing(value) or value is None:
            return None
        try:
            return json.loads(value)
        except (TypeError, ValueError):
            return value  # a trace cut at the size cap: shown as the raw text kept

    requests, responses = load(call.get("request")), load(call.get("response"))
    if isinstance(requests, str):
        requests = [[{"role": "(raw, cut at the size cap)", "content": requests}]]
    if isinstance(responses, str):
        responses = [responses]
    requests, responses = requests or [], responses or []
    out = []
    for i in range(max(len(requests), len(responses))):
        messages = requests[i] if i < len(requests) else None
        if isinstance(messages, dict):
            messages = [messages]
        out.append({"attempt": i + 1, "messages": messages,
                    "response": responses[i] if i < len(responses) else None})
    return out


# -- a run, step by step ------------------------------------------------------------------------------

def pass_steps(steps: pd.DataFrame) -> list[int]:
    """Steps at which an observer or reflector pass fired, in order."""
    if steps.empty:
        return []
    return [int(s) for s in steps[steps.observed | steps.reflected].step]


def neighbour(passes: Sequence[int], step: int, direction: int) -> int | None:
    """The pass before (``-1``) or after (``+1``) ``step``, or ``None``."""
    if direction > 0:
        return next((p for p in passes if p > step), None)
    return next((p for p in reversed(passes) if p < step), None)


def crossing_series(steps: pd.DataFrame, calls: pd.DataFrame, column: str, stage: str) -> pd.DataFrame:
    """The volume ``column`` per step with, at each step where a ``stage`` pass fired, the volume
    just before the pass as well (two points at that step: before, then after), so the line visibly
    crosses the threshold where a pass fires. Volumes before come from the call's
    ``volume_before``; a run without calls recorded shows the after-volumes only."""
    flag = "observed" if stage == "observe" else "reflected"
    before: dict[int, float] = {}
    if calls is not None and not calls.empty:
        mine = calls[(calls.stage == stage) & calls.step.notna() & calls.volume_before.notna()]
        for row in mine.sort_values("seq").itertuples():
            before.setdefault(int(row.step), float(row.volume_before))
    xs, ys, kinds = [], [], []
    for row in steps[["step", column, flag]].itertuples(index=False):
        step, value, fired = int(row[0]), float(row[1]), bool(row[2])
        if fired and step in before:
            xs.append(step)
            ys.append(before[step])
            kinds.append("before pass")
        xs.append(step)
        ys.append(value)
        kinds.append("after pass" if fired else "")
    return pd.DataFrame({"step": xs, "tokens": ys, "point": kinds})


def page_count(total: int, size: int) -> int:
    return max(1, -(-total // size))


def page_slice(total: int, page: int, size: int) -> slice:
    """Items of ``page`` (1-based, clamped) of ``total``."""
    page = min(max(1, page), page_count(total, size))
    return slice((page - 1) * size, min(total, page * size))


def next_compaction(steps: pd.DataFrame, step: int) -> int | None:
    return neighbour(pass_steps(steps), step, +1)


def headline(text: str) -> tuple[str, str]:
    """``text`` split after its first sentence (``("Step 0: the conversation begins.", "The
    agent…")``); the rest is ``""`` when there is one sentence."""
    match = re.search(r"(?<=[.!?])\s+(?=[A-Z0-9])", text)
    return (text, "") if match is None else (text[:match.start()], text[match.end():])


def opening_sentence(row: Any, total_messages: int) -> str:
    """What step 0 means: the first memory read, before anything could be compacted."""
    seen = int(row["message_index"])
    if seen == 0:
        return (f"Step 0: the conversation begins. The agent is about to answer the first of {total_messages:,} "
                "messages, with nothing said before it. Notes start once messages leave the window and the "
                "backlog passes the observation threshold.")
    return (f"Step 0: the conversation begins. The agent is about to answer message {seen + 1} of "
            f"{total_messages:,}; it sees the {seen} message{'s' if seen != 1 else ''} so far "
            f"({int(row['context_tokens']):,} tokens) verbatim. Nothing is old enough to condense yet: "
            "notes start once messages leave the window and the backlog passes the observation threshold.")


def opens_plainly(row: Any) -> bool:
    """Whether step 0 is the plain opening :func:`opening_sentence` describes: nothing condensed,
    every message so far in view. A first read after many user messages (reads come before the
    assistant's) may already condense some, or leave some behind the window: then it is narrated."""
    return (int(row["step"]) == 0 and not bool(row["observed"]) and not bool(row["reflected"])
            and int(row["context_tokens"]) >= int(row["history_tokens"]))


def step_sentence(row: Any, previous: Any, records: pd.DataFrame, total_messages: int) -> str:
    """What happened at a step, in words: the opening for a plain step 0, else the narration."""
    from .analysis import narrate  # (analysis imports this module)

    return opening_sentence(row, total_messages) if opens_plainly(row) else narrate(row, previous, records)


def config_sentence(config: dict[str, Any], label: str | None = None) -> str:
    """The configuration named in one line: models, thresholds, window, prompt versions."""
    reflector = config.get("reflector") or "none"
    text = (f"observer {config.get('observer')} · reflector {reflector} · observation threshold "
            f"{config.get('observation_threshold')} · reflection threshold {config.get('reflection_threshold')} · "
            f"window {config.get('last_messages')} · prompts {prompt_of(config, 'observer')[0]}/"
            f"{prompt_of(config, 'reflector')[0]}")
    if config.get("max_backlog"):
        text += f" · max backlog {config['max_backlog']}"
    return f"{label}: {text}" if label and not missing(label) else text


def settings_note(stored: dict[str, Any], chosen: dict[str, Any]) -> str | None:
    """What the explorer says under a stored run whose settings are not the sidebar's: those
    settings, and the sidebar's, which Run replay would use (the page showed obs 600 beside a
    sidebar set to 300 without a word). ``None`` when they agree."""
    mine, theirs = config_sentence(stored).split(" · "), config_sentence(chosen).split(" · ")
    differ = [part for part in mine if part not in theirs]
    if not differ and len(mine) == len(theirs):
        return None
    instead = [part for part in theirs if part not in mine]
    return (f"This stored run was made with {' · '.join(differ) or 'no ' + ' · '.join(instead)}; Run replay uses the "
            f"sidebar's {' · '.join(instead) or 'settings without ' + ' · '.join(differ)}.")


def run_name(run: dict[str, Any]) -> str | None:
    """A run's configuration label in its experiment, else its own label, else ``None``; never the
    default label that only restates the configuration (the sentence after it says all of that)."""
    for key in ("config_label", "label"):
        value = run.get(key)
        if value is not None and not missing(value) and str(value).strip():
            return None if key == "label" and str(value) == _default_label(run.get("config")) else str(value)
    return None




def short_config(run: Any) -> str:
    """A run's configuration in a few words: its experiment label (``obs 150``), else thresholds and
    window, the observer named when it is not the built-in model and the reflector when it differs
    from the observer or there is none."""
    label = run.get("config_label")
    if label is not None and not missing(label) and str(label).strip():
        return str(label)
    config = run.get("config")
    config = json.loads(config) if isinstance(config, str) else (config or {})
    observer, reflector = str(config.get("observer") or ""), config.get("reflector")
    text = f"obs {config.get('observation_threshold')} · "
    # With no reflector the reflection threshold means nothing: not shown as if it did.
    text += "no reflector" if reflector is None else f"ref {config.get('reflection_threshold')}"
    text += f" · window {config.get('last_messages')}"
    if reflector is not None and reflector != observer:
        text += f" · reflector {reflector}"
    if config.get("max_backlog"):
        text += f" · max backlog {config['max_backlog']}"
    # Prompt versions and the token counter when not the defaults: runs that differ only in them
    # read alike in every picker (found by a walkthrough, on the Runs, Traces and Presentation pages).
    versions = [(config.get(f"{name}_prompt") or {}).get("version") for name in ("observer", "reflector")]
    if any(v is not None and v != DEFAULT_PROMPT_VERSIONS.get(name)
           for name, v in zip(("observer", "reflector"), versions)):
        text += f" · prompts {versions[0] or '–'}/{versions[1] if reflector is not None and versions[1] else '–'}"
    if config.get("token_counter") not in (None, "heuristic"):
        text += f" · {config['token_counter']}"
    return text if observer == OFFLINE_MODEL else f"{observer} · {text}"  # (a typo such as omem/extractivX shows)


def _default_label(config: Any) -> str | None:
    try:
        return default_run_label(config if isinstance(config, dict) else json.loads(config))
    except (TypeError, ValueError):
        return None


# -- page helpers: banners, sweeps, column order ---------------------------------------

_CLI_HINT = re.compile(r";?\s*(?:finish|resume) it with:\s*python -m workbench .*$", re.IGNORECASE | re.DOTALL)


def as_sentence(text: str) -> str:
    """``text`` as a sentence: capital first letter, a closing full stop (empty stays empty)."""
    text = text.strip().rstrip(";,").strip()
    if not text:
        return ""
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def terminal_command(words: str, db: str) -> str:
    """A CLI command for the app to show (Markdown): a code span, with ``--db`` naming the app's
    run store unless it is the default (:func:`formatting.cli_command`); fenced by more backticks
    than any run of them in a path, so none ends it early."""
    command = cli_command(words, db)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", command)), default=0) + 1)
    pad = " " if command.endswith("`") else ""
    return f"{fence}{command}{pad}{fence}"


def unfinished_banner(experiment_id: str, status: str, done: int, planned: int, error: str | None,
                      resumable: bool, db: str = DEFAULT_DB) -> tuple[str, str, str]:
    """An unfinished experiment's banner as (Markdown prefix, detail shown as text, Markdown
    suffix): the stored reason as a sentence of its own (its "finish it with: <CLI command>" tail,
    written for a terminal, dropped), then the way to finish it from here: the Resume button, the
    command only as the other way."""
    from .experiments import status_phrase

    prefix = f"**This experiment {status_phrase(status)}** ({done} of {planned} runs completed). "
    detail = as_sentence(_CLI_HINT.sub("", error or ""))
    safe_id = re.sub(r"[^A-Za-z0-9_.-]", "", str(experiment_id))
    suffix = (f" To finish it, press **Resume** below (or run {terminal_command(f'experiment resume {safe_id}', db)} "
              "in a terminal)." if resumable else "")
    return prefix, detail, suffix


_SAME_RUN_KEYS = ("observer", "reflector", "observation_threshold", "reflection_threshold", "last_messages",
                  "token_counter", "recall_on", "max_backlog")


def _run_key(config: dict[str, Any]) -> tuple:
    """What makes two replays of one conversation the same: the models, thresholds, window,
    counter, backlog ceiling and the prompts' text (not the timeout nor the cache switch)."""
    prompts = tuple((config.get(name) or {}).get("sha256") or (config.get(name) or {}).get("text")
                    for name in ("observer_prompt", "reflector_prompt"))
    return tuple(config.get(k) for k in _SAME_RUN_KEYS) + prompts


def config_problems(observation: float, reflection: float, window: float, backlog: float) -> list[str]:
    """What is wrong with a replay form's numbers, in the form's words (empty: nothing). Checked
    here, not by the number fields' bounds: a value typed outside those was dropped with only a red
    outline, and the run made with the previous value."""
    from .replay import OBSERVER_INPUT_CAP

    problems = []
    for label, value, least in (("observation threshold", observation, 1), ("reflection threshold", reflection, 1),
                                ("window", window, 1), ("backlog ceiling", backlog, 0)):
        if not math.isfinite(value) or value != int(value) or value < least:  # ("1e400" is inf)
            problems.append(f"the {label} must be a whole number{' of at least 1' if least else ' (0 = off)'}, "
                            f"not {typed(value)}")
    if observation > OBSERVER_INPUT_CAP:
        problems.append(f"the observation threshold must be at most {OBSERVER_INPUT_CAP:,} tokens (the workbench's "
                        f"limit, sized for common models: each segment the observer is sent is one threshold's "
                        f"worth), not {typed(observation)}")
    return problems


def earlier_rule_runs(runs: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """``runs`` less those scored under an earlier retention rule (their figures would be drawn
    beside the others' as if comparable), and how many those were."""
    if runs.empty or "scoring" not in runs:
        return runs, 0
    earlier = runs.scoring.map(is_earlier).astype(bool)
    return runs[~earlier], int(earlier.sum())


def already_swept(runs: pd.DataFrame, grid: list[Any]) -> list[int]:
    """Positions in ``grid`` (``ReplayConfig``s) that a completed run in ``runs`` (one
    conversation's runs, their ``config`` column as stored JSON) already replayed with the same
    configuration: running them again would only duplicate that run."""
    import json

    if runs.empty or "config" not in runs:
        return []
    done = runs[runs.status == "completed"] if "status" in runs else runs
    if "scoring" in done:  # (one scored under an earlier rule is not the run a sweep would make now)
        done = done[~done.scoring.map(is_earlier).astype(bool)]
    seen = {_run_key(json.loads(c) if isinstance(c, str) else c) for c in done.config}
    return [i for i, config in enumerate(grid) if _run_key(config.to_json()) in seen]


# The figures people compare configurations by come first: at 1280 px the table's later columns
# scroll off to the right (the others follow in their own order).
SUMMARY_FIRST = ("configuration", "retention", "95% CI", "compression", "cost", "observer calls", "reflector calls",
                 "completed", "not completed")
# (status and counts before the grid: at 800 px, a long name and grid pushed them out of sight)
EXPERIMENTS_FIRST = ("name", "status", "completed", "not completed", "grid", "configurations", "conversations", "dataset",
                     "created", "experiment")


def key_first(columns: Any, first: tuple[str, ...]) -> list[str]:
    """``columns`` reordered: those named in ``first`` (in that order), then the rest as they were."""
    columns = list(columns)
    return [c for c in first if c in columns] + [c for c in columns if c not in first]


def sweep_skip_note(repeated: int, total: int) -> str:
    """What a sweep says when some of its configurations already have a run of the conversation."""
    if repeated >= total:
        return (f"Nothing new to run: {'the configuration' if total == 1 else f'all {total} configurations'} "
                "already have a completed run of this conversation, shown below. Change a threshold, or tick "
                "“Replay configurations already swept” to record identical runs again.")
    return (f"{repeated} of the {total} configurations already have a completed run of this conversation: "
            "skipped (tick “Replay configurations already swept” to record them again).")


__all__ = [
    "CALLS_FORMATS", "COLUMNS", "KEPT", "calls_numbers", "LOCOMO_CATEGORIES", "call_label", "calls_table", "category_name", "clean", "column_spec",
    "compression_note", "config_sentence",
    "config_table", "crossing_series", "figure_columns", "number_text", "experiment_label", "experiments_table",
    "failed_configs",
    "figures_comparison", "final_memory", "grid_reason", "opens_plainly", "step_sentence", "funnel_note", "funnel_table", "grid_target", "grid_view", "neighbour",
    "next_compaction", "offline_prompt_note", "opening_sentence", "page_count", "page_slice", "pareto_points", "compare_pair", "demo_to_finish", "messages_text",
    "pair_conversations", "parse_values", "pass_steps", "probe_grid", "prompt_of", "shared_range", "summary_table", "text_diff",
    "run_name", "short_config", "status_text", "threshold_cells", "trace_attempts", "verdict",
    "EXPERIMENTS_FIRST", "EXPERIMENTS_FORMATS", "SUMMARY_FIRST", "SUMMARY_FORMATS", "as_text", "beats_history_note", "natural_order", "run_findings", "no_retention_note", "run_settings", "text_widths", "unscored_sentence",
    "experiments_numbers", "sortable", "summary_numbers", "already_swept", "key_first", "last_read_compression", "state_phrase",
    "sweep_skip_note", "unfinished_banner",
]


def html_text(value: Any) -> str:
    """Dataset or model text for a plotly title or label (plotly reads a little HTML): escaped."""
    import html

    return html.escape(str(value), quote=False)


def status_text(status: Any, steps: Any, planned: Any) -> str:
    """:func:`workbench.formatting.progress` safe for pandas' ``NA`` (an experiment's run refused
    before its first step has no planned steps): "failed at step 0"."""
    return progress(str(status), _value(steps), _value(planned))


def state_phrase(run: Any) -> str:
    """What became of a run, to follow "This run" or "it": "was interrupted at step 11 of 208",
    "is still running at step 3 of 100", "failed at step 26 of 100", "completed"."""
    verb = {"interrupted": "was ", "running": "is still "}.get(str(run["status"]), "")
    return verb + status_text(run["status"], run["steps"], run["planned_steps"])


def unrecorded_read_note(run: Any, steps: pd.DataFrame) -> str | None:
    """Why the step slider of a run that failed or was stopped ends one before the step its banner
    names ("failed at step 26": reads 0–25 were recorded, read 26 was not), or ``None``."""
    if run["status"] == "completed" or steps.empty:
        return None
    last, planned = int(steps.step.max()), _value(run["planned_steps"])
    if planned is not None and last + 1 >= planned:
        return None
    verb = {"failed": "failed", "running": "is in progress"}.get(str(run["status"]), "was not made")
    return (f"Steps 0–{last} are the memory reads recorded; read {last + 1} {verb}, so it has no step here."
            if last else f"Step 0 is the one memory read recorded; read 1 {verb}, so it has no step here.")


def last_read_compression(run: Any, steps: pd.DataFrame) -> float | None:
    """A run that did not finish may store no whole-run compression: then its ratio at the last
    memory read (what the volumes chart marks there), else ``None`` (the stored figure stands)."""
    if run["status"] == "completed" or not missing(run["compression"]) or steps.empty:
        return None
    last = steps.sort_values("step").iloc[-1]
    return float(last.history_tokens) / float(last.context_tokens) if last.context_tokens else None


def messages_text(run: Any, steps: pd.DataFrame) -> str:
    """The run's message count as a figure: for a run that did not finish, the messages replayed up
    to its last recorded read (that read's message included: where a resume goes on from) "of"
    the conversation's ("164 of 200"): beside "its figures cover only the part replayed", a bare
    "200" read as the whole conversation replayed."""
    if run["status"] == "completed" or steps.empty or missing(run.get("messages")):
        return display(run.get("messages"))
    return f"{display(int(steps.message_index.max()) + 1)} of {display(run['messages'])}"


def redraw_for_other_process(store: Any, experiment_id: str, shown_done: int, may_redraw: bool) -> bool:
    """Whether the Experiments page, following an experiment another process runs (the CLI),
    should draw itself again: it ended, or (when ``may_redraw``: not too soon after the last draw)
    more runs are completed than the ``shown_done`` it shows. It showed "0 of 20 runs completed"
    until the end, while the CLI recorded run after run."""
    if store.experiment(experiment_id)["status"] != "running":
        return True
    return may_redraw and completed_pairs(store.experiment_runs(experiment_id)) != shown_done


def completed_pairs(runs: pd.DataFrame) -> int:
    """How many (conversation, configuration) pairs of an experiment have a completed run."""
    if runs.empty:
        return 0
    done = runs[runs.status == "completed"]
    return int(len(done.drop_duplicates(["conversation_id", "config_label"])))
