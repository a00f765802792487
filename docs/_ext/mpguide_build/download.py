"""What a reader downloads: the helper library as a wheel published by the docs build, and its install line.

Every downloaded example imports ``mpguide`` (the run harness writes the results record and
checks the claims), so the site must offer the library itself. The docs build writes
``_static/<WHEEL_NAME>`` next to the pages (:func:`~mpguide_build.download.write_wheel`, connected in
``conf.py``), every example page links it, and :data:`~mpguide_build.download.INSTALL_COMMANDS` are the
commands a reader runs in the folder holding the wheel and the downloaded example. The wheel is built
here, from the package's own source files, with no build backend and no network: a pure-Python
wheel is a zip archive with ``METADATA``, ``WHEEL``, ``entry_points.txt`` and ``RECORD``
(PEP 427, PEP 376). Entries carry a fixed date, so the same sources give the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import mpguide
from mpguide import __version__

#: Distribution name and version of the wheel (``mpguide.__version__``).
DIST = "mpguide"
#: File name of the wheel the site offers, name-version-python-abi-platform as PEP 427 spells it.
WHEEL_NAME = f"{DIST}-{__version__}-py3-none-any.whl"
#: What the examples import besides mpguide and torch, pinned as in ``requirements.txt``.
READER_REQUIREMENTS = ("lightning==2.6.6", "scikit-learn==1.9.1", "matplotlib==3.11.2")
#: What the library itself imports besides torch and Lightning, declared as ``Requires-Dist`` in the
#: wheel's ``METADATA`` so that the install line pulls it in: pydantic validates every record an example
#: writes (:mod:`mpguide.verify.records.schema`, pydantic 2's API). A lower bound, never an exact pin: the
#: wheel goes into a reader's own environment (``requirements.txt`` pins the site's version).
WHEEL_REQUIREMENTS = ("pydantic>=2",)
#: The instruction as one command, where the pages quote it inline in a sentence (the front page, the guide).
INSTALL_LINE = f"pip install {WHEEL_NAME} {' '.join(READER_REQUIREMENTS)}"
#: Columns of a command in :data:`INSTALL_COMMANDS`: what a code block shows on a 412 px phone
#: (``mpguide_build.gallery_format``: 12 px code, 50 characters).
COMMAND_WIDTH = 50


def install_commands(width: int = COMMAND_WIDTH) -> tuple[str, ...]:
    """The same install as :data:`INSTALL_LINE`, cut into ``pip install`` commands of at most ``width`` characters.

    The requirements go first, packed greedily, and the wheel last, so that pip resolves the wheel's own
    requirements (``pydantic>=2``) against the Lightning already installed. Separate commands rather than one
    continued with a backslash, which Windows' shells do not read. Raises ``ValueError`` when one requirement
    alone does not fit ``width``.
    """
    commands: list[str] = []
    for requirement in (*READER_REQUIREMENTS, WHEEL_NAME):
        joined = f"{commands[-1]} {requirement}" if commands and requirement != WHEEL_NAME else ""
        if joined and len(joined) <= width:
            commands[-1] = joined
            continue
        command = f"pip install {requirement}"
        if len(command) > width:
            raise ValueError(f"{command!r} is {len(command)} characters, over {width}; raise the width")
        commands.append(command)
    return tuple(commands)


#: The instruction printed as a code block on every example page and in the header of every downloaded
#: file, one command a line, each short enough for a phone's code block.
INSTALL_COMMANDS = install_commands()
#: The instruction wherever ``PitfallChecks`` is offered on its own. ``mpguide.checks`` imports torch and
#: Lightning only (the import contract in pyproject.toml), which a reader who trains with Lightning has:
#: ``--no-deps`` installs nothing else and changes none of their versions. The wheel's version is fixed
#: (the examples' headers name its file), so ``--force-reinstall`` makes pip replace an older copy of the
#: same version instead of keeping it ("Requirement already satisfied").
CHECKS_INSTALL_LINE = f"pip install --force-reinstall --no-deps {WHEEL_NAME}"
#: Lightning releases on which every PitfallChecks claim of the version matrix holds for the runs without
#: ``ManualMixedPrecision`` (which refuses releases it was not tested on); tests/test_reader_download.py
#: reads results/matrix/ to keep this true (claims declared ``only_if`` a condition the release does not meet are
#: not applicable there). Older releases fail flags claims for other reasons (the matrix's releases page).
CHECKS_RELEASES = ("2.5.4", "2.5.5", "2.6.6")
_DATE = (2026, 1, 1, 0, 0, 0)  # fixed entry date: reproducible bytes


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def wheel_files(package_dir: Path | None = None) -> dict[str, bytes]:
    """Archive path -> bytes of every file of the wheel, ``RECORD`` last.

    Args:
        package_dir: folder of the ``mpguide`` package (default: the installed one).

    Raises:
        FileNotFoundError: ``package_dir`` holds no ``__init__.py``.
    """
    package_dir = Path(package_dir or Path(mpguide.__file__).parent)
    if not (package_dir / "__init__.py").is_file():
        raise FileNotFoundError(f"{package_dir}: not the mpguide package (no __init__.py); pass its folder")
    info = f"{DIST}-{__version__}.dist-info"
    files = {
        f"{DIST}/{p.relative_to(package_dir).as_posix()}": p.read_bytes()
        for p in sorted(package_dir.rglob("*.py"))
        if "__pycache__" not in p.parts
    }
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {__version__}\n"
        "Summary: Helper library of the verified guide to manual optimization under mixed precision\n"
        "Requires-Python: >=3.10\n" + "".join(f"Requires-Dist: {r}\n" for r in WHEEL_REQUIREMENTS)
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: mpguide_build.download\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{info}/entry_points.txt"] = b"[console_scripts]\nmpguide-gate = mpguide.verify.gate:main\n"
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    return files


def write_wheel(directory: Path, package_dir: Path | None = None) -> Path:
    """Write ``<directory>/<WHEEL_NAME>`` (created if missing) and return its path."""
    path = Path(directory) / WHEEL_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in wheel_files(package_dir).items():
            entry = zipfile.ZipInfo(name, _DATE)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    tmp.replace(path)
    return path


def publish_wheel(app, exception) -> None:
    """Sphinx ``build-finished`` handler: put the wheel in the HTML output's ``_static`` folder.

    Only for HTML builders and successful builds; the example pages link ``../_static/<WHEEL_NAME>``.
    """
    if exception is None and getattr(app.builder, "format", "") == "html":
        write_wheel(Path(app.outdir) / "_static")
