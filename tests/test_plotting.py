"""Figures that make their point alone: covered curves say so, skipped steps are markers, faint lines are named."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from conftest import curve, make_record, run

from mpguide.verify.show import overlap, plotting


def _labels(ax) -> list[str]:
    return ax.get_legend_handles_labels()[1]


def _line(ax, start: str):
    return next(line for line in ax.get_lines() if line.get_label().startswith(start))


def test_overlap_partner_finds_a_covered_series_and_only_that():
    ref = curve()
    close = [v * 1.001 for v in ref]  # 0.1 %: drawn on top of each other
    apart = [v * 1.5 for v in ref]  # clearly apart
    partners = overlap.overlap_partner([ref, apart, close])
    assert partners[1] is None, "a curve 50 % above the others does not overlap them"
    assert partners[2] is None, "the last curve drawn covers, it is not covered"
    later, near, common, rel = partners[0]
    assert later == 2 and near == common == len(ref)
    assert rel == pytest.approx(0.001 / 1.001, rel=1e-6)


def test_overlap_partner_on_a_log_axis_ignores_zeros_and_judges_decades():
    ones, tiny = [1.0] * 50, [1e-6] * 50
    assert overlap.overlap_partner([ones, tiny], log=True) == [None, None]
    with_zero = [0.0] + [1.0 + 1e-7] * 49
    found = overlap.overlap_partner([ones, with_zero, tiny], log=True)[0]  # the axis spans 6 decades
    assert found is not None and found[:3] == (1, 49, 49), "the zero (no value on a log axis) is left out"
    # alone on their axis, the two would be autoscaled apart: 1e-7 is then the whole range
    assert overlap.overlap_partner([ones, with_zero], log=True)[0] is None


def test_a_covered_loss_curve_gets_markers_and_names_what_covers_it():
    ref = curve()
    rec = make_record(
        [run("a", ref), run("b", [v * 1.0005 for v in ref], "bf16-mixed"), run("c", [v * 1.6 for v in ref])], []
    )
    fig, ax = plotting.figure(1, 1, 6, 4)
    plotting.plot_loss_curves(ax, rec, ["a", "b", "c"], "t")
    labels = _labels(ax)
    assert labels[0].replace("\n", " ").startswith("a (markers: under b at 140 of 140 batches, at most 0.05 % apart)")
    assert labels[1:] == ["b", "c", overlap.RAW_LABEL], "curves that are visible carry no note"
    assert _line(ax, "a (markers").get_marker() not in ("None", "", None)
    assert _line(ax, "c").get_marker() in ("None", "", None)
    # the markers are drawn again above every line, so the covered curve shows through
    assert any(line.get_zorder() > 3 and line.get_linestyle() == "None" for line in ax.get_lines())


def test_raw_lines_have_a_legend_entry_only_when_drawn():
    error = {"type": "RuntimeError", "message": "x", "traceback": ""}
    rec = make_record([run("a", curve()), run("bad", [], error=error)], [])
    fig, (ax1, ax2) = plotting.figure(1, 2, 8, 4)
    plotting.plot_loss_curves(ax1, rec, ["a"], "t")
    plotting.plot_loss_curves(ax2, rec, ["bad"], "t")
    assert overlap.RAW_LABEL in _labels(ax1)
    assert overlap.RAW_LABEL not in _labels(ax2), "no faint line is drawn for a run that raised"


def _factor_record(values_stock, values_fixed):
    runs = [run("fp32", curve()), run("stock", curve(), "16-mixed"), run("fixed", curve(), "16-mixed")]
    runs[0]["extra"] = {"f": [1.0] * len(values_stock)}
    runs[1]["extra"] = {"f": values_stock}
    runs[2]["extra"] = {"f": values_fixed}
    return make_record(runs, [])


def test_skipped_steps_on_a_log_axis_are_markers_not_drops_to_zero():
    stock = [2.0] + [1.0] * 20 + [0.5] * 5 + [0.0] + [1.0] * 13
    fixed = [1.0] * 30 + [0.0] + [1.0] * 9
    rec = _factor_record(stock, fixed)
    fig, ax = plotting.figure(1, 1, 6, 4)
    plotting.plot_extra_series(ax, rec, ["fp32", "fixed", "stock"], "f", "t", "factor", log_base=2)
    fig.canvas.draw()
    assert ax.get_yscale() == "log"
    for line in ax.get_lines():
        ydata = np.asarray(line.get_ydata(), dtype=float)
        if line.get_transform() == ax.transData:
            assert not np.any(ydata == 0), f"{line.get_label()} is drawn at 0 on a log axis"
    skipped = [line for line in ax.get_lines() if "step skipped" in line.get_label()]
    assert [list(line.get_xdata()) for line in skipped] == [[30], [26]]
    ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    assert ticks and all(t > 0 and math.log2(t).is_integer() for t in ticks)
    assert min(ticks) >= 0.5, "no tick below the data, inside the band of skipped steps"


def test_without_a_log_axis_zeros_stay_values():
    """The markers are not decoration: on a linear axis a 0 is a value and is drawn as one."""
    rec = _factor_record([1.0, 0.0, 1.0], [1.0, 1.0, 1.0])
    fig, ax = plotting.figure(1, 1, 6, 4)
    plotting.plot_extra_series(ax, rec, ["stock"], "f", "t", "factor")
    assert not [line for line in ax.get_lines() if "step skipped" in line.get_label()]
    assert 0.0 in list(_line(ax, "stock").get_ydata())


def test_text_is_large_enough_to_read_when_the_figure_is_shown_at_its_size():
    """Saved at 110 dpi, a 10 pt legend is 15 px in the enlarged view (docs/_static/mpguide.js)."""
    rec = make_record([run("a", curve()), run("b", [v * 2 for v in curve()])], [])
    fig, ax = plotting.figure(1, 1, 12, 5)
    plotting.describe(fig, "A conclusion")
    plotting.plot_loss_curves(ax, rec, ["a", "b"], "t")
    sizes = [t.get_fontsize() for t in ax.get_legend().get_texts()]
    sizes += [ax.xaxis.label.get_fontsize(), ax.title.get_fontsize()]
    sizes += [t.get_fontsize() for t in ax.get_xticklabels()]
    assert min(sizes) >= 10, sizes
    assert fig._suptitle.get_text() == "A conclusion"
