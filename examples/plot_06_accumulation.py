"""
Gradient accumulation by hand under mixed precision
===================================================

``Trainer(accumulate_grad_batches=N)`` is rejected in manual optimization; you accumulate
yourself: divide the loss by N, backward every micro-batch, and step and ``zero_grad`` only at
the end of each window of N. Done right, the curve equals Lightning's automatic accumulation in
every precision. This example checks that, shows the two common mistakes, and follows the loss
scale through the windows of a 16-mixed run, including a window with an overflow.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_06_accumulation.py

**What you will learn**

* the accumulation recipe, and why not dividing is an N times larger learning rate with SGD;
* that the loss scale is constant inside a window under 16-mixed (it only changes in ``opt.step()``);
* that one overflowing micro-batch skips the whole window's update;
* that ``(batch_idx + 1) % N == 0`` alone never steps an epoch's short last window (``steps.window_ends`` does).
"""


# %%
# The recipe and the mistakes
# ---------------------------
# All runs use SGD with momentum, where the size of the gradient is the size of the step: a
# window's gradient that is N times too large is the same as a learning rate N times too large.

import functools

import lightning.pytorch as pl
import matplotlib.pyplot as plt
import torch
from lightning.pytorch.plugins.precision import (
    MixedPrecision,
)

from mpguide import steps
from mpguide.data import digits_loader
from mpguide.models import DigitsClassifier

# sphinx_gallery_start_ignore
from mpguide.verify.run import runner

runner.quiet_lightning()
runner.check_settings(
    "plot_06_accumulation"
)  # MPGUIDE_* settings, before anything trains or prints
# sphinx_gallery_end_ignore

N = 4  # micro-batches per optimizer step
# in the overflow run, this micro-batch of
# epoch 0 gets an infinite gradient (window 5)
OVERFLOW_BATCH = 21


class ManualAccumulation(DigitsClassifier):
    def __init__(
        self, overflow=False, n=N, **kwargs
    ):
        super().__init__(**kwargs)
        self.overflow, self.n = overflow, n

    def window_share(self, loss):
        # so that the summed gradient of the
        # window is an average
        return loss / self.n

    def window_done(self, batch_idx):
        # every n-th micro-batch and the
        # epoch's last, as automatic
        # accumulation steps
        return steps.window_ends(
            self.trainer, batch_idx, self.n
        )

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.compute_loss(batch)
        self.manual_backward(
            self.window_share(loss)
        )
        if (
            self.overflow
            and self.current_epoch == 0
            and batch_idx == OVERFLOW_BATCH
        ):
            # as if this micro-batch
            # overflowed fp16
            self.net[0].weight.grad.fill_(
                float("inf")
            )
        if self.window_done(batch_idx):
            opt.step()
            opt.zero_grad()
        return loss.detach()


class NoDivision(ManualAccumulation):
    """Mistake 1: the window's gradient is a
    sum, N times too large."""

    def window_share(self, loss):
        return loss


class ModuloOnly(ManualAccumulation):
    """Mistake 3: ``(batch_idx + 1) % n == 0``
    alone; when n does not divide the epoch
    its last window never steps."""

    def window_done(self, batch_idx):
        return (batch_idx + 1) % self.n == 0


class ZeroGradEveryBatch(ManualAccumulation):
    """Mistake 2: ``zero_grad()`` at the top
    of every batch keeps only the last
    micro-batch."""

    def window_share(self, loss):
        # wipes the micro-batches before this
        # one
        self.optimizers().zero_grad()
        return super().window_share(loss)


# %%
# The ``Trainer`` call to copy
# ----------------------------
# The recipe under 16-mixed, for five windows of four micro-batches. On a GPU ``precision="16-mixed"``
# is enough; on a CPU that flag silently becomes bf16-mixed, so Lightning's plugin is passed
# explicitly. ``max_steps`` counts optimizer steps, i.e. windows.

