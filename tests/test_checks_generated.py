"""Generated manual training steps judged by an oracle that reads the program's parts, never the check (issue 34,
item 4; the style of tests/test_generated_programs.py).

A program is drawn from parts: the ``training_step`` signature (``batch`` / ``batch, batch_idx`` / ``*args``),
an accumulation window (1-3 micro-batches, with or without a step at the epoch's last batch), where ``zero_grad``
happens (after the step, or every batch), where clipping happens (none, ``on_before_optimizer_step``, or
``clip_grad_norm_`` before ``opt.step()``), the scheduler (none, per step through ``step_skip_aware``, per step
plainly, once an epoch at ``is_last_batch``), the precision (fp32, bf16-mixed, stock 16-mixed whose every step
overflows: init scale 2**40), and the number of batches per epoch (2-5, two epochs). The oracle derives the
sections from those parts (:func:`expected`); ``schedulers`` also from the count of batches a scheduler steps in,
``accumulation`` from which micro-batches a zero discards. Property: the check reports exactly those, with no
crash. Budget: ``MPGUIDE_CHECKS_PROGRAMS`` programs (default 150, the CI budget) from seed
``MPGUIDE_CHECKS_SEED`` (default 34); a long run: ``MPGUIDE_CHECKS_PROGRAMS=1000``.

The numeric pitfalls (an update off by the loss scale, stale casts) are confirmed by numbers, never by the check:
:func:`test_numeric_pitfalls_are_confirmed_by_an_fp32_run_and_found` runs each drawn program and the same program
in fp32 and compares the first update and a probe's output before and after the step
(``MPGUIDE_CHECKS_NUMERIC_PROGRAMS``, default 150 draws over its 96 distinct programs).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from conftest import quiet_trainer
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils.data import DataLoader, TensorDataset

from mpguide import steps
from mpguide.checks import PitfallChecks
from mpguide.verify.run.runner import quiet_lightning

quiet_lightning()
EXAMPLES = int(os.environ.get("MPGUIDE_CHECKS_PROGRAMS", "150"))
SEED = int(os.environ.get("MPGUIDE_CHECKS_SEED", "34"))
SECTION_COUNTS: dict[str, int] = {}


@dataclass(frozen=True)
class Step:
    signature: str  # "batch", "batch_idx", "args"
    window: int  # micro-batches per step
    last_batch_step: bool  # also step at the epoch's last batch
    zero: str  # "after_step", "every_batch"
    clip: str  # "none", "hook", "before_step"
    scheduler: str  # "none", "skip_aware", "per_step", "per_epoch"
    precision: str  # "32-true", "bf16-mixed", "16-overflow"
    batches: int  # per epoch


def programs() -> st.SearchStrategy[Step]:
    return st.builds(
        Step,
        signature=st.sampled_from(["batch", "batch_idx", "args"]),
        window=st.integers(1, 3),
        last_batch_step=st.booleans(),
        zero=st.sampled_from(["after_step", "every_batch"]),
        clip=st.sampled_from(["none", "hook", "before_step"]),
        scheduler=st.sampled_from(["none", "skip_aware", "per_step", "per_epoch"]),
        precision=st.sampled_from(["32-true", "bf16-mixed", "16-overflow"]),
        batches=st.integers(2, 5),
    )


def stepping_batches(p: Step) -> list[bool]:
    """Per batch of an epoch: does the program step there?"""
    return [(b + 1) % p.window == 0 or (p.last_batch_step and b == p.batches - 1) for b in range(p.batches)]


def expected(p: Step) -> set[str]:
    """The sections the program's parts make, derived from the parts alone (two epochs)."""
    out = set()
    stepping = stepping_batches(p)
    scaled = p.precision == "16-overflow"
    if not any(stepping):
        if scaled and p.zero == "every_batch":
            return {"nonfinite-guard"}  # inf gradients zeroed without a step: named instead of the idle optimizer
        return {"no-gradient-step"}  # never stepped, and its weights did not change
    held: set[int] = set()  # epochs whose backwards are not stepped on yet
    discarded = False  # micro-batches of earlier batches zeroed since the last step
    for epoch in range(2):
        for b in range(p.batches):
            if p.zero == "every_batch":
                if held and scaled:
                    # every gradient of an overflowing run is inf: zeroing unstepped ones is the check's
                    # nonfinite-guard (non-finite gradients zeroed without a step on them), not accumulation
                    out.add("nonfinite-guard")
                else:
                    discarded |= bool(held)
                held = set()
            held.add(epoch)
            if stepping[b]:
                if discarded or any(e < epoch for e in held):
                    out.add("accumulation")  # a window's micro-batches lost, or the epoch's tail carried over
                discarded, held = False, set()
    if p.clip == "before_step" and scaled:
        out.add("clipping")  # clipped while still multiplied by the loss scale
    if p.scheduler == "per_step" and scaled and sum(stepping) >= 2:
        out.add("schedulers")  # stepped after skipped steps, in two or more batches of an epoch
    return out


