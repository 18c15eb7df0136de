"""Model-free retention: does the gold answer survive in what the agent would see?

A probe's score is the share of its gold answer's content words (lower-cased alphanumeric
words, common stop words removed) present anywhere in the visible text. Messages are rendered
for scoring as ``[8 May 2023] Speaker: text``, so dates in the timestamps count (clock times do
not: "13:56" would hand a gold answer of "13" a word it never had).

Retention measures what survives once a probe's evidence has left the window: a probe whose
evidence messages are all still in the final window is not scored (its row says
``evidence_in_window``), by any method, so memory and baselines pool the same probes.

Baselines, scored the same way: *full history* (no compaction), *window only* (no memory), and
*recent tokens* (the newest K tokens of history, K = the final context's size).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import regex

if TYPE_CHECKING:
    from omem_core import Message

# Words are runs of letters (with their combining marks: Devanagari vowel signs, Hebrew points)
# and digits in any script — "zürich", "миша", "हिन्दी" — compared after NFKC normalisation and
# case folding. Chinese and Japanese are written without spaces and the scorer has no segmenter:
# a Han character is a word of its own ("東京" is retained when 東 and 京 both are), a run of
# katakana (names, loanwords: "コーヒー") is one word, and hiragana (particles, inflections) is
# not read — a gold answer written only in hiragana is left unscored rather than matched on
# particles.
_WORD = regex.compile(r"\p{Han}|[\p{Katakana}\u30fc]+|(?:(?![\p{Han}\p{Hiragana}\p{Katakana}\u30fc])[\p{L}\p{N}\p{M}])+")

STOP_WORDS = frozenset(
    """a an the and or but if of at by for with about against between into through during before after
    above below to from up down in out on off over under again further then once here there when where
    why how all any both each few more most other some such no nor not only own same so than too very
    s t can will just don should now is are was were be been being have has had having do does did doing
    i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her
    hers herself it its itself they them their theirs themselves what which who whom this that these
    those am would could also""".split()
)

METHODS = ("memory", "full_history", "window_only", "recent_tokens")


def content_words(text: str) -> set[str]:
    """The words retention compares: letters and digits of any script, lower-cased, no stop words."""
    folded = unicodedata.normalize("NFKC", text).replace("İ", "I").casefold()  # ("İ" folds to i + a dot mark)
    return {w for w in _WORD.findall(folded) if w not in STOP_WORDS}


def render_for_scoring(message: Message) -> str:
    stamp = f"{message.created_at.day} {message.created_at:%B %Y}"
    return f"[{stamp}] {message.content}" if message.role != "system" else message.content


def render_context(messages: Sequence[Message]) -> str:
    return "\n".join(render_for_scoring(m) for m in messages)


def probe_score(gold: str | None, visible: set[str]) -> float | None:
    """Share of the gold answer's content words in ``visible``; ``None`` when unscorable."""
    if gold is None:
        return None
    words = content_words(gold)
    if not words:
        return None
    return len(words & visible) / len(words)


def newest_tokens(history: Sequence[Message], budget: int, count: Callable[[list[str]], list[int]]) -> list[Message]:
    """The newest messages of ``history`` whose volume fits ``budget`` (the recency baseline)."""
    counts = count([m.content for m in history]) if history else []
    kept: list[Message] = []
    used = 0
    for message, tokens in zip(reversed(history), reversed(counts)):
        if used + tokens > budget:
            break
        kept.append(message)
        used += tokens
    return kept[::-1]


@dataclass(frozen=True)
class RetentionSummary:
    retention: float | None
    full_history: float | None
    window_only: float | None
    recent_tokens: float | None
    scored: int
    per_category: dict[str, dict[str, float | int | None]]
    in_window: int = 0  # probes not scored: their evidence is all still in the final window

    @property
    def relative(self) -> float | None:
        if self.retention is None or not self.full_history:
            return None
        return self.retention / self.full_history


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(rows: Sequence[dict]) -> RetentionSummary:
    """Mean scores per method, overall and per category, over probes every method scored."""
    by_probe: dict[str, dict[str, float]] = {}
    category: dict[str, str] = {}
    for row in rows:
        if row["method"] in METHODS and row["score"] is not None:
            by_probe.setdefault(row["probe_id"], {})[row["method"]] = row["score"]
            category[row["probe_id"]] = row["category"]
    complete = {p: s for p, s in by_probe.items() if all(m in s for m in METHODS)}

    def means(probes: dict[str, dict[str, float]]) -> dict[str, float | None]:
        return {m: _mean([s[m] for s in probes.values()]) for m in METHODS}

    overall = means(complete)
    per_category = {
        cat: {**means({p: s for p, s in complete.items() if category[p] == cat}),
              "probes": sum(1 for p in complete if category[p] == cat)}  # a count (JSON: 32, not 32.0)
        for cat in sorted({category[p] for p in complete})
    }
    waiting = {row["probe_id"] for row in rows if row["method"] in METHODS and row.get("evidence_in_window")}
    return RetentionSummary(overall["memory"], overall["full_history"], overall["window_only"],
                            overall["recent_tokens"], len(complete), per_category, len(waiting))


def evidence_in_window(probe: Any, window_ids: set[str]) -> bool:
    """Whether every evidence message of ``probe`` is still in the window (so nothing of it has
    had to survive yet: not scored). A probe without evidence is scored."""
    return bool(probe.evidence) and all(e in window_ids for e in probe.evidence)


def score_retention(conversation: Any, context: Sequence[Message], window: Sequence[Message], budget: int,
                    count: Callable[[list[str]], list[int]],
                    recorder: Any = None) -> RetentionSummary:
    """Score every probe of ``conversation`` against the final context and the three baselines
    (full history, window only, the newest ``budget`` tokens); ``recorder`` keeps the rows."""
    history = [t.to_message(conversation.id) for t in conversation.turns]
    visible = {
        "memory": content_words(render_context(context)),
        "full_history": content_words(render_context(history)),
        "window_only": content_words(render_context(window)),
        "recent_tokens": content_words(render_context(newest_tokens(history, budget, count))),
    }
    window_ids = {m.id for m in window}
    rows = []
    for probe in conversation.probes:
        waiting = evidence_in_window(probe, window_ids)
        for method in METHODS:
            rows.append({
                "probe_id": probe.id, "method": method, "question": probe.question, "gold": probe.gold,
                "category": probe.category, "evidence": list(probe.evidence), "evidence_in_window": waiting,
                "score": None if waiting else probe_score(probe.gold, visible[method]), "answer": None,
            })
    if recorder is not None:
        recorder.save_probes([{**r, "evidence": json.dumps(r["evidence"])} for r in rows], METHODS)
    return summarise(rows)
