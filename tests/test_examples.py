"""Every gallery example ran in the strict build and its record passes the gate; swapped recipes fail it.

The per-example tests judge the shared build (``MPGUIDE_BUILT_SITE``, else the tests' own build at the test preset):
each example runs once per CI run, in that build. The script path, ``python examples/plot_NN.py`` with its printed
table line, its relative "results saved to" line and its figures next to the record, is tested by
``tests/test_reader_download.py`` on a downloaded example; the swap tests below run swapped examples as scripts.
"""

import html
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

from mpguide.verify import claims, gate, records

EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("plot_*.py"))
pytestmark = pytest.mark.slow


def run_example(name, tmp_path, **env):
    full_env = dict(
        os.environ,
        MPGUIDE_PRESET="test",
        MPGUIDE_DEVICE="cpu",
        MPGUIDE_RESULTS_DIR=str(tmp_path),
        MPLBACKEND="Agg",
        **env,
    )
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        env=full_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )


def table_counts(text: str) -> tuple[int, int, int]:
    """(held, shown, inconclusive) of the verdict table's count line (``report.count_line``) in ``text``."""
    counts = re.search(r"\b(\d+) of (\d+) checks in the table hold(?:, (\d+) inconclusive)?", text)
    assert counts, f"no verdict table count line in: {text[-2000:]}"
    held, shown, undecided = (int(n or 0) for n in counts.groups())
    return held, shown, undecided


def test_table_counts_fail_on_a_failed_check():
    """The count check below fails on a table with a failed row, and on a page without a table."""
    held, shown, undecided = table_counts("plot_99 on CPU: 5 of 6 checks in the table hold, 0 inconclusive")
    assert held + undecided != shown
    with pytest.raises(AssertionError, match="no verdict table count line"):
        table_counts("<p>no table</p>")


@pytest.mark.build
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_ran_in_the_build_and_its_claims_hold(name, built_site):
    out, build = built_site
    stem = name[:-3]
    record = records.load_record(out / "results" / f"{stem}.json")
    assert record["source"]["run_env"]["MPGUIDE_PRESET"] == build.run_env["MPGUIDE_PRESET"]
    assert record["source"]["run_env"]["MPGUIDE_DEVICE"] == build.run_env["MPGUIDE_DEVICE"]
    assert record["source"]["run_env"]["swaps"] == {}, "the shared build trains the declared recipes"
    # every run trains its planned batches, or stops where its declared max_steps stopped it, or raised
    assert all(
        r["loss"] and (len(r["loss"]) == r["steps"] or claims.stopped_by_max_steps(r)) or r["error"]
        for r in record["runs"]
    )
    assert list((out / "results").glob(f"{stem}_*.png")), "the example saves its figures next to its record"
    # the verdict table the example ends with, on its page: every check it shows holds, or is a throughput claim a
    # busy machine left inconclusive (the gate's rule: inconclusive is not a failure; gate.check below fails on one)
    page = html.unescape((out / "html" / "auto_examples" / f"{stem}.html").read_text())
    assert 'class="mpguide-verdicts"' in page, f"{stem}: the page shows no verdict table"
    held, shown, undecided = table_counts(page)
    assert held + undecided == shown, page[-2000:]
    gate.check([out / "results" / f"{stem}.json"])


@pytest.mark.build
def test_swapping_in_a_broken_recipe_fails_the_gate(swapped_build):
    out, _ = swapped_build
    page = html.unescape((out / "html" / "auto_examples" / "plot_01_porting_to_manual.html").read_text())
    assert "trains run 'manual-bf16' with recipe 'scheduler every batch'" in page
    report = gate.judge([out / "results" / "plot_01_porting_to_manual.json"])
    failed = {(v.kind, tuple(v.runs)) for v in report.failures}
    assert ("match", ("manual-bf16", "auto-bf16")) in failed  # the claim catches the divergence
    assert ("declaration", ("manual-bf16",)) in failed  # and the record says it trained another recipe


def test_unknown_recipe_in_swap_is_a_clear_error(tmp_path):
    proc = run_example(
        "plot_01_porting_to_manual.py", tmp_path, MPGUIDE_SWAP_RECIPE="plot_01_porting_to_manual:manual-bf16=nonsense"
    )
    assert proc.returncode != 0 and proc.stdout == "", "refused before the example trains or prints"
    assert (
        "MPGUIDE_SWAP_RECIPE names recipe(s) ['nonsense'] that plot_01_porting_to_manual does not have" in proc.stderr
    )
    assert not (tmp_path / "plot_01_porting_to_manual.json").exists()


