"""The version matrix: summaries from real gate verdicts, staleness, the table, the "applies to" sentence."""

import json

import pytest
from conftest import curve, make_record, run

from mpguide.verify import claims, records
from mpguide_build import matrix, matrix_outcomes, matrix_page, matrix_summarize, matrix_summary


@pytest.fixture(autouse=True)
def _fake_examples(fake_examples):
    """Every test here sees the fake example plot_99_fake (``MPGUIDE_EXAMPLES_DIR``), so its cells can be fresh."""
    return fake_examples


def fresh(out):
    """``out`` with every cell's keys made today's, under the column's versions (a cell as a rerun writes it)."""
    for name, entry in out["examples"].items():
        entry["keys"] = dict(
            matrix_summary.cell_keys(name),
            torch=out["torch"],
            lightning=out.get("lightning_version"),
            python=out["python"],
        )
    return out


def summary(version, verdicts, status="ran", examples_dir=None):
    """A summary of example plot_99_fake whose claims have the given verdicts ({claim id: verdict}), fresh."""
    out = matrix_summarize.new_summary(
        version, status, None if status == "ran" else {"stage": "install", "message": "boom"}
    )
    out["examples"]["plot_99_fake"] = {
        "keys": matrix_summary.cell_keys("plot_99_fake", examples_dir),
        "status": "ran",
        "error": None,
        "seconds": 1.0,
        "claims": [
            {
                "id": cid,
                "kind": "match",
                "runs": ["a", "b"],
                "title": f"title of {cid}",
                "verdict": v,
                "observed": "x",
                "message": f"message of {cid} on {version}",
            }
            for cid, v in verdicts.items()
        ],
    }
    return fresh(out)


def test_summarize_example_keeps_the_gates_verdicts(fake_examples, tmp_path):
    declared = [
        claims.match("manual", "auto", "same-precision", "port"),
        claims.match("bf16", "auto", "mixed-vs-fp32", "bf16"),
        claims.diverge("broken", "auto", "pitfall-gap", "pitfall"),
        claims.expect("broken", "stalled", True, "the broken recipe stalls"),
    ]
    rec = make_record(
        [
            run("auto", curve()),
            run("manual", curve(scale=1.5)),
            run("bf16", curve(), "bf16-mixed"),
            run("broken", curve(scale=3.0)),
        ],
        declared,
    )
    rec["runs"][3]["extra"]["stalled"] = True
    records.write_record(rec, tmp_path / "plot_99_fake.json")
    entry = matrix_summarize.summarize_example("plot_99_fake", tmp_path, "2.4.0", examples=fake_examples)
    verdicts = {c["id"]: c["verdict"] for c in entry["claims"]}
    assert verdicts == {
        "match(manual, auto)": "fail",
        "match(bf16, auto)": "pass",
        "diverge(broken, auto)": "pass",
        "expect(broken) [stalled]": "pass",
        matrix_summary.RUNS_ROW: "pass",
    }
    assert entry["runs"]["bf16"] == {"precision": "bf16-mixed", "plugin": None, "error": None}  # what outcome() reads
    port = next(c for c in entry["claims"] if c["id"] == "match(manual, auto)")
    assert "lightning-2.4.0/plot_99_fake.json" in port["message"] and str(tmp_path) not in port["message"]
    # the releases page shows each judged check in words, with its unit and bound, not the gate's message
    assert port["words"].startswith("DOES NOT HOLD; measured largest gap between smoothed loss curves: ")
    assert "allowed at most" in port["words"] and "threshold" not in port["words"]


def test_the_releases_page_shows_stored_words_and_falls_back_to_the_message(tmp_path):
    worded = summary("2.6.6", {"c": "pass"})
    worded["examples"]["plot_99_fake"]["claims"][0]["words"] = "holds; measured gap 0.00 %; allowed at most 0.10 %"
    matrix_summary.write_summary(worded, tmp_path)  # the summary schema accepts the field
    text = matrix_page.render_table(matrix_summary.load_matrix(tmp_path))
    assert "plot_99_fake, title of c: holds; measured gap 0.00 %; allowed at most 0.10 %" in text
    assert "message of c on 2.6.6" not in text
    assert "message of c on 2.6.6" in matrix_page.render_table([summary("2.6.6", {"c": "pass"})])  # older summaries


def test_missing_record_is_could_not_run(fake_examples, tmp_path):
    entry = matrix_summarize.summarize_example(
        "plot_99_fake", tmp_path, "2.2.5", "TypeError: boom", examples=fake_examples
    )
    assert entry["status"] == "could not run" and entry["error"] == "TypeError: boom" and entry["claims"] == []


def test_staleness_is_per_cell_and_keyed_on_code(fake_examples, monkeypatch):
    good = summary("2.6.6", {"c": "pass"}, examples_dir=fake_examples)
    assert matrix_summary.staleness(good, fake_examples) == []
    source = (fake_examples / "plot_99_fake.py").read_text()
    (fake_examples / "plot_99_fake.py").write_text('"""A new docstring."""\n' + source + "\n# a comment\n")
    assert matrix_summary.staleness(good, fake_examples) == []  # docstrings and comments are not code
    (fake_examples / "plot_99_fake.py").write_text(source + "\nEDIT = 1\n")
    assert matrix_summary.staleness(good, fake_examples) == [
        "Lightning 2.6.6: plot_99_fake: the code of examples/plot_99_fake.py changed since"
    ]
    (fake_examples / "plot_99_fake.py").write_text(source)
    (fake_examples / "plot_98_new.py").write_text("")
    good["examples"]["plot_97_gone"] = good["examples"]["plot_99_fake"]
    reasons = " | ".join(matrix_summary.staleness(good, fake_examples))
    assert "plot_98_new.py is not in the column yet" in reasons and "plot_97_gone.py no longer exists" in reasons
    del good["examples"]["plot_97_gone"]
    (fake_examples / "plot_98_new.py").unlink()
    monkeypatch.setattr(matrix_summary, "verdict_library_code", lambda: "another library")
    assert matrix_summary.staleness(good, fake_examples) == [
        "Lightning 2.6.6: plot_99_fake: the code of the mpguide library changed since"
    ]
    monkeypatch.undo()
    good["examples"]["plot_99_fake"]["keys"]["torch"] = "2.12.0+cpu"  # made under another torch than the column's
    assert "ran under torch 2.12.0+cpu" in matrix_summary.staleness(good, fake_examples)[0]
    good["examples"]["plot_99_fake"]["keys"] = dict(matrix_summary.cell_keys("plot_99_fake"), example_code=None)
    assert "not verified when the cell was migrated" in matrix_summary.staleness(good, fake_examples)[0]


