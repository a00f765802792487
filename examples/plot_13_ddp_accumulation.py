"""
Manual accumulation with DDP: synchronize once per window
=========================================================

With ``Trainer(strategy="ddp", devices=2)`` every ``manual_backward`` all-reduces the gradients
between the processes. When you accumulate by hand, only the last micro-batch of a window needs
that: wrap the others in ``opt.toggle_model(sync_grad=False)``, which enters the strategy's
``no_sync`` (Lightning 2.6.6, ``core/optimizer.py`` and ``loops/utilities.py``). This example
trains two real processes over gloo on the CPU and checks that skipping the synchronisation
changes nothing but the traffic, in fp32 and in 16-mixed.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_13_ddp_accumulation.py

**What you will learn**

* the accumulation loop with ``toggle_model(sync_grad=...)``, and what it saves (all-reduces, bytes);
* that DDP on two processes equals one process with the same global batch;
* why, under 16-mixed, GradScaler's skip decision is the same on every rank, and how to break it.

**Prerequisites**: the accumulation recipe of :ref:`sphx_glr_auto_examples_plot_06_accumulation.py`.
"""


# %%
# The recipe
# ----------
# Each window has ``N = 4`` micro-batches; the loss is divided by N so the window's summed gradient
# is an average. ``toggle_model(sync_grad=False)`` blocks DDP's all-reduce for the backward inside
# it; the last micro-batch syncs the whole sum at once. Outside DDP the context is a no-op.

from mpguide.models import DigitsClassifier

# sphinx_gallery_start_ignore
from mpguide.verify.run import runner

runner.quiet_lightning()
runner.check_settings(
    "plot_13_ddp_accumulation"
)  # MPGUIDE_* settings, before anything trains or prints
# sphinx_gallery_end_ignore

N = 4  # micro-batches per optimizer step


class AccumulateSyncAtWindowEnd(
    DigitsClassifier
):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        last = (batch_idx + 1) % N == 0
        with opt.toggle_model(
            sync_grad=self.sync(last)
        ):
            loss = self.compute_loss(batch)
            self.manual_backward(loss / N)
        if last:
            opt.step()
            opt.zero_grad()
        return loss.detach()

    def sync(self, last_micro_batch):
        # all-reduce once per window
        return last_micro_batch


# %%
# The ``Trainer`` call to copy
# ----------------------------
# On two GPUs; ``strategy="ddp"`` starts the other process by running your script again, so the
# call belongs under ``if __name__ == "__main__":``::
#
#     import lightning.pytorch as pl
#
#     from mpguide.data import digits_loader
#
#     if __name__ == "__main__":
#         pl.seed_everything(0)
#         model = AccumulateSyncAtWindowEnd()
#         trainer = pl.Trainer(
#             accelerator="gpu",
#             devices=2,
#             strategy="ddp",
#             precision="16-mixed",
#             max_epochs=1,
#             logger=False,
#             enable_checkpointing=False,
#         )
#         # 32 samples per process and micro-batch
#         trainer.fit(
#             model, digits_loader(batch_size=32)
#         )
#
# This page cannot run that cell: inside the docs build the script ``"ddp"`` would run again is
# ``sphinx-build``. Its runs use ``strategy="ddp_fork"`` (it forks the process that calls ``fit``)
# with ``accelerator="cpu"`` (gloo), and give each process half of one global batch.
#
# Two variants: syncing every micro-batch (what a plain loop does, the reference), and the mistake
# of never syncing (each process trains its own model).


class AccumulateSyncEveryMicroBatch(
    AccumulateSyncAtWindowEnd
):
    def sync(self, last_micro_batch):
        return True


class AccumulateNeverSync(
    AccumulateSyncAtWindowEnd
):
    def sync(self, last_micro_batch):
        # the mistake: the replicas are never
        # averaged
        return False


# %%
# Evidence: the runs and their claims
# -----------------------------------
# ``{"strategy": "ddp_fork", "devices": 2}`` works both in a script and inside the docs build (see
# :mod:`mpguide.verify.run.distributed` for why not ``"ddp"`` or ``"ddp_spawn"``). The single process sees
# each global batch of 64 whole, each DDP rank 32 samples of it. For 16-mixed, rank 0 alone gets an
# infinite gradient on the first (unsynchronised) micro-batch of windows 0 and 10.

from mpguide import steps
from mpguide.verify.run import distributed, runner
from mpguide.verify.show import plotting, report

