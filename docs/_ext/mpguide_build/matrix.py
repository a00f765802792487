"""The version matrix: which claims hold on which Lightning release, summarised, checked for staleness, rendered.

``nox -s matrix`` installs each release of :data:`~mpguide_build.matrix.RELEASES` into its own environment
(sharing one CPU torch), runs every example there at the ``test`` preset and calls
``python -m mpguide_build.matrix run`` in that environment, which judges the records with the claim gate
(:func:`mpguide.verify.gate.judge`) and writes one compact **summary** per release,
``results/matrix/lightning-<version>.json`` (a few KB; the full records stay out of git):

``schema``
    :data:`~mpguide_build.matrix.SCHEMA` (other values are refused).
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
    examples it runs (:data:`~mpguide_build.matrix.TORCH_EXAMPLES`); other examples show "not run" there.
``autocast_cache_probe``
    the minimal reproduction of the autocast-cache bug on that torch (:func:`probe_autocast_cache`):
    ``{"torch", "gradient_lost" (bool), "detail"}``.

Summaries without the last four fields (written before they existed) read as releases on the site's torch.

A summary is **stale** when an example or the library changed since it was produced
(:func:`~mpguide_build.matrix.staleness`); the test suite fails then, and the message says to run
``nox -s matrix``. :func:`~mpguide_build.matrix.render_table` draws the table of the guide and
:func:`~mpguide_build.matrix.applies_sentence` the "applies to Lightning X to Y" line of a pitfall section.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mpguide.verify import declarations, records
from mpguide.verify.schema import MATRIX_SCHEMA, matrix_problem

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
#: Older torch releases for the claims that depend on torch, each with :data:`TORCH_LIGHTNING`. They
#: bracket the fix of the autocast-cache bug (PyTorch pull request #165068, merged 2025-12-10): the
#: minimal reproduction (:func:`probe_autocast_cache`, measured 2026-12-01) loses the gradient on torch
#: 2.9.1 and 2.10.0 (the last release without the fix; PyPI has no 2.10.x patch) and keeps it on 2.11.0
#: and 2.13.0. PyPI has CUDA builds only for x86_64 Linux (2.5-3 GB with their CUDA libraries); they
#: run on the CPU.
TORCH_RELEASES: tuple[str, ...] = ("2.10.0", "2.11.0")
#: The Lightning release the older-torch columns use (it supports torch >= 2.1).
TORCH_LIGHTNING = "2.6.6"
#: The examples the older-torch columns run, those whose claims concern autocast caching (plot_08; plot_01
#: has the #20970 reporter's no_grad teacher recipe) and the two seed cases (plot_01, plot_02).
TORCH_EXAMPLES: tuple[str, ...] = ("plot_01_porting_to_manual", "plot_02_two_optimizers", "plot_08_autocast_cache")

#: Where the summaries are committed.
MATRIX_DIR = records.REPO_ROOT / "results" / "matrix"

#: Outcome "holds", the claim held on that release.
HOLDS = "holds"
#: Outcome "does not hold", the example ran and the claim did not (the behaviour differs there).
DOES_NOT_HOLD = "does not hold"
#: Outcome "cannot run", the example's code cannot run there (an API is missing, or no install).
CANNOT_RUN = "cannot run"
#: Outcome "plugin refuses", a run uses ManualMixedPrecision, which refuses that release.
PLUGIN_REFUSES = "plugin refuses"
#: Outcome "CPU-only artifact", a 16-mixed claim on a CPU where that release disables its GradScaler.
CPU_ARTIFACT = "CPU-only artifact"
#: Outcome "not judged", the record could not judge the claim.
NOT_JUDGED = "not judged"
#: Outcome "inconclusive", a throughput claim the rounds could not decide (never a pass).
INCONCLUSIVE = "inconclusive"
#: Outcome "not run", the column does not run that example (an older-torch column runs a few).
NOT_RUN = "not run"
#: Every outcome class of a cell (:func:`~mpguide_build.matrix.outcome`), in the legend's order.
OUTCOMES = (HOLDS, DOES_NOT_HOLD, CANNOT_RUN, PLUGIN_REFUSES, CPU_ARTIFACT, INCONCLUSIVE, NOT_JUDGED, NOT_RUN)
#: What each outcome means, for the legend above the table.
OUTCOME_MEANING = {
    HOLDS: "the claim held on that release",
    DOES_NOT_HOLD: "the example ran and the claim did not hold: the behaviour differs on that release",
    CANNOT_RUN: "the example's code cannot run there: an API it uses is missing (named in the message), or the "
    "release could not be installed",
    PLUGIN_REFUSES: "the run uses ManualMixedPrecision, which refuses every Lightning release but 2.6.x "
    "(UnsupportedVersionError) instead of computing something wrong",
    CPU_ARTIFACT: "a 16-mixed claim on a release whose CPU GradScaler is disabled: the CPU run trains fp16 "
    "without loss scaling, so it says nothing about that release on a GPU (not 'not affected')",
    INCONCLUSIVE: "a throughput claim whose rounds could not decide it (never counted as holding)",
    NOT_JUDGED: "the record could not judge the claim",
    NOT_RUN: "that column does not run this example (the older-torch columns run only the torch-dependent ones)",
}
#: Verdict words of a table cell (the outcome classes), kept under the old name.
CELL_WORDS = {o: o for o in OUTCOMES}
#: Lightning minors whose ``MixedPrecision`` creates ``torch.cuda.amp.GradScaler()`` whatever the device,
#: so that on a CPU the scaler disables itself and 16-mixed runs without loss scaling
#: (``lightning/pytorch/plugins/precision/amp.py``: 2.2.5 line 55, 2.3.3 line 52; 2.4.0 creates
#: ``torch.amp.GradScaler(device=device)``).
CPU_SCALER_DISABLED = ("2.2", "2.3")
#: Errors that mean "this code cannot run on this release" (an API the example uses is missing).
MISSING_API_ERRORS = ("AttributeError", "ImportError", "ModuleNotFoundError")
_MISSING_API = re.compile(
    r"has no attribute '(\w+)'|cannot import name '(\w+)'|No module named '([\w.]+)'|"
    r"unexpected keyword argument '(\w+)'"
)
_RUN_ERROR = re.compile(r"completes\(([^)]+)\) FAILED \[[^\]]*\]: exception = ([\w.]+): (.*?), threshold none")
_RUN_RAISED = re.compile(r"run (\S+) raised (\w+)")
#: Id of the row that stands for the implicit checks of an example (runs complete, losses finite).
RUNS_ROW = "runs complete"
#: The tests of the plugin run in every environment.
PLUGIN_TESTS = "tests/test_precision.py"
#: Text the plugin's refusal of a release must contain to count as a clear refusal (not a failure):
#: the name of the error :func:`mpguide.precision.check_versions` raises.
REFUSAL_MARK = "UnsupportedVersionError"


class MatrixError(ValueError):
    """A summary file is missing, unreadable or of another schema; the message names the file and the fix."""


def summary_path(version: str, directory: Path | None = None, torch_pin: str | None = None) -> Path:
    """``<directory>/lightning-<version>.json`` (default directory :data:`~mpguide_build.matrix.MATRIX_DIR`), or
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


