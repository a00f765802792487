"""Where the examples are, and how to make a record again, in words that work where the reader is.

In a checkout the examples live in ``examples/`` and the docs build (``nox -s docs``) reruns them; a
reader who downloaded one example from the site has neither, only the script in a folder of their own.
Every "rerun the example" hint of the harness comes from :func:`rerun`, so it names the command that
works in the reader's situation.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

#: Environment variable naming the examples folder, set by the docs build; without it, ``examples/`` of the checkout.
EXAMPLES_ENV = "MPGUIDE_EXAMPLES_DIR"


def examples_dir() -> Path:
    """Folder of the examples: ``$MPGUIDE_EXAMPLES_DIR``, else ``examples/`` of this library's repository."""
    return Path(os.environ.get(EXAMPLES_ENV) or Path(__file__).resolve().parents[2] / "examples")


def in_checkout() -> bool:
    """True when the examples folder exists (a checkout or the docs build), False after a download."""
    return examples_dir().is_dir()


def rerun(example: str) -> str:
    """The command that writes ``example``'s record again: in a checkout the file or the docs build, else the script."""
    if in_checkout():
        return f"python examples/{example}.py, or rebuild the docs with nox -s docs"
    return f"python {example}.py in the folder of the downloaded example"


def example_of(record: Any, path: Path | str) -> str:
    """The example a record belongs to, for a rerun hint: its ``example`` field, else the file's stem.

    A record's file name may differ from its example (a copy, a reference kept under another name, a file
    renamed by hand); the command that writes the record again is the one of the example the record names.
    The file's stem is used only when the record has no usable ``example`` (not an object, the field
    missing, or not a file stem of letters, digits, ``_`` and ``-``).
    """
    name = record.get("example") if isinstance(record, dict) else None
    if isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):
        return name
    return Path(path).stem
