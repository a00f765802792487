"""The code digest: what decides whether a record, an example or a matrix cell is fresh.

A file's **code digest** is the SHA-256 of a canonical text of its syntax tree (:mod:`ast`) with every
bare-string statement removed: module, class and function docstrings and the strings written under an
attribute as its "docstring" (any expression statement whose value is a string constant). Comments never
reach the tree, and neither do blank lines, indentation style, quotes or parentheses, so editing any of
them keeps the digest; editing a statement, a default value, a name, or a string the code uses (a warning
text, a claim's message, an f-string) changes it.

The text is written by this module's own walker, not :func:`ast.dump`, so that Python 3.11, 3.12 and 3.13 give
the same digest for the same file (the CPU build runs 3.11, the GPU machine 3.12): ``ast.dump``'s output
differs between them (3.12 added ``type_params`` to functions and classes; 3.13 prints fewer empty fields),
and 3.12.1 writes an empty string part into a nested f-string format spec, which the walker drops (it joins
adjacent string parts of an f-string too). The walker writes each node's type name and its fields in the order
the node class lists them, leaving out every field whose value is ``None`` or an empty list (the field name is
written with each value kept, so nothing becomes ambiguous; a ``None`` inside a list, such as the key of
``{**d}``, is kept) and every line and column attribute. A node type that only exists on a newer Python
(``TypeAlias``, type parameters) only appears in a file that needs that Python to parse at all. A statement
list emptied by the removal is left out like any empty list, the same whether the docstring was its only
statement or the list was empty to begin with (a function whose body is only its docstring reads as one with
no body; the digest runs nothing).

Limits, stated: the digest says nothing about what a program reads at run time, so freshness code never
reads ``__doc__``, ``inspect.getdoc`` or ``inspect.getsource`` (``tests/test_code_digest.py`` scans
the package for such reads). Line numbers are not part of the digest: a traceback stored in a record made
before a comment edit may name lines that moved since. A file that does not parse is an error
(:class:`CodeDigestError` naming the file and the line), never a fallback to its bytes: an example with a
syntax error is a real failure.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable
from pathlib import Path

#: The tag written first into every digest. A change of the canonical text changes this tag, so a digest of
#: another algorithm can never compare equal by accident.
ALGORITHM = "mpguide-code-digest-1"


class CodeDigestError(ValueError):
    """A file could not be read or parsed; the message names the file, the line and the fix."""


def _is_bare_string(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _fstring_parts(values: list) -> list:
    """The parts of an f-string with empty string parts dropped and adjacent string parts joined.

    Python 3.12.1 leaves an empty ``Constant('')`` in a nested format spec (``f"{x:>{w}}"``) that 3.11
    and 3.13 do not write; both spellings mean the same string.
    """
    out: list = []
    for item in values:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            if not item.value:
                continue
            if out and isinstance(out[-1], ast.Constant) and isinstance(out[-1].value, str):
                out[-1] = ast.Constant(value=out[-1].value + item.value)
                continue
        out.append(item)
    return out


def _constant(value: object) -> str:
    # the type name keeps 1, 1.0, True and "1" apart; repr is exact and the same on every Python
    if value is Ellipsis:
        return "Ellipsis"
    return f"{type(value).__name__}:{value!r}"


def _write(node: object, out: list[str]) -> None:
    if isinstance(node, ast.AST):
        out.append(type(node).__name__ + "(")
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):  # a statement list loses its bare strings; emptied, it is left out
                value = [item for item in value if not _is_bare_string(item)]
                if isinstance(node, ast.JoinedStr):
                    value = _fstring_parts(value)
            if value is None or (isinstance(value, list) and not value):
                continue
            out.append(name + "=")
            _write(value, out)
            out.append(",")
        out.append(")")
    elif isinstance(node, list):
        out.append("[")
        for item in node:
            _write(item, out)
            out.append(";")
        out.append("]")
    elif node is None:
        out.append("None")  # only inside a list (a field that is None is left out above)
    else:
        out.append(_constant(node))


def canonical_text(source: str | bytes, filename: str = "<source>") -> str:
    """The canonical text of ``source``'s syntax tree that :func:`code_digest` hashes (for tests and debugging).

    Raises:
        CodeDigestError: ``source`` is not valid Python (names ``filename`` and the line).
    """
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as err:
        raise CodeDigestError(
            f"{filename}: not valid Python (line {err.lineno}: {err.msg}), so it has no code digest; "
            f"fix the syntax error"
        ) from None
    except ValueError as err:  # null bytes
        raise CodeDigestError(f"{filename}: not Python source ({err}); fix or restore the file") from None
    out: list[str] = []
    _write(tree, out)
    return "".join(out)


def code_digest(path_or_source: Path | str | bytes) -> str:
    """SHA-256 (hex) of a Python file's code: its syntax tree without bare-string statements (see the module).

    Args:
        path_or_source: a :class:`~pathlib.Path` of a file, or the source itself (``str`` or ``bytes``).

    Raises:
        CodeDigestError: the file cannot be read or does not parse (the message names it).
    """
    if isinstance(path_or_source, Path):
        try:
            source: str | bytes = path_or_source.read_bytes()
        except OSError as err:
            raise CodeDigestError(f"{path_or_source}: cannot be read ({err.strerror}); restore the file") from None
        name = str(path_or_source)
    else:
        source, name = path_or_source, "<source>"
    return _digest(source, name)


def _digest(source: str | bytes, name: str) -> str:
    digest = hashlib.sha256(ALGORITHM.encode())
    digest.update(b"\n")
    digest.update(canonical_text(source, name).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def file_code_digest(path: Path) -> str | None:
    """:func:`code_digest` of the file at ``path``, or ``None`` when it does not exist."""
    path = Path(path)
    return code_digest(path) if path.is_file() else None


def tree_code_digest(files: Iterable[tuple[str, str | bytes]]) -> str:
    """SHA-256 (hex) over ``(relative path, source)`` pairs: each path with its :func:`code_digest`, in path order.

    A file added, removed or renamed changes it; a docstring or comment edit in any of them does not.
    """
    return combine((name, _digest(source, name)) for name, source in files)


def combine(digests: Iterable[tuple[str, str]]) -> str:
    """SHA-256 (hex) over ``(relative path, code digest)`` pairs in path order (the last step of
    :func:`tree_code_digest`)."""
    digest = hashlib.sha256(ALGORITHM.encode())
    for name, code in sorted(digests, key=lambda pair: pair[0]):
        digest.update(b"\n" + name.encode() + b"\0" + code.encode())
    return digest.hexdigest()
