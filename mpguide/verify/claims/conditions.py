"""Measured conditions: a claim that holds only where a property of the installed libraries, measured when the
record is made, has a given value (the claim option ``only_if``).

Some facts differ between releases for a reason the harness can measure. Lightning's own autocast region (the
one ``training_step`` runs in, ``Precision.train_step_context``) cached weight casts until Lightning 2.5.4 and
on its master branch at commit 7f0c343 (``MixedPrecision.autocast_context_manager`` and, on master,
``forward_context`` build ``torch.autocast`` with its default ``cache_enabled=True``); Lightning 2.5.5
passes ``cache_enabled=False`` (Lightning issue #20921, pull request #21914 not on master). In a caching region a
forward after ``opt.step()`` reads the casts made before the step, so ``PitfallChecks`` rightly reports
``autocast-cache`` on runs that are clean where the region does not cache. Instead of a list of releases,
the record says what it measured (:func:`measure`, stored in ``env``), and a claim declared with
``{"only_if": NAME}`` is judged only on records where :data:`CONDITIONS` ``[NAME]`` holds; elsewhere its verdict
is "not applicable" (neither a pass nor a failure). A record that does not hold the measurement (made
before it existed) cannot say: the claim is "not judged" there.

Rules:

* A condition is one ``env`` field and the value it must have; its name says what holds.
* The value is measured in the process that trains, never typed from a version number.
* A claim names at most one condition; a pair of claims (one per value) says what holds everywhere.
"""

from __future__ import annotations

from typing import Any

#: Claim option naming a condition (``{"only_if": "lightning-autocast-caches"}``).
OPTION = "only_if"

#: Condition name -> (``env`` field, the value it must have, what it means in words).
CONDITIONS: dict[str, tuple[str, Any, str]] = {
    "lightning-autocast-caches": (
        "lightning_autocast_cache",
        True,
        "Lightning's own autocast caches weight casts (measured: cache enabled inside train_step_context)",
    ),
    "lightning-autocast-no-cache": (
        "lightning_autocast_cache",
        False,
        "Lightning's own autocast does not cache weight casts (measured: cache disabled inside train_step_context)",
    ),
}

#: The words a claim that does not apply is shown with, in the gate, the tables and the release pages.
NOT_APPLICABLE = "not applicable on this release"


def check(value: Any, at: str) -> str | None:
    """``None`` when ``value`` names a condition, else the message for a declaration error at ``at``.

    Args:
        value: the ``only_if`` option as declared.
        at: where it was declared (``examples/plot_08_autocast_cache.py: CLAIMS[3]``).
    """
    if isinstance(value, str) and value in CONDITIONS:
        return None
    return (
        f"{at}: field {OPTION!r} is {value!r}, which names no measured condition; fix: use one of "
        f"{sorted(CONDITIONS)} (mpguide.verify.claims.conditions.CONDITIONS), or drop the option"
    )


def applies(claim: dict[str, Any], env: dict[str, Any]) -> tuple[bool | None, str]:
    """Whether ``claim`` applies to a record made in ``env`` (its ``env`` field), and why.

    Returns:
        ``(True, "")`` for a claim without ``only_if`` or whose condition holds; ``(False, reason)`` when the
        measured value differs; ``(None, reason)`` when the record holds no measurement of the field.
    """
    name = claim.get(OPTION)
    if not name:
        return True, ""
    field, wanted, words = CONDITIONS[name]
    measured = env.get(field)
    if measured is None:
        return None, (
            f"not judged: the claim applies only where {words}, and this record does not hold env.{field} "
            f"(made before it was measured); rerun the example"
        )
    if measured == wanted:
        return True, ""
    return (
        False,
        f"{NOT_APPLICABLE}: the claim applies only where {words}; this record measured env.{field} = {measured}",
    )


def measure() -> dict[str, Any]:
    """The measured fields of the conditions, for a record's ``env``, taken in this process.

    ``lightning_autocast_cache``: enter the installed Lightning's ``MixedPrecision("bf16-mixed", "cpu")``
    ``train_step_context()`` (the region ``training_step`` runs in) and read ``torch.is_autocast_cache_enabled()``
    inside it. ``None`` when the plugin cannot be built (it never was on the releases the matrix runs).
    """
    import torch

    try:
        from lightning.pytorch.plugins.precision import MixedPrecision

        plugin = MixedPrecision("bf16-mixed", "cpu")
        with plugin.train_step_context():
            caches = bool(torch.is_autocast_cache_enabled())
    except Exception:  # noqa: BLE001 - a release without this plugin: the record says it could not measure
        caches = None
    return {"lightning_autocast_cache": caches}
