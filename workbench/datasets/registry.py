"""The formats, in one place: detection order, the CLI's ``--format`` choices (:data:`FORMATS`),
the app's format picker and ``datasets/README.md``'s table all come from :data:`REGISTRY`.

A format is a module with ``NAME``, ``DESCRIPTION`` (one line), ``FOLDER`` (whether a dataset of
it is a folder, e.g. a zip upload), ``sniff(source) -> bool`` and ``load(source) ->
list[Conversation]``. A format whose files hold one conversation per list element (LongMemEval)
also has ``conversations(source)`` (streaming, with byte offsets), ``conversation(value, index,
source)`` and ``ID_KEY``: listing and single-conversation loads then go through a cached index.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from . import beam, index, locomo, longmemeval, memorybank, omem, openai_export, sharegpt
from .base import Conversation, ConversationInfo, ConversationNotFound, DatasetError, ordinal
from .source import Element, Source, read_at


@dataclass(frozen=True)
class DatasetFormat:
    name: str
    description: str  # one line, Markdown
    folder: bool  # a folder format (the path may be the folder or its main file)
    sniff: Callable[[Source], bool]
    load: Callable[[Source], list[Conversation]]
    folder_files: tuple[str, ...] = ()  # the files that mark a folder of this format
    stream: Callable[[Source], Iterator[tuple[Element, Conversation]]] | None = None
    build: Callable[[Any, int, Source], Conversation] | None = None
    id_key: str | None = None

    @property
    def indexed(self) -> bool:
        return self.stream is not None


def _format(module: ModuleType) -> DatasetFormat:
    return DatasetFormat(module.NAME, module.DESCRIPTION, module.FOLDER, module.sniff, module.load,
                         getattr(module, "FOLDER_FILES", ()), getattr(module, "conversations", None),
                         getattr(module, "conversation", None), getattr(module, "ID_KEY", None))


# Detection tries these in order; the first whose sniff says yes wins.
REGISTRY: tuple[DatasetFormat, ...] = tuple(
    _format(m) for m in (omem, locomo, longmemeval, beam, memorybank, openai_export, sharegpt))
FORMATS: tuple[str, ...] = tuple(f.name for f in REGISTRY)
_BY_NAME = {f.name: f for f in REGISTRY}


def get_format(name: str) -> DatasetFormat:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown format {name!r}; choose one of {', '.join(FORMATS)}") from None


_CONTENT: OrderedDict[tuple[str, int, int], tuple[str, ...]] = OrderedDict()  # a few hundred files' formats


def content_formats(path: Path) -> tuple[str, ...]:
    """The formats whose sniff recognises a file's content, in detection order (``()``: none, not
    JSON, blank, a zip, unreadable). Kept per file (path, size, modification time): folder checks
    ask about the same files again and again, and a large JSON object is parsed whole to sniff it."""
    try:
        stat = path.stat()
    except OSError:
        return ()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key in _CONTENT:
        _CONTENT.move_to_end(key)
        return _CONTENT[key]
    found: tuple[str, ...] = ()
    if path.is_file() and not _blank(path) and not _zipped(path) and not _gzipped(path):
        source = Source(path)
        try:
            found = tuple(f.name for f in REGISTRY if f.sniff(source))
        except DatasetError:  # not JSON: no dataset
            found = ()
    _CONTENT[key] = found
    while len(_CONTENT) > 512:
        _CONTENT.popitem(last=False)
    return found


def sniffed(path: Path) -> str | None:
    """The format a file's content is in (``None``: none, or not JSON), as detection would say."""
    return next(iter(content_formats(path)), None)


def _a_dataset_folder(path: Path) -> bool:
    """A folder that reads as a dataset: a folder format's (a BEAM chat, a folder of them,
    MemoryBank's), or one holding a single dataset file (``locomo-dev/`` beside its licence)."""
    if any((path / file).is_file() for f in REGISTRY for file in f.folder_files) or beam.chat_folders(path):
        return True
    return _file_inside(Source(path), None) is not None


