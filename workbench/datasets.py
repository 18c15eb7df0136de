"""Conversation datasets: the project's JSON Lines format and loaders for public formats.

Every loader returns :class:`Conversation` objects; a malformed file raises :class:`DatasetError`
naming the file, the record (line or index) and the field. Evidence ids that point nowhere are
not fatal: they are dropped, counted and reported in ``Conversation.warnings``.

Formats (``--format``; auto-detected by content when omitted):

* ``omem``: JSON Lines, documented in ``datasets/README.md`` (read line by line, streaming);
* ``locomo``: LoCoMo-style JSON (a list of samples with ``conversation`` and ``qa``);
* ``beam``: a BEAM chat folder (``chat.json`` + ``probing_questions.json``);
* ``openai``: ``{"messages": [...]}`` objects (one JSON document, a list, or JSON Lines) and
  ChatGPT data exports (``mapping`` trees);
* ``sharegpt``: ``{"conversations": [{"from": "human", "value": ...}]}`` lists;
* ``memorybank``: MemoryBank's ``memory_bank_en.json`` (+ ``probing_questions_en.jsonl``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from omem_core import Message

FORMATS = ("omem", "locomo", "beam", "openai", "sharegpt", "memorybank")
ROLES = ("user", "assistant", "system", "tool")
_EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)


class DatasetError(ValueError):
    """A dataset file that cannot be read, with where and what."""

    def __init__(self, file: str | Path, record: str, field_name: str | None, problem: str) -> None:
        self.file, self.record, self.field, self.problem = str(file), record, field_name, problem
        where = f"{file}: {record}" + (f": field {field_name!r}" if field_name else "")
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True, slots=True)
class Turn:
    """One message of a dataset conversation."""

    id: str
    role: str
    text: str
    created_at: datetime
    speaker: str | None = None

    @property
    def content(self) -> str:
        """The message as the agent stores it: ``Speaker: text`` when a speaker is named."""
        return f"{self.speaker}: {self.text}" if self.speaker else self.text

    def to_message(self, thread_id: str) -> Message:
        return Message(id=self.id, thread_id=thread_id, role=self.role, content=self.content,
                       created_at=self.created_at)


@dataclass(frozen=True, slots=True)
class Probe:
    """A question about the conversation, with its gold answer and evidence message ids."""

    id: str
    question: str
    gold: str | None
    category: str
    evidence: tuple[str, ...] = ()


@dataclass
class Conversation:
    id: str
    turns: list[Turn]
    probes: list[Probe] = field(default_factory=list)
    source: str = ""
    format: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def dangling_evidence(self) -> int:
        return sum(1 for w in self.warnings if w.startswith("evidence"))


# -- helpers ---------------------------------------------------------------------------------


def _require(obj: Any, key: str, file: Path, record: str, kind: type | tuple[type, ...] = str) -> Any:
    if not isinstance(obj, dict):
        raise DatasetError(file, record, None, f"expected a JSON object, got {type(obj).__name__}")
    if key not in obj or obj[key] is None:
        raise DatasetError(file, record, key, "missing")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DatasetError(file, record, key, f"expected {names}, got {type(value).__name__}")
    return value


def _timestamp(value: str, file: Path, record: str, key: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise DatasetError(file, record, key, f"not an ISO-8601 timestamp: {value!r}") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _load_json(file: Path) -> Any:
    try:
        with file.open("rb") as handle:
            return json.load(handle)
    except UnicodeDecodeError as exc:
        raise DatasetError(file, f"byte {exc.start}", None, "not valid UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise DatasetError(file, f"line {exc.lineno} column {exc.colno}", None, f"invalid JSON: {exc.msg}") from exc
    except OSError as exc:
        raise DatasetError(file, "file", None, f"cannot be read: {exc.strerror or exc}") from exc


def _json_lines(file: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, object)`` for each non-empty line, streaming."""
    try:
        with file.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as exc:
                    raise DatasetError(file, f"line {number}", None, "not valid UTF-8") from exc
                if not line:
                    continue
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(file, f"line {number}", None, f"invalid JSON: {exc.msg}") from exc
    except OSError as exc:
        raise DatasetError(file, "file", None, f"cannot be read: {exc.strerror or exc}") from exc


