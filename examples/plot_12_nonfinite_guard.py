"""
"Skip the step when the gradient norm is not finite" freezes 16-mixed training
==============================================================================

A common fp32 habit calls ``opt.step()`` only when the gradient norm after the backward is finite.
Under 16-mixed the gradients after ``manual_backward`` are still multiplied by the loss scale, so at
GradScaler's initial 65536 they overflow, the guard skips ``opt.step()``, and with it the only call
that lowers the scale (Lightning runs ``GradScaler.update()`` inside ``opt.step()``). The scale never
comes down and the model never changes. This example measures it and shows the guard that works:
always call ``opt.step()``, and find out afterwards whether GradScaler skipped it.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_12_nonfinite_guard.py

**What you will learn**: why a user-side finite check and GradScaler's own check must not both
decide; how to tell, after ``opt.step()``, that a step was skipped (the loss scale went down); that
the fp32 habit is harmless in fp32 and bf16-mixed, which have no loss scale. **Prerequisites**:
:doc:`plot_05_skipped_steps` (why GradScaler skips steps at all).
"""


# %%
# The habit
# ---------
# A digits classifier whose loss is **summed** over the batch of 64 (its gradients times 65536
# overflow fp16), with the guard many fp32 loops use to survive a bad batch.

import torch

from mpguide.models import DigitsClassifier

# sphinx_gallery_start_ignore
from mpguide.verify.run import runner

runner.quiet_lightning()
runner.check_settings(
    "plot_12_nonfinite_guard"
)  # MPGUIDE_* settings, before anything trains or prints
# sphinx_gallery_end_ignore


class SkipIfNotFinite(DigitsClassifier):
    def __init__(self):
        super().__init__(
            optimizer="adamw",
            lr=4e-4,
            reduction="sum",
        )

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.compute_loss(batch)
        self.manual_backward(loss)
        grad_norm = (
            torch.nn.utils.get_total_norm(
                [
                    p.grad
                    for p in self.parameters()
                ]
            )
        )
        # under 16-mixed: the norm of the
        # *scaled* gradients
        if torch.isfinite(grad_norm):
            opt.step()
        return loss.detach()


# %%
# Sixteen steps with the habit under 16-mixed
# -------------------------------------------
# The ``Trainer`` call to copy. On a GPU ``precision="16-mixed"`` is enough; on a CPU that flag
# silently becomes bf16-mixed, so the plugin is passed explicitly (a real fp16 autocast and GradScaler).

import lightning.pytorch as pl
from lightning.pytorch.plugins.precision import (
    MixedPrecision,
)

from mpguide.data import digits_loader

device = (
    "cuda"
    if torch.cuda.is_available()
    else "cpu"
)
pl.seed_everything(0)
model = SkipIfNotFinite()
initial_weights = model.weights()
trainer = pl.Trainer(
    accelerator=device,
    devices=1,
    max_epochs=1,
    limit_train_batches=16,
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
    "batches: 16, optimizer steps taken "
    "(trainer.global_step): "
    f"{trainer.global_step}"
)
changed = not torch.equal(
    initial_weights, model.weights()
)
print(f"weights changed: {changed}")
scaler = trainer.precision_plugin.scaler
print(
    "loss scale after the run: "
    f"{scaler.get_scale():g}"
)


# %%
# Sixteen batches, no optimizer step, unchanged weights, and the loss scale still at 65536. Note that
# ``max_steps`` would not have stopped this run: it counts ``opt.step()`` calls, and the guard made none.
#
# The right way
# -------------
# Always call ``opt.step()``: GradScaler unscales the gradients, checks them for inf/NaN, skips the
# step if it finds any and lowers the scale. Whether it skipped can be read afterwards from the
# scale: :func:`mpguide.steps.step_skip_aware` compares it before and after the step.

from mpguide import steps


class StepAndDetect(SkipIfNotFinite):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.compute_loss(batch)
        self.manual_backward(loss)
        # False: GradScaler skipped this step
        applied = steps.step_skip_aware(
            opt, self.trainer
        )
        self.log(
            "step_applied", float(applied)
        )
        return loss.detach()


# %%
# If the fp32 guard must stay (to skip NaN gradients from bad data in fp32 too), compute the norm
# on **unscaled** gradients: clip or measure inside ``on_before_optimizer_step``, which Lightning
# calls from within ``opt.step()`` after unscaling (see :doc:`plot_04_gradient_clipping`).


# %%
# Evidence: the runs and their claims
# -----------------------------------
# The habit in fp32, bf16-mixed and 16-mixed, step-and-detect in fp32 and 16-mixed, for the whole preset.
# The probes record, per batch, whether the parameters changed, and the loss scale at the end.

from mpguide.verify.show import plotting, report