class Generated(pl.LightningModule):
    def __init__(self, p: Step) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.p = p
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.01)
        if self.p.scheduler == "none":
            return opt
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)]

    def body(self, batch, batch_idx) -> None:
        p = self.p
        x, y = batch
        opt = self.optimizers()
        if p.zero == "every_batch":
            opt.zero_grad()
        self.manual_backward(F.mse_loss(self.net(x).float(), y) / p.window)
        last = batch_idx == p.batches - 1
        if (batch_idx + 1) % p.window == 0 or (p.last_batch_step and last):
            if p.clip == "before_step":
                torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
            if p.scheduler == "skip_aware":
                steps.step_skip_aware(opt, self.trainer, self.lr_schedulers())
            else:
                opt.step()
                if p.scheduler == "per_step":
                    self.lr_schedulers().step()
            if p.zero == "after_step":
                opt.zero_grad()
        if p.scheduler == "per_epoch" and self.trainer.is_last_batch:
            self.lr_schedulers().step()

    def on_before_optimizer_step(self, optimizer):
        if self.p.clip == "hook":
            torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)


def module_for(p: Step) -> Generated:
    """The program's class, with the drawn ``training_step`` signature."""
    if p.signature == "batch":

        class M(Generated):
            def training_step(self, batch):
                self.body(batch, self.trainer.fit_loop.epoch_loop.batch_idx)

    elif p.signature == "batch_idx":

        class M(Generated):
            def training_step(self, batch, batch_idx):
                self.body(batch, batch_idx)

    else:

        class M(Generated):
            def training_step(self, *args):
                self.body(args[0], args[1])

    return M(p)


def run(p: Step, checks: PitfallChecks) -> tuple[str | None, set[str]]:
    if p.precision == "16-overflow":
        plugins = [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=2.0**40))]
    elif p.precision == "bf16-mixed":
        plugins = [MixedPrecision("bf16-mixed", "cpu")]
    else:
        plugins = []
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4 * p.batches, 4, generator=g)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checks],
        plugins=plugins,
    )
    error = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.fit(module_for(p), DataLoader(TensorDataset(x, x[:, :1].sin()), batch_size=4))
        except Exception as err:  # noqa: BLE001 - a crash is a result
            error = f"{type(err).__name__}: {err}"
    return error, {f.section for f in checks.findings}


@seed(SEED)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(programs())
def test_generated_steps_get_exactly_the_oracles_sections(p):
    note(repr(p))
    error, found = run(p, PitfallChecks())
    want = expected(p)
    for section in want:
        SECTION_COUNTS[section] = SECTION_COUNTS.get(section, 0) + 1
    assert error is None
    assert found == want, (found, want)


def test_the_property_fails_with_one_rule_disabled(monkeypatch):
    """The schedulers rule turned off: a per-step scheduler on overflowing steps is then missed."""
    p = Step("batch_idx", 1, False, "after_step", "none", "per_step", "16-overflow", 3)
    assert expected(p) == {"schedulers"}
    assert run(p, PitfallChecks())[1] == {"schedulers"}
    monkeypatch.setattr(PitfallChecks, "_judge_schedulers", lambda self: None)
    assert run(p, PitfallChecks())[1] != expected(p)


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    print(f"\nprograms per expected section (seed {SEED}, {EXAMPLES} programs): {SECTION_COUNTS}")


