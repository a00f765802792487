"""A precision plugin for manual optimization under mixed precision: ``ManualMixedPrecision``.

Pass it instead of the ``precision=`` flag::

    trainer = Trainer(plugins=[ManualMixedPrecision("16-mixed", "cuda")])   # or "bf16-mixed", "32-true"

Tested with Lightning 2.6.6 and torch 2.13.0 (CPU build; 16-mixed through a CPU GradScaler).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Callable, Generator, Literal

import torch
from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.optim import LBFGS, Optimizer


class NoGradientStepWarning(UserWarning):
    """An optimizer was stepped although none of its parameters had a gradient."""


def _params(optimizer: Any) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def has_gradients(optimizer: Any) -> bool:
    """Whether any parameter of ``optimizer`` (a torch optimizer) currently has a ``.grad``."""
    return any(p.grad is not None for p in _params(optimizer))


class ManualMixedPrecision(MixedPrecision):
    """Lightning's :class:`~lightning.pytorch.plugins.precision.MixedPrecision`, made safe for
    manual optimization with several optimizers.

    Behaviour changes versus Lightning 2.6.6 (``lightning/pytorch/plugins/precision/amp.py``):

    1. **Stepping an optimizer whose parameters have no gradient is a no-op**, exactly as in
       fp32 (``torch.optim`` skips parameters whose ``.grad`` is ``None``), with one
       :class:`~mpguide.precision.NoGradientStepWarning` per optimizer naming it. Stock 16-mixed raises
       ``AssertionError: No inf checks were recorded for this optimizer`` from
       ``GradScaler.step`` (Lightning issues #20116 and #4524); stock fp32 and bf16-mixed stay
       silent, which hides a training bug, so they warn here too. ``on_before_optimizer_step``
       still runs, as in fp32.
    2. **The loss scale is updated once, after every optimizer holding gradients produced at the
       current scale has stepped** (PyTorch's AMP recipe for several optimizers), instead of after
       each ``opt.step()``. With one backward feeding two optimizers, the stock plugin halves the
       scale after the first optimizer overflows and the second then unscales gradients made at
       the old scale: its update doubles (a growth step halves it). Here both unscale with the
       scale their gradients were made with. An optimizer "holds" gradients when a backward since
       its last step created or changed any of its parameters' ``.grad``; GAN-style
       "backward A, step A, backward B, step B" and accumulation windows follow from that rule.
    3. **``self.clip_gradients(opt, ...)`` called before ``opt.step()`` clips unscaled
       gradients**: under 16-mixed the plugin unscales that optimizer first (once; the step then
       does not unscale again), so clipping between ``manual_backward`` and ``opt.step()`` is
       correct, as it is in fp32.
    4. ``"32-true"`` is accepted too (no autocast, no scaler), so one plugin can be passed in
       every precision; it only adds the warning of item 1. bf16-mixed has no scaler and is
       otherwise unchanged.

    Limits: a scale update that must happen while another optimizer still holds gradients made
    at the current scale (an optimizer stepped twice before the other steps once) is performed
    before the second step, as the stock plugin would; gradients zeroed with
    ``set_to_none=False`` still count as held. Optimizers that unscale inside their own step
    (``fused=True``) keep Lightning's behaviour, including its refusal to clip them.

    Args:
        precision: ``"16-mixed"``, ``"bf16-mixed"`` or ``"32-true"``.
        device: device type of the autocast region, ``"cuda"`` or ``"cpu"``.
        scaler: optional ``torch.amp.GradScaler`` for 16-mixed (for example with another
            ``growth_interval``); one with default settings is created otherwise.

    Raises:
        ValueError: any other precision.
    """

    def __init__(self, precision: Literal["16-mixed", "bf16-mixed", "32-true"], device: str,
                 scaler: torch.amp.GradScaler | None = None) -> None:
        if precision == "32-true":
            if scaler is not None:
                raise ValueError("precision='32-true' does not use a GradScaler")
            self.precision, self.device, self.scaler = precision, device, None  # type: ignore[assignment]
        else:
            super().__init__(precision, device, scaler)
        self._warned: set[int] = set()
        self._holding: dict[int, Any] = {}  # optimizers holding gradients made at the current scale
        self._stepped: set[int] = set()  # optimizers stepped since the last scale update
        self._unscaled: set[int] = set()  # optimizers unscaled early (by clip_gradients)
        self._grad_snapshot: dict[int, tuple[int, int]] = {}

    # ------------------------------------------------------------------ autocast
    def autocast_context_manager(self) -> Any:  # noqa: D102 - see MixedPrecision
        if self.precision == "32-true":
            return torch.autocast(self.device, enabled=False)
        return super().autocast_context_manager()

    @contextmanager
    def forward_context(self) -> Generator[None, None, None]:  # noqa: D102
        with self.autocast_context_manager():
            yield

    # ------------------------------------------------------------------ backward bookkeeping
    @staticmethod
    def _grad_key(p: torch.Tensor) -> tuple[int, int]:
        g = p.grad
        return (0, 0) if g is None else (id(g), g._version)

    def _optimizers(self, module: Any) -> list[Any]:
        trainer = getattr(module, "_trainer", None)
        return [getattr(o, "optimizer", o) for o in (trainer.optimizers if trainer is not None else [])]

    def pre_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:  # noqa: D102
        if self.scaler is not None:
            self._maybe_update()  # a deferred update whose optimizers all stepped or dropped their gradients
            self._grad_snapshot = {id(p): self._grad_key(p) for o in self._optimizers(module) for p in _params(o)}
        return super().pre_backward(tensor, module)

    def post_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:  # noqa: D102
        if self.scaler is not None:
            for opt in self._optimizers(module):
                if any(self._grad_key(p) != self._grad_snapshot.get(id(p), (0, 0)) and p.grad is not None
                       for p in _params(opt)):
                    self._holding[id(opt)] = opt
        return super().post_backward(tensor, module)

    # ------------------------------------------------------------------ stepping
    def _warn_no_gradients(self, optimizer: Optimizer) -> None:
        if id(optimizer) not in self._warned:
            self._warned.add(id(optimizer))
            warnings.warn(
                f"{type(optimizer).__name__} optimizer (id {id(optimizer):#x}, {len(_params(optimizer))} parameter "
                f"tensors) was stepped but none of its parameters has a gradient; the step does nothing (as in "
                f"fp32). Check that its loss reaches its model, that the right optimizer is toggled, and that "
                f"no zero_grad() runs between backward and step.",
                NoGradientStepWarning,
                stacklevel=2,
            )

    def _maybe_update(self) -> None:
        still_holding = [o for o in self._holding.values() if has_gradients(o)]
        self._holding = {id(o): o for o in still_holding}
        if self._stepped and not still_holding:
            self._update()

    def _update(self) -> None:
        self.scaler.update()
        self._stepped.clear()
        self._unscaled.clear()

    def optimizer_step(self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        """Run ``closure``, then step ``optimizer`` following the rules of the class docstring.

        Raises:
            MisconfigurationException: LBFGS under 16-mixed (GradScaler does not take closures).
        """
        if self.scaler is None:
            def checked_closure() -> Any:
                result = closure()
                if not has_gradients(optimizer) and not (result is None and model.automatic_optimization):
                    self._warn_no_gradients(optimizer)
                return result

            return super().optimizer_step(optimizer, model=model, closure=checked_closure, **kwargs)
        if isinstance(optimizer, LBFGS):
            raise MisconfigurationException("AMP and the LBFGS optimizer are not compatible.")
        closure_result = closure()
        if closure_result is None and model.automatic_optimization:
            return closure_result  # the training step skipped its backward: nothing to step
        key = id(optimizer)
        if not has_gradients(optimizer):
            self._warn_no_gradients(optimizer)
            self._after_closure(model, optimizer)
            self._holding.pop(key, None)
            self._maybe_update()
            return closure_result
        if key in self._stepped:
            self._update()  # stepped twice since the last update: GradScaler needs the update first
        if not _optimizer_handles_unscaling(optimizer) and key not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(key)
        self._after_closure(model, optimizer)
        output = self.scaler.step(optimizer, **kwargs)
        self._stepped.add(key)
        self._holding.pop(key, None)
        self._maybe_update()
        return output

    def clip_gradients(self, optimizer: Optimizer, clip_val: int | float = 0.0,
                       gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM) -> None:
        """Clip gradients; under 16-mixed unscale them first if the step has not done so yet.

        ``optimizer`` may be the :class:`~lightning.pytorch.core.optimizer.LightningOptimizer` that
        ``self.optimizers()`` returns or the torch optimizer inside it.
        """
        optimizer = getattr(optimizer, "optimizer", optimizer)
        if self.precision == "32-true":  # exactly fp32's clipping, fused optimizers included
            Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)
            return
        if (clip_val and self.scaler is not None and not _optimizer_handles_unscaling(optimizer)
                and id(optimizer) not in self._unscaled and id(optimizer) in self._holding
                and has_gradients(optimizer)):
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))
        super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The GradScaler's state (empty without a scaler), as Lightning stores it in checkpoints."""
        return super().state_dict()
