"""OpenAI chat format: ``{"messages": [{"role", "content"}, ...]}`` objects (one JSON document, a
list, or JSON Lines), and ChatGPT data exports (``conversations.json``: ``mapping`` trees).

Content parts are joined, tool calls written as ``[tool call: name(arguments)]`` lines (an agent's
message with no text is often only that), the ``developer`` role read as ``system`` and the older
``function`` as ``tool``; ``timestamp``/``created_at`` (any date form the parser reads) set the
clock, else a minute per message."""

from __future__ import annotations

from .base import Conversation, require
from .chat_export import conversation_id, from_chatgpt, from_messages, load_objects
from .source import Source

NAME = "openai"
DESCRIPTION = "OpenAI chats: `{\"messages\": [...]}` objects (JSON, list or JSON Lines) and ChatGPT `mapping` exports"
FOLDER = False
# OpenAI's newer "developer" role is its system prompt; "function" is the older name of "tool".
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system", "tool": "tool",
         "function": "tool"}


def sniff(source: Source) -> bool:
    first = source.first()
    return isinstance(first, dict) and ("messages" in first or "mapping" in first)


def load(source: Source) -> list[Conversation]:
    def convert(obj, index, record):
        if isinstance(obj.get("mapping"), dict):
            return from_chatgpt(obj, index, source, NAME)
        messages = require(obj, "messages", source.path, record, list)
        return from_messages(conversation_id(obj, index), messages, source, record, NAME, "role", "content", ROLES)

    return load_objects(source, convert)
