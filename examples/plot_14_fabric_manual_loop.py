"""
Lightning Fabric's manual loop: several optimizers under 16-mixed
=================================================================

With Fabric you write the loop yourself: ``fabric.backward(loss)``, then ``opt.step()`` for each
optimizer. Under 16-mixed, Fabric's ``MixedPrecision`` plugin behaves like the Trainer's (Lightning
2.6.6, ``fabric/plugins/precision/amp.py``): it updates the loss scale after **each** ``opt.step()``,
and stepping an optimizer without gradients raises. The Trainer's plugins, the library's
``ManualMixedPrecision`` included, cannot be passed to Fabric. This example measures all three; the
plugin :class:`mpguide.fabric.FabricManualMixedPrecision` fixes the first two.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_14_fabric_manual_loop.py

**What you will learn**

* that one backward feeding two optimizers doubles the second one's update after an overflow;
* which errors Fabric users meet, verbatim;
* how to pass :class:`~mpguide.fabric.FabricManualMixedPrecision` to ``Fabric(plugins=[...])``.

**Prerequisites**: :ref:`sphx_glr_auto_examples_plot_03_shared_backward.py` (the same effect with the Trainer).
"""


# %%
# The ``Fabric`` loop to copy
# ---------------------------
# A body and a head, two optimizers, one backward, then a step for each optimizer. The fix is one argument
# of ``Fabric(...)``: the plugin in place of ``precision="16-mixed"`` (on a CPU that becomes bf16-mixed).

import torch
import torch.nn.functional as F
from lightning.fabric import (
    Fabric,
    seed_everything,
)
from torch import nn

from mpguide.data import (
    NUM_CLASSES,
    NUM_FEATURES,
    digits_loader,
)
from mpguide.fabric import (
    FabricManualMixedPrecision,
    loss_scale,
)

# sphinx_gallery_start_ignore
from mpguide.verify.run import runner

runner.quiet_lightning()
runner.check_settings(
    "plot_14_fabric_manual_loop"
)  # MPGUIDE_* settings, before anything trains or prints
# sphinx_gallery_end_ignore

device = (
    "cuda"
    if torch.cuda.is_available()
    else "cpu"
)
seed_everything(0)
fabric = Fabric(
    accelerator=device,
    devices=1,
    plugins=[
        FabricManualMixedPrecision(
            "16-mixed", device
        )
    ],
)
body, head = (
    nn.Sequential(
        nn.Linear(NUM_FEATURES, 64), nn.Tanh()
    ),
    nn.Linear(64, NUM_CLASSES),
)
body, opt_body = fabric.setup(
    body,
    torch.optim.SGD(
        body.parameters(), lr=0.05
    ),
)
head, opt_head = fabric.setup(
    head,
    torch.optim.SGD(
        head.parameters(), lr=0.05
    ),
)
for _, (images, labels) in zip(
    range(20),
    fabric.setup_dataloaders(
        digits_loader(batch_size=64)
    ),
):
    opt_body.zero_grad()
    opt_head.zero_grad()
    loss = F.cross_entropy(
        head(body(images)), labels
    )
    fabric.backward(loss)
    opt_body.step()
    opt_head.step()
print(
    "loss after 20 iterations: "
    f"{float(loss):.4f}, loss scale: "
    f"{loss_scale(fabric):g}"
)


# %%
# The same loop, with an overflow
# -------------------------------
# The runs train that loop body batch by batch. On batch 1 the body's gradient is made infinite: GradScaler
# skips the body's step and halves the scale; which scale divides the head's finite gradients? The
# second loop steps an optimizer whose model the loss never reaches (``no_grad``, a detached branch).

# global batch indices whose body gradient is
# made infinite (16-mixed only)
OVERFLOW_BATCHES = (1, 50)


