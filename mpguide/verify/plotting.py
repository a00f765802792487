"""Loss-curve figures from results records (matplotlib), shared by the examples and the guide page."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from . import records
from .claims import smooth

#: One colour per precision (colour-blind-safe Okabe-Ito hues, legible on light and dark pages).
PRECISION_COLORS = {"32-true": "#0072B2", "bf16-mixed": "#E69F00", "16-mixed": "#009E73"}
#: One line style per precision, so that precisions stay apart when a figure recolours its runs.
PRECISION_STYLES = {"32-true": "-", "bf16-mixed": (0, (6, 2)), "16-mixed": (0, (1.5, 1.5))}
#: Colours for runs that are not a plain recipe (pitfalls, user recipes), in order of appearance.
EXTRA_COLORS = ["#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#999999"]
#: Label of the x axis of every per-batch series (one point per ``training_step`` call). With
#: accumulation or several optimizers this is not ``trainer.global_step``, which counts ``opt.step()`` calls.
BATCH_AXIS = "batch (training_step call)"
#: Gap in inches between the bottom of an axes and the top of a legend placed below it, which
#: leaves room for tick labels and the x-axis label.
LEGEND_DROP_IN = 0.55


def figure(nrows: int = 1, ncols: int = 1, width: float = 11.0, height: float = 4.6, **kwargs: Any):
    """``plt.subplots`` with constrained layout, so legends below the axes and labels are never cut.

    Returns:
        ``(fig, axes)`` as :func:`matplotlib.pyplot.subplots` returns them; sizes in inches.
    """
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=(width, height), layout="constrained", **kwargs)


def describe(fig: Any, text: str) -> None:
    """Put a one-line statement of what ``fig`` shows above it.

    sphinx-gallery uses a figure's title texts as the image's alt text, so this sentence is also
    what a screen reader announces.
    """
    fig.suptitle(text, fontsize=10)


def legend_below(ax: Any, ncol: int = 1) -> None:
    """Legend under ``ax``, below its x-axis label, outside the data (constrained layout makes room)."""
    from matplotlib.transforms import ScaledTranslation

    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    transform = ax.transAxes + ScaledTranslation(0, -LEGEND_DROP_IN, ax.figure.dpi_scale_trans)
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=transform,
              ncol=ncol, fontsize=8, frameon=False)


def _merged_label(labels: Sequence[str]) -> str:
    """``["automatic, fp32", "manual, fp32"]`` -> ``"automatic = manual, fp32 (identical, drawn once)"``."""
    if len(labels) == 1:
        return labels[0]
    tails = {label.rsplit(", ", 1)[-1] for label in labels}
    if len(tails) == 1 and all(", " in label for label in labels):
        tail = tails.pop()
        return " = ".join(label.rsplit(", ", 1)[0] for label in labels) + f", {tail} (identical, drawn once)"
    return " = ".join(labels) + " (identical, drawn once)"


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
) -> None:
    """Draw the smoothed loss curves of ``run_ids`` on ``ax``, one point per batch.

    Each curve is the exponential moving average the claims use (:func:`mpguide.verify.claims.smooth`),
    drawn over the raw per-batch loss in a faint line. Colour follows precision unless ``colors``
    gives one per run id; the line style always follows precision (:data:`PRECISION_STYLES`).
    Runs whose losses are bitwise identical are drawn once, with one legend entry naming them all
    ("automatic = manual, fp32 (identical, drawn once)"). Runs that raised are listed in the legend
    as "(raised ...)" without a curve. The legend goes below the axes.

    Args:
        ax: a matplotlib Axes.
        record: a results record.
        run_ids: runs to draw, in legend order.
        title: axes title.
        colors: optional run id -> colour.
    """
    colors = colors or {}
    groups: dict[tuple[float, ...], list[dict[str, Any]]] = {}
    failed = []
    for run_id in run_ids:
        run = run_by_id(record, run_id)
        if run.get("error") or not run["loss"]:
            failed.append(run)
        else:
            groups.setdefault(tuple(run["loss"]), []).append(run)
    for members in groups.values():
        first = members[0]
        color = colors.get(first["id"], PRECISION_COLORS.get(first["precision"], "#444444"))
        style = PRECISION_STYLES.get(first["precision"], "-")
        steps = range(len(first["loss"]))
        ax.plot(steps, first["loss"], color=color, alpha=0.18, linewidth=0.8)
        ax.plot(steps, smooth(first["loss"]), color=color, linestyle=style, linewidth=1.8,
                label=_merged_label([m.get("label") or m["id"] for m in members]))
    for run in failed:
        label = run.get("label") or run["id"]
        ax.plot([], [], color=colors.get(run["id"], PRECISION_COLORS.get(run["precision"], "#444444")),
                linestyle=PRECISION_STYLES.get(run["precision"], "-"),
                label=f"{label} (raised {run['error']['type']}, no curve)" if run.get("error") else f"{label} (no steps)")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(BATCH_AXIS)
    ax.set_ylabel("training loss (EMA-smoothed)")
    ax.grid(alpha=0.3)
    legend_below(ax)


def plot_run_series(ax: Any, record: dict[str, Any], run_ids: Sequence[str], field: str,
                    colors: dict[str, str] | None = None, limit: int | None = None, steps: bool = False) -> None:
    """Draw a per-batch list stored in each run (``"lr"``, ``"loss_scale"``), exactly equal series once.

    Args:
        ax: a matplotlib Axes.
        record: a results record.
        run_ids: runs to draw, in legend order; a run with an empty list is left out.
        field: key of the per-batch list in each run.
        colors: optional run id -> colour (default: by precision).
        limit: draw only the first ``limit`` batches.
        steps: draw as a step function (values hold until the next batch).
    """
    colors = colors or {}
    groups: dict[tuple[float, ...], list[dict[str, Any]]] = {}
    for run_id in run_ids:
        run = run_by_id(record, run_id)
        values = tuple((run.get(field) or [])[:limit])
        if values:
            groups.setdefault(values, []).append(run)
    for values, members in groups.items():
        first = members[0]
        kwargs = dict(color=colors.get(first["id"], PRECISION_COLORS.get(first["precision"], "#444444")),
                      linestyle=PRECISION_STYLES.get(first["precision"], "-"), linewidth=1.6,
                      label=_merged_label([m.get("label") or m["id"] for m in members]))
        if steps:
            ax.step(range(len(values)), values, where="post", **kwargs)
        else:
            ax.plot(range(len(values)), values, **kwargs)
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

    Each pair ``(candidate, reference)`` becomes one line of :func:`mpguide.verify.claims.relative_gap`,
    coloured and styled by the candidate's precision. Pairs whose curves are bitwise identical have
    no difference to draw on a log axis: they share one line at :data:`~mpguide.verify.plotting.GAP_FLOOR`
    and one legend entry naming every such pair.

    Args:
        ax: a matplotlib Axes.
        record: a results record.
        pairs: ``(candidate, reference)`` run ids.
        title: axes title.
    """
    import numpy as np

    from .claims import relative_gap, warmup_steps

    identical, steps = [], None
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
        ax.plot(steps, np.maximum(gap, GAP_FLOOR), color=color, linestyle=PRECISION_STYLES.get(a["precision"], "-"),
                linewidth=1.5, label=f"{cand} vs {ref}")
    if identical and steps is not None:
        import textwrap

        text = f"no difference, drawn at {GAP_FLOOR:g}: " + ", ".join(p.replace(" vs ", " = ") for p in identical)
        ax.plot(steps, np.full(len(steps), GAP_FLOOR), color="#444444", linewidth=2.5, alpha=0.7,
                label="\n".join(textwrap.wrap(text, 60)))
    ax.set_yscale("log")
    ax.set_ylim(GAP_FLOOR / 10, 1.0)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(BATCH_AXIS)
    ax.set_ylabel("relative difference of smoothed loss")
    ax.grid(alpha=0.3, which="major")
    legend_below(ax)


