"""The record schema under random mutations of real records: no traceback, and no exit 0 for a broken type.

Real records: this build's record of ``plot_05_skipped_steps`` (run once, at the test preset, in a
session fixture) and the committed H200 references (``results/reference/nvidia-h200``, real GPU
runs of eight examples). Each mutation changes one field of one record the way a hand edit, a
truncated copy or a buggy writer would, and the gate's command line (``mpguide.verify.gate.main``) judges
the result in this process, so that any exception it lets through fails the test.

What counts as type-breaking is written here from the producer's side (what
:class:`mpguide.verify.run.runner.RunResult` and the writers store), not read from
:mod:`mpguide.verify.records.schema`: a
value of another JSON type; ``null`` where the writer never stores one; NaN or Infinity in a
finite number (a loss, a logged value or a claim's stored value may legitimately be NaN);
a negative integer where the writer stores a count; a deleted field that the writer always
stores; a truncated file.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from mpguide.verify import gate, records
from mpguide.verify.records import schema

FRESH = "plot_05_skipped_steps"  # the quickest example at the test preset
REFERENCES = ROOT / "results" / "reference" / "nvidia-h200"

#: Paths (runs[] and claims[] generalised) where the writers store null on purpose.
NULLABLE = {
    "source.example_code",
    "source.library_code",
    "source.example_sha256",
    "source.library_sha256",
    "source.declaration_sha256",
    "source.commit",
    "source.dirty",
    "source.run_env.MPGUIDE_PRESET",
    "source.run_env.MPGUIDE_DEVICE",
    "source.upgraded_from_schema",
    "runs[].plugin",
    "runs[].swapped_from",
    "runs[].loss_scale",
    "runs[].error",
    "claims[].value",
    "claims[].expected",
    "runs[].extra.final_loss_scale",
    # a PitfallChecks finding made at fit start has no batch or epoch; one about the module, no optimizer
    "runs[].extra.pitfall_findings[].batch",
    "runs[].extra.pitfall_findings[].epoch",
    "runs[].extra.pitfall_findings[].optimizer",
    # the schema reads null as "not measured", as it reads the key's absence (records made before the measurement;
    # their only_if claims read "not judged"): null is no type-breaking change here (a hypothesis draw found it)
    "env.lightning_autocast_cache",
}
#: Paths whose numbers may be NaN or Infinity (data, judged by the claims).
NAN_OK = re.compile(r"runs\[\]\.loss\[\]|runs\[\]\.extra\.logged\..*|claims\[\]\.value")
#: Keys the writers may leave out (schema-1 upgrades lack the run options; a claim holds its kind's keys; records
#: made before code digests lack example_code and library_code, records made since lack the byte digests). A
#: reference without its code digests reads STALE and is judged on its unchanged claims, as one whose digest was
#: edited; a build record without them fails as stale (tests/test_gate_declarations.py). Records made before the
#: measurement of Lightning's autocast cache lack env.lightning_autocast_cache: their only_if claims read "not judged".
OPTIONAL = re.compile(
    r"env\.lightning_autocast_cache|"
    r"source\.(commit|dirty|upgraded_from_schema|example_sha256|library_sha256|example_code|library_code)|source\.run_env\..*|runs\[\]\.(plugin|"
    r"trainer_kwargs|plain_flag|swapped_from)|runs\[\]\.trainer_kwargs\..*|runs\[\]\.error\."
    r"traceback|runs\[\]\.extra\..*|runs\[\]\.measures(\..*)?|claims\[\]\.(?!kind$|runs$).*"
)


def _generic(path: str) -> str:
    return re.sub(r"\[\d+\]", "[]", path)


def _leaves(value, path=""):
    """Every (path, value) of a parsed record, containers included, with JSON-path names."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}[{i}]")


def _parts(path: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]


def _parent(record, parts):
    obj = record
    for part in parts[:-1]:
        obj = obj[part]
    return obj


