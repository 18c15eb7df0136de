"""Figures as people read them, for the CLI and the app alike: never ``nan``, ``$nan`` or ``nanx``.

A missing value (``None``, NaN, a figure a failed run never reached) is shown as an en dash.
Decimals round half up, as Plotly's number formats (JavaScript's ``toFixed``) do, so a figure in a
table and the same figure on a chart read alike (Python alone would print 5.25 as ``5.2``).
"""

from __future__ import annotations

import math
import numbers
import os
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Any

MISSING = "–"


def fixed(value: float, digits: int, *, separators: bool = False) -> str:
    """``value`` to ``digits`` decimals, rounding half up (away from zero) on its exact binary
    value, like JavaScript's ``toFixed``: ``fixed(5.25, 1) == "5.3"``, ``fixed(0.125, 2) == "0.13"``."""
    number = float(value)
    if not math.isfinite(number):  # inf, nan: as Python writes them
        return f"{number:,.{digits}f}" if separators else f"{number:.{digits}f}"
    with localcontext() as context:
        context.prec = 400  # enough for any float's exact value (the default 28 raised on 1e27)
        exact = Decimal(number).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    exact = exact.copy_abs() if exact.is_zero() else exact  # never "-0.000"
    return f"{exact:,.{digits}f}" if separators else f"{exact:.{digits}f}"


def missing(value: Any) -> bool:
    """``None``, NaN, and pandas' missing markers (``pd.NA``, ``NaT``)."""
    if value is None:
        return True
    if type(value).__name__ in ("NAType", "NaTType"):
        return True
    try:
        return isinstance(value, numbers.Real) and math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def number(value: Any, digits: int = 3) -> str:
    """A float to ``digits`` decimals, an integer with thousands separators, else ``str``."""
    if missing(value):
        return MISSING
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        return fixed(value, digits)
    return str(value)


def display(value: Any) -> str:
    """A figure as people read it: floats to 3 decimals (5 below 0.01), counts with separators."""
    if missing(value):
        return MISSING
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        value = float(value)
        if value.is_integer() and abs(value) >= 1000:
            return f"{int(value):,}"
        return fixed(value, 5) if 0 < abs(value) < 0.01 else fixed(value, 3)
    return str(value)


def typed(value: float) -> str:
    """A number someone typed, as typed: ``2.5``, ``0``, ``50,000`` (not ``2.500``: a form's
    number fields hold real numbers, and its errors quote them)."""
    value = float(value)
    return f"{int(value):,}" if value.is_integer() else f"{value:,.15g}"


def ratio(value: Any, *, partial: bool = False) -> str:
    """A compression figure: ``3.9x``; ``3.9x (partial)`` for a run that did not finish."""
    if missing(value):
        return MISSING
    return fixed(value, 1) + "x" + (" (partial)" if partial else "")


def tokens(value: Any) -> str:
    """A token volume (possibly a mean) in whole tokens: ``1,234``."""
    return MISSING if missing(value) else fixed(value, 0, separators=True)


def money(value: Any, digits: int = 4) -> str:
    """``$0`` for nothing spent (the offline model), cents from a dollar up, else ``digits`` decimals
    (calls cost fractions of a cent); less than the last of those digits shows: ``<$0.01``."""
    if missing(value):
        return MISSING
    amount = float(value)
    if amount == 0:
        return "$0"
    if 0 < amount < 0.5 * 10 ** -digits:  # ("$0.00" for a paid call read as free)
        return f"<${fixed(10 ** -digits, digits)}"
    return "$" + (fixed(amount, 2, separators=True) if abs(amount) >= 1 else fixed(amount, digits))


def about_money(value: Any, digits: int = 4) -> str:
    """An estimate: ``about $0.42``, or ``<$0.01`` below the digits shown (never "about <$0.01")."""
    text = money(value, digits)
    return text if text.startswith("<") else f"about {text}"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 run``, ``2 runs``, ``1,204 probes``; ``plural`` for nouns that do not take an s."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


def share(value: Any, digits: int = 3) -> str:
    """A retention or score: 3 decimals everywhere (tables, headers, labels) so one figure reads alike."""
    return MISSING if missing(value) else fixed(value, digits)


def percent_of(value: Any) -> str:
    """A retention for stakeholders, as a percentage with the same digits as :func:`share`
    (0.705 is "70.5%": "70%" beside the explorer's 0.705 read as another figure)."""
    return MISSING if missing(value) else f"{100 * float(value):.1f}%"