def _inside(folder: Path) -> str:
    """What in an unrecognised folder could be the dataset meant (``; give one of these as the
    dataset instead: …``): its JSON files whose content a format recognises, and its subfolders
    that a folder format recognises. JSON files that are no dataset (an export's ``user.json``, a
    ``meta.json``) are not offered; when nothing else is, they are said to be none."""
    found, others = [], []
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix.lower() in (".json", ".jsonl"):
            (found if sniffed(path) else others).append(path.name)
        elif path.is_dir() and _a_dataset_folder(path):
            found.append(path.name + "/")

    def listed(names: list[str]) -> str:
        return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")

    if found:
        return f"; give one of these as the dataset instead: {listed(found)}"
    if others:
        return f"; its JSON files ({listed(others)}) are in none of the formats read: {', '.join(FORMATS)}"
    return ""


def _detect(source: Source) -> DatasetFormat:
    for fmt in REGISTRY:
        if fmt.sniff(source):
            return fmt
    if source.path.name == "chat.json":  # BEAM's name, content no format recognises: its loader says why
        return _BY_NAME[beam.NAME]
    if source.is_dir:
        if mixed := beam.mixed_folder(source.path):
            raise DatasetError(source.path, "folder", None, mixed + _inside(source.path))
        marks = ", ".join(f"{file} ({f.name})" for f in REGISTRY for file in f.folder_files)
        raise DatasetError(source.path, "folder", None,
                           f"format not recognised: holds none of {marks}{_inside(source.path)}")
    if source.first() in (None, {}):  # (not blank: that was said before) ``null``, ``[]``, ``{}``
        raise DatasetError(source.path, "file", None, "holds no conversations (its JSON is empty: null, [] or {})")
    if (beside := _folder_format_of(source.path)) is not None:  # (a file of a folder format's folder, alone)
        raise DatasetError(source.path, "file", None, f"is one file of a {beside} dataset: give its folder "
                           f"({source.path.parent}), which the {beside} format reads whole")
    raise DatasetError(source.path, "top level", None, f"format not recognised; choose its format (the app's Format picker, the CLI's --format): {', '.join(FORMATS)}")


def _folder_format_of(path: Path) -> str | None:
    """The folder format that reads the folder ``path`` is in, given a file of it alone (MemoryBank's
    ``probing_questions_en.jsonl``), else ``None``."""
    for fmt in REGISTRY:
        if fmt.folder and path.is_file():
            try:
                if fmt.sniff(Source(path.parent)):
                    return fmt.name
            except DatasetError:
                return None
    return None


def _blank(path: Path) -> bool:
    """A file with nothing but white space in it, or a byte-order mark (a folder or a big file is
    not read for this)."""
    try:
        return (path.is_file() and path.stat().st_size < 65_536
                and not path.read_bytes().decode("utf-8-sig", "replace").strip())
    except OSError:
        return False  # the loader says what is wrong with reading it


_TABLES = {".csv", ".tsv", ".parquet", ".xlsx", ".xls", ".feather", ".arrow"}


