"""The small programs behind the nox sessions: ``python -m mpguide_build.tasks COMMAND`` (see ``--help``).

``noxfile.py`` stays a task runner: each session installs what it needs and calls a module. What a session
needs beyond Sphinx, pytest and the matrix lives here:

``check-settings``
    refuse, in one line and before Sphinx starts, ``MPGUIDE_*`` settings that no example accepts (the
    build's own check, :func:`mpguide_build.sphinx_ext.check_run_environment`); exit 1.
``clean``
    remove everything a docs build generated, so every example reruns.
``cuda``
    one line naming the CUDA device; exit 1 with the reason when this interpreter's torch sees none.
``imports --checkout DIR``
    the packages the GPU build imports are there and ``mpguide`` is imported from ``DIR``; exit 1 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "_build"
#: What a docs build generates (removed by ``clean``).
GENERATED = (
    BUILD / "html",
    BUILD / "results",
    BUILD / "doctrees",
    ROOT / "docs" / "auto_examples",
    ROOT / "docs" / "jupyter_execute",
    ROOT / "docs" / "sg_execution_times.rst",
)
#: Distributions whose versions the GPU build prints (the import check).
BUILD_PACKAGES = ("sphinx", "sphinx-gallery", "myst-nb", "torch", "lightning", "scikit-learn", "matplotlib", "numpy")


def requirement_pins(requirements: Path, *names: str) -> list[str]:
    """The lines of ``requirements`` (a requirements.txt) that pin ``names`` (the matrix sessions' base)."""
    lines = [line.split("#")[0].strip() for line in requirements.read_text().splitlines()]
    return [line for line in lines if line.split("=")[0].split(">")[0].strip().lower() in names]


def check_settings(examples: Path) -> int:
    """Exit code 0 when the build's own settings check passes; else print its one line and return 1."""
    from sphinx.errors import ConfigError

    from .sphinx_ext import check_run_environment

    try:
        check_run_environment(examples)
    except ConfigError as err:
        print(str(err).removeprefix("[mpguide] "))
        return 1
    return 0


def clean(paths: Sequence[Path] = GENERATED) -> int:
    """Remove ``paths`` (folders and files); missing ones are fine."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return 0


def cuda(session: str = "") -> int:
    """Print the CUDA device, or in one line why there is none (no torch, a CPU build, no device); exit 1 then."""
    try:
        import torch
    except ImportError:
        reason = "torch is not installed in this environment"
    else:
        reason = (
            ""
            if torch.cuda.is_available()
            else (f"torch {torch.__version__} here has no usable CUDA device (CUDA build: {torch.version.cuda})")
        )
    if reason:
        print(
            f"{session} needs a CUDA GPU and a CUDA build of torch in the environment that runs nox: {reason}; "
            "on a CPU machine run `nox -s docs`"
            if session
            else reason
        )
        return 1
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    return 0


def imports(checkout: Path) -> int:
    """Check that the build's packages import and that ``mpguide`` comes from ``checkout``."""
    import importlib
    import importlib.metadata as md

    try:
        for name in (
            "sphinx",
            "sphinx_gallery",
            "myst_nb",
            "pydata_sphinx_theme",
            "ipykernel",
            "sklearn",
            "matplotlib",
            "lightning",
        ):
            importlib.import_module(name)
        import mpguide
    except ImportError as err:
        print(f"{err}", file=sys.stderr)
        return 1
    where = Path(mpguide.__file__).resolve().parent
    if where != (Path(checkout) / "mpguide").resolve():
        print(
            f"mpguide is imported from {where}, not from this checkout (put the checkout on PYTHONPATH)",
            file=sys.stderr,
        )
        return 1
    print("packages: " + ", ".join(f"{name} {md.version(name)}" for name in BUILD_PACKAGES))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mpguide_build.tasks check-settings|clean|cuda|imports``."""
    parser = argparse.ArgumentParser(prog="python -m mpguide_build.tasks", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check-settings", help="refuse unknown MPGUIDE_* settings in one line").add_argument(
        "--examples", type=Path, default=ROOT / "examples"
    )
    sub.add_parser("clean", help="remove everything a docs build generated")
    sub.add_parser("cuda", help="exit 1 unless this interpreter's torch sees a CUDA device").add_argument(
        "--for", dest="session", default="", help="the session that needs it (named in the refusal)"
    )
    sub.add_parser("imports", help="the GPU build's packages import; mpguide is this checkout's").add_argument(
        "--checkout", type=Path, default=ROOT
    )
    args = parser.parse_args(argv)
    if args.command == "check-settings":
        return check_settings(args.examples)
    if args.command == "clean":
        return clean()
    if args.command == "cuda":
        return cuda(args.session)
    return imports(args.checkout)


if __name__ == "__main__":
    sys.exit(main())
