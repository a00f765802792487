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
  all variants alike; the reported rate is the **median** over rounds;
* the number of rounds is **sequential**: after :attr:`Size.rounds` rounds (the fewest that admit a
  95 % interval for a median), the benchmark stops as soon as every parity claim it is given
  (:func:`~mpguide.verify.throughput.claims_decided`) is decided by the rule of
  :func:`mpguide.verify.metrics.decide_paired`, else it times another round, up to :attr:`Size.max_rounds`;
  the claims that are still undecided there are judged inconclusive (never passed).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from . import hardware
from .metrics import decide_paired
from .tolerances import TOLERANCES

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


def variants_for(precision: str, size: Size) -> tuple[str, ...]:
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
        rounds: windows per variant at least (the median is taken over all rounds timed); 6 is the
            fewest that admit a 95 % interval for a median (:func:`mpguide.verify.metrics.median_interval`).
        max_rounds: the cap of the sequential rule: with a stopping test
            (:func:`~mpguide.verify.throughput.interleaved`'s ``until``) rounds go on until it says every claim is
            decided or this many were timed; without one, exactly ``rounds`` are timed.
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
#: claim is decided, at most ``max_rounds`` (see :data:`mpguide.verify.tolerances.PAIRED_RULE`). A CPU round costs
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

    def __iter__(self):
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
    """Reads the clock (device synchronised) at the end of batch ``warmup - 1`` and of the last batch.

    ``slowdown`` > 0 (a test hook, :data:`SLOWDOWN_ENV`) makes every timed step really last that fraction
    longer: after each one it busy-waits on the same clock for ``slowdown`` x the step's own time.
    """

    def __init__(self, warmup: int, accelerator: str, slowdown: float = 0.0) -> None:
        self.warmup, self.accelerator, self.slowdown = warmup, accelerator, slowdown
        self.start = self.end = 0.0

    def _now(self) -> float:
        return clock(self.accelerator)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup - 1:
            self.start = self._now()
        elif batch_idx >= self.warmup and self.slowdown > 0:
            _spin(self.accelerator, self.slowdown * (self._now() - self.end))
        self.end = self._now()


#: Environment variable of a test hook that slows variants down for real. ``"manual=0.3"`` makes each timed
#: step of the manual variant last 30 % longer (rate x 1/1.3); ``"manual=0.3,plain loop=0.1"`` slows two.
#: It proves that a parity claim fails on a real regression; the record says so (``injected_slowdown``).
SLOWDOWN_ENV = "MPGUIDE_INJECT_SLOWDOWN"


def parse_slowdown(text: str | None) -> dict[str, float]:
    """``"variant=fraction[,...]"`` (:data:`SLOWDOWN_ENV`) -> variant -> fraction; ``""``/``None`` -> ``{}``.

    Raises:
        hardware.ConfigurationError: an entry without ``=``, a fraction that is not a number >= 0, or a
            variant that is not one of :data:`VARIANTS` or :data:`TUNED`.
    """
    known = set(VARIANTS) | {v for tuned in TUNED.values() for v in tuned}
    out: dict[str, float] = {}
    for entry in filter(None, (e.strip() for e in (text or "").split(","))):
        name, sep, value = entry.partition("=")
        try:
            fraction = float(value) if sep else -1.0
        except ValueError:
            fraction = -1.0
        if name.strip() not in known or not fraction >= 0:
            raise hardware.ConfigurationError(
                f"{SLOWDOWN_ENV}={text!r}: entry {entry!r} must be 'variant=fraction' with a fraction >= 0 and a "
                f"variant among {sorted(known)}; e.g. {SLOWDOWN_ENV}='manual=0.3', or unset it"
            )
        out[name.strip()] = fraction
    return out


def _spin(accelerator: str, seconds: float) -> None:
    """Busy-wait ``seconds`` of the benchmark's clock (real work on CPU: CPU time only advances while running)."""
    until = clock(accelerator) + seconds
    while clock(accelerator) < until:
        pass


def _lightning_window(
    net: nn.Module,
    manual: bool,
    batch: Any,
    size: Size,
    precision: str,
    accelerator: str,
    tuning: Tuning = Tuning(),
    slowdown: float = 0.0,
) -> float:
    """Seconds of ``size.steps`` timed Trainer steps after ``size.warmup`` untimed ones."""
    n = size.warmup + size.steps
    clock = _WindowClock(size.warmup, accelerator, slowdown)
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        max_steps=n,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[clock],
        **hardware.trainer_precision_kwargs(precision, accelerator),
    )
    loader = torch.utils.data.DataLoader(_RepeatBatch(batch, n), batch_size=None)
    before = torch.get_float32_matmul_precision()
    if tuning.tf32:
        torch.set_float32_matmul_precision("high")
    try:
        trainer.fit(_Timed(net, manual, fused=tuning.fused), loader)
    finally:
        torch.set_float32_matmul_precision(before)
    return clock.end - clock.start


