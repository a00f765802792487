"""Where the examples are, and how to make a record again, in words that work where the reader is.

In a checkout the examples live in ``examples/`` and the docs build (``nox -s docs``) reruns them; a
reader who downloaded one example from the site has neither, only the script in a folder of their own.
Every "rerun the example" hint of the harness comes from :func:`rerun`, so it names the command that
works in the reader's situation.
"""

from __future__ import annotations

import os
from pathlib import Path

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
