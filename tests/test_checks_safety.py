"""PitfallChecks never alters the reader's code: every training_step signature Lightning supports reaches the
reader's method with the same arguments, its return value and exceptions pass through, and an exception in the
check's own code becomes one warning while the run goes on bitwise as without the callback (issue 34, item 1).

Run on the installed Lightning (2.6.6 here); the version matrix runs the same file on the other releases.
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils.data import DataLoader, TensorDataset

from mpguide.checks import ChecksStoppedWarning, PitfallChecks, rules
from mpguide.checks.recorder import Recorder
from mpguide.verify.claims import conditions


def data(seed: int = 0, n: int = 24) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return DataLoader(TensorDataset(x, x[:, :1].clone()), batch_size=4)


class Base(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.calls: list[tuple] = []

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def update(self, batch) -> torch.Tensor:
        x, y = batch
        opt = self.optimizers()
        opt.zero_grad()
        loss = F.mse_loss(self.net(x).float(), y)
        self.manual_backward(loss)
        opt.step()
        return loss.detach()


class OnlyBatch(Base):
    def training_step(self, batch):
        self.calls.append(("batch",))
        return self.update(batch)


class BatchIdx(Base):
    def training_step(self, batch, batch_idx):
        self.calls.append(("batch", batch_idx))
        return self.update(batch)


class DataloaderIdx(Base):
    """Two training dataloaders: Lightning combines them (CombinedLoader, max_size_cycle) and passes a list of
    batches; it passes no ``dataloader_idx`` to ``training_step``, so the default is what the reader gets."""

    def training_step(self, batch, batch_idx, dataloader_idx=0):
        self.calls.append(("list", batch_idx, dataloader_idx, len(batch)))
        return self.update(batch[0]) + self.update(batch[1])


class DataloaderIter(Base):
    def training_step(self, dataloader_iter):
        batch, batch_idx, dataloader_idx = next(dataloader_iter)
        self.calls.append(("iter", batch_idx, dataloader_idx))
        return self.update(batch)


class StarArgs(Base):
    def training_step(self, *args):
        self.calls.append(("args", len(args), args[1] if len(args) > 1 else None))
        return self.update(args[0])


class KeywordOnlyTail(Base):
    def training_step(self, batch, batch_idx, **kwargs):
        self.calls.append(("kw", batch_idx, tuple(sorted(kwargs))))
        return self.update(batch)


def run(module_cls, checks=None, precision="32-true", loaders=None, **kwargs):
    module = module_cls()
    # a CPU GradScaler given explicitly: Lightning <= 2.3 makes a CUDA one for "16-mixed", disabled on a CPU
    plugins = [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))] if precision == "16-mixed" else []
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checks] if checks else [],
        plugins=plugins,
        precision=None if plugins else precision,
        **kwargs,
    )
    trainer.fit(module, loaders if loaders is not None else data())
    return module, trainer


def weights(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(weights(a), weights(b), strict=True))


#: Whether the installed Lightning's own autocast caches casts (measured as the records' env measures it).
LIGHTNING_CACHES = bool(conditions.measure().get("lightning_autocast_cache"))

SIGNATURES = [OnlyBatch, BatchIdx, DataloaderIdx, DataloaderIter, StarArgs, KeywordOnlyTail]


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
@pytest.mark.parametrize("module_cls", SIGNATURES, ids=lambda c: c.__name__)
def test_every_signature_gets_the_same_calls_and_weights_with_the_check(module_cls, precision):
    loaders = [data(0), data(1)] if module_cls is DataloaderIdx else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, plain_trainer = run(module_cls, precision=precision, loaders=loaders)
        checks = PitfallChecks()
        watched, trainer = run(module_cls, checks, precision=precision, loaders=loaders)
    assert watched.calls == plain.calls and len(plain.calls) == 6
    assert trainer.global_step == plain_trainer.global_step
    assert same(watched, plain)
    # two updates per training_step: where Lightning's own autocast caches casts (<= 2.5.4), the second forward
    # reads the casts of the weights before the first step, a true finding
    two_updates_cached = module_cls is DataloaderIdx and precision != "32-true" and LIGHTNING_CACHES
    assert checks.stopped == [] and {f.section for f in checks.findings} == (
        {"autocast-cache"} if two_updates_cached else set()
    )
    # the wrapper is gone after the fit: the reader's method is the class's again
    assert "training_step" not in vars(watched)


def test_the_training_step_seen_during_the_fit_keeps_the_readers_signature():
    import inspect

    from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

    seen = {}

    class Probe(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            step = pl_module.training_step
            seen["wrapped"] = "training_step" in vars(pl_module)
            seen["batch_idx"] = is_param_in_hook_signature(step, "batch_idx", min_args=2)
            seen["iter"] = is_param_in_hook_signature(step, "dataloader_iter", explicit=True)
            seen["signature"] = str(inspect.signature(step))

    module = OnlyBatch()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[PitfallChecks(), Probe()],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, data())
    assert seen == {"wrapped": True, "batch_idx": False, "iter": False, "signature": "(batch)"}


class RaisesAtBatch2(BatchIdx):
    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            raise ValueError("the reader's own error at batch 2")
        return super().training_step(batch, batch_idx)


def test_the_readers_exception_reaches_the_caller_unchanged():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="the reader's own error at batch 2") as plain:
            run(RaisesAtBatch2)
        checks = PitfallChecks()
        with pytest.raises(ValueError, match="the reader's own error at batch 2") as watched:
            run(RaisesAtBatch2, checks)
    assert type(watched.value) is type(plain.value) is ValueError
    assert checks.stopped == []
    assert torch.Tensor.backward is torch.Tensor.backward  # restored (checked fully in test_checks)


class ClipInHook(BatchIdx):
    def on_before_optimizer_step(self, optimizer):
        torch.nn.utils.clip_grad_norm_(self.parameters(), 0.5)


class StepsWithoutGradient(BatchIdx):
    """A second optimizer over a head no loss reaches: the no-gradient-step rule runs at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(6, 1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=0.05), torch.optim.SGD(self.head.parameters(), lr=0.05)

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt, head = self.optimizers()
        opt.zero_grad()
        self.manual_backward(F.mse_loss(self.net(x), y))
        opt.step()
        head.step()


