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
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
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