# ---------------------------------------------------------------------------------------------------------------------
# Numeric pitfalls, confirmed by a run of the same program in fp32 (never by the check)
#
# The parts: the precision (fp32, bf16-mixed, 16-mixed with a finite init scale of 2**4 or 2**10, so no step
# overflows), how the step is taken (``opt.step()`` on Lightning's wrapper, or the torch optimizer's own
# ``opt.optimizer.step()``), an own ``torch.autocast`` around the forward, backward and step (none, caching,
# non-caching) and whether a forward through the stepped model follows the step inside it. From the parts:
# a raw step is ``step-frequencies``; a caching own region with a forward after the step is ``autocast-cache``.
# The numbers come from two runs of the program: the drawn one and the same program in fp32 (no own autocast,
# Lightning's 32-true, same seed, data and step kind). The update is off by the scale when the first update's
# norm is ``scale`` times the fp32 run's (within 5 %), and equal otherwise (within 5 %); a cast is stale when the
# probe's output after the step equals its output before it bitwise while the fp32 run's differs. The oracle
# requires the numbers to agree with the parts: a part that does not make the numbers move is not a pitfall.
NUMERIC_EXAMPLES = int(os.environ.get("MPGUIDE_CHECKS_NUMERIC_PROGRAMS", "150"))
NUMERIC_COUNTS: dict[str, int] = {}


@dataclass(frozen=True)
class NumericStep:
    precision: str  # "32-true", "bf16-mixed", "16-mixed-16", "16-mixed-1024"
    raw_step: bool  # opt.optimizer.step() instead of opt.step()
    region: str  # "none", "caching", "fresh": an own torch.autocast(bf16) around forward, backward, step
    forward_after: bool  # a forward through the model after the step, inside the region
    batches: int


def numeric_programs() -> st.SearchStrategy[NumericStep]:
    return st.builds(
        NumericStep,
        precision=st.sampled_from(["32-true", "bf16-mixed", "16-mixed-16", "16-mixed-1024"]),
        raw_step=st.booleans(),
        region=st.sampled_from(["none", "caching", "fresh"]),
        forward_after=st.booleans(),
        batches=st.integers(2, 3),
    )


def numeric_scale(p: NumericStep) -> float:
    return float(p.precision.rsplit("-", 1)[1]) if p.precision.startswith("16-mixed") else 1.0


def numeric_expected(p: NumericStep) -> set[str]:
    """The sections from the parts alone."""
    out = set()
    if p.raw_step:
        out.add("step-frequencies")  # bypasses Lightning's wrapper, whatever the precision
    if p.region == "caching" and p.forward_after:
        # a forward after a step (through opt.step() or the torch optimizer's own) in a caching region reads the
        # casts made before it
        out.add("autocast-cache")
    return out


class NumericProgram(pl.LightningModule):
    def __init__(self, p: NumericStep) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.p = p
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.probe = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
        self.first: dict[str, torch.Tensor] = {}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)

    def region(self):
        import contextlib

        if self.p.region == "none":
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=self.p.region == "caching")

    def flat(self) -> torch.Tensor:
        return torch.cat([q.detach().double().flatten() for q in self.parameters()])

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        first = not self.first
        with self.region():
            self.manual_backward(F.mse_loss(self.net(x).float(), y))
            if first:
                self.first["w0"] = self.flat()
                self.first["before"] = self.net(self.probe).detach().float()
            (opt.optimizer.step if self.p.raw_step else opt.step)()
            if self.p.forward_after:
                after = self.net(self.probe).detach().float()
                if first:
                    self.first["after"] = after
        if first:
            self.first["w1"] = self.flat()
        opt.zero_grad()


def numeric_run(p: NumericStep, checks: PitfallChecks | None) -> tuple[str | None, set[str], dict[str, torch.Tensor]]:
    plugins = []
    if p.precision == "bf16-mixed":
        plugins = [MixedPrecision("bf16-mixed", "cpu")]
    elif p.precision.startswith("16-mixed"):
        plugins = [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=numeric_scale(p)))]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8 * p.batches, 4, generator=g)
    trainer = quiet_trainer(callbacks=[checks] if checks is not None else [], plugins=plugins)
    module = NumericProgram(p)
    error = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.fit(module, DataLoader(TensorDataset(x, x[:, :1].sin()), batch_size=8))
        except Exception as err:  # noqa: BLE001 - a crash is a result
            error = f"{type(err).__name__}: {err}"
    return error, ({f.section for f in checks.findings} if checks is not None else set()), module.first


_FP32_RUNS: dict[tuple[bool, bool, int], dict[str, torch.Tensor]] = {}


def fp32_twin(p: NumericStep) -> dict[str, torch.Tensor]:
    """The same program in fp32: Lightning's 32-true, no own autocast, same step kind, seed and data."""
    key = (p.raw_step, p.forward_after, p.batches)
    if key not in _FP32_RUNS:
        twin = NumericStep("32-true", p.raw_step, "none", p.forward_after, p.batches)
        error, _, first = numeric_run(twin, None)
        assert error is None, error
        _FP32_RUNS[key] = first
    return _FP32_RUNS[key]


