"""mpguide_build.gallery_format: reader cells at 46 columns, Evidence at 118, the code unchanged, the check fails."""

from __future__ import annotations

import ast

import pytest

from mpguide_build import gallery_format

EXAMPLE = '''"""
Title
=====

Header.
"""

# %%
# The call to copy
# ----------------
# Prose stays as written, however long its lines are: it is rendered as text on the page, not shown as code.

import torch


def helper(alpha, beta):
    return torch.nn.functional.mse_loss(torch.zeros(3) * alpha, torch.ones(3) * beta, reduction="sum")  TRAILING


message = f"the loss of this step is {helper(1, 2):g}, and this sentence is long enough to need two lines"

# %%
# Evidence: the runs
# ------------------
# The folded cell.

RUNS = [("run-a", "recipe", "32-true", {"label": "a label"}), ("run-b", "recipe", "16-mixed", {"label": "b"})]
'''.replace("TRAILING", "# a trailing comment that makes the line long")


def shown_lines(text, evidence):
    cells = gallery_format.split(text)
    return [line for cell in cells[1:] if cell.evidence == evidence for line in cell.text.splitlines()[4:]]


def test_reader_cells_fit_46_columns_evidence_118_and_the_tree_is_the_same(tmp_path):
    path = tmp_path / "plot_99_example.py"
    path.write_text(EXAMPLE)
    assert gallery_format.main([str(path)]) == 0
    text = path.read_text()
    assert ast.dump(ast.parse(text)) == ast.dump(ast.parse(EXAMPLE))
    assert max(len(line) for line in shown_lines(text, evidence=False)) <= gallery_format.READER_WIDTH
    evidence = shown_lines(text, evidence=True)
    assert max(len(line) for line in evidence) <= gallery_format.EVIDENCE_WIDTH
    assert any(len(line) > gallery_format.READER_WIDTH for line in evidence)  # formatted at 118, not 46
    assert "# a trailing comment that makes" in text.split("def helper")[1].split("return")[0]  # moved above
    assert "however long its lines are: it is rendered as text on the page, not shown as code." in text
    assert gallery_format.main(["--check", str(path)]) == 0  # idempotent
    assert gallery_format.format_source(text, gallery_format.Path(".")) == text


def test_check_fails_on_an_unformatted_file(tmp_path, capsys):
    path = tmp_path / "plot_99_example.py"
    path.write_text(EXAMPLE)
    assert gallery_format.main(["--check", str(path)]) == 1
    assert "plot_99_example.py: not formatted for the page" in capsys.readouterr().out
    assert path.read_text() == EXAMPLE  # --check changes nothing


def test_check_fails_on_one_line_too_long(tmp_path, capsys):
    """A word that no tool can cut (a URL) leaves one line longer than the cell: the check names it."""
    url = "https://example.org/" + "a" * 60
    path = tmp_path / "plot_99_example.py"
    path.write_text(f'"""\nT\n=\n"""\n\n# %%\n# Cell\n# ----\n\nURL = "{url}"\n')
    assert gallery_format.main([str(path)]) == 0
    assert gallery_format.main(["--check", str(path)]) == 0  # formatted: the plain check passes
    capsys.readouterr()
    assert gallery_format.main(["--check", "--max-line", "46", str(path)]) == 1
    assert "characters in a reader cell of 46 columns" in capsys.readouterr().out


def test_a_missing_file_and_a_syntax_error_are_one_line_each(tmp_path, capsys):
    broken = tmp_path / "plot_98_broken.py"
    broken.write_text("def f(:\n")
    assert gallery_format.main(["--check", str(tmp_path / "nope.py"), str(broken)]) == 1
    err = capsys.readouterr().err
    assert "nope.py: no such file" in err
    assert "plot_98_broken.py:" in err and "Traceback" not in err


@pytest.mark.parametrize("code", ['x = f"{a} and {b} " "tail"', 'y = "no spaces' + "z" * 80 + '"'])
def test_strings_are_cut_only_where_the_tree_stays_the_same(code):
    out = gallery_format.split_strings(code + "\n", 46)
    assert ast.dump(ast.parse(out)) == ast.dump(ast.parse(code))


def test_fmt_off_tables_stay_unless_asked(tmp_path):
    row = (
        '    ("run-a", "a recipe name", "32-true", {"label": "a label long enough to pass the width", '
        '"note": "and a note that makes the row wider than an Evidence cell"}),'
    )
    assert len(row) > gallery_format.EVIDENCE_WIDTH
    table = f'"""\nT\n=\n"""\n\n# %%\n# Evidence: runs\n# --------------\n\n# fmt: off\nRUNS = [\n{row}\n]\n# fmt: on\n'
    path = tmp_path / "plot_97_table.py"
    path.write_text(table)
    assert gallery_format.main([str(path)]) == 0
    assert row in path.read_text()  # the authored one-row-per-line table stays
    assert gallery_format.main(["--tables", str(path)]) == 0
    text = path.read_text()
    assert "fmt: off" not in text and row not in text
    assert max(len(line) for line in text.splitlines()) <= gallery_format.EVIDENCE_WIDTH
    assert ast.dump(ast.parse(text)) == ast.dump(ast.parse(table))


def test_a_long_docstring_is_rewrapped_and_the_code_digest_stays(tmp_path):
    """A reader cell's one-line docstring over 46 columns is rewrapped; the code digest (which leaves
    docstrings out) is the same, and a change of a docstring's words is still refused."""
    from mpguide.verify.records.codedigest import code_digest

    source = EXAMPLE.replace(
        "def helper(alpha, beta):\n",
        'def helper(alpha, beta):\n    """The mean squared error of two constant tensors, summed over '
        'the three entries."""\n',
    )
    path = tmp_path / "plot_98_docstring.py"
    path.write_text(source)
    assert gallery_format.main([str(path)]) == 0
    text = path.read_text()
    assert max(len(line) for line in shown_lines(text, evidence=False)) <= gallery_format.READER_WIDTH
    assert "summed over the three" in text and code_digest(text) == code_digest(source)
    assert gallery_format.same_tree(source, text, "x")
    assert not gallery_format.same_tree(source, source.replace("three entries", "four entries"), "x")


def test_the_page_header_keeps_its_layout(tmp_path):
    """The module docstring is reStructuredText (a title and its underline): never rewrapped."""
    header = '"""\nA title that is long enough to pass the reader width\n' + "=" * 52 + "\n\nProse.\n" + '"""\n'
    path = tmp_path / "plot_96_header.py"
    path.write_text(header + "\n\n# %%\n# Cell\n# ----\n\nx = 1\n")
    assert gallery_format.main([str(path)]) == 0
    assert path.read_text().startswith(header)