OVERFLOW_WINDOWS = (0, 10)


def overflow_on_rank_zero(recipe):
    class WithOverflow(recipe):
        def __init__(self):
            super().__init__()
            self.micro_batch = 0
            for p in self.parameters():
                p.register_hook(self.maybe_overflow)

        def training_step(self, batch, batch_idx):
            self.micro_batch = batch_idx % N
            return super().training_step(batch, batch_idx)

        def maybe_overflow(self, grad):  # global_step counts optimizer steps: the window index
            if (
                self.global_rank == 0
                and self.micro_batch == 0
                and self.global_step in OVERFLOW_WINDOWS
                and steps.loss_scale(self.trainer) is not None
            ):
                return grad * float("inf")
            return grad

    return WithOverflow


recipes = {
    "sync at window end": AccumulateSyncAtWindowEnd,
    "sync every micro-batch": AccumulateSyncEveryMicroBatch,
    "sync at window end, overflow on rank 0": overflow_on_rank_zero(AccumulateSyncAtWindowEnd),
    "never sync, overflow on rank 0": overflow_on_rank_zero(AccumulateNeverSync),
}
RUNS = [
    # run id               recipe                                    precision   options
    ("single-fp32", "sync at window end", "32-true", {"label": "1 process, global batch 64, fp32"}),
    (
        "ddp-fp32-every",
        "sync every micro-batch",
        "32-true",
        {"trainer": {"strategy": "ddp_fork", "devices": 2}, "label": "DDP x2, sync every micro-batch, fp32"},
    ),
    (
        "ddp-fp32-window-end",
        "sync at window end",
        "32-true",
        {"trainer": {"strategy": "ddp_fork", "devices": 2}, "label": "DDP x2, sync at window end, fp32"},
    ),
    (
        "ddp-16-window-end",
        "sync at window end, overflow on rank 0",
        "16-mixed",
        {"trainer": {"strategy": "ddp_fork", "devices": 2}, "label": "DDP x2, sync at window end, 16-mixed"},
    ),
    (
        "ddp-16-never",
        "never sync, overflow on rank 0",
        "16-mixed",
        {"trainer": {"strategy": "ddp_fork", "devices": 2}, "label": "DDP x2, never sync (mistake), 16-mixed"},
    ),
]
CLAIMS = [
    (
        "match",
        "ddp-fp32-window-end",
        "ddp-fp32-every",
        "same-precision",
        "sync at window end = sync every micro-batch (fp32)",
    ),
    ("match", "ddp-fp32-window-end", "single-fp32", "same-precision", "DDP x2 = 1 process, same global batch"),
    ("expect", "ddp-fp32-every", "allreduces_per_optimizer_step", 4.0, "sync every micro-batch: 4 all-reduces/step"),
    ("expect", "ddp-fp32-window-end", "allreduces_per_optimizer_step", 1.0, "sync at window end: 1 all-reduce/step"),
    (
        "expect",
        "ddp-fp32-window-end",
        "allreduce_bytes_per_optimizer_step",
        19240,
        "one all-reduce = 4810 fp32 gradients",
    ),
    ("expect", "ddp-fp32-window-end", "weights_agree_across_ranks", True, "replicas stay bitwise equal"),
    (
        "expect",
        "ddp-16-window-end",
        "skipped_batches_per_rank",
        [[3, 43], [3, 43]],
        "16-mixed: overflow on rank 0 alone skips the window on both ranks",
    ),
    ("expect", "ddp-16-window-end", "weights_agree_across_ranks", True, "16-mixed: replicas stay bitwise equal"),
    ("expect", "ddp-16-never", "skipped_batches_per_rank", [[3, 43], []], "never syncing: only rank 0 skips"),
    ("expect", "ddp-16-never", "weights_agree_across_ranks", False, "never syncing: the replicas drift apart"),
]

record = runner.run_example("plot_13_ddp_accumulation", recipes, RUNS, CLAIMS, train=distributed.train_run)


# %%
# The same training, a quarter of the traffic
# -------------------------------------------
# Left: the smoothed loss of the global batch (the mean of the two ranks' losses); the DDP runs lie
# on the single process's curve (covered curves carry markers, their legend says how far apart).
# Right: what each run all-reduced per rank.

import matplotlib.pyplot as plt

