"""Accumulation windows at the epoch's tail (issue 35 item 1): the guide's snippets and ``mpguide.steps``.

Automatic ``accumulate_grad_batches=n`` steps every ``n`` batches **and** at the epoch's last batch; a manual
window cut by ``(batch_idx + 1) % n == 0`` alone does not. With 18 batches per epoch and ``n = 4`` over 2 epochs
that is 10 optimizer steps against 8. Every test here fits a real Trainer on a module of a shape other than the
examples' (a denoiser MLP trained on noise prediction, a diffusion trainer's step) and compares it with automatic
accumulation: step count and weights, bitwise in fp32, within example 06's tolerance (``same-precision``, 1e-3
relative) under bf16-mixed and 16-mixed; then the same with an ``IterableDataset`` without ``__len__``
(``num_training_batches`` is inf) and under ``limit_train_batches``. The old snippet fails the same test.
"""

from __future__ import annotations

import math
import warnings

import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT
from lightning.pytorch.plugins.precision import MixedPrecision
from test_guide_page import _guide_snippet
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from mpguide.steps import manual_stepping_batches, window_ends
from mpguide.verify.claims.tolerances import TOLERANCES
from mpguide.verify.run.runner import quiet_lightning

quiet_lightning()
N = 4
BATCHES = 18  # per epoch: 4 does not divide it
OLD_CONDITION = "(batch_idx + 1) % n == 0"
CALL = "window_ends(trainer, batch_idx, n)"  # the snippets' call (trainer = self.trainer)
TOL = TOLERANCES["same-precision"].value  # example 06's manual-vs-automatic tolerance


class Denoiser(L.LightningModule):
    """Predicts the noise added to a sample (a diffusion trainer's loss), SGD with momentum."""

    def __init__(self, manual: bool):
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = not manual
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8))

    def compute_loss(self, batch):
        (x,) = batch
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(int(x[0, 0].item() * 1e4) % 9973))
        return F.mse_loss(self.net(x + noise).float(), noise)

    def training_step(self, batch, batch_idx):  # automatic
        return self.compute_loss(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _snippet_module(code: str):
    namespace = {"torch": torch, "L": L}
    exec(compile(code, "accumulation snippet", "exec"), namespace)
    return type("Manual", (Denoiser,), {"training_step": namespace["training_step"]})(manual=True)


def _samples(count: int) -> torch.Tensor:
    return torch.randn(count, 8, generator=torch.Generator().manual_seed(3))


class Unsized(IterableDataset):
    """18 batches of 4 samples, no ``__len__``: Lightning's ``num_training_batches`` is inf."""

    def __iter__(self):
        for row in _samples(BATCHES * 4):
            yield (row,)


def _fit(module, precision: str, data: str = "sized", **trainer_kwargs):
    plugins = (
        {"plugins": [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=1024.0))]}
        if precision == "16-mixed"
        else {"precision": precision}
    )
    if data == "sized":
        loader = DataLoader(TensorDataset(_samples(BATCHES * 4)), batch_size=4)
    elif data == "unsized":
        loader = DataLoader(Unsized(), batch_size=4)
    else:  # 30 batches, cut to 18 by limit_train_batches
        loader = DataLoader(TensorDataset(_samples(30 * 4)), batch_size=4)
        trainer_kwargs["limit_train_batches"] = BATCHES
    trainer_kwargs.setdefault("max_epochs", 2)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **plugins,
        **trainer_kwargs,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader)
    return trainer.global_step, torch.cat([p.detach().flatten() for p in module.parameters()])


def _automatic(precision: str, data: str = "sized"):
    return _fit(Denoiser(manual=False), precision, data, accumulate_grad_batches=N)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed"])
def test_the_accumulation_snippet_steps_like_automatic_accumulation_at_the_epoch_tail(precision):
    code = _guide_snippet("accumulation").code
    auto_steps, auto_w = _automatic(precision)
    steps, w = _fit(_snippet_module(code), precision)
    assert auto_steps == steps == 2 * math.ceil(BATCHES / N) == 10
    if precision == "32-true":
        assert torch.equal(w, auto_w)
    else:
        assert _relative(w, auto_w) <= TOL, _relative(w, auto_w)


@pytest.mark.slow
def test_the_old_accumulation_snippet_fails_the_same_test():
    code = _guide_snippet("accumulation").code
    old = code.replace(CALL, OLD_CONDITION)
    assert old != code
    auto_steps, auto_w = _automatic("32-true")
    steps, w = _fit(_snippet_module(old), "32-true")
    assert (steps, auto_steps) == (8, 10)
    assert not torch.equal(w, auto_w)


