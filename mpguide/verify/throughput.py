"""Training throughput: the same MLP trained by Lightning (automatic and manual optimization) and by a
plain PyTorch loop, timed fairly.

Timing rules (what makes a ratio of two variants meaningful on a noisy machine):

* every variant trains the same model shape from the same initial weights on one batch that already
  lives on the device, so no data loading or host-to-device copy is timed;
* each timed **window** starts after ``warmup`` steps of that window (allocations, autocast caches,
  cuBLAS heuristics); on CUDA the device is synchronised before both clock readings, on CPU the
  clock is the process's CPU time with one thread (:func:`~mpguide.verify.throughput.clock`);
* windows of the variants are **interleaved**: round after round, each variant runs one window, in
  an order that rotates every round, so machine noise (other processes, frequency changes) hits
  all variants alike; the reported rate is the **median** over rounds.

The Lightning variants are real :class:`lightning.pytorch.Trainer` fits (``max_steps`` per window,
logger, checkpointing and progress bar off); their windows are timed by a callback from the end of
the last warm-up batch to the end of the last batch, so Trainer setup is not counted, Lightning's
per-step loop and hooks are. On CUDA, :func:`~mpguide.verify.throughput.matmul_peak_tflops` measures a
bf16 matmul peak in the same process, on the same GPU, to put achieved TFLOP/s in proportion, and
the GPU sizes also time :data:`~mpguide.verify.throughput.TUNED`: the manual variant with one standard
speed-up at a time (TF32 matmuls in fp32; a fused optimizer, ``torch.compile`` or both in bf16-mixed),
so the page can say what each one moves. On a GPU the whole benchmark holds the device alone
(:func:`mpguide.verify.hardware.device_lock`), although the docs build runs other examples in parallel.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from . import hardware

#: The baseline variants, timed in every precision and compared by the parity claims, in the order of
#: the first round.
VARIANTS: tuple[str, ...] = ("automatic", "manual", "plain loop")


@dataclass(frozen=True)
class Tuning:
    """Standard speed-ups applied to the manual variant (see :data:`~mpguide.verify.throughput.TUNED`).

    Attributes:
        fused: ``torch.optim.SGD(..., fused=True)``: one kernel updates every parameter.
        compiled: the MLP wrapped in ``torch.compile`` (default mode) once per variant and precision;
            its compilation happens in the warm-up steps of the first window.
        tf32: ``torch.set_float32_matmul_precision("high")`` for the window (TF32 tensor-core matmuls
            for fp32 tensors; restored afterwards). Only fp32 runs fp32 matmuls, so only fp32 uses it.
    """

    fused: bool = False
    compiled: bool = False
    tf32: bool = False


#: The tuned variants of each precision, as variant name -> :class:`~mpguide.verify.throughput.Tuning`. They
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


def variant_key(variant: str) -> str:
    """The variant's name as a record key prefix: ``"plain loop"`` -> ``"plain_loop"``,
    ``"manual, compiled + fused SGD"`` -> ``"manual_compiled_fused_sgd"``."""
    return "_".join(re.findall(r"[a-z0-9]+", variant.lower()))


def variants_for(precision: str, size: "Size") -> tuple[str, ...]:
    """The variants timed in ``precision``: :data:`VARIANTS`, then the tuned ones when ``size.tuned``."""
    return VARIANTS + (tuple(TUNED.get(precision, {})) if size.tuned else ())


@dataclass(frozen=True)
class Size:
    """Model and timing size.

    Attributes:
        width: features of every ``Linear(width, width)`` layer.
        layers: number of such layers (ReLU between them).
        batch: samples per step.
        warmup: untimed steps at the start of every window.
        steps: timed steps per window.
        rounds: windows per variant (the median is taken over these).
        tuned: also time the :data:`~mpguide.verify.throughput.TUNED` variants.
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
SIZES: dict[tuple[str, str], Size] = {
    ("cpu", "test"): Size(width=256, layers=4, batch=512, warmup=2, steps=3, rounds=5, min_window_s=0.05),
    ("cpu", "quick"): Size(width=256, layers=4, batch=512, warmup=2, steps=3, rounds=5, min_window_s=0.05),
    ("cpu", "full"): Size(width=256, layers=4, batch=512, warmup=3, steps=20, rounds=7, min_window_s=0.05),
    ("cuda", "test"): Size(width=1024, layers=4, batch=1024, warmup=5, steps=20, rounds=3, tuned=True),
    ("cuda", "quick"): Size(width=4096, layers=8, batch=8192, warmup=5, steps=20, rounds=5, tuned=True),
    ("cuda", "full"): Size(width=4096, layers=8, batch=8192, warmup=5, steps=20, rounds=5, tuned=True),
}


