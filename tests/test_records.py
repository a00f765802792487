import json

import pytest

from mpguide.verify import records
from mpguide.verify.records import RecordError, load_record, write_record


def test_roundtrip_keeps_nan(tmp_path, good_record):
    good_record["runs"][0]["loss"][5] = float("nan")
    path = write_record(good_record, tmp_path / "plot_99_fake.json")
    back = load_record(path)
    assert back["runs"][0]["loss"][5] != back["runs"][0]["loss"][5]  # NaN survives the trip
    assert back["runs"][1]["loss"] == good_record["runs"][1]["loss"]


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path, good_record, monkeypatch):
    path = write_record(good_record, tmp_path / "r.json")
    before = path.read_text()

    def boom(*args, **kwargs):
        raise KeyboardInterrupt("interrupted mid-write")

    monkeypatch.setattr(json, "dump", boom)
    with pytest.raises(KeyboardInterrupt):
        write_record(good_record, path)
    assert path.read_text() == before  # the old record is intact
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_invalid_record_is_not_written(tmp_path, good_record):
    del good_record["runs"][0]["loss"]
    with pytest.raises(RecordError, match="missing field 'loss'"):
        write_record(good_record, tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def test_missing_file_names_file_and_fix(tmp_path):
    with pytest.raises(RecordError) as err:
        load_record(tmp_path / "plot_01_porting_to_manual.json")
    assert "plot_01_porting_to_manual.json" in str(err.value)
    assert "python examples/plot_01_porting_to_manual.py" in str(err.value)


def test_truncated_json(tmp_path, good_record):
    path = write_record(good_record, tmp_path / "plot_99_fake.json")
    path.write_text(path.read_text()[:200])
    with pytest.raises(RecordError, match="not valid JSON.*truncated or corrupt"):
        load_record(path)


def test_corrupt_bytes(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"\x00\x01 garbage {")
    with pytest.raises(RecordError, match=r"x\.json: not valid JSON"):
        load_record(path)


@pytest.mark.parametrize("version", [0, 1, 3, "2", None])
def test_wrong_schema_version(tmp_path, good_record, version):
    good_record["schema_version"] = version
    path = tmp_path / "r.json"
    path.write_text(json.dumps(good_record))
    with pytest.raises(RecordError, match="schema_version"):
        load_record(path)


def test_wrong_types_and_duplicates(tmp_path, good_record):
    bad = dict(good_record, runs="not a list")
    with pytest.raises(RecordError, match="'runs' should be list"):
        records.validate_record(bad, "r.json")
    dup = dict(good_record, runs=good_record["runs"] + good_record["runs"][:1])
    with pytest.raises(RecordError, match="appears twice"):
        records.validate_record(dup, "r.json")
    text = dict(good_record)
    text["runs"] = [dict(good_record["runs"][0], loss=["0.5"])]
    with pytest.raises(RecordError, match="non-numeric loss"):
        records.validate_record(text, "r.json")


def test_results_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv(records.RESULTS_ENV, str(tmp_path))
    assert records.record_path("plot_x") == tmp_path / "plot_x.json"


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.update(claims=[]), "declares no claims"),
        (lambda r: r["claims"][0].update(runs=["auto", "auto"]), "2 distinct run id"),
        (lambda r: r["claims"][0].update(runs=["auto"]), "2 distinct run id"),
        (lambda r: r["claims"][0].update(runs=[["auto"], "manual"]), "2 distinct run id"),
        (lambda r: r["claims"][0].pop("tolerance"), "non-empty string 'tolerance'"),
        (lambda r: r["runs"][0].update(error="boom"), "'error' must be null or an object"),
        (lambda r: r["runs"][0].update(error={}), "'error' must be null or an object"),
        (lambda r: r["runs"][0]["loss"].__setitem__(3, True), "non-numeric loss"),
        (lambda r: r["runs"][0].update(extra=[]), "'extra' must be an object"),
    ],
)
def test_claim_and_run_fields_are_validated(good_record, mutate, message):
    mutate(good_record)
    with pytest.raises(RecordError, match=message):
        records.validate_record(good_record, "r.json")


