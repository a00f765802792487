"""Task runner. Sessions: docs (strict build), docs_preview (no execution), docs_live, tests, gate, matrix.

    pip install nox && nox -s docs      # build the whole site strictly, every example executed
    pip install nox && nox -s tests     # the test suite

Environment variables:
    MPGUIDE_TORCH    pip requirement for torch (default "torch==2.13.0", the CPU build on these
                     machines). Set it to "" to keep the torch already installed, e.g. a CUDA build
                     with `nox --no-venv -s docs` in your own environment.
    MPGUIDE_PRESET   quick (default), full or test; MPGUIDE_DEVICE: auto (default), cpu or cuda.
    MPGUIDE_MATRIX_EXAMPLES  space-separated example stems for `nox -s matrix` (default: all).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def requirement(name: str) -> str:
    """The line of requirements.txt that pins ``name`` (so the matrix uses the site's versions)."""
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        spec = line.split("#")[0].strip()
        if spec.lower().startswith(name.lower()) and spec[len(name):len(name) + 1] in "=<>!~ ":
            return spec
    raise ValueError(f"requirements.txt has no line for {name}")


@nox.session
def matrix(session: nox.Session) -> None:
    """Every example at the test preset on each Lightning release of mpguide.matrix.RELEASES.

    One base environment holds torch (CPU build), scikit-learn, matplotlib, numpy and pytest; each
    release gets its own venv that sees the base through a .pth file and installs only
    ``lightning==X`` (plus a setuptools that still ships pkg_resources, which Lightning < 2.4
    imports). ``python -m mpguide.matrix run`` then runs the examples and the plugin tests there and
    writes results/matrix/lightning-X.json. A release that cannot be installed or imported is
    recorded as "could not run". Pass releases as arguments to run only those:
    ``nox -s matrix -- 2.4.0 2.6.6``; MPGUIDE_MATRIX_EXAMPLES restricts the examples.
    """
    sys.path.insert(0, str(ROOT))
    from mpguide.matrix import MATRIX_DIR, RELEASES

    torch_spec = os.environ.get("MPGUIDE_TORCH", "torch==2.13.0")
    if torch_spec:
        session.install(*torch_spec.split())
    session.install(*(requirement(n) for n in ("scikit-learn", "numpy", "matplotlib", "pytest")))
    base = Path(session.virtualenv.location)
    base_site = session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                            silent=True).strip()
    releases = session.posargs or list(RELEASES)
    examples = os.environ.get("MPGUIDE_MATRIX_EXAMPLES", "").split()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for version in releases:
        venv = base.parent / f"matrix-lightning-{version}"
        python = venv / "bin" / "python"
        log = base.parent / f"matrix-lightning-{version}.log"
        session.log(f"Lightning {version}: environment {venv.name}")
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        Path(site, "mpguide_matrix_base.pth").write_text(base_site + "\n")
        with open(log, "w") as out:
            install = subprocess.run([str(python), "-m", "pip", "install", "-q", f"lightning=={version}",
                                      "setuptools<81"], stdout=out, stderr=subprocess.STDOUT)
            check = subprocess.run([str(python), "-c", "import lightning, torch, sys; "
                                    "assert lightning.__file__.startswith(sys.prefix), lightning.__file__; "
                                    "print(lightning.__version__, torch.__version__)"],
                                   stdout=out, stderr=subprocess.STDOUT) if install.returncode == 0 else None
        stage = "install" if install.returncode else "import" if check.returncode else ""
        if stage:
            session.run("python", "-m", "mpguide.matrix", "error", "--lightning", version, "--stage", stage,
                        "--message-file", str(log), "--out", str(MATRIX_DIR), *(["--examples", *examples]
                                                                                 if examples else []), env=env)
            continue
        session.run(str(python), "-m", "mpguide.matrix", "run", "--lightning", version, "--out", str(MATRIX_DIR),
                    *(["--examples", *examples] if examples else []), env=env, external=True)
    session.log(f"summaries in {MATRIX_DIR}; commit them (git add results/matrix)")
