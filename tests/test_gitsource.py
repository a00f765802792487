"""mpguide_build.gitsource: what `nox -s matrix_main` installs from a copy of Lightning's repository."""

import subprocess
import sys

from conftest import ROOT

from mpguide_build import gitsource


def _repo(path):
    def run(*args):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)

    path.mkdir()
    run("init", "-q")
    (path / "setup.py").write_text("print('setup')\n")
    (path / "src" / "lightning").mkdir(parents=True)
    (path / "src" / "lightning" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    (path / "docs").mkdir()
    (path / "docs" / "big.bin").write_text("not needed to install\n")
    for name in ("pyproject.toml", "README.md", "LICENSE", "requirements.txt"):
        (path / name).write_text("x\n")
    (path / "requirements").mkdir()
    (path / "requirements" / "base.txt").write_text("torch\n")
    (path / ".actions").mkdir()
    (path / ".actions" / "assistant.py").write_text("\n")
    run("add", "-A")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    return path


def test_export_writes_what_pip_needs_and_names_the_commit(tmp_path):
    repo = _repo(tmp_path / "lightning")
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "left-over.txt").write_text("from an earlier export\n")
    commit, date = gitsource.export(repo, tmp_path / "dest")
    expected = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert commit == expected.stdout.strip() and len(commit) == 40 and date[:2] == "20"
    assert (tmp_path / "dest" / "src" / "lightning" / "__init__.py").read_text() == "__version__ = '9.9.9'\n"
    assert not (tmp_path / "dest" / "docs").exists() and not (tmp_path / "dest" / "left-over.txt").exists()


def test_a_folder_that_is_not_a_repository_exits_2_with_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mpguide_build.gitsource", str(tmp_path), str(tmp_path / "dest")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "docs" / "_ext"), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr.count("\n") == 1
        and "not a git repository" in proc.stderr
        and "MPGUIDE_LIGHTNING_GIT" in proc.stderr
    )
