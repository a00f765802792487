"""Run a matrix of real Lightning ``Trainer`` fits and turn them into a results record.

An example names its recipes (LightningModule factories) and declares its runs and claims in the
literal ``RUNS`` and ``CLAIMS`` tables (:mod:`mpguide.verify.claims.declarations`), then calls
:func:`~mpguide.verify.run.runner.run_example`. Every run trains on the same data in the same order from the
same initial weights; the per-step loss, learning rate and loss scale, the wall time, warnings and
any exception are captured into the record. Measurements beyond those reach a run's ``extra`` through
Lightning callbacks only, never through methods of the recipe: the shared probes of
:mod:`mpguide.verify.run.probes` on every run, and an example's own probes on the runs of the recipes it
names (``run_example(..., probes={recipe: [ProbeClass, ...]})``), so the LightningModule a reader copies
holds training code only.

Environment variables (besides those of :mod:`mpguide.verify.hardware`):

``MPGUIDE_SWAP_RECIPE``
    ``"example:run_id=recipe[,...]"``: train run ``run_id`` of ``example`` with another recipe. Used by the
    test suite to prove that the docs build fails when a correct run is replaced by a broken one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from ...data import digits_loader
from ...steps import loss_scale
from .. import hardware, records
from ..claims import declarations
from ..claims.declarations import SWAP_ENV, RunDecl, parse_swaps
from ..records import build as record_build
from ..records.measures import measures_of
from . import probes as probes_mod
from .probes import (
    parameter_digest,  # noqa: F401 - examples call runner.parameter_digest
    print_findings,  # noqa: F401 - examples call runner.print_findings
    with_checks,  # noqa: F401 - examples call runner.with_checks
)

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
    raised during a run are still captured into the record by :func:`~mpguide.verify.run.runner.train_run`.
    Also hides torch's ``LeafSpec`` FutureWarning (torch 2.13, raised inside Lightning's
    ``utilities/_pytree.py``), which prints the path of the installed Lightning under the fits an
    example shows outside :func:`~mpguide.verify.run.runner.run_example`.
    """
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*LeafSpec", FutureWarning)


def check_settings(example: str) -> None:
    """Refuse bad ``MPGUIDE_*`` settings at the top of ``example``, before it trains or prints anything.

    Checks ``MPGUIDE_PRESET`` and ``MPGUIDE_DEVICE`` (``cuda`` needs a CUDA device), that ``MPGUIDE_SWAP_RECIPE``
    is well formed, and that its entries for ``example`` name runs the example declares. The declaration is
    read from the example's file: ``examples/`` of a checkout, or the script being run after a download
    (``sys.argv[0]``); without either (a notebook) :func:`run_example` checks the runs later. Each error is
    an input error, printed in one line when the example runs as a script (:mod:`mpguide.verify.errors`).

    Raises:
        hardware.ConfigurationError: an unknown preset or device, CUDA asked for without one, or a swap naming a
            run ``example`` does not declare.
        declarations.DeclarationError: ``MPGUIDE_SWAP_RECIPE`` is malformed.
    """
    hardware.select_preset()
    hardware.select_accelerator()
    swaps = declarations.example_swaps(example, parse_swaps(os.environ.get(SWAP_ENV)))
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    source = next((p for p in (declarations.example_file(example), script) if p.stem == example and p.is_file()), None)
    if swaps and source is not None:
        declared = [spec.id for spec in declarations.read(source).runs]
        unknown = sorted(set(swaps) - set(declared))
        if unknown:
            raise hardware.ConfigurationError(
                f"{SWAP_ENV} names run(s) {unknown} that {example} does not have; its runs: {declared}"
            )


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