@pytest.mark.slow
@pytest.mark.parametrize("data", ["unsized", "limited"])
def test_the_window_rule_holds_without_len_and_under_limit_train_batches(data):
    code = _guide_snippet("accumulation").code
    auto_steps, auto_w = _automatic("32-true", data)
    steps, w = _fit(_snippet_module(code), "32-true", data)
    assert auto_steps == steps == 10
    assert torch.equal(w, auto_w)
    # the guide's rule without the library: the modulo or trainer.is_last_batch (set in both cases)
    alone = code.replace(CALL, f"{OLD_CONDITION} or self.trainer.is_last_batch")
    steps_alone, w_alone = _fit(_snippet_module(alone), "32-true", data)
    assert steps_alone == 10 and torch.equal(w_alone, auto_w)
    old = code.replace(CALL, OLD_CONDITION)
    assert _fit(_snippet_module(old), "32-true", data)[0] == 8


@pytest.mark.slow
def test_the_ddp_snippet_steps_at_the_epoch_tail():
    """One process: ``toggle_model(sync_grad=...)`` is a no-op; the windows are what is tested."""
    code = _guide_snippet("ddp").code
    auto_steps, auto_w = _automatic("32-true")
    steps, w = _fit(_snippet_module(code), "32-true")
    assert auto_steps == steps == 10 and torch.equal(w, auto_w)
    old = code.replace(CALL, OLD_CONDITION)
    assert old != code and _fit(_snippet_module(old), "32-true")[0] == 8


@pytest.mark.slow
def test_manual_stepping_batches_counts_windows_not_batches():
    seen = {}

    class Sized(Denoiser):
        def configure_optimizers(self):
            seen["estimated"] = self.trainer.estimated_stepping_batches
            seen["windows"] = manual_stepping_batches(self.trainer, N)
            return super().configure_optimizers()

        training_step = _snippet_module(_guide_snippet("accumulation").code).__class__.training_step

    steps, _ = _fit(Sized(manual=True), "32-true")
    assert seen == {"estimated": 2 * BATCHES, "windows": steps} and steps == 10
    seen.clear()
    steps, _ = _fit(Sized(manual=True), "32-true", "limited")
    assert seen["windows"] == steps == 10
    seen.clear()
    _fit(Sized(manual=True), "32-true", "unsized", max_steps=7)
    assert seen["windows"] == 7  # inf batches per epoch: max_steps bounds it
    seen.clear()
    _fit(Sized(manual=True), "32-true", "unsized", max_steps=-1, max_epochs=1)
    assert seen["windows"] == math.inf


def test_window_ends_refuses_a_bad_window():
    class T:
        is_last_batch, num_training_batches = False, 18

    assert [window_ends(T(), i, 4) for i in (2, 3, 16, 17)] == [False, True, False, True]
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="n must be a positive int"):
            window_ends(T(), 3, bad)
        with pytest.raises(ValueError, match="n must be a positive int"):
            manual_stepping_batches(T(), bad)


def test_no_guide_snippet_cuts_windows_with_a_modulo_alone():
    """Every snippet that steps on ``(batch_idx + 1) % n`` also steps at the epoch's end."""
    from test_guide_page import GUIDE, snippets

    offenders = [s.where for s in snippets(GUIDE) if "% n" in s.code and "window_ends" not in s.code]
    assert not offenders, offenders
    assert (ROOT / "mpguide" / "steps.py").read_text().count("def window_ends(") == 1


@pytest.mark.slow
def test_the_20116_fix_steps_its_tail_window():
    """The #20116 fix with windows of 4 over 18 batches: 5 windows per epoch, the tail (batches 16-17) included."""
    snippet = _guide_snippet("no_gradient_step")
    assert CALL in snippet.code
    old = snippet.code.replace("not " + CALL, "(batch_idx + 1) % n != 0")
    assert old != snippet.code
    assert _steps_of_the_20116_fix(snippet.code) == 10 and _steps_of_the_20116_fix(old) == 8


def _steps_of_the_20116_fix(code: str) -> int:
    namespace = {"torch": torch, "L": L}
    exec(compile(code, "20116 snippet", "exec"), namespace)

    class Two(Denoiser):
        n_batches_per_optimizer = N

        def __init__(self):
            super().__init__(manual=True)
            self.other = torch.nn.Linear(8, 8)

        def inner_training_step(self, batch, batch_idx, compute_model_1_loss):
            (x,) = batch
            return (self.other(x) if compute_model_1_loss else self.net(x)).pow(2).mean()

        def configure_optimizers(self):
            return [torch.optim.SGD(self.other.parameters(), lr=0.01), torch.optim.SGD(self.net.parameters(), lr=0.01)]

    module = type("S", (Two,), {"training_step": namespace["training_step"]})()
    return _fit(module, "32-true")[0]