def build_mlp(size: Size, seed: int = 0) -> nn.Sequential:
    """``size.layers`` x ``Linear(width, width)`` with ReLU between them (fp32 weights), seeded."""
    torch.manual_seed(seed)
    mods: list[nn.Module] = []
    for i in range(size.layers):
        mods.append(nn.Linear(size.width, size.width))
        if i < size.layers - 1:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def one_batch(size: Size, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """One ``(x, y)`` batch on ``device``: float32 inputs and regression targets, shape ``(batch, width)``."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(size.batch, size.width, generator=gen)
    return x.to(device), (0.5 * x.roll(1, dims=1)).to(device)


class _RepeatBatch(torch.utils.data.IterableDataset):
    """The same device batch, ``n`` times (no copying, no collation)."""

    def __init__(self, batch: tuple[torch.Tensor, torch.Tensor], n: int) -> None:
        self.batch, self.n = batch, n

    def __iter__(self):  # noqa: D105
        return iter([self.batch] * self.n)


class _Timed(pl.LightningModule):
    """The MLP with SGD, trained by Lightning with automatic or manual optimization."""

    def __init__(self, net: nn.Module, manual: bool, fused: bool = False) -> None:
        super().__init__()
        self.net = net
        self.fused = fused
        self.automatic_optimization = not manual

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).float(), y)
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.net.parameters(), lr=1e-3, fused=self.fused or None)


class _WindowClock(Callback):
    """Reads the clock (device synchronised) at the end of batch ``warmup - 1`` and of the last batch."""

    def __init__(self, warmup: int, accelerator: str) -> None:
        self.warmup, self.accelerator = warmup, accelerator
        self.start = self.end = 0.0

    def _now(self) -> float:
        return clock(self.accelerator)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup - 1:
            self.start = self._now()
        self.end = self._now()


def _lightning_window(net: nn.Module, manual: bool, batch: Any, size: Size, precision: str,
                      accelerator: str, tuning: Tuning = Tuning()) -> float:
    """Seconds of ``size.steps`` timed Trainer steps after ``size.warmup`` untimed ones."""
    n = size.warmup + size.steps
    clock = _WindowClock(size.warmup, accelerator)
    trainer = pl.Trainer(accelerator=accelerator, devices=1, max_steps=n, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, callbacks=[clock],
                         **hardware.trainer_precision_kwargs(precision, accelerator))
    loader = torch.utils.data.DataLoader(_RepeatBatch(batch, n), batch_size=None)
    before = torch.get_float32_matmul_precision()
    if tuning.tf32:
        torch.set_float32_matmul_precision("high")
    try:
        trainer.fit(_Timed(net, manual, fused=tuning.fused), loader)
    finally:
        torch.set_float32_matmul_precision(before)
    return clock.end - clock.start


def _plain_window(net: nn.Module, batch: Any, size: Size, precision: str, accelerator: str,
                  state: dict[str, Any]) -> float:
    """Seconds of ``size.steps`` timed steps of a plain PyTorch loop (autocast + GradScaler as Lightning uses)."""
    x, y = batch
    opt = state.setdefault("opt", torch.optim.SGD(net.parameters(), lr=1e-3))
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    if precision == "16-mixed" and "scaler" not in state:
        state["scaler"] = torch.amp.GradScaler(accelerator)
    scaler = state.get("scaler")

    def step() -> None:
        opt.zero_grad()
        with torch.autocast(accelerator, dtype=dtype, enabled=dtype is not None, cache_enabled=False):
            loss = nn.functional.mse_loss(net(x).float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    for _ in range(size.warmup):
        step()
    start = clock(accelerator)
    for _ in range(size.steps):
        step()
    return clock(accelerator) - start


def _calibrated(size: Size, net: nn.Module, batch: Any, precision: str, accelerator: str,
                state: dict[str, Any]) -> Size:
    """``size`` with enough timed steps per window to last :attr:`Size.min_window_s` in ``precision``.

    Times one untimed-for-the-result window of the plain loop (``size.warmup`` + ``size.steps`` steps on
    the plain variant's own model, which goes on training) and scales ``steps`` up from it, never down.
    """
    if size.min_window_s <= 0:
        return size
    seconds = _plain_window(net, batch, size, precision, accelerator, state)
    per_step = max(seconds, 1e-9) / size.steps
    return dataclasses.replace(size, steps=max(size.steps, math.ceil(size.min_window_s / per_step)))


def clock(accelerator: str) -> float:
    """Seconds for timing windows: CUDA: wall time after ``torch.cuda.synchronize()``; CPU: this process's
    CPU time (:func:`time.process_time`).

    On CPU the benchmark runs single-threaded (see :func:`~mpguide.verify.throughput.interleaved`), so CPU time
    is the work of the step itself; wall time would mostly measure the other processes sharing the
    cores (on the project's shared 2-core machine, wall-clock rates of one variant swung 100x between
    windows while CPU time did not).
    """
    if accelerator == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()


@dataclass
class Timing:
    """Timed windows of one precision.

    Attributes:
        precision: ``"32-true"``, ``"bf16-mixed"`` or ``"16-mixed"``.
        size: the model and timing size of this precision (``size.steps``: timed steps per window,
            after :attr:`Size.min_window_s` calibration).
        seconds: variant -> seconds of each timed window (``size.steps`` steps), in round order.
        device_wait_s: seconds the benchmark waited for the GPU to itself (0.0 on CPU; see
            :func:`mpguide.verify.hardware.device_lock`).
    """

    precision: str
    size: Size
    seconds: dict[str, list[float]] = field(default_factory=dict)
    device_wait_s: float = 0.0

    def steps_per_s(self, variant: str) -> float:
        """Median over windows of ``steps / seconds`` for ``variant``."""
        return statistics.median(self.size.steps / s for s in self.seconds[variant])

    def samples_per_s(self, variant: str) -> float:
        """Median steps/s times the batch size."""
        return self.steps_per_s(variant) * self.size.batch

    def tflops(self, variant: str) -> float:
        """Achieved matmul TFLOP/s (:meth:`Size.flops_per_step` x median steps/s / 1e12)."""
        return self.steps_per_s(variant) * self.size.flops_per_step() / 1e12

    def spread(self, variant: str) -> float:
        """(max - min) / median of the per-window rates of ``variant`` (a fraction; noise indicator)."""
        rates = self.round_rates(variant)
        return (max(rates) - min(rates)) / statistics.median(rates)

    def summary(self) -> dict[str, Any]:
        """JSON-ready medians, spreads and raw windows, keyed by variant (for a record's ``extra``)."""
        return {v: {"steps_per_s": self.steps_per_s(v), "samples_per_s": self.samples_per_s(v),
                    "tflops": self.tflops(v), "spread": self.spread(v), "steps_per_window": self.size.steps,
                    "window_seconds": self.seconds[v], "round_steps_per_s": self.round_rates(v)}
                for v in self.seconds}

    def round_rates(self, variant: str) -> list[float]:
        """Steps/s of each window of ``variant``, in round order (round ``r`` of every variant ran back to back)."""
        return [self.size.steps / s for s in self.seconds[variant]]

    def rates(self) -> dict[str, Any]:
        """Flat record entries for every timed variant (see :func:`variant_key`): ``<key>_steps_per_s`` and
        ``<key>_samples_per_s`` (medians) and ``<key>_round_steps_per_s`` (a list, one rate per round), the
        numbers :func:`mpguide.verify.claims.rate_ratio` claims divide (lists: paired by round)."""
        out: dict[str, Any] = {}
        for v in self.seconds:
            out[f"{variant_key(v)}_steps_per_s"] = self.steps_per_s(v)
            out[f"{variant_key(v)}_samples_per_s"] = self.samples_per_s(v)
            out[f"{variant_key(v)}_round_steps_per_s"] = self.round_rates(v)
        return out


def interleaved(precisions: tuple[str, ...], size: Size, accelerator: str,
                progress: Callable[[str], None] = print) -> dict[str, Timing]:
    """Time the variants of every precision (:func:`~mpguide.verify.throughput.variants_for`), interleaved.

    Each variant keeps its own copy of the same initial weights across rounds (it goes on training),
    so no variant times a cold model the others have warmed. On CUDA the benchmark holds the GPU alone
    (:func:`mpguide.verify.hardware.device_lock`, exclusive) from the first window to the last.

    Args:
        precisions: Lightning precision names.
        size: model and timing size (see :data:`~mpguide.verify.throughput.SIZES`).
        accelerator: ``"cpu"`` or ``"cuda"``.
        progress: called with one line per round.

    Returns:
        precision -> :class:`~mpguide.verify.throughput.Timing`.

    Raises:
        hardware.ConfigurationError: an unknown precision or accelerator.
    """
    import warnings

    from .runner import quiet_lightning

    for p in precisions:
        hardware.check_precision(p)
    quiet_lightning()
    batch = one_batch(size, accelerator)
    variants = {p: variants_for(p, size) for p in precisions}
    tunings = {p: {**{v: Tuning() for v in VARIANTS}, **TUNED.get(p, {})} for p in precisions}
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
            sizes = {p: _calibrated(size, nets[(p, "plain loop")], batch, p, accelerator, plain_state[p])
                     for p in precisions}
            out = {p: Timing(p, sizes[p], {v: [] for v in variants[p]}) for p in precisions}
            for r in range(size.rounds):
                for p in precisions:
                    out[p].device_wait_s = waited
                    names = variants[p]
                    order = names[r % len(names):] + names[:r % len(names)]  # rotate: no variant always first
                    for v in order:
                        net = nets[(p, v)]
                        seconds = (_plain_window(net, batch, sizes[p], p, accelerator, plain_state[p])
                                   if v == "plain loop" else
                                   _lightning_window(net, v != "automatic", batch, sizes[p], p, accelerator,
                                                     tunings[p][v]))
                        out[p].seconds[v].append(seconds)
                progress(f"  round {r + 1}/{size.rounds}: " + ", ".join(
                    f"{p} " + "/".join(f"{out[p].round_rates(v)[-1]:.1f}" for v in VARIANTS)
                    for p in precisions)
                    + " steps/s (automatic/manual/plain)")
    finally:
        torch.set_num_threads(threads)
    return out


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
        return 2 * n ** 3 * repeats / (time.perf_counter() - start) / 1e12
