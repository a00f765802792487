"""Run a matrix of real Lightning ``Trainer`` fits and turn them into a results record.

An example names its recipes (LightningModule factories) and declares its runs and claims in the
literal ``RUNS`` and ``CLAIMS`` tables (:mod:`mpguide.verify.claims.declarations`), then calls
:func:`~mpguide.verify.run.runner.run_example`. Every run trains on the same data in the same order from the
same initial weights; the per-step loss, learning rate and loss scale, the wall time, warnings and
any exception are captured into the record (:class:`mpguide.verify.run.strategy.RunStrategy`;
:func:`strategy_for` picks one Trainer, two DDP ranks or a Fabric loop for each run). Measurements beyond
those reach a run's ``extra`` through Lightning callbacks only, never through methods of the recipe: the
shared probes of :mod:`mpguide.verify.run.probes` on every run, and an example's own probes on the runs of
the recipes it names (``run_example(..., probes={recipe: [ProbeClass, ...]})``), so the LightningModule a
reader copies holds training code only.

Environment variables (besides those of :mod:`mpguide.verify.hardware`):

``MPGUIDE_SWAP_RECIPE``
    ``"example:run_id=recipe[,...]"``: train run ``run_id`` of ``example`` with another recipe. Used by the
    test suite to prove that the docs build fails when a correct run is replaced by a broken one.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import hardware, records
from ..claims import declarations
from ..claims.declarations import SWAP_ENV, RunDecl, parse_swaps
from ..records import build as record_build
from . import distributed, fabric
from .probes import (
    parameter_digest,  # noqa: F401 - examples call runner.parameter_digest
    print_findings,  # noqa: F401 - examples call runner.print_findings
    with_checks,  # noqa: F401 - examples call runner.with_checks
)
from .strategy import (  # noqa: F401 - examples and tests reach these through the runner
    RunResult,
    RunStrategy,
    StepRecorder,
    TrainerRun,
    captured_warnings,
    error_record,
    quiet_lightning,
    record_extra,
    train_run,
)


def check_settings(example: str) -> None:
    """Refuse bad ``MPGUIDE_*`` settings at the top of ``example``, before it trains or prints anything.

    Checks ``MPGUIDE_PRESET`` and ``MPGUIDE_DEVICE`` (``cuda`` needs a CUDA device), that ``MPGUIDE_SWAP_RECIPE``
    is well formed, and that its entries for ``example`` name runs the example declares. The declaration is
    read from the example's file: ``examples/`` of a checkout, or the script being run after a download
    (``sys.argv[0]``); without either (a notebook) :func:`run_example` checks the runs later. Each error is
    an input error, printed in one line when the example runs as a script (:mod:`mpguide.verify.errors`).

    Raises:
        hardware.ConfigurationError: an unknown preset or device, CUDA asked for without one, or a swap naming a
            run ``example`` does not declare or a recipe its literal ``recipes`` table does not have.
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
        known = _recipe_names(source)
        wrong = sorted({name for name in swaps.values() if known is not None and name not in known})
        if wrong:
            raise hardware.ConfigurationError(
                f"{SWAP_ENV} names recipe(s) {wrong} that {example} does not have; its recipes: {sorted(known)}"
            )


def _recipe_names(source: Path) -> set[str] | None:
    """The string keys of the module-level ``recipes = {...}`` table of ``source``, or ``None`` when the file
    has no such literal table (then :func:`run_example` checks the names against the real table)."""
    import ast

    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "recipes" for t in node.targets):
            value = node.value
            if isinstance(value, ast.Dict) and all(isinstance(k, ast.Constant) for k in value.keys):
                return {k.value for k in value.keys}
    return None


def strategy_for(spec: RunDecl, module_factory: Callable[[], Any]) -> RunStrategy:
    """The strategy that trains ``spec``: DDP, Fabric or one Trainer.

    A recipe given as a class that is not a :class:`lightning.pytorch.LightningModule` (a
    :class:`mpguide.verify.run.fabric.FabricRecipe` or a class of the same shape, with ``setup(fabric)`` and
    ``training_step``) trains in a Fabric loop (:class:`~mpguide.verify.run.fabric.FabricRun`); a run whose
    ``trainer`` options ask for ``devices`` > 1 in forked ranks (:class:`~mpguide.verify.run.distributed.DDPRun`);
    any other run, a recipe built by a function included, in one :class:`lightning.pytorch.Trainer`
    (:class:`~mpguide.verify.run.strategy.TrainerRun`).
    """
    from lightning.pytorch import LightningModule

    if isinstance(module_factory, type) and not issubclass(module_factory, LightningModule):
        return fabric.FabricRun()
    if distributed.is_ddp(spec):
        return distributed.DDPRun()
    return TrainerRun()


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
        train: trains one run, with the arguments and result of
            :meth:`mpguide.verify.run.strategy.RunStrategy.train`; by default the ``train`` of the strategy
            :func:`strategy_for` picks for the run and the recipe it trains (e.g.
            :func:`mpguide.verify.run.distributed.train_run` makes the same choice).

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
            where = f" (through {SWAP_ENV})" if spec.id in swaps else ""
            raise hardware.ConfigurationError(
                f"{example}: run {spec.id!r} names unknown recipe {name!r}{where}; known: {sorted(recipes)}"
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
            res = (train or strategy_for(run_spec, recipes[recipe]).train)(
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
