"""Training throughput: the same MLP trained by Lightning (automatic and manual optimization) and by a
plain PyTorch loop, timed fairly.

Timing rules (what makes a ratio of two variants meaningful on a noisy machine):

* every variant trains the same model shape from the same initial weights on one batch that already
  lives on the device, so no data loading or host-to-device copy is timed;
* each timed **window** starts after ``warmup`` steps of that window (allocations, autocast caches,
  cuBLAS heuristics); on CUDA the device is synchronised before both clock readings, on CPU the
  clock is the process's CPU time with one thread (:func:`~mpguide.verify.run.throughput.windows.clock`);
* windows of the variants are **interleaved**: round after round, each variant runs one window, in
  an order that rotates every round, so machine noise (other processes, frequency changes) hits
  all variants alike; the reported rate is the **median** over rounds;
* the number of rounds is **sequential**: after :attr:`~mpguide.verify.run.throughput.config.Size.rounds` rounds
  (the fewest that admit a 95 % interval for a median), the benchmark stops as soon as every parity claim it is given
  (:func:`~mpguide.verify.run.throughput.claims_decided`) is decided by the rule of
  :func:`mpguide.verify.claims.metrics.decide_paired`, else it times another round, up to
  :attr:`~mpguide.verify.run.throughput.config.Size.max_rounds`;
  the claims that are still undecided there are judged inconclusive (never passed).

The Lightning variants are real :class:`lightning.pytorch.Trainer` fits (``max_steps`` per window,
logger, checkpointing and progress bar off); their windows are timed by a callback from the end of
the last warm-up batch to the end of the last batch, so Trainer setup is not counted, Lightning's
per-step loop and hooks are. On CUDA, :func:`~mpguide.verify.run.throughput.matmul_peak_tflops` measures a
bf16 matmul peak in the same process, on the same GPU, to put achieved TFLOP/s in proportion, and
the GPU sizes also time :data:`~mpguide.verify.run.throughput.config.TUNED`: the manual variant with one standard
speed-up at a time (TF32 matmuls in fp32; a fused optimizer, ``torch.compile`` or both in bf16-mixed),
so the page can say what each one moves. On a GPU the whole benchmark holds the device alone
(:func:`mpguide.verify.hardware.device_lock`), although the docs build runs other examples in parallel.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ... import hardware
from ...claims.metrics import decide_paired
from ...claims.tolerances import TOLERANCES
from .config import OFFERED, TUNED, VARIANTS, Size, Tuning, variant_key, variants_for
from .config import SIZES as SIZES
from .windows import (
    SLOWDOWN_ENV,
    build_mlp,
    lightning_window,
    one_batch,
    parse_slowdown,
    plain_window,
)

#: The ``extra`` keys the benchmark's figures fill (a rate key is named after its variant, so by pattern).
MEASURES = {
    "*_round_steps_per_s": "list[positive]",
    "*_steps_per_s": "positive",
    "*_samples_per_s": "positive",
    "benchmark": "benchmark",
    "size": "benchmark_size",
    "device_wait_s": "nonnegative",
    "peak_bf16_tflops": "positive",
    "automatic_tflops": "nonnegative",
}


def _calibrated(
    size: Size, net: nn.Module, batch: Any, precision: str, accelerator: str, state: dict[str, Any]
) -> Size:
    """``size`` with enough timed steps per window to last
    :attr:`~mpguide.verify.run.throughput.config.Size.min_window_s` in ``precision``.

    Times one untimed-for-the-result window of the plain loop (``size.warmup`` + ``size.steps`` steps on
    the plain variant's own model, which goes on training) and scales ``steps`` up from it, never down.
    """
    if size.min_window_s <= 0:
        return size
    seconds = plain_window(net, batch, size, precision, accelerator, state)
    per_step = max(seconds, 1e-9) / size.steps
    return dataclasses.replace(size, steps=max(size.steps, math.ceil(size.min_window_s / per_step)))


@dataclass
class Timing:
    """Timed windows of one precision.

    Attributes:
        precision: ``"32-true"``, ``"bf16-mixed"`` or ``"16-mixed"``.
        size: the model and timing size of this precision (``size.steps``: timed steps per window,
            after :attr:`~mpguide.verify.run.throughput.config.Size.min_window_s` calibration).
        seconds: variant -> seconds of each timed window (``size.steps`` steps), in round order.
        device_wait_s: seconds the benchmark waited for the GPU to itself (0.0 on CPU; see
            :func:`mpguide.verify.hardware.device_lock`).
        injected_slowdown: variant -> fraction of the test hook
        :data:`~mpguide.verify.run.throughput.windows.SLOWDOWN_ENV`
            (empty normally).
    """

    precision: str
    size: Size
    seconds: dict[str, list[float]] = field(default_factory=dict)
    device_wait_s: float = 0.0
    injected_slowdown: dict[str, float] = field(default_factory=dict)

    def steps_per_s(self, variant: str) -> float:
        """Median over windows of ``steps / seconds`` for ``variant``."""
        return statistics.median(self.size.steps / s for s in self.seconds[variant])

    def samples_per_s(self, variant: str) -> float:
        """Median steps/s times the batch size."""
        return self.steps_per_s(variant) * self.size.batch

    def tflops(self, variant: str) -> float:
        """Achieved matmul TFLOP/s (:meth:`~mpguide.verify.run.throughput.config.Size.flops_per_step` x median steps/s /
        1e12)."""
        return self.steps_per_s(variant) * self.size.flops_per_step() / 1e12

    def spread(self, variant: str) -> float:
        """(max - min) / median of the per-window rates of ``variant`` (a fraction; noise indicator)."""
        rates = self.round_rates(variant)
        return (max(rates) - min(rates)) / statistics.median(rates)

    def summary(self) -> dict[str, Any]:
        """JSON-ready medians, spreads and raw windows, keyed by variant (for a record's ``extra``)."""
        return {
            v: {
                "steps_per_s": self.steps_per_s(v),
                "samples_per_s": self.samples_per_s(v),
                "tflops": self.tflops(v),
                "spread": self.spread(v),
                "steps_per_window": self.size.steps,
                "window_seconds": self.seconds[v],
                "round_steps_per_s": self.round_rates(v),
            }
            for v in self.seconds
        }

    def round_rates(self, variant: str) -> list[float]:
        """Steps/s of each window of ``variant``, in round order (round ``r`` of every variant ran back to back)."""
        return [self.size.steps / s for s in self.seconds[variant]]

    def rates(self) -> dict[str, Any]:
        """Flat record entries for every timed variant (see :func:`~mpguide.verify.run.throughput.config.variant_key`):
        ``<key>_steps_per_s`` and
        ``<key>_samples_per_s`` (medians) and ``<key>_round_steps_per_s`` (a list, one rate per round), the
        numbers :func:`mpguide.verify.claims.rate_ratio` claims divide (lists: paired by round)."""
        out: dict[str, Any] = {}
        for v in self.seconds:
            out[f"{variant_key(v)}_steps_per_s"] = self.steps_per_s(v)
            out[f"{variant_key(v)}_samples_per_s"] = self.samples_per_s(v)
            out[f"{variant_key(v)}_round_steps_per_s"] = self.round_rates(v)
        return out


def interleaved(
    precisions: tuple[str, ...],
    size: Size,
    accelerator: str,
    progress: Callable[[str], None] = print,
    until: Callable[[dict[str, Timing]], bool] | None = None,
    slowdown: dict[str, float] | None = None,
) -> dict[str, Timing]:
    """Time the variants of every precision (:func:`~mpguide.verify.run.throughput.config.variants_for`), interleaved.

    Each variant keeps its own copy of the same initial weights across rounds (it goes on training),
    so no variant times a cold model the others have warmed. On CUDA the benchmark holds the GPU alone
    (:func:`mpguide.verify.hardware.device_lock`, exclusive) from the first window to the last.

    Args:
        precisions: Lightning precision names.
        size: model and timing size (see :data:`~mpguide.verify.run.throughput.config.SIZES`).
        accelerator: ``"cpu"`` or ``"cuda"``.
        progress: called with one line per round.
        until: the sequential stopping test, e.g. :func:`~mpguide.verify.run.throughput.claims_decided`: called
            after every round from round ``size.rounds`` on with the timings so far; ``True`` stops.
            Rounds end at ``size.max_rounds`` whatever it says. ``None``: exactly ``size.rounds`` rounds.
        slowdown: variant -> fraction by which each of its timed steps is really made longer (a test
            hook; default: :data:`~mpguide.verify.run.throughput.windows.SLOWDOWN_ENV`, parsed by
            :func:`~mpguide.verify.run.throughput.windows.parse_slowdown`).

    Returns:
        precision -> :class:`~mpguide.verify.run.throughput.Timing`.

    Raises:
        hardware.ConfigurationError: an unknown precision or accelerator, or a malformed
            :data:`~mpguide.verify.run.throughput.windows.SLOWDOWN_ENV`.
    """
    import os
    import warnings

    from ..runner import quiet_lightning

    for p in precisions:
        hardware.check_precision(p)
    slow = parse_slowdown(os.environ.get(SLOWDOWN_ENV)) if slowdown is None else dict(slowdown)
    if slow:
        progress(f"  TEST HOOK: injected slowdown {slow} (each timed step of these variants lasts that much longer)")
    cap = max(size.rounds, size.max_rounds) if until is not None else size.rounds
    quiet_lightning()
    batch = one_batch(size, accelerator)
    variants = {p: variants_for(p, size) for p in precisions}
    tunings = {p: {**{v: Tuning() for v in VARIANTS}, **OFFERED.get(p, {}), **TUNED.get(p, {})} for p in precisions}
    nets: dict[tuple[str, str], nn.Module] = {}
    for p in precisions:
        for v in variants[p]:
            net = build_mlp(size).to(accelerator)
            nets[(p, v)] = torch.compile(net) if tunings[p][v].compiled else net
    plain_state: dict[str, dict[str, Any]] = {p: {} for p in precisions}
    threads = torch.get_num_threads()
    if accelerator == "cpu":
        torch.set_num_threads(1)  # CPU time of one thread = the step's work, whoever else uses the cores
    try:
        with hardware.device_lock(accelerator, exclusive=True) as waited, warnings.catch_warnings():
            if waited > 1.0:
                progress(f"  waited {waited:.1f} s for the GPU to itself")
            warnings.simplefilter("ignore")  # Lightning's "few batches" and precision notes are not timed facts
            sizes = {
                p: _calibrated(size, nets[(p, "plain loop")], batch, p, accelerator, plain_state[p]) for p in precisions
            }
            out = {p: Timing(p, sizes[p], {v: [] for v in variants[p]}, injected_slowdown=slow) for p in precisions}
            for r in range(cap):
                for p in precisions:
                    out[p].device_wait_s = waited
                    names = variants[p]
                    order = names[r % len(names) :] + names[: r % len(names)]  # rotate: no variant always first
                    for v in order:
                        net = nets[(p, v)]
                        seconds = (
                            plain_window(
                                net, batch, sizes[p], p, accelerator, plain_state[p], slowdown=slow.get(v, 0.0)
                            )
                            if v == "plain loop"
                            else lightning_window(
                                net,
                                v != "automatic",
                                batch,
                                sizes[p],
                                p,
                                accelerator,
                                tunings[p][v],
                                slowdown=slow.get(v, 0.0),
                            )
                        )
                        out[p].seconds[v].append(seconds)
                done = r + 1 >= size.rounds and (until is None or until(out))
                progress(
                    f"  round {r + 1}/{size.rounds}"
                    + (f"-{cap}" if cap > size.rounds else "")
                    + ": "
                    + ", ".join(
                        f"{p} " + "/".join(f"{out[p].round_rates(v)[-1]:.1f}" for v in VARIANTS) for p in precisions
                    )
                    + " steps/s (automatic/manual/plain)"
                    + ("; every claim decided" if done and until else "")
                )
                if done:
                    break
    finally:
        torch.set_num_threads(threads)
    return out


def claims_decided(
    runs: list[tuple[Any, ...]], claims: list[tuple[Any, ...]], accelerator: str, example: str = "plot_15_throughput"
) -> Callable[[dict[str, Timing]], bool]:
    """The stopping test of the sequential rule for an example's ``RUNS`` and ``CLAIMS`` tables.

    Picks the declared ``rate_ratio`` claims that apply on ``accelerator`` and compare two per-round
    rate lists (keys ending in ``_round_steps_per_s``, as :meth:`Timing.rates` records them), finds each
    one's precision from its run, and returns a function of the timings so far that is ``True`` when
    :func:`mpguide.verify.claims.metrics.decide_paired` decides every one of them (pass or fail, not inconclusive).
    Claims that compare single numbers are decided without an interval and do not keep rounds going.

    Raises:
        mpguide.verify.claims.declarations.DeclarationError: the tables are malformed (as
            :func:`mpguide.verify.run.runner.run_example` would say).
    """
    from ...claims import declarations

    decl = declarations.from_tables(example, runs, claims)
    precision_of = {r.id: r.precision for r in decl.runs}
    wanted = []
    for claim in decl.claims:
        num, _, den = claim.get("key", "").partition("/")
        if (
            claim["kind"] == "rate_ratio"
            and claim.get("only_on") in (None, accelerator)
            and num.endswith("_round_steps_per_s")
            and den.endswith("_round_steps_per_s")
        ):
            wanted.append((precision_of[claim["runs"][0]], num, den, TOLERANCES[claim["tolerance"]]))

    def decided(timings: dict[str, Timing]) -> bool:
        for precision, num, den, tol in wanted:
            rates = timings[precision].rates()
            ratios = [a / b for a, b in zip(rates[num], rates[den], strict=True)]
            if decide_paired(ratios, tol).verdict == "inconclusive":
                return False
        return True

    return decided


def matmul_peak_tflops(n: int = 8192, repeats: int = 50) -> float:
    """Measured bf16 matmul rate of this GPU in TFLOP/s: ``repeats`` ``n x n @ n x n`` products, after warm-up,
    with the GPU held alone (:func:`mpguide.verify.hardware.device_lock`).

    Raises:
        RuntimeError: CUDA is not available.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("matmul_peak_tflops needs CUDA")
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    with hardware.device_lock("cuda", exclusive=True):  # no other example's kernels in the way
        for _ in range(5):
            a @ b
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        torch.cuda.synchronize()
        return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12
