"""Optimizer-step helpers for manual optimization: know whether a 16-mixed step was skipped.

Under 16-mixed, ``GradScaler.step`` skips the optimizer step when the unscaled gradients contain
inf/NaN, and ``GradScaler.update`` then lowers the loss scale (``torch/amp/grad_scaler.py``).
Lightning's :class:`~lightning.pytorch.plugins.precision.MixedPrecision` calls ``update()`` right
after every ``opt.step()`` (``plugins/precision/amp.py``), so a lower scale after the step means
that step was skipped. A learning-rate scheduler stepped unconditionally advances on skipped steps
(and torch warns "Detected call of `lr_scheduler.step()` before `optimizer.step()`" when the very
first steps are skipped); :func:`~mpguide.steps.step_skip_aware` steps it only after real updates.
"""

from __future__ import annotations

from typing import Any


def loss_scale(trainer: Any) -> float | None:
    """Current loss scale of the trainer's GradScaler, or ``None`` without one (fp32, bf16-mixed)."""
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    return None if scaler is None else float(scaler.get_scale())


def step_skip_aware(optimizer: Any, trainer: Any, scheduler: Any = None) -> bool:
    """Call ``optimizer.step()``; step ``scheduler`` only if the optimizer step was really applied.

    Args:
        optimizer: the :class:`~lightning.pytorch.core.optimizer.LightningOptimizer` from
            ``self.optimizers()``.
        trainer: ``self.trainer``.
        scheduler: optional LR scheduler (from ``self.lr_schedulers()``) stepped after an applied step.

    Returns:
        ``True`` if the step was applied, ``False`` if GradScaler skipped it (the loss scale went
        down). Always ``True`` without a GradScaler.

    Note:
        Valid with Lightning's own MixedPrecision plugin, which updates the scale inside every
        ``opt.step()``. :class:`mpguide.precision.ManualMixedPrecision` may defer that update until
        other optimizers have stepped; with one optimizer it updates at once, as here.
    """
    before = loss_scale(trainer)
    optimizer.step()
    after = loss_scale(trainer)
    applied = before is None or after is None or after >= before
    if applied and scheduler is not None:
        scheduler.step()
    return applied
