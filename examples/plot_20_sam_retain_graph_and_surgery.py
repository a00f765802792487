"""
SAM, a step between two backwards, and gradient surgery under mixed precision
=============================================================================

Three training steps that run without an error in bf16-mixed and 16-mixed and still train something
else than fp32 does. SAM's ``first_step``/``second_step`` (or ``opt.optimizer.step()``) go around
Lightning's optimizer wrapper: under 16-mixed nothing unscales the gradients, so the update is the loss
scale times fp32's, and ``global_step`` never moves. A second backward through a graph kept with
``retain_graph=True`` after an ``opt.step()`` raises in fp32, but in mixed precision it silently
differentiates the weights from before the step. Gradients from ``torch.autograd.grad`` written into
``p.grad`` (PCGrad, LibMTL's autograd mode) are divided by the loss scale in ``opt.step()``.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_20_sam_retain_graph_and_surgery.py

**What you will learn**: SAM under 16-mixed through ``opt.step()``; what a second backward after a step
differentiates, and the two ways to say what you mean; :func:`mpguide.steps.scaled_grads` for gradients you
write yourself. **Prerequisites**: :doc:`plot_07_backward_and_flags`.
"""


# %%
# SAM through ``opt.step()``
# --------------------------
# Sharpness-aware minimization takes two backwards per batch: the first finds the direction in which the
# loss rises fastest, the weights climb a distance ``rho`` that way, the second backward takes the gradient
# there, and the base optimizer (SGD) steps from the weights before the climb with that gradient. Keep the
# base optimizer as the one Lightning wraps and climb by hand: the climb needs only the gradient's direction,
# the same at any loss scale, and the step goes through ``opt.step()``, which unscales, skips a step whose
# gradients overflowed, and counts it.

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import (
    MixedPrecision,
)

from mpguide.data import digits_loader
from mpguide.models import DigitsClassifier
from mpguide.steps import scaled_grads

# sphinx_gallery_start_ignore
from mpguide.verify.run import runner

runner.quiet_lightning()
runner.check_settings(
    "plot_20_sam_retain_graph_and_surgery"
)  # MPGUIDE_* settings, before anything trains
# sphinx_gallery_end_ignore

RHO, LR = 0.05, 0.02


class SAMThroughWrapper(DigitsClassifier):
    def training_step(self, batch, batch_idx):
        # wraps the base optimizer
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(
            self.compute_loss(batch)
        )
        params = [
            p
            for p in self.parameters()
            if p.grad is not None
        ]
        # the climb: rho along the gradient's
        # direction
        with torch.no_grad():
            start = [
                p.detach().clone()
                for p in params
            ]
            norm = torch.linalg.vector_norm(
                torch.stack(
                    [
                        p.grad.norm()
                        for p in params
                    ]
                )
            )
            for p in params:
                p.add_(
                    p.grad,
                    alpha=RHO
                    / float(norm + 1e-12),
                )
        opt.zero_grad()
        loss = self.compute_loss(batch)
        self.manual_backward(loss)
        # back to where we were
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        # unscales, skips on inf/NaN, counts
        # global_step
        opt.step()
        return loss.detach()

    def configure_optimizers(self):
        return torch.optim.SGD(
            self.parameters(), lr=LR
        )


# %%
# The ``Trainer`` call to copy, under 16-mixed (on a CPU the plugin is passed explicitly: the flag alone
# becomes bf16-mixed there).

device = (
    "cuda"
    if torch.cuda.is_available()
    else "cpu"
)
pl.seed_everything(0)
model = SAMThroughWrapper()
trainer = pl.Trainer(
    accelerator=device,
    devices=1,
    max_steps=20,
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
    "SAM through opt.step(): "
    "trainer.global_step "
    f"{trainer.global_step}"
)


