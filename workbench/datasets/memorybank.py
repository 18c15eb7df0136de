"""MemoryBank (English): ``memory_bank_en.json`` (users' daily chats with an AI companion) and,
beside it, ``probing_questions_en.jsonl`` (questions only, no gold answers).

One conversation per user; each day's exchanges start at 09:00 UTC, two minutes apart.
"""

from __future__ import annotations

from datetime import timedelta

from .base import Conversation, DatasetError, EmptyConversation, Probe, Turn, finish, require, skip_empty
from .dates import later, parse_datetime
from .source import Source, json_lines, load_json

NAME = "memorybank"
DESCRIPTION = "MemoryBank: `memory_bank_en.json` (+ `probing_questions_en.jsonl` beside it), one conversation per user"
FOLDER = True
FOLDER_FILES = ("memory_bank_en.json",)


def sniff(source: Source) -> bool:
    if source.is_dir:
        return (source.path / "memory_bank_en.json").is_file()
    if source.path.name == "memory_bank_en.json":
        return True
    if source.lines or source.top() != "{":
        return False
    first = source.first()
    return isinstance(first, dict) and bool(first) and all(
        isinstance(v, dict) and "history" in v for v in first.values())


def load(source: Source) -> list[Conversation]:
    file = source.path / "memory_bank_en.json" if source.is_dir else source.path
    data = load_json(file) if source.is_dir else source.document()
    if not isinstance(data, dict):
        raise DatasetError(file, "top level", None, "expected an object of users")
    questions: dict[str, list[str]] = {}
    question_file = file.parent / "probing_questions_en.jsonl"
    if question_file.exists():
        for element in json_lines(question_file):
            if isinstance(element.value, dict):
                for name, items in element.value.items():
                    if isinstance(items, list):
                        questions.setdefault(name.strip(), []).extend(q for q in items if isinstance(q, str))
    conversations: list[Conversation] = []
    empty: list[str] = []
    for raw_name, user in data.items():
        name = raw_name.strip()
        history = require(user, "history", file, f"user {name!r}", dict)
        turns: list[Turn] = []
        for day in sorted(history):
            start = parse_datetime(day, file, f"user {name!r} history", day).replace(hour=9)
            exchanges = history[day]
            if not isinstance(exchanges, list):
                raise DatasetError(file, f"user {name!r} history", day, "expected a list of exchanges")
            for index, exchange in enumerate(exchanges):
                where = f"user {name!r} history {day} item {index}"
                stamp = later(start, timedelta(minutes=2 * index + 1), file, where, day) - timedelta(minutes=1)
                turns.append(Turn(f"{day}-{index}-q", "user", require(exchange, "query", file, where), stamp, name))
                turns.append(Turn(f"{day}-{index}-r", "assistant", require(exchange, "response", file, where),
                                  stamp + timedelta(minutes=1), "AI"))  # (checked above)
        probes = [Probe(f"{name}-q{i}", q, None, "memorybank") for i, q in enumerate(questions.get(name, []))]
        try:
            conversations.append(finish(Conversation(f"memorybank-{name}", turns, probes, str(file), NAME), file))
        except EmptyConversation:
            empty.append(f"memorybank-{name}")
    if not conversations:
        raise DatasetError(file, "top level", None, "has no users" + (" with messages" if empty else ""))
    strangers = sorted(set(questions) - {name.strip() for name in data})
    if strangers:  # (their questions were dropped without a word; said once, with the first user)
        asked = sum(len(questions[name]) for name in strangers)
        conversations[0].warnings.append(
            f"{question_file.name} asks {asked} question{'s' if asked != 1 else ''} of "
            f"{len(strangers)} user{'s' if len(strangers) != 1 else ''} not in {file.name} "
            f"({', '.join(map(repr, strangers[:3]))}{', …' if len(strangers) > 3 else ''}): left out")
    return skip_empty(conversations, empty)
