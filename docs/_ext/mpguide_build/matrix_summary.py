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
    only in summaries written before per-cell keys: the byte digest of the library then (kept as written;
    nothing compares it any more).
``examples``
    example -> ``{"keys", "status" ("ran" or "could not run"), "error", "seconds",
    "claims": [{"id", "kind", "runs", "title", "verdict", "observed", "message"}]}``, each verdict ``"pass"``,
    ``"fail"``, ``"inconclusive"``, ``"not judged"`` or ``"not applicable"``. Besides the declared claims, one
    row ``id = "runs complete"`` per example stands for the gate's implicit checks (every run trains to the end
    with a finite loss).
    ``keys`` (:class:`mpguide_build.summary_schema.CellKeys`) are what the cell was produced with: the
    example's code digest, the library's code digest without the modules that only draw
    (:data:`mpguide.verify.records.PRESENTATION_MODULES`: no verdict depends on them), the Python, torch and
    Lightning versions, the date and the commit. Cells written before keys hold ``example_sha256`` (bytes).
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

A **cell** (one example in one column) is **stale** when the code it was produced with differs from
today's, or it ran under another torch or Lightning than its column now names
(:func:`~mpguide_build.matrix_summary.cell_staleness`): keyed per cell, so a partial rerun never mixes cells
of two libraries under one column digest. A stale cell shows no verdict (the pages say "not re-run since
<date>, <commit>", :mod:`mpguide_build.matrix_outcomes`) and fails no test; ``python -m mpguide_build.matrix
check`` counts them, and ``nox -s matrix -- --stale-only`` reruns them. Docstrings and comments are not code
(:mod:`mpguide.verify.records.codedigest`): editing them stales nothing.
"""

from __future__ import annotations

import functools
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
    for key, kind in (("lightning", str), ("status", str), ("examples", dict)):
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


def verdict_library_code() -> str:
    """Code digest of the library verdicts depend on (figures and tables left out), for a cell's keys.

    Computed once per process and package folder (:data:`mpguide.verify.records.PACKAGE_DIR`): the
    releases page asks for it once per matrix cell (thousands of times), and the library does not change
    while a page renders. A process that edits the package and asks again calls
    ``_verdict_library_code.cache_clear()`` first.
    """
    return _verdict_library_code(records.PACKAGE_DIR)


@functools.cache
def _verdict_library_code(package_dir: Path) -> str:
    return records.library_code_digest(exclude=records.PRESENTATION_MODULES)


def cell_keys(example: str, examples: Path | None = None, library: str | None = None) -> dict[str, Any]:
    """The keys of a cell produced now in this environment (:class:`mpguide_build.summary_schema.CellKeys`)."""
    import platform

    versions: dict[str, str | None] = {}
    for module in ("torch", "lightning"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - an environment that cannot import it is a result too
            versions[module] = None
    commit, dirty = records.git_state([records.PACKAGE_DIR, declarations.examples_dir()])
    return {
        "example_code": records.example_code_digest(declarations.example_file(example, examples)),
        "library_code": library or verdict_library_code(),
        "python": platform.python_version(),
        "torch": versions["torch"],
        "lightning": versions["lightning"],
        "created": records.utc_now(),
        "commit": (commit + ("+dirty" if dirty else "")) if commit else None,
    }


def _minor(version: str | None) -> str:
    return ".".join(str(version or "").split(".")[:2])


def cell_staleness(
    summary: dict[str, Any], example: str, examples: Path | None = None, library: str | None = None
) -> str:
    """Why the cell of ``example`` in ``summary`` is stale, or ``""`` when it is fresh (or nothing ran there).

    Stale: the cell has no keys, or a code key the migration could not verify (``null``); the example's or the
    library's code digest differs from today's (:func:`verdict_library_code`); or the cell ran under another
    torch or Lightning than the column names (``torch``, ``lightning_version``) or another Python minor. A
    column that could not run, a cell of an example outside the column's ``scope`` and a missing cell are not
    stale (they show "could not run" / "not run").
    """
    entry = summary["examples"].get(example)
    if summary.get("status") != "ran" or entry is None:
        return ""
    if summary.get("scope") is not None and example not in summary["scope"]:
        return ""
    keys = entry.get("keys")
    if not isinstance(keys, dict):
        return "the cell has no keys (made before cells recorded them)"
    if not keys.get("example_code"):
        return f"the code examples/{example}.py ran with was not verified when the cell was migrated"
    if not keys.get("library_code"):
        return "the library code the cell ran with was not verified when the cell was migrated"
    try:
        current = records.example_code_digest(declarations.example_file(example, examples))
        library = library or verdict_library_code()
    except records.CodeDigestError as err:  # a file that does not parse: the cell cannot be current
        return str(err)
    if current is None:
        return f"examples/{example}.py no longer exists"
    if keys["example_code"] != current:
        return f"the code of examples/{example}.py changed since"
    if keys["library_code"] != library:
        return "the code of the mpguide library changed since"
    for key, column in (("torch", summary.get("torch")), ("lightning", summary.get("lightning_version"))):
        if column and keys.get(key) != column:
            return f"it ran under {key} {keys.get(key)}, the column now runs {column}"
    if _minor(keys.get("python")) != _minor(summary.get("python")):
        return f"it ran under Python {keys.get('python')}, the column now runs {summary.get('python')}"
    return ""


def not_rerun_since(summary: dict[str, Any], example: str) -> str:
    """``"not re-run since <date>, <commit>"`` of a cell (its keys; the summary's date for a cell without keys)."""
    keys = (summary["examples"].get(example) or {}).get("keys") or {}
    date = str(keys.get("created") or summary.get("created") or "")[:10] or "an unknown date"
    commit = keys.get("commit") or keys.get("migrated_from")
    return f"not re-run since {date}, " + (f"commit {str(commit)[:7]}" if commit else "an unknown commit")


def stale_cells(summary: dict[str, Any], examples: Path | None = None, library: str | None = None) -> dict[str, str]:
    """Example -> why, for every stale cell of one column: stale entries (:func:`cell_staleness`), examples of
    the column's scope it has no cell for, and cells of examples that no longer exist."""
    if summary.get("status") != "ran":
        return {}
    folder = Path(examples or declarations.examples_dir())
    current = sorted(p.stem for p in folder.glob("plot_*.py"))
    scope = summary.get("scope")
    wanted = [name for name in current if scope is None or name in scope]
    try:
        library = library or verdict_library_code()
    except records.CodeDigestError:
        library = ""  # each cell then names the file that does not parse (cell_staleness)
    out = {
        name: "examples/" + name + ".py is not in the column yet" for name in wanted if name not in summary["examples"]
    }
    for name in summary["examples"]:
        if name not in current:
            out[name] = f"examples/{name}.py no longer exists"
        elif why := cell_staleness(summary, name, folder, library):
            out[name] = why
    return dict(sorted(out.items()))


def staleness(summary: dict[str, Any], examples: Path | None = None) -> list[str]:
    """One line per stale cell of ``summary`` (empty list when every cell is fresh): the column, the example, why."""
    where = f"Lightning {column_label(summary)}"
    return [f"{where}: {name}: {why}" for name, why in stale_cells(summary, examples).items()]


def check_matrix(
    directory: Path | None = None,
    examples: Path | None = None,
    releases: Sequence[str] = RELEASES,
    main: str | None = MAIN_BRANCH,
    torch_columns: Sequence[tuple[str, str]] = TORCH_COLUMNS,
) -> tuple[list[str], list[str], int]:
    """The committed matrix checked: ``(stale lines, problems, number of cells)``.

    Stale cells (:func:`staleness`, one line each) are findings, not failures: the pages show them as "not
    re-run". Problems are what no rerun of stale cells repairs by itself, one line each naming the file, the
    field and the fix: a column of ``releases``, of the unreleased ``main`` branch (``None``: none) or of
    ``torch_columns`` without a summary, a summary that cannot be read or does not follow the schema, a cell
    without keys (written before cells recorded them). Cells: every example entry of every column that ran.
    """
    directory = Path(directory or MATRIX_DIR)
    problems: list[str] = []
    summaries: list[tuple[Path, dict[str, Any]]] = []
    unreadable: set[Path] = set()
    for path in sorted(list(directory.glob("lightning-*.json")) + list(directory.glob("torch-*.json"))):
        try:
            summaries.append((path, load(path)))
        except MatrixError as err:
            problems.append(str(err))
            unreadable.add(path)  # named once, by its own problem; not "missing" as well
    columns = {(s.get("torch_pin"), s["lightning"], is_unreleased(s)) for _, s in summaries}
    refresh = "write it with nox -s matrix (matrix_torch, matrix_main for those columns)"
    problems += [
        f"{summary_path(v, directory)}: missing (field 'lightning' = {v!r}); {refresh}"
        for v in releases
        if (None, v, False) not in columns and summary_path(v, directory) not in unreadable
    ]
    if main and (None, main, True) not in columns and summary_path(main, directory) not in unreadable:
        problems.append(f"{summary_path(main, directory)}: missing (unreleased {main!r}); {refresh}")
    problems += [
        f"{summary_path(lightning, directory, torch)}: missing (field 'torch_pin' = {torch!r}); {refresh}"
        for torch, lightning in torch_columns
        if (torch, lightning, False) not in columns and summary_path(lightning, directory, torch) not in unreadable
    ]
    stale: list[str] = []
    cells = 0
    try:
        library = verdict_library_code()
    except records.CodeDigestError as err:
        problems.append(f"{err} (the library's code digest needs every module to parse)")
        library = ""
    for path, summary in summaries:
        if summary.get("status") != "ran":
            continue
        found = stale_cells(summary, examples, library)
        cells += len(summary["examples"]) + sum(name not in summary["examples"] for name in found)
        for name, entry in summary["examples"].items():
            if entry.get("keys") is None:
                problems.append(
                    f"{path}: field 'examples.{name}.keys' missing (a cell made before cells recorded their keys); "
                    f"migrate it (python -m mpguide_build.matrix migrate --from-commit <commit>) or rerun it "
                    f"(nox -s matrix -- --stale-only)"
                )
        where = f"Lightning {column_label(summary)}"
        stale += [f"{where}: {name}: {why}" for name, why in found.items()]
    return stale, problems, cells
