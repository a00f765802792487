"""One timed window of one variant: the MLP and its batch, the Lightning fit or plain loop that runs it, and
the clock that times it (:func:`~mpguide.verify.run.throughput.windows.clock`; the timing rules are in
:mod:`mpguide.verify.run.throughput`), plus the slowdown a test can inject
(:data:`~mpguide.verify.run.throughput.windows.SLOWDOWN_ENV`)."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from ....checks import PitfallChecks
from ... import hardware
from .config import TUNED, VARIANTS, Size, Tuning


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
            variant that is not one of :data:`~mpguide.verify.run.throughput.config.VARIANTS` or
            :data:`~mpguide.verify.run.throughput.config.TUNED`.
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


#: The default of :func:`lightning_window`: no speed-up.
_NO_TUNING = Tuning()


def lightning_window(
    net: nn.Module,
    manual: bool,
    batch: Any,
    size: Size,
    precision: str,
    accelerator: str,
    tuning: Tuning = _NO_TUNING,
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
        callbacks=[clock, *([PitfallChecks()] if tuning.checks else [])],
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


def plain_window(
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


def clock(accelerator: str) -> float:
    """Seconds for timing windows: CUDA: wall time after ``torch.cuda.synchronize()``; CPU: this process's
    CPU time (:func:`time.process_time`).

    On CPU the benchmark runs single-threaded (see :func:`~mpguide.verify.run.throughput.interleaved`), so CPU time
    is the work of the step itself; wall time would mostly measure the other processes sharing the
    cores (on the project's shared 2-core machine, wall-clock rates of one variant swung 100x between
    windows while CPU time did not).
    """
    if accelerator == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()
