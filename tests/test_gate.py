import json

from mpguide import gate, records


def write(tmp_path, record, name=None):
    return records.write_record(record, tmp_path / f"{name or record['example']}.json")


def test_cli_passes_on_good_record(tmp_path, good_record, capsys):
    write(tmp_path, good_record)
    assert gate.main([str(tmp_path)]) == 0
    assert "passed" in capsys.readouterr().out


def test_cli_fails_on_diverged_curve_with_precise_message(tmp_path, good_record, capsys):
    good_record["runs"][1]["loss"] = [v * 1.5 for v in good_record["runs"][1]["loss"]]
    path = write(tmp_path, good_record)
    assert gate.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "1 failed claim(s)" in err
    assert "plot_99_fake: match(manual, auto) FAILED [port]: max rel. diff = 0.5, threshold <= 0.001" in err
    assert str(path) in err


def test_cli_record_errors_exit_2(tmp_path, good_record, capsys):
    write(tmp_path, good_record)
    (tmp_path / "plot_98_truncated.json").write_text(json.dumps(good_record)[:100])
    assert gate.main([str(tmp_path)]) == 2
    assert "plot_98_truncated.json: not valid JSON" in capsys.readouterr().err


def test_missing_expected_record_is_an_error(tmp_path, good_record):
    write(tmp_path, good_record)
    report = gate.judge(gate.find_records([tmp_path]), ["plot_01_porting_to_manual"], tmp_path)
    assert not report.ok
    assert "plot_01_porting_to_manual.json: results record not found" in report.failure_message()


def test_no_records_at_all_fails(tmp_path, capsys):
    assert gate.main([str(tmp_path)]) == 2
    assert "nothing was verified" in capsys.readouterr().err


def test_check_raises_gate_failure(tmp_path, good_record):
    good_record["runs"][0]["loss"][10] = float("nan")
    write(tmp_path, good_record)
    try:
        gate.check(gate.find_records([tmp_path]))
    except gate.GateFailure as failure:
        assert "the loss is nan at step 10" in str(failure)
        assert failure.report.failures
    else:
        raise AssertionError("the gate passed a record with a NaN loss")


def test_hidden_temp_files_are_ignored(tmp_path, good_record):
    write(tmp_path, good_record)
    (tmp_path / ".plot_99_fake.json.abc.tmp").write_text("{half")
    (tmp_path / ".library-hash").write_text("x")
    assert gate.judge(gate.find_records([tmp_path])).ok


def test_reference_records_are_judged_and_listed_for_pages(tmp_path, good_record, monkeypatch):
    """A committed GPU reference is read next to this build's record and can fail the gate on its own."""
    from mpguide import report

    build, reference = tmp_path / "build", tmp_path / "reference" / "nvidia-h200"
    monkeypatch.setenv(records.RESULTS_ENV, str(build))
    monkeypatch.setenv(records.REFERENCE_ENV, str(tmp_path / "reference"))
    write(build, good_record)
    gpu = json.loads(json.dumps(good_record))
    gpu["env"].update(device="NVIDIA H200", cuda="13.0", accelerator="cuda")
    write(reference, gpu)
    found = report.page_entries("plot_99_fake")
    assert [entry.source for entry in found] == ["this build", "reference: nvidia-h200"]
    assert found[1].record["env"]["device"] == "NVIDIA H200" and not found[1].stale
    assert "NVIDIA H200, CUDA 13.0" in found[1].label and all(v.passed for v in found[1].verdicts)
    assert gate.judge(gate.find_records([build]), references=gate.find_records([tmp_path / "reference"])).ok

    gpu["runs"][1]["loss"] = [v * 2 for v in gpu["runs"][1]["loss"]]  # a later threshold change breaks it
    write(reference, gpu)
    report_ = gate.judge(gate.find_records([build]), references=gate.find_records([tmp_path / "reference"]))
    assert not report_.ok
    assert "NVIDIA H200, CUDA 13.0" in report_.failure_message()
    assert "reference/nvidia-h200/plot_99_fake.json" in report_.failure_message()
