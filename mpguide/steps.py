"""Optimizer-step helpers for manual optimization: know whether a 16-mixed step was skipped, take
gradients inside ``training_step`` with the trainer's loss scale (gradient penalties:
:func:`scaled_input_grad`; gradients written into ``p.grad``: :func:`scaled_grads`), and cut
accumulation windows where Lightning's automatic accumulation cuts them (:func:`window_ends`,
:func:`manual_stepping_batches`).

Under 16-mixed, ``GradScaler.step`` skips the optimizer step when the unscaled gradients contain
inf/NaN, and ``GradScaler.update`` then lowers the loss scale (``torch/amp/grad_scaler.py``).
A learning-rate scheduler stepped unconditionally advances on skipped steps (and torch warns
"Detected call of `lr_scheduler.step()` before `optimizer.step()`" when the very first steps are
skipped); :func:`~mpguide.steps.step_skip_aware` steps it only after real updates.

How a skip is detected depends on the precision plugin:

* :class:`mpguide.precision.ManualMixedPrecision` does not update the scale inside every
  ``opt.step()`` (its rule: ``mpguide._common.UPDATE_RULE``), so comparing the scale around a step
  cannot tell; the plugin answers directly with ``step_was_skipped(optimizer)`` (GradScaler's inf
  check for that optimizer's latest step; ``False`` for a step that was a no-op).
* Lightning's own ``MixedPrecision`` calls ``update()`` right after every ``opt.step()``
  (``plugins/precision/amp.py``), so a lower scale after the step means that step was skipped.
  This cannot tell when the scaler's ``backoff_factor`` is 1, and it is wrong for any other
  plugin that does not update the scale inside every step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


def loss_scale(trainer: Any) -> float | None:
    """Current loss scale of the trainer's GradScaler, or ``None`` without one (fp32, bf16-mixed)."""
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    return None if scaler is None else float(scaler.get_scale())


def step_skip_aware(optimizer: Any, trainer: Any, scheduler: Any = None, metrics: Any = None) -> bool:
    """Call ``optimizer.step()``; step ``scheduler`` only if the optimizer step was really applied.

    Args:
        optimizer: the :class:`~lightning.pytorch.core.optimizer.LightningOptimizer` from
            ``self.optimizers()``.
        trainer: ``self.trainer``.
        scheduler: optional LR scheduler (from ``self.lr_schedulers()``) stepped after an applied step:
            any ``torch.optim.lr_scheduler`` scheduler, ``scheduler.step()``; a ``ReduceLROnPlateau``
            (configured with ``"monitor"`` in ``configure_optimizers``, or not), ``scheduler.step(metrics)``.
        metrics: the monitored value (a float or 0-dim tensor) a ``ReduceLROnPlateau`` is stepped with,
            for example ``loss.detach()`` or ``self.trainer.callback_metrics["val_loss"]``. In manual
            optimization Lightning steps no scheduler and ignores the ``"monitor"`` key of
            ``configure_optimizers`` with a warning (``lightning/pytorch/core/optimizer.py``,
            ``_configure_schedulers_manual_opt``), so the value must be given here.
            A value passed on a skipped step never reaches the scheduler.

    Returns:
        ``True`` if the step was applied, ``False`` if GradScaler skipped it (inf/NaN gradients).
        Always ``True`` without a GradScaler, and for a step that did nothing because no parameter
        had a gradient (as in fp32, where such a step "runs" too). Synchronizes with the device.

    Raises:
        TypeError: ``scheduler`` is a ``ReduceLROnPlateau`` and ``metrics`` is missing
            (``ReduceLROnPlateau.step(metrics)`` requires it, ``torch/optim/lr_scheduler.py``), or
            ``metrics`` is given for another scheduler (whose ``step()`` takes no metric). Raised before
            the optimizer steps.

    Note:
        With a plugin that has ``step_was_skipped`` (:class:`mpguide.precision.ManualMixedPrecision`)
        the answer is exact in every stepping pattern. Otherwise the scale before and after the step
        is compared, which is right for Lightning's ``MixedPrecision`` (one update inside every step)
        but not for a plugin that defers the update (see the module docstring).
    """
    plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    # checked before the optimizer steps, so a wrong call fails at once and changes nothing
    if plateau and metrics is None:
        raise TypeError(
            "step_skip_aware: a ReduceLROnPlateau scheduler is stepped with the value it monitors, and "
            "metrics= is missing. Call step_skip_aware(opt, self.trainer, sched, metrics=value) with the "
            'value it watches (e.g. loss.detach(), or self.trainer.callback_metrics["val_loss"] once '
            'logged): in manual optimization Lightning ignores the "monitor" key of '
            "configure_optimizers and steps no scheduler itself (lightning/pytorch/core/optimizer.py)."
        )
    if metrics is not None and not plateau:
        raise TypeError(
            f"step_skip_aware: metrics= is for ReduceLROnPlateau only; "
            f"{type(scheduler).__name__ if scheduler is not None else 'no scheduler'} was given "
            f"(its step() takes no metric). Drop metrics=, or pass the ReduceLROnPlateau as scheduler=."
        )
    plugin = trainer.precision_plugin
    ask = getattr(plugin, "step_was_skipped", None)
    if callable(ask):
        optimizer.step()
        applied = not ask(optimizer)
    else:
        before = loss_scale(trainer)
        optimizer.step()
        after = loss_scale(trainer)
        applied = before is None or after is None or after >= before
    if applied and scheduler is not None:
        if plateau:
            scheduler.step(metrics)
        else:
            scheduler.step()
    return applied


