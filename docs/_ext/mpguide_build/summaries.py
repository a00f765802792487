"""One-screen summaries above the long reference tables: this build on the front page, each release's pitfalls.

A reader asks "did this build check my case?" and "does my release have this bug?"; the full tables answer
both, 46 and 61 desktop screens down. These functions write the short answer, from the same data:

* :func:`build_line`: one sentence for the front page (examples, checks that hold, runs, where, when), which
  a phone shows without a table wider than its screen; the per-example table stays on the verification page.
* :func:`release_summary`: per Lightning column of the version matrix, which examples' pitfalls still
  reproduce there and which no longer do. A *pitfall claim* is one that demonstrates a bug (kinds
  ``diverge`` and ``raises``: the bug must reproduce for it to hold). An example whose column is stale
  (:func:`mpguide_build.matrix_summary.staleness` names it, or the library changed) is listed as
  *not re-run*, never as reproducing or fixed; so are cells whose outcome is not "holds" or "does not hold"
  (the code cannot run there, the plugin refuses, a CPU-only artifact).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Claim kinds that demonstrate a pitfall: they hold while the bug reproduces.
PITFALL_KINDS = ("diverge", "raises")


def build_line(prefix: str = "") -> str:
    """One Markdown sentence: how many examples and checks this build judged, and how many hold."""
    from mpguide.verify.claims.declarations import example_names
    from mpguide.verify.claims.verdicts import hardware_label

    from .pages import counted_checks, page_entries

    names = example_names()
    held = judged = runs = 0
    where, dates = set(), set()
    for name in names:
        entry = page_entries(name)[0]
        checks = counted_checks(entry.verdicts)[0]
        held += sum(v.passed for v in checks)
        judged += len(checks)
        runs += len(entry.record["runs"])
        where.add(hardware_label(entry.record["env"]))
        dates.add(entry.record["created"][:10])
    span = min(dates) if len(dates) == 1 else f"{min(dates)} to {max(dates)}"
    return (
        f"**{held} of {judged} checks hold** in {len(names)} examples ({runs} training runs, "
        f"{', '.join(sorted(where))}, {span}). Per example: "
        f'<a href="{prefix}verification.html#verification-build">verification</a>.'
    )


def _short(example: str, prefix: str = "") -> str:
    """``plot_08_autocast_cache`` -> a link ``08`` to its page, titled ``autocast cache`` (a row of a dozen
    examples stays one line)."""
    number, _, words = example.removeprefix("plot_").partition("_")
    return f'<a href="{prefix}auto_examples/{example}.html" title="{words.replace("_", " ")}">{number}</a>'


def _stale_examples(summary: dict[str, Any]) -> set[str]:
    """Examples of ``summary`` whose cells no longer describe today's code, one by one
    (:func:`mpguide_build.matrix_summary.stale_cells`: the example's or the library's code changed, or the
    cell has no keys)."""
    from .matrix_summary import stale_cells

    return set(stale_cells(summary))


def release_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """One row per Lightning column (newest first): examples whose pitfalls reproduce, are fixed, not re-run."""
    from .matrix_outcomes import DOES_NOT_HOLD, HOLDS, NOT_APPLICABLE, outcome
    from .matrix_summary import column_label, column_order, not_rerun_since

    rows = []
    for summary in sorted(summaries, key=column_order, reverse=True):
        stale = _stale_examples(summary)
        reproduce, fixed, other = [], [], []
        stale_listed = 0
        for example in sorted(summary["examples"]):
            claims = [c for c in summary["examples"][example].get("claims", []) if c.get("kind") in PITFALL_KINDS]
            if not claims:
                continue
            if example in stale:
                other.append(_short(example))
                stale_listed += 1
                continue
            classes = {outcome(summary, example, c["id"])[0] for c in claims} - {NOT_APPLICABLE}
            if not classes:  # every pitfall claim of the example is declared for another release
                continue
            if classes == {HOLDS}:
                reproduce.append(_short(example))
            elif DOES_NOT_HOLD in classes and classes <= {HOLDS, DOES_NOT_HOLD}:
                fixed.append(_short(example))
            else:
                other.append(_short(example))
        if (
            other and not reproduce and not fixed and len(other) == stale_listed
        ):  # every example of the column is stale: one phrase, not "none"
            since = not_rerun_since(summary, sorted(stale)[0])
            rows.append(
                {
                    "release": column_label(summary),
                    "pitfalls that reproduce": since,
                    "differs there (a pitfall check does not hold)": since,
                    "not re-run or cannot run": "every example (its code or the library's changed)",
                }
            )
            continue
        rows.append(
            {
                "release": column_label(summary),
                "pitfalls that reproduce": ", ".join(reproduce) or "none",
                "differs there (a pitfall check does not hold)": ", ".join(fixed) or "none",
                "not re-run or cannot run": ", ".join(other) or "none",
            }
        )
    return rows


def release_summary(summaries: Sequence[dict[str, Any]]) -> str:
    """:func:`release_rows` as a Markdown table, with one line on how to read it."""
    from .pages import markdown_table

    rows = release_rows(summaries)
    if not rows:
        return "*No version-matrix column is committed (results/matrix/).*"
    columns = tuple(rows[0])
    names = ", ".join(
        f"{e.removeprefix('plot_')[:2]} {e.removeprefix('plot_')[3:].replace('_', ' ')}"
        for e in sorted({e for summary in summaries for e in summary["examples"]})
    )
    return (
        "Per release, the examples whose pitfalls (the checks that a bug still reproduces) all hold, those "
        "where one no longer reproduces, and those not re-run since their example changed or that cannot "
        "run there. Each cell's reason is in the full table below.\n\n"
        + markdown_table(rows, columns)
        + f"\n\nExamples: {names}."
    )
