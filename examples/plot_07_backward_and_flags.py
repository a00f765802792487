"""
``loss.backward()`` vs ``manual_backward``, and what ``precision="16-mixed"`` means on a CPU
============================================================================================

Two things decide whether 16-mixed really runs. ``self.manual_backward(loss)`` is where Lightning
multiplies the loss by the GradScaler's scale; a plain ``loss.backward()`` skips that, and the first
``opt.step()`` fails (under bf16-mixed, which has no scaler, the same code runs silently). And
``Trainer(precision="16-mixed")`` on a CPU quietly trains in bf16-mixed, with no scaler at all.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_07_backward_and_flags.py

**What you will learn**: why ``manual_backward`` is not optional under 16-mixed and why bf16-mixed
hides it; how to get a real fp16 autocast and a GradScaler on a CPU, as every example of this site does.
"""


# %%
# ``loss.backward()`` in a manual ``training_step``
# -------------------------------------------------
# ``manual_backward`` goes through the precision plugin; ``loss.backward()`` goes straight to autograd.

import functools

import torch

from mpguide.models import DigitsClassifier

# sphinx_gallery_start_ignore
from mpguide.verify.run import runner

runner.quiet_lightning()
runner.check_settings(
    "plot_07_backward_and_flags"
)  # MPGUIDE_* settings, before anything trains or prints
# sphinx_gallery_end_ignore


class Manual(DigitsClassifier):
    """Manual optimization with either
    backward call."""

    def __init__(
        self, plain_backward=False, **kwargs
    ):
        super().__init__(**kwargs)
        self.plain_backward = plain_backward

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.compute_loss(batch)
        if self.plain_backward:
            # bypasses the precision plugin:
            # no loss scaling
            loss.backward()
        else:
            self.manual_backward(loss)
        opt.step()
        return loss.detach()


# %%
# The ``Trainer`` call to copy
# ----------------------------
# Real 16-mixed on any machine. On a GPU ``precision="16-mixed"`` is enough; on a CPU that flag
# silently becomes bf16-mixed (no GradScaler), so Lightning's plugin is passed explicitly.

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
model = Manual(optimizer="sgd", lr=0.05)
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
scaler = trainer.precision_plugin.scaler
print(
    "Trainer.precision = "
    f"{trainer.precision!r}, GradScaler: "
    f"{scaler is not None}, "
    f"optimizer steps: {trainer.global_step}"
)


# %%
# Evidence: the runs and their claims
# -----------------------------------
# Both backward calls under 16-mixed and bf16-mixed, plus the plain ``precision="16-mixed"`` flag. The
# probes record which precision the ``Trainer`` really used and whether it had a GradScaler; on a GPU
# the plain flag gets a real GradScaler, and the claims say so instead.

from mpguide.verify.show import plotting, report

