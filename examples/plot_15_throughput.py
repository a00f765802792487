"""
Does manual optimization cost speed?
====================================

The same MLP is trained three ways: by Lightning with automatic optimization, by Lightning with
manual optimization (``zero_grad``, ``manual_backward``, ``step`` by hand), and by a plain PyTorch
loop without Lightning, in fp32, bf16-mixed and 16-mixed. The three variants are timed in one
process, their windows interleaved, so that the ratios between them mean something even on a
busy machine.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_15_throughput.py

**What you will learn**

* how to time training steps fairly: warm-up excluded, device synchronised, median of several
  windows, variants interleaved, and as many rounds as it takes for a confidence interval to
  decide (or an honest "inconclusive");
* that manual optimization runs at the speed of automatic optimization, and how much a plain
  loop saves where a step is very short (Lightning's fixed per-step cost);
* on a GPU, what bf16-mixed buys over fp32, in steps/s and in TFLOP/s against a measured peak,
  and what TF32 matmuls, a fused optimizer and ``torch.compile`` add to a manual loop.
"""


# %%
# A manual training step
# ----------------------
# The digits classifier with the faithful manual step: zero the gradients, forward,
# ``manual_backward``, step. The runs below train it in every precision (it must train to the end
# with finite losses); the timing itself is done on a larger MLP by the benchmark further down.

import time

import lightning.pytorch as pl
import torch

from mpguide.models import DigitsClassifier

# sphinx_gallery_start_ignore
from mpguide.verify.run import runner

runner.quiet_lightning()
runner.check_settings(
    "plot_15_throughput"
)  # MPGUIDE_* settings, before anything trains or prints
# sphinx_gallery_end_ignore


class TimedManual(DigitsClassifier):
    """Manual optimization on the digits."""

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.compute_loss(batch)
        self.manual_backward(loss)
        opt.step()
        return loss.detach()


# %%
# The timed ``Trainer`` call to copy
# ----------------------------------
# To time your own model, time ``trainer.fit`` and divide the optimizer steps by the seconds. The
# first steps are slower (allocations, kernel selection), so time a second fit of a warm process,
# or many steps; on a GPU, ``fit`` returns after the device has finished. On a CPU ``"bf16-mixed"``
# runs real bf16 autocast; ``"16-mixed"`` would silently become bf16-mixed there.

from mpguide.data import digits_loader

