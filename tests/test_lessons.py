"""The examples' teaching share (mpguide_build.lessons): the rule counts what it says, fails on a bad example,
and every example holds the budget."""

from __future__ import annotations

import textwrap

import pytest
from conftest import ROOT

from mpguide_build import lessons

GOOD = '''\
"""
A title
=======

The problem, in two lines of prose
that a reader reads.
"""

# %%
# The model
# ---------

import torch

# sphinx_gallery_start_ignore
from mpguide.verify import runner
runner.quiet_lightning()
# sphinx_gallery_end_ignore

model = torch.nn.Linear(2, 2)
trainer = None

# %%
# Evidence: the runs and their claims
# -----------------------------------

from mpguide.verify import report
RUNS = [("a", "b", "32-true", {})]

# %%
# Why
# ---
# Because.
'''


def _write(tmp_path, text, name="plot_99_probe.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_the_rule_counts_teaching_evidence_and_hidden_lines(tmp_path):
    lesson = lessons.count(_write(tmp_path, GOOD))
    # teaching: 6 docstring lines + 5 (heading, underline, import, two code lines) + 3 (why) = 14; hidden ones uncounted
    assert (lesson.teaching, lesson.verification) == (14, 4), (lesson.teaching, lesson.verification)
    assert lesson.evidence_titles == ["Evidence: the runs and their claims"]
    assert not lesson.problems()


def test_a_harness_import_in_a_teaching_cell_fails(tmp_path):
    bad = GOOD.replace("import torch\n", "import torch\nfrom mpguide.verify import plotting\n")
    problems = lessons.count(_write(tmp_path, bad)).problems()
    assert len(problems) == 1 and "plot_99_probe.py:14: a teaching cell imports mpguide.verify" in problems[0]


def test_an_example_that_mostly_verifies_fails(tmp_path):
    bad = GOOD.replace('RUNS = [("a", "b", "32-true", {})]', "\n".join(f"CLAIM_{i} = {i}" for i in range(40)))
    problems = lessons.count(_write(tmp_path, bad)).problems()
    assert any("counted lines teach (budget 60%)" in p for p in problems), problems


def test_an_example_without_an_evidence_cell_fails(tmp_path):
    problems = lessons.count(_write(tmp_path, GOOD.replace("Evidence: the runs", "The runs"))).problems()
    assert any("no cell titled 'Evidence...'" in p for p in problems), problems


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("plot_*.py")), ids=lambda p: p.stem)
def test_every_example_teaches_first(path):
    lesson = lessons.count(path)
    assert not lesson.problems(), "\n".join(lesson.problems())
