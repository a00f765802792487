"""The page check: cells that must show a figure, a table or a glued value, and real builds that
pass when they do and FAIL when they do not (a tiny MyST-NB project under ``MPLBACKEND=Agg``), plus
the site's own strict build under ``MPLBACKEND=Agg`` (every figure rendered)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from docutils import nodes
from docutils.utils import new_document

from mpguide_build import pagecheck

PAGE_HEAD = """\
---
file_format: mystnb
kernelspec:
  name: python3
  display_name: Python 3
mystnb:
  execution_mode: force
---

# Tiny page

"""


def cell(code: str, tags: str = "") -> str:
    return "```{code-cell} python\n" + (f":tags: [{tags}]\n" if tags else "") + code.strip() + "\n```\n\n"


def write_page(tmp_path: Path, body: str) -> Path:
    (tmp_path / "page.md").write_text(PAGE_HEAD + body)
    return tmp_path / "page.md"


def test_read_cells_finds_expectations_lines_and_glue_keys(tmp_path):
    path = write_page(
        tmp_path,
        cell("import matplotlib.pyplot as plt", "remove-cell")
        + "Loss {glue:text}`loss:.3f`, {glue}`other` and {glue:text}`page2::x:.1f`.\n\n"
        + cell("fig, ax = plt.subplots()\nplt.show()", "remove-input")
        + cell("display(verdict_table('x'))")
        + cell("print(1)", "mpguide-figure, mpguide-table")
        + cell("plt.subplots()", "mpguide-no-check")
        + cell("# plt.show() in a comment only\nx = 1"),
    )
    cells, refs = pagecheck.read_cells(path)
    assert [c.number for c in cells] == [1, 2, 3, 4, 5, 6]
    assert [c.expects() for c in cells] == [[], ["figure"], ["table"], ["figure", "table"], [], []]
    lines = path.read_text().splitlines()
    assert lines[cells[1].line - 1] == "```{code-cell} python"
    assert cells[1].label("page.md") == f"page.md:{cells[1].line}, code cell 2 (`fig, ax = plt.subplots()`)"
    assert [(kind, key) for kind, key, _ in refs] == [("text", "loss"), ("any", "other")]
    assert "{glue:text}`loss:.3f`" in lines[refs[0][2] - 1]


def _doc_with_cell(index: int, output: nodes.Node | None) -> nodes.document:
    doc = new_document("page")
    container = nodes.container(nb_element="cell_code", cell_index=index)
    out = nodes.container(nb_element="cell_code_output")
    if output is not None:
        out += output
    container += out
    doc += container
    return doc


def test_notebook_check_names_the_cell_and_the_fix_for_each_missing_element():
    figure_cell = pagecheck.Cell(index=2, number=1, line=12, source="fig, ax = plt.subplots()\nplt.show()")
    table_cell = pagecheck.Cell(index=3, number=2, line=20, source="display(verdict_table('x'))")
    empty = _doc_with_cell(2, nodes.literal_block("", "<Figure size 640x480 with 1 Axes>"))
    problems = pagecheck.check_notebook_page(
        "docs/p.md", empty, [figure_cell, table_cell], [("text", "gap", 30), ("text", "loss", 31)], {"loss"}
    )
    assert problems[0].startswith("docs/p.md:12, code cell 1 (`fig, ax = plt.subplots()`) should show a figure")
    assert "%matplotlib inline" in problems[0]
    assert problems[1].startswith("docs/p.md:20, code cell 2 (`display(verdict_table('x'))`) should show a table")
    assert "docs/p.md:30: {glue:text} names key 'gap', which no cell of the page glued" in problems[2]
    assert "1 of 1 {glue:text} values rendered nothing" in problems[3]
    assert len(problems) == 4

    shown = _doc_with_cell(2, nodes.image(uri="x.png"))
    shown += nodes.inline("0.1", "0.1", classes=["pasted-text"])
    refs = [("text", "loss", 31)]
    assert pagecheck.check_notebook_page("docs/p.md", shown, [figure_cell], refs, {"loss"}) == []


def test_gallery_check_wants_an_image_when_the_example_draws(tmp_path):
    script = tmp_path / "plot_x.py"
    script.write_text("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nplt.show()\n")
    doc = new_document("auto_examples/plot_x")
    (problem,) = pagecheck.check_gallery_page("docs/auto_examples/plot_x.rst", script, doc)
    assert "plot_x.py draws figures but its gallery page shows no image" in problem
    doc += nodes.image(uri="sphx_glr_plot_x_001.png")
    assert pagecheck.check_gallery_page("docs/auto_examples/plot_x.rst", script, doc) == []
    script.write_text("print('no figure here')\n")
    assert pagecheck.check_gallery_page("docs/auto_examples/plot_x.rst", script, new_document("x")) == []


TINY_CONF = """\
extensions = ["myst_nb", "mpguide_build.sphinx_ext"]
exclude_patterns = ["_build", "jupyter_execute"]
mpguide_gate = False  # no examples or records in this project: only the page check acts
mpguide_results_dir = {results!r}
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_render_markdown_format = "myst"  # Markdown outputs with tables, as the site renders them
"""

FIGURE_BODY = "fig, ax = plt.subplots(figsize=(2, 2))\nax.plot([1, 2, 3])\nplt.show()"


def tiny_build(tmp_path: Path, body: str, strict: bool = True) -> subprocess.CompletedProcess:
    """Build a one-page MyST-NB project with mpguide_build.sphinx_ext under MPLBACKEND=Agg."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(TINY_CONF.format(results=str(tmp_path / "results")))
    (src / "index.md").write_text(PAGE_HEAD + body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPGUIDE_")}
    env.update(
        MPLBACKEND="Agg",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "docs" / "_ext"), env.get("PYTHONPATH", "")]),
    )
    cmd = [
        sys.executable,
        "-m",
        "sphinx",
        "-b",
        "html",
        str(src),
        str(tmp_path / "html"),
        "-d",
        str(tmp_path / "doctrees"),
    ] + (["-W", "--keep-going"] if strict else [])
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_tiny_build_under_agg_shows_the_figure_with_the_inline_backend(tmp_path):
    body = (
        cell(
            "%matplotlib inline\nimport matplotlib.pyplot as plt\nfrom myst_nb import glue\n"
            "from IPython.display import Markdown, display\nglue('loss', 0.25, display=False)",
            "remove-cell",
        )
        + "Loss {glue:text}`loss:.2f`.\n\n"
        + cell(FIGURE_BODY, "remove-input")
        + cell("display(Markdown('| a | b |\\n|---|---|\\n| 1 | 2 |'))", "remove-input, mpguide-table")
    )
    proc = tiny_build(tmp_path, body)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "[mpguide] page check: every figure, table and glued value is shown" in proc.stdout
    html = (tmp_path / "html" / "index.html").read_text()
    assert html.count("<img") == 1 and "<table" in html and "0.25" in html


