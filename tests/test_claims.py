import math

import pytest
from conftest import curve, make_record, run

from mpguide.verify import claims
from mpguide.verify.claims import ClaimSpecError, evaluate_record, metrics, tolerances


def by_kind(verdicts, kind):
    return [v for v in verdicts if v.kind == kind]


def test_good_record_passes(good_record):
    verdicts = evaluate_record(good_record)
    assert [v.passed for v in verdicts] == [True] * len(verdicts)
    assert len(by_kind(verdicts, "finite")) == 4  # one implicit check per run


def test_diverged_curve_fails_match(good_record):
    good_record["runs"][1]["loss"] = [v * 1.2 for v in good_record["runs"][1]["loss"]]
    port = evaluate_record(good_record)[0]
    assert not port.passed
    assert port.value == pytest.approx(0.2, rel=1e-6)
    assert port.threshold == "<= 0.001" and "differ by up to 20.00%" in port.detail


def test_match_threshold_is_inclusive_and_tight():
    ref = curve()
    tol = tolerances.TOLERANCES["mixed-vs-fp32"].value
    just_in = make_record(
        [run("a", [v * (1 + 0.99 * tol) for v in ref]), run("b", ref)], [claims.match("a", "b", "mixed-vs-fp32")]
    )
    just_out = make_record(
        [run("a", [v * (1 + 1.01 * tol) for v in ref]), run("b", ref)], [claims.match("a", "b", "mixed-vs-fp32")]
    )
    assert evaluate_record(just_in)[0].passed
    assert not evaluate_record(just_out)[0].passed


def test_pitfall_that_no_longer_reproduces_fails(good_record):
    good_record["runs"][3]["loss"] = [v * 1.01 for v in good_record["runs"][0]["loss"]]
    pitfall = evaluate_record(good_record)[2]
    assert not pitfall.passed and "no longer reproduces" in pitfall.detail


def test_one_spike_does_not_make_a_pitfall():
    ref = curve()
    spiky = list(ref)
    spiky[40] = ref[40] * 2.5
    assert metrics.relative_gap(spiky, ref).max() > tolerances.TOLERANCES["pitfall-gap"].value
    rec = make_record([run("a", spiky), run("b", ref)], [claims.diverge("a", "b")])
    assert not evaluate_record(rec)[0].passed  # judged on the mean gap, not the max


def test_warmup_is_ignored():
    ref = curve()
    early = [v * 3 if i < 3 else v for i, v in enumerate(ref)]
    rec = make_record([run("a", early), run("b", ref)], [claims.match("a", "b", "mixed-vs-fp32")])
    # the EMA still carries the early difference for a while, so only the first steps are free
    assert metrics.warmup_steps(60) == 6
    assert (
        evaluate_record(rec)[0].value
        < evaluate_record(
            make_record(
                [run("a", [v * 3 if i < 10 else v for i, v in enumerate(ref)]), run("b", ref)],
                [claims.match("a", "b", "mixed-vs-fp32")],
            )
        )[0].value
    )


def test_nan_fails_finite_and_match(good_record):
    good_record["runs"][1]["loss"][30] = math.nan
    verdicts = evaluate_record(good_record)
    assert not verdicts[0].passed  # the match cannot pass with a NaN in the curve
    finite = [v for v in by_kind(verdicts, "finite") if v.runs == ["manual"]][0]
    assert not finite.passed and "the loss is nan at step 30" in finite.detail
    assert "run manual has a loss of nan at step 30" in verdicts[0].detail and verdicts[0].observed == "nan loss"


def test_inf_and_short_curves_fail_finite(good_record):
    good_record["runs"][0]["loss"][-1] = math.inf
    good_record["runs"][2]["steps"] = 100
    failed = [v.runs[0] for v in by_kind(evaluate_record(good_record), "finite") if not v.passed]
    assert failed == ["auto", "bf16"]


def test_missing_run_fails(good_record):
    good_record["runs"] = [r for r in good_record["runs"] if r["id"] != "manual"]
    port = evaluate_record(good_record)[0]
    assert not port.passed and "missing from the record" in port.detail


def test_unexpected_exception_fails(good_record):
    good_record["runs"][2]["error"] = {"type": "RuntimeError", "message": "boom", "traceback": ""}
    verdicts = evaluate_record(good_record)
    completes = by_kind(verdicts, "completes")
    assert len(completes) == 1 and not completes[0].passed and "RuntimeError: boom" in completes[0].detail
    assert not verdicts[1].passed  # and its match has no curve to compare