def train_run(
    spec: RunDecl,
    module_factory: Callable[[], Any],
    accelerator: str,
    preset: hardware.Preset,
    plugin_factory: Callable[..., Any] | None = None,
    probes: Sequence[Callable[[], Callback]] = (),
) -> RunResult:
    """Fit one LightningModule with a real :class:`lightning.pytorch.Trainer` and record it.

    Weights are created after :func:`lightning.pytorch.seed_everything` with ``spec.seed``, and the
    data order comes from :func:`mpguide.data.digits_loader` with the same seed, so two runs that
    share a seed start identical. An exception inside ``fit`` is caught and stored (type, message,
    the last frames of the traceback) instead of propagating: whether it was expected is for the
    claims to judge.

    Args:
        spec: the declared run.
        module_factory: builds the LightningModule (called once, after seeding).
        accelerator: ``"cpu"`` or ``"cuda"``.
        preset: size (epochs, batch size).
        plugin_factory: the precision plugin named by ``spec.plugin``, called as
            ``plugin_factory(precision, accelerator)``; ``None`` for Lightning's own handling.
        probes: the example's own measuring callbacks for this recipe (zero-argument factories, e.g.
            the classes); each instance joins the ``Trainer``'s callbacks and its ``record_extra()``
            goes into ``extra`` (see :func:`~mpguide.verify.run.runner.record_extra`).

    Returns:
        The :class:`~mpguide.verify.run.runner.RunResult`; ``steps`` is the number of training batches the run was
        meant to
        see (epochs x batches per epoch).
    """
    import lightning.pytorch as pl

    hardware.check_precision(spec.precision, hardware.RUN_PRECISIONS)
    quiet_lightning()
    pl.seed_everything(spec.seed)  # no verbose=: Lightning < 2.4 lacks it; quiet_lightning() mutes the line
    module = module_factory()
    loader = digits_loader(preset.batch_size, seed=spec.seed)
    recorder = StepRecorder()
    shared = probes_mod.callbacks()
    own = [factory() for factory in probes]
    # warnings are captured from Trainer construction on (Lightning warns about precision there)
    result = RunResult(
        id=spec.id,
        mode="automatic" if module.automatic_optimization else "manual",
        precision=spec.precision,
        precision_plugin="(not created)",
        recipe=spec.recipe,
        seed=spec.seed,
        steps=preset.epochs * len(loader),
        plugin=spec.plugin,
        trainer_kwargs=dict(spec.trainer_kwargs),
        plain_flag=spec.plain_flag,
        label=spec.label or spec.id,
    )
    trainer = None
    # warnings are captured from Trainer construction on (Lightning warns about precision there), and
    # an error there (a plugin refusing this Lightning version, say) is this run's result too
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        try:
            trainer = pl.Trainer(
                accelerator=accelerator,
                devices=1,
                max_epochs=preset.epochs,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
                callbacks=[recorder, *shared, *own],
                **(
                    {"precision": spec.precision}
                    if spec.plain_flag
                    else hardware.trainer_precision_kwargs(spec.precision, accelerator, plugin_factory)
                ),
                **spec.trainer_kwargs,
            )
            result.precision_plugin = type(trainer.precision_plugin).__name__
            trainer.fit(module, loader)
        except Exception as err:  # noqa: BLE001 - the record keeps it, claims judge it
            result.error = error_record(err)
    if accelerator == "cuda":
        torch.cuda.synchronize()
    result.seconds = round(time.perf_counter() - start, 3)
    result.loss, result.lr, result.skipped_steps = recorder.loss, recorder.lr, sum(recorder.skipped_per_step)
    result.loss_scale = recorder.scale or None
    result.extra["batches"] = len(result.loss)
    if recorder.skipped_per_step:
        result.extra["skipped_per_step"] = recorder.skipped_per_step
    result.warnings = captured_warnings(caught)
    if trainer is None:  # the Trainer could not be built: nothing ran, nothing more to measure
        return result
    result.extra["global_step"] = trainer.global_step
    for probe in shared:
        result.extra.update(probe.record_extra())
        result.measures.update(measures_of(probe))
    for probe in own:
        record_extra(result, probe.record_extra)
    return result


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


