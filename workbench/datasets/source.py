"""A dataset path opened once for detection and loading: the document is parsed at most once,
and a JSON list (or JSON Lines) can be read element by element without holding the whole file.

Detection looks at :meth:`Source.first` (the first element of a list, the first line of JSON
Lines, or the whole object) and never parses a large list to its end.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import DatasetError

LINE_SUFFIXES = (".jsonl", ".ndjson")
CHUNK = 1 << 22  # bytes read at a time when streaming a list (grows for larger elements)
_WHITESPACE = " \t\n\r"
_SPACE = re.compile(r"[ \t\n\r]*")
_NUMBER_START = frozenset("-0123456789")
_NUMBER_PART = frozenset("0123456789+-.eE")
_NOTHING = object()


@dataclass(frozen=True, slots=True)
class Element:
    """One element of a JSON list (or one line of JSON Lines) and where its bytes are."""

    index: int
    value: Any
    offset: int
    length: int


def _invalid_json(file: Path, exc: json.JSONDecodeError, line_base: int = 1, column_base: int = 1) -> DatasetError:
    """The error at ``exc``'s place, for text that starts at ``line_base``:``column_base`` of the file."""
    column = exc.colno + (column_base - 1 if exc.lineno == 1 else 0)
    reason = exc.msg + (f" column {column}" if exc.msg.endswith(" at") else "")  # "Unterminated string starting at"
    if exc.msg == "Extra data" and exc.colno == 1 and file.suffix.lower() == ".json":
        # a second value at the start of a line: JSON Lines (a fine-tuning file, say) named .json
        reason += " (one JSON value per line is JSON Lines: name the file .jsonl)"
    return DatasetError(file, f"line {line_base + exc.lineno - 1} column {column}", None, f"invalid JSON: {reason}")


def _too_long(exc: ValueError) -> bool:
    """Whether ``exc`` is Python's refusal of an integer of more than 4,300 digits (``sys.set_int_max_str_digits``)."""
    return "integer string conversion" in str(exc)


_TOO_LONG = (f"a number of more than {sys.get_int_max_str_digits():,} digits (Python reads no longer integer; "
             "PYTHONINTMAXSTRDIGITS sets the limit)")


def _unreadable(file: Path, exc: OSError) -> DatasetError:
    return DatasetError(file, "file", None, f"cannot be read: {exc.strerror or exc}")


def load_json(file: Path) -> Any:
    """A whole JSON document."""
    try:
        with file.open("rb") as handle:
            return json.load(handle)
    except UnicodeDecodeError as exc:
        raise DatasetError(file, f"byte {exc.start}", None, "not valid UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise _invalid_json(file, exc) from exc
    except RecursionError as exc:
        raise DatasetError(file, "top level", None, "nested too deeply") from exc
    except ValueError as exc:
        if not _too_long(exc):
            raise
        raise DatasetError(file, "top level", None, f"invalid JSON: {_TOO_LONG}") from exc
    except OSError as exc:
        raise _unreadable(file, exc) from exc


def json_lines(file: Path) -> Iterator[Element]:
    """Each non-empty line of a JSON Lines file, streaming; ``index`` is the line number."""
    offset = 0
    try:
        with file.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                start, offset = offset, offset + len(raw)
                try:
                    line = raw.decode("utf-8").strip()
                    if number == 1:
                        line = line.removeprefix("\ufeff").strip()  # a byte-order mark (Windows editors)
                except UnicodeDecodeError as exc:
                    raise DatasetError(file, f"line {number}", None, "not valid UTF-8") from exc
                if not line:
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise _invalid_json(file, exc, line_base=number) from exc
                except RecursionError as exc:
                    raise DatasetError(file, f"line {number}", None, "nested too deeply") from exc
                except ValueError as exc:
                    if not _too_long(exc):
                        raise
                    raise DatasetError(file, f"line {number}", None, f"invalid JSON: {_TOO_LONG}") from exc
                yield Element(number, value, start, len(raw))
    except OSError as exc:
        raise _unreadable(file, exc) from exc


def _incomplete(exc: json.JSONDecodeError, text: str) -> bool:
    """Whether a decode error may only mean that the text stops early (more is to be read)."""
    return exc.msg.startswith("Unterminated string") or exc.pos >= len(text) - 8


def json_array(file: Path) -> Iterator[Element]:
    """The elements of a top-level JSON list, parsed one at a time from a bounded buffer
    (stdlib ``raw_decode``), each with its byte offset and length for a later :func:`read_at`."""
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    try:
        handle = file.open("rb")
    except OSError as exc:
        raise _unreadable(file, exc) from exc
    with handle:
        buf = ""  # decoded text; buf[pos:] is not consumed yet
        pos = 0
        offset = 0  # byte offset of buf[pos] in the file
        line_base, column_base = 1, 1  # line and column of buf[0]
        read_bytes = 0
        eof = False
        ascii_only = True  # everything read so far is ASCII: characters are bytes

        def fill(at_least: int) -> None:
            nonlocal buf, pos, eof, read_bytes, ascii_only, line_base, column_base
            dropped = buf[:pos]
            newlines = dropped.count("\n")
            line_base += newlines
            column_base = len(dropped) - dropped.rfind("\n") if newlines else column_base + len(dropped)
            data = handle.read(max(CHUNK, at_least))
            try:
                text = utf8.decode(data, final=not data)
            except UnicodeDecodeError as exc:
                raise DatasetError(file, f"byte {read_bytes + exc.start}", None, "not valid UTF-8") from exc
            read_bytes += len(data)
            eof = not data
            ascii_only = ascii_only and text.isascii()
            buf, pos = buf[pos:] + text, 0

        def advance(to: int) -> None:
            nonlocal pos, offset
            offset += to - pos if ascii_only else len(buf[pos:to].encode("utf-8"))
            pos = to

        def skip_space() -> bool:  # False at the end of the file
            while True:
                advance(_SPACE.match(buf, pos).end())
                if pos < len(buf):
                    return True
                if eof:
                    return False
                fill(0)

        def where() -> str:
            newlines = buf.count("\n", 0, pos)
            column = pos - buf.rfind("\n", 0, pos) if newlines else column_base + pos
            return f"line {line_base + newlines} column {column}"

        try:
            while not buf and not eof:
                fill(0)
            if buf.startswith("\ufeff"):
                pos, offset = 1, 3
            if not skip_space() or buf[pos] != "[":
                raise DatasetError(file, "top level", None, "expected a JSON list")
            advance(pos + 1)
            index = 0
            while True:
                if not skip_space():
                    raise DatasetError(file, where(), None, "invalid JSON: the list is not closed")
                if buf[pos] == "]":
                    advance(pos + 1)
                    if skip_space():
                        raise DatasetError(file, where(), None, "invalid JSON: extra data after the list")
                    return
                if index:
                    if buf[pos] != ",":
                        raise DatasetError(file, where(), None, "invalid JSON: expecting ',' delimiter")
                    advance(pos + 1)
                    if not skip_space():
                        raise DatasetError(file, where(), None, "invalid JSON: the list is not closed")
                while True:
                    try:
                        value, end = decoder.raw_decode(buf, pos)
                        if not eof and buf[pos] in _NUMBER_START and (end == len(buf) or buf[end] in _NUMBER_PART):
                            raise json.JSONDecodeError("the number may go on", buf, end)  # read more
                        break
                    except json.JSONDecodeError as exc:
                        if eof or not _incomplete(exc, buf):
                            raise _invalid_json(file, exc, line_base, column_base) from exc
                        fill(len(buf) - pos)  # at least as much again: geometric growth for huge elements
                start = offset
                advance(end)
                yield Element(index, value, start, offset - start)
                index += 1
        except RecursionError as exc:
            raise DatasetError(file, where(), None, "nested too deeply") from exc
        except ValueError as exc:
            if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)) or not _too_long(exc):
                raise
            raise DatasetError(file, where(), None, f"invalid JSON: {_TOO_LONG}") from exc
        except OSError as exc:
            raise _unreadable(file, exc) from exc


