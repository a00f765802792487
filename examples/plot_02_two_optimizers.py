"""
Two optimizers under 16-mixed: "No inf checks were recorded for this optimizer"
===============================================================================

A GAN has two models and one optimizer each, and manual optimization alternates them. When one
optimizer is stepped although none of its parameters received a gradient, fp32 and bf16-mixed
silently do nothing, while 16-mixed crashes with ``AssertionError: No inf checks were recorded
for this optimizer`` (Lightning issues #20116 and #4524). This example reproduces both faces of
the bug on a small GAN for scikit-learn's digits and shows two fixes: correct user code, and the
library's :class:`~mpguide.precision.ManualMixedPrecision` plugin.

**Run it yourself**: download this example (``.py`` or ``.ipynb``, links at the bottom of its page)
and the helper library `mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_
into one folder, install PyTorch (CPU or CUDA build), then, in that folder::

    pip install mpguide-0.1.0-py3-none-any.whl lightning==2.6.6 scikit-learn==1.9.1 matplotlib==3.11.2
    python plot_02_two_optimizers.py

**What you will learn**

* why the GradScaler refuses an optimizer without gradients, and why fp32 hiding it is worse;
* the GAN step written so that each loss reaches its own model, with ``toggled_optimizer``;
* alternating with gradient accumulation (the generator steps every second batch), and when a loss-scale
  change inside the window mis-weights a micro-batch;
* the training step of Lightning issue #20116 as posted, one element changed at a time, and the fix
  to paste on stock Lightning (a three-line change with a ``has_gradients`` guard);
* a precision plugin that makes the empty step a warned no-op in every precision, without
  changing fp32 results by a single bit.
"""

# %%
# A small GAN on the digits
# -------------------------
# The generator maps 16 noise values to an 8x8 image; the discriminator scores images. Both
# train with Adam. Each ``training_step`` first steps the discriminator on real and generated
# images, then the generator through the discriminator's verdict. ``toggled_optimizer`` switches
# off ``requires_grad`` of every parameter that does not belong to the given optimizer, so each
# backward only reaches its own model.

import lightning.pytorch as pl
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from mpguide import steps
from mpguide.data import NUM_FEATURES
from mpguide.verify import plotting, report, runner

# sphinx_gallery_start_ignore
runner.quiet_lightning()
runner.check_settings("plot_02_two_optimizers")  # MPGUIDE_* settings, before anything trains or prints
# sphinx_gallery_end_ignore

LATENT = 16


class DigitsGAN(pl.LightningModule):
    """The healthy alternation: each loss reaches its own model."""

    def __init__(self, lr: float = 1e-3):
        super().__init__()
        self.automatic_optimization = False
        self.lr = lr
        self.generator = nn.Sequential(nn.Linear(LATENT, 128), nn.ReLU(), nn.Linear(128, NUM_FEATURES), nn.Sigmoid())
        self.discriminator = nn.Sequential(nn.Linear(NUM_FEATURES, 128), nn.LeakyReLU(0.2), nn.Linear(128, 1))

    def generate(self, n, batch_idx):
        gen = torch.Generator().manual_seed(10_000 * self.current_epoch + batch_idx)
        return self.generator(torch.randn(n, LATENT, generator=gen).to(self.device))

    def judge(self, images, is_real):
        logits = self.discriminator(images)
        return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, float(is_real)))

    def training_step(self, batch, batch_idx):
        real, _ = batch
        fake = self.generate(len(real), batch_idx)
        loss_d = self.discriminator_step(real, fake)
        loss_g = self.generator_step(fake, batch_idx)
        return (loss_d + loss_g).detach()

    def discriminator_step(self, real, fake):
        opt_d, _ = self.optimizers()
        with self.toggled_optimizer(opt_d):
            loss_d = self.judge(real, True) + self.judge(fake.detach(), False)
            opt_d.zero_grad()
            self.manual_backward(loss_d)
            opt_d.step()
        return loss_d

    def generator_step(self, fake, batch_idx):
        _, opt_g = self.optimizers()
        with self.toggled_optimizer(opt_g):
            loss_g = self.judge(fake, True)  # flows back through the discriminator into the generator
            opt_g.zero_grad()
            self.manual_backward(loss_g)
            opt_g.step()
        return loss_g

    def configure_optimizers(self):
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=self.lr, betas=(0.5, 0.999))
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=self.lr, betas=(0.5, 0.999))
        return opt_d, opt_g


# %%
# The bug as users write it
# -------------------------
# A common first version detaches the generated batch once, "to save memory", and reuses it
# for both losses, without toggling. The generator's loss then never reaches the generator: the
# backward fills only the discriminator's gradients, and ``opt_g.step()`` finds none of its own.


