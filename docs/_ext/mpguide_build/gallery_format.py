"""Format the gallery's code for the page it is read on: reader cells at the guide's width, Evidence at the desktop's.

A gallery page shows each cell's code in a column 120 characters wide on a 1400 px desktop (118 inside an
open Evidence fold) and 52 on a 412 px phone (12 px code, ``docs/_static/mpguide.css``; measured in
``tests/test_browser.py``). The reader's cells are formatted at the guide's snippet width
(``docs/model/ruff.toml``) so that they fit a phone; on a desktop ``mpguide.js`` sets a long block of them in
two columns. This module formats each cell of an example separately with ruff:

* the cells a reader copies (every cell outside the folded ``Evidence`` sections, the page header included)
  at :data:`READER_WIDTH` columns;
* the ``Evidence`` cells (title starting with ``Evidence``, as :mod:`mpguide_build.evidence` folds them, and
  untitled code-only cells that follow one, which stay in its fold) at :data:`EVIDENCE_WIDTH` columns.

Cells are cut at their ``# %%`` lines like :func:`mpguide_build.cells.cells` does; each formatted cell is
joined to the next by two blank lines, so formatting is idempotent. Only layout changes: the check compares
``ast.dump`` of every file before and after (a docstring's whitespace aside) and refuses to write a file whose
syntax tree changed, so an example's code digest (``mpguide.verify.records.codedigest``) stays the same.

ruff does not split long strings or comments, so this module does, without changing the syntax tree: a
comment that makes its line too long moves above the line and is rewrapped, a string literal alone on its
line is cut at spaces into adjacent literals (Python joins them), in pieces of at least :data:`MIN_PIECE`
characters; a docstring with a line over the width is rewrapped (:func:`wrap_docstrings`). A code line
still longer than its cell's width (a name or an f-string field that cannot be cut, a string deep in a block) is
reported (file, line, cell, width), and fails ``--check --max-line N`` when longer than N; the leading comment
block of a cell (rendered as prose, not code) and the lines between ``sphinx_gallery_start_ignore`` and
``..._end_ignore`` (hidden from the page) are not counted. ``# fmt: off`` regions (the Evidence cells'
one-row-per-line ``RUNS``/``CLAIMS`` tables) stay as written, so their rows scroll inside the open fold.
``--tables`` lays them out too (:func:`drop_layout_pragmas` removes the ``fmt`` and E501 noqa comments first):
nothing of theirs scrolls at 1400 px then, but a row longer than the width grows to several lines, which
costs the example teaching share (``mpguide_build.lessons``; plot_15's many claims would fall to 57 %), so it
is off by default and run on one file at a time; a file laid out once stays so (no ``fmt: off`` is left).

A new example: ``python -m mpguide_build.gallery_format examples/plot_NN_name.py`` (``PYTHONPATH=docs/_ext``),
and ``--tables`` too if its teaching share allows it.

``python -m mpguide_build.gallery_format [--check [--max-line N]] examples/*.py``: rewrite the files (or, with
``--check``, exit 1 and name each file that would change; with ``--max-line``, also each line longer than N).
The repository's own ``ruff format`` excludes ``examples/`` (pyproject.toml ``[tool.ruff.format]``), so it
never reformats them at 120; ``nox -s lint`` runs ``--check`` on them instead.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import subprocess
import sys
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path

#: Columns of a reader cell: the guide's snippets' width (docs/model/ruff.toml), which fits a 412 px phone.
READER_WIDTH = 46
#: Columns of an Evidence cell: what the code column of a gallery page shows at 1400 px, inside the fold
#: (measured in Chromium: a 1,034 px block of 14 px code inside the open fold, 8.4 px a character after 32 px
#: of padding: 118; an example page gives its article the page's width, mpguide.css).
EVIDENCE_WIDTH = 118
#: The shortest piece a long string is cut into (shorter pieces read worse than a line that scrolls).
MIN_PIECE = 30
EVIDENCE_PREFIX = "Evidence"  # as mpguide_build.evidence folds them
_ASSIGN = re.compile(r"[\w.\[\]'\"]+ *[-+*/%|&]?= *")  # ``name = `` or ``name += ``, before a value
_UNDERLINE = re.compile(r"^# ?[-=~^\"'`#*+]{3,}\s*$")


@dataclass
class Cell:
    first_line: int  # 1-based line of the cell in the file
    text: str
    evidence: bool


class FormatError(Exception):
    """A file that cannot be formatted (ruff refused it, or its syntax tree would change)."""


def split(source: str) -> list[Cell]:
    """The cells of ``source``, cut before each ``# %%`` line, each marked reader or Evidence."""
    lines = source.splitlines(keepends=True)
    starts = [0] + [i for i, line in enumerate(lines) if line.startswith("# %%") and i > 0]
    result: list[Cell] = []
    for a, b in zip(starts, [*starts[1:], len(lines)]):
        chunk = lines[a:b]
        evidence = False
        if chunk and chunk[0].startswith("# %%"):
            if len(chunk) > 2 and chunk[1].startswith("#") and _UNDERLINE.match(chunk[2].rstrip("\n")):
                evidence = chunk[1][1:].strip().startswith(EVIDENCE_PREFIX)
            elif result and result[-1].evidence:
                # an untitled cell stays in the previous section; without prose it stays in its fold
                evidence = not (len(chunk) > 1 and chunk[1].startswith("#"))
        result.append(Cell(a + 1, "".join(chunk), evidence))
    return result


