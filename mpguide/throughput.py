"""Training throughput: the same MLP trained by Lightning (automatic and manual optimization) and by a
plain PyTorch loop, timed fairly.

Timing rules (what makes a ratio of two variants meaningful on a noisy machine):

* every variant trains the same model shape from the same initial weights on one batch that already
  lives on the device, so no data loading or host-to-device copy is timed;
* each timed **window** starts after ``warmup`` steps of that window (allocations, autocast caches,
  cuBLAS heuristics); on CUDA the device is synchronised before both clock readings, on CPU the
  clock is the process's CPU time with one thread (:func:`~mpguide.throughput.clock`);
* windows of the variants are **interleaved**: round after round, each variant runs one window, in
  an order that rotates every round, so machine noise (other processes, frequency changes) hits
  all variants alike; the reported rate is the **median** over rounds.

The Lightning variants are real :class:`lightning.pytorch.Trainer` fits (``max_steps`` per window,
logger, checkpointing and progress bar off); their windows are timed by a callback from the end of
the last warm-up batch to the end of the last batch, so Trainer setup is not counted, Lightning's
per-step loop and hooks are. On CUDA, :func:`~mpguide.throughput.matmul_peak_tflops` measures a
bf16 matmul peak in the same process, on the same GPU, to put achieved TFLOP/s in proportion.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from . import hardware

#: The variants, in the order of the first round.
VARIANTS: tuple[str, ...] = ("automatic", "manual", "plain loop")


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
    """

    width: int
    layers: int
    batch: int
    warmup: int
    steps: int
    rounds: int

    def flops_per_step(self) -> float:
        """Matmul FLOPs of one training step: forward ``2*B*W*W`` per layer, backward twice that (3x in all)."""
        return 3 * 2 * self.batch * self.width * self.width * self.layers


#: Model and timing sizes by accelerator and preset. The CPU sizes fit 2 shared cores (the whole
#: benchmark at the quick preset, three precisions and three variants, stays under about 20 s). The
#: CUDA ``full`` size is the reference measured before this project (H200, 8 x Linear(4096), batch 8192).
SIZES: dict[tuple[str, str], Size] = {
    ("cpu", "test"): Size(width=256, layers=4, batch=512, warmup=2, steps=3, rounds=3),
    ("cpu", "quick"): Size(width=256, layers=4, batch=512, warmup=2, steps=3, rounds=5),
    ("cpu", "full"): Size(width=256, layers=4, batch=512, warmup=3, steps=20, rounds=7),
    ("cuda", "test"): Size(width=1024, layers=4, batch=1024, warmup=5, steps=20, rounds=3),
    ("cuda", "quick"): Size(width=4096, layers=8, batch=8192, warmup=5, steps=20, rounds=5),
    ("cuda", "full"): Size(width=4096, layers=8, batch=8192, warmup=10, steps=50, rounds=7),
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

    def __init__(self, net: nn.Module, manual: bool) -> None:
        super().__init__()
        self.net = net
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
        return torch.optim.SGD(self.net.parameters(), lr=1e-3)


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
                      accelerator: str) -> float:
    """Seconds of ``size.steps`` timed Trainer steps after ``size.warmup`` untimed ones."""
    n = size.warmup + size.steps
    clock = _WindowClock(size.warmup, accelerator)
    trainer = pl.Trainer(accelerator=accelerator, devices=1, max_steps=n, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, callbacks=[clock],
                         **hardware.trainer_precision_kwargs(precision, accelerator))
    loader = torch.utils.data.DataLoader(_RepeatBatch(batch, n), batch_size=None)
    trainer.fit(_Timed(net, manual), loader)
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


def clock(accelerator: str) -> float:
    """Seconds for timing windows: CUDA: wall time after ``torch.cuda.synchronize()``; CPU: this process's
    CPU time (:func:`time.process_time`).

    On CPU the benchmark runs single-threaded (see :func:`~mpguide.throughput.interleaved`), so CPU time
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
        size: the model and timing size.
        seconds: variant -> seconds of each timed window (``size.steps`` steps), in round order.
    """

    precision: str
    size: Size
    seconds: dict[str, list[float]] = field(default_factory=dict)

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
        rates = [self.size.steps / s for s in self.seconds[variant]]
        return (max(rates) - min(rates)) / statistics.median(rates)

    def summary(self) -> dict[str, Any]:
        """JSON-ready medians, spreads and raw windows, keyed by variant (for a record's ``extra``)."""
        return {v: {"steps_per_s": self.steps_per_s(v), "samples_per_s": self.samples_per_s(v),
                    "tflops": self.tflops(v), "spread": self.spread(v), "window_seconds": self.seconds[v]}
                for v in self.seconds}


def interleaved(precisions: tuple[str, ...], size: Size, accelerator: str,
                progress: Callable[[str], None] = print) -> dict[str, Timing]:
    """Time the three :data:`~mpguide.throughput.VARIANTS` in every precision, interleaved.

    Each variant keeps its own copy of the same initial weights across rounds (it goes on training),
    so no variant times a cold model the others have warmed.

    Args:
        precisions: Lightning precision names.
        size: model and timing size (see :data:`~mpguide.throughput.SIZES`).
        accelerator: ``"cpu"`` or ``"cuda"``.
        progress: called with one line per round.

    Returns:
        precision -> :class:`~mpguide.throughput.Timing`.
    """
    from .runner import quiet_lightning

    quiet_lightning()
    batch = one_batch(size, accelerator)
    nets = {(p, v): build_mlp(size).to(accelerator) for p in precisions for v in VARIANTS}
    plain_state: dict[str, dict[str, Any]] = {p: {} for p in precisions}
    out = {p: Timing(p, size, {v: [] for v in VARIANTS}) for p in precisions}
    import warnings

    threads = torch.get_num_threads()
    if accelerator == "cpu":
        torch.set_num_threads(1)  # CPU time of one thread = the step's work, whoever else uses the cores
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's "few batches" and precision notes are not timed facts
        for r in range(size.rounds):
            for p in precisions:
                order = VARIANTS[r % 3:] + VARIANTS[:r % 3]  # rotate: no variant always goes first
                for v in order:
                    net = nets[(p, v)]
                    seconds = (_plain_window(net, batch, size, p, accelerator, plain_state[p]) if v == "plain loop"
                               else _lightning_window(net, v == "manual", batch, size, p, accelerator))
                    out[p].seconds[v].append(seconds)
            progress(f"  round {r + 1}/{size.rounds}: " + ", ".join(
                f"{p} " + "/".join(f"{size.steps / out[p].seconds[v][-1]:.1f}" for v in VARIANTS)
                for p in precisions)
                + " steps/s (automatic/manual/plain)")
    torch.set_num_threads(threads)
    return out


def matmul_peak_tflops(n: int = 8192, repeats: int = 50) -> float:
    """Measured bf16 matmul rate of this GPU in TFLOP/s: ``repeats`` ``n x n @ n x n`` products, after warm-up.

    Raises:
        RuntimeError: CUDA is not available.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("matmul_peak_tflops needs CUDA")
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * repeats / (time.perf_counter() - start) / 1e12
