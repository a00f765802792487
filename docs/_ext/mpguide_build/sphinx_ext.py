"""Sphinx extension: wire the results records into the build and fail it when a claim fails.

What it does, in build order:

1. ``builder-inited`` (before sphinx-gallery runs the examples): exports the records folder as
   ``MPGUIDE_RESULTS_DIR`` (and the examples folder as ``MPGUIDE_EXAMPLES_DIR``) so examples (run
   in-process by sphinx-gallery, which sets no ``__file__`` and changes directory) and the MyST-NB
   page kernel agree on them; then forces a re-run of exactly the examples whose record does not
   match the current inputs (:func:`~mpguide_build.sphinx_ext.examples_to_rerun`: a missing or unreadable
   record, or one made from another example file, library, preset, device or recipe swap;
   sphinx-gallery alone only looks at the example file's md5); removes what earlier builds left
   for deleted examples; and refuses an ``MPGUIDE_SWAP_RECIPE`` that names an example that does
   not exist (a typo must not let a build pass unswapped).
2. ``env-before-read-docs``: loads every record the pages will read and stops the build with
   the record's own message (file, problem, fix) if one is missing or corrupt.
3. ``source-read``: registers every record file as a dependency of the pages that read records,
   so those pages are re-read (and re-executed) when a record changes.
4. ``build-finished``: runs the claim gate (:func:`mpguide.verify.gate.judge`) over this build's records
   and the committed reference records, each compared with its example's declared runs and
   claims; any failed claim, altered or stale record, or unreadable record raises
   :class:`sphinx.errors.ExtensionError`, so ``sphinx-build`` exits non-zero with one line per
   failure naming example, claim, runs, metric, threshold, record and hardware. An inconclusive
   claim (:data:`mpguide.verify.claims.tolerances.INCONCLUSIVE_RULE`) gets its own line, ``[mpguide] INCONCLUSIVE (not
   a pass): ...``, logged at info level: a Sphinx warning would fail the ``-W`` build by noise.
5. ``build-finished``, last: one line with the build's wall time, the examples' and pages' summed
   execution times and their ratio (:mod:`mpguide_build.buildtime`); printed, never judged.

Configuration values (``conf.py``): ``mpguide_results_dir``, ``mpguide_reference_dir``,
``mpguide_examples_dir``, ``mpguide_gallery_dir`` (absolute paths), ``mpguide_record_pages``
(docnames that read records) and ``mpguide_gate`` (``False`` in the no-execution preview).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.errors import ConfigError, ExtensionError
from sphinx.util import logging

from mpguide.verify import gate
from mpguide.verify.claims.declarations import (
    EXAMPLES_ENV,
    SWAP_ENV,
    example_file,
    example_names,
    example_swaps,
    parse_swaps,
)
from mpguide.verify.records import REFERENCE_ENV, RESULTS_ENV, RecordError, load_record, record_path

from . import buildtime, evidence, matrix_summary

logger = logging.getLogger(__name__)


def remove_deleted_examples(examples_dir: Path, gallery_dir: Path, results_dir: Path) -> list[str]:
    """Delete what earlier builds generated for examples that no longer exist in ``examples_dir``.

    sphinx-gallery keeps its copy of a deleted script (and expects its notebook) in the gallery
    folder, which breaks the next incremental build; and the deleted example's record would still be
    judged by the gate and shown on the pages. Both go: the gallery's files for that example
    (script copy, notebook, page, stamps, figures) and its record and figures in ``results_dir``.

    Returns:
        Names of the examples whose leftovers were removed.
    """
    present = set(example_names(examples_dir))
    gallery_dir, results_dir = Path(gallery_dir), Path(results_dir)
    gone = (
        sorted({p.name.split(".")[0] for p in gallery_dir.glob("plot_*.py*")} - present) if gallery_dir.is_dir() else []
    )
    for name in gone:
        patterns = [f"{name}.*", f"images/sphx_glr_{name}_*", f"images/thumb/sphx_glr_{name}_*"]
        for path in [p for pattern in patterns for p in gallery_dir.glob(pattern)]:
            path.unlink(missing_ok=True)
        for path in results_dir.glob(f"{name}*"):
            path.unlink(missing_ok=True)
    return gone


def examples_to_rerun(examples_dir: Path, results_dir: Path) -> dict[str, str]:
    """Examples whose record in ``results_dir`` does not match their current inputs, with the reason.

    Inputs are what a record's ``source`` stores (:data:`mpguide.verify.records.INPUT_FIELDS`, built by
    :func:`mpguide.verify.records.source_inputs`, the function the examples write them with): the example
    file's code digest, the library's code digest (:mod:`mpguide.verify.records.codedigest`: a docstring or
    comment edit reruns nothing), and the preset, device and recipe swaps that apply to that
    example. An example is rerun when its record is missing or unreadable or when any input
    differs, so a recipe swap for one example reruns that one only.

    Returns:
        example name -> reason, in name order.
    """
    from mpguide.verify.records import CodeDigestError, library_code_digest, source_inputs

    swaps = parse_swaps(os.environ.get(SWAP_ENV))
    try:
        library = library_code_digest()
    except CodeDigestError as err:  # the library does not parse: every example reruns and fails, naming it
        return {name: str(err) for name in example_names(examples_dir)}
    rerun: dict[str, str] = {}
    for name in example_names(examples_dir):
        try:
            source = load_record(record_path(name, results_dir))["source"]
        except RecordError:
            rerun[name] = "no readable record"
            continue
        try:
            current = source_inputs(example_file(name, examples_dir), example_swaps(name, swaps), library)
        except CodeDigestError as err:  # running it shows the SyntaxError where the reader sees it
            rerun[name] = str(err)
            continue
        changed = [key for key, value in current.items() if source.get(key) != value]
        if changed:
            rerun[name] = ", ".join(changed) + " changed"
    return rerun


def invalidate_stale_examples(examples_dir: Path, gallery_dir: Path, results_dir: Path) -> dict[str, str]:
    """Delete sphinx-gallery's md5 stamps of :func:`~mpguide_build.sphinx_ext.examples_to_rerun`, so those run again.

    Returns:
        example name -> why it reruns.
    """
    Path(results_dir).mkdir(parents=True, exist_ok=True)
    stale = examples_to_rerun(examples_dir, results_dir)
    for name in stale:
        (Path(gallery_dir) / f"{name}.py.md5").unlink(missing_ok=True)
    return stale


def _on_builder_inited(app: Sphinx) -> None:
    cfg = app.config
    results = Path(cfg.mpguide_results_dir)
    os.environ[RESULTS_ENV] = str(results)
    os.environ[EXAMPLES_ENV] = str(cfg.mpguide_examples_dir)
    if cfg.mpguide_reference_dir:
        os.environ[REFERENCE_ENV] = str(cfg.mpguide_reference_dir)
    if not cfg.mpguide_gate:
        logger.info("[mpguide] preview build: examples are not run and the claim gate is off")
        return
    examples = Path(cfg.mpguide_examples_dir)
    check_run_environment(examples)
    gone = remove_deleted_examples(examples, Path(cfg.mpguide_gallery_dir), results)
    if gone:
        logger.info(f"[mpguide] removed the generated files and records of deleted examples: {', '.join(gone)}")
    stale = invalidate_stale_examples(examples, Path(cfg.mpguide_gallery_dir), results)
    for name, why in stale.items():
        logger.info(f"[mpguide] {name} runs: {why}")


def check_run_environment(examples: Path) -> None:
    """Refuse, before any example runs, an ``MPGUIDE_PRESET``, ``MPGUIDE_DEVICE`` or ``MPGUIDE_SWAP_RECIPE``
    that names something unknown (a typo must not let a build pass unswapped or fail late).

    Raises:
        sphinx.errors.ConfigError: one line naming the variable, the value and what is accepted.
    """
    from mpguide.verify.hardware import select_accelerator, select_preset  # imports torch: only for builds that run

    try:
        select_preset()
        select_accelerator()
        swaps = parse_swaps(os.environ.get(SWAP_ENV))
    except ValueError as err:
        raise ConfigError(f"[mpguide] {err}") from None
    unknown = sorted({ex for ex, _ in swaps} - set(example_names(examples)))
    if unknown:
        raise ConfigError(
            f"[mpguide] {SWAP_ENV} names example(s) {unknown} that {examples} does not have; "
            f"examples: {example_names(examples)}"
        )


def _record_files(app: Sphinx, references: bool | None = None) -> list[Path]:
    """This build's records (``references=False``), the committed references (``True``), or both."""
    cfg = app.config
    locations = [] if references else [Path(cfg.mpguide_results_dir)]
    if references is not False and cfg.mpguide_reference_dir and Path(cfg.mpguide_reference_dir).is_dir():
        locations.append(Path(cfg.mpguide_reference_dir))
    return gate.find_records(p for p in locations if p.exists())


