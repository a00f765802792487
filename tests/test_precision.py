"""ManualMixedPrecision against fp32 references and against Lightning's own MixedPrecision."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils.data import DataLoader, TensorDataset

from mpguide.precision import ManualMixedPrecision, NoGradientStepWarning, has_gradients
from mpguide.verify.run.runner import parameter_digest, quiet_lightning

quiet_lightning()


def amp(cls, precision="16-mixed", **scaler_kw):
    """A plugin whose GradScaler starts at 256 instead of 65536, so that these small models never
    overflow by themselves and every difference from fp32 is the one a test provokes."""
    if precision != "16-mixed":
        return cls(precision, "cpu")
    return cls(precision, "cpu", scaler=torch.amp.GradScaler("cpu", **{"init_scale": 256.0, **scaler_kw}))


def loader(n=8):
    gen = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n * 4, 6, generator=gen)), batch_size=4)


def fit(module, plugin=None, steps=None, ckpt_path=None, callbacks=(), precision="32-true", max_epochs=1, **kw):
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=max_epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks),
        max_steps=steps or -1,
        **({"plugins": [plugin]} if plugin else {"precision": precision}),
        **kw,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, loader(), ckpt_path=ckpt_path)
    return trainer, [w for w in caught if issubclass(w.category, NoGradientStepWarning)]


class Pair(pl.LightningModule):
    """Two linear models, one SGD each. ``mode`` selects the stepping pattern."""

    def __init__(self, mode="starved", overflow_steps=(), lr=0.1):
        super().__init__()
        pl.seed_everything(0)  # no verbose=: Lightning < 2.4 lacks it; quiet_lightning() mutes the line
        self.automatic_optimization = False
        self.a, self.b = torch.nn.Linear(6, 1), torch.nn.Linear(6, 1)
        self.mode, self.overflow_steps, self.lr = mode, overflow_steps, lr
        self.b_updates, self.losses = [], []
        self.a.weight.register_hook(self._overflow)

    def _overflow(self, grad):
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if scaler is not None and self.global_step // 2 in self.overflow_steps:
            return grad * float("inf")
        return grad

    def training_step(self, batch, batch_idx):
        (x,) = batch
        opt_a, opt_b = self.optimizers()
        if self.mode == "starved":  # the loss reaches only a; b is stepped on odd batches
            opt_a.zero_grad()
            opt_b.zero_grad()
            loss = self.a(x).pow(2).mean()
            self.manual_backward(loss)
            (opt_a if batch_idx % 2 == 0 else opt_b).step()
        elif self.mode == "shared":  # one backward, both step
            opt_a.zero_grad()
            opt_b.zero_grad()
            loss = self.a(x).sum() + 3 * self.b(x).sum()
            self.manual_backward(loss)
            opt_a.step()
            before = self.b.weight.detach().clone()
            opt_b.step()
            self.b_updates.append(float((before - self.b.weight.detach()).abs().sum()))
        elif self.mode == "gan":  # backward a, step a, backward b, step b
            # toggle_/untoggle_optimizer rather than the toggled_optimizer context manager, which
            # Lightning < 2.5 lacks: on those releases only the plugin's own refusal may fail a test
            self.toggle_optimizer(opt_a)
            opt_a.zero_grad()
            loss_a = self.a(x).pow(2).mean()
            self.manual_backward(loss_a)
            opt_a.step()
            self.untoggle_optimizer(opt_a)
            self.toggle_optimizer(opt_b)
            opt_b.zero_grad()
            loss_b = (self.b(x) - 1).pow(2).mean()
            self.manual_backward(loss_b)
            opt_b.step()
            self.untoggle_optimizer(opt_b)
            loss = loss_a + loss_b
        else:  # "accumulate": a steps every batch, b accumulates over windows of 2 batches
            opt_a.zero_grad()
            loss = self.a(x).pow(2).mean() + (self.b(x) - 1).pow(2).mean()
            self.manual_backward(loss)
            opt_a.step()
            if batch_idx % 2 == 1:
                opt_b.step()
                opt_b.zero_grad()
        self.losses.append(float(loss))
        return loss.detach()

    def configure_optimizers(self):
        return (torch.optim.SGD(self.a.parameters(), lr=self.lr), torch.optim.SGD(self.b.parameters(), lr=self.lr))


def test_stock_16_mixed_raises_without_gradients():
    with pytest.raises(AssertionError, match="No inf checks were recorded for this optimizer"):
        fit(Pair("starved"), amp(MixedPrecision))


def test_no_gradient_step_is_a_warned_no_op_like_fp32():
    ref = Pair("starved")
    fit(ref)
    b_before = parameter_digest(Pair("starved").b)
    fixed = Pair("starved")
    _, caught = fit(fixed, amp(ManualMixedPrecision))
    assert parameter_digest(fixed.b) == b_before == parameter_digest(ref.b)  # b never moves, as in fp32
    assert len(caught) == 1 and str(caught[0].message).startswith("optimizer 1 (SGD) of configure_optimizers")
    assert fixed.losses == pytest.approx(ref.losses, rel=2e-3)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_plugin_changes_nothing_in_fp32_and_bf16(precision):
    for mode in ("starved", "shared", "gan"):
        plain, with_plugin = Pair(mode), Pair(mode)
        fit(plain, precision=precision)
        _, caught = fit(with_plugin, amp(ManualMixedPrecision, precision))
        assert parameter_digest(plain) == parameter_digest(with_plugin), mode  # bitwise identical
        assert plain.losses == with_plugin.losses
        assert bool(caught) == (mode == "starved")


def test_shared_backward_overflow_doubles_stock_update_and_plugin_fixes_it():
    ref = Pair("shared")
    stock, fixed = Pair("shared", overflow_steps=(0,)), Pair("shared", overflow_steps=(0,))
    fit(ref)
    fit(stock, amp(MixedPrecision))
    fit(fixed, amp(ManualMixedPrecision))
    assert stock.b_updates[0] == pytest.approx(2 * ref.b_updates[0], rel=1e-3)
    assert stock.b_updates[1:] == pytest.approx(ref.b_updates[1:], rel=1e-3)
    assert fixed.b_updates == pytest.approx(ref.b_updates, rel=1e-3)


def test_shared_backward_without_overflow_is_unchanged():
    ref, stock, fixed = Pair("shared"), Pair("shared"), Pair("shared")
    fit(ref)
    fit(stock, amp(MixedPrecision))
    trainer, _ = fit(fixed, amp(ManualMixedPrecision))
    assert stock.b_updates == pytest.approx(ref.b_updates, rel=1e-3)
    assert fixed.b_updates == pytest.approx(ref.b_updates, rel=1e-3)
    assert trainer.precision_plugin.scaler.get_scale() == 256.0


def test_growth_step_between_optimizers():
    def plugin(cls):
        return amp(cls, growth_interval=1, init_scale=2.0**-10)  # room for 16 doublings without overflow

    ref, stock, fixed = Pair("shared"), Pair("shared"), Pair("shared")
    fit(ref)
    stock_trainer, _ = fit(stock, plugin(MixedPrecision))
    fixed_trainer, _ = fit(fixed, plugin(ManualMixedPrecision))
    # grown after a's step
    assert stock.b_updates == pytest.approx([0.5 * u for u in ref.b_updates], rel=1e-3)
    assert fixed.b_updates == pytest.approx(ref.b_updates, rel=1e-3)
    # one update per batch instead of two: 8 growth steps instead of 16
    assert fixed_trainer.precision_plugin.scaler.get_scale() == 2.0**-10 * 2**8
    assert stock_trainer.precision_plugin.scaler.get_scale() == 2.0**-10 * 2**16


def test_gan_alternation_matches_fp32_and_updates_once_per_training_step():
    ref, fixed = Pair("gan"), Pair("gan", overflow_steps=(1,))
    fit(ref)
    trainer, caught = fit(fixed, amp(ManualMixedPrecision))
    assert not caught
    # the overflow at batch 1 skips a's step there only; b must follow fp32 exactly
    assert parameter_digest(fixed.b) != parameter_digest(Pair("gan").b)
    torch.testing.assert_close(fixed.b.weight, ref.b.weight, rtol=2e-3, atol=1e-4)
    assert trainer.precision_plugin.scaler.get_scale() == 128.0  # halved once


def test_accumulation_window_matches_fp32():
    ref, fixed, stock = Pair("accumulate"), Pair("accumulate"), Pair("accumulate")
    fit(ref)
    fit(fixed, amp(ManualMixedPrecision))
    fit(stock, amp(MixedPrecision))
    torch.testing.assert_close(fixed.b.weight, ref.b.weight, rtol=2e-3, atol=1e-4)
    torch.testing.assert_close(stock.b.weight, ref.b.weight, rtol=2e-3, atol=1e-4)


def test_checkpoint_resume_reproduces_the_uninterrupted_run(tmp_path):
    """Two epochs in one go vs one epoch, a checkpoint, and a resumed second epoch."""
    whole = Pair("shared", overflow_steps=(1,))
    fit(whole, amp(ManualMixedPrecision, growth_interval=3), max_epochs=2)

    first = Pair("shared", overflow_steps=(1,))
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)
    fit(first, amp(ManualMixedPrecision, growth_interval=3), callbacks=[ckpt], max_epochs=1)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    # 256, halved at batch 1, doubled after batches 4 and 7
    assert saved["ManualMixedPrecision"]["scale"] == 512.0

    resumed = Pair("shared", overflow_steps=(1,))
    fit(resumed, amp(ManualMixedPrecision, growth_interval=3), ckpt_path=str(tmp_path / "last.ckpt"), max_epochs=2)
    assert len(resumed.losses) == 8 and len(whole.losses) == 16
    assert first.losses + resumed.losses == whole.losses  # bitwise the same curve
    assert parameter_digest(resumed) == parameter_digest(whole)


def test_clip_gradients_before_step_clips_unscaled_gradients():
    class Clipped(Pair):
        def training_step(self, batch, batch_idx):
            (x,) = batch
            opt_a, _ = self.optimizers()
            opt_a.zero_grad()
            loss = 10 * self.a(x).sum()  # gradient norm ~40, scaled by 256: no fp16 overflow
            self.manual_backward(loss)
            self.clip_gradients(opt_a, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
            before = self.a.weight.detach().clone()
            opt_a.step()
            self.b_updates.append(float((before - self.a.weight.detach()).norm()))
            return loss.detach()

    ref, stock, fixed = Clipped(), Clipped(), Clipped()
    fit(ref)
    fit(stock, amp(MixedPrecision))
    fit(fixed, amp(ManualMixedPrecision))
    assert 0.05 < ref.b_updates[0] <= 0.1 + 1e-6  # at most lr x the clipped norm (shared with the bias)
    assert max(stock.b_updates) < 0.05 * min(ref.b_updates)  # stock clipped the scaled gradient (scale 256)
    assert fixed.b_updates == pytest.approx(ref.b_updates, rel=1e-2)


def test_helpers_and_errors():
    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    assert not has_gradients(opt)
    with pytest.raises(ValueError, match="does not use a GradScaler"):
        ManualMixedPrecision("32-true", "cpu", scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(ValueError):
        ManualMixedPrecision("64-true", "cpu")


def test_automatic_optimization_is_unchanged():
    class Auto(pl.LightningModule):
        def __init__(self):
            super().__init__()
            pl.seed_everything(0)  # no verbose=: Lightning < 2.4 lacks it; quiet_lightning() mutes the line
            self.net = torch.nn.Linear(6, 1)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    stock, fixed = Auto(), Auto()
    fit(stock, amp(MixedPrecision))
    _, caught = fit(fixed, amp(ManualMixedPrecision))
    assert parameter_digest(stock) == parameter_digest(fixed) and not caught


def test_fused_optimizer_steps_as_in_lightning_and_cannot_be_clipped():
    class Fused(Pair):
        def training_step(self, batch, batch_idx):
            opt_a, _ = self.optimizers()
            opt_a.zero_grad()
            loss = self.a(batch[0]).pow(2).mean()
            self.manual_backward(loss)
            if self.mode == "clip":
                self.clip_gradients(opt_a, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
            opt_a.step()
            return loss.detach()

        def configure_optimizers(self):
            return (
                torch.optim.AdamW(self.a.parameters(), lr=0.01, fused=True),
                torch.optim.SGD(self.b.parameters(), lr=0.1),
            )

    stock, fixed = Fused("plain", overflow_steps=(1,)), Fused("plain", overflow_steps=(1,))
    stock_trainer, _ = fit(stock, amp(MixedPrecision))
    trainer, _ = fit(fixed, amp(ManualMixedPrecision))
    assert parameter_digest(stock) == parameter_digest(fixed)  # the inf check and skip run inside the step
    # one step per batch, so global_step // 2 == 1 at batches 2 and 3: two skips, 256 -> 64
    assert trainer.precision_plugin.scaler.get_scale() == stock_trainer.precision_plugin.scaler.get_scale() == 64
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
        fit(Fused("clip"), amp(ManualMixedPrecision))


def test_step_was_skipped_without_a_scaler_and_for_foreign_optimizers():
    plugin = ManualMixedPrecision("bf16-mixed", "cpu")
    module = Pair("shared")
    fit(module, plugin)
    assert not plugin.step_was_skipped(module.trainer.optimizers[0])
    with pytest.raises(ValueError, match="has not been set up with or stepped through this plugin"):
        plugin.step_was_skipped(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1))


def test_fp32_opens_no_autocast_even_when_lightning_builds_its_own(monkeypatch):
    """Lightning's master branch (7f0c343, pull request #21616) builds ``torch.autocast(device, dtype)`` in
    ``MixedPrecision.forward_context`` instead of entering ``autocast_context_manager()``; with float16 for any
    precision but bf16-mixed. Imitated here: the plugin's 32-true must still run ``training_step`` in fp32."""
    from contextlib import contextmanager

    @contextmanager
    def master_like_forward_context(self):
        with torch.autocast(self.device, dtype=torch.bfloat16 if self.precision == "bf16-mixed" else torch.half):
            yield

    monkeypatch.setattr(MixedPrecision, "forward_context", master_like_forward_context)
    with ManualMixedPrecision("32-true", "cpu").forward_context():
        assert not torch.is_autocast_enabled("cpu")
        assert (torch.nn.Linear(4, 4)(torch.randn(2, 4))).dtype == torch.float32
    with ManualMixedPrecision("bf16-mixed", "cpu").forward_context():  # the mixed precisions keep Lightning's region
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


