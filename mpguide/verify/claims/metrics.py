"""Curve and rate metrics the claims are judged with.

Curve metrics: both curves are smoothed with an exponential moving
average (:data:`~mpguide.verify.claims.metrics.EMA_ALPHA`), the first
:data:`~mpguide.verify.claims.metrics.WARMUP_FRACTION` of
the steps is dropped, and the candidate is compared with the reference step by step, relative to
the reference:

* ``match``: the **maximum** relative difference must stay at or below the tolerance;
* ``diverge``: the **mean** relative gap must reach at least the tolerance (a mean, so one spike
  cannot pass a pitfall off as reproduced).

Rate metrics: a paired rate claim is decided on the per-round ratios of an interleaved benchmark by
:func:`~mpguide.verify.claims.metrics.decide_paired` (:data:`mpguide.verify.claims.tolerances.PAIRED_RULE`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .tolerances import Tolerance

#: Smoothing factor of the exponential moving average applied to loss curves (weight of the new step).
EMA_ALPHA = 0.1
#: Fraction of the steps ignored at the start of a run (at least
#: :data:`~mpguide.verify.claims.metrics.MIN_WARMUP_STEPS`).
WARMUP_FRACTION = 0.1
#: Smallest number of steps ignored at the start of a run.
MIN_WARMUP_STEPS = 3

#: Confidence of the interval that decides a paired rate claim (see
#: :func:`~mpguide.verify.claims.metrics.decide_paired`).
PAIRED_CONFIDENCE = 0.95


def smooth(values: Sequence[float], alpha: float = EMA_ALPHA) -> np.ndarray:
    """Exponential moving average of a curve.

    Args:
        values: per-step losses, length ``n``.
        alpha: weight of each new value.

    Returns:
        float64 array of length ``n``; ``out[0] = values[0]``.
    """
    x = np.asarray(values, dtype=np.float64)
    out = np.empty_like(x)
    acc = x[0] if len(x) else 0.0
    for i, v in enumerate(x):
        acc = v if i == 0 else alpha * v + (1 - alpha) * acc
        out[i] = acc
    return out


def warmup_steps(n: int) -> int:
    """Number of leading steps ignored by curve metrics for a run of ``n`` steps."""
    return max(MIN_WARMUP_STEPS, int(math.ceil(WARMUP_FRACTION * n)))


def relative_gap(candidate: Sequence[float], reference: Sequence[float]) -> np.ndarray:
    """Per-step relative difference ``|ema(c) - ema(r)| / |ema(r)|`` after the warm-up.

    Element ``i`` belongs to step ``i + warmup_steps(len(reference))`` of the run (steps counted
    from 0 at the start of the run).

    Raises:
        ValueError: the curves have different lengths or are too short to leave any step after
            the warm-up.
    """
    if len(candidate) != len(reference):
        raise ValueError(f"curves have different lengths: {len(candidate)} steps vs {len(reference)} steps")
    skip = warmup_steps(len(reference))
    if len(reference) <= skip:
        raise ValueError(f"curves of {len(reference)} steps leave nothing after a {skip}-step warm-up")
    c, r = smooth(candidate)[skip:], smooth(reference)[skip:]
    with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN curves yield NaN gaps, judged by callers
        return np.abs(c - r) / np.maximum(np.abs(r), 1e-12)


def warmup_gap(candidate: Sequence[float], reference: Sequence[float]) -> float:
    """Largest relative difference of the smoothed curves **inside** the warm-up (the steps claims skip).

    Args:
        candidate: per-step losses, length ``n``.
        reference: per-step losses, length ``n``.

    Returns:
        ``max |ema(c) - ema(r)| / |ema(r)|`` over steps ``0 .. warmup_steps(n) - 1`` (a fraction).

    Raises:
        ValueError: the curves have different lengths.
    """
    if len(candidate) != len(reference):
        raise ValueError(f"curves have different lengths: {len(candidate)} steps vs {len(reference)} steps")
    skip = min(warmup_steps(len(reference)), len(reference))
    c, r = smooth(candidate)[:skip], smooth(reference)[:skip]
    return float(np.max(np.abs(c - r) / np.maximum(np.abs(r), 1e-12))) if skip else 0.0


def first_non_finite(values: Sequence[float]) -> tuple[int, float] | None:
    """``(step, value)`` of the first NaN or infinite value (steps counted from 0), or ``None``."""
    for i, v in enumerate(values):
        if not math.isfinite(v):
            return i, v
    return None


def median_interval(
    values: Sequence[float], confidence: float = PAIRED_CONFIDENCE
) -> tuple[float, float, int, float] | None:
    """Distribution-free confidence interval for the median of ``values`` (order statistics).

    For ``n`` independent draws of one continuous distribution, the median lies between the ``k``-th
    smallest and the ``k``-th largest draw with probability ``1 - 2 P(Binomial(n, 1/2) <= k - 1)``
    (the sign-test interval; e.g. Conover, *Practical Nonparametric Statistics*, 3rd ed., section 3.2).

    Args:
        values: the draws (any order), ``n`` of them.
        confidence: the smallest coverage accepted, in (0, 1).

    Returns:
        ``(low, high, k, coverage)`` for the largest ``k`` whose coverage is at least ``confidence``
        (the narrowest such interval), or ``None`` when even ``k = 1`` (min to max) covers less, i.e.
        too few values: at 95 % that is ``n < 6``.
    """
    n = len(values)
    ordered = sorted(values)
    k, below = 0, 0.0  # below = P(Binomial(n, 1/2) <= k - 1) for the current k
    for j in range(n // 2 + 1):  # k = j + 1 needs P(B <= j) <= (1 - confidence) / 2
        tail = below + math.comb(n, j) / 2**n
        if 2 * tail > 1 - confidence + 1e-12:
            break
        k, below = j + 1, tail
    if k == 0:
        return None
    return ordered[k - 1], ordered[n - k], k, 1 - 2 * below


@dataclass(frozen=True)
class PairedDecision:
    """What :func:`~mpguide.verify.claims.metrics.decide_paired` concluded from per-round ratios.

    Attributes:
        verdict: ``"pass"`` (interval inside the band), ``"fail"`` (wholly outside) or
            ``"inconclusive"`` (it straddles an edge, or too few rounds for an interval).
        rounds: number of ratios ``n``.
        median: their median.
        low, high: the interval of :func:`~mpguide.verify.claims.metrics.median_interval` (``None`` without one).
        order: its ``k``; 0 without an interval.
        coverage: its coverage; 0.0 without an interval.
        band: ``(lowest, highest)`` ratio the claim accepts (``math.inf`` for a speed-up's top).
    """

    verdict: str
    rounds: int
    median: float
    low: float | None
    high: float | None
    order: int
    coverage: float
    band: tuple[float, float]

    def describe(self) -> str:
        """One line: rounds, median, interval, band and what that means."""
        band = f"{self.band[0]:.3g}-{self.band[1]:.3g}" if math.isfinite(self.band[1]) else f">= {self.band[0]:.3g}"
        if self.low is None:
            return (
                f"median {self.median:.3f} of {self.rounds} rounds; too few rounds for a "
                f"{PAIRED_CONFIDENCE:.0%} interval (6 needed): inconclusive"
            )
        where = {"pass": "inside", "fail": "outside", "inconclusive": "across the edge of"}[self.verdict]
        return (
            f"median {self.median:.3f} of {self.rounds} rounds, {self.coverage:.1%} interval "
            f"{self.low:.3f}-{self.high:.3f} {where} band {band}"
        )


def decide_paired(ratios: Sequence[float], tolerance: Tolerance) -> PairedDecision:
    """Decide a rate claim from its per-round ratios (:data:`~mpguide.verify.claims.tolerances.PAIRED_RULE`).

    Args:
        ratios: ``numerator / denominator`` of each interleaved round (positive floats).
        tolerance: a ``"max"`` bound is parity, band ``[1 - value, 1 + value]``; a ``"min"`` bound is a
            speed-up, band ``[value, inf)``.

    Returns:
        A :class:`~mpguide.verify.claims.metrics.PairedDecision`; its verdict is ``"inconclusive"`` whenever the
        interval is missing or reaches across a band edge, so noise alone never makes it pass.
    """
    band = (1 - tolerance.value, 1 + tolerance.value) if tolerance.bound == "max" else (tolerance.value, math.inf)
    interval = median_interval(ratios)
    median = statistics.median(ratios)
    if interval is None:
        return PairedDecision("inconclusive", len(ratios), median, None, None, 0, 0.0, band)
    low, high, k, coverage = interval
    verdict = (
        "pass" if band[0] <= low and high <= band[1] else "fail" if high < band[0] or low > band[1] else "inconclusive"
    )
    return PairedDecision(verdict, len(ratios), median, low, high, k, coverage, band)
