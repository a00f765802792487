"""What the throughput benchmark times: the variants, the tuned variants of the GPU sizes, and the model and
round sizes per accelerator and preset (:data:`~mpguide.verify.run.throughput.config.SIZES`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The baseline variants, timed in every precision and compared by the parity claims, in the order of
#: the first round.
VARIANTS: tuple[str, ...] = ("automatic", "manual", "plain loop")


@dataclass(frozen=True)
class Tuning:
    """Standard speed-ups applied to the manual variant (see :data:`~mpguide.verify.run.throughput.config.TUNED`).

    Attributes:
        fused: ``torch.optim.SGD(..., fused=True)``: one kernel updates every parameter.
        compiled: the MLP wrapped in ``torch.compile`` (default mode) once per variant and precision;
            its compilation happens in the warm-up steps of the first window.
        tf32: ``torch.set_float32_matmul_precision("high")`` for the window (TF32 tensor-core matmuls
            for fp32 tensors; restored afterwards). Only fp32 runs fp32 matmuls, so only fp32 uses it.
        checks: :class:`mpguide.checks.PitfallChecks` among the Trainer's callbacks (what the check costs,
            issue 27).
    """

    fused: bool = False
    compiled: bool = False
    tf32: bool = False
    checks: bool = False


#: The tuned variants of each precision, as variant name -> :class:`~mpguide.verify.run.throughput.config.Tuning`. They
#: are timed (interleaved with the baseline variants) only when :attr:`Size.tuned` is set, i.e. on
#: CUDA, where the aim is more than 70 % of the measured bf16 matmul peak in bf16-mixed.
TUNED: dict[str, dict[str, Tuning]] = {
    "32-true": {"manual, TF32 matmuls": Tuning(tf32=True)},
    "bf16-mixed": {
        "manual, fused SGD": Tuning(fused=True),
        "manual, compiled": Tuning(compiled=True),
        "manual, compiled + fused SGD": Tuning(fused=True, compiled=True),
    },
    "16-mixed": {},
}


#: What the site offers the reader, timed on every accelerator in the mixed precisions (interleaved with
#: the baseline, compared with ``manual`` by the parity claims): the manual step with
#: :class:`mpguide.checks.PitfallChecks` among the callbacks. ``ManualMixedPrecision`` is not a variant: it
#: refuses Lightning releases before 2.6, and one refusal would stop the whole benchmark in the version
#: matrix's older columns; its own time per step is counted in ``tests/test_plugin_cost.py`` instead.
OFFERED: dict[str, dict[str, Tuning]] = {
    "32-true": {},
    "bf16-mixed": {"manual, PitfallChecks": Tuning(checks=True)},
    "16-mixed": {"manual, PitfallChecks": Tuning(checks=True)},
}


def variant_key(variant: str) -> str:
    """The variant's name as a record key prefix: ``"plain loop"`` -> ``"plain_loop"``,
    ``"manual, compiled + fused SGD"`` -> ``"manual_compiled_fused_sgd"``."""
    return "_".join(re.findall(r"[a-z0-9]+", variant.lower()))


def variants_for(precision: str, size: Size) -> tuple[str, ...]:
    """The variants timed in ``precision``: :data:`VARIANTS`, the :data:`OFFERED` ones, then the tuned ones
    when ``size.tuned``."""
    return VARIANTS + tuple(OFFERED.get(precision, {})) + (tuple(TUNED.get(precision, {})) if size.tuned else ())


@dataclass(frozen=True)
class Size:
    """Model and timing size.

    Attributes:
        width: features of every ``Linear(width, width)`` layer.
        layers: number of such layers (ReLU between them).
        batch: samples per step.
        warmup: untimed steps at the start of every window.
        steps: timed steps per window.
        rounds: windows per variant at least (the median is taken over all rounds timed); 6 is the
            fewest that admit a 95 % interval for a median (:func:`mpguide.verify.claims.metrics.median_interval`).
        max_rounds: the cap of the sequential rule: with a stopping test
            (:func:`~mpguide.verify.run.throughput.interleaved`'s ``until``) rounds go on until it says every claim is
            decided or this many were timed; without one, exactly ``rounds`` are timed.
        tuned: also time the :data:`~mpguide.verify.run.throughput.config.TUNED` variants.
        min_window_s: shortest timed window in seconds of the benchmark's clock; a precision whose
            ``steps`` would take less gets more steps per window, found by timing ``steps`` steps of
            the plain loop once before the rounds (0: no calibration). Very short windows are at
            the mercy of a few scheduler ticks on a shared CPU.
    """

    width: int
    layers: int
    batch: int
    warmup: int
    steps: int
    rounds: int
    tuned: bool = False
    min_window_s: float = 0.0
    max_rounds: int = 0

    def __post_init__(self) -> None:
        if self.max_rounds and self.max_rounds < self.rounds:
            raise ValueError(f"Size: max_rounds={self.max_rounds} is below rounds={self.rounds}")

    def flops_per_step(self) -> float:
        """Matmul FLOPs of one training step: forward ``2*B*W*W`` per layer, backward twice that (3x in all)."""
        return 3 * 2 * self.batch * self.width * self.width * self.layers


#: Model and timing sizes by accelerator and preset. The CPU sizes fit 2 shared cores (the whole
#: benchmark at the quick preset, three precisions and three variants, stays under about 20 s). The
#: CUDA sizes use the model of the reference measured before this project (H200, 8 x Linear(4096),
#: batch 8192: about 73 steps/s in bf16-mixed, about 7.8 in fp32). Their windows are short because fp32
#: dominates the time: at the full size fp32 takes 3 variants x 5 rounds x 25 steps / 7.8 steps/s, about
#: 50 s, the tuned variants (one compilation included) and the mixed precisions about 40 s more. On CPU
#: a window lasts at least 50 ms of CPU time: 3 steps of 16-mixed take about 0.36 s, but 3 bf16-mixed
#: steps only 8 ms, so bf16-mixed gets about 19 steps and fp32 about 6 (``min_window_s``).
#: Rounds: at least 6 (the fewest that admit a 95 % interval of a median), then more until every parity
#: claim is decided, at most ``max_rounds`` (see :data:`mpguide.verify.claims.tolerances.PAIRED_RULE`). A CPU round
#: costs
#: about 3 s of CPU time (16-mixed's fp16 matmuls are most of it), so the cap of 20 bounds the benchmark
#: at about a minute of CPU time; on the shared 2-core machine under heavy load 20 runs needed 6 to 12
#: rounds (see the throughput-parity-cpu tolerance). The GPU reference measurements spread 0.4 %, so 6 rounds
#: decide them.
SIZES: dict[tuple[str, str], Size] = {
    ("cpu", "test"): Size(
        width=256, layers=4, batch=512, warmup=2, steps=3, rounds=6, min_window_s=0.05, max_rounds=20
    ),
    ("cpu", "quick"): Size(
        width=256, layers=4, batch=512, warmup=2, steps=3, rounds=6, min_window_s=0.05, max_rounds=20
    ),
    ("cpu", "full"): Size(
        width=256, layers=4, batch=512, warmup=3, steps=20, rounds=7, min_window_s=0.05, max_rounds=20
    ),
    ("cuda", "test"): Size(width=1024, layers=4, batch=1024, warmup=5, steps=20, rounds=6, tuned=True, max_rounds=12),
    ("cuda", "quick"): Size(width=4096, layers=8, batch=8192, warmup=5, steps=20, rounds=6, tuned=True, max_rounds=12),
    ("cuda", "full"): Size(width=4096, layers=8, batch=8192, warmup=5, steps=20, rounds=6, tuned=True, max_rounds=12),
}
