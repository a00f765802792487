"""Verdicts in words: what each row measured with its unit, what was allowed (the tolerance named and
linked), and a result a reader cannot misread ("the bug still reproduces: yes" for a pitfall)."""

from __future__ import annotations

import re

import pytest
from conftest import curve, make_record, run

from mpguide.verify import claims
from mpguide.verify.show import report
from mpguide_build import pages


def _rows(record, **kw):
    return report.verdict_rows(claims.evaluate_record(record), **kw)


def test_rows_say_what_is_measured_with_its_unit_and_the_allowed_bound(good_record):
    rows = {r["check"]: r for r in _rows(good_record)}
    assert rows["port"]["measured"] == "largest gap between smoothed loss curves: 0.00 %"
    assert rows["port"]["allowed"] == "at most 0.10 % (same-precision)"
    assert rows["port"]["result"] == "holds"
    assert re.fullmatch(r"largest gap between smoothed loss curves: 0\.\d\d %", rows["bf16"]["measured"])
    assert rows["bf16"]["allowed"] == "at most 2.00 % (mixed-vs-fp32)"
    assert re.fullmatch(r"average gap between smoothed loss curves: \d+\.\d\d %", rows["pitfall"]["measured"])
    assert rows["pitfall"]["allowed"] == "at least 10.00 % (pitfall-gap)"
    assert rows["pitfall"]["result"] == "the bug still reproduces: yes"  # a pass of a pitfall is not "pass"
    assert rows["the broken recipe stalls"]["measured"] == "recorded stalled = True"
    assert rows["the broken recipe stalls"]["allowed"] == "expected True"


def test_a_pitfall_that_no_longer_reproduces_and_a_broken_match_say_so(good_record):
    broken = next(r for r in good_record["runs"] if r["id"] == "broken")
    broken["loss"] = list(next(r for r in good_record["runs"] if r["id"] == "auto")["loss"])  # the bug is gone
    good_record["runs"][1]["loss"] = curve(scale=1.5)  # and the port diverges
    rows = {r["check"]: r for r in _rows(good_record)}
    assert rows["pitfall"]["result"] == "the bug still reproduces: NO"
    assert rows["pitfall"]["measured"] == "average gap between smoothed loss curves: 0.00 %"
    assert rows["port"]["result"] == "DOES NOT HOLD"
    assert float(rows["port"]["measured"].split(": ")[1].rstrip(" %")) > 10


def test_tolerance_names_link_to_their_definition(good_record):
    rows = {r["check"]: r for r in _rows(good_record, tolerance_href="../verification.html")}
    assert rows["port"]["allowed"] == (
        'at most 0.10 % (<a href="../verification.html#tol-same-precision">same-precision</a>)'
    )
    assert "href" not in rows["the broken recipe stalls"]["allowed"]  # no tolerance, no link
    # the markdown table keeps the link intact (only | and ` are escaped)
    table = pages.markdown_table(list(rows.values()), report.WORD_COLUMNS)
    assert '<a href="../verification.html#tol-pitfall-gap">pitfall-gap</a>' in table


def test_raised_errors_and_warnings_read_as_still_appearing():
    err = {
        "type": "AssertionError",
        "message": "No inf checks were recorded for this optimizer.",
        "traceback": "Traceback (most recent call last):\nAssertionError: No inf checks were recorded",
    }
    runs = [run("bug", [], "16-mixed", error=err), run("ok", curve())]
    runs[1]["warnings"] = ["UserWarning: Detected call of `lr_scheduler.step()` before `optimizer.step()`."]
    record = make_record(
        runs,
        [
            claims.raises("bug", "AssertionError", "No inf checks", "crash"),
            claims.warns("ok", "UserWarning", "Detected call", "warns"),
            claims.raises("ok", "RuntimeError", "x", "should raise"),
        ],
    )
    rows = {r["check"]: r for r in _rows(record)}
    assert rows["crash"]["result"] == "the error still appears: yes"
    assert rows["crash"]["measured"].startswith("error raised: AssertionError: No inf checks")
    assert rows["crash"]["allowed"] == "the error: AssertionError"
    assert rows["warns"]["result"] == "the warning still appears: yes"
    assert rows["warns"]["measured"] == "matching warnings: 1"
    assert rows["should raise"]["result"] == "the error still appears: NO"
    assert rows["should raise"]["measured"] == "no error raised"


