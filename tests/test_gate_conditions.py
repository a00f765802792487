"""Claims declared ``only_if`` a measured condition (mpguide.verify.claims.conditions): judged where the record's
``env`` meets it, "not applicable on this release" where it does not (never a pass, never a failure), "not judged"
where the record holds no measurement, and a malformed condition is a declaration error naming file, field, fix."""

from __future__ import annotations

import pytest
from conftest import curve, make_record, run

from mpguide.verify import claims, gate, records
from mpguide.verify.claims import conditions, declarations
from mpguide.verify.records import RecordError
from mpguide.verify.show import report
from mpguide_build import matrix_outcomes, matrix_page, matrix_summarize

#: A fake example whose pitfall check says opposite things per condition, as plot_08's clean/flags pair does.
EXAMPLE = '''"""A fake example: a claim per value of a measured condition."""
RUNS = [
    ("auto", "auto", "32-true"),
    ("cached", "cached", "bf16-mixed"),
]
CLAIMS = [
    ("match", "cached", "auto", "mixed-vs-fp32", "bf16 trains like fp32"),
    ("expect", "cached", "stale", False, "no stale cast", {"only_if": "lightning-autocast-no-cache"}),
    ("expect", "cached", "stale", True, "a stale cast", {"only_if": "lightning-autocast-caches"}),
]
'''


@pytest.fixture
def example(fake_examples):
    (fake_examples / "plot_98_cond.py").write_text(EXAMPLE)
    return fake_examples


def record_for(example_dir, caches, stale):
    declared = [dict(c) for c in declarations.read(example_dir / "plot_98_cond.py").claims]
    rec = make_record([run("auto", curve()), run("cached", curve(), "bf16-mixed")], declared, example="plot_98_cond")
    rec["runs"][1]["extra"]["stale"] = stale
    if caches is not None:
        rec["env"]["lightning_autocast_cache"] = caches
    return rec


def judged(tmp_path, rec):
    path = records.write_record(rec, tmp_path / "plot_98_cond.json")
    report_ = gate.judge([path])
    return report_, {v.title: v for v in report_.verdicts}


@pytest.mark.parametrize("caches", [True, False])
def test_the_claim_of_the_measured_condition_is_judged_the_other_is_not_applicable(example, tmp_path, caches):
    report_, verdicts = judged(tmp_path, record_for(example, caches, stale=caches))
    applies, other = ("a stale cast", "no stale cast") if caches else ("no stale cast", "a stale cast")
    assert verdicts[applies].status == "pass" and verdicts[applies].applicable
    off = verdicts[other]
    assert off.status == "not applicable" and not off.passed and not off.failed and off.judged
    assert f"env.lightning_autocast_cache = {caches}" in off.detail
    assert report_.ok, report_.failure_message()
    assert "1 not applicable on this release (only_if)" in report_.summary()
    assert "not applicable on this release" in off.message()


def test_an_applicable_claim_that_does_not_hold_fails_the_gate(example, tmp_path):
    """A caching release whose run read no stale cast: the flags-side claim is judged, and fails."""
    report_, verdicts = judged(tmp_path, record_for(example, caches=True, stale=False))
    assert verdicts["a stale cast"].failed and verdicts["no stale cast"].status == "not applicable"
    assert not report_.ok
    assert "expect(cached) FAILED [a stale cast]" in report_.failure_message()


def test_a_record_without_the_measurement_is_not_judged_on_conditional_claims(example, tmp_path):
    report_, verdicts = judged(tmp_path, record_for(example, caches=None, stale=True))
    for title in ("a stale cast", "no stale cast"):
        assert verdicts[title].status == "not judged" and not verdicts[title].failed
        assert "does not hold env.lightning_autocast_cache" in verdicts[title].detail
    assert verdicts["bf16 trains like fp32"].status == "pass"


def test_the_verdict_table_says_not_applicable_on_this_release(example):
    rec = record_for(example, caches=False, stale=False)
    rows = report.verdict_rows(claims.evaluate_record(rec))
    row = next(r for r in rows if r["check"] == "a stale cast")
    assert row["result"] == "not applicable on this release" and row["verdict"] == "not applicable"
    assert row["allowed"].startswith("only where Lightning's own autocast caches weight casts")
    assert "2 of 2 checks in the table hold, 1 not applicable on this release" in report.count_line(
        claims.evaluate_record(rec)
    )
    html = report.VerdictTable(rec)._repr_html_()
    assert "mpguide-fail" not in html


