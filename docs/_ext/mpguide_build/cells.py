"""Run an example cell by cell, as the version matrix does: a cell that raises does not stop the next ones.

An example is a lesson first: its call to copy (a ``Trainer(...).fit(...)`` with ``toggled_optimizer`` or
``ManualMixedPrecision``) comes before its ``Evidence...`` cells and may need a newer Lightning than a matrix
column installs. Run as one script, the example would stop there and leave no record, although its evidence
(the stock runs, which the releases page reports per release) does not depend on that cell. So the matrix runs
each example through this module: the script is cut at its ``# %%`` lines (sphinx-gallery's cells) and the
cells run in order in one ``__main__`` namespace; each cell that raises prints its traceback to stderr and
the next cell runs. The exit status is 1 when any cell raised, and the *first* error's traceback is printed
again last, so the matrix records the error that stopped the lesson, not a later ``NameError`` it caused.

``python docs/_ext/mpguide_build/cells.py examples/plot_02_two_optimizers.py`` (it imports nothing of the
build code: the matrix's environment has the repository, not ``docs/_ext``, on its path).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path


def cells(source: str) -> list[tuple[int, str]]:
    """``(first line, code)`` of each cell of ``source``, cut before each ``# %%`` line; line numbers are kept
    (each cell is padded with blank lines) so that tracebacks name the script's own lines."""
    lines = source.splitlines(keepends=True)
    starts = [0] + [i for i, line in enumerate(lines) if line.startswith("# %%")]
    bounds = [b for b in dict.fromkeys(starts)] + [len(lines)]
    return [(a + 1, "\n" * a + "".join(lines[a:b])) for a, b in zip(bounds, bounds[1:]) if a < b]


def run(path: Path) -> int:
    """Run ``path`` cell by cell (see the module docstring); 0 when no cell raised, else 1."""
    namespace = {"__name__": "__main__", "__file__": str(path)}
    sys.path.insert(0, str(path.parent))
    sys.argv = [str(path)]  # as ``python EXAMPLE.py`` would see it
    first: str | None = None
    for line, code in cells(path.read_text()):
        try:
            exec(compile(code, str(path), "exec"), namespace)
        except SystemExit as stop:
            if stop.code not in (0, None):
                raise
            return 0 if first is None else 1
        except Exception:  # noqa: BLE001 - recorded, and the next cell runs
            text = traceback.format_exc()
            print(f"[cell at line {line} raised]\n{text}", file=sys.stderr, flush=True)
            first = first or text
    if first is not None:
        print(f"[the first error]\n{first}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_file():
        print("usage: python -m mpguide_build.cells EXAMPLE.py (an existing file)", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(run(Path(sys.argv[1])))
