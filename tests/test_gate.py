import json

from mpguide.verify import gate, records
from mpguide.verify.claims import declarations
from mpguide.verify.show import report
from mpguide_build import pages


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
    err = capsys.readouterr().err
    assert "no results records were found, so nothing was verified; run the examples" in err
    assert "0 record error(s)" not in err  # one message, not a count of zero above a problem


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

    build, reference = tmp_path / "build", tmp_path / "reference" / "nvidia-h200"
    monkeypatch.setenv(records.RESULTS_ENV, str(build))
    monkeypatch.setenv(records.REFERENCE_ENV, str(tmp_path / "reference"))
    write(build, good_record)
    gpu = json.loads(json.dumps(good_record))
    gpu["env"].update(device="NVIDIA H200", cuda="13.0", accelerator="cuda")
    write(reference, gpu)
    found = pages.page_entries("plot_99_fake")
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


LONG = "manual-fp16-with-a-per-batch-scheduler-stepped-only-when-the-scaler-did-not-skip"  # 82 characters
GATE_COLUMNS = ("verdict", "claim", "runs", "value", "threshold", "hardware")


def cells_of(table, columns):
    """Parse a plain-text table back into rows of cells (continuation lines joined), checking alignment."""
    lines = table.splitlines()
    starts, at = [], 0
    for name in columns:
        at = lines[0].index(name, at)
        starts.append(at)
    assert set(lines[1]) <= {"-", " "} and all(line == line.rstrip() for line in lines)
    for name, dashes in zip(columns, lines[1].split()):  # no column grows past its limit, however long a cell
        assert len(dashes) <= max(len(name), report.MAX_CELL_WIDTH[name]), (name, len(dashes))
    rows = []
    for line in lines[2:]:
        for start in starts[1:]:  # the gap before every column is blank on every line: nothing spills over
            assert line[start - 2 : start].strip() == "", (start, line)
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
        if cells[0]:
            rows.append([[c] if c else [] for c in cells])
        else:
            for i, c in enumerate(cells):
                rows[-1][i] += [c] if c else []
    return rows


def test_verdict_table_stays_aligned_with_very_long_run_ids(tmp_path, fake_examples, capsys):
    from conftest import curve, make_record, run

    from mpguide.verify.claims import verdicts

    (fake_examples / "plot_97_long.py").write_text(
        f'RUNS = [("auto", "auto", "32-true"), ("{LONG}", "manual", "32-true")]\n'
        f'CLAIMS = [("match", "{LONG}", "auto", "same-precision", "port with a long run id"),\n'
        f'          ("match", "auto", "{LONG}", "same-precision")]\n'
    )
    declared = list(declarations.read(fake_examples / "plot_97_long.py").claims)
    runs = [run("auto", curve()), dict(run(LONG, curve(scale=1.5)), recipe="manual")]
    write(tmp_path, make_record(runs, declared, example="plot_97_long"))
    assert gate.main([str(tmp_path)]) == 1
    table = capsys.readouterr().out.split("\nclaim gate:")[0]
    widths = {len(line) for line in table.splitlines()[:2]}
    assert max(len(line) for line in table.splitlines()) <= max(widths)
    rows = cells_of(table, GATE_COLUMNS)
    assert [row[0] for row in rows][:2] == [["FAIL"], ["FAIL"]]
    runs = [" ".join(row[2]).replace(" ", "") for row in rows[:2]]
    assert runs == [f"{LONG}vsauto", f"autovs{LONG}"]  # wrapped, nothing lost
    assert all(len(row[2]) > 1 for row in rows[:2]) and all(row[5] == [row[5][0]] for row in rows)
    assert verdicts.hardware_label(make_record([], [])["env"]) == rows[0][5][0]


def test_report_summary_wraps_long_titles_and_line_breaks(good_record):
    good_record["runs"][1]["id"] = LONG
    for claim in good_record["claims"]:
        claim["runs"] = [LONG if r == "manual" else r for r in claim["runs"]]
    good_record["claims"][0]["title"] = ""  # untitled: the claim column shows match(<long id>, auto)
    good_record["claims"][1]["title"] = "first line\nsecond line"
    text = report.summary(good_record)
    table = text.split("\n\n")[0]
    rows = cells_of(table, report.SHORT_COLUMNS)
    assert "".join(rows[0][1]).replace(" ", "") == f"match({LONG},auto)".replace(" ", "")
    assert rows[1][1] == ["first line", "second line"]
    assert max(len(line) for line in table.splitlines()) == len(table.splitlines()[1])


def test_empty_build_folder_fails_even_with_references(tmp_path, good_record, capsys):
    """`gate DIR --reference REF`: the references alone must not make an empty build pass."""
    refs = tmp_path / "refs"
    refs.mkdir()
    empty = tmp_path / "build"
    empty.mkdir()
    assert gate.main([str(empty), "--reference", str(refs)]) == 2
    assert f"{empty}: no record found (no *.json); run the examples or build the docs first" in capsys.readouterr().err


def test_missing_reference_path_fails(tmp_path, good_record, capsys):
    write(tmp_path, good_record)
    assert gate.main([str(tmp_path), "--reference", str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'}: no such reference file or folder" in capsys.readouterr().err
