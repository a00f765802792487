"""One run, from seed to record: the skeleton every run strategy shares, and the one-process Trainer run.

:class:`RunStrategy` trains one declared run (:class:`mpguide.verify.claims.declarations.RunDecl`) and returns
its :class:`RunResult`. Its :meth:`~RunStrategy.train` is the same for every run: check the precision, seed,
build the recipe after seeding (so two runs that share a seed start from identical weights), the data loader
(same seed, same order), the example's probes and the result, then fit inside one warnings capture and one
error capture, time it and collect what was measured. A strategy says only how it fits and what it collects:
:class:`TrainerRun` here (one :class:`lightning.pytorch.Trainer`), :class:`mpguide.verify.run.distributed.DDPRun`
(two forked ranks, merged) and :class:`mpguide.verify.run.fabric.FabricRun` (a Fabric loop).
:func:`mpguide.verify.run.runner.run_example` picks the strategy a run asks for.
"""

from __future__ import annotations

import logging
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from ...data import digits_loader
from ...steps import loss_scale
from .. import hardware, records
from ..claims import batches_per_epoch
from ..records.measures import measures_of
from . import probes as probes_mod

#: The ``extra`` keys every Trainer run records (type names: :data:`mpguide.verify.records.schema.MEASURE_TYPES`).
MEASURES = {"global_step": "count", "batches": "count", "skipped_per_step": "list[bool]"}


@dataclass
class RunResult:
    """What one run produced (the ``runs`` entry of a record, as a dataclass)."""

    id: str
    mode: str
    precision: str
    precision_plugin: str
    recipe: str
    seed: int
    steps: int
    plugin: str | None = None
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    plain_flag: bool = False
    swapped_from: str | None = None
    label: str = ""
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    loss_scale: list[float] | None = None
    skipped_steps: int = 0
    seconds: float = 0.0
    error: dict[str, str] | None = None
    warnings: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    #: key -> type name, what the run's probes declare (``measures``); the record adds the harness's own keys
    measures: dict[str, str] = field(default_factory=dict)


def quiet_lightning() -> None:
    """Silence Lightning's banners and info logs (GPU available, model summary, ...).

    They carry absolute paths and machine details that do not belong on a rendered page; warnings
    raised during a run are still captured into the record by :meth:`RunStrategy.train`.
    Also hides torch's ``LeafSpec`` FutureWarning (torch 2.13, raised inside Lightning's
    ``utilities/_pytree.py``), which prints the path of the installed Lightning under the fits an
    example shows outside :func:`~mpguide.verify.run.runner.run_example`.
    """
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*LeafSpec", FutureWarning)


