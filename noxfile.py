"""Task runner. Sessions: docs (strict build), docs_preview (no execution), docs_live, tests, gate.

    pip install nox && nox -s docs      # build the whole site strictly, every example executed
    pip install nox && nox -s tests     # the test suite

Environment variables:
    MPGUIDE_TORCH    pip requirement for torch (default "torch==2.13.0", the CPU build on these
                     machines). Set it to "" to keep the torch already installed, e.g. a CUDA build
                     with `nox --no-venv -s docs` in your own environment.
    MPGUIDE_PRESET   quick (default), full or test; MPGUIDE_DEVICE: auto (default), cpu or cuda.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

ROOT = Path(__file__).parent.resolve()
BUILD = ROOT / "_build"
nox.options.sessions = ["tests", "docs"]
nox.options.reuse_venv = "yes"

SPHINX = ["sphinx-build", "-c", str(ROOT), str(ROOT / "docs")]
STRICT = ["-W", "--keep-going", "-b", "html"]
PREVIEW = ["-b", "html", "-D", "mpguide_gate=0", "-D", "nb_execution_mode=off", "-D", "plot_gallery=0"]


def install(session: nox.Session) -> None:
    """Install torch (CPU build unless MPGUIDE_TORCH says otherwise), the requirements and mpguide."""
    torch_spec = os.environ.get("MPGUIDE_TORCH", "torch==2.13.0")
    if torch_spec:
        session.install(*torch_spec.split())
    session.install("-r", str(ROOT / "requirements.txt"))
    session.install("-e", str(ROOT), "--no-deps")


@nox.session
def docs(session: nox.Session) -> None:
    """Strict build: every example runs, warnings are errors, the claim gate judges every record.

    Pass `-- --clean` to start from an empty build folder (all examples rerun).
    """
    install(session)
    if "--clean" in session.posargs:
        for path in (BUILD / "html", BUILD / "results", BUILD / "doctrees", ROOT / "docs" / "auto_examples",
                     ROOT / "docs" / "jupyter_execute"):
            shutil.rmtree(path, ignore_errors=True)
    session.run(*SPHINX, str(BUILD / "html"), *STRICT, "-d", str(BUILD / "doctrees"))
    session.log(f"built {BUILD / 'html' / 'index.html'}")


@nox.session(name="docs_preview")
def docs_preview(session: nox.Session) -> None:
    """Fast preview for writers: no example and no page cell runs, the gate is off."""
    install(session)
    session.run(*SPHINX, str(BUILD / "preview"), *PREVIEW, "-d", str(BUILD / "preview-doctrees"))
    session.log(f"preview at {BUILD / 'preview' / 'index.html'}")


@nox.session(name="docs_live")
def docs_live(session: nox.Session) -> None:
    """Live-reloading preview on http://127.0.0.1:8000 (no execution), rebuilt on every save."""
    install(session)
    session.run("sphinx-autobuild", *SPHINX[1:], str(BUILD / "live"), *PREVIEW,
                "--watch", str(ROOT / "mpguide"), "--watch", str(ROOT / "examples"),
                "--ignore", str(ROOT / "docs" / "auto_examples"), "--port", "8000")


def install_browser(session: nox.Session) -> None:
    """Debian's Chromium and chromedriver for the browser test (only where apt-get runs as root)."""
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "chromium", "chromium-driver", external=True)
    else:
        session.warn("chromium/chromedriver missing and not root: install them (Debian: apt-get install "
                     "chromium chromium-driver) or the browser test fails")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (unit tests, examples at the test preset, real builds, a real browser)."""
    install(session)
    install_browser(session)
    session.run("pytest", *session.posargs)


@nox.session
def gate(session: nox.Session) -> None:
    """Judge the records of the last docs build and the committed GPU references."""
    install(session)
    session.run("python", "-m", "mpguide.gate", str(BUILD / "results"), "--reference", str(ROOT / "results" / "reference"))
