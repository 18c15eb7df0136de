"""Pure steps of a read: what the records say, which segment is due, what the agent sees.

No I/O and no model calls here; the wrapper feeds these functions what it read and acts on the
answer. The same functions back the side-effect-free ``inspect``.
"""

from __future__ import annotations

import re

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .messages import Message, ObservationRecord

MEMORY_MESSAGE_PREFIX = "omem-memory:"


@dataclass(frozen=True, slots=True)
class MemoryView:
    """What a thread's records amount to."""

    reflection: ObservationRecord | None
    unreflected: tuple[ObservationRecord, ...]
    cursor: str | None  # id of the newest message an observation covers


def view_of(records: Sequence[ObservationRecord]) -> MemoryView:
    """The newest reflection, the observations it does not cover (oldest first), and the cursor.

    ``records`` is a creation-ordered list: the whole store or its ``list_recent`` suffix (which
    starts early enough to hold every observation the newest reflection leaves uncovered, so both
    give the same view). An observation created after the newest reflection is never covered by
    it (a reflection covers records that existed when it was made), so only the observations
    *before* it need a membership check; the usual one is the reflection's newest source, and
    otherwise the reflection's source set is built once per record object (:func:`covered_by`).
    """
    reflection_at = -1
    cursor: str | None = None
    for index in range(len(records) - 1, -1, -1):
        record = records[index]
        if record.kind == "reflection":
            if reflection_at < 0:
                reflection_at = index
        elif cursor is None and record.source_ids:
            cursor = record.source_ids[-1]
        if reflection_at >= 0 and cursor is not None:
            break
    if reflection_at < 0:
        unreflected = tuple(r for r in records if r.kind == "observation")
        return MemoryView(reflection=None, unreflected=unreflected, cursor=cursor)
    reflection = records[reflection_at]
    sources = reflection.source_ids
    covered: frozenset[str] | None = None
    earlier: list[ObservationRecord] = []
    for record in records[:reflection_at]:
        if record.kind != "observation" or (sources and record.id == sources[-1]):
            continue
        if covered is None:
            covered = covered_by(reflection)
        if record.id not in covered:
            earlier.append(record)
    later = [r for r in records[reflection_at + 1 :] if r.kind == "observation"]
    return MemoryView(reflection=reflection, unreflected=tuple(earlier + later), cursor=cursor)


_COVERED: OrderedDict[int, tuple[ObservationRecord, frozenset[str]]] = OrderedDict()
_COVERED_ENTRIES = 16
_COVERED_MIN = 512  # smaller sets are cheaper to rebuild than to keep


def covered_by(reflection: ObservationRecord) -> frozenset[str]:
    """``frozenset(reflection.source_ids)``; for a long source list, built once per record object
    and kept in a small cache (a reflection's source list grows with the thread, so building the
    set on every read would make reads grow with the history)."""
    key = id(reflection)
    hit = _COVERED.get(key)
    if hit is not None and hit[0] is reflection:
        _COVERED.move_to_end(key)
        return hit[1]
    covered = frozenset(reflection.source_ids)
    if len(covered) >= _COVERED_MIN:
        _COVERED[key] = (reflection, covered)
        while len(_COVERED) > _COVERED_ENTRIES:
            _COVERED.popitem(last=False)
    return covered


def segment_length(counts: Sequence[int], threshold: int) -> int:
    """How many of the oldest backlog messages form the next segment.

    The longest oldest-first run whose volume does not exceed ``threshold``, and at least one
    message (a single message larger than the threshold is observed alone).
    """
    total = 0
    for index, count in enumerate(counts):
        total += count
        if total > threshold:
            return max(1, index)
    return len(counts)


def segment_budget(backlog_volume: int, threshold: int, max_backlog: int | None, max_input_tokens: int) -> int:
    """The volume the next segment may take: the observation threshold, and when the backlog
    exceeds ``max_backlog``, the threshold plus the excess (at most ``max_input_tokens``), so a
    backlog that grows by more than one segment per read stops growing."""
    if max_backlog is None or backlog_volume <= max_backlog:
        return threshold
    return min(max_input_tokens, max(threshold, threshold + backlog_volume - max_backlog))


OMISSION_MARKER = "[... {omitted:,} tokens of this message omitted ...]"
OMISSION = re.compile(r"\[\.\.\. [\d,]+ tokens of this message omitted \.\.\.\]")  # the marker, found