def test_raises_claim():
    err = {"type": "AssertionError", "message": "No inf checks were recorded for this optimizer.", "traceback": ""}
    rec = make_record(
        [run("fp16", curve()[:3], "16-mixed", error=err)],
        [claims.raises("fp16", "AssertionError", "No inf checks were recorded")],
    )
    verdicts = evaluate_record(rec)
    assert [v.passed for v in verdicts] == [True]  # expected error: no implicit checks on that run
    rec["runs"][0]["error"] = None
    assert not evaluate_record(rec)[0].passed  # the error is gone: the page would be outdated
    rec["runs"][0]["error"] = dict(err, type="RuntimeError")
    assert not evaluate_record(rec)[0].passed


def test_threshold_comes_from_library_not_record(good_record, monkeypatch):
    good_record["claims"][1]["threshold"] = "<= 1000"  # a stale or tampered number in the file
    strict = tolerances.Tolerance("mixed-vs-fp32", "max", 1e-6, "test")
    monkeypatch.setitem(tolerances.TOLERANCES, "mixed-vs-fp32", strict)
    assert not evaluate_record(good_record)[1].passed


def test_unknown_tolerance_or_kind_in_record_fails(good_record):
    good_record["claims"][0]["tolerance"] = "whatever"
    good_record["claims"].append({"kind": "resembles", "runs": ["auto"]})
    verdicts = evaluate_record(good_record)
    assert not verdicts[0].passed and "unknown tolerance" in verdicts[0].detail
    assert not verdicts[4].passed and "unknown claim kind" in verdicts[4].detail


def test_declaration_errors():
    with pytest.raises(ClaimSpecError, match="unknown tolerance"):
        claims.match("a", "b", "nearly")
    with pytest.raises(ClaimSpecError, match="cannot be used here"):
        claims.match("a", "b", "pitfall-gap")
    with pytest.raises(ClaimSpecError):
        claims.diverge("a", "b", "same-precision")
    with pytest.raises(ClaimSpecError):
        claims.raises("a", "", "x")


def test_message_names_everything(good_record):
    good_record["runs"][1]["loss"] = curve(scale=3)
    msg = evaluate_record(good_record, "/x/plot_99_fake.json")[0].message()
    for part in (
        "plot_99_fake",
        "match(manual, auto)",
        "FAILED",
        "max rel. diff",
        "<= 0.001",
        "/x/plot_99_fake.json",
        "CPU (2 cores)",
    ):
        assert part in msg


def test_smooth_and_gap_shapes():
    assert list(metrics.smooth([1.0, 0.0])) == [1.0, 0.9]
    with pytest.raises(ValueError, match="different lengths"):
        metrics.relative_gap([1.0] * 10, [1.0] * 11)
    with pytest.raises(ValueError, match="leave nothing"):
        metrics.relative_gap([1.0] * 3, [1.0] * 3)


def test_warns_and_no_warning():
    rec = make_record(
        [run("a", curve())],
        [
            claims.warns("a", "NoGradientStepWarning", "none of its parameters"),
            claims.no_warning("a", "lr_scheduler.step()"),
        ],
    )
    rec["runs"][0]["warnings"] = ["NoGradientStepWarning: SGD optimizer ... none of its parameters has a gradient"]
    assert [v.passed for v in evaluate_record(rec)[:2]] == [True, True]
    rec["runs"][0]["warnings"] = ["UserWarning: Detected call of `lr_scheduler.step()` before `optimizer.step()`"]
    first, second = evaluate_record(rec)[:2]
    assert not first.passed and first.detail == "no NoGradientStepWarning warning containing 'none of its parameters'"
    assert not second.passed and "lr_scheduler.step()" in second.detail
    rec["runs"][0]["warnings"] = ["UserWarning: none of its parameters"]  # right text, wrong class
    assert not evaluate_record(rec)[0].passed


