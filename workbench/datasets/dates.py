"""One date parser for every format: the date-times users' files actually hold.

* ISO 8601: ``2024-05-08T13:56:00Z``, ``2024-05-08 13:56``, ``2024-05-08`` (the project's format,
  OpenAI exports, MemoryBank days);
* LoCoMo: ``1:56 pm on 8 May, 2023``;
* LoCoMo variants (REALTALK): ``08.05.2023, 13:56:00`` (day first; seconds optional);
* LongMemEval: ``2023/05/08 (Mon) 13:56`` (the weekday is optional; one that contradicts the date
  is an error: one of the two is mistyped);
* BEAM time anchors: ``March-15-2024``, ``Mar-15-2024``.

* Unix time, a number: seconds (ChatGPT exports' ``create_time``), or milliseconds when it is
  above 10^11 (JavaScript's ``Date.now()``; 10^11 seconds is the year 5138).

A value without an offset is read as UTC. Anything else is a :class:`DatasetError` naming the
file, the record, the field and the value.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from .base import DatasetError

_MONTHS = {name: number for number, names in enumerate(
    [("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
     ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
     ("october", "oct"), ("november", "nov"), ("december", "dec")], start=1) for name in names}

_LOCOMO = re.compile(r"(\d{1,2}):(\d{2})\s*([ap])\.?m\.?\s+on\s+(\d{1,2})\s+([a-z]+)\.?,?\s+(\d{4})", re.I)
_DOTTED = re.compile(r"(\d{1,2})\.(\d{1,2})\.(\d{4}),?\s+(\d{1,2}):(\d{2})(?::(\d{2}))?")
_SLASHED = re.compile(r"(\d{4})/(\d{1,2})/(\d{1,2})(?:\s*\(\s*([a-z]+)\.?\s*\))?(?:\s+(\d{1,2}):(\d{2})(?::(\d{2}))?)?",
                      re.I)
_WEEKDAYS = {name: number for number, names in enumerate(
    [("monday", "mon"), ("tuesday", "tue", "tues"), ("wednesday", "wed"), ("thursday", "thu", "thur", "thurs"),
     ("friday", "fri"), ("saturday", "sat"), ("sunday", "sun")]) for name in names}


class _Contradiction(ValueError):
    """A date-time whose parts disagree (its weekday and its date): said as it is, not as unrecognised."""
_ANCHOR = re.compile(r"([a-z]+)-(\d{1,2})-(\d{4})", re.I)

UNIX_MILLISECONDS = 10**11  # a Unix time above this is in milliseconds

EXPECTED = ("ISO 8601 ('2023-05-08T13:56:00Z'), LoCoMo's '1:56 pm on 8 May, 2023', "
            "'08.05.2023, 13:56:00' or LongMemEval's '2023/05/08 (Mon) 13:56'")


def _match(text: str) -> datetime | None:
    """The parsed value, or ``None`` when no known form matches. May raise ``ValueError`` for a
    known form with impossible parts (month 13)."""
    if m := _LOCOMO.fullmatch(text):
        hour, minute, half, day, month, year = m.groups()
        if month.lower() not in _MONTHS or not 1 <= int(hour) <= 12:
            raise ValueError("no such month or hour")
        hour_24 = int(hour) % 12 + (12 if half.lower() == "p" else 0)
        return datetime(int(year), _MONTHS[month.lower()], int(day), hour_24, int(minute))
    if m := _DOTTED.fullmatch(text):
        day, month, year, hour, minute, second = m.groups()
        return datetime(int(year), int(month), int(day), int(hour), int(minute), int(second or 0))
    if m := _SLASHED.fullmatch(text):
        year, month, day, weekday, hour, minute, second = m.groups()
        parsed = datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0))
        if weekday is not None and _WEEKDAYS.get(weekday.lower()) != parsed.weekday():
            said = "is no weekday" if weekday.lower() not in _WEEKDAYS else "contradicts the date"
            raise _Contradiction(f"({weekday}) {said}: {parsed:%Y-%m-%d} is a {parsed:%A}")
        return parsed
    if m := _ANCHOR.fullmatch(text):
        month, day, year = m.groups()
        if month.lower() not in _MONTHS:
            return None
        return datetime(int(year), _MONTHS[month.lower()], int(day))
    if text[:4].isdigit():
        return datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    return None


def parse_datetime(value: Any, file: str | Path, record: str, field: str | None) -> datetime:
    """Parse a dataset date-time in any of the known forms (timezone-aware; UTC when none given)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value / 1000 if abs(value) > UNIX_MILLISECONDS else value, tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise DatasetError(file, record, field, f"Unix time {value!r} is out of range") from None
    if not isinstance(value, str):
        raise DatasetError(file, record, field, f"expected a date-time string or Unix time, got {type(value).__name__}")
    try:
        parsed = _match(value.strip())
    except _Contradiction as exc:
        raise DatasetError(file, record, field, f"date-time {value!r}: {exc}") from None
    except (ValueError, OverflowError):
        parsed = None
    if parsed is None:
        digits = value.strip()
        if digits.isascii() and digits.isdigit() and len(digits) >= 9:  # (a Unix time as text; "2024" is a year)
            raise DatasetError(file, record, field, f"{value!r} looks like a Unix time written as text: write it as a "
                               f"JSON number ({value.strip()}, no quotes), or as a date-time: {EXPECTED}")
        raise DatasetError(file, record, field, f"unrecognised date-time {value!r}; expected {EXPECTED}, "
                           "or a Unix time as a JSON number")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def try_parse_datetime(value: Any, *, numbers: bool = False) -> datetime | None:
    """:func:`parse_datetime` for optional values: ``None`` instead of an error, and for a number
    unless ``numbers`` (Unix time) is asked for (a BEAM anchor is a date string, never a number)."""
    if isinstance(value, (int, float)) and not numbers:
        return None
    try:
        return parse_datetime(value, "", "", None)
    except DatasetError:
        return None


def later(moment: datetime, delta: timedelta, file: str | Path, record: str, field: str | None) -> datetime:
    """``moment + delta``, the time a loader gives a message after a dated one; a ``DatasetError``
    naming the record when it would pass the end of year 9999 (it was an ``OverflowError``)."""
    try:
        return moment + delta
    except OverflowError as exc:
        raise DatasetError(file, record, field, f"dated {moment:%Y-%m-%d %H:%M:%S}: too close to the end of year 9999 "
                           "to date the messages after it") from exc
