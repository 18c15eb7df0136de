"""A byte-offset index of a large dataset file, so listing its conversations or loading one of
them does not parse the whole file each time.

The index holds, per conversation, what a listing shows (:class:`ConversationInfo`) and where
its bytes are. It is kept in this process and, for files of ``MIN_BYTES`` or more, on disk under
``$OMEM_CACHE_DIR/datasets`` (default ``~/.cache/omem/datasets``), keyed by the file's resolved
path, size and modification time: a changed file is indexed again. When the cache folder cannot
be written, the index lives in this process only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import astuple, dataclass
from pathlib import Path

from .base import ConversationInfo

VERSION = 2  # 2: scored_probes counts gold answers with a word the score reads
MIN_BYTES = 8 << 20  # smaller files are read in well under a second: not worth a file on disk
_MEMO_SIZE = 16
_memo: OrderedDict[tuple, list[Entry]] = OrderedDict()
_lock = threading.Lock()  # the app reads from several threads


@dataclass(frozen=True, slots=True)
class Entry:
    info: ConversationInfo
    index: int  # the element's position (its record in errors)
    offset: int  # byte offset in the file; -1 when unknown
    length: int


def cache_dir() -> Path:
    return Path(os.environ.get("OMEM_CACHE_DIR") or Path.home() / ".cache" / "omem") / "datasets"


def _key(path: Path, fmt: str) -> tuple[str, int, int, str]:
    """Path, size and modification time; of a folder, its files' total size and newest time
    (a folder's own time does not change when a file in it is edited)."""
    resolved = path.resolve()
    stats = [resolved.stat()]
    if resolved.is_dir():
        stats += [child.stat() for child in resolved.iterdir() if child.is_file()]
    size = stats[0].st_size if len(stats) == 1 else sum(s.st_size for s in stats[1:])
    return str(resolved), size, max(s.st_mtime_ns for s in stats), fmt


def _file_for(key: tuple) -> Path:
    digest = hashlib.sha256(f"{key[0]}\0{key[3]}".encode()).hexdigest()[:24]
    return cache_dir() / f"{digest}.json"


def _read(key: tuple) -> list[Entry] | None:
    try:
        data = json.loads(_file_for(key).read_text(encoding="utf-8"))
        if data.get("version") != VERSION or [data.get(k) for k in ("path", "size", "mtime_ns", "format")] != list(key):
            return None
        return [Entry(ConversationInfo(*row[:6]), *row[6:9]) for row in data["entries"]]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _write(key: tuple, entries: list[Entry]) -> None:
    target = _file_for(key)
    data = {"version": VERSION, "path": key[0], "size": key[1], "mtime_ns": key[2], "format": key[3],
            "entries": [[*astuple(e.info), e.index, e.offset, e.length] for e in entries]}
    temporary: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        os.replace(temporary, target)
    except OSError:  # a read-only or unusable cache folder: the index stays in this process only
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _remember(key: tuple, entries: list[Entry]) -> list[Entry]:
    with _lock:
        _memo[key] = entries
        _memo.move_to_end(key)
        while len(_memo) > _MEMO_SIZE:
            _memo.popitem(last=False)
    return entries


def lookup(path: Path, fmt: str) -> list[Entry] | None:
    """The index when one exists (in this process or on disk), without building it."""
    key = _key(path, fmt)
    with _lock:
        found = _memo.get(key)
    if found is not None:
        return found
    entries = _read(key) if key[1] >= MIN_BYTES else None
    return None if entries is None else _remember(key, entries)


def get(path: Path, fmt: str, build: Callable[[], list[Entry]]) -> list[Entry]:
    """The index, built with ``build`` (and stored) when there is none."""
    found = lookup(path, fmt)
    if found is not None:
        return found
    key = _key(path, fmt)
    entries = build()
    if key[1] >= MIN_BYTES and all(e.offset >= 0 for e in entries):
        _write(key, entries)
    return _remember(key, entries)


def clear_memory() -> None:
    """Forget the in-process indexes (the files on disk stay)."""
    with _lock:
        _memo.clear()
