"""Page check: fail the build when a rendered page lacks a figure, table or glued number it must show.

A page can execute without error and still show nothing: on a GPU machine with ``MPLBACKEND=Agg`` in
the environment, every cell of the guide ended in ``plt.show()``, which draws nothing under Agg in
the MyST-NB kernel (ipykernel only selects its inline backend when ``MPLBACKEND`` is unset), and
the build passed with a guide without a single curve. This module looks at what the build
*rendered* (the resolved doctree of each page, the same tree the HTML is written from) and
compares it with what the page's source says it must show:

* **MyST-NB pages** that were executed (any ``file_format: mystnb`` page or ``.ipynb``):

  - a code cell that draws with matplotlib (``plt.show()``, ``plt.subplots(``, ``plt.figure(``,
    ``display(fig``) or is tagged ``mpguide-figure`` must have an image among its outputs;
  - a code cell that builds a verdict table (``verdict_table(``, ``markdown_table(``) or is tagged
    ``mpguide-table`` must have a table among its outputs;
  - every key named by a ``{glue...}`` role or directive must have been glued by the page's own
    cells (``myst_nb.glue``), and every ``{glue:text}`` role must have rendered a value.

  Cells tagged ``mpguide-no-check`` are skipped, and so are cells whose output is removed
  (``remove-output``, ``remove-cell``): they promise nothing to the reader.
* **sphinx-gallery example pages**, when the gallery executed (``plot_gallery`` true): an example
  whose script draws with matplotlib must show at least one image.

Every failure names the page source, the cell (number, first source line and line in the file) or
the glue key, what is missing, and the fix. :func:`on_build_finished` raises one
:class:`sphinx.errors.ExtensionError` listing all of them, so the build fails in strict and
non-strict mode alike.

Pages that were not executed (``nb_execution_mode = "off"`` in the preview) and galleries that did
not run (``plot_gallery = 0``) are not checked: they show no outputs by design.

Upstream facts used: MyST-NB 1.4 renders each code cell as a ``container`` node with
``nb_element="cell_code"``, ``cell_index`` and ``cell_metadata`` (``myst_nb/core/render.py``),
stores the executed page's glue keys and execution data in ``env.nb_metadata``
(``myst_nb/sphinx_.py``, ``NbMetadataCollector``) and renders ``{glue:text}`` as an inline node of
class ``pasted-text`` (``myst_nb/ext/glue/roles.py``); sphinx-gallery 0.22 renders example figures
as ``imgsgnode`` nodes (``sphinx_gallery/directives.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docutils import nodes

#: Cell tags (cell metadata ``tags``) that state what a cell must show, or opt a cell out.
FIGURE_TAG = "mpguide-figure"
TABLE_TAG = "mpguide-table"
NO_CHECK_TAG = "mpguide-no-check"

#: Code that makes a cell a figure cell, or a table cell, when it carries no tag.
FIGURE_CODE = re.compile(r"\bplt\.(?:show|subplots|figure)\(|\bdisplay\(\s*fig\b")
TABLE_CODE = re.compile(r"\b(?:verdict_table|markdown_table)\(")

#: Roles ``{glue}`key```, ``{glue:text}`key:fmt```, ``{glue:md}`key:fmt``` and directives ``{glue:figure} key``.
_GLUE_ROLE = re.compile(r"\{glue(?::(any|text|md|math))?\}`([^`]+)`")
_GLUE_DIRECTIVE = re.compile(r"^\s*(?:`{3,}|:{3,})\{glue(?::\w+)?\}\s+(\S+)", re.MULTILINE)
_HIDDEN_OUTPUT_TAGS = {"remove-output", "remove_output", "remove-cell", "remove_cell"}
_FIX_FIGURE = (
    "fix: make the page independent of the matplotlib backend (`%matplotlib inline` in its first "
    "code cell, or end the cell with `display(fig)`), or tag the cell `mpguide-no-check` if it "
    "is not meant to show a figure"
)
_FIX_TABLE = (
    "fix: end the cell with `display(Markdown(...))` of the table (MyST renders Markdown tables), "
    "or tag the cell `mpguide-no-check` if it is not meant to show a table"
)


@dataclass
class Cell:
    """One code cell of a MyST-NB page, as the page check needs it.

    Attributes:
        index: position in the notebook (markdown cells counted too), as MyST-NB's ``cell_index``.
        number: 1-based position among the page's code cells (what a writer counts).
        line: 1-based line of the cell's ``{code-cell}`` directive in the source file (0 if unknown).
        source: the cell's code.
        tags: the cell's metadata tags.
    """

    index: int
    number: int
    line: int
    source: str
    tags: list[str] = field(default_factory=list)

    def expects(self) -> list[str]:
        """What the cell must show: a sublist of ``["figure", "table"]`` (empty for unchecked cells)."""
        if NO_CHECK_TAG in self.tags or _HIDDEN_OUTPUT_TAGS & set(self.tags):
            return []
        code = "\n".join(line for line in self.source.splitlines() if not line.lstrip().startswith("#"))
        wanted = []
        if FIGURE_TAG in self.tags or FIGURE_CODE.search(code):
            wanted.append("figure")
        if TABLE_TAG in self.tags or TABLE_CODE.search(code):
            wanted.append("table")
        return wanted

    def label(self, source_file: str) -> str:
        """``<file>:<line>, code cell <n> (`<first code line>`)`` for messages."""
        first = next(
            (ln.strip() for ln in self.source.splitlines() if ln.strip() and not ln.lstrip().startswith(("#", "%"))), ""
        )
        first = first if len(first) <= 70 else first[:67] + "..."
        where = f"{source_file}:{self.line}" if self.line else source_file
        return f"{where}, code cell {self.number} (`{first}`)"


def read_cells(path: Path) -> tuple[list[Cell], list[tuple[str, str, int]]]:
    """Code cells and glue references of a notebook page (MyST Markdown ``.md`` or ``.ipynb``).

    Returns:
        ``(cells, glue_refs)``; each glue reference is ``(kind, key, line)`` with kind ``"text"``,
        ``"any"``, ``"md"``, ``"math"`` or ``"directive"`` and the 1-based line in the file (0 for
        ``.ipynb``). Cross-page references (``page::key``) are left out: their page checks them.

    Raises:
        OSError: the file cannot be read.
    """
    import nbformat
    from myst_nb.core.read import read_myst_markdown_notebook

    text = Path(path).read_text(encoding="utf-8")
    if Path(path).suffix == ".ipynb":
        nb, starts = nbformat.reads(text, as_version=4), None
    else:
        nb = read_myst_markdown_notebook(text, add_source_map=True, path=path)
        starts = nb.metadata.get("source_map")
    lines = text.splitlines()
    seen: dict[str, int] = {}

    def line_of(snippet: str, after: int) -> int:
        """1-based line of the next occurrence of ``snippet`` at or after line ``after`` (0 if unknown)."""
        start = max(after, seen.get(snippet, 0))
        for number_, content in enumerate(lines[start:], start=start + 1):
            if snippet in content:
                seen[snippet] = number_
                return number_
        return 0

    cells, refs, number = [], [], 0
    for index, cell in enumerate(nb.cells):
        source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
        line = starts[index] if starts else 0  # MyST-NB's source map: 1-based line of a code cell's directive
        if cell.cell_type == "code":
            number += 1
            cells.append(Cell(index, number, line, source, list(cell.metadata.get("tags", []))))
        elif cell.cell_type == "markdown":
            for match in _GLUE_ROLE.finditer(source):
                kind, text_ = match.group(1) or "any", match.group(2)
                if "::" in text_:
                    continue
                key = text_.rsplit(":", 1)[0] if kind in ("text", "md") and ":" in text_ else text_
                refs.append((kind, key, line_of(match.group(0), line) if starts else 0))
            for match in _GLUE_DIRECTIVE.finditer(source):
                if "::" not in match.group(1):
                    found = line_of(match.group(0).strip(), line) if starts else 0
                    refs.append(("directive", match.group(1), found))
    return cells, refs


def _count_images(node: nodes.Node) -> int:
    return sum(1 for n in node.findall(nodes.Element) if isinstance(n, nodes.image) or type(n).__name__ == "imgsgnode")


def check_notebook_page(
    source_file: str, doctree: nodes.document, cells: list[Cell], glue_refs: list[tuple[str, str, int]], glued: set[str]
) -> list[str]:
    """Problems of one executed MyST-NB page (empty list: it shows what it must).

    Args:
        source_file: the page's path as shown in messages (relative to the project).
        doctree: the page's resolved doctree.
        cells: its code cells (:func:`read_cells`).
        glue_refs: its glue references (:func:`read_cells`).
        glued: the keys its cells glued (MyST-NB's ``env.nb_metadata[docname]["glue"]``).

    Returns:
        One message per missing figure, table or glued value, naming the cell or key and the fix.
    """
    rendered: dict[int, nodes.Element] = {}
    for node in doctree.findall(nodes.container):
        if node.get("nb_element") == "cell_code" and node.get("cell_index") is not None:
            rendered[int(node["cell_index"])] = node
    problems = []
    for cell in cells:
        wanted = cell.expects()
        if not wanted:
            continue
        node = rendered.get(cell.index)
        outputs = (
            [n for n in node.findall(nodes.container) if n.get("nb_element") == "cell_code_output"]
            if node is not None
            else []
        )
        if "figure" in wanted and not any(_count_images(out) for out in outputs):
            problems.append(
                f"{cell.label(source_file)} should show a figure but its output has no image; " + _FIX_FIGURE
            )
        if "table" in wanted and not any(any(True for _ in out.findall(nodes.table)) for out in outputs):
            problems.append(f"{cell.label(source_file)} should show a table but its output has none; " + _FIX_TABLE)
    for kind, key, line in glue_refs:
        if key not in glued:
            role = "{glue}" if kind in ("any", "directive") else f"{{glue:{kind}}}"
            problems.append(
                f"{source_file}:{line}: {role} "
                f"names key {key!r}, which no cell of the page glued; fix: add "
                f"`glue({key!r}, value, display=False)` to a cell, or correct the key"
            )
    wanted_text = sum(1 for kind, key, _ in glue_refs if kind == "text" and key in glued)
    shown_text = sum(1 for n in doctree.findall(nodes.inline) if "pasted-text" in n.get("classes", []))
    if shown_text < wanted_text:
        problems.append(
            f"{source_file}: {wanted_text - shown_text} of {wanted_text} {{glue:text}} values "
            "rendered nothing (a format spec that does not fit the glued value; see the glue "
            "warnings above); fix: glue a number for numeric format specs, or change the spec"
        )
    return problems


def check_gallery_page(source_file: str, example: Path, doctree: nodes.document) -> list[str]:
    """Problems of one executed sphinx-gallery example page (empty list: fine).

    An example whose script draws with matplotlib (:data:`~mpguide_build.pagecheck.FIGURE_CODE`) must show at
    least one image; sphinx-gallery's matplotlib scraper collects every open figure after each block.
    """
    code = "\n".join(
        line for line in example.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("#")
    )
    if FIGURE_CODE.search(code) and _count_images(doctree) == 0:
        return [
            f"{source_file}: the example {example.name} draws figures but its gallery page shows no "
            "image; fix: leave the figures open at the end of their block (`plt.show()`, no "
            "`plt.close()`) so sphinx-gallery's matplotlib scraper collects them"
        ]
    return []


def _gallery_examples(app: Any) -> list[tuple[str, Path]]:
    """``(docname, example script)`` of every executed sphinx-gallery example page."""
    conf = getattr(app.config, "sphinx_gallery_conf", None) or {}
    if not conf or not conf.get("plot_gallery") or str(conf.get("plot_gallery")).lower() in ("0", "false"):
        return []
    pattern = re.compile(conf.get("filename_pattern", r"/plot"))
    srcdir = Path(app.srcdir)
    found = []
    examples_dirs = conf.get("examples_dirs") or []
    gallery_dirs = conf.get("gallery_dirs") or []
    for src, dst in zip(
        [examples_dirs] if isinstance(examples_dirs, str) else examples_dirs,
        [gallery_dirs] if isinstance(gallery_dirs, str) else gallery_dirs,
    ):
        src_path, dst_path = Path(app.confdir, src), Path(srcdir, dst)
        for script in sorted(src_path.glob("*.py")):
            if pattern.search(str(script)):
                docname = (dst_path / script.stem).relative_to(srcdir).as_posix()
                found.append((docname, script))
    return found


def check_build(app: Any) -> list[str]:
    """Run the page check over every executed notebook page and gallery example page of a build.

    Returns:
        All problems found (messages as described in the module docstring).
    """
    from myst_nb.sphinx_ import NbMetadataCollector

    env = app.env
    nb_data = NbMetadataCollector.get_doc_data(env)
    root = Path(app.confdir)
    problems: list[str] = []

    def shown(path: Path) -> str:
        try:
            return Path(path).resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            return str(path)

    for docname in sorted(env.found_docs):
        data = nb_data.get(docname, {})
        if not data.get("exec_data"):
            continue  # not a notebook page, or not executed in this build's configuration
        path = Path(env.doc2path(docname))
        cells, refs = read_cells(path)
        # resolved: after MyST-NB picked each output's mime type for this builder
        doctree = env.get_and_resolve_doctree(docname, app.builder)
        problems += check_notebook_page(shown(path), doctree, cells, refs, set(data.get("glue", [])))
    for docname, script in _gallery_examples(app):
        if docname in env.found_docs:
            # the pickled doctree suffices: sphinx-gallery's image nodes are final before post-transforms
            # (resolving costs ~0.2 s a page, most of an unchanged rebuild's page check)
            problems += check_gallery_page(shown(Path(env.doc2path(docname))), script, env.get_doctree(docname))
    return problems


def on_build_finished(app: Any, exception: Exception | None) -> None:
    """Sphinx ``build-finished`` handler: raise if a page lacks what it must show.

    Raises:
        sphinx.errors.ExtensionError: one line per missing figure, table or glued value.
    """
    from sphinx.errors import ExtensionError
    from sphinx.util import logging

    if exception is not None or app.builder.format != "html":
        return
    problems = check_build(app)
    if problems:
        raise ExtensionError(
            f"[mpguide] page check: {len(problems)} page element(s) missing:\n  " + "\n  ".join(problems)
        )
    logging.getLogger(__name__).info("[mpguide] page check: every figure, table and glued value is shown")