class DetachedOnce(DigitsGAN):
    def training_step(self, batch, batch_idx):
        real, _ = batch
        opt_d, opt_g = self.optimizers()
        fake = self.generate(len(real), batch_idx).detach()  # the bug: detached for both losses
        loss_d = self.judge(real, True) + self.judge(fake, False)
        opt_d.zero_grad()
        self.manual_backward(loss_d)
        opt_d.step()
        loss_g = self.judge(fake, True)
        opt_g.zero_grad()
        self.manual_backward(loss_g)  # reaches only the discriminator
        opt_g.step()  # no generator gradient: a no-op in fp32, an AssertionError under 16-mixed
        return (loss_d + loss_g).detach()


# %%
# Alternating every second batch, with accumulation
# -------------------------------------------------
# Here the generator accumulates its gradient over a window of two batches and steps at the end
# of the window, while the discriminator steps every batch. The loss is divided by the window
# size so the accumulated gradient is an average; ``zero_grad`` runs only after the step. Under
# Lightning's own 16-mixed this is correct only while the loss scale stays constant inside the
# generator's window: the discriminator's steps inside it can change the scale (next section).


class WindowedGAN(DigitsGAN):
    window = 2

    def generator_step(self, fake, batch_idx):
        _, opt_g = self.optimizers()
        with self.toggled_optimizer(opt_g):
            loss_g = self.judge(fake, True)
            self.manual_backward(loss_g / self.window)
            if (batch_idx + 1) % self.window == 0:
                opt_g.step()
                opt_g.zero_grad()
        return loss_g


# %%
# A loss-scale change inside the generator's window
# -------------------------------------------------
# With one optimizer the loss scale cannot change inside an accumulation window: it only changes
# in ``opt.step()``. Here two optimizers share the scaler, and the discriminator steps in every
# batch, *inside* the generator's window; Lightning updates the scale after each of those steps.
# To see what that does, this variant forces the discriminator's gradient to inf in the second
# batch of one generator window (batches 4 and 5 of the first epoch): its step is skipped and the
# scale halves before the generator's second micro-batch. The run records the factor by which
# each micro-batch's gradient enters the generator's update (1 = counted once; 2 when it was made at
# the old, doubled scale): a probe of the verification section below reads it from the gradients,
# the module only forces the overflow.


class WindowedWithOverflow(WindowedGAN):
    overflow_batch = 5  # second batch of the generator window over batches 4 and 5, first epoch

    def training_step(self, batch, batch_idx):
        self.force_overflow = self.current_epoch == 0 and batch_idx == self.overflow_batch
        return super().training_step(batch, batch_idx)

    def discriminator_step(self, real, fake):
        opt_d, _ = self.optimizers()
        with self.toggled_optimizer(opt_d):
            loss_d = self.judge(real, True) + self.judge(fake.detach(), False)
            opt_d.zero_grad()
            self.manual_backward(loss_d)
            if self.force_overflow:
                for p in self.discriminator.parameters():
                    p.grad.fill_(float("inf"))  # as if the discriminator's gradients overflowed fp16
            opt_d.step()
        return loss_d


# %%
# Lightning issue #20116, the reporter's ``training_step`` as posted
# ------------------------------------------------------------------
# The reporter of `Lightning issue #20116 <https://github.com/Lightning-AI/pytorch-lightning/issues/20116>`_
# (Lightning 2.3.3, ``16-mixed``) alternates two optimizers every ``N`` batches and accumulates inside
# each window: ``opt.zero_grad()`` at the top of every batch, ``with opt.toggle_model():`` around the
# loss and ``manual_backward``, and ``opt.step()`` on the window's last batch. "I can take steps with
# my first optimizer. When I take my first step with the second optimizer I get" the AssertionError.
# Their ``inner_training_step`` is not in the issue; here model 1 is the discriminator and model 2
# the generator of the GAN above, so each window's loss reaches its own model. Each class attribute
# switches one element of the posted code, for the measurements below. ``toggle_model`` exists in
# every Lightning 2.x release, unlike ``toggled_optimizer``.

from contextlib import nullcontext


def has_gradients(opt):
    """True when a parameter of ``opt`` holds a gradient, i.e. ``opt.step()`` would change something."""
    return any(p.grad is not None for group in opt.param_groups for p in group["params"])


