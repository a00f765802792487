"""What the pages show from the matrix: the table of the guide (:func:`~mpguide_build.matrix_page.render_table`)
with its legend, and the sentences of a pitfall section (:func:`~mpguide_build.matrix_page.applies_sentence`:
"applies to Lightning X to Y", the unreleased column, the older torch releases, the autocast-cache bug)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from typing import Any

from .matrix_outcomes import (
    CANNOT_RUN,
    CELL_WORDS,
    CPU_ARTIFACT,
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    NOT_JUDGED,
    NOT_RERUN,
    NOT_RUN,
    OUTCOME_MEANING,
    OUTCOMES,
    PLUGIN_REFUSES,
    cell,
    missing_api,
    outcome,
    rows,
)
from .matrix_summary import MatrixError, column_heading, column_label, column_order, is_unreleased, version_key


def _anchor(version: str, example: str, cid: str) -> str:
    return "mx-" + re.sub(r"[^a-z0-9]+", "-", f"{version} {example} {cid}".lower()).strip("-")


def _words(summary: dict[str, Any], example: str, cid: str) -> str | None:
    """The stored worded check of one cell (``words`` of the claim), prefixed with its release and example."""
    entry = summary["examples"].get(example) or {}
    claim = next((c for c in entry.get("claims", []) if c["id"] == cid), {})
    return f"{example}, {claim['title']}: {claim['words']}" if claim.get("words") else None


def render_table(summaries: Sequence[dict[str, Any]], examples: Iterable[str] | None = None) -> str:
    """The matrix as MyST Markdown: per example a table with one row per claim and one column per
    release, then every message.

    Each cell reads one outcome of :data:`~mpguide_build.matrix_outcomes.OUTCOMES`
    (:func:`~mpguide_build.matrix_outcomes.outcome`), explained in a legend above the tables, and links to
    its message below the tables (an HTML anchor, so no Sphinx reference can dangle). The messages sit
    in one collapsed ``<details>`` block per release (a browser opens it when a link points inside),
    the non-passing ones first; identical messages of one release are listed once.

    Args:
        summaries: from :func:`~mpguide_build.matrix_summary.load_matrix`.
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
            if word in (HOLDS, DOES_NOT_HOLD):  # the claim was judged: show it in words where stored
                message = _words(summary, example, cid) or message
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

    A release counts as :data:`~mpguide_build.matrix_outcomes.HOLDS` when every claim holds there; otherwise
    it takes the outcome of its first claim that does not hold, in the order of
    :data:`~mpguide_build.matrix_outcomes.OUTCOMES` read from the most telling: a real difference
    (:data:`~mpguide_build.matrix_outcomes.DOES_NOT_HOLD`) before the reasons nothing could be learnt
    (cannot run, plugin refuses, CPU-only artifact). A claim not applicable on a release (declared ``only_if`` a
    measured condition that release did not meet) is left out there, unless every claim is.
    """
    rank = {
        DOES_NOT_HOLD: 0,
        CANNOT_RUN: 1,
        PLUGIN_REFUSES: 2,
        CPU_ARTIFACT: 3,
        INCONCLUSIVE: 4,
        NOT_JUDGED: 5,
        NOT_RUN: 6,
        NOT_RERUN: 7,
        NOT_APPLICABLE: 8,
    }
    out: dict[str, list[str]] = {}
    for s in sorted(summaries, key=lambda s: version_key(s["lightning"])):
        found = [outcome(s, ex, cid)[0] for ex, cid in claims]
        if set(found) != {NOT_APPLICABLE}:  # a claim declared for other releases says nothing about this one
            found = [o for o in found if o != NOT_APPLICABLE]
        other = sorted((o for o in found if o != HOLDS), key=rank.get)
        out.setdefault(other[0] if other else HOLDS, []).append(s["lightning"])
    return out


def _releases(versions: Sequence[str]) -> str:
    return versions[0] if len(versions) == 1 else ", ".join(versions[:-1]) + " and " + versions[-1]


def _require_claims(
    summaries: Sequence[dict[str, Any]], claims: Sequence[tuple[str, str]], who: str, kind: str
) -> None:
    """Refuse an empty ``claims`` or one no summary has (:class:`MatrixError` naming ``who`` and a few known ids)."""
    if not claims:
        raise MatrixError(f"{who} needs at least one (example, claim id)")
    known = {(ex, cid) for ex, cid, _ in rows(summaries)}
    unknown = [c for c in claims if tuple(c) not in known]
    if unknown:
        raise MatrixError(f"no {kind} of the matrix has claim(s) {unknown}; known ids look like {sorted(known)[:3]}")


def applies_sentence(
    summaries: Sequence[dict[str, Any]], claims: Sequence[tuple[str, str]], differs: str = "the behaviour differs there"
) -> str:
    """The "Lightning releases" line of a guide section, drawn from the matrix, in words that cannot mislead.

    Args:
        summaries: from :func:`~mpguide_build.matrix_summary.load_matrix`.
        claims: the ``(example, claim id)`` pairs the section rests on.
        differs: what is different on a release where the claims do not hold, after "Does not hold on
            <releases>: " (the section knows why, for example "Lightning's own autocast caches casts there").

    Returns:
        One sentence per outcome of :func:`release_outcomes`, for example "Holds on Lightning 2.4.0 and
        2.6.6." followed by "Untested on 2.2.5 and 2.3.3 ..." for a CPU-only artifact; a release where the
        code cannot run names the missing API.

    Raises:
        MatrixError: ``claims`` is empty or names a claim no summary has.
    """
    _require_claims(summaries, claims, "applies_sentence", "release")
    every = summaries
    summaries = [s for s in summaries if not is_unreleased(s)]
    groups = release_outcomes(summaries, claims)
    ordered = sorted(summaries, key=column_order)
    parts = []
    if HOLDS in groups:
        parts.append(
            f"Holds on Lightning {_releases(groups[HOLDS])}" + (" (every release tested)." if len(groups) == 1 else ".")
        )
    elif set(groups) == {NOT_RERUN}:
        pass  # the "Not re-run on ..." sentence below is all there is to say
    else:
        parts.append(
            f"Holds on none of the Lightning releases tested ({_releases([s['lightning'] for s in ordered])})."
        )
    if DOES_NOT_HOLD in groups:
        parts.append(f"Does not hold on {_releases(groups[DOES_NOT_HOLD])}: {differs}.")
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
        not_installed = all(
            s["status"] != "ran" for s in ordered if s["lightning"] in groups[CANNOT_RUN]
        )  # the release itself could not be installed or imported
        why = (
            f"`{'`, `'.join(apis)}` {'is' if len(apis) == 1 else 'are'} missing"
            if apis
            else "it could not be installed"
            if not_installed
            else "it stopped before its checks; the releases page has the message"
        )
        parts.append(f"The example cannot run on {_releases(groups[CANNOT_RUN])} ({why}).")
    if PLUGIN_REFUSES in groups:
        parts.append(f"ManualMixedPrecision refuses {_releases(groups[PLUGIN_REFUSES])} (it supports Lightning 2.6.x).")
    if CPU_ARTIFACT in groups:
        parts.append(f"Untested on {_releases(groups[CPU_ARTIFACT])} (their CPU GradScaler is disabled).")
    if NOT_JUDGED in groups:
        parts.append(f"Not judged on {_releases(groups[NOT_JUDGED])}.")
    if NOT_APPLICABLE in groups:
        parts.append(
            f"Not applicable on {_releases(groups[NOT_APPLICABLE])} (declared only where a measured condition "
            "holds, which those releases' records did not meet)."
        )
    if INCONCLUSIVE in groups:
        parts.append(f"Inconclusive on {_releases(groups[INCONCLUSIVE])} (the timing rounds could not decide).")
    if NOT_RERUN in groups:
        parts.append(
            f"Not re-run on Lightning {_releases(groups[NOT_RERUN])} since the code changed (the releases page "
            "says since when)."
        )
    text = " ".join(parts)
    return text + unreleased_clause(every, claims, differs, said=differs in text)


def unreleased_clause(
    summaries: Sequence[dict[str, Any]],
    claims: Sequence[tuple[str, str]],
    differs: str = "the behaviour differs there",
    said: bool = False,
) -> str:
    """What the unreleased column says about ``claims`` when it differs from the newest release.

    Returns:
        ``""`` when there is no unreleased column or its cells equal the newest release's; else e.g.
        ``" On Lightning's unreleased master branch (commit 7f0c3436cd, 2026-07-20) it does not hold:
        <differs>."`` (``"... it does not hold either, for the same reason."`` when ``said``: the sentence
        before already gave ``differs`` for a release; outcome classes in parentheses instead when it does not
        hold for another reason) or ``"... it holds."`` (with a leading space, to append to a sentence).
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
    classes = {outcome(branch[-1], ex, cid)[0] for ex, cid in claims} - {HOLDS}
    if NOT_RERUN in classes:
        return where + " it is not re-run since the code changed."
    if classes == {DOES_NOT_HOLD}:
        return where + (" it does not hold either, for the same reason." if said else f" it does not hold: {differs}.")
    return where + f" it does not hold ({', '.join(sorted(classes))})."


