"""LLM-judged retention: an answerer answers each probe from the visible context, a judge grades.

Both are litellm model strings. Verdicts are stored per probe (method ``llm_judge``) with the
answer. :func:`estimate` says how many calls and roughly what they cost before anything runs.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import litellm

from omem_core._env import error_text, redact_secrets
from omem_core.tokens import heuristic_count

from .datasets import Probe
from .errors import WorkbenchError

ANSWER_PROMPT = (
    "Answer the question using only the conversation memory and recent messages below. "
    "Answer in one short sentence. If the context does not contain the answer, say \"I don't know\".\n\n"
    "<context>\n{context}\n</context>\n\n{asked}Question: {question}"
)
ASKED_LINE = "Today's date: {date}\n"
ABSTENTION_GOLD = ("The conversation does not contain this; a correct answer says it does not know or that it was "
                   "never mentioned, without inventing one.")
JUDGE_PROMPT = (
    "You grade answers. Given a question, a gold answer and a candidate answer, reply with exactly "
    "one word: CORRECT if the candidate conveys the gold answer's key facts (wording may differ), "
    "otherwise WRONG.\n\nQuestion: {question}\nGold answer: {gold}\nCandidate answer: {answer}"
)


@dataclass(frozen=True)
class Estimate:
    calls: int
    input_tokens: int
    cost_usd: float | None

    def describe(self) -> str:
        cost = ("free" if self.cost_usd == 0 else f"~${self.cost_usd:.4f}"
                if self.cost_usd is not None else "unknown cost (model not in litellm's price map)")
        return f"{self.calls} model calls, ~{self.input_tokens:,} input tokens, {cost}"


def abstention_gold(probe: Probe) -> str:
    """What an abstention probe's answer is graded against: declining, with the dataset's own
    note when it has one (LongMemEval: "You mentioned a cat, but not a dog"; BEAM's ideal
    response), which tells the judge what a confused answer would mix up."""
    reference = (getattr(probe, "reference", None) or "").strip()
    return ABSTENTION_GOLD + (f" The dataset's note: {reference}" if reference else "")


def answer_prompt(probe: Probe, context: str) -> str:
    """What the answerer is asked: the context, the date the question is asked on (when the
    dataset gives it: temporal questions such as "how many days ago…" need it) and the question."""
    asked_at = getattr(probe, "asked_at", None)
    asked = "" if asked_at is None else ASKED_LINE.format(date=asked_at.strftime("%Y-%m-%d (%A) %H:%M"))
    return ANSWER_PROMPT.format(context=context, asked=asked, question=probe.question)


def _cost(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    try:
        prompt_cost, completion_cost = litellm.cost_per_token(
            model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        return float(prompt_cost + completion_cost)
    except Exception:
        return None


# One probe's two calls in tokens, for both estimates (a replay's here, an experiment's in
# ``experiments.estimate_judging``), meant to err high: the prompts' own text (about 60 and 70
# tokens, plus the date line), the answer as long as it is asked to be at most, a one-word grade.
ANSWER_OVERHEAD, ANSWER_OUT = 75, 40
JUDGE_OVERHEAD, JUDGE_OUT = 80, 5
# when the probes' own text is not at hand (an experiment's estimate reads only their number)
TYPICAL_QUESTION, TYPICAL_GOLD = 40, 60


def probe_tokens(context: int, question: int = TYPICAL_QUESTION, gold: int = TYPICAL_GOLD) -> tuple[int, int, int, int]:
    """Tokens of one probe's calls: (answerer in, answerer out, judge in, judge out). The judge
    reads the question, the gold answer and the answer."""
    return (context + question + ANSWER_OVERHEAD, ANSWER_OUT,
            question + gold + ANSWER_OUT + JUDGE_OVERHEAD, JUDGE_OUT)


def total_cost(costs: Sequence[float | None]) -> float | None:
    """The sum of calls' costs, or ``None`` when any is unknown (litellm does not know the
    model's price): an unknown cost is never counted as $0."""
    return None if None in costs else known_cost(costs)


def known_cost(costs: Sequence[float | None]) -> float:
    """The sum of the calls' costs that are known."""
    return float(sum(c for c in costs if c))


def estimate(probes: Sequence[Probe], context: str, answerer: str, judge: str) -> Estimate:
    scorable = [p for p in probes if p.gold or getattr(p, "abstention", False)]
    context_tokens = heuristic_count([context])[0]
    calls = [probe_tokens(context_tokens, *heuristic_count([p.question, p.gold or abstention_gold(p)]))
             for p in scorable]
    answer_in, answer_out, judge_in, judge_out = (sum(column) for column in zip(*calls)) if calls else (0, 0, 0, 0)
    total = total_cost([_cost(answerer, answer_in, answer_out), _cost(judge, judge_in, judge_out)])
    return Estimate(calls=2 * len(scorable), input_tokens=answer_in + judge_in, cost_usd=total)


class JudgeFailed(WorkbenchError, RuntimeError):
    """An answerer or judge call failed (the reason has any secret replaced by its name); nothing
    judged of the run was stored."""


def unusable(answerer: str, judge: str) -> str | None:
    """Why the answerer or judge cannot be called here (an unknown model, a missing provider key),
    asked of litellm without a call, or ``None``: a judged run is refused before it starts."""
    from .models import unusable_models

    offline = [m for m in dict.fromkeys([answerer, judge]) if m.startswith("omem/")]
    if offline:  # (it would answer every question with notes, and grade nothing correct: a 0 that means nothing)
        return (f"{offline[0]} is the built-in offline summariser: it cannot answer or grade questions, so "
                "the answerer and the judge must be LLMs")
    bad = unusable_models([answerer, judge])
    return "; ".join(f"{s.model}: {s.reason}" for s in bad) or None


