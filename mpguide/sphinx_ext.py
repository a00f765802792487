"""Sphinx extension: wire the results records into the build and fail it when a claim fails.

What it does, in build order:

1. ``builder-inited`` (before sphinx-gallery runs the examples): exports the records folder as
   ``MPGUIDE_RESULTS_DIR`` so examples (run in-process by sphinx-gallery, which sets no
   ``__file__`` and changes directory) and the MyST-NB page kernel agree on it; then forces a
   re-run of every example whose record is missing, or of all examples when the helper library's
   source changed since the last build (sphinx-gallery only looks at the example file's own md5);
   removes what earlier builds left for deleted examples; and refuses an ``MPGUIDE_SWAP_RECIPE``
   that names an example that does not exist (a typo must not let a build pass unswapped).
2. ``env-before-read-docs``: loads every record the pages will read and stops the build with
   the record's own message (file, problem, fix) if one is missing or corrupt.
3. ``source-read``: registers every record file as a dependency of the pages that read records,
   so those pages are re-read (and re-executed) when a record changes.
4. ``build-finished``: runs the claim gate (:func:`mpguide.gate.check`) over this build's records
   and the committed reference records; any failed claim or unreadable record raises
   :class:`sphinx.errors.ExtensionError`, so ``sphinx-build`` exits non-zero with one line per
   failure naming example, claim, runs, metric, threshold, record and hardware.

Configuration values (``conf.py``): ``mpguide_results_dir``, ``mpguide_reference_dir``,
``mpguide_examples_dir``, ``mpguide_gallery_dir`` (absolute paths), ``mpguide_record_pages``
(docnames that read records) and ``mpguide_gate`` (``False`` in the no-execution preview).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging

from . import gate
from .records import REFERENCE_ENV, RESULTS_ENV, RecordError, load_record, record_path
from .runner import SWAP_ENV, parse_swaps

logger = logging.getLogger(__name__)
#: File in the results folder holding the :func:`~mpguide.sphinx_ext.library_hash` of the last build.
STAMP = ".library-hash"


#: Environment variables that change what an example trains; part of :func:`~mpguide.sphinx_ext.library_hash`.
RUN_ENV = ("MPGUIDE_PRESET", "MPGUIDE_DEVICE", "MPGUIDE_SWAP_RECIPE")


def library_hash() -> str:
    """SHA-256 (hex) of what examples depend on besides their own file.

    Covers the helper library's Python sources (names and contents) and the values of
    :data:`~mpguide.sphinx_ext.RUN_ENV`, so that switching preset or device, or swapping a recipe, reruns the examples.
    """
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    for name in RUN_ENV:
        digest.update(f"{name}={os.environ.get(name, '')}".encode())
    return digest.hexdigest()


def example_names(examples_dir: Path) -> list[str]:
    """Stems of the gallery examples that train (``plot_*.py``) in ``examples_dir``, sorted."""
    return sorted(p.stem for p in Path(examples_dir).glob("plot_*.py"))


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
    gone = sorted({p.name.split(".")[0] for p in gallery_dir.glob("plot_*.py*")} - present) if gallery_dir.is_dir() else []
    for name in gone:
        patterns = [f"{name}.*", f"images/sphx_glr_{name}_*", f"images/thumb/sphx_glr_{name}_*"]
        for path in [p for pattern in patterns for p in gallery_dir.glob(pattern)]:
            path.unlink(missing_ok=True)
        for path in results_dir.glob(f"{name}*"):
            path.unlink(missing_ok=True)
    return gone


def invalidate_stale_examples(examples_dir: Path, gallery_dir: Path, results_dir: Path) -> list[str]:
    """Delete sphinx-gallery's md5 stamps of examples that must run again.

    An example must run again when its record is missing from ``results_dir`` or when the helper
    library changed since the stamp in ``results_dir`` was written.

    Returns:
        Names of the examples invalidated.
    """
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = results_dir / STAMP
    current = library_hash()
    library_changed = not stamp.is_file() or stamp.read_text().strip() != current
    stale = [name for name in example_names(examples_dir)
             if library_changed or not record_path(name, results_dir).is_file()]
    for name in stale:
        (Path(gallery_dir) / f"{name}.py.md5").unlink(missing_ok=True)
    stamp.write_text(current + "\n")
    return stale


def _on_builder_inited(app: Sphinx) -> None:
    cfg = app.config
    results = Path(cfg.mpguide_results_dir)
    os.environ[RESULTS_ENV] = str(results)
    if cfg.mpguide_reference_dir:
        os.environ[REFERENCE_ENV] = str(cfg.mpguide_reference_dir)
    if not cfg.mpguide_gate:
        logger.info("[mpguide] preview build: examples are not run and the claim gate is off")
        return
    examples = Path(cfg.mpguide_examples_dir)
    try:
        swaps = parse_swaps(os.environ.get(SWAP_ENV))
    except ValueError as err:
        raise ExtensionError(f"[mpguide] {err}") from None
    unknown = sorted({ex for ex, _ in swaps} - set(example_names(examples)))
    if unknown:
        raise ExtensionError(f"[mpguide] {SWAP_ENV} names example(s) {unknown} that {examples} does not have; "
                             f"examples: {example_names(examples)}")
    gone = remove_deleted_examples(examples, Path(cfg.mpguide_gallery_dir), results)
    if gone:
        logger.info(f"[mpguide] removed the generated files and records of deleted examples: {', '.join(gone)}")
    stale = invalidate_stale_examples(examples, Path(cfg.mpguide_gallery_dir), results)
    if stale:
        logger.info(f"[mpguide] examples to (re)run: {', '.join(stale)}")


def _record_files(app: Sphinx) -> list[Path]:
    cfg = app.config
    locations = [Path(cfg.mpguide_results_dir)]
    if cfg.mpguide_reference_dir and Path(cfg.mpguide_reference_dir).is_dir():
        locations.append(Path(cfg.mpguide_reference_dir))
    return gate.find_records(p for p in locations if p.exists())


def _on_source_read(app: Sphinx, docname: str, source: list[str]) -> None:
    if docname in app.config.mpguide_record_pages:
        for path in _record_files(app):
            app.env.note_dependency(str(path))


def _on_env_before_read_docs(app: Sphinx, env: Any, docnames: list[str]) -> None:
    """Fail early, with the record's own message, when a page would read a bad record.

    The pages execute in a Jupyter kernel whose traceback MyST-NB does not pass on, so a corrupt
    record would otherwise surface as a bare "ExecutionError: docs/index.md".
    """
    if not app.config.mpguide_gate:
        return
    expected = [record_path(name, Path(app.config.mpguide_results_dir))
                for name in example_names(Path(app.config.mpguide_examples_dir))]
    for path in dict.fromkeys(expected + _record_files(app)):
        try:
            load_record(path)
        except RecordError as err:
            raise ExtensionError(f"[mpguide] {err}") from None


def _on_build_finished(app: Sphinx, exception: Exception | None) -> None:
    cfg = app.config
    if exception is not None or not cfg.mpguide_gate:
        return
    results = Path(cfg.mpguide_results_dir)
    report = gate.judge(_record_files(app), example_names(Path(cfg.mpguide_examples_dir)), results)
    if not report.ok:
        raise ExtensionError(report.failure_message())
    logger.info(f"[mpguide] claim gate: {len(report.verdicts)} checks in {len(report.records)} records passed")


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the configuration values and event handlers (see the module docstring)."""
    app.add_config_value("mpguide_results_dir", "", "env", types=[str])
    app.add_config_value("mpguide_reference_dir", "", "env", types=[str])
    app.add_config_value("mpguide_examples_dir", "", "env", types=[str])
    app.add_config_value("mpguide_gallery_dir", "", "env", types=[str])
    app.add_config_value("mpguide_record_pages", [], "env", types=[list])
    app.add_config_value("mpguide_gate", True, "env", types=[bool])
    app.connect("builder-inited", _on_builder_inited, priority=100)  # before sphinx-gallery (500)
    app.connect("env-before-read-docs", _on_env_before_read_docs)
    app.connect("source-read", _on_source_read)
    app.connect("build-finished", _on_build_finished)
    from .pagecheck import on_build_finished as check_pages  # after the gate: page elements shown
    app.connect("build-finished", check_pages, priority=600)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
