"""The guide's snippets at the edges issue 35 found (items 4, 5 and 6), each run as printed, in real fits, on modules
of shapes other than the examples', and each shown to fail on the snippet or advice the evidence found wrong.

* ``gradient_penalty``: a WGAN-GP critic step runs in fp32, bf16-mixed and 16-mixed and its input gradient is the
  unscaled one (round-5 case 12: the old snippet raised ``AttributeError`` in fp32 and bf16-mixed);
* ``resuming``: after ``fit(ckpt_path=...)`` with new GradScaler settings the scale grows again (round-4 held case
  12b: ``set_growth_interval(1)`` alone left it frozen, the restored growth count being past the new interval).
"""

from __future__ import annotations

import textwrap
import warnings

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from test_guide_page import _guide_snippet
from torch.utils.data import DataLoader, TensorDataset

from mpguide.verify.run.runner import quiet_lightning

quiet_lightning()

OLD_PENALTY = """# None in fp32 and bf16-mixed
scaler = self.trainer.precision_plugin.scaler
# scale what goes in
scaled = scaler.scale(scores.sum())
(grad,) = torch.autograd.grad(
    scaled, images, create_graph=True
)
# unscale what comes out
grad = grad / scaler.get_scale()
penalty = grad.pow(2).sum(dim=1).mean()
loss = loss_d + gamma / 2 * penalty
self.manual_backward(loss)
"""


def _trainer(precision: str, **kwargs) -> L.Trainer:
    kw = (
        {"plugins": [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=1024.0))]}
        if precision == "16-mixed"
        else {"precision": precision}
    )
    kwargs.setdefault("max_epochs", 1)
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
        **kwargs,
    )


def _critic_step(snippet_code: str):
    """A WGAN-GP critic (MLP on 12 features) whose training_step is the snippet around its own lines."""
    body = textwrap.indent(snippet_code, "    ")
    source = (
        "def training_step(self, batch, batch_idx):\n"
        "    opt = self.optimizers()\n"
        "    (x,) = batch\n"
        "    images = x.clone().requires_grad_(True)\n"
        "    scores = self.critic(images)\n"
        "    loss_d = -scores.float().mean()\n"
        "    gamma = 10.0\n"
        "    opt.zero_grad()\n"
        f"{body}"
        "    opt.step()\n"
        "    self.grads.append(grad.detach().float().clone())\n"
    )
    namespace = {"torch": torch}
    exec(compile(source, "gradient_penalty snippet", "exec"), namespace)

    class Critic(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.automatic_optimization = False
            self.critic = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
            self.grads = []

        training_step = namespace["training_step"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    return Critic()


def _first_input_gradient(code: str, precision: str) -> torch.Tensor:
    data = TensorDataset(torch.randn(16, 12, generator=torch.Generator().manual_seed(1)))
    module = _critic_step(code)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(precision, max_steps=2).fit(module, DataLoader(data, batch_size=8))
    return module.grads[0]


@pytest.mark.slow
def test_the_gradient_penalty_snippet_runs_and_is_unscaled_in_every_precision():
    code = _guide_snippet("gradient_penalty").code
    fp32 = _first_input_gradient(code, "32-true")
    # the reference: the plain input gradient of the same critic at its initial weights
    module = _critic_step(code)
    x = torch.randn(16, 12, generator=torch.Generator().manual_seed(1))[:8].requires_grad_(True)
    (plain,) = torch.autograd.grad(module.critic(x).sum(), x)
    assert torch.allclose(fp32, plain, rtol=1e-6, atol=0)
    for precision, bound in (("bf16-mixed", 0.05), ("16-mixed", 0.01)):
        got = _first_input_gradient(code, precision)
        err = float((got - plain).norm() / plain.norm())
        # bf16 carries 8 significand bits (2**-8 = 0.4 % per rounding), fp16 11; a scale left in would be 1023
        print(f"{precision}: input-gradient relative error {err:.3g}")
        assert err < bound, (precision, err)


@pytest.mark.slow
@pytest.mark.parametrize(
    "precision, error",
    [("32-true", "'Precision' object has no attribute 'scaler'"), ("bf16-mixed", "'NoneType' object has no attribute")],
)
def test_the_old_gradient_penalty_snippet_raises_where_its_comment_said_none(precision, error):
    with pytest.raises(AttributeError, match=error):
        _first_input_gradient(OLD_PENALTY, precision)


# ----------------------------------------------------------------------------- resuming with new scaler settings


class _Resumed(L.LightningModule):
    """A small autoencoder, one SGD step per batch; records the loss scale after each step."""

    def __init__(self, on_start=None):
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.net = torch.nn.Sequential(torch.nn.Linear(10, 4), torch.nn.ReLU(), torch.nn.Linear(4, 10))
        self.on_start = on_start
        self.scales = []

    def on_train_start(self):
        if self.on_start is not None:
            self.on_start(self)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        (x,) = batch
        opt.zero_grad()
        self.manual_backward(torch.nn.functional.mse_loss(self.net(x).float(), x))
        opt.step()
        self.scales.append(self.trainer.precision_plugin.scaler.get_scale())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def _fit_resumed(steps: int, growth_interval: int, ckpt=None, on_start=None):
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=growth_interval)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
    )
    module = _Resumed(on_start)
    data = TensorDataset(torch.randn(64, 10, generator=torch.Generator().manual_seed(2)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, DataLoader(data, batch_size=4), ckpt_path=ckpt)
    return trainer, module


@pytest.mark.slow
def test_the_resuming_snippet_makes_the_scale_grow_after_a_resume(tmp_path):
    namespace = {"torch": torch}
    exec(compile(_guide_snippet("resuming").code, "resuming snippet", "exec"), namespace)
    first, run = _fit_resumed(4, 2000)
    assert run.scales == [1024.0] * 4  # 4 clean steps: the growth count is 4, far from 2000
    ckpt = tmp_path / "c.ckpt"
    first.save_checkpoint(ckpt)
    _, fixed = _fit_resumed(12, 1, ckpt, on_start=namespace["on_train_start"])
    # the 8 resumed steps: the scale doubles after each clean step, as a fresh interval-1 scaler does
    assert fixed.scales == [1024.0 * 2**k for k in range(1, 9)], fixed.scales
    # the advice the evidence found wrong: set_growth_interval(1) alone; the count (4) is past 1, the scale is frozen
    _, frozen = _fit_resumed(12, 1, ckpt, on_start=lambda m: m.trainer.precision_plugin.scaler.set_growth_interval(1))
    assert frozen.trainer.precision_plugin.scaler.get_growth_interval() == 1
    assert frozen.scales == [1024.0] * 8