def run_example(
    example: str,
    recipes: dict[str, Callable[[], Any]],
    runs: list[tuple[Any, ...]],
    claims: list[tuple[Any, ...]],
    *,
    plugins: dict[str, Callable[..., Any]] | None = None,
    probes: Mapping[str, Sequence[Callable[[], Any]]] | None = None,
    results_dir: Any = None,
    progress: Callable[[str], None] = print,
    train: Callable[..., RunResult] | None = None,
) -> dict[str, Any]:
    """Train every declared run of an example, judge its claims and write its results record.

    Prints one progress line per run and returns the record (also written to
    ``<results_dir>/<example>.json`` atomically; see :mod:`mpguide.verify.records`).

    Args:
        example: the example's file stem, e.g. ``"plot_01_porting_to_manual"``.
        recipes: recipe name -> zero-argument factory of a LightningModule.
        runs: the example's literal ``RUNS`` table (see :mod:`mpguide.verify.claims.declarations`).
        claims: the example's literal ``CLAIMS`` table.
        plugins: plugin name -> factory ``(precision, accelerator) -> plugin`` for runs with a
            ``"plugin"`` option; :class:`mpguide.precision.ManualMixedPrecision` is known by name.
        probes: recipe name -> the example's own measuring probes for the runs that train that recipe
            (zero-argument factories; Lightning callbacks for ``Trainer`` runs), whose ``record_extra()``
            dicts go into the run's ``extra``. They follow the recipe a run really trains, so a run
            swapped to another recipe by ``MPGUIDE_SWAP_RECIPE`` is measured like that recipe.
        results_dir: folder for the record (default :func:`mpguide.verify.records.results_dir`).
        progress: called with each progress line.
        train: trains one run, with the arguments and result of :func:`~mpguide.verify.run.runner.train_run` (the
            default); e.g. :func:`mpguide.verify.run.distributed.train_run` (DDP) or
            :func:`mpguide.verify.run.fabric.train_run`.

    Raises:
        mpguide.verify.claims.declarations.DeclarationError: the tables are malformed, or differ from what the
            example file (when it is found) declares at module level.
        hardware.ConfigurationError: unknown preset/device/precision, or a run naming a recipe or
            plugin the tables do not have (including through ``MPGUIDE_SWAP_RECIPE``), or probes for an
            unknown recipe.
    """
    from ...precision import ManualMixedPrecision

    declaration = declarations.from_tables(example, runs, claims)
    source_file = declarations.example_file(example)
    if source_file.is_file() and declarations.read(source_file) != declaration:
        raise declarations.DeclarationError(
            f"{source_file}: the RUNS/CLAIMS passed to run_example differ from the module-level tables the gate "
            f"reads; pass the tables themselves, unmodified"
        )
    plugins = {"ManualMixedPrecision": ManualMixedPrecision, **(plugins or {})}
    accelerator = hardware.select_accelerator()
    preset = hardware.select_preset()
    all_swaps = parse_swaps(os.environ.get(SWAP_ENV))
    swaps = declarations.example_swaps(example, all_swaps)
    others = sorted({ex for ex, _ in all_swaps} - {example})
    if others:
        progress(f"  note: {SWAP_ENV} entries for {others} do not apply to {example} (check the spelling)")
    unknown = set(swaps) - {spec.id for spec in declaration.runs}
    if unknown:
        raise hardware.ConfigurationError(f"{SWAP_ENV} names run(s) {sorted(unknown)} that {example} does not have")
    unprobed = set(probes or {}) - set(recipes)
    if unprobed:
        raise hardware.ConfigurationError(f"{example}: probes name unknown recipe(s) {sorted(unprobed)}")
    for spec in declaration.runs:
        name = swaps.get(spec.id, spec.recipe)
        if name not in recipes:
            raise hardware.ConfigurationError(
                f"{example}: run {spec.id!r} names unknown recipe {name!r}; known: {sorted(recipes)}"
            )
        if spec.plugin is not None and spec.plugin not in plugins:
            raise hardware.ConfigurationError(
                f"{example}: run {spec.id!r} names unknown plugin {spec.plugin!r}; known: {sorted(plugins)}"
            )
    progress(f"{example}: {len(declaration.runs)} runs on {hardware.device_name(accelerator)}, size {preset.name!r}")
    results = []
    # runs whose error is the point (a raises claim checks it): their progress line says so
    expected = {c["runs"][0] for c in declaration.claims_for(accelerator) if c.get("kind") == "raises"}
    for i, spec in enumerate(declaration.runs, 1):
        recipe = swaps.get(spec.id, spec.recipe)
        if recipe != spec.recipe:
            progress(f"  note: {SWAP_ENV} trains run {spec.id!r} with recipe {recipe!r}")
        run_spec = dataclasses.replace(spec, recipe=recipe)
        with hardware.device_lock(accelerator):  # shared; the throughput benchmark takes the GPU alone
            res = (train or train_run)(
                run_spec,
                recipes[recipe],
                accelerator,
                preset,
                plugins[spec.plugin] if spec.plugin else None,
                probes=tuple((probes or {}).get(recipe, ())),
            )
        if recipe != spec.recipe:
            res.swapped_from = spec.recipe
        status = (
            f"raised {res.error['type']}, the error this run exists to show"
            if res.error and spec.id in expected
            else f"raised {res.error['type']}"
            if res.error
            else f"final loss {res.loss[-1]:.4f}"
            if res.loss
            else "no steps"
        )
        progress(
            f"  [{i:2d}/{len(declaration.runs)}] {spec.id:<20} {res.mode:<9} {res.precision:<10} "
            f"{len(res.loss):4d} steps {res.seconds:6.2f} s  {status}"
        )
        results.append(res)
    record = record_build.build_record(example, results, declaration, accelerator, preset, swaps)
    path = records.write_record(record, records.record_path(example, results_dir))
    progress(f"{example}: results saved to {_shown_path(path)}")
    return record


def _shown_path(path: Path) -> str:
    """``path`` relative to the current folder when inside it, else its file name (no machine paths)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return f"<results folder>/{Path(path).name}"
