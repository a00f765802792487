"""The schema of a version-matrix summary (:mod:`mpguide_build.matrix_summary`), as typed pydantic models in the
strict mode of :mod:`mpguide.verify.records.schema`, whose error messages it uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from mpguide.verify.records.schema import Count, Name, NonNegative, StrictModel, expected_text, found_text, json_path

#: Format of a version-matrix summary (:mod:`mpguide_build.matrix`).
MATRIX_SCHEMA = "mpguide-matrix-1"


class MatrixClaim(StrictModel):
    """One row of an example in a summary: a declared claim or the implicit ``runs complete`` row."""

    id: Name
    kind: Name
    runs: list[str]
    title: str
    verdict: Literal["pass", "fail", "inconclusive", "not judged", "not applicable"]
    observed: str | None = None
    message: str
    #: the check in words (result, measured value with its unit, what is allowed), as the example's table
    #: words it (:mod:`mpguide.verify.show.report`); summaries written before 2026-12-01 afternoon have none
    words: str | None = None


class MatrixRun(StrictModel):
    """``examples[name].runs[id]``: what the release pages need of one run (its precision, plugin and error)."""

    precision: str
    plugin: str | None = None
    error: str | None = None


class CellKeys(StrictModel):
    """``examples[name].keys``: what one cell was produced with (:func:`mpguide_build.matrix_summary.cell_staleness`).

    ``example_code`` and ``library_code`` are code digests (:mod:`mpguide.verify.records.codedigest`; the library
    without :data:`mpguide.verify.records.PRESENTATION_MODULES`), ``null`` when a migration could not verify them
    (the cell is then stale); ``commit`` is the repository commit the cell ran at, or for a migrated cell
    ``migrated_from``, the commit whose sources the migration checked the cell's byte digests against.
    """

    example_code: str | None
    library_code: str | None
    python: str | None
    torch: str | None
    lightning: str | None
    created: str
    commit: str | None
    migrated_from: str | None = None


class MatrixExample(StrictModel):
    """``examples[name]`` of a summary (``runs`` only in summaries written since 2026-12-01; ``keys`` since
    code digests: a cell without them is a problem for ``python -m mpguide_build.matrix check``)."""

    keys: CellKeys | None = None
    example_sha256: str | None = None  # the byte digest of cells written before keys (kept as written)
    status: Literal["ran", "could not run"]
    error: str | None
    seconds: NonNegative | None
    claims: list[MatrixClaim]
    runs: dict[str, MatrixRun] | None = None


class ReleaseError(StrictModel):
    """``error`` of a release that could not run."""

    stage: Literal["install", "import"]
    message: str


class PluginTests(StrictModel):
    """``plugin_tests``: the plugin's tests in that environment."""

    status: Literal["pass", "fail", "refused", "could not run"]
    passed: Count
    failed: Count
    message: str


class MatrixSource(StrictModel):
    """``source`` of a summary: a release from PyPI, or a commit of Lightning's development branch."""

    kind: Literal["pypi", "git"]
    repository: str | None = None
    branch: str | None = None
    commit: str | None = None
    date: str | None = None


class CacheProbe(StrictModel):
    """``autocast_cache_probe``: the minimal reproduction of the autocast-cache bug on that torch."""

    torch: str | None = None
    gradient_lost: bool | None = None
    detail: str = ""


class MatrixSummary(StrictModel):
    """A version-matrix summary, ``results/matrix/lightning-<version>.json`` (see :mod:`mpguide_build.matrix`)."""

    schema_: Literal["mpguide-matrix-1"] = Field(alias="schema")  # "schema" would shadow a BaseModel attribute
    lightning: Name
    torch: str | None
    python: str
    device: str
    preset: str
    created: str
    status: Literal["ran", "could not run"]
    error: ReleaseError | None
    library_sha256: Name | None = None  # byte digest of summaries written before per-cell keys (kept as written)
    examples: dict[str, MatrixExample]
    plugin_tests: PluginTests | None
    # written since the older-torch and unreleased columns (absent in older summaries)
    torch_threads: Count | None = None
    lightning_version: str | None = None
    source: MatrixSource | None = None
    torch_pin: str | None = None
    scope: list[str] | None = None
    autocast_cache_probe: CacheProbe | None = None


def matrix_problem(summary: Any, where: Path | str) -> str:
    """``""`` for a valid summary, else the first problem: the file, the field's JSON path, what is wrong."""
    try:
        MatrixSummary.model_validate(summary)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        loc = tuple(first["loc"])
        at = json_path(loc)  # examples.<name>.claims[0].verdict
        if first["type"] == "missing":
            return f"{where}: missing field {at!r}"
        if first["type"] == "extra_forbidden":
            return f"{where}: unknown field {at!r}"
        return f"{where}: field {at!r} should be {expected_text(first)}, found {found_text(first.get('input'))}"
    return ""