ONLY = {"main": None, "torch_columns": ()}


def test_check_prints_stale_cells_and_exits_0(fake_examples, tmp_path, capsys):
    matrix_summary.write_summary(summary("2.6.6", {"c": "pass"}), tmp_path)
    assert matrix.check_command(tmp_path, releases=("2.6.6",), **ONLY) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "stale cells: 0 of 1"
    (fake_examples / "plot_99_fake.py").write_text((fake_examples / "plot_99_fake.py").read_text() + "EDIT = 1\n")
    assert matrix.check_command(tmp_path, releases=("2.6.6",), **ONLY) == 0  # stale is a finding, not a failure
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "stale: Lightning 2.6.6: plot_99_fake: the code of examples/plot_99_fake.py changed since",
        "stale cells: 1 of 1",
    ]
    assert matrix.check_command(tmp_path, max_stale=1, releases=("2.6.6",), **ONLY) == 0
    assert matrix.check_command(tmp_path, max_stale=0, releases=("2.6.6",), **ONLY) == 1  # --max-stale 0
    assert "more than --max-stale 0" in capsys.readouterr().out


def test_check_exits_1_on_a_missing_column(tmp_path, capsys):
    matrix_summary.write_summary(summary("2.6.6", {"c": "pass"}), tmp_path)
    assert matrix.check_command(tmp_path, releases=("2.4.0", "2.6.6"), **ONLY) == 1
    out = capsys.readouterr().out
    assert f"problem: {tmp_path / 'lightning-2.4.0.json'}: missing (field 'lightning' = '2.4.0'); write it" in out
    assert out.splitlines()[-1] == "stale cells: 0 of 1"
    assert matrix.check_command(tmp_path, releases=("2.6.6",), main="master", torch_columns=(("2.9.1", "2.6.6"),)) == 1
    out = capsys.readouterr().out
    assert "lightning-master.json: missing" in out and "torch-2.9.1+lightning-2.6.6.json: missing" in out


@pytest.mark.parametrize("text", ["{", '{"schema": "mpguide-matrix-1", "lightning": "2.6.6"}'])
def test_check_exits_1_on_an_unreadable_or_malformed_summary(tmp_path, capsys, text):
    (tmp_path / "lightning-2.6.6.json").write_text(text)
    assert matrix.check_command(tmp_path, releases=("2.6.6",), **ONLY) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"problem: {tmp_path / 'lightning-2.6.6.json'}: ") and "nox -s matrix" in out
    assert ": missing" not in out  # the file is there, only unreadable: one problem, named once


def test_check_exits_1_on_a_cell_without_keys(tmp_path, capsys):
    old = summary("2.6.6", {"c": "pass"})
    del old["examples"]["plot_99_fake"]["keys"]
    matrix_summary.write_summary(old, tmp_path)
    assert matrix.check_command(tmp_path, releases=("2.6.6",), **ONLY) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "stale: Lightning 2.6.6: plot_99_fake: the cell has no keys (made before cells recorded them)"
    assert "field 'examples.plot_99_fake.keys' missing" in out[1] and "migrate" in out[1] and "--stale-only" in out[1]
    assert out[-1] == "stale cells: 1 of 1"


