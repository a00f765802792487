"""How much of each example teaches: the line rule of the examples' budget (docs/budgets.md).

The rule, per ``examples/plot_*.py``:

* The script is cut into sphinx-gallery cells at its ``# %%`` lines; the first cell is the module
  docstring (the problem, the install line, what the reader learns).
* A cell whose section title (its first comment line after ``# %%``) starts with ``Evidence`` is
  verification: the probes, the ``RUNS``/``CLAIMS`` tables, ``run_example`` and the verdict table.
* Lines between ``# sphinx_gallery_start_ignore`` and ``# sphinx_gallery_end_ignore`` are not counted:
  the page does not show them (the settings check, the quiet logging).
* Every other non-blank line teaches: the docstring, the prose comments, the reader's model, the call
  to copy, the figures, the conclusion.

``teaching share = teaching lines / (teaching + verification lines)``; the budget is at least
:data:`MIN_TEACHING_SHARE`. Besides, no teaching cell may import the harness (``mpguide.verify``): a
reader copies those cells. Run ``python -m mpguide_build.lessons`` for the table, or with file names.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: At least this share of an example's counted lines teach (the budget).
MIN_TEACHING_SHARE = 0.60
#: A section title that marks a verification cell.
EVIDENCE_PREFIX = "Evidence"
_HARNESS_IMPORT = re.compile(r"^\s*(from\s+mpguide\.verify\b|import\s+mpguide\.verify\b)")
ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Lesson:
    """The line count of one example (see the module docstring for the rule)."""

    path: Path
    teaching: int = 0
    verification: int = 0
    harness_imports: list[int] = field(default_factory=list)  # 1-based lines of teaching cells importing mpguide.verify
    evidence_titles: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        total = self.teaching + self.verification
        return self.teaching / total if total else 0.0

    def problems(self) -> list[str]:
        """What breaks the budget, one sentence each (empty when it holds)."""
        out = []
        if self.share < MIN_TEACHING_SHARE:
            out.append(
                f"{self.path.name}: {self.share:.1%} of its {self.teaching + self.verification} counted lines teach "
                f"(budget {MIN_TEACHING_SHARE:.0%}); move probes and tables into fewer lines or a cell titled "
                f"'{EVIDENCE_PREFIX}...' that says less, or teach more"
            )
        for line in self.harness_imports:
            out.append(
                f"{self.path.name}:{line}: a teaching cell imports mpguide.verify; import the harness in the "
                f"'{EVIDENCE_PREFIX}...' cell (or a hidden sphinx_gallery_start_ignore block)"
            )
        if not self.evidence_titles:
            out.append(f"{self.path.name}: no cell titled '{EVIDENCE_PREFIX}...' holds its runs and claims")
        return out


def count(path: Path) -> Lesson:
    """Count ``path`` by the module's rule."""
    lesson = Lesson(path)
    lines = path.read_text().splitlines()
    evidence = False  # the first cell (the docstring and the imports before the first "# %%") teaches
    hidden = False
    title_next = False
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped.startswith("# %%"):
            evidence, title_next = False, True
            continue
        if title_next and stripped.startswith("#"):
            title = stripped.lstrip("#").strip()
            if title:
                evidence = title.startswith(EVIDENCE_PREFIX)
                if evidence:
                    lesson.evidence_titles.append(title)
                title_next = False
        elif stripped:
            title_next = False
        if stripped == "# sphinx_gallery_start_ignore":
            hidden = True
            continue
        if stripped == "# sphinx_gallery_end_ignore":
            hidden = False
            continue
        if hidden or not stripped or stripped.startswith("# %%"):
            continue
        if evidence:
            lesson.verification += 1
        else:
            lesson.teaching += 1
            if _HARNESS_IMPORT.match(line):
                lesson.harness_imports.append(number)
    return lesson


def main(argv: list[str] | None = None) -> int:
    """Print each example's share; exit 1 when one breaks the budget (each problem on its own line)."""
    names = sys.argv[1:] if argv is None else argv
    paths = [Path(n) for n in names] or sorted((ROOT / "examples").glob("plot_*.py"))
    problems = []
    for path in paths:
        lesson = count(path)
        print(
            f"{path.name:<40} teaching {lesson.teaching:>4}  verification {lesson.verification:>4}  {lesson.share:6.1%}"
        )
        problems += lesson.problems()
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