@pytest.mark.parametrize(
    ("module_cls", "rule", "section", "precision"),
    [
        (ClipInHook, "clipping", "clipping", "16-mixed"),
        (StepsWithoutGradient, "no_gradient_step", "no-gradient-step", "32-true"),
    ],
)
def test_a_rule_that_raises_stops_itself_with_one_warning_and_changes_nothing(
    module_cls, rule, section, precision, monkeypatch
):
    def broken(*args, **kwargs):
        raise KeyError("a bug in the rule")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, _ = run(module_cls, precision=precision)
    monkeypatch.setattr(rules, rule, broken)
    checks = PitfallChecks()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watched, _ = run(module_cls, checks, precision=precision)
    stops = [w for w in caught if issubclass(w.category, ChecksStoppedWarning)]
    assert len(stops) == 1 and f"[{section}] rule" in str(stops[0].message) and "KeyError" in str(stops[0].message)
    assert checks.stopped == [str(stops[0].message)]
    assert section not in {f.section for f in checks.findings}
    assert same(watched, plain)


def test_a_recorder_that_raises_stops_the_whole_check_and_restores_everything(monkeypatch):
    def broken(self):
        raise RuntimeError("a bug in the recorder")

    originals = (torch.Tensor.backward, torch.autograd.grad, torch.nn.utils.clip_grad_norm_, torch.autocast.__enter__)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, _ = run(ClipInHook, precision="16-mixed")
    monkeypatch.setattr(Recorder, "start_backward", broken)
    checks = PitfallChecks()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watched, _ = run(ClipInHook, checks, precision="16-mixed")
    stops = [w for w in caught if issubclass(w.category, ChecksStoppedWarning)]
    assert len(stops) == 1 and "stopped watching this run in batch 0" in str(stops[0].message)
    assert checks.findings == []
    assert same(watched, plain)
    now = (torch.Tensor.backward, torch.autograd.grad, torch.nn.utils.clip_grad_norm_, torch.autocast.__enter__)
    assert now == originals