class BodyAndHead:
    def __init__(self, lr=0.05):
        self.lr, self.step_count = lr, 0
        self.body = nn.Sequential(
            nn.Linear(NUM_FEATURES, 64),
            nn.Tanh(),
        )
        self.head = nn.Linear(64, NUM_CLASSES)
        for p in self.body.parameters():
            p.register_hook(
                self.maybe_overflow
            )

    def setup(self, fabric):
        self.fabric = fabric
        self.body, opt_body = fabric.setup(
            self.body,
            torch.optim.SGD(
                self.body.parameters(),
                lr=self.lr,
            ),
        )
        self.head, opt_head = fabric.setup(
            self.head,
            torch.optim.SGD(
                self.head.parameters(),
                lr=self.lr,
            ),
        )
        self.optimizers = [opt_body, opt_head]

    def training_step(self, batch, batch_idx):
        images, labels = batch
        opt_body, opt_head = self.optimizers
        opt_body.zero_grad()
        opt_head.zero_grad()
        loss = F.cross_entropy(
            self.head(self.body(images)),
            labels,
        )
        self.fabric.backward(loss)
        opt_body.step()
        opt_head.step()
        self.step_count += 1
        return loss.detach()

    def maybe_overflow(self, grad):
        if (
            loss_scale(self.fabric)
            is not None
            and self.step_count
            in OVERFLOW_BATCHES
        ):
            return grad * float("inf")
        return grad


class StepsAnUnusedOptimizer:
    def __init__(self, lr=0.05):
        self.model, self.unused = (
            nn.Linear(
                NUM_FEATURES, NUM_CLASSES
            ),
            nn.Linear(
                NUM_FEATURES, NUM_CLASSES
            ),
        )

    def setup(self, fabric):
        self.fabric = fabric
        self.model, opt = fabric.setup(
            self.model,
            torch.optim.SGD(
                self.model.parameters(),
                lr=0.05,
            ),
        )
        self.unused, opt_unused = (
            fabric.setup(
                self.unused,
                torch.optim.SGD(
                    self.unused.parameters(),
                    lr=0.05,
                ),
            )
        )
        self.optimizers = [opt, opt_unused]

    def training_step(self, batch, batch_idx):
        images, labels = batch
        for opt in self.optimizers:
            opt.zero_grad()
        loss = F.cross_entropy(
            self.model(images), labels
        )
        self.fabric.backward(loss)
        for opt in self.optimizers:
            # the second optimizer's
            # parameters have no gradient
            opt.step()
        return loss.detach()


# %%
# The fix without the library
# ---------------------------
# ``Fabric(precision="32-true")``, your own fp16 ``torch.autocast`` and ``GradScaler``, **one**
# ``scaler.update()`` after the last step. ``fabric.autocast()`` at 32-true casts nothing (fp32 logits).


class LibraryFree(BodyAndHead):
    """The loop without the library: Fabric at
    32-true, autocast and GradScaler of your
    own."""

    def setup(self, fabric):
        super().setup(fabric)
        self.scaler = torch.amp.GradScaler(
            fabric.device.type
        )

    def training_step(self, batch, batch_idx):
        images, labels = batch
        opt_body, opt_head = self.optimizers
        opts = (opt_body, opt_head)
        for opt in opts:
            opt.zero_grad()
        with torch.autocast(
            self.fabric.device.type,
            torch.float16,
        ):
            logits = self.head(
                self.body(images)
            )
            loss = F.cross_entropy(
                logits, labels
            )
        self.fabric.backward(
            self.scaler.scale(loss)
        )
        for opt in opts:
            ps = [
                p for g in opt.param_groups
                for p in g["params"]
            ]  # fmt: skip
            # no gradient: the step would
            # raise
            if any(
                p.grad is not None for p in ps
            ):
                self.scaler.step(opt)
        # once per iteration, after every step
        self.scaler.update()
        self.step_count += 1
        return loss.detach()

    def maybe_overflow(self, grad):
        # the forced overflow of the runs
        # above, for this loop's own
        # GradScaler
        return (
            grad * float("inf")
            if self.step_count
            in OVERFLOW_BATCHES
            else grad
        )


class FabricAutocast32(LibraryFree):
    """The shortcut that trains fp32:
    ``fabric.autocast()`` at
    ``precision="32-true"``."""

    def training_step(self, batch, batch_idx):
        images, labels = batch
        opt_body, opt_head = self.optimizers
        opt_body.zero_grad()
        opt_head.zero_grad()
        # at 32-true: nothing is cast
        with self.fabric.autocast():
            logits = self.head(
                self.body(images)
            )
            self.logits_dtype = str(
                logits.dtype
            )
            loss = F.cross_entropy(
                logits, labels
            )
        self.fabric.backward(
            self.scaler.scale(loss)
        )
        self.scaler.step(opt_body)
        self.scaler.step(opt_head)
        self.scaler.update()
        self.step_count += 1
        return loss.detach()


