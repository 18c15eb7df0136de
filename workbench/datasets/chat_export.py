"""What the OpenAI and ShareGPT formats share: a file of chat objects, each a list of messages."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from .base import EPOCH, ROLES, Conversation, DatasetError, EmptyConversation, Turn, finish, require, skip_empty
from .dates import parse_datetime, try_parse_datetime
from .source import Source


def _part_text(part: Any) -> str | None:
    """One content part as text: its text (a voice message's transcription too), a refusal's
    words, or a marker for what has no text (``[image]``, ``[audio]``) so that the message does
    not read as empty or lose that something was shown."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return None
    kind = str(part.get("type") or part.get("content_type") or "")
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return part["refusal"]
    if isinstance(part.get("text"), str):
        return part["text"]
    if "image" in kind:
        return "[image]"
    if "audio" in kind:
        return "[audio]"
    return None


def text_of(content: Any) -> str:
    """A message's text from a string, OpenAI content parts, or a ChatGPT export's content (its
    ``parts``, or the ``text`` of a code-interpreter turn and its output)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "\n".join(t for t in map(_part_text, content) if t).strip()
    if isinstance(content, dict) and isinstance(content.get("parts"), list):  # ChatGPT export
        return "\n".join(t for t in map(_part_text, content["parts"]) if t).strip()
    if isinstance(content, dict) and isinstance(content.get("text"), str):  # ChatGPT code / execution output
        return content["text"].strip()
    if isinstance(content, dict) and isinstance(content.get("result"), str):  # ChatGPT browsing's page text
        return content["result"].strip()
    return ""


def calls_text(item: dict[str, Any]) -> str:
    """An OpenAI message's tool calls (``tool_calls``, or the older ``function_call``) as text, a
    line each: ``[tool call: get_weather({"city": "Porto"})]``. An agent's message is often only
    that (its ``content`` null), and what the agent did is part of what memory should hold."""
    calls = [c for c in item.get("tool_calls") or [] if isinstance(c, dict)] if isinstance(item.get("tool_calls"), list) else []
    if isinstance(item.get("function_call"), dict):
        calls.append({"function": item["function_call"]})
    lines = []
    for call in calls:
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        lines.append(call_line(function["name"], function.get("arguments")))
    return "\n".join(lines)


def call_line(name: str, arguments: Any) -> str:
    """One tool call as text, ``[tool call: get_weather({"city": "Porto"})]`` (arguments as given
    when text, else as JSON)."""
    if not isinstance(arguments, str):
        arguments = "" if arguments is None else json.dumps(arguments, ensure_ascii=False)
    return f"[tool call: {name}({arguments.strip()})]"


def from_messages(conv_id: str, messages: list[Any], source: Source, record: str, fmt: str,
                  role_key: str, text_key: str, roles: dict[str, str] | None,
                  rewrite: Callable[[Any, str], str] | None = None) -> Conversation:
    """The conversation of ``messages`` (a message with no text is skipped, with a warning);
    ``rewrite(message, text)``: a format's own reading of a message's text."""
    file = source.path
    turns: list[Turn] = []
    stamps: list[datetime | None] = []
    empty: list[str] = []  # messages with no text (null, "", no tool call), skipped
    for index, item in enumerate(messages):
        where = f"{record} message {index}"
        raw_role = require(item, role_key, file, where)
        role = roles.get(raw_role.lower()) if roles is not None else raw_role
        if role not in ROLES:
            known = list(roles) if roles is not None else list(ROLES)
            raise DatasetError(file, where, role_key, f"unknown role {raw_role!r} (expected one of {', '.join(known)})")
        calls = calls_text(item)
        if text_key not in item and not calls:  # (OpenAI leaves it out of a turn that only calls tools)
            raise DatasetError(file, where, text_key, "missing")
        content = item.get(text_key)
        if not (content is None or isinstance(content, (str, list))
                or isinstance(content, dict) and isinstance(content.get("parts"), list)):
            # (null is a message with no text, e.g. an assistant's tool call; a number is a mistake)
            raise DatasetError(file, where, text_key, f"expected text or a list of content parts, got "
                               f"{type(content).__name__} {str(content)[:40]!r}")
        key = "timestamp" if item.get("timestamp") not in (None, "") else "created_at"
        stamp = None if item.get(key) in (None, "") else parse_datetime(item[key], file, where, key)
        text = "\n".join(part for part in (text_of(content), calls) if part)
        if rewrite is not None and text.strip():
            text = rewrite(item, text)
        if not text.strip():  # ("value": null or "" was kept as an empty message, counted as one)
            empty.append(where)
            continue
        stamps.append(stamp)
        turns.append(Turn(named(item.get("id")) or f"{conv_id}-{index}", role, text,
                          EPOCH, item.get("name") if isinstance(item.get("name"), str) else None))
    turns = [dataclasses.replace(turn, created_at=when) for turn, when in zip(turns, fill_times(stamps))]
    conversation = Conversation(conv_id, turns, [], str(file), fmt)
    if empty:  # said, as for ChatGPT exports: not silent
        conversation.warnings.append(f"{len(empty)} message{'s' if len(empty) > 1 else ''} with no text "
                                     f"{'were' if len(empty) > 1 else 'was'} skipped (first: {empty[0]!r})")
    return finish(conversation, file)


def fill_times(stamps: list[datetime | None]) -> list[datetime]:
    """Each message's time: its own; else, when no message has one, a minute per message from
    :data:`EPOCH`; else the time of the message before it (the first known time for those
    before any), so an undated message sits among its dated neighbours, not years away."""
    known = [s for s in stamps if s is not None]
    if not known:
        return [EPOCH + timedelta(minutes=index) for index in range(len(stamps))]
    out, last = [], known[0]
    for stamp in stamps:
        last = stamp or last
        out.append(last)
    return out


NEVER = datetime.min.replace(tzinfo=timezone.utc)  # sorts an undated node first


def from_chatgpt(obj: dict[str, Any], index: int, source: Source, fmt: str) -> Conversation:
    """A ChatGPT data export conversation: a ``mapping`` tree of nodes. The conversation is the
    path from the root to ``current_node`` (the branch the user last saw): a reply regenerated
    away, or an edited question's first version, lies on another branch and is not read. Without
    a usable ``current_node``, the path to the leaf whose branch holds the newest message; with no
    parent links at all, every message by time. A message without a ``create_time`` takes the
    time of the one before it."""
    mapping = obj["mapping"]
    nodes = {key: node for key, node in mapping.items() if isinstance(node, dict)}

    def created(node: dict[str, Any]) -> datetime | None:
        message = node.get("message")
        value = message.get("create_time") if isinstance(message, dict) else None
        if not value or isinstance(value, bool):
            return None
        return try_parse_datetime(value, numbers=True)

    def path_to(key: Any) -> list[dict[str, Any]]:
        path: list[dict[str, Any]] = []
        seen: set[str] = set()
        while isinstance(key, str) and key in nodes and key not in seen:  # (a cycle ends the walk)
            seen.add(key)
            path.append(nodes[key])
            key = nodes[key].get("parent")
        return path[::-1]

    leaf = obj.get("current_node")
    if not (isinstance(leaf, str) and leaf in nodes):
        # The newest branch: of the leaves (nodes no node names as its parent), the one whose path
        # holds the newest message, then the longest path.
        parents = {node.get("parent") for node in nodes.values() if isinstance(node.get("parent"), str)}
        leaves = [key for key in nodes if key not in parents]

        def rank(key: str) -> tuple[datetime, int]:
            path = path_to(key)
            return max((created(node) or NEVER for node in path), default=NEVER), len(path)

        leaf = max(leaves, key=rank) if leaves else None
    path = path_to(leaf)
    linked = any(isinstance(node.get("parent"), str) and node["parent"] in nodes for node in nodes.values())
    if not linked:  # no tree: every message, by time
        path = sorted(nodes.values(), key=lambda node: created(node) or NEVER)
    turns: list[Turn] = []
    stamps: list[datetime | None] = []
    empty: list[str] = []  # user/assistant/tool messages with no text, skipped: said, not silent
    for node in path:
        message = node.get("message")
        if not isinstance(message, dict):
            continue
        author = message.get("author")
        role = author.get("role", "") if isinstance(author, dict) else ""
        text = text_of(message.get("content"))
        if role not in ROLES or not text:
            metadata = message.get("metadata") if isinstance(message.get("metadata"), dict) else {}
            if role in ("user", "assistant", "tool") and not metadata.get("is_visually_hidden_from_conversation"):
                empty.append(str(named(message.get("id"), node.get("id")) or "?"))
            continue
        turns.append(Turn(named(message.get("id"), node.get("id")) or f"message-{len(turns)}", role, text, EPOCH))
        stamps.append(created(node))
    turns = [dataclasses.replace(turn, created_at=when) for turn, when in zip(turns, fill_times(stamps))]
    conv_id = named(obj.get("id"), obj.get("conversation_id"), obj.get("title")) or f"conversation-{index}"
    conversation = Conversation(conv_id, turns, [], str(source.path), fmt)
    if empty and turns:
        conversation.warnings.append(f"{len(empty)} message{'s' if len(empty) > 1 else ''} with no text "
                                     f"{'were' if len(empty) > 1 else 'was'} skipped (first: {empty[0]!r})")
    return finish(conversation, source.path)


def load_objects(source: Source, convert: Callable[[dict[str, Any], int, str], Conversation]) -> list[Conversation]:
    """Each chat object of the file (one JSON document, a list, or JSON Lines) through ``convert``."""
    file = source.path
    if source.is_dir:
        raise DatasetError(file, "folder", None, "expected a JSON or JSON Lines file, not a folder")
    if source.lines:
        items = ((e.index, e.value, f"line {e.index}") for e in source.elements())
    else:
        document = source.document()
        # (one object, not a list: its records are the top level's, `.messages[4]` to jq, not "conversation 0")
        items = (((i, v, f"conversation {i}") for i, v in enumerate(document)) if isinstance(document, list)
                 else iter([(0, document, "top level")]))
    conversations: list[Conversation] = []
    empty: list[str] = []
    for index, obj, record in items:
        if not isinstance(obj, dict):
            raise DatasetError(file, record, None, "expected a JSON object")
        try:
            conversations.append(convert(obj, index, record))
        except EmptyConversation as exc:
            empty.append(exc.conversation_id)
    if not conversations:
        raise DatasetError(file, "file", None, "has no conversations" + (" with messages" if empty else ""))
    return skip_empty(conversations, empty)


def conversation_id(obj: dict[str, Any], index: int) -> str:
    return named(obj.get("id"), obj.get("conversation_id")) or f"conversation-{index}"


def named(*values: Any) -> str | None:
    """The first of ``values`` that names something: an optional id that is missing, null or
    blank is skipped (then numbered by the caller), as if it were absent."""
    for value in values:
        if value is not None and str(value).strip():
            return str(value)
    return None
