"""From one release's records to its summary: one row per declared claim of each example, plus the row
:data:`~mpguide_build.matrix_summary.RUNS_ROW` for the gate's implicit checks, as judged by the claim gate
(:func:`mpguide.verify.gate.judge`)."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mpguide.verify import records
from mpguide.verify.show.report import allowed_text, measured_text, result_text

from .matrix_summary import RUNS_ROW, SCHEMA, cell_keys, summary_path


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
        examples: folder of the examples (default :func:`mpguide.verify.hints.examples_dir`).

    Returns:
        The ``examples[example]`` entry of a summary (see the module docstring). Without a readable
        record the example "could not run" and ``error`` holds the script's error or the record error.
    """
    from mpguide.verify.gate import judge

    entry: dict[str, Any] = {
        "keys": cell_keys(example, examples),
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
                # what the releases page shows: the measurement in words, as the example's own table words it
                "words": f"{result_text(v)}; measured {measured_text(v)}; allowed {allowed_text(v)}",
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
            "keys": cell_keys(example, examples_dir),
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