class ReporterAlternation(DigitsGAN):
    """#20116's training_step as posted; optimizer 0 trains model 1 (the discriminator)."""

    n_batches_per_optimizer = 3
    toggle = True  # ``with opt.toggle_model():``
    detach_for_model_2 = False  # the mistake: model 2's loss computed from a detached batch
    guard = False  # the fix's guard: step only with gradients

    def inner_training_step(self, batch, batch_idx, compute_model_1_loss):
        real, _ = batch
        fake = self.generate(len(real), batch_idx)
        if compute_model_1_loss:
            return self.judge(real, True) + self.judge(fake.detach(), False)
        return self.judge(fake.detach() if self.detach_for_model_2 else fake, True)

    def training_step(self, batch, batch_idx):
        opts = self.optimizers()
        current_cycle = (batch_idx // self.n_batches_per_optimizer) % len(opts)
        opt = opts[current_cycle]
        opt.zero_grad()
        with opt.toggle_model() if self.toggle else nullcontext():
            loss = self.inner_training_step(batch, batch_idx, compute_model_1_loss=current_cycle == 0)
            self.manual_backward(loss)
            if (batch_idx + 1) % self.n_batches_per_optimizer == 0 and (not self.guard or has_gradients(opt)):
                opt.step()
        return loss.detach()


def variant(**changes):
    """The posted step with some elements changed (one ablation row)."""
    return type("ReporterVariant", (ReporterAlternation,), changes)


# %%
# The fix to paste on stock Lightning
# -----------------------------------
# Against the posted code, three lines change: ``zero_grad`` at the **start of each window** instead
# of every batch (so the window accumulates, and a window cut short by the end of an epoch is
# discarded), the loss divided by the window length (an average, as ``accumulate_grad_batches``
# does), and a guard that steps only an optimizer whose parameters hold gradients (GradScaler
# cannot step one without: that is the AssertionError; in fp32 the same step silently does nothing).
# The guard stops the crash, not the bug: a window whose loss reaches none of that model's parameters
# still leaves the model untrained, so the guard says so, naming the optimizer and the batch.

import warnings


class ReporterFixed(ReporterAlternation):
    def training_step(self, batch, batch_idx):
        n = self.n_batches_per_optimizer
        opts = self.optimizers()
        current_cycle = (batch_idx // n) % len(opts)
        opt = opts[current_cycle]
        if batch_idx % n == 0:
            opt.zero_grad()  # once per window, not every batch
        with opt.toggle_model():
            loss = self.inner_training_step(batch, batch_idx, compute_model_1_loss=current_cycle == 0)
            self.manual_backward(loss / n)
            if (batch_idx + 1) % n == 0:
                if has_gradients(opt):
                    opt.step()
                else:
                    # no crash, but this model does not train: say so
                    warnings.warn(f"optimizer {current_cycle} skipped at batch {batch_idx}: no gradients", stacklevel=2)
        return loss.detach()


class FixedUnreached(ReporterFixed):
    """The fix, with a model-2 loss that reaches no parameter of model 2, only a loss weight no optimizer holds."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.loss_weight = nn.Parameter(torch.ones(1))  # in no optimizer: toggle_model leaves it trainable

    def inner_training_step(self, batch, batch_idx, compute_model_1_loss):
        if compute_model_1_loss:
            return super().inner_training_step(batch, batch_idx, True)
        fake = self.generate(len(batch[0]), batch_idx).detach()  # the mistake: model 2 is cut off
        return (self.loss_weight * self.judge(fake, True)).squeeze()


class OverlappingWindows(DigitsGAN):
    """Example 02's other pattern, with ``toggle_model``: the discriminator steps every batch, inside
    the generator's window of two batches."""

    window = 2

    def training_step(self, batch, batch_idx):
        real, _ = batch
        opt_d, opt_g = self.optimizers()
        fake = self.generate(len(real), batch_idx)
        with opt_d.toggle_model():
            loss_d = self.judge(real, True) + self.judge(fake.detach(), False)
            opt_d.zero_grad()
            self.manual_backward(loss_d)
            opt_d.step()
        with opt_g.toggle_model():
            loss_g = self.judge(fake, True)
            self.manual_backward(loss_g / self.window)
            if (batch_idx + 1) % self.window == 0:
                opt_g.step()
                opt_g.zero_grad()
        return (loss_d + loss_g).detach()


class OftenChangingScale:
    """Mixed into a recipe: the GradScaler changes its scale at every step (``growth_interval=1``)."""

    def on_fit_start(self):
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            scaler.set_growth_interval(1)


# %%
# How this page is verified
# -------------------------
# The buggy code runs in every precision with Lightning's own precision handling, and again
# with ``plugins=[ManualMixedPrecision(precision, device)]``. What the page promises:
#
# * 16-mixed raises the AssertionError; fp32 and bf16-mixed complete **with an unchanged
#   generator** (the silent version of the same bug);
# * with the plugin, 16-mixed completes, warns once naming the optimizer, and follows the fp32
#   curve; fp32 and bf16-mixed with the plugin end with **bitwise identical** weights to the runs
#   without it;
# * the healthy alternation (every batch, and every second batch with accumulation) trains the
#   generator and its mixed-precision curves follow fp32 (in these runs the scale never moved
#   inside a generator window);
# * #20116's step as posted trains under 16-mixed; only a model-2 loss that reaches none of model
#   2's parameters raises, and then only without ``toggle_model``; the fix and the plugin complete;
# * one optimizer per window keeps the scale constant inside every window even when the scale
#   changes at every step; a discriminator stepping inside the generator's window does not.
#
# The measurements come from probes, Lightning callbacks that the modules above never see: whether
# the generator changed and a digest of all weights; for the forced overflow, the weight of each
# generator micro-batch in the generator's unscaled gradient (least squares over what each
# generator backward added, divided by its loss scale: a plugin's rescaling of held gradients
# shows, its absence too); for
# #20116's windows, at every optimizer step, how many of the window's micro-batches the gradient
# still holds, and the loss scale each of them was made at relative to the scale the step unscales
# with (1 = counted once; 2 or 0.5 after a scale change in between).

import functools

from lightning.pytorch.callbacks import Callback

from mpguide.verify.probes import parameter_digest


class GeneratorAndWeights(Callback):
    def setup(self, trainer, pl_module, stage):
        self.module, self.initial_generator = pl_module, parameter_digest(pl_module.generator)

    def record_extra(self):
        return {
            "generator_changed": parameter_digest(self.module.generator) != self.initial_generator,
            "weights": parameter_digest(self.module),
        }


class WindowFactors(Callback):
    """How much each generator micro-batch of a window weighs in the step, read from the gradients.

    A hook on the generator's parameters keeps what each generator backward added, divided by the loss
    scale of that backward (the micro-batch's true gradient). At the generator's step the unscaled
    gradient is solved, by least squares, as a weighted sum of those: weight 1 = counted once, 2 or 0.5
    after a scale change. It sees a plugin's rescaling of held gradients as well as its absence.
    """

    def __init__(self):
        self.window_factors = []  # per window: the weight of each generator micro-batch in the step
        self.pieces = []  # per generator backward of the current window: (loss scale, {param: gradient})

    def setup(self, trainer, pl_module, stage):
        self.module, self.trainer = pl_module, trainer
        for param in pl_module.generator.parameters():
            param.register_hook(functools.partial(self.keep, param))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.backwards = 0

    def on_before_backward(self, trainer, pl_module, loss):
        self.backwards += 1
        if self.backwards == 2:  # the discriminator's backward comes first, then the generator's
            self.pieces.append((steps.loss_scale(trainer) or 1.0, {}))

    def keep(self, param, grad):
        if self.backwards == 2 and self.pieces:
            self.pieces[-1][1][param] = grad.detach().double().clone()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if optimizer is trainer.optimizers[1]:  # the generator's step, its gradients unscaled
            params = list(self.module.generator.parameters())
            total = torch.cat([p.grad.detach().double().flatten() for p in params])
            parts = torch.stack(
                [torch.cat([got[p].flatten() / scale for p in params]) for scale, got in self.pieces], dim=1
            )
            weights = torch.linalg.lstsq(parts, total.unsqueeze(1)).solution.flatten()
            self.window_factors.append([round(float(w), 3) for w in weights])
            self.pieces = []

    def record_extra(self):
        window, overflow_batch = self.module.window, self.module.overflow_batch
        forced = self.window_factors[overflow_batch // window]
        others = [f for i, f in enumerate(self.window_factors) if i != overflow_batch // window]
        return {
            "forced_window_factors": forced,
            "other_windows_constant": all(f == [1.0] * window for f in others),
        }


def flat_grad(opt):
    return torch.cat(
        [
            (torch.zeros_like(p) if p.grad is None else p.grad).detach().flatten().float()
            for group in opt.param_groups
            for p in group["params"]
        ]
    )


class MicroBatches(Callback):
    def __init__(self):
        self.added = {}  # optimizer -> [(gradient one backward added, loss scale of that backward)]
        self.windows = []  # per step: (micro-batches kept, micro-batches since the last step, scale factors)

    def on_before_backward(self, trainer, pl_module, loss):
        self.before = [flat_grad(opt) for opt in trainer.optimizers]

    def on_after_backward(self, trainer, pl_module):
        scale = steps.loss_scale(trainer) or 1.0
        for opt, old in zip(trainer.optimizers, self.before, strict=True):
            added = flat_grad(opt) - old
            if bool(added.abs().max() > 0):
                self.added.setdefault(id(opt), []).append((added, scale))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        added = self.added.pop(id(optimizer), [])
        scale = steps.loss_scale(trainer) or 1.0
        grad = flat_grad(optimizer) * scale  # unscaled by now: back to the backward's scale
        kept = next(
            (
                k
                for k in range(len(added), 0, -1)
                if torch.allclose(grad, sum(a for a, _ in added[-k:]), rtol=1e-4, atol=1e-6 * scale)
            ),
            0,
        )
        self.windows.append((kept, len(added), [s / scale for _, s in added[len(added) - kept :]]))

    def record_extra(self):
        return {
            "micro_batches_kept": sorted({k for k, n, _ in self.windows if n}),
            "micro_batches_per_window": sorted({n for _, n, _ in self.windows}),
            "windows_with_scale_change": sum(any(f != 1.0 for f in fs) for _, _, fs in self.windows),
            "scale_changed_inside_a_window": any(f != 1.0 for _, _, fs in self.windows for f in fs),
            "optimizer_steps": len(self.windows),
        }


recipes = {
    "healthy": DigitsGAN,
    "detached once": DetachedOnce,
    "windowed": WindowedGAN,
    "windowed, D overflow": WindowedWithOverflow,
    "#20116 as posted": ReporterAlternation,
    "#20116, N=1": variant(n_batches_per_optimizer=1),
    "#20116, no toggle_model": variant(toggle=False),
    "#20116, model 2 loss detached": variant(toggle=False, detach_for_model_2=True),
    "#20116, model 2 loss detached, toggle_model": variant(detach_for_model_2=True),
    "#20116, model 2 loss detached, guard": variant(toggle=False, detach_for_model_2=True, guard=True),
    "#20116 fixed": ReporterFixed,
    "#20116 fixed, model 2's loss reaches none of it": FixedUnreached,
    "#20116 fixed, growth_interval=1": type("FixedGrowth", (OftenChangingScale, ReporterFixed), {}),
    "overlapping windows, growth_interval=1": type("OverlapGrowth", (OftenChangingScale, OverlappingWindows), {}),
}
probes = {
    name: [GeneratorAndWeights]
    + ([WindowFactors] if name == "windowed, D overflow" else [])
    + ([MicroBatches] if name.startswith(("#20116", "overlapping")) else [])
    for name in recipes
}
RUNS = [
    # run id            recipe            precision     options
    ("healthy-fp32", "healthy", "32-true", {"label": "healthy, 32-true"}),
    ("healthy-bf16", "healthy", "bf16-mixed", {"label": "healthy, bf16-mixed"}),
    ("healthy-fp16", "healthy", "16-mixed", {"label": "healthy, 16-mixed"}),
    ("window-fp32", "windowed", "32-true", {"label": "every 2nd batch, 32-true"}),
    ("window-fp16", "windowed", "16-mixed", {"label": "every 2nd batch, 16-mixed"}),
    ("bug-fp32", "detached once", "32-true", {"label": "bug, 32-true"}),
    ("bug-bf16", "detached once", "bf16-mixed", {"label": "bug, bf16-mixed"}),
    ("bug-fp16", "detached once", "16-mixed", {"label": "bug, 16-mixed"}),
    (
        "bug-fp32-plugin",
        "detached once",
        "32-true",
        {"plugin": "ManualMixedPrecision", "label": "bug + plugin, 32-true"},
    ),
    (
        "bug-bf16-plugin",
        "detached once",
        "bf16-mixed",
        {"plugin": "ManualMixedPrecision", "label": "bug + plugin, bf16-mixed"},
    ),
    (
        "bug-fp16-plugin",
        "detached once",
        "16-mixed",
        {"plugin": "ManualMixedPrecision", "label": "bug + plugin, 16-mixed"},
    ),
    (
        "window-fp16-overflow",
        "windowed, D overflow",
        "16-mixed",
        {"label": "every 2nd batch, D overflow in window 2, 16-mixed"},
    ),
    (
        "window-fp16-overflow-plugin",
        "windowed, D overflow",
        "16-mixed",
        {"plugin": "ManualMixedPrecision", "label": "same + ManualMixedPrecision, 16-mixed"},
    ),
    # Lightning issue #20116: the posted step (N=3), one element changed per row, then the fix
    ("rep-fp32", "#20116 as posted", "32-true", {"label": "#20116 as posted, 32-true"}),
    ("rep-fp16", "#20116 as posted", "16-mixed", {"label": "#20116 as posted, 16-mixed"}),
    ("rep-n1-fp16", "#20116, N=1", "16-mixed", {"label": "#20116, N=1 (no accumulation), 16-mixed"}),
    ("rep-notoggle-fp16", "#20116, no toggle_model", "16-mixed", {"label": "#20116 without toggle_model, 16-mixed"}),
    (
        "unreached-fp32",
        "#20116, model 2 loss detached",
        "32-true",
        {"label": "#20116, model 2's loss detached, 32-true"},
    ),
    (
        "unreached-fp16",
        "#20116, model 2 loss detached",
        "16-mixed",
        {"label": "#20116, model 2's loss detached, 16-mixed"},
    ),
    (
        "unreached-toggle-fp32",
        "#20116, model 2 loss detached, toggle_model",
        "32-true",
        {"label": "same with toggle_model, 32-true"},
    ),
    (
        "unreached-toggle-fp16",
        "#20116, model 2 loss detached, toggle_model",
        "16-mixed",
        {"label": "same with toggle_model, 16-mixed"},
    ),
    (
        "unreached-guard-fp16",
        "#20116, model 2 loss detached, guard",
        "16-mixed",
        {"label": "model 2's loss detached + has_gradients guard, 16-mixed"},
    ),
    (
        "unreached-fp16-plugin",
        "#20116, model 2 loss detached",
        "16-mixed",
        {"plugin": "ManualMixedPrecision", "label": "model 2's loss detached + ManualMixedPrecision, 16-mixed"},
    ),
    ("fixed-fp32", "#20116 fixed", "32-true", {"label": "#20116 fixed, 32-true"}),
    ("fixed-fp16", "#20116 fixed", "16-mixed", {"label": "#20116 fixed, 16-mixed"}),
    (
        "fixed-unreached-fp16",
        "#20116 fixed, model 2's loss reaches none of it",
        "16-mixed",
        {"label": "#20116 fixed, model 2's loss misses it, 16-mixed"},
    ),
    (
        "fixed-fp16-growth",
        "#20116 fixed, growth_interval=1",
        "16-mixed",
        {"label": "#20116 fixed, scale changes every step, 16-mixed"},
    ),
    (
        "overlap-fp16-growth",
        "overlapping windows, growth_interval=1",
        "16-mixed",
        {"label": "D inside G's window, scale changes every step, 16-mixed"},
    ),
]
CLAIMS = [
    (
        "raises",
        "bug-fp16",
        "AssertionError",
        "No inf checks were recorded for this optimizer",
        "the bug crashes under 16-mixed",
    ),
    ("expect", "bug-fp32", "generator_changed", False, "the bug is silent in fp32: generator never changes"),
    ("expect", "bug-bf16", "generator_changed", False, "the bug is silent in bf16-mixed too"),
    ("expect", "healthy-fp32", "generator_changed", True, "the healthy GAN trains its generator"),
    ("match", "healthy-bf16", "healthy-fp32", "mixed-vs-fp32", "healthy: bf16-mixed = fp32"),
    ("match", "healthy-fp16", "healthy-fp32", "mixed-vs-fp32", "healthy: 16-mixed = fp32"),
    ("match", "window-fp16", "window-fp32", "mixed-vs-fp32", "every 2nd batch: 16-mixed = fp32"),
    ("match", "bug-fp16-plugin", "bug-fp32", "mixed-vs-fp32", "plugin: 16-mixed completes and = fp32"),
    ("expect", "bug-fp16-plugin", "generator_changed", False, "plugin: the empty step is a no-op"),
    (
        "warns",
        "bug-fp16-plugin",
        "NoGradientStepWarning",
        "was stepped but none of its parameters has a gradient",
        "plugin warns under 16-mixed",
    ),
    (
        "warns",
        "bug-fp32-plugin",
        "NoGradientStepWarning",
        "was stepped but none of its parameters has a gradient",
        "plugin warns in fp32 as well",
    ),
    ("same", "bug-fp32-plugin", "bug-fp32", "weights", "plugin leaves fp32 bitwise unchanged"),
    ("same", "bug-bf16-plugin", "bug-bf16", "weights", "plugin leaves bf16-mixed bitwise unchanged"),
    (
        "expect",
        "window-fp16-overflow",
        "forced_window_factors",
        [2.0, 1.0],
        "two optimizers: a D overflow inside G's window doubles G's first micro-batch",
    ),
    (
        "expect",
        "window-fp16-overflow",
        "other_windows_constant",
        True,
        "without an overflow the scale is constant inside G's windows",
    ),
    (
        "expect",
        "window-fp16-overflow-plugin",
        "forced_window_factors",
        [1.0, 1.0],
        "plugin: G's held micro-batch is brought to the new scale, both count once",
    ),
    (
        "expect",
        "rep-fp16",
        "generator_changed",
        True,
        "#20116 as posted trains both models under 16-mixed (no AssertionError here)",
    ),
    ("match", "rep-fp16", "rep-fp32", "mixed-vs-fp32", "#20116 as posted: 16-mixed = fp32"),
    (
        "expect",
        "rep-fp32",
        "micro_batches_kept",
        [1],
        "#20116 as posted: zero_grad() at the top leaves only the window's last micro-batch in each step",
    ),
    ("expect", "rep-n1-fp16", "generator_changed", True, "#20116 with N=1 trains under 16-mixed"),
    ("expect", "rep-notoggle-fp16", "generator_changed", True, "#20116 without toggle_model trains under 16-mixed"),
    (
        "raises",
        "unreached-fp16",
        "AssertionError",
        "No inf checks were recorded for this optimizer",
        "model 2's loss reaches none of its parameters: 16-mixed raises at model 2's first step",
    ),
    ("expect", "unreached-fp32", "generator_changed", False, "the same code in fp32: no error, model 2 never changes"),
    (
        "raises",
        "unreached-toggle-fp32",
        "RuntimeError",
        "does not require grad",
        "with toggle_model the same mistake stops in backward instead (fp32)",
    ),
    (
        "raises",
        "unreached-toggle-fp16",
        "RuntimeError",
        "does not require grad",
        "with toggle_model the same mistake stops in backward instead (16-mixed)",
    ),
    (
        "match",
        "unreached-guard-fp16",
        "unreached-fp32",
        "mixed-vs-fp32",
        "has_gradients guard: 16-mixed completes and = fp32",
    ),
    ("expect", "unreached-guard-fp16", "generator_changed", False, "has_gradients guard: the empty step is skipped"),
    (
        "warns",
        "fixed-unreached-fp16",
        "UserWarning",
        "optimizer 1 skipped at batch 5",
        "the fix, model 2's loss missing it: the skip is visible (a warning naming optimizer and batch)",
    ),
    ("expect", "fixed-unreached-fp16", "generator_changed", False, "the fix, model 2's loss missing it: G frozen"),
    ("no_warning", "fixed-fp16", "skipped at batch", "the fix on #20116's own step: no skip, no warning"),
    (
        "warns",
        "unreached-fp16-plugin",
        "NoGradientStepWarning",
        "was stepped but none of its parameters has a gradient",
        "plugin: the same code completes under 16-mixed and warns",
    ),
    ("match", "unreached-fp16-plugin", "unreached-fp32", "mixed-vs-fp32", "plugin: 16-mixed = fp32"),
    ("expect", "fixed-fp32", "micro_batches_kept", [3], "the fix: each step holds all 3 micro-batches of its window"),
    ("expect", "fixed-fp16", "generator_changed", True, "the fix trains both models under 16-mixed"),
    ("match", "fixed-fp16", "fixed-fp32", "mixed-vs-fp32", "the fix: 16-mixed = fp32"),
    (
        "expect",
        "fixed-fp16-growth",
        "scale_changed_inside_a_window",
        False,
        "one optimizer per window: the scale never changes inside a window, even when it changes every step",
    ),
    (
        "expect",
        "overlap-fp16-growth",
        "scale_changed_inside_a_window",
        True,
        "D stepping inside G's window: a scale change lands inside G's windows",
    ),
    # PitfallChecks on every run (runner.with_checks): each buggy run flags its section, each correct run is clean
    ("clean", "healthy-fp32", "PitfallChecks: healthy-fp32 has no finding"),
    ("clean", "healthy-bf16", "PitfallChecks: healthy-bf16 has no finding"),
    ("clean", "healthy-fp16", "PitfallChecks: healthy-fp16 has no finding"),
    ("clean", "window-fp32", "PitfallChecks: window-fp32 has no finding"),
    ("clean", "window-fp16", "PitfallChecks: window-fp16 has no finding"),
    ("clean", "window-fp16-overflow-plugin", "PitfallChecks: window-fp16-overflow-plugin has no finding"),
    ("clean", "rep-n1-fp16", "PitfallChecks: rep-n1-fp16 has no finding"),
    ("clean", "fixed-fp32", "PitfallChecks: fixed-fp32 has no finding"),
    ("clean", "fixed-fp16", "PitfallChecks: fixed-fp16 has no finding"),
    ("clean", "fixed-fp16-growth", "PitfallChecks: fixed-fp16-growth has no finding"),
    ("flags", "bug-fp32", "no-gradient-step", "PitfallChecks flags bug-fp32: no-gradient-step"),
    ("flags", "bug-bf16", "no-gradient-step", "PitfallChecks flags bug-bf16: no-gradient-step"),
    ("flags", "bug-fp16", "no-gradient-step", "PitfallChecks flags bug-fp16: no-gradient-step"),
    ("flags", "bug-fp32-plugin", "no-gradient-step", "PitfallChecks flags bug-fp32-plugin: no-gradient-step"),
    ("flags", "bug-bf16-plugin", "no-gradient-step", "PitfallChecks flags bug-bf16-plugin: no-gradient-step"),
    ("flags", "bug-fp16-plugin", "no-gradient-step", "PitfallChecks flags bug-fp16-plugin: no-gradient-step"),
    ("flags", "unreached-fp32", "no-gradient-step", "PitfallChecks flags unreached-fp32: no-gradient-step"),
    ("flags", "unreached-fp16", "no-gradient-step", "PitfallChecks flags unreached-fp16: no-gradient-step"),
    (
        "flags",
        "unreached-fp16-plugin",
        "no-gradient-step",
        "PitfallChecks flags unreached-fp16-plugin: no-gradient-step",
    ),
    ("flags", "window-fp16-overflow", "scale-changes", "PitfallChecks flags window-fp16-overflow: scale-changes"),
    ("flags", "overlap-fp16-growth", "scale-changes", "PitfallChecks flags overlap-fp16-growth: scale-changes"),
    ("flags", "rep-fp32", "accumulation", "PitfallChecks flags rep-fp32: accumulation"),
    ("flags", "rep-fp16", "accumulation", "PitfallChecks flags rep-fp16: accumulation"),
    ("flags", "rep-notoggle-fp16", "accumulation", "PitfallChecks flags rep-notoggle-fp16: accumulation"),
    ("flags", "unreached-toggle-fp32", "accumulation", "PitfallChecks flags unreached-toggle-fp32: accumulation"),
    ("flags", "unreached-toggle-fp16", "accumulation", "PitfallChecks flags unreached-toggle-fp16: accumulation"),
    ("flags", "unreached-guard-fp16", "accumulation", "PitfallChecks flags unreached-guard-fp16: accumulation"),
    (
        "flags",
        "fixed-unreached-fp16",
        "no-gradient-step",
        "PitfallChecks flags fixed-unreached-fp16: the guard skipped every step of model 2",
    ),
]

# %%
# Train
# -----

record = runner.run_example("plot_02_two_optimizers", recipes, RUNS, CLAIMS, probes=runner.with_checks(recipes, probes))
runner.print_findings(record)  # what PitfallChecks told each run (mpguide.checks)

# %%
# The captured error
# ------------------
# The 16-mixed run of the buggy code stops at its first generator step. GradScaler keeps, per
# optimizer, whether ``unscale_`` found inf/NaN in that optimizer's gradients; with no gradient
# at all there is nothing to check, and ``GradScaler.step`` refuses to decide whether to skip.

print(report.expected_error(record, "bug-fp16"))

# %%
# Curves
# ------
# Left: the healthy alternation in three precisions, and every second batch with accumulation.
# Right: the buggy code. fp32 and bf16-mixed "train" (the discriminator learns to reject a
# generator that never moves); with the plugin, 16-mixed does the same instead of crashing.

fig, (left, right) = plotting.figure(1, 2, 11, 5.2)  # own y axes: the bug's scale would flatten the healthy runs
plotting.describe(fig, "The healthy GAN trains in every precision; the buggy one never moves its generator")
plotting.plot_loss_curves(
    left,
    record,
    ["healthy-fp32", "healthy-bf16", "healthy-fp16", "window-fp32", "window-fp16"],
    "Healthy alternation (D + G loss)",
    {"window-fp32": "#CC79A7", "window-fp16": "#D55E00"},
)
plotting.plot_loss_curves(
    right,
    record,
    ["bug-fp32", "bug-bf16", "bug-fp16", "bug-fp16-plugin"],
    "Generator loss never reaches the generator",
    {"bug-fp16-plugin": "#D55E00"},
)
plotting.save_figure(fig, record["example"], "curves")
plt.show()

# %%
# What the scale change did to the generator's window
# ---------------------------------------------------
# Factor per generator micro-batch in the window with the forced overflow: with Lightning's
# plugin the first micro-batch was scaled at the old scale and unscaled at the halved one, so its
# gradient counts twice in that update. ``ManualMixedPrecision`` lowers the scale before the next
# backward too (as the stock plugin does), but first brings the generator's held micro-batch to the
# new scale, so both micro-batches count once.

for run_id in ("window-fp16-overflow", "window-fp16-overflow-plugin"):
    run = plotting.run_by_id(record, run_id)
    print(f"{run['label']:<55} factors {run['extra']['forced_window_factors']}")

# %%
# #20116: which element does what
# -------------------------------
# One row per run of the reporter's step: whether it raised, whether model 2 (the generator)
# changed, how many micro-batches each applied step held, and how many steps unscaled a micro-batch
# with another scale than it was made at.

for run_id in (
    "rep-fp32",
    "rep-fp16",
    "rep-n1-fp16",
    "rep-notoggle-fp16",
    "unreached-fp32",
    "unreached-fp16",
    "unreached-toggle-fp16",
    "unreached-guard-fp16",
    "unreached-fp16-plugin",
    "fixed-fp32",
    "fixed-fp16",
    "fixed-fp16-growth",
    "overlap-fp16-growth",
):
    run = plotting.run_by_id(record, run_id)
    extra = run["extra"]
    outcome = f"raised {run['error']['type']}" if run["error"] else "trained"
    print(
        f"{run['label']:<58} {outcome:<22} model 2 changed: {str(extra.get('generator_changed')):<5} "
        f"micro-batches per step: {extra.get('micro_batches_kept')}  "
        f"steps with a scale change inside: {extra.get('windows_with_scale_change')}"
    )

# %%
# Verdicts
# --------

print(report.summary(record))

# %%
# The ``Trainer`` call to copy
# ----------------------------
# The first fix is the healthy ``DigitsGAN`` itself: every optimizer it steps has gradients, so
# Lightning's own 16-mixed trains it. On a GPU ``precision="16-mixed"`` is enough; on a CPU that flag
# silently becomes bf16-mixed, so the plugin is passed explicitly. On Lightning 2.5.0 and older,
# which lack ``toggled_optimizer``, write ``toggle_optimizer`` and ``untoggle_optimizer`` instead.

from lightning.pytorch.plugins.precision import MixedPrecision

from mpguide.data import digits_loader

device = "cuda" if torch.cuda.is_available() else "cpu"
pl.seed_everything(0)
model = DigitsGAN()
generator_before = model.generator[0].weight.detach().clone()
trainer = pl.Trainer(
    accelerator=device,
    devices=1,
    max_steps=40,
    plugins=[MixedPrecision("16-mixed", device)],
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(model, digits_loader(batch_size=64))
print(
    f"optimizer steps (two per batch): {trainer.global_step}, "
    f"generator changed: {not torch.equal(generator_before, model.generator[0].weight)}"
)

# %%
# Conclusion
# ----------
# Under 16-mixed, step only optimizers whose parameters got a gradient in this iteration: make
# each loss reach its own model (``toggled_optimizer`` or ``toggle_model``, no shared ``detach``),
# and guard different step frequencies so that a step always follows its own backward
# (``has_gradients`` above). For #20116's alternation: zero the gradients once per window, not every
# batch, or only the window's last micro-batch reaches the step. Windows in which only one optimizer
# backpropagates and steps are safe under Lightning's own 16-mixed; a window inside which another
# optimizer steps is mis-weighted at every scale change that lands in it. If you want the
# fp32 behaviour back (and a warning in every precision, where fp32 used to stay silent), pass
# ``plugins=[ManualMixedPrecision("16-mixed", "cuda")]``. When your models train well in bf16,
# bf16-mixed has no GradScaler and none of these rules.