class RunStrategy:
    """How one declared run is trained and recorded; a subclass says how it fits and what it collects.

    :meth:`train` is the skeleton. A subclass implements :meth:`fit` (reading the attributes ``train`` set:
    ``spec``, ``module``, ``loader``, ``probes``, ``result``, ``accelerator``, ``preset``, ``plugin_factory``)
    and :meth:`collect`, and may override :meth:`check`, :meth:`make_loader`, :meth:`mode` and :attr:`device`.
    An instance holds one run's state while it trains; :meth:`train` resets it, so one instance may train
    several runs in turn.
    """

    #: the precisions this strategy trains (:func:`mpguide.verify.hardware.check_precision`)
    precisions: tuple[str, ...] = hardware.PRECISIONS
    #: ``precision_plugin`` of a run whose Trainer or Fabric could not be built
    unbuilt = "?"

    def train(
        self,
        spec: Any,
        module_factory: Callable[[], Any],
        accelerator: str,
        preset: hardware.Preset,
        plugin_factory: Callable[..., Any] | None = None,
        probes: Sequence[Callable[[], Any]] = (),
    ) -> RunResult:
        """Train ``spec`` and record it; an exception while fitting is stored in ``error``, not raised.

        Weights are created by ``module_factory()`` after :func:`lightning.pytorch.seed_everything` with
        ``spec.seed``, the data order comes from :meth:`make_loader` with the same seed. Warnings are captured
        from the construction of the Trainer (or Fabric) on: Lightning warns about precision there, and an
        error there (a plugin refusing this Lightning version, say) is this run's result too. The error
        record holds type, message and the ends of the traceback (:func:`error_record`); whether it was
        expected is for the claims to judge.

        Args:
            spec: the declared run (:class:`mpguide.verify.claims.declarations.RunDecl`).
            module_factory: builds the LightningModule or :class:`mpguide.verify.run.fabric.FabricRecipe`
                (called once, after seeding, in this process).
            accelerator: ``"cpu"`` or ``"cuda"``.
            preset: size (epochs, batch size).
            plugin_factory: the precision plugin named by ``spec.plugin``, called as
                ``plugin_factory(precision, accelerator)``; ``None`` for Lightning's own handling.
            probes: the example's own measuring callbacks for this recipe (zero-argument factories, e.g.
                the classes); each ``record_extra()`` goes into ``extra`` (see :func:`record_extra`).

        Returns:
            The :class:`RunResult`; ``steps`` is the number of training batches the run was meant to see
            (epochs x batches per epoch), ``seconds`` the wall time of the fit.

        Raises:
            hardware.ConfigurationError: a precision this strategy does not train (see :meth:`check`).
        """
        import lightning.pytorch as pl

        self.check(spec)
        quiet_lightning()
        pl.seed_everything(spec.seed)  # no verbose=: Lightning < 2.4 lacks it; quiet_lightning() mutes the line
        self.spec, self.accelerator, self.preset, self.plugin_factory = spec, accelerator, preset, plugin_factory
        self.module = module_factory()
        self.loader = self.make_loader(preset.batch_size, spec.seed)
        self.probes = [factory() for factory in probes]
        self.result = RunResult(
            id=spec.id,
            mode=self.mode(self.module),
            precision=spec.precision,
            precision_plugin=self.unbuilt,
            recipe=spec.recipe,
            seed=spec.seed,
            steps=preset.epochs * batches_per_epoch(len(self.loader), spec.trainer_kwargs),
            plugin=spec.plugin,
            trainer_kwargs=dict(spec.trainer_kwargs),
            plain_flag=spec.plain_flag,
            label=spec.label or spec.id,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.start_clock()
            try:
                self.fit()
            except Exception as err:  # noqa: BLE001 - the record keeps it, claims judge it
                self.result.error = error_record(err)
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.result.seconds = round(time.perf_counter() - self._start, 3)
        self.result.warnings = captured_warnings(caught)
        self.collect()
        return self.result

    @property
    def device(self) -> str:
        """The device the run trains on, the accelerator asked for."""
        return self.accelerator

    def check(self, spec: Any) -> None:
        """Refuse a run this strategy cannot train, before seeding (raises ``hardware.ConfigurationError``)."""
        hardware.check_precision(spec.precision, self.precisions)

    def make_loader(self, batch_size: int, seed: int) -> Any:
        """The run's data: :func:`mpguide.data.digits_loader` (``batch_size`` samples a batch, shuffled by ``seed``)."""
        return digits_loader(batch_size, seed=seed)

    def mode(self, module: Any) -> str:
        """``"automatic"`` or ``"manual"``: the optimization mode of the recipe."""
        return "automatic" if module.automatic_optimization else "manual"

    def start_clock(self) -> None:
        """(Re)start the wall clock of ``seconds``; :meth:`fit` calls it again to leave its setup out."""
        self._start = time.perf_counter()

    def fit(self) -> None:
        """Train ``self.module`` on ``self.loader``, recording into ``self.result``; may raise."""
        raise NotImplementedError

    def collect(self) -> None:
        """Fill ``self.result`` from what the fit measured (called after the fit, also after an error)."""
        raise NotImplementedError

    def record_probes(self) -> None:
        """Add the ``record_extra()`` of the example's probes to the result (:func:`record_extra`)."""
        for probe in self.probes:
            record_extra(self.result, probe.record_extra)


class StepRecorder(Callback):
    """Lightning callback recording, per training batch, loss, learning rate and loss scale.

    * ``lr``: learning rate of the first optimizer's first param group at batch start (the rate
      the batch's optimizer step uses, before any per-batch scheduler step).
    * ``scale``: the GradScaler's loss scale at batch start (what the backward multiplies the loss
      by); stays empty when the precision plugin has no scaler (fp32, bf16-mixed).
    * ``loss``: the value ``training_step`` returned (a tensor or ``{"loss": tensor}``), as float.
    * ``skipped_per_step``: whether the scale went down after each batch (GradScaler halves
      it when it finds inf/NaN gradients and skips that optimizer step; ``torch/amp/grad_scaler.py``).
    """

    def __init__(self) -> None:
        self.loss: list[float] = []
        self.lr: list[float] = []
        self.scale: list[float] = []
        self.skipped_per_step: list[bool] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.lr.append(float(trainer.optimizers[0].param_groups[0]["lr"]))
        scale = loss_scale(trainer)
        if scale is not None:
            self.scale.append(scale)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            raise RuntimeError("training_step returned None; return the loss so that it can be recorded")
        if pl_module.automatic_optimization:
            # automatic optimization hands on the loss already divided by accumulate_grad_batches
            # (ClosureResult in lightning/pytorch/loops/optimization/automatic.py); record the batch loss
            loss = loss * trainer.accumulate_grad_batches
        self.loss.append(float(loss))
        scale = loss_scale(trainer)
        if scale is not None and self.scale:
            self.skipped_per_step.append(scale < self.scale[-1])


class TrainerRun(RunStrategy):
    """One process, one device: ``Trainer(devices=1, ...).fit(module, loader)``, measured by callbacks.

    The Trainer's callbacks are a :class:`StepRecorder`, the shared probes of :mod:`mpguide.verify.run.probes`
    and the example's own; ``extra`` gets ``batches``, ``skipped_per_step`` (when a GradScaler ran),
    ``global_step`` and every probe's ``record_extra()``. ``spec.trainer_kwargs`` go to the Trainer;
    ``spec.plain_flag`` passes ``precision=`` as a reader would, without the CPU fp16 plugin of
    :func:`mpguide.verify.hardware.trainer_precision_kwargs`.
    """

    precisions = hardware.RUN_PRECISIONS
    unbuilt = "(not created)"

    def build_trainer(self, accelerator: str, callbacks: list[Any], precision: dict[str, Any], **options: Any) -> Any:
        """A quiet :class:`lightning.pytorch.Trainer` for ``preset.epochs`` (no logger, checkpoints, progress
        bar, summary or sanity check) with ``precision`` (its precision keyword arguments) and ``options``."""
        import lightning.pytorch as pl

        trainer = pl.Trainer(
            accelerator=accelerator,
            max_epochs=self.preset.epochs,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=callbacks,
            **precision,
            **options,
        )
        self.result.precision_plugin = type(trainer.precision_plugin).__name__
        return trainer

    def fit(self) -> None:
        spec = self.spec
        self.recorder, self.shared, self.trainer = StepRecorder(), probes_mod.callbacks(), None
        self.trainer = self.build_trainer(
            self.accelerator,
            [self.recorder, *self.shared, *self.probes],
            {"precision": spec.precision}
            if spec.plain_flag
            else hardware.trainer_precision_kwargs(spec.precision, self.accelerator, self.plugin_factory),
            devices=1,
            **spec.trainer_kwargs,
        )
        self.trainer.fit(self.module, self.loader)

    def collect(self) -> None:
        rec = self.recorder
        record_steps(self.result, rec.loss, rec.lr, rec.scale, rec.skipped_per_step)
        if self.trainer is None:  # the Trainer could not be built: nothing ran, nothing more to measure
            return
        self.result.extra["global_step"] = self.trainer.global_step
        for probe in self.shared:
            self.result.extra.update(probe.record_extra())
            self.result.measures.update(measures_of(probe))
        self.record_probes()


def train_run(spec: Any, *args: Any, **kwargs: Any) -> RunResult:
    """Fit one LightningModule with a real one-device :class:`lightning.pytorch.Trainer` and record it.

    ``TrainerRun().train(...)``: arguments ``(spec, module_factory, accelerator, preset, plugin_factory=None,
    probes=())``, result and errors as :meth:`RunStrategy.train`, measurements as :class:`TrainerRun`.
    """
    return TrainerRun().train(spec, *args, **kwargs)


def record_steps(
    result: RunResult, loss: list[float], lr: list[float], scale: list[float], skipped: list[bool]
) -> None:
    """Store per-batch ``loss``, ``lr``, loss ``scale`` (empty without a GradScaler) and ``skipped`` flags in
    ``result``, with ``extra["batches"]`` and, when a scaler ran, ``extra["skipped_per_step"]``."""
    result.loss, result.lr, result.skipped_steps = loss, lr, sum(skipped)
    result.loss_scale = scale or None
    result.extra["batches"] = len(loss)
    if skipped:
        result.extra["skipped_per_step"] = skipped


def record_extra(result: RunResult, measure: Callable[[], dict[str, Any]]) -> None:
    """Add ``measure()`` (an example's own probe's measurements) to ``result.extra``.

    A measurement that fails after a run that already raised is dropped (the run's error is what
    counts); one that fails after a run that trained becomes the run's error, so the gate fails it.
    """
    result.measures.update(measures_of(getattr(measure, "__self__", None)))
    try:
        result.extra.update(measure())
    except Exception as err:  # noqa: BLE001 - recorded, judged by the claims
        if result.error is None:
            result.error = error_record(err, prefix="record_extra() failed: ")


def captured_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """A record's ``warnings``: ``"Category: message"`` of each distinct warning, sorted, machine paths cut
    (:func:`mpguide.verify.records.short_paths`; a warning such as ``detect_anomaly``'s carries a traceback)."""
    return sorted({records.short_paths(f"{w.category.__name__}: {w.message}") for w in caught})


def error_record(err: BaseException, prefix: str = "") -> dict[str, str]:
    """The ``error`` field of a run: exception type, message, first and last four traceback entries.

    Machine paths are shortened (:func:`mpguide.verify.records.short_paths`), so records and pages show
    ``torch/amp/grad_scaler.py`` or ``examples/plot_02_two_optimizers.py``, never a home folder.
    """
    frames = traceback.format_exception(type(err), err, err.__traceback__)
    return {
        "type": type(err).__name__,
        "message": records.short_paths(f"{prefix}{err}".strip()),
        "traceback": records.short_paths("".join(frames[:1] + frames[-4:])),
    }
