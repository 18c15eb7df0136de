"""Pure functions over the run store's tables: comparisons, probe differences, narration.

No Streamlit here: the app, the CLI and notebooks call these and display what they return.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from .formatting import display, money, progress, ratio, share  # noqa: F401  (display: re-exported)
from .retention import scoring_rule
from .runstore import RunStore

SUMMARY_ROWS = [
    ("label", "configuration"),
    ("status", "status"),
    ("messages", "messages"),
    ("steps", "reads"),
    ("observer_calls", "observer calls"),
    ("reflector_calls", "reflector calls"),
    ("cache_hits", "cache hits"),
    ("full_history_tokens", "full-history tokens"),
    ("final_context_tokens", "final context tokens"),
    ("compression", "compression (x)"),
    ("retention", "retention (memory)"),
    ("retention_full_history", "retention (full history)"),
    ("retention_window_only", "retention (window only)"),
    ("retention_recent", "retention (newest K tokens)"),
    ("scoring", "scoring rule (retention)"),  # (not "retention …": that row name formats a share)
    ("cost_usd", "cost (USD)"),
]


def runs_with_config(store: RunStore) -> pd.DataFrame:
    """The runs table with the configuration's main fields as columns."""
    runs = store.runs()
    if runs.empty:
        return runs.assign(observer=[], reflector=[], observation_threshold=[], reflection_threshold=[], window=[])
    configs = runs.config.map(json.loads)
    runs = runs.assign(
        observer=configs.map(lambda c: c.get("observer")),
        reflector=configs.map(lambda c: c.get("reflector") or "none"),
        observation_threshold=configs.map(lambda c: c.get("observation_threshold")),
        reflection_threshold=configs.map(lambda c: c.get("reflection_threshold")),
        window=configs.map(lambda c: c.get("last_messages")),
        observer_prompt=configs.map(lambda c: (c.get("observer_prompt") or {}).get("version")),
        reflector_prompt=configs.map(lambda c: (c.get("reflector_prompt") or {}).get("version")),
    )
    return runs


def config_rows(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "observer": config.get("observer"),
        "reflector": config.get("reflector") or "none",
        "observation threshold": config.get("observation_threshold"),
        "reflection threshold": config.get("reflection_threshold"),
        "window": config.get("last_messages"),
        "token counter": config.get("token_counter"),
        "observer prompt": (config.get("observer_prompt") or {}).get("version"),
        "reflector prompt": (config.get("reflector_prompt") or {}).get("version"),
        # (text: "off" beside numbers made a column of mixed types, which Streamlit logged a traceback for)
        "max backlog": f"{config['max_backlog']:,}" if config.get("max_backlog") else "off",
    }


def compare_runs(store: RunStore, run_a: str, run_b: str) -> pd.DataFrame:
    """Configuration and figures of two runs, one column each, plus retention per category."""
    columns = {}
    for run_id in (run_a, run_b):
        run = store.run(run_id)
        values: dict[str, Any] = {"conversation": run["conversation_id"], **config_rows(run["config"])}
        for key, name in SUMMARY_ROWS:
            values[name] = run.get(key)
        values["scoring rule (retention)"] = scoring_rule(run.get("scoring"))  # 2, not "2.000"
        values["status"] = progress(run["status"], run.get("steps"), run.get("planned_steps"))
        if run["status"] != "completed":  # say which figures describe only the prefix replayed
            from .app_data import last_read_compression  # (app_data imports this module)

            # as the explorer shows it: the ratio at the last read when the run has no whole figure
            at_last_read = last_read_compression(run, store.steps(run_id))
            values["compression (x)"] = ratio(run.get("compression") if at_last_read is None else at_last_read,
                                              partial=True)
        tokens = store.model_calls(run_id)
        values["model tokens in"] = int(tokens.input_tokens.fillna(0).sum()) if not tokens.empty else 0
        values["model tokens out"] = int(tokens.output_tokens.fillna(0).sum()) if not tokens.empty else 0
        for category, score in category_retention(store.probes(run_id)).items():
            values[f"retention · {_category(category)}"] = score
        columns[run_id] = values
    return pd.DataFrame(columns)


