"""Conversation datasets: the project's JSON Lines format and loaders for public formats.

Every loader returns :class:`Conversation` objects; a malformed file raises :class:`DatasetError`
naming the file, the record (line, index or instance) and the field. Evidence ids that point
nowhere are not fatal: they are dropped, counted and reported in ``Conversation.warnings``.

One module per format (``omem``, ``locomo``, ``longmemeval``, ``beam``, ``memorybank``,
``openai_export``, ``sharegpt``), each with ``sniff`` and ``load``; :mod:`.registry` lists them
once, and detection, :data:`FORMATS` (the CLI's ``--format`` choices), the app's format picker
(:data:`REGISTRY`: name, one-line description, folder or not) and ``datasets/README.md``'s table
derive from it. Dates in every format go through :func:`parse_datetime`.

Entry points: :func:`load_dataset` (every conversation), :func:`load_conversation` (one; from a
large LongMemEval file only that instance is parsed), :func:`list_conversations` (ids and sizes,
through a cached index for large files), :func:`detect_format`.
"""

from __future__ import annotations

from .base import ROLES, Conversation, ConversationInfo, DatasetError, Probe, Turn
from .dates import parse_datetime
from .registry import (
    FORMATS,
    REGISTRY,
    DatasetFormat,
    detect_format,
    get_format,
    list_conversations,
    load_conversation,
    load_dataset,
    markdown_table,
)

__all__ = [
    "FORMATS", "REGISTRY", "ROLES", "Conversation", "ConversationInfo", "DatasetError", "DatasetFormat", "Probe",
    "Turn", "detect_format", "get_format", "list_conversations", "load_conversation", "load_dataset",
    "markdown_table", "parse_datetime",
]
