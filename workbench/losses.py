"""Loss attribution: where in the pipeline each probe's answer was lost.

For a probe with evidence messages and a gold answer, the run is followed along the path a fact
takes: the evidence is *said*; an observation covers it (which one, and does that note keep the
answer's words?); a reflection merges that note (does the reflection keep them?); and what the agent
sees at the end keeps them or not. Evidence still in the window at the end skips the first two
stages (it is seen verbatim). A stage keeps the answer when at least :data:`KEPT` of the gold
answer's content words are in its text (the word-retention rule of :mod:`workbench.retention`, the
run's scoring rule: a note's date heading counts as retention counts it).

The per-configuration *loss funnel* counts the probes that reach each stage:
said → observed with the answer → survived reflection → visible at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omem_core import ObservationRecord

from .retention import SCORING, Scorer, Visible, content_words, evidence_in_window

KEPT = 0.5
STAGES = ("said", "observed", "reflected", "visible")
STAGE_NAMES = {"said": "evidence said", "observed": "observed with the answer",
               "reflected": "survived reflection", "visible": "visible at the end"}


def attribute_losses(conversation: Any, records: Sequence[ObservationRecord], state: Any,
                     steps: Sequence[Mapping[str, Any]] = (), record_steps: Mapping[str, int] | None = None,
                     rule: int = SCORING) -> list[dict[str, Any]]:
    """One row per scored probe with evidence (not one whose evidence is all still in the window):
    how far its answer got, and where it was lost.

    ``state`` is the thread's final :class:`omem_core.ThreadState`; ``record_steps`` maps record
    ids to the step that wrote them (for ``lost_step``: where the explorer should open); ``rule``
    is the scoring rule (:data:`workbench.retention.SCORING_RULES`).
    """
    scorer = Scorer(conversation, rule)

    read: dict[tuple[str, ...], Visible] = {}  # (the reflection's text, read once, not once per probe)

    def score(probe: Any, texts: Sequence[str]) -> float | None:
        if not texts:
            return 0.0
        key = tuple(texts)
        if key not in read:
            read[key] = Visible(notes=texts)
        return scorer.score(probe, read[key])

    record_steps = dict(record_steps or {})
    observations = [r for r in records if r.kind == "observation"]
    covering: dict[str, list[ObservationRecord]] = {}
    for record in observations:
        for source in record.source_ids:
            covering.setdefault(source, []).append(record)
    window_ids = {m.id for m in state.window}
    reflection = state.reflection
    reflected_ids = set(reflection.source_ids) if reflection is not None else set()
    unreflected_ids = {r.id for r in state.unreflected}
    visible = Visible(state.context)
    rows = []
    for probe in conversation.probes:
        if not probe.evidence or probe.gold is None or not content_words(probe.gold):
            continue
        if evidence_in_window(probe, window_ids):  # nothing of it has had to survive yet: not scored
            continue
        evidence = list(probe.evidence)
        notes = {r.id: r for e in evidence for r in covering.get(e, [])}
        observed_all = all(e in window_ids or e in covering for e in evidence)
        observation_score = score(probe, [r.text for r in notes.values()]) if notes else 0.0
        observed = observed_all and (observation_score or 0.0) >= KEPT
        # A note not merged yet is shown as it is; a merged one survives only in the reflection.
        pending = [r for r in notes.values() if r.id in unreflected_ids]
        merged = [r for r in notes.values() if r.id in reflected_ids]
        if not merged:
            reflection_score = observation_score
        else:
            reflection_score = score(probe, [reflection.text, *[r.text for r in pending]])
        reflected = observed and (reflection_score or 0.0) >= KEPT
        visible_score = scorer.score(probe, visible)
        shown = (visible_score or 0.0) >= KEPT
        lost_at, lost_step = None, None
        if not observed:
            lost_at = "observation"
            lost_step = min((record_steps.get(r.id) for r in notes.values() if r.id in record_steps), default=None)
        elif not reflected:
            lost_at = "reflection"
            lost_step = record_steps.get(reflection.id) if reflection is not None else None
        elif not shown:
            lost_at = "end"
        rows.append({
            "probe_id": probe.id, "category": probe.category, "evidence": evidence,
            "in_window_at_end": False,  # (such probes are not scored; the column stays for old runs)
            "observation_ids": sorted(notes), "observation_score": observation_score,
            "observed": observed, "reflection_score": reflection_score, "reflected": reflected,
            "visible_score": visible_score, "visible": shown, "lost_at": lost_at, "lost_step": lost_step,
        })
    return rows


def funnel(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many probes reach each stage (each stage counts those that passed every earlier one),
    and ``visible_elsewhere``: probes whose answer is visible at the end although the notes on its
    evidence lost it (its words came from other messages' notes, or are common ones). Retention
    counts those as kept; the funnel, which follows the evidence, does not."""
    said = len(rows)
    observed = sum(1 for r in rows if r["observed"])
    reflected = sum(1 for r in rows if r["observed"] and r["reflected"])
    visible = sum(1 for r in rows if r["observed"] and r["reflected"] and r["visible"])
    elsewhere = sum(1 for r in rows if r["visible"] and not (r["observed"] and r["reflected"]))
    return {"said": said, "observed": observed, "reflected": reflected, "visible": visible,
            "visible_elsewhere": elsewhere}


__all__ = ["KEPT", "STAGES", "STAGE_NAMES", "attribute_losses", "funnel"]
