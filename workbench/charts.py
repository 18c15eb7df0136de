"""Plotly figure builders over the run store's DataFrames. Pure: data in, figure out."""

from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go

from . import formatting as fmt

COLORS = {
    "reflection": "#6C5CE7",
    "observations": "#00B894",
    "window": "#0984E3",
    "history": "#636E72",
    "observe": "#00B894",
    "reflect": "#6C5CE7",
}


def _esc(text: object) -> str:
    """Dataset or model text for plotly's text and names (which read a little HTML): escaped."""
    return html.escape(str(text), quote=False)


SIDE_BY_SIDE_WIDTH = 395  # px: two charts side by side on a wide page, one under the other below ~850 px
_LABEL_PX = 6.6  # the width of a character of an annotation (11-12 px font), for placing labels
_PLOT_PX = SIDE_BY_SIDE_WIDTH - 90  # the plot area of such a chart (the y axis and margins take the rest)


def label_side(text: str, level: float, above: bool, passes: pd.DataFrame, x_range: tuple[float, float],
               top: float, step: float | None = None) -> str:
    """Which end of its line a threshold's label goes to ("left" or "right"): the one where fewer
    pass markers sit in the box the label covers (its width estimated for a side-by-side chart; on
    the same level, above or under the line), the right on a tie. ``passes``: the markers' ``step``
    and ``tokens``. The current ``step``'s line counts as more than every marker: at the last
    step (where the explorer opens) it crossed the right-hand labels."""
    low, high = x_range
    span = max(high - low, 1e-9)
    width = min(1.0, len(text) * _LABEL_PX / _PLOT_PX) * span
    band = 0.1 * max(top, 1)
    ys = (level, level + band) if above else (level - band, level)
    near = passes[(passes.tokens >= ys[0]) & (passes.tokens <= ys[1])] if not passes.empty else passes
    boxes = (("right", (high - width, high)), ("left", (low, low + width)))
    counts = {side: int(((near.step >= a) & (near.step <= b)).sum()) if not near.empty else 0 for side, (a, b) in boxes}
    if step is not None:
        for side, (a, b) in boxes:
            counts[side] += (len(passes) + 1) * (a <= step <= b)
    return "left" if counts["left"] < counts["right"] else "right"


def _marker_line(fig: go.Figure, step: int | None) -> None:
    """The current step as a dotted line, labelled just above the plot area (inside it, the label
    printed over threshold labels and data) on the side with room: right of the line in the left
    half of the chart (at step 0 a label to the left would sit on the y axis), else left."""
    if step is not None:
        ends = [max(trace.x) for trace in fig.data if trace.x is not None and len(trace.x)]
        left_half = not ends or step <= max(ends) / 2
        fig.add_vline(x=step, line_dash="dot", line_color="#d63031")
        fig.add_annotation(x=step, xref="x", y=1, yref="paper", yanchor="bottom", showarrow=False,
                           text=f"step {step}", font=dict(color="#d63031"),
                           xanchor="left" if left_half else "right")


def _fit(fig: go.Figure) -> go.Figure:
    """Margins grow to fit tick labels and axis titles (a fixed margin let "tokens" print over the
    "2000" tick, and a long title run off the edge, in the HTML export)."""
    fig.update_xaxes(automargin=True, title_standoff=8)
    fig.update_yaxes(automargin=True, title_standoff=8)
    return fig


def _layout(fig: go.Figure, title: str, y: str) -> go.Figure:
    fig.update_layout(title=title, xaxis_title="step (memory read)", yaxis_title=y, height=320,
                      margin=dict(l=40, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.25))
    return _fit(fig)


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


