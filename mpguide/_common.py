"""What the Trainer plugin (:mod:`mpguide.precision`) and the Fabric plugin (:mod:`mpguide.fabric`) share.

Reader layer: imports only torch and Lightning. Two things live here:

* :class:`NoGradientStepWarning` and the small optimizer helpers both plugins use;
* :class:`HeldGradientScales`, the 16-mixed bookkeeping both plugins need when an optimizer keeps
  its gradients across a loss-scale change (an optimizer stepped every k-th batch, accumulation, a
  clip without a step): which scale each held gradient is multiplied by, bringing it to the current
  scale before the next backward adds to it, unscaling each optimizer at most once per step, and
  ``GradScaler.update()`` from the inf checks of the steps taken since the last update.

GradScaler (``torch/amp/grad_scaler.py``) multiplies every new gradient by the current scale and
divides an optimizer's gradients by the current scale at ``unscale_``/``step``. It does not know
that a gradient was made at an older scale: an optimizer that holds a gradient made at scale S
while ``update()`` moves the scale to S' unscales it by S', so its update is S/S' times too large
(x2 after one overflow, x0.5 after one growth).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
from torch.amp.grad_scaler import OptState
from torch.optim import Optimizer


class NoGradientStepWarning(UserWarning):
    """An optimizer was stepped although none of its parameters had a gradient (the step did nothing).

    Both :class:`mpguide.precision.ManualMixedPrecision` and :class:`mpguide.fabric.FabricManualMixedPrecision`
    warn with it, once per optimizer.
    """


def params(optimizer: Any) -> list[torch.Tensor]:
    """The parameters of ``optimizer`` (a torch optimizer, or a wrapper exposing ``param_groups``)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def has_gradients(optimizer: Any) -> bool:
    """Whether any parameter of ``optimizer`` (a torch optimizer or Lightning's/Fabric's wrapper) has a ``.grad``."""
    return any(p.grad is not None for p in params(optimizer))


def unwrap(optimizer: Any) -> Any:
    """The torch optimizer inside Lightning's ``LightningOptimizer`` or Fabric's ``_FabricOptimizer``."""
    return getattr(optimizer, "optimizer", optimizer)


@dataclass
class OptimizerRecord:
    """What a plugin knows about one optimizer."""

    index: int  # position in configure_optimizers (Trainer) or order of first use (Fabric)
    optimizer: Optimizer
    label: str  # how warnings name it
    stepped: bool = False  # GradScaler stepped it since the last scale update
    carried_inf: list[torch.Tensor] = field(default_factory=list)  # inf checks of earlier steps, same update
    found_inf: torch.Tensor | None = None  # > 0 when its latest step was skipped; None: never stepped
    warned: bool = False