def test_expect_and_same():
    rec = make_record(
        [run("a", curve()), run("b", curve())],
        [claims.expect("a", "generator_changed", False), claims.same("a", "b", "weights")],
    )
    rec["runs"][0]["extra"] = {"generator_changed": False, "weights": "abc"}
    rec["runs"][1]["extra"] = {"weights": "abc"}
    assert [v.passed for v in evaluate_record(rec)[:2]] == [True, True]
    rec["runs"][0]["extra"] = {"generator_changed": True, "weights": "abd"}
    assert [v.passed for v in evaluate_record(rec)[:2]] == [False, False]
    rec["runs"][0]["extra"] = {}
    verdicts = evaluate_record(rec)[:2]
    assert not any(v.passed for v in verdicts) and "did not record" in verdicts[0].detail


def test_ratio_with_numbers_predictions_and_skipped_steps():
    ref = run("fp32", curve(8))
    ref["extra"] = {"u": [0.3] * 4}
    cand = run("fp16", curve(8))
    cand["extra"] = {"u": [0.6, 0.3, 0.0, 0.15], "pred": [2.0, 1.0, 0.0, 0.5]}
    rec = make_record([cand, ref], [claims.ratio("fp16", "fp32", "u", "pred"), claims.ratio("fp16", "fp32", "u", 1.0)])
    predicted, one = evaluate_record(rec)[:2]
    assert predicted.passed and predicted.value < 1e-12
    assert not one.passed and one.value == pytest.approx(1.0)  # the skipped step (0 vs 1) is the worst
    cand["extra"]["u"][2] = 0.01  # a "skipped" step that moved
    assert not evaluate_record(rec)[0].passed
    cand["extra"]["pred"] = [1.0]  # wrong length
    assert "not recorded per step" in evaluate_record(rec)[0].detail
    del ref["extra"]["u"]
    assert "not recorded by fp32" in evaluate_record(rec)[1].detail


def test_tolerance_bound_is_rechecked_when_judging(good_record):
    good_record["claims"][0]["tolerance"] = "pitfall-gap"  # a min bound on a match claim
    good_record["claims"][2]["tolerance"] = "same-precision"  # a max bound on a diverge claim
    verdicts = evaluate_record(good_record)
    assert not verdicts[0].passed and "needs a 'max' one" in verdicts[0].detail
    assert not verdicts[2].passed and "needs a 'min' one" in verdicts[2].detail


def test_runs_shorter_than_the_preset_plans_fail(good_record):
    for entry in good_record["runs"]:
        entry["loss"], entry["steps"] = entry["loss"][:40], 40  # consistently truncated
    finite = by_kind(evaluate_record(good_record), "finite")
    assert finite and not any(v.passed for v in finite)
    assert "the run has 40 steps, but preset 'test' plans 140" in finite[0].detail
    good_record["preset"] = "gigantic"
    assert not any(v.passed for v in by_kind(evaluate_record(good_record), "finite"))


@pytest.mark.parametrize("lost, passes", [(853, True), (500, True), (499, False), (0, False)])
def test_share_of_lost_updates_must_reach_a_majority(lost, passes):
    # plot_16: rate_ratio on two counts, "updates_lost/updates_with_gradient" >= pitfall-majority (0.5)
    cand = run("bf16-true", curve(8), precision="bf16-true")
    cand["extra"] = {"updates_lost": lost, "updates_with_gradient": 1000}
    rec = make_record(
        [cand],
        [
            claims.rate_ratio(
                "bf16-true", "updates_lost/updates_with_gradient", "pitfall-majority", "most updates round away"
            )
        ],
    )
    verdict = evaluate_record(rec)[0]
    assert verdict.passed is passes
    assert verdict.value == pytest.approx(lost / 1000) and verdict.threshold == ">= 0.5"


@pytest.mark.parametrize("kept, passes", [(1000, True), (951, True), (949, False), (150, False)])
def test_share_of_kept_updates_must_be_nearly_all(kept, passes):
    # plot_16: "updates_kept/updates_with_gradient" within updates-kept (5 %) of 1
    cand = run("fp32", curve(8))
    cand["extra"] = {"updates_kept": kept, "updates_with_gradient": 1000}
    rec = make_record([cand], [claims.rate_ratio("fp32", "updates_kept/updates_with_gradient", "updates-kept")])
    assert evaluate_record(rec)[0].passed is passes


def test_share_without_any_gradient_is_not_measured():
    cand = run("fp32", curve(8))
    cand["extra"] = {"updates_kept": 0, "updates_with_gradient": 0}  # no step ever saw a gradient
    rec = make_record([cand], [claims.rate_ratio("fp32", "updates_kept/updates_with_gradient", "updates-kept")])
    verdict = evaluate_record(rec)[0]
    assert not verdict.passed and "positive number 'updates_with_gradient'" in verdict.detail