def thresholds_chart(steps: pd.DataFrame, observation: int, reflection: int, step: int | None = None,
                     calls: pd.DataFrame | None = None, top: float | None = None) -> go.Figure:
    """Backlog vs the observation threshold, unreflected vs the reflection threshold, passes marked.

    With the run's ``calls``, each pass step carries the volume just before the pass as well as
    after it, so the line visibly rises over the dashed threshold and drops where a pass fires.
    ``top``: the y axis' top when the chart will share a scale with another (labels are placed for it)."""
    from .app_data import crossing_series

    fig = go.Figure()
    backlog = crossing_series(steps, calls, "backlog_tokens", "observe")
    unreflected = crossing_series(steps, calls, "unreflected_tokens", "reflect")
    fig.add_scatter(x=backlog.step, y=backlog.tokens, name="backlog", mode="lines",
                    line=dict(color=COLORS["window"]), hovertemplate="step %{x}: %{y} tokens<extra>backlog</extra>")
    fig.add_scatter(x=unreflected.step, y=unreflected.tokens, name="unreflected observations", mode="lines",
                    line=dict(color=COLORS["observe"]),
                    hovertemplate="step %{x}: %{y} tokens<extra>unreflected</extra>")
    # Two thresholds close together *on the drawn axis* would print their labels over each other
    # (1,000 and 2,000 are close on an axis that reaches 50,000): the upper one's label goes over
    # its line, the other under (the same value: one label for both).
    top = max([observation, reflection, 1, top or 0,  # ``top``: the axis' top when it is shared (Compare)
               *backlog.tokens.dropna().tolist(), *unreflected.tokens.dropna().tolist()])
    close = abs(reflection - observation) <= 0.12 * top
    observed = backlog[backlog.point == "before pass"]
    if observed.empty:  # no calls recorded: mark the passes on the after-volumes
        observed = steps[steps.observed].rename(columns={"backlog_tokens": "tokens"})
    reflected = unreflected[unreflected.point == "before pass"]
    if reflected.empty:
        reflected = steps[steps.reflected].rename(columns={"unreflected_tokens": "tokens"})
    # Each label goes to the end of its line where it covers fewer pass markers (they sit just over
    # the line they crossed), on a white ground so that it reads where it cannot avoid them.
    passes = pd.concat([observed[["step", "tokens"]], reflected[["step", "tokens"]]], ignore_index=True)
    steps_drawn = pd.concat([backlog.step, unreflected.step, steps.step]).dropna()
    x_range = (float(steps_drawn.min()), float(steps_drawn.max())) if not steps_drawn.empty else (0.0, 1.0)
    label = dict(annotation_bgcolor="rgba(255,255,255,0.85)", annotation_font_size=11)

    def line(level: int, text: str, color: str, above: bool, side: str | None = None) -> str:
        side = side or label_side(text, level, above, passes, x_range, top, step)
        fig.add_hline(y=level, line_dash="dash", line_color=color, annotation_text=text,
                      annotation_position=("top " if above else "bottom ") + side, **label)
        return side

    # A label goes under its line: a pass marker sits just over the line it crossed, and a label
    # over the line hid them (at 900 px most of them). But over a line near the axis' foot (under
    # it, the label would sit on the tick labels), and over the upper of two close lines; two
    # labels over two close lines take opposite ends.
    floor = 0.05 * top  # (a label is about 15 px high, a side-by-side plot about 230 px)
    if observation == reflection:
        line(observation, f"observation and reflection threshold {observation}", COLORS["observe"],
             observation < floor)
    else:
        (low, low_text, low_color), (high, high_text, high_color) = sorted([
            (observation, f"observation threshold {observation}", COLORS["window"]),
            (reflection, f"reflection threshold {reflection}", COLORS["observe"])])
        high_side = line(high, high_text, high_color, close)
        low_above = low < floor
        if close and low_above:
            line(low, low_text, low_color, True, "left" if high_side == "right" else "right")
        else:
            line(low, low_text, low_color, low_above)
    # A pass at (nearly) every read, as when the observer falls behind on BEAM: full-size markers
    # hid the backlog line they sit on, so dense ones are drawn small and see-through.
    dense = len(observed) > 30
    fig.add_scatter(x=observed.step, y=observed.tokens, mode="markers", name="observe pass",
                    marker=dict(symbol="triangle-down", size=6 if dense else 10, color=COLORS["observe"],
                                opacity=0.55 if dense else 1.0),
                    hovertemplate="observe pass at step %{x}: backlog %{y} tokens before it<extra></extra>")
    fig.add_scatter(x=reflected.step, y=reflected.tokens, mode="markers", name="reflect pass",
                    marker=dict(symbol="diamond", size=11, color=COLORS["reflect"]),
                    hovertemplate="reflect pass at step %{x}: %{y} unreflected tokens before it<extra></extra>")
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
        times = last.history_tokens / last.context_tokens if last.context_tokens else 1.0
        right_half = float(last.step) > float(steps.step.max()) / 2
        fig.add_annotation(x=last.step, y=last.context_tokens,
                           text=f"{fmt.ratio(times)} compression at step {int(last.step)}", showarrow=True,
                           arrowhead=2, ax=-20 if right_half else 20, ay=-30,
                           xanchor="right" if right_half else "left")  # the label stays inside the plot
    _marker_line(fig, step)
    return _layout(fig, "Token volumes", "tokens")


