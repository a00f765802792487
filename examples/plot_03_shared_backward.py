"""
One backward, two optimizers: when the loss scale changes in between
=====================================================================

A digits classifier keeps its body and its head in two optimizers (to give them different learning
rates or schedules): one loss, one ``manual_backward``, then ``opt_body.step(); opt_head.step()``.
Under 16-mixed, Lightning 2.6.x updates the loss scale after **each** optimizer step
(``plugins/precision/amp.py``), so when the scale changes after the body's step, the head unscales
gradients made at the old scale: its update doubles after an overflow and halves after a growth
step. This example measures that factor on every step, against the prediction from the recorded
scales, and shows that the library's :class:`~mpguide.precision.ManualMixedPrecision` removes it.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_03_shared_backward.py

**What you will learn**

* what ``GradScaler.update()`` does and why PyTorch calls it once per iteration;
* how to measure the update an optimizer really applied;
* why a scale change between two optimizers is invisible in the loss curve but not in the update.
"""


# %%
# The model
# ---------
# A body and a head, each with its own plain SGD, and one backward through both; the body steps
# first, then the head. fp16 gradients overflow above 65504; to make that happen on chosen steps,
# the body's gradient is multiplied by infinity at steps 0 and 50 in the 16-mixed runs (fp32 and
# bf16 have the range of fp32 and would not overflow).

import functools

import lightning.pytorch as pl
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import (
    MixedPrecision,
)
from torch import nn

from mpguide import steps
from mpguide.data import (
    NUM_CLASSES,
    NUM_FEATURES,
    digits_loader,
)
from mpguide.precision import (
    ManualMixedPrecision,
)

# sphinx_gallery_start_ignore
from mpguide.verify.run import runner

runner.quiet_lightning()
runner.check_settings(
    "plot_03_shared_backward"
)  # MPGUIDE_* settings, before anything trains or prints
# sphinx_gallery_end_ignore

OVERFLOW_STEPS = (0, 50)


