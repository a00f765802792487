"""
Skipped steps, learning-rate schedulers and step counts under 16-mixed
======================================================================

GradScaler starts at a loss scale of 65536 and halves it each time the scaled gradients overflow,
**skipping** that optimizer step. Skips at the start of a run are normal when the gradients are
large enough to overflow fp16 at that scale, as this example's summed loss makes them (runs whose
gradients stay small skip none). But a scheduler stepped every batch still advances on skipped
steps, so the first real update uses a later learning rate, and torch warns "Detected call of
``lr_scheduler.step()`` before ``optimizer.step()``". This example records, per step, the loss
scale, whether the step was skipped, and the learning rate used, with and without skip-aware
stepping.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_05_skipped_steps.py

**What you will learn**

* how to tell a skipped step (the loss scale went down inside ``opt.step()``);
* :func:`mpguide.steps.step_skip_aware`, which steps the scheduler only after applied updates;
* that ``trainer.global_step`` (and so ``max_steps``) counts skipped steps too;
* that it counts only the ``opt.step()`` calls made inside ``training_step``.
"""


# %%
# A per-batch schedule
# --------------------
# A digits classifier whose loss is **summed** over the batch: its gradients are 64 times those of
# the mean, large enough that the first steps overflow fp16 at a scale of 65536. The scheduler
# multiplies the learning rate by 0.97 per **step** (a warm schedule that users step by hand).

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
    "plot_05_skipped_steps"
)  # MPGUIDE_* settings, before anything trains or prints
# sphinx_gallery_end_ignore

BASE_LR, GAMMA = 2e-3, 0.97


class SchedulerEveryBatch(DigitsClassifier):
    """Step the scheduler after every
    ``opt.step()``, applied or not."""

    def __init__(self, **kwargs):
        super().__init__(
            reduction="sum",
            lr=BASE_LR,
            scheduler_gamma=GAMMA,
            **kwargs,
        )

    def training_step(self, batch, batch_idx):
        opt, sched = (
            self.optimizers(),
            self.lr_schedulers(),
        )
        opt.zero_grad()
        loss = self.compute_loss(batch)
        self.manual_backward(loss)
        self.step_and_schedule(opt, sched)
        return loss.detach()

    def step_and_schedule(self, opt, sched):
        opt.step()
        # also after a step that GradScaler
        # skipped
        sched.step()


class SkipAware(SchedulerEveryBatch):
    """Step the scheduler only when the
    optimizer step was applied."""

    def step_and_schedule(self, opt, sched):
        # the scheduler steps only if
        # opt.step() was applied
        steps.step_skip_aware(
            opt, self.trainer, sched
        )


# %%
# The ``Trainer`` call to copy
# ----------------------------
# The skip-aware module under 16-mixed. On a GPU ``precision="16-mixed"`` is enough; on a CPU that
# flag silently becomes bf16-mixed, which has no GradScaler and skips nothing, so Lightning's plugin
# is passed explicitly.

device = (
    "cuda"
    if torch.cuda.is_available()
    else "cpu"
)
pl.seed_everything(0)
model = SkipAware()
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
# one per applied optimizer step
scheduler_steps = (
    model.lr_schedulers().last_epoch
)
print(
    "optimizer steps: "
    f"{trainer.global_step}, of which "
    "GradScaler skipped "
    f"{trainer.global_step - scheduler_steps}"
)
lr = model.optimizers().param_groups[0]["lr"]
print(
    f"learning rate now: {lr:g}"
    f" = {BASE_LR:g} x "
    f"{GAMMA}^{scheduler_steps}"
)


# %%
# ``opt.step()`` outside ``training_step``
# ----------------------------------------
# Some projects call ``opt.step()`` from a hook that runs after ``training_step``, such as
# ``on_train_batch_end``. The weights update as they would from ``training_step``, but
# ``trainer.global_step`` does not count those steps, so ``max_steps`` never stops the run (nor do
# step-based checkpoints or logging intervals). Lightning counts a manual step through hooks that
# ``_ManualOptimization.on_run_start`` attaches to each ``LightningOptimizer`` for the duration of
# ``training_step`` only; ``on_run_end`` resets them before ``on_train_batch_end`` runs
# (``lightning/pytorch/loops/optimization/manual.py``, ``lightning/pytorch/core/optimizer.py``).


class StepInTrainingStep(DigitsClassifier):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.compute_loss(batch)
        self.manual_backward(loss)
        opt.step()
        return loss.detach()