def _gzipped(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return path.is_file() and handle.read(2) == b"\x1f\x8b"
    except OSError:
        return False


def _not_text(path: Path) -> str | None:
    """What a file that is plainly not a JSON text is ("an SQLite database"), from its first bytes;
    ``None`` otherwise. Read as text each was "byte 111: not valid UTF-8"."""
    try:
        with path.open("rb") as handle:
            head = handle.read(16) if path.is_file() else b""
    except OSError:
        return None
    if head.startswith(b"SQLite format 3\x00"):
        return "is an SQLite database"
    if head[8:12] == b"DUCK" and not head[:1].isspace() and head[:1] not in (b"{", b"[", b"\xef"):
        # (a JSON text starts with a bracket, a space or a BOM: `{"id": "DUCK-1"…` is one)
        return "is a DuckDB database (the workbench's run store?)"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "is UTF-16 text: save it as UTF-8"
    return None


def _zipped(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return path.is_file() and handle.read(4) == b"PK\x03\x04"
    except OSError:
        return False  # (a folder, or unreadable: said elsewhere)


def _file_inside(folder: Source, format: str | None) -> tuple[Source, DatasetFormat] | None:
    """The one dataset file of a folder that no folder format reads: a ChatGPT export unpacked
    (``conversations.json`` beside ``user.json``, ``chat.html``, …), LoCoMo's ``locomo-dev/``
    (beside its licence). ``None`` when the folder is a folder format's, or holds no such file or
    several (the error then names them)."""
    if format is not None and _BY_NAME[format].folder:
        return None
    if format is None and any(f.folder and f.sniff(folder) for f in REGISTRY):
        return None
    if format is None and beam.mixed_folder(folder.path):  # beside chat folders, not plainly the one meant
        return None
    found: list[tuple[Source, DatasetFormat]] = []
    try:
        paths = sorted(folder.path.iterdir())
    except OSError:
        return None
    for path in paths:
        if not (path.is_file() and path.suffix.lower() in (".json", ".jsonl")):
            continue
        fmt = next((_BY_NAME[name] for name in content_formats(path)
                    if not _BY_NAME[name].folder and format in (None, name)), None)
        if fmt is not None:
            found.append((Source(path), fmt))
    return found[0] if len(found) == 1 else None


def _open(path: str | Path | Source, format: str | None) -> tuple[Source, DatasetFormat]:
    source = path if isinstance(path, Source) else Source(path)
    if not source.path.exists():
        raise DatasetError(source.path, "file", None, "does not exist")
    if _blank(source.path):  # whatever its format (an empty .json read as "invalid JSON" at line 1)
        raise DatasetError(source.path, "file", None, "is empty")
    if _gzipped(source.path):  # (read as text it was "not valid UTF-8")
        raise DatasetError(source.path, "file", None, "is gzip-compressed: decompress it first (gunzip -k FILE) "
                           "and give the JSON or JSON Lines file")
    if source.path.suffix.lower() in _TABLES and not source.is_dir:  # (it was "line 1 column 1: invalid JSON")
        raise DatasetError(source.path, "file", None, f"is a {source.path.suffix.lower()} file: datasets are JSON or "
                           f"JSON Lines, in one of the formats read ({', '.join(FORMATS)}; see datasets/README.md)")
    if (kind := _not_text(source.path)) is not None:
        raise DatasetError(source.path, "file", None, f"{kind}: datasets are JSON or JSON Lines text, in one of "
                           f"the formats read ({', '.join(FORMATS)}; see datasets/README.md)")
    if _zipped(source.path):  # (read as text it was "byte 11: not valid UTF-8")
        raise DatasetError(source.path, "file", None, "is a zip archive: unpack it and give the file or folder "
                           "(the app's upload takes a zip as it is)")
    if format is not None and format not in _BY_NAME:
        raise DatasetError(source.path, "--format", None, f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    if source.is_dir:
        inside = _file_inside(source, format)
        if inside is not None:
            return inside
        if format is not None and not _BY_NAME[format].folder:
            other = _file_inside(source, None)
            if other is not None:
                raise DatasetError(source.path, "folder", None,
                                   f"its {other[0].path.name} is not in the {format} format: its content is "
                                   f"{other[1].name} (drop --format, or choose {other[1].name})")
            raise DatasetError(source.path, "folder", None,
                               f"is a folder, and the {format} format reads a file{_inside(source.path)}")
    if format is None:
        return source, _detect(source)
    chosen = _BY_NAME[format]
    if not chosen.sniff(source):
        # Content that is plainly another format gets that said, not the parse error the wrong
        # loader would give; content no format recognises goes to the chosen loader, whose error
        # names the record and field that do not fit.
        try:
            detected = _detect(source)
        except DatasetError:
            detected = None
        if detected is not None and detected is not chosen:
            raise DatasetError(source.path, "top level", None,
                               f"is not in the {format} format: its content is {detected.name} "
                               f"(drop --format, or choose {detected.name})")
    return source, chosen


def detect_format(path: str | Path) -> str:
    """Guess a dataset's format from its content (``--format`` overrides). Reads only the start
    of a large list."""
    return _open(path, None)[1].name


def load_dataset(path: str | Path, format: str | None = None) -> list[Conversation]:
    """Load every conversation of a dataset file or folder (detection and loading share one parse)."""
    source, fmt = _open(path, format)
    conversations = fmt.load(source)
    _unique_ids(source.path, [c.id for c in conversations])
    return conversations


def _unique_ids(path: Path, ids: list[str]) -> None:
    """Two conversations of one file under one id: the second could never be chosen (an id picks
    the first), so the file is refused, naming both."""
    seen: dict[str, int] = {}
    for number, conversation_id in enumerate(ids, start=1):
        if conversation_id in seen:
            raise DatasetError(path, f"the {ordinal(number)} conversation", "id",
                               f"duplicate conversation id {conversation_id!r} (the {ordinal(seen[conversation_id])} "
                               "conversation has it too): give each a distinct id")
        seen[conversation_id] = number


def _entries(source: Source, fmt: DatasetFormat) -> list[index.Entry]:
    def build() -> list[index.Entry]:
        if fmt.stream is not None:
            return [index.Entry(ConversationInfo.of(c), e.index, e.offset, e.length) for e, c in fmt.stream(source)]
        return [index.Entry(ConversationInfo.of(c), i, -1, -1) for i, c in enumerate(fmt.load(source))]

    return index.get(source.path, fmt.name, build)


def list_conversations(path: str | Path, format: str | None = None) -> list[ConversationInfo]:
    """What a listing shows of each conversation (id, messages, probes, tokens), cheaply: a large
    LongMemEval file is indexed once (a few seconds) and the index cached on disk."""
    source, fmt = _open(path, format)
    entries = _entries(source, fmt)
    if not entries:
        raise DatasetError(source.path, "top level", None, "has no conversations")
    _unique_ids(source.path, [e.info.id for e in entries])
    return [e.info for e in entries]


def _not_found(path: Path, conversation_id: str, ids: list[str]) -> DatasetError:
    shown = ", ".join(ids[:20]) + (f", … ({len(ids)} in all)" if len(ids) > 20 else "")
    return ConversationNotFound(path, f"conversation {conversation_id!r}", None, f"not found; available: {shown}")


def _closed(path: Path) -> bool:
    """Whether a file's last character past white space is ``]`` (read from its end only)."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - 256))
            return handle.read().rstrip(b" \t\r\n").endswith(b"]")
    except OSError:
        return True  # (reading it will say what is wrong)


def load_conversation(path: str | Path, conversation_id: str | None = None,
                      format: str | None = None) -> Conversation:
    """One conversation (the first when ``conversation_id`` is None). From a LongMemEval file,
    only that instance is parsed: found through the index when there is one, else by a scan."""
    source, fmt = _open(path, format)
    if fmt.stream is None or fmt.build is None:
        conversations = fmt.load(source)
        _unique_ids(source.path, [c.id for c in conversations])
        if conversation_id is None:
            return conversations[0]
        for conversation in conversations:
            if conversation.id == conversation_id:
                return conversation
        raise _not_found(source.path, conversation_id, [c.id for c in conversations])
    entries = index.lookup(source.path, fmt.name)
    if entries is None and not source.lines and source.top() == "[" and not _closed(source.path):
        # (read without an index, one instance is found without reading past it: a download cut
        # off later was read as whole) A JSON list must end with its "]": checked at the file's end.
        raise DatasetError(source.path, "file", None, "is cut off: it ends before the list's closing ']' "
                           "(an interrupted download?)")
    if entries is not None and all(e.offset >= 0 for e in entries):
        if not entries:
            raise DatasetError(source.path, "top level", None, "has no conversations")
        entry = entries[0] if conversation_id is None else next(
            (e for e in entries if e.info.id == conversation_id), None)
        if entry is None:
            raise _not_found(source.path, str(conversation_id), [e.info.id for e in entries])
        return fmt.build(read_at(source.path, entry.offset, entry.length), entry.index, source)
    ids: list[str] = []
    for element in source.elements():
        value = element.value
        raw = value.get(fmt.id_key) if isinstance(value, dict) and fmt.id_key else None
        found = str(raw) if raw is not None else None
        if conversation_id is None or found == conversation_id:
            return fmt.build(value, element.index, source)
        if found is not None:
            ids.append(found)
    if conversation_id is None or not ids:
        raise DatasetError(source.path, "top level", None, "has no conversations")
    raise _not_found(source.path, conversation_id, ids)


def markdown_table() -> str:
    """The formats table of ``datasets/README.md``."""
    rows = ["| format | what | folder |", "|---|---|---|"]
    rows += [f"| `{f.name}` | {f.description} | {'yes' if f.folder else 'no'} |" for f in REGISTRY]
    return "\n".join(rows)