def _check_unique_and_evidence(conversation: Conversation, file: Path) -> Conversation:
    if not conversation.turns:
        raise DatasetError(file, f"conversation {conversation.id!r}", None, "has no messages")
    seen: set[str] = set()
    for index, turn in enumerate(conversation.turns):
        if turn.id in seen:
            raise DatasetError(file, f"conversation {conversation.id!r} message {index}", "id",
                               f"duplicate message id {turn.id!r}")
        seen.add(turn.id)
    probes = []
    for probe in conversation.probes:
        kept = tuple(e for e in probe.evidence if e in seen)
        for missing in (e for e in probe.evidence if e not in seen):
            conversation.warnings.append(
                f"evidence {missing!r} of probe {probe.id!r} points to no message")
        probes.append(Probe(probe.id, probe.question, probe.gold, probe.category, kept))
    conversation.probes = probes
    return conversation


# -- the project's own format ----------------------------------------------------------------


def load_omem(file: Path) -> list[Conversation]:
    conversations: dict[str, Conversation] = {}
    for number, obj in _json_lines(file):
        record = f"line {number}"
        conversation_id = _require(obj, "conversation_id", file, record)
        conversation = conversations.setdefault(
            conversation_id, Conversation(conversation_id, [], source=str(file), format="omem"))
        kind = obj.get("type", "probe" if "question" in obj else "message")
        if kind == "message":
            role = _require(obj, "role", file, record)
            if role not in ROLES:
                raise DatasetError(file, record, "role", f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
            speaker = obj.get("speaker")
            if speaker is not None and not isinstance(speaker, str):
                raise DatasetError(file, record, "speaker", "expected str")
            conversation.turns.append(Turn(
                id=_require(obj, "id", file, record),
                role=role,
                text=_require(obj, "content", file, record),
                created_at=_timestamp(_require(obj, "timestamp", file, record), file, record, "timestamp"),
                speaker=speaker,
            ))
        elif kind == "probe":
            evidence = obj.get("evidence", [])
            if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
                raise DatasetError(file, record, "evidence", "expected a list of message ids")
            gold = obj.get("answer")
            conversation.probes.append(Probe(
                id=_require(obj, "id", file, record),
                question=_require(obj, "question", file, record),
                gold=None if gold is None else str(gold),
                category=str(obj.get("category", "uncategorised")),
                evidence=tuple(evidence),
            ))
        else:
            raise DatasetError(file, record, "type", f"unknown record type {kind!r}; expected message or probe")
    if not conversations:
        raise DatasetError(file, "file", None, "has no records")
    return [_check_unique_and_evidence(c, file) for c in conversations.values()]


# -- LoCoMo ----------------------------------------------------------------------------------

_EVIDENCE_ID = re.compile(r"D\d+:\d+")


def _locomo_time(value: str, file: Path, record: str, key: str) -> datetime:
    try:
        return datetime.strptime(value.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=timezone.utc)
    except ValueError as exc:
        raise DatasetError(file, record, key, f"unrecognised session date-time {value!r}") from exc


def load_locomo(file: Path, data: Any = None) -> list[Conversation]:
    data = _load_json(file) if data is None else data
    if not isinstance(data, list):
        raise DatasetError(file, "top level", None, "expected a list of LoCoMo samples")
    conversations = []
    for index, sample in enumerate(data):
        record = f"sample {index}"
        sample_id = str(sample.get("sample_id", index)) if isinstance(sample, dict) else str(index)
        convo = _require(sample, "conversation", file, record, dict)
        speaker_a = _require(convo, "speaker_a", file, f"{record} conversation")
        sessions = sorted(
            (int(key.split("_")[1]), key) for key in convo
            if re.fullmatch(r"session_\d+", key)
        )
        turns: list[Turn] = []
        for number, key in sessions:
            where = f"{record} {key}"
            start = _locomo_time(_require(convo, f"{key}_date_time", file, f"{record} conversation"),
                                 file, f"{record} conversation", f"{key}_date_time")
            session = convo[key]
            if not isinstance(session, list):
                raise DatasetError(file, where, key, "expected a list of turns")
            for position, turn in enumerate(session):
                turn_where = f"{where} turn {position}"
                speaker = _require(turn, "speaker", file, turn_where)
                text = turn.get("text") if isinstance(turn, dict) else None
                text = text if isinstance(text, str) else ""
                if turn.get("blip_caption"):
                    text = f"{text} [shares an image: {turn['blip_caption']}]".strip()
                if not text:
                    raise DatasetError(file, turn_where, "text", "missing")
                turns.append(Turn(
                    id=_require(turn, "dia_id", file, turn_where),
                    role="user" if speaker == speaker_a else "assistant",
                    text=text,
                    created_at=start + timedelta(seconds=30 * position),
                    speaker=speaker,
                ))
        probes = []
        warnings: list[str] = []
        qa_items = sample.get("qa") or []
        if not isinstance(qa_items, list):
            raise DatasetError(file, record, "qa", f"expected a list, got {type(qa_items).__name__}")
        for q_index, qa in enumerate(qa_items):
            where = f"{record} qa {q_index}"
            question = _require(qa, "question", file, where)
            category = qa.get("category")
            # Category 5 (adversarial) asks about something the conversation never says; its
            # `adversarial_answer` is the trap, not a fact to retain, so such probes have no gold.
            gold = None if category == 5 else qa.get("answer")
            raw_evidence = qa.get("evidence") or []
            if not isinstance(raw_evidence, list):
                raise DatasetError(file, where, "evidence", f"expected a list, got {type(raw_evidence).__name__}")
            evidence: list[str] = []
            for item in raw_evidence:
                found = _EVIDENCE_ID.findall(str(item))
                if not found:
                    warnings.append(f"evidence {item!r} of probe {sample_id}-q{q_index} is malformed")
                evidence.extend(found)
            probes.append(Probe(
                id=f"{sample_id}-q{q_index}",
                question=question,
                gold=None if gold is None else str(gold),
                category=str(category),
                evidence=tuple(evidence),
            ))
        conversation = Conversation(sample_id, turns, probes, str(file), "locomo", warnings)
        conversations.append(_check_unique_and_evidence(conversation, file))
    return conversations


# -- BEAM ------------------------------------------------------------------------------------

_BEAM_SUFFIX = re.compile(r"\s*->->\s*\d+\s*,\s*\d+\s*$")
_BEAM_GOLD = ("answer", "ideal_answer", "ideal_response", "ideal_summary", "expected_compliance")


def _beam_anchor(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    for pattern in ("%B-%d-%Y", "%b-%d-%Y", "%Y-%m-%d"):
        try:
            return datetime.strptime(value.strip(), pattern).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


def _flatten_ids(value: Any) -> list[str]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, str)):
        return [str(value)]
    if isinstance(value, list):
        return [i for item in value for i in _flatten_ids(item)]
    if isinstance(value, dict):
        return [i for item in value.values() for i in _flatten_ids(item)]
    return []


