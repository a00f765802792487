"""Loss-curve figures from results records (matplotlib), shared by the examples and the guide page.

How several series share one axes without hiding each other is in :mod:`mpguide.verify.show.overlap`.

Why this module is longer than 400 lines (about 440): it is the one plotting API the examples import, one
function per kind of figure (loss curves, per-run series, relative gaps, recorded extra series), each with the
checks of the record fields it draws; the style constants and the figure helpers are a few dozen lines of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import records
from ..claims.metrics import relative_gap, smooth, warmup_steps
from .overlap import RAW_LABEL, draw_series, merged_label

#: One colour per precision (colour-blind-safe Okabe-Ito hues, legible on light and dark pages).
PRECISION_COLORS = {
    "32-true": "#0072B2",
    "bf16-mixed": "#E69F00",
    "16-mixed": "#009E73",
    "bf16-true": "#D55E00",
    "16-true": "#CC79A7",
}
#: One line style per precision, so that precisions stay apart when a figure recolours its runs.
PRECISION_STYLES = {
    "32-true": "-",
    "bf16-mixed": (0, (6, 2)),
    "16-mixed": (0, (1.5, 1.5)),
    "bf16-true": (0, (4, 1, 1, 1)),
    "16-true": (0, (1, 1, 4, 1)),
}
#: Colours for runs that are not a plain recipe (pitfalls, user recipes), in order of appearance.
EXTRA_COLORS = ["#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#999999"]
#: Label of the x axis of every per-batch series (one point per ``training_step`` call). With
#: accumulation or several optimizers this is not ``trainer.global_step``, which counts ``opt.step()`` calls.
BATCH_AXIS = "batch (training_step call)"
#: Gap in inches between the bottom of an axes and the top of a legend placed below it, which
#: leaves room for tick labels and the x-axis label.
LEGEND_DROP_IN = 0.62
#: Text sizes in points. Figures are saved at 110 dpi, so 10 pt is 15 pixels in the enlarged view
#: (a click or tap on a figure shows it at its own size, ``docs/_static/mpguide.js``).
TEXT_RC = {
    "font.size": 11,
    "axes.titlesize": 11.5,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "figure.titlesize": 12,
}
#: Legend text size in points.
LEGEND_SIZE = TEXT_RC["legend.fontsize"]


def figure(nrows: int = 1, ncols: int = 1, width: float = 11.0, height: float = 4.6, **kwargs: Any):
    """``plt.subplots`` with constrained layout, so legends below the axes and labels are never cut.

    Also sets matplotlib's text sizes to :data:`TEXT_RC` (global ``rcParams``: matplotlib reads them
    when a text is made, so they must be set before the figure's texts exist; sphinx-gallery resets
    them between examples).

    Returns:
        ``(fig, axes)`` as :func:`matplotlib.pyplot.subplots` returns them; sizes in inches.
    """
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    mpl.rcParams.update(TEXT_RC)
    return plt.subplots(nrows, ncols, figsize=(width, height), layout="constrained", **kwargs)


def describe(fig: Any, text: str) -> None:
    """Put the figure's conclusion, in one sentence, above it.

    sphinx-gallery uses a figure's title texts (this one, then each axes title) as the image's alt
    text, so this sentence is also what a screen reader announces: state what the figure shows
    ("manual equals automatic"), not what it is ("loss curves"). Wrapped to the figure's width.
    """
    import textwrap

    width_in = fig.get_size_inches()[0]
    fig.suptitle("\n".join(textwrap.wrap(text, max(40, int(width_in * 10.5)))), fontsize=TEXT_RC["figure.titlesize"])


def legend_below(ax: Any, ncol: int = 1) -> None:
    """Legend under ``ax``, below its x-axis label, outside the data (constrained layout makes room)."""
    from matplotlib.transforms import ScaledTranslation

    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    transform = ax.transAxes + ScaledTranslation(0, -LEGEND_DROP_IN, ax.figure.dpi_scale_trans)
    ax.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        bbox_transform=transform,
        ncol=ncol,
        fontsize=LEGEND_SIZE,
        frameon=False,
    )


def run_by_id(record: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The run ``run_id`` of ``record``.

    Raises:
        KeyError: naming the example, the missing id and the ids the record has.
    """
    for run in record["runs"]:
        if run["id"] == run_id:
            return run
    raise KeyError(f"{record['example']}: no run {run_id!r}; runs: {[r['id'] for r in record['runs']]}")