def scaled_input_grad(
    output: torch.Tensor,
    inputs: Sequence[torch.Tensor] | torch.Tensor,
    trainer: Any,
    create_graph: bool = True,
    retain_graph: bool | None = None,
) -> tuple[torch.Tensor, ...]:
    """Gradients of ``output.sum()`` with respect to ``inputs``, loss-scaled like ``manual_backward``.

    ``torch.autograd.grad`` does not go through ``manual_backward``, so under 16-mixed nothing
    scales it: its fp16 backward can underflow. PyTorch's AMP recipe for gradient penalties
    (``docs/source/notes/amp_examples.rst``, "Gradient penalty") scales the output with the
    GradScaler, takes the gradients and divides them by the scale; this function does that with the
    trainer's GradScaler (``trainer.precision_plugin.scaler``). Without a GradScaler (fp32,
    bf16-mixed) it is plain ``torch.autograd.grad``. Call it inside ``training_step`` (so inside
    Lightning's autocast) and compute the penalty from its result there too.

    If the scaled gradients overflow, the returned gradients hold inf/NaN; a penalty built from them
    makes the gradients of the following ``manual_backward`` non-finite, and GradScaler skips that
    ``opt.step()`` and lowers the scale, as for any overflow.

    The division by the scale is done in float32: a float16 gradient divided in float16 underflows
    again to the zeros the scaling avoided (measured on a loss balancer's per-loss gradients of a
    float16 activation in ``tests/test_steps.py``).

    Args:
        output: a tensor of any shape (e.g. critic scores ``(B, 1)``); its sum is differentiated.
        inputs: tensor(s) with ``requires_grad=True`` that ``output`` depends on.
        trainer: ``self.trainer``.
        create_graph: keep the graph so that the penalty can be backpropagated (default ``True``).
        retain_graph: keep the graph for another backward or ``autograd.grad`` through it (several
            losses of one activation); defaults to ``create_graph``, as in ``torch.autograd.grad``.

    Returns:
        One gradient per input, same shape as the input, unscaled; float32 for a float16 or bfloat16
        input under a GradScaler (the unscaled values may lie below float16's range), otherwise the
        input's dtype.
    """
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    total = output.sum()
    if scaler is None or not scaler.is_enabled():
        return torch.autograd.grad(total, inputs, create_graph=create_graph, retain_graph=retain_graph)
    grads = torch.autograd.grad(scaler.scale(total), inputs, create_graph=create_graph, retain_graph=retain_graph)
    inv_scale = 1.0 / scaler.get_scale()
    return tuple((g.float() if g.dtype in (torch.float16, torch.bfloat16) else g) * inv_scale for g in grads)


