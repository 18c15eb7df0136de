"""The project's own format: JSON Lines, one message or probe per line (``datasets/README.md``)."""

from __future__ import annotations

from .base import ROLES, Conversation, DatasetError, Probe, Turn, finish, require, text_or_none
from .dates import parse_datetime
from .source import Source, json_lines

NAME = "omem"
DESCRIPTION = "the project's JSON Lines: one message or probe per line, grouped by `conversation_id`"
FOLDER = False


def sniff(source: Source) -> bool:
    first = source.first() if source.lines else None
    return isinstance(first, dict) and "conversation_id" in first and any(
        key in first for key in ("role", "question", "type"))


_KEYS = {
    "message": ("type", "conversation_id", "id", "role", "content", "timestamp", "speaker"),
    "probe": ("type", "conversation_id", "id", "question", "answer", "evidence", "category", "abstention"),
}


def _unknown_keys(obj: dict, kind: str, record: str, said: set[tuple[str, str]]) -> str | None:
    """A warning for keys a line of ``kind`` has that are not read (each key once per kind, in
    ``said``: the conversation's): a probe's ``"gold"`` for ``"answer"`` loaded as a probe without
    a gold answer, unscored, and only "none has a gold answer" said why."""
    unknown = [key for key in obj if key not in _KEYS[kind] and (kind, key) not in said]
    if not unknown:
        return None
    said.update((kind, key) for key in unknown)
    return (f"{record}: {'keys' if len(unknown) > 1 else 'key'} {', '.join(map(repr, unknown))} of a {kind} "
            f"{'are' if len(unknown) > 1 else 'is'} not read (a {kind}'s keys: {', '.join(_KEYS[kind])})")


def load(source: Source) -> list[Conversation]:
    file = source.path
    said: dict[str, set[tuple[str, str]]] = {}  # by conversation: each is warned about on its own
    conversations: dict[str, Conversation] = {}
    # where each message and probe is, for the checks once loaded: "line 9", not "its 4th message"
    lines: dict[str, tuple[list[str], list[str]]] = {}
    for element in json_lines(file):
        obj, record = element.value, f"line {element.index}"
        conversation_id = require(obj, "conversation_id", file, record)
        conversation = conversations.setdefault(
            conversation_id, Conversation(conversation_id, [], source=str(file), format=NAME))
        turn_lines, probe_lines = lines.setdefault(conversation_id, ([], []))
        kind = obj.get("type", "probe" if "question" in obj else "message")
        if "type" not in obj and "question" in obj and ("role" in obj or "content" in obj):
            # (read as a probe, its message was dropped without a word)
            raise DatasetError(file, record, "type", "missing: the line has a question and a message's "
                               f"{'role' if 'role' in obj else 'content'}; say \"type\": \"message\" or \"probe\"")
        if isinstance(kind, str) and kind in _KEYS and (unread := _unknown_keys(obj, kind, record, said.setdefault(conversation_id, set()))):
            conversation.warnings.append(unread)
        if kind == "message":
            role = require(obj, "role", file, record)
            if role not in ROLES:
                raise DatasetError(file, record, "role", f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
            speaker = obj.get("speaker")
            if speaker is not None and not isinstance(speaker, str):
                raise DatasetError(file, record, "speaker", "expected str")
            conversation.turns.append(Turn(
                id=require(obj, "id", file, record),
                role=role,
                text=require(obj, "content", file, record),
                created_at=parse_datetime(require(obj, "timestamp", file, record, (str, int, float)), file, record,
                                          "timestamp"),
                speaker=speaker,
            ))
            turn_lines.append(record)
        elif kind == "probe":
            evidence = obj.get("evidence", [])
            if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
                raise DatasetError(file, record, "evidence", "expected a list of message ids")
            abstention = obj.get("abstention", False)
            if not isinstance(abstention, bool):
                raise DatasetError(file, record, "abstention", "expected true or false")
            gold = obj.get("answer")
            gold = text_or_none(gold)
            conversation.probes.append(Probe(
                id=require(obj, "id", file, record),
                question=require(obj, "question", file, record),
                gold=None if abstention else gold,
                category=str(obj.get("category", "uncategorised")),
                evidence=tuple(evidence),
                abstention=abstention,
                reference=gold,
            ))
            probe_lines.append(record)
        else:
            raise DatasetError(file, record, "type", f"unknown record type {kind!r}; expected message or probe")
    if not conversations:
        raise DatasetError(file, "file", None, "has no records")
    return [finish(c, file, turn_records=lines[c.id][0], probe_records=lines[c.id][1])
            for c in conversations.values()]