def pareto_chart(runs: pd.DataFrame) -> go.Figure:
    """Compression vs retention, one point per run; the Pareto front drawn under the points (its
    line takes no hover, so hovering and clicking reach the points)."""
    data = runs.dropna(subset=["compression", "retention"]).copy()
    fig = go.Figure()
    if not data.empty:
        front = pareto_front(data)
        fig.add_scatter(x=front.compression, y=front.retention, mode="lines", name="Pareto front",
                        line=dict(color="#d63031", dash="dot"), hoverinfo="skip")
        labels = [f"obs {o} · ref {r} · window {w}" for o, r, w in zip(data.observation_threshold,
                                                                    data.reflection_threshold, data.window)]
        # Coloured by observation threshold only when the runs tried more than one: a colour bar
        # for one value spans a meaningless range (299.6 to 300.4).
        varied = data.observation_threshold.nunique() > 1
        marker = (dict(size=11, color=data.observation_threshold, colorscale="Viridis", showscale=True,
                       colorbar=dict(title="observation<br>threshold")) if varied
                  else dict(size=11, color=COLORS["window"], showscale=False))
        fig.add_scatter(x=data.compression, y=data.retention, mode="markers", name="runs", text=labels,
                        customdata=data.run_id, marker=marker,
                        hovertemplate="%{text}<br>compression %{x:.1f}x<br>retention %{y:.3f}<extra></extra>")
        fig.update_yaxes(range=list(retention_range(float(data.retention.min()), float(data.retention.max()))))
    fig.update_layout(title="Compression vs retention", xaxis_title="compression (x)", yaxis_title="retention",
                      height=420, margin=dict(l=40, r=20, t=50, b=40), clickmode="event+select",
                      legend=dict(orientation="h", y=-0.2))  # (on the right it covered the colour bar)
    return _fit(fig)


def _label_sides(x: pd.Series) -> list[str]:
    """Point labels that stay inside the chart: the leftmost point's to its right, the rightmost's
    to its left, the others centred (centred at the edges, half of a long label was cut off)."""
    low, high = float(x.min()), float(x.max())
    if low == high:
        return ["top center"] * len(x)
    return ["top right" if v == low else "top left" if v == high else "top center" for v in x.astype(float)]


CROWDED = 0.2  # points closer than this share of the x span: their labels (about 0.15 of it wide) would touch


def _crowds(xs: list[float], ys: list[float]) -> list[list[int]]:
    """The points (their positions) in runs whose neighbours are closer in x than :data:`CROWDED`
    of the x span, each run ordered by x then y (a single point is a run of its own)."""
    span = max(xs) - min(xs) if xs else 0.0
    crowds: list[list[int]] = []
    for i in sorted(range(len(xs)), key=lambda i: (xs[i], ys[i])):
        if crowds and (xs[i] - xs[crowds[-1][-1]] <= CROWDED * span if span else True):
            crowds[-1].append(i)
        else:
            crowds.append([i])
    return crowds


