"""Version-matrix summaries: their format, where they live, how they are read, and when they are stale.

One compact **summary** per column of the matrix (a Lightning release, Lightning's development branch, or
an older torch), ``results/matrix/lightning-<version>.json`` (a few KB; the full records stay out of git),
written by ``python -m mpguide_build.matrix run`` (:mod:`mpguide_build.matrix`), its rows built by
:mod:`mpguide_build.matrix_summarize`:

``schema``
    :data:`~mpguide_build.matrix_summary.SCHEMA` (other values are refused).
``lightning``, ``torch``, ``python``, ``device``, ``preset``, ``created`` (UTC)
    what ran, where and when.
``status``, ``error``
    ``"ran"``, or ``"could not run"`` with ``error`` = ``{"stage": "install" | "import", "message"}``
    when the release could not be installed or imported (a result, not a crash).
``library_sha256``
    :func:`mpguide.verify.records.library_digest` of the library the matrix was produced with, without the
    modules that only draw (:data:`mpguide.verify.records.PRESENTATION_MODULES`): no verdict depends on them.
``examples``
    example -> ``{"example_sha256", "status" ("ran" or "could not run"), "error", "seconds",
    "claims": [{"id", "kind", "runs", "title", "verdict" ("pass" | "fail" | "inconclusive" | "not judged"),
    "observed", "message"}]}``. Besides the declared claims, one row ``id = "runs complete"`` per
    example stands for the gate's implicit checks (every run trains to the end with a finite loss).
``plugin_tests``
    outcome of the :class:`mpguide.precision.ManualMixedPrecision` tests in that environment:
    ``{"status" ("pass" | "fail" | "refused" | "could not run"), "passed", "failed", "message"}``.
``lightning_version``
    ``lightning.__version__`` as imported (for a release the same as ``lightning``).
``source``
    ``{"kind": "pypi"}`` for a release (``nox -s matrix``); ``{"kind": "git", "repository", "branch",
    "commit", "date"}`` for the **unreleased** column of Lightning's development branch (``nox -s
    matrix_main``; :data:`MAIN_BRANCH`, file ``lightning-master.json``; ``lightning`` is then the branch
    name), installed from a copy of the repository: ``commit`` is the full hash, ``date`` its committer
    date (ISO 8601).
``torch_pin``, ``scope``
    ``None`` for a column on the site's torch; for an **older-torch** column the torch release it
    pins (``nox -s matrix_torch``; file ``torch-<torch_pin>+lightning-<lightning>.json``) and the
    examples it runs (:data:`~mpguide_build.matrix_summary.TORCH_EXAMPLES`); other examples show "not run" there.
``autocast_cache_probe``
    the minimal reproduction of the autocast-cache bug on that torch
    (:func:`~mpguide_build.matrix.probe_autocast_cache`): ``{"torch", "gradient_lost" (bool), "detail"}``.

Summaries without the last four fields (written before they existed) read as releases on the site's torch.

A summary is **stale** when an example or the library changed since it was produced
(:func:`~mpguide_build.matrix_summary.staleness`); the test suite fails then, and the message says to run
``nox -s matrix``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mpguide.verify import records
from mpguide.verify.claims import declarations

from .summary_schema import MATRIX_SCHEMA, matrix_problem

#: Format of a summary file; bump on incompatible changes.
SCHEMA = MATRIX_SCHEMA

#: The Lightning releases of the matrix, oldest first. Latest patch of each minor where not named
#: (``pip index versions lightning`` on 2026-11-30: 2.2.5 and 2.3.3 close their minors; 2.6.6 is the
#: release ``requirements.txt`` pins). 2.5.4 and 2.5.5 bracket the switch of Lightning's autocast to
#: ``cache_enabled=False`` (``lightning/pytorch/plugins/precision/amp.py`` of 2.5.5).
RELEASES: tuple[str, ...] = ("2.2.5", "2.3.3", "2.4.0", "2.5.0", "2.5.4", "2.5.5", "2.6.6")

#: Lightning's development branch (the default branch of github.com/Lightning-AI/pytorch-lightning is
#: ``master``): one **unreleased** column, installed from a copy of that repository
#: (``MPGUIDE_LIGHTNING_GIT=<git dir> nox -s matrix_main``), so its summary names a commit.
MAIN_BRANCH = "master"
#: The older-torch columns, ``(torch, Lightning)`` pairs, for the claims that depend on torch. The first
#: two pin :data:`TORCH_LIGHTNING` and bracket the fix of the autocast-cache bug (PyTorch pull request
#: #165068, merged 2025-12-10): the minimal reproduction (:func:`~mpguide_build.matrix.probe_autocast_cache`,
#: measured 2026-12-01) loses the gradient on torch 2.9.1 and 2.10.0 (the last release without the fix; PyPI
#: has no 2.10.x patch) and keeps it on 2.11.0 and 2.13.0. ``("2.10.0", "2.5.4")`` is the #20970 reporter's
#: likely stack (a torch without the fix under a Lightning whose autocast still caches: 2.5.5 switched its
#: autocast to ``cache_enabled=False``). ``("2.14.1", "2.6.6")`` is the newest torch this workplace's package
#: mirror serves (pip's constraint file caps torch at 2.14.1; 2.15 is not measured). PyPI has CUDA builds only
#: for x86_64 Linux (2.5-3 GB with their CUDA libraries); they run on the CPU.
TORCH_COLUMNS: tuple[tuple[str, str], ...] = (
    ("2.10.0", "2.6.6"),
    ("2.11.0", "2.6.6"),
    ("2.14.1", "2.6.6"),
    ("2.10.0", "2.5.4"),
)
#: The Lightning release whose older-torch columns are compared with the site's own torch (2.13.0).
TORCH_LIGHTNING = "2.6.6"
#: Examples run by the older-torch columns, those whose claims concern autocast caching (plot_08; plot_01,
#: whose predictor serves a no_grad teacher and the student; plot_17, the #20970 reporter's step), and the
#: two-optimizer cases (plot_02 and the #20116 reporter's, plot_18).
TORCH_EXAMPLES: tuple[str, ...] = (
    "plot_01_porting_to_manual",
    "plot_02_two_optimizers",
    "plot_08_autocast_cache",
    "plot_17_issue_20970_bf16_drift",
    "plot_18_issue_20116_alternating_optimizers",
)

#: Where the summaries are committed.
MATRIX_DIR = records.REPO_ROOT / "results" / "matrix"


#: Id of the row that stands for the implicit checks of an example (runs complete, losses finite).
RUNS_ROW = "runs complete"


class MatrixError(ValueError):
    """A summary file is missing, unreadable or of another schema; the message names the file and the fix."""


def summary_path(version: str, directory: Path | None = None, torch_pin: str | None = None) -> Path:
    """``<directory>/lightning-<version>.json`` (default directory :data:`~mpguide_build.matrix_summary.MATRIX_DIR`), or
    ``torch-<torch_pin>+lightning-<version>.json`` for an older-torch column."""
    name = f"torch-{torch_pin}+lightning-{version}.json" if torch_pin else f"lightning-{version}.json"
    return Path(directory or MATRIX_DIR) / name


def summary_file(summary: dict[str, Any], directory: Path | None = None) -> Path:
    """The file of ``summary`` in ``directory`` (:func:`summary_path` of its ``lightning`` and ``torch_pin``)."""
    return summary_path(summary["lightning"], directory, summary.get("torch_pin"))


def is_unreleased(summary: dict[str, Any]) -> bool:
    """True for a column installed from a git copy (``source.kind == "git"``), not from a release."""
    return (summary.get("source") or {}).get("kind") == "git"


def column_label(summary: dict[str, Any]) -> str:
    """Short name of a summary's column: ``"2.6.6"``, ``"master (unreleased)"`` or ``"2.6.6, torch 2.10.0"``."""
    label = summary["lightning"] + (" (unreleased)" if is_unreleased(summary) else "")
    return label + (f", torch {summary['torch_pin']}" if summary.get("torch_pin") else "")


