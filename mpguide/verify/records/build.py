"""A results record assembled from an example's finished runs: its ``source`` field and its judged claims.

:func:`~mpguide.verify.run.runner.run_example` trains the runs; this module turns them into the record that
:func:`mpguide.verify.records.write_record` stores (fields in :mod:`mpguide.verify.records.schema`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import claims, hardware, records
from ..claims import declarations
from .measures import with_harness_declarations


def source_info(
    example: str, declaration: declarations.Declaration, swaps: dict[str, str], accelerator: str
) -> dict[str, Any]:
    """The ``source`` field of a record: what it is produced from (see :mod:`mpguide.verify.records`).

    Its inputs come from :func:`mpguide.verify.records.source_inputs` (what the docs build compares to
    decide a rerun); added here are the git state and ``declaration_sha256``, the digest of what
    the example declares for a record made on ``accelerator``
    (:meth:`mpguide.verify.claims.declarations.Declaration.digest`), so the runs and claims the record holds hash
    to it (:func:`mpguide.verify.claims.declarations.record_digest`).

    Args:
        example: the example's file stem.
        declaration: its declared runs and claims.
        swaps: run id -> recipe of the ``MPGUIDE_SWAP_RECIPE`` entries that apply to it.
        accelerator: ``"cpu"`` or ``"cuda"``, where the record's runs trained.
    """
    example_path = declarations.example_file(example)
    commit, dirty = records.git_state([example_path, records.PACKAGE_DIR])
    return {
        **records.source_inputs(example_path, swaps),
        "declaration_sha256": declaration.digest(accelerator),
        "commit": commit,
        "dirty": dirty,
    }


def build_record(
    example: str,
    results: Sequence[Any],
    declaration: declarations.Declaration,
    accelerator: str,
    preset: hardware.Preset,
    swaps: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Assemble a schema-valid record and fill in each claim's value and verdict as judged now.

    Args:
        example: the example's file stem.
        results: the finished runs, :class:`mpguide.verify.run.strategy.RunResult` (each stored as its fields).
        declaration: the example's declared runs and claims.
        accelerator: ``"cpu"`` or ``"cuda"``; preset: the size the runs trained at.
        swaps: run id -> recipe of the ``MPGUIDE_SWAP_RECIPE`` entries that apply.
    """
    record = {
        "example": example,
        "schema_version": records.SCHEMA_VERSION,
        "created": records.utc_now(),
        "preset": preset.name,
        "env": records.environment(accelerator),
        "source": source_info(example, declaration, swaps or {}, accelerator),
        "runs": [with_harness_declarations(dict(r.__dict__)) for r in results],
        "claims": [dict(c) for c in declaration.claims_for(accelerator)],
    }
    judged = [v for v in claims.evaluate_record(record) if v.kind not in ("finite", "completes")]
    for claim, verdict in zip(record["claims"], judged):
        claim.update(
            value=verdict.value,
            threshold=verdict.threshold,
            verdict=verdict.status,
            metric=verdict.metric,
            detail=verdict.detail,
            observed=verdict.shown_value(),
        )
    return record