@pytest.mark.parametrize(
    "factor, passes", [(1 + 0.99e-3, True), (1 - 0.99e-3, True), (1 + 1.01e-3, False), (1 / 65536, False)]
)
def test_clipped_norm_fails_just_past_its_bound(factor, passes):
    # plot_19: ratio of the clip factor per batch (applied norm over fp32's clip of the true gradient) to fp32's
    cand, ref = run("fp16", curve(), precision="16-mixed"), run("fp32", curve())
    cand["extra"], ref["extra"] = {"clip_factor": [1.0, factor, 1.0]}, {"clip_factor": [1.0, 1.0, 1.0]}
    rec = make_record([cand, ref], [claims.ratio("fp16", "fp32", "clip_factor", 1.0, "clipped-norm")])
    assert evaluate_record(rec)[0].passed is passes


@pytest.mark.parametrize(
    "factor, expected, passes",
    [(1.0099, 1.0, True), (0.9901, 1.0, True), (1.0101, 1.0, False), (1024.0, 1.0, False), (1 / 1024, 1.0, False),
     (1024 * 1.0099, 1024.0, True), (1024 * 1.0101, 1024.0, False), (1.0, 1024.0, False)],
)  # fmt: skip
def test_update_vs_fp32_fails_just_past_its_bound(factor, expected, passes):
    # plot_20: the first update of a mixed-precision run over fp32's, against 1 or the loss scale (a recorded list)
    cand, ref = run("fp16", curve(), precision="16-mixed"), run("fp32", curve())
    cand["extra"], ref["extra"] = {"first_update": [0.5 * factor], "first_scale": [expected]}, {"first_update": [0.5]}
    want = 1.0 if expected == 1.0 else "first_scale"
    rec = make_record([cand, ref], [claims.ratio("fp16", "fp32", "first_update", want, "update-vs-fp32")])
    assert evaluate_record(rec)[0].passed is passes


@pytest.mark.parametrize("far, passes", [(5.01e-2, True), (4.99e-2, False), (1e-3, False)])
def test_closer_weights_fails_just_past_its_bound(far, passes):
    # plot_20: the second backward's distance to the wrong weights' gradient over that to the right ones', >= 5
    cand = run("bf16", curve(), precision="bf16-mixed")
    cand["extra"] = {"second_vs_after_step": far, "second_vs_before_step": 1e-2}
    rec = make_record(
        [cand], [claims.rate_ratio("bf16", "second_vs_after_step/second_vs_before_step", "closer-weights")]
    )
    verdict = evaluate_record(rec)[0]
    assert verdict.passed is passes


def test_limit_train_batches_plans_fewer_batches(good_record):
    for entry in good_record["runs"]:
        entry["loss"], entry["steps"], entry["trainer_kwargs"] = entry["loss"][:15], 15, {"limit_train_batches": 3}
    assert claims.planned_steps("test", {"limit_train_batches": 3}) == 15  # 5 epochs x 3 batches
    assert claims.planned_steps("test", {"limit_train_batches": 99}) == 140  # capped by the 28 batches of an epoch
    assert all(v.passed for v in by_kind(evaluate_record(good_record), "finite"))
    good_record["runs"][0]["trainer_kwargs"] = {"limit_train_batches": 4}  # 20 planned, 15 recorded
    failed = [v for v in by_kind(evaluate_record(good_record), "finite") if not v.passed]
    assert [v.runs for v in failed] == [["auto"]] and "preset 'test' plans 20" in failed[0].detail


@pytest.mark.parametrize("reached, passes", [(32, True), (30, True), (29, False), (None, False)])
def test_a_run_may_stop_early_only_where_max_steps_stopped_it(good_record, reached, passes):
    entry = good_record["runs"][0]
    entry["loss"], entry["trainer_kwargs"] = entry["loss"][:4], {"max_steps": 30}
    if reached is not None:
        entry["extra"]["global_step"] = reached
    finite = [v for v in by_kind(evaluate_record(good_record), "finite") if v.runs == ["auto"]][0]
    assert finite.passed is passes
    if not passes:
        assert "run too short: 4 losses recorded for 140 steps" in finite.detail