def read_at(file: Path, offset: int, length: int) -> Any:
    """The JSON value stored at ``offset`` (``length`` bytes), e.g. one element of a list."""
    try:
        with file.open("rb") as handle:
            handle.seek(offset)
            data = handle.read(length)
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # (JSON or UTF-8 errors, a too long number)
        raise DatasetError(file, f"byte {offset}", None, "changed since it was indexed; open it again") from exc
    except OSError as exc:
        raise _unreadable(file, exc) from exc


class Source:
    """A dataset path: a file (JSON or JSON Lines) or a folder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.is_dir = self.path.is_dir()
        self.lines = not self.is_dir and self.path.suffix.lower() in LINE_SUFFIXES
        self._document: Any = _NOTHING
        self._first: Any = _NOTHING
        self._top: str | None = None

    def __repr__(self) -> str:
        return f"Source({str(self.path)!r})"

    def top(self) -> str:
        """The first character of a JSON file past whitespace (``""`` when empty or a folder)."""
        if self._top is None:
            self._top = ""
            if not self.is_dir:
                try:
                    with self.path.open("rb") as handle:
                        while chunk := handle.read(65536):
                            text = chunk.decode("utf-8", errors="replace").lstrip("\ufeff" + _WHITESPACE)
                            if text:
                                self._top = text[0]
                                break
                except OSError as exc:
                    raise _unreadable(self.path, exc) from exc
        return self._top

    def document(self) -> Any:
        """The whole JSON document, parsed once."""
        if self._document is _NOTHING:
            if self.is_dir:
                raise DatasetError(self.path, "folder", None, "is a folder, not a JSON file")
            self._document = load_json(self.path)
        return self._document

    def first(self) -> Any:
        """What detection looks at: the first element of a list or JSON Lines file, else the
        document. ``None`` for an empty list or file."""
        if self._first is _NOTHING:
            if self.is_dir:
                self._first = None
            elif self.lines:
                self._first = next((e.value for e in json_lines(self.path)), None)
            elif self._document is not _NOTHING or self.top() != "[":
                document = self.document()
                self._first = (document[0] if document else None) if isinstance(document, list) else document
            else:
                self._first = next((e.value for e in json_array(self.path)), None)
        return self._first

    def elements(self) -> Iterator[Element]:
        """Every element, streaming: of a list, of JSON Lines; a single object is one element."""
        if self.lines:
            yield from json_lines(self.path)
        elif self._document is not _NOTHING and isinstance(self._document, list):
            for index, value in enumerate(self._document):
                yield Element(index, value, -1, -1)
        elif self.top() == "[":
            yield from json_array(self.path)
        else:
            yield Element(0, self.document(), -1, -1)
