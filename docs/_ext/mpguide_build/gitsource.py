"""Export the installable files of a Lightning git repository for ``nox -s matrix_main``.

``python -m mpguide_build.gitsource GIT_DIR DEST`` writes the files ``pip install`` needs from
``GIT_DIR``'s ``HEAD`` into ``DEST`` (emptied first) and prints one line, ``<commit> <committer date>``
(the 40-hex commit and its ISO 8601 date, which the matrix column names). ``GIT_DIR`` may be a clone
or a bare mirror: ``git archive`` reads the commit, not a work tree, and only the paths below are
exported, because a mirror may lack the large files of ``docs/``. Lightning's ``setup.py`` builds
the unified ``lightning`` package from them when ``PACKAGE_NAME=lightning`` is set.

Exit status 2 with one line naming the folder when it is not a git repository.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

#: What ``pip install`` of Lightning's repository reads (its setup.py, requirements and sources).
INSTALL_PATHS = (
    "setup.py",
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "requirements.txt",
    "requirements",
    "src",
    ".actions",
)


class GitSourceError(Exception):
    """``GIT_DIR`` is not a git repository, or ``git archive`` failed; the message says which and why."""


def head(git_dir: str | Path) -> tuple[str, str]:
    """``(commit, committer date)`` of ``HEAD`` in ``git_dir`` (40 hex digits; ISO 8601 with offset).

    Raises:
        GitSourceError: ``git_dir`` is not a git repository.
    """
    proc = subprocess.run(["git", "-C", str(git_dir), "log", "-1", "--format=%H %cI"], capture_output=True, text=True)
    if proc.returncode or len(proc.stdout.split()) != 2:
        raise GitSourceError(
            f"{git_dir}: not a git repository ({proc.stderr.strip() or 'no commit'}); point MPGUIDE_LIGHTNING_GIT "
            "at a clone or a bare mirror of Lightning-AI/pytorch-lightning"
        )
    commit, date = proc.stdout.split()
    return commit, date


def export(git_dir: str | Path, dest: str | Path) -> tuple[str, str]:
    """Write :data:`INSTALL_PATHS` of ``HEAD`` into ``dest`` (emptied first); returns :func:`head`.

    Raises:
        GitSourceError: ``git_dir`` is not a git repository, or ``git archive`` failed.
    """
    commit, date = head(git_dir)
    proc = subprocess.run(["git", "-C", str(git_dir), "archive", "HEAD", *INSTALL_PATHS], capture_output=True)
    if proc.returncode:
        raise GitSourceError(f"{git_dir}: git archive HEAD failed: {proc.stderr.decode(errors='replace').strip()}")
    dest = Path(dest)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return commit, date


def main(argv: list[str] | None = None) -> int:
    """Command line: export, then print ``<commit> <date>``; exit 2 with one line on a bad folder."""
    parser = argparse.ArgumentParser(prog="python -m mpguide_build.gitsource", description=__doc__.splitlines()[0])
    parser.add_argument("git_dir", help="a clone or bare mirror of Lightning-AI/pytorch-lightning")
    parser.add_argument("dest", help="folder to write the installable files into (emptied first)")
    args = parser.parse_args(argv)
    try:
        commit, date = export(args.git_dir, args.dest)
    except GitSourceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(commit, date)
    return 0


if __name__ == "__main__":
    sys.exit(main())