def load_beam(path: Path) -> list[Conversation]:
    folder = path if path.is_dir() else path.parent
    chat_file = folder / "chat.json" if path.is_dir() else path
    data = _load_json(chat_file)
    if not isinstance(data, list):
        raise DatasetError(chat_file, "top level", None, "expected a list of batches")
    turns: list[Turn] = []
    clock: datetime | None = None
    for b_index, batch in enumerate(data):
        where = f"batch {b_index}"
        groups = _require(batch, "turns", chat_file, where, list)
        clock = _beam_anchor(batch.get("time_anchor")) or clock
        for g_index, group in enumerate(groups):
            items = group if isinstance(group, list) else [group]
            for m_index, item in enumerate(items):
                m_where = f"{where} turn {g_index} message {m_index}"
                role = _require(item, "role", chat_file, m_where)
                if role not in ROLES:
                    raise DatasetError(chat_file, m_where, "role", f"unknown role {role!r}")
                message_id = _require(item, "id", chat_file, m_where, (int, str))
                anchor = _beam_anchor(item.get("time_anchor"))
                if anchor is not None and (clock is None or anchor > clock):
                    clock = anchor
                clock = (clock or _EPOCH) + timedelta(minutes=1)
                turns.append(Turn(str(message_id), role,
                                  _BEAM_SUFFIX.sub("", _require(item, "content", chat_file, m_where)), clock))
    probes = []
    probe_file = folder / "probing_questions.json"
    if probe_file.exists():
        questions = _load_json(probe_file)
        if not isinstance(questions, dict):
            raise DatasetError(probe_file, "top level", None, "expected an object of categories")
        for category, items in questions.items():
            for index, item in enumerate(items if isinstance(items, list) else []):
                where = f"{category} {index}"
                gold = next((item[k] for k in _BEAM_GOLD if isinstance(item, dict) and item.get(k)), None)
                probes.append(Probe(
                    id=f"{category}-{index}",
                    question=_require(item, "question", probe_file, where),
                    gold=None if gold is None else str(gold),
                    category=category,
                    evidence=tuple(_flatten_ids(item.get("source_chat_ids"))),
                ))
    conversation = Conversation(f"beam-{folder.name}", turns, probes, str(folder), "beam")
    return [_check_unique_and_evidence(conversation, chat_file)]


