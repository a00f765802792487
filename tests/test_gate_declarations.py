"""The gate judges what the examples declare: every kind of tampering with a record exits 1 with its
own message, an untouched record passes, stale references are labelled, and messages are actionable."""

import json

import pytest
from conftest import FAKE_EXAMPLE, curve, reseal

from mpguide.verify import gate, records
from mpguide.verify.claims import declarations


def write(folder, record):
    return records.write_record(record, folder / f"{record['example']}.json")


def gate_run(tmp_path, capsys, *args):
    status = gate.main([str(a) for a in args] or [str(tmp_path)])
    out = capsys.readouterr()
    return status, out.out + out.err


def test_untouched_record_passes(tmp_path, good_record, capsys):
    write(tmp_path, good_record)
    status, out = gate_run(tmp_path, capsys)
    assert status == 0, out
    assert "0 failed" in out and "the broken recipe stalls" in out


def test_corrupt_curve_and_delete_its_claim(tmp_path, good_record, capsys):
    good_record["runs"][1]["loss"] = curve(scale=3.0)  # manual no longer matches auto ...
    good_record["claims"] = [
        c for c in good_record["claims"] if c["runs"] != ["manual", "auto"]
    ]  # ... and no claim says so
    write(tmp_path, good_record)
    status, out = gate_run(tmp_path, capsys)
    assert status == 1
    assert (
        "claim 'port' (match of manual, auto) is declared in examples/plot_99_fake.py but missing from the record"
        in out
    )
    assert "match(manual, auto) FAILED [port]: max rel. diff" in out  # the declared claim is judged anyway


def test_looser_tolerance_name(tmp_path, good_record, capsys):
    good_record["runs"][1]["loss"] = [v * 1.01 for v in good_record["runs"][1]["loss"]]  # 1 %: fails same-precision
    good_record["claims"][0]["tolerance"] = "mixed-vs-fp32"  # ... but would pass the looser one
    write(tmp_path, good_record)
    status, out = gate_run(tmp_path, capsys)
    assert status == 1
    assert "tolerance is 'mixed-vs-fp32' in the record, 'same-precision' in examples/plot_99_fake.py" in out
    assert "threshold <= 0.001" in out


def test_flipped_expected_value(tmp_path, good_record, capsys):
    good_record["runs"][3]["extra"]["stalled"] = False
    good_record["claims"][3]["expected"] = False
    write(tmp_path, good_record)
    status, out = gate_run(tmp_path, capsys)
    assert status == 1
    assert "expected is False in the record, True in examples/plot_99_fake.py" in out
    assert "expect(broken) FAILED [the broken recipe stalls]: stalled = False, threshold == True" in out


def test_deleted_run_with_its_claims(tmp_path, good_record, capsys):
    good_record["runs"] = [r for r in good_record["runs"] if r["id"] != "broken"]
    good_record["claims"] = [c for c in good_record["claims"] if "broken" not in c["runs"]]
    write(tmp_path, good_record)
    status, out = gate_run(tmp_path, capsys)
    assert status == 1
    assert "examples/plot_99_fake.py declares run 'broken' but the record has no such run" in out
    assert "claim 'pitfall' (diverge of broken, auto) is declared" in out


def test_extra_claim_and_extra_run(tmp_path, good_record, capsys):
    good_record["claims"].append({"kind": "expect", "runs": ["auto"], "key": "x", "expected": 1, "title": "mine"})
    good_record["runs"].append(dict(good_record["runs"][0], id="bonus"))
    write(tmp_path, good_record)
    status, out = gate_run(tmp_path, capsys)
    assert status == 1
    assert "the record holds a claim examples/plot_99_fake.py does not declare" in out
    assert "the record holds run(s) ['bonus'] that examples/plot_99_fake.py does not declare" in out


