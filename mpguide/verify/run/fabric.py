"""Recorded runs of Lightning Fabric's manual loop, judged by the same gate as Trainer runs.

:func:`train_run` trains one declared run with a :class:`FabricRecipe` and returns the same
:class:`mpguide.verify.run.runner.RunResult` fields as a Trainer run, so the records of Fabric examples are
judged by the same gate. The plugin a reader uses is :class:`mpguide.fabric.FabricManualMixedPrecision`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.fabric.plugins.precision import MixedPrecision

from ...data import digits_loader
from ...fabric import loss_scale
from .. import hardware
from .runner import RunResult, captured_warnings, error_record, quiet_lightning, record_extra

#: The ``extra`` keys every Fabric run records.
MEASURES = {"batches": "count", "skipped_per_step": "list[bool]"}


def fabric_precision_kwargs(
    precision: str, accelerator: str, plugin_factory: Callable[..., Any] | None = None
) -> dict[str, Any]:
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
    is recorded), and implement :meth:`training_step`. :func:`train_run` drives the batches. A recipe
    holds training code only: what a run measures comes from probes (see :func:`train_run`).
    """

    fabric: Any = None
    optimizers: list[Any]

    def setup(self, fabric: Any) -> None:
        """Wrap models and optimizers with ``fabric.setup``; set ``self.fabric`` and ``self.optimizers``."""
        raise NotImplementedError

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """One iteration on ``batch`` (``images (B, 64) float32, labels (B,) int64``); returns the loss (0-dim)."""
        raise NotImplementedError


def train_run(
    spec: Any,
    recipe_factory: Callable[[], FabricRecipe],
    accelerator: str,
    preset: hardware.Preset,
    plugin_factory: Callable[..., Any] | None = None,
    probes: Sequence[Callable[[], Any]] = (),
) -> RunResult:
    """Train one declared run with :class:`lightning.fabric.Fabric` (one device) and record it.

    Pass it to :func:`mpguide.verify.run.runner.run_example` as ``train=``. Seeding, data order and the
    recorded fields follow :func:`mpguide.verify.run.runner.train_run`: weights are built after
    ``seed_everything(spec.seed)``, batches come from :func:`mpguide.data.digits_loader` with the
    same seed, and per batch the loss, the first optimizer's learning rate and the loss scale at
    batch start are recorded. A plugin with ``update_scale()``
    (:class:`~mpguide.fabric.FabricManualMixedPrecision`) gets it called after each batch, so the
    recorded scale is per iteration; a batch counts as skipped when the scale went down during it.
    ``spec.trainer_kwargs`` go to ``Fabric(...)``. An exception is stored in ``error``, not raised.

    Measurements reach ``extra`` through Fabric's own callback mechanism: the ``probes`` are passed as
    ``Fabric(callbacks=[...])``, and the loop calls ``fabric.call("on_train_start", recipe)`` once the
    recipe is set up and ``fabric.call("on_train_batch_end", recipe, loss, batch_idx)`` after each batch
    (a probe implements the hooks it needs); each probe's ``record_extra()`` then joins ``extra``
    (:func:`mpguide.verify.run.runner.record_extra`), like a Trainer run's probes.

    Args:
        spec: the declared run (:class:`mpguide.verify.claims.declarations.RunDecl`).
        recipe_factory: builds the :class:`FabricRecipe` (called once, after seeding).
        accelerator: ``"cpu"`` or ``"cuda"``.
        preset: size (epochs, batch size).
        plugin_factory: precision plugin factory ``(precision, accelerator) -> plugin`` or ``None``.
        probes: zero-argument factories of the example's probes for this recipe (see above).

    Returns:
        The :class:`mpguide.verify.run.runner.RunResult`; ``mode`` is ``"manual"`` (Fabric has no automatic
        optimization), ``precision_plugin`` the class name of Fabric's precision plugin.
    """
    from lightning.fabric import Fabric, seed_everything

    hardware.check_precision(spec.precision)
    quiet_lightning()
    seed_everything(spec.seed)  # no verbose=: Lightning < 2.4 lacks it
    recipe = recipe_factory()
    loader = digits_loader(preset.batch_size, seed=spec.seed)
    result = RunResult(
        id=spec.id,
        mode="manual",
        precision=spec.precision,
        precision_plugin="?",
        recipe=spec.recipe,
        seed=spec.seed,
        steps=preset.epochs * len(loader),
        plugin=spec.plugin,
        trainer_kwargs=dict(spec.trainer_kwargs),
        plain_flag=spec.plain_flag,
        label=spec.label or spec.id,
    )
    own = [factory() for factory in probes]
    scales, skipped = [], []
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fabric = Fabric(
                accelerator=accelerator,
                devices=1,
                **fabric_precision_kwargs(spec.precision, accelerator, plugin_factory),
                **spec.trainer_kwargs,
                callbacks=own,
            )
            result.precision_plugin = type(fabric.strategy.precision).__name__
            recipe.setup(fabric)
            fabric.call("on_train_start", recipe)
            batches = fabric.setup_dataloaders(loader, move_to_device=True)
            start = time.perf_counter()
            for _ in range(preset.epochs):
                for batch_idx, batch in enumerate(batches):
                    result.lr.append(float(recipe.optimizers[0].param_groups[0]["lr"]))
                    before = loss_scale(fabric)
                    loss = recipe.training_step(batch, batch_idx)
                    getattr(fabric.strategy.precision, "update_scale", lambda: None)()
                    result.loss.append(float(loss))
                    fabric.call("on_train_batch_end", recipe, loss, batch_idx)
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
    for probe in own:
        record_extra(result, probe.record_extra)
    return result