def test_the_record_stores_the_status_and_the_schema_types_the_fields(example, tmp_path):
    rec = record_for(example, caches=False, stale=False)
    for claim, verdict in zip(rec["claims"], claims.evaluate_record(rec)):
        claim["verdict"] = verdict.status
    records.write_record(rec, tmp_path / "plot_98_cond.json")  # valid: the status and the option are schema fields
    rec["env"]["lightning_autocast_cache"] = "no"
    with pytest.raises(RecordError, match=r"env\.lightning_autocast_cache"):
        records.validate_record(rec, "r.json")
    rec["env"]["lightning_autocast_cache"] = False
    rec["claims"][1]["only_if"] = "lightning-autocast-cached"
    with pytest.raises(RecordError, match=r"only_if"):
        records.validate_record(rec, "r.json")


@pytest.mark.parametrize("value", ["lightning-autocast-cached", True, ["lightning-autocast-caches"]])
def test_a_malformed_condition_is_a_declaration_error_naming_file_field_and_fix(fake_examples, value):
    bad = EXAMPLE.replace('{"only_if": "lightning-autocast-caches"}', f"{{'only_if': {value!r}}}")
    path = fake_examples / "plot_98_cond.py"
    path.write_text(bad)
    with pytest.raises(declarations.DeclarationError) as err:
        declarations.read(path)
    message = str(err.value)
    assert str(path) in message and "CLAIMS[2]" in message
    assert "field 'only_if'" in message and "names no measured condition" in message
    assert "fix: use one of ['lightning-autocast-caches', 'lightning-autocast-no-cache']" in message


def test_the_gate_fails_a_record_of_an_example_with_a_malformed_condition(example, tmp_path, capsys):
    rec = record_for(example, caches=True, stale=True)
    path = records.write_record(rec, tmp_path / "plot_98_cond.json")
    (example / "plot_98_cond.py").write_text(EXAMPLE.replace("lightning-autocast-no-cache", "no-cache"))
    status = gate.main([str(path)])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert status == 1
    assert "field 'only_if' is 'no-cache', which names no measured condition; fix: use one of" in out


def test_measure_reads_the_installed_lightnings_region():
    """The measurement enters the plugin's region: whatever the release, the value is what torch reports there."""
    import torch
    from lightning.pytorch.plugins.precision import MixedPrecision

    with MixedPrecision("bf16-mixed", "cpu").train_step_context():
        inside = torch.is_autocast_cache_enabled()
    assert conditions.measure() == {"lightning_autocast_cache": inside}
    assert records.environment("cpu")["lightning_autocast_cache"] is inside


def test_matrix_summaries_and_the_releases_page_show_not_applicable(example, tmp_path):
    rec = record_for(example, caches=False, stale=False)
    records.write_record(rec, tmp_path / "plot_98_cond.json")
    entry = matrix_summarize.summarize_example("plot_98_cond", tmp_path, "2.6.6", examples=example)
    verdicts = {c["id"]: c["verdict"] for c in entry["claims"]}
    assert verdicts["expect(cached) [stale]"] == "pass", verdicts
    assert verdicts["expect(cached) [stale] #2"] == "not applicable"
    summary = matrix_summarize.new_summary("2.6.6", "ran", None)
    summary["examples"]["plot_98_cond"] = entry
    assert matrix_outcomes.outcome(summary, "plot_98_cond", "expect(cached) [stale] #2", example)[0] == (
        "not applicable on this release"
    )
    assert "not applicable on this release" in matrix_outcomes.OUTCOMES
    # a section resting on both claims of the pair holds on this release: the other claim is not about it
    groups = matrix_page.release_outcomes(
        [summary], [("plot_98_cond", "expect(cached) [stale]"), ("plot_98_cond", "expect(cached) [stale] #2")]
    )
    assert groups == {"holds": ["2.6.6"]}
    only = matrix_page.release_outcomes([summary], [("plot_98_cond", "expect(cached) [stale] #2")])
    assert only == {"not applicable on this release": ["2.6.6"]}
