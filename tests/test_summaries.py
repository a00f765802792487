"""mpguide_build.summaries: the per-release pitfall summary never calls a stale or unrun cell holding or fixed."""

from __future__ import annotations

import copy

import pytest

from mpguide_build import matrix_summary, summaries

EXAMPLE = "plot_18_issue_20116_alternating_optimizers"


@pytest.fixture
def column():
    return matrix_summary.load(matrix_summary.summary_path("2.6.6"))


def _cells(rows):
    row = rows[0]
    return [row[k] for k in list(row)[1:]]


def _stale(monkeypatch, which):
    """Cells read stale where ``which(example)`` is true, fresh elsewhere (whatever today's code is)."""

    def why(summary, example, examples=None, library=None):
        return "the code changed since" if which(example) else ""

    monkeypatch.setattr("mpguide_build.matrix_summary.cell_staleness", why)
    monkeypatch.setattr("mpguide_build.matrix_outcomes.cell_staleness", why)


def test_a_stale_example_is_listed_as_not_rerun_only(column, monkeypatch):
    _stale(monkeypatch, lambda example: example == EXAMPLE)
    reproduce, differs, other = _cells(summaries.release_rows([column]))
    assert f"{EXAMPLE}.html" in other
    assert f"{EXAMPLE}.html" not in reproduce and f"{EXAMPLE}.html" not in differs


def test_a_changed_library_makes_every_example_not_rerun(column, monkeypatch):
    _stale(monkeypatch, lambda example: True)
    reproduce, differs, other = _cells(summaries.release_rows([column]))
    # one phrase for the whole column, never "none" (which would read as "nothing reproduces there")
    assert reproduce.startswith("not re-run since") and differs == reproduce and "every example" in other


def test_a_pitfall_that_no_longer_reproduces_is_listed_as_differs(column, monkeypatch):
    _stale(monkeypatch, lambda example: False)
    reproduce, _, _ = _cells(summaries.release_rows([column]))
    assert f"{EXAMPLE}.html" in reproduce  # every pitfall check of example 18 holds on 2.6.6
    changed = copy.deepcopy(column)
    claim = next(c for c in changed["examples"][EXAMPLE]["claims"] if c["kind"] == "raises")
    claim["verdict"] = "fail"
    reproduce, differs, _ = _cells(summaries.release_rows([changed]))
    assert f"{EXAMPLE}.html" in differs and f"{EXAMPLE}.html" not in reproduce


def test_pages_count_no_claim_that_is_not_applicable_as_held_or_failed():
    """A reader's trial saw "32 of 33 checks hold; the build reports the others as failures" in the guide for an
    example whose 33rd claim was only not applicable on this release; the front page said 32 of 32."""
    from mpguide.verify.claims.verdicts import Verdict
    from mpguide_build.pages import counted_checks

    def verdict(kind="expect", passed=True, **kw):
        return Verdict("plot_x", kind, ["a"], "t", "m", 1.0, "= 1", passed, **kw)

    verdicts = [verdict(), verdict(passed=False), verdict(passed=False, applicable=False), verdict(kind="finite")]
    counted, not_applicable = counted_checks(verdicts)
    assert [v.passed for v in counted] == [True, False] and not_applicable == 1
    assert counted_checks([verdict(passed=False, judged=False)]) == ([], 0)
