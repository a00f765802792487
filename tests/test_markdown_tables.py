"""Every markdown table of the docs parses as a table: a block of lines starting with ``|`` has a header and
a ``|---|`` separator as its second line (a blank line inside a table once left three rows of the budgets
page as raw text)."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

_SEPARATOR = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+\s*$")


def table_problems(text: str, name: str) -> list[str]:
    """One sentence per block of ``|`` lines that is not a table (no separator as its second line)."""
    problems, block, start, fenced = [], [], 0, False
    for number, line in enumerate(text.splitlines() + [""], start=1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            start = start if block else number
            block.append(line)
            continue
        if block and not (len(block) >= 2 and _SEPARATOR.match(block[1])):
            problems.append(
                f"{name}:{start}: {len(block)} line(s) starting with '|' are no table (the second line must be "
                f"'|---|...'); a blank line inside a table splits it: remove it"
            )
        block = []
    return problems


@pytest.mark.parametrize("path", sorted((ROOT / "docs").rglob("*.md")), ids=lambda p: p.name)
def test_every_table_of_the_docs_is_a_table(path):
    if "auto_examples" in path.parts or "_build" in path.parts:
        pytest.skip("generated")
    assert not table_problems(path.read_text(), path.name)


def test_a_table_split_by_a_blank_line_is_found():
    good = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert table_problems(good, "x.md") == []
    problems = table_problems(good + "\n| 3 | 4 |\n| 5 | 6 |\n", "x.md")
    assert len(problems) == 1 and problems[0].startswith("x.md:5: 2 line(s)")