device = (
    "cuda"
    if torch.cuda.is_available()
    else "cpu"
)
pl.seed_everything(0)
model = TimedManual()
trainer = pl.Trainer(
    accelerator=device,
    devices=1,
    max_steps=50,
    precision="bf16-mixed",
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
started = time.perf_counter()
trainer.fit(
    model, digits_loader(batch_size=64)
)
elapsed = time.perf_counter() - started
print(
    f"{trainer.global_step} optimizer steps "
    f"in {elapsed:.2f} s: "
    f"{trainer.global_step / elapsed:.0f} "
    "steps/s"
)


# %%
# Timing fairly
# -------------
# Every variant gets ``layers`` x ``Linear(width, width)`` from the same seed and one batch already on
# the device. In each round each variant runs one window (untimed warm-up steps, then at least
# ``steps`` timed ones, on CPU enough for 50 ms), in an order that rotates per round; a variant's rate
# is the median over rounds. A parity claim pairs the rounds (a stretch of machine load moves both
# sides alike): it passes when the 95 % confidence interval of the median ratio (order statistics)
# lies inside its band, fails when it lies wholly outside, and is **inconclusive** when it straddles
# an edge: then the benchmark times another round, up to its cap, so noise costs rounds, not a wrong
# verdict (:func:`mpguide.verify.claims.decide_paired`). On a GPU it waits until no other example uses it.


# %%
# Evidence: the runs and their claims
# -----------------------------------
# :func:`mpguide.verify.run.throughput.interleaved` times the rounds until every parity claim of this
# accelerator is decided (or the cap). Each run then trains ``TimedManual`` in one precision and a
# probe (a callback) carries that precision's benchmark into its record: medians and per-round rates.

import dataclasses

from lightning.pytorch.callbacks import Callback

from mpguide.verify import hardware
from mpguide.verify.run import throughput
from mpguide.verify.show import plotting, report

accelerator, preset = hardware.select_accelerator(), hardware.select_preset()
size = throughput.SIZES[(accelerator, preset.name)]
print(
    f"{size.layers} x Linear({size.width}), batch {size.batch}, {size.rounds} to {size.max_rounds} rounds per "
    f"variant and precision, on {hardware.device_name(accelerator)}"
)


class CarriesTheBenchmark(Callback):
    # and <variant>_steps_per_s, <variant>_samples_per_s (positive), <variant>_round_steps_per_s (list[positive])
    # fmt: off
    measures = {"fp32_automatic_steps_per_s": "positive", "device_wait_s": "nonnegative",
                "peak_bf16_tflops": "positive", "automatic_tflops": "nonnegative"}
    # fmt: on

    def setup(self, trainer, pl_module, stage):
        self.trainer = trainer

    def record_extra(self):
        timing = timings[self.trainer.precision_plugin.precision]
        out = timing.rates()  # <variant>_steps_per_s and <variant>_samples_per_s, what the claims divide
        out["fp32_automatic_steps_per_s"] = timings["32-true"].steps_per_s("automatic")
        out.update(
            benchmark=timing.summary(),
            size=dataclasses.asdict(size),
            device_wait_s=timing.device_wait_s,
            injected_slowdown=timing.injected_slowdown,
        )
        if peak is not None:
            out["peak_bf16_tflops"] = peak
            out["automatic_tflops"] = timing.tflops("automatic")
        return out


recipes = {"manual, carries the benchmark": TimedManual}
probes = {"manual, carries the benchmark": [CarriesTheBenchmark]}
# fmt: off
RUNS = [
    # run id         recipe                            precision     options
    ("bench-fp32", "manual, carries the benchmark", "32-true", {"label": "fp32"}),
    ("bench-bf16", "manual, carries the benchmark", "bf16-mixed", {"label": "bf16-mixed"}),
    ("bench-fp16", "manual, carries the benchmark", "16-mixed", {"label": "16-mixed"}),
]
CLAIMS = [
    # On CPU: manual vs automatic in every precision; manual vs the plain loop where a step is long
    # enough (fp32, 16-mixed) for Lightning's fixed per-step cost to stay small (see the tolerance).
    ("rate_ratio", "bench-fp32", "manual_round_steps_per_s/automatic_round_steps_per_s",
     "throughput-parity-cpu", "CPU fp32: manual as fast as automatic", {"only_on": "cpu"}),
    ("rate_ratio", "bench-bf16", "manual_round_steps_per_s/automatic_round_steps_per_s",
     "throughput-parity-cpu", "CPU bf16-mixed: manual as fast as automatic", {"only_on": "cpu"}),
    ("rate_ratio", "bench-fp16", "manual_round_steps_per_s/automatic_round_steps_per_s",
     "throughput-parity-cpu", "CPU 16-mixed: manual as fast as automatic", {"only_on": "cpu"}),
    ("rate_ratio", "bench-fp32", "manual_round_steps_per_s/plain_loop_round_steps_per_s",
     "throughput-parity-cpu", "CPU fp32: manual as fast as a plain loop", {"only_on": "cpu"}),
    ("rate_ratio", "bench-fp16", "manual_round_steps_per_s/plain_loop_round_steps_per_s",
     "throughput-parity-cpu", "CPU 16-mixed: manual as fast as a plain loop", {"only_on": "cpu"}),
    # What PitfallChecks costs: the manual step with the check against the same step without it.
    ("rate_ratio", "bench-bf16", "manual_pitfallchecks_round_steps_per_s/manual_round_steps_per_s",
     "throughput-parity-cpu", "CPU bf16-mixed: PitfallChecks costs no speed", {"only_on": "cpu"}),
    ("rate_ratio", "bench-fp16", "manual_pitfallchecks_round_steps_per_s/manual_round_steps_per_s",
     "throughput-parity-cpu", "CPU 16-mixed: PitfallChecks costs no speed", {"only_on": "cpu"}),
    ("rate_ratio", "bench-bf16", "manual_pitfallchecks_round_steps_per_s/manual_round_steps_per_s",
     "throughput-parity", "GPU bf16-mixed: PitfallChecks costs no speed", {"only_on": "cuda"}),
    ("rate_ratio", "bench-fp16", "manual_pitfallchecks_round_steps_per_s/manual_round_steps_per_s",
     "throughput-parity", "GPU 16-mixed: PitfallChecks costs no speed", {"only_on": "cuda"}),
    # On CUDA: every pair within a few percent, and bf16-mixed faster than fp32.
    ("rate_ratio", "bench-fp32", "manual_round_steps_per_s/automatic_round_steps_per_s",
     "throughput-parity", "GPU fp32: manual as fast as automatic", {"only_on": "cuda"}),
    ("rate_ratio", "bench-bf16", "manual_round_steps_per_s/automatic_round_steps_per_s",
     "throughput-parity", "GPU bf16-mixed: manual as fast as automatic", {"only_on": "cuda"}),
    ("rate_ratio", "bench-fp16", "manual_round_steps_per_s/automatic_round_steps_per_s",
     "throughput-parity", "GPU 16-mixed: manual as fast as automatic", {"only_on": "cuda"}),
    ("rate_ratio", "bench-fp32", "manual_round_steps_per_s/plain_loop_round_steps_per_s",
     "throughput-parity", "GPU fp32: manual as fast as a plain loop", {"only_on": "cuda"}),
    ("rate_ratio", "bench-bf16", "manual_round_steps_per_s/plain_loop_round_steps_per_s",
     "throughput-parity", "GPU bf16-mixed: manual as fast as a plain loop", {"only_on": "cuda"}),
    ("rate_ratio", "bench-fp16", "manual_round_steps_per_s/plain_loop_round_steps_per_s",
     "throughput-parity", "GPU 16-mixed: manual as fast as a plain loop", {"only_on": "cuda"}),
    ("rate_ratio", "bench-bf16", "automatic_steps_per_s/fp32_automatic_steps_per_s",
     "bf16-speedup", "GPU: bf16-mixed faster than fp32", {"only_on": "cuda"}),
]
# fmt: on

# Time rounds until every parity claim of this accelerator is decided (or the cap), then train and judge.
started = time.perf_counter()
timings = throughput.interleaved(
    hardware.PRECISIONS, size, accelerator, until=throughput.claims_decided(RUNS, CLAIMS, accelerator)
)
print(
    f"benchmark: {time.perf_counter() - started:.1f} s wall time, {len(timings['32-true'].seconds['manual'])} "
    f"rounds; timed steps per window: "
    + ", ".join(f"{hardware.PRECISION_LABELS[p]} {t.size.steps}" for p, t in timings.items())
)
peak = throughput.matmul_peak_tflops() if accelerator == "cuda" else None
record = runner.run_example("plot_15_throughput", recipes, RUNS, CLAIMS, probes=probes)


# %%
# Steps per second
# ----------------
# One group of bars per precision, one bar per variant (median over rounds; log scale, since fp16
# matmuls are slow on CPUs without fp16 units); the whiskers span the slowest and fastest window,
# the noise the medians and the interleaving absorb.

import matplotlib.pyplot as plt

fig, ax = plotting.figure(1, 1, 9, 4.6)
plotting.describe(
    fig,
    "Automatic and manual optimization run "
    "at the same speed; a plain loop wins "
    "where steps are very short",
)
variants = [
    *throughput.VARIANTS,
    "manual, PitfallChecks",
    *(
        v
        for tuned in throughput.TUNED.values()
        for v in tuned
    ),
]
colors = dict(
    zip(
        variants,
        [
            "#0072B2",
            "#D55E00",
            "#009E73",
            "#F0E442",
            "#CC79A7",
            "#E69F00",
            "#56B4E9",
            "#999999",
        ],
    )
)
labelled = set()
for i, _precision in enumerate(
    hardware.PRECISIONS
):
    # the variants timed here
    bench = plotting.run_by_id(
        record, RUNS[i][0]
    )["extra"]["benchmark"]
    width = 0.8 / len(bench)
    for j, (variant, timed) in enumerate(
        bench.items()
    ):
        rates, median, x = (
            timed["round_steps_per_s"],
            timed["steps_per_s"],
            i
            + (j - (len(bench) - 1) / 2)
            * width,
        )
        label, whiskers = (
            None
            if variant in labelled
            else variant,
            [
                [median - min(rates)],
                [max(rates) - median],
            ],
        )
        ax.bar(
            x,
            median,
            width=width * 0.92,
            color=colors[variant],
            label=label,
            capsize=3,
            yerr=whiskers,
        )
        labelled.add(variant)
ax.set_xticks(
    range(3),
    [
        hardware.PRECISION_LABELS[p]
        for p in hardware.PRECISIONS
    ],
)
clock = (
    "GPU wall time"
    if accelerator == "cuda"
    else "CPU time, 1 thread"
)
ax.set(
    yscale="log",
    ylabel=(
        "training steps per "
        f"second\n(median; {clock})"
    ),
    title=(
        f"{size.layers} x "
        f"Linear({size.width}), batch "
        f"{size.batch}, "
        f"{hardware.device_name(accelerator)}"
    ),
)
# constrained layout keeps it in view
ax.legend(
    frameon=False,
    loc="upper left",
    bbox_to_anchor=(1.01, 1.0),
)
plotting.save_figure(
    fig, record["example"], "steps_per_s"
)
plt.show()


# %%
# The numbers, and standard speed-ups
# -----------------------------------
# On a GPU the manual loop is also timed, in the same rounds, with one speed-up at a time: TF32 matmuls
# for fp32 (``torch.set_float32_matmul_precision("high")``), ``SGD(fused=True)``, ``torch.compile`` or both
# for bf16-mixed; each line says how far it moves the manual loop and what share of the bf16 peak it reaches.

for run_id, _, precision, _ in RUNS:
    bench = plotting.run_by_id(
        record, run_id
    )["extra"]["benchmark"]
    rates = [
        f"{v} {bench[v]['steps_per_s']:.1f} "
        "steps/s "
        f"({bench[v]['samples_per_s']:.0f} "
        "samples/s)"
        for v in throughput.VARIANTS
    ]
    label = hardware.PRECISION_LABELS[
        precision
    ]
    print(f"{label:>10}: " + ", ".join(rates))
    for variant in (
        v
        for v in throughput.TUNED[precision]
        if v in bench
    ):
        gain = (
            bench[variant]["steps_per_s"]
            / bench["manual"]["steps_per_s"]
        )
        tuned = bench[variant]
        share = (
            f", {tuned['tflops'] / peak:.0%}"
            " of the bf16 peak"
            if peak
            else ""
        )
        print(
            f"{label:>10} {variant}: "
            f"{tuned['steps_per_s']:.1f} "
            f"steps/s, x{gain:.2f} the "
            "manual loop, "
            f"{tuned['tflops']:.1f} "
            f"TFLOP/s{share}"
        )
if peak is not None:
    bf16 = plotting.run_by_id(
        record, "bench-bf16"
    )["extra"]
    print(
        "bf16-mixed automatic: "
        f"{bf16['automatic_tflops']:.0f} "
        f"TFLOP/s of a measured {peak:.0f} "
        "TFLOP/s bf16 "
        "matmul peak "
        f"({bf16['automatic_tflops'] / peak:.0%})"
    )
if not size.tuned:
    print(
        "not timed on "
        f"{hardware.device_name(accelerator)}: "
        "the speed-ups are measured on a GPU "
        "only"
    )


# %%
# Conclusion
# ----------
# Manual optimization does not cost speed (where the verdicts above say ``pass``): Lightning's
# manual loop, its automatic loop and a plain PyTorch loop run the same kernels, and the per-step
# bookkeeping of either Lightning loop is small next to a real model's step. What changes speed is
# the precision, on hardware built for it, and on a GPU the speed-ups measured above.


# %%
# Evidence: the verdicts
# ----------------------
# ``inconclusive`` means the machine was too noisy to tell within the cap of rounds: not a pass, and
# the build says so in its gate summary without failing (:data:`mpguide.verify.claims.INCONCLUSIVE_RULE`).

report.verdicts(record)
