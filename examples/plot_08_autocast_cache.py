"""
The autocast cache: a fixed bug and a hazard that remains
=========================================================

Inside ``torch.autocast`` (with ``cache_enabled=True``, the default), weights cast to bf16/fp16 are
cached for the rest of the region. Two consequences matter in manual optimization:

1. **History.** A ``torch.no_grad()`` forward, then a graded forward through the same weights in one
   caching region, used to reuse the cast made without autograd history, so those weights got no
   gradient (PyTorch #65766, #112583, #158232). Lightning's own autocast cached until 2.5.4 and
   stopped in 2.5.5 (#20921). The installed torch no longer does this: this example checks it.
2. **Hazard.** ``opt.step()`` changes the weights in place, but the cache keeps the casts made
   before the step: a second forward after the step, in the same region, silently uses the old weights.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_08_autocast_cache.py

**What you will learn**: which versions were affected, how to check yours, and the safe recipe.
"""


# %%
# Two forwards, same weights
# --------------------------
# Self-distillation: a digits classifier pulled towards its own ``no_grad`` predictions on a noisy
# view. Both forwards share every weight, the pattern that lost gradients in affected versions.

import contextlib
import functools

import torch
import torch.nn.functional as F

from mpguide.models import DigitsClassifier

# sphinx_gallery_start_ignore
from mpguide.verify.run import runner

runner.quiet_lightning()
runner.check_settings(
    "plot_08_autocast_cache"
)  # MPGUIDE_* settings, before anything trains or prints
# sphinx_gallery_end_ignore


class SelfDistillation(DigitsClassifier):
    """Lightning's autocast only (cache off
    since Lightning 2.5.5): the reference."""

    def own_autocast(self):
        # nothing of our own
        return contextlib.nullcontext()

    def distillation_loss(
        self, batch, batch_idx
    ):
        images, labels = batch
        seeded = (
            torch.Generator().manual_seed(
                batch_idx
            )
        )
        noise = torch.randn(
            images.shape, generator=seeded
        ).to(images)
        noisy = images + 0.2 * noise
        with torch.no_grad():
            target = F.softmax(
                self.net(noisy).float(),
                dim=-1,
            )
        logits = self.net(images)
        return F.cross_entropy(
            logits, labels
        ) + F.cross_entropy(logits, target)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        with self.own_autocast():
            loss = self.distillation_loss(
                batch, batch_idx
            )
            self.manual_backward(loss)
            before = self.net(batch[0])
            opt.step()
            # a second forward after the step
            # (logging, a lookahead, ...)
            after = self.net(batch[0])
        if (
            batch_idx == 0
            and self.current_epoch == 0
        ):
            self.stale_after_step = bool(
                torch.equal(before, after)
            )
        return loss.detach()


class CachingAutocast(SelfDistillation):
    """The user's own caching autocast around
    the no_grad forward, the graded forward
    and the step."""

    def own_autocast(self):
        return torch.autocast(
            self.device.type,
            dtype=torch.bfloat16,
            cache_enabled=True,
        )


class NoCacheAutocast(SelfDistillation):
    """The fix on every release: the forwards
    in an own autocast with the cache off,
    inside Lightning's."""

    def own_autocast(self):
        return torch.autocast(
            self.device.type,
            dtype=torch.bfloat16,
            cache_enabled=False,
        )


# %%
# The ``Trainer`` call to copy
# ----------------------------
# The safe recipe: ``precision="bf16-mixed"`` and no autocast of your own. It prints ``False`` here;
# on Lightning 2.5.4 and older, whose own autocast caches casts, it prints ``True`` (the guide's
# version matrix measured it), so run it on your versions. There, run the forwards in
# ``torch.autocast(..., cache_enabled=False)`` (``NoCacheAutocast`` above: ``False`` on every release).

import lightning.pytorch as pl

from mpguide.data import digits_loader

device = (
    "cuda"
    if torch.cuda.is_available()
    else "cpu"
)
pl.seed_everything(0)
model = SelfDistillation(
    optimizer="adamw", lr=3e-3
)
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
    "a forward right after opt.step() saw "
    "the old weights: "
    f"{model.stale_after_step}"
)


# %%
# Evidence: the runs and their claims
# -----------------------------------
# The three modules under bf16-mixed, and fp32. A probe (a Lightning callback) hands the flag the module sets
# in its first batch (did the forward after ``opt.step()`` return the old outputs?) to the record.

from lightning.pytorch.callbacks import Callback

from mpguide.verify.show import plotting, report


class StaleAfterStep(Callback):
    measures = {"stale_after_step": "bool"}

    def setup(self, trainer, pl_module, stage):
        self.module = pl_module

    def record_extra(self):
        return {"stale_after_step": self.module.stale_after_step}


