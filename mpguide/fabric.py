"""A precision plugin for Lightning Fabric's manual loop under 16-mixed: :class:`FabricManualMixedPrecision`.

Its rules are in the class docstring (``help(FabricManualMixedPrecision)``). It shares its
loss-scale bookkeeping and its warning with the Trainer plugin through :mod:`mpguide._common`.
The example-time harness that records Fabric runs is :mod:`mpguide.verify.run.fabric`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.fabric.plugins.precision import MixedPrecision
from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
from torch.nn import Module
from typing_extensions import override

from ._common import HeldGradientScales, OptimizerRecord, has_gradients, unwrap
from ._common import NoGradientStepWarning as NoGradientStepWarning  # re-exported: the warning both plugins raise


class FabricManualMixedPrecision(HeldGradientScales, MixedPrecision):
    """Fabric's ``MixedPrecision`` with a scale-update rule that keeps GradScaler's contract, held gradients
    kept at their scale, and no-op empty steps.

    Use it instead of ``precision="16-mixed"``::

        fabric = Fabric(plugins=[FabricManualMixedPrecision("16-mixed", "cuda")])

    Fabric's own plugin (Lightning 2.6.6, ``fabric/plugins/precision/amp.py``) calls
    ``scaler.update()`` right after every ``scaler.step(optimizer)``: with one backward and two
    optimizers the second unscales gradients made at a scale that has since changed; and stepping an
    optimizer whose parameters have no gradient raises ``AssertionError: No inf checks were recorded
    for this optimizer`` (``torch/amp/grad_scaler.py``). The Trainer's plugins cannot be passed to
    Fabric instead: Fabric calls their ``pre_backward(tensor, module)`` with ``module=None``, and
    they read ``module.trainer``. The rules of this plugin:

    * ``optimizer.step()`` unscales and steps (skipping the step on inf/NaN, as GradScaler does) but
      does not update the scale by itself; see the scale-update rule below.
    * A gradient an optimizer keeps across a scale update (an optimizer stepped every k-th batch,
      accumulation, a clip without a step) is brought to the new scale before the next backward adds
      to it, so every optimizer unscales by the scale its gradients carry. This covers the
      parameters of every module passed to ``fabric.setup``/``fabric.setup_module`` and of every
      optimizer once stepped or clipped.
    * Each optimizer's gradients are unscaled at most once per step, whether
      ``fabric.clip_gradients`` or the step unscales them.
    * Stepping an optimizer none of whose parameters has a gradient does nothing and warns once per
      optimizer (:class:`~mpguide._common.NoGradientStepWarning`), instead of raising "No inf checks
      were recorded". With a closure (``optimizer.step(closure)``) the gradients are checked after
      the closure ran.
    * ``plugin.step_was_skipped(optimizer)``
      (:meth:`~mpguide._common.HeldGradientScales.step_was_skipped`) tells whether GradScaler
      skipped that optimizer's latest step.
    * ``bf16-mixed`` (no scaler) is Fabric's plugin unchanged, plus the warning;
      ``GradScaler(enabled=False)`` scales nothing and steps as Fabric's plugin does.

    The scale-update rule: an optimizer step goes through GradScaler.step (skipped on inf/NaN
    gradients) without updating the loss scale. The pending GradScaler.update() runs at the first of
    these moments: (1) right after a step, once every optimizer that holds gradients has stepped
    since the last update; (2) before a backward, when a step since the last update was skipped, or
    was taken by a fused optimizer (whose inf check is not read, so as to add no device sync); (3)
    before an optimizer that already stepped since the last update is unscaled or stepped again; (4)
    Trainer: when training_step returns, if an optimizer stepped in it; Fabric: at
    plugin.update_scale() and before plugin.state_dict(). An update that follows k > 1 skipped
    steps backs off k times, once per skipped step, as Lightning's plugin does.

    What the rule keeps and costs (measured in ``tests/test_fabric.py``,
    ``tests/test_generated_programs.py`` and ``nox -s patterns``; example 14 and the guide's Fabric
    section give the numbers): GradScaler never sees two steps of one optimizer without an update
    between them (rule 3); every gradient is unscaled with the scale it was made at, held gradients
    being brought to a new scale first; never more updates than steps (Lightning's plugins make one
    per step) and, on the generated programs, no more skips than Lightning's plugin, because an
    overflow lowers the scale before the next backward (rule 2) and an update backs off once per
    skipped step, as there. That also means the scale can change inside an accumulation window of
    another optimizer; its held gradient is then brought to the new scale, so each micro-batch still
    counts once. It is not PyTorch's one update per iteration wherever rule 1 completes early: one
    optimizer stepped k times in an iteration gets k updates, as with Fabric's plugin; a loop that
    zeroes each optimizer right after its step (CycleGAN's three optimizers) completes rule 1 more
    than once per iteration; a loop that zeroes each optimizer just before its backward (Lightning's
    Fabric DCGAN example) gets one update per iteration.

    Fabric shows a precision plugin an optimizer only at its first step or clip: for rule 1 a gradient
    on a parameter of a module passed to ``fabric.setup`` that no optimizer met so far holds counts as
    held by an optimizer that has not stepped. A saved ``plugin.scaler`` (PyTorch's recipe saves the
    GradScaler) holds the current scale whenever no update is pending: always with one optimizer
    (rule 1 after each step; ``test_a_saved_gradscaler_holds_the_current_scale``), but not between a
    generator's step and the next critic step of a GAN loop; save the plugin itself
    (``state["precision"] = plugin``, its ``state_dict`` applies the pending update) or call
    :meth:`update_scale` before ``fabric.save``.

    Limits: one device (not tested with DDP, DeepSpeed or FSDP); no parameter in two optimizers; no
    clipping of fused optimizers (as Fabric's plugin); tested with Lightning 2.6.6 and torch 2.13.

    As with the Trainer plugin, a direct ``torch.nn.utils.clip_grad_norm_`` between
    ``fabric.backward`` and ``optimizer.step()`` sees scaled gradients under 16-mixed; clip with
    ``fabric.clip_gradients(model, optimizer, max_norm=..., error_if_nonfinite=False)``, which
    unscales first. Its default ``error_if_nonfinite=True`` (``lightning/fabric/fabric.py``) raises
    ``RuntimeError: The total norm ... is non-finite`` at the first overflow, with this plugin and
    with Fabric's, where GradScaler would skip the step and lower the scale; with ``False`` the
    gradients become non-finite and the step is skipped.

    Two things no precision plugin can see (``tests/test_fabric_edges.py``):

    * autocast covers the ``forward`` of a module passed to ``fabric.setup``; any other method
      (``agent.training_step(...)`` in Lightning's Fabric PPO example) runs in float32 on one device
      (``lightning/fabric/wrappers.py`` routes methods marked with ``mark_forward_method`` through
      ``forward`` only under a strategy wrapper such as DDP). Call such a method inside
      ``with fabric.autocast():``;
    * an optimizer not passed to ``fabric.setup`` never reaches the plugin: ``fabric.backward`` still
      scales the loss, and its ``step()`` applies the scaled gradients (an SGD update the loss scale
      times too large; adaptive optimizers hide most of it). Set up every optimizer.

    Args:
        precision: ``"16-mixed"`` or ``"bf16-mixed"``.
        device: ``"cuda"`` or ``"cpu"``.
        scaler: optional ``torch.amp.GradScaler`` (one with default settings is created for 16-mixed).

    Raises:
        ValueError: another precision, or a scaler with ``"bf16-mixed"`` (from Fabric's plugin).
    """

    def __init__(self, precision: str, device: str, scaler: torch.amp.GradScaler | None = None) -> None:
        super().__init__(precision, device, scaler)  # type: ignore[arg-type]
        self._init_held_scales()

    @override
    def _record(self, optimizer: Any) -> OptimizerRecord:
        record = self._find(optimizer)
        if record is None:
            # Fabric never shows its precision plugin the optimizers: they are met at their first step or clip
            inner = unwrap(optimizer)
            record = self._add_record(inner, f"{type(inner).__name__} optimizer")
        return record

    @override
    def convert_module(self, module: Module) -> Module:
        module = super().convert_module(module)
        # fabric.setup passes every module here: follow its gradients before any optimizer is met
        self._track(module.parameters())
        return module

    def update_scale(self) -> bool:
        """Apply the pending loss-scale update now. Returns ``True`` when there was one."""
        if not self._scaling() or not self._pending():
            return False
        self._update()
        return True

    @override
    def backward(self, tensor: torch.Tensor, model: Module | None, *args: Any, **kwargs: Any) -> None:
        """Apply a pending update if a step since it was skipped (rule 2), bring held gradients to the
        current scale, then scale and backpropagate ``tensor``."""
        if self._scaling():
            self._before_backward()  # so that this backward adds like to like, at a lowered scale after a skip
        super().backward(tensor, model, *args, **kwargs)

    @override
    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        """Step ``optimizer`` through GradScaler without updating the scale; a step without gradients is a no-op.

        A closure (``optimizer.step(closure)``) makes the gradients, so they are checked after it has run
        (the step itself is then taken as Fabric's plugin takes it).

        Raises:
            TypeError: LBFGS under 16-mixed (as Fabric's plugin; GradScaler does not take closures).
            RuntimeError: a closure under 16-mixed (from ``GradScaler.step``, as with Fabric's plugin).
        """
        if self._scaling() and isinstance(optimizer, torch.optim.LBFGS):
            raise TypeError("AMP and the LBFGS optimizer are not compatible.")
        record = self._record(optimizer)
        if kwargs.get("closure") is not None:
            kwargs["closure"] = self._checked_closure(record, kwargs["closure"])
            if self._scaling():
                return self.scaler.step(optimizer, **kwargs)  # GradScaler refuses closures, as with Fabric's plugin
        elif not has_gradients(optimizer):
            self._warn_no_gradients(record, stacklevel=5)  # stacklevel: the user's optimizer.step() line
            self._no_op_step(record)
            return None
        if not self._scaling():
            return super().optimizer_step(optimizer, **kwargs)
        self._unscale(record)  # applies the pending update first when it already stepped since it (rule 3)
        return self._scaler_step(record, optimizer, **kwargs)

    def _checked_closure(self, record: OptimizerRecord, closure: Callable[[], Any]) -> Callable[[], Any]:
        def checked() -> Any:
            result = closure()
            if not has_gradients(record.optimizer):
                self._warn_no_gradients(record)
            return result

        return checked

    @override
    def unscale_gradients(self, optimizer: Any) -> None:
        """Unscale before clipping (``fabric.clip_gradients``), once per step; applies a pending update first
        when this optimizer already stepped since the last one.

        Raises:
            NotImplementedError: a fused optimizer (it unscales inside its step), as with Fabric's plugin.
        """
        if not self._scaling():
            return
        record = self._record(optimizer)
        if _optimizer_handles_unscaling(record.optimizer):
            raise NotImplementedError("Gradient clipping is not implemented for optimizers handling the unscaling.")
        self._unscale(record)  # clipped after its step: the pending update first (rule 3)

    @override
    def state_dict(self) -> dict[str, Any]:
        """The GradScaler's state after applying any pending update (for ``fabric.save``)."""
        self.update_scale()
        return super().state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._scale_cache = None


def loss_scale(fabric: Any) -> float | None:
    """The loss scale of ``fabric``'s GradScaler, or ``None`` without one (fp32, bf16-mixed)."""
    scaler = getattr(fabric.strategy.precision, "scaler", None)
    return None if scaler is None else float(scaler.get_scale())