def test_non_utf8_and_deep_nesting_are_clean_errors(tmp_path):
    (tmp_path / "a.json").write_bytes(b'{"example": "\xff\xfe"}')
    with pytest.raises(RecordError, match=r"a\.json: not UTF-8"):
        load_record(tmp_path / "a.json")
    (tmp_path / "b.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(RecordError, match=r"b\.json: JSON nested too deeply"):
        load_record(tmp_path / "b.json")


def test_record_under_another_examples_name(tmp_path, good_record):
    path = write_record(good_record, tmp_path / "plot_02_two_optimizers.json")
    with pytest.raises(RecordError, match="holds the record of 'plot_99_fake', not of 'plot_02_two_optimizers'") as err:
        load_record(path)
    # the fix names the example the record belongs to, whose run writes plot_99_fake.json
    assert "rerun the example it names (python examples/plot_99_fake.py" in str(err.value)
    assert "python examples/plot_02_two_optimizers.py" not in str(err.value)


@pytest.mark.parametrize("name", ["copy of the record.json", "plot_02_two_optimizers.json"])
def test_schema_fix_hint_names_the_records_example_not_its_file(tmp_path, good_record, name):
    """A record saved under another name gets the rerun hint of its ``example`` field, through the gate too."""
    from mpguide.verify import gate

    del good_record["runs"][0]["loss"]
    path = tmp_path / name
    path.write_text(json.dumps(good_record))
    for message in (
        _error_of(lambda: load_record(path)),
        _error_of(lambda: records.validate_record(good_record, path)),
        gate.judge([path]).record_errors[0],
    ):
        assert "missing field 'loss'" in message, message
        assert "rerun the example (python examples/plot_99_fake.py" in message, message
        assert f"python examples/{path.stem}.py" not in message, message


def test_schema_fix_hint_falls_back_to_the_file_name(tmp_path, good_record):
    """Without a usable ``example`` field the file's stem is the only name there is."""
    good_record["example"] = ["not", "a", "name"]
    message = _error_of(lambda: records.validate_record(good_record, tmp_path / "plot_07_x.json"))
    assert "rerun the example (python examples/plot_07_x.py" in message, message


def _error_of(call) -> str:
    with pytest.raises(RecordError) as err:
        call()
    return str(err.value)


@pytest.mark.parametrize(
    "mutate, where, field, hint",
    [
        (lambda r: r.update(runz=[]), "r.json", "runz", "a typo of 'runs'"),
        (lambda r: r["env"].update(gpu="H200"), "r.json: env", "gpu", "a typo"),
        (
            lambda r: r["source"].update(declaration_sha265="0" * 64),
            "r.json: source",
            "declaration_sha265",
            "a typo of 'declaration_sha256'",
        ),
        (
            lambda r: r["source"].update(run_env={"MPGUIDE_PRESET": "test", "MPGUIDE_DEVICES": "cpu"}),
            "r.json: source.run_env",
            "MPGUIDE_DEVICES",
            "a typo of 'MPGUIDE_DEVICE'",
        ),
        (
            lambda r: r["runs"][2].update(precison="32-true"),
            "r.json: runs[2] (bf16)",
            "precison",
            "a typo of 'precision'",
        ),
        (
            lambda r: r["runs"][0].update(error={"type": "E", "message": "m", "trace": ""}),
            "r.json: runs[0] (auto).error",
            "trace",
            "a typo of 'traceback'",
        ),
        (
            lambda r: r["claims"][0].update(tolerence="mixed-vs-fp32"),
            "r.json: claims[0]",
            "tolerence",
            "a typo of 'tolerance'",
        ),
    ],
)
def test_unknown_fields_are_refused_naming_file_field_and_fix(good_record, mutate, where, field, hint):
    mutate(good_record)
    with pytest.raises(RecordError) as err:
        records.validate_record(good_record, "r.json")
    assert str(err.value) == (
        f"{where}: unknown field {field!r}, which schema 2 does not define (1 unknown field(s) in all): {hint} "
        f"(fix the name), a field of a newer mpguide (update this checkout) or a hand edit; rerun the example "
        f"(python examples/plot_99_fake.py, or rebuild the docs with nox -s docs) to write a fresh record"
    )  # the record's example, not its file name r.json


def test_a_runs_extra_is_free_form(good_record):
    good_record["runs"][0]["extra"] = {"anything": 1, "the recipe": {"measures": [1, 2]}}
    records.validate_record(good_record, "r.json")


def test_unknown_field_is_a_record_error_of_the_gate_and_is_never_written(tmp_path, good_record, capsys):
    from mpguide.verify import gate

    with pytest.raises(RecordError, match="unknown field 'sed'"):
        write_record(dict(good_record, sed=1), tmp_path / "plot_99_fake.json")
    assert not (tmp_path / "plot_99_fake.json").exists()
    (tmp_path / "plot_99_fake.json").write_text(json.dumps(dict(good_record, sed=1)))
    assert gate.main([str(tmp_path)]) == 2
    assert f"{tmp_path / 'plot_99_fake.json'}: unknown field 'sed'" in capsys.readouterr().err


def test_schema_fields_cover_what_runs_and_declarations_write():
    """The lists of known fields cannot drift from what a run records and a claim declares."""
    import dataclasses

    from mpguide.verify.claims import compare as declaration_check
    from mpguide.verify.claims import declarations
    from mpguide.verify.run.runner import RunResult

    assert {f.name for f in dataclasses.fields(RunResult)} == records.SCHEMA_FIELDS["run"]
    assert set(declaration_check.CLAIM_KEYS) | {"title"} <= records.SCHEMA_FIELDS["claim"]
    assert set(declarations.RUN_KEYS) <= records.SCHEMA_FIELDS["run"]
    assert set(records.run_env({})) == records.SCHEMA_FIELDS["run_env"]
    assert set(records.environment("cpu")) == records.SCHEMA_FIELDS["env"]


def test_captured_warnings_carry_no_machine_paths():
    """detect_anomaly's warning carries a traceback of absolute paths; records must not (they get committed)."""
    import warnings

    from mpguide.verify.run.runner import captured_warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn(
            'Error detected.\n  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 9\n'
            '  File "/home/ci/repo/.nox/site/lib/python3.11/site-packages/torch/autograd/graph.py", line 8',
            UserWarning,
            stacklevel=1,
        )
    [text] = captured_warnings(caught)
    assert '"threading.py"' in text and '"torch/autograd/graph.py"' in text
    assert "/root" not in text and "/home" not in text and ".nox" not in text