def cut_middle(text: str, limit: int, count: Callable[[str], int]) -> str:
    """``text`` cut to about ``limit`` tokens: its head and its tail around an explicit marker
    saying how much was left out. ``text`` itself when it fits. Deterministic."""
    total = count(text)
    if total <= limit:
        return text
    marker = OMISSION_MARKER.format(omitted=total)
    budget = max(2, limit - count(marker) - 2)
    head_budget, tail_budget = budget - budget // 3, budget // 3  # the opening usually says more
    per_token = len(text) / max(total, 1)

    def fit(take: int, budget: int, from_end: bool) -> str:
        while take > 0:
            piece = text[len(text) - take:] if from_end else text[:take]
            if count(piece) <= budget:
                return piece
            take = int(take * 0.9)
        return ""

    head = _whole_words(text, fit(int(head_budget * per_token), head_budget, False), False)
    tail = _whole_words(text, fit(int(tail_budget * per_token), tail_budget, True), True)
    omitted = total - count(head) - count(tail)
    return f"{head.rstrip()} {OMISSION_MARKER.format(omitted=max(omitted, 0))} {tail.lstrip()}"


def _whole_words(text: str, piece: str, from_end: bool) -> str:
    """``piece`` (a head or a tail of ``text``) without a part-word at its cut, when a space or
    line break in its last (first) fifth allows: "…named Zephyr" rather than "…named Zephyr ju"."""
    if not piece:
        return piece
    if from_end:
        cut = len(text) - len(piece)
        if cut == 0 or text[cut - 1].isspace() or piece[0].isspace():
            return piece
        gap = _SPACE.search(piece)
        return piece[gap.end():] if gap is not None and gap.start() <= len(piece) // 5 else piece
    if len(piece) == len(text) or text[len(piece)].isspace() or piece[-1].isspace():
        return piece
    gaps = [m.start() for m in _SPACE.finditer(piece, max(0, len(piece) - len(piece) // 5))]
    return piece[:gaps[-1]] if gaps and gaps[-1] > 0 else piece


_SPACE = re.compile(r"\s+")


def memory_text(view: MemoryView) -> str:
    """The derived system message's text: the reflection, then unreflected observations."""
    parts = [view.reflection.text] if view.reflection is not None else []
    parts.extend(record.text for record in view.unreflected)
    return "\n\n".join(parts)


def render_memory(view: MemoryView, thread_id: str, window: Sequence[Message] = ()) -> Message | None:
    """One ``system`` message carrying the memory, or ``None`` when the thread has no records.

    Its id is ``omem-memory:`` and the newest record's id, unless a message of ``window`` has that
    id already: wrappers stacked on one another that observed the same segment render records of
    the same id, and the inner one's memory message is in the outer one's window. The outer one's
    then takes ``#2`` (``#3``…) after it, so no read returns two messages under one id."""
    records = ([view.reflection] if view.reflection is not None else []) + list(view.unreflected)
    if not records:
        return None
    # (ties, a fixed or coarse clock: the later in order, the one saved last; the first kept the id
    # of the first note while the content changed)
    newest = max(enumerate(records), key=lambda pair: (pair[1].created_at, pair[0]))[1]
    base, taken, number = f"{MEMORY_MESSAGE_PREFIX}{newest.id}", {m.id for m in window}, 1
    memory_id = base
    while memory_id in taken:
        number += 1
        memory_id = f"{base}#{number}"
    return Message(
        id=memory_id,
        thread_id=thread_id,
        role="system",
        content=memory_text(view),
        created_at=newest.created_at,
        resource_id=newest.resource_id,
    )


def observer_target_tokens(segment_volume: int) -> int:
    """The length asked of the observer: about 30% of the segment, at least 48 tokens."""
    return max(48, (segment_volume * 3 + 9) // 10)


REFLECTION_INPUT_RATIO = 0.55


def reflector_target_tokens(threshold: int, input_volume: int) -> int:
    """The length asked of the reflector: about 55% of what it condenses (the current reflection
    plus the unreflected observations), never more than the reflection threshold.

    A reflection therefore grows with the conversation only until it reaches the threshold, and
    the rendered memory stays within the reflection (at most ``threshold``) plus the unreflected
    observations (at most ``threshold`` plus one observation), whatever the thread's length.
    """
    return min(threshold, max(48, int(input_volume * REFLECTION_INPUT_RATIO)))
