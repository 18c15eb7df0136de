"""Plotly figure builders over the run store's DataFrames. Pure: data in, figure out."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

COLORS = {
    "reflection": "#6C5CE7",
    "observations": "#00B894",
    "window": "#0984E3",
    "history": "#636E72",
    "observe": "#00B894",
    "reflect": "#6C5CE7",
}


def _marker_line(fig: go.Figure, step: int | None) -> None:
    if step is not None:
        fig.add_vline(x=step, line_dash="dot", line_color="#d63031", annotation_text=f"step {step}",
                      annotation_position="bottom left")


def _layout(fig: go.Figure, title: str, y: str) -> go.Figure:
    fig.update_layout(title=title, xaxis_title="step (memory read)", yaxis_title=y, height=320,
                      margin=dict(l=40, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.25))
    return fig


def cursor_chart(steps: pd.DataFrame, total_messages: int, step: int | None = None) -> go.Figure:
    """Newest observed message vs messages saved so far, per step."""
    fig = go.Figure()
    fig.add_scatter(x=steps.step, y=steps.message_index, name="messages saved", mode="lines",
                    line=dict(color=COLORS["history"]))
    fig.add_scatter(x=steps.step, y=steps.cursor_index + 1, name="observed up to (cursor)", mode="lines",
                    line=dict(color=COLORS["observe"], shape="hv"))
    fig.add_hline(y=total_messages, line_dash="dash", line_color="#b2bec3",
                  annotation_text=f"conversation length {total_messages}")
    _marker_line(fig, step)
    return _layout(fig, "Cursor advance", "messages")


def thresholds_chart(steps: pd.DataFrame, observation: int, reflection: int, step: int | None = None) -> go.Figure:
    """Backlog vs the observation threshold, unreflected vs the reflection threshold, passes marked."""
    fig = go.Figure()
    fig.add_scatter(x=steps.step, y=steps.backlog_tokens, name="backlog", mode="lines",
                    line=dict(color=COLORS["window"]))
    fig.add_scatter(x=steps.step, y=steps.unreflected_tokens, name="unreflected observations", mode="lines",
                    line=dict(color=COLORS["observe"]))
    fig.add_hline(y=observation, line_dash="dash", line_color=COLORS["window"],
                  annotation_text=f"observation threshold {observation}")
    fig.add_hline(y=reflection, line_dash="dash", line_color=COLORS["observe"],
                  annotation_text=f"reflection threshold {reflection}")
    observed = steps[steps.observed]
    reflected = steps[steps.reflected]
    fig.add_scatter(x=observed.step, y=observed.backlog_tokens, mode="markers", name="observe pass",
                    marker=dict(symbol="triangle-down", size=10, color=COLORS["observe"]))
    fig.add_scatter(x=reflected.step, y=reflected.unreflected_tokens, mode="markers", name="reflect pass",
                    marker=dict(symbol="diamond", size=11, color=COLORS["reflect"]))
    _marker_line(fig, step)
    return _layout(fig, "Thresholds and passes", "tokens")


def volumes_chart(steps: pd.DataFrame, step: int | None = None) -> go.Figure:
    """What the agent sees (reflection, observations, window, stacked) vs the full history."""
    observations = (steps.memory_tokens - steps.reflection_tokens).clip(lower=0)
    fig = go.Figure()
    for name, values in (("reflection", steps.reflection_tokens), ("observations", observations),
                         ("window", steps.window_tokens)):
        fig.add_scatter(x=steps.step, y=values, name=name, stackgroup="context", mode="lines",
                        line=dict(width=0.5, color=COLORS[name]))
    fig.add_scatter(x=steps.step, y=steps.history_tokens, name="full history", mode="lines",
                    line=dict(color=COLORS["history"], dash="dash"))
    if not steps.empty:
        last = steps.iloc[-1] if step is None else steps[steps.step == step].iloc[0]
        ratio = last.history_tokens / last.context_tokens if last.context_tokens else 1.0
        fig.add_annotation(x=last.step, y=last.context_tokens, text=f"{ratio:.1f}x compression at step {int(last.step)}",
                           showarrow=True, arrowhead=2)
    _marker_line(fig, step)
    return _layout(fig, "Token volumes", "tokens")


def pareto_chart(runs: pd.DataFrame) -> go.Figure:
    """Compression vs retention, one point per run; the Pareto front joined."""
    data = runs.dropna(subset=["compression", "retention"]).copy()
    fig = go.Figure()
    if not data.empty:
        labels = [f"obs {o} · ref {r} · win {w}" for o, r, w in zip(data.observation_threshold,
                                                                    data.reflection_threshold, data.window)]
        fig.add_scatter(x=data.compression, y=data.retention, mode="markers", name="runs", text=labels,
                        customdata=data.run_id, marker=dict(size=11, color=data.observation_threshold,
                                                            colorscale="Viridis", showscale=True,
                                                            colorbar=dict(title="obs thr")),
                        hovertemplate="%{text}<br>compression %{x:.1f}x<br>retention %{y:.3f}<extra></extra>")
        front = pareto_front(data)
        fig.add_scatter(x=front.compression, y=front.retention, mode="lines", name="Pareto front",
                        line=dict(color="#d63031", dash="dot"))
    fig.update_layout(title="Compression vs retention", xaxis_title="compression (x)", yaxis_title="retention",
                      height=420, margin=dict(l=40, r=20, t=50, b=40))
    return fig


def pareto_front(data: pd.DataFrame) -> pd.DataFrame:
    """Runs no other run beats on both compression and retention, by compression."""
    ordered = data.sort_values(["compression", "retention"], ascending=[False, False])
    best = -1.0
    keep = []
    for index, row in ordered.iterrows():
        if row.retention > best:
            keep.append(index)
            best = row.retention
    return data.loc[keep].sort_values("compression")


def heatmap(runs: pd.DataFrame, value: str = "retention") -> go.Figure:
    """Mean ``value`` by observation (x) and reflection (y) threshold."""
    table = runs.pivot_table(index="reflection_threshold", columns="observation_threshold", values=value,
                             aggfunc="mean")
    fig = go.Figure(go.Heatmap(z=table.values, x=[str(c) for c in table.columns], y=[str(i) for i in table.index],
                               colorscale="Viridis", colorbar=dict(title=value),
                               text=[[f"{v:.3f}" if pd.notna(v) else "" for v in row] for row in table.values],
                               texttemplate="%{text}"))
    fig.update_layout(title=f"{value} by thresholds", xaxis_title="observation threshold",
                      yaxis_title="reflection threshold", height=380, margin=dict(l=40, r=20, t=50, b=40))
    return fig