def torch_sentence(summaries: Sequence[dict[str, Any]], claims: Sequence[tuple[str, str]]) -> str:
    """Which torch releases ``claims`` hold on, from the older-torch columns plus the site's column of
    the same Lightning release.

    Args:
        summaries: :func:`~mpguide_build.matrix_summary.load_torch_matrix` plus, optionally, the
            :data:`~mpguide_build.matrix_summary.TORCH_LIGHTNING` column of
            :func:`~mpguide_build.matrix_summary.load_matrix` (its torch is named by its ``torch`` field).
        claims: ``(example, claim id)`` pairs; they hold on a torch when all of them pass.

    Returns:
        e.g. ``"With Lightning 2.6.6 this holds on torch 2.11.0+cu130, 2.13.0+cpu; not on torch
        2.10.0+cu128 (fail)."``

    Raises:
        MatrixError: ``claims`` is empty or names a claim no summary has.
    """
    _require_claims(summaries, claims, "torch_sentence", "column")
    ordered = sorted(summaries, key=lambda s: version_key(str(s.get("torch"))))
    ok, bad, stale = [], [], []
    for s in ordered:
        words = {cell(s, ex, cid)[0] for ex, cid in claims}
        if words == {"pass"}:
            ok.append(str(s.get("torch")))
        elif "not re-run" in words:
            stale.append(str(s.get("torch")))
        elif words != {"not run"}:
            bad.append(f"{s.get('torch')} ({' / '.join(sorted(words - {'pass'}))})")
    lightning_versions = ", ".join(sorted({s["lightning"] for s in ordered}))
    held = f"this holds on torch {', '.join(ok)}" if ok else "this holds on none of the torch releases tested"
    out = f"With Lightning {lightning_versions} {held}" + (f"; not on torch {', '.join(bad)}" if bad else "")
    return out + (f"; not re-run on torch {', '.join(stale)} since the code changed." if stale else ".")