recipes = {
    "manual_backward": functools.partial(Manual, optimizer="sgd", lr=0.05),
    "loss.backward()": functools.partial(Manual, plain_backward=True, optimizer="sgd", lr=0.05),
}
RUNS = [
    # run id                  recipe             precision     options
    ("fp16-manual-backward", "manual_backward", "16-mixed", {"label": "16-mixed, manual_backward"}),
    ("fp16-loss-backward", "loss.backward()", "16-mixed", {"label": "16-mixed, loss.backward()"}),
    ("bf16-manual-backward", "manual_backward", "bf16-mixed", {"label": "bf16-mixed, manual_backward"}),
    ("bf16-loss-backward", "loss.backward()", "bf16-mixed", {"label": "bf16-mixed, loss.backward()"}),
    ("flag-16-mixed", "manual_backward", "16-mixed", {"plain_flag": True, "label": 'Trainer(precision="16-mixed")'}),
]
CLAIMS = [
    (
        "raises",
        "fp16-loss-backward",
        "AssertionError",
        "Attempted unscale_ but _scale is None",
        "16-mixed: loss.backward() fails at the first step",
    ),
    (
        "match",
        "bf16-loss-backward",
        "bf16-manual-backward",
        "same-precision",
        "bf16-mixed: loss.backward() silently equals manual_backward",
    ),
    ("expect", "fp16-manual-backward", "has_scaler", True, "16-mixed as this site runs it has a GradScaler"),
    (
        "warns",
        "flag-16-mixed",
        "UserWarning",
        "AMP with fp16 is not supported on CPU",
        "CPU: the plain flag warns and falls back",
        {"only_on": "cpu"},
    ),
    (
        "expect",
        "flag-16-mixed",
        "trainer_precision",
        "bf16-mixed",
        "CPU: the plain flag trains in bf16-mixed",
        {"only_on": "cpu"},
    ),
    ("expect", "flag-16-mixed", "has_scaler", False, "CPU: ... with no GradScaler at all", {"only_on": "cpu"}),
    ("expect", "flag-16-mixed", "has_scaler", True, "GPU: the plain flag has a GradScaler", {"only_on": "cuda"}),
    # PitfallChecks on every run (runner.with_checks): each buggy run flags its section, each correct run is clean
    ("clean", "fp16-manual-backward", "PitfallChecks: fp16-manual-backward has no finding"),
    ("clean", "bf16-manual-backward", "PitfallChecks: bf16-manual-backward has no finding"),
    ("clean", "flag-16-mixed", "PitfallChecks: flag-16-mixed has no finding"),
    ("flags", "fp16-loss-backward", "backward-flags", "PitfallChecks flags fp16-loss-backward: backward-flags"),
    ("flags", "bf16-loss-backward", "backward-flags", "PitfallChecks flags bf16-loss-backward: backward-flags"),
]

record = runner.run_example("plot_07_backward_and_flags", recipes, RUNS, CLAIMS, probes=runner.with_checks(recipes))
runner.print_findings(record)  # what PitfallChecks told each run (mpguide.checks)


# %%
# What happened
# -------------
# ``loss.backward()`` fails under 16-mixed and trains under bf16-mixed exactly like ``manual_backward``;
# the plain flag on a CPU trained in bf16-mixed.

for run in record["runs"]:
    error, extra = run["error"], run["extra"]
    scaler = (
        "yes"
        if extra.get("has_scaler")
        else "no"
    )
    outcome = (
        f"{error['type']}: "
        f"{error['message'].splitlines()[0]}"
        if error
        else f"trained {len(run['loss'])} steps, "
        "Trainer.precision = "
        f"{extra['trainer_precision']!r}, "
        f"GradScaler: {scaler}"
    )
    print(
        f"{run['label']:<32} "
        f"{run['precision_plugin']:<15} "
        f"{outcome}"
    )

import matplotlib.pyplot as plt

fig_runs = [
    "bf16-manual-backward",
    "bf16-loss-backward",
    "fp16-manual-backward",
    "flag-16-mixed",
]
fig, ax = plotting.figure(1, 1, 8, 5)
plotting.describe(
    fig,
    "loss.backward() equals manual_backward "
    "under bf16-mixed; the CPU 16-mixed "
    "flag trains in bf16",
)
plotting.plot_loss_curves(
    ax,
    record,
    fig_runs,
    "Runs that trained",
    {
        "bf16-loss-backward": "#D55E00",
        "flag-16-mixed": "#CC79A7",
    },
)
plotting.save_figure(
    fig, record["example"], "curves"
)
plt.show()


# %%
# Why
# ---
# ``manual_backward`` calls the precision plugin's ``pre_backward``, which for 16-mixed returns
# ``scaler.scale(loss)``; that first call also creates the scaler's internal scale tensor. With
# ``loss.backward()`` it never happens, so at the first ``opt.step()`` the plugin's
# ``scaler.unscale_`` finds no scale and raises. bf16-mixed has no scaler, so both calls do the same
# arithmetic and the curves are identical, but the habit breaks the moment the project switches to
# 16-mixed, and it also skips Lightning's backward hooks and strategy logic (for example DDP's
# gradient synchronisation context).
#
# On CPU, Lightning's accelerator connector replaces ``"16-mixed"`` by ``"bf16-mixed"`` with a
# warning. Pass ``plugins=[MixedPrecision("16-mixed", "cpu")]`` instead, as the call above does: it
# builds a CPU ``torch.amp.GradScaler`` and an fp16 autocast region.


# %%
# Evidence: the verdicts
# ----------------------

report.verdicts(record)
