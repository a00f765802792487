"""Results records: one versioned JSON file per example, written atomically.

A record is the only thing that travels from a training example to the guide page and to the
claim gate. Layout (``schema_version`` 2)::

    {
      "example": "plot_01_porting_to_manual",   # file stem of the example
      "schema_version": 2,
      "created": "2026-11-29T20:00:00Z",        # UTC, ISO 8601
      "preset": "quick",                        # size preset, see mpguide.verify.hardware
      "env": {"python", "torch", "lightning", "accelerator", "device", "cuda", "platform",
              "lightning_autocast_cache"?},         # measured: mpguide.verify.claims.conditions
      "source": {"example_code", "library_code", "declaration_sha256", "commit", "dirty",
                 "run_env": {"MPGUIDE_PRESET", "MPGUIDE_DEVICE", "swaps"},
                 "example_sha256"?, "library_sha256"?, "upgraded_from_schema"?},
      "runs": [{"id", "mode", "precision", "precision_plugin", "recipe", "seed", "steps",
                "plugin", "trainer_kwargs", "plain_flag", "swapped_from"?, "label",
                "loss": [float] * steps, "lr": [float] * steps, "loss_scale": [float] * steps | null,
                "skipped_steps": int, "seconds": float, "error": null | {"type", "message", "traceback"},
                "warnings": [str], "extra": {}}],
      "claims": [{"kind", "runs", "title", "tolerance" | "exception" | "message" | "category" | "key" | "section"
                  | "expected" | "only_on" | "only_if",
                  "value", "threshold", "verdict", "metric", "detail", "observed"}]
    }

A claim's ``verdict`` is ``"pass"``, ``"FAIL"``, ``"inconclusive"`` (a paired throughput claim the data
could not decide; never a pass, see :data:`mpguide.verify.claims.tolerances.INCONCLUSIVE_RULE`), ``"not judged"``
or ``"not applicable"`` (an ``only_if`` claim whose measured condition does not hold in ``env``), as
:attr:`mpguide.verify.claims.verdicts.Verdict.status` gives it when the record is written; the gate re-judges every
record and never reads these words.

Every field is typed in :mod:`mpguide.verify.records.schema` (pydantic models, strict mode) and listed in
:data:`~mpguide.verify.records.schema.SCHEMA_FIELDS`; a record with any other field (top level, ``env``,
``source``, ``run_env``, a run, its ``error``, a claim) or a value of the wrong type is refused,
naming the file, the field's JSON path and the fix. A run's ``extra`` is the one free-form object:
each recipe records its own measurements there, typed by what its probes declare (``runs[].measures``,
:mod:`mpguide.verify.records.measures`).

``source`` says what the record was produced from: the **code digests** of the example file and of the
helper library's sources (``example_code``, ``library_code``: :func:`~mpguide.verify.records.example_code_digest`,
:func:`~mpguide.verify.records.library_code_digest`; a docstring or comment edit changes neither, see
:mod:`mpguide.verify.records.codedigest`), the SHA-256 of the runs and claims the
example declared for this record (:func:`mpguide.verify.claims.declarations.digest_of`; the claims of the
record's accelerator only), the git commit when known (``dirty`` when the example or library
differed from it), and the environment variables that steer a run. The claim gate compares the
record with the example's declaration (:mod:`mpguide.verify.claims.declarations`), calls a record **stale**
when the example's code changed since it was written (or the record has no ``example_code``), and
checks that the runs and claims the record holds still hash to its ``declaration_sha256`` (so a run or
claim deleted or edited later is noticed even in a stale reference, which is not compared with today's declaration).

Records written before code digests carry the byte digests ``example_sha256`` and ``library_sha256``
instead (SHA-256 of the file's bytes; :func:`~mpguide.verify.records.file_digest`,
:func:`~mpguide.verify.records.library_digest`): such a record reads as stale until it is rerun, or until
``python -m mpguide_build.matrix migrate`` adds the code digests after checking that the byte digests it
holds are those of the sources it migrates from (committed GPU references).

Non-finite losses are stored as JSON's ``NaN``/``Infinity`` tokens (Python's :mod:`json` reads them
back), so a NaN curve stays visible to the gate instead of being dropped.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
import platform
import re
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# The schema (types, validation, RecordError) lives in mpguide.verify.records.schema; these names stay importable from
# here.
from .. import hints
from .codedigest import CodeDigestError as CodeDigestError
from .codedigest import code_digest, combine
from .schema import SCHEMA_FIELDS as SCHEMA_FIELDS
from .schema import SCHEMA_VERSION, RecordError, validate_record

#: Environment variable naming the folder where examples write records (the docs build sets it).
RESULTS_ENV = "MPGUIDE_RESULTS_DIR"


def results_dir() -> Path:
    """Folder for this machine's records: ``$MPGUIDE_RESULTS_DIR`` or ``./results/local``."""
    return Path(os.environ.get(RESULTS_ENV) or Path.cwd() / "results" / "local")