# %%
# Evidence: the runs and their claims
# -----------------------------------
# :func:`mpguide.verify.run.fabric.train_run` drives the loops; the probes are Fabric callbacks.
# SGD moves the head by ``lr`` x its true gradient x the **update factor** (predicted: backward's scale / step's).

from lightning.pytorch.plugins.precision import MixedPrecision as TrainerMixedPrecision

from mpguide import fabric
from mpguide.verify.run import fabric as fabric_runs
from mpguide.verify.show import plotting, report


class HeadUpdate:
    measures = {
        "head_update_factor": "list[finite]",
        "predicted_factor": "list[finite]",
        "predicted_first_three": "list[finite]",
    }

    def __init__(self):
        self.factors, self.predicted = [], []

    def on_train_start(self, recipe):
        opt_body, opt_head = recipe.optimizers
        body_step, head_step = opt_body.step, opt_head.step

        def recorded_body_step(*args, **kwargs):
            self.scale_of_backward = loss_scale(recipe.fabric) or 1.0  # 1.0: no GradScaler (fp32)
            return body_step(*args, **kwargs)

        def recorded_head_step(*args, **kwargs):
            weight, scale_at_step = recipe.head.weight, loss_scale(recipe.fabric) or 1.0
            true_grad, before = weight.grad.detach().clone() / self.scale_of_backward, weight.detach().clone()
            output = head_step(*args, **kwargs)
            moved = (before - weight.detach()).norm()
            self.factors.append(float(moved / (recipe.lr * true_grad.norm())))
            self.predicted.append(self.scale_of_backward / scale_at_step)
            return output

        opt_body.step, opt_head.step = recorded_body_step, recorded_head_step  # these instances only

    def record_extra(self):
        predicted = self.predicted
        return {
            "head_update_factor": self.factors,
            "predicted_factor": predicted,
            "predicted_first_three": predicted[:3],
        }


class Weights:
    measures = {"weights": "name", "logits_dtype": "name"}

    def on_train_start(self, recipe):
        self.recipe = recipe

    def record_extra(self):
        extra = {"weights": runner.parameter_digest(nn.ModuleList([self.recipe.body, self.recipe.head]))}
        if hasattr(self.recipe, "logits_dtype"):
            extra["logits_dtype"] = self.recipe.logits_dtype
        return extra


class UnusedModelMoved:
    measures = {"unused_model_moved": "bool"}

    def on_train_start(self, recipe):
        self.recipe, self.initial = recipe, recipe.unused.weight.detach().clone()

    def record_extra(self):
        return {"unused_model_moved": not torch.equal(self.initial, self.recipe.unused.weight.detach())}


