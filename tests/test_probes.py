"""The measuring callbacks of mpguide.verify.run.probes and the loss-scaled gradient of mpguide.steps, on real fits."""

from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from torch import nn

from mpguide import steps
from mpguide.data import digits_loader
from mpguide.models import DigitsClassifier
from mpguide.verify.run import probes, runner


class Stepping(DigitsClassifier):
    def __init__(self, step=True):
        super().__init__(reduction="sum", lr=1e-3)
        self.step = step

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.compute_loss(batch)
        self.manual_backward(loss)
        self.log("loss_logged", loss.detach())
        if self.step:
            opt.step()
        return loss.detach()


def fit(module, **kwargs):
    runner.quiet_lightning()
    callbacks = probes.callbacks()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_train_batches=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **kwargs,
    )
    trainer.fit(module, digits_loader(64))
    return probes.collect(trainer)


def test_probes_record_applied_updates_logged_values_scale_and_weights():
    pl.seed_everything(0, verbose=False)
    extra = fit(Stepping(step=True))
    assert extra["updates_applied"] == 6 and extra["all_updates_applied"] is True
    assert extra["applied_per_step"] == [True] * 6
    assert len(extra["logged"]["loss_logged"]) == 6
    assert extra["final_loss_scale"] is None  # fp32: no GradScaler
    assert len(extra["final_weights"]) == 64


def test_probes_see_steps_that_were_not_applied():
    pl.seed_everything(0, verbose=False)
    extra = fit(Stepping(step=False))
    assert extra["updates_applied"] == 0 and extra["updates_not_applied"] == 6
    assert extra["all_updates_applied"] is False


def test_final_weights_differ_when_training_differs():
    pl.seed_everything(0, verbose=False)
    stepped = fit(Stepping(step=True))["final_weights"]
    pl.seed_everything(0, verbose=False)
    frozen = fit(Stepping(step=False))["final_weights"]
    assert stepped != frozen


def test_final_loss_scale_under_16_mixed_is_read_from_the_scaler():
    pl.seed_everything(0, verbose=False)
    extra = fit(Stepping(step=True), plugins=[MixedPrecision("16-mixed", "cpu")])
    assert extra["final_loss_scale"] is not None and extra["final_loss_scale"] < 65536.0  # sum loss overflows


def _tiny_gradient_setup():
    # two layers with weights 2**-15 (exact in fp16): d out / d x = 8 * 2**-30, below fp16's smallest
    # subnormal (2**-24), so an unscaled fp16 backward rounds it to 0; at a scale of 2**14 it is 2**-13
    lin = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    with torch.no_grad():
        for layer in lin:
            layer.weight.fill_(2.0**-15)
    x = torch.randn(4, 8, requires_grad=True)
    return lin, x


@pytest.mark.parametrize("scaled", [False, True])
def test_scaled_input_grad_survives_fp16_underflow_only_when_scaled(scaled):
    lin, x = _tiny_gradient_setup()
    (reference,) = torch.autograd.grad(lin(x).sum(), x)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**14) if scaled else None
    # with a scaler the helper scales; without one it is plain autograd.grad (what the naive code does)
    trainer = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=scaler))
    with torch.autocast("cpu", dtype=torch.float16):
        (grad,) = steps.scaled_input_grad(lin(x), x, trainer)
    error = float((grad - reference).norm() / reference.norm())
    if scaled:
        assert error < 1e-2
    else:
        assert error > 0.5  # the underflow the helper exists for


def test_scaled_input_grad_equals_autograd_grad_without_a_scaler():
    lin, x = nn.Linear(8, 1), torch.randn(4, 8, requires_grad=True)
    trainer = SimpleNamespace(precision_plugin=SimpleNamespace())
    (plain,) = torch.autograd.grad(lin(x).sum(), x)
    (helper,) = steps.scaled_input_grad(lin(x), [x], trainer)
    assert torch.equal(plain, helper)


class TinySteps(Stepping):
    """SGD at a learning rate so small that bf16 weights cannot take the step (fp32 ones can)."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-5)


@pytest.mark.parametrize("precision, lost", [("32-true", False), ("bf16-true", True)])
def test_lost_updates_count_steps_that_round_away(precision, lost):
    pl.seed_everything(0, verbose=False)
    extra = fit(TinySteps(), precision=precision)
    assert extra["updates_with_gradient"] > 0
    assert len(extra["lost_fraction_per_step"]) == 6
    assert extra["updates_kept"] + extra["updates_lost"] == extra["updates_with_gradient"]
    fraction = extra["updates_lost"] / extra["updates_with_gradient"]
    if lost:  # lr x gradient is far below half a bf16 spacing: (nearly) every update rounds away
        assert fraction > 0.9
    else:  # fp32 takes (nearly) every one of them
        assert fraction < 0.01


def test_lost_updates_count_a_step_that_was_not_taken():
    pl.seed_everything(0, verbose=False)
    extra = fit(Stepping(step=False))  # no opt.step(): on_before_optimizer_step never runs, nothing counted
    assert extra["updates_with_gradient"] == 0 and extra["lost_fraction_per_step"] == [0.0] * 6