recipes = {"skip if not finite": SkipIfNotFinite, "step and detect": StepAndDetect}
# fmt: off
RUNS = [
    # run id          recipe                 precision     options
    ("habit-fp32", "skip if not finite", "32-true", {"label": "habit, fp32"}),
    ("habit-bf16", "skip if not finite", "bf16-mixed", {"label": "habit, bf16-mixed"}),
    ("habit-fp16", "skip if not finite", "16-mixed", {"label": "habit, 16-mixed"}),
    ("detect-fp32", "step and detect", "32-true", {"label": "step and detect, fp32"}),
    ("detect-fp16", "step and detect", "16-mixed", {"label": "step and detect, 16-mixed"}),
]
CLAIMS = [
    ("expect", "habit-fp16", "updates_applied", 0, "habit, 16-mixed: not a single update is applied"),
    ("expect", "habit-fp16", "final_loss_scale", 65536.0, "habit, 16-mixed: the loss scale never leaves 65536"),
    ("diverge", "habit-fp16", "habit-fp32", "pitfall-gap", "habit, 16-mixed: the loss stays where it started"),
    ("expect", "habit-fp32", "all_updates_applied", True, "habit, fp32: every step applied (gradients finite)"),
    ("match", "habit-bf16", "habit-fp32", "mixed-vs-fp32", "habit, bf16-mixed = fp32 (no loss scale)"),
    ("same", "detect-fp32", "habit-fp32", "applied_per_step", "step and detect, fp32: same steps as the habit"),
    ("match", "detect-fp16", "habit-fp32", "mixed-vs-fp32", "step and detect, 16-mixed = fp32"),
    ("expect", "detect-fp16", "all_updates_applied", False, "step and detect, 16-mixed: some steps skipped"),
    # PitfallChecks on every run (runner.with_checks): each buggy run flags its section, each correct run is clean
    ("clean", "habit-fp32", "PitfallChecks: habit-fp32 has no finding"),
    ("clean", "habit-bf16", "PitfallChecks: habit-bf16 has no finding"),
    ("clean", "detect-fp32", "PitfallChecks: detect-fp32 has no finding"),
    ("clean", "detect-fp16", "PitfallChecks: detect-fp16 has no finding"),
    ("flags", "habit-fp16", "nonfinite-guard", "PitfallChecks flags habit-fp16: nonfinite-guard"),
]
# fmt: on

record = runner.run_example("plot_12_nonfinite_guard", recipes, RUNS, CLAIMS, probes=runner.with_checks(recipes))
runner.print_findings(record)  # what PitfallChecks told each run (mpguide.checks)


# %%
# Loss and loss scale
# -------------------
# Left: the habit's 16-mixed run stays at its initial loss while fp32 and bf16-mixed train. Right:
# its loss scale stays at 65536, while with ``opt.step()`` always called GradScaler lowers the
# scale in a few skipped steps and then trains like fp32.

import matplotlib.pyplot as plt

fig, (loss_ax, scale_ax) = plt.subplots(
    1, 2, figsize=(11, 4)
)
plotting.plot_loss_curves(
    loss_ax,
    record,
    [
        "habit-fp32",
        "habit-bf16",
        "habit-fp16",
        "detect-fp16",
    ],
    "Summed cross-entropy",
    {
        "habit-fp16": "#D55E00",
        "detect-fp16": "#009E73",
    },
)
for run_id, color in (
    ("habit-fp16", "#D55E00"),
    ("detect-fp16", "#009E73"),
):
    run = plotting.run_by_id(record, run_id)
    scale_ax.step(
        range(len(run["loss_scale"])),
        run["loss_scale"],
        where="post",
        color=color,
        label=run["label"],
    )
scale_ax.set(
    yscale="log",
    xlabel="batch",
    ylabel="loss scale at batch start",
    title="GradScaler's loss scale",
)
scale_ax.grid(alpha=0.3)
scale_ax.legend(
    loc="upper left",
    bbox_to_anchor=(1.02, 1),
    frameon=False,
    fontsize=8,
)
fig.tight_layout()
plotting.save_figure(
    fig, record["example"], "loss_scale"
)
plt.show()


# %%
# Steps applied
# -------------

for run_id in (
    "habit-fp32",
    "habit-bf16",
    "habit-fp16",
    "detect-fp16",
):
    extra = plotting.run_by_id(
        record, run_id
    )["extra"]
    print(
        f"{run_id:12s} updates applied: "
        f"{extra['updates_applied']:3d} of "
        f"{extra['batches']} batches, "
        "final loss scale: "
        f"{extra['final_loss_scale']}"
    )


# %%
# Conclusion
# ----------
# Under 16-mixed, never decide yourself whether to call ``opt.step()`` from the gradients that
# ``manual_backward`` left: they are scaled, and skipping the call also skips the scale update that
# would make them finite. Call ``opt.step()`` every time and detect skipped steps afterwards (the
# loss scale went down); put checks that need real gradient values into
# ``on_before_optimizer_step``, where they are already unscaled.


# %%
# Evidence: the verdicts
# ----------------------

report.verdicts(record)
