"""Self-contained HTML exports for stakeholders: one file with the charts (plotly.js embedded once)
and the text, which opens from disk in any browser with no app, server or network.

All dataset and model text goes through :func:`html.escape` (tables through pandas' escaping), so
a conversation's text can never become markup in the exported page.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from . import app_data, charts, experiments
from .analysis import narrate
from .formatting import MISSING, count, display, missing, percent_of, ratio, share, short_path, tokens
from .retention import earlier_rule_note

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 2rem auto;
       max-width: 1200px; padding: 0 1.5rem; color: #2d3436; line-height: 1.45; }
h1 { margin-bottom: .2rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #dfe6e9; padding-bottom: .3rem; }
.meta { color: #636e72; } .warn { background: #fff3cd; border-left: 4px solid #e17055; padding: .6rem 1rem; }
table { border-collapse: collapse; font-size: .9rem; margin: .6rem 0; }
.wide { overflow-x: auto; }
th, td { border: 1px solid #dfe6e9; padding: .3rem .6rem; text-align: left; vertical-align: top; }
th { background: #f5f6fa; } pre { background: #f5f6fa; padding: .8rem; white-space: pre-wrap; font-size: .85rem; }
.figures { display: flex; gap: 2rem; flex-wrap: wrap; } .figure b { display: block; font-size: 1.6rem; }
"""