device = (
    "cuda"
    if torch.cuda.is_available()
    else "cpu"
)
pl.seed_everything(0)
model = ManualAccumulation(
    optimizer="sgd", lr=0.05
)
trainer = pl.Trainer(
    accelerator=device,
    devices=1,
    max_steps=5,
    plugins=[
        MixedPrecision("16-mixed", device)
    ],
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(
    model, digits_loader(batch_size=64)
)
print(
    f"optimizer steps (windows of {N} "
    f"micro-batches): {trainer.global_step}"
)


# %%
# The epoch's last window
# -----------------------
# An epoch of the digits has 28 batches: windows of 4 divide it, windows of 3 do not (9 windows, then 1
# micro-batch). Automatic accumulation steps at the epoch's last batch too, so it takes 10 steps per epoch.
# ``(batch_idx + 1) % 3 == 0`` alone takes 9: the last micro-batch's gradient leaks into the next epoch's
# first window, or is lost at the end of training. ``steps.window_ends`` steps where automatic accumulation does.
# A schedule stepped once per window must know the number of windows. In manual optimization
# ``trainer.estimated_stepping_batches`` counts batches (28 here), not optimizer steps, so a OneCycleLR sized from
# it would end 2.8 times too late; ``steps.manual_stepping_batches(trainer, 3)`` counts the windows (10), the
# short one included. Call it in ``configure_optimizers``.

for recipe in (
    ManualAccumulation,
    ModuloOnly,
):
    pl.seed_everything(0)
    model = recipe(
        n=3, optimizer="sgd", lr=0.05
    )
    trainer = pl.Trainer(
        accelerator=device,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(
        model, digits_loader(batch_size=64)
    )
    print(
        f"{recipe.__name__}, N = 3: "
        f"{trainer.global_step} optimizer "
        "steps in 28 batches (automatic: 10)"
    )
print(
    "estimated_stepping_batches: "
    f"{trainer.estimated_stepping_batches}"
)
print(
    "manual_stepping_batches(trainer, 3): "
    f"{steps.manual_stepping_batches(trainer, 3)}"
)


# %%
# Evidence: the runs and their claims
# -----------------------------------
# Automatic ``accumulate_grad_batches=4`` is the reference in each precision. A probe (a callback: the recipes
# carry no measuring code) records the loss scale at each micro-batch start and whether each window moved the weights.

from lightning.pytorch.callbacks import Callback

from mpguide.verify.run import runner
from mpguide.verify.show import plotting, report


class WindowProbe(Callback):
    measures = {
        "window_moved": "list[bool]",
        "scale_constant_in_windows": "bool",
        "overflow_window_skipped": "bool",
        "other_windows_moved": "bool",
    }

    def __init__(self):
        self.window_moved, self.scales, self.start = [], [], None  # moved per window; scale per micro-batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx % N == 0:
            self.start = pl_module.weights()
        self.scales.append(steps.loss_scale(trainer))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (batch_idx + 1) % N == 0:
            self.window_moved.append(bool((pl_module.weights() != self.start).any()))

    def record_extra(self):
        windows = [self.scales[i : i + N] for i in range(0, len(self.scales), N)]
        return {
            "window_moved": self.window_moved,
            "scale_constant_in_windows": all(len(set(w)) == 1 for w in windows),
            "overflow_window_skipped": not self.window_moved[OVERFLOW_BATCH // N] if self.window_moved else None,
            "other_windows_moved": all(m for i, m in enumerate(self.window_moved) if i != OVERFLOW_BATCH // N),
        }


class TailProbe(Callback):
    measures = {"tail_stepped": "bool", "schedule_equals_steps": "bool"}

    def on_train_start(self, trainer, pl_module):
        self.trainer, self.moved, self.planned = trainer, [], steps.manual_stepping_batches(trainer, pl_module.n)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.start = pl_module.weights() if batch_idx + 1 == trainer.num_training_batches else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.start is not None:  # the epoch's last micro-batch: did its window step?
            self.moved.append(bool((pl_module.weights() != self.start).any()))

    def record_extra(self):
        tail = bool(self.moved) and all(self.moved)
        return {"tail_stepped": tail, "schedule_equals_steps": self.planned == self.trainer.global_step}


sgd = {"optimizer": "sgd", "lr": 0.05}
recipes = {
    "automatic": functools.partial(DigitsClassifier, manual=False, **sgd),
    "manual": functools.partial(ManualAccumulation, **sgd),
    "manual, overflow": functools.partial(ManualAccumulation, overflow=True, **sgd),
    "no division": functools.partial(NoDivision, **sgd),
    "zero_grad every batch": functools.partial(ZeroGradEveryBatch, **sgd),
    "manual, lr x 4": functools.partial(ManualAccumulation, optimizer="sgd", lr=4 * sgd["lr"]),
    "manual, lr 0.5": functools.partial(ManualAccumulation, optimizer="sgd", lr=0.5),
    "no division, lr 0.5": functools.partial(NoDivision, optimizer="sgd", lr=0.5),
    "manual N=3": functools.partial(ManualAccumulation, n=3, **sgd),  # 28 batches: 9 windows of 3, then 1
    "modulo only N=3": functools.partial(ModuloOnly, n=3, **sgd),
}
probes = {name: [WindowProbe] for name in recipes if name != "automatic" and "N=3" not in name}
probes.update({name: [TailProbe] for name in recipes if "N=3" in name})
RUNS = [
    # run id           recipe                   precision     options
    ("auto-fp32", "automatic", "32-true", {"trainer": {"accumulate_grad_batches": 4}, "label": "automatic, 32-true"}),
    (
        "auto-bf16",
        "automatic",
        "bf16-mixed",
        {"trainer": {"accumulate_grad_batches": 4}, "label": "automatic, bf16-mixed"},
    ),
    (
        "auto-fp16",
        "automatic",
        "16-mixed",
        {"trainer": {"accumulate_grad_batches": 4}, "label": "automatic, 16-mixed"},
    ),
    ("manual-fp32", "manual", "32-true", {"label": "manual, 32-true"}),
    ("manual-bf16", "manual", "bf16-mixed", {"label": "manual, bf16-mixed"}),
    ("manual-fp16", "manual", "16-mixed", {"label": "manual, 16-mixed"}),
    ("no-division", "no division", "32-true", {"label": "no division, fp32"}),
    ("zero-grad", "zero_grad every batch", "32-true", {"label": "zero_grad every batch, fp32"}),
    ("manual-lr-x4", "manual, lr x 4", "32-true", {"label": "manual, lr 0.2 (4 x 0.05), fp32"}),
    ("manual-lr-0.5", "manual, lr 0.5", "32-true", {"label": "manual, lr 0.5, fp32"}),
    ("no-division-lr-0.5", "no division, lr 0.5", "32-true", {"label": "no division, lr 0.5, fp32"}),
    ("overflow-fp16", "manual, overflow", "16-mixed", {"label": "16-mixed, overflow in window 5"}),
    (
        "trainer-flag",
        "manual",
        "32-true",
        {"trainer": {"accumulate_grad_batches": 4}, "label": "Trainer(accumulate_grad_batches=4)"},
    ),
    (
        "auto3-fp32",
        "automatic",
        "32-true",
        {"trainer": {"accumulate_grad_batches": 3}, "label": "automatic, N = 3, 32-true"},
    ),
    ("manual3-fp32", "manual N=3", "32-true", {"label": "manual, N = 3, 32-true"}),
    ("modulo3-fp32", "modulo only N=3", "32-true", {"label": "(batch_idx + 1) % 3 only, 32-true"}),
]
CLAIMS = [
    ("match", "manual-fp32", "auto-fp32", "same-precision", "manual accumulation = automatic (fp32)"),
    ("match", "manual-bf16", "auto-bf16", "same-precision", "manual accumulation = automatic (bf16)"),
    ("match", "manual-fp16", "auto-fp16", "same-precision", "manual accumulation = automatic (fp16)"),
    ("diverge", "no-division", "manual-fp32", "pitfall-gap", "not dividing the loss diverges"),
    ("diverge", "zero-grad", "manual-fp32", "pitfall-gap", "zero_grad every batch diverges"),
    ("same", "no-division", "manual-lr-x4", "final_weights", "not dividing = dividing with a 4 x larger lr, bitwise"),
    ("diverge", "no-division-lr-0.5", "manual-lr-0.5", "pitfall-gap", "at lr 0.5, not dividing diverges"),
    ("expect", "overflow-fp16", "scale_constant_in_windows", True, "the loss scale is constant inside each window"),
    ("expect", "overflow-fp16", "overflow_window_skipped", True, "one overflowing micro-batch skips its window"),
    ("expect", "overflow-fp16", "other_windows_moved", True, "every other window is applied"),
    (
        "same",
        "manual3-fp32",
        "auto3-fp32",
        "final_weights",
        "N = 3, 28 batches per epoch: manual = automatic, bitwise (fp32)",
    ),
    ("same", "manual3-fp32", "auto3-fp32", "global_step", "N = 3: as many optimizer steps as automatic accumulation"),
    ("expect", "manual3-fp32", "tail_stepped", True, "N = 3: each epoch's short last window steps"),
    (
        "expect",
        "modulo3-fp32",
        "tail_stepped",
        False,
        "(batch_idx + 1) % N alone: the epoch's last window never steps",
    ),
    ("expect", "manual3-fp32", "schedule_equals_steps", True, "manual_stepping_batches = the optimizer steps taken"),
    (
        "raises",
        "trainer-flag",
        "MisconfigurationException",
        "Automatic gradient accumulation is not supported for manual optimization",
        "Trainer(accumulate_grad_batches) is rejected in manual optimization",
    ),
    # PitfallChecks on every run (runner.with_checks): each buggy run flags its section, each correct run is clean
    ("clean", "auto-fp32", "PitfallChecks: auto-fp32 has no finding"),
    ("clean", "auto-bf16", "PitfallChecks: auto-bf16 has no finding"),
    ("clean", "auto-fp16", "PitfallChecks: auto-fp16 has no finding"),
    ("clean", "manual-fp32", "PitfallChecks: manual-fp32 has no finding"),
    ("clean", "manual-bf16", "PitfallChecks: manual-bf16 has no finding"),
    ("clean", "manual-fp16", "PitfallChecks: manual-fp16 has no finding"),
    ("clean", "manual-lr-x4", "PitfallChecks: manual-lr-x4 has no finding"),
    ("clean", "manual-lr-0.5", "PitfallChecks: manual-lr-0.5 has no finding"),
    ("clean", "overflow-fp16", "PitfallChecks: overflow-fp16 has no finding"),
    ("flags", "zero-grad", "accumulation", "PitfallChecks flags zero-grad: accumulation"),
]

record = runner.run_example("plot_06_accumulation", recipes, RUNS, CLAIMS, probes=runner.with_checks(recipes, probes))
runner.print_findings(record)  # what PitfallChecks told each run (mpguide.checks)


# %%
# Curves
# ------
# Left: manual and automatic accumulation are identical in every precision (each pair drawn once).
# Right: the two mistakes in fp32. Not dividing reaches a *lower* loss here, bitwise the curve of the
# divided recipe with a 4 times larger learning rate (one line): at lr 0.05 this model profits from
# larger steps. ``zero_grad`` every batch keeps a quarter of each window's gradient and trains slower.

fig, (left, right) = plotting.figure(
    1, 2, 12, 5.0, sharey=True
)
plotting.describe(
    fig,
    "Manual accumulation equals automatic "
    "accumulation; not dividing the loss "
    "equals a 4 x larger "
    "learning rate (lower loss at lr 0.05); "
    "zero_grad every batch trains slower",
)
acc_ids = [
    "auto-fp32",
    "manual-fp32",
    "auto-bf16",
    "manual-bf16",
    "auto-fp16",
    "manual-fp16",
]
plotting.plot_loss_curves(
    left,
    record,
    acc_ids,
    "Automatic vs manual accumulation, N = 4",
)
names = {
    "manual-fp32": "divided by 4",
    "no-division": "not divided",
    "manual-lr-x4": "divided, lr x 4",
}
names["zero-grad"] = "zero_grad every batch"
colors = {
    "no-division": "#D55E00",
    "zero-grad": "#CC79A7",
}
plotting.plot_loss_curves(
    right,
    record,
    list(names),
    "Accumulation mistakes, SGD lr 0.05, "
    "fp32",
    colors,
    names,
)
plotting.save_figure(
    fig, record["example"], "curves"
)
plt.show()


# %%
# An lr of 0.5, and an overflow
# -----------------------------
# Left: the same mistake at lr 0.5, where the divided recipe trains well: every step is four times
# too long and the loss climbs far above where it started (log scale). Not dividing is not "slower"
# or "faster" but a different learning rate, tuned for nothing. Right: in the overflow run,
# micro-batch 21 (window 5) carries an infinite gradient. The scale stays constant inside every
# window, the window with the overflow applies no update, and the scale halves once, at its ``opt.step()``.

fig, (ax, windows) = plotting.figure(
    1, 2, 12, 4.1
)
plotting.describe(
    fig,
    "At lr 0.5 the divided recipe trains and "
    "the undivided one diverges; the loss "
    "scale is constant "
    "inside each window, and the window "
    "with the overflow is skipped",
)
names = {
    "manual-lr-0.5": "divided by 4",
    "no-division-lr-0.5": "not divided",
}
plotting.plot_loss_curves(
    ax,
    record,
    list(names),
    "SGD lr 0.5, fp32",
    {"no-division-lr-0.5": "#D55E00"},
    names,
)
ax.set_yscale("log")
run, shown = (
    plotting.run_by_id(
        record, "overflow-fp16"
    ),
    40,
)
windows.step(
    range(shown),
    run["loss_scale"][:shown],
    where="post",
    color="#009E73",
    label="loss scale",
)
for w, moved in enumerate(
    run["extra"]["window_moved"][: shown // N]
):
    windows.axvspan(
        w * N,
        (w + 1) * N,
        color="#999999"
        if moved
        else "#D55E00",
        alpha=0.06 if moved else 0.25,
    )
windows.axvline(
    OVERFLOW_BATCH,
    color="#D55E00",
    linestyle=":",
    label="overflowing micro-batch",
)
windows.set(
    yscale="log",
    xlabel="micro-batch (batch)",
    ylabel="loss scale at micro-batch start",
)
windows.set_title(
    "16-mixed, windows of 4 micro-batches "
    "(red: skipped)"
)
windows.legend(
    fontsize=plotting.LEGEND_SIZE,
    frameon=False,
    loc="lower left",
)
plotting.save_figure(
    fig,
    record["example"],
    "larger_lr_and_windows",
)
plt.show()


# %%
# Conclusion
# ----------
# Divide the loss by N, call ``manual_backward`` on every micro-batch, and call ``opt.step()`` and
# ``opt.zero_grad()`` only at the end of the window. Forgetting the division multiplies SGD's
# learning rate by N (bitwise the same run), which may look better or diverge depending on the
# learning rate; a learning rate tuned with ``accumulate_grad_batches`` no longer fits. Under 16-mixed
# nothing else is needed: the scale cannot change inside a window, and an overflow anywhere in it
# skips the window as a whole. When N does not divide the epoch, also step at its last batch (``steps.window_ends``,
# or ``or self.trainer.is_last_batch``), as automatic accumulation does, and size per-step schedules with
# ``steps.manual_stepping_batches``. ``mpguide.checks.PitfallChecks()`` flags the ``zero_grad`` mistake (the
# ``zero-grad`` run above); not dividing leaves no trace it sees: compare with automatic accumulation once.


# %%
# Evidence: the verdicts
# ----------------------

report.verdicts(record)