class HeldGradientScales:
    """Mixin for a precision plugin with a ``scaler`` (``torch.amp.GradScaler`` or ``None``).

    The plugin calls ``_init_held_scales`` in ``__init__``, registers optimizers with
    ``_add_record`` and the parameters whose gradients it must follow with ``_track``,
    implements ``_record(optimizer)``, and calls ``_to_current_scale`` before every backward,
    ``_unscale`` before every clip or step, and ``_update`` where its loss-scale update
    belongs. It relies on GradScaler's private ``_per_optimizer_states`` and ``_get_scale_async``
    (torch 2.13); ``mpguide.precision.check_versions`` checks that they exist.
    """

    scaler: torch.amp.GradScaler | None

    def _init_held_scales(self) -> None:
        self._records: list[OptimizerRecord] = []
        # id(parameter) -> the 0-dim scale tensor its .grad is multiplied by (None: true, unscaled values)
        self._grad_scales: dict[int, torch.Tensor | None] = {}
        self._tracked: dict[int, torch.Tensor] = {}  # id -> parameter (keeps the ids valid)
        self._scale_cache: torch.Tensor | None = None

    def _record(self, optimizer: Any) -> OptimizerRecord:
        raise NotImplementedError

    def _add_record(self, optimizer: Any, label: str) -> OptimizerRecord:
        record = OptimizerRecord(len(self._records), unwrap(optimizer), label)
        self._records.append(record)
        self._track(params(record.optimizer))
        return record

    def _track(self, tensors: Any) -> None:
        """Follow the gradients of ``tensors`` (parameters) from the next backward on."""
        for p in tensors:
            self._tracked.setdefault(id(p), p)

    def step_was_skipped(self, optimizer: Any) -> bool:
        """Whether GradScaler skipped the latest ``step()`` of ``optimizer`` (inf/NaN gradients).

        ``False`` without a GradScaler (fp32, bf16-mixed), before the first step, and for a step
        that was a no-op because no parameter had a gradient. Reads a device tensor: on CUDA this
        synchronizes. These plugins do not update the loss scale inside ``step()``, so comparing the
        scale around it cannot tell; use this method.

        Args:
            optimizer: a torch optimizer or the wrapper Lightning or Fabric returns for it.

        Raises:
            ValueError: (Trainer plugin) ``optimizer`` is not one of the trainer's optimizers.
        """
        found_inf = self._record(optimizer).found_inf
        return found_inf is not None and bool(found_inf.item() > 0)

    def _scale(self) -> torch.Tensor:
        """The current loss scale as a 0-dim tensor, one object per scale value (no device sync)."""
        if self._scale_cache is None:
            scale = self.scaler._get_scale_async()
            self._scale_cache = torch.tensor(self.scaler.get_scale()) if scale is None else scale.detach().clone()
        return self._scale_cache

    def _stage(self, record: OptimizerRecord) -> OptState:
        state = self.scaler._per_optimizer_states.get(id(record.optimizer))
        return OptState.READY if state is None else state["stage"]

    def _found_inf(self, record: OptimizerRecord) -> torch.Tensor:
        """A copy of GradScaler's inf check for ``record`` (``update()`` adds into the originals)."""
        state = self.scaler._per_optimizer_states[id(record.optimizer)]
        checks = list(state["found_inf_per_device"].values())
        return torch.stack([t.detach().to(checks[0].device) for t in checks]).sum()

    def _bring_to_scale(self, tensors: Any) -> bool:
        """Multiply each held gradient of ``tensors`` to the current scale; whether any record changed."""
        scale, changed = self._scale(), False
        for p in tensors:
            key = id(p)
            if key not in self._grad_scales:
                # first seen: its gradient (if any) comes from the backward about to run
                self._grad_scales[key] = scale
                continue
            held = self._grad_scales[key]
            if held is scale:
                continue
            # a gradient kept from before (unscaled by a clip or step, or made at an older scale): the next
            # backward must add like to like, and the next unscale must divide by the scale it carries
            if p.grad is not None:
                factor = scale if held is None else scale / held
                p.grad.mul_(factor.to(p.grad.device))
            self._grad_scales[key] = scale
            changed = True
        return changed

    def _all_to_current_scale(self) -> None:
        """Before a backward: every followed gradient to the current scale (so the backward adds like to like)."""
        for record in self._records:
            self._to_current_scale(record)
        self._bring_to_scale(self._tracked.values())

    def _to_current_scale(self, record: OptimizerRecord) -> None:
        """Bring the gradients ``record``'s optimizer holds to the current loss scale."""
        if self._bring_to_scale(params(record.optimizer)) and self._stage(record) is OptState.UNSCALED:
            # its earlier unscale no longer describes the gradients: GradScaler must check them again
            self.scaler._per_optimizer_states.pop(id(record.optimizer))

    def _unscale(self, record: OptimizerRecord) -> None:
        """Leave ``record``'s gradients unscaled and inf-checked, unscaling them only if not done yet."""
        stage = self._stage(record)
        if stage is OptState.UNSCALED:
            return  # clipped before the step: unscaled once already
        if stage is OptState.STEPPED:
            # stepped again before the scale update (e.g. several critic steps in one training_step):
            # keep the first step's inf check for the update and let GradScaler check the new gradients
            record.carried_inf.append(self._found_inf(record))
            self.scaler._per_optimizer_states.pop(id(record.optimizer))
        self._to_current_scale(record)
        if not _optimizer_handles_unscaling(record.optimizer):
            self.scaler.unscale_(record.optimizer)
        # a fused optimizer unscales inside its step (and leaves unscaled gradients behind)
        for p in params(record.optimizer):
            self._grad_scales[id(p)] = None

    def _scaler_step(self, record: OptimizerRecord, optimizer: Any, **kwargs: Any) -> Any:
        """``GradScaler.step`` on gradients ``_unscale`` has prepared; remembers its inf check."""
        output = self.scaler.step(optimizer, **kwargs)
        record.stepped, record.found_inf = True, self._found_inf(record)
        return output

    def _update(self) -> None:
        """``GradScaler.update()`` from the inf checks of the steps taken since the last update."""
        states = self.scaler._per_optimizer_states
        for record in self._records:
            if not record.stepped:
                # unscaled by a clip but not stepped: that check is redone when it steps
                states.pop(id(record.optimizer), None)
            elif record.carried_inf:
                carried = sum(record.carried_inf[1:], record.carried_inf[0].clone())
                states[("carried", record.index)] = {
                    "stage": OptState.STEPPED,
                    "found_inf_per_device": {carried.device: carried},
                }
            record.stepped, record.carried_inf = False, []
        self.scaler.update()
        self._scale_cache = None

    def _warn_no_gradients(self, record: OptimizerRecord, stacklevel: int = 2) -> None:
        if not record.warned:
            record.warned = True
            warnings.warn(
                f"{record.label} was stepped but none of its parameters has a gradient "
                f"({len(params(record.optimizer))} tensors); the step does nothing (as in fp32). "
                f"Check that its loss reaches its model, that the right optimizer is toggled, and that no "
                f"zero_grad() runs between backward and step.",
                NoGradientStepWarning,
                stacklevel=stacklevel,
            )
