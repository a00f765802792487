"""What the pages show of the records: each example's record and references as the gate judges them, the GPU table.

Page-only helpers (the guide page, ``docs/gpu_references.md``); the gate itself
(:mod:`mpguide.verify.gate`) and the examples never need them, so they live with the build.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpguide.verify.claims.verdicts import Verdict, hardware_label
from mpguide.verify.gate import evaluate
from mpguide.verify.records import load_record, record_path, reference_dir
from mpguide.verify.show.report import COLUMNS


def counted_checks(verdicts: Sequence[Verdict]) -> tuple[list[Verdict], int]:
    """The checks a page counts, and how many it leaves out as not applicable on this release.

    Counted: each judged claim that applies to the record (a claim declared ``only_if`` a condition the record's
    ``env`` does not meet is neither held nor failed); the implicit ``finite``/``completes`` checks are counted
    apart. Every page that says "N of M checks hold" uses this, so the front page, the guide and the verification
    page agree.
    """
    judged = [v for v in verdicts if v.judged and v.kind not in ("finite", "completes")]
    counted = [v for v in judged if v.applicable]
    return counted, len(judged) - len(counted)


@dataclass
class PageRecord:
    """One record as a page shows it: where it comes from, its verdicts as the gate judges them.

    Attributes:
        source: ``"this build"`` or ``"reference: <device folder>"``.
        record: the record.
        verdicts: from :func:`mpguide.verify.gate.evaluate` (compared with the example's declaration).
        stale: why a reference is stale, or ``""`` when it was made from the current example.
        path: the record file.
    """

    source: str
    record: dict[str, Any]
    verdicts: list[Verdict]
    stale: str
    path: Path

    @property
    def label(self) -> str:
        """Hardware, versions, date and provenance in one line, e.g. for a figure title or a caption."""
        rec = self.record
        commit = (rec.get("source") or {}).get("commit")
        where = "this build" if self.source == "this build" else "reference"
        text = f"{where}: {hardware_label(rec['env'])}, preset {rec['preset']}, {rec['created'][:10]}"
        if self.source != "this build" and commit:
            text += f", recorded at {commit[:7]}"
        return text + (" (STALE: the example's code changed since)" if self.stale else "")


def page_entries(example: str) -> list[PageRecord]:
    """This build's record of ``example`` first, then each committed reference, judged as the gate does.

    Raises:
        mpguide.verify.records.RecordError: this build's record is missing or unreadable (the message
            names the file and the command that writes it). References are optional.
    """
    path = record_path(example)
    record = load_record(path)
    verdicts, _ = evaluate(record, path)
    entries = [PageRecord("this build", record, verdicts, "", path)]
    for ref in sorted(reference_dir().glob(f"*/{example}.json")):
        record = load_record(ref)
        verdicts, stale = evaluate(record, ref, reference=True)
        entries.append(PageRecord(f"reference: {ref.parent.name}", record, verdicts, stale, ref))
    return entries


def speedup_rows(entries: Sequence[Any]) -> list[dict[str, str]]:
    """Rows of the guide's GPU speed-up table from plot_15 records (:func:`~mpguide_build.pages.page_entries` of it).

    One row per CUDA record, run (precision) and variant other than the automatic loop and the plain
    loop: steps/s (median of the per-round rates, the numbers the claims judge), the factor over the
    plain manual loop of the same precision,
    achieved matmul TFLOP/s and its share of the bf16 matmul peak measured in the same run. CPU
    records give no rows (they time no speed-up; see :data:`mpguide.verify.run.throughput.config.TUNED`).

    Raises:
        KeyError: a CUDA record's run lacks ``extra["benchmark"]`` or its ``"manual"`` variant (a record
            that did not come from plot_15).
    """
    # imported here: the throughput package imports torch and Lightning (about 5 s in each page's kernel),
    # and only a GPU record's rows need it
    from mpguide.verify.run.throughput.config import Size

    rows = []
    for entry in entries:
        env = entry.record.get("env", {})
        if env.get("accelerator") != "cuda":
            continue
        for run in entry.record["runs"]:
            bench, peak = run["extra"]["benchmark"], run["extra"].get("peak_bf16_tflops")
            flops = Size(**run["extra"]["size"]).flops_per_step()
            rates = {v: statistics.median(t["round_steps_per_s"]) for v, t in bench.items()}
            for variant in (v for v in bench if v not in ("automatic", "plain loop")):
                tflops = rates[variant] * flops / 1e12
                rows.append(
                    {
                        "record": entry.label,
                        "precision": run["precision"],
                        "variant": variant,
                        "steps/s": f"{rates[variant]:.1f}",
                        "vs manual": f"x{rates[variant] / rates['manual']:.2f}",
                        "TFLOP/s": f"{tflops:.0f}",
                        "of bf16 peak": f"{tflops / peak:.0%}" if peak else "not measured",
                    }
                )
    return rows


def markdown_table(rows: Sequence[dict[str, str]], columns: Sequence[str] = COLUMNS) -> str:
    """GitHub-flavoured Markdown table of ``rows`` (cells have ``|`` escaped)."""

    def cell(value: Any) -> str:  # escape what Markdown would read as table syntax or code
        return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`").replace("\n", " ")

    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(out)


def captured_texts(run: dict[str, Any]) -> list[str]:
    """What a run captured: ``"Type: message"`` of its error (if any) and each recorded warning."""
    texts = [str(w) for w in run.get("warnings") or []]
    if run.get("error"):
        texts.append(f"{run['error']['type']}: {run['error']['message']}")
    return texts


def check_quoted_messages(
    records: dict[str, dict[str, Any]], quoted: Sequence[tuple[str, str, str]], page: str = "the guide page"
) -> None:
    """Fail when a message a page quotes was not captured by the run that is said to produce it.

    Args:
        records: example name -> results record (this build's).
        quoted: ``(example, run id, exact text)``; the text must occur in the run's error message or
            in one of its recorded warnings.
        page: named in the error message.

    Raises:
        ValueError: one line per missing message, naming example, run, text and what to update.
    """
    missing = []
    for example, run_id, text in quoted:
        if example not in records:
            missing.append(f"{example}: no record (quoted: {text!r})")
            continue
        run = next((r for r in records[example]["runs"] if r["id"] == run_id), None)
        if run is None:
            missing.append(f"{example}: no run {run_id!r} (quoted: {text!r})")
        elif not any(text in t for t in captured_texts(run)):
            missing.append(f"{example} run {run_id!r} did not capture {text!r}")
    if missing:
        raise ValueError(
            f"{page} quotes messages this build did not produce; update the quote or the run:\n  "
            + "\n  ".join(missing)
        )