# ---------------------------------------------------------------------------------------------- issue 26
def skips_and_distance(module_cls, plugin_factory, ref_weights=None, **fit_kw):
    """Run ``module_cls()``; returns (module, skipped steps, max |W - W_ref|, scale updates)."""
    module, plugin, updates = module_cls(), plugin_factory() if plugin_factory else None, [0]
    if plugin is not None and plugin.scaler is not None:
        update = plugin.scaler.update

        def counted(*args, **kwargs):
            updates[0] += 1
            return update(*args, **kwargs)

        plugin.scaler.update = counted
    fit(module, plugin, **fit_kw)
    weights = torch.cat([p.detach().flatten() for p in module.parameters()])
    distance = None if ref_weights is None else float((weights - ref_weights).abs().max())
    return module, module.steps - module.applied, distance, updates[0], weights


class ChunkSteps(pl.LightningModule):
    """Truncated BPTT as in Lightning-AI/pytorch-lightning#17848: one optimizer stepped after every one of
    the 6 time chunks of a batch, inside one ``training_step``. The loss is large enough that the default
    init scale 65536 overflows the first steps, as at the start of any fp16 run."""

    def __init__(self):
        super().__init__()
        pl.seed_everything(0)
        self.automatic_optimization = False
        self.inp, self.rec, self.out = torch.nn.Linear(6, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 1)
        self.steps = self.applied = 0

    def training_step(self, batch, batch_idx):
        (x,) = batch  # (4, 6): six time steps of one feature each, copied to 6 features
        opt, h = self.optimizers(), torch.zeros(x.shape[0], 16)
        for t in range(0, 6, 2):  # chunks of 2 time steps
            for k in (t, t + 1):
                h = torch.tanh(self.inp(x * x[:, k : k + 1]) + self.rec(h))
            loss = (self.out(h).float() - x[:, t : t + 1]).pow(2).mean() * 300.0
            opt.zero_grad()
            self.manual_backward(loss)
            before = self.rec.weight.detach().clone()
            opt.step()
            self.steps += 1
            self.applied += int(not torch.equal(before, self.rec.weight))
            h = h.detach()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def test_several_steps_of_one_optimizer_skip_no_more_than_stock():
    """Issue 26 item 1: the plugin updated once per training_step (46 of 64 skipped on the public case,
    stock 6); rule 1 updates after each step of a lone optimizer, so skips and weights equal stock's."""
    *_, ref = skips_and_distance(ChunkSteps, None)
    _, stock_skips, stock_dist, stock_updates, _ = skips_and_distance(
        ChunkSteps, lambda: MixedPrecision("16-mixed", "cpu"), ref, max_epochs=2
    )
    _, ours_skips, ours_dist, ours_updates, _ = skips_and_distance(
        ChunkSteps, lambda: ManualMixedPrecision("16-mixed", "cpu"), ref, max_epochs=2
    )
    assert stock_skips > 0  # the case overflows at all
    assert ours_skips <= stock_skips
    assert ours_dist <= stock_dist * 1.01 + 1e-7
    assert ours_updates == stock_updates == 48  # 2 epochs x 8 batches x 3 chunk steps