def claim_id(claim: dict[str, Any]) -> str:
    """Short identity of a declared claim within its example: ``kind(run, ...)`` plus its key or category.

    Args:
        claim: a claim dict as built by :mod:`mpguide.verify.claims` (``kind``, ``runs``, maybe ``key``).
    """
    qualifier = claim.get("key") or claim.get("category") or ""
    return f"{claim['kind']}({', '.join(claim['runs'])})" + (f" [{qualifier}]" if qualifier else "")


def _unique(ids: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for i in ids:
        seen[i] = seen.get(i, 0) + 1
        out.append(i if seen[i] == 1 else f"{i} #{seen[i]}")
    return out


def _word(status: str) -> str:
    return {"pass": "pass", "FAIL": "fail"}.get(status, status)


def summarize_example(
    example: str,
    record_dir: Path,
    version: str,
    script_error: str = "",
    seconds: float | None = None,
    examples: Path | None = None,
    torch_pin: str | None = None,
) -> dict[str, Any]:
    """Judge one example's record in ``record_dir`` with the gate and keep the compact part.

    Args:
        example: file stem, e.g. ``"plot_05_skipped_steps"``.
        record_dir: folder holding ``<example>.json`` written by the example in this environment.
        version: the Lightning release (used in messages instead of the temporary record path).
        torch_pin: the torch release of an older-torch column (named in the record path of messages).
        script_error: last lines of the script's stderr when it exited non-zero (``""`` otherwise).
        seconds: wall time of the script.
        examples: folder of the examples (default :func:`mpguide.verify.declarations.examples_dir`).

    Returns:
        The ``examples[example]`` entry of a summary (see the module docstring). Without a readable
        record the example "could not run" and ``error`` holds the script's error or the record error.
    """
    from mpguide.verify.gate import judge

    entry: dict[str, Any] = {
        "example_sha256": records.file_digest(declarations.example_file(example, examples)),
        "status": "ran",
        "error": script_error or None,
        "seconds": seconds,
        "claims": [],
    }
    path = records.record_path(example, record_dir)
    report = judge([path], examples=examples)
    if report.record_errors:
        entry["status"] = "could not run"
        entry["error"] = script_error or report.record_errors[0].replace(str(record_dir), "<records>")
        return entry
    shown = summary_path(version, Path("."), torch_pin).stem + f"/{example}.json"
    declared = [v for v in report.verdicts if v.kind not in ("finite", "completes")]
    implicit = [v for v in report.verdicts if v.kind in ("finite", "completes")]
    for v in report.verdicts:
        v.record = shown
    for cid, v in zip(
        _unique([claim_id({"kind": v.kind, "runs": v.runs, "key": _key_of(v)}) for v in declared]), declared
    ):
        entry["claims"].append(
            {
                "id": cid,
                "kind": v.kind,
                "runs": list(v.runs),
                "title": v.title,
                "verdict": _word(v.status),
                "observed": v.shown_value(),
                "message": v.message(),
            }
        )
    record = records.load_record(path)
    entry["runs"] = {
        r["id"]: {
            "precision": r["precision"],
            "plugin": r.get("plugin"),
            "error": (
                f"{r['error']['type']}: {(r['error'].get('message') or '').splitlines()[0]}"
                if r.get("error") and (r["error"].get("message") or "").strip()
                else r["error"]["type"]
                if r.get("error")
                else None
            ),
        }
        for r in record["runs"]
    }
    bad = [v for v in implicit if v.failed]
    entry["claims"].append(
        {
            "id": RUNS_ROW,
            "kind": "implicit",
            "runs": sorted({r for v in implicit for r in v.runs}),
            "title": "every run trains to the end with a finite loss",
            "verdict": "fail" if bad else "pass",
            "observed": f"{len(implicit) - len(bad)} of {len(implicit)} checks pass",
            "message": " | ".join(v.message() for v in bad)
            if bad
            else f"{example}: all {len(implicit)} implicit checks passed (record: {shown})",
        }
    )
    return entry


def _key_of(verdict: Any) -> str:
    # The verdict's metric is the key for expect/same/ratio claims and the category text for warns.
    if verdict.kind in ("expect", "same", "ratio"):
        return verdict.metric if verdict.kind != "ratio" else ""
    if verdict.kind == "warns" and verdict.threshold.startswith("warns "):
        return verdict.threshold[len("warns ") :]
    return ""


def new_summary(
    version: str,
    status: str = "ran",
    error: dict[str, str] | None = None,
    examples: Sequence[str] = (),
    examples_dir: Path | None = None,
    source: dict[str, str] | None = None,
    torch_pin: str | None = None,
    scope: Sequence[str] | None = None,
) -> dict[str, Any]:
    """An empty summary of ``version`` with versions, date and source digests filled in.

    ``examples`` are listed as "could not run" with the release's ``error`` when the release
    itself could not run, so that the table still has their rows. ``source``, ``torch_pin`` and
    ``scope`` are stored as given (see the module docstring; ``source`` defaults to ``{"kind": "pypi"}``).
    """
    try:
        import torch

        torch_version = torch.__version__
    except Exception:  # noqa: BLE001 - an environment without torch is a result too
        torch_version = None
    try:
        import lightning

        lightning_version = lightning.__version__
    except Exception:  # noqa: BLE001 - an environment without lightning is a result too
        lightning_version = None
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "lightning": version,
        "torch": torch_version,
        "python": platform.python_version(),
        "device": f"CPU ({os.cpu_count()} cores)",
        "preset": "test",
        "created": records.utc_now(),
        "status": status,
        "error": error,
        "library_sha256": verdict_library_digest(),
        "examples": {},
        "plugin_tests": None,
        "torch_threads": _torch_threads(),
        "lightning_version": lightning_version,
        "source": source or {"kind": "pypi"},
        "torch_pin": torch_pin,
        "scope": list(scope) if scope is not None else None,
        "autocast_cache_probe": None,
    }
    for example in examples:
        out["examples"][example] = {
            "example_sha256": records.file_digest(declarations.example_file(example, examples_dir)),
            "status": "could not run",
            "error": (error or {}).get("message"),
            "seconds": None,
            "claims": [],
        }
    return out


