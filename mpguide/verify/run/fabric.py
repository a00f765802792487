"""Recorded runs of Lightning Fabric's manual loop, judged by the same gate as Trainer runs.

:class:`FabricRun` trains one declared run with a :class:`FabricRecipe` and returns the same
:class:`mpguide.verify.run.strategy.RunResult` fields as a Trainer run, so the records of Fabric examples are
judged by the same gate. The plugin a reader uses is :class:`mpguide.fabric.FabricManualMixedPrecision`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.fabric.plugins.precision import MixedPrecision

from ...fabric import loss_scale
from .. import hardware
from .strategy import RunResult, RunStrategy, record_steps

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
    is recorded), and implement :meth:`training_step`. :class:`FabricRun` drives the batches. A recipe
    holds training code only: what a run measures comes from probes (see :class:`FabricRun`).
    """

    fabric: Any = None
    optimizers: list[Any]

    def setup(self, fabric: Any) -> None:
        """Wrap models and optimizers with ``fabric.setup``; set ``self.fabric`` and ``self.optimizers``."""
        raise NotImplementedError

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """One iteration on ``batch`` (``images (B, 64) float32, labels (B,) int64``); returns the loss (0-dim)."""
        raise NotImplementedError


class FabricRun(RunStrategy):
    """One :class:`lightning.fabric.Fabric` (one device) driving a :class:`FabricRecipe`'s loop.

    Seeding, data order and the recorded fields follow :class:`mpguide.verify.run.strategy.TrainerRun`: per
    batch the loss, the first optimizer's learning rate and the loss scale at batch start are recorded. A
    plugin with ``update_scale()`` (:class:`~mpguide.fabric.FabricManualMixedPrecision`) gets it called after
    each batch, so the recorded scale is per iteration; a batch counts as skipped when the scale went down
    during it. ``spec.trainer_kwargs`` go to ``Fabric(...)``. ``mode`` is ``"manual"`` (Fabric has no
    automatic optimization), ``precision_plugin`` the class name of Fabric's precision plugin.

    Measurements reach ``extra`` through Fabric's own callback mechanism: the probes are passed as
    ``Fabric(callbacks=[...])``, and the loop calls ``fabric.call("on_train_start", recipe)`` once the
    recipe is set up and ``fabric.call("on_train_batch_end", recipe, loss, batch_idx)`` after each batch
    (a probe implements the hooks it needs); each probe's ``record_extra()`` then joins ``extra``
    (:func:`mpguide.verify.run.strategy.record_extra`), like a Trainer run's probes, also after an error.
    """

    def mode(self, module: Any) -> str:
        """Always ``"manual"``: Fabric has no automatic optimization."""
        return "manual"

    def fit(self) -> None:
        from lightning.fabric import Fabric

        recipe, result = self.module, self.result
        self.scales: list[float] = []
        self.skipped: list[bool] = []
        fabric = Fabric(
            accelerator=self.accelerator,
            devices=1,
            **fabric_precision_kwargs(self.spec.precision, self.accelerator, self.plugin_factory),
            **self.spec.trainer_kwargs,
            callbacks=self.probes,
        )
        result.precision_plugin = type(fabric.strategy.precision).__name__
        recipe.setup(fabric)
        fabric.call("on_train_start", recipe)
        batches = fabric.setup_dataloaders(self.loader, move_to_device=True)
        self.start_clock()
        for _ in range(self.preset.epochs):
            for batch_idx, batch in enumerate(batches):
                result.lr.append(float(recipe.optimizers[0].param_groups[0]["lr"]))
                before = loss_scale(fabric)
                loss = recipe.training_step(batch, batch_idx)
                getattr(fabric.strategy.precision, "update_scale", lambda: None)()
                result.loss.append(float(loss))
                fabric.call("on_train_batch_end", recipe, loss, batch_idx)
                if before is not None:
                    self.scales.append(before)
                    self.skipped.append(loss_scale(fabric) < before)

    def collect(self) -> None:
        record_steps(self.result, self.result.loss, self.result.lr, self.scales, self.skipped)
        self.record_probes()


def train_run(spec: Any, *args: Any, **kwargs: Any) -> RunResult:
    """Train one declared run with :class:`FabricRun` (its recipe factory builds a :class:`FabricRecipe`).

    Arguments ``(spec, recipe_factory, accelerator, preset, plugin_factory=None, probes=())``, result and errors
    as :meth:`mpguide.verify.run.strategy.RunStrategy.train`;
    :func:`mpguide.verify.run.runner.run_example` picks :class:`FabricRun` by itself for a recipe class that is
    not a LightningModule (:func:`mpguide.verify.run.runner.strategy_for`).
    """
    return FabricRun().train(spec, *args, **kwargs)