def _ruff() -> list[str]:
    """The ruff command: the running interpreter's ``ruff`` module, else the one on PATH."""
    try:
        import ruff  # noqa: F401 - only to know it is installed
    except ImportError:
        found = shutil.which("ruff")
        if found is None:
            raise FormatError("ruff is not installed: pip install ruff (the version in noxfile.py's EXTRAS)") from None
        return [found]
    return [sys.executable, "-m", "ruff"]


def format_code(code: str, width: int, root: Path) -> str:
    """``code`` formatted by ruff at ``width`` columns (the repository's other settings), no trailing newline."""
    command = [*_ruff(), "format", "--line-length", str(width), "--stdin-filename", "cell.py", "-"]
    done = subprocess.run(command, input=code, capture_output=True, text=True, cwd=root, check=False)
    if done.returncode != 0:
        raise FormatError(done.stderr.strip() or f"ruff exited with {done.returncode}")
    return done.stdout.rstrip("\n")


#: Comments that tools read: never moved or rewrapped.
_PRAGMAS = ("# noqa", "# fmt:", "# type:", "# pragma", "# sphinx_gallery", "# %%", "# isort", "# ruff")


def wrap_comments(code: str, width: int) -> str:
    """``code`` with each comment that makes its line longer than ``width`` rewrapped on lines of its own.

    A trailing comment moves above its line (the guide's rule: comments go above the line they explain);
    a comment on its own line is rewrapped in place. The cell's leading comment block (prose on the page),
    pragmas (:data:`_PRAGMAS`) and hidden ``sphinx_gallery_*_ignore`` blocks stay as they are. Comments
    are not in the syntax tree, so the code does not change."""
    lines = code.splitlines()
    first = _first_code(lines)
    comments = {}  # 0-based line -> (column, text) of its comment
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0] - 1] = (token.start[1], token.string)
    out: list[str] = []
    hidden = False
    for number, line in enumerate(lines):
        stripped = line.strip()
        hidden = hidden or stripped.startswith("# sphinx_gallery_start_ignore")
        comment = comments.get(number)
        if hidden or number < first or comment is None or len(line) <= width or comment[1].startswith(_PRAGMAS):
            out.append(line)
        else:
            column, text = comment
            before = line[:column].rstrip()
            indent = line[: len(line) - len(line.lstrip())]
            body = text.lstrip("#").strip()
            wrapped = textwrap.wrap(body, max(20, width - len(indent) - 2), break_long_words=False)
            out.extend(f"{indent}# {part}" for part in wrapped)
            if before:
                out.append(before)
        if stripped.startswith("# sphinx_gallery_end_ignore"):
            hidden = False
    return "\n".join(out) + "\n"


