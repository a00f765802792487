"""Facts of the guide's clipping and Fabric sections that round 4's public cases measured, each in a real run.

* Under 16-mixed a gradient norm logged in ``on_after_backward`` is the loss scale times the norm
  ``on_before_optimizer_step`` sees (Lightning unscales inside ``opt.step()``, before that hook:
  ``lightning/pytorch/plugins/precision/amp.py``), and with ``AdamW(fused=True)`` the second hook still
  sees the scaled norm (a fused optimizer unscales inside its own step, so Lightning does not).
* ``Fabric(precision="32-true")``: ``fabric.autocast()`` casts nothing (``lightning/fabric/plugins/precision/
  precision.py``: the base plugin's ``forward_context`` is a null context).

Example 04 and example 14 run the same patterns and print what they measured; these tests hold the facts.
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric import Fabric
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils.data import DataLoader, TensorDataset


def _norm(module: torch.nn.Module) -> float:
    grads = [p.grad.float().norm() for p in module.parameters() if p.grad is not None]
    return float(torch.stack(grads).norm())


class LoggedNorms(pl.LightningModule):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.fused = fused
        self.seen: list[tuple[float, float, float]] = []  # (after backward, before step, loss scale)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), 1e-3, fused=self.fused)

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(torch.nn.functional.mse_loss(self.net(x).float(), y))
        opt.step()

    def on_after_backward(self):
        self._after = _norm(self)
        self._scale = float(self.trainer.precision_plugin.scaler.get_scale())

    def on_before_optimizer_step(self, optimizer):
        self.seen.append((self._after, _norm(self), self._scale))


def _fit(fused: bool) -> list[tuple[float, float, float]]:
    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)), batch_size=8)
    model = LoggedNorms(fused)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        plugins=[MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=1024.0))],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data)
    finite = [(a, b, s) for a, b, s in model.seen if torch.isfinite(torch.tensor(a + b))]
    assert len(finite) >= 4, model.seen
    return finite


def test_a_norm_logged_after_backward_is_the_loss_scale_times_the_real_one():
    for after, before, scale in _fit(fused=False):
        assert after == pytest.approx(scale * before, rel=1e-2)
        assert scale > 1  # so the two hooks really differ


def test_a_fused_optimizer_still_sees_scaled_gradients_before_its_step():
    for after, before, scale in _fit(fused=True):
        assert before == pytest.approx(after, rel=1e-6)
        assert scale > 1


def test_fabric_autocast_at_32_true_casts_nothing():
    fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
    layer = torch.nn.Linear(4, 3)
    with fabric.autocast():
        out = layer(torch.randn(2, 4))
    assert out.dtype == torch.float32
    # the same block under Fabric's bf16-mixed casts: the test can tell the two apart
    with Fabric(accelerator="cpu", devices=1, precision="bf16-mixed").autocast():
        assert layer(torch.randn(2, 4)).dtype == torch.bfloat16
