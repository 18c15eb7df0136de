"""ShareGPT: ``[{"conversations": [{"from": "human", "value": ...}, ...]}]``; ``human``/``gpt``
(and the usual aliases) map to user/assistant.

Function-calling sets (Glaive, xLAM, ToolACE) add a top-level ``system`` prompt and ``tools``
(the functions the model may call) and write a call as JSON in a ``function_call`` turn: the
system prompt is the conversation's first message (naming the tools), and a call reads as the
OpenAI format's do, ``[tool call: get_weather({"city": "Porto"})]``.
"""

from __future__ import annotations

import json
from typing import Any

from .base import Conversation, Turn, require
from .chat_export import call_line, conversation_id, from_messages, load_objects
from .source import Source

NAME = "sharegpt"
DESCRIPTION = "ShareGPT: `[{\"conversations\": [{\"from\": \"human\", \"value\": ...}]}]` (JSON or JSON Lines)"
FOLDER = False

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant",
         "bing": "assistant", "bard": "assistant", "system": "system", "tool": "tool", "function": "tool",
         # function-calling sets (Glaive, xLAM): the model's call, and what the tool returned
         "function_call": "assistant", "observation": "tool"}


def sniff(source: Source) -> bool:
    first = source.first()
    return isinstance(first, dict) and "conversations" in first


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # (not JSON, or nested too deeply to read: the text as written)
            return value
    return value


def _call(call: Any) -> str | None:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    return call_line(call["name"], _json(call.get("arguments", call.get("parameters"))))


def function_call_text(value: Any) -> str | None:
    """A ``function_call`` turn's JSON (one call, or a list of them) as a line per call; ``None``
    when it is not calls (then the text stays as written)."""
    parsed = _json(value)
    calls = parsed if isinstance(parsed, list) else [parsed]
    lines = [_call(call) for call in calls]
    return "\n".join(lines) if lines and all(lines) else None  # type: ignore[arg-type]


def tool_names(tools: Any) -> list[str]:
    """The names of a ``tools`` list (a JSON string or a list; OpenAI's ``{"function": {...}}``
    wrapping too)."""
    names = []
    for tool in _json(tools) if isinstance(_json(tools), list) else []:
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
            tool = tool["function"]
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            names.append(tool["name"])
    return names


def tools_problem(tools: Any) -> str | None:
    """Why a ``tools`` value given (not absent, not empty) names no tool: not JSON, not a list, or
    no entry with a name. Said as a warning, not dropped silently."""
    parsed = _json(tools)
    if tools in (None, "") or parsed in (None, [], {}):  # absent, or given empty ("null", "[]", {})
        return None
    if isinstance(tools, str) and parsed is tools:
        return f"its 'tools' is not valid JSON ({tools[:40]!r}…)" if len(tools) > 40 else \
            f"its 'tools' is not valid JSON ({tools!r})"
    if not isinstance(parsed, list):
        return f"its 'tools' is not a list (got {type(parsed).__name__})"
    if parsed and not tool_names(parsed):
        return "its 'tools' names no tool (no entry has a 'name')"
    return None


def load(source: Source) -> list[Conversation]:
    def convert(obj, index, record):
        messages = require(obj, "conversations", source.path, record, list)
        def calls(item: Any, text: str) -> str:  # (a function_call turn's JSON, as a line per call)
            if str(item.get("from", "")).lower() == "function_call":
                return function_call_text(item.get("value")) or text
            return text

        conversation = from_messages(conversation_id(obj, index), messages, source, record, NAME, "from", "value",
                                     ROLES, calls)
        turns = list(conversation.turns)
        system = obj.get("system").strip() if isinstance(obj.get("system"), str) else ""
        if any(t.role == "system" and t.text.strip() == system for t in turns):
            system = ""  # given at the top and as a turn too: once is enough
        names = tool_names(obj.get("tools"))
        if problem := tools_problem(obj.get("tools")):
            conversation.warnings.append(f"{problem}: the tools the model could call are not shown")
        prompt = "\n".join(part for part in (system, f"[tools: {', '.join(names)}]" if names else "") if part)
        if prompt and turns:
            taken, name = {t.id for t in turns}, f"{conversation.id}-system"
            while name in taken:
                name += "~"
            turns.insert(0, Turn(name, "system", prompt, turns[0].created_at))
        conversation.turns = turns
        return conversation

    return load_objects(source, convert)