# -- OpenAI / ShareGPT / ChatGPT exports -------------------------------------------------------

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
                   "assistant": "assistant", "bing": "assistant", "bard": "assistant", "system": "system",
                   "tool": "tool", "function": "tool"}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        parts = [p.get("text") if isinstance(p, dict) else p for p in content]
        return "\n".join(p for p in parts if isinstance(p, str)).strip()
    if isinstance(content, dict) and isinstance(content.get("parts"), list):  # ChatGPT export
        return "\n".join(p for p in content["parts"] if isinstance(p, str)).strip()
    return ""


def _from_messages(conv_id: str, messages: list[Any], file: Path, record: str, fmt: str) -> Conversation:
    turns = []
    for index, item in enumerate(messages):
        where = f"{record} message {index}"
        role_key, text_key = ("from", "value") if fmt == "sharegpt" else ("role", "content")
        raw_role = _require(item, role_key, file, where)
        role = _SHAREGPT_ROLES.get(raw_role.lower()) if fmt == "sharegpt" else raw_role
        if role not in ROLES:
            raise DatasetError(file, where, role_key, f"unknown role {raw_role!r}")
        if text_key not in item:
            raise DatasetError(file, where, text_key, "missing")
        stamp = item.get("timestamp") or item.get("created_at")
        created = (_timestamp(stamp, file, where, "timestamp") if isinstance(stamp, str)
                   else _EPOCH + timedelta(minutes=index))
        turns.append(Turn(str(item.get("id", f"{conv_id}-{index}")), role, _text_of(item[text_key]),
                          created, item.get("name") if isinstance(item.get("name"), str) else None))
    return _check_unique_and_evidence(Conversation(conv_id, turns, [], str(file), fmt), file)


def _from_chatgpt(obj: dict[str, Any], index: int, file: Path) -> Conversation:
    def stamp(message: dict[str, Any]) -> float:
        value = message.get("create_time")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0

    nodes = [n for n in obj["mapping"].values() if isinstance(n, dict) and isinstance(n.get("message"), dict)]
    nodes.sort(key=lambda n: stamp(n["message"]))
    turns = []
    for node in nodes:
        message = node["message"]
        author = message.get("author")
        role = author.get("role", "") if isinstance(author, dict) else ""
        text = _text_of(message.get("content"))
        if role not in ROLES or not text:
            continue
        try:
            created = (datetime.fromtimestamp(stamp(message), tz=timezone.utc) if stamp(message)
                       else _EPOCH + timedelta(minutes=len(turns)))
        except (OverflowError, OSError, ValueError):
            created = _EPOCH + timedelta(minutes=len(turns))
        turns.append(Turn(str(message.get("id", node.get("id"))), role, text, created))
    conv_id = str(obj.get("id") or obj.get("conversation_id") or obj.get("title") or f"conversation-{index}")
    return _check_unique_and_evidence(Conversation(conv_id, turns, [], str(file), "openai"), file)


def load_chat_export(file: Path, fmt: str) -> list[Conversation]:
    if file.suffix == ".jsonl":
        items = [obj for _, obj in _json_lines(file)]
    else:
        data = _load_json(file)
        items = data if isinstance(data, list) else [data]
    conversations = []
    for index, obj in enumerate(items):
        record = f"conversation {index}"
        if not isinstance(obj, dict):
            raise DatasetError(file, record, None, "expected a JSON object")
        conv_id = str(obj.get("id", obj.get("conversation_id", f"conversation-{index}")))
        if fmt == "openai" and isinstance(obj.get("mapping"), dict):
            conversations.append(_from_chatgpt(obj, index, file))
        elif fmt == "sharegpt":
            conversations.append(_from_messages(conv_id, _require(obj, "conversations", file, record, list),
                                                file, record, fmt))
        else:
            conversations.append(_from_messages(conv_id, _require(obj, "messages", file, record, list),
                                                file, record, fmt))
    if not conversations:
        raise DatasetError(file, "file", None, "has no conversations")
    return conversations


# -- MemoryBank ------------------------------------------------------------------------------