def label_positions(x: pd.Series, y: pd.Series) -> list[str]:
    """Where each point's label goes (plotly ``textposition``). Points far apart in x: above them, the
    edge ones pointing inwards (:func:`_label_sides`). Points crowded together in x (a label over one
    sat on its neighbour's error bar or label): beside their markers instead, fanning out from the
    crowd (the left ones to the left, the right ones to the right), a middle one under its point,
    so that no two labels of a crowd share a place."""
    xs, ys = [float(v) for v in x], [float(v) for v in y]
    positions = _label_sides(pd.Series(xs, dtype=float)) if xs else []
    for crowd in _crowds(xs, ys):
        if len(crowd) < 2:
            continue
        half = len(crowd) / 2
        for rank, i in enumerate(crowd):
            positions[i] = ("middle left" if rank < half - 0.5 else "middle right" if rank > half - 0.5
                            else "bottom center")
    return positions


def _padded_range(x: pd.Series, positions: list[str], labels: list[str]) -> list[float] | None:
    """An x range with room for the labels that point out of the chart ("middle left" of the
    leftmost point, "middle right" of the rightmost): without it they ran over the y axis or off
    the right edge ("obs 3…"). ``None``: plotly's own range is fine."""
    xs = [float(v) for v in x]
    if not xs:
        return None
    low, high = min(xs), max(xs)
    span = (high - low) or max(abs(high), 1.0) * 0.1
    room = [min(1.0, len(str(t)) * _LABEL_PX / _PLOT_PX) * span * 1.1 for t in labels]
    left = max([room[i] for i, (v, p) in enumerate(zip(xs, positions)) if p.endswith("left") and v - room[i] < low]
               + [0.05 * span])
    right = max([room[i] for i, (v, p) in enumerate(zip(xs, positions)) if p.endswith("right") and v + room[i] > high]
                + [0.05 * span])
    return [low - left, high + right]


_PARETO_PLOT_PX = 300  # the height of the experiment chart's plot area (440 px less title, axis, legend)
_LINE_PX = 15  # a label's line (11-12 px font): two labels closer than this overlap


def _stacked_labels(points: pd.DataFrame, positions: list[str], y_range: tuple[float, float]
                    ) -> list[tuple[int, float, float, str]]:
    """Labels of a crowd whose side-by-side labels would overlap (two on one side closer in y than
    a line: "obs 400 · window 6" over "obs 400 · window 4"), as ``(point, label x, label y,
    xanchor)``: stacked a line apart in a column beside the crowd, each with a leader line to its
    point. Crowds whose labels fit beside their markers are left to ``positions``."""
    xs, ys = [float(v) for v in points.compression], [float(v) for v in points.retention]
    span_x = (max(xs) - min(xs)) or 1.0
    low, high = y_range
    gap = _LINE_PX * (high - low) / _PARETO_PLOT_PX
    stacked = []
    for crowd in _crowds(xs, ys):  # (the crowds label_positions sees)
        sides: dict[str, list[float]] = {}
        for i in crowd:
            sides.setdefault(positions[i], []).append(ys[i])
        if not any(min(abs(v[a] - v[b]) for a in range(len(v)) for b in range(a + 1, len(v))) < gap
                   for v in sides.values() if len(v) > 1):
            continue
        left_room, right_room = min(xs[i] for i in crowd) - min(xs), max(xs) - max(xs[i] for i in crowd)
        right = right_room >= left_room
        x = (max(xs[i] for i in crowd) + 0.06 * span_x) if right else (min(xs[i] for i in crowd) - 0.06 * span_x)
        members = sorted(crowd, key=lambda i: -ys[i])
        levels = []
        for i in members:  # a line apart, top down, then centred on the crowd and kept inside the axis
            levels.append(min(ys[i], levels[-1] - gap) if levels else ys[i])
        shift = sum(ys[i] for i in members) / len(members) - sum(levels) / len(levels)
        shift = min(shift, high - gap / 2 - levels[0])
        shift = max(shift, low + gap / 2 - levels[-1])
        stacked += [(i, x, level + shift, "left" if right else "right") for i, level in zip(members, levels)]
    return stacked


def retention_range(low: float, high: float, least: float = 0.1) -> tuple[float, float]:
    """A retention axis for values from ``low`` to ``high``: padded, at least ``least`` wide, and
    never past 0 or 1 by more than its padding (plotly's own range for one point at 1.0 ran from 0
    to 2, a retention no run can have)."""
    pad = max(high - low, 0.02) * 0.06
    low, high = low - pad, high + pad
    if high - low < least:
        middle = (low + high) / 2
        low, high = middle - least / 2, middle + least / 2
    if high > 1 + pad:
        low, high = low - (high - 1 - pad), 1 + pad
    if low < -pad:
        low, high = -pad, high + (-pad - low)
    return low, high