class _Page:
    """Sections of escaped text and charts; plotly.js goes in with the first chart only."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self._js = False

    def text(self, tag: str, value: Any, cls: str | None = None) -> None:
        attr = f' class="{cls}"' if cls else ""
        self.parts.append(f"<{tag}{attr}>{html.escape(str(value))}</{tag}>")

    def pre(self, value: str) -> None:
        self.parts.append(f"<pre>{html.escape(value or '(empty)')}</pre>")

    def table(self, frame: pd.DataFrame, *, index: bool = False) -> None:
        shown = app_data.clean(frame) if not frame.empty else frame
        # (scrolled on its own when wider than the page: at 900 px the grid's tables widened the
        # whole page, which then scrolled sideways)
        self.parts.append('<div class="wide">' + shown.to_html(index=index, escape=True, border=0, na_rep=MISSING)
                          + "</div>")

    def figures(self, items: list[tuple[str, str]]) -> None:
        cells = "".join(f'<div class="figure">{html.escape(name)}<b>{html.escape(value)}</b></div>'
                        for name, value in items)
        self.parts.append(f'<div class="figures">{cells}</div>')

    def chart(self, figure: go.Figure) -> None:
        self.parts.append(figure.to_html(include_plotlyjs=not self._js, full_html=False,
                                         config={"displaylogo": False, "responsive": True}))
        self._js = True

    def render(self) -> str:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(self.title)}</title><style>{_STYLE}</style></head><body>"
                + "\n".join(self.parts)
                + f'<p class="meta">Exported from the omem workbench on {stamp}. This file needs no network.</p>'
                "</body></html>\n")


def experiment_html(store: Any, experiment_id: str) -> str:
    """An experiment for stakeholders: its grid, pooled figures, retention per conversation, Pareto
    chart, heatmaps, loss funnel, comparisons with the first configuration (and on how many
    conversations each keeps more) and the configurations that failed."""
    from .experiments import summarise

    experiment = store.experiment(experiment_id)
    summaries = summarise(store, experiment_id)
    runs = store.experiment_runs(experiment_id)
    probes = store.experiment_probes(experiment_id)
    name = experiment.get("name")
    page = _Page(f"omem experiment {name or experiment_id}")
    page.text("h1", f"Experiment {name or experiment_id}")
    page.text("p", f"{experiment_id} · {experiment['status']} · dataset {short_path(experiment['dataset'])} · "
                   f"{count(len(experiment['conversations']), 'conversation')} × "
                   f"{count(len(experiment['configs']), 'configuration')}", "meta")
    if experiment["status"] != "completed":
        page.text("p", f"This experiment {experiments.status_phrase(experiment['status'])}: figures cover the runs "
                       f"that completed. {app_data.as_sentence(experiment.get('error') or '')}", "warn")
    if earlier := experiments.rule_note(experiment, runs)[0]:
        page.text("p", app_data.as_sentence(earlier), "warn")
    failed = app_data.failed_configs(runs)
    if not failed.empty:
        page.text("p", f"{count(len(failed), 'run')} did not complete; "
                       f"{'it is' if len(failed) == 1 else 'they are'} listed at the end and not drawn.", "warn")
    page.text("h2", "Configurations")
    page.table(app_data.config_table(experiment["configs"]))
    page.text("h2", "Figures per configuration (pooled over every probe of the conversations it completed)")
    page.table(app_data.summary_table(summaries))
    if uneven := experiments.uneven_note(runs):
        page.text("p", uneven, "warn")
    if behind := experiments.backlog_note(summaries):
        page.text("p", behind, "warn")
    if len(experiment["conversations"]) > 1:
        page.text("h2", "Retention per conversation (the spread the pooled interval does not show)")
        frame = app_data.conversation_numbers(experiments.per_conversation(experiment, runs, probes))
        page.table(app_data.as_text(frame, app_data.conversation_formats(frame)))
    points = app_data.pareto_points(summaries)
    if not points.empty:
        page.text("h2", "Retention vs compression")
        page.chart(charts.experiment_pareto_chart(points))
    all_cells = app_data.threshold_cells(summaries)
    for setting in dict.fromkeys(all_cells.settings):  # a heatmap per combination of the other settings
        cells = all_cells[all_cells.settings == setting]
        if cells.observation_threshold.nunique() > 1 or cells.reflection_threshold.nunique() > 1:
            if cells.retention.notna().any():
                page.chart(charts.heatmap(cells, "retention", settings=setting))
            if cells.compression.notna().any():
                page.chart(charts.heatmap(cells, "compression", settings=setting))
    funnel = app_data.funnel_table(summaries)
    if not funnel.empty and int(funnel.iloc[0].sum()):
        page.text("h2", "Where answers are lost")
        page.chart(charts.funnel_chart(funnel))
        note = app_data.funnel_note(summaries)
        if note:
            page.text("p", note)
    if len(summaries) > 1:
        page.text("h2", f"Compared with {summaries[0].label}")
        rows = [{"configuration": s.label, "verdict (paired bootstrap, 95% CI)":
                 app_data.verdict(probes, summaries[0].label, s.label)
                 + experiments.tally_text(summaries[0].label, s.label, experiments.conversation_tally(
                     probes, summaries[0].label, s.label))} for s in summaries[1:]]
        page.table(pd.DataFrame(rows))
    if not failed.empty:
        page.text("h2", "Runs that did not complete")
        page.table(failed)
    return page.render()


def run_html(store: Any, run_id: str) -> str:
    """One run, as the presentation shows it: the configuration, the headline figures, the charts
    on a stable step axis, every compaction in plain words and the notes written."""
    run = store.run(run_id)
    steps = store.steps(run_id)
    records = store.records(run_id)
    calls = store.model_calls(run_id)
    config = run["config"]
    done = run["status"] == "completed"
    page = _Page(f"omem run {run_id}")
    page.text("h1", "Observational memory, step by step")
    page.text("p", f"Run {run_id} · conversation {run['conversation_id']} · "
                   + app_data.config_sentence(config, app_data.run_name(run)), "meta")
    if not done:
        page.text("p", f"Not a finished run: it {app_data.status_text(run['status'], run['steps'], run['planned_steps'])}. "
                       f"Its figures cover only the part replayed. {run.get('error') or ''}", "warn")
    calls_made = sum(0 if missing(run.get(k)) else int(run[k]) for k in ("observer_calls", "reflector_calls"))
    page.figures([
        ("Compression" + ("" if done else " (partial)"), ratio(run.get("compression"))),
        ("Answer words retained", percent_of(run.get("retention"))),
        ("Model calls", display(calls_made)),
        ("Blind-spot tokens (mean)", tokens(run.get("blind_spot_tokens"))),
        ("Messages", app_data.messages_text(run, steps)),
    ])
    if earlier := earlier_rule_note(run.get("scoring")):
        page.text("p", app_data.as_sentence(earlier), "warn")
    if unscored := app_data.no_retention_note(run, store.probes(run_id)):  # (the dash said no reason)
        page.text("p", unscored, "meta")
    if not steps.empty:
        last = int(steps.step.max())
        volumes = charts.volumes_chart(steps)
        volumes.update_xaxes(range=[0, last])
        thresholds = charts.thresholds_chart(steps, config["observation_threshold"], config["reflection_threshold"],
                                             calls=calls)
        thresholds.update_xaxes(range=[0, last])
        note = app_data.compression_note(run, steps)
        if note:  # the chart's last-read figure differs from the headline's
            page.text("p", note, "meta")
        for finding in app_data.run_findings(run, steps, calls):  # (the observer falling behind, …)
            page.text("p", finding, "warn")
        page.chart(volumes)
        page.chart(thresholds)
        page.text("h2", "What happened")
        first = steps.iloc[0]
        if app_data.opens_plainly(first):
            page.text("p", app_data.opening_sentence(first, int(run["messages"])))
        elif 0 not in app_data.pass_steps(steps):  # (a pass at step 0 is narrated below)
            page.text("p", narrate(first, None, records))
        by_step = {int(s): row for s, row in zip(steps.step, steps.to_dict("records"))}
        for step in app_data.pass_steps(steps):
            row = pd.Series(by_step[step])
            previous = pd.Series(by_step[step - 1]) if step - 1 in by_step else None
            page.text("p", narrate(row, previous, records))
    if not records.empty:
        page.text("h2", "Notes written")
        for record in records.itertuples():
            page.text("h3", f"{str(record.kind).capitalize()} at step {display(record.step)} · "
                            f"{display(record.tokens)} tokens")
            page.pre(record.text)
    probes = store.probes(run_id)
    if not probes.empty:
        memory = probes[probes.method == "memory"]
        page.text("h2", f"Probes (retention {share(run.get('retention'))})")
        page.table(pd.DataFrame({"category": memory.category.map(app_data.category_name),
                                 "question": memory.question, "gold": memory.gold,
                                 "score": memory.score.map(lambda v: share(v))}))
    return page.render()


__all__ = ["experiment_html", "run_html"]