class StepInBatchEndHook(DigitsClassifier):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.compute_loss(batch)
        self.manual_backward(loss)
        return loss.detach()

    def on_train_batch_end(
        self, outputs, batch, batch_idx
    ):
        # outside training_step: Lightning
        # does not count it
        self.optimizers().step()


# %%
# Evidence: the runs and their claims
# -----------------------------------
# Both ways of stepping run in fp32 from the same weights, the hook version with
# ``Trainer(max_steps=3)``. Two probes (callbacks: the modules carry no measuring code) record the
# learning rate of every update GradScaler applied (a batch whose loss scale went down was skipped,
# as ``steps.step_skip_aware`` decides it), and how often ``optimizer.step()`` really ran (a
# post-step hook of the torch optimizer counts it).

from lightning.pytorch.callbacks import Callback

from mpguide.verify.run import runner
from mpguide.verify.show import plotting, report


class AppliedLearningRates(Callback):
    measures = {
        "first_applied_lr": "nonnegative",
        "first_applied_lr_is_base": "bool",
        "skipped_steps": "count",
        "skipped_any": "bool",
        "global_step_counts_skipped": "bool",
    }

    def __init__(self):
        self.applied_lrs = []  # learning rate of every update that was really applied
        self.skipped, self.lr, self.scale, self.trainer = 0, None, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.trainer = trainer
        self.lr = trainer.optimizers[0].param_groups[0]["lr"]
        self.scale = steps.loss_scale(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.scale is None or steps.loss_scale(trainer) >= self.scale:
            self.applied_lrs.append(self.lr)
        else:
            self.skipped += 1

    def record_extra(self):
        return {
            "first_applied_lr": self.applied_lrs[0] if self.applied_lrs else None,
            "first_applied_lr_is_base": bool(self.applied_lrs) and self.applied_lrs[0] == BASE_LR,
            "skipped_steps": self.skipped,
            "skipped_any": self.skipped > 0,
            "global_step_counts_skipped": self.trainer.global_step == len(self.applied_lrs) + self.skipped,
        }


class OptimizerStepCalls(Callback):
    measures = {"step_calls": "count", "ran_past_max_steps": "bool"}

    def __init__(self):
        self.step_calls, self.max_steps = 0, None

    def on_train_start(self, trainer, pl_module):
        self.max_steps = trainer.max_steps
        trainer.optimizers[0].register_step_post_hook(self.count)

    def count(self, optimizer, args, kwargs):
        self.step_calls += 1

    def record_extra(self):
        return {"step_calls": self.step_calls, "ran_past_max_steps": self.step_calls > self.max_steps}


recipes = {
    "scheduler every batch": SchedulerEveryBatch,
    "skip-aware": SkipAware,
    "step in training_step": StepInTrainingStep,
    "step in on_train_batch_end": StepInBatchEndHook,
}
probes = {name: [AppliedLearningRates] for name in ("scheduler every batch", "skip-aware")}
probes["step in on_train_batch_end"] = [OptimizerStepCalls]
RUNS = [
    # run id            recipe                   precision   options
    ("fp32", "scheduler every batch", "32-true", {"label": "fp32"}),
    ("fp16-naive", "scheduler every batch", "16-mixed", {"label": "16-mixed, scheduler every batch"}),
    ("fp16-skip-aware", "skip-aware", "16-mixed", {"label": "16-mixed, skip-aware scheduler"}),
    ("step-fp32", "step in training_step", "32-true", {"label": "fp32, opt.step() in training_step"}),
    (
        "hook-fp32",
        "step in on_train_batch_end",
        "32-true",
        {"label": "fp32, opt.step() in on_train_batch_end, max_steps=3", "trainer": {"max_steps": 3}},
    ),
]
CLAIMS = [
    ("expect", "fp16-naive", "skipped_any", True, "GradScaler skips steps at the default initial scale"),
    ("expect", "fp16-naive", "first_applied_lr_is_base", False, "naive: the first real update uses a later LR"),
    (
        "warns",
        "fp16-naive",
        "UserWarning",
        "Detected call of `lr_scheduler.step()` before `optimizer.step()`",
        "naive: torch warns about the scheduler",
    ),
    ("expect", "fp16-skip-aware", "first_applied_lr", 0.002, "skip-aware: first real update uses the first LR"),
    (
        "no_warning",
        "fp16-skip-aware",
        "Detected call of `lr_scheduler.step()` before `optimizer.step()`",
        "skip-aware: no scheduler warning",
    ),
    ("expect", "fp16-naive", "global_step_counts_skipped", True, "global_step counts skipped steps too"),
    ("expect", "hook-fp32", "global_step", 0, "opt.step() in on_train_batch_end: global_step stays 0"),
    (
        "expect",
        "hook-fp32",
        "ran_past_max_steps",
        True,
        "opt.step() in on_train_batch_end: max_steps=3 never stops it",
    ),
    (
        "same",
        "hook-fp32",
        "step-fp32",
        "final_weights",
        "opt.step() in on_train_batch_end: the same weights as from training_step, bitwise",
    ),
    # PitfallChecks on every run (runner.with_checks): each buggy run flags its section, each correct run is clean
    ("clean", "fp32", "PitfallChecks: fp32 has no finding"),
    ("clean", "fp16-skip-aware", "PitfallChecks: fp16-skip-aware has no finding"),
    ("clean", "step-fp32", "PitfallChecks: step-fp32 has no finding"),
    ("flags", "fp16-naive", "schedulers", "PitfallChecks flags fp16-naive: schedulers"),
    ("flags", "hook-fp32", "step-frequencies", "PitfallChecks flags hook-fp32: step-frequencies"),
]

record = runner.run_example(
    "plot_05_skipped_steps", recipes, RUNS, CLAIMS, probes=runner.with_checks(recipes, probes)
)
runner.print_findings(record)  # what PitfallChecks told each run (mpguide.checks)


# %%
# Loss scale, skipped steps and learning rate
# -------------------------------------------
# Left: the loss scale of each 16-mixed run; every drop is a skipped step. Right: the learning
# rate each batch used. The naive run has moved down its schedule while nothing was updated; the
# skip-aware run starts its schedule at the first applied update, like fp32.

fig, (scale_ax, lr_ax) = plotting.figure(
    1, 2, 12, 5
)
plotting.describe(
    fig,
    "Skipped steps lower the loss scale; a "
    "naive per-batch scheduler decays on "
    "them, a skip-aware one does not",
)
colors = {
    "fp16-naive": "#D55E00",
    "fp16-skip-aware": "#009E73",
}
plotting.plot_run_series(
    scale_ax,
    record,
    ["fp16-naive", "fp16-skip-aware"],
    "loss_scale",
    colors,
    steps=True,
)
plotting.plot_run_series(
    lr_ax,
    record,
    ["fp32", "fp16-naive", "fp16-skip-aware"],
    "lr",
    colors,
)
scale_ax.set(
    yscale="log",
    ylabel="loss scale at batch start",
    title="GradScaler's loss scale",
)
lr_ax.set(
    yscale="log",
    ylabel="learning rate used",
    title="Learning rate",
)
plotting.save_figure(
    fig, record["example"], "scale_lr"
)
plt.show()


# %%
# Step counts
# -----------
# ``trainer.global_step`` counts ``opt.step()`` calls, skipped ones included, so ``max_steps``
# stops a run after that many calls whether or not they updated anything. And it counts only the
# calls made inside ``training_step``: the hook version stepped once per batch, changed the weights
# exactly as the ``training_step`` version did, and ran every batch although ``max_steps=3``.

for run_id in (
    "fp16-naive",
    "fp16-skip-aware",
    "step-fp32",
    "hook-fp32",
):
    run = plotting.run_by_id(record, run_id)
    extra, max_steps = (
        run["extra"],
        run["trainer_kwargs"].get(
            "max_steps", -1
        ),
    )
    line = (
        f"{run_id}: {extra['batches']} "
        "batches, trainer.global_step = "
        f"{extra['global_step']}, "
    )
    if "skipped_steps" in extra:
        line += (
            f"{extra['skipped_steps']} "
            "skipped, first applied lr "
            f"{extra['first_applied_lr']:.6g}"
            f" (base {BASE_LR:g})"
        )
    else:
        line += (
            f"max_steps = {max_steps}, final "
            "weights "
            f"{extra['final_weights'][:12]}"
        )
    print(line)


# %%
# Conclusion
# ----------
# Skipped steps at the start of a 16-mixed run are by design. If you step a scheduler by hand,
# step it only after applied updates (``mpguide.steps.step_skip_aware``, or compare the scale before
# and after ``opt.step()`` yourself), and remember that ``global_step`` counts every call made in
# ``training_step``, and none made anywhere else: call ``opt.step()`` inside ``training_step``.


# %%
# Evidence: the verdicts
# ----------------------

report.verdicts(record)