def test_a_30_percent_slower_manual_loop_fails_the_parity_claims(tmp_path):
    """The throughput test hook really slows each timed manual step by 30 %: every CPU claim that compares
    manual with another variant must fail (decided, not inconclusive) within the benchmark's cap of rounds."""
    proc = run_example("plot_15_throughput.py", tmp_path, MPGUIDE_INJECT_SLOWDOWN="manual=0.3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TEST HOOK: injected slowdown {'manual': 0.3}" in proc.stdout
    report = gate.judge([tmp_path / "plot_15_throughput.json"])
    failed = sorted(v.title for v in report.failures if v.kind == "rate_ratio")
    assert failed == sorted(
        [
            "CPU fp32: manual as fast as automatic",
            "CPU bf16-mixed: manual as fast as automatic",
            "CPU 16-mixed: manual as fast as automatic",
            "CPU fp32: manual as fast as a plain loop",
            "CPU 16-mixed: manual as fast as a plain loop",
            # the check's claims divide the check's rate by the slowed manual one: 1.3, outside 0.85-1.15
            "CPU bf16-mixed: PitfallChecks costs no speed",
            "CPU 16-mixed: PitfallChecks costs no speed",
        ]
    ), report.summary()
    assert not report.inconclusive


def test_opt_step_outside_training_step_claims_fail_once_such_steps_count(tmp_path):
    # plot_05's hook-fp32 run trained as the training_step version (whose steps Lightning counts): the
    # claims about opt.step() in on_train_batch_end must fail, as they would if Lightning started to count them
    proc = run_example(
        "plot_05_skipped_steps.py",
        tmp_path,
        MPGUIDE_SWAP_RECIPE="plot_05_skipped_steps:hook-fp32=step in training_step",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = gate.judge([tmp_path / "plot_05_skipped_steps.json"])
    failed = {v.title for v in report.failures}
    assert "opt.step() in on_train_batch_end: global_step stays 0" in failed  # global_step reached max_steps=3
    assert "opt.step() in on_train_batch_end: max_steps=3 never stops it" in failed  # not recorded: a claim fails
    # it stopped after 3 batches, where its declared max_steps=3 stopped it: the implicit check accepts that
    # (mpguide.verify.claims.stopped_by_max_steps), so only the two claims above fail
    assert not any(v.kind == "finite" and v.runs == ["hook-fp32"] for v in report.failures)


def test_true_half_precision_claims_fail_when_the_errors_are_fixed(tmp_path):
    # plot_16's two erroring runs trained with their fixes: the claims that the errors (and the NaN right
    # after the first step) reproduce must fail, and the swap is reported
    proc = run_example(
        "plot_16_true_half_precision.py",
        tmp_path,
        MPGUIDE_SWAP_RECIPE=(
            "plot_16_true_half_precision:fp32-teacher=fp32 teacher from weights cast to fp32,"
            "plot_16_true_half_precision:adamw-16-true=AdamW with eps 1e-4"
        ),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = {v.title for v in gate.judge([tmp_path / "plot_16_true_half_precision.json"]).failures}
    assert {
        "fp32 teacher, bf16 weights: lerp_ refuses mixed dtypes",
        "16-true, AdamW eps=1e-8: NaN",
        "16-true, AdamW eps=1e-8: NaN weights after the first step",
    } <= failed


def test_the_old_clip_before_step_advice_fails_the_clip_claims(tmp_path):
    # plot_19's 16-mixed PPO run trained with the clip between manual_backward and opt.step(): the claims that
    # each optimizer's clip acts as in fp32 must fail (the clip cut the scaled gradients, 1/65536 of the limit)
    proc = run_example(
        "plot_19_several_steps_per_training_step.py",
        tmp_path,
        MPGUIDE_SWAP_RECIPE="plot_19_several_steps_per_training_step:ppo-fp16=clip before step",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = {v.title for v in gate.judge([tmp_path / "plot_19_several_steps_per_training_step.json"]).failures}
    assert {"16-mixed: the actor's clip acts as in fp32", "16-mixed: the critic's clip acts as in fp32"} <= failed


def test_plot_20_claims_fail_when_the_pitfalls_and_their_fixes_trade_places(tmp_path):
    # plot_20's pitfall runs trained with their fixes and its fix runs with the old code: every claim about an
    # update's factor, global_step, the second backward's weights, the fp32 error and PitfallChecks' verdict fails
    example = "plot_20_sam_retain_graph_and_surgery"
    swaps = {
        "sam-fp16": "SAM through opt.step()",
        "sam-wrapper-fp16": "SAM raw steps",
        "between-fp32": "forward again",
        "between-bf16": "forward again",
        "again-bf16": "step between backwards",
        "surgery-fp16": "scaled_grads into p.grad",
        "scaled-fp16": "autograd.grad into p.grad",
    }
    proc = run_example(
        f"{example}.py",
        tmp_path,
        MPGUIDE_SWAP_RECIPE=",".join(f"{example}:{run}={recipe}" for run, recipe in swaps.items()),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = {v.title for v in gate.judge([tmp_path / f"{example}.json"]).failures}
    assert {
        "SAM raw steps, 16-mixed: the update is the loss scale times fp32's",
        "SAM raw steps: global_step stays 0",
        "SAM through opt.step(), 16-mixed: fp32's update",
        "SAM through opt.step(): global_step counts every batch",
        "step between backwards, fp32: raises",
        "step between backwards, bf16-mixed: the second backward sees the weights before the step",
        "forward again, bf16-mixed: the second backward sees the stepped weights",
        "autograd.grad into p.grad, 16-mixed: 1/scale of fp32's update",
        "scaled_grads into p.grad, 16-mixed: fp32's update",
        "PitfallChecks flags sam-fp16: step-frequencies",
        "PitfallChecks: sam-wrapper-fp16 has no finding",
    } <= failed, sorted(failed)
