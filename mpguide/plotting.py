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
    Runs that raised are listed in the legend as "(raised ...)" without a curve.

    Args:
        ax: a matplotlib Axes.
        record: a results record.
        run_ids: runs to draw, in legend order.
        title: axes title.
        colors: optional run id -> colour.
    """
    colors = colors or {}
    for run_id in run_ids:
        run = run_by_id(record, run_id)
        color = colors.get(run_id, PRECISION_COLORS.get(run["precision"], "#444444"))
        style = MODE_STYLES.get(run["mode"], "-")
        label = run.get("label") or run_id
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