def test_changed_run_spec(tmp_path, good_record, capsys):
    good_record["runs"][2]["precision"] = "32-true"  # a bf16 comparison quietly made in fp32
    write(tmp_path, good_record)
    status, out = gate_run(tmp_path, capsys)
    assert status == 1
    assert "run 'bf16': precision is '32-true' in the record, 'bf16-mixed' in examples/plot_99_fake.py" in out


def test_record_of_an_example_that_no_longer_exists(tmp_path, good_record, fake_examples, capsys):
    write(tmp_path, good_record)
    (fake_examples / "plot_99_fake.py").unlink()
    status, out = gate_run(tmp_path, capsys)
    assert status == 1
    assert "the record is of example 'plot_99_fake', which no longer exists; delete the record" in out


def test_build_record_of_an_edited_example_is_stale_and_fails(tmp_path, good_record, fake_examples, capsys):
    write(tmp_path, good_record)
    (fake_examples / "plot_99_fake.py").write_text(FAKE_EXAMPLE + "LATER_EDIT = 1  # a later edit of the code\n")
    status, out = gate_run(tmp_path, capsys)
    assert status == 1
    assert "the code of examples/plot_99_fake.py changed since the record was made" in out
    assert "rerun the example" in out


def test_stale_reference_is_labelled_and_still_judged(tmp_path, good_record, fake_examples, capsys):
    ref = tmp_path / "reference" / "nvidia-h200"
    good_record["env"].update(accelerator="cuda", device="NVIDIA H200", cuda="13.0")
    good_record["source"]["commit"] = "4008df8" + "0" * 33
    good_record["claims"] = good_record["claims"][:3]  # made before the expect claim existed ...
    reseal(good_record)  # ... so it was written with the digest of these three claims
    write(ref, good_record)
    (fake_examples / "plot_99_fake.py").write_text(FAKE_EXAMPLE + "LATER_EDIT = 1  # a later edit of the code\n")
    status, out = gate_run(tmp_path, capsys, "--reference", tmp_path / "reference")
    assert status == 0, out
    assert "stale reference" in out and "changed since the record was made at commit 4008df8" in out
    assert "1 not judged" in out and "not judged" in out
    good_record["runs"][1]["loss"] = curve(scale=3.0)  # a stale reference is still judged where it can be
    write(ref, good_record)
    status, out = gate_run(tmp_path, capsys, "--reference", tmp_path / "reference")
    assert status == 1 and "match(manual, auto) FAILED [port]" in out


def test_current_reference_must_match_exactly(tmp_path, good_record, capsys):
    ref = tmp_path / "reference" / "nvidia-h200"
    good_record["claims"][0]["tolerance"] = "mixed-vs-fp32"
    write(ref, good_record)
    status, out = gate_run(tmp_path, capsys, "--reference", tmp_path / "reference")
    assert status == 1 and "was altered" in out


def test_messages_count_steps_from_the_start_and_name_nan_and_short_curves(tmp_path, good_record, capsys):
    loss = good_record["runs"][1]["loss"]
    loss[100] = loss[100] * 4  # a late spike: the message names step 100, not "step 86 after warm-up"
    write(tmp_path, good_record)
    status, out = gate_run(tmp_path, capsys)
    assert status == 1 and "at step 100 (counted from the start of the run" in out
    good_record["runs"][3]["loss"][50] = float("nan")
    write(tmp_path, good_record)
    status, out = gate_run(tmp_path, capsys)
    assert "run broken has a loss of nan at step 50" in out and "no longer reproduces" not in out
    good_record["runs"][3]["loss"] = good_record["runs"][3]["loss"][:90]
    good_record["runs"][3]["steps"] = 90
    write(tmp_path, good_record)
    status, out = gate_run(tmp_path, capsys)
    assert "run broken is too short: 90 steps recorded, run auto has 140" in out


def test_help_lists_exit_codes(capsys):
    with pytest.raises(SystemExit):
        gate.main(["--help"])
    out = capsys.readouterr().out
    for line in ("0  every judged claim passed", "1  a claim failed", "2  a record is missing"):
        assert line in out