def cache_bug_sentence(summaries: Sequence[dict[str, Any]]) -> str:
    """Which torch releases lose a weight's gradient in the minimal autocast-cache reproduction
    (:func:`~mpguide_build.matrix.probe_autocast_cache`), from every summary that ran it.

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


def stale_note(summaries: Sequence[dict[str, Any]]) -> str:
    """A warning for the hand-written lines above the tables when some cells are stale, else ``""``.

    Prose such as "every section" was written from the matrix as it last ran; a stale cell
    (:func:`~mpguide_build.matrix_summary.cell_staleness`) must not be read as still holding, so the page
    says how many cells are not re-run and in which columns (the tables mark each one *not re-run*).
    """
    from .matrix_summary import stale_cells

    cells = stale = 0
    columns = []
    for summary in sorted(summaries, key=column_order):
        if summary.get("status") != "ran":
            continue
        found = stale_cells(summary)
        cells += len(summary["examples"]) + sum(name not in summary["examples"] for name in found)
        stale += len(found)
        if found:
            columns.append(column_label(summary))
    if not stale:
        return ""
    return (
        f"**{stale} of {cells} cells are not re-run since the code changed** (Lightning {_releases(columns)}): "
        "the lines above describe the matrix as it last ran, not today's code; the tables below show each such "
        "cell as *not re-run*, with the date and commit of its last run."
    )
