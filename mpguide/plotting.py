"""Loss-curve figures from results records (matplotlib), shared by the examples and the guide page."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from . import records
from .claims import smooth

#: One colour per precision (colour-blind-safe Okabe-Ito hues, legible on light and dark pages).
PRECISION_COLORS = {"32-true": "#0072B2", "bf16-mixed": "#E69F00", "16-mixed": "#009E73"}
#: Colours for runs that are not a plain recipe (pitfalls, user recipes), in order of appearance.
EXTRA_COLORS = ["#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#999999"]
MODE_STYLES = {"automatic": "-", "manual": "--"}


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
    """Draw the smoothed loss curves of ``run_ids`` on ``ax``.

    Each curve is the exponential moving average the claims use (:func:`mpguide.claims.smooth`),
    drawn over the raw per-step loss in a faint line. Colour follows precision unless ``colors``
    gives one per run id; line style follows the optimization mode (solid automatic, dashed manual).
    A curve bitwise identical to one drawn before hides it; its legend entry says so.
    Runs that raised are listed in the legend as "(raised ...)" without a curve.

    Args:
        ax: a matplotlib Axes.
        record: a results record.
        run_ids: runs to draw, in legend order.
        title: axes title.
        colors: optional run id -> colour.
    """
    colors = colors or {}
    drawn: dict[tuple[float, ...], str] = {}  # curves already drawn -> their label
    for run_id in run_ids:
        run = run_by_id(record, run_id)
        color = colors.get(run_id, PRECISION_COLORS.get(run["precision"], "#444444"))
        style = MODE_STYLES.get(run["mode"], "-")
        label = run.get("label") or run_id
        twin = drawn.get(tuple(run["loss"])) if run["loss"] else None
        if twin:
            label = f"{label} (identical to {twin}, drawn on top)"
        elif run["loss"]:
            drawn[tuple(run["loss"])] = run.get("label") or run_id
        if run.get("error") or not run["loss"]:
            ax.plot([], [], color=color, linestyle=style, label=f"{label} (raised {run['error']['type']})"
                    if run.get("error") else f"{label} (no steps)")
            continue
        steps = range(len(run["loss"]))
        ax.plot(steps, run["loss"], color=color, alpha=0.18, linewidth=0.8)
        ax.plot(steps, smooth(run["loss"]), color=color, linestyle=style, linewidth=1.8, label=label)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (EMA-smoothed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)


def save_figure(fig: Any, example: str, name: str, directory: Path | None = None) -> Path:
    """Save ``fig`` as ``<directory>/<example>_<name>.png`` (default folder: the results folder)."""
    path = Path(directory or records.results_dir()) / f"{example}_{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


#: Floor for plotting relative differences on a log axis; identical curves are drawn at this value.
GAP_FLOOR = 1e-7


def plot_relative_gaps(ax: Any, record: dict[str, Any], pairs: Sequence[tuple[str, str]], title: str) -> None:
    """Draw, per step after the warm-up, the relative difference the claims judge (log scale).

    Each pair ``(candidate, reference)`` becomes one line of
    :func:`mpguide.claims.relative_gap`; curves that are bitwise identical have no difference to
    draw on a log axis and are drawn at :data:`~mpguide.plotting.GAP_FLOOR` with "(identical)" in the legend.

    Args:
        ax: a matplotlib Axes.
        record: a results record.
        pairs: ``(candidate, reference)`` run ids.
        title: axes title.
    """
    import numpy as np

    from .claims import relative_gap, warmup_steps

    for i, (cand, ref) in enumerate(pairs):
        a, b = run_by_id(record, cand), run_by_id(record, ref)
        if a.get("error") or b.get("error"):
            continue
        gap = relative_gap(a["loss"], b["loss"])
        steps = np.arange(len(gap)) + warmup_steps(len(b["loss"]))
        identical = not np.any(gap)
        color = PRECISION_COLORS.get(a["precision"], EXTRA_COLORS[i % len(EXTRA_COLORS)])
        style = "--" if a["mode"] != b["mode"] else "-"
        label = f"{cand} vs {ref}" + (" (identical)" if identical else "")
        ax.plot(steps, np.maximum(gap, GAP_FLOOR), color=color, linestyle=style, linewidth=1.5, label=label)
    ax.set_yscale("log")
    ax.set_ylim(GAP_FLOOR / 10, 10.0)  # the top decades stay free for the legend
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("relative difference of smoothed loss")
    ax.grid(alpha=0.3, which="major")
    ax.legend(fontsize=8, frameon=False, loc="upper left", ncol=2)


def plot_extra_series(ax: Any, record: dict[str, Any], run_ids: Sequence[str], key: str, title: str, ylabel: str,
                      colors: dict[str, str] | None = None, log_base: int | None = None) -> None:
    """Draw a per-step series that runs recorded in ``extra[key]`` (e.g. an update factor), as steps.

    Args:
        ax: a matplotlib Axes.
        record: a results record.
        run_ids: runs to draw; a run without ``extra[key]`` (one that raised) is left out of the plot.
        key: name of the list in each run's ``extra``.
        title: axes title.
        ylabel: y-axis label (with unit).
        colors: optional run id -> colour (default: :data:`~mpguide.plotting.EXTRA_COLORS` in order).
        log_base: draw the y axis in this log base (e.g. 2 for factors of two).
    """
    colors = colors or {}
    for i, run_id in enumerate(run_ids):
        run = run_by_id(record, run_id)
        values = run.get("extra", {}).get(key)
        if not values:
            continue
        ax.step(range(len(values)), values, where="mid", linewidth=1.5, label=run.get("label") or run_id,
                color=colors.get(run_id, EXTRA_COLORS[i % len(EXTRA_COLORS)]))
    if log_base:
        ax.set_yscale("symlog", base=log_base, linthresh=0.25)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("optimizer step (batch)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left", framealpha=0.85)
