"""One line, not a traceback, when an example run as a script stops on bad input.

An example reads its environment (``MPGUIDE_PRESET``, ``MPGUIDE_DEVICE``, ``MPGUIDE_SWAP_RECIPE``),
its declarations and records, and ends with the claim gate; each of those stops with an error whose
message already names the file or variable, the problem and the fix. Printed by Python's default
hook, that message comes last under ten lines of traceback, which reads like a crash of the
library. :func:`install` replaces the default hook so that these errors print as
``error: <message>`` on stderr (exit status 1, as before); every other exception keeps its
traceback. Only the interpreter's own default hook is replaced: IPython, Jupyter kernels,
sphinx-gallery and pytest catch exceptions themselves and are not affected.
"""

from __future__ import annotations

import sys
from types import TracebackType

#: The errors whose message is the whole story (class names; each is defined in a module of ``mpguide``):
#: bad environment variables, a bad declaration or claim table, an unreadable record, a failed claim,
#: a Lightning release the plugin does not support.
INPUT_ERRORS = frozenset(
    {
        "ConfigurationError",
        "DeclarationError",
        "ClaimSpecError",
        "RecordError",
        "GateFailure",
        "UnsupportedVersionError",
    }
)


def is_input_error(exc_type: type[BaseException]) -> bool:
    """True when ``exc_type`` is (a subclass of) one of :data:`INPUT_ERRORS` defined in ``mpguide``."""
    return any(c.__name__ in INPUT_ERRORS and c.__module__.startswith("mpguide.") for c in exc_type.__mro__)


def _hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if is_input_error(exc_type):
        print(f"error: {exc}", file=sys.stderr)
    else:
        sys.__excepthook__(exc_type, exc, tb)


def install() -> None:
    """Use the one-line hook, unless something other than Python's default hook is installed."""
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _hook