class Swap(pl.Callback):
    """Replaces the optimizer at epoch 1, as finetuning callbacks do (``trainer.optimizers = [...]``)."""

    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 1:
            trainer.optimizers = [torch.optim.SGD(module.parameters(), lr=0.05)]


class OneOpt(pl.LightningModule):
    def __init__(self, manual):
        super().__init__()
        pl.seed_everything(0)
        self.automatic_optimization = not manual
        self.net = torch.nn.Linear(6, 1)

    def training_step(self, batch, batch_idx):
        loss = self.net(batch[0]).float().pow(2).mean()
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


@pytest.mark.parametrize("manual", [True, False])
@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_an_optimizer_replaced_by_a_callback_trains_like_stock(manual, precision, tmp_path):
    """Issue 26 item 4: ``ValueError: SGD was not returned by configure_optimizers`` on 5d093d9."""
    stock, ours = OneOpt(manual), OneOpt(manual)
    fit(stock, amp(MixedPrecision, precision), max_epochs=2, callbacks=[Swap()], default_root_dir=tmp_path)
    trainer, _ = fit(
        ours, amp(ManualMixedPrecision, precision), max_epochs=2, callbacks=[Swap()], default_root_dir=tmp_path
    )
    assert isinstance(trainer.optimizers[0], torch.optim.SGD) and trainer.global_step == 16
    assert parameter_digest(ours) == parameter_digest(stock)
    assert not trainer.precision_plugin.step_was_skipped(trainer.optimizers[0])


