import json

import pytest

from mpguide import records
from mpguide.records import RecordError, load_record, write_record


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


@pytest.mark.parametrize("version", [0, 2, "1", None])
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
