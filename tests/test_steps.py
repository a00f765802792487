"""mpguide.steps.step_skip_aware with ReduceLROnPlateau (issue 21 item 2), in real Trainer runs.

At a31c63a ``step_skip_aware(opt, trainer, sched)`` with a ``ReduceLROnPlateau`` raised torch's
``TypeError: ReduceLROnPlateau.step() missing 1 required positional argument: 'metrics'`` at the
first batch in every precision, after the optimizer had stepped. Now the monitored value is passed
with ``metrics=``, and a missing one is refused before the optimizer steps, naming the fix.
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from conftest import quiet_fit
from lightning.pytorch.plugins.precision import MixedPrecision

from mpguide.precision import ManualMixedPrecision
from mpguide.steps import step_skip_aware
from mpguide.verify.run.runner import quiet_lightning

quiet_lightning()
OVERFLOW_BATCH = 2  # under 16-mixed this batch's gradient is made infinite: GradScaler skips its step
PRECISIONS = {
    "32-true": {"precision": "32-true"},
    "bf16-mixed": {"precision": "bf16-mixed"},
    # CPU: precision="16-mixed" would run bf16. Scale 256: at 65536 the fp16 backward of this model overflows
    # by itself on the first batches, and only the forced overflow should skip
    "16-mixed": lambda: {"plugins": [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", 256.0))]},
    "16-mixed-plugin": lambda: {
        "plugins": [ManualMixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", 256.0))]
    },
}


class Plateau(pl.LightningModule):
    """One SGD stepped every batch; a ReduceLROnPlateau monitoring the logged training loss."""

    def __init__(self, pass_metrics: bool):
        super().__init__()
        pl.seed_everything(0, verbose=False)
        self.automatic_optimization = False
        self.net = torch.nn.Linear(6, 1)
        self.pass_metrics = pass_metrics
        self.applied, self.passed = [], []
        self.net.weight.register_hook(self._overflow)

    def _overflow(self, grad):
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        return grad * float("inf") if scaler is not None and self.batch == OVERFLOW_BATCH else grad

    def training_step(self, batch, batch_idx):
        opt, sched = self.optimizers(), self.lr_schedulers()
        self.batch = batch_idx
        opt.zero_grad()
        loss = (self.net(batch[0]).float() - 1).pow(2).mean()
        self.manual_backward(loss)
        self.log("train_loss", loss)
        if self.pass_metrics:
            applied = step_skip_aware(opt, self.trainer, sched, metrics=loss.detach())
        else:
            applied = step_skip_aware(opt, self.trainer, sched)
        self.applied.append(applied)
        if applied:
            self.passed.append(float(loss))
        return loss.detach()

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "train_loss"}}


def fit(module, name, batches=8):
    precision = PRECISIONS[name]() if callable(PRECISIONS[name]) else PRECISIONS[name]
    return quiet_fit(module, batches * 4, **precision)


@pytest.mark.parametrize("name", list(PRECISIONS))
def test_plateau_gets_the_monitored_value_of_applied_steps_only(name):
    module = Plateau(pass_metrics=True)
    fit(module, name)
    sched = module.lr_schedulers()
    skipped = [OVERFLOW_BATCH] if name.startswith("16-mixed") else []  # fp32 and bf16 have no scaler
    assert [i for i, a in enumerate(module.applied) if not a] == skipped
    assert sched.last_epoch == len(module.passed) == 8 - len(skipped)  # one scheduler step per applied update
    # the expected learning rate: a fresh ReduceLROnPlateau fed exactly the values of the applied steps
    replay = torch.optim.lr_scheduler.ReduceLROnPlateau(
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), mode="min", factor=0.5, patience=0
    )
    for value in module.passed:
        replay.step(value)
    assert sched.get_last_lr() == replay.get_last_lr() and sched.best == replay.best
    assert module.optimizers().param_groups[0]["lr"] == replay.get_last_lr()[0]


@pytest.mark.parametrize("name", list(PRECISIONS))
def test_plateau_without_metrics_is_refused_before_the_step(name):
    module = Plateau(pass_metrics=False)
    before = module.net.weight.detach().clone()
    fix = r"metrics= is missing\. Call step_skip_aware\(opt, self\.trainer, sched, metrics=value\) with the value"
    with pytest.raises(TypeError, match=fix + r' it watches .*Lightning ignores the "monitor" key'):
        fit(module, name)
    assert module.applied == [] and torch.equal(before, module.net.weight.detach())  # at the first batch, no step


def test_metrics_for_another_scheduler_is_refused():
    class Trainer:  # step_skip_aware reads only precision_plugin before it refuses
        precision_plugin = None

    param = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([param], lr=0.1)
    with pytest.raises(TypeError, match="metrics= is for ReduceLROnPlateau only; StepLR was given"):
        step_skip_aware(opt, Trainer(), torch.optim.lr_scheduler.StepLR(opt, 1), metrics=1.0)


# ---------------------------------------------------------------------------------------------- issue 26 item 7
def tiny_gradient_setup(scale=65536.0):
    from types import SimpleNamespace

    trainer = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=torch.amp.GradScaler("cpu", init_scale=scale)))
    x = torch.linspace(-1, 1, 64).half().requires_grad_(True)
    coeff = torch.linspace(1e-8, 1e-7, 64)  # below fp16's smallest normal (6.1e-05), as a balancer's small loss
    return trainer, x, coeff


def test_scaled_input_grad_unscales_in_fp32():
    """On 5d093d9 the unscaling ran in float16 and these gradients came back rounded to fp16's subnormal grid
    (relative error > 0.1, zeros); in float32 they are within fp16's rounding of the scaled values."""
    from mpguide.steps import scaled_input_grad

    trainer, x, coeff = tiny_gradient_setup()
    (grad,) = scaled_input_grad(x * coeff, x, trainer, create_graph=False)  # float32 product: fp16 x's grad
    expected = coeff
    assert grad.dtype == torch.float32
    assert float(((grad - expected).abs() / expected).max()) < 2e-3
    fp16_unscaled = (grad * 65536.0).half() * (1.0 / 65536.0)  # what unscaling in fp16 gives
    assert float(((fp16_unscaled.float() - expected).abs() / expected).max()) > 0.1  # the check can fail


def test_scaled_input_grad_can_keep_the_graph_without_building_one():
    """On 5d093d9 ``create_graph=False`` freed the graph (no ``retain_graph``): a second use raised."""
    from mpguide.steps import scaled_input_grad

    trainer, x, coeff = tiny_gradient_setup()
    out = (x.float() * 3.0).exp()
    first = scaled_input_grad(out, x, trainer, create_graph=False, retain_graph=True)
    second = scaled_input_grad(out, x, trainer, create_graph=False)
    assert torch.equal(first[0], second[0])
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        scaled_input_grad(out, x, trainer, create_graph=False)