def window_ends(trainer: Any, batch_idx: int, n: int) -> bool:
    """Whether the micro-batch ``batch_idx`` closes an accumulation window of ``n`` micro-batches.

    Automatic optimization with ``accumulate_grad_batches=n`` steps when the epoch's count of
    batches is a multiple of ``n`` **or** the epoch ends (``lightning/pytorch/loops/
    training_epoch_loop.py``: ``_accumulated_batches_reached`` and ``_num_ready_batches_reached``);
    its windows restart every epoch. ``(batch_idx + 1) % n == 0`` alone misses the epoch's last,
    short window whenever ``n`` does not divide the epoch: those micro-batches leak into the next
    epoch's first window (or are zeroed by the next ``zero_grad``). This returns the automatic rule:
    ``batch_idx + 1`` a multiple of ``n``, or ``trainer.is_last_batch`` (set by the data fetcher,
    which looks one batch ahead: it holds for an ``IterableDataset`` without ``__len__``, where
    ``trainer.num_training_batches`` is ``inf``, and for an epoch cut by ``limit_train_batches``), or
    ``batch_idx + 1 == trainer.num_training_batches`` (Lightning checks both; the count covers a
    ``training_step`` that takes ``dataloader_iter``, where ``is_last_batch`` is not known yet).

    Divide each micro-batch's loss by ``n`` in the short window too: automatic accumulation does.

    Args:
        trainer: ``self.trainer``.
        batch_idx: the ``batch_idx`` of ``training_step``.
        n: micro-batches per optimizer step (>= 1).

    Raises:
        ValueError: ``n`` is not a positive integer.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"window_ends: n must be a positive int (micro-batches per step), got {n!r}")
    ready = batch_idx + 1
    return ready % n == 0 or bool(trainer.is_last_batch) or ready == trainer.num_training_batches


def manual_stepping_batches(trainer: Any, n: int) -> float:
    """Optimizer steps a fit takes with windows of ``n`` micro-batches cut by :func:`window_ends`.

    In manual optimization ``trainer.estimated_stepping_batches`` counts batches (the Trainer's
    ``accumulate_grad_batches`` is 1 there), so a per-step schedule sized from it (OneCycleLR's
    ``total_steps``, a warmup fraction) runs ``n`` times too long. This counts windows instead:
    ``ceil(num_training_batches / n)`` per epoch (the short tail window included) times
    ``max_epochs``, capped by ``max_steps`` (which, in manual optimization, counts ``opt.step()``
    calls). For one optimizer stepped once per window; with several, multiply by the steps per
    window before comparing with ``max_steps``.

    Call it in ``configure_optimizers``: it first asks ``trainer.estimated_stepping_batches``, which
    sets up the train dataloader so that ``trainer.num_training_batches`` is known.

    Returns:
        The number of steps; ``math.inf`` when neither the epoch length (an ``IterableDataset``
        without ``__len__``) nor ``max_epochs`` bounds it and ``max_steps`` is not set, as Lightning's
        own estimate does.

    Raises:
        ValueError: ``n`` is not a positive integer.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"manual_stepping_batches: n must be a positive int (micro-batches per step), got {n!r}")
    trainer.estimated_stepping_batches  # noqa: B018  (sets up the dataloader: num_training_batches)
    per_epoch = trainer.num_training_batches
    epochs = trainer.max_epochs
    total = math.inf
    if per_epoch != math.inf and epochs is not None and epochs >= 0:
        total = math.ceil(per_epoch / n) * epochs
    if trainer.max_steps is not None and trainer.max_steps >= 0:
        total = min(total, trainer.max_steps)
    return total


def scaled_grads(
    loss: torch.Tensor,
    params: Sequence[torch.Tensor],
    trainer: Any,
    retain_graph: bool | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """Gradients of ``loss`` for ``params`` at the loss scale ``opt.step()`` divides by, for writing into ``p.grad``.

    Gradient surgery (PCGrad, GradVac, LibMTL's ``autograd`` mode) takes per-task gradients with
    ``torch.autograd.grad``, combines them and writes the result into ``p.grad`` before
    ``opt.step()``. Under 16-mixed ``opt.step()`` unscales ``p.grad``: it divides by the loss scale
    (``GradScaler.unscale_``, ``torch/amp/grad_scaler.py``), as if ``manual_backward`` had made it,
    so a gradient taken from the unscaled loss ends up the loss scale times too small, and small
    fp16 gradients underflow on the way. This differentiates ``scaler.scale(loss)`` instead, as
    ``manual_backward`` does: the results carry the scale, combine linearly (sums, projections and
    other operations that commute with a constant factor), and the step removes the scale and skips
    on inf/NaN as usual. Without a GradScaler (fp32, bf16-mixed) it is plain ``torch.autograd.grad``.

    Call it inside ``training_step``, write the combined gradients into ``p.grad`` and call
    ``opt.step()`` before the scale can change (no other optimizer's step in between). A
    norm-dependent combination (clipping, a cosine test that compares norms with a constant) sees
    the scaled values; divide by :func:`loss_scale` for those.

    Args:
        loss: a scalar loss of the step.
        params: the parameters to differentiate (those of one optimizer).
        trainer: ``self.trainer``.
        retain_graph: keep the graph for another task's gradients (as in ``torch.autograd.grad``).

    Returns:
        One gradient per parameter, or ``None`` for a parameter ``loss`` does not reach.
    """
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if scaler is not None and scaler.is_enabled():
        loss = scaler.scale(loss)
    return torch.autograd.grad(loss, list(params), retain_graph=retain_graph, allow_unused=True)
