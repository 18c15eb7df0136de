"""ShareGPT: ``[{"conversations": [{"from": "human", "value": ...}, ...]}]``; ``human``/``gpt``
(and the usual aliases) map to user/assistant."""

from __future__ import annotations

from .base import Conversation, require
from .chat_export import conversation_id, from_messages, load_objects
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


def load(source: Source) -> list[Conversation]:
    def convert(obj, index, record):
        messages = require(obj, "conversations", source.path, record, list)
        return from_messages(conversation_id(obj, index), messages, source, record, NAME, "from", "value", ROLES)

    return load_objects(source, convert)