def test_check_command_line(tmp_path, capsys):
    (tmp_path / "lightning-2.6.6.json").write_text("{")
    assert matrix.main(["check", "--dir", str(tmp_path), "--max-stale", "3"]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("stale cells: ")


def test_corrupt_or_foreign_summary_is_refused(tmp_path):
    (tmp_path / "lightning-2.4.0.json").write_text("{")
    with pytest.raises(matrix_summary.MatrixError, match=r"lightning-2\.4\.0\.json: not valid JSON"):
        matrix_summary.load_matrix(tmp_path)
    (tmp_path / "lightning-2.4.0.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(matrix_summary.MatrixError, match="not a matrix summary"):
        matrix_summary.load_matrix(tmp_path)
    with pytest.raises(matrix_summary.MatrixError, match="no matrix summaries"):
        matrix_summary.load_matrix(tmp_path / "empty")


def test_table_has_a_row_per_claim_a_column_per_release_and_linked_messages():
    sums = [
        summary("2.6.6", {"c1": "pass", "c2": "pass"}),
        summary("2.2.5", {"c1": "fail", "c2": "pass"}),
        summary("2.3.3", {}, status="could not run"),
    ]
    text = matrix_page.render_table(sums)
    header = next(line for line in text.splitlines() if line.startswith("| claim"))
    assert header.index("2.2.5") < header.index("2.3.3") < header.index("2.6.6")
    assert "**plot\\_99\\_fake**" in text or "**plot_99_fake**" in text  # one table per example, named
    row = next(line for line in text.splitlines() if "title of c1" in line)
    assert row.count("<a href=") == 3 and "<b>does not hold</b>" in row and "<b>cannot run</b>" in row
    anchor = row.split('href="#')[1].split('"')[0]
    assert f'<li id="{anchor}"><b>does not hold</b>: message of c1 on 2.2.5</li>' in text
    assert all(f"* **{o}**: " in text for o in matrix_outcomes.OUTCOMES)  # the legend explains every word
    assert "could not be installed: boom" in text


def test_applies_sentence_is_drawn_from_the_table():
    sums = [summary(v, {"c": w}) for v, w in (("2.2.5", "fail"), ("2.4.0", "pass"), ("2.6.6", "pass"))]
    assert (
        matrix_page.applies_sentence(sums, [("plot_99_fake", "c")])
        == "Holds on Lightning 2.4.0 and 2.6.6. Does not hold on 2.2.5: the behaviour differs there."
    )
    sums[0]["examples"]["plot_99_fake"]["claims"][0]["verdict"] = "pass"
    assert (
        matrix_page.applies_sentence(sums, [("plot_99_fake", "c")])
        == "Holds on Lightning 2.2.5, 2.4.0 and 2.6.6 (every release tested)."
    )
    sums[1]["examples"]["plot_99_fake"]["claims"][0]["verdict"] = "fail"
    assert matrix_page.applies_sentence(sums, [("plot_99_fake", "c")]).startswith(
        "Holds on Lightning 2.2.5 and 2.6.6. Does not hold on 2.4.0"
    )
    with pytest.raises(matrix_summary.MatrixError, match="no release of the matrix has claim"):
        matrix_page.applies_sentence(sums, [("plot_99_fake", "typo")])


def _failing(version, message, observed="x", runs=None, stored_runs=None, device="CPU (2 cores)"):
    """A summary of plot_99_fake whose claim "c" failed with ``message``; ``runs``: the summary's
    ``runs`` field (run id -> precision, plugin, error), as summaries store it."""
    out = summary(version, {"c": "fail", matrix_summary.RUNS_ROW: "fail" if stored_runs else "pass"})
    out["device"] = device
    entry = out["examples"]["plot_99_fake"]
    entry["claims"][0].update(message=message, observed=observed)
    entry["claims"][1].update(message=stored_runs or "all passed", kind="implicit", runs=["a", "b"])
    if runs is not None:
        entry["runs"] = runs
    return out


def _r(precision, error=None, plugin=None):
    return {"precision": precision, "plugin": plugin, "error": error}


@pytest.mark.parametrize(
    "case, expected",
    [
        # the example ran, both runs trained, the claim did not hold: a real difference
        (
            dict(
                version="2.5.4",
                message="expect(a) FAILED: stale_after_step = True",
                runs={"a": _r("bf16-mixed"), "b": _r("32-true")},
            ),
            matrix_outcomes.DOES_NOT_HOLD,
        ),
        # a run of the claim raised AttributeError: an API is missing on that release
        (
            dict(
                version="2.4.0",
                message="run a raised AttributeError, so there is no curve to compare",
                runs={
                    "a": _r("32-true", "AttributeError: 'DigitsGAN' object has no attribute 'toggled_optimizer'"),
                    "b": _r("32-true"),
                },
            ),
            matrix_outcomes.CANNOT_RUN,
        ),
        # the plugin's run raised UnsupportedVersionError
        (
            dict(
                version="2.5.5",
                message="run a raised UnsupportedVersionError, so there is no curve to compare",
                runs={
                    "a": _r(
                        "16-mixed",
                        "UnsupportedVersionError: ManualMixedPrecision was tested with Lightning 2.6.x",
                        "ManualMixedPrecision",
                    ),
                    "b": _r("32-true"),
                },
            ),
            matrix_outcomes.PLUGIN_REFUSES,
        ),
        # a raises claim whose run raised the refusal instead of the expected error
        (
            dict(
                version="2.5.5",
                message="raises(a) FAILED",
                observed="UnsupportedVersionError: ManualMixedPrecision was",
                runs={"a": _r("16-mixed"), "b": _r("32-true")},
            ),
            matrix_outcomes.PLUGIN_REFUSES,
        ),
        # 16-mixed on a CPU on 2.3: the GradScaler is disabled there
        (
            dict(
                version="2.3.3",
                message="raises(a) FAILED: got no exception",
                runs={"a": _r("16-mixed"), "b": _r("32-true")},
            ),
            matrix_outcomes.CPU_ARTIFACT,
        ),
        # the same failure of a 16-mixed run on 2.4.0 is a real difference (its CPU GradScaler works)
        (
            dict(
                version="2.4.0",
                message="raises(a) FAILED: got no exception",
                runs={"a": _r("16-mixed"), "b": _r("32-true")},
            ),
            matrix_outcomes.DOES_NOT_HOLD,
        ),
        # ... and on 2.3.3 on a GPU it is a real difference too
        (
            dict(
                version="2.3.3",
                message="raises(a) FAILED: got no exception",
                device="NVIDIA H200",
                runs={"a": _r("16-mixed"), "b": _r("32-true")},
            ),
            matrix_outcomes.DOES_NOT_HOLD,
        ),
        # a bf16-mixed claim failing on 2.3.3 on a CPU is no CPU artifact
        (
            dict(version="2.3.3", message="match(a, b) FAILED", runs={"a": _r("bf16-mixed"), "b": _r("32-true")}),
            matrix_outcomes.DOES_NOT_HOLD,
        ),
        # summaries written before runs were stored: the error is read from the implicit checks' message
        (
            dict(
                version="2.2.5",
                message="expect(a) FAILED: generator_changed = False",
                stored_runs="plot_99_fake: completes(a) FAILED [a trains to the end]: exception = AttributeError: "
                "'DigitsGAN' object has no attribute 'toggled_optimizer', threshold none. unexpected",
            ),
            matrix_outcomes.CANNOT_RUN,
        ),
    ],
)
def test_outcome_classes_from_stored_summaries(case, expected):
    s = _failing(**case)
    got, why = matrix_outcomes.outcome(s, "plot_99_fake", "c")
    assert got == expected, why
    if expected == matrix_outcomes.CANNOT_RUN:
        assert "`toggled_optimizer` is missing" in why
    assert matrix_outcomes.outcome(summary("2.6.6", {"c": "pass"}), "plot_99_fake", "c")[0] == matrix_outcomes.HOLDS


def test_applies_sentence_gives_each_outcome_its_words_and_never_says_not_affected():
    def cpu(v):
        return _failing(v, "raises(a) FAILED: got no exception", runs={"a": _r("16-mixed"), "b": _r("32-true")})

    api = _failing(
        "2.4.0",
        "run a raised AttributeError",
        runs={
            "a": _r("32-true", "AttributeError: 'M' object has no attribute 'toggled_optimizer'"),
            "b": _r("32-true"),
        },
    )
    refused = _failing(
        "2.5.5",
        "run a raised UnsupportedVersionError",
        runs={"a": _r("16-mixed", "UnsupportedVersionError: no", "ManualMixedPrecision"), "b": _r("32-true")},
    )
    differs = _failing("2.5.4", "expect(a) FAILED", runs={"a": _r("bf16-mixed"), "b": _r("32-true")})
    sums = [
        cpu("2.2.5"),
        cpu("2.3.3"),
        api,
        differs,
        refused,
        summary("2.6.6", {"c": "pass", matrix_summary.RUNS_ROW: "pass"}),
    ]
    text = matrix_page.applies_sentence(sums, [("plot_99_fake", "c")])
    assert text == (
        "Holds on Lightning 2.6.6. Does not hold on 2.5.4: the behaviour differs there. "
        "The example cannot run on 2.4.0 (`toggled_optimizer` is missing). "
        "ManualMixedPrecision refuses 2.5.5 (it supports Lightning 2.6.x). "
        "Untested on 2.2.5 and 2.3.3 (their CPU GradScaler is disabled)."
    )
    assert "not on" not in text and "(fail)" not in text
    table = matrix_page.render_table(sums)
    row = next(line for line in table.splitlines() if "title of c" in line and "title of c1" not in line)
    for word in ("CPU-only artifact", "cannot run", "does not hold", "plugin refuses", "holds"):
        assert word in row, (word, row)


def test_rate_ratio_claim_parity_and_speedup():
    def judge(extra, key, tolerance):
        rec = {
            "example": "x",
            "env": {},
            "preset": "test",
            "runs": [dict(run("r", curve()), extra=extra)],
            "claims": [claims.rate_ratio("r", key, tolerance, "t")],
        }
        return claims.evaluate_record(rec)[0]

    assert judge({"a": 100.0, "b": 98.0}, "a/b", "throughput-parity").passed
    slow = judge({"a": 50.0, "b": 100.0}, "a/b", "throughput-parity")
    assert not slow.passed and slow.value == pytest.approx(0.5) and "ratio 0.5000" in slow.detail
    assert judge({"a": 940.0, "b": 100.0}, "a/b", "bf16-speedup").passed
    assert not judge({"a": 110.0, "b": 100.0}, "a/b", "bf16-speedup").passed
    missing = judge({"a": 1.0}, "a/b", "throughput-parity")
    assert not missing.passed and "did not record a positive number 'b'" in missing.detail
    with pytest.raises(claims.ClaimSpecError, match="numerator/denominator"):
        claims.rate_ratio("r", "a", "throughput-parity")


def _judge_rates(extra, key="m/a", tolerance="throughput-parity-cpu"):
    rec = {
        "example": "x",
        "env": {},
        "preset": "test",
        "runs": [dict(run("r", curve()), extra=extra)],
        "claims": [claims.rate_ratio("r", key, tolerance, "t")],
    }
    return claims.evaluate_record(rec)[0]


def test_rate_ratio_pairs_per_round_rates():
    """Lists are paired by round. These are plot_15's bf16 windows from a build on a loaded machine: the
    medians of the two variants fell into different load regimes (ratio 0.769), each round's pair did not.
    Five rounds admit no 95 % interval of the median, so the claim is inconclusive there (never a pass); six
    are still inconclusive, because the interval (min to max at n = 6) holds the outlier round 0.746; nine
    rounds drop it (2nd smallest to 2nd largest) and pass."""
    manual = [264.1, 283.8, 284.9, 395.1, 384.9]
    automatic = [269.7, 282.6, 382.1, 370.7, 380.7]
    unpaired = _judge_rates({"m": 284.9, "a": 370.7})
    assert not unpaired.passed and unpaired.failed
    five = _judge_rates({"m": manual, "a": automatic})
    assert five.status == "inconclusive" and not five.passed and not five.failed
    assert "too few rounds" in five.shown_value() and "Per-round ratios 0.979, 1.004, 0.746" in five.detail
    six = _judge_rates({"m": manual + [380.0], "a": automatic + [383.0]})
    assert six.status == "inconclusive" and "97% interval 0.746-1.066" in six.shown_value()
    more_m, more_a = manual + [380.0, 390.0, 385.0, 379.0], automatic + [383.0, 388.0, 386.0, 381.0]
    paired = _judge_rates({"m": more_m, "a": more_a})
    ratios = sorted(m / a for m, a in zip(more_m, more_a, strict=True))
    assert paired.passed and paired.value == pytest.approx(ratios[4])  # the median of 9 ratios
    assert "median over 9 rounds" in paired.shown_value() and "interval 0.979-1.011" in paired.shown_value()
    slow = _judge_rates({"m": [r / 2 for r in more_m], "a": more_a})  # half as fast in every round
    assert slow.failed and slow.value == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"m": [1.0, 2.0], "a": [1.0]}, "recorded 2 rounds of 'm' but 1 of 'a'; a paired ratio needs the same rounds"),
        ({"m": [1.0, 2.0], "a": 1.0}, "did not record a non-empty list of positive numbers 'a'"),
        ({"m": [], "a": []}, "did not record a non-empty list of positive numbers 'm'"),
        ({"m": [1.0, float("nan")], "a": [1.0, 1.0]}, "did not record a non-empty list of positive numbers 'm'"),
        ({"m": [1.0, 1.0], "a": [1.0, 0.0]}, "did not record a non-empty list of positive numbers 'a'"),
    ],
)
def test_rate_ratio_refuses_lists_it_cannot_pair(extra, message):
    verdict = _judge_rates(extra)
    assert not verdict.passed and verdict.value is None and message in verdict.detail