def numeric_evidence(p: NumericStep, first: dict[str, torch.Tensor]) -> set[str]:
    """The numeric pitfalls the runs show: the update off by the scale, a stale cast (from numbers only)."""
    ref = fp32_twin(p)
    out = set()
    ratio = float((first["w1"] - first["w0"]).norm() / (ref["w1"] - ref["w0"]).norm())
    scale = numeric_scale(p)
    if scale > 1 and abs(ratio / scale - 1) < 0.05:
        out.add("update off by the scale")
    else:
        assert abs(ratio - 1) < 0.05, f"update ratio {ratio:.4g} vs fp32: neither 1 nor the scale {scale:g}"
    if p.forward_after:
        assert not torch.equal(ref["before"], ref["after"]), "the fp32 run's step did not change the probe"
        if torch.equal(first["before"], first["after"]):
            out.add("stale cast")
    return out


def numeric_parts(p: NumericStep) -> set[str]:
    """What the parts say the numbers must show."""
    out = set()
    if p.raw_step and numeric_scale(p) > 1:
        out.add("update off by the scale")
    if p.region == "caching" and p.forward_after:
        out.add("stale cast")
    return out


@seed(SEED)
@settings(max_examples=NUMERIC_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(numeric_programs())
def test_numeric_pitfalls_are_confirmed_by_an_fp32_run_and_found(p):
    note(repr(p))
    error, found, first = numeric_run(p, PitfallChecks())
    assert error is None, error
    evidence = numeric_evidence(p, first)
    assert evidence == numeric_parts(p), (evidence, numeric_parts(p))  # the parts' numeric pitfalls are real
    want = numeric_expected(p)
    for section in want:
        NUMERIC_COUNTS[section] = NUMERIC_COUNTS.get(section, 0) + 1
    for kind in evidence:
        NUMERIC_COUNTS[kind] = NUMERIC_COUNTS.get(kind, 0) + 1
    assert found == want, (found, want)


def test_stale_casts_after_a_raw_step_are_found():
    """Found by the numeric oracle (seed 34), a miss until the raw step marked the caching region: an own caching
    autocast, the torch optimizer's own step, then a forward. The fp32 twin confirms the stale cast."""
    p = NumericStep("32-true", True, "caching", True, 2)
    error, found, first = numeric_run(p, PitfallChecks())
    assert error is None and numeric_evidence(p, first) == {"stale cast"}
    assert found == {"step-frequencies", "autocast-cache"}


def test_the_numeric_oracle_fails_on_a_wrong_part():
    """The fp32 confirmation tells the parts apart: no stale cast in a non-caching region, an update off by the
    scale (1024) only for the raw step under 16-mixed, an fp32-sized update through Lightning's wrapper."""
    p = NumericStep("bf16-mixed", False, "fresh", True, 2)
    error, _, first = numeric_run(p, None)
    assert error is None
    assert "stale cast" not in numeric_evidence(p, first)
    raw = NumericStep("16-mixed-1024", True, "none", False, 2)
    assert numeric_evidence(raw, numeric_run(raw, None)[2]) == {"update off by the scale"}
    wrapped = NumericStep("16-mixed-1024", False, "none", False, 2)
    assert numeric_evidence(wrapped, numeric_run(wrapped, None)[2]) == set()


def test_the_numeric_property_fails_with_the_autocast_cache_rule_disabled(monkeypatch):
    """The forward-after-step rule turned off: a stale cast the fp32 run confirms is then missed."""
    p = NumericStep("bf16-mixed", False, "caching", True, 2)
    assert numeric_expected(p) == {"autocast-cache"}
    error, found, first = numeric_run(p, PitfallChecks())
    assert error is None and found == {"autocast-cache"} and numeric_evidence(p, first) == {"stale cast"}
    from mpguide.checks import rules

    judge = rules.autocast_cache
    monkeypatch.setattr(
        rules, "autocast_cache", lambda rec, when, *a, **k: [] if when == "forward" else judge(rec, when, *a, **k)
    )
    assert numeric_run(p, PitfallChecks())[1] != numeric_expected(p)


@pytest.fixture(scope="module", autouse=True)
def _report_numeric_counts():
    yield
    print(
        f"\nnumeric programs per section and confirmed pitfall (seed {SEED}, {NUMERIC_EXAMPLES} programs): "
        f"{NUMERIC_COUNTS}"
    )
