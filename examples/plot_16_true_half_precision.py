"""
"True" half precision: lost updates, a frozen EMA teacher and AdamW's NaN
=========================================================================

``precision="bf16-true"`` and ``"16-true"`` do not mix precisions: Lightning casts the whole module to
bf16 or fp16 (``HalfPrecision.convert_module``, ``plugins/precision/half.py``), so weights, gradients
and optimizer state are all stored in half precision, with no autocast and no GradScaler. That halves
their memory, and costs the updates smaller than the weights' rounding step. This example measures,
on a manual-optimization student with an EMA teacher, that cost against fp32 and bf16-mixed, the two
errors it leads to, and the fixes that work.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_16_true_half_precision.py

**What you will learn**

* why most small SGD updates of bf16 weights round away (how many, measured), and an EMA teacher never moves;
* why an fp32 teacher next to bf16 weights raises, and AdamW's default ``eps`` turns fp16 weights into NaN;
* that ``"bf16-mixed"`` (fp32 weights, bf16 arithmetic) has none of these problems.

**Prerequisites**: :doc:`plot_01_porting_to_manual` (the EMA teacher), :doc:`plot_11_fp16_parameters`.
"""


# %%
# A student and its EMA teacher
# -----------------------------
# A digits classifier (4,810 weights) trained by SGD at ``lr=0.01``, and a "mean teacher": after each
# ``opt.step()`` every teacher weight moves a thousandth of the way to the student's (``lerp_``, decay
# 0.999). The teacher has no optimizer; it is a submodule, so Lightning casts it with the student.

import copy

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from mpguide.data import (
    NUM_CLASSES,
    NUM_FEATURES,
)

# sphinx_gallery_start_ignore
from mpguide.verify.run import runner

runner.quiet_lightning()
runner.check_settings(
    "plot_16_true_half_precision"
)  # MPGUIDE_* settings, before anything trains or prints
# sphinx_gallery_end_ignore

DECAY = 0.999


class StudentTeacher(pl.LightningModule):
    def __init__(
        self,
        optimizer="sgd",
        lr=0.01,
        eps=1e-8,
    ):
        super().__init__()
        self.automatic_optimization = False
        (
            self.optimizer_name,
            self.lr,
            self.eps,
        ) = optimizer, lr, eps
        self.student = nn.Sequential(
            nn.Linear(NUM_FEATURES, 64),
            nn.Tanh(),
            nn.Linear(64, NUM_CLASSES),
        )
        self.teacher = copy.deepcopy(
            self.student
        ).requires_grad_(False)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        opt = self.optimizers()
        opt.zero_grad()
        loss = F.cross_entropy(
            self.student(images).float(),
            labels,
        )
        self.manual_backward(loss)
        opt.step()
        self.update_teacher()
        return loss.detach()

    @torch.no_grad()
    def update_teacher(self):
        for teacher, student in zip(
            self.teacher.parameters(),
            self.student.parameters(),
            strict=True,
        ):
            # teacher += (1 - DECAY) *
            # (student - teacher)
            teacher.lerp_(student, 1 - DECAY)

    def configure_optimizers(self):
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(
                self.student.parameters(),
                lr=self.lr,
            )
        return torch.optim.AdamW(
            self.student.parameters(),
            lr=self.lr,
            eps=self.eps,
        )


# %%
# The ``Trainer`` call to copy: ``"bf16-mixed"``
# ----------------------------------------------
# Under ``"bf16-mixed"`` weights, teacher and update stay in fp32; autocast runs the matmuls in bf16.

from mpguide.data import digits_loader