fig, (curves, traffic) = plotting.figure(
    1, 2, 12, 5.6
)
plotting.describe(
    fig,
    "DDP with manual accumulation: syncing "
    "only at the window end gives the "
    "single-process "
    "curve with a quarter of the all-reduces",
)
plotting.plot_loss_curves(
    curves,
    record,
    [
        "single-fp32",
        "ddp-fp32-every",
        "ddp-fp32-window-end",
    ],
    "Loss of the global batch",
    colors={
        "ddp-fp32-every": "#E69F00",
        "ddp-fp32-window-end": "#009E73",
    },
    labels={
        "single-fp32": "1 process",
        "ddp-fp32-every": "DDP x2, "
        "sync every micro-batch",
        "ddp-fp32-window-end": "DDP x2, "
        "sync at window end",
    },
)
runs = [
    plotting.run_by_id(record, i)
    for i in [
        "ddp-fp32-every",
        "ddp-fp32-window-end",
        "ddp-16-window-end",
        "ddp-16-never",
    ]
]
traffic.barh(
    [r["label"] for r in runs],
    [
        r["extra"]["allreduce_bytes"] / 1e6
        for r in runs
    ],
    color="#56B4E9",
)
for y, r in enumerate(runs):
    label = (
        f"{r['extra']['allreduce_calls']} "
        "all-reduces"
    )
    traffic.annotate(
        label,
        (0, y),
        xytext=(4, 0),
        textcoords="offset points",
        va="center",
        fontsize=plotting.LEGEND_SIZE,
    )
traffic.set(
    xlabel=(
        "gradient bytes all-reduced per "
        "rank (MB)"
    ),
    title="Communication per run",
)
traffic.invert_yaxis()
plotting.save_figure(
    fig, record["example"], "traffic"
)
plt.show()

every, window_end = (
    runs[0]["extra"],
    runs[1]["extra"],
)
saved = (
    every["allreduce_bytes"]
    - window_end["allreduce_bytes"]
)
calls = (
    every["allreduce_calls"]
    - window_end["allreduce_calls"]
)
share = saved / every["allreduce_bytes"]
print(
    "sync at window end saves "
    f"{calls} all-reduces and "
    f"{saved / 1e6:.2f} MB per rank "
    f"({share:.0%}) over "
    f"{window_end['global_step']} steps"
)


# %%
# Skip decisions under 16-mixed
# -----------------------------
# GradScaler looks for inf/NaN in each rank's own gradients; nothing in it talks to the other rank.
# The ranks agree because DDP averages the gradients first: rank 0's infinity reaches rank 1 in the
# window's last all-reduce, so both skip that step. Never syncing, rank 0 skips alone and the two
# processes now hold different models.

fig, ax = plotting.figure(1, 1, 10, 3.8)
plotting.describe(
    fig,
    "Synced at the window end, both ranks "
    "skip the same 16-mixed steps; never "
    "synced, rank 0 skips alone",
)
for row, run_id in enumerate(
    ["ddp-16-window-end", "ddp-16-never"]
):
    for rank, skipped in enumerate(
        plotting.run_by_id(record, run_id)[
            "extra"
        ]["skipped_batches_per_rank"]
    ):
        ax.plot(
            skipped,
            [2 * row + rank] * len(skipped),
            "x",
            color="#D55E00",
            markersize=9,
        )
        ax.axhline(
            2 * row + rank,
            color="#999999",
            linewidth=0.5,
        )
ax.set_yticks(
    range(4),
    [
        "sync at window end, rank 0",
        "sync at window end, rank 1",
        "never sync, rank 0",
        "never sync, rank 1",
    ],
)
ax.set(
    xlabel=(
        "micro-batch (x = GradScaler "
        "skipped the step ending here)"
    ),
    xlim=(-2, 60),
    ylim=(-0.7, 3.7),
    title=(
        "Skipped optimizer steps per rank, "
        "16-mixed"
    ),
)
plotting.save_figure(
    fig, record["example"], "skips"
)
plt.show()


# %%
# Conclusion
# ----------
# Accumulating under DDP, block the all-reduce on all but the last micro-batch of each window with
# ``opt.toggle_model(sync_grad=False)`` (or ``self.trainer.strategy.model.no_sync()``): training is
# unchanged and the traffic drops by the accumulation factor. Never skip the last one: DDP's
# all-reduce keeps the replicas equal and, under 16-mixed, makes every rank take the same skip
# decision. The runs here are CPU processes over gloo; NCCL on GPUs synchronises the same way.


# %%
# Evidence: the verdicts
# ----------------------

report.verdicts(record)
