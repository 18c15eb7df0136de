"""Observer and reflector prompts: versioned text, overridable per store.

A prompt is the *system* message of a compaction call; the *user* message is built by
:func:`render_observer_input` / :func:`render_reflector_input` in a fixed, documented layout that
real models read easily and that the offline ``omem/extractive`` model parses:

* observer input: ``<messages>`` with one line per message,
  ``[YYYY-MM-DD HH:MM Ddd] role: content`` (newlines in content folded to `` / ``);
* reflector input: ``<reflection>`` (the current reflection, possibly empty) and
  ``<observations>`` (the unreflected notes, oldest first);
* both end with ``Target length: at most N tokens.``

Text inside the layout (message content, notes) cannot forge it: every line break is folded, and a
``<`` that would open or close one of the layout's tags (``<messages>``, ``</reflection>``, …) is
written ``&lt;`` (:func:`escape_structure`; an ``&lt;`` already there gains an ``amp;``, so
:func:`unescape_structure` restores the text exactly).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from .messages import Message, ObservationRecord, check_text


@dataclass(frozen=True)
class Prompt:
    """A named, versioned prompt. ``sha256`` identifies its exact text (stored with every run)."""

    name: str
    version: str
    text: str
    sha256: str = field(init=False)

    def __post_init__(self) -> None:
        for field_name in ("name", "version", "text"):  # (text=5 was an AttributeError on 'strip')
            check_text(getattr(self, field_name), f"prompt {self.name!r}", field_name)
        if not self.text.strip():
            raise ValueError(f"prompt {self.name!r} version {self.version!r} is empty")
        object.__setattr__(self, "sha256", hashlib.sha256(self.text.encode()).hexdigest())

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"


OBSERVER_PROMPT_V1 = Prompt(
    name="observer",
    version="v1",
    text="""\
You are the observer of a long-running conversation. The messages below have left the model's \
context window; your notes are all that will remain of them. Write observation notes that let \
someone answer any later question about these messages without reading them.

Rules:
- Group notes under a date heading written like `8 May 2023` (the date of the messages they come \
from), then one bullet per fact, event, decision or preference: `- Name: fact`.
- Say who said or did what, using the speaker's name (or "User"/"Assistant").
- Keep every name, number, quantity, price, place, title and date exactly as written.
- Resolve relative dates against the message timestamp and write the absolute date: "yesterday" \
in a message of 8 May 2023 becomes "yesterday (7 May 2023)"; "last week" becomes "the week of \
1 May 2023"; "next month" becomes "June 2023".
- Record preferences and how they change, decisions, plans, commitments, and when something \
planned was completed or cancelled. If a later message contradicts an earlier one, keep the later \
state and say it changed.
- Record what the assistant recommended or produced only when the user relied on it (names of \
tools, final choices, numbers).
- Skip greetings, small talk, filler and repetition. Do not invent or generalise.
- Stay within the target length; prefer dropping the least specific facts over shortening names \
or numbers.
Output only the bullets.""",
)

REFLECTOR_PROMPT_V1 = Prompt(
    name="reflector",
    version="v1",
    text="""\
You maintain the long-term memory of a conversation. Merge the current reflection and the new \
observation notes into one updated reflection.