def _run_raised(record, parts) -> bool:
    return parts[:1] == ["runs"] and len(parts) > 1 and record["runs"][parts[1]].get("error") is not None


def type_breaking_mutations(record) -> list[tuple[str, str, object]]:
    """``(path, mutation, new value)`` for every type-breaking change of one field of ``record``."""
    out = []
    for path, value in _leaves(record):
        if not path or path == "schema_version":
            continue
        generic, parts = _generic(path), _parts(path)
        in_raised_extra = ".extra." in generic and _run_raised(record, parts)
        if isinstance(value, bool):
            others = ["x", 7, [], {}]
        elif isinstance(value, (int, float)):
            others = ["x", True, [], {}]
            if isinstance(value, float) and math.isfinite(value) and not NAN_OK.fullmatch(generic):
                others += [math.nan, math.inf]
            if isinstance(value, int) and value >= 0 and "." in generic:  # a count
                others.append(-5)
        elif isinstance(value, str):
            others = [7, True, [], {}]
        elif isinstance(value, list):
            others = ["x", 7, {}]
        elif isinstance(value, dict):
            others = ["x", 7, []]
        else:  # null: an object of strings is no type that a nullable field may hold instead
            others = [{"a": "b"}] if not generic.endswith(".expected") else []
        if value is not None and generic not in NULLABLE and not in_raised_extra:
            others.append(None)
        out += [(path, "set", o) for o in others]
        if isinstance(parts[-1], str) and not OPTIONAL.fullmatch(generic):
            out.append((path, "delete", None))
    return out


def apply(record, path: str, how: str, new):
    mutated = json.loads(json.dumps(record))  # a deep copy, 5x faster than copy.deepcopy on long curves
    parts = _parts(path)
    parent = _parent(mutated, parts)
    if how == "delete":
        del parent[parts[-1]]
    else:
        parent[parts[-1]] = new
    return mutated