def test_no_arguments_judges_the_last_build_and_the_references(tmp_path, good_record, monkeypatch, capsys):
    build, refs = tmp_path / "_build" / "results", tmp_path / "reference"
    monkeypatch.setattr(gate, "DEFAULT_BUILD_RESULTS", build)
    monkeypatch.setenv(records.REFERENCE_ENV, str(refs))
    write(build, good_record)
    bad = json.loads(json.dumps(good_record))
    bad["runs"][1]["loss"] = curve(scale=3.0)
    write(refs / "gpu", bad)
    assert gate.main([]) == 1
    assert str(refs / "gpu" / "plot_99_fake.json") in capsys.readouterr().err


def test_verdict_values_for_every_kind(good_record):
    from mpguide.verify import claims
    from mpguide.verify.show import report

    decl = declarations.read(declarations.example_file("plot_99_fake"))
    rows = report.verdict_rows(claims.evaluate_record(good_record, "", decl))
    assert [r["value"] for r in rows][-1] == "stalled = True"
    assert all(r["value"] not in ("-", "", "1", "n/a") for r in rows), rows


def test_no_arguments_fails_when_an_example_left_no_record(tmp_path, good_record, fake_examples, monkeypatch, capsys):
    build = tmp_path / "_build" / "results"
    monkeypatch.setattr(gate, "DEFAULT_BUILD_RESULTS", build)
    monkeypatch.setenv(records.REFERENCE_ENV, str(tmp_path / "no-references"))
    write(build, good_record)
    assert gate.main([]) == 0
    (fake_examples / "plot_98_second.py").write_text(FAKE_EXAMPLE)  # an example whose record is missing
    assert gate.main([]) == 2
    assert "plot_98_second.json: results record not found" in capsys.readouterr().err


def test_without_any_examples_folder_the_records_own_claims_are_judged_and_said_so(
    tmp_path, good_record, monkeypatch, capsys
):
    """A reader who downloaded one example has no examples/ folder: the gate judges, and says it compared nothing."""
    write(tmp_path, good_record)
    monkeypatch.setenv("MPGUIDE_EXAMPLES_DIR", str(tmp_path / "no-checkout"))
    status, out = gate_run(tmp_path, capsys)
    assert status == 0 and "not compared" in out and "1 not judged" in out
    good_record["runs"][1]["loss"] = curve(scale=3.0)  # the claims themselves are still judged
    write(tmp_path, good_record)
    status, out = gate_run(tmp_path, capsys)
    assert status == 1 and "match(manual, auto) FAILED [port]" in out


def test_a_build_record_without_code_digests_is_stale_and_fails(tmp_path, good_record, fake_examples, capsys):
    """A record made before code digests (byte digests only) is stale in a build: it fails and names the fix."""
    good_record["source"]["example_sha256"] = good_record["source"].pop("example_code")
    write(tmp_path, good_record)
    status, out = gate_run(tmp_path, capsys)
    assert status == 1
    assert "the record has no code digest of examples/plot_99_fake.py (source.example_code)" in out
    assert "rerun the example" in out


def test_a_docstring_or_comment_edit_keeps_a_build_record_current(tmp_path, good_record, fake_examples, capsys):
    write(tmp_path, good_record)
    source = (fake_examples / "plot_99_fake.py").read_text()
    (fake_examples / "plot_99_fake.py").write_text('"""An edited docstring."""\n# a comment\n' + source)
    status, out = gate_run(tmp_path, capsys)
    assert status == 0, out


def test_an_example_that_does_not_parse_fails_the_gate_without_a_traceback(
    tmp_path, good_record, fake_examples, capsys
):
    write(tmp_path, good_record)
    (fake_examples / "plot_99_fake.py").write_text("def broken(:\n")
    status, out = gate_run(tmp_path, capsys)
    assert status != 0 and "Traceback" not in out
    assert "plot_99_fake.py" in out
