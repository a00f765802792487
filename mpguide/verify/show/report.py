"""Verdict tables: the same rows printed by an example at its end and rendered on the guide page."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..claims import evaluate_record
from ..claims.conditions import CONDITIONS, NOT_APPLICABLE
from ..claims.tolerances import TOLERANCES
from ..claims.verdicts import Verdict
from ..records import short_paths

#: The terse columns the claim gate prints for maintainers.
COLUMNS = ("verdict", "claim", "runs", "metric", "value", "threshold")
#: The worded columns of the tables that the examples print and the pages show.
WORD_COLUMNS = ("result", "check", "measured", "allowed")
#: Older name of the example tables' columns (kept for callers that pass it explicitly).
SHORT_COLUMNS = WORD_COLUMNS
#: Longest threshold text shown in a table cell (longer ones are cut, ending in "...").
MAX_THRESHOLD = 40
#: Widest a column of a plain-text table (:func:`~mpguide.verify.show.report.format_table`) gets, in characters;
#: a longer cell (a long run id, claim title or observed message) wraps onto continuation lines.
MAX_CELL_WIDTH: dict[str, int] = {
    "verdict": 12,
    "claim": 44,
    "runs": 36,
    "metric": 24,
    "value": 36,
    "threshold": MAX_THRESHOLD,
    "hardware": 60,
    "result": 34,
    "check": 40,
    "measured": 44,
    "allowed": 34,
}
#: Width limit of a column :data:`~mpguide.verify.show.report.MAX_CELL_WIDTH` does not name.
DEFAULT_CELL_WIDTH = 40
#: Claim kinds whose passing verdict means "a bug or trap still shows" (so a pass is not good news).
PITFALL_KINDS = ("diverge",)
#: Anchor of a tolerance's definition on the verification page (``docs/verification.md``).
TOLERANCE_ANCHOR = "tol-{}"


def _percent(fraction: float) -> str:
    """``0.0012`` -> ``"0.12 %"``; tiny non-zero values keep two significant digits (``"3.1e-06 %"``)."""
    pct = 100 * fraction
    if pct == 0:
        return "0.00 %"
    if math.isnan(pct) or math.isinf(pct):
        return f"{pct} %"
    return f"{pct:.2f} %" if abs(pct) >= 0.01 else f"{pct:.2g} %"


def _tolerance_name(v: Verdict, href: str | None) -> str:
    if not v.tolerance:
        return ""
    if href is None:
        return f" ({v.tolerance})"
    anchor = TOLERANCE_ANCHOR.format(v.tolerance)
    return f' (<a href="{href}#{anchor}">{v.tolerance}</a>)'


def measured_text(v: Verdict) -> str:
    """What ``v`` measured, in words and with its unit, e.g.
    ``"largest gap between smoothed loss curves: 0.00 %"``.

    Falls back to the verdict's observed text where nothing numeric was measured (a run that raised,
    a value not recorded), so the reader sees why.
    """
    value, observed = v.value, v.observed
    numeric = value is not None and not observed
    if not v.judged:
        return "not judged on this record"
    if not v.applicable:
        return NOT_APPLICABLE
    if v.kind == "match":
        return f"largest gap between smoothed loss curves: {_percent(value)}" if numeric else observed or "n/a"
    if v.kind == "diverge":
        return f"average gap between smoothed loss curves: {_percent(value)}" if numeric else observed or "n/a"
    if v.kind == "ratio":
        return (
            f"largest deviation of the update from the expected factor: {_percent(value)}"
            if numeric
            else observed or "not recorded"
        )
    if v.kind == "rate_ratio":
        what = "speed ratio" if v.tolerance.startswith("throughput") else "ratio"  # rates, or two other numbers
        return f"{what}, {observed}" if observed else "n/a"
    if v.kind == "raises":
        return f"error raised: {observed}" if observed != "no exception" else "no error raised"
    if v.kind == "warns":
        return f"matching warnings: {int(value) if value is not None else 0}"
    if v.kind == "no_warning":
        return f"matching warnings: {int(value) if value is not None else 0}"
    if v.kind == "expect":
        return f"recorded {observed}"
    if v.kind == "same":
        return f"{v.metric}: {observed}"
    if v.kind == "finite":
        return f"steps with a non-finite loss: {int(value) if value is not None else '?'}"
    if v.kind == "completes":
        return f"error raised: {observed}"
    return observed or (f"{value:.3g}" if value is not None else "n/a")


def allowed_text(v: Verdict, tolerance_href: str | None = None) -> str:
    """What ``v`` requires, in words, naming its tolerance (a link to its definition when
    ``tolerance_href`` is the verification page's URL), e.g. ``"at most 0.10 % (same-precision)"``."""
    tol = TOLERANCES.get(v.tolerance)
    name = _tolerance_name(v, tolerance_href)
    if not v.judged:
        return "-"
    if not v.applicable:
        return f"only where {CONDITIONS[v.extra['only_if']][2]}"
    if v.kind == "match" and tol:
        return f"at most {_percent(tol.value)}{name}"
    if v.kind == "diverge" and tol:
        return f"at least {_percent(tol.value)}{name}"
    if v.kind == "ratio" and tol:
        return f"at most {_percent(tol.value)}{name}"
    if v.kind == "rate_ratio" and tol:
        return f"within {_percent(tol.value)} of 1{name}" if tol.bound == "max" else f"at least {tol.value:g}x{name}"
    if v.kind == "raises":
        return f"the error: {v.threshold.removeprefix('raises ')}"
    if v.kind == "warns":
        return f"at least one {v.threshold.removeprefix('warns ')}"
    if v.kind == "no_warning":
        return "none"
    if v.kind == "expect":
        return f"expected {v.threshold.removeprefix('== ')}"
    if v.kind == "same":
        return "bitwise identical"
    if v.kind == "finite":
        return "none"
    if v.kind == "completes":
        return "none (the run must train to the end)"
    return v.threshold


def result_text(v: Verdict) -> str:
    """The verdict in words: "holds" or "DOES NOT HOLD"; for a pitfall "the bug still reproduces: yes"
    (or "NO"); for an expected error "the error still appears: yes" (or "NO")."""
    if not v.judged:
        return "not judged (older record)"
    if not v.applicable:
        return NOT_APPLICABLE
    if v.undecided:
        return "inconclusive (not a pass)"
    if v.kind in PITFALL_KINDS:
        return "the bug still reproduces: " + ("yes" if v.passed else "NO")
    if v.kind == "raises":
        return "the error still appears: " + ("yes" if v.passed else "NO")
    if v.kind == "warns":
        return "the warning still appears: " + ("yes" if v.passed else "NO")
    return "holds" if v.passed else "DOES NOT HOLD"


def verdict_rows(
    verdicts: Sequence[Verdict], include_implicit: bool = False, tolerance_href: str | None = None
) -> list[dict[str, str]]:
    """Table rows (column -> text) for ``verdicts``.

    Each row has the worded columns of :data:`~mpguide.verify.show.report.WORD_COLUMNS` (``result``, ``check``,
    ``measured`` with its unit, ``allowed`` naming the tolerance) and the terse ones of
    :data:`~mpguide.verify.show.report.COLUMNS` (the gate's own table prints those).

    Args:
        verdicts: from :func:`mpguide.verify.claims.evaluate_record`.
        include_implicit: also list the implicit per-run checks (``finite``, ``completes``); failing
            implicit checks are always listed.
        tolerance_href: URL of the page defining the tolerances (``"../verification.html"``, say);
            when given, each tolerance name in ``allowed`` is an HTML link to ``#tol-<name>`` there.
    """
    rows = []
    for v in verdicts:
        if v.kind in ("finite", "completes") and v.passed and not include_implicit:
            continue
        rows.append(
            {
                "result": result_text(v),
                "check": v.title,
                "measured": measured_text(v),
                "allowed": allowed_text(v, tolerance_href),
                "claim": v.title,
                "runs": " vs ".join(v.runs),
                "metric": v.metric,
                "value": v.shown_value(),
                "threshold": v.threshold
                if len(v.threshold) <= MAX_THRESHOLD
                else v.threshold[: MAX_THRESHOLD - 3] + "...",
                "verdict": v.status,
                "hardware": v.hardware,
            }
        )
    return rows


def format_table(
    rows: Sequence[dict[str, str]], columns: Sequence[str] = COLUMNS, max_width: dict[str, int] | None = None
) -> str:
    """Plain-text table of ``rows`` with aligned columns (for terminals and gallery output).

    A cell wider than its column's limit, or holding a line break, wraps onto continuation lines
    (at spaces and hyphens, else anywhere), so one long run id or message cannot push the other
    columns out of line; the other cells of that row stay blank on those lines. Lines carry no
    trailing blanks.

    Args:
        rows: column -> text (as :func:`~mpguide.verify.show.report.verdict_rows` gives them).
        columns: the columns shown, in order.
        max_width: column -> widest cell in characters (default :data:`~mpguide.verify.show.report.MAX_CELL_WIDTH`,
            then :data:`~mpguide.verify.show.report.DEFAULT_CELL_WIDTH`); a header is never wrapped.
    """
    limits = {
        c: max(len(c), (MAX_CELL_WIDTH if max_width is None else max_width).get(c, DEFAULT_CELL_WIDTH)) for c in columns
    }
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

    return [
        part
        for line in text.splitlines() or [""]
        for part in (textwrap.wrap(line, width, break_long_words=True) or [""])
    ]


def count_line(verdicts: Sequence[Verdict]) -> str:
    """How many of the shown checks hold, and how many automatic per-run checks passed besides.

    The first number counts exactly the rows :func:`~mpguide.verify.show.report.verdict_rows` shows (declared
    claims, plus any failing automatic check); the automatic checks that passed are counted apart,
    because the table does not list them.
    """
    shown = [v for v in verdicts if v.kind not in ("finite", "completes") or v.failed]
    hidden = [v for v in verdicts if v.kind in ("finite", "completes") and not v.failed]
    inapplicable = sum(v.judged and not v.applicable for v in shown)
    judged = [v for v in shown if v.judged and v.applicable]
    ok = sum(v.passed for v in judged)
    undecided = sum(v.undecided for v in judged)
    text = f"{ok} of {len(judged)} checks in the table hold"
    if undecided:
        text += f", {undecided} inconclusive (not a pass)"
    if inapplicable:
        text += f", {inapplicable} {NOT_APPLICABLE}"
    if len(judged) + inapplicable < len(shown):
        text += f" ({len(shown) - len(judged) - inapplicable} not judged)"
    if hidden:
        text += (
            f"; besides, {len(hidden)} automatic check{'s' if len(hidden) != 1 else ''} (every run trains to "
            f"the end with a finite loss) passed"
        )
    return text


def summary(record: dict[str, Any], path: str = "") -> str:
    """Worded verdict table of one record plus a closing line counting the rows it shows."""
    verdicts = evaluate_record(record, path)
    table = format_table(verdict_rows(verdicts), WORD_COLUMNS)
    return f"{table}\n\n{record['example']} on {verdicts[0].hardware if verdicts else '?'}: {count_line(verdicts)}"


class VerdictTable:
    """The worded verdict table of one record, for a gallery page (HTML) and a terminal (text).

    sphinx-gallery renders the object a cell ends with through ``_repr_html_`` (``capture_repr`` in
    ``conf.py``); a terminal, a notebook's text view and ``print()`` get :func:`summary`'s table. Columns:
    result, check, measured (with its unit), allowed (the tolerance, linked to its definition on the
    verification page when ``tolerance_href`` is given); the caption is :func:`count_line`.

    Attributes:
        record: the record as :func:`mpguide.verify.run.runner.run_example` returned it.
        verdicts: the record's verdicts (:func:`mpguide.verify.claims.evaluate_record`).
        tolerance_href: URL of the verification page, relative to the page showing the table.
    """

    def __init__(self, record: dict[str, Any], tolerance_href: str | None = "../verification.html") -> None:
        self.record = record
        self.verdicts = evaluate_record(record)
        self.tolerance_href = tolerance_href

    def caption(self) -> str:
        """``"<example> on <hardware>: <count line>"``."""
        hardware = self.verdicts[0].hardware if self.verdicts else "?"
        return f"{self.record['example']} on {hardware}: {count_line(self.verdicts)}"

    def __str__(self) -> str:
        return f"{format_table(verdict_rows(self.verdicts), WORD_COLUMNS)}\n\n{self.caption()}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        rows = verdict_rows(self.verdicts)  # plain text: every cell is escaped, then the tolerance is linked
        shown = [v for v in self.verdicts if v.kind not in ("finite", "completes") or not v.passed]
        head = "".join(f"<th>{html.escape(c)}</th>" for c in WORD_COLUMNS)
        body = []
        for row, v in zip(rows, shown):
            failed = row["verdict"] not in ("pass", "not judged", "not applicable")
            cells = [html.escape(row[c]) for c in WORD_COLUMNS]
            if self.tolerance_href and v.tolerance and v.judged:
                plain = html.escape(f" ({v.tolerance})")
                cells[3] = cells[3].replace(plain, _tolerance_name(v, html.escape(self.tolerance_href)), 1)
            body.append(
                f'<tr class="{"mpguide-fail" if failed else "mpguide-row"}">'
                + "".join(f"<td>{cell}</td>" for cell in cells)
                + "</tr>"
            )
        return (
            '<div class="mpguide-verdicts"><table>'
            f"<caption>{html.escape(self.caption())}</caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
        )


#: Set by the site's ``conf.py``: the examples run inside sphinx-gallery, which renders a cell's last expression.
GALLERY_ENV = "MPGUIDE_IN_GALLERY"


def _shows_last_expression() -> bool:
    """Whether the cell's last expression is rendered for the reader: sphinx-gallery or a Jupyter kernel."""
    import os
    import sys

    if os.environ.get(GALLERY_ENV):
        return True
    ipython = sys.modules.get("IPython")
    return bool(ipython and getattr(ipython, "get_ipython", lambda: None)())


def verdicts(record: dict[str, Any]) -> VerdictTable:
    """The verdict table an example ends with (:class:`VerdictTable`): rendered as HTML where the cell's last
    expression is shown (the gallery page, a notebook), printed as text when the script runs with ``python``."""
    table = VerdictTable(record)
    if not _shows_last_expression():
        print(table)
    return table


def expected_error(record: dict[str, Any], run_id: str) -> str:
    """The captured error of run ``run_id``, introduced as what it is: the expected error a claim checks.

    For an example's terminal output: a bare traceback in the middle of a run's output reads like a
    crash; this text says which run raised it, that it was caught, and that it is the point.

    Raises:
        KeyError: ``run_id`` is not in the record, or that run raised nothing.
    """
    run = next((r for r in record["runs"] if r["id"] == run_id), None)
    if run is None or not run.get("error"):
        raise KeyError(f"{record.get('example')}: run {run_id!r} has no captured error")
    error = run["error"]
    body = short_paths(error.get("traceback") or f"{error['type']}: {error['message']}").rstrip()
    return (
        f"Expected error, captured from run {run_id!r} (the run stopped here on purpose; training went on "
        f"with the next run):\n" + "\n".join("    " + line for line in body.splitlines())
    )
