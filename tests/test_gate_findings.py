"""The two claim kinds that judge PitfallChecks: ``flags`` and ``clean``, each proven to fail on bad input."""

from __future__ import annotations

import json

import pytest
from conftest import curve, make_record, run

from mpguide.verify import claims, gate, records
from mpguide.verify.claims import declarations

EXAMPLE = "plot_97_checks"
SOURCE = '''"""A fake example whose runs carry PitfallChecks: only its declaration tables matter."""
RUNS = [
    ("good", "good", "32-true"),
    ("buggy", "buggy", "16-mixed"),
]
CLAIMS = [
    ("clean", "good", "the correct run: no finding"),
    ("flags", "buggy", "clipping", "the buggy run: clipping"),
]
'''


def finding(section: str) -> dict:
    return {
        "section": section,
        "message": f"[{section}] seen. See x#{section}",
        "batch": 0,
        "epoch": 0,
        "optimizer": 0,
        "count": 3,
    }


@pytest.fixture
def example_dir(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.mktemp("examples")
    (folder / f"{EXAMPLE}.py").write_text(SOURCE)
    monkeypatch.setenv(declarations.EXAMPLES_ENV, str(folder))
    return folder


def record_with(example_dir, good: list[dict] | None, buggy: list[dict] | None) -> dict:
    runs = [run("good", curve()), run("buggy", curve(), "16-mixed")]
    for r, found in zip(runs, (good, buggy), strict=True):
        if found is not None:
            r["extra"] = {
                "pitfall_findings": found,
                "pitfall_notes": [],
                "pitfall_check_seconds": 0.01,
                "pitfall_step_seconds": 1.0,
            }
    declared = [dict(c) for c in declarations.read(example_dir / f"{EXAMPLE}.py").claims]
    return make_record(runs, declared, example=EXAMPLE)


def judge(tmp_path, record, capsys) -> tuple[int, str]:
    records.write_record(record, tmp_path / f"{EXAMPLE}.json")
    status = gate.main([str(tmp_path)])
    out = capsys.readouterr()
    return status, out.out + out.err


def test_passes_when_the_buggy_run_is_flagged_and_the_good_one_clean(tmp_path, example_dir, capsys):
    status, text = judge(tmp_path, record_with(example_dir, [], [finding("clipping")]), capsys)
    assert status == 0, text


def test_flags_fails_when_the_run_has_no_finding_of_that_section(tmp_path, example_dir, capsys):
    status, text = judge(tmp_path, record_with(example_dir, [], [finding("porting")]), capsys)
    assert status == 1
    assert "no 'clipping' finding; the check reported ['porting']" in text


def test_flags_fails_when_the_run_has_no_finding_at_all(tmp_path, example_dir, capsys):
    status, text = judge(tmp_path, record_with(example_dir, [], []), capsys)
    assert status == 1
    assert "no 'clipping' finding; the check reported nothing" in text


def test_clean_fails_when_the_run_has_a_finding(tmp_path, example_dir, capsys):
    status, text = judge(tmp_path, record_with(example_dir, [finding("accumulation")], [finding("clipping")]), capsys)
    assert status == 1
    assert "1 finding(s): accumulation" in text


def test_both_fail_when_the_check_was_not_attached(tmp_path, example_dir, capsys):
    status, text = judge(tmp_path, record_with(example_dir, None, None), capsys)
    assert status == 1
    assert text.count("has no extra.pitfall_findings: attach the check") == 2


def test_a_record_whose_claim_section_was_edited_fails(tmp_path, example_dir, capsys):
    record = record_with(example_dir, [], [finding("porting")])
    next(c for c in record["claims"] if c["kind"] == "flags")["section"] = "porting"  # loosened after the fact
    status, text = judge(tmp_path, record, capsys)
    assert status == 1
    assert "the record holds a claim" in text and "'section': 'porting'" in text


def test_a_record_whose_flags_claim_was_turned_into_clean_or_deleted_fails(tmp_path, example_dir, capsys):
    record = record_with(example_dir, [], [])
    flagged = next(c for c in record["claims"] if c["kind"] == "flags")
    flagged["kind"] = "clean"  # tampered: the run that must be flagged made to pass as clean
    del flagged["section"]
    status, text = judge(tmp_path, record, capsys)
    assert status == 1
    assert "claim 'the buggy run: clipping' (flags of buggy) is declared in" in text
    record = record_with(example_dir, [], [])
    record["claims"] = [c for c in record["claims"] if c["kind"] != "flags"]  # tampered: the claim deleted
    status, text = judge(tmp_path, record, capsys)
    assert status == 1
    assert "missing from the record" in text


def test_a_malformed_finding_is_one_schema_error(tmp_path, example_dir, capsys):
    record = record_with(example_dir, [], [finding("clipping")])
    del record["runs"][1]["extra"]["pitfall_findings"][0]["message"]
    (tmp_path / f"{EXAMPLE}.json").write_text(json.dumps(record))  # written by hand: write_record refuses it
    status = gate.main([str(tmp_path)])
    text = capsys.readouterr().err
    assert status == 2
    assert "runs[1] (buggy).extra.pitfall_findings[0].message" in text
    assert "Traceback" not in text


def test_a_flags_claim_with_an_unknown_section_is_refused_with_the_file(tmp_path):
    with pytest.raises(claims.ClaimSpecError, match="flags\\(\\) needs a section among"):
        claims.flags("buggy", "no-such-section")
    path = tmp_path / "plot_96_bad.py"
    path.write_text(SOURCE.replace('"clipping"', '"clip"'))
    with pytest.raises(declarations.DeclarationError, match="plot_96_bad.py: CLAIMS\\[1\\] \\(flags\\)"):
        declarations.read(path)