def _on_source_read(app: Sphinx, docname: str, source: list[str]) -> None:
    """A page that reads records, or the version matrix, is read again when one of those files changes (an
    incremental build after a matrix refresh showed the releases page of the previous matrix)."""
    if docname in app.config.mpguide_record_pages:
        for path in _record_files(app):
            app.env.note_dependency(str(path))
    if docname in app.config.mpguide_matrix_pages:
        for path in sorted(matrix_summary.MATRIX_DIR.glob("*.json")):
            app.env.note_dependency(str(path))


def _on_env_before_read_docs(app: Sphinx, env: Any, docnames: list[str]) -> None:
    """Fail early, with the record's own message, when a page would read a bad record.

    The pages execute in a Jupyter kernel whose traceback MyST-NB does not pass on, so a corrupt
    record would otherwise surface as a bare "ExecutionError: docs/index.md".
    """
    if not app.config.mpguide_gate:
        return
    expected = [
        record_path(name, Path(app.config.mpguide_results_dir))
        for name in example_names(Path(app.config.mpguide_examples_dir))
    ]
    for path in dict.fromkeys(expected + _record_files(app)):
        try:
            load_record(path)
        except RecordError as err:
            raise ExtensionError(f"[mpguide] {err}") from None
    try:  # the guide page reads the version matrix too: a malformed summary fails here, not in a kernel
        matrix_summary.load_matrix()
    except matrix_summary.MatrixError as err:
        raise ExtensionError(f"[mpguide] {err}") from None


