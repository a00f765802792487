"""The matrix's cell-by-cell runner (mpguide_build.cells): a raising cell is recorded and the next cells run,
the exit status says an error happened, and the first error is the one printed last."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

from mpguide_build import cells

SCRIPT = '''"""A title."""

# %%
# Setup
import sys
seen = ["setup"]

# %%
# A call to copy that needs a newer release
raise AttributeError("'Model' object has no attribute 'toggled_optimizer'")

# %%
# Evidence
seen.append("evidence")
print("evidence ran:", seen)
undefined_name_from_the_failed_cell
'''


def _run(tmp_path, text):
    path = tmp_path / "plot_99_cells.py"
    path.write_text(text)
    runner = ROOT / "docs" / "_ext" / "mpguide_build" / "cells.py"
    return subprocess.run([sys.executable, str(runner), str(path)], capture_output=True, text=True, timeout=60)


def test_a_raising_cell_does_not_stop_the_next_and_the_first_error_comes_last(tmp_path):
    proc = _run(tmp_path, SCRIPT)
    assert proc.returncode == 1
    assert "evidence ran: ['setup', 'evidence']" in proc.stdout
    assert "[cell at line 8 raised]" in proc.stderr and "NameError" in proc.stderr
    tail = proc.stderr.strip().splitlines()[-1]
    assert tail == "AttributeError: 'Model' object has no attribute 'toggled_optimizer'", tail
    assert 'plot_99_cells.py", line 10' in proc.stderr  # tracebacks name the script's own lines


def test_a_clean_script_exits_0_and_cells_keep_line_numbers(tmp_path):
    assert _run(tmp_path, '"""T."""\n\n# %%\nprint("ok")\n').returncode == 0
    parts = cells.cells("a = 1\n# %%\nb = 2\n# %%\nc = 3\n")
    assert [line for line, _ in parts] == [1, 2, 4]
    assert parts[2][1].count("\n") == 5 and parts[2][1].endswith("c = 3\n")