#: Environment variable naming the folder of committed reference records (the docs build sets it).
REFERENCE_ENV = "MPGUIDE_REFERENCE_DIR"


def reference_dir() -> Path:
    """Folder of committed reference records, one subfolder per device (``<device-slug>/``).

    ``$MPGUIDE_REFERENCE_DIR``, else ``results/reference`` of the repository this library lives in.
    """
    return Path(os.environ.get(REFERENCE_ENV) or REPO_ROOT / "results" / "reference")


def record_path(example: str, directory: Path | None = None) -> Path:
    """Path of the record of ``example`` (a file stem) inside ``directory``.

    ``directory`` defaults to :func:`~mpguide.verify.records.results_dir`.
    """
    return Path(directory or results_dir()) / f"{example}.json"


def environment(accelerator: str) -> dict[str, Any]:
    """Versions and hardware of this process, for the ``env`` field, and the conditions claims may depend on,
    measured here (:func:`mpguide.verify.claims.conditions.measure`).

    Args:
        accelerator: ``"cpu"`` or ``"cuda"``.
    """
    import lightning
    import torch

    from ..claims import conditions
    from ..hardware import device_name

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "accelerator": accelerator,
        "device": device_name(accelerator),
        "cuda": (torch.version.cuda or "unknown") if accelerator == "cuda" else "cpu",
        "platform": platform.platform(terse=True),
        **conditions.measure(),
    }


#: The repository this library lives in (its ``examples/`` and ``mpguide/`` are hashed for ``source``).
REPO_ROOT = Path(__file__).resolve().parents[3]
#: The installed package whose sources a record's library digest covers (the reader API and this harness).
#: The docs build's own code (``docs/_ext/mpguide_build``) is not part of it, so editing the build never
#: makes a record stale (and never reruns the examples).
PACKAGE_DIR = Path(__file__).resolve().parents[2]


def file_digest(path: Path) -> str | None:
    """SHA-256 (hex) of a file's bytes, or ``None`` when it does not exist.

    The digest records carried before code digests (``source.example_sha256``): kept to read them and to
    migrate results made under it (:func:`mpguide_build.matrix_migrate.migrate`); freshness is decided by
    :func:`example_code_digest`.
    """
    path = Path(path)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


#: Package modules (paths relative to the package) that only draw figures and tables. Examples run
#: them, so they are part of a record's library digest, but no verdict depends on them: the version
#: matrix leaves them out.
PRESENTATION_MODULES = frozenset(
    {"verify/show/__init__.py", "verify/show/plotting.py", "verify/show/overlap.py", "verify/show/report.py"}
)


def package_files(exclude: frozenset[str] = frozenset()) -> list[tuple[str, Path]]:
    """``(path relative to the package, file)`` of every ``mpguide/**/*.py`` but ``exclude``, in path order."""
    out = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        name = path.relative_to(PACKAGE_DIR).as_posix()
        if "__pycache__" not in path.parts and name not in exclude:
            out.append((name, path))
    return out


def bytes_digest_of(files: Iterable[tuple[str, bytes]]) -> str:
    """The byte digest of a library given as ``(relative path, bytes)`` pairs: SHA-256 over each path and its
    bytes, in path order (the algorithm of ``source.library_sha256`` and of the matrix's ``library_sha256``)."""
    digest = hashlib.sha256()
    for name, data in sorted(files, key=lambda pair: pair[0]):
        digest.update(name.encode())
        digest.update(data)
    return digest.hexdigest()


def library_digest(exclude: frozenset[str] = frozenset()) -> str:
    """SHA-256 (hex) over the relative paths and bytes of the package sources examples run, in path order.

    The byte digest of results made before code digests (``source.library_sha256``), kept to read them
    and to migrate them; freshness is decided by :func:`library_code_digest`. Every ``mpguide/**/*.py``
    except ``exclude`` (paths relative to the package).
    """
    return bytes_digest_of((name, path.read_bytes()) for name, path in package_files(exclude))


@functools.lru_cache(maxsize=1024)
def _code_digest_cached(path: str, mtime_ns: int, size: int) -> str:
    return code_digest(Path(path))