def stale_cell_shown_as_verdict(text: str, stale: dict[str, str]) -> list[str]:
    """The stale cells (example -> column label) whose message in rendered text is not "not re-run since"."""
    bad = []
    for example, label in stale.items():
        prefix = matrix_page._anchor(label, example, "")
        items = [line for line in text.splitlines() if line.startswith(f'<li id="{prefix}-')]
        words = {line.split('">', 1)[1].split(":")[0].replace("<b>", "").replace("</b>", "") for line in items}
        if not items or words != {"not re-run"}:
            bad.append(f"{label}: {example}")
    return bad


def render_with_one_stale_cell(summaries, render):
    """Render ``summaries`` (the committed ones) after making one fresh cell stale: its example code key edited."""
    s = json.loads(json.dumps(summaries))
    column = next(c for c in s if c["status"] == "ran")
    name = next(iter(column["examples"]))
    keys = column["examples"][name].setdefault("keys", matrix_summary.cell_keys(name))
    keys.update(example_code="0" * 64, created="2026-12-01T00:00:00Z", commit="abcdef0123")
    return render(s), {name: matrix_summary.column_label(column)}, column, name


def test_no_rendered_page_shows_a_stale_cell_as_a_verdict(monkeypatch):
    """The releases table and the guide's status lines, from the committed summaries with one stale cell injected
    (replaces "the committed matrix is current": a stale cell shows no verdict and fails no test)."""
    monkeypatch.delenv("MPGUIDE_EXAMPLES_DIR")  # the real examples
    committed = matrix_summary.load_matrix()
    text, stale, column, name = render_with_one_stale_cell(committed, matrix_page.render_table)
    assert stale_cell_shown_as_verdict(text, stale) == []
    assert f"not re-run since 2026-12-01, commit abcdef0: the code of examples/{name}.py changed since" in text
    # every cell the committed matrix holds stale (by the rule) renders as "not re-run", none as a verdict
    every_stale = {}
    for s in committed:
        for example in matrix_summary.stale_cells(s):
            if example in s["examples"]:  # a new example not in the column yet has no row to show a verdict in
                every_stale.setdefault(example, matrix_summary.column_label(s))
    assert stale_cell_shown_as_verdict(matrix_page.render_table(committed), every_stale) == []
    # the guide's status lines: a section on a stale cell says "Not re-run on", never "Holds on" that release
    for cid in [c["id"] for c in column["examples"][name]["claims"]]:
        summaries = json.loads(json.dumps(committed))
        for s in summaries:
            if s["lightning"] == column["lightning"] and name in s["examples"]:
                s["examples"][name].setdefault("keys", matrix_summary.cell_keys(name))["example_code"] = "0" * 64
        sentence = matrix_page.applies_sentence(summaries, [(name, cid)])
        groups = matrix_page.release_outcomes(
            [s for s in summaries if not matrix_summary.is_unreleased(s)], [(name, cid)]
        )
        assert column["lightning"] in groups.get(matrix_outcomes.NOT_RERUN, []) or matrix_summary.is_unreleased(column)
        assert f"Holds on Lightning {column['lightning']}" not in sentence
        assert matrix_summary.is_unreleased(column) or "Not re-run on Lightning" in sentence
        break