recipes = {
    "body+head": BodyAndHead,
    "unused optimizer": StepsAnUnusedOptimizer,
    "library-free": LibraryFree,
    "fabric.autocast() at 32-true": FabricAutocast32,
}
probes = {
    "body+head": [HeadUpdate, Weights],
    "unused optimizer": [UnusedModelMoved],
    "library-free": [Weights],
    "fabric.autocast() at 32-true": [Weights],
}
PLUGINS = {
    "FabricManualMixedPrecision": fabric.FabricManualMixedPrecision,
    "Trainer's MixedPrecision": TrainerMixedPrecision,
}
RUNS = [
    # run id                     recipe                           precision   options
    ("fp32", "body+head", "32-true", {"label": "fp32"}),
    ("fp16-stock", "body+head", "16-mixed", {"label": "16-mixed, Fabric's MixedPrecision"}),
    (
        "fp16-fixed",
        "body+head",
        "16-mixed",
        {"plugin": "FabricManualMixedPrecision", "label": "16-mixed, FabricManualMixedPrecision"},
    ),
    ("unused-fp32", "unused optimizer", "32-true", {"label": "fp32, optimizer without gradients"}),
    ("unused-fp16-stock", "unused optimizer", "16-mixed", {"label": "16-mixed, optimizer without gradients"}),
    (
        "unused-fp16-fixed",
        "unused optimizer",
        "16-mixed",
        {"plugin": "FabricManualMixedPrecision", "label": "16-mixed, FabricManualMixedPrecision, no gradients"},
    ),
    (
        "manual-plugin-in-fabric",
        "body+head",
        "16-mixed",
        {"plugin": "ManualMixedPrecision", "label": "Fabric(plugins=[ManualMixedPrecision(...)])"},
    ),
    (
        "trainer-plugin-in-fabric",
        "body+head",
        "16-mixed",
        {"plugin": "Trainer's MixedPrecision", "label": "Fabric(plugins=[Trainer's MixedPrecision(...)])"},
    ),
    ("libfree", "library-free", "32-true", {"label": "no library: own autocast + GradScaler"}),
    ("autocast32", "fabric.autocast() at 32-true", "32-true", {"label": "fabric.autocast() at 32-true"}),
]
CLAIMS = [
    (
        "expect",
        "fp16-stock",
        "predicted_first_three",
        [1.0, 2.0, 1.0],
        "stock: head update x1, x2, x1 around an overflow",
    ),
    (
        "ratio",
        "fp16-stock",
        "fp32",
        "head_update_factor",
        "predicted_factor",
        "update-ratio",
        "stock: head update = fp32 update x predicted factor",
    ),
    (
        "expect",
        "fp16-fixed",
        "predicted_first_three",
        [1.0, 1.0, 1.0],
        "fixed: the scale never changes mid-iteration",
    ),
    ("ratio", "fp16-fixed", "fp32", "head_update_factor", 1.0, "update-ratio", "fixed: head update = fp32 update"),
    ("match", "fp16-fixed", "fp32", "mixed-vs-fp32", "fixed: 16-mixed loss = fp32 loss"),
    ("expect", "unused-fp32", "unused_model_moved", False, "fp32: the empty step silently does nothing"),
    (
        "raises",
        "unused-fp16-stock",
        "AssertionError",
        "No inf checks were recorded for this optimizer",
        "stock 16-mixed: the empty step raises",
    ),
    (
        "warns",
        "unused-fp16-fixed",
        "NoGradientStepWarning",
        "none of its parameters has a gradient",
        "fixed: the empty step warns",
    ),
    ("expect", "unused-fp16-fixed", "unused_model_moved", False, "fixed: the empty step does nothing, as in fp32"),
    (
        "raises",
        "manual-plugin-in-fabric",
        "AttributeError",
        "'NoneType' object has no attribute 'trainer'",
        "ManualMixedPrecision cannot be passed to Fabric",
    ),
    (
        "raises",
        "trainer-plugin-in-fabric",
        "AttributeError",
        "'NoneType' object has no attribute 'trainer'",
        "nor can the Trainer's own MixedPrecision",
    ),
    ("same", "libfree", "fp16-fixed", "weights", "no library: weights = FabricManualMixedPrecision (bitwise)"),
    ("match", "libfree", "fp32", "mixed-vs-fp32", "no library: 16-mixed loss = fp32 loss"),
]

record = runner.run_example(
    "plot_14_fabric_manual_loop", recipes, RUNS, CLAIMS, plugins=PLUGINS, probes=probes, train=fabric_runs.train_run
)


# %%
# The update factor, iteration by iteration
# -----------------------------------------
# Fabric's plugin doubles the head's update on the batches whose body gradient overflowed; the fix keeps
# it at 1, on fp32's line. The factors, the errors and the warning, verbatim, are in the verdicts below.

import matplotlib.pyplot as plt

fig, ax = plotting.figure(1, 1, 9, 3.6)
text = (
    "Fabric, one backward and two "
    "optimizers: the head's update doubles "
    "after each overflow with Fabric's plugin"
)
plotting.describe(
    fig,
    text
    + (
        ", and stays at 1 (like fp32) with "
        "FabricManualMixedPrecision"
    ),
)
colors = {
    "fp32": "#0072B2",
    "fp16-fixed": "#CC79A7",
    "fp16-stock": "#D55E00",
}
title = (
    "Head update relative to the "
    "fp32-equivalent update"
)
plotting.plot_extra_series(
    ax,
    record,
    list(colors),
    "head_update_factor",
    title,
    "applied / expected update",
    colors,
    log_base=2,
)
plotting.save_figure(
    fig, record["example"], "factor"
)
plt.show()


# %%
# Conclusion
# ----------
# Fabric's 16-mixed plugin, like the Trainer's, updates the loss scale inside every ``opt.step()``: an
# overflow or a growth step changes the update of the optimizers that step later. The fix updates it
# once all optimizers with gradients have stepped, and warns on empty steps. Trainer plugins need a Trainer.


# %%
# Evidence: the verdicts
# ----------------------

report.verdicts(record)
