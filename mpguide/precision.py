"""A precision plugin for manual optimization under mixed precision: :class:`ManualMixedPrecision`.

Its rules are in the class docstring (``help(ManualMixedPrecision)``); the guide page
(``docs/model/manual_optimization.md``) shows them measured. The bookkeeping it shares with the
Fabric plugin (:mod:`mpguide.fabric`) lives in :mod:`mpguide._common`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any, Literal

import lightning
import torch
from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.optim import LBFGS, Optimizer
from typing_extensions import override

from ._common import HeldGradientScales, OptimizerRecord, has_gradients, unwrap
from ._common import NoGradientStepWarning as NoGradientStepWarning  # re-exported: the warning both plugins raise

#: Lightning minor versions whose internals this plugin was checked against (tested with 2.6.6).
SUPPORTED_LIGHTNING = ("2.6",)


class UnsupportedVersionError(RuntimeError):
    """The installed Lightning or torch lacks an internal ``ManualMixedPrecision`` relies on."""


def check_versions(lightning_version: str | None = None) -> None:
    """Refuse versions whose internals the plugin was not checked against.

    Args:
        lightning_version: version string to check; defaults to the installed ``lightning.__version__``.

    Raises:
        UnsupportedVersionError: Lightning is not one of :data:`SUPPORTED_LIGHTNING`, or
            ``torch.amp.GradScaler`` lacks ``_per_optimizer_states``/``_get_scale_async``.
    """
    version = lightning_version or lightning.__version__
    if ".".join(version.split(".")[:2]) not in SUPPORTED_LIGHTNING:
        raise UnsupportedVersionError(
            f"ManualMixedPrecision was tested with Lightning {', '.join(SUPPORTED_LIGHTNING)}.x (2.6.6); "
            f"found "
            f"{version}. It relies on Lightning internals (plugins/precision/amp.py, strategies/strategy.py, "
            f"trainer/connectors/checkpoint_connector.py): install lightning==2.6.6 or use MixedPrecision."
        )
    scaler = torch.amp.GradScaler("cpu")
    if not hasattr(scaler, "_per_optimizer_states") or not hasattr(scaler, "_get_scale_async"):
        raise UnsupportedVersionError(
            f"torch {torch.__version__}: torch.amp.GradScaler has no _per_optimizer_states/_get_scale_async "
            f"(torch/amp/grad_scaler.py), which ManualMixedPrecision reads; it was tested with torch 2.13."
        )


class ManualMixedPrecision(HeldGradientScales, MixedPrecision):
    """Lightning's ``MixedPrecision`` made correct for manual optimization.

    Pass it instead of the ``precision=`` flag::

        trainer = Trainer(plugins=[ManualMixedPrecision("16-mixed", "cuda")])   # or "bf16-mixed", "32-true"

    Under 16-mixed it keeps GradScaler's contract (``torch/amp/grad_scaler.py``) where Lightning's
    plugin (``lightning/pytorch/plugins/precision/amp.py``, which calls ``GradScaler.update()`` inside
    every ``opt.step()``) breaks it: an optimizer whose gradients were made before another
    optimizer's update is unscaled with the changed scale there (update x2 after an overflow, x0.5
    after a growth).

    The scale-update rule: an optimizer step goes through GradScaler.step (skipped on inf/NaN
    gradients) without updating the loss scale. The pending GradScaler.update() runs at the first of
    these moments: (1) right after a step, once every optimizer that holds gradients has stepped
    since the last update; (2) before a backward, when a step since the last update was skipped, or
    was taken by a fused optimizer (whose inf check is not read, so as to add no device sync); (3)
    before an optimizer that already stepped since the last update is unscaled or stepped again; (4)
    Trainer: when training_step returns, if an optimizer stepped in it; Fabric: at
    plugin.update_scale() and before plugin.state_dict(). An update that follows k > 1 skipped
    steps backs off k times, once per skipped step, as Lightning's plugin does.

    What the rule keeps and costs (measured in ``tests/test_precision.py``,
    ``tests/test_generated_programs.py`` and ``nox -s patterns``; the guide's ``plugin`` section
    and examples 03 and 14 give the numbers): GradScaler never sees two steps of one optimizer
    without an update between them (rule 3); every gradient is unscaled with the scale it was made
    at, held gradients being brought to a new scale first (except the gradients an added optimizer
    holds before its first step, below); never more updates than steps (Lightning's plugins make one
    per step) and, on the generated programs, no more skips than Lightning's plugin, because an
    overflow lowers the scale before the next backward (rule 2) and an update backs off once per
    skipped step, as there. That also means the scale can change inside an accumulation window of
    another optimizer; its held gradient is then brought to the new scale, so each micro-batch still
    counts once. It is not PyTorch's one update per iteration wherever rule 1 completes early: one
    optimizer stepped k times in one training_step (truncated BPTT, a critic stepped k times per
    generator step) gets k updates, as with Lightning's plugin, so the scale grows up to k times as
    fast as PyTorch's recipe would let it; a loop that zeroes each optimizer right after its step
    completes rule 1 early too (CycleGAN's three optimizers: more than one update per iteration);
    one that zeroes each optimizer just before its backward gets one per iteration.

    The other rules:

    * each optimizer's gradients are unscaled at most once per optimizer step, whether
      ``self.clip_gradients`` or the step unscales them; gradients an optimizer keeps across a scale
      change (accumulation, an optimizer stepped every k-th batch, a clip without a step) are brought
      to the new scale first;
    * ``opt.step()``, ``on_before_optimizer_step`` and clipping run with autocast disabled, as in
      automatic optimization. ``manual_backward`` runs in ``training_step``'s autocast region, as with
      Lightning's plugin: code that recomputes a forward inside the backward (a GradCache backward
      hook, an ldm-style activation checkpoint) needs that region and raises a dtype mismatch
      outside it; the backward kernels themselves are not autocast, so
      gradients equal those of a backward outside it (``test_recompute_in_backward_...``);
    * an optimizer the trainer did not get from ``configure_optimizers`` (a callback assigning
      ``trainer.optimizers``) is registered at its first step or clip and replaces the optimizer
      whose parameters it shares. Until then the plugin does not know it holds gradients: rule 1 can
      update the scale before its first step, which then unscales gradients made at the old scale
      with the new one (its first update is off by the growth or backoff factor; Lightning's plugin
      is off too). Its later steps follow the rules. To avoid it, return every optimizer from
      ``configure_optimizers``, or add one only where no other optimizer holds gradients;
    * ``GradScaler(enabled=False)`` scales nothing: the plugin then steps as in fp32, as Lightning's;
    * stepping an optimizer without gradients is a no-op that warns once per optimizer
      (:class:`~mpguide._common.NoGradientStepWarning`), as in fp32;
    * checkpoints keep the loss scale when a run moves between this plugin and Lightning's
      ``MixedPrecision`` in either direction;
    * ``plugin.step_was_skipped(optimizer)``
      (:meth:`~mpguide._common.HeldGradientScales.step_was_skipped`) tells whether GradScaler
      skipped that optimizer's latest step (``False`` after a step that was a no-op).

    Limits: Lightning 2.6.x only; one device (DDP not tested; not DeepSpeed or FSDP); no parameter
    in two optimizers; no clipping of fused optimizers and no LBFGS under 16-mixed (as Lightning's
    plugin); the generated programs inject overflows at small scales on CPU, so the claims above are
    measured on injected, not natural, overflows.

    What it does not fix: a direct ``torch.nn.utils.clip_grad_norm_(params, ...)`` (or any other
    reading of ``p.grad``) between ``manual_backward`` and ``opt.step()`` still sees the scaled
    gradients under 16-mixed, as with Lightning's plugin: every clipped update is the loss scale
    times too small (``tests/test_clipping.py``). Clip with
    ``self.clip_gradients(opt, gradient_clip_val=...)``, or call ``clip_grad_norm_`` inside
    ``on_before_optimizer_step``, which ``opt.step()`` calls after unscaling: both match fp32.
    Unscaling right after every backward would make direct calls correct but decides the skip on the
    gradients as the backward left them: a gradient repaired between backward and step
    (``torch.nan_to_num_``) would then be skipped and the scale halved, where fp32 and GradScaler's
    own check at the step apply it, so the plugin unscales
    at the clip or the step, as GradScaler's recipe does. Such a direct clip acts on gradients
    multiplied by the loss scale at that moment, and this plugin moves the scale at other moments
    than Lightning's, so the two give different (both wrong) weights: no claim is made for it.

    Tested with Lightning 2.6.6 and torch 2.13.0 (CPU build; 16-mixed through a CPU GradScaler), one
    device; its tests also run on CUDA when a GPU is present. It relies on Lightning 2.6 internals
    (the iteration boundary ``train_step_context``, the checkpoint key ``type(plugin).__qualname__``)
    and on GradScaler's per-optimizer state; constructing it with another Lightning minor version
    raises :class:`UnsupportedVersionError`.

    Args:
        precision: ``"16-mixed"``, ``"bf16-mixed"`` or ``"32-true"``.
        device: device type of the autocast region, ``"cuda"`` or ``"cpu"``.
        scaler: optional ``torch.amp.GradScaler`` for 16-mixed (for example with another
            ``growth_interval``); one with default settings is created otherwise.

    Raises:
        ValueError: any other precision, or a scaler with ``"32-true"``.
        UnsupportedVersionError: see :func:`check_versions`.
    """

    def __init__(
        self,
        precision: Literal["16-mixed", "bf16-mixed", "32-true"],
        device: str,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        check_versions()
        if precision == "32-true":
            if scaler is not None:
                raise ValueError("precision='32-true' does not use a GradScaler")
            # no autocast and no scaler; MixedPrecision.__init__ refuses "32-true", so set its fields here
            self.precision, self.device, self.scaler = precision, device, None  # type: ignore[assignment]
        else:
            super().__init__(precision, device, scaler)
        self._init_held_scales()
        self._in_training_step = False

    # ------------------------------------------------------------------ setup and lookup
    @override
    def connect(self, model: Any, optimizers: list[Any], lr_schedulers: list[Any]) -> Any:
        self._init_held_scales()
        for i, optimizer in enumerate(optimizers):
            inner = unwrap(optimizer)
            self._add_record(inner, f"optimizer {i} ({type(inner).__name__}) of configure_optimizers")
        return super().connect(model, optimizers, lr_schedulers)

    @override
    def _record(self, optimizer: Any) -> OptimizerRecord:
        record = self._find(optimizer)
        if record is None:
            # not from configure_optimizers: a callback replaced trainer.optimizers mid-run (stock runs it)
            inner = unwrap(optimizer)
            record = self._add_record(inner, f"{type(inner).__name__} optimizer (not from configure_optimizers)")
        return record

    # ------------------------------------------------------------------ autocast
    @override
    def autocast_context_manager(self) -> torch.autocast:
        if self.precision == "32-true":
            return torch.autocast(self.device, enabled=False)
        return super().autocast_context_manager()

    @override
    @contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        """The region ``training_step`` runs in: Lightning's, except that ``"32-true"`` opens no autocast.

        Lightning 2.6.6's ``MixedPrecision.forward_context`` enters ``autocast_context_manager()``,
        so overriding ``autocast_context_manager`` sufficed; its master branch (commit 7f0c343, pull request #21616)
        builds ``torch.autocast(device, dtype=...)`` itself, with float16 for any precision other than
        bf16-mixed, so ``"32-true"`` ran fp16 autocast there (found by the version matrix's master
        column). The mixed precisions keep the parent's region, with its cache policy.
        """
        if self.precision == "32-true":
            with self.autocast_context_manager():
                yield
        else:
            with super().forward_context():
                yield

    def _no_autocast(self) -> torch.autocast:
        """Optimizer math runs outside autocast, as in automatic optimization."""
        return torch.autocast(self.device, enabled=False)

    @override
    @contextmanager
    def train_step_context(self) -> Generator[None, None, None]:
        self._in_training_step = True
        try:
            with self.forward_context():
                yield
        finally:
            self._in_training_step = False
        # reached only when training_step returned: the end of the iteration
        self._end_iteration()

    # ------------------------------------------------------------------ scale bookkeeping (see _common)
    def _end_iteration(self) -> None:
        # rule 4; no optimizer stepped (an accumulation window): the scale stays, as PyTorch's recipe says
        if self._scaling() and self._pending():
            self._update()

    # ------------------------------------------------------------------ hooks
    @override
    def pre_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:
        if self._scaling():
            # rule 2, and held gradients to the scale this backward uses, so that it adds like to like
            self._before_backward()
        return super().pre_backward(tensor, module)  # scales the loss (initializing the scale)

    # manual_backward is not overridden: it runs in training_step's autocast region, as with Lightning's
    # plugin. Code that recomputes a forward inside the backward (a GradCache hook, an ldm-style activation
    # checkpoint) needs that region; autocast does not change the backward kernels themselves.

    @override
    def optimizer_step(self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        """Run ``closure``, then step ``optimizer`` outside autocast.

        Raises:
            MisconfigurationException: LBFGS under 16-mixed (GradScaler does not take closures).
        """
        if not self._scaling():
            return self._step_without_scaler(optimizer, model, closure, **kwargs)
        if isinstance(optimizer, LBFGS):
            raise MisconfigurationException("AMP and the LBFGS optimizer are not compatible.")
        closure_result = closure()
        if closure_result is None and model.automatic_optimization:
            return closure_result  # the training step skipped its backward: nothing to step
        record = self._record(optimizer)
        if not has_gradients(optimizer):
            self._warn_no_gradients(record)
            self._no_op_step(record)
            with self._no_autocast():
                self._after_closure(model, optimizer)
            return closure_result
        self._unscale(record)
        with self._no_autocast():
            self._after_closure(model, optimizer)  # on_before_optimizer_step sees unscaled gradients
            output = self._scaler_step(record, optimizer, **kwargs)
        if not self._in_training_step and self._pending():
            self._update()  # automatic optimization, or a step taken in a hook: no iteration end to wait for
        return output

    def _step_without_scaler(self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        """fp32 and bf16-mixed: Lightning's step, outside autocast, warning when nothing has a gradient."""
        record = self._record(optimizer)

        def checked_closure() -> Any:
            if model.automatic_optimization:
                result = closure()  # training_step opens its own autocast region
            else:
                with self.forward_context():  # a closure passed to opt.step() runs in training_step's region
                    result = closure()
            if not has_gradients(optimizer) and not (result is None and model.automatic_optimization):
                self._warn_no_gradients(record)
            return result

        with self._no_autocast():
            return Precision.optimizer_step(self, optimizer, model=model, closure=checked_closure, **kwargs)

    @override
    def clip_gradients(
        self,
        optimizer: Optimizer,
        clip_val: float = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        """Clip gradients outside autocast; under 16-mixed unscale them first if not done yet.

        ``optimizer`` may be the ``LightningOptimizer`` that ``self.optimizers()`` returns.

        Raises:
            RuntimeError: clipping a fused optimizer under mixed precision (as Lightning does).
        """
        optimizer = unwrap(optimizer)
        with self._no_autocast():
            if self.precision == "32-true":  # exactly fp32's clipping, fused optimizers included
                Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)
                return
            if (
                clip_val
                and self._scaling()
                and not _optimizer_handles_unscaling(optimizer)
                and has_gradients(optimizer)
            ):
                self._unscale(self._record(optimizer))
            super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)

    # ------------------------------------------------------------------ checkpoints
    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning stores our state under "ManualMixedPrecision" (type(plugin).__qualname__ in
        # trainer/connectors/checkpoint_connector.py); the stock plugin only looks for its own name
        state = self.state_dict()
        if state:
            checkpoint.setdefault(MixedPrecision.__qualname__, state)

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # runs before Lightning loads checkpoint[type(self).__qualname__]; a checkpoint written with the
        # stock plugin (or with this class under another subclass name) has only the other key
        if type(self).__qualname__ in checkpoint:
            return
        for key in (ManualMixedPrecision.__qualname__, MixedPrecision.__qualname__):
            if key in checkpoint:
                self.load_state_dict(checkpoint[key])
                self._scale_cache = None
                return

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._scale_cache = None