def test_the_stale_cell_check_fails_when_a_stale_cell_is_rendered_as_a_verdict(monkeypatch):
    """The check above, shown to fail: a renderer that ignores staleness (the old one) shows the verdict."""
    monkeypatch.delenv("MPGUIDE_EXAMPLES_DIR")
    monkeypatch.setattr(matrix_outcomes, "cell_staleness", lambda *args, **kwargs: "")
    text, stale, _, _ = render_with_one_stale_cell(matrix_summary.load_matrix(), matrix_page.render_table)
    assert stale_cell_shown_as_verdict(text, stale) == list(f"{v}: {k}" for k, v in stale.items())


@pytest.mark.parametrize(
    "bodies, status",
    [
        (["pass"], "pass"),
        (["raise UnsupportedVersionError('found 2.2.5')", "raise UnsupportedVersionError('found 2.2.5')"], "refused"),
        (["raise UnsupportedVersionError('found 2.2.5')", "assert 1 == 2"], "fail"),  # a refusal hides nothing else
    ],
)
def test_plugin_tests_are_classified(tmp_path, bodies, status):
    """``refused`` only when every failing test is the plugin's version refusal."""
    import sys

    from mpguide_build import matrix

    (tmp_path / "tests").mkdir()
    lines = ["class UnsupportedVersionError(RuntimeError):", "    pass", ""]
    for i, body in enumerate(bodies):
        lines += [f"def test_{i}():", f"    {body}", ""]
    (tmp_path / matrix.PLUGIN_TESTS).write_text("\n".join(lines))
    outcome = matrix.run_plugin_tests(sys.executable, tmp_path)
    assert outcome["status"] == status, outcome