adamw = {"optimizer": "adamw", "lr": 3e-3}
recipes = {
    "Lightning's autocast only": functools.partial(SelfDistillation, **adamw),
    "own caching autocast": functools.partial(CachingAutocast, **adamw),
    "own autocast, cache off": functools.partial(NoCacheAutocast, **adamw),
}
probes = {name: [StaleAfterStep] for name in recipes}
RUNS = [
    # run id            recipe                        precision     options
    ("lightning-bf16", "Lightning's autocast only", "bf16-mixed", {"label": "bf16-mixed, Lightning's autocast"}),
    ("caching-bf16", "own caching autocast", "bf16-mixed", {"label": "bf16-mixed, own caching autocast"}),
    ("fp32", "Lightning's autocast only", "32-true", {"label": "fp32"}),
    ("nocache-bf16", "own autocast, cache off", "bf16-mixed", {"label": "bf16-mixed, own autocast, cache off"}),
]
CLAIMS = [
    (
        "match",
        "caching-bf16",
        "lightning-bf16",
        "same-precision",
        "no_grad then graded forward in a caching autocast trains normally (installed torch)",
    ),
    ("match", "lightning-bf16", "fp32", "mixed-vs-fp32", "bf16-mixed follows fp32"),
    ("expect", "caching-bf16", "stale_after_step", True, "hazard: a forward after opt.step() sees old weights"),
    ("expect", "lightning-bf16", "stale_after_step", False, "safe: without a caching autocast it sees new ones"),
    (
        "expect",
        "nocache-bf16",
        "stale_after_step",
        False,
        "fix on every release: inside autocast(cache_enabled=False) it sees new ones",
    ),
    # PitfallChecks on every run (runner.with_checks): each buggy run flags its section, each correct run is clean
    (
        "clean",
        "lightning-bf16",
        "PitfallChecks: lightning-bf16 has no finding",
        {"only_if": "lightning-autocast-no-cache"},
    ),
    (
        "flags",
        "lightning-bf16",
        "autocast-cache",
        "PitfallChecks flags lightning-bf16 where Lightning's own autocast caches: autocast-cache",
        {"only_if": "lightning-autocast-caches"},
    ),
    ("clean", "fp32", "PitfallChecks: fp32 has no finding"),
    ("flags", "caching-bf16", "autocast-cache", "PitfallChecks flags caching-bf16: autocast-cache"),
]

record = runner.run_example(
    "plot_08_autocast_cache", recipes, RUNS, CLAIMS, probes=runner.with_checks(recipes, probes)
)
runner.print_findings(record)  # what PitfallChecks told each run (mpguide.checks)


# %%
# What happened
# -------------
# The caching autocast trains like Lightning's own (the gradients are there on the installed torch),
# but a forward after ``opt.step()`` in its region returned the outputs of the old weights.

import matplotlib.pyplot as plt

fig, ax = plotting.figure(1, 1, 8, 5)
plotting.describe(
    fig,
    "A no_grad forward before a graded one "
    "no longer breaks training in a caching "
    "autocast",
)
plotting.plot_loss_curves(
    ax,
    record,
    [
        "fp32",
        "lightning-bf16",
        "caching-bf16",
    ],
    "Self-distillation",
    {"caching-bf16": "#D55E00"},
)
plotting.save_figure(
    fig, record["example"], "curves"
)
plt.show()

for run_id in (
    "lightning-bf16",
    "caching-bf16",
    "nocache-bf16",
):
    run = plotting.run_by_id(record, run_id)
    if run["error"]:  # torch 2.10 and older
        print(
            f"{run_id}: raised "
            f"{run['error']['type']}"
        )
        continue
    stale = run["extra"]["stale_after_step"]
    print(
        f"{run_id}: a forward after "
        "opt.step() saw the old weights: "
        f"{stale}"
    )
print(
    "installed: torch "
    f"{record['env']['torch']}, Lightning "
    f"{record['env']['lightning']}"
)


# %%
# The safe recipe
# ---------------
# Do not add a ``torch.autocast`` of your own for the dtype Lightning already uses. If you need
# one (another dtype for part of the model), pass ``cache_enabled=False``, or close it before
# ``opt.step()`` so that any forward after the step starts a new region. Closing yours is not
# enough where Lightning's own autocast caches (2.5.4 and earlier, master 7f0c343): there run the
# forward after the step in ``torch.autocast(..., cache_enabled=False)``, as ``NoCacheAutocast`` does
# (on Lightning 2.5.4 and master its forward after the step sees the new weights, the one without an
# autocast of its own the old ones: the fifth check holds there, the fourth does not). On an old stack
# (Lightning 2.5.4 or earlier with a torch that still has the cache bug), a ``no_grad`` forward
# followed by a graded forward through the same weights loses their gradients; run this example
# there and the first claim fails.


# %%
# Evidence: the verdicts
# ----------------------

report.verdicts(record)