def column_order(summary: dict[str, Any]) -> tuple:
    """Sort key of columns: by pinned torch (site's torch last), releases oldest first, unreleased last."""
    pin = summary.get("torch_pin")
    return (pin is None, version_key(pin or ""), is_unreleased(summary), version_key(summary["lightning"]))


def column_heading(summary: dict[str, Any]) -> str:
    """What a column ran on, for the line above its messages: versions, device, preset, date; for the
    unreleased column the commit and its date (from ``source``)."""
    source = summary.get("source") or {}
    where = (
        f"commit {str(source.get('commit'))[:10]} of {str(source.get('date'))[:10]} on branch "
        f"{source.get('branch')} of {source.get('repository')}, version string "
        f"{summary.get('lightning_version')}, "
        if is_unreleased(summary)
        else ""
    )
    return (
        f"**Lightning {column_label(summary)}** ({where}torch {summary.get('torch')}, {summary.get('device')}, "
        f"preset {summary.get('preset')}, {str(summary.get('created', ''))[:10]})"
    )


def version_key(version: str) -> tuple[int, ...]:
    """Sort key of a release string such as ``"2.5.0"`` or ``"2.5.0.post0"`` (numbers only)."""
    return tuple(int(p) for p in re.findall(r"\d+", version))


def write_summary(summary: dict[str, Any], directory: Path | None = None) -> Path:
    """Write ``summary`` to :func:`summary_file` in ``directory`` atomically (temp file, rename)."""
    validate(summary, "<new summary>")
    path = summary_file(summary, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1, sort_keys=False)
        handle.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def validate(summary: Any, where: str | Path) -> dict[str, Any]:
    """Check the layout of a parsed summary against :class:`mpguide_build.summary_schema.MatrixSummary`.

    Raises:
        MatrixError: naming ``where`` and the first problem, with the fix (rerun ``nox -s matrix``).
    """
    fix = "rerun `nox -s matrix` to write it again"
    if not isinstance(summary, dict) or summary.get("schema") != SCHEMA:
        got = summary.get("schema") if isinstance(summary, dict) else type(summary).__name__
        raise MatrixError(f"{where}: not a matrix summary of schema {SCHEMA!r} (found {got!r}); {fix}")
    for key, kind in (("lightning", str), ("status", str), ("library_sha256", str), ("examples", dict)):
        if not isinstance(summary.get(key), kind):
            raise MatrixError(f"{where}: field {key!r} missing or not a {kind.__name__}; {fix}")
    source = summary.get("source")
    if source is not None and (not isinstance(source, dict) or source.get("kind") not in ("pypi", "git")):
        raise MatrixError(
            f"{where}: field 'source' must be {{'kind': 'pypi'}} or {{'kind': 'git', 'commit', "
            f"'date', ...}} (found {source!r}); {fix}"
        )
    if is_unreleased(summary) and not all(isinstance(source.get(k), str) and source[k] for k in ("commit", "date")):
        raise MatrixError(
            f"{where}: an unreleased column must name its git 'commit' and 'date' in 'source' "
            f"(found {source!r}); {fix} with MPGUIDE_LIGHTNING_GIT set to the repository copy"
        )
    scope = summary.get("scope")
    if scope is not None and not (isinstance(scope, list) and all(isinstance(x, str) for x in scope)):
        raise MatrixError(f"{where}: field 'scope' must be null or a list of example names (found {scope!r}); {fix}")
    for name, entry in summary["examples"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("claims"), list) or "status" not in entry:
            raise MatrixError(f"{where}: examples[{name!r}] lacks 'status' or a 'claims' list; {fix}")
        for claim in entry["claims"]:
            if not isinstance(claim, dict) or not {"id", "title", "verdict", "message"} <= set(claim):
                raise MatrixError(f"{where}: a claim of {name!r} lacks id, title, verdict or message; {fix}")
    problem = matrix_problem(summary, where)  # every field typed (mpguide_build.summary_schema.MatrixSummary)
    if problem:
        raise MatrixError(f"{problem}; {fix}")
    return summary