# %%
# SAM's own steps
# ---------------
# Ported as it is usually written, SAM is an optimizer with two steps of its own, reached through
# ``opt.optimizer``: its ``first_step`` climbs, its ``second_step`` returns and steps the base optimizer.
# Neither goes through Lightning's wrapper, so under 16-mixed nothing unscales the gradients (the update is
# the loss scale times fp32's) and ``global_step`` stays 0 (``opt.optimizer.step()`` does the same).


class SAM(torch.optim.Optimizer):
    """A SAM optimizer of the usual shape: a
    base optimizer inside, two steps called by
    hand."""

    def __init__(
        self, params, base, **kwargs
    ):
        super().__init__(params, kwargs)
        self.base = base(
            self.param_groups, **kwargs
        )
        self.param_groups = (
            self.base.param_groups
        )

    @torch.no_grad()
    # climb rho along the gradient, remember
    # where we were
    def first_step(self):
        params = [
            p
            for group in self.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        norm = torch.linalg.vector_norm(
            torch.stack(
                [
                    p.grad.norm()
                    for p in params
                ]
            )
        )
        for p in params:
            self.state[p]["start"] = (
                p.detach().clone()
            )
            p.add_(
                p.grad,
                alpha=RHO
                / float(norm + 1e-12),
            )
        self.zero_grad()

    @torch.no_grad()
    # return, then the base optimizer steps
    # with the gradient found up there
    def second_step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if "start" in self.state[p]:
                    p.copy_(
                        self.state[p]["start"]
                    )
        self.base.step()
        self.zero_grad()


class SAMRawSteps(DigitsClassifier):
    def training_step(self, batch, batch_idx):
        # the torch optimizer behind
        # Lightning's wrapper
        sam = self.optimizers().optimizer
        self.manual_backward(
            self.compute_loss(batch)
        )
        sam.first_step()
        loss = self.compute_loss(batch)
        self.manual_backward(loss)
        # neither unscaled nor counted
        sam.second_step()
        return loss.detach()

    def configure_optimizers(self):
        return SAM(
            self.parameters(),
            torch.optim.SGD,
            lr=LR,
        )


# %%
# A step between two backwards
# ----------------------------
# Two tasks share a trunk and one optimizer steps for each in turn. The second backward goes through the
# graph of the first forward (``retain_graph=True``), after ``opt.step()`` changed the trunk in place. fp32
# raises "modified by an inplace operation"; under autocast the graph kept the bf16/fp16 copies of the
# weights, which the step did not touch, so the second gradient is taken at the weights before the step.


class TwoTasks(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.trunk = torch.nn.Sequential(
            torch.nn.Linear(64, 32),
            torch.nn.Tanh(),
            torch.nn.Linear(32, 32),
            torch.nn.Tanh(),
        )
        self.digit, self.size = (
            torch.nn.Linear(32, 10),
            torch.nn.Linear(32, 1),
        )

    # task a: which digit; task b: the digit's
    # value, regressed
    def losses(self, batch):
        images, labels = batch
        h = self.trunk(images)
        value = self.size(h).squeeze(-1)
        return F.cross_entropy(
            self.digit(h), labels
        ), F.mse_loss(
            value, labels.to(value.dtype) / 9
        )

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss_a, loss_b = self.losses(batch)
        opt.zero_grad()
        self.manual_backward(
            loss_a, retain_graph=True
        )
        opt.step()
        opt.zero_grad()
        # through the graph of before the step
        self.manual_backward(loss_b)
        opt.step()
        return (loss_a + loss_b).detach()

    def configure_optimizers(self):
        return torch.optim.SGD(
            self.parameters(), lr=0.2
        )


# %%
# Say which weights the second loss should see. The stepped ones: forward again after the step (below).
# The old ones: take every backward before the first step.


class ForwardAgain(TwoTasks):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss_a, _ = self.losses(batch)
        opt.zero_grad()
        self.manual_backward(loss_a)
        opt.step()
        # a new graph, through the stepped
        # weights
        _, loss_b = self.losses(batch)
        opt.zero_grad()
        self.manual_backward(loss_b)
        opt.step()
        return (loss_a + loss_b).detach()


# %%
# Where Lightning's own autocast caches casts (2.5.4 and older, and master at 7f0c343: :doc:`plot_08_autocast_cache`),
# a forward after a step inside ``training_step`` reads the casts of the old weights, so the forward again (and SAM's
# second forward after the climb) needs a region without a cache there. The version matrix runs both.


class ForwardAgainNoCache(ForwardAgain):
    def losses(self, batch):
        with torch.autocast(
            self.device.type,
            dtype=torch.bfloat16,
            cache_enabled=False,
        ):
            return super().losses(batch)


# %%
# Gradients you write into ``p.grad``
# -----------------------------------
# Gradient surgery takes each task's gradient with ``torch.autograd.grad``, combines them (PCGrad removes
# the part of one that conflicts with the other) and writes the result into ``p.grad`` before
# ``opt.step()``. Under 16-mixed ``opt.step()`` divides ``p.grad`` by the loss scale, as if
# ``manual_backward`` had made it: a gradient of the unscaled loss ends up the scale times too small.
# :func:`mpguide.steps.scaled_grads` takes it at the loss scale (plain ``autograd.grad`` without a GradScaler).


class Surgery(TwoTasks):
    def task_grads(self, loss, params):
        return torch.autograd.grad(
            loss, params, retain_graph=True
        )

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        shared = list(self.trunk.parameters())
        losses = self.losses(batch)
        # each task's trunk gradient
        g_a, g_b = (
            self.task_grads(loss, shared)
            for loss in losses
        )
        dot = sum(
            (a * b).sum()
            for a, b in zip(g_a, g_b)
        )
        # PCGrad: drop the part of a that
        # points against b
        if dot < 0:
            g_a = [
                a
                - dot
                / sum(
                    b.pow(2).sum()
                    for b in g_b
                )
                * b
                for a, b in zip(g_a, g_b)
            ]
        opt.zero_grad()
        # the heads' gradients (LibMTL's
        # order)
        self.manual_backward(sum(losses))
        for p, a, b in zip(shared, g_a, g_b):
            # the trunk's: the combined task
            # gradients
            p.grad = a + b
        opt.step()
        return sum(losses).detach()


class SurgeryScaled(Surgery):
    def task_grads(self, loss, params):
        return scaled_grads(
            loss,
            params,
            self.trainer,
            retain_graph=True,
        )


# %%
# Evidence: the runs and their claims
# -----------------------------------
# Each pitfall and its fix, one batch per epoch, from the same weights; the 16-mixed runs start GradScaler at a
# loss scale of 1024 (at the default 65536 SAM's raw steps reach NaN within a few batches). A probe (a callback:
# the modules carry no measuring code) records the norm of the first batch's update (of the shared trunk in the
# two-task modules) and the loss scale it ran at; another, on the two-task runs, takes the gradient of the
# second backward of the first batch and compares it, in float64, with task b's gradient at the weights before
# the step and after it (relative distances).

import copy

from lightning.pytorch.callbacks import Callback

from mpguide.steps import loss_scale
from mpguide.verify.show import plotting, report


class FirstUpdate(Callback):
    measures = {
        "first_update": "list[number]",
        "first_scale": "list[number]",
        "first_inverse_scale": "list[number]",
        "steps_per_batch": "number",
    }

    def __init__(self):
        self.update, self.scale, self.batches = [], 1.0, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.update:
            self.params = list(getattr(pl_module, "trunk", pl_module).parameters())  # the shared trunk, if any
            self.start = [p.detach().clone() for p in self.params]
            self.scale = loss_scale(trainer) or 1.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.trainer, self.batches = trainer, self.batches + 1
        if not self.update:
            moved = [(p.detach() - s).flatten() for p, s in zip(self.params, self.start)]
            self.update.append(float(torch.cat(moved).norm()))

    def record_extra(self):
        return {
            "first_update": self.update,
            "first_scale": [self.scale],
            "first_inverse_scale": [1 / self.scale],
            "steps_per_batch": self.trainer.global_step / self.batches,
        }


class SecondBackward(Callback):
    measures = {"second_vs_before_step": "nonnegative", "second_vs_after_step": "nonnegative"}

    def __init__(self):
        self.backwards, self.before, self.after, self.got, self.batch = 0, None, None, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.got is None:
            self.before, self.batch = copy.deepcopy(pl_module.state_dict()), batch

    def on_after_backward(self, trainer, pl_module):
        self.backwards += 1
        if self.backwards == 2:  # the second backward of the first batch, before its step
            scale = loss_scale(trainer) or 1.0
            self.got = {n: p.grad.double() / scale for n, p in pl_module.named_parameters() if p.grad is not None}
            self.after = copy.deepcopy(pl_module.state_dict())

    def distance(self, pl_module, state):  # task b's gradient at the weights `state`, in float64
        with torch.random.fork_rng():
            ref = type(pl_module)().double()
        ref.load_state_dict(state)
        images, labels = self.batch
        names = [n for n, _ in ref.named_parameters()]
        grads = torch.autograd.grad(
            ref.losses((images.double(), labels))[1], list(ref.parameters()), allow_unused=True
        )
        want = torch.cat([g.flatten() for n, g in zip(names, grads) if g is not None and n in self.got])
        got = torch.cat([self.got[n].flatten() for n, g in zip(names, grads) if g is not None and n in self.got])
        return float((got - want).norm() / want.norm())

    def record_extra(self):
        if self.got is None:
            return {"second_vs_before_step": None, "second_vs_after_step": None}
        module = self.module
        return {
            "second_vs_before_step": self.distance(module, self.before),
            "second_vs_after_step": self.distance(module, self.after),
        }

    def setup(self, trainer, pl_module, stage):
        self.module = pl_module


recipes = {
    "SAM raw steps": SAMRawSteps,
    "SAM through opt.step()": SAMThroughWrapper,
    "step between backwards": TwoTasks,
    "forward again": ForwardAgain,
    "forward again, cache off": ForwardAgainNoCache,
    "autograd.grad into p.grad": Surgery,
    "scaled_grads into p.grad": SurgeryScaled,
}
probes = {name: [FirstUpdate] for name in recipes}
for name in ("step between backwards", "forward again", "forward again, cache off"):
    probes[name].append(SecondBackward)
# fmt: off
RUNS = [
    # run id, recipe, precision
    #     options
    ("sam-fp32", "SAM raw steps", "32-true",
     {"label": "SAM raw steps, fp32", "trainer": {"limit_train_batches": 1}}),
    ("sam-fp16", "SAM raw steps", "16-mixed",
     {"label": "SAM raw steps, 16-mixed", "plugin": "init scale 1024", "trainer": {"limit_train_batches": 1}}),
    ("sam-wrapper-fp16", "SAM through opt.step()", "16-mixed",
     {"label": "SAM through opt.step(), 16-mixed", "plugin": "init scale 1024",
      "trainer": {"limit_train_batches": 1}}),
    ("between-fp32", "step between backwards", "32-true",
     {"label": "step between backwards, fp32", "trainer": {"limit_train_batches": 1}}),
    ("between-bf16", "step between backwards", "bf16-mixed",
     {"label": "step between backwards, bf16-mixed", "trainer": {"limit_train_batches": 1}}),
    ("again-fp32", "forward again", "32-true",
     {"label": "forward again, fp32", "trainer": {"limit_train_batches": 1}}),
    ("again-bf16", "forward again", "bf16-mixed",
     {"label": "forward again, bf16-mixed", "trainer": {"limit_train_batches": 1}}),
    ("again-nocache-bf16", "forward again, cache off", "bf16-mixed",
     {"label": "forward again in autocast(cache_enabled=False), bf16-mixed", "trainer": {"limit_train_batches": 1}}),
    ("surgery-fp32", "autograd.grad into p.grad", "32-true",
     {"label": "autograd.grad into p.grad, fp32", "trainer": {"limit_train_batches": 1}}),
    ("surgery-fp16", "autograd.grad into p.grad", "16-mixed",
     {"label": "autograd.grad into p.grad, 16-mixed", "plugin": "init scale 1024",
      "trainer": {"limit_train_batches": 1}}),
    ("scaled-fp16", "scaled_grads into p.grad", "16-mixed",
     {"label": "scaled_grads into p.grad, 16-mixed", "plugin": "init scale 1024",
      "trainer": {"limit_train_batches": 1}}),
]
# fmt: on
CLAIMS = [
    (
        "ratio",
        "sam-fp16",
        "sam-fp32",
        "first_update",
        "first_scale",
        "update-vs-fp32",
        "SAM raw steps, 16-mixed: the update is the loss scale times fp32's",
        {"only_if": "lightning-autocast-no-cache"},
    ),
    ("expect", "sam-fp16", "global_step", 0, "SAM raw steps: global_step stays 0"),
    (
        "ratio",
        "sam-wrapper-fp16",
        "sam-fp32",
        "first_update",
        1.0,
        "update-vs-fp32",
        "SAM through opt.step(), 16-mixed: fp32's update",
        {"only_if": "lightning-autocast-no-cache"},
    ),
    ("expect", "sam-wrapper-fp16", "steps_per_batch", 1.0, "SAM through opt.step(): global_step counts every batch"),
    (
        "raises",
        "between-fp32",
        "RuntimeError",
        "modified by an inplace operation",
        "step between backwards, fp32: raises",
    ),
    (
        "rate_ratio",
        "between-bf16",
        "second_vs_after_step/second_vs_before_step",
        "closer-weights",
        "step between backwards, bf16-mixed: the second backward sees the weights before the step",
    ),
    (
        "rate_ratio",
        "again-bf16",
        "second_vs_before_step/second_vs_after_step",
        "closer-weights",
        "forward again, bf16-mixed: the second backward sees the stepped weights",
        {"only_if": "lightning-autocast-no-cache"},
    ),
    (
        "ratio",
        "again-bf16",
        "again-fp32",
        "first_update",
        1.0,
        "update-vs-fp32",
        "forward again, bf16-mixed: fp32's update",
        {"only_if": "lightning-autocast-no-cache"},
    ),
    (
        "ratio",
        "surgery-fp16",
        "surgery-fp32",
        "first_update",
        "first_inverse_scale",
        "update-vs-fp32",
        "autograd.grad into p.grad, 16-mixed: 1/scale of fp32's update",
    ),
    (
        "ratio",
        "scaled-fp16",
        "surgery-fp32",
        "first_update",
        1.0,
        "update-vs-fp32",
        "scaled_grads into p.grad, 16-mixed: fp32's update",
    ),
    # PitfallChecks on every run (runner.with_checks): it names steps that bypass the wrapper; a step between two
    # backwards and gradients written into p.grad are among what its docstring says it cannot see
    ("flags", "sam-fp16", "step-frequencies", "PitfallChecks flags sam-fp16: step-frequencies"),
    ("clean", "sam-wrapper-fp16", "PitfallChecks: sam-wrapper-fp16 has no finding"),
    ("clean", "between-bf16", "PitfallChecks: between-bf16 has no finding (cannot see it)"),
    ("clean", "again-bf16", "PitfallChecks: again-bf16 has no finding", {"only_if": "lightning-autocast-no-cache"}),
    (
        "flags",
        "again-bf16",
        "autocast-cache",
        "PitfallChecks flags again-bf16 where Lightning's own autocast caches: autocast-cache",
        {"only_if": "lightning-autocast-caches"},
    ),
    (
        "rate_ratio",
        "again-nocache-bf16",
        "second_vs_before_step/second_vs_after_step",
        "closer-weights",
        "forward again without a cache, bf16-mixed, on every release: the stepped weights",
    ),
    (
        "ratio",
        "again-nocache-bf16",
        "again-fp32",
        "first_update",
        1.0,
        "update-vs-fp32",
        "forward again without a cache, bf16-mixed, on every release: fp32's update",
    ),
    ("clean", "again-nocache-bf16", "PitfallChecks: again-nocache-bf16 has no finding"),
    ("clean", "surgery-fp16", "PitfallChecks: surgery-fp16 has no finding (cannot see it)"),
    ("clean", "scaled-fp16", "PitfallChecks: scaled-fp16 has no finding"),
]


def scale_1024(precision, device):  # GradScaler starting at a loss scale of 1024: SAM's raw steps stay finite
    return MixedPrecision(precision, device, torch.amp.GradScaler(device, init_scale=1024))


plugins = {"init scale 1024": scale_1024}
record = runner.run_example(
    "plot_20_sam_retain_graph_and_surgery",
    recipes,
    RUNS,
    CLAIMS,
    plugins=plugins,
    probes=runner.with_checks(recipes, probes),
)
runner.print_findings(record)  # what PitfallChecks told each run (mpguide.checks)


# %%
# What each update was
# --------------------
# The first batch's update of each run over fp32's, from the same weights and the same batch. SAM's raw steps
# and the written gradients miss the loss scale in opposite directions; through ``opt.step()`` and with
# ``scaled_grads`` the updates are fp32's.

import matplotlib.pyplot as plt

pairs = [
    ("sam-fp16", "sam-fp32"),
    ("sam-wrapper-fp16", "sam-fp32"),
    ("again-bf16", "again-fp32"),
    ("surgery-fp16", "surgery-fp32"),
    ("scaled-fp16", "surgery-fp32"),
]
fig, ax = plotting.figure(1, 1, 10, 3.6)
plotting.describe(
    fig,
    "First update over fp32's: SAM's raw "
    "steps under 16-mixed take the loss "
    "scale times fp32's update, "
    "gradients written into p.grad 1/scale "
    "of it; through opt.step() and with "
    "scaled_grads they take fp32's",
)
ratios = [
    plotting.run_by_id(record, run)["extra"][
        "first_update"
    ][0]
    / plotting.run_by_id(record, ref)[
        "extra"
    ]["first_update"][0]
    for run, ref in pairs
]
ax.barh(
    [
        plotting.run_by_id(record, run)[
            "label"
        ]
        for run, _ in pairs
    ],
    ratios,
    color="#0072B2",
)
ax.set(
    xscale="log",
    xlabel="first update / fp32's",
)
ax.axvline(1.0, color="black", lw=0.8)
plotting.save_figure(
    fig, record["example"], "update_ratios"
)
plt.show()

for run_id in ("between-bf16", "again-bf16"):
    extra = plotting.run_by_id(
        record, run_id
    )["extra"]
    print(
        f"{run_id}: second backward vs the "
        "gradient at the weights before the "
        "step "
        f"{extra['second_vs_before_step']:.2g}, "
        "after it "
        f"{extra['second_vs_after_step']:.2g}"
    )
for run_id in (
    "sam-fp16",
    "sam-wrapper-fp16",
):
    run = plotting.run_by_id(record, run_id)
    print(
        f"{run_id}: trainer.global_step "
        f"{run['extra']['global_step']}"
    )


# %%
# Conclusion
# ----------
# Step through ``opt.step()``: a SAM step written around it trains like fp32 in every precision and counts in
# ``global_step``. A second backward after a step differentiates the old weights under autocast, where fp32
# refuses: forward again after the step, or take every backward first. Gradients you write into ``p.grad``
# under 16-mixed must carry the loss scale: take them with :func:`mpguide.steps.scaled_grads`.


# %%
# Evidence: the verdicts
# ----------------------

report.verdicts(record)