def _torch_threads() -> int | None:
    try:
        import torch

        return torch.get_num_threads()
    except Exception:  # noqa: BLE001
        return None


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
    """Check the layout of a parsed summary against :class:`mpguide.verify.schema.MatrixSummary`.

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
    problem = matrix_problem(summary, where)  # every field typed (mpguide.verify.schema.MatrixSummary)
    if problem:
        raise MatrixError(f"{problem}; {fix}")
    return summary


def load(path: Path) -> dict[str, Any]:
    """Read and validate one summary file. Raises :class:`~mpguide_build.matrix.MatrixError`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MatrixError(f"{path}: matrix summary not found; run `nox -s matrix`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise MatrixError(f"{path}: not valid JSON ({err}); rerun `nox -s matrix`") from None
    return validate(data, path)


def load_matrix(directory: Path | None = None) -> list[dict[str, Any]]:
    """Every Lightning column in ``directory`` (default :data:`~mpguide_build.matrix.MATRIX_DIR`) on the site's
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
    (:func:`~mpguide_build.matrix.verdict_library_digest`) must be the same.
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
    torch_releases: Sequence[str] = TORCH_RELEASES,
) -> None:
    """Raise when the committed matrix is missing a column or was produced from other sources.

    The columns: every release of ``releases``, the unreleased ``main`` branch (``None``: none) and
    one older-torch column per ``torch_releases`` (with :data:`TORCH_LIGHTNING`).

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
        f"Lightning {TORCH_LIGHTNING}, torch {v}: no summary"
        for v in torch_releases
        if v not in {s.get("torch_pin") for s in pinned}
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


# ------------------------------------------------------------------------------------ rendering


def cell(summary: dict[str, Any], example: str, cid: str) -> tuple[str, str]:
    """``(verdict, message)`` of claim ``cid`` of ``example`` in one release's summary, as stored.

    ``verdict`` is ``"pass"``, ``"fail"``, ``"inconclusive"`` (a throughput claim the data could not decide,
    never a pass), ``"not judged"``, ``"not run"`` (the column does not run that example) or
    ``"could not run"`` (the release or the example could not run, or the claim is absent from its record).
    :func:`~mpguide_build.matrix.outcome` tells a reader what a non-passing verdict means.
    """
    entry = summary["examples"].get(example)
    label = column_label(summary)
    if summary.get("scope") is not None and example not in summary["scope"]:
        return (
            "not run",
            f"{example} is not part of the column Lightning {label} (it runs {', '.join(summary['scope'])})",
        )
    if summary["status"] != "ran":
        err = summary.get("error") or {}
        return "could not run", f"Lightning {label} could not be {err.get('stage', 'run')}ed: {err.get('message', '')}"
    if entry is None or entry["status"] != "ran":
        return (
            "could not run",
            f"{example} could not run on Lightning {label}: {(entry or {}).get('error') or 'not in the matrix'}",
        )
    for claim in entry["claims"]:
        if claim["id"] == cid:
            return claim["verdict"], claim["message"]
    return (
        "could not run",
        f"{example}: claim {cid!r} has no verdict on Lightning {label} (the example stopped before judging it)",
    )


def run_errors(summary: dict[str, Any], example: str) -> dict[str, str]:
    """Run id -> ``"Type: first line"`` of each run of ``example`` that raised on this release.

    Read from the summary's ``runs`` field where it has one, else from the messages of the implicit
    checks (the ``runs complete`` row names each run that raised an unexpected error).
    """
    entry = summary["examples"].get(example) or {}
    if isinstance(entry.get("runs"), dict):
        return {rid: r["error"] for rid, r in entry["runs"].items() if r.get("error")}
    row = next((c for c in entry.get("claims", []) if c["id"] == RUNS_ROW), None)
    return {m.group(1): f"{m.group(2)}: {m.group(3)}" for m in _RUN_ERROR.finditer(row["message"] if row else "")}


def _run_precision(summary: dict[str, Any], example: str, run_id: str, examples: Path | None) -> str:
    entry = summary["examples"].get(example) or {}
    if isinstance(entry.get("runs"), dict) and run_id in entry["runs"]:
        return entry["runs"][run_id]["precision"]
    try:  # summaries written before runs were stored: the example's declaration
        decl = declarations.read(declarations.example_file(example, examples))
    except Exception:  # noqa: BLE001 - an unreadable example only loses the precision hint
        return ""
    return next((r.precision for r in decl.runs if r.id == run_id), "")


def _claim_runs(summary: dict[str, Any], example: str, cid: str) -> list[str]:
    entry = summary["examples"].get(example) or {}
    claim = next((c for c in entry.get("claims", []) if c["id"] == cid), None)
    if claim is None:
        return []
    if cid == RUNS_ROW:  # the runs the failing implicit checks name
        return re.findall(r"(?:completes|finite)\(([^)]+)\) FAILED", claim["message"]) or list(claim.get("runs") or [])
    return list(claim.get("runs") or [])


def missing_api(error: str) -> str:
    """The name an ``AttributeError``/``ImportError``/keyword ``TypeError`` says is missing (``""`` if none)."""
    m = _MISSING_API.search(error or "")
    return next((g for g in m.groups() if g), "") if m else ""


def outcome(summary: dict[str, Any], example: str, cid: str, examples: Path | None = None) -> tuple[str, str]:
    """What a cell means for a reader: ``(outcome class, why)``, the class one of :data:`OUTCOMES`.

    Derived from what the summary stores, in this order:

    * ``pass`` -> :data:`HOLDS`; ``not judged`` -> :data:`NOT_JUDGED`;
    * the release or the example could not run, or a run of the claim raised an ``AttributeError``,
      ``ImportError`` or a ``TypeError`` about an unexpected keyword -> :data:`CANNOT_RUN`, naming the
      missing API;
    * a run of the claim raised ``UnsupportedVersionError`` (:data:`REFUSAL_MARK`), or the claim's own
      observation is that refusal -> :data:`PLUGIN_REFUSES`;
    * the summary ran on a CPU, the release is one of :data:`CPU_SCALER_DISABLED` and a run of the claim
      is 16-mixed -> :data:`CPU_ARTIFACT`;
    * otherwise -> :data:`DOES_NOT_HOLD`.

    Args:
        summary: one release's summary; ``example``/``cid``: the cell.
        examples: folder of the examples, for the run precisions of summaries that do not store them.
    """
    verdict, message = cell(summary, example, cid)
    if verdict == "pass":
        return HOLDS, message
    if verdict == "not judged":
        return NOT_JUDGED, message
    if verdict == "inconclusive":
        return INCONCLUSIVE, message
    if verdict == "not run":
        return NOT_RUN, message
    if verdict == "could not run":
        return CANNOT_RUN, message
    errors = run_errors(summary, example)
    involved = _claim_runs(summary, example, cid)
    raised = {r: errors[r] for r in involved if r in errors}
    for m in _RUN_RAISED.finditer(message):  # "run X raised Type, so there is no curve"
        raised.setdefault(m.group(1), errors.get(m.group(1), m.group(2)))
    for run_id, error in raised.items():
        kind = error.split(":")[0].split(".")[-1]
        api = missing_api(error)
        if kind in MISSING_API_ERRORS or (kind == "TypeError" and api):
            return CANNOT_RUN, (
                f"run {run_id} cannot run on Lightning {summary['lightning']}: "
                f"{'`' + api + '` is missing' if api else error} ({error})"
            )
    entry = summary["examples"].get(example) or {}
    observed = next((c.get("observed", "") for c in entry.get("claims", []) if c["id"] == cid), "")
    if any(REFUSAL_MARK in e for e in raised.values()) or REFUSAL_MARK in observed:
        return PLUGIN_REFUSES, (
            f"ManualMixedPrecision refuses Lightning {summary['lightning']} (UnsupportedVersionError): {message}"
        )
    minor = ".".join(summary["lightning"].split(".")[:2])
    on_cpu = str(summary.get("device", "cpu")).lower().startswith("cpu")
    if (
        on_cpu
        and minor in CPU_SCALER_DISABLED
        and any(_run_precision(summary, example, r, examples) == "16-mixed" for r in involved)
    ):
        return CPU_ARTIFACT, (
            f"Lightning {summary['lightning']} disables its GradScaler on a CPU, so this 16-mixed "
            f"run trained without loss scaling; not evidence either way for a GPU. {message}"
        )
    return DOES_NOT_HOLD, message


def rows(summaries: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """``(example, claim id, title)`` of every claim in the matrix, in example and declaration order.

    The newest release that ran an example decides the order and the titles.
    """
    out: list[tuple[str, str, str]] = []
    seen: set[tuple[str, str]] = set()
    for summary in sorted(summaries, key=column_order, reverse=True):
        for example in sorted(summary["examples"]):
            for claim in summary["examples"][example]["claims"]:
                if (example, claim["id"]) not in seen:
                    seen.add((example, claim["id"]))
                    out.append((example, claim["id"], claim["title"]))
    return sorted(out, key=lambda r: r[0])  # stable: keeps declaration order within an example


def _anchor(version: str, example: str, cid: str) -> str:
    return "mx-" + re.sub(r"[^a-z0-9]+", "-", f"{version} {example} {cid}".lower()).strip("-")


def render_table(summaries: Sequence[dict[str, Any]], examples: Iterable[str] | None = None) -> str:
    """The matrix as MyST Markdown: per example a table with one row per claim and one column per
    release, then every message.

    Each cell reads one outcome of :data:`OUTCOMES` (:func:`~mpguide_build.matrix.outcome`), explained in a
    legend above the tables, and links to its message below the tables (an HTML anchor, so no Sphinx
    reference can dangle). The messages sit
    in one collapsed ``<details>`` block per release (a browser opens it when a link points inside),
    the non-passing ones first; identical messages of one release are listed once.

    Args:
        summaries: from :func:`~mpguide_build.matrix.load_matrix`.
        examples: restrict to these examples (default: all).

    Returns:
        Markdown text (render it with ``nb_render_markdown_format = "myst"``, or any CommonMark
        renderer with tables and raw HTML).
    """
    summaries = sorted(summaries, key=column_order)
    wanted = None if examples is None else set(examples)
    table_rows = [r for r in rows(summaries) if wanted is None or r[0] in wanted]
    head = ["claim"] + [column_label(s) for s in summaries]  # short headers leave the claim column its width
    lines: list[str] = [legend()]
    messages: dict[str, list[tuple[str, str, str]]] = {column_label(s): [] for s in summaries}
    current = None
    for example, cid, title in table_rows:
        if example != current:  # one table per example: the claim column keeps its width
            current = example
            lines += ["", f"**{_md(example)}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        cells = []
        for summary in summaries:
            word, message = outcome(summary, example, cid)
            anchor = _anchor(column_label(summary), example, cid)
            text = html.escape(CELL_WORDS.get(word, word))
            cells.append(f'<a href="#{anchor}">{"<b>" + text + "</b>" if word != HOLDS else text}</a>')
            messages[column_label(summary)].append((anchor, word, message))
        lines.append("| " + " | ".join([_md(title)] + cells) + " |")
    lines.append("")
    for summary in summaries:
        version = column_label(summary)
        lines.append(column_heading(summary))
        lines.append("")
        ordered = [m for m in messages[version] if m[1] != HOLDS] + [m for m in messages[version] if m[1] == HOLDS]
        bad = sum(m[1] != HOLDS for m in ordered)
        # one element per line: docutils refuses lines over 10,000 characters; no blank line inside
        # the block, which would end the raw HTML block in CommonMark. A message already listed is
        # not repeated: the later anchors point to a short "same as above" item.
        seen: dict[tuple[str, str], str] = {}
        items = []
        for anchor, word, message in ordered:
            if (word, message) in seen:
                items.append(
                    f'<li id="{anchor}">{html.escape(word)}: same message as '
                    f'<a href="#{seen[(word, message)]}">above</a></li>'
                )
                continue
            seen[(word, message)] = anchor
            shown = f"<b>{html.escape(word)}</b>" if word != HOLDS else html.escape(word)
            items.append(f'<li id="{anchor}">{shown}: {html.escape(message)}</li>')
        lines += [
            '<div class="mpguide-matrix-messages">',
            f"<details><summary>Messages of Lightning {html.escape(version)}: {len(ordered) - bad} hold, "
            f"{bad} other</summary>",
            "<ul>",
            *items,
            "</ul>",
            "</details>",
            "</div>",
            "",
        ]
    return "\n".join(lines)


def _md(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`").replace("\n", " ")


def legend() -> str:
    """One Markdown list explaining each outcome word of the table."""
    return "\n".join(f"* **{o}**: {OUTCOME_MEANING[o]}" for o in OUTCOMES) + "\n"


def passing_releases(summaries: Sequence[dict[str, Any]], claims: Sequence[tuple[str, str]]) -> list[str]:
    """Releases (oldest first) on which every ``(example, claim id)`` of ``claims`` passed (the
    unreleased column is no release: see :func:`unreleased_clause`)."""
    ordered = sorted((s for s in summaries if not is_unreleased(s)), key=column_order)
    return [s["lightning"] for s in ordered if all(cell(s, ex, cid)[0] == "pass" for ex, cid in claims)]


def release_outcomes(summaries: Sequence[dict[str, Any]], claims: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """Outcome class -> releases (oldest first) of a section resting on ``claims``.

    A release counts as :data:`HOLDS` when every claim holds there; otherwise it takes the outcome of
    its first claim that does not hold, in the order of :data:`OUTCOMES` read from the most telling:
    a real difference (:data:`DOES_NOT_HOLD`) before the reasons nothing could be learnt
    (cannot run, plugin refuses, CPU-only artifact).
    """
    rank = {
        DOES_NOT_HOLD: 0,
        CANNOT_RUN: 1,
        PLUGIN_REFUSES: 2,
        CPU_ARTIFACT: 3,
        INCONCLUSIVE: 4,
        NOT_JUDGED: 5,
        NOT_RUN: 6,
    }
    out: dict[str, list[str]] = {}
    for s in sorted(summaries, key=lambda s: version_key(s["lightning"])):
        found = [outcome(s, ex, cid)[0] for ex, cid in claims]
        other = sorted((o for o in found if o != HOLDS), key=rank.get)
        out.setdefault(other[0] if other else HOLDS, []).append(s["lightning"])
    return out


def _releases(versions: Sequence[str]) -> str:
    return versions[0] if len(versions) == 1 else ", ".join(versions[:-1]) + " and " + versions[-1]


def applies_sentence(summaries: Sequence[dict[str, Any]], claims: Sequence[tuple[str, str]]) -> str:
    """The "Lightning releases" line of a guide section, drawn from the matrix, in words that cannot mislead.

    Args:
        summaries: from :func:`~mpguide_build.matrix.load_matrix`.
        claims: the ``(example, claim id)`` pairs the section rests on.

    Returns:
        One sentence per outcome of :func:`release_outcomes`, for example "Holds on Lightning 2.4.0 and
        2.6.6." followed by "Untested on 2.2.5 and 2.3.3 ..." for a CPU-only artifact; a release where the
        code cannot run names the missing API.

    Raises:
        MatrixError: ``claims`` is empty or names a claim no summary has.
    """
    if not claims:
        raise MatrixError("applies_sentence needs at least one (example, claim id)")
    known = {(ex, cid) for ex, cid, _ in rows(summaries)}
    unknown = [c for c in claims if tuple(c) not in known]
    if unknown:
        raise MatrixError(f"no release of the matrix has claim(s) {unknown}; known ids look like {sorted(known)[:3]}")
    every = summaries
    summaries = [s for s in summaries if not is_unreleased(s)]
    groups = release_outcomes(summaries, claims)
    ordered = sorted(summaries, key=column_order)
    parts = []
    if HOLDS in groups:
        parts.append(
            f"Holds on Lightning {_releases(groups[HOLDS])}" + (" (every release tested)." if len(groups) == 1 else ".")
        )
    else:
        parts.append(
            f"Holds on none of the Lightning releases tested ({_releases([s['lightning'] for s in ordered])})."
        )
    if DOES_NOT_HOLD in groups:
        parts.append(f"Does not hold on {_releases(groups[DOES_NOT_HOLD])}: the behaviour differs there.")
    if CANNOT_RUN in groups:
        apis = sorted(
            {
                missing_api(outcome(s, ex, cid)[1])
                for s in ordered
                if s["lightning"] in groups[CANNOT_RUN]
                for ex, cid in claims
            }
            - {""}
        )
        why = (
            f"`{'`, `'.join(apis)}` {'is' if len(apis) == 1 else 'are'} missing"
            if apis
            else "it could not be installed"
        )
        parts.append(f"The example cannot run on {_releases(groups[CANNOT_RUN])} ({why}).")
    if PLUGIN_REFUSES in groups:
        parts.append(f"ManualMixedPrecision refuses {_releases(groups[PLUGIN_REFUSES])} (it supports Lightning 2.6.x).")
    if CPU_ARTIFACT in groups:
        parts.append(
            f"Untested on {_releases(groups[CPU_ARTIFACT])}: their CPU GradScaler is disabled (a CPU-only "
            f"artifact, not a sign they are unaffected)."
        )
    if NOT_JUDGED in groups:
        parts.append(f"Not judged on {_releases(groups[NOT_JUDGED])}.")
    if INCONCLUSIVE in groups:
        parts.append(f"Inconclusive on {_releases(groups[INCONCLUSIVE])} (the timing rounds could not decide).")
    return " ".join(parts) + unreleased_clause(every, claims)


def unreleased_clause(summaries: Sequence[dict[str, Any]], claims: Sequence[tuple[str, str]]) -> str:
    """What the unreleased column says about ``claims`` when it differs from the newest release.

    Returns:
        ``""`` when there is no unreleased column or its cells equal the newest release's; else e.g.
        ``" On Lightning's unreleased master branch (commit 7f0c3436cd, 2026-07-20) it does not hold
        (fail)."`` or ``"... it holds."`` (with a leading space, to append to a sentence).
    """
    branch = [s for s in summaries if is_unreleased(s)]
    released = sorted((s for s in summaries if not is_unreleased(s)), key=column_order)
    if not branch:
        return ""
    words = {cell(branch[-1], ex, cid)[0] for ex, cid in claims}
    if released and words == {cell(released[-1], ex, cid)[0] for ex, cid in claims}:
        return ""
    source = branch[-1]["source"]
    where = (
        f" On Lightning's unreleased {branch[-1]['lightning']} branch (commit {source['commit'][:10]}, "
        f"{source['date'][:10]})"
    )
    if words == {"pass"}:
        return where + " it holds."
    return where + f" it does not hold ({' / '.join(sorted(words - {'pass'}))})."


def torch_sentence(summaries: Sequence[dict[str, Any]], claims: Sequence[tuple[str, str]]) -> str:
    """Which torch releases ``claims`` hold on, from the older-torch columns plus the site's column of
    the same Lightning release.

    Args:
        summaries: :func:`load_torch_matrix` plus, optionally, the :data:`TORCH_LIGHTNING` column of
            :func:`load_matrix` (its torch is named by its ``torch`` field).
        claims: ``(example, claim id)`` pairs; they hold on a torch when all of them pass.

    Returns:
        e.g. ``"With Lightning 2.6.6 this holds on torch 2.11.0+cu130, 2.13.0+cpu; not on torch
        2.10.0+cu128 (fail)."``

    Raises:
        MatrixError: ``claims`` is empty or names a claim no summary has.
    """
    if not claims:
        raise MatrixError("torch_sentence needs at least one (example, claim id)")
    known = {(ex, cid) for ex, cid, _ in rows(summaries)}
    unknown = [c for c in claims if tuple(c) not in known]
    if unknown:
        raise MatrixError(f"no column of the matrix has claim(s) {unknown}")
    ordered = sorted(summaries, key=lambda s: version_key(str(s.get("torch"))))
    ok, bad = [], []
    for s in ordered:
        words = {cell(s, ex, cid)[0] for ex, cid in claims}
        if words == {"pass"}:
            ok.append(str(s.get("torch")))
        elif words != {"not run"}:
            bad.append(f"{s.get('torch')} ({' / '.join(sorted(words - {'pass'}))})")
    lightning_versions = ", ".join(sorted({s["lightning"] for s in ordered}))
    held = f"this holds on torch {', '.join(ok)}" if ok else "this holds on none of the torch releases tested"
    return f"With Lightning {lightning_versions} {held}" + (f"; not on torch {', '.join(bad)}." if bad else ".")


def cache_bug_sentence(summaries: Sequence[dict[str, Any]]) -> str:
    """Which torch releases lose a weight's gradient in the minimal autocast-cache reproduction
    (:func:`probe_autocast_cache`), from every summary that ran it.

    Returns:
        e.g. ``"Measured: torch 2.10.0+cu128 loses the gradient; torch 2.11.0+cu130, 2.13.0+cpu do not."``

    Raises:
        MatrixError: no summary holds a probe result.
    """
    results: dict[str, bool] = {}
    for s in summaries:
        probe = s.get("autocast_cache_probe")
        if isinstance(probe, dict) and probe.get("torch"):
            results[probe["torch"]] = bool(probe.get("gradient_lost"))
    if not results:
        raise MatrixError("no matrix summary holds an autocast_cache_probe result; rerun the matrix")
    order = sorted(results, key=version_key)
    lost = [t for t in order if results[t]]
    kept = [t for t in order if not results[t]]
    parts = ([f"torch {', '.join(lost)} lose{'s' if len(lost) == 1 else ''} the gradient"] if lost else []) + (
        [f"torch {', '.join(kept)} do{'es' if len(kept) == 1 else ''} not"] if kept else []
    )
    return "Measured: " + "; ".join(parts) + "."


# ------------------------------------------------------------------------------------ producing


def run_plugin_tests(python: str, root: Path, timeout: float = 600) -> dict[str, Any]:
    """Run :data:`~mpguide_build.matrix.PLUGIN_TESTS` with ``python -m pytest`` and classify the outcome.

    ``refused`` when every failing test of pytest's short summary carries
    :data:`~mpguide_build.matrix.REFUSAL_MARK` (the plugin declines that Lightning release with a clear
    error and nothing else went wrong), ``pass`` when nothing failed, else ``fail``.
    """
    proc = subprocess.run(
        [python, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", PLUGIN_TESTS],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONPATH=str(root), COLUMNS="1000"),
    )  # no cut summary lines
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|error|errors)", tail[-1] if tail else "")}
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    # pytest's short summary (-ra) has one "FAILED ..."/"ERROR ..." line per failing test
    summary = [line for line in tail if line.startswith(("FAILED ", "ERROR "))]
    if proc.returncode == 0:
        status = "pass"
    elif summary and all(REFUSAL_MARK in line for line in summary):
        status = "refused"  # every failure is the plugin declining this release, nothing else
    else:
        status = "fail" if counts else "could not run"
    first_error = next((line for line in tail if line.startswith(("E ", "FAILED", "ERROR"))), "")
    return {
        "status": status,
        "passed": counts.get("passed", 0),
        "failed": failed,
        "message": (first_error + " | " if first_error else "") + (tail[-1] if tail else "no output"),
    }


def probe_autocast_cache(forward: Any = None) -> dict[str, Any]:
    """The minimal reproduction of the autocast-cache bug on the installed torch.

    In one ``torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=True)`` region, a
    ``nn.Linear(8, 4)`` forwards a ``(3, 8)`` float32 batch under ``torch.no_grad()``, then again with
    gradients; the second output is summed and backpropagated. On affected torch the second forward
    reuses the bf16 weight cast cached without autograd history, so the output has no ``grad_fn`` and
    the weight gets no gradient (PyTorch issues #65766, #112583, #158232; fixed by pull request
    #165068, merged 2025-12-10, in ``aten/src/ATen/autocast_mode.cpp``). CPU autocast shares that code.

    Args:
        forward: ``forward(layer, x) -> Tensor`` (default ``layer(x)``); tests pass a broken one to
            prove the probe reports a lost gradient.

    Returns:
        ``{"torch": torch.__version__, "gradient_lost": bool, "detail": str}``.
    """
    import torch

    forward = forward or (lambda layer, x: layer(x))
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=True):
        with torch.no_grad():
            forward(layer, x)
        out = forward(layer, x)
        has_graph = out.requires_grad
        if has_graph:
            out.float().sum().backward()
    grad = layer.weight.grad
    lost = grad is None or not bool(torch.isfinite(grad).all()) or not bool(grad.abs().sum() > 0)
    if not has_graph:
        detail = "the graded forward after a no_grad forward returned an output without grad_fn (weight.grad None)"
    elif grad is None:
        detail = "backward ran but weight.grad is None"
    else:
        detail = f"weight.grad present, |grad| sum {float(grad.abs().sum()):.4g}" + (
            "" if not lost else " (zero or not finite)"
        )
    return {"torch": torch.__version__, "gradient_lost": lost, "detail": detail}


def run_release(
    version: str,
    out_dir: Path,
    names: Sequence[str],
    timeout: float = 600,
    source: dict[str, str] | None = None,
    torch_pin: str | None = None,
    scope: Sequence[str] | None = None,
    plugin_tests: bool = True,
) -> dict[str, Any]:
    """In the current environment: run ``names`` at the test preset, judge them, write the summary.

    Each example runs as ``python examples/<name>.py`` with ``MPGUIDE_PRESET=test`` and
    ``MPGUIDE_DEVICE=cpu``; a script that fails or times out is recorded, not raised.

    Args:
        version: the release this environment must import, or the branch name of an unreleased
            column (``source`` of kind ``git``: any version string is accepted and recorded).
        source: ``{"kind": "git", "repository", "branch", "commit", "date"}`` for the unreleased column.
        torch_pin: the torch release this environment must import (older-torch columns).
        scope: the examples such a column runs (stored; others read "not run").
        plugin_tests: run :data:`PLUGIN_TESTS` (else the previous summary's outcome is kept, see
            :func:`merge_into_previous`).

    Returns:
        The summary written to :func:`~mpguide_build.matrix.summary_file` in ``out_dir``.
    """
    root = records.REPO_ROOT
    summary = new_summary(version, source=source, torch_pin=torch_pin, scope=scope)
    try:
        import lightning
        import torch
    except Exception as err:  # noqa: BLE001 - a release that installs but does not import is a result
        summary.update(status="could not run", error={"stage": "import", "message": f"{type(err).__name__}: {err}"})
        write_summary(summary, out_dir)
        return summary
    if not is_unreleased(summary) and lightning.__version__ != version:
        summary.update(
            status="could not run",
            error={
                "stage": "import",
                "message": f"this environment imports Lightning {lightning.__version__}, not {version}",
            },
        )
        write_summary(summary, out_dir)  # the column shows why
        return summary
    if torch_pin and torch.__version__.split("+")[0] != torch_pin:
        summary.update(
            status="could not run",
            error={
                "stage": "import",
                "message": f"this environment imports torch {torch.__version__}, not {torch_pin}",
            },
        )
        write_summary(summary, out_dir)
        return summary
    summary["autocast_cache_probe"] = probe_autocast_cache()
    print(
        f"  Lightning {column_label(summary)}: autocast cache probe on torch {torch.__version__}: "
        f"{summary['autocast_cache_probe']['detail']}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="mpguide-matrix-") as tmp:
        for name in names:
            start = time.perf_counter()
            env = dict(
                os.environ,
                MPGUIDE_PRESET="test",
                MPGUIDE_DEVICE="cpu",
                MPGUIDE_RESULTS_DIR=tmp,
                MPLBACKEND="Agg",
                PYTHONPATH=str(root),
            )
            try:
                proc = subprocess.run(
                    [sys.executable, str(declarations.example_file(name))],
                    cwd=tmp,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
                err = "" if proc.returncode == 0 else _last_error(proc.stderr)
            except subprocess.TimeoutExpired:
                err = f"timed out after {timeout:.0f} s"
            seconds = round(time.perf_counter() - start, 1)
            summary["examples"][name] = summarize_example(name, Path(tmp), version, err, seconds, torch_pin=torch_pin)
            entry = summary["examples"][name]
            bad = sum(c["verdict"] != "pass" for c in entry["claims"])
            print(
                f"  Lightning {column_label(summary)}: {name}: {entry['status']}, {len(entry['claims']) - bad} pass, "
                f"{bad} not passing, {seconds} s" + (f" ({err.splitlines()[-1][:120]})" if err else ""),
                flush=True,
            )
    if plugin_tests:
        summary["plugin_tests"] = run_plugin_tests(sys.executable, root, timeout)
        print(
            f"  Lightning {column_label(summary)}: plugin tests {summary['plugin_tests']['status']}: "
            f"{summary['plugin_tests']['message'][:160]}",
            flush=True,
        )
    summary = merge_into_previous(summary, out_dir)
    write_summary(summary, out_dir)
    return summary


def merge_into_previous(summary: dict[str, Any], directory: Path | None = None) -> dict[str, Any]:
    """``summary`` with the examples it did not run taken from the release's previous summary.

    Lets ``MPGUIDE_MATRIX_EXAMPLES`` rerun only the examples that changed. Entries are taken over
    only from a previous summary of the same library digest and status ``"ran"``; each keeps its
    own ``example_sha256``, so :func:`~mpguide_build.matrix.staleness` still names every entry that
    describes an older example.
    """
    path = summary_file(summary, directory)
    try:
        previous = load(path)
    except MatrixError:
        return summary
    if previous.get("library_sha256") != summary["library_sha256"] or previous.get("status") != "ran":
        return summary
    if previous.get("source") != summary.get("source"):  # another commit of the branch: nothing carries over
        return summary
    merged = dict(
        summary,
        examples={**previous["examples"], **summary["examples"]},
        plugin_tests=summary.get("plugin_tests") or previous.get("plugin_tests"),
    )
    merged["examples"] = dict(sorted(merged["examples"].items()))
    return merged


def _last_error(stderr: str, lines: int = 3) -> str:
    """The exception lines at the end of a traceback (without machine paths), or the last lines."""
    text = [line for line in stderr.strip().splitlines() if line.strip()]
    tail = "\n".join(text[-lines:])
    return re.sub(r"/[^\s\"']*/(site-packages|examples|mpguide)/", r"\1/", tail)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mpguide_build.matrix run|error|check|table|probe``; see ``--help``."""
    parser = argparse.ArgumentParser(prog="python -m mpguide_build.matrix", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the examples in this environment and write its summary")
    err = sub.add_parser("error", help="write the summary of a release that could not be installed")
    for command in (run, err):
        command.add_argument(
            "--lightning",
            required=True,
            help="the release this environment should import, or the branch name with --git-commit",
        )
        command.add_argument("--out", type=Path, default=MATRIX_DIR)
        command.add_argument(
            "--examples",
            nargs="*",
            default=None,
            help="example stems (default: every plot_*.py, or TORCH_EXAMPLES with --torch)",
        )
        command.add_argument("--torch", default=None, help="an older-torch column: the torch release it pins")
        command.add_argument("--git-commit", default=None, help="an unreleased column: the commit installed")
        command.add_argument("--git-date", default=None, help="its committer date (ISO 8601)")
        command.add_argument("--git-repository", default="Lightning-AI/pytorch-lightning")
    run.add_argument(
        "--no-plugin-tests",
        action="store_true",
        help="leave plugin_tests as in the previous summary (for a partial rerun of examples)",
    )
    run.add_argument(
        "--timeout",
        type=float,
        default=float(os.environ.get("MPGUIDE_MATRIX_TIMEOUT", 600)),
        help="seconds per example and for the plugin tests (default: MPGUIDE_MATRIX_TIMEOUT or 600)",
    )
    err.add_argument("--stage", default="install")
    what = err.add_mutually_exclusive_group(required=True)
    what.add_argument("--message-file", type=Path, help="a log whose last error lines say why")
    what.add_argument("--message", help="why, in words")
    sub.add_parser("check", help="exit 1 when the committed matrix is stale")
    table = sub.add_parser("table", help="print the Markdown table")
    table.add_argument("--dir", type=Path, default=MATRIX_DIR)
    table.add_argument("--torch", action="store_true", help="the older-torch columns and the site's TORCH_LIGHTNING")
    sub.add_parser("probe", help="print the minimal autocast-cache reproduction's outcome on this torch (JSON)")
    args = parser.parse_args(argv)
    every = sorted(p.stem for p in declarations.examples_dir().glob("plot_*.py"))
    if args.command in ("run", "error"):
        if bool(args.git_commit) != bool(args.git_date):
            parser.error("--git-commit and --git-date go together (the unreleased column names both)")
        source = (
            {
                "kind": "git",
                "repository": args.git_repository,
                "branch": args.lightning,
                "commit": args.git_commit,
                "date": args.git_date,
            }
            if args.git_commit
            else None
        )
        scope = list(TORCH_EXAMPLES) if args.torch else None
        names = args.examples or scope or every
    if args.command == "run":
        run_release(
            args.lightning,
            args.out,
            names,
            args.timeout,
            source=source,
            torch_pin=args.torch,
            scope=scope,
            plugin_tests=not args.no_plugin_tests,
        )
        return 0
    if args.command == "error":
        message = args.message or _last_error(args.message_file.read_text(encoding="utf-8", errors="replace"), lines=6)
        summary = new_summary(
            args.lightning,
            "could not run",
            {"stage": args.stage, "message": message},
            names,
            source=source,
            torch_pin=args.torch,
            scope=scope,
        )
        print(f"  Lightning {column_label(summary)}: could not {args.stage}: {message.splitlines()[-1][:160]}")
        write_summary(summary, args.out)
        return 0
    if args.command == "probe":
        print(json.dumps(probe_autocast_cache()))
        return 0
    if args.command == "check":
        try:
            check_current()
        except MatrixError as error:
            print(error, file=sys.stderr)
            return 1
        print("the committed version matrix is current")
        return 0
    if args.torch:
        site = [s for s in load_matrix(args.dir) if s["lightning"] == TORCH_LIGHTNING and not is_unreleased(s)]
        print(render_table(load_torch_matrix(args.dir) + site, examples=TORCH_EXAMPLES))
        return 0
    print(render_table(load_matrix(args.dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