def _plain_window(
    net: nn.Module,
    batch: Any,
    size: Size,
    precision: str,
    accelerator: str,
    state: dict[str, Any],
    slowdown: float = 0.0,
) -> float:
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
        before = clock(accelerator)
        step()
        if slowdown > 0:
            _spin(accelerator, slowdown * (clock(accelerator) - before))
    return clock(accelerator) - start


def _calibrated(
    size: Size, net: nn.Module, batch: Any, precision: str, accelerator: str, state: dict[str, Any]
) -> Size:
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
        injected_slowdown: variant -> fraction of the test hook :data:`SLOWDOWN_ENV` (empty normally).
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
        """Achieved matmul TFLOP/s (:meth:`Size.flops_per_step` x median steps/s / 1e12)."""
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
        """Flat record entries for every timed variant (see :func:`variant_key`): ``<key>_steps_per_s`` and
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
    """Time the variants of every precision (:func:`~mpguide.verify.throughput.variants_for`), interleaved.

    Each variant keeps its own copy of the same initial weights across rounds (it goes on training),
    so no variant times a cold model the others have warmed. On CUDA the benchmark holds the GPU alone
    (:func:`mpguide.verify.hardware.device_lock`, exclusive) from the first window to the last.

    Args:
        precisions: Lightning precision names.
        size: model and timing size (see :data:`~mpguide.verify.throughput.SIZES`).
        accelerator: ``"cpu"`` or ``"cuda"``.
        progress: called with one line per round.
        until: the sequential stopping test, e.g. :func:`~mpguide.verify.throughput.claims_decided`: called
            after every round from round ``size.rounds`` on with the timings so far; ``True`` stops.
            Rounds end at ``size.max_rounds`` whatever it says. ``None``: exactly ``size.rounds`` rounds.
        slowdown: variant -> fraction by which each of its timed steps is really made longer (a test
            hook; default: :data:`SLOWDOWN_ENV`, parsed by :func:`~mpguide.verify.throughput.parse_slowdown`).

    Returns:
        precision -> :class:`~mpguide.verify.throughput.Timing`.

    Raises:
        hardware.ConfigurationError: an unknown precision or accelerator, or a malformed :data:`SLOWDOWN_ENV`.
    """
    import os
    import warnings

    from .runner import quiet_lightning

    for p in precisions:
        hardware.check_precision(p)
    slow = parse_slowdown(os.environ.get(SLOWDOWN_ENV)) if slowdown is None else dict(slowdown)
    if slow:
        progress(f"  TEST HOOK: injected slowdown {slow} (each timed step of these variants lasts that much longer)")
    cap = max(size.rounds, size.max_rounds) if until is not None else size.rounds
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
                            _plain_window(
                                net, batch, sizes[p], p, accelerator, plain_state[p], slowdown=slow.get(v, 0.0)
                            )
                            if v == "plain loop"
                            else _lightning_window(
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
    :func:`mpguide.verify.metrics.decide_paired` decides every one of them (pass or fail, not inconclusive).
    Claims that compare single numbers are decided without an interval and do not keep rounds going.

    Raises:
        mpguide.verify.declarations.DeclarationError: the tables are malformed (as
            :func:`mpguide.verify.runner.run_example` would say).
    """
    from . import declarations

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
