"""Lightning Fabric's manual loop under 16-mixed: a precision plugin for several optimizers, and recorded runs.

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
no-op, as in fp32. :func:`train_run` trains one declared run with a :class:`FabricRecipe` and
returns the same :class:`mpguide.runner.RunResult` fields as a Trainer run, so the records of
Fabric examples are judged by the same gate.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import torch
from lightning.fabric.plugins.precision import MixedPrecision

from . import hardware
from .data import digits_loader
from .runner import RunResult, captured_warnings, error_record, quiet_lightning, record_extra


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


def fabric_precision_kwargs(precision: str, accelerator: str,
                            plugin_factory: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Keyword arguments for :class:`lightning.fabric.Fabric` that really run ``precision``.

    ``Fabric(accelerator="cpu", precision="16-mixed")`` falls back to bf16-mixed with a warning
    (``fabric/connector.py``), like the Trainer; on CPU 16-mixed therefore goes through Fabric's
    ``MixedPrecision("16-mixed", "cpu")`` (fp16 autocast and a CPU GradScaler).

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"`` or ``"16-mixed"``.
        accelerator: ``"cpu"`` or ``"cuda"``.
        plugin_factory: called as ``plugin_factory(precision, accelerator)``; its plugin is passed instead.

    Returns:
        ``{"precision": ...}`` or ``{"plugins": [plugin]}``.

    Raises:
        hardware.ConfigurationError: unknown precision.
    """
    hardware.check_precision(precision)
    if plugin_factory is not None:
        return {"plugins": [plugin_factory(precision, accelerator)]}
    if precision == "16-mixed" and accelerator == "cpu":
        return {"plugins": [MixedPrecision("16-mixed", "cpu")]}
    return {"precision": precision}


class FabricRecipe:
    """A Fabric training loop body, the Fabric counterpart of a manual-optimization LightningModule.

    Subclasses build their models in ``__init__`` (called after seeding), wrap models and
    optimizers in :meth:`setup` and set ``self.optimizers`` (a list, the first one's learning rate
    is recorded), and implement :meth:`training_step`. :func:`train_run` drives the batches.
    """

    fabric: Any = None
    optimizers: list[Any]

    def setup(self, fabric: Any) -> None:
        """Wrap models and optimizers with ``fabric.setup``; set ``self.fabric`` and ``self.optimizers``."""
        raise NotImplementedError

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """One iteration on ``batch`` (``images (B, 64) float32, labels (B,) int64``); returns the loss (0-dim)."""
        raise NotImplementedError

    def record_extra(self) -> dict[str, Any]:
        """JSON-ready measurements stored in the run's ``extra``."""
        return {}


def loss_scale(fabric: Any) -> float | None:
    """The loss scale of ``fabric``'s GradScaler, or ``None`` without one (fp32, bf16-mixed)."""
    scaler = getattr(fabric.strategy.precision, "scaler", None)
    return None if scaler is None else float(scaler.get_scale())


def train_run(spec: Any, recipe_factory: Callable[[], FabricRecipe], accelerator: str, preset: hardware.Preset,
              plugin_factory: Callable[..., Any] | None = None) -> RunResult:
    """Train one declared run with :class:`lightning.fabric.Fabric` (one device) and record it.

    Pass it to :func:`mpguide.runner.run_example` as ``train=``. Seeding, data order and the
    recorded fields follow :func:`mpguide.runner.train_run`: weights are built after
    ``seed_everything(spec.seed)``, batches come from :func:`mpguide.data.digits_loader` with the
    same seed, and per batch the loss, the first optimizer's learning rate and the loss scale at
    batch start are recorded. A plugin with ``update_scale()`` (:class:`FabricManualMixedPrecision`)
    gets it called after each batch, so the recorded scale is per iteration; a batch counts as
    skipped when the scale went down during it. ``spec.trainer_kwargs`` go to ``Fabric(...)``. An
    exception is stored in ``error``, not raised.

    Args:
        spec: the declared run (:class:`mpguide.declarations.RunDecl`).
        recipe_factory: builds the :class:`FabricRecipe` (called once, after seeding).
        accelerator: ``"cpu"`` or ``"cuda"``.
        preset: size (epochs, batch size).
        plugin_factory: precision plugin factory ``(precision, accelerator) -> plugin`` or ``None``.

    Returns:
        The :class:`mpguide.runner.RunResult`; ``mode`` is ``"manual"`` (Fabric has no automatic
        optimization), ``precision_plugin`` the class name of Fabric's precision plugin.
    """
    from lightning.fabric import Fabric, seed_everything

    hardware.check_precision(spec.precision)
    quiet_lightning()
    seed_everything(spec.seed)  # no verbose=: Lightning < 2.4 lacks it
    recipe = recipe_factory()
    loader = digits_loader(preset.batch_size, seed=spec.seed)
    result = RunResult(id=spec.id, mode="manual", precision=spec.precision, precision_plugin="?",
                       recipe=spec.recipe, seed=spec.seed, steps=preset.epochs * len(loader), plugin=spec.plugin,
                       trainer_kwargs=dict(spec.trainer_kwargs), plain_flag=spec.plain_flag,
                       label=spec.label or spec.id)
    scales, skipped = [], []
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fabric = Fabric(accelerator=accelerator, devices=1,
                            **fabric_precision_kwargs(spec.precision, accelerator, plugin_factory), **spec.trainer_kwargs)
            result.precision_plugin = type(fabric.strategy.precision).__name__
            recipe.setup(fabric)
            batches = fabric.setup_dataloaders(loader, move_to_device=True)
            start = time.perf_counter()
            for _ in range(preset.epochs):
                for batch_idx, batch in enumerate(batches):
                    result.lr.append(float(recipe.optimizers[0].param_groups[0]["lr"]))
                    before = loss_scale(fabric)
                    loss = recipe.training_step(batch, batch_idx)
                    getattr(fabric.strategy.precision, "update_scale", lambda: None)()
                    result.loss.append(float(loss))
                    if before is not None:
                        scales.append(before)
                        skipped.append(loss_scale(fabric) < before)
        except Exception as err:  # noqa: BLE001 - the record keeps it, claims judge it
            result.error = error_record(err)
    result.seconds = round(time.perf_counter() - start, 3)
    result.loss_scale = scales or None
    result.skipped_steps = sum(skipped)
    result.warnings = captured_warnings(caught)
    result.extra["batches"] = len(result.loss)
    if skipped:
        result.extra["skipped_per_step"] = skipped
    record_extra(result, recipe.record_extra)
    return result