class BodyAndHead(pl.LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.automatic_optimization = False
        self.lr = lr
        self.body = nn.Sequential(
            nn.Linear(NUM_FEATURES, 64),
            nn.Tanh(),
        )
        self.head = nn.Linear(64, NUM_CLASSES)
        for p in self.body.parameters():
            p.register_hook(
                self.maybe_overflow
            )

    def maybe_overflow(self, grad):
        # global_step counts the steps of both
        # optimizers: two per batch
        if (
            steps.loss_scale(self.trainer)
            is not None
            and self.global_step // 2
            in OVERFLOW_STEPS
        ):
            return grad * float("inf")
        return grad

    def training_step(self, batch, batch_idx):
        images, labels = batch
        opt_body, opt_head = self.optimizers()
        opt_body.zero_grad()
        opt_head.zero_grad()
        loss = F.cross_entropy(
            self.head(self.body(images)),
            labels,
        )
        self.manual_backward(loss)
        opt_body.step()
        opt_head.step()
        return loss.detach()

    def configure_optimizers(self):
        return (
            torch.optim.SGD(
                self.body.parameters(),
                lr=self.lr,
            ),
            torch.optim.SGD(
                self.head.parameters(),
                lr=self.lr,
            ),
        )


# %%
# The ``Trainer`` call to copy
# ----------------------------
# ``ManualMixedPrecision`` takes the arguments of Lightning's ``MixedPrecision`` (on a GPU it
# replaces ``precision="16-mixed"``). It supports Lightning 2.6.x only and raises
# ``UnsupportedVersionError`` on other releases; there, use one optimizer with two parameter groups,
# or bf16-mixed. Batch 0 is the forced overflow.

device = (
    "cuda"
    if torch.cuda.is_available()
    else "cpu"
)
pl.seed_everything(0)
model = BodyAndHead()
trainer = pl.Trainer(
    accelerator=device,
    devices=1,
    max_steps=40,
    plugins=[
        ManualMixedPrecision(
            "16-mixed", device
        )
    ],
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(
    model, digits_loader(batch_size=64)
)
scaler = trainer.precision_plugin.scaler
scale = scaler.get_scale()
print(
    f"optimizer steps: {trainer.global_step} "
    "(two per batch), loss scale after the "
    f"run: {scale:g}"
)


# %%
# Both plugins again, with a small growth interval
# ------------------------------------------------
# ``growth_interval=20`` makes the scaler double its scale after twenty updates without an
# overflow (the default waits 2000), so growth steps show up within a short run.


def with_growth_interval(
    plugin_class, precision, device
):
    scaler = torch.amp.GradScaler(
        device, growth_interval=20
    )
    return plugin_class(
        precision, device, scaler=scaler
    )


stock_growth = functools.partial(
    with_growth_interval, MixedPrecision
)
fixed_growth = functools.partial(
    with_growth_interval, ManualMixedPrecision
)


# %%
# Evidence: the runs and their claims
# -----------------------------------
# With plain SGD an applied update is exactly ``lr`` times the gradient the optimizer saw. A probe
# (a callback: the module carries no measuring code) reads the head's gradient after the backward
# (still times the backward's scale), the scale at the head's step, and how far the head moved. The
# **update factor**, the move over ``lr`` times the true gradient, is 1 when unscaling used the
# right scale; the prediction is the backward's scale over the head step's, or 0 where the head's
# own gradient overflowed and GradScaler skipped its step.

from lightning.pytorch.callbacks import Callback

from mpguide.verify.run import runner
from mpguide.verify.show import plotting, report


class HeadUpdate(Callback):
    measures = {
        "head_update_factor": "list[finite]",
        "predicted_factor": "list[finite]",
        "predicted_at_overflow": "finite",
        "smallest_scale_change": "finite",
        "steps_with_scale_change": "count",
    }

    def __init__(self):
        self.factors, self.predicted = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.scale_of_backward = steps.loss_scale(trainer) or 1.0  # 1.0: no GradScaler (fp32)

    def on_after_backward(self, trainer, pl_module):
        weight = pl_module.head.weight
        self.true_grad = weight.grad.detach().clone() / self.scale_of_backward
        self.before = weight.detach().clone()
        self.finite = all(torch.isfinite(p.grad).all() for p in pl_module.head.parameters())

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if optimizer is trainer.optimizers[1]:  # the head's; the scale its unscale divided by (stock plugin)
            self.scale_of_head_step = steps.loss_scale(trainer) or 1.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        moved = (self.before - pl_module.head.weight.detach()).norm()
        if self.finite:
            self.factors.append(float(moved / (pl_module.lr * self.true_grad.norm())))
            self.predicted.append(self.scale_of_backward / self.scale_of_head_step)
        else:  # a head gradient (weight or bias) overflowed: GradScaler skips the step
            self.factors.append(float(moved))
            self.predicted.append(0.0)

    def record_extra(self):
        changed = [f for f in self.predicted if f not in (0.0, 1.0)]  # steps unscaled with another scale
        return {
            "head_update_factor": self.factors,
            "predicted_factor": self.predicted,
            "predicted_at_overflow": self.predicted[OVERFLOW_STEPS[0]] if self.predicted else None,
            "smallest_scale_change": min(changed, default=1.0),
            "steps_with_scale_change": len(changed),
        }


PLUGINS = {
    "MixedPrecision, growth_interval=20": stock_growth,
    "ManualMixedPrecision, growth_interval=20": fixed_growth,
}
RUNS = [
    # run id              recipe       precision   options
    ("fp32", "body+head", "32-true", {"label": "fp32"}),
    ("fp16-stock", "body+head", "16-mixed", {"label": "16-mixed, Lightning's plugin"}),
    (
        "fp16-plugin",
        "body+head",
        "16-mixed",
        {"plugin": "ManualMixedPrecision", "label": "16-mixed, ManualMixedPrecision"},
    ),
    (
        "fp16-growth-stock",
        "body+head",
        "16-mixed",
        {"plugin": "MixedPrecision, growth_interval=20", "label": "16-mixed, growth_interval=20, Lightning's plugin"},
    ),
    (
        "fp16-growth-plugin",
        "body+head",
        "16-mixed",
        {
            "plugin": "ManualMixedPrecision, growth_interval=20",
            "label": "16-mixed, growth_interval=20, ManualMixedPrecision",
        },
    ),
]
CLAIMS = [
    (
        "ratio",
        "fp16-stock",
        "fp32",
        "head_update_factor",
        "predicted_factor",
        "update-ratio",
        "stock: head update = fp32 update x (scale of backward / scale at head step)",
    ),
    ("expect", "fp16-stock", "predicted_at_overflow", 2.0, "stock: the head update doubles after an overflow"),
    ("ratio", "fp16-plugin", "fp32", "head_update_factor", 1.0, "update-ratio", "plugin: head update = fp32 update"),
    (
        "ratio",
        "fp16-growth-stock",
        "fp32",
        "head_update_factor",
        "predicted_factor",
        "update-ratio",
        "stock, growth: update follows the predicted factor",
    ),
    ("expect", "fp16-growth-stock", "smallest_scale_change", 0.5, "stock, growth: a growth step halves the update"),
    (
        "ratio",
        "fp16-growth-plugin",
        "fp32",
        "head_update_factor",
        "predicted_factor",
        "update-ratio",
        "plugin, growth: = fp32 update, or no update where the head overflowed",
    ),
    (
        "expect",
        "fp16-growth-plugin",
        "steps_with_scale_change",
        0,
        "plugin, growth: the scale never changes mid-step",
    ),
    ("match", "fp16-plugin", "fp32", "mixed-vs-fp32", "plugin: 16-mixed loss = fp32 loss"),
    # PitfallChecks on every run (runner.with_checks): each buggy run flags its section, each correct run is clean
    ("clean", "fp32", "PitfallChecks: fp32 has no finding"),
    ("clean", "fp16-plugin", "PitfallChecks: fp16-plugin has no finding"),
    ("clean", "fp16-growth-plugin", "PitfallChecks: fp16-growth-plugin has no finding"),
    ("flags", "fp16-stock", "scale-changes", "PitfallChecks flags fp16-stock: scale-changes"),
    ("flags", "fp16-growth-stock", "scale-changes", "PitfallChecks flags fp16-growth-stock: scale-changes"),
]

recipes = {"body+head": BodyAndHead}
probes = runner.with_checks(recipes, {"body+head": [HeadUpdate]})
record = runner.run_example("plot_03_shared_backward", recipes, RUNS, CLAIMS, plugins=PLUGINS, probes=probes)
runner.print_findings(record)  # what PitfallChecks told each run (mpguide.checks)


# %%
# The update factor, step by step
# -------------------------------
# fp32 sits at 1 by definition. With Lightning's plugin the head's update jumps to 2 on the forced
# overflows and drops to 0.5 whenever a growth step lands between the two optimizer steps; with
# ``ManualMixedPrecision`` every step is 1, except the steps GradScaler skips because the head's own
# gradient overflowed (0: nothing moves, which is correct).

fig, (left, right) = plotting.figure(
    1, 2, 12, 6.2, sharey=True
)
plotting.describe(
    fig,
    "Stock 16-mixed: the head's update "
    "doubles after an overflow and halves "
    "after a growth step; "
    "ManualMixedPrecision keeps it at 1, "
    "like fp32",
)
stock, fixed = (
    "Lightning's 16-mixed plugin",
    "ManualMixedPrecision",
)
names = {
    "fp32": "fp32",
    "fp16-plugin": fixed,
    "fp16-growth-plugin": fixed,
}
names.update(
    {
        "fp16-stock": stock,
        "fp16-growth-stock": stock,
    }
)
colors = {
    run_id: {
        "fp32": "#0072B2",
        fixed: "#CC79A7",
        stock: "#D55E00",
    }[name]
    for run_id, name in names.items()
}
for ax, ids, title in [
    (
        left,
        ["fp32", "fp16-plugin", "fp16-stock"],
        "Forced overflows at batches 0 and "
        "50",
    ),
    (
        right,
        [
            "fp32",
            "fp16-growth-plugin",
            "fp16-growth-stock",
        ],
        "16-mixed, growth_interval=20",
    ),
]:
    ylabel = (
        "head update / fp32-equivalent update"
    )
    plotting.plot_extra_series(
        ax,
        record,
        ids,
        "head_update_factor",
        title,
        ylabel,
        colors,
        log_base=2,
        labels=names,
    )
plotting.save_figure(
    fig, record["example"], "factor"
)
plt.show()


# %%
# Conclusion
# ----------
# When several optimizers consume one backward under 16-mixed, the loss scale must not change
# until all of them have stepped. In plain Lightning 2.6 you cannot delay the update, so either
# use one optimizer with two parameter groups (one ``step``, one update), or use bf16-mixed, or
# pass ``plugins=[ManualMixedPrecision("16-mixed", device)]``, which updates the scale once after
# every optimizer holding gradients of the current scale has stepped.


# %%
# Evidence: the verdicts
# ----------------------

report.verdicts(record)
