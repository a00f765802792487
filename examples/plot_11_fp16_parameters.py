"""
Trainable fp16 parameters under mixed precision: two errors and the fix
=======================================================================

To save memory, a model or an adapter is sometimes cast with ``.half()`` and then trained with
``precision="16-mixed"`` or ``"bf16-mixed"``. Mixed precision expects the opposite: parameters (and
so their gradients and the optimizer's state) stay in fp32, and autocast runs each operation in
fp16 or bf16. Under 16-mixed the first ``opt.step()`` fails with ``ValueError: Attempting to
unscale FP16 gradients.``; under bf16-mixed with gradient clipping it fails with
``RuntimeError: Unexpected floating ScalarType in at::autocast::prioritize``. This example captures
both and shows the fix.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_11_fp16_parameters.py

**What you will learn**: why GradScaler refuses fp16 gradients; why clipping a mix of fp16 and fp32
gradients fails inside a bf16 autocast region; why, without clipping, AdamW turns fp16 weights into
inf/NaN at its first step; that fp32 parameters under autocast already run the adapter's matrix
products in fp16/bf16. **Prerequisites**: :doc:`plot_04_gradient_clipping` (clip in
``on_before_optimizer_step``).
"""


# %%
# A half-precision adapter
# ------------------------
# A body ``Linear(64, 64) + Tanh`` and an adapter ``Linear(64, 10)``; ``half_adapter=True`` casts the
# adapter to fp16 ("it is small, keep it in half precision"). Gradients are clipped at norm 1 in
# ``on_before_optimizer_step``, which Lightning calls inside ``opt.step()`` after unscaling.

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
    "plot_11_fp16_parameters"
)  # MPGUIDE_* settings, before anything trains or prints
# sphinx_gallery_end_ignore


class BodyAndAdapter(pl.LightningModule):
    def __init__(
        self,
        half_adapter=False,
        clip=True,
        lr=1e-3,
    ):
        super().__init__()
        self.automatic_optimization = False
        self.clip, self.lr = clip, lr
        self.body = nn.Sequential(
            nn.Linear(NUM_FEATURES, 64),
            nn.Tanh(),
        )
        self.adapter = nn.Linear(
            64, NUM_CLASSES
        )
        if half_adapter:
            # the mistake: trainable fp16
            # parameters
            self.adapter.half()

    def training_step(self, batch, batch_idx):
        images, labels = batch
        opt = self.optimizers()
        opt.zero_grad()
        loss = F.cross_entropy(
            self.adapter(
                self.body(images)
            ).float(),
            labels,
        )
        self.manual_backward(loss)
        opt.step()
        return loss.detach()

    def on_before_optimizer_step(
        self, optimizer
    ):
        if self.clip:
            self.clip_gradients(
                optimizer,
                gradient_clip_val=1.0,
                gradient_clip_algorithm="norm",
            )

    def configure_optimizers(self):
        return torch.optim.AdamW(
            self.parameters(), lr=self.lr
        )


# %%
# The fix: the ``Trainer`` call
# -----------------------------
# Keep every trainable parameter in fp32 (drop the ``.half()``). Autocast still runs the adapter's
# ``Linear`` in fp16 under 16-mixed; GradScaler unscales fp32 gradients, and the AdamW update is
# applied to fp32 weights. On a GPU ``precision="16-mixed"`` is enough; on a CPU the plugin is
# passed explicitly, because ``Trainer(precision="16-mixed")`` silently becomes bf16-mixed there.

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
model = BodyAndAdapter(half_adapter=False)
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
    "adapter weight dtype: "
    f"{model.adapter.weight.dtype}, "
    f"optimizer steps: {trainer.global_step}"
)


# %%
# Evidence: the runs and their claims
# -----------------------------------
# The half adapter under 16-mixed and bf16-mixed with clipping (both must raise the errors above), and
# under bf16-mixed without clipping, with ``Trainer(detect_anomaly=True)``; the fp32 adapter in the
# three precisions with clipping, where it must follow fp32.

from mpguide.verify.show import plotting, report

