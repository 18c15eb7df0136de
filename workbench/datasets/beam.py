"""BEAM: a chat folder with ``chat.json`` (batches of turns with ``time_anchor``s) and
``probing_questions.json`` (probes by category; the gold field varies by category) beside it or,
as BEAM publishes them, in a ``probing_questions/`` folder. A folder of chat folders (BEAM's
``chats/100K/``: ``1/``, ``2/``, …) is a dataset of one conversation per chat.

``time_anchor``s set the clock (a minute per message after the newest anchor); ``source_chat_ids``
may be ints, lists or dicts and point at message ids. Categories keep BEAM's names; the
``abstention`` category asks about what the chat never says, so its probes have no gold (their
``ideal_response`` is kept as the reference for a judge).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from .base import EPOCH, ROLES, Conversation, DatasetError, Probe, Turn, finish, require, text_or_none
from .dates import later, try_parse_datetime
from .source import Source, load_json

NAME = "beam"
DESCRIPTION = ("a BEAM chat folder: `chat.json` (batches of turns) + `probing_questions.json`; or a folder of "
               "them (BEAM's `chats/100K/`), one conversation each")
FOLDER = True
FOLDER_FILES = ("chat.json",)  # what marks a folder of this format

ABSTENTION = "abstention"
_SUFFIX = re.compile(r"\s*->->\s*\d+\s*,\s*\d+\s*$")
_GOLD = ("answer", "ideal_answer", "ideal_response", "ideal_summary", "expected_compliance")


def _number_first(path: Path) -> tuple[int, int | str]:
    return (0, int(path.name)) if path.name.isdecimal() else (1, path.name)


def chat_folders(folder: Path) -> list[Path]:
    """The chats a folder holds: itself when it has a ``chat.json``, else each subfolder that has
    one, in number order (``2/`` before ``10/``) — unless the folder has dataset files of its own:
    then which dataset is meant is not clear (the registry's error names the candidates)."""
    if (folder / "chat.json").is_file():
        return [folder]
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    chats = _chats(entries)
    return [] if chats and _own_json(entries) else chats  # (its own files are read only beside chats)


def _chats(entries: list[Path]) -> list[Path]:
    """The subfolders that hold a ``chat.json``, in number order."""
    return sorted((p for p in entries if p.is_dir() and (p / "chat.json").is_file()), key=_number_first)


def _own_json(entries: list[Path]) -> list[Path]:
    """The folder's own JSON files that are datasets (one a format recognises by its content): a
    ``meta.json`` or a download's manifest beside the chat folders leaves them one dataset."""
    from .registry import sniffed  # (the registry imports this module)

    return sorted(p for p in entries if p.is_file() and p.suffix.lower() in (".json", ".jsonl") and sniffed(p))


def mixed_folder(folder: Path) -> str | None:
    """Why a folder of chat folders is not read as one dataset (it also holds dataset files of its
    own), or ``None``."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return None
    chats = _chats(entries)
    if not chats or (folder / "chat.json").is_file():
        return None
    own = _own_json(entries)
    if not own:
        return None
    return (f"holds BEAM chat folders ({', '.join(p.name + '/' for p in chats[:3])}{', …' if len(chats) > 3 else ''}) "
            f"and dataset files of its own ({', '.join(p.name for p in own[:3])}{', …' if len(own) > 3 else ''}), so "
            "which dataset is meant is not clear (move those files out to read the chats as one dataset)")


def sniff(source: Source) -> bool:
    if source.is_dir:
        return bool(chat_folders(source.path))
    # (a file named chat.json of no other format is read as BEAM too, after every other format
    # declined it: see the registry's detection; a ShareGPT file of that name is ShareGPT)
    first = source.first() if not source.lines else None
    return isinstance(first, dict) and isinstance(first.get("turns"), list) and (
        "batch_number" in first or "time_anchor" in first)


def _flatten_ids(value: Any) -> list[str]:
    """The ids (numbers and strings) anywhere in ``value``'s lists and objects, in order; iterative,
    so a list nested hundreds deep (which JSON parsing takes) is no ``RecursionError``."""
    found: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, (int, str)):
            found.append(str(item))
        elif isinstance(item, (list, dict)):
            stack.extend(reversed(item if isinstance(item, list) else list(item.values())))
    return found


PROBE_FILES = ("probing_questions.json", "probing_questions/probing_questions.json")


def load(source: Source) -> list[Conversation]:
    if source.is_dir:
        folders = chat_folders(source.path)
        if not folders:
            raise DatasetError(source.path, "folder", None,
                               mixed_folder(source.path) or "holds no chat.json, nor folders that do")
        return [_chat(folder, folder / "chat.json", load_json(folder / "chat.json")) for folder in folders]
    return [_chat(source.path.parent, source.path, source.document())]


def _chat(folder: Path, chat_file: Path, data: Any) -> Conversation:
    if not isinstance(data, list):
        raise DatasetError(chat_file, "top level", None, "expected a list of batches")
    turns: list[Turn] = []
    clock: datetime | None = None
    unread: list[str] = []  # anchors that are not a date: skipped, and said (they were skipped silently)

    def anchor_of(obj: Any, where: str) -> datetime | None:
        value = obj.get("time_anchor")
        when = try_parse_datetime(value)
        if when is None and value not in (None, ""):
            unread.append(f"{where}: {value!r}")
        return when

    for b_index, batch in enumerate(data):
        where = f"batch {b_index}"
        groups = require(batch, "turns", chat_file, where, list)
        clock = anchor_of(batch, where) or clock
        for g_index, group in enumerate(groups):
            items = group if isinstance(group, list) else [group]
            for m_index, item in enumerate(items):
                m_where = f"{where} turn {g_index} message {m_index}"
                role = require(item, "role", chat_file, m_where)
                if role not in ROLES:
                    raise DatasetError(chat_file, m_where, "role", f"unknown role {role!r}")
                message_id = require(item, "id", chat_file, m_where, (int, str))
                anchor = anchor_of(item, m_where)
                if anchor is not None and (clock is None or anchor > clock):
                    clock = anchor
                clock = later(clock or EPOCH, timedelta(minutes=1), chat_file, m_where, "time_anchor")
                turns.append(Turn(str(message_id), role,
                                  _SUFFIX.sub("", require(item, "content", chat_file, m_where)), clock))
    probes = []
    probe_file = next((folder / name for name in PROBE_FILES if (folder / name).is_file()), None)
    if probe_file is not None:
        questions = load_json(probe_file)
        if not isinstance(questions, dict):
            raise DatasetError(probe_file, "top level", None, "expected an object of categories")
        for category, items in questions.items():
            for index, item in enumerate(items if isinstance(items, list) else []):
                where = f"{category} {index}"
                question = require(item, "question", probe_file, where)
                gold = next((item[k] for k in _GOLD if item.get(k)), None)
                abstention = category == ABSTENTION
                probes.append(Probe(
                    id=f"{category}-{index}",
                    question=question,
                    gold=None if abstention else text_or_none(gold),
                    category=category,
                    evidence=tuple(_flatten_ids(item.get("source_chat_ids"))),
                    abstention=abstention,
                    reference=text_or_none(gold),
                ))
    conversation = Conversation(f"beam-{folder.name}", turns, probes, str(folder), NAME)
    if unread:
        conversation.warnings.append(
            f"{len(unread)} time_anchor{'s are' if len(unread) > 1 else ' is'} not a date and "
            f"{'were' if len(unread) > 1 else 'was'} skipped (first: {unread[0]}): the clock ran on from the last one read")
    if probe_file is None:
        conversation.warnings.append(f"no probing questions: neither {' nor '.join(PROBE_FILES)} is in {folder}, "
                                     "so nothing can be scored")
    return finish(conversation, chat_file)