def wrap_docstrings(code: str, width: int) -> str:
    """``code`` with each docstring that has a line longer than ``width`` rewrapped at ``width``.

    A docstring here is a triple-quoted string that is a statement of its own (``_is_docstring``); its
    paragraphs (cut at blank lines) are rewrapped, the closing quotes stay on the last line of text. A
    docstring holding an indented line (a code example, a list's continuation) is left as it is. Bare
    strings are no part of the code digest (``mpguide.verify.records.codedigest``), and the syntax tree
    changes only in that string's whitespace, which :func:`main` allows for docstrings alone."""
    lines = code.splitlines()
    tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    cuts: dict[int, tuple[int, list[str]]] = {}  # first 0-based line -> (last line, replacement)
    for index, token in enumerate(tokens):
        if token.type != tokenize.STRING or not _is_docstring(tokens, index):
            continue
        first, last = token.start[0] - 1, token.end[0] - 1
        if all(len(line) <= width for line in lines[first : last + 1]):
            continue
        text = token.string
        prefix = text[: len(text) - len(text.lstrip("rRuU"))]
        quote = text[len(prefix) : len(prefix) + 3]
        body = text[len(prefix) + 3 : -3]
        indent = lines[first][: token.start[1]]
        rows = body.splitlines()
        if any(row.startswith(indent + " ") for row in rows[1:] if row.strip()):
            continue  # an indented block inside: the writer's layout
        paragraphs, current = [], []
        for row in rows:
            if row.strip():
                current.append(row.strip())
            elif current:
                paragraphs.append(" ".join(current))
                current = []
        if current:
            paragraphs.append(" ".join(current))
        out: list[str] = []
        room = max(20, width - len(indent))
        for number, paragraph in enumerate(paragraphs):
            lead = prefix + quote if number == 0 else ""
            wrapped = textwrap.wrap(lead + paragraph, room, break_long_words=False, break_on_hyphens=False)
            if number:
                out.append("")
            out.extend(wrapped)
        out[-1] += quote
        if len(out[-1]) > room and len(out) > 0:
            out[-1] = out[-1][: -len(quote)]
            out.append(quote)
        cuts[first] = (last, [indent + row if row else "" for row in out])
    result, skip_to = [], -1
    for number, line in enumerate(lines):
        if number <= skip_to:
            continue
        if number in cuts:
            skip_to, replacement = cuts[number]
            result.extend(replacement)
        else:
            result.append(line)
    return "\n".join(result) + "\n"


def _is_docstring(tokens: list[tokenize.TokenInfo], index: int) -> bool:
    """True when ``tokens[index]`` is a triple-quoted string that is a statement of its own (not the first
    statement of the code: a module docstring is the page's header and keeps its layout)."""
    text = tokens[index].string.lstrip("rRuU")
    if text[:3] not in ('"""', "'''"):
        return False
    skip = (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)
    before = [t for t in tokens[:index] if t.type not in skip][-1:]
    after = [t for t in tokens[index + 1 :] if t.type not in (tokenize.NL, tokenize.COMMENT)][:1]
    if not before or before[0].type == tokenize.ENCODING:
        return False  # the module docstring: the page's header, reStructuredText (titles, literal blocks)
    starts = before[0].type == tokenize.NEWLINE or before[0].string == ":"
    return starts and bool(after) and after[0].type in (tokenize.NEWLINE, tokenize.ENDMARKER)


def _split_points(body: str, is_f: bool) -> list[int]:
    """Offsets in a string literal's ``body`` just after a space, outside an f-string's replacement fields."""
    points, depth, i = [], 0, 0
    while i < len(body):
        pair = body[i : i + 2]
        if is_f and pair in ("{{", "}}"):
            i += 2
            continue
        if body[i] == "\\":
            i += 2
            continue
        if is_f and body[i] == "{":
            depth += 1
        elif is_f and body[i] == "}":
            depth -= 1
        elif body[i] == " " and depth == 0:
            points.append(i + 1)
        i += 1
    return points