Rules:
- Keep the layout of the notes: a date heading written like `8 May 2023`, then bullets \
`- Name: fact`, oldest date first.
- Merge duplicates into one bullet. When facts conflict, the newest one wins: keep the latest \
state and note what it replaced ("moved to Berlin in 2023-06, previously Paris").
- Keep every name, number, quantity and date exactly. Keep plans with their status (planned, \
done, cancelled).
- Drop small talk and facts that later notes made obsolete, never specific facts that are still \
true.
- Stay within the target length: when space is short, shorten wording and merge related bullets \
before dropping facts, and drop the least specific facts first.
Output only the bullets.""",
)


def revised(prompt: Prompt, version: str, *edits: tuple[str, str]) -> Prompt:
    """``prompt`` with each ``(old, new)`` edit applied, as ``version``: the change between two
    versions reads as what it is. An ``old`` that is not in the text is an error, not a no-op."""
    text = prompt.text
    for old, new in edits:
        if old not in text:
            raise ValueError(f"{prompt.label}: {old!r} is not in the text")
        text = text.replace(old, new)
    return Prompt(name=prompt.name, version=version, text=text)


# v2: date headings are part of the output, dates in examples use the heading format, and the
# reflector knows its length is a hard limit.
OBSERVER_PROMPT = revised(
    OBSERVER_PROMPT_V1, "v2",
    ("Output only the bullets.", "Output only the date headings and their bullets."),
)
REFLECTOR_PROMPT = revised(
    REFLECTOR_PROMPT_V1, "v2",
    ("moved to Berlin in 2023-06", "moved to Berlin in June 2023"),
    ("drop the least specific facts first.\n",
     "drop the least specific facts first. The length is a hard limit: a reflection that is too long "
     "comes back to you to be rewritten shorter.\n"),
    ("Output only the bullets.", "Output only the date headings and their bullets."),
)

BUILTIN_PROMPTS: dict[str, tuple[Prompt, ...]] = {
    "observer": (OBSERVER_PROMPT, OBSERVER_PROMPT_V1),
    "reflector": (REFLECTOR_PROMPT, REFLECTOR_PROMPT_V1),
}
"""Every shipped prompt version per role, the default first."""


_TAG_TAIL = r"(?=\s*/?\s*(?:messages|reflection|observations)\s*>)"
_ESCAPABLE = re.compile(r"(?:&(?:amp;)*lt;|<)" + _TAG_TAIL, re.IGNORECASE)
_ESCAPED = re.compile(r"&(?:amp;)*lt;" + _TAG_TAIL, re.IGNORECASE)


def escape_structure(text: str) -> str:
    """``text`` with every ``<`` that would open or close a tag of the compaction input layout
    written ``&lt;`` (and an existing ``&lt;`` before such a name written ``&amp;lt;``)."""
    return _ESCAPABLE.sub(lambda m: "&lt;" if m[0] == "<" else "&amp;" + m[0][1:], text)


def unescape_structure(text: str) -> str:
    """The inverse of :func:`escape_structure`."""
    return _ESCAPED.sub(lambda m: "<" if len(m[0]) == 4 else "&" + m[0][5:], text)


def format_timestamp(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M %a")


def render_message_line(message: Message) -> str:
    content = " / ".join(part.strip() for part in escape_structure(message.content).splitlines() if part.strip())
    return f"[{format_timestamp(message.created_at)}] {message.role}: {content}"


def render_observer_input(segment: Iterable[Message], *, target_tokens: int) -> str:
    lines = "\n".join(render_message_line(message) for message in segment)
    return f"<messages>\n{lines}\n</messages>\n\nTarget length: at most {target_tokens} tokens."


def render_reflector_input(
    reflection: ObservationRecord | None,
    observations: Iterable[ObservationRecord],
    *,
    target_tokens: int,
) -> str:
    current = escape_structure(reflection.text.strip()) if reflection is not None else ""
    notes = "\n".join(escape_structure(record.text.strip()) for record in observations)
    return (
        f"<reflection>\n{current}\n</reflection>\n\n<observations>\n{notes}\n</observations>\n\n"
        f"Target length: at most {target_tokens} tokens."
    )


def render_tighten_input(draft: str, *, draft_tokens: int, limit_tokens: int, target_tokens: int) -> str:
    """A second request to the reflector when its reflection came back over the threshold.

    The over-long draft goes back as the observations to merge (there is no separate reflection),
    with a stronger target, so the same prompt and the same input layout apply."""
    return (
        f"Your reflection was {draft_tokens} tokens; it must fit in {limit_tokens}. Rewrite it shorter: "
        "merge duplicates, keep the newest state of each fact, keep exact names, numbers and dates, "
        "and drop the least important lines.\n\n"
        f"<reflection>\n\n</reflection>\n\n<observations>\n{escape_structure(draft.strip())}\n</observations>\n\n"
        f"Target length: at most {target_tokens} tokens."
    )


def as_prompt(value: Prompt | str | None, default: Prompt) -> Prompt:
    """Accept a ``Prompt``, a plain string (version ``custom``), or ``None`` for the default."""
    if value is None:
        return default
    if isinstance(value, Prompt):
        return value
    if isinstance(value, str):
        return Prompt(name=default.name, version="custom", text=value)
    raise TypeError(f"{default.name} prompt must be a Prompt or a str, got {type(value).__name__}")
