"""The two reporters' training steps (examples 17 and 18): their measurements and claims can fail.

Each test trains one-epoch runs of an example's own recipes with a real Trainer (the example's code up
to its ``run_example`` call is executed, nothing is copied), then judges the example's own claim on
the right run and on a run of the wrong recipe, which must fail it.
"""

from __future__ import annotations

import pytest
from conftest import ROOT

from mpguide.precision import ManualMixedPrecision
from mpguide.verify import hardware
from mpguide.verify.claims import declarations, judging, verdicts
from mpguide.verify.run import runner

TINY = hardware.Preset("tiny", epochs=1, batch_size=64)
pytestmark = pytest.mark.slow


def example_namespace(example: str) -> dict:
    """The example's module namespace, executed up to (not including) its ``run_example`` call."""
    source = (ROOT / "examples" / f"{example}.py").read_text()
    namespace = {"__name__": f"test_{example}"}
    exec(compile(source[: source.index("record = runner.run_example(")], example, "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def two():
    return example_namespace("plot_18_issue_20116_alternating_optimizers")


@pytest.fixture(scope="module")
def one():
    return example_namespace("plot_17_issue_20970_bf16_drift")


def train(ns: dict, example: str, run_id: str, recipe: str | None = None) -> dict:
    """Train the declared run ``run_id`` for one epoch, optionally with another recipe of the example."""
    spec = next(s for s in declarations.from_tables(example, ns["RUNS"], ns["CLAIMS"]).runs if s.id == run_id)
    recipe = recipe or spec.recipe
    result = runner.train_run(
        spec,
        ns["recipes"][recipe],
        "cpu",
        TINY,
        ManualMixedPrecision if spec.plugin else None,
        probes=ns["probes"].get(recipe, ()),  # the example's own measuring callbacks for that recipe
    )
    return dict(result.__dict__)


def judge(ns: dict, example: str, title_part: str, runs: dict) -> verdicts.Verdict:
    """Judge the example's claim whose title contains ``title_part`` on ``runs`` (run id -> run)."""
    declaration = declarations.from_tables(example, ns["RUNS"], ns["CLAIMS"])
    (claim,) = [c for c in declaration.claims if title_part in (c.get("title") or "")]
    return judging.evaluate_claim(claim, runs, lambda **kw: verdicts.Verdict(example=example, **kw))


def test_20116_posted_step_keeps_one_micro_batch_and_the_fix_all_three(two):
    posted = train(two, "plot_18_issue_20116_alternating_optimizers", "rep-fp32")
    fixed = train(two, "plot_18_issue_20116_alternating_optimizers", "fixed-fp32")
    assert posted["error"] is None and fixed["error"] is None
    assert posted["extra"]["micro_batches_kept"] == [1]
    assert 3 in fixed["extra"]["micro_batches_kept"] and fixed["extra"]["all_micro_batches_kept"] is True
    assert posted["extra"]["all_micro_batches_kept"] is False
    claim = "the fix: each step holds every micro-batch of its window"
    assert judge(two, "plot_18_issue_20116_alternating_optimizers", claim, {"fixed-fp32": fixed}).passed
    # the posted step trained under the fix's run id: the claim must fail
    assert not judge(two, "plot_18_issue_20116_alternating_optimizers", claim, {"fixed-fp32": posted}).passed


def test_20116_assertion_needs_a_loss_that_misses_model_2(two):
    posted = train(two, "plot_18_issue_20116_alternating_optimizers", "rep-fp16")
    unreached = train(two, "plot_18_issue_20116_alternating_optimizers", "unreached-fp16")
    guarded = train(two, "plot_18_issue_20116_alternating_optimizers", "unreached-guard-fp16")
    claim = "reaches none of its parameters: 16-mixed raises"
    assert judge(two, "plot_18_issue_20116_alternating_optimizers", claim, {"unreached-fp16": unreached}).passed
    assert not judge(two, "plot_18_issue_20116_alternating_optimizers", claim, {"unreached-fp16": posted}).passed
    assert guarded["error"] is None and guarded["extra"]["generator_changed"] is False
    assert posted["error"] is None and posted["extra"]["generator_changed"] is True


def test_20116_fix_shows_the_skip_when_model_2_is_not_reached(two):
    unreached = train(two, "plot_18_issue_20116_alternating_optimizers", "fixed-unreached-fp16")
    reached = train(two, "plot_18_issue_20116_alternating_optimizers", "fixed-unreached-fp16", recipe="#20116 fixed")
    assert unreached["error"] is None and unreached["extra"]["generator_changed"] is False
    assert any("optimizer 1 skipped at batch 5: no gradients" in w for w in unreached["warnings"])
    assert reached["extra"]["generator_changed"] is True
    assert not any("skipped at batch" in w for w in reached["warnings"])
    ex, claim = "plot_18_issue_20116_alternating_optimizers", "model 2's loss missing it: the skip is visible"
    assert judge(two, ex, claim, {"fixed-unreached-fp16": unreached}).passed
    assert not judge(two, ex, claim, {"fixed-unreached-fp16": reached}).passed
    quiet = "the fix on #20116's own step: no skip"
    assert judge(two, ex, quiet, {"fixed-fp16": reached}).passed
    assert not judge(two, ex, quiet, {"fixed-fp16": unreached}).passed


def test_20116_fix_warns_instead_of_raising_when_model_2s_loss_is_detached(two):
    ex = "plot_18_issue_20116_alternating_optimizers"
    fixed = train(two, ex, "fixed-detached-fp16")
    posted = train(two, ex, "fixed-detached-fp16", recipe="#20116, model 2 loss detached, toggle_model")
    assert fixed["error"] is None and fixed["extra"]["generator_changed"] is False
    assert posted["error"]["type"] == "RuntimeError"  # the posted step with toggle_model stops in backward
    claim = "model 2's loss detached: no RuntimeError, the skip is visible"
    assert judge(two, ex, claim, {"fixed-detached-fp16": fixed}).passed
    assert not judge(two, ex, claim, {"fixed-detached-fp16": posted}).passed


def test_scale_change_inside_a_window_is_detected(two):
    overlap = train(two, "plot_18_issue_20116_alternating_optimizers", "overlap-fp16-growth")
    fixed = train(two, "plot_18_issue_20116_alternating_optimizers", "fixed-fp16-growth")
    assert overlap["extra"]["scale_changed_inside_a_window"] is True
    assert overlap["extra"]["windows_with_scale_change"] > 0
    assert fixed["extra"]["scale_changed_inside_a_window"] is False
    claim = "one optimizer per window: the scale never changes"
    assert judge(two, "plot_18_issue_20116_alternating_optimizers", claim, {"fixed-fp16-growth": fixed}).passed
    assert not judge(two, "plot_18_issue_20116_alternating_optimizers", claim, {"fixed-fp16-growth": overlap}).passed


def test_20970_elements_change_no_weight_and_the_same_claim_can_fail(one):
    posted = train(one, "plot_17_issue_20970_bf16_drift", "reporter-bf16")
    no_autocast = train(one, "plot_17_issue_20970_bf16_drift", "rep-noautocast-bf16")
    per_epoch = train(
        one, "plot_17_issue_20970_bf16_drift", "rep-noautocast-bf16", recipe="#20970, scheduler per epoch"
    )
    claim = "the own autocast changes no weight"
    assert judge(
        one, "plot_17_issue_20970_bf16_drift", claim, {"rep-noautocast-bf16": no_autocast, "reporter-bf16": posted}
    ).passed
    assert not judge(
        one, "plot_17_issue_20970_bf16_drift", claim, {"rep-noautocast-bf16": per_epoch, "reporter-bf16": posted}
    ).passed


def test_20970_the_measured_cause_moves_bf16_only_and_the_posted_step_is_bitwise_automatic(one):
    ex = "plot_17_issue_20970_bf16_drift"
    cached, plain = train(one, ex, "cache2-bf16"), train(one, ex, "plain2-bf16")
    cached32, plain32 = train(one, ex, "cache2-fp32"), train(one, ex, "plain2-fp32")
    drift = "two updates in a caching autocast: bf16-mixed drifts"
    assert judge(one, ex, drift, {"cache2-bf16": cached, "plain2-bf16": plain}).passed
    assert not judge(one, ex, drift, {"cache2-bf16": plain, "plain2-bf16": plain}).passed
    fp32 = "two updates in a caching autocast: fp32 unchanged"
    assert judge(one, ex, fp32, {"cache2-fp32": cached32, "plain2-fp32": plain32}).passed
    assert not judge(one, ex, fp32, {"cache2-fp32": cached, "plain2-fp32": plain32}).passed
    posted, automatic = train(one, ex, "reporter-bf16"), train(one, ex, "towers-auto-bf16")
    bitwise = "final weights bitwise"
    assert judge(one, ex, bitwise, {"reporter-bf16": posted, "towers-auto-bf16": automatic}).passed
    assert not judge(one, ex, bitwise, {"reporter-bf16": cached, "towers-auto-bf16": automatic}).passed