def split_strings(code: str, width: int) -> str:
    """``code`` with each one-line string literal that alone makes its line too long cut at spaces into
    adjacent literals (Python joins them: the syntax tree is the same, which :func:`main` checks).

    Only a literal that stands alone on its line inside brackets (a call's argument, a tuple's element) is
    cut; docstrings, triple-quoted and byte strings are left as they are."""
    lines = code.splitlines()
    cuts = {}  # 0-based line -> replacement lines
    depth = 0
    tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    skip = (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)
    for index, token in enumerate(tokens):
        if token.type == tokenize.OP and token.string in "([{":
            depth += 1
        elif token.type == tokenize.OP and token.string in ")]}":
            depth -= 1
        if token.type != tokenize.STRING or token.start[0] != token.end[0]:
            continue
        around = [t for t in tokens[index + 1 :] if t.type not in skip][:1]
        around += [t for t in tokens[:index] if t.type not in skip][-1:]
        in_concatenation = any(t.type == tokenize.STRING for t in around)
        row = token.start[0] - 1
        line = lines[row]
        text = token.string
        prefix = text[: len(text) - len(text.lstrip("rRfFuUbB"))]
        quoted = text[len(prefix) :]
        if len(line) <= width or "b" in prefix.lower() or quoted[:3] in ('"""', "'''"):
            continue
        lead, tail = line[: token.start[1]], line[token.end[1] :]
        code_before = lead.strip()
        if in_concatenation and (depth == 0 or code_before):
            continue  # a piece of an implicit concatenation is cut only when it stands alone in brackets
        if tail.strip() not in ("", ",") or (depth == 0 and not _ASSIGN.fullmatch(code_before)):
            continue  # not alone at the end of its line, or (outside brackets) not the value of an assignment
        indent = lead[: len(lead) - len(lead.lstrip())]
        comma = tail.strip()
        inner = indent + ("    " if depth == 0 or code_before else "")
        body, quote, is_f = quoted[1:-1], quoted[0], "f" in prefix.lower()
        room = width - len(inner) - len(prefix) - 2 - len(comma)
        if room < MIN_PIECE:
            continue  # deep in a block: pieces this short would be harder to read than a line that scrolls
        pieces, start = [], 0
        points = _split_points(body, is_f)
        while len(body) - start > room:
            fit = [p for p in points if start < p <= start + room]
            if not fit:
                break
            pieces.append(body[start : fit[-1]])
            start = fit[-1]
        pieces.append(body[start:])
        if len(pieces) < 2:
            continue
        out = []
        for piece in pieces:
            piece_prefix = prefix if ("{" in piece or "}" in piece) else prefix.replace("f", "").replace("F", "")
            out.append(f"{inner}{piece_prefix}{quote}{piece}{quote}")
        if depth == 0:  # ``name = "..."``: the pieces go in parentheses
            out = [f"{indent}{code_before} (", *out, f"{indent})"]
        elif code_before:  # ``title="..."`` or ``else "..."`` inside brackets
            out = [f"{indent}{code_before} (", *out, f"{indent}){comma}"]
        else:
            out[-1] += comma
        cuts[row] = out
    result = []
    for number, line in enumerate(lines):
        result.extend(cuts.get(number, [line]))
    return "\n".join(result) + "\n"


#: Comments that only held a layout the page cannot show: ``# fmt: off``/``on`` (one table row per line, wider
#: than the page) and a noqa comment for E501 alone (a line over the repository's 120 columns), both removed
#: before ruff runs (a noqa naming other rules stays).
_LAYOUT_PRAGMA = re.compile(r"^\s*# fmt: (off|on)\s*$|\s*# noqa: E501\s*(\(.*\))?\s*$")


def drop_layout_pragmas(code: str) -> str:
    """``code`` without :data:`_LAYOUT_PRAGMA` comments (a line that held only one of them goes)."""
    out = []
    for line in code.splitlines():
        stripped = _LAYOUT_PRAGMA.sub("", line)
        if stripped.strip() or not line.strip():
            out.append(stripped.rstrip())
    return "\n".join(out) + "\n"


def format_cell(code: str, width: int, root: Path, tables: bool = False) -> str:
    """One cell: ruff at ``width``, long comments rewrapped (:func:`wrap_comments`), ruff again until stable;
    with ``tables``, :func:`drop_layout_pragmas` first."""
    code = drop_layout_pragmas(code) if tables else (code if code.endswith("\n") else code + "\n")
    # trailing comments move above their line before ruff lays the line out (and attaches them elsewhere)
    text = format_code(wrap_comments(code, width), width, root)
    for _ in range(3):
        again = format_code(
            wrap_docstrings(split_strings(wrap_comments(text + "\n", width), width), width), width, root
        )
        if again == text:
            break
        text = again
    return text


