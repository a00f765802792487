"""Gallery pages: the code and output of each ``Evidence...`` cell fold into a ``<details>`` block.

An example is a lesson first (``mpguide_build.lessons``); its verification stays on its page, one click away.
For every section of a gallery page whose title starts with ``Evidence`` (the cells that hold the probes, the
``RUNS``/``CLAIMS`` tables, ``run_example`` and the verdict table), everything after the section's prose is
wrapped in ``<details class="mpguide-evidence">``. The summary says what the block holds: for the verdict
table, the table's own count line (``"... 11 of 11 checks in the table hold"``), and the block is open when a
check did not hold; otherwise the number of code lines. The HTML source is the same with or without the fold
(a reader without a browser, a search engine and the link checker see every line).
"""

from __future__ import annotations

import html
import re
from typing import Any

from docutils import nodes
from sphinx import addnodes

#: A section title that marks a verification cell (as ``mpguide_build.lessons`` counts it).
EVIDENCE_PREFIX = "Evidence"
_CAPTION = re.compile(r"<caption>(.*?)</caption>", re.S)


def _summary(blocks: list[nodes.Node]) -> tuple[str, bool]:
    """``(summary text, open)`` of the folded ``blocks``."""
    for block in blocks:
        for raw in block.findall(nodes.raw) if not isinstance(block, nodes.raw) else [block]:
            text = raw.astext()
            caption = _CAPTION.search(text)
            if caption and "mpguide-verdicts" in text:
                return f"Verdicts: {html.unescape(caption.group(1))}", "mpguide-fail" in text
    code = [  # sphinx-gallery's code blocks (its own node class once resolved), not their printed output
        b
        for b in blocks
        if not isinstance(b, (nodes.comment, nodes.raw)) and "sphx-glr-script-out" not in b.get("classes", [])
    ]
    lines = sum(len(b.astext().splitlines()) for b in code)
    return f"Show the code ({lines} lines: probes, runs, claims) and its output", False


def fold(app: Any, doctree: nodes.document, docname: str) -> None:
    """``doctree-resolved`` handler: fold the evidence cells of the gallery pages (HTML builders only)."""
    if app.builder.format != "html" or not docname.startswith("auto_examples/plot_"):
        return
    for section in list(doctree.findall(nodes.section)):
        if not section.children or not isinstance(section[0], nodes.title):
            continue
        if not section[0].astext().startswith(EVIDENCE_PREFIX):
            continue
        children = list(section.children)
        start = next(
            (i for i, child in enumerate(children[1:], 1) if not isinstance(child, (nodes.paragraph, nodes.target))),
            None,
        )
        if start is None:
            continue
        blocks = []
        for child in children[start:]:  # the cell's code and output: up to the page's footer or a subsection
            if isinstance(child, (nodes.section, nodes.paragraph, nodes.target, addnodes.only)):
                break
            blocks.append(child)
        if not blocks:
            continue
        text, is_open = _summary(blocks)
        opening = (
            f'<details class="mpguide-evidence"{" open" if is_open else ""}><summary>{html.escape(text)}</summary>'
        )
        end = start + len(blocks)
        section.insert(end, nodes.raw("", "</details>", format="html"))
        section.insert(start, nodes.raw("", opening, format="html"))