device = (
    "cuda"
    if torch.cuda.is_available()
    else "cpu"
)
pl.seed_everything(0)
model = StudentTeacher()
trainer = pl.Trainer(
    accelerator=device,
    devices=1,
    max_steps=20,
    precision="bf16-mixed",
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(
    model, digits_loader(batch_size=64)
)
print(
    "student: "
    f"{model.student[0].weight.dtype}, "
    "teacher: "
    f"{model.teacher[0].weight.dtype}, "
    f"steps: {trainer.global_step}"
)


# %%
# If the model must be *stored* in bf16 (``"bf16-true"``, to fit in memory), keep the teacher in fp32:
# cast it back in ``on_fit_start`` (Lightning casts the whole module at setup, before it). ``lerp_`` then
# needs both operands in fp32: passing the bf16 student weights raises; ``student.float()`` is the fix.


class FP32Teacher(StudentTeacher):
    def on_fit_start(self):
        # Lightning cast the whole module to
        # bf16 at setup
        self.teacher.float()


class FP32TeacherFromCast(FP32Teacher):
    @torch.no_grad()
    def update_teacher(self):
        for teacher, student in zip(
            self.teacher.parameters(),
            self.student.parameters(),
            strict=True,
        ):
            # both operands in fp32
            teacher.lerp_(
                student.float(), 1 - DECAY
            )


# %%
# Evidence: the runs and their claims
# -----------------------------------
# Same weights and batches for every run. :class:`mpguide.verify.run.probes.LostUpdates` counts the weight
# elements with a gradient that did not change; ``WeightsMoved`` (a callback), which weights moved.

from lightning.pytorch.callbacks import Callback

from mpguide.verify.show import plotting, report


class WeightsMoved(Callback):
    measures = {
        "student_moved": "count",
        "teacher_moved": "count",
        "teacher_elements": "count",
        "teacher_unchanged": "count",
        "teacher_followed": "count",
        "teacher_frozen": "count",
        "nonfinite_weights": "count",
        "weight_dtype": "name",
        "teacher_dtype": "name",
    }

    def on_fit_start(self, trainer, pl_module):
        self.module = pl_module
        self.start = {name: p.detach().float().clone() for name, p in pl_module.named_parameters()}

    def record_extra(self):
        params = list(self.module.named_parameters())

        def moved(prefix):
            return torch.cat(
                [(p.detach().float() != self.start[n]).flatten() for n, p in params if n.startswith(prefix)]
            )

        student, teacher = moved("student."), moved("teacher.")
        weights = torch.cat([p.detach().float().flatten() for p in self.module.student.parameters()])
        return {
            "student_moved": int(student.sum()),
            "teacher_moved": int(teacher.sum()),
            "teacher_elements": teacher.numel(),
            "teacher_unchanged": int((~teacher).sum()),
            "teacher_followed": int((student & teacher).sum()),
            "teacher_frozen": int((student & ~teacher).sum()),
            "weight_dtype": str(self.module.student[0].weight.dtype).replace("torch.", ""),
            "teacher_dtype": str(self.module.teacher[0].weight.dtype).replace("torch.", ""),
            "nonfinite_weights": int((~torch.isfinite(weights)).sum()),
        }


recipes = {
    "teacher in the module's dtype": StudentTeacher,
    "fp32 teacher from bf16 weights": FP32Teacher,
    "fp32 teacher from weights cast to fp32": FP32TeacherFromCast,
    "AdamW": lambda: StudentTeacher(optimizer="adamw", lr=1e-3),
    "AdamW with eps 1e-4": lambda: StudentTeacher(optimizer="adamw", lr=1e-3, eps=1e-4),
}
probes = {name: [WeightsMoved] for name in recipes}
RUNS = [
    # run id               recipe                                    precision     options
    ("fp32", "teacher in the module's dtype", "32-true", {"label": "SGD, fp32"}),
    ("bf16-mixed", "teacher in the module's dtype", "bf16-mixed", {"label": "SGD, bf16-mixed"}),
    ("bf16-true", "teacher in the module's dtype", "bf16-true", {"label": "SGD, bf16-true (bf16 teacher)"}),
    ("fp32-teacher", "fp32 teacher from bf16 weights", "bf16-true", {"label": "SGD, bf16-true, fp32 teacher"}),
    (
        "fp32-teacher-cast",
        "fp32 teacher from weights cast to fp32",
        "bf16-true",
        {"label": "SGD, bf16-true, fp32 teacher from cast weights"},
    ),
    ("adamw-fp32", "AdamW", "32-true", {"label": "AdamW, fp32"}),
    ("adamw-16-mixed", "AdamW", "16-mixed", {"label": "AdamW, 16-mixed"}),
    ("adamw-16-true", "AdamW", "16-true", {"label": "AdamW, 16-true", "trainer": {"detect_anomaly": True}}),
    ("adamw-16-true-eps", "AdamW with eps 1e-4", "16-true", {"label": "AdamW eps=1e-4, 16-true"}),
]
CLAIMS = [
    (
        "rate_ratio",
        "bf16-true",
        "updates_lost/updates_with_gradient",
        "pitfall-majority",
        "bf16-true: most SGD updates round away",
    ),
    ("rate_ratio", "fp32", "updates_kept/updates_with_gradient", "updates-kept", "fp32: every update is kept"),
    (
        "rate_ratio",
        "bf16-mixed",
        "updates_kept/updates_with_gradient",
        "updates-kept",
        "bf16-mixed (fp32 weights): every update is kept",
    ),
    ("match", "bf16-mixed", "fp32", "mixed-vs-fp32", "bf16-mixed = fp32"),
    (
        "rate_ratio",
        "bf16-true",
        "teacher_frozen/student_moved",
        "pitfall-majority",
        "bf16 teacher: most weights never follow the student",
    ),
    ("rate_ratio", "fp32", "teacher_followed/student_moved", "updates-kept", "fp32 teacher follows the student"),
    (
        "raises",
        "fp32-teacher",
        "RuntimeError",
        "expected dtype float for `end`",
        "fp32 teacher, bf16 weights: lerp_ refuses mixed dtypes",
    ),
    (
        "rate_ratio",
        "fp32-teacher-cast",
        "teacher_followed/student_moved",
        "updates-kept",
        "fix: fp32 teacher from weights cast to fp32 follows the student",
    ),
    ("raises", "adamw-16-true", "RuntimeError", "returned nan values", "16-true, AdamW eps=1e-8: NaN"),
    ("expect", "adamw-16-true", "batches", 1, "16-true, AdamW eps=1e-8: NaN weights after the first step"),
    (
        "diverge",
        "adamw-16-true-eps",
        "adamw-fp32",
        "pitfall-gap",
        "16-true, AdamW eps=1e-4: finite, but another optimizer than fp32's AdamW",
    ),
    ("match", "adamw-16-mixed", "adamw-fp32", "mixed-vs-fp32", "fix: AdamW under 16-mixed = fp32"),
    # PitfallChecks on every run (runner.with_checks): each buggy run flags its section, each correct run is clean
    ("clean", "fp32", "PitfallChecks: fp32 has no finding"),
    ("clean", "bf16-mixed", "PitfallChecks: bf16-mixed has no finding"),
    ("clean", "adamw-fp32", "PitfallChecks: adamw-fp32 has no finding"),
    ("clean", "adamw-16-mixed", "PitfallChecks: adamw-16-mixed has no finding"),
    ("clean", "adamw-16-true-eps", "PitfallChecks: adamw-16-true-eps has no finding"),
    ("flags", "bf16-true", "fp16-parameters", "PitfallChecks flags bf16-true: fp16-parameters"),
    ("flags", "fp32-teacher-cast", "fp16-parameters", "PitfallChecks flags fp32-teacher-cast: fp16-parameters"),
    ("flags", "adamw-16-true", "fp16-parameters", "PitfallChecks flags adamw-16-true: fp16-parameters"),
]

record = runner.run_example(
    "plot_16_true_half_precision", recipes, RUNS, CLAIMS, probes=runner.with_checks(recipes, probes)
)


# %%
# Updates that round away, a teacher that never moves
# ---------------------------------------------------
# bf16 keeps 8 significant bits: a weight of 0.1 moves in steps of 2**-11 (about 4.9e-4), so with
# ``lr=0.01`` every gradient element below about 0.024 in such a weight is lost (fp32, or bf16-mixed's
# fp32 weights, lose almost nothing). The teacher's step, ``(1 - 0.999) x (student - teacher)``, is far
# below that: a bf16 teacher stays where it started. The lost updates are the small ones, so the
# bf16-true student still learns, at about half of fp32's pace (loss: mean of the last 10 batches).

start = plotting.run_by_id(record, "fp32")[
    "loss"
][0]
for run_id in (
    "fp32",
    "bf16-mixed",
    "bf16-true",
    "fp32-teacher-cast",
    "adamw-16-true-eps",
):
    run = plotting.run_by_id(record, run_id)
    # a run that raised instead of training
    # has nothing to show here
    if run["error"]:
        continue
    x, lost = (
        run["extra"],
        run["extra"]["updates_lost"]
        / run["extra"][
            "updates_with_gradient"
        ],
    )
    print(
        f"{run_id:17s} "
        f"{x['weight_dtype']:8s} updates "
        f"lost {lost:5.1%}, loss {start:.3f} "
        "-> "
        f"{sum(run['loss'][-10:]) / 10:.3f}; "
        f"{x['teacher_dtype']} teacher "
        "followed "
        f"{x['teacher_followed']} of "
        f"{x['student_moved']} moved weights"
    )


# %%
# The two errors, and the curves
# -------------------------------
# ``torch.lerp`` needs ``end`` in the dtype of the tensor it updates and does not promote. AdamW keeps
# its moments in the parameters' dtype: its default ``eps=1e-8`` is below fp16's smallest number (about
# 6e-8) and rounds to 0, and so do squared gradients below about 2.4e-4. The first update divides by
# ``sqrt(0) + 0``: the weights become inf and NaN (the errors, verbatim, in the verdicts; PitfallChecks
# flags the AdamW run). ``eps=1e-4`` trains, but as another optimizer; 16-mixed keeps AdamW as it is.

run = plotting.run_by_id(
    record, "adamw-16-true"
)
x, n = run["extra"], len(run["loss"])
print(
    "AdamW, 16-true: "
    f"{x.get('nonfinite_weights')} of "
    f"{x.get('teacher_elements')} weights "
    f"non-finite after {n} step"
)

import matplotlib.pyplot as plt

fig, (sgd_ax, adam_ax, lost_ax) = (
    plotting.figure(1, 3, 14, 3.5)
)
plotting.describe(
    fig,
    "Students trained in fp32, mixed and "
    "true half precision: SGD, AdamW, and "
    "the updates lost",
)
plotting.plot_loss_curves(
    sgd_ax,
    record,
    [
        "fp32",
        "bf16-mixed",
        "bf16-true",
        "fp32-teacher",
    ],
    "SGD, lr=0.01",
)
plotting.plot_loss_curves(
    adam_ax,
    record,
    [
        "adamw-fp32",
        "adamw-16-mixed",
        "adamw-16-true",
        "adamw-16-true-eps",
    ],
    "AdamW, lr=1e-3",
)
colors = {
    "fp32": "#0072B2",
    "bf16-mixed": "#E69F00",
    "bf16-true": "#D55E00",
    "adamw-16-true-eps": "#CC79A7",
}
what = (
    "lost_fraction_per_step",
    "Updates lost per step",
    "lost / elements with a gradient",
)
plotting.plot_extra_series(
    lost_ax,
    record,
    list(colors),
    *what,
    colors,
)
plotting.save_figure(
    fig, record["example"], "curves"
)
plt.show()


# %%
# Conclusion
# ----------
# ``"bf16-true"`` and ``"16-true"`` store weights, gradients and optimizer state in half precision: use
# them only where updates are large against the weights' rounding step, never for an EMA copy (keep it
# in fp32, updated from weights cast to fp32); AdamW needs an ``eps`` fp16 can represent, and is then
# another optimizer. To keep every update, keep fp32 master weights: ``"bf16-mixed"`` or ``"16-mixed"``.


# %%
# Evidence: the verdicts
# ----------------------

report.verdicts(record)