def comparison_shown(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`compare_runs` as people read it, figures formatted as every other table shows them
    (compression ``3.9x``, retention ``0.795``, cost ``$0.0012``, counts with separators)."""
    def row(name: str) -> Any:
        if name == "compression (x)":
            return lambda v: v if isinstance(v, str) else ratio(v)
        if name == "cost (USD)":
            return money
        if name.startswith("retention"):
            return share
        return display
    return table.apply(lambda r: r.map(row(str(r.name))), axis=1)


def category_retention(probes: pd.DataFrame, method: str = "memory") -> dict[str, float]:
    if probes.empty:
        return {}
    rows = probes[(probes.method == method) & probes.score.notna()]
    return {str(k): float(v) for k, v in rows.groupby("category").score.mean().sort_index().items()}


METHOD_NAMES = {"memory": "memory", "recent_tokens": "recency baseline (same tokens)", "window_only": "window only",
                "full_history": "full history", "llm_judge": "LLM judge", "probes": "probes"}


def _category(value: Any) -> str:
    from .app_data import category_name  # (app_data imports this module)

    return category_name(value)


def retention_table(probes: pd.DataFrame) -> pd.DataFrame:
    """Mean score per category (rows, by name) and method (columns, readable names)."""
    if probes.empty:
        return pd.DataFrame()
    scored = probes[probes.score.notna()]
    table = scored.pivot_table(index="category", columns="method", values="score", aggfunc="mean")
    table["probes"] = scored[scored.method == "memory"].groupby("category").size()
    order = [c for c in METHOD_NAMES if c in table]
    table = table[order].rename(columns=METHOD_NAMES)
    table.index = [_category(c) for c in table.index]
    table.index.name = "category"
    table.columns.name = None
    return table


def probe_diff(store: RunStore, run_a: str, run_b: str, *, kept: float = 0.5) -> pd.DataFrame:
    """Probes one run keeps (score >= ``kept``) and the other loses, with both scores."""
    a = store.probes(run_a)
    b = store.probes(run_b)
    if a.empty or b.empty:
        return pd.DataFrame(columns=["probe_id", "category", "question", "gold", "score_a", "score_b", "kept_by"])
    a = a[a.method == "memory"][["probe_id", "category", "question", "gold", "score"]]
    b = b[b.method == "memory"][["probe_id", "score"]]
    merged = a.merge(b, on="probe_id", suffixes=("_a", "_b")).dropna(subset=["score_a", "score_b"])
    keep_a = merged.score_a >= kept
    keep_b = merged.score_b >= kept
    merged = merged[keep_a != keep_b].copy()
    merged["kept_by"] = merged.apply(lambda r: run_a if r.score_a >= kept else run_b, axis=1)
    return merged.reset_index(drop=True)


def records_at(records: pd.DataFrame, step: int) -> pd.DataFrame:
    """Records written at or before ``step``."""
    return records[records.step.fillna(-1) <= step]


def sources_of(record: pd.Series, messages: pd.DataFrame) -> pd.DataFrame:
    """The messages an observation condensed (for a reflection: the messages of its observations)."""
    ids = json.loads(record["source_ids"]) if isinstance(record["source_ids"], str) else list(record["source_ids"])
    return messages[messages.message_id.isin(ids)]


def visible_at(step_row: pd.Series, records: pd.DataFrame, messages: pd.DataFrame, window: int) -> tuple[str, pd.DataFrame]:
    """What the agent saw at a step: the rendered memory text and the window messages.

    The step row names them (``window_ids``, ``memory_ids``: what ``recall`` returned, recorded by
    the replay); a run recorded before that is rebuilt from the stored rows with the library's
    own rendering rule (newest reflection, then the observations it does not cover, oldest first).
    """
    from omem_core.planning import memory_text, view_of

    step = int(step_row["step"])
    window_ids = step_row.get("window_ids")
    if isinstance(window_ids, str):
        shown = records[records.record_id.isin(json.loads(step_row.get("memory_ids") or "[]"))]
        view = view_of([_record(row) for _, row in shown.iterrows()])  # records are in creation order
        ordered = json.loads(window_ids)
        by_id = messages.set_index("message_id", drop=False)
        return memory_text(view), by_id.loc[[i for i in ordered if i in by_id.index]].reset_index(drop=True)
    written = records_at(records, step)
    view = view_of([_record(row) for _, row in written.iterrows()])
    end = int(step_row["message_index"])
    return memory_text(view), messages[(messages.idx < end) & (messages.idx >= end - window)]


def _record(row: pd.Series):
    from omem_core import ObservationRecord

    ids = json.loads(row["source_ids"]) if isinstance(row["source_ids"], str) else list(row["source_ids"])
    return ObservationRecord(id=row["record_id"], thread_id=row["thread_id"], resource_id=row["resource_id"],
                             created_at=row["created_at"].to_pydatetime() if hasattr(row["created_at"], "to_pydatetime")
                             else row["created_at"], kind=row["kind"], source_ids=tuple(ids), text=row["text"])


def note_lines(text: str) -> int:
    """The note lines of an observation or reflection: its bullet lines ("- ", "* ", "• "), not the
    date headings above them (counted, "the observer wrote 2 lines" for one note under a date); a
    text without bullets counts its non-empty lines."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    bullets = [line for line in lines if line[:2] in ("- ", "* ") or line.startswith("•")]
    return len(bullets) if bullets else len(lines)


def narrate(step_row: pd.Series, previous: pd.Series | None, records: pd.DataFrame) -> str:
    """One plain-language sentence about what happened at a step (presentation mode)."""
    step = int(step_row["step"])
    new = records[records.step == step]
    parts = []
    left = int(step_row["message_index"]) - (int(previous["message_index"]) if previous is not None else 0)
    if step_row["observed"]:
        obs = new[new.kind == "observation"]
        lines = sum(note_lines(t) for t in obs.text)
        sources = sum(len(json.loads(s)) for s in obs.source_ids)
        parts.append(f"{sources} older message{' was' if sources == 1 else 's were'} condensed: the observer "
                     f"wrote {lines} line{'s' if lines != 1 else ''}")
    if step_row["reflected"]:
        ref = new[new.kind == "reflection"]
        lines = sum(note_lines(t) for t in ref.text)
        parts.append(f"the reflector merged the notes into a {lines}-line reflection")
    if not parts:
        backlog = int(step_row["backlog_tokens"])
        parts.append(f"{left} new message{'s' if left != 1 else ''} arrived; {backlog:,} tokens wait behind the "
                     "window, nothing to compact yet")
    sentence = "; ".join(parts)
    seen, said = int(step_row["context_tokens"]), int(step_row["history_tokens"])
    times = said / seen if seen else 1.0
    if ratio(times) == ratio(1.0) or times < 1:  # ("54 instead of 54 (1.0x smaller)" said nothing)
        end = f"The agent sees {seen:,} tokens; the conversation so far holds {said:,}."
    else:
        end = f"The agent sees {seen:,} tokens instead of {said:,} ({ratio(times)} smaller)."
    return f"Step {step}: {sentence[0].upper()}{sentence[1:]}. {end}"


def falling_behind(steps: pd.DataFrame, observation_threshold: int) -> tuple[int, float] | None:
    """``(tokens, share of the history)`` in neither memory nor the window at a run's end when
    the observer fell behind (that backlog over 3 observation thresholds and still growing since
    the run's middle), else ``None``."""
    if len(steps) < 4:
        return None
    ordered = steps.sort_values("step")
    backlog, history = ordered.backlog_tokens.to_numpy(), ordered.history_tokens.to_numpy()
    final, middle = int(backlog[-1]), int(backlog[len(backlog) // 2])
    if final > 3 * observation_threshold and final > middle:
        return final, final / max(int(history[-1]), 1)
    return None


def findings(steps: pd.DataFrame, observation_threshold: int, calls: pd.DataFrame | None = None,
             max_backlog: int | None = None, reflection_threshold: int | None = None,
             recall_on: str | None = None, complete: bool = True) -> list[str]:
    """Plain-language warnings about a run a user tuning thresholds should know about.

    * The observer falls behind: each read observes at most one segment (at most the observation
      threshold, or one message), so when reads add more than that, the backlog (messages neither
      observed nor in the window, so invisible to the agent) keeps growing. (Reading more often is
      suggested only when ``recall_on`` is not already ``"every"``.)
    * Reflections came back over the reflection threshold and were sent back or trimmed.
    * The reflection threshold is below what one observer pass writes.
    * Nothing was observed in a ``complete`` run without an observer call (its figures are the
      window's alone).
    """
    notes: list[str] = []
    called = calls is not None and not calls.empty and bool((calls.stage == "observe").any())
    if complete and not called and not steps.empty and "observed" in steps and not steps.observed.astype(bool).any():
        # (a conversation below the threshold showed "Compression 4.0x" and "Retention 1.000" beside
        # "Model calls 0", and no word that the memory never ran)
        ordered = steps.sort_values("step")
        left_out = int(ordered.backlog_tokens.iloc[-1])
        notes.append(
            f"Nothing was observed: the backlog (messages older than the window, {left_out:,} tokens at the end; "
            f"at most {int(ordered.backlog_tokens.max()):,}) never reached the observation threshold "
            f"({observation_threshold:,} tokens), so no model ran and memory stayed empty. The compression "
            "is only what leaving those messages out of the window saves, and retention counts what the "
            "window holds: lower the observation threshold to see the memory at work on this conversation."
        )
    if (behind := falling_behind(steps, observation_threshold)) is not None:
        final, share = behind
        history = steps.sort_values("step").history_tokens.to_numpy()
        added = pd.Series(history).diff().dropna()
        per_read = int(added.median()) if not added.empty else 0
        notes.append(
            f"The observer is falling behind: at the end, {final:,} tokens of messages "
            f"({share:.0%} of the history) are neither in memory nor in the window, "
            f"and the backlog was still growing. A read observes at most one segment of up to "
            f"{observation_threshold:,} tokens (or one longer message), while this conversation adds about "
            f"{per_read:,} tokens per read. Raise the observation threshold well above that (segments are "
            f"whole messages), "
            + ("read memory more often (recall before every message), or " if recall_on != "every" else "or ")
            + ("set a backlog ceiling (--max-backlog; max_backlog in the library): past it, a read observes "
               "a larger segment, so the backlog stops growing." if max_backlog is None else
               f"lower the backlog ceiling ({max_backlog:,} tokens in this run: past it, a read observes a "
               f"larger segment, up to the observer's input cap).")
        )
    observe = calls[calls.stage == "observe"] if calls is not None and not calls.empty else None
    if reflection_threshold and observe is not None and "output_tokens" in observe:
        written = observe.output_tokens.dropna()
        typical = int(written.median()) if not written.empty else 0
        if typical > reflection_threshold:  # memory is squeezed below one note: compression looks good for nothing
            notes.append(
                f"The reflection threshold ({reflection_threshold:,} tokens) is below what one observer pass "
                f"writes (about {typical:,} tokens): every reflection squeezes all the notes into less than one "
                "of them, so memory keeps little, however good the compression looks. Set it to a few times "
                "the observer's output."
            )
    if calls is not None and not calls.empty and "attempts" in calls:
        reflect = calls[calls.stage == "reflect"]
        tightened = int((reflect.attempts.fillna(1) > 1).sum())
        trimmed = int(reflect.trimmed.fillna(False).astype(bool).sum())
        if tightened:
            one = tightened == 1
            notes.append(
                f"{tightened} of {len(reflect)} reflection{'' if len(reflect) == 1 else 's'} came back over the "
                f"reflection threshold and {'was' if one else 'were'} sent back to be shortened; "
                + (f"{trimmed} still did not fit and {'was' if trimmed == 1 else 'were'} trimmed to it without a "
                   f"model ({'its' if trimmed == 1 else 'their'} least informative sentences dropped)." if trimmed
                   else ("it then fit." if one else "each then fit."))
            )
    return notes