async def _ask(model: str, role: str, prompt: str, spent: Callable[[float | None], None] | None,
               **kwargs) -> str:
    try:
        response = await litellm.acompletion(model=model, messages=[{"role": "user", "content": prompt}], **kwargs)
        text = response.choices[0].message.content or ""
    except Exception as exc:  # a provider's error may quote the key it was sent: never carried further
        raise JudgeFailed(f"the {role} model {model} failed: {error_text(exc)}") from None
    if spent is not None:
        cost = (getattr(response, "_hidden_params", None) or {}).get("response_cost")
        spent(float(cost) if isinstance(cost, (int, float)) else None)
    return redact_secrets(text.strip())


_NEGATION = r"(?:NOT|NEVER|CANNOT|\w+N'T)"
_VERDICT = re.compile(
    rf"\b(?P<negated>{_NEGATION}\s+(?!ONLY\b)(?:\w+\s+){{0,2}}(?P<what>INCORRECT|CORRECT|WRONG)"
    r"|(?:PARTIALLY|PARTLY|HALF)[\s-]+CORRECT)\b"
    r"|\b(?P<word>INCORRECT|CORRECT|WRONG)\b")


def verdict_word(verdict: str) -> str:
    """``CORRECT`` or ``WRONG`` as a judge's reply says it, whatever its case or Markdown
    ("**Correct**", "Verdict: CORRECT"); ``""`` when it names none (then the probe is not scored).

    A negated verdict is the other one ("Not correct", "**Not** correct", "cannot be correct",
    "wasn't correct" are WRONG; "not wrong" is CORRECT), a partial one is WRONG ("Partially
    correct, but …"). A reply that opens with its verdict is read by it ("WRONG - the correct answer
    is 2019"); one that explains first is read by its last ("The correct answer is Paris; the
    candidate says London. WRONG")."""
    plain = re.sub(r"[*_`~#>]", "", verdict.upper()).replace("’", "'")
    opening = re.match(r"\W*(?:(?:FINAL\s+)?(?:VERDICT|ANSWER|GRADE|JUDG(?:E)?MENT|RESULT|DECISION)\s*[:=-]?\W*)?", plain)
    found = []
    for match in _VERDICT.finditer(plain):
        if match.group("negated"):
            word = "CORRECT" if match.group("what") in ("WRONG", "INCORRECT") else "WRONG"
        else:
            word = "CORRECT" if match.group("word") == "CORRECT" else "WRONG"
        if match.start() == opening.end():
            return word
        found.append(word)
    return found[-1] if found else ""


def unscored_note(replies: int) -> str:
    """What every place that shows judged accuracy says of judge replies that named no verdict."""
    return (f"{replies:,} judge {'reply' if replies == 1 else 'replies'} named no verdict (neither CORRECT nor WRONG): "
            "those probes are not scored, and the accuracy is over the others; check the judge model")


def left_the_window(store: Any, run_id: str, probes: Sequence[Probe]) -> list[Probe]:
    """``probes`` without those the run's word retention left unscored because their evidence is
    still in the final window: the judge scores the same probes (nothing had to survive yet)."""
    stored = store.probes(run_id)
    if stored.empty or "evidence_in_window" not in stored:
        return list(probes)
    memory = stored[stored.method == "memory"]
    waiting = set(memory[memory.evidence_in_window.fillna(False).astype(bool)].probe_id)
    return [p for p in probes if p.id not in waiting]


async def judge_probes(
    probes: Sequence[Probe], context: str, *, answerer: str, judge: str, concurrency: int = 4,
    progress: Callable[[int, int], None] | None = None, completion_kwargs: dict | None = None,
    spent: Callable[[float | None], None] | None = None,
) -> list[dict]:
    """Answer and grade every probe with a gold answer, and every abstention probe (the right answer
    to a question the conversation never answers is to decline); one row per probe. ``spent`` is
    told each call's cost (``None``: litellm does not know the model's price).

    Raises:
        JudgeFailed: a call failed (its reason cleaned of secrets); no row is returned.
    """
    scorable = [p for p in probes if p.gold or getattr(p, "abstention", False)]
    gate = asyncio.Semaphore(concurrency)
    done = 0
    kwargs = completion_kwargs or {}

    async def one(probe: Probe) -> dict:
        nonlocal done
        async with gate:
            answer = await _ask(answerer, "answerer", answer_prompt(probe, context), spent, **kwargs)
            gold = probe.gold if probe.gold else abstention_gold(probe)
            verdict = await _ask(judge, "judge", JUDGE_PROMPT.format(question=probe.question, gold=gold,
                                                                     answer=answer), spent, **kwargs)
        done += 1
        if progress is not None:
            progress(done, len(scorable))
        word = verdict_word(verdict)
        # A reply that names no verdict is not scored (it read as a 0: a judge that answers off
        # script looked like a measured accuracy of 0.000); the counts say how many.
        return {"probe_id": probe.id, "method": "llm_judge", "question": probe.question, "gold": probe.gold,
                "category": probe.category, "evidence": json.dumps(list(probe.evidence)),
                "evidence_in_window": None, "score": None if not word else 1.0 if word == "CORRECT" else 0.0,
                "answer": answer}

    tasks = [asyncio.ensure_future(one(p)) for p in scorable]
    try:
        return list(await asyncio.gather(*tasks))
    finally:  # one failed (or we were cancelled): the others stop now, not in the background
        for task in tasks:
            task.cancel()
