"""What the Trainer plugin (:mod:`mpguide.precision`) and the Fabric plugin (:mod:`mpguide.fabric`) share.

Reader layer: imports only torch and Lightning. Two things live here:

* :class:`NoGradientStepWarning` and the small optimizer helpers both plugins use;
* :class:`HeldGradientScales`, the 16-mixed bookkeeping both plugins need when an optimizer keeps
  its gradients across a loss-scale change (an optimizer stepped every k-th batch, accumulation, a
  clip without a step): which scale each held gradient is multiplied by, bringing it to the current
  scale before the next backward adds to it, unscaling each optimizer at most once per step, and
  the scale-update rule (:data:`UPDATE_RULE`): when ``GradScaler.update()`` runs.

GradScaler (``torch/amp/grad_scaler.py``) multiplies every new gradient by the current scale and
divides an optimizer's gradients by the current scale at ``unscale_``/``step``. It does not know
that a gradient was made at an older scale: an optimizer that holds a gradient made at scale S
while ``update()`` moves the scale to S' unscales it by S', so its update is S/S' times too large
(x2 after one overflow, x0.5 after one growth).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
from torch.amp.grad_scaler import OptState
from torch.optim import Optimizer

#: The scale-update rule both plugins follow; their class docstrings and the guide's plugin section state
#: it in these words (``tests/test_precision.py`` checks that they do).
UPDATE_RULE = """\
An optimizer step goes through GradScaler.step (skipped on inf/NaN gradients) without updating the
loss scale. The pending GradScaler.update() runs at the first of these moments: (1) right after a
step, once every optimizer that holds gradients has stepped since the last update; (2) before a
backward, when a step since the last update was skipped, or was taken by a fused optimizer (whose
inf check is not read, so as to add no device sync); (3) before an optimizer that already stepped
since the last update is unscaled or stepped again; (4) Trainer: when training_step returns, if an
optimizer stepped in it; Fabric: at plugin.update_scale() and before plugin.state_dict(). An
update that follows k > 1 skipped steps backs off k times, once per skipped step, as Lightning's
plugin does.
"""


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
    # whether its step since the last update was skipped: True/False read at the step (GradScaler.step reads
    # it on the host there too); None: a fused optimizer's check, not read (no sync): assume it may have been
    overflow: bool | None = False
    found_inf: torch.Tensor | None = None  # > 0 when its latest step was skipped; None: never stepped, or a no-op
    warned: bool = False


class HeldGradientScales:
    """Mixin for a precision plugin with a ``scaler`` (``torch.amp.GradScaler`` or ``None``).

    The plugin calls ``_init_held_scales`` in ``__init__``, registers optimizers with
    ``_add_record`` and the parameters whose gradients it must follow with ``_track``,
    implements ``_record(optimizer)``, and calls ``_before_backward`` before every backward (rule 2
    of :data:`UPDATE_RULE`), ``_unscale`` before every clip or step (rule 3), ``_scaler_step`` for
    the step (rule 1), ``_no_op_step`` for a step without gradients, and ``_update`` where its rule 4
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
        self._uncovered_cache: list[torch.Tensor] | None = None  # followed parameters no known optimizer holds

    def _record(self, optimizer: Any) -> OptimizerRecord:
        raise NotImplementedError

    def _scaling(self) -> bool:
        """Whether gradients are loss-scaled: an enabled GradScaler (``GradScaler(enabled=False)`` scales nothing)."""
        return self.scaler is not None and self.scaler.is_enabled()

    def _add_record(self, optimizer: Any, label: str) -> OptimizerRecord:
        optimizer = unwrap(optimizer)
        new = {id(p) for p in params(optimizer)}
        # an optimizer replaced mid-run (a callback assigning trainer.optimizers): the one it replaces
        # shares its parameters and is never stepped again, so it must not hold back rule 1
        self._records = [r for r in self._records if not new.intersection(id(p) for p in params(r.optimizer))]
        record = OptimizerRecord(len(self._records), optimizer, label)
        self._records.append(record)
        self._track(params(record.optimizer))
        self._uncovered_cache = None
        return record

    def _find(self, optimizer: Any) -> OptimizerRecord | None:
        optimizer = unwrap(optimizer)  # LightningOptimizer / _FabricOptimizer -> torch optimizer
        for record in self._records:
            if record.optimizer is optimizer:
                return record
        return None

    def _track(self, tensors: Any) -> None:
        """Follow the gradients of ``tensors`` (parameters) from the next backward on."""
        for p in tensors:
            self._tracked.setdefault(id(p), p)
        self._uncovered_cache = None

    def _uncovered(self) -> list[torch.Tensor]:
        """Followed parameters of no registered optimizer (Fabric meets optimizers only at their first step)."""
        if self._uncovered_cache is None:
            owned = {id(p) for r in self._records for p in params(r.optimizer)}
            self._uncovered_cache = [p for key, p in self._tracked.items() if key not in owned]
        return self._uncovered_cache

    def step_was_skipped(self, optimizer: Any) -> bool:
        """Whether GradScaler skipped the latest ``step()`` of ``optimizer`` (inf/NaN gradients).

        ``False`` without a GradScaler (fp32, bf16-mixed) or with a disabled one, before the first
        step, and for a step that was a no-op because no parameter had a gradient (also when the
        step before it was skipped). Reads a device tensor: on CUDA this
        synchronizes. These plugins do not update the loss scale inside ``step()``, so comparing the
        scale around it cannot tell; use this method.

        Args:
            optimizer: a torch optimizer or the wrapper Lightning or Fabric returns for it.

        Raises:
            ValueError: ``optimizer`` was never registered (configure_optimizers, or a first step or clip).
        """
        record = self._find(optimizer)
        if record is None:
            raise ValueError(
                f"{type(unwrap(optimizer)).__name__} has not been set up with or stepped through this plugin "
                f"(configure_optimizers, trainer.optimizers, or fabric.setup and a step)"
            )
        if not self._scaling():
            return False
        return record.found_inf is not None and bool(record.found_inf.item() > 0)

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
        if record.stepped:
            # rule 3: stepped since the last update (several steps of one optimizer in one training_step,
            # truncated BPTT): GradScaler needs an update between two steps of one optimizer
            self._update()
        if self._stage(record) is OptState.UNSCALED:
            return  # clipped before the step: unscaled once already
        self._to_current_scale(record)
        if not _optimizer_handles_unscaling(record.optimizer):
            self.scaler.unscale_(record.optimizer)
        # a fused optimizer unscales inside its step (and leaves unscaled gradients behind)
        for p in params(record.optimizer):
            self._grad_scales[id(p)] = None

    def _scaler_step(self, record: OptimizerRecord, optimizer: Any, **kwargs: Any) -> Any:
        """``GradScaler.step`` on gradients ``_unscale`` has prepared; remembers its inf check, then rule 1."""
        overflow: bool | None = None
        if not _optimizer_handles_unscaling(record.optimizer):
            # GradScaler.step reads this same check on the host next (``.item()``): no extra wait
            overflow = bool(self._found_inf(record).item() > 0)
        output = self.scaler.step(optimizer, **kwargs)
        record.stepped, record.found_inf, record.overflow = True, self._found_inf(record), overflow
        # rule 1: every optimizer that holds gradients has stepped since the last update
        if all(r.stepped or not has_gradients(r.optimizer) for r in self._records) and not any(
            p.grad is not None for p in self._uncovered()
        ):
            self._update()
        return output

    def _no_op_step(self, record: OptimizerRecord) -> None:
        """A step without gradients did nothing: it was not skipped (``step_was_skipped`` is ``False``)."""
        record.found_inf = None

    def _pending(self) -> bool:
        return any(r.stepped for r in self._records)

    def _before_backward(self) -> None:
        """Rule 2, then every followed gradient to the current scale (call before the loss is scaled)."""
        if any(r.stepped and r.overflow is not False for r in self._records):
            self._update()
        self._all_to_current_scale()

    def _update(self) -> None:
        """``GradScaler.update()`` from the inf checks of the steps taken since the last update."""
        states = self.scaler._per_optimizer_states
        stepped = [r for r in self._records if r.stepped]
        for record in self._records:
            if not record.stepped:
                # unscaled by a clip but not stepped: that check is redone when it steps
                states.pop(id(record.optimizer), None)
            record.stepped, record.overflow = False, False
        self.scaler.update()  # one growth step or one backoff, from all the inf checks
        checks = [r.found_inf > 0 for r in stepped if r.found_inf is not None]
        if len(checks) > 1:
            # one backoff per skipped step, as Lightning's plugin (one update per step) backs off: a single
            # backoff for several skipped steps left the scale higher there, and later steps overflowed
            # (found by the generated programs: 12 skips vs stock's 10). Device math, no sync.
            skipped = torch.stack(checks).sum()
            extra = (skipped - 1).clamp(min=0).to(self.scaler._scale.dtype)
            self.scaler._scale.mul_(torch.full_like(self.scaler._scale, self.scaler.get_backoff_factor()).pow(extra))
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