def test_a_disabled_gradscaler_runs_like_stock():
    """Issue 26 item 3: ``AttributeError: 'GradScaler' object has no attribute '_scale'`` on 5d093d9."""
    stock, ours = Pair("alternate"), Pair("alternate")
    fit(stock, MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", enabled=False)))
    trainer, _ = fit(ours, ManualMixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", enabled=False)))
    assert parameter_digest(ours) == parameter_digest(stock)
    assert not trainer.precision_plugin.step_was_skipped(trainer.optimizers[0])


class _Recompute(torch.autograd.Function):
    """An ldm-style activation checkpoint (CompVis/latent-diffusion ``ldm/modules/diffusionmodules/util.py``,
    ``CheckpointFunction``): the forward runs under ``no_grad``; the backward recomputes it under
    ``enable_grad`` in whatever autocast state the backward runs in."""

    @staticmethod
    def forward(ctx, layer, x, *weights):
        ctx.layer = layer
        ctx.save_for_backward(x)
        with torch.no_grad():
            return layer(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(True)
        weights = tuple(ctx.layer.parameters())
        with torch.enable_grad():
            out = ctx.layer(x)
        grads = torch.autograd.grad(out, (x, *weights), grad)
        return (None, *grads)


class Checkpointed(pl.LightningModule):
    def __init__(self, recompute):
        super().__init__()
        pl.seed_everything(0)
        self.automatic_optimization = False
        self.first, self.second = torch.nn.Linear(6, 8), torch.nn.Linear(8, 1)
        self.recompute, self.grads = recompute, []

    def training_step(self, batch, batch_idx):
        h = self.first(batch[0])
        h = _Recompute.apply(self.second, h, *self.second.parameters()) if self.recompute else self.second(h)
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(h.float().pow(2).mean())
        self.grads.append(torch.cat([p.grad.flatten() for p in self.parameters()]))
        opt.step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_recompute_in_backward_gives_the_gradients_without_checkpoint(precision):
    """Issue 26 item 5: ``mat1 and mat2 must have the same dtype`` on 5d093d9, whose plugin ran
    ``manual_backward`` with autocast disabled; the backward now runs in training_step's region, as stock's."""
    plain, checkpointed, stock = Checkpointed(False), Checkpointed(True), Checkpointed(True)
    fit(plain, amp(ManualMixedPrecision, precision))
    fit(checkpointed, amp(ManualMixedPrecision, precision))
    fit(stock, amp(MixedPrecision, precision))
    for a, b, c in zip(plain.grads, checkpointed.grads, stock.grads, strict=True):
        assert torch.equal(a, b) and torch.equal(b, c)


class SkippedThenEmpty(pl.LightningModule):
    """Batch 0: an inf gradient (skipped step); batch 1: a loss that reaches no parameter (empty step);
    later batches: normal. A scheduler is stepped by ``step_skip_aware``."""

    def __init__(self):
        super().__init__()
        pl.seed_everything(0)
        self.automatic_optimization = False
        self.net = torch.nn.Linear(6, 1)
        self.rows = []

    def training_step(self, batch, batch_idx):
        from mpguide.steps import step_skip_aware

        opt, sched = self.optimizers(), self.lr_schedulers()
        opt.zero_grad()
        if batch_idx == 1:
            loss = batch[0].sum() * 0 + self.net(batch[0]).detach().sum()  # reaches no parameter
            loss.requires_grad_(True)
        else:
            loss = self.net(batch[0]).float().pow(2).mean()
        if batch_idx != 1:
            self.manual_backward(loss * (float("inf") if batch_idx == 0 else 1.0))
        applied = step_skip_aware(opt, self.trainer, sched)
        plugin = self.trainer.precision_plugin
        self.rows.append((plugin.step_was_skipped(opt), applied, sched.last_epoch))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]


def test_an_empty_step_after_a_skipped_one_is_not_reported_skipped():
    """Issue 26 item 6: on 5d093d9 the empty step after a skipped one reported (True, False) and the
    scheduler did not step; the docstrings promise (False, True)."""
    module = SkippedThenEmpty()
    fit(module, amp(ManualMixedPrecision), steps=3)
    assert module.rows == [(True, False, 0), (False, True, 1), (False, True, 2)]


def _words(text: str) -> str:
    return " ".join(text.replace("`", "").split()).lower()


def test_the_update_rule_is_stated_in_both_docstrings_and_the_guide():
    """The rule (mpguide._common.UPDATE_RULE) appears word for word where the plugins are offered."""
    from pathlib import Path

    from mpguide._common import UPDATE_RULE
    from mpguide.fabric import FabricManualMixedPrecision

    page = Path(__file__).resolve().parent.parent / "docs" / "model" / "manual_optimization.md"
    section = page.read_text().split("(plugin)=")[1].split("(throughput)=")[0]
    for where, text in [
        ("ManualMixedPrecision", ManualMixedPrecision.__doc__),
        ("FabricManualMixedPrecision", FabricManualMixedPrecision.__doc__),
        ("the guide's plugin section", section),
    ]:
        assert _words(UPDATE_RULE) in _words(text), where
    assert _words(UPDATE_RULE) not in _words(section.replace("(3) before", "(3) after"))  # the check can fail
