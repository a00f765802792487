"""The schema of a results record, as typed pydantic models.

A version-matrix summary has its own schema, in :mod:`mpguide_build.summary_schema`.

Every field of the layout in :mod:`mpguide.verify.records` has a type here, checked in pydantic's strict
mode (no coercion: ``"0.5"`` is not a number, ``true`` is not ``1``), and every measured number
that a claim or a page reads is finite where it must be. A record that breaks the schema is
refused with one :class:`RecordError` naming the file, the field as a JSON path (for example
``runs[3] (bench-fp32).extra.manual_round_steps_per_s[2]``) and the fix; the gate turns it into
exit status 2, the docs build into one build error.

Why pydantic (v2) rather than jsonschema: the records are made and read by Python only, and the
models state the types next to the code that writes them (:class:`mpguide.verify.run.strategy.RunResult`);
each error carries a location tuple (``("runs", 3, "extra", ...)``) that becomes the JSON path of
the message; strict mode refuses the silent coercions a hand check forgets (a bool is an int in
Python); ``allow_inf_nan=False`` says per field where NaN and Infinity are malformed input and
where they are data. A language-neutral JSON Schema can still be written from the models
(``Record.model_json_schema()``), but nothing here needs one.

What is finite and what is not:

* ``loss`` may hold NaN and Infinity: a run expected to blow up stores its curve as it was (JSON's
  ``NaN``/``Infinity`` tokens), and the gate's implicit ``finite`` check judges it;
* ``lr``, ``loss_scale``, ``seconds``, ``steps``, ``skipped_steps`` and the recipe measurements
  in ``extra`` are finite (counts are integers >= 0, rates are > 0);
* ``extra`` stays a free-form object per recipe, but the probe that measures a key declares its type
  where it measures it (``measures = {"key": "type"}``, names from :data:`MEASURE_TYPES`); the runner
  writes the declarations into the run (``measures``), each declared key is checked against its type, a
  claim may read only keys its runs declare, and any other key is a JSON value whose numbers are finite
  (:func:`check_json`). A record without declarations (written before probes declared them) is typed by
  the declarations read from the sources (:mod:`mpguide.verify.records.measures`). A declared key may be
  ``null`` only in a run that raised (the recipe had nothing to measure), or where
  :data:`NULLABLE_EXTRA` says so.

Semantic rules the types cannot say are model validators: run ids are unique, a record holds at
least one claim, a claim of a known kind names as many distinct runs as the kind compares and
carries the fields it needs, and a record written by schema 2 itself (not upgraded from schema 1)
stores every run option.

Why this module is longer than 400 lines: it is the schema of one record, and the parts depend on each other
(the declared ``extra`` keys are checked by the run model, the claim model reads the run ids of the record
model, and the error messages walk the same models' locations); split up, a reader would follow one field
through several files.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .. import hints
from ..claims.conditions import CONDITIONS

#: Bump when the layout changes incompatibly; the gate refuses other versions.
SCHEMA_VERSION = 2


class RecordError(Exception):
    """A results record is missing, unreadable, or does not follow the schema.

    The message names the file, the field and how to produce a good one.
    """


# ----------------------------------------------------------------------------------- value types

#: A finite number (an int is a number; a bool is not).
Finite = Annotated[float, Field(allow_inf_nan=False)]
#: A number that may be NaN or Infinity (a loss of a run that blew up is data).
AnyNumber = Annotated[float, Field(allow_inf_nan=True)]
#: A finite number >= 0 (seconds, norms, a loss scale).
NonNegative = Annotated[float, Field(allow_inf_nan=False, ge=0)]
#: A finite number > 0 (a rate: steps per second).
Positive = Annotated[float, Field(allow_inf_nan=False, gt=0)]
#: An integer >= 0 (a count of steps, batches, calls, bytes).
Count = Annotated[int, Field(ge=0)]
#: A non-empty string (an id, a digest, a name).
Name = Annotated[str, Field(min_length=1)]

_STRICT = ConfigDict(extra="forbid", strict=True)


class StrictModel(BaseModel):
    """The base of every model here: strict types (no coercion) and no fields beyond the declared ones."""

    model_config = _STRICT


def check_json(value: Any, at: str = "") -> None:
    """Refuse anything in ``value`` that is not plain JSON with finite numbers.

    Args:
        value: a parsed JSON value (an undeclared ``extra`` entry, a claim's ``expected``).
        at: JSON path of ``value`` below the field being validated, for the message.

    Raises:
        pydantic_core.PydanticCustomError: ``mpguide_type`` naming the sub-path and what was found.
    """
    if value is None or isinstance(value, (bool, str, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PydanticCustomError(
                "mpguide_type", "{expected}", {"at": at, "expected": "a finite number", "found": value}
            )
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_json(item, f"{at}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PydanticCustomError(
                    "mpguide_type", "{expected}", {"at": at, "expected": "string keys", "found": key}
                )
            check_json(item, f"{at}.{key}")
        return
    raise PydanticCustomError("mpguide_type", "{expected}", {"at": at, "expected": "a JSON value", "found": value})


# ------------------------------------------------------------------------------------ extra keys


class BenchmarkVariant(StrictModel):
    """Per-variant figures of the throughput benchmark (``summary()`` in :mod:`mpguide.verify.run.throughput`)."""

    steps_per_s: Positive
    samples_per_s: Positive
    tflops: NonNegative
    spread: NonNegative
    steps_per_window: Count
    window_seconds: list[NonNegative]
    round_steps_per_s: list[Positive]


class BenchmarkSize(StrictModel):
    """``extra.size``: the fields of :class:`mpguide.verify.run.throughput.config.Size` (the page recomputes FLOP/s from
    them)."""

    width: Count
    layers: Count
    batch: Count
    warmup: Count
    steps: Count
    rounds: Count
    tuned: bool = False
    min_window_s: NonNegative = 0.0
    max_rounds: Count = 0


class PitfallFinding(StrictModel):
    """One entry of ``extra.pitfall_findings``: a :class:`mpguide.checks.Finding` (``Finding.as_dict()``)."""

    section: Name
    message: Name
    batch: Count | None
    epoch: Count | None
    optimizer: Count | None
    count: Annotated[int, Field(ge=1)]


def _json_finite(value: Any) -> Any:
    check_json(value)
    return value


#: The type names a ``measures`` declaration may use (a probe's ``measures = {"key": "type"}``, the harness's
#: ``MEASURES``), each with its validator; ``list[T]`` of any of them nests (``list[list[count]]``). The first
#: six are the examples' vocabulary; the others name the harness's composite measurements.
MEASURE_TYPES: dict[str, Any] = {
    "bool": bool,
    "count": Count,  # an int >= 0
    "finite": Finite,
    "nonnegative": NonNegative,
    "positive": Positive,
    "name": Name,  # a non-empty string
    "text": str,
    "fraction": Annotated[float, Field(allow_inf_nan=False, ge=0, le=1)],
    "number": AnyNumber,  # NaN and Infinity are data (a blown-up logged value)
    "json": Annotated[Any, AfterValidator(_json_finite)],  # any JSON value whose numbers are finite
    "series": dict[str, list[AnyNumber]],  # what self.log saw, by name
    "pitfall_finding": PitfallFinding,
    "benchmark": dict[str, BenchmarkVariant],
    "benchmark_size": BenchmarkSize,
}
_LIST = re.compile(r"list\[(.+)\]")


@functools.cache
def _measure_kind(name: str) -> Any:
    inner = _LIST.fullmatch(name)
    if inner:
        return list[_measure_kind(inner.group(1))]
    if name not in MEASURE_TYPES:
        raise ValueError(f"unknown type name {name!r} (known: {', '.join(MEASURE_TYPES)}, and list[...] of them)")
    return MEASURE_TYPES[name]


@functools.cache
def measure_type(name: str) -> TypeAdapter:
    """The validator of the type ``name`` of a ``measures`` declaration.

    Raises:
        ValueError: ``name`` is not in :data:`MEASURE_TYPES` (nor ``list[...]`` of one).
    """
    kind = _measure_kind(name)
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return TypeAdapter(kind)
    return TypeAdapter(kind, config=ConfigDict(strict=True))


#: Declared keys that are ``null`` in a run that completed: no GradScaler, no final scale.
NULLABLE_EXTRA = frozenset({"final_loss_scale"})


def declared_type(measures: dict[str, str], key: str) -> str | None:
    """The type name ``measures`` declares for ``key`` (a key may be declared by a pattern, ``"*_steps_per_s"``)."""
    if key in measures:
        return measures[key]
    patterns = ((pattern, kind) for pattern, kind in measures.items() if "*" in pattern)
    return next((kind for pattern, kind in patterns if fnmatch.fnmatchcase(key, pattern)), None)


def _validate_extra(extra: dict[str, Any], raised: bool, measures: dict[str, str] | None) -> None:
    """Each declared key against its declared type; any other key is a JSON value with finite numbers."""
    for key, value in extra.items():
        kind = declared_type(measures, key) if measures is not None else None
        if kind is None:
            check_json(value, f".{key}")
            continue
        if value is None and (raised or key in NULLABLE_EXTRA):
            continue
        try:
            measure_type(kind).validate_python(value, strict=True)
        except ValidationError as err:
            first = err.errors(include_url=False)[0]
            at = f".{key}" + json_path(first["loc"], absolute=False)
            if first["type"] == "mpguide_type":
                at += first["ctx"]["at"]
            raise PydanticCustomError(
                "mpguide_type", "{expected}", {"at": at, "expected": expected_text(first), "found": first.get("input")}
            ) from None


# ---------------------------------------------------------------------------------------- record


class Env(StrictModel):
    """``env``: versions and hardware of the process that made the record (strings), and the measured conditions."""

    python: str
    torch: str
    lightning: str
    accelerator: str
    device: str
    cuda: str
    platform: str
    #: measured when the record is made (mpguide.verify.claims.conditions.measure): does the installed Lightning's
    #: own autocast region cache weight casts; absent in records made before it was measured
    lightning_autocast_cache: bool | None = None


class RunEnv(StrictModel):
    """``source.run_env``: the environment variables that steer a run (``None``: not recorded)."""

    MPGUIDE_PRESET: str | None = None
    MPGUIDE_DEVICE: str | None = None
    swaps: dict[str, str] = {}


class Source(StrictModel):
    """``source``: what the record was produced from (digests, commit, run environment)."""

    # code digests (mpguide.verify.records.codedigest): what freshness is decided on; absent in records written
    # before them, which read as stale; null in a migrated reference whose sources could not be verified
    example_code: str | None = None
    library_code: str | None = None
    # byte digests of records written before code digests (kept as written; nothing compares them any more)
    example_sha256: str | None = None
    library_sha256: Name | None = None
    declaration_sha256: str | None  # the gate's integrity check explains a missing one
    commit: str | None = None
    dirty: bool | None = None
    run_env: RunEnv
    upgraded_from_schema: Annotated[int, Field(ge=1, le=1)] | None = None  # not Literal[1]: it accepts True


class ErrorInfo(StrictModel):
    """A run's ``error``: the exception it raised."""

    type: Name
    message: str
    traceback: str = ""


class Run(StrictModel):
    """One entry of ``runs`` (the fields of :class:`mpguide.verify.run.strategy.RunResult`)."""

    id: Name
    mode: Name
    precision: Name
    precision_plugin: str
    recipe: Name
    seed: int
    steps: Count
    plugin: str | None = None
    trainer_kwargs: dict[str, Any] = {}
    plain_flag: bool = False
    swapped_from: str | None = None
    label: str
    loss: list[AnyNumber]
    lr: list[NonNegative]
    loss_scale: list[NonNegative] | None
    skipped_steps: Count
    seconds: NonNegative
    error: ErrorInfo | None
    warnings: list[str]
    #: key -> type name of every ``extra`` key the run's probes and harness declare (:data:`MEASURE_TYPES`);
    #: absent in a record written before probes declared them (then the caller's fallback declarations apply).
    measures: dict[str, str] | None = None
    extra: dict[str, Any]

    @field_validator("error", mode="before")
    @classmethod
    def _error_shape(cls, value: Any) -> Any:
        if value is not None and not (
            isinstance(value, dict)
            and isinstance(value.get("type"), str)
            and value["type"]
            and isinstance(value.get("message"), str)
        ):
            raise PydanticCustomError("mpguide", "'error' must be null or an object with string 'type' and 'message'")
        return value

    @field_validator("trainer_kwargs", mode="after")
    @classmethod
    def _kwargs_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_json(value)
        return value

    @field_validator("warnings", mode="before")
    @classmethod
    def _warnings_list(cls, value: Any) -> Any:
        if not isinstance(value, list):
            raise PydanticCustomError("mpguide", "'warnings' must be a list of strings")
        return value

    @field_validator("extra", mode="before")
    @classmethod
    def _extra_typed(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, dict):
            raise PydanticCustomError("mpguide", "'extra' must be an object")
        measures = info.data.get("measures")
        if measures is None:
            measures = (info.context or {}).get("fallback_measures")
        _validate_extra(value, raised=info.data.get("error") is not None, measures=measures)
        return value

    @field_validator("measures", mode="before")
    @classmethod
    def _measures_object(cls, value: Any) -> Any:
        # absent: a record from before the declarations (typed by the sources); present, it must be an object
        if not isinstance(value, dict):
            raise PydanticCustomError(
                "mpguide",
                "'measures' must be an object of key -> type name (what the run's probes declare); leave the "
                "field out only in a record written before probes declared their keys",
            )
        return value

    @field_validator("measures", mode="after")
    @classmethod
    def _known_types(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, kind in (value or {}).items():
            try:
                _measure_kind(kind)
            except ValueError as err:
                why = {"key": repr(key), "why": str(err)}
                raise PydanticCustomError("mpguide", "measures[{key}]: {why}", why) from None
        return value


#: Per claim kind: number of runs it names and the string fields it needs.
CLAIM_FIELDS: dict[str, tuple[int, tuple[str, ...]]] = {
    "match": (2, ("tolerance",)),
    "diverge": (2, ("tolerance",)),
    "ratio": (2, ("tolerance", "key")),
    "raises": (1, ("exception", "message")),
    "warns": (1, ("category", "message")),
    "no_warning": (1, ("message",)),
    "expect": (1, ("key",)),
    "same": (2, ("key",)),
    "rate_ratio": (1, ("tolerance", "key")),
    "flags": (1, ("section",)),
    "clean": (1, ()),
}


class Claim(StrictModel):
    """One entry of ``claims``: its defining keys (:data:`mpguide.verify.claims.compare.CLAIM_KEYS`), what was
    judged."""

    kind: Name
    runs: list[Any]  # checked by _runs_for_kind, with the kind in the message
    title: str = ""
    # the defining keys a kind needs (CLAIM_FIELDS); absent ones are "" (a stored null is refused)
    tolerance: str = ""
    exception: str = ""
    message: str = ""
    category: str = ""
    key: str = ""
    section: str = ""  # a flags claim: the guide section PitfallChecks must report (mpguide.checks.SECTIONS)
    expected: Any = None
    only_on: Literal["cpu", "cuda"] = "cpu"
    only_if: Literal[tuple(CONDITIONS)] | None = None  # type: ignore[valid-type]  # a measured condition
    # what the run that wrote the record judged (the gate judges again and does not read these)
    value: AnyNumber | None = None  # NaN for a curve that could not be compared, None for no number
    threshold: str = ""
    verdict: str = ""
    metric: str = ""
    detail: str = ""
    observed: str = ""

    @field_validator("expected", mode="after")
    @classmethod
    def _expected_json(cls, value: Any) -> Any:
        check_json(value)
        return value

    @model_validator(mode="after")
    def _runs_for_kind(self) -> Claim:
        ids = self.runs
        needs = CLAIM_FIELDS.get(self.kind)
        if needs is None:  # an unknown kind is judged (and failed) by the gate, naming the kind
            if not all(isinstance(r, str) and r for r in ids):
                raise PydanticCustomError(
                    "mpguide", "'runs' must be a list of run ids, found {ids}", {"ids": repr(ids)}
                )
            return self
        count, fields = needs
        if len(ids) != count or not all(isinstance(r, str) and r for r in ids) or len(set(map(repr, ids))) != len(ids):
            raise PydanticCustomError(
                "mpguide",
                "a {kind} claim needs {count} distinct run id(s), found {ids}",
                {"kind": repr(self.kind), "count": count, "ids": repr(ids)},
            )
        for name in fields:
            if not getattr(self, name):
                raise PydanticCustomError(
                    "mpguide",
                    "a {kind} claim needs a non-empty string {name}",
                    {"kind": repr(self.kind), "name": repr(name)},
                )
        if self.kind in ("expect", "ratio") and "expected" not in self.model_fields_set:
            raise PydanticCustomError("mpguide", "a {kind} claim needs 'expected'", {"kind": repr(self.kind)})
        return self


class Record(StrictModel):
    """A results record of ``schema_version`` 2 (the layout in :mod:`mpguide.verify.records`)."""

    example: Name
    schema_version: Annotated[int, Field(ge=SCHEMA_VERSION, le=SCHEMA_VERSION)]  # strict int: not 2.0, not True
    created: str
    preset: Name
    env: Env
    source: Source
    runs: list[Run]
    claims: list[Claim]

    @model_validator(mode="after")
    def _whole_record(self) -> Record:
        seen: set[str] = set()
        for run in self.runs:
            if run.id in seen:
                raise PydanticCustomError("mpguide", "run id {id} appears twice", {"id": repr(run.id)})
            seen.add(run.id)
        if not self.claims:
            raise PydanticCustomError("mpguide", "declares no claims, so it verifies nothing")
        if self.source.upgraded_from_schema is None:  # schema 2 writes every run option (schema 1 did not)
            for i, run in enumerate(self.runs):
                missing = [f for f in ("plugin", "trainer_kwargs", "plain_flag") if f not in run.model_fields_set]
                if missing:
                    raise PydanticCustomError(
                        "mpguide",
                        "runs[{i}] ({id}): missing field {name} (a record not "
                        "upgraded from schema 1 stores every run option)",
                        {"i": i, "id": run.id, "name": repr(missing[0])},
                    )
        return self


#: Every field schema 2 defines, per object (a field not listed is refused as unknown).
SCHEMA_FIELDS: dict[str, frozenset[str]] = {
    "record": frozenset(Record.model_fields),
    "env": frozenset(Env.model_fields),
    "source": frozenset(Source.model_fields),
    "run_env": frozenset(RunEnv.model_fields),
    "run": frozenset(Run.model_fields),
    "error": frozenset(ErrorInfo.model_fields),
    "claim": frozenset(Claim.model_fields),
}


# -------------------------------------------------------------------------------------- messages

_JSON_TYPES = (
    (bool, "boolean"),
    (str, "string"),
    (int, "number"),
    (float, "number"),
    (list, "list"),
    (dict, "object"),
    (type(None), "null"),
)


def found_text(value: Any) -> str:
    """What a field held, for a message: its JSON type and value, cut at 40 characters (``"string 'x'"``)."""
    kind = next((name for t, name in _JSON_TYPES if isinstance(value, t)), type(value).__name__)
    if kind in ("list", "object"):
        return f"{kind} of {len(value)} item(s)"
    text = (
        repr(value)
        if not isinstance(value, float) or math.isfinite(value)
        else {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[str(value)]
    )
    return kind if kind == "null" else f"{kind} {text[:40] + ('...' if len(text) > 40 else '')}"


def expected_text(error: dict[str, Any]) -> str:
    """What a field should hold, in words, from one pydantic error (``"a finite number"``)."""
    kind, ctx = error["type"], error.get("ctx") or {}
    words = {
        "list_type": "list",
        "dict_type": "object",
        "model_type": "object",
        "model_attributes_type": "object",
        "string_type": "a string",
        "int_type": "an integer",
        "float_type": "a number",
        "finite_number": "a finite number (not NaN or Infinity)",
        "bool_type": "true or false",
        "none_required": "null",
        "string_too_short": "a non-empty string",
        "greater_than_equal": f"a number >= {ctx.get('ge', 0):g}",
        "less_than_equal": f"a number <= {ctx.get('le', 0):g}",
        "greater_than": f"a number > {ctx.get('gt', 0):g}",
        "literal_error": f"one of {ctx.get('expected')}",
    }
    if kind == "mpguide_type":
        return ctx.get("expected", "")
    return words.get(kind, error["msg"].replace("Input should be ", ""))


def json_path(loc: tuple[Any, ...], absolute: bool = True, record: Any = None) -> str:
    """``("runs", 3, "extra", "x", 2)`` -> ``runs[3] (id).extra.x[2]`` (the run id from ``record``)."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            if i == 1 and loc[0] == "runs" and isinstance(record, dict):
                runs = record.get("runs")
                run = runs[part] if isinstance(runs, list) and part < len(runs) else None
                if isinstance(run, dict) and isinstance(run.get("id"), str):
                    out += f" ({run['id']})"
        else:
            out += f".{part}" if out or not absolute else str(part)
    return out


def _part(loc: tuple[Any, ...]) -> str:
    """Which object of :data:`SCHEMA_FIELDS` lies at ``loc``."""
    names = [p for p in loc if isinstance(p, str)]
    return {
        (): "record",
        ("env",): "env",
        ("source",): "source",
        ("source", "run_env"): "run_env",
        ("runs",): "run",
        ("runs", "error"): "error",
        ("claims",): "claim",
    }.get(tuple(names), "")


def describe(err: ValidationError, record: Any, path: Path | str) -> str:
    """One message for the first problem pydantic found: the file, the field's JSON path, what is wrong, the fix."""
    errors = err.errors(include_url=False)
    first = errors[0]
    loc, kind, ctx = tuple(first["loc"]), first["type"], first.get("ctx") or {}
    fix = f"rerun the example ({hints.rerun(hints.example_of(record, path))}) to write a fresh record"

    def where(at: tuple[Any, ...]) -> str:
        text = json_path(at, record=record)
        return f"{path}: {text}" if text else f"{path}"

    if kind == "extra_forbidden":
        parent = loc[:-1]
        unknown = sorted(
            (str(e["loc"][-1]) for e in errors if e["type"] == "extra_forbidden" and tuple(e["loc"][:-1]) == parent),
            key=str,
        )
        name = unknown[0]
        known = sorted(SCHEMA_FIELDS.get(_part(parent), ()))
        close = difflib.get_close_matches(name, known, n=1)
        typo = f"a typo of {close[0]!r}" if close else "a typo"
        return (
            f"{where(parent)}: unknown field {name!r}, which schema {SCHEMA_VERSION} does not define "
            f"({len(unknown)} unknown field(s) in all): {typo} (fix the name), a field of a newer mpguide "
            f"(update this checkout) or a hand edit; {fix}"
        )
    more = f" ({len(errors) - 1} more problem(s) in this record)" if len(errors) > 1 else ""
    if kind == "missing":
        return f"{where(loc[:-1])}: missing field {loc[-1]!r}{more}; {fix}"
    if kind == "mpguide":
        return f"{where(loc)}: {first['msg']}{more}; {fix}"
    at = json_path(loc, record=record) + (ctx.get("at", "") if kind == "mpguide_type" else "")
    value = ctx.get("found") if kind == "mpguide_type" else first.get("input")
    if len(loc) == 4 and loc[0] == "runs" and loc[2] == "loss":
        return (
            f"{path}: field {at!r} is a non-numeric loss value ({found_text(value)}); a loss is a number "
            f"(NaN and Infinity are stored as JSON's NaN/Infinity){more}; {fix}"
        )
    return f"{path}: field {at!r} should be {expected_text(first)}, found {found_text(value)}{more}; {fix}"


def claim_keys(claim: dict[str, Any]) -> list[str]:
    """The ``extra`` keys a claim reads: its ``key`` (``"a/b"`` reads two) and a ratio's named ``expected``."""
    keys = str(claim.get("key") or "").split("/") if claim.get("key") else []
    if claim.get("kind") == "ratio" and isinstance(claim.get("expected"), str):
        keys.append(claim["expected"])
    return keys


def validate_record(
    record: Any, path: Path | str = "<record>", fallback_measures: dict[str, str] | None = None
) -> None:
    """Check a record already parsed from JSON against :class:`Record`.

    Each run's ``extra`` is typed by the run's own ``measures``; a run without them (a record written before
    probes declared their keys: the committed references, upgraded records) by ``fallback_measures``, the
    declarations read from the harness and example sources (:func:`mpguide.verify.records.measures.declared`).

    Raises:
        RecordError: naming ``path``, the first problem's field (a JSON path) and the fix.
    """
    fix = f"rerun the example ({hints.rerun(hints.example_of(record, path))}) to write a fresh record"
    if not isinstance(record, dict):
        raise RecordError(f"{path}: a record must be a JSON object, found {type(record).__name__}; {fix}")
    version = record.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise RecordError(
            f"{path}: schema_version {version!r}, this library reads version {SCHEMA_VERSION}; {fix}"
            + (
                " (a committed reference of version 1 can be converted with "
                "`python -m mpguide.verify.records upgrade PATH --commit SHA`)"
                if version == 1
                else ""
            )
        )
    try:
        Record.model_validate(record, context={"fallback_measures": fallback_measures})
    except ValidationError as err:
        raise RecordError(describe(err, record, path)) from None