@pytest.mark.slow
def test_tiny_build_fails_naming_the_cell_without_figure_the_table_and_the_glue_key(tmp_path):
    """Under MPLBACKEND=Agg, `plt.show()` without the inline backend shows nothing: the build must fail.

    Built without -W so that the page check, not MyST-NB's glue warning, is what fails the build.
    """
    body = (
        cell("import matplotlib.pyplot as plt\nfrom myst_nb import glue", "remove-cell")
        + "Gap {glue:text}`gap:.2f`.\n\n"
        + cell(FIGURE_BODY, "remove-input")
        + cell("print('no table here')", "mpguide-table")
    )
    proc = tiny_build(tmp_path, body, strict=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "[mpguide] page check: 3 page element(s) missing" in out, out[-3000:]
    assert re.search(
        r"index\.md:\d+, code cell 2 \(`fig, ax = plt.subplots\(figsize=\(2, 2\)\)`\) "
        r"should show a figure but its output has no image; fix: .*%matplotlib inline",
        out,
    )
    assert re.search(r"index\.md:\d+, code cell 3 \(`print\('no table here'\)`\) should show a table", out)
    assert re.search(r"index\.md:\d+: \{glue:text\} names key 'gap', which no cell of the page glued", out)


@pytest.mark.build
def test_site_build_under_agg_renders_every_figure(built_site):
    """The shared strict build of the site (conftest runs it with MPLBACKEND=Agg) shows every figure."""
    out, proc = built_site
    assert "[mpguide] page check: every figure, table and glued value is shown" in proc.stdout
    for page, source in [
        ("model/manual_optimization", ROOT / "docs/model/manual_optimization.md"),
        ("index", ROOT / "docs/index.md"),
    ]:
        cells, _ = pagecheck.read_cells(source)
        # figure cells, and the gallery figures a page reuses with a {figure} directive
        figures = sum("figure" in c.expects() for c in cells) + source.read_text().count("```{figure}")
        html = (out / "html" / f"{page}.html").read_text()
        images = html.count('src="../_images/' if "/" in page else 'src="_images/')  # alt text is prose now
        assert figures >= 1 and images >= figures, f"{page}: {figures} figure cells, {images} images"
    for script in sorted((ROOT / "examples").glob("plot_*.py")):
        html = (out / "html" / "auto_examples" / f"{script.stem}.html").read_text()
        assert "sphx-glr-single-img" in html or "sphx-glr-multi-img" in html, script.name