def plot_loss_curves(
    ax: Any,
    record: dict[str, Any],
    run_ids: Sequence[str],
    title: str,
    colors: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> None:
    """Draw the smoothed loss curves of ``run_ids`` on ``ax``, one point per batch.

    Each curve is the exponential moving average the claims use (:func:`mpguide.verify.claims.metrics.smooth`),
    drawn over the raw per-batch loss in a faint line of the same colour; one grey legend entry,
    :data:`~mpguide.verify.show.overlap.RAW_LABEL`, says what the faint lines are. Colour follows precision unless
    ``colors``
    gives one per run id; the line style always follows precision (:data:`PRECISION_STYLES`).
    Runs whose losses are bitwise identical are drawn once, with one legend entry naming them all
    ("automatic = manual, fp32 (identical, drawn once)"); a curve that lies on top of an earlier
    one without being identical gets hollow markers and says so in its legend entry (see
    :func:`~mpguide.verify.show.overlap.overlap_partner`). Runs that raised are listed in the legend as
    "(raised ...)" without a curve. The legend goes below the axes.

    Args:
        ax: a matplotlib Axes.
        record: a results record.
        run_ids: runs to draw, in legend order.
        title: axes title.
        colors: optional run id -> colour.
        labels: optional run id -> legend text for this figure (default: the run's label).
    """
    from matplotlib.lines import Line2D

    colors = colors or {}
    groups: dict[tuple[float, ...], list[dict[str, Any]]] = {}
    failed = []
    for run_id in run_ids:
        run = run_by_id(record, run_id)
        if run.get("error") or not run["loss"]:
            failed.append(run)
        else:
            groups.setdefault(tuple(run["loss"]), []).append(run)
    series = []
    for members in groups.values():
        first = members[0]
        color = colors.get(first["id"], PRECISION_COLORS.get(first["precision"], "#444444"))
        steps = range(len(first["loss"]))
        ax.plot(steps, first["loss"], color=color, alpha=0.18, linewidth=0.8)
        names = [(labels or {}).get(m["id"]) or m.get("label") or m["id"] for m in members]
        series.append(
            dict(
                x=steps,
                y=smooth(first["loss"]),
                color=color,
                linestyle=PRECISION_STYLES.get(first["precision"], "-"),
                name=merged_label(names),
                first=names[0],
            )
        )
    draw_series(ax, series)
    for run in failed:
        label = (labels or {}).get(run["id"]) or run.get("label") or run["id"]
        ax.plot(
            [],
            [],
            color=colors.get(run["id"], PRECISION_COLORS.get(run["precision"], "#444444")),
            linestyle=PRECISION_STYLES.get(run["precision"], "-"),
            label=f"{label} (raised {run['error']['type']}, no curve)" if run.get("error") else f"{label} (no steps)",
        )
    if series:
        ax.add_line(Line2D([], [], color="#777777", alpha=0.45, linewidth=0.8, label=RAW_LABEL))
    ax.set_title(title)
    ax.set_xlabel(BATCH_AXIS)
    ax.set_ylabel("training loss (EMA-smoothed)")
    ax.grid(alpha=0.3)
    legend_below(ax)


def plot_run_series(
    ax: Any,
    record: dict[str, Any],
    run_ids: Sequence[str],
    field: str,
    colors: dict[str, str] | None = None,
    limit: int | None = None,
    steps: bool = False,
    log: bool = False,
) -> None:
    """Draw a per-batch list stored in each run (``"lr"``, ``"loss_scale"``), exactly equal series once.

    A series lying on top of an earlier, unequal one gets markers and a legend note
    (:func:`~mpguide.verify.show.overlap.overlap_partner`).

    Args:
        ax: a matplotlib Axes.
        record: a results record.
        run_ids: runs to draw, in legend order; a run with an empty list is left out.
        field: key of the per-batch list in each run.
        colors: optional run id -> colour (default: by precision).
        limit: draw only the first ``limit`` batches.
        steps: draw as a step function (values hold until the next batch).
        log: draw the y axis in log base 2 (and judge overlaps on that scale).
    """
    colors = colors or {}
    groups: dict[tuple[float, ...], list[dict[str, Any]]] = {}
    for run_id in run_ids:
        run = run_by_id(record, run_id)
        values = tuple((run.get(field) or [])[:limit])
        if values:
            groups.setdefault(values, []).append(run)
    series = []
    for values, members in groups.items():
        first = members[0]
        series.append(
            dict(
                x=range(len(values)),
                y=values,
                where="post" if steps else None,
                linewidth=1.6,
                color=colors.get(first["id"], PRECISION_COLORS.get(first["precision"], "#444444")),
                linestyle=PRECISION_STYLES.get(first["precision"], "-"),
                name=merged_label([m.get("label") or m["id"] for m in members]),
                first=members[0].get("label") or members[0]["id"],
            )
        )
    draw_series(ax, series, log=log)
    if log:
        ax.set_yscale("log", base=2)
    ax.set_xlabel(BATCH_AXIS)
    ax.grid(alpha=0.3)
    legend_below(ax)


def save_figure(fig: Any, example: str, name: str, directory: Path | None = None) -> Path:
    """Save ``fig`` as ``<directory>/<example>_<name>.png`` (default folder: the results folder)."""
    path = Path(directory or records.results_dir()) / f"{example}_{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


#: Floor for plotting relative differences on a log axis; identical curves are drawn at this value.
GAP_FLOOR = 1e-7


def plot_relative_gaps(ax: Any, record: dict[str, Any], pairs: Sequence[tuple[str, str]], title: str) -> None:
    """Draw, per batch after the warm-up, the relative difference the claims judge (log scale).

    Each pair ``(candidate, reference)`` becomes one line of :func:`mpguide.verify.claims.metrics.relative_gap`,
    coloured and styled by the candidate's precision. Pairs whose curves are bitwise identical have
    no difference to draw on a log axis: they share one line at :data:`~mpguide.verify.show.plotting.GAP_FLOOR`
    and one legend entry naming every such pair.

    Args:
        ax: a matplotlib Axes.
        record: a results record.
        pairs: ``(candidate, reference)`` run ids.
        title: axes title.
    """
    import numpy as np

    identical, steps, series = [], None, []
    for i, (cand, ref) in enumerate(pairs):
        a, b = run_by_id(record, cand), run_by_id(record, ref)
        if a.get("error") or b.get("error"):
            continue
        gap = relative_gap(a["loss"], b["loss"])
        steps = np.arange(len(gap)) + warmup_steps(len(b["loss"]))
        if not np.any(gap):
            identical.append(f"{cand} vs {ref}")
            continue
        color = PRECISION_COLORS.get(a["precision"], EXTRA_COLORS[i % len(EXTRA_COLORS)])
        series.append(
            dict(
                x=steps,
                y=np.maximum(gap, GAP_FLOOR),
                color=color,
                linewidth=1.5,
                linestyle=PRECISION_STYLES.get(a["precision"], "-"),
                name=f"{cand} vs {ref}",
            )
        )
    draw_series(ax, series, log=True, span=float(np.log10(1.0 / (GAP_FLOOR / 10))))
    if identical and steps is not None:
        import textwrap

        text = f"no difference, drawn at {GAP_FLOOR:g}: " + ", ".join(p.replace(" vs ", " = ") for p in identical)
        ax.plot(
            steps,
            np.full(len(steps), GAP_FLOOR),
            color="#444444",
            linewidth=2.5,
            alpha=0.7,
            label="\n".join(textwrap.wrap(text, 60)),
        )
    ax.set_yscale("log")
    ax.set_ylim(GAP_FLOOR / 10, 1.0)
    ax.set_title(title)
    ax.set_xlabel(BATCH_AXIS)
    ax.set_ylabel("relative difference of smoothed loss")
    ax.grid(alpha=0.3, which="major")
    legend_below(ax)


def plot_extra_series(
    ax: Any,
    record: dict[str, Any],
    run_ids: Sequence[str],
    key: str,
    title: str,
    ylabel: str,
    colors: dict[str, str] | None = None,
    log_base: int | None = None,
    labels: dict[str, str] | None = None,
    steps: bool = True,
    legend: bool = True,
) -> None:
    """Draw a per-batch series that runs recorded in ``extra[key]`` (e.g. an update factor), as steps.

    Series that are exactly equal are drawn once, with one legend entry naming every run; a series
    lying on top of an earlier, unequal one gets hollow markers and a legend note naming it
    (:func:`~mpguide.verify.show.overlap.overlap_partner`); the line style follows precision; the legend goes below
    the axes.

    On a log axis (``log_base``) a value of exactly 0 (a skipped step: nothing moved) has no place:
    the line leaves a gap there and a triangle at the bottom of the axes marks the batch, with one
    legend entry per run ("...: step skipped, update 0"). The axis shows only powers of
    ``log_base`` within the data, never a 0 tick.

    Args:
        ax: a matplotlib Axes.
        record: a results record.
        run_ids: runs to draw; a run without ``extra[key]`` (one that raised) is left out of the plot.
        key: name of the list in each run's ``extra``.
        title: axes title.
        ylabel: y-axis label (with unit).
        colors: optional run id -> colour (default: :data:`~mpguide.verify.show.plotting.EXTRA_COLORS` in order).
        log_base: draw the y axis in this log base (e.g. 2 for factors of two, 10 for norms).
        labels: optional run id -> legend text for this figure (default: the run's label).
        steps: draw steps (a value per batch, held across it); ``False`` draws lines between batches.
        legend: put a legend below the axes (``False`` when a neighbouring panel shows the same runs).
    """
    import numpy as np
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import FixedLocator, NullLocator
    from matplotlib.transforms import blended_transform_factory

    colors = colors or {}
    groups: dict[tuple[float, ...], list[tuple[int, dict[str, Any]]]] = {}
    for i, run_id in enumerate(run_ids):
        run = run_by_id(record, run_id)
        values = run.get("extra", {}).get(key)
        if values:
            groups.setdefault(tuple(values), []).append((i, run))
    series, skips = [], []
    for values, members in groups.items():
        i, first = members[0]
        y = np.asarray(values, dtype=float)
        names = [(labels or {}).get(m["id"]) or m.get("label") or m["id"] for _, m in members]
        name = merged_label(names)
        color = colors.get(first["id"], EXTRA_COLORS[i % len(EXTRA_COLORS)])
        if log_base:
            zero = np.flatnonzero(y == 0)
            if zero.size:
                skips.append((zero, color, names[0] if len(names) == 1 else " = ".join(names)))
            y = np.where(y > 0, y, np.nan)
        series.append(
            dict(
                x=np.arange(len(y)),
                y=y,
                where="mid" if steps else None,
                linewidth=1.5,
                name=name,
                first=names[0],
                color=color,
                linestyle=PRECISION_STYLES.get(first["precision"], "-"),
            )
        )
    draw_series(ax, series, log=bool(log_base))
    if log_base:
        ax.set_yscale("log", base=log_base)
        finite = np.concatenate([s["y"][np.isfinite(s["y"])] for s in series]) if series else np.array([1.0])
        lo, hi = float(finite.min()), float(finite.max())
        # room below the data for the skip markers; half a power of the base above
        ax.set_ylim(lo / log_base ** (1.3 if skips else 0.5), hi * log_base**0.5)
        if skips:  # ticks only at powers of the base within the data: none inside the skip band
            powers = np.arange(
                np.ceil(np.log(lo) / np.log(log_base) - 1e-9), np.floor(np.log(hi) / np.log(log_base) + 1e-9) + 1
            )
            ax.yaxis.set_major_locator(FixedLocator(float(log_base) ** powers))
            ax.yaxis.set_minor_locator(NullLocator())
        band = blended_transform_factory(ax.transData, ax.transAxes)
        if skips:
            top = 0.06 + 0.06 * len(skips)
            ax.add_patch(
                Rectangle((0, 0), 1, top, transform=ax.transAxes, color="#999999", alpha=0.12, linewidth=0, zorder=0)
            )
            ax.text(
                0.01,
                top - 0.01,
                "skipped steps (update 0, no value on a log axis)",
                transform=ax.transAxes,
                va="top",
                ha="left",
                fontsize=LEGEND_SIZE - 1,
                color="#555555",
            )
        for row, (zero, color, first) in enumerate(skips):
            ax.plot(
                zero,
                np.full(zero.size, 0.03 + 0.06 * row),
                linestyle="none",
                marker="v",
                markersize=8,
                color=color,
                transform=band,
                label=f"{first}: step skipped, update 0",
            )
    ax.set_title(title)
    ax.set_xlabel(BATCH_AXIS)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend:
        legend_below(ax)