def _on_build_finished(app: Sphinx, exception: Exception | None) -> None:
    cfg = app.config
    if exception is not None or not cfg.mpguide_gate:
        return
    results = Path(cfg.mpguide_results_dir)
    report = gate.judge(
        _record_files(app, references=False),
        example_names(Path(cfg.mpguide_examples_dir)),
        results,
        references=_record_files(app, references=True),
        examples=Path(cfg.mpguide_examples_dir),
    )
    if not report.ok:
        raise ExtensionError(report.failure_message())
    logger.info(f"[mpguide] {report.summary().splitlines()[0]}")
    for line in report.summary().splitlines()[1:]:  # inconclusive claims, stale references: one line each
        logger.info(f"[mpguide] {line.strip()}", color="darkred" if "INCONCLUSIVE" in line else None)


def _on_build_finished_time(app: Sphinx, exception: Exception | None) -> None:
    """Print how well the build overlapped its examples and pages (:mod:`mpguide_build.buildtime`)."""
    if exception is None:
        logger.info(f"[mpguide] {buildtime.measure(app).line()}")


def threads_per_worker(gallery_conf: dict[str, Any], fname: Any, when: str) -> None:
    """sphinx-gallery ``reset_modules`` hook: split the cores between the parallel example workers.

    torch starts one intra-op thread per core in every process, so two workers on two cores run
    four threads on two cores. The examples' models are small (a few thousand weights, batches of
    32-64), whose steps gain nothing from a second thread and lose to the switching. Each worker
    therefore gets ``cores // workers`` threads (at least one); a serial gallery keeps torch's
    default. Verdicts do not change: every claim compares runs of one example, which share the
    thread count, and the throughput example sets its own threads around each timed window
    (:mod:`mpguide.verify.run.throughput`).
    """
    workers = gallery_conf.get("parallel") or 1
    if when != "before" or workers is True or int(workers) <= 1:
        return
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


def share_device_in_fits(gallery_conf: dict[str, Any], fname: Any, when: str) -> None:
    """sphinx-gallery ``reset_modules`` hook: every ``Trainer.fit`` of the examples holds the device lock.

    Runs in the process (or parallel worker) that is about to execute an example, and wraps
    :meth:`lightning.pytorch.Trainer.fit` once per process so that each fit holds the shared lock
    of its device (:func:`mpguide.verify.hardware.device_lock`). :func:`mpguide.verify.run.runner.run_example` already
    holds it around each declared run; this also covers the fits an example shows in plain sight, so
    that the throughput benchmark, which holds the lock exclusively, times a GPU no other example
    uses. On CPU the lock does nothing. Nothing an example computes changes.
    """
    if when != "before":
        return
    import functools

    import lightning.pytorch as pl
    from lightning.pytorch.accelerators import CUDAAccelerator

    from mpguide.verify.hardware import device_lock

    if getattr(pl.Trainer.fit, "mpguide_device_lock", False):
        return
    fit = pl.Trainer.fit

    @functools.wraps(fit)
    def fit_holding_the_device(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        with device_lock("cuda" if isinstance(trainer.accelerator, CUDAAccelerator) else "cpu"):
            return fit(trainer, *args, **kwargs)

    fit_holding_the_device.mpguide_device_lock = True  # type: ignore[attr-defined]
    pl.Trainer.fit = fit_holding_the_device


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the configuration values and event handlers (see the module docstring)."""
    app.add_config_value("mpguide_results_dir", "", "env", types=[str])
    app.add_config_value("mpguide_reference_dir", "", "env", types=[str])
    app.add_config_value("mpguide_examples_dir", "", "env", types=[str])
    app.add_config_value("mpguide_gallery_dir", "", "env", types=[str])
    app.add_config_value("mpguide_record_pages", [], "env", types=[list])
    app.add_config_value("mpguide_matrix_pages", [], "env", types=[list])
    app.add_config_value("mpguide_gate", True, "env", types=[bool])
    app.connect("builder-inited", _on_builder_inited, priority=100)  # before sphinx-gallery (500)
    app.connect("builder-inited", lambda app: buildtime.mark("gallery"), priority=900)  # after it
    app.connect("env-before-read-docs", lambda app, env, docnames: buildtime.reading(docnames))
    app.connect("env-updated", lambda app, env: buildtime.mark("reading"))
    app.connect("build-finished", lambda app, exc: buildtime.mark("writing"), priority=1)  # before the gate
    app.connect("env-before-read-docs", _on_env_before_read_docs)
    app.connect("source-read", _on_source_read)
    app.connect("doctree-resolved", evidence.fold)  # gallery pages: the Evidence cells fold
    app.connect("build-finished", _on_build_finished)
    from .pagecheck import on_build_finished as check_pages  # after the gate: page elements shown

    app.connect("build-finished", check_pages, priority=600)
    app.connect("build-finished", _on_build_finished_time, priority=900)  # last: after the JUnit file
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