def test_a_partial_rerun_keeps_the_other_cells_with_their_own_keys(fake_examples, tmp_path):
    """``MPGUIDE_MATRIX_EXAMPLES`` / ``--stale-only`` rerun some examples; the others come from the previous
    summary, each keeping the keys it was made with, so a cell of an older library still reads stale."""
    (fake_examples / "plot_98_other.py").write_text("X = 1\n")
    old = summary("2.4.0", {"c": "pass"})
    old["examples"]["plot_98_other"] = json.loads(json.dumps(old["examples"]["plot_99_fake"]))
    old["examples"]["plot_98_other"]["keys"] = dict(
        matrix_summary.cell_keys("plot_98_other"), torch=old["torch"], library_code="an older library"
    )
    old["examples"]["plot_97_gone"] = json.loads(json.dumps(old["examples"]["plot_99_fake"]))
    old["plugin_tests"] = {"status": "pass", "passed": 15, "failed": 0, "message": "15 passed"}
    matrix_summary.write_summary(old, tmp_path)
    new = summary("2.4.0", {"c": "fail"})  # reran plot_99_fake only, without the plugin tests
    merged = matrix.merge_into_previous(new, tmp_path)
    assert merged["plugin_tests"]["passed"] == 15
    assert list(merged["examples"]) == ["plot_98_other", "plot_99_fake"]  # an example that no longer exists: dropped
    assert merged["examples"]["plot_98_other"]["keys"]["library_code"] == "an older library"
    assert matrix_summary.stale_cells(merged) == {"plot_98_other": "the code of the mpguide library changed since"}
    assert merged["examples"]["plot_99_fake"]["claims"][0]["verdict"] == "fail"
    new["source"] = {"kind": "git", "commit": "another", "date": "2026-07-21"}  # nothing from another commit
    assert list(matrix.merge_into_previous(new, tmp_path)["examples"]) == ["plot_99_fake"]