def default_run_label(config: dict[str, Any]) -> str | None:
    """The label a replay gets when none is given, from its configuration as stored (``None`` when
    that lacks a setting): ``omem/extractive / omem/extractive · obs 1000 · ref 2000 · window 10 ·
    v2/v1``. Plain string work, so listing runs never loads the library."""
    try:
        return (f"{config['observer']} / {config.get('reflector') or 'none'} · "
                f"obs {config['observation_threshold']} · ref {config['reflection_threshold']} · "
                f"window {config['last_messages']} · "
                f"{config['observer_prompt']['version']}/{config['reflector_prompt']['version']}"
                + (f" · max backlog {config['max_backlog']}" if config.get("max_backlog") else ""))
    except (KeyError, TypeError):
        return None


def short_path(path: str | os.PathLike[str]) -> str:
    """A path as short as it can be and still work from here: relative to the working folder when
    that is shorter and at most one folder up (``datasets/demo.jsonl``, ``../shared/…``), else absolute."""
    absolute = os.path.abspath(path)
    try:
        relative = os.path.relpath(absolute)
    except ValueError:  # another drive (Windows)
        return absolute
    up = relative.split(os.sep).count(os.pardir)
    return relative if up <= 1 and len(relative) < len(absolute) else absolute


def split_list(text: str) -> list[str]:
    """The items of a comma-separated list, stripped; a trailing comma is allowed, an empty item
    between two commas is a ``ValueError`` ("100,,200" is more likely a value left out than a
    typo for "100,200")."""
    items = [part.strip() for part in text.split(",")]
    if not any(items):
        return []
    if not items[-1]:
        items.pop()
    if not all(items):
        raise ValueError(f"an empty value in {text!r}")
    return items


def progress(status: str, steps: Any, planned: Any) -> str:
    """``completed``; ``failed at step 26 of 100``; ``interrupted at step 3 of 100``."""
    if status in ("completed", "running") or missing(steps):
        return status
    total = "" if missing(planned) else f" of {int(planned)}"
    return f"{status} at step {int(steps)}{total}"


def runs_table(frame: Any) -> Any:
    """The runs table for a terminal: status says where a run stopped, figures of a run that did
    not finish are marked partial (retention is only scored on completed runs), no NaN."""
    shown = frame.copy()
    done = shown["status"] == "completed"
    planned = shown["planned_steps"] if "planned_steps" in shown else [None] * len(shown)
    shown["status"] = [progress(s, k, n) for s, k, n in zip(shown["status"], shown["steps"], planned)]
    shown["compression"] = [ratio(v, partial=not d) for v, d in zip(shown["compression"], done)]
    shown["retention"] = [share(v) for v in shown["retention"]]
    shown = shown.drop(columns=[c for c in ("planned_steps",) if c in shown])
    return shown.astype(object).map(lambda v: MISSING if missing(v) else v)


_BIDI_CONTROLS = {0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069}


def terminal_text(text: str) -> str:
    """``text`` safe to print on one terminal line: control characters (a newline, an escape
    sequence) and the bidirectional embedding/override/isolate characters (which reorder the rest
    of the line) written as Python escapes (``\\n``, ``\\u202e``); anything else as it is (an emoji
    with its joiners included). An id holding them scrambled the CLI's summary lines."""
    return "".join(ch.encode("unicode_escape").decode("ascii")
                   if (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 or ord(ch) in _BIDI_CONTROLS) else ch
                   for ch in text)


def whole_text(text: str) -> str:
    """``text`` with each lone surrogate (half an emoji: JSON's ``"\\ud83d"`` alone decodes to
    one) replaced by U+FFFD; a pair left as two code points is joined back. Neither UTF-8 nor
    DuckDB can hold one: dataset text, traces and errors go through this before they are stored."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


__all__ = ["MISSING", "count", "display", "fixed", "missing", "money", "tokens", "number", "progress", "ratio",
           "runs_table", "share", "short_path", "split_list", "whole_text"]


DEFAULT_DB = "runs.duckdb"  # the CLI's run store when neither --db nor $OMEM_DB names one


def cli_command(words: str, db: object) -> str:
    """``python -m workbench <words>``, with ``--db`` unless the run store is the default one and
    ``$OMEM_DB`` names no other, so a hint printed by a command run on another file works when
    pasted as it is (in another shell too)."""
    import shlex

    default = str(db) == DEFAULT_DB and (os.environ.get("OMEM_DB") or DEFAULT_DB) == DEFAULT_DB
    return f"python -m workbench {words}" + ("" if default else f" --db {shlex.quote(str(db))}")


def printable(text: str) -> str:
    """``text`` with what is not valid Unicode shown as escapes (``caf\\xe9.jsonl`` for a file name
    in Latin-1, ``\\ud83d`` for half an emoji): never raises, and can be written anywhere."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # (a lone surrogate outside U+DC80-U+DCFF: not a byte of a file name)
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def not_text(text: str | None) -> bool:
    """Whether ``text`` holds a lone surrogate (what bytes that are not UTF-8 become), which the
    run store (DuckDB) refuses to write."""
    try:
        (text or "").encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