def load_memorybank(path: Path) -> list[Conversation]:
    file = path / "memory_bank_en.json" if path.is_dir() else path
    data = _load_json(file)
    if not isinstance(data, dict):
        raise DatasetError(file, "top level", None, "expected an object of users")
    questions: dict[str, list[str]] = {}
    question_file = file.parent / "probing_questions_en.jsonl"
    if question_file.exists():
        for _, obj in _json_lines(question_file):
            if isinstance(obj, dict):
                for name, items in obj.items():
                    if isinstance(items, list):
                        questions.setdefault(name.strip(), []).extend(q for q in items if isinstance(q, str))
    conversations = []
    for raw_name, user in data.items():
        name = raw_name.strip()
        history = _require(user, "history", file, f"user {name!r}", dict)
        turns: list[Turn] = []
        for day in sorted(history):
            try:
                start = datetime.strptime(day, "%Y-%m-%d").replace(hour=9, tzinfo=timezone.utc)
            except ValueError as exc:
                raise DatasetError(file, f"user {name!r} history", day, "not a YYYY-MM-DD date") from exc
            exchanges = history[day]
            if not isinstance(exchanges, list):
                raise DatasetError(file, f"user {name!r} history", day, "expected a list of exchanges")
            for index, exchange in enumerate(exchanges):
                where = f"user {name!r} history {day} item {index}"
                stamp = start + timedelta(minutes=2 * index)
                turns.append(Turn(f"{day}-{index}-q", "user", _require(exchange, "query", file, where), stamp, name))
                turns.append(Turn(f"{day}-{index}-r", "assistant", _require(exchange, "response", file, where),
                                  stamp + timedelta(minutes=1), "AI"))
        probes = [Probe(f"{name}-q{i}", q, None, "memorybank") for i, q in enumerate(questions.get(name, []))]
        conversations.append(_check_unique_and_evidence(
            Conversation(f"memorybank-{name}", turns, probes, str(file), "memorybank"), file))
    return conversations


# -- detection and the entry point ------------------------------------------------------------


def detect_format(path: Path) -> str:
    """Guess a dataset's format from its content (``--format`` overrides)."""
    if path.is_dir():
        if (path / "chat.json").exists():
            return "beam"
        if (path / "memory_bank_en.json").exists():
            return "memorybank"
        raise DatasetError(path, "folder", None, "holds neither chat.json (BEAM) nor memory_bank_en.json")
    if path.name == "chat.json":
        return "beam"
    if path.suffix == ".jsonl":
        for number, obj in _json_lines(path):
            if isinstance(obj, dict) and "conversation_id" in obj and ("role" in obj or "question" in obj or "type" in obj):
                return "omem"
            if isinstance(obj, dict) and "messages" in obj:
                return "openai"
            if isinstance(obj, dict) and "conversations" in obj:
                return "sharegpt"
            raise DatasetError(path, f"line {number}", None, "format not recognised; pass --format")
        raise DatasetError(path, "file", None, "is empty")
    data = _load_json(path)
    first = data[0] if isinstance(data, list) and data else data
    if isinstance(first, dict):
        if "conversation" in first and "qa" in first:
            return "locomo"
        if "conversations" in first:
            return "sharegpt"
        if "messages" in first or "mapping" in first:
            return "openai"
        if first and all(isinstance(v, dict) and "history" in v for v in first.values()):
            return "memorybank"
    raise DatasetError(path, "top level", None, f"format not recognised; pass --format ({', '.join(FORMATS)})")


def load_dataset(path: str | Path, format: str | None = None) -> list[Conversation]:
    """Load every conversation of a dataset file or folder."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(path, "file", None, "does not exist")
    if format is not None and format not in FORMATS:
        raise DatasetError(path, "--format", None, f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    fmt = format or detect_format(path)
    if fmt == "omem":
        return load_omem(path)
    if fmt == "locomo":
        return load_locomo(path)
    if fmt == "beam":
        return load_beam(path)
    if fmt == "memorybank":
        return load_memorybank(path)
    return load_chat_export(path, fmt)


def load_conversation(path: str | Path, conversation_id: str | None = None,
                      format: str | None = None) -> Conversation:
    conversations = load_dataset(path, format)
    if conversation_id is None:
        return conversations[0]
    for conversation in conversations:
        if conversation.id == conversation_id:
            return conversation
    raise DatasetError(path, f"conversation {conversation_id!r}", None,
                       f"not found; available: {', '.join(c.id for c in conversations)}")