def example_code_digest(path: Path) -> str | None:
    """:func:`~mpguide.verify.records.codedigest.code_digest` of a file (an example), ``None`` when it does not exist.

    Cached by the file's modification time and size, so the pages may ask once per matrix cell.

    Raises:
        ~mpguide.verify.records.codedigest.CodeDigestError: the file does not parse (the message names it and the line).
    """
    path = Path(path)
    if not path.is_file():
        return None
    stat = path.stat()
    return _code_digest_cached(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


def library_code_digest(exclude: frozenset[str] = frozenset()) -> str:
    """The code digest of the package sources examples run: each relative path with its code digest
    (:mod:`mpguide.verify.records.codedigest`; docstrings and comments do not count), in path order.

    Every ``mpguide/**/*.py`` except ``exclude`` (paths relative to the package, e.g.
    :data:`~mpguide.verify.records.PRESENTATION_MODULES` for the library verdicts depend on). A file added,
    removed or renamed changes it.
    """
    return combine((name, str(example_code_digest(path))) for name, path in package_files(exclude))


def short_paths(text: str) -> str:
    """``text`` with machine-specific folders cut: ``/any/where/site-packages/torch/x.py`` -> ``torch/x.py``,
    ``/any/where/lib/python3.11/threading.py`` -> ``threading.py``.

    Tracebacks captured in records carry the absolute paths of the machine that ran them; a page
    shows the package-relative part only, and paths inside this repository relative to its root
    (``examples/plot_02_two_optimizers.py``).
    """
    text = text.replace(f"{REPO_ROOT}/", "").replace(f"{REPO_ROOT}\\", "")
    text = re.sub(r"(?:[A-Za-z]:)?[^\s\"']*[/\\](?:site|dist)-packages[/\\]", "", text)
    # the standard library: /root/.pyenv/versions/3.11.7/lib/python3.11/threading.py -> threading.py
    return re.sub(r"(?:[A-Za-z]:)?[^\s\"']*[/\\]lib[/\\]python3\.\d+[/\\]", "", text)


def git_state(paths: list[Path]) -> tuple[str | None, bool | None]:
    """The commit checked out in :data:`~mpguide.verify.records.REPO_ROOT` and whether ``paths`` differ from it.

    Returns:
        ``(commit, dirty)``; ``(None, None)`` outside a git checkout or without git.
    """
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", *map(str, paths)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit or None, bool(status)


def run_env(swaps: dict[str, str]) -> dict[str, Any]:
    """Environment variables that change what an example trains, as a record's ``source`` stores them.

    Args:
        swaps: run id -> recipe of ``MPGUIDE_SWAP_RECIPE`` entries that apply to the example.

    Returns:
        ``{"MPGUIDE_PRESET": name, "MPGUIDE_DEVICE": "auto" | "cpu" | "cuda", "swaps": {...}}`` with the
        defaults filled in (``quick``, ``auto``).
    """
    return {
        "MPGUIDE_PRESET": (os.environ.get("MPGUIDE_PRESET") or "quick").lower(),
        "MPGUIDE_DEVICE": (os.environ.get("MPGUIDE_DEVICE") or "auto").lower(),
        "swaps": dict(sorted(swaps.items())),
    }


#: The fields of ``source`` that name a record's inputs: the docs build reruns an example whose record
#: holds other values than :func:`~mpguide.verify.records.source_inputs` gives now.
INPUT_FIELDS = ("example_code", "library_code", "run_env")


def source_inputs(example_path: Path, swaps: dict[str, str], library: str | None = None) -> dict[str, Any]:
    """The :data:`~mpguide.verify.records.INPUT_FIELDS` of a record's ``source``, as a run would write them now.

    The one place these fields are built: :func:`mpguide.verify.records.build.source_info` writes them into every
    record, and :func:`mpguide_build.sphinx_ext.examples_to_rerun` compares a record's with them. Reads
    files only (no torch, no git). Both digests are code digests (:mod:`mpguide.verify.records.codedigest`):
    a docstring or comment edit reruns nothing.

    Args:
        example_path: the example file (its code digest becomes ``example_code``; ``None`` when absent).
        swaps: run id -> recipe of the ``MPGUIDE_SWAP_RECIPE`` entries that apply to this example.
        library: :func:`~mpguide.verify.records.library_code_digest`, when the caller already computed it.

    Returns:
        ``{"example_code": hex | None, "library_code": hex, "run_env": {...}}``.
    """
    return {
        "example_code": example_code_digest(example_path),
        "library_code": library or library_code_digest(),
        "run_env": run_env(swaps),
    }


def utc_now() -> str:
    """The current UTC time as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_record(record: dict[str, Any], path: Path) -> Path:
    """Validate ``record`` and write it to ``path`` atomically.

    The JSON goes to a temporary file in the same folder, which is then renamed over ``path``, so
    an interrupted run leaves either the previous record or the new one, never half a file.

    Raises:
        RecordError: the record does not follow the schema (nothing is written).
    """
    validate_record(record, path)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1)
            handle.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; records are meant to be read by others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_record(path: Path) -> dict[str, Any]:
    """Read and validate one record.

    Raises:
        RecordError: the file is missing, is not valid JSON (for example truncated), has another
            ``schema_version``, or lacks required fields. The message names the file and the fix.
    """
    path = Path(path)
    if not path.is_file():
        raise RecordError(
            f"{path}: results record not found; run the example that writes it ({hints.rerun(path.stem)})"
        )
    fix = f"delete it and rerun the example ({hints.rerun(path.stem)})"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise RecordError(
            f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
            f"the file is truncated or corrupt: {fix}"
        ) from None
    except UnicodeDecodeError as err:
        raise RecordError(f"{path}: not UTF-8 text (byte {err.start}); the file is corrupt: {fix}") from None
    except RecursionError:
        raise RecordError(f"{path}: JSON nested too deeply to be a results record: {fix}") from None
    fallback = None
    runs = record.get("runs") if isinstance(record, dict) else None
    if isinstance(runs, list) and any(isinstance(run, dict) and "measures" not in run for run in runs):
        # written before probes declared their keys: the declarations in the sources type its extra
        from .measures import declared

        fallback = declared(str(record.get("example") or path.stem))
    validate_record(record, path, fallback)
    if record["example"] != path.stem:
        raise RecordError(
            f"{path}: holds the record of {record['example']!r}, not of {path.stem!r} (its file name); delete "
            f"this copy and rerun the example it names ({hints.rerun(record['example'])}), which writes "
            f"{record['example']}.json"
        )
    return record


def upgrade_v1(
    record: dict[str, Any], commit: str, example_source: bytes, library_sources: dict[str, bytes]
) -> dict[str, Any]:
    """Convert a schema-1 record to schema 2 without changing any measured value.

    Schema 1 did not say what a record was produced from. The caller states it: the commit the
    record was made at and the example's and library's sources at that commit (for example from
    ``git show COMMIT:examples/NAME.py``); their digests become ``source``. Runs keep every field;
    the run options schema 1 did not store (``plugin``, ``trainer_kwargs``, ``plain_flag``) stay
    absent, and the gate then compares only what is present (see :mod:`mpguide.verify.claims`). A schema-1
    record holds every claim its example made, so ``declaration_sha256`` is the digest of the runs
    and claims the record holds (:func:`mpguide.verify.claims.declarations.digest_of`): the gate notices a run or
    claim deleted or edited after the conversion.

    Args:
        record: a parsed schema-1 record.
        commit: the git commit it was produced at (40 hex digits).
        example_source: bytes of ``examples/<example>.py`` at that commit.
        library_sources: file name -> bytes of every ``mpguide/*.py`` at that commit.

    Returns:
        A new schema-2 record (validated).

    Raises:
        RecordError: the input is not a schema-1 record.
    """
    if not isinstance(record, dict) or record.get("schema_version") != 1:
        raise RecordError(f"upgrade_v1 needs a schema_version 1 record, found {record.get('schema_version')!r}")
    library = hashlib.sha256()
    for name in sorted(library_sources):
        library.update(name.encode())
        library.update(library_sources[name])
    from ..claims.declarations import digest_of

    out = dict(record, schema_version=SCHEMA_VERSION)
    out["source"] = {
        "example_sha256": hashlib.sha256(example_source).hexdigest(),
        "library_sha256": library.hexdigest(),
        "declaration_sha256": digest_of(record.get("runs") or [], record.get("claims") or []),
        "commit": commit,
        "dirty": False,
        "run_env": {"MPGUIDE_PRESET": record.get("preset"), "MPGUIDE_DEVICE": None, "swaps": {}},
        "upgraded_from_schema": 1,
    }
    validate_record(out, f"<{record.get('example')} upgraded>")
    return out


def _upgrade_cli(argv: list[str] | None = None) -> int:
    """``python -m mpguide.verify.records upgrade PATH... --commit SHA``: rewrite schema-1 records in place."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m mpguide.verify.records",
        description="Convert schema-1 records to schema 2, reading the example and library sources at COMMIT from git.",
    )
    parser.add_argument("command", choices=["upgrade"])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--commit", required=True, help="the commit the records were produced at")
    args = parser.parse_args(argv)

    def show(rel: str) -> bytes:
        return subprocess.run(
            ["git", "show", f"{args.commit}:{rel}"], cwd=REPO_ROOT, capture_output=True, check=True
        ).stdout

    commit = subprocess.run(
        ["git", "rev-parse", args.commit], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", commit, "mpguide/"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    library = {Path(n).name: show(n) for n in names if n.endswith(".py")}
    for path in args.paths:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        upgraded = upgrade_v1(record, commit, show(f"examples/{record['example']}.py"), library)
        write_record(upgraded, path)
        print(f"{path}: schema 1 -> {SCHEMA_VERSION}, source at {commit[:7]}")
    return 0