def experiment_pareto_chart(points: pd.DataFrame) -> go.Figure:
    """Pooled retention (with its 95% CI as error bars) vs compression, one point per configuration
    of an experiment; the Pareto front drawn first, under the points, and never hovered."""
    fig = go.Figure()
    if not points.empty:
        front = pareto_front(points)
        fig.add_scatter(x=front.compression, y=front.retention, mode="lines", name="Pareto front",
                        line=dict(color="#d63031", dash="dot", width=2), hoverinfo="skip")
        positions = label_positions(points.compression, points.retention)
        y_range = retention_range(float(points.low.min()), float(points.high.max()))
        fig.update_yaxes(range=list(y_range))  # (plotly's own for one point at 1.0 ran from 0 to 2)
        stacked = _stacked_labels(points, positions, y_range)
        labels = [_esc(v) for v in points.label]
        x_range = _padded_range(points.compression, positions, list(points.label))
        if stacked:  # (placed for y_range)
            span = float(points.compression.max() - points.compression.min()) or 1.0
            for i, x, y, anchor in stacked:
                fig.add_annotation(x=float(points.compression.iloc[i]), y=float(points.retention.iloc[i]),
                                   ax=x, ay=y, axref="x", ayref="y", text=labels[i], xanchor=anchor,
                                   showarrow=True, arrowhead=0, arrowwidth=1, arrowcolor="#b2bec3",
                                   standoff=7, font=dict(size=11, color="#2d3436"),
                                   bgcolor="rgba(255,255,255,0.85)")
                width = min(1.0, len(str(points.label.iloc[i])) * _LABEL_PX / _PLOT_PX) * span * 1.1
                if x_range is not None:  # (room for the stacked labels beside the crowd)
                    x_range = [min(x_range[0], x - width if anchor == "right" else x_range[0]),
                               max(x_range[1], x + width if anchor == "left" else x_range[1])]
                labels[i] = ""
        fig.update_xaxes(range=x_range)
        fig.add_scatter(
            x=points.compression, y=points.retention, mode="markers+text", name="configurations",
            text=labels, textposition=positions, cliponaxis=False,
            textfont=dict(shadow="auto"),  # a halo: where a label crosses an error bar it still reads
            customdata=points.label, hovertext=[_esc(v) for v in points.label],  # (a stacked label's text is "")
            error_y=dict(type="data", symmetric=False, array=(points.high - points.retention).clip(lower=0),
                         arrayminus=(points.retention - points.low).clip(lower=0), color="#636e72", thickness=1.2),
            marker=dict(size=13, color=COLORS["window"], line=dict(width=1, color="white")),
            hovertemplate="%{hovertext}<br>compression %{x:.1f}x<br>retention %{y:.3f}<extra></extra>")
    fig.update_layout(title="Pooled retention (95% CI) vs compression", xaxis_title="compression (x)",
                      yaxis_title="retention (pooled over probes)", height=440, margin=dict(l=40, r=20, t=50, b=40),
                      clickmode="event+select", showlegend=True, legend=dict(orientation="h", y=-0.2))
    return _fit(fig)


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


MIN_SPAN = 0.2  # a colour scale spans at least this share of its top value (compression and the like)


def color_range(values: list[float], value: str) -> tuple[float, float] | None:
    """The colour scale's ends for a heatmap of ``value``, wide enough not to exaggerate: scaled
    to the cells' own min..max, 0.712 and 0.711 read as full yellow and full purple. Retention (a
    share) spans 0..1; compression starts at 1x (no compression) and reaches at least 2x; any other
    value spans at least ``MIN_SPAN`` of its largest magnitude, centred on the cells. ``None``: no
    cells."""
    if not values:
        return None
    low, high = min(values), max(values)
    if value == "retention" or (value.endswith("share") and 0 <= low and high <= 1):
        return 0.0, 1.0
    if value == "compression":
        return min(1.0, low), max(high, 2.0 * min(1.0, low))
    need = MIN_SPAN * max(abs(low), abs(high), 1e-9)
    if high - low >= need:
        return low, high
    middle = (low + high) / 2
    return middle - need / 2, middle + need / 2


