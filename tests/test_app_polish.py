"""Polish at a narrow page: button rows that wrap instead of cutting labels, experiment point labels
that keep off each other's error bars, heatmap colours that do not exaggerate, and an interrupted
run told as one (grammatical, not an error, its compression the chart's)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from apptest import app
from streamlit.testing.v1 import AppTest

from workbench import charts
from workbench.runstore import RunStore


def parent_of(at: AppTest, key: str):
    """The block that holds the widget with ``key``."""
    def walk(node):
        for child in getattr(node, "children", {}).values():
            if getattr(child, "key", None) == key:
                return node
            found = walk(child)
            if found is not None:
                return found
        return None

    found = walk(at._tree[0])
    assert found is not None, key
    return found


def assert_one_wrapping_row(at: AppTest, *keys: str) -> None:
    """The widgets share one horizontal block that wraps: never equal columns, which cut a label to
    "Open in the expl…" on a 900 px page."""
    rows = [parent_of(at, key) for key in keys]
    assert all(row is rows[0] for row in rows), keys
    flex = rows[0].proto.flex_container
    assert type(rows[0]).__name__ == "Block" and flex.direction == flex.HORIZONTAL and flex.wrap


def test_presentation_buttons_sit_in_one_row_that_wraps(db: Path) -> None:
    at = app("present")
    assert_one_wrapping_row(at, "pres_back", "pres_next", "pres_jump")
    assert at.button(key="pres_jump").label == "Jump to next compaction »"
    at.button(key="pres_next").click().run()
    assert not at.exception and at.subheader[0].value.startswith("Step 1:")


def test_runs_actions_sit_in_one_row_that_wraps(db: Path) -> None:
    at = app("runs")
    run_id = RunStore(db).runs().run_id[0]
    assert_one_wrapping_row(at, f"runs_open_{run_id}", "runs_export", f"runs_confirm_{run_id}", f"runs_delete_{run_id}")


# -- the experiment scatter's point labels ---------------------------------------------------------

def points(compression, retention, labels) -> pd.DataFrame:
    return pd.DataFrame({"label": labels, "compression": compression, "retention": retention,
                         "low": [r - 0.03 for r in retention], "high": [r + 0.03 for r in retention]})


def test_crowded_points_label_beside_or_under_their_markers_never_over_a_neighbour() -> None:
    # The Tune chart a user saw at 900 px: obs 300, 200 and 500 within 0.1x of each other, obs 1000 apart;
    # "obs 200" centred over its point sat on obs 500's error bar, beside "obs 300" and "obs 500".
    crowd = points([6.76, 6.68, 6.78, 7.2], [0.700, 0.694, 0.705, 0.689], ["obs 200", "obs 300", "obs 500", "obs 1000"])
    marks = charts.experiment_pareto_chart(crowd).data[-1]
    positions = dict(zip(crowd.label, marks.textposition))
    assert positions == {"obs 300": "middle left", "obs 200": "bottom center", "obs 500": "middle right",
                         "obs 1000": "top left"}
    assert marks.cliponaxis is False and marks.textfont.shadow == "auto"  # a halo where a label crosses a bar
    # The x axis leaves room for "obs 300" to the left of the leftmost point (it ran over the y axis).
    low, high = charts.experiment_pareto_chart(crowd).layout.xaxis.range
    assert low < 6.68 - 0.15 * (7.2 - 6.68) and high > 7.2  # (more than the 5% pad either side)
    # Points far apart keep their labels above them, the edge ones pointing inwards.
    apart = points([2.0, 3.0, 4.0], [0.8, 0.7, 0.6], ["a", "b", "c"])
    assert list(charts.experiment_pareto_chart(apart).data[-1].textposition) == ["top right", "top center", "top left"]
    # Two points on top of each other: one label each side, never both in one place.
    assert sorted(charts.label_positions(pd.Series([5.0, 5.0]), pd.Series([0.6, 0.7]))) == ["middle left",
                                                                                             "middle right"]


def test_a_crowd_at_the_right_edge_keeps_its_labels_inside() -> None:
    crowd = points([3.1, 3.3, 3.33], [0.80, 0.79, 0.75], ["obs 200", "obs 500", "obs 1000"])
    figure = charts.experiment_pareto_chart(crowd)
    assert list(figure.data[-1].textposition) == ["top right", "middle left", "middle right"]
    # "obs 1000" to the right of the rightmost point: the axis reaches past where it ends.
    assert figure.layout.xaxis.range[1] > 3.33 + 0.1 * (3.33 - 3.1)


def test_a_crowd_whose_labels_would_overlap_gets_a_stack_of_labels_with_leader_lines() -> None:
    """Found in Chromium: six configurations within 0.2x and 0.01 of retention; two labels on one
    side of the crowd a pixel apart ("obs 400 · window 6" over "obs 400 · window 4")."""
    labels = ["obs 100 · window 6", "obs 100 · window 4", "obs 200 · window 6", "obs 200 · window 4",
              "obs 300 · window 6", "obs 300 · window 4", "obs 400 · window 6", "obs 400 · window 4"]
    crowd = points([5.47, 5.53, 7.09, 7.13, 7.15, 7.13, 7.17, 7.29], [0.716, 0.714, 0.691, 0.689, 0.686, 0.683,
                                                                      0.690, 0.688], labels)
    figure = charts.experiment_pareto_chart(crowd)
    marks = figure.data[-1]
    stacked = {a.text: a for a in figure.layout.annotations}
    assert sorted(stacked) == sorted(labels[2:])  # the crowd that collided; obs 100's two fit beside their points
    assert [t for t, label in zip(marks.text, labels) if t] == labels[:2]
    low, high = figure.layout.yaxis.range
    line = charts._LINE_PX * (high - low) / charts._PARETO_PLOT_PX
    levels = sorted(a.ay for a in stacked.values())
    assert all(b - a >= line - 1e-9 for a, b in zip(levels, levels[1:])) and low < levels[0] and levels[-1] < high
    for label, note in stacked.items():  # each points at its own configuration
        row = crowd[crowd.label == label].iloc[0]
        assert (note.x, note.y, note.showarrow) == (row.compression, row.retention, True)
    # the stack's order is the points' (the highest retention on top): no leader lines cross needlessly
    assert [a.text for a in sorted(stacked.values(), key=lambda a: -a.ay)] == \
        list(crowd[crowd.label.isin(stacked)].sort_values("retention", ascending=False).label)
    assert list(marks.hovertext) == labels  # the hover still names every point
    # Fifteen configurations (the most a user tried): every label drawn once, stacks inside the axis.
    many = points([6 + 0.02 * i for i in range(15)], [0.70 + 0.001 * (i % 4) for i in range(15)],
                  [f"obs {100 * (i + 1)}" for i in range(15)])
    figure = charts.experiment_pareto_chart(many)
    drawn = [t for t in figure.data[-1].text if t] + [a.text for a in figure.layout.annotations]
    assert sorted(drawn) == sorted(many.label)
    low, high = figure.layout.yaxis.range
    assert all(low < a.ay < high for a in figure.layout.annotations)


def test_the_retention_axis_never_runs_past_what_a_retention_can_be() -> None:
    """Found by a newcomer: Tune on an experiment of one configuration at retention 1.0 drew the
    axis from 0 to 2 (plotly's own range for one point)."""
    one = points([1.23], [1.0], ["obs 600"]).assign(low=[1.0], high=[1.0])
    low, high = charts.experiment_pareto_chart(one).layout.yaxis.range
    assert 0.85 < low < 1.0 < high <= 1.01
    low, high = charts.experiment_pareto_chart(points([5.0], [0.0], ["a"]).assign(low=[0.0], high=[0.0])
                                               ).layout.yaxis.range
    assert -0.01 <= low < 0.0 < high < 0.15
    runs = pd.DataFrame({"compression": [1.23], "retention": [1.0], "observation_threshold": [600],
                         "reflection_threshold": [2000], "window": [10], "run_id": ["r"]})
    low, high = charts.pareto_chart(runs).layout.yaxis.range  # (the runs' scatter alike)
    assert 0.85 < low < 1.0 < high <= 1.01


# -- heatmap colours -------------------------------------------------------------------------------

def cells(values, value) -> pd.DataFrame:
    return pd.DataFrame({"observation_threshold": [200, 300, 500, 1000][:len(values)],
                         "reflection_threshold": [2000] * len(values), value: values})


def test_heatmap_colours_do_not_exaggerate_tiny_differences() -> None:
    retention = charts.heatmap(cells([0.700, 0.694, 0.705, 0.689], "retention"), "retention").data[0]
    assert (retention.zmin, retention.zmax) == (0.0, 1.0)  # a share: 0.705 vs 0.689 are near in colour
    assert list(retention.text[0]) == ["0.700", "0.694", "0.705", "0.689"]  # the cells still say their figure
    compression = charts.heatmap(cells([6.8, 6.7, 6.8, 7.2], "compression"), "compression").data[0]
    assert compression.zmin == 1.0 and compression.zmax == 7.2  # from 1x (no compression)
    assert list(compression.text[0]) == ["6.8x", "6.7x", "6.8x", "7.2x"]
    small = charts.heatmap(cells([1.10, 1.12], "compression"), "compression").data[0]
    assert (small.zmin, small.zmax) == (1.0, 2.0)  # 1.10x vs 1.12x: not purple vs yellow either
    # Any other figure spans at least a fifth of its size, centred on the cells.
    assert charts.color_range([100.0, 101.0], "cost") == pytest.approx((90.4, 110.6))
    assert charts.color_range([0.0, 50.0], "cost") == (0.0, 50.0)
    assert charts.color_range([], "retention") is None


# -- an interrupted run in the explorer and the presentation --------------------------------------

def interrupt(db: Path) -> str:
    """The demo run, stored as a Ctrl-C leaves one: interrupted, no whole-run compression."""
    with RunStore(db) as store:
        run_id = store.runs().run_id[0]
        store.set_status(run_id, "interrupted",
                         f"stopped before the end; resume with: python -m workbench replay --resume {run_id}")
        store.update_run(run_id, compression=None, retention=None)
    return run_id


def test_an_interrupted_run_reads_as_one_in_the_explorer(db: Path) -> None:
    at = app("explorer")
    run_id = interrupt(db)
    at.run()
    assert not at.exception
    said = [w.value.replace("\\", "") for w in at.warning if "This run" in w.value]
    assert said and said[0].startswith("**This run was interrupted at step "), said  # not "This run interrupted"
    assert "Stopped before the end; resume with: python -m workbench replay --resume " + run_id in said[0]
    assert not any("This run" in e.value or "Error:" in e.value for e in at.error)  # an interrupt is no error
    steps = RunStore(db).steps(run_id)
    last = steps.iloc[-1]
    [metric] = [m for m in at.metric if m.label == "Compression (partial)"]
    # The figure the volumes chart marks at the last read, never "–" beside a chart saying 1.3x.
    assert metric.value == f"{last.history_tokens / last.context_tokens:.1f}x"
    assert f"step {int(last.step)}" in metric.help


def test_an_interrupted_run_reads_as_one_in_the_presentation(db: Path) -> None:
    at = app("present")
    run_id = interrupt(db)
    at.sidebar.selectbox(key="pres_run").set_value(run_id).run()
    assert not at.exception
    said = [w.value for w in at.warning if "Not a finished run" in w.value]
    assert said and "it was interrupted at step " in said[0], said
    assert not any("Not a finished run" in e.value for e in at.error)
    [metric] = [m for m in at.metric if m.label == "Compression (partial)"]
    assert metric.value.endswith("x") and metric.value != "–"


def test_the_narration_counts_notes_not_date_headings() -> None:
    from workbench.analysis import note_lines

    assert note_lines("8 May 2023\n- Caroline: I adopted a greyhound.") == 1  # "wrote 2 lines" before
    assert note_lines("8 May 2023\n- a\n- b\n9 May 2023\n- c") == 3
    assert note_lines("a plain reflection\nin two lines") == 2  # no bullets: its lines


def test_an_unfinished_run_is_told_in_a_sentence_with_its_last_read_compression() -> None:
    from workbench.app_data import last_read_compression, state_phrase

    run = {"status": "interrupted", "steps": 11, "planned_steps": 208, "compression": float("nan")}
    steps = pd.DataFrame({"step": [9, 10], "history_tokens": [900, 1300], "context_tokens": [700, 1000]})
    assert state_phrase(run) == "was interrupted at step 11 of 208"
    assert last_read_compression(run, steps) == 1.3
    assert last_read_compression({**run, "compression": 2.0}, steps) is None  # a stored figure stands
    assert last_read_compression({**run, "status": "completed"}, steps) is None
    assert state_phrase({**run, "status": "failed"}).startswith("failed at step 11")


def test_addresses_in_banners_copy_as_written_and_never_link() -> None:
    """A web or e-mail address in text shown through ui.plain is a code span (GFM links nothing
    there), so what a reader copies is the address itself, with no invisible word joiner in it."""
    from workbench.ui import WORD_JOINER, plain

    text = "cannot reach http://localhost:8000/v1/chat?x=a_b*c; write to ops@example.org or see www.example.org."
    out = plain(text)
    assert "`http://localhost:8000/v1/chat?x=a_b*c`" in out  # the address whole, unescaped
    assert "`ops@example.org`" in out and "`www.example.org`" in out  # (the final full stop is not in it)
    assert WORD_JOINER not in out
    outside = re.sub(r"`[^`]*`", "", out)
    assert "\\;" in outside and "\\." in outside  # the rest still escaped
    # a backtick ends an address (it would end the code span), the rest escaped
    assert plain("http://x.example/`a``b") == "`http://x.example/`\\`a\\`\\`b"
    # what is no address still cannot become one: a word joiner breaks GFM's match
    bare = plain("http:// and user@localhost")
    assert "`" not in bare and bare.count(WORD_JOINER) == 2
    # a backtick next to an address stays out of it; a parenthesis it opened closes it (GFM's rule)
    assert "`http://a`" in plain("x `http://a` y") and "``" not in plain("x `http://a` y").replace("\\`", "")
    assert "`https://example.com/a_(b)`" in plain("see https://example.com/a_(b) now")
    assert "`https://example.com/a`\\)" in plain("see (https://example.com/a) now")
