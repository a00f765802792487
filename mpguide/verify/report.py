"""Verdict tables: the same rows printed by an example at its end and rendered on the guide page."""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from .claims import Verdict, evaluate_record
from .records import short_paths  # noqa: F401 - the pages call report.short_paths

COLUMNS = ("verdict", "claim", "runs", "metric", "value", "threshold")
#: Columns of the narrower tables printed by the examples and shown per section on the guide.
SHORT_COLUMNS = ("verdict", "claim", "value", "threshold")
#: Longest threshold text shown in a table cell (longer ones are cut, ending in "...").
MAX_THRESHOLD = 40
#: Widest a column of a plain-text table (:func:`~mpguide.verify.report.format_table`) gets, in characters;
#: a longer cell (a long run id, claim title or observed message) wraps onto continuation lines.
MAX_CELL_WIDTH: dict[str, int] = {"verdict": 12, "claim": 44, "runs": 36, "metric": 24, "value": 36,
                                  "threshold": MAX_THRESHOLD, "hardware": 60}
#: Width limit of a column :data:`~mpguide.verify.report.MAX_CELL_WIDTH` does not name.
DEFAULT_CELL_WIDTH = 40


def verdict_rows(verdicts: Sequence[Verdict], include_implicit: bool = False) -> list[dict[str, str]]:
    """Table rows (column -> text) for ``verdicts``.

    Args:
        verdicts: from :func:`mpguide.verify.claims.evaluate_record`.
        include_implicit: also list the implicit per-run checks (``finite``, ``completes``); failing
            implicit checks are always listed.
    """
    rows = []
    for v in verdicts:
        if v.kind in ("finite", "completes") and v.passed and not include_implicit:
            continue
        rows.append({
            "claim": v.title,
            "runs": " vs ".join(v.runs),
            "metric": v.metric,
            "value": v.shown_value(),
            "threshold": v.threshold if len(v.threshold) <= MAX_THRESHOLD else v.threshold[:MAX_THRESHOLD - 3] + "...",
            "verdict": v.status,
            "hardware": v.hardware,
        })
    return rows


def format_table(rows: Sequence[dict[str, str]], columns: Sequence[str] = COLUMNS,
                 max_width: dict[str, int] | None = None) -> str:
    """Plain-text table of ``rows`` with aligned columns (for terminals and gallery output).

    A cell wider than its column's limit, or holding a line break, wraps onto continuation lines
    (at spaces and hyphens, else anywhere), so one long run id or message cannot push the other
    columns out of line; the other cells of that row stay blank on those lines. Lines carry no
    trailing blanks.

    Args:
        rows: column -> text (as :func:`~mpguide.verify.report.verdict_rows` gives them).
        columns: the columns shown, in order.
        max_width: column -> widest cell in characters (default :data:`~mpguide.verify.report.MAX_CELL_WIDTH`,
            then :data:`~mpguide.verify.report.DEFAULT_CELL_WIDTH`); a header is never wrapped.
    """
    limits = {c: max(len(c), (MAX_CELL_WIDTH if max_width is None else max_width).get(c, DEFAULT_CELL_WIDTH))
              for c in columns}
    cells = [[_wrap(str(r.get(c, "")), limits[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(line) for row in cells for line in row[i]]) for i, c in enumerate(columns)]

    def join(parts: Sequence[str]) -> str:
        return "  ".join(part.ljust(width) for part, width in zip(parts, widths)).rstrip()

    out = [join(columns), join(["-" * w for w in widths])]
    for row in cells:
        out += [join([cell[k] if k < len(cell) else "" for cell in row]) for k in range(max(map(len, row), default=1))]
    return "\n".join(out)


def _wrap(text: str, width: int) -> list[str]:
    """``text`` as lines of at most ``width`` characters (its own line breaks kept; at least one line)."""
    import textwrap

    return [part for line in text.splitlines() or [""]
            for part in (textwrap.wrap(line, width, break_long_words=True) or [""])]


def summary(record: dict[str, Any], path: str = "") -> str:
    """Verdict table of one record plus a closing line ``N passed, M failed`` (claims and checks), with
    ``, K inconclusive (not passed)`` when some claim could not be decided."""
    verdicts = evaluate_record(record, path)
    passed = sum(v.passed for v in verdicts)
    undecided = sum(v.undecided for v in verdicts)
    table = format_table(verdict_rows(verdicts), SHORT_COLUMNS)
    return (f"{table}\n\n{record['example']} on {verdicts[0].hardware if verdicts else '?'}: "
            f"{passed} checks passed, {len(verdicts) - passed - undecided} failed"
            + (f", {undecided} inconclusive (not passed)" if undecided else ""))


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


def check_quoted_messages(records: dict[str, dict[str, Any]],
                          quoted: Sequence[tuple[str, str, str]], page: str = "the guide page") -> None:
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
        raise ValueError(f"{page} quotes messages this build did not produce; update the quote or the run:\n  "
                         + "\n  ".join(missing))


def speedup_rows(entries: Sequence[Any]) -> list[dict[str, str]]:
    """Rows of the guide's GPU speed-up table from plot_15 records (:func:`~mpguide.verify.gate.page_entries` of it).

    One row per CUDA record, run (precision) and variant other than the automatic loop and the plain
    loop: steps/s (median of the per-round rates, the numbers the claims judge), the factor over the
    plain manual loop of the same precision,
    achieved matmul TFLOP/s and its share of the bf16 matmul peak measured in the same run. CPU
    records give no rows (they time no speed-up; see :data:`mpguide.verify.throughput.TUNED`).

    Raises:
        KeyError: a CUDA record's run lacks ``extra["benchmark"]`` or its ``"manual"`` variant (a record
            that did not come from plot_15).
    """
    from .throughput import Size  # imports Lightning: only for the page that shows the table

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
                rows.append({"record": entry.label, "precision": run["precision"],
                             "variant": variant, "steps/s": f"{rates[variant]:.1f}",
                             "vs manual": f"x{rates[variant] / rates['manual']:.2f}",
                             "TFLOP/s": f"{tflops:.0f}",
                             "of bf16 peak": f"{tflops / peak:.0%}" if peak else "not measured"})
    return rows