def plot_extra_series(ax: Any, record: dict[str, Any], run_ids: Sequence[str], key: str, title: str, ylabel: str,
                      colors: dict[str, str] | None = None, log_base: int | None = None) -> None:
    """Draw a per-batch series that runs recorded in ``extra[key]`` (e.g. an update factor), as steps.

    Series that are exactly equal are drawn once, with one legend entry naming every run; the
    line style follows precision; the legend goes below the axes.

    Args:
        ax: a matplotlib Axes.
        record: a results record.
        run_ids: runs to draw; a run without ``extra[key]`` (one that raised) is left out of the plot.
        key: name of the list in each run's ``extra``.
        title: axes title.
        ylabel: y-axis label (with unit).
        colors: optional run id -> colour (default: :data:`~mpguide.verify.plotting.EXTRA_COLORS` in order).
        log_base: draw the y axis in this log base (e.g. 2 for factors of two).
    """
    colors = colors or {}
    groups: dict[tuple[float, ...], list[tuple[int, dict[str, Any]]]] = {}
    for i, run_id in enumerate(run_ids):
        run = run_by_id(record, run_id)
        values = run.get("extra", {}).get(key)
        if values:
            groups.setdefault(tuple(values), []).append((i, run))
    for values, members in groups.items():
        i, first = members[0]
        ax.step(range(len(values)), values, where="mid", linewidth=1.5,
                label=_merged_label([m.get("label") or m["id"] for _, m in members]),
                color=colors.get(first["id"], EXTRA_COLORS[i % len(EXTRA_COLORS)]),
                linestyle=PRECISION_STYLES.get(first["precision"], "-"))
    if log_base:
        ax.set_yscale("symlog", base=log_base, linthresh=0.25)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(BATCH_AXIS)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    legend_below(ax)
