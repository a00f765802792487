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
* alternating with gradient accumulation (the generator steps every second batch);
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

from mpguide.verify import plotting, report, runner
from mpguide import steps
from mpguide.data import NUM_FEATURES

# sphinx_gallery_start_ignore
runner.quiet_lightning()
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
        self.initial_generator = runner.parameter_digest(self.generator)

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

    def record_extra(self):
        return {"generator_changed": runner.parameter_digest(self.generator) != self.initial_generator,
                "weights": runner.parameter_digest(self)}


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
# size so the accumulated gradient is an average; ``zero_grad`` runs only after the step.


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
# scale halves before the generator's second micro-batch. The run records the scale of each
# generator backward and the scale the generator's step unscales with; their ratio is the factor
# by which each micro-batch's gradient enters the update (1 when the scale did not move).


class WindowedWithOverflow(WindowedGAN):
    overflow_batch = 5  # second batch of the generator window over batches 4 and 5, first epoch

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.g_backward_scales = []  # scale of each generator micro-batch in the current window
        self.window_factors = []  # per window: backward scale / scale at the generator's step

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

    def generator_step(self, fake, batch_idx):
        self.g_backward_scales.append(steps.loss_scale(self.trainer))
        _, opt_g = self.optimizers()
        with self.toggled_optimizer(opt_g):
            loss_g = self.judge(fake, True)
            self.manual_backward(loss_g / self.window)
            if (batch_idx + 1) % self.window == 0:
                at_step = steps.loss_scale(self.trainer)
                self.window_factors.append([s / at_step for s in self.g_backward_scales])
                self.g_backward_scales = []
                opt_g.step()
                opt_g.zero_grad()
        return loss_g

    def record_extra(self):
        forced = self.window_factors[self.overflow_batch // self.window]
        others = [f for i, f in enumerate(self.window_factors) if i != self.overflow_batch // self.window]
        return {**super().record_extra(), "forced_window_factors": forced,
                "other_windows_constant": all(f == [1.0] * self.window for f in others)}


# %%
# Runs and claims
# ---------------
# The buggy code runs in every precision with Lightning's own precision handling, and again
# with ``plugins=[ManualMixedPrecision(precision, device)]``. What the page promises:
#
# * 16-mixed raises the AssertionError; fp32 and bf16-mixed complete **with an unchanged
#   generator** (the silent version of the same bug);
# * with the plugin, 16-mixed completes, warns once naming the optimizer, and follows the fp32
#   curve; fp32 and bf16-mixed with the plugin end with **bitwise identical** weights to the runs
#   without it;
# * the healthy alternation (every batch, and every second batch with accumulation) trains the
#   generator and its mixed-precision curves follow fp32.

recipes = {"healthy": DigitsGAN, "detached once": DetachedOnce, "windowed": WindowedGAN,
           "windowed, D overflow": WindowedWithOverflow}
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
    ("bug-fp32-plugin", "detached once", "32-true", {"plugin": "ManualMixedPrecision", "label": "bug + plugin, 32-true"}),
    ("bug-bf16-plugin", "detached once", "bf16-mixed",
     {"plugin": "ManualMixedPrecision", "label": "bug + plugin, bf16-mixed"}),
    ("bug-fp16-plugin", "detached once", "16-mixed", {"plugin": "ManualMixedPrecision", "label": "bug + plugin, 16-mixed"}),
    ("window-fp16-overflow", "windowed, D overflow", "16-mixed",
     {"label": "every 2nd batch, D overflow in window 2, 16-mixed"}),
    ("window-fp16-overflow-plugin", "windowed, D overflow", "16-mixed",
     {"plugin": "ManualMixedPrecision", "label": "same + ManualMixedPrecision, 16-mixed"}),
]
CLAIMS = [
    ("raises", "bug-fp16", "AssertionError", "No inf checks were recorded for this optimizer",
     "the bug crashes under 16-mixed"),
    ("expect", "bug-fp32", "generator_changed", False, "the bug is silent in fp32: generator never changes"),
    ("expect", "bug-bf16", "generator_changed", False, "the bug is silent in bf16-mixed too"),
    ("expect", "healthy-fp32", "generator_changed", True, "the healthy GAN trains its generator"),
    ("match", "healthy-bf16", "healthy-fp32", "mixed-vs-fp32", "healthy: bf16-mixed = fp32"),
    ("match", "healthy-fp16", "healthy-fp32", "mixed-vs-fp32", "healthy: 16-mixed = fp32"),
    ("match", "window-fp16", "window-fp32", "mixed-vs-fp32", "every 2nd batch: 16-mixed = fp32"),
    ("match", "bug-fp16-plugin", "bug-fp32", "mixed-vs-fp32", "plugin: 16-mixed completes and = fp32"),
    ("expect", "bug-fp16-plugin", "generator_changed", False, "plugin: the empty step is a no-op"),
    ("warns", "bug-fp16-plugin", "NoGradientStepWarning", "was stepped but none of its parameters has a gradient",
     "plugin warns under 16-mixed"),
    ("warns", "bug-fp32-plugin", "NoGradientStepWarning", "was stepped but none of its parameters has a gradient",
     "plugin warns in fp32 as well"),
    ("same", "bug-fp32-plugin", "bug-fp32", "weights", "plugin leaves fp32 bitwise unchanged"),
    ("same", "bug-bf16-plugin", "bug-bf16", "weights", "plugin leaves bf16-mixed bitwise unchanged"),
    ("expect", "window-fp16-overflow", "forced_window_factors", [2.0, 1.0],
     "two optimizers: a D overflow inside G's window doubles G's first micro-batch"),
    ("expect", "window-fp16-overflow", "other_windows_constant", True,
     "without an overflow the scale is constant inside G's windows"),
    ("expect", "window-fp16-overflow-plugin", "forced_window_factors", [1.0, 1.0],
     "plugin: the scale update waits for G's step, both micro-batches count once"),
]

# %%
# Train
# -----

record = runner.run_example("plot_02_two_optimizers", recipes, RUNS, CLAIMS)

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
plotting.plot_loss_curves(left, record, ["healthy-fp32", "healthy-bf16", "healthy-fp16", "window-fp32",
                                         "window-fp16"], "Healthy alternation (D + G loss)",
                          {"window-fp32": "#CC79A7", "window-fp16": "#D55E00"})
plotting.plot_loss_curves(right, record, ["bug-fp32", "bug-bf16", "bug-fp16", "bug-fp16-plugin"],
                          "Generator loss never reaches the generator", {"bug-fp16-plugin": "#D55E00"})
plotting.save_figure(fig, record["example"], "curves")
plt.show()

# %%
# What the scale change did to the generator's window
# ---------------------------------------------------
# Factor per generator micro-batch in the window with the forced overflow: with Lightning's
# plugin the first micro-batch was scaled at the old scale and unscaled at the halved one, so its
# gradient counts twice in that update. ``ManualMixedPrecision`` defers the scale update until the
# generator, which holds gradients of the current scale, has stepped.

for run_id in ("window-fp16-overflow", "window-fp16-overflow-plugin"):
    run = plotting.run_by_id(record, run_id)
    print(f"{run['label']:<55} factors {run['extra']['forced_window_factors']}")

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
trainer = pl.Trainer(accelerator=device, devices=1, max_steps=40,
                     plugins=[MixedPrecision("16-mixed", device)], logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, digits_loader(batch_size=64))
print(f"optimizer steps (two per batch): {trainer.global_step}, "
      f"generator changed: {not torch.equal(generator_before, model.generator[0].weight)}")

# %%
# Conclusion
# ----------
# Under 16-mixed, step only optimizers whose parameters got a gradient in this iteration: make
# each loss reach its own model (``toggled_optimizer``, no shared ``detach``), and guard
# different step frequencies so that a step always follows its own backward. If you want the
# fp32 behaviour back (and a warning in every precision, where fp32 used to stay silent), pass
# ``plugins=[ManualMixedPrecision("16-mixed", "cuda")]``. When your models train well in bf16,
# bf16-mixed has no GradScaler and none of these rules.
