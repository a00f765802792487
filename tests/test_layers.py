"""The three layers (issue 20) as import contracts: `lint-imports` keeps them, and fails on a forbidden import.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``). Each test copies the package and the build
code to a temporary tree, breaks one rule there, and checks that the same contracts fail on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    if not LINT_IMPORTS.is_file():
        pytest.skip("import-linter is not installed in this environment (it is in the site environment)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "docs" / "_ext")])}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=tree,
        env=env,
        timeout=300,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "mpguide", tmp_path / "mpguide", ignore=ignore)
    shutil.copytree(ROOT / "docs" / "_ext", tmp_path / "docs" / "_ext", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_repository_keeps_its_contracts(tree):
    proc = lint_imports(tree)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        (
            "mpguide/precision.py",
            "from mpguide.verify.run import runner",
            "The reader API needs torch and Lightning only",
        ),
        ("mpguide/steps.py", "import sphinx", "The reader API needs torch and Lightning only"),
        (
            "mpguide/checks/rules.py",
            "from mpguide.verify.run import probes",
            "The reader API needs torch and Lightning only",
        ),
        (
            "mpguide/verify/records/__init__.py",
            "from mpguide_build import matrix",
            "The harness never imports the build code",
        ),
        ("mpguide/verify/claims/__init__.py", "import docutils", "The harness never imports Sphinx"),
        ("mpguide/verify/run/probes.py", "from . import runner", "No import cycle inside the harness"),
        ("mpguide/checks/record.py", "from . import rules", "No import cycle inside the harness"),
        ("mpguide/verify/claims/judging.py", "from mpguide.verify.records import schema", "The harness in five floors"),
        ("mpguide/verify/hints.py", "from mpguide.verify import gate", "The harness in five floors"),
        ("mpguide/verify/run/runner.py", "from mpguide.verify.show import report", "The harness in five floors"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(tree, module, line, contract):
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # injected by the test\n")
    proc = lint_imports(tree)
    assert proc.returncode == 1, proc.stdout[-3000:]
    broken = proc.stdout[proc.stdout.index("Broken contracts") :]
    assert contract in broken, broken
