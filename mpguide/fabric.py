"""Lightning Fabric's manual loop under 16-mixed: a precision plugin for several optimizers.

Fabric (Lightning 2.6.6, ``fabric/plugins/precision/amp.py``) has the same two 16-mixed behaviours
as the Trainer's plugin: ``MixedPrecision.optimizer_step`` calls ``scaler.update()`` right after
every ``scaler.step(optimizer)``, so with one backward and two optimizers the second unscales
gradients made at a scale that has since changed; and stepping an optimizer whose parameters have
no gradient raises ``AssertionError: No inf checks were recorded for this optimizer``
(``torch/amp/grad_scaler.py``). The Trainer's plugins cannot be passed to Fabric instead: Fabric
accepts them (they subclass Fabric's ``Precision``) but calls their ``pre_backward(tensor, module)``
with ``module=None``, and they read ``module.trainer``.

:class:`FabricManualMixedPrecision` is a Fabric plugin that (1) updates the loss scale once per
iteration, after every optimizer has stepped, and (2) turns a step without gradients into a warned
no-op, as in fp32. The examples' recorded Fabric runs live in :mod:`mpguide.verify.fabric_runs`.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from lightning.fabric.plugins.precision import MixedPrecision



class EmptyStepWarning(UserWarning):
    """An optimizer was stepped although none of its parameters had a gradient (the step did nothing)."""


def has_gradients(optimizer: Any) -> bool:
    """Whether any parameter of ``optimizer`` (a torch optimizer or Fabric's wrapper) has a ``.grad``."""
    return any(p.grad is not None for group in optimizer.param_groups for p in group["params"])


class FabricManualMixedPrecision(MixedPrecision):
    """Fabric's ``MixedPrecision`` with one loss-scale update per iteration and no-op empty steps.

    Use it instead of ``precision="16-mixed"``::

        fabric = Fabric(plugins=[FabricManualMixedPrecision("16-mixed", "cuda")])

    * ``optimizer.step()`` unscales and steps (skipping the step on inf/NaN as GradScaler does) but
      does not update the scale. The update happens at the next ``fabric.backward`` (or at
      :meth:`update_scale`, or before :meth:`state_dict`), so every optimizer of an iteration
      unscales with the scale its gradients were made with, and one overflow lowers the scale once
      (PyTorch's recipe for several optimizers: ``scaler.update()`` once, after all ``scaler.step``).
      Stepping the same optimizer again before a backward applies the pending update first, as
      GradScaler requires.
    * Stepping an optimizer none of whose parameters has a gradient does nothing and warns once per
      optimizer (:class:`EmptyStepWarning`), instead of raising "No inf checks were recorded". With a
      closure (``optimizer.step(closure)``) the gradients are checked after the closure ran.
    * ``bf16-mixed`` (no scaler) is Fabric's plugin unchanged, plus the warning.

    Args:
        precision: ``"16-mixed"`` or ``"bf16-mixed"``.
        device: ``"cuda"`` or ``"cpu"``.
        scaler: optional ``torch.amp.GradScaler`` (one with default settings is created for 16-mixed).
    """

    def __init__(self, precision: str, device: str, scaler: torch.amp.GradScaler | None = None) -> None:
        super().__init__(precision, device, scaler)  # type: ignore[arg-type]
        self._stepped: set[int] = set()  # optimizers stepped since the last scale update
        self._warned: set[int] = set()

    def update_scale(self) -> bool:
        """Apply the pending loss-scale update now. Returns ``True`` when there was one."""
        if self.scaler is None or not self._stepped:
            return False
        self.scaler.update()
        self._stepped.clear()
        return True

    def backward(self, tensor: torch.Tensor, model: Any, *args: Any, **kwargs: Any) -> None:
        """Apply the previous iteration's pending scale update, then scale and backpropagate ``tensor``."""
        self.update_scale()
        super().backward(tensor, model, *args, **kwargs)

    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        """Step ``optimizer`` through GradScaler without updating the scale; a step without gradients is a no-op.

        A closure (``optimizer.step(closure)``) makes the gradients, so they are checked after it has run
        (the step itself is then taken as Fabric's plugin takes it).

        Raises:
            TypeError: LBFGS under 16-mixed (as Fabric's plugin; GradScaler does not take closures).
        """
        if self.scaler is not None and isinstance(optimizer, torch.optim.LBFGS):
            raise TypeError("AMP and the LBFGS optimizer are not compatible.")
        if kwargs.get("closure") is not None:
            kwargs["closure"] = self._checked_closure(optimizer, kwargs["closure"])
        elif not has_gradients(optimizer):
            self._warn_empty(optimizer)
            return None
        if self.scaler is None:
            return super().optimizer_step(optimizer, **kwargs)
        if id(optimizer) in self._stepped:
            self.update_scale()  # stepped twice without a backward in between: GradScaler needs the update
        output = self.scaler.step(optimizer, **kwargs)
        self._stepped.add(id(optimizer))
        return output

    def _warn_empty(self, optimizer: Any) -> None:
        if id(optimizer) not in self._warned:
            self._warned.add(id(optimizer))
            warnings.warn(f"{type(optimizer).__name__} was stepped but none of its parameters has a gradient; "
                          f"the step does nothing (as in fp32). Check that the loss reaches its model.",
                          EmptyStepWarning, stacklevel=3)

    def _checked_closure(self, optimizer: Any, closure: Callable[[], Any]) -> Callable[[], Any]:
        def checked() -> Any:
            result = closure()
            if not has_gradients(optimizer):
                self._warn_empty(optimizer)
            return result

        return checked

    def unscale_gradients(self, optimizer: Any) -> None:
        """Unscale before clipping (``fabric.clip_gradients``); applies a pending update this optimizer needs first."""
        if self.scaler is not None and id(optimizer) in self._stepped:
            self.update_scale()
        super().unscale_gradients(optimizer)

    def state_dict(self) -> dict[str, Any]:
        """The GradScaler's state after applying any pending update (for ``fabric.save``)."""
        self.update_scale()
        return super().state_dict()


def loss_scale(fabric: Any) -> float | None:
    """The loss scale of ``fabric``'s GradScaler, or ``None`` without one (fp32, bf16-mixed)."""
    scaler = getattr(fabric.strategy.precision, "scaler", None)
    return None if scaler is None else float(scaler.get_scale())