def test_count_line_counts_the_rows_the_table_shows(good_record):
    text = report.summary(good_record)
    table, _, last = text.partition("\n\n")
    shown = sum(1 for line in table.splitlines()[2:] if not line.startswith(" "))  # continuation lines start blank
    assert f"{shown} of {shown} checks in the table hold" in last
    assert "besides, 4 automatic checks (every run trains to the end with a finite loss) passed" in last
    good_record["runs"][1]["loss"][50] = float("nan")  # a failing automatic check is listed, and counted
    verdicts = claims.evaluate_record(good_record)
    rows = report.verdict_rows(verdicts)
    line = report.count_line(verdicts)
    holding = sum(r["result"] in ("holds", "the bug still reproduces: yes") for r in rows)
    assert line.startswith(f"{holding} of {len(rows)} checks in the table hold") and holding < len(rows)


def test_expected_error_is_introduced_as_expected():
    err = {
        "type": "AssertionError",
        "message": "No inf checks were recorded for this optimizer.",
        "traceback": 'File "/home/x/venv/lib/python3.11/site-packages/torch/amp/grad_scaler.py", line 4\n'
        "AssertionError: No inf checks were recorded for this optimizer.",
    }
    record = make_record([run("bug-fp16", [], "16-mixed", error=err), run("ok", curve())], [])
    text = report.expected_error(record, "bug-fp16")
    first, *body = text.splitlines()
    assert first.startswith("Expected error, captured from run 'bug-fp16'")
    assert body == [
        '    File "torch/amp/grad_scaler.py", line 4',
        "    AssertionError: No inf checks were recorded for this optimizer.",
    ]
    with pytest.raises(KeyError, match="run 'ok' has no captured error"):
        report.expected_error(record, "ok")


def test_the_html_verdict_table_escapes_every_cell_links_tolerances_and_marks_failures(good_record):
    broken = next(r for r in good_record["runs"] if r["id"] == "broken")
    broken["loss"] = list(next(r for r in good_record["runs"] if r["id"] == "auto")["loss"])  # the bug is gone
    good_record["claims"][0]["title"] = "<script>alert(1)</script> port"
    table = report.verdicts(good_record)
    html = table._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt; port" in html
    assert '<a href="../verification.html#tol-pitfall-gap">pitfall-gap</a>' in html
    assert html.count("<tr class=") == len(report.verdict_rows(table.verdicts))
    failing = re.findall(r'<tr class="mpguide-fail"><td>([^<]*)</td>', html)
    assert failing == ["the bug still reproduces: NO"], failing
    assert "the bug still reproduces: NO" in str(table) and table.caption() in str(table)  # text for a terminal


def test_a_ratio_of_two_numbers_is_not_called_a_speed_ratio():
    # plot_20's rate_ratio claims divide two distances, plot_16's two counts: only a throughput tolerance compares rates
    cand = run("bf16", curve(), precision="bf16-mixed")
    cand["extra"] = {"far": 0.05, "near": 0.003, "fast": 10.0, "slow": 10.0}
    record = make_record(
        [cand],
        [
            claims.rate_ratio("bf16", "far/near", "closer-weights", "distances"),
            claims.rate_ratio("bf16", "fast/slow", "throughput-parity-cpu", "rates"),
        ],
    )
    rows = {r["check"]: r for r in _rows(record)}
    assert rows["distances"]["measured"].startswith("ratio, ")
    assert rows["rates"]["measured"].startswith("speed ratio, ")