def load(path: Path) -> dict[str, Any]:
    """Read and validate one summary file. Raises :class:`~mpguide_build.matrix_summary.MatrixError`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MatrixError(f"{path}: matrix summary not found; run `nox -s matrix`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise MatrixError(f"{path}: not valid JSON ({err}); rerun `nox -s matrix`") from None
    return validate(data, path)


def load_matrix(directory: Path | None = None) -> list[dict[str, Any]]:
    """Every Lightning column in ``directory`` (default :data:`~mpguide_build.matrix_summary.MATRIX_DIR`) on the site's
    torch (``lightning-*.json``): oldest release first, the unreleased branch column last.

    Raises:
        MatrixError: a file is unreadable, or the folder holds no summary at all.
    """
    directory = Path(directory or MATRIX_DIR)
    found = [load(p) for p in sorted(directory.glob("lightning-*.json"))]
    if not found:
        raise MatrixError(f"{directory}: no matrix summaries (lightning-*.json); run `nox -s matrix`")
    return sorted(found, key=column_order)


def load_torch_matrix(directory: Path | None = None) -> list[dict[str, Any]]:
    """The older-torch columns in ``directory`` (``torch-*.json``), oldest torch first; ``[]`` when none.

    Raises:
        MatrixError: a file is unreadable or of another schema.
    """
    directory = Path(directory or MATRIX_DIR)
    return sorted((load(p) for p in sorted(directory.glob("torch-*.json"))), key=column_order)


def verdict_library_digest() -> str:
    """Digest of the library code verdicts depend on (figures and tables left out), for staleness."""
    return records.library_digest(exclude=records.PRESENTATION_MODULES)


def staleness(summary: dict[str, Any], examples: Path | None = None) -> list[str]:
    """Why ``summary`` no longer describes the current sources (empty list when it does).

    Compares the recorded digests with today's: every ``examples/plot_*.py`` must be in the summary
    with the same SHA-256, no example may have been removed, and the library digest
    (:func:`~mpguide_build.matrix_summary.verdict_library_digest`) must be the same.
    """
    folder = Path(examples or declarations.examples_dir())
    current = {p.stem: records.file_digest(p) for p in sorted(folder.glob("plot_*.py"))}
    scope = summary.get("scope")
    if scope is not None:  # a column that runs some examples only: the others are not expected there
        current = {name: digest for name, digest in current.items() if name in scope}
    recorded = summary["examples"]
    where = f"Lightning {column_label(summary)}"
    reasons = [
        f"{where}: examples/{name}.py changed since the matrix was produced"
        for name in sorted(current)
        if name in recorded and recorded[name].get("example_sha256") != current[name]
    ]
    added, removed = sorted(set(current) - set(recorded)), sorted(set(recorded) - set(current))
    reasons += [f"{where}: examples/{name}.py is not in the matrix" for name in added]
    reasons += [f"{where}: the matrix holds {name}, which no longer exists" for name in removed]
    if summary["library_sha256"] != verdict_library_digest():
        reasons.append(f"{where}: the mpguide library changed since the matrix was produced")
    return reasons


def check_current(
    directory: Path | None = None,
    examples: Path | None = None,
    releases: Sequence[str] = RELEASES,
    main: str | None = MAIN_BRANCH,
    torch_columns: Sequence[tuple[str, str]] = TORCH_COLUMNS,
) -> None:
    """Raise when the committed matrix is missing a column or was produced from other sources.

    The columns: every release of ``releases``, the unreleased ``main`` branch (``None``: none) and
    one older-torch column per ``(torch, Lightning)`` pair of ``torch_columns``.

    Raises:
        MatrixError: one line per problem, ending with the command that refreshes each stale column.
    """
    summaries = load_matrix(directory)
    pinned = load_torch_matrix(directory)
    have = {s["lightning"] for s in summaries}
    problems = [f"Lightning {v}: no summary" for v in releases if v not in have]
    if main and not any(s["lightning"] == main and is_unreleased(s) for s in summaries):
        problems.append(f"Lightning {main} (unreleased): no summary")
    problems += [
        f"Lightning {lightning}, torch {torch}: no summary"
        for torch, lightning in torch_columns
        if (torch, lightning) not in {(s.get("torch_pin"), s["lightning"]) for s in pinned}
    ]
    for summary in summaries + pinned:
        problems += staleness(summary, examples)
    if problems:
        raise MatrixError(
            "the committed version matrix (results/matrix) is stale:\n  - "
            + "\n  - ".join(problems)
            + "\nrun `nox -s matrix` (the releases, about 20 min on 2 cores), "
            "`MPGUIDE_LIGHTNING_GIT=<copy of Lightning's git repository> nox -s matrix_main` (the "
            "unreleased column) and `nox -s matrix_torch` (the older-torch columns, downloads of "
            "2.5-3 GB each), then commit results/matrix/"
        )
