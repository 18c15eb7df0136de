"""Confidence intervals for retention: bootstrap over probes, and paired comparisons.

What is resampled: *probes* (each scored probe of every conversation is one unit, drawn with
replacement), so an interval says how much the pooled figure would move with another draw of
questions of the same kind. Probes of one conversation are not independent, so with few
conversations these intervals are on the narrow side; the experiment's per-conversation figures
show the spread between conversations.

A paired comparison draws the same probes for both configurations (the differences per probe are
resampled), which removes the variation between questions that both configurations share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

REPLICATES = 2000
# Fewer probes (or paired probes) than this get no interval: the bootstrap of 2 equal values is a
# zero-width interval that read as certainty ("−0.200 [−0.200, −0.200]", highlighted as a finding).
MIN_PAIRED = 10
SEED = 20261202  # fixed: the same data gives the same interval on every machine


def bootstrap_ci(values: Sequence[float], *, replicates: int = REPLICATES, seed: int = SEED,
                 level: float = 0.95) -> tuple[float, float] | None:
    """The percentile interval of the mean of ``values`` (``None`` for fewer than
    :data:`MIN_PAIRED` values: two equal scores gave a zero-width interval that read as certainty)."""
    data = np.asarray([v for v in values if v is not None and v == v], dtype=float)
    if len(data) < max(2, MIN_PAIRED):
        return None
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(replicates, len(data)))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class PairedDifference:
    a: str
    b: str
    probes: int
    difference: float | None  # mean(b - a)
    ci95: tuple[float, float] | None

    @property
    def detectable(self) -> bool:
        return self.ci95 is not None and (self.ci95[0] > 0 or self.ci95[1] < 0)

    def verdict(self) -> str:
        """A plain sentence: "b keeps 0.031 more [0.012, 0.050]" (a size, unsigned: it never
        reads against a signed b − a shown beside it), or "no detectable difference: −0.013
        [−0.040, +0.014]" (b − a)."""
        if self.difference is None:
            return "not enough shared probes to compare"
        if self.ci95 is None:
            return (f"too few shared probes for an interval: {signed(self.difference)} on {self.probes} "
                    f"(an interval needs {MIN_PAIRED})")
        if not self.detectable:
            return f"no detectable difference: {signed(self.difference)} [{signed(self.ci95[0])}, {signed(self.ci95[1])}]"
        if self.difference > 0:
            better, change, (low, high) = self.b, self.difference, self.ci95
        else:
            better, change, (low, high) = self.a, -self.difference, (-self.ci95[1], -self.ci95[0])
        size = [signed(v).lstrip("+") for v in (change, low, high)]
        return f"{better} keeps {size[0]} more [{size[1]}, {size[2]}]"


def signed(value: float) -> str:
    """A difference with its sign, never a sign the rounding hid: an interval that reaches 0 ends
    at ``0.000`` (no sign), one that stops just short of it shows enough digits to say on which
    side (``+0.0004``), so "+0.000" never appears beside a verdict it seems to contradict."""
    from .formatting import fixed

    if value == 0:
        return "0.000"
    if value != value:  # NaN
        return "–"
    for digits in (3, 4, 5):
        text = fixed(value, digits)
        if text.strip("-0."):
            return text if text.startswith("-") else "+" + text
    return f"{value:+.0e}"


def paired_difference(a: str, b: str, scores_a: dict[str, float], scores_b: dict[str, float], *,
                      replicates: int = REPLICATES, seed: int = SEED) -> PairedDifference:
    """``b`` minus ``a`` on the probes both scored (keys: probe identifiers); with fewer than
    :data:`MIN_PAIRED` of them, the mean difference without an interval (never "detectable")."""
    shared = sorted(k for k in scores_a.keys() & scores_b.keys()
                    if scores_a[k] is not None and scores_b[k] is not None)
    differences = [scores_b[k] - scores_a[k] for k in shared]
    if not differences:
        return PairedDifference(a, b, 0, None, None)
    interval = bootstrap_ci(differences, replicates=replicates, seed=seed)  # (None below MIN_PAIRED)
    return PairedDifference(a, b, len(differences), float(np.mean(differences)), interval)


__all__ = ["MIN_PAIRED", "PairedDifference", "REPLICATES", "bootstrap_ci", "paired_difference"]
