"""Presentation helpers of the pages: quoted messages backed by records, figures a reader can read."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
from conftest import curve, make_record, run

from mpguide.verify.show import overlap, plotting, report
from mpguide_build import pages


def _record():
    ref = curve()
    error = {
        "type": "AssertionError",
        "message": "No inf checks were recorded for this optimizer.",
        "traceback": 'File "/home/x/venv/lib/python3.11/site-packages/torch/amp/grad_scaler.py", line 4',
    }
    runs = [
        run("auto-fp32", ref, mode="automatic"),
        run("manual-fp32", list(ref)),
        run("auto-bf16", [v * 1.01 for v in ref], "bf16-mixed", mode="automatic"),
        run("manual-bf16", [v * 1.01 for v in ref], "bf16-mixed"),
        run("bug-fp16", [], "16-mixed", error=error),
    ]
    for r in runs:
        r["label"] = f"{r['mode']}, {r['precision']}"
    runs[0]["warnings"] = ["UserWarning: Detected call of `lr_scheduler.step()` before `optimizer.step()`."]
    return make_record(runs, [])


def test_quoted_messages_pass_when_captured_and_fail_naming_the_run():
    rec = _record()
    records = {rec["example"]: rec}
    pages.check_quoted_messages(
        records,
        [
            (rec["example"], "bug-fp16", "No inf checks were recorded"),
            (rec["example"], "auto-fp32", "Detected call of `lr_scheduler.step()`"),
        ],
    )
    with pytest.raises(ValueError, match="run 'auto-fp32' did not capture 'Attempted unscale_'"):
        pages.check_quoted_messages(records, [(rec["example"], "auto-fp32", "Attempted unscale_")])
    with pytest.raises(ValueError, match="no run 'gone'"):
        pages.check_quoted_messages(records, [(rec["example"], "gone", "x")])
    with pytest.raises(ValueError, match="plot_00_missing: no record"):
        pages.check_quoted_messages(records, [("plot_00_missing", "x", "y")])


def test_short_paths_removes_machine_folders():
    text = _record()["runs"][4]["error"]["traceback"]
    assert report.short_paths(text) == 'File "torch/amp/grad_scaler.py", line 4'


def test_identical_curves_are_drawn_once_with_one_entry():
    rec = _record()
    fig, ax = plotting.figure(1, 1, 6, 4)
    plotting.plot_loss_curves(ax, rec, ["auto-fp32", "manual-fp32", "auto-bf16", "manual-bf16", "bug-fp16"], "t")
    labels = ax.get_legend_handles_labels()[1]
    # the fp32 pair lies 1 % under the bf16 pair: it carries markers and says so (tests/test_plotting.py)
    assert labels[0].startswith("automatic = manual, 32-true (identical, drawn once) (markers:\nunder automatic, bf16")
    assert labels[1:] == [
        "automatic = manual, bf16-mixed (identical, drawn once)",
        "manual, 16-mixed (raised AssertionError, no curve)",
        overlap.RAW_LABEL,
    ]
    styles = {line.get_label(): line.get_linestyle() for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert len(set(list(styles.values())[:2])) == 2, "fp32 and bf16 must not share a line style"
    assert ax.get_xlabel() == plotting.BATCH_AXIS


@pytest.mark.parametrize("kind", ["curves", "gaps", "series"])
def test_legend_is_outside_the_data_and_nothing_is_clipped(kind, tmp_path):
    rec = _record()
    fig, axes = plotting.figure(1, 2, 11, 4.6)
    for ax in axes:
        if kind == "curves":
            plotting.plot_loss_curves(ax, rec, ["auto-fp32", "auto-bf16", "manual-bf16"], "title")
        elif kind == "gaps":
            plotting.plot_relative_gaps(ax, rec, [("manual-fp32", "auto-fp32"), ("auto-bf16", "auto-fp32")], "title")
        else:
            plotting.plot_run_series(ax, rec, ["auto-fp32", "auto-bf16"], "lr")
    for ax in axes:
        ax.set_ylabel(ax.get_ylabel() or "a y-axis label")
    fig.savefig(tmp_path / "f.png")  # runs the constrained layout
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    for ax in axes:
        legend, data = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        label = ax.xaxis.label.get_window_extent(renderer)
        assert not legend.overlaps(data), "legend covers the data area"
        assert not legend.overlaps(label), "legend covers the x-axis label"
        for box in (legend, label, ax.yaxis.label.get_window_extent(renderer)):
            assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, "clipped"


def test_the_overlap_check_fails_for_a_legend_inside_the_axes(tmp_path):
    """The check above is able to fail: matplotlib's default legend placement sits on the data."""
    rec = _record()
    fig, ax = plotting.figure(1, 1, 6, 4)
    plotting.plot_loss_curves(ax, rec, ["auto-fp32", "auto-bf16"], "title")
    ax.legend(loc="upper right")
    fig.savefig(tmp_path / "f.png")
    renderer = fig.canvas.get_renderer()
    assert ax.get_legend().get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