def heatmap(runs: pd.DataFrame, value: str = "retention", *, settings: str = "") -> go.Figure:
    """Mean ``value`` by observation (x) and reflection (y) threshold, on categorical axes: every
    threshold tried is one equal cell, whatever its number (150/300/600 are three equal columns).
    ``settings`` names what the runs share besides the thresholds (in the title)."""
    data = runs.dropna(subset=["observation_threshold", "reflection_threshold"])
    table = data.pivot_table(index="reflection_threshold", columns="observation_threshold", values=value,
                             aggfunc="mean", dropna=False)
    table = table.sort_index().sort_index(axis=1)
    xs, ys = [str(int(c)) for c in table.columns], [str(int(i)) for i in table.index]
    z = [[None if pd.isna(v) else float(v) for v in row] for row in table.values]
    cell = fmt.ratio if value == "compression" else (lambda v: fmt.share(v, 3))  # as the tables print them
    distinct = {v for row in z for v in row if v is not None}
    ends = color_range(sorted(distinct), value)
    fig = go.Figure(go.Heatmap(z=z, x=xs, y=ys, colorscale="Viridis", colorbar=dict(title=value),
                               zmin=ends[0] if ends else None, zmax=ends[1] if ends else None,
                               showscale=len(distinct) > 1,  # one value: a colour bar's range means nothing
                               text=[["" if v is None else cell(v) for v in row] for row in z],
                               texttemplate="%{text}", hoverongaps=False,
                               hovertemplate="observation %{x} · reflection %{y}: %{z:.3f}<extra></extra>"))
    title = f"{value} by thresholds" + (f" · {settings}" if settings else "")
    fig.update_layout(title=_esc(title), height=380, margin=dict(l=40, r=20, t=50, b=40))
    fig.update_xaxes(type="category", title="observation threshold", categoryorder="array", categoryarray=xs)
    fig.update_yaxes(type="category", title="reflection threshold", categoryorder="array", categoryarray=ys)
    return _fit(fig)


def wrap(text: object, width: int = 14) -> str:
    """``text`` escaped and broken into lines of about ``width`` characters (``<br>``), for axis
    labels that a narrow chart would otherwise tilt and cut."""
    lines: list[str] = []
    for word in str(text).split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(_esc(line) for line in lines)


def funnel_chart(table: pd.DataFrame) -> go.Figure:
    """The loss funnel: probes reaching each stage (rows of ``table``), one bar group per configuration.
    Stage names wrap on level lines; the counts print over the bars only for up to three groups (more
    printed over each other: the table under the chart has them)."""
    fig = go.Figure()
    palette = ["#0984E3", "#E17055", "#00B894", "#6C5CE7", "#FDCB6E", "#636E72"]
    if len(table.columns) > len(palette):  # (8 configurations: two pairs of bars looked alike)
        import plotly.colors

        palette = plotly.colors.qualitative.Dark24
    stages = [wrap(v) for v in table.index]
    few = len(table.columns) <= 3
    for i, label in enumerate(table.columns):
        fig.add_bar(x=stages, y=table[label].tolist(), name=_esc(label),
                    text=table[label].tolist() if few else None, textposition="outside" if few else "none",
                    cliponaxis=False, marker_color=palette[i % len(palette)],
                    hovertemplate="%{x}: %{y} probes<extra>" + _esc(label) + "</extra>")
    fig.update_layout(title="Loss funnel: probes reaching each stage", barmode="group",
                      yaxis_title="probes", height=400, margin=dict(l=40, r=20, t=50, b=40),
                      legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(type="category", tickangle=0)
    return _fit(fig)


def share_y(*figures: go.Figure, top: float) -> None:
    """Put side-by-side figures on one y scale (0 to ``top``)."""
    for figure in figures:
        figure.update_yaxes(range=[0, top])