def format_source(
    source: str, root: Path, widths: tuple[int, int] = (READER_WIDTH, EVIDENCE_WIDTH), tables: bool = False
) -> str:
    """``source`` with every cell formatted at its width (``widths``: reader cells, Evidence cells); cells
    joined by two blank lines."""
    parts = []
    for cell in split(source):
        if not cell.text.strip():
            continue
        parts.append(format_cell(cell.text, widths[cell.evidence], root, tables))
    return "\n\n\n".join(parts) + "\n"


def long_lines(
    source: str, widths: tuple[int, int] = (READER_WIDTH, EVIDENCE_WIDTH)
) -> list[tuple[int, int, int, bool]]:
    """``(line, length, width, evidence)`` of each shown code line longer than its cell's width."""
    found = []
    for index, cell in enumerate(split(source)):
        width = widths[cell.evidence]
        lines = cell.text.splitlines()
        if index == 0:
            continue  # the page header: a docstring, rendered as text
        hidden = False
        for offset in range(_first_code(lines), len(lines)):  # the leading comment block is prose
            line = lines[offset]
            stripped = line.strip()
            if stripped.startswith("# sphinx_gallery_start_ignore"):
                hidden = True
            if not hidden and len(line) > width:
                found.append((cell.first_line + offset, len(line), width, cell.evidence))
            if stripped.startswith("# sphinx_gallery_end_ignore"):
                hidden = False
    return found


def _first_code(lines: list[str]) -> int:
    """Index of the first line of a cell that is not the ``# %%`` line, a comment or blank."""
    return next((i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")), len(lines))


def same_tree(before: str, after: str, name: str) -> bool:
    """True when ``before`` and ``after`` parse to the same syntax tree (comments and layout aside; in a
    docstring, a bare string statement, only the whitespace may differ: :func:`wrap_docstrings`)."""
    try:
        return _tree(before, name) == _tree(after, name)
    except SyntaxError as error:
        raise FormatError(f"{name}: line {error.lineno}: {error.msg}") from None


def _tree(source: str, name: str) -> str:
    tree = ast.parse(source, name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            node.value.value = " ".join(node.value.value.split())
    return ast.dump(tree)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpguide_build.gallery_format", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    parser.add_argument(
        "--max-line", type=int, metavar="N", help="with --check: also fail on a shown code line longer than N"
    )
    parser.add_argument("--reader-width", type=int, default=READER_WIDTH, help="columns of the reader's cells")
    parser.add_argument("--evidence-width", type=int, default=EVIDENCE_WIDTH, help="columns of Evidence cells")
    parser.add_argument(
        "--tables",
        action="store_true",
        help="also lay out the '# fmt: off' tables (RUNS, CLAIMS) at the cell's width (see the module docstring)",
    )
    parser.add_argument("files", nargs="+", type=Path, help="gallery scripts (examples/plot_*.py)")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[3]
    widths = (args.reader_width, args.evidence_width)
    failed = 0
    for path in args.files:
        if not path.is_file():
            print(f"{path}: no such file (give gallery scripts, e.g. examples/plot_*.py)", file=sys.stderr)
            failed += 1
            continue
        source = path.read_text()
        try:
            same_tree(source, source, str(path))  # a syntax error: one line, before any tool reads the file
            formatted = format_source(source, root, widths, args.tables)
            if not same_tree(source, formatted, str(path)):
                raise FormatError("formatting would change the syntax tree; file left as it is")
        except FormatError as error:
            print(f"{path}: {error}", file=sys.stderr)
            failed += 1
            continue
        if formatted != source:
            if args.check:
                print(f"{path}: not formatted for the page; run python -m mpguide_build.gallery_format {path}")
                failed += 1
            else:
                path.write_text(formatted)
                print(f"{path}: formatted")
        for line, length, width, evidence in long_lines(formatted, widths):
            kind = "Evidence" if evidence else "reader"
            print(f"{path}:{line}: {length} characters in a {kind} cell of {width} columns (split it by hand)")
            failed += bool(args.check and args.max_line is not None and length > args.max_line)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
