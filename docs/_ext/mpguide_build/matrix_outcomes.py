"""The outcome classes of a matrix cell (holds, does not hold, cannot run, plugin refuses, CPU-only artifact,
inconclusive, not judged, not run), and how a stored verdict and its message are classified into one
(:func:`~mpguide_build.matrix_outcomes.outcome`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mpguide.verify.claims import declarations

from .matrix_summary import RUNS_ROW, cell_staleness, column_label, column_order, not_rerun_since

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
#: Outcome "not applicable on this release", a claim declared ``only_if`` a measured condition
#: (:mod:`mpguide.verify.claims.conditions`) that the release's record did not meet; neither holds nor fails.
NOT_APPLICABLE = "not applicable on this release"
#: Outcome "inconclusive", a throughput claim the rounds could not decide (never a pass).
INCONCLUSIVE = "inconclusive"
#: Outcome "not run", the column does not run that example (an older-torch column runs a few).
NOT_RUN = "not run"
#: Outcome "not re-run". The cell was produced from other code (or versions) than today's, so it shows no
#: verdict (:func:`mpguide_build.matrix_summary.cell_staleness`), only since when it was not re-run.
NOT_RERUN = "not re-run"
#: Every outcome class of a cell (:func:`~mpguide_build.matrix_outcomes.outcome`), in the legend's order.
OUTCOMES = (
    HOLDS,
    DOES_NOT_HOLD,
    CANNOT_RUN,
    PLUGIN_REFUSES,
    CPU_ARTIFACT,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    NOT_JUDGED,
    NOT_RUN,
    NOT_RERUN,
)
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
    NOT_APPLICABLE: "the claim is declared only where a measured condition holds (only_if, e.g. Lightning's own "
    "autocast caches casts), and that release's record measured otherwise; a paired claim says what holds there",
    NOT_JUDGED: "the record could not judge the claim",
    NOT_RUN: "that column does not run this example (the older-torch columns run only the torch-dependent ones)",
    NOT_RERUN: "the example or the library code changed since this cell ran (docstrings and comments do not "
    "count): it shows no verdict until it is re-run (nox -s matrix -- --stale-only)",
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


#: Text the plugin's refusal of a release must contain to count as a clear refusal (not a failure):
#: the name of the error :func:`mpguide.precision.check_versions` raises.
REFUSAL_MARK = "UnsupportedVersionError"


# ------------------------------------------------------------------------------------ rendering


def cell(summary: dict[str, Any], example: str, cid: str) -> tuple[str, str]:
    """``(verdict, message)`` of claim ``cid`` of ``example`` in one release's summary, as stored.

    ``verdict`` is ``"pass"``, ``"fail"``, ``"inconclusive"`` (a throughput claim the data could not decide,
    never a pass), ``"not judged"``, ``"not run"`` (the column does not run that example) or
    ``"could not run"`` (the release or the example could not run, or the claim is absent from its record),
    or ``"not re-run"`` for a stale cell (:func:`~mpguide_build.matrix_summary.cell_staleness`), whose
    message is ``"not re-run since <date>, commit <id>: <why>"``: a stale cell never shows its old verdict.
    :func:`~mpguide_build.matrix_outcomes.outcome` tells a reader what a non-passing verdict means.
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
    stale = cell_staleness(summary, example)
    if stale:
        return "not re-run", f"{example} on Lightning {label}: {not_rerun_since(summary, example)}: {stale}"
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


def _scaler_disabled_on_cpu(summary: dict[str, Any]) -> bool:
    """The summary ran on a CPU with a release of :data:`CPU_SCALER_DISABLED` (16-mixed without loss scaling)."""
    on_cpu = str(summary.get("device", "cpu")).lower().startswith("cpu")
    return on_cpu and ".".join(summary["lightning"].split(".")[:2]) in CPU_SCALER_DISABLED


def _refused_non_finite_on_disabled_scaler(
    summary: dict[str, Any], example: str, message: str, examples: Path | None
) -> bool:
    """The example ran where :func:`_scaler_disabled_on_cpu`, and its record was refused for a non-finite
    measurement of a 16-mixed run (:mod:`mpguide.verify.records.schema` requires finite numbers)."""
    refused = re.search(r"field 'runs\[\d+\] \(([^)]+)\)[^']*' should be a finite number", message or "")
    return bool(
        _scaler_disabled_on_cpu(summary)
        and refused
        and _run_precision(summary, example, refused.group(1), examples) in ("16-mixed", "")
    )


def outcome(summary: dict[str, Any], example: str, cid: str, examples: Path | None = None) -> tuple[str, str]:
    """What a cell means for a reader: ``(outcome class, why)``, the class one of :data:`OUTCOMES`.

    Derived from what the summary stores, in this order:

    * ``pass`` -> :data:`HOLDS`; ``not judged`` -> :data:`NOT_JUDGED`; ``not applicable`` -> :data:`NOT_APPLICABLE`;
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
    if verdict == "not applicable":
        return NOT_APPLICABLE, message
    if verdict == "inconclusive":
        return INCONCLUSIVE, message
    if verdict == "not run":
        return NOT_RUN, message
    if verdict == "not re-run":
        return NOT_RERUN, message
    if verdict == "could not run":
        if _refused_non_finite_on_disabled_scaler(summary, example, message, examples):
            return CPU_ARTIFACT, (
                f"Lightning {summary['lightning']} disables its GradScaler on a CPU, so a 16-mixed run trained "
                f"without loss scaling and measured a non-finite value, which a record may not hold (the record "
                f"was refused); not evidence either way for a GPU. {message}"
            )
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
    if _scaler_disabled_on_cpu(summary) and any(
        _run_precision(summary, example, r, examples) == "16-mixed" for r in involved
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
