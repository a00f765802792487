"""Each section's rule of PitfallChecks on records built by hand, without a Trainer (issue 34, item 5).

A rule takes the fit's record (``mpguide.checks.record.FitRecord``) and what the moment adds, and returns what
it found; for every rule one case must give a finding and one (correct code, or a finding already made) must
not. The real runs of the same rules are ``test_checks.py``, ``test_checks_corpus.py`` and
``test_checks_generated.py``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from mpguide._sections import SECTIONS
from mpguide.checks import Finding, PitfallChecks, PitfallError, PitfallWarning, rules
from mpguide.checks.findings import Found
from mpguide.checks.record import FitRecord, ParamGrads, StepRecord


def record(**fields) -> FitRecord:
    """A 16-mixed fit of a two-optimizer module, in batch 3 of epoch 0, at loss scale 65536."""
    rec = FitRecord(
        precision="16-mixed",
        manual=True,
        module="Gan",
        optimizers=["SGD", "Adam"],
        sizes=[2, 2],
        scaled=True,
        scale=65536.0,
        batch=3,
        global_batch=3,
    )
    for name, value in fields.items():
        setattr(rec, name, value)
    return rec


def sections(found: list[Found]) -> list[str]:
    return [f.section for f in found if f.message and not f.note]


def test_every_section_has_one_rule():
    for section in SECTIONS:
        assert callable(getattr(rules, section.replace("-", "_"))), section


def test_no_gradient_step():
    rec = record(step=StepRecord(backwards=[1]), params={10: ParamGrads({1}, {65536.0})}, param_module={10: "gen"})
    (found,) = rules.no_gradient_step(rec, 1)
    assert found.subject == 1 and "optimizer 1 (Adam) stepped in batch 3 (epoch 0)" in found.message
    assert "reached only gen" in found.message
    assert rules.no_gradient_step(rec, 1, with_grad=2) == []
    (end,) = rules.no_gradient_step(rec, 1, at_end=True)
    assert "never stepped in 4 batch(es)" in end.message
    rec.reported[("no-gradient-step", 1)] = Finding("no-gradient-step", "x")
    assert rules.no_gradient_step(rec, 1) == [rules.again("no-gradient-step", 1)]  # counted, no new message


def test_clipping():
    rec = record()
    owners = ((0, False, True),)  # optimizer 0, unfused, not unscaled yet
    (found,) = rules.clipping(rec, "clip", name="clip_grad_norm_", owners=owners, norm=torch.tensor(6553.6), limit=1.0)
    assert "unscaled, the norm was 0.1" in found.message and "on_before_optimizer_step" in found.message
    assert rules.clipping(rec, "clip", name="clip_grad_norm_", owners=((0, False, False),), norm=None, limit=1.0) == []
    (fused,) = rules.clipping(rec, "clip", name="clip_grad_value_", owners=((1, True, False),), limit=0.5)
    assert "fused=False" in fused.message and fused.optimizer == 1
    assert rules.clipping(record(in_step_fn=1), "unscale", 0)[0].section == "clipping"
    assert rules.clipping(record(in_step_fn=1, in_lightning=1), "unscale", 0) == []


def test_scale_changes():
    rec = record(scale=32768.0)
    (found,) = rules.scale_changes(rec, 0, {65536.0, 32768.0})
    assert "produced at 65536" in found.message and "2x what it should be" in found.message
    assert rules.scale_changes(rec, 0, {32768.0}) == []
    assert rules.scale_changes(record(scale=32768.0, rescales_held=True), 0, {65536.0}) == []


def test_schedulers():
    candidates = {7: ("ExponentialLR", 0, 2, 0.1, 0.05)}
    (found,) = rules.schedulers(record(sched_candidates=candidates, scheduler_batches={7: {0, 1, 2}}))
    assert found.batch == 2 and "stepped in 3 batches of epoch 0" in found.message and "0.1 to 0.05" in found.message
    # once an epoch (at is_last_batch, or ReduceLROnPlateau after the batches): follows epochs, not updates
    assert rules.schedulers(record(sched_candidates=candidates, scheduler_batches={7: {3}})) == []


def test_nonfinite_guard():
    rec = record()
    (found,) = rules.nonfinite_guard(rec, 0, torch.tensor(False))
    assert "not finite were zeroed in batch 3" in found.message and "loss scale 65536" in found.message
    assert rules.nonfinite_guard(rec, 0, torch.tensor(True)) == []
    assert rules.nonfinite_guard(rec, 0, False, moved=True) == []  # changed in place after the zero: not a guard


def test_backward_flags():
    rec = record(in_step_fn=1, params={10: ParamGrads({5})}, param_module={10: "net"})
    (found,) = rules.backward_flags(rec, 5)
    assert "reached net" in found.message and "manual_backward" in found.message
    assert rules.backward_flags(rec, 6) == []  # a backward through another model (an inner loop's)
    assert rules.backward_flags(record(params={10: ParamGrads({5})}, param_module={10: "net"}), 5) == []


def test_fp16_parameters():
    assert sections(rules.fp16_parameters(record(), half=(("net.weight", torch.float16),))) == ["fp16-parameters"]
    assert rules.fp16_parameters(record(precision="32-true"), half=(("net.weight", torch.float16),)) == []
    true16 = record(precision="16-true", scaled=False)
    assert "eps=1e-08" in rules.fp16_parameters(true16, eps=((0, "Adam", 1e-8),))[0].message
    assert rules.fp16_parameters(true16, eps=((0, "Adam", 1e-4),)) == []
    assert "60 of 100 weight elements" in rules.fp16_parameters(true16, moved=100, lost=60)[0].message
    assert rules.fp16_parameters(true16, moved=100, lost=10) == []
    skipped = record(precision="16-true", step=StepRecord(skipped={0}))
    assert rules.fp16_parameters(skipped, moved=100, lost=60) == []  # a skipped step changes nothing, by design


def test_step_frequencies():
    (hook,) = rules.step_frequencies(record(), "hook", 0)
    assert "outside training_step" in hook.message
    assert rules.step_frequencies(record(in_step_fn=1), "hook", 0) == []
    (raw,) = rules.step_frequencies(record(in_step_fn=1), "raw", 1)
    assert "torch optimizer's own step()" in raw.message and "loss scale (65536" in raw.message
    (end,) = rules.step_frequencies(record(scaled=False), "end", 1, changed=3)
    assert "version counters moved by 3" in end.message and "loss scale" not in end.message
    assert rules.step_frequencies(record(), "end", 1, changed=0) == []


def test_porting():
    (found,) = rules.porting(record(), "start", hooks=(("optimizer_step", "Gan", False),))
    assert not found.note and "overrides optimizer_step()" in found.message
    (note,) = rules.porting(record(), "start", hooks=(("lr_scheduler_step", "Auto", True),))
    assert note.note and sections([note]) == []
    dead = record(dead_hooks=[("optimizer_step", "Auto")])
    (frozen,) = rules.porting(dead, "end", frozen=("ema.w", "ema.b"), outside=2)
    assert "none of the 2 parameter(s)" in frozen.message and not frozen.note
    assert rules.porting(dead, "end", frozen=("ema.w",), outside=2)[0].note  # the EMA moved: its work happened
    unstepped = ((0, "StepLR", 0, 0),)
    (sched,) = rules.porting(record(applied_steps={0: 3}), "schedulers", schedulers=unstepped)
    assert "scheduler 0 (StepLR) from configure_optimizers was never stepped" in sched.message
    assert rules.porting(record(), "schedulers", schedulers=unstepped) == []  # every step skipped: skip-aware
    assert rules.porting(record(applied_steps={0: 3}), "schedulers", schedulers=((0, "StepLR", 0, 5),)) == []


def test_accumulation():
    (lost,) = rules.accumulation(record(), 0, pending=(1, 2))
    assert "2 backward(s) of earlier batches in its window (from batch 1 on)" in lost.message
    (tail,) = rules.accumulation(record(epoch=1), 0, tail=((0, 7), (0, 8)))
    assert tail.subject == "epoch tail 0" and "2 backward(s) of epoch 0 (from its batch 7 on)" in tail.message
    assert rules.accumulation(record(), 0) == []


def test_autocast_cache():
    (own,) = rules.autocast_cache(record(), "forward", "Linear", own=True)
    assert "an own torch.autocast with its cache on" in own.message
    (plugin,) = rules.autocast_cache(record(), "forward", "Linear", own=False)
    assert "the precision plugin opens" in plugin.message
    (note,) = rules.autocast_cache(record(), "exit", dtype=torch.float16)
    assert note.note and "redundant" in note.message
    assert rules.autocast_cache(record(precision="32-true"), "exit", dtype=torch.float16) == []
    assert rules.autocast_cache(record(noted={torch.float16}), "exit", dtype=torch.float16) == []


def test_optimizer_math():
    (found,) = rules.optimizer_math(record(), 0, "cpu", torch.bfloat16, ("mm on torch.float32", "mm on torch.float32"))
    assert "calls mm on torch.float32 with gradient recording off" in found.message
    assert rules.optimizer_math(record(), 0, "cpu", torch.bfloat16, ()) == []


def test_gradient_penalty():
    (found,) = rules.gradient_penalty(record(), total=1000, zeros=80, under=50)
    assert not found.note and "50 (5.0%) are 0 as computed and non-zero" in found.message
    (note,) = rules.gradient_penalty(record(), total=1000, zeros=339, under=5)
    assert note.note and note.subject == "autograd.grad" and "not a finding" in note.message
    assert rules.gradient_penalty(record(), total=0, zeros=0, under=0) == []


def test_the_callback_files_each_finding_once_counts_it_and_raises_when_strict():
    checks = PitfallChecks()
    checks.recorder.rec.batch, checks.recorder.rec.optimizers = 3, ["SGD"]
    found = rules.accumulation(checks.recorder.rec, 0, pending=(1, 2))
    with pytest.warns(PitfallWarning, match=r"\[accumulation\] .* See the guide"):
        checks._emit(found)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checks._emit(found)  # the same section and subject: counted, not warned again
    assert [(f.section, f.batch, f.count) for f in checks.findings] == [("accumulation", 3, 2)]
    strict = PitfallChecks(strict=True)
    with pytest.raises(PitfallError) as err:
        strict._emit(found)
    assert err.value.section == "accumulation"


def test_an_own_autocast_of_another_dtype_than_lightnings_is_no_redundancy_note():
    """Under 16-mixed Lightning casts to float16: an own bfloat16 region changes the dtype (a reader's trial)."""
    assert rules.autocast_cache(record(precision="16-mixed"), "exit", dtype=torch.bfloat16) == []
    (note,) = rules.autocast_cache(record(precision="16-mixed"), "exit", dtype=torch.float16)
    assert note.note and "redundant" in note.message
