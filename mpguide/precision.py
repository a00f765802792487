"""A precision plugin for manual optimization under mixed precision: ``ManualMixedPrecision``.

Pass it instead of the ``precision=`` flag::

    trainer = Trainer(plugins=[ManualMixedPrecision("16-mixed", "cuda")])   # or "bf16-mixed", "32-true"

What it changes, and its limits, are stated on the guide page (``docs/model/manual_optimization.md``).
In short, under 16-mixed it follows PyTorch's AMP recipe (``torch/amp/grad_scaler.py``) instead of
Lightning's (``lightning/pytorch/plugins/precision/amp.py``, which calls ``GradScaler.update()``
inside every ``opt.step()``):

* each optimizer's gradients are unscaled at most once per optimizer step, whether
  ``self.clip_gradients`` or the step unscales them;
* ``GradScaler.update()`` runs once per ``training_step``, after it returns, and only if an
  optimizer stepped in it; gradients an optimizer keeps across a scale change (accumulation, an
  optimizer stepped every k-th batch, a clip without a step) are brought to the new scale first;
* ``opt.step()``, ``on_before_optimizer_step``, clipping and ``manual_backward`` run with autocast
  disabled, as they do in automatic optimization;
* stepping an optimizer without gradients is a warned no-op, as in fp32;
* checkpoints keep the loss scale when a run moves between this plugin and Lightning's
  ``MixedPrecision`` in either direction.

Tested with Lightning 2.6.6 and torch 2.13.0 (CPU build; 16-mixed through a CPU GradScaler), one
device; its tests also run on CUDA when a GPU is present, which the build that wrote it did not have. It relies on Lightning 2.6 internals (the iteration boundary ``train_step_context``, the
checkpoint key ``type(plugin).__qualname__``) and on GradScaler's per-optimizer state; constructing
it with another Lightning minor version raises :class:`UnsupportedVersionError`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import lightning
import torch
from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.amp.grad_scaler import OptState
from torch.optim import LBFGS, Optimizer
from typing_extensions import override

#: Lightning minor versions whose internals this plugin was checked against (tested with 2.6.6).
SUPPORTED_LIGHTNING = ("2.6",)


class NoGradientStepWarning(UserWarning):
    """An optimizer was stepped although none of its parameters had a gradient."""


class UnsupportedVersionError(RuntimeError):
    """The installed Lightning or torch lacks an internal ``ManualMixedPrecision`` relies on."""


def _params(optimizer: Any) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def has_gradients(optimizer: Any) -> bool:
    """Whether any parameter of ``optimizer`` (a torch optimizer) currently has a ``.grad``."""
    return any(p.grad is not None for p in _params(optimizer))


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
            f"trainer/connectors/checkpoint_connector.py): install lightning==2.6.6 or use MixedPrecision.")
    scaler = torch.amp.GradScaler("cpu")
    if not hasattr(scaler, "_per_optimizer_states") or not hasattr(scaler, "_get_scale_async"):
        raise UnsupportedVersionError(
            f"torch {torch.__version__}: torch.amp.GradScaler has no _per_optimizer_states/_get_scale_async "
            f"(torch/amp/grad_scaler.py), which ManualMixedPrecision reads; it was tested with torch 2.13.")


@dataclass
class _OptimizerRecord:
    """What the plugin knows about one optimizer, keyed by its index in ``configure_optimizers``."""

    index: int
    optimizer: Optimizer
    # the 0-dim loss-scale tensor its held gradients are multiplied by; None: true (unscaled) values
    grads_scale: torch.Tensor | None = None
    stepped: bool = False  # GradScaler stepped it since the last scale update
    carried_inf: list[torch.Tensor] = field(default_factory=list)  # inf checks of earlier steps, same update
    found_inf: torch.Tensor | None = None  # > 0 when its latest step was skipped; None: never stepped
    warned: bool = False

    @property
    def name(self) -> str:
        return f"optimizer {self.index} ({type(self.optimizer).__name__})"


class ManualMixedPrecision(MixedPrecision):
    """Lightning's ``MixedPrecision`` made correct for manual optimization.

    The behaviour and its limits are described on the guide page and in the module docstring.

    Args:
        precision: ``"16-mixed"``, ``"bf16-mixed"`` or ``"32-true"``.
        device: device type of the autocast region, ``"cuda"`` or ``"cpu"``.
        scaler: optional ``torch.amp.GradScaler`` for 16-mixed (for example with another
            ``growth_interval``); one with default settings is created otherwise.

    Raises:
        ValueError: any other precision, or a scaler with ``"32-true"``.
        UnsupportedVersionError: see :func:`check_versions`.
    """

    def __init__(self, precision: Literal["16-mixed", "bf16-mixed", "32-true"], device: str,
                 scaler: torch.amp.GradScaler | None = None) -> None:
        check_versions()
        if precision == "32-true":
            if scaler is not None:
                raise ValueError("precision='32-true' does not use a GradScaler")
            self.precision, self.device, self.scaler = precision, device, None  # type: ignore[assignment]
        else:
            super().__init__(precision, device, scaler)
        self._records: list[_OptimizerRecord] = []
        self._in_training_step = False
        self._scale_cache: torch.Tensor | None = None

    # ------------------------------------------------------------------ setup and lookup
    @override
    def connect(self, model: Any, optimizers: list[Any], lr_schedulers: list[Any]) -> Any:
        self._records = [_OptimizerRecord(i, getattr(o, "optimizer", o)) for i, o in enumerate(optimizers)]
        return super().connect(model, optimizers, lr_schedulers)

    def _record(self, optimizer: Any) -> _OptimizerRecord:
        optimizer = getattr(optimizer, "optimizer", optimizer)  # LightningOptimizer -> torch optimizer
        for record in self._records:
            if record.optimizer is optimizer:
                return record
        raise ValueError(f"{type(optimizer).__name__} was not returned by configure_optimizers; "
                         f"ManualMixedPrecision only handles the trainer's optimizers")

    def step_was_skipped(self, optimizer: Any) -> bool:
        """Whether GradScaler skipped the latest ``step()`` of ``optimizer`` (inf/NaN gradients).

        ``False`` without a GradScaler (fp32, bf16-mixed), before the first step, and for a step
        that was a no-op because no parameter had a gradient. Reads a device tensor: on CUDA this
        synchronizes. With this plugin the loss scale changes only when ``training_step`` returns,
        so comparing the scale around ``opt.step()`` cannot tell; use this method.

        Args:
            optimizer: a torch optimizer or the ``LightningOptimizer`` wrapping it.

        Raises:
            ValueError: ``optimizer`` is not one of the trainer's optimizers.
        """
        found_inf = self._record(optimizer).found_inf
        return found_inf is not None and bool(found_inf.item() > 0)

    # ------------------------------------------------------------------ autocast
    @override
    def autocast_context_manager(self) -> torch.autocast:
        if self.precision == "32-true":
            return torch.autocast(self.device, enabled=False)
        return super().autocast_context_manager()

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

    # ------------------------------------------------------------------ scale bookkeeping
    def _scale(self) -> torch.Tensor:
        """The current loss scale as a 0-dim tensor, one object per scale value (no device sync)."""
        if self._scale_cache is None:
            scale = self.scaler._get_scale_async()
            self._scale_cache = (torch.tensor(self.scaler.get_scale()) if scale is None
                                 else scale.detach().clone())
        return self._scale_cache

    def _stage(self, record: _OptimizerRecord) -> OptState:
        state = self.scaler._per_optimizer_states.get(id(record.optimizer))
        return OptState.READY if state is None else state["stage"]

    def _found_inf(self, record: _OptimizerRecord) -> torch.Tensor:
        """A copy of GradScaler's inf check for ``record`` (``update()`` adds into the originals)."""
        state = self.scaler._per_optimizer_states[id(record.optimizer)]
        checks = list(state["found_inf_per_device"].values())
        return torch.stack([t.detach().to(checks[0].device) for t in checks]).sum()

    def _to_current_scale(self, record: _OptimizerRecord) -> None:
        """Bring the gradients ``record``'s optimizer holds to the current loss scale."""
        scale = self._scale()
        if record.grads_scale is scale:
            return
        # gradients kept from before (unscaled by a clip or step, or made at an older scale): the next
        # backward must add like to like, and the next unscale must divide by the scale they carry
        factor = scale if record.grads_scale is None else scale / record.grads_scale
        for p in _params(record.optimizer):
            if p.grad is not None:
                p.grad.mul_(factor.to(p.grad.device))
        if self._stage(record) is OptState.UNSCALED:
            # its earlier unscale no longer describes the gradients: GradScaler must check them again
            self.scaler._per_optimizer_states.pop(id(record.optimizer))
        record.grads_scale = scale

    def _unscale(self, record: _OptimizerRecord) -> None:
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
        record.grads_scale = None

    def _end_iteration(self) -> None:
        if self.scaler is not None and any(r.stepped for r in self._records):
            self._update()
        # no optimizer stepped (an accumulation window): the scale stays, as PyTorch's recipe says

    def _update(self) -> None:
        """``GradScaler.update()`` from the inf checks of the steps taken since the last update."""
        states = self.scaler._per_optimizer_states
        for record in self._records:
            if not record.stepped:
                # unscaled by a clip but not stepped: that check is redone when it steps
                states.pop(id(record.optimizer), None)
            elif record.carried_inf:
                carried = sum(record.carried_inf[1:], record.carried_inf[0].clone())
                states[("carried", record.index)] = {"stage": OptState.STEPPED,
                                                     "found_inf_per_device": {carried.device: carried}}
            record.stepped, record.carried_inf = False, []
        self.scaler.update()
        self._scale_cache = None

    # ------------------------------------------------------------------ hooks
    @override
    def pre_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:
        tensor = super().pre_backward(tensor, module)  # scales the loss (initializing the scale)
        if self.scaler is not None:
            for record in self._records:
                self._to_current_scale(record)
        return tensor

    @override
    def backward(self, tensor: torch.Tensor, model: Any, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        with self._no_autocast():
            super().backward(tensor, model, optimizer, *args, **kwargs)

    def _warn_no_gradients(self, record: _OptimizerRecord) -> None:
        if not record.warned:
            record.warned = True
            warnings.warn(
                f"{record.name} of configure_optimizers was stepped but none of its parameters has a "
                f"gradient ({len(_params(record.optimizer))} tensors); the step does nothing (as in fp32). "
                f"Check that its loss reaches its model, that the right optimizer is toggled, and that no "
                f"zero_grad() runs between backward and step.",
                NoGradientStepWarning,
                stacklevel=2,
            )

    @override
    def optimizer_step(self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        """Run ``closure``, then step ``optimizer`` outside autocast.

        Raises:
            MisconfigurationException: LBFGS under 16-mixed (GradScaler does not take closures).
        """
        if self.scaler is None:
            return self._step_without_scaler(optimizer, model, closure, **kwargs)
        if isinstance(optimizer, LBFGS):
            raise MisconfigurationException("AMP and the LBFGS optimizer are not compatible.")
        closure_result = closure()
        if closure_result is None and model.automatic_optimization:
            return closure_result  # the training step skipped its backward: nothing to step
        record = self._record(optimizer)
        if not has_gradients(optimizer):
            self._warn_no_gradients(record)
            with self._no_autocast():
                self._after_closure(model, optimizer)
            return closure_result
        self._unscale(record)
        with self._no_autocast():
            self._after_closure(model, optimizer)  # on_before_optimizer_step sees unscaled gradients
            output = self.scaler.step(optimizer, **kwargs)
        record.stepped, record.found_inf = True, self._found_inf(record)
        if not self._in_training_step:
            self._update()  # automatic optimization, or a step taken in a hook: no iteration end to wait for
        return output

    def _step_without_scaler(self, optimizer: Any, model: Any, closure: Callable[[], Any],
                             **kwargs: Any) -> Any:
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
    def clip_gradients(self, optimizer: Optimizer, clip_val: float = 0.0,
                       gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM) -> None:
        """Clip gradients outside autocast; under 16-mixed unscale them first if not done yet.

        ``optimizer`` may be the ``LightningOptimizer`` that ``self.optimizers()`` returns.

        Raises:
            RuntimeError: clipping a fused optimizer under mixed precision (as Lightning does).
        """
        optimizer = getattr(optimizer, "optimizer", optimizer)
        with self._no_autocast():
            if self.precision == "32-true":  # exactly fp32's clipping, fused optimizers included
                Precision.clip_gradients(self, optimizer, clip_val, gradient_clip_algorithm)
                return
            if (clip_val and self.scaler is not None and not _optimizer_handles_unscaling(optimizer)
                    and has_gradients(optimizer)):
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