def test_stale_command_lists_a_columns_stale_examples(fake_examples, tmp_path, capsys):
    (fake_examples / "plot_98_other.py").write_text("X = 1\n")
    column = summary("2.4.0", {"c": "pass"})
    matrix_summary.write_summary(column, tmp_path)
    assert matrix.main(["stale", "--lightning", "2.4.0", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert out.out.split() == ["plot_98_other"] and "1 stale examples" in out.err  # an example alone: no plugin tests
    column["examples"]["plot_98_other"] = fresh(summary("2.4.0", {}))["examples"]["plot_99_fake"]
    column["examples"]["plot_98_other"]["keys"]["example_code"] = matrix_summary.cell_keys("plot_98_other")[
        "example_code"
    ]
    matrix_summary.write_summary(column, tmp_path)
    assert matrix.main(["stale", "--lightning", "2.4.0", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert out.out.split() == [] and "0 stale examples, nothing to run" in out.err
    assert matrix.main(["stale", "--lightning", "2.5.0", "--dir", str(tmp_path)]) == 0  # no summary yet: all
    assert capsys.readouterr().out.split() == ["plot_98_other", "plot_99_fake", "plugin-tests"]  # tests rerun too


# --------------------------------------------------- the unreleased branch column and the older-torch columns

GIT = {
    "kind": "git",
    "repository": "Lightning-AI/pytorch-lightning",
    "branch": "master",
    "commit": "7f0c3436cd3f6ad3753125672024fc415cbcb414",
    "date": "2026-07-20T13:18:29+01:00",
}


def branch_summary(verdicts, examples_dir=None):
    out = summary("master", verdicts, examples_dir=examples_dir)
    out.update(source=dict(GIT), lightning_version="2.6.2")
    return fresh(out)


def torch_summary(pin, verdicts, examples_dir=None, lost=None):
    out = summary("2.6.6", verdicts, examples_dir=examples_dir)
    out.update(torch_pin=pin, torch=f"{pin}+cu128", scope=["plot_99_fake"])
    if lost is not None:
        out["autocast_cache_probe"] = {"torch": out["torch"], "gradient_lost": lost, "detail": "d"}
    return fresh(out)


def test_the_unreleased_column_is_last_named_by_its_commit_and_kept_out_of_the_release_sentence(tmp_path):
    for s in (summary("2.5.5", {"c": "pass"}), summary("2.6.6", {"c": "pass"}), branch_summary({"c": "fail"})):
        matrix_summary.write_summary(s, tmp_path)
    assert (tmp_path / "lightning-master.json").exists()
    sums = matrix_summary.load_matrix(tmp_path)
    assert [matrix_summary.column_label(s) for s in sums] == ["2.5.5", "2.6.6", "master (unreleased)"]
    text = matrix_page.render_table(sums)
    header = next(line for line in text.splitlines() if line.startswith("| claim"))
    assert header.endswith("| master (unreleased) |")
    assert "**Lightning master (unreleased)** (commit 7f0c3436cd of 2026-07-20 on branch master" in text
    assert matrix_page.applies_sentence(sums, [("plot_99_fake", "c")]) == (
        "Holds on Lightning 2.5.5 and 2.6.6 (every release tested). On Lightning's unreleased master branch "
        "(commit 7f0c3436cd, 2026-07-20) it does not hold: the behaviour differs there."
    )
    because = "the cache is on there"  # a section's own reason replaces the generic one, in both sentences
    assert matrix_page.applies_sentence(sums, [("plot_99_fake", "c")], differs=because).endswith(
        "it does not hold: the cache is on there."
    )
    sums[0]["examples"]["plot_99_fake"]["claims"][0]["verdict"] = "fail"
    both = matrix_page.applies_sentence(sums, [("plot_99_fake", "c")], differs=because)
    assert "Does not hold on 2.5.5: the cache is on there." in both
    assert both.endswith("(commit 7f0c3436cd, 2026-07-20) it does not hold either, for the same reason."), both
    assert both.count(because) == 1, both  # the reason once, not again for the branch
    sums[0]["examples"]["plot_99_fake"]["claims"][0]["verdict"] = "pass"
    sums[-1]["examples"]["plot_99_fake"]["claims"][0]["verdict"] = "pass"  # same as the newest release: no clause
    assert (
        matrix_page.applies_sentence(sums, [("plot_99_fake", "c")])
        == "Holds on Lightning 2.5.5 and 2.6.6 (every release tested)."
    )
    assert matrix_page.passing_releases(sums, [("plot_99_fake", "c")]) == ["2.5.5", "2.6.6"]


@pytest.mark.parametrize(
    "source, message",
    [
        ({"kind": "git", "commit": "abc"}, "must name its git 'commit' and 'date'"),
        ({"kind": "svn"}, "field 'source' must be"),
    ],
)
def test_a_branch_column_without_commit_and_date_is_refused(tmp_path, source, message):
    bad = branch_summary({"c": "pass"})
    bad["source"] = source
    (tmp_path / "lightning-master.json").write_text(json.dumps(bad))
    with pytest.raises(matrix_summary.MatrixError, match=rf"lightning-master\.json: .*{message}"):
        matrix_summary.load_matrix(tmp_path)


def test_a_torch_column_expects_only_its_examples(fake_examples):
    pinned = torch_summary("2.9.1", {"c": "pass"}, examples_dir=fake_examples)
    (fake_examples / "plot_98_other.py").write_text("")  # out of its scope: not missing there
    assert matrix_summary.staleness(pinned, fake_examples) == []
    pinned["scope"].append("plot_98_other")  # in scope but absent from the summary: missing
    assert matrix_summary.staleness(pinned, fake_examples) == [
        "Lightning 2.6.6, torch 2.9.1: plot_98_other: examples/plot_98_other.py is not in the column yet"
    ]


def test_torch_columns_render_not_run_outside_their_scope_and_name_the_torch():
    site = summary("2.6.6", {"c": "pass"})
    site["examples"]["plot_98_other"] = site["examples"]["plot_99_fake"]
    old, new = torch_summary("2.9.1", {"c": "fail"}), torch_summary("2.10.0", {"c": "pass"})
    text = matrix_page.render_table([site, new, old])
    header = next(line for line in text.splitlines() if line.startswith("| claim"))
    assert header.index("2.6.6, torch 2.9.1") < header.index("2.6.6, torch 2.10.0") < header.rindex("| 2.6.6 |")
    other = text.split("**plot_98_other**")[1].split("**plot")[0]
    assert other.count(">not run<") == 2 and "not part of the column Lightning 2.6.6, torch 2.9.1" in text
    site["torch"] = "2.13.0+cpu"
    assert (
        matrix_page.torch_sentence([site, old, new], [("plot_99_fake", "c")])
        == "With Lightning 2.6.6 this holds on torch 2.10.0+cu128, 2.13.0+cpu; not on torch 2.9.1+cu128 (fail)."
    )
    with pytest.raises(matrix_summary.MatrixError, match="no column of the matrix has claim"):
        matrix_page.torch_sentence([old], [("plot_99_fake", "typo")])


def test_the_autocast_cache_probe_reports_a_lost_gradient():
    """On the installed torch (2.13) the gradient arrives; a forward that drops autograd history after a
    no_grad forward, as affected torch does, is reported as lost."""
    ok = matrix.probe_autocast_cache()
    assert ok["gradient_lost"] is False and "weight.grad present" in ok["detail"]
    import torch

    def stale(layer, x):  # what the bug does: the graded call reuses a cast made without history
        return torch.nn.functional.linear(x, layer.weight.detach(), layer.bias.detach())

    lost = matrix.probe_autocast_cache(stale)
    assert lost["gradient_lost"] is True and "without grad_fn" in lost["detail"]


def test_cache_bug_sentence_names_the_affected_torch_releases():
    sums = [
        torch_summary("2.9.1", {}, lost=True),
        torch_summary("2.10.0", {}, lost=False),
        dict(summary("2.6.6", {}), autocast_cache_probe={"torch": "2.13.0+cpu", "gradient_lost": False}),
    ]
    assert (
        matrix_page.cache_bug_sentence(sums)
        == "Measured: torch 2.9.1+cu128 loses the gradient; torch 2.10.0+cu128, 2.13.0+cpu do not."
    )
    with pytest.raises(matrix_summary.MatrixError, match="autocast_cache_probe"):
        matrix_page.cache_bug_sentence([summary("2.6.6", {})])


def test_a_torch_column_refuses_an_environment_with_another_torch(tmp_path):
    """The older-torch column checks the torch it imports before running anything."""
    import lightning
    import torch

    out = matrix.run_release(lightning.__version__, tmp_path, ["plot_99_fake"], torch_pin="2.10.0")
    assert out["status"] == "could not run" and out["error"]["stage"] == "import"
    assert out["error"]["message"] == f"this environment imports torch {torch.__version__}, not 2.10.0"
    assert (
        matrix_summary.load(tmp_path / f"torch-2.10.0+lightning-{lightning.__version__}.json")["error"] == out["error"]
    )
    assert matrix_outcomes.cell(out, "plot_99_fake", "c")[0] == "could not run"


@pytest.mark.parametrize(("version", "expected"), [("2.2.5", "CPU-only artifact"), ("2.4.0", "cannot run")])
def test_a_record_refused_for_a_nan_on_a_disabled_cpu_scaler_is_a_cpu_artifact(version, expected):
    """On 2.2/2.3 a CPU 16-mixed run trains without loss scaling and may measure NaN, which a record may not
    hold: that example 'could not run' because of the CPU, not because the release lacks something."""
    out = summary(version, {"c": "pass"})
    out["device"] = "CPU (2 cores)"
    out["examples"]["plot_99_fake"].update(
        status="could not run",
        claims=[],
        error="RecordError: /tmp/x/plot_99_fake.json: field 'runs[1] (fp16-stock).extra.factor[1]' should be a "
        "finite number (not NaN or Infinity), found number NaN; rerun python examples/plot_99_fake.py",
    )
    assert matrix_outcomes.outcome(out, "plot_99_fake", "c")[0] == expected
    if expected == "cannot run":  # the release was installed: the sentence does not say it was not
        sentence = matrix_page.applies_sentence([out, summary("2.6.6", {"c": "pass"})], [("plot_99_fake", "c")])
        assert "it stopped before its checks" in sentence and "could not be installed" not in sentence


# ------------------------------------------------------------------------- the workflow and the migration


def test_the_workflow_refreshes_stale_cells_of_every_column():
    """The matrix workflow: --stale-only on every job, one torch job per TORCH_COLUMNS pair, master pinned at the
    commit of the committed master summary (moving it reruns every cell of that column)."""
    import yaml

    workflow = yaml.safe_load((records.REPO_ROOT / ".github" / "workflows" / "matrix.yml").read_text())
    jobs = workflow["jobs"]
    pins = [(p["torch"], p["lightning"]) for p in jobs["torch-column"]["strategy"]["matrix"]["pin"]]
    assert pins == list(matrix_summary.TORCH_COLUMNS)
    for job in jobs.values():
        assert "--stale-only" in job["env"]["STALE_ONLY"] and any(
            "${{ env.STALE_ONLY }}" in step.get("run", "") for step in job["steps"]
        )
    master = json.loads(matrix_summary.summary_path(matrix_summary.MAIN_BRANCH).read_text())
    assert jobs["main-column"]["env"]["LIGHTNING_COMMIT"] == master["source"]["commit"]


def _git(root, *args):
    import subprocess

    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


def test_migration_writes_code_keys_only_where_the_old_byte_digests_match(tmp_path, capsys):
    """The one-off migration (python -m mpguide_build.matrix migrate): per cell, the code digests of the sources
    at the commit when the recorded byte digests are theirs; ``null`` (stale) otherwise, never today's digest."""
    import hashlib

    from mpguide_build import matrix_migrate

    repo = tmp_path / "repo"
    (repo / "mpguide" / "verify" / "show").mkdir(parents=True)
    (repo / "examples").mkdir()
    (repo / "mpguide" / "core.py").write_text('"""Old docstring."""\nX = 1\n')
    (repo / "mpguide" / "verify" / "show" / "plotting.py").write_text("DRAW = 1\n")
    (repo / "examples" / "plot_99_fake.py").write_text("A = 1\n")
    (repo / "examples" / "plot_98_other.py").write_text("B = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "old")
    commit = _git(repo, "rev-parse", "HEAD")
    sha = lambda data: hashlib.sha256(data).hexdigest()  # noqa: E731
    verdict_library = records.bytes_digest_of([("core.py", b'"""Old docstring."""\nX = 1\n')])  # no show/ module
    old = summary("2.6.6", {"c": "pass"})
    old["library_sha256"] = verdict_library
    for name, data in (("plot_99_fake", b"A = 1\n"), ("plot_98_other", b"B = 2\n")):  # plot_98: another version
        entry = json.loads(json.dumps(old["examples"]["plot_99_fake"]))
        entry.pop("keys", None)
        entry["example_sha256"] = sha(data)
        old["examples"][name] = entry
    matrix_dir = tmp_path / "matrix"
    matrix_summary.write_summary(old, matrix_dir)
    totals = matrix_migrate.migrate(commit, matrix_dir, None, root=repo)
    assert (totals["cells_migrated"], totals["cells_stale"]) == (1, 1)
    cells = json.loads((matrix_dir / "lightning-2.6.6.json").read_text())["examples"]
    assert cells["plot_99_fake"]["keys"]["example_code"] == records.code_digest("A = 1\n")
    assert cells["plot_99_fake"]["keys"]["library_code"] == records.codedigest.tree_code_digest(
        [("core.py", "X = 1\n")]  # the same code without its docstring
    )
    assert cells["plot_99_fake"]["keys"]["migrated_from"] == commit
    assert cells["plot_98_other"]["keys"]["example_code"] is None  # bytes of another version: left stale
    assert "not verified" in matrix_summary.cell_staleness(
        matrix_summary.load(matrix_dir / "lightning-2.6.6.json"), "plot_98_other"
    )
    # a column whose library bytes are not those of the commit keeps no library key: every cell stale
    old["library_sha256"] = "0" * 64
    matrix_summary.write_summary(old, matrix_dir)
    totals = matrix_migrate.migrate(commit, matrix_dir, None, root=repo)
    assert (totals["cells_migrated"], totals["cells_stale"]) == (0, 2)
    assert matrix.main(["migrate", "--from-commit", "no-such-commit", "--dir", str(matrix_dir)]) == 1
    assert capsys.readouterr().out.startswith("problem: git rev-parse")


def test_the_releases_page_warns_above_its_prose_when_cells_are_stale(fake_examples):
    column = summary("2.6.6", {"c": "pass"})
    assert matrix_page.stale_note([column]) == ""
    column["examples"]["plot_99_fake"]["keys"]["library_code"] = "an older library"
    note = matrix_page.stale_note([column, summary("2.5.5", {"c": "pass"})])
    assert note.startswith("**1 of 2 cells are not re-run since the code changed** (Lightning 2.6.6)")
