"""Drawing several series on one axes so that none hides another: which series lie on top of each other
(:func:`~mpguide.verify.show.overlap.overlap_partner`), hollow markers and a legend note for the covered one, and
the faint raw per-batch lines under smoothed curves (:func:`~mpguide.verify.show.overlap.draw_series`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Share of the axis' data range (on the drawn scale, so in decades on a log axis) within which two
#: drawn series lie on top of each other, at :data:`OVERLAP_SHARE` of their points; the covered
#: one gets markers and a legend note naming the one above it (see :func:`overlap_partner`).
OVERLAP_FRACTION = 0.015
#: Share of points that must be that close for two series to count as overlapping.
OVERLAP_SHARE = 0.9
#: Marker shapes for overlapping series, in order (hollow, so the line below stays visible).
OVERLAP_MARKERS = ["o", "s", "^", "D", "v", "P"]
#: Legend text of the faint raw per-batch loss lines drawn under the smoothed curves.
RAW_LABEL = "faint lines: raw loss of each batch"


def merged_label(labels: Sequence[str]) -> str:
    """``["automatic, fp32", "manual, fp32"]`` -> ``"automatic = manual, fp32 (identical, drawn once)"``."""
    if len(labels) == 1:
        return labels[0]
    tails = {label.rsplit(", ", 1)[-1] for label in labels}
    if len(tails) == 1 and all(", " in label for label in labels):
        tail = tails.pop()
        return " = ".join(label.rsplit(", ", 1)[0] for label in labels) + f", {tail} (identical, drawn once)"
    return " = ".join(labels) + " (identical, drawn once)"


def _drawn(values: Sequence[float], log: bool) -> Any:
    """``values`` as the axis draws them: ``log10`` on a log axis (non-positive values: NaN, not drawn)."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(v > 0, np.log10(np.where(v > 0, v, 1.0)), np.nan)
    return v


def overlap_partner(
    ys: Sequence[Sequence[float]], log: bool = False, span: float | None = None
) -> list[tuple[int, int, int, float] | None]:
    """For each series, the first *later* series drawn over it, where they overlap and how far apart they get.

    Two series overlap when, on the drawn scale (``log10`` of the values on a log axis), they are
    closer than :data:`OVERLAP_FRACTION` of ``span`` at :data:`OVERLAP_SHARE` or more of their
    common points. Points where either series is not finite (or not positive on a log axis) are
    left out; series with no common point overlap nothing. A later series is drawn over an
    earlier one, so it is the earlier one that may disappear.

    Args:
        ys: per-batch values of each series, in drawing order (any lengths; compared over the shorter).
        log: the axis is logarithmic.
        span: the drawn range of the axis (default: the range of all finite drawn values, or 1.0
            when that is 0).

    Returns:
        One entry per series, ``None`` or ``(index of the later series, batches where the two are
        that close, common batches, largest |a - b| / max(|a|, |b|))`` (a fraction; 0.0 for equal values).
    """
    import numpy as np

    drawn = [_drawn(y, log) for y in ys]
    if span is None:
        finite = [d[np.isfinite(d)] for d in drawn]
        values = np.concatenate(finite) if finite else np.array([])
        span = float(values.max() - values.min()) if values.size else 0.0
        span = span or 1.0
    out: list[tuple[int, int, int, float] | None] = []
    for i, d in enumerate(drawn):
        found = None
        for j in range(i + 1, len(drawn)):
            n = min(len(d), len(drawn[j]))
            a, b = d[:n], drawn[j][:n]
            both = np.isfinite(a) & np.isfinite(b)
            if not both.any():
                continue
            close = np.abs(a[both] - b[both]) <= OVERLAP_FRACTION * span
            if close.mean() >= OVERLAP_SHARE:
                raw_a = np.asarray(ys[i][:n], dtype=float)[both]
                raw_b = np.asarray(ys[j][:n], dtype=float)[both]
                biggest = np.maximum(np.maximum(np.abs(raw_a), np.abs(raw_b)), np.finfo(float).tiny)
                found = (j, int(close.sum()), int(both.sum()), float((np.abs(raw_a - raw_b) / biggest).max()))
                break
        out.append(found)
    return out


def _percent(fraction: float) -> str:
    """``0.000123`` -> ``"0.012 %"``; two significant digits."""
    return "0 %" if fraction == 0 else f"{100 * fraction:.2g} %"


def draw_series(ax: Any, series: list[dict[str, Any]], log: bool = False, span: float | None = None) -> None:
    """Draw ``series`` on ``ax`` in order; a series that a later one covers gets markers drawn above everything.

    Each item: ``x``, ``y``, ``name`` (legend text), ``color``, ``linestyle``, optional ``first``
    (the first run's label of a merged entry, used in notes), ``linewidth`` and ``where`` (draw
    as steps, as :meth:`matplotlib.axes.Axes.step` does). The
    covered series' legend entry shows its marker and says what covers it ("markers: under fp32
    at 139 of 140 batches, at most 0.0001 % apart"), so that every legend entry is visible.
    """
    import textwrap

    partners = overlap_partner([item["y"] for item in series], log, span)
    shown = 0
    for item, partner in zip(series, partners):
        label = item["name"]
        kwargs: dict[str, Any] = dict(
            color=item["color"], linestyle=item["linestyle"], linewidth=item.get("linewidth", 1.8)
        )
        marks: dict[str, Any] = {}
        if partner is not None:
            j, close, common, rel = partner
            other = series[j].get("first") or series[j]["name"]  # a merged entry: its first run
            label = f"{label} (markers: under {other} at {close} of {common} batches, at most {_percent(rel)} apart)"
            every = max(1, len(item["y"]) // 12)
            marks = dict(
                marker=OVERLAP_MARKERS[shown % len(OVERLAP_MARKERS)],
                markersize=7,
                markerfacecolor="none",
                markeredgewidth=1.6,
                markevery=((every * ((shown + 1) % 4)) // 4, every),
            )
            shown += 1
        draw = ax.step if item.get("where") else ax.plot
        where = {"where": item["where"]} if item.get("where") else {}
        draw(item["x"], item["y"], label="\n".join(textwrap.wrap(label, 62)), **where, **kwargs, **marks)
        if marks:  # the same markers again, above every line, without a legend entry
            draw(item["x"], item["y"], **where, color=item["color"], linestyle="none", zorder=3.5, **marks)
