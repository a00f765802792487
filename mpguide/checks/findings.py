"""What :class:`~mpguide.checks.PitfallChecks` reports: its finding, warning and error classes, and the words and
numbers its messages share (the section's link, a number's format, what a scaled clip did)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .._sections import GUIDE_URL, SECTION_TITLES

#: ``Found.batch`` when the finding belongs to the batch being watched (the usual case).
CURRENT = -2


class PitfallWarning(UserWarning):
    """One finding of :class:`PitfallChecks` (warned once per section and subject)."""


class ChecksStoppedWarning(UserWarning):
    """The check's own code raised: it stopped watching the run (or one section's rule stopped); the fit goes on
    exactly as without the callback. Warned once per stop; the text is also in ``PitfallChecks.stopped``."""


class PitfallError(RuntimeError):
    """Raised by ``PitfallChecks(strict=True)`` at the first finding, or for an unsupported Lightning.

    Attributes:
        section: the guide's anchor of the pitfall (one of :data:`SECTIONS`), ``""`` for a refusal.
    """

    def __init__(self, message: str, section: str = "") -> None:
        super().__init__(message)
        self.section = section


@dataclass
class Finding:
    """One pitfall seen in a run.

    Attributes:
        section: the guide's anchor (one of :data:`SECTIONS`).
        message: what was seen, with numbers, the fix in one line and the link to the section.
        batch: index of the training batch (within the epoch) where it was first seen, ``None`` at fit start.
        epoch: the epoch of that batch.
        optimizer: index of the optimizer in ``configure_optimizers`` concerned, or ``None``.
        count: how many times its rule reported it (the message describes the first). A rule reports when it
            judges: ``schedulers`` once an epoch, others once a step, so the count is not a number of batches.
    """

    section: str
    message: str
    batch: int | None = None
    epoch: int | None = None
    optimizer: int | None = None
    count: int = 1

    def as_dict(self) -> dict[str, Any]:
        """The finding as a JSON-ready dict."""
        return {
            "section": self.section,
            "message": self.message,
            "batch": self.batch,
            "epoch": self.epoch,
            "optimizer": self.optimizer,
            "count": self.count,
        }


@dataclass
class Found:
    """What a rule returns: one finding (or note) before the callback files it.

    Attributes:
        section: the guide's anchor.
        subject: what the finding is about (an optimizer's index, a hook's name...): one finding per section and
            subject, later sightings only count.
        message: the finding's text without the section tag and link (those the callback adds); a note's whole text.
        optimizer: the optimizer's index, or ``None``.
        batch: the batch it belongs to; :data:`CURRENT` for the batch being watched.
        note: a remark, not a pitfall (goes to ``PitfallChecks.notes``); with a ``subject`` it is also filed under
            that key, so the measurement is not made again.
    """

    section: str
    subject: Any
    message: str
    optimizer: int | None = None
    batch: int | None = CURRENT
    note: bool = False


def link(section: str) -> str:
    """Where to read on: the section's heading (a terminal reader searches for it) and its address on the site."""
    return f'section "{SECTION_TITLES[section]}" ({GUIDE_URL}#{section})'


def fmt(value: float) -> str:
    """A number in 3 significant digits; a whole number (a loss scale, 65536) in full; ``inf``/``nan`` as such
    (an overflowing first step of 16-mixed clips a norm of inf: the check must report it, not raise)."""
    if not math.isfinite(value):
        return f"{value:.3g}"
    return str(int(value)) if value == int(value) and abs(value) < 1e9 else f"{value:.3g}"


def clip_numbers(seen: float, limit: Any, scale: float) -> str:
    """What clipping the scaled total norm ``seen`` to ``limit`` did, against clipping the true gradients.

    The true norm is ``seen / scale``. Clipped while scaled, the update's norm becomes ``min(seen, c) / scale``;
    clipped after unscaling it would be ``min(seen / scale, c)``: their ratio is how much smaller this update is.
    """
    true = seen / scale
    text = f"it clipped a total norm of {fmt(seen)} to {limit}; unscaled, the norm was {fmt(true)}"
    try:
        c = float(limit)
    except (TypeError, ValueError):
        return text
    if not (math.isfinite(seen) and c > 0):
        return text + " (a non-finite norm: GradScaler skips this step)"
    if seen <= c:
        return text + f"; nothing was cut this time, but the limit acts on gradients {fmt(scale)}x too large"
    shrink = min(true, c) / (c / scale)
    return text + f", so this update is about {fmt(shrink)} times smaller than clipping the true gradients"
