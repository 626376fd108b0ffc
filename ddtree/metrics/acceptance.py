"""Acceptance statistics as the papers define them."""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence


def mean_of_means(per_response: Iterable[Sequence[int]]) -> float:
    """tau: the mean over responses of each response's mean acceptance length (bonus included),
    not the mean pooled over rounds.

    A response with no round has no acceptance length (``GenerationResult.mean_acceptance`` is
    NaN for it): it is left out, so tau is the mean over responses with at least one round, and
    NaN when there are none.

    >>> mean_of_means([[1, 1, 1, 5], [4], []])
    3.0
    """
    means = [sum(r) / len(r) for r in per_response if len(r)]
    return sum(means) / len(means) if means else float("nan")


def pooled_histogram(per_response: Iterable[Sequence[int]]) -> dict[int, float]:
    """Fraction of rounds at each acceptance length, pooled over all rounds (the paper's Fig. 4)."""
    counts = Counter(length for r in per_response for length in r)
    total = sum(counts.values())
    return {k: counts[k] / total for k in sorted(counts)} if total else {}