def judge_file(path: Path, reference: bool) -> tuple[int, str]:
    """``python -m mpguide.verify.gate`` on one file, in this process: (exit status, stderr). Exceptions propagate."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = gate.main(["--reference", str(path)] if reference else [str(path)])
    return status, err.getvalue()


@pytest.fixture(scope="session")
def fresh_record(tmp_path_factory) -> dict:
    """This build's record of :data:`FRESH`, made now by running the example at the test preset."""
    folder = tmp_path_factory.mktemp("fresh")
    env = dict(
        os.environ, MPGUIDE_PRESET="test", MPGUIDE_DEVICE="cpu", MPGUIDE_RESULTS_DIR=str(folder), MPLBACKEND="Agg"
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{FRESH}.py")],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((folder / f"{FRESH}.json").read_text())


def _real_records(fresh_record):
    refs = [(json.loads(p.read_text()), True) for p in sorted(REFERENCES.glob("plot_*.json"))]
    return [(fresh_record, False)] + refs


@pytest.fixture(scope="session")
def mutation_groups(fresh_record) -> list[tuple[dict, bool, list]]:
    """Per real record and kind of change (generic path, delete or the new value's type): its mutations.

    Drawing a group first, then one of its members, spreads the draws over the fields instead of
    over the thousands of loss values.
    """
    groups: dict[tuple, list] = {}
    for index, (record, _) in enumerate(_real_records(fresh_record)):
        for path, how, new in type_breaking_mutations(record):
            kind = "nan" if isinstance(new, float) and math.isnan(new) else type(new).__name__
            groups.setdefault((index, _generic(path), how, kind, repr(new)[:8]), []).append((path, how, new))
    records_ = _real_records(fresh_record)
    return [(records_[key[0]][0], records_[key[0]][1], members) for key, members in sorted(groups.items(), key=str)]


def _write(tmp_path: Path, record, reference: bool, text: str | None = None, name: str = "") -> Path:
    folder = tmp_path / ("nvidia-h200" if reference else "build")
    folder.mkdir(exist_ok=True)
    path = folder / f"{name or record['example']}.json"
    path.write_text(text if text is not None else json.dumps(record))
    return path


def test_real_records_pass_unchanged(fresh_record, tmp_path):
    """The control: every real record, written back untouched, passes the gate (exit 0)."""
    for record, reference in _real_records(fresh_record):
        status, err = judge_file(_write(tmp_path, record, reference), reference)
        assert status == 0, err


def test_every_extra_key_of_the_real_records_is_declared(fresh_record):
    """Claims and pages read these keys: each must be declared with a type where it is measured (the run's own
    ``measures``, or for a record written before them, the probes' and the harness's declarations in the sources)."""
    from mpguide.verify.records import measures

    undeclared = set()
    for record, _ in _real_records(fresh_record):
        fallback = measures.declared(record["example"])
        for run in record["runs"]:
            declared = run.get("measures", fallback)
            undeclared |= {
                (record["example"], key) for key in run["extra"] if schema.declared_type(declared, key) is None
            }
    assert not undeclared, f"extra keys no probe declares (measures = {{...}}): {sorted(undeclared)}"


def test_every_key_a_declared_claim_reads_is_declared():
    """Every ``key`` in an example's CLAIMS table (expect, same, ratio, rate_ratio) is declared by a probe."""
    from mpguide.verify.claims import declarations
    from mpguide.verify.records import measures

    undeclared = []
    for name in declarations.example_names():
        declared = measures.declared(name)
        for claim in declarations.read(declarations.example_file(name)).claims:
            undeclared += [(name, k) for k in schema.claim_keys(claim) if schema.declared_type(declared, k) is None]
    assert not undeclared, f"claims read extra keys no probe declares (measures = {{...}}): {undeclared}"


def test_the_runner_writes_the_declarations(fresh_record):
    """A fresh record carries its runs' declarations, and they type every key the run holds."""
    for run in fresh_record["runs"]:
        assert run["measures"], run["id"]
        assert all(schema.declared_type(run["measures"], key) for key in run["extra"]), run["id"]


def _declared_record(fresh_record):
    record = json.loads(json.dumps(fresh_record))
    claim = next(c for c in record["claims"] if c.get("key"))
    return record, claim


def test_a_claim_reading_an_undeclared_key_is_refused(fresh_record, tmp_path):
    record, claim = _declared_record(fresh_record)
    key = claim["key"].split("/")[0]
    claim["key"] = f"{key}_typo"  # a key no probe declares (the claim reads it from the record as written)
    status, err = judge_file(_write(tmp_path, record, False), False)
    assert status == 1, err
    assert f"reads extra key '{key}_typo', which no probe declares" in err, err


def test_a_value_of_the_wrong_declared_type_is_refused(fresh_record, tmp_path):
    record = json.loads(json.dumps(fresh_record))
    run = next(r for r in record["runs"] if "global_step" in r["extra"])
    run["measures"]["global_step"] = "count"
    run["extra"]["global_step"] = -1
    status, err = judge_file(_write(tmp_path, record, False), False)
    assert status == 2, err
    assert "extra.global_step' should be a number >= 0, found number -1" in err, err


def test_a_declaration_of_an_unknown_type_name_is_refused(fresh_record, tmp_path):
    record = json.loads(json.dumps(fresh_record))
    record["runs"][0]["measures"]["batches"] = "int"
    status, err = judge_file(_write(tmp_path, record, False), False)
    assert status == 2, err
    assert "unknown type name 'int'" in err, err


def test_type_names_nest_and_patterns_declare_keys():
    assert schema.measure_type("list[list[count]]").validate_python([[0, 2], []]) == [[0, 2], []]
    with pytest.raises(ValueError, match="unknown type name 'list\\[integer\\]'|unknown type name 'integer'"):
        schema.measure_type("list[integer]")
    assert schema.declared_type({"*_steps_per_s": "positive"}, "manual_steps_per_s") == "positive"
    assert schema.declared_type({"*_steps_per_s": "positive"}, "manual_samples_per_s") is None


def test_a_record_without_declarations_is_typed_by_the_sources(fresh_record, tmp_path):
    """A record written before probes declared their keys (a committed reference) loads, typed as before."""
    record = json.loads(json.dumps(fresh_record))
    for run in record["runs"]:
        del run["measures"]
    assert judge_file(_write(tmp_path, record, False), False)[0] == 0
    run = next(r for r in record["runs"] if "global_step" in r["extra"])
    run["extra"]["global_step"] = 1.5  # the harness declares a count
    status, err = judge_file(_write(tmp_path, record, False), False)
    assert status == 2 and "global_step" in err, err


def _check(record, reference, path, how, new, tmp_path):
    mutated = apply(record, path, how, new)
    try:
        status, err = judge_file(_write(tmp_path, mutated, reference, name=record["example"]), reference)
    except Exception as exc:  # noqa: BLE001 - a traceback is the failure this test exists for
        pytest.fail(f"{record['example']}: {how} {path} = {new!r}: the gate raised {type(exc).__name__}: {exc}")
    assert status != 0, f"{record['example']}: {how} {path} = {new!r} passed the gate (exit 0)"
    return status, err


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_type_breaking_mutations_never_pass_and_never_raise(mutation_groups, tmp_path, data):
    """200 random type-breaking mutations over the real records: each exits non-zero, without a traceback."""
    record, reference, members = data.draw(st.sampled_from(mutation_groups), label="kind of change")
    path, how, new = data.draw(st.sampled_from(members), label="mutation")
    status, err = _check(record, reference, path, how, new, tmp_path)
    if status == 2:  # refused by the schema: the message names the file and the fix
        assert f"{record['example']}.json" in err and "rerun the example (python examples/" in err, err


def test_schema_errors_name_the_field_as_a_json_path(fresh_record, tmp_path):
    """The issue's case: a round of a rate set to a string, null, NaN or a negative number exits 2, naming it."""
    run = next(i for i, r in enumerate(fresh_record["runs"]) if r["id"] == "fp16-naive")
    for new, expected in (
        ("x", "a number, found string 'x'"),
        (None, "found null"),
        (math.nan, "finite number (not NaN or Infinity), found number NaN"),
        (-5, "a number >= 0, found number -5"),
    ):
        mutated = apply(fresh_record, f"runs[{run}].lr[2]", "set", new)
        status, err = judge_file(_write(tmp_path, mutated, False), False)
        assert status == 2
        assert f"field 'runs[{run}] (fp16-naive).lr[2]' should be" in err and expected in err, err
    plot_15 = {"runs": [{"id": "bench-fp32", "extra": {"manual_round_steps_per_s": [80.0, 90.0, "x"]}}]}
    with pytest.raises(ValidationError) as caught:
        schema.Record.model_validate(
            {
                **fresh_record,
                "runs": [
                    dict(
                        fresh_record["runs"][0],
                        extra=plot_15["runs"][0]["extra"],
                        measures={"*_round_steps_per_s": "list[positive]"},  # as the benchmark declares it
                    )
                ],
            }
        )
    message = schema.describe(caught.value, {"runs": plot_15["runs"]}, "plot_15_throughput.json")
    assert message.startswith(
        "plot_15_throughput.json: field 'runs[0] (bench-fp32).extra.manual_round_steps_per_s[2]' "
        "should be a number, found string 'x'"
    )


def test_truncated_real_records_exit_2(fresh_record, tmp_path):
    for record, reference in _real_records(fresh_record):
        text = json.dumps(record)
        for cut in (1, len(text) // 3, len(text) - 2):
            status, err = judge_file(_write(tmp_path, record, reference, text[:cut]), reference)
            assert status == 2 and "not valid JSON" in err, err


def test_run_env_of_another_type_is_a_record_error_not_a_traceback(fresh_record, tmp_path):
    """Measured at a31c63a: source.run_env as a list raised AttributeError in integrity.integrity_problems."""
    for new in ([], "x", 3):
        status, err = judge_file(_write(tmp_path, apply(fresh_record, "source.run_env", "set", new), False), False)
        assert status == 2 and "field 'source.run_env' should be object" in err, err


def test_a_registered_extra_key_may_be_null_only_in_a_run_that_raised(fresh_record):
    record = copy.deepcopy(fresh_record)
    run = next(r for r in record["runs"] if r["id"] == "fp16-naive")
    run["extra"]["skipped_any"] = None
    with pytest.raises(records.RecordError, match=r"extra\.skipped_any' should be true or false, found null"):
        records.validate_record(record, "r.json")
    run["error"] = {"type": "RuntimeError", "message": "boom", "traceback": ""}
    records.validate_record(record, "r.json")  # a run that raised measured nothing


def test_the_docs_build_refuses_a_malformed_record_before_any_page_runs(fresh_record, tmp_path):
    """The Sphinx side: the check before pages are read raises one ExtensionError naming the file and field."""
    from types import SimpleNamespace

    from sphinx.errors import ExtensionError

    from mpguide_build import sphinx_ext

    results = tmp_path / "results"
    results.mkdir()
    bad = apply(fresh_record, "runs[0].seconds", "set", "slow")
    (results / f"{FRESH}.json").write_text(json.dumps(bad))
    examples = tmp_path / "examples"
    examples.mkdir()
    shutil.copy(ROOT / "examples" / f"{FRESH}.py", examples)
    config = SimpleNamespace(
        mpguide_gate=True,
        mpguide_results_dir=str(results),
        mpguide_examples_dir=str(examples),
        mpguide_reference_dir=str(tmp_path / "none"),
    )
    app = SimpleNamespace(config=config)
    with pytest.raises(ExtensionError, match=rf"{FRESH}\.json: field 'runs\[0\] \(fp32\)\.seconds' should be"):
        sphinx_ext._on_env_before_read_docs(app, None, [])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s.update(status="done"), "field 'status' should be one of 'ran' or 'could not run'"),
        (lambda s: s["examples"][next(iter(s["examples"]))].update(seconds="7"), "seconds' should be"),
        (lambda s: s["examples"][next(iter(s["examples"]))]["claims"][0].update(verdict=None), "verdict' should be"),
        (lambda s: s["examples"][next(iter(s["examples"]))]["keys"].update(example_code=7), "example_code' should be"),
        (
            lambda s: s["examples"][next(iter(s["examples"]))]["keys"].pop("created"),
            "missing field 'examples.plot_01_porting_to_manual.keys.created'",
        ),
        (
            lambda s: s.update(plugin_tests={"status": "pass", "passed": -1, "failed": 0, "message": ""}),
            "field 'plugin_tests.passed' should be a number >= 0",
        ),
    ],
)
def test_matrix_summaries_are_typed(tmp_path, mutate, message):
    from mpguide_build import matrix_summary

    summary = json.loads(sorted(matrix_summary.MATRIX_DIR.glob("lightning-*.json"))[-1].read_text())
    matrix_summary.validate(copy.deepcopy(summary), "s.json")  # the committed summary is valid
    mutate(summary)
    (tmp_path / "lightning-9.9.9.json").write_text(json.dumps(summary))
    with pytest.raises(matrix_summary.MatrixError, match=re.escape(message)):
        matrix_summary.load_matrix(tmp_path)


def test_the_readers_wheel_declares_the_schema_library():
    """A downloaded example validates its record with pydantic: the wheel's METADATA makes pip install it."""
    from mpguide_build import download

    pins = dict(
        line.split("#")[0].strip().split("==")
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if "==" in line.split("#")[0]
    )
    metadata = download.wheel_files()[f"mpguide-{download.__version__}.dist-info/METADATA"].decode()
    declared = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    # a lower bound the site's own pin satisfies, never an exact pin (it would replace a reader's pydantic)
    assert declared == ["pydantic>=2"], metadata
    assert int(pins["pydantic"].split(".")[0]) >= 2
