"""Gallery pages fold their Evidence cells (mpguide_build.evidence): code and output go into a <details>, the
prose and the page's footer stay out, a verdict table's count line is the summary, a failing check opens it."""

from __future__ import annotations

from types import SimpleNamespace

from docutils import nodes
from docutils.frontend import get_default_settings
from docutils.parsers.rst import Parser
from docutils.utils import new_document

from mpguide_build import evidence

APP = SimpleNamespace(builder=SimpleNamespace(format="html"))


def _section(title: str, *children: nodes.Node) -> nodes.section:
    section = nodes.section()
    section += nodes.title(text=title)
    for child in children:
        section += child
    return section


def _page(*sections: nodes.section) -> nodes.document:
    doc = new_document("page", get_default_settings(Parser))
    for section in sections:
        doc += section
    return doc


def _table(failing: bool) -> nodes.raw:
    row = '<tr class="mpguide-fail">' if failing else '<tr class="mpguide-row">'
    html = (
        f'<div class="mpguide-verdicts"><table><caption>plot_99 on CPU: 1 of 2 checks hold</caption>{row}</table></div>'
    )
    return nodes.raw("", html, format="html")


def _raws(section: nodes.section) -> list[str]:
    return [c.astext() for c in section.children if isinstance(c, nodes.raw)]


def test_the_runs_cell_folds_its_code_and_output_but_not_its_prose():
    runs = _section(
        "Evidence: the runs and their claims",
        nodes.paragraph(text="What is measured."),
        nodes.literal_block(text="RUNS = [\n  ('a', 'b'),\n]"),
        nodes.literal_block(text="results saved", classes=["sphx-glr-script-out"]),
    )
    lesson = _section("Why", nodes.literal_block(text="trainer.fit(model)"))
    evidence.fold(APP, _page(runs, lesson), "auto_examples/plot_99_probe")
    kinds = [type(c).__name__ for c in runs.children]
    assert kinds == ["title", "paragraph", "raw", "literal_block", "literal_block", "raw"], kinds
    opening, closing = _raws(runs)
    assert (
        opening.startswith('<details class="mpguide-evidence"><summary>Show the code (3 lines')
        and closing == "</details>"
    )
    assert not _raws(lesson)  # a lesson cell is never folded


def test_the_verdicts_fold_under_their_count_line_and_open_on_a_failure():
    for failing in (False, True):
        footer = nodes.paragraph(text="Download Python source code")
        verdicts = _section(
            "Evidence: the verdicts", nodes.literal_block(text="report.verdicts(record)"), _table(failing), footer
        )
        evidence.fold(APP, _page(verdicts), "auto_examples/plot_99_probe")
        opening = _raws(verdicts)[0]
        assert "<summary>Verdicts: plot_99 on CPU: 1 of 2 checks hold</summary>" in opening
        assert (" open>" in opening) is failing
        assert verdicts.children[-1] is footer and isinstance(verdicts.children[-2], nodes.raw)  # footer stays out


def test_other_pages_and_builders_are_left_alone():
    def page():
        return _page(_section("Evidence: the runs", nodes.literal_block(text="x")))

    for app, name in (
        (APP, "model/manual_optimization"),
        (SimpleNamespace(builder=SimpleNamespace(format="latex")), "auto_examples/plot_99"),
    ):
        doc = page()
        evidence.fold(app, doc, name)
        assert not list(doc.findall(nodes.raw))