recipes = {
    "half adapter": lambda: BodyAndAdapter(half_adapter=True),
    "half adapter, no clipping": lambda: BodyAndAdapter(half_adapter=True, clip=False),
    "fp32 adapter": lambda: BodyAndAdapter(half_adapter=False),
}
RUNS = [
    # run id              recipe                       precision     options
    ("half-fp16", "half adapter", "16-mixed", {"label": "fp16 adapter, 16-mixed"}),
    ("half-bf16", "half adapter", "bf16-mixed", {"label": "fp16 adapter, bf16-mixed, clipping"}),
    (
        "half-bf16-noclip",
        "half adapter, no clipping",
        "bf16-mixed",
        {"label": "fp16 adapter, bf16-mixed, no clipping", "trainer": {"detect_anomaly": True}},
    ),
    ("fp32", "fp32 adapter", "32-true", {"label": "fp32 adapter, fp32"}),
    ("fixed-bf16", "fp32 adapter", "bf16-mixed", {"label": "fp32 adapter, bf16-mixed"}),
    ("fixed-fp16", "fp32 adapter", "16-mixed", {"label": "fp32 adapter, 16-mixed"}),
]
CLAIMS = [
    (
        "raises",
        "half-fp16",
        "ValueError",
        "Attempting to unscale FP16 gradients.",
        "fp16 parameters, 16-mixed: GradScaler refuses fp16 gradients",
    ),
    (
        "raises",
        "half-bf16",
        "RuntimeError",
        "Unexpected floating ScalarType in at::autocast::prioritize",
        "fp16 parameters, bf16-mixed + clipping: the norm of mixed fp16/fp32 gradients fails",
    ),
    (
        "raises",
        "half-bf16-noclip",
        "RuntimeError",
        "returned nan values",
        "fp16 parameters, bf16-mixed, no clipping: AdamW turns the weights into inf/NaN",
    ),
    ("match", "fixed-bf16", "fp32", "mixed-vs-fp32", "fix: fp32 parameters, bf16-mixed = fp32"),
    ("match", "fixed-fp16", "fp32", "mixed-vs-fp32", "fix: fp32 parameters, 16-mixed = fp32"),
    # PitfallChecks on every run (runner.with_checks): each buggy run flags its section, each correct run is clean
    ("clean", "fp32", "PitfallChecks: fp32 has no finding"),
    ("clean", "fixed-bf16", "PitfallChecks: fixed-bf16 has no finding"),
    ("clean", "fixed-fp16", "PitfallChecks: fixed-fp16 has no finding"),
    ("flags", "half-fp16", "fp16-parameters", "PitfallChecks flags half-fp16: fp16-parameters"),
    ("flags", "half-bf16", "fp16-parameters", "PitfallChecks flags half-bf16: fp16-parameters"),
    ("flags", "half-bf16-noclip", "fp16-parameters", "PitfallChecks flags half-bf16-noclip: fp16-parameters"),
]

record = runner.run_example("plot_11_fp16_parameters", recipes, RUNS, CLAIMS, probes=runner.with_checks(recipes))
runner.print_findings(record)  # what PitfallChecks told each run (mpguide.checks)


# %%
# The error under 16-mixed
# ------------------------
# Lightning's ``MixedPrecision.optimizer_step`` calls ``GradScaler.unscale_`` before the closure's
# hooks. ``unscale_`` divides the gradients by the loss scale and checks them for inf/NaN; it does so
# for fp32 gradients only (``torch/amp/grad_scaler.py``, ``allow_fp16=False``), because the scaled
# fp16 gradients are exactly what may have overflowed, and an fp16 optimizer update of fp16 weights
# loses small steps to rounding. The design is fp32 master weights with fp16 arithmetic.

print(
    report.expected_error(record, "half-fp16")
)


# %%
# The error under bf16-mixed with clipping
# ----------------------------------------
# bf16-mixed has no GradScaler, so the step itself would work. Clipping computes one norm per
# gradient dtype (fp16 for the adapter, fp32 for the body) and stacks them. In manual optimization
# that happens inside ``opt.step()``, i.e. inside the bf16 autocast region that Lightning opens
# around ``training_step``; autocast's type promotion for ``stack`` accepts fp32 and the autocast
# dtype (bf16), and an fp16 tensor there is the "unexpected floating ScalarType".

print(
    report.expected_error(record, "half-bf16")
)


# %%
# Without clipping: no error, but NaN after one step
# ---------------------------------------------------
# Under bf16-mixed without clipping nothing refuses the fp16 adapter, and the first AdamW step
# ruins it: AdamW keeps its moment estimates in the parameter's dtype, the squared gradients
# (about 1e-6 and below) and ``eps=1e-8`` both round to zero in fp16, and the update divides by
# zero. The adapter's weights become inf/NaN, and the next loss is NaN. ``Trainer(detect_anomaly=True)``
# turns that NaN into an error at the backward that first produces it. It is a diagnostic for
# bf16-mixed, fp32 and the ``-true`` precisions: under 16-mixed the first steps may overflow by design
# (GradScaler starts at 65536 and backs off), and anomaly detection then stops a correct run at step 0
# (round-4 case 10: ``Function 'AddmmBackward0' returned nan values``). This page's fp32-adapter model did
# not overflow that way when we tried, so 16-mixed runs here without it.

run = plotting.run_by_id(
    record, "half-bf16-noclip"
)
print(
    "losses recorded before the error: "
    f"{run['loss']}"
)
print(
    f"{run['error']['type']}: "
    f"{run['error']['message']}"
)


# %%
# Curves
# ------
# The fp32 adapter follows fp32 in bf16-mixed and 16-mixed.

import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(9, 4))
plotting.plot_loss_curves(
    ax,
    record,
    [
        "fp32",
        "fixed-bf16",
        "fixed-fp16",
        "half-fp16",
        "half-bf16",
        "half-bf16-noclip",
    ],
    "Cross-entropy",
)
ax.legend(
    loc="upper left",
    bbox_to_anchor=(1.02, 1),
    frameon=False,
    fontsize=8,
)
fig.tight_layout()
plotting.save_figure(
    fig, record["example"], "curves"
)
plt.show()


# %%
# Conclusion
# ----------
# Under ``"16-mixed"`` and ``"bf16-mixed"``, keep trainable parameters in fp32: autocast already
# runs the matrix products in half precision, GradScaler unscales fp32 gradients, clipping sees
# one gradient dtype, and AdamW's state has the range it needs. Storing the whole model in half
# precision (``"bf16-true"``, ``"16-true"``) is another trade: small updates round away, an EMA copy
# in half precision never moves, and AdamW's default ``eps`` makes fp16 weights NaN, as measured in
# :doc:`plot_16_true_half_precision`.


# %%
# Evidence: the verdicts
# ----------------------

report.verdicts(record)
