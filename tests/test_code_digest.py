"""The code digest (mpguide.verify.records.codedigest): docstrings and comments are not code; the same digest on
Python 3.11, 3.12 and 3.13; nothing that decides freshness reads docstrings or source text at run time."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpguide.verify import records
from mpguide.verify.claims import declarations
from mpguide.verify.records import codedigest, measures
from mpguide.verify.run import runner

ROOT = Path(__file__).resolve().parents[1]

#: A fixed source that exercises what differs between Python versions (f-strings with nested format specs,
#: match, except*, positional-only and keyword-only arguments, {**d}, walrus, async); its digest is stored
#: below, computed on 3.11.2, 3.12.1 and 3.13.0 alike, so the GPU machine's 3.12 is held to the same value.
FIXED = '''"""Module docstring."""
import os as _os
x: int = 1
y = f"{x!r:>{x}} and {x=} {x:.3f}" "tail" f""
z = {**{"a": 1}, "b": [*range(3)]}
class A:
    """Doc."""
    attr: int = 3
    """Attribute doc."""
    def f(self, a, /, b=2, *args, c: "int" = 3, **kw) -> None:
        """Doc."""
    async def g(self):
        async with self as s:
            await s
        return [i async for i in self]
@staticmethod
def h(n):
    match n:
        case [1, *rest] if rest:
            return rest
        case {"k": v, **others}:
            return others
        case A(attr=3) | None:
            pass
        case _:
            return (lambda q=b"x", *, r=1.5j: q)(n)
    while (m := n) > 0:
        n -= 1
    else:
        del m
    try:
        raise ValueError("a warning text") from None
    except* ValueError as e:
        pass
    finally:
        global G
    return ..., f"{'nested' + f'{n}'}", 0x10, 1_000, u"u", r"\\d", not n, n if n else -n
'''
FIXED_DIGEST = "e35dd7e39dc7468972790526a4f61ed056759e391eacbe62df9f5856052dd4f3"


def test_a_fixed_source_has_its_stored_digest():
    assert codedigest.code_digest(FIXED) == FIXED_DIGEST


def test_other_pythons_on_this_machine_give_the_stored_digest(tmp_path):
    """Every Python 3.11-3.13 found here computes the stored digest (the module is stdlib only)."""
    (tmp_path / "fixed.py").write_text(FIXED)
    script = (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location('cd', sys.argv[1]); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "print(m.code_digest(open(sys.argv[2]).read()))"
    )
    candidates = [sys.executable] + [shutil.which(f"python3.{minor}") or "" for minor in (11, 12, 13)]
    candidates += [str(p) for p in sorted(Path.home().glob(".pyenv/versions/3.1[123]*/bin/python3.1[123]"))]
    found = {}
    for exe in filter(None, candidates):
        works = subprocess.run([exe, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True)
        if works.returncode == 0 and works.stdout.strip().startswith(("3.11", "3.12", "3.13")):
            out = subprocess.run(
                [exe, "-c", script, codedigest.__file__, str(tmp_path / "fixed.py")],
                capture_output=True,
                text=True,
                timeout=60,
            )
            found[works.stdout.strip()] = out.stdout.strip() or out.stderr.strip()[-200:]
    assert found and set(found.values()) == {FIXED_DIGEST}, found


def test_docstrings_and_comments_are_not_code():
    edited = (
        FIXED.replace('"""Module docstring."""', '"""Another module docstring,\n\nover lines."""  # comment')
        .replace('"""Doc."""', '"""Measured 1,234 times at commit abc."""', 1)
        .replace('    """Attribute doc."""\n', "")
        .replace('        """Doc."""\n', '        """Doc."""\n        # a comment\n\n')
        .replace("x: int = 1", "x: int = (1)  # parentheses and a comment")
    )
    assert edited != FIXED and codedigest.code_digest(edited) == FIXED_DIGEST


def test_a_body_emptied_of_its_docstring_reads_as_empty():
    only_doc = 'def f():\n    """Doc."""\n'
    other_doc = 'def f():\n    """Other doc."""\n    "and a bare string"\n'
    assert codedigest.code_digest(only_doc) == codedigest.code_digest(other_doc)
    assert codedigest.code_digest(only_doc) != codedigest.code_digest("def f():\n    pass\n")


@pytest.mark.parametrize(
    "old, new",
    [
        ("n -= 1", "n -= 2"),  # a statement
        ("b=2", "b=3"),  # a default value
        ('"a warning text"', '"another warning text"'),  # a string the code uses
        ("{x=}", "{x}"),  # an f-string
        ("return rest", "return list(rest)"),
        ("x: int = 1", "x: float = 1"),  # an annotation
        ("0x10", "16.0"),  # a constant's type (16 == 16.0, but not the same code)
    ],
)
def test_code_edits_change_the_digest(old, new):
    assert old in FIXED
    assert codedigest.code_digest(FIXED.replace(old, new, 1)) != FIXED_DIGEST


def test_a_file_that_does_not_parse_is_an_error_naming_it(tmp_path):
    bad = tmp_path / "plot_bad.py"
    bad.write_text("def f(:\n")
    with pytest.raises(codedigest.CodeDigestError, match=r"plot_bad\.py: not valid Python \(line 1"):
        codedigest.code_digest(bad)
    with pytest.raises(codedigest.CodeDigestError, match="missing.py: cannot be read"):
        codedigest.code_digest(tmp_path / "missing.py")
    assert records.example_code_digest(tmp_path / "missing.py") is None


def test_the_library_code_digest_is_the_combination_of_its_files():
    files = [(name, path.read_bytes()) for name, path in records.package_files(records.PRESENTATION_MODULES)]
    assert records.library_code_digest(records.PRESENTATION_MODULES) == codedigest.tree_code_digest(files)
    assert records.library_code_digest() != records.library_code_digest(records.PRESENTATION_MODULES)


def _edit_docs_and_comments(source: str) -> str:
    """``source`` with its module docstring extended and comments added before a def and at the end."""
    tree = ast.parse(source)
    assert ast.get_docstring(tree), "the file needs a module docstring"
    edited = source.replace('"""', '"""An added sentence with a count, 1,234, and commit 5a6abb2. ', 1)
    edited = edited.replace("\ndef ", "\n# an added comment\ndef ", 1)
    return edited + "\n# a trailing comment\n"


@pytest.mark.parametrize(
    "path",
    ["examples/plot_01_porting_to_manual.py", "examples/plot_05_skipped_steps.py", "mpguide/verify/run/probes.py"],
)
def test_the_ast_readers_and_the_digest_ignore_a_docstring_or_comment_edit(tmp_path, path):
    """declarations.read, measures.declared_in and runner._recipe_names read the same tables after the edit."""
    original = ROOT / path
    copy = tmp_path / original.name
    copy.write_text(_edit_docs_and_comments(original.read_text()))
    assert copy.read_text() != original.read_text()
    assert codedigest.code_digest(copy) == codedigest.code_digest(original)
    assert measures.declared_in(copy) == measures.declared_in(original)
    assert runner._recipe_names(copy) == runner._recipe_names(original)
    if path.startswith("examples/"):
        before, after = declarations.read(original), declarations.read(copy)
        assert after.digest() == before.digest() and after.runs == before.runs
        assert runner._recipe_names(original)  # the example has a literal recipes table: something was compared
    else:
        assert measures.declared_in(original)  # the probes declare measures: something was compared


#: Calls that read a docstring or source text at run time (the digest would not see what they read).
DOC_READERS = {"getdoc", "getsource", "getsourcelines", "getcomments", "findsource"}


def doc_reads(root: Path) -> list[str]:
    """``file:line: what`` for every read of ``__doc__`` or of inspect's docstring/source readers under ``root``.

    One exemption: ``description=__doc__...`` as an argument of a call (an ``argparse`` help line of a command).
    """
    found = []
    for path in sorted(Path(root).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        exempt = {
            id(node)
            for call in ast.walk(tree)
            if isinstance(call, ast.Call)
            for kw in call.keywords
            if kw.arg == "description"
            for node in ast.walk(kw.value)
        }
        for node in ast.walk(tree):
            what = None
            if isinstance(node, ast.Name) and node.id == "__doc__" and id(node) not in exempt:
                what = "__doc__"
            elif isinstance(node, ast.Attribute) and node.attr == "__doc__":
                what = "__doc__"
            elif isinstance(node, ast.Attribute) and node.attr in DOC_READERS:
                what = f"inspect.{node.attr}"
            elif isinstance(node, ast.ImportFrom) and node.module == "inspect":
                names = {a.name for a in node.names} & DOC_READERS
                what = f"from inspect import {', '.join(sorted(names))}" if names else None
            if what:
                found.append(f"{path}:{node.lineno}: {what}")
    return found


def test_nothing_in_the_package_or_the_build_code_reads_docstrings_or_source():
    assert doc_reads(ROOT / "mpguide") == []
    assert doc_reads(ROOT / "docs" / "_ext") == []


@pytest.mark.parametrize(
    "planted",
    [
        "def f(obj):\n    return obj.__doc__\n",
        "import inspect\n\ndef f(obj):\n    return inspect.getdoc(obj)\n",
        "from inspect import getsource\n",
        "TEXT = __doc__.upper()\n",
    ],
)
def test_the_scan_fails_on_a_planted_docstring_read(tmp_path, planted):
    shutil.copytree(ROOT / "mpguide" / "verify" / "records", tmp_path / "records")
    (tmp_path / "records" / "planted.py").write_text(planted)
    assert [line.split(": ", 1)[0].rsplit(":", 1)[0] for line in doc_reads(tmp_path)] == [
        str(tmp_path / "records" / "planted.py")
    ]


def test_a_plugin_docstring_edit_stales_nothing_and_a_statement_edit_stales_the_library(tmp_path, monkeypatch):
    """The issue's case on a copy of the package: one docstring line of mpguide/precision.py edited keeps the
    library's code digest (no example reruns, no matrix cell goes stale); one statement of
    ``ManualMixedPrecision.optimizer_step`` edited changes it."""
    copy = tmp_path / "mpguide"
    shutil.copytree(ROOT / "mpguide", copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(records, "PACKAGE_DIR", copy)
    before = records.library_code_digest(records.PRESENTATION_MODULES)
    precision = copy / "precision.py"
    source = precision.read_text()
    first_line = source.splitlines()[0]
    assert first_line.startswith('"""')
    precision.write_text(source.replace(first_line, first_line + " (one edited docstring line)", 1))
    assert records.library_code_digest(records.PRESENTATION_MODULES) == before
    tree = ast.parse(source)
    plugin = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ManualMixedPrecision")
    step = next(n for n in plugin.body if isinstance(n, ast.FunctionDef) and n.name == "optimizer_step")
    lines = source.splitlines(keepends=True)
    statement = step.body[-1]  # its last statement (a return): add one statement before it
    indent = " " * statement.col_offset
    lines.insert(statement.lineno - 1, f"{indent}_edited = True\n")
    precision.write_text("".join(lines))
    assert records.library_code_digest(records.PRESENTATION_MODULES) != before
