"""Hardware, precision and size presets: where a run trains and how big it is.

Three environment variables steer every example (and the docs build passes them on):

``MPGUIDE_DEVICE``
    ``auto`` (default: CUDA when present, else CPU), ``cpu`` or ``cuda``.
``MPGUIDE_PRESET``
    ``quick`` (default; CPU-sized, used by CI and the docs build), ``full`` (GPU-sized) or
    ``test`` (a tiny step budget for the test suite).

Precision names are Lightning's own: ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``, and for the
examples about storing the whole model in half precision ``"bf16-true"`` and ``"16-true"``.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: The three precisions every example compares, in display order.
PRECISIONS: tuple[str, ...] = ("32-true", "bf16-mixed", "16-mixed")

#: The "true" half precisions. Lightning's ``HalfPrecision`` plugin casts the whole module (weights, gradients
#: and so the optimizer state) to bf16 or fp16, with no autocast and no GradScaler (``plugins/precision/half.py``).
TRUE_PRECISIONS: tuple[str, ...] = ("bf16-true", "16-true")

#: Every precision a run may train in. :data:`PRECISIONS`, then :data:`TRUE_PRECISIONS`.
RUN_PRECISIONS: tuple[str, ...] = PRECISIONS + TRUE_PRECISIONS

#: Short labels used in run ids and legends.
PRECISION_LABELS: dict[str, str] = {
    "32-true": "fp32",
    "bf16-mixed": "bf16-mixed",
    "16-mixed": "16-mixed",
    "bf16-true": "bf16-true",
    "16-true": "16-true",
}


class ConfigurationError(ValueError):
    """An environment variable or argument names something this library does not know."""


@dataclass(frozen=True)
class Preset:
    """Size of a run.

    Attributes:
        name: ``"test"``, ``"quick"`` or ``"full"``.
        epochs: passes over the training set (an epoch of the digits data is 28 optimizer steps at
            batch size 64).
        batch_size: samples per batch.
    """

    name: str
    epochs: int
    batch_size: int


#: The size presets by name.
PRESETS: dict[str, Preset] = {
    "test": Preset("test", epochs=5, batch_size=64),
    "quick": Preset("quick", epochs=8, batch_size=64),
    "full": Preset("full", epochs=20, batch_size=64),
}


def select_preset(name: str | None = None) -> Preset:
    """Return the size preset named by ``name`` or by ``MPGUIDE_PRESET`` (default ``quick``).

    Raises:
        ConfigurationError: the name is not one of :data:`~mpguide.verify.hardware.PRESETS`.
    """
    name = (name or os.environ.get("MPGUIDE_PRESET") or "quick").lower()  # empty means the default
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown preset {name!r} (from MPGUIDE_PRESET); use one of {sorted(PRESETS)}"
        ) from None


def select_accelerator(name: str | None = None) -> str:
    """Return ``"cuda"`` or ``"cpu"`` from ``name`` or ``MPGUIDE_DEVICE`` (default ``auto``).

    ``auto`` picks CUDA when :func:`torch.cuda.is_available` says so.

    Raises:
        ConfigurationError: unknown name, or ``cuda`` was asked for on a machine without CUDA.
    """
    import torch  # here, not at the top: the gate and the pages read the presets without torch

    name = (name or os.environ.get("MPGUIDE_DEVICE", "auto")).lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda"):
        raise ConfigurationError(f"unknown device {name!r} (from MPGUIDE_DEVICE); use auto, cpu or cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigurationError("MPGUIDE_DEVICE=cuda but torch.cuda.is_available() is False; use auto or cpu")
    return name


def check_precision(precision: str, allowed: tuple[str, ...] = PRECISIONS) -> str:
    """Return ``precision`` unchanged if it is one of ``allowed``.

    Args:
        precision: a Lightning precision name.
        allowed: the names accepted, by default :data:`~mpguide.verify.hardware.PRECISIONS` (the throughput
            benchmark and Fabric runs); Trainer runs pass :data:`~mpguide.verify.hardware.RUN_PRECISIONS`.

    Raises:
        ConfigurationError: any other value (Lightning aliases such as ``"bf16"`` or ``16`` are not
            accepted here, so records always use one spelling).
    """
    if precision not in allowed:
        raise ConfigurationError(f"unknown precision {precision!r}; use one of {list(allowed)}")
    return precision


def trainer_precision_kwargs(precision: str, accelerator: str, plugin_class: type | None = None) -> dict[str, Any]:
    """Keyword arguments for :class:`lightning.pytorch.Trainer` that really run ``precision``.

    ``Trainer(precision="16-mixed")`` on CPU silently falls back to bf16-mixed (Lightning warns
    "You passed `Trainer(accelerator='cpu', precision='16-mixed')` but AMP with fp16 is not supported
    on CPU", see ``trainer/connectors/accelerator_connector.py``), so no GradScaler would ever run in
    CPU CI. On CPU, 16-mixed therefore goes through an explicit
    ``MixedPrecision("16-mixed", "cpu")`` plugin, which creates a CPU ``torch.amp.GradScaler``
    and an fp16 autocast region.

    Args:
        precision: one of :data:`~mpguide.verify.hardware.RUN_PRECISIONS` (``"bf16-true"`` and ``"16-true"`` are
            passed as ``Trainer(precision=...)``: Lightning's ``HalfPrecision`` runs on CPU as on CUDA).
        accelerator: ``"cpu"`` or ``"cuda"``.
        plugin_class: a precision plugin class called as ``plugin_class(precision, accelerator)`` and
            passed in ``plugins=[...]`` for every precision (for example
            :class:`mpguide.precision.ManualMixedPrecision`, which accepts ``"32-true"`` too).

    Returns:
        ``{"precision": ...}`` or ``{"plugins": [plugin]}``.

    Raises:
        ConfigurationError: unknown precision or accelerator.
    """
    from lightning.pytorch.plugins.precision import MixedPrecision

    check_precision(precision, RUN_PRECISIONS)
    if accelerator not in ("cpu", "cuda"):
        raise ConfigurationError(f"unknown accelerator {accelerator!r}; use cpu or cuda")
    if plugin_class is not None:
        return {"plugins": [plugin_class(precision, accelerator)]}
    if precision != "16-mixed" or accelerator == "cuda":
        return {"precision": precision}
    return {"plugins": [MixedPrecision(precision, accelerator)]}


def device_name(accelerator: str) -> str:
    """Human-readable device name: the CUDA device name, or ``"CPU (<n> cores)"``."""
    import torch  # here, not at the top: the gate and the pages read the presets without torch

    if accelerator == "cuda":
        return torch.cuda.get_device_name(0)
    return f"CPU ({os.cpu_count()} cores)"


def device_slug(name: str | None = None) -> str:
    """Folder name for a device's reference records, e.g. ``"nvidia-h200"``.

    Args:
        name: a device name such as ``"NVIDIA H200"`` (default: ``torch.cuda.get_device_name(0)``).

    Returns:
        The name lower-cased, every run of characters other than ``a-z0-9`` replaced by one ``-``,
        with no ``-`` at either end (``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"``).

    Raises:
        ConfigurationError: ``name`` is None and CUDA is not available, or the name has no letter
            or digit at all (it would give an empty folder name).
    """
    import torch  # here, not at the top: the gate and the pages read the presets without torch

    if name is None:
        if not torch.cuda.is_available():
            raise ConfigurationError(
                "device_slug() needs a CUDA device (torch.cuda.is_available() is False) or an explicit device name"
            )
        name = torch.cuda.get_device_name(0)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not slug:
        raise ConfigurationError(f"device name {name!r} has no letter or digit to build a folder name from")
    return slug


#: Accelerators whose lock this process holds, and whether exclusively (see :func:`device_lock`).
_HELD: dict[str, bool] = {}


@contextlib.contextmanager
def device_lock(accelerator: str, exclusive: bool = False) -> Iterator[float]:
    """Hold this machine's lock on ``accelerator`` for the ``with`` block; yields the seconds waited for it.

    The docs build runs examples in parallel worker processes (``conf.py``). On one GPU their kernels
    would share the device, which is harmless for curves but not for timings: every training run
    therefore holds the **shared** lock on CUDA (:func:`mpguide.verify.run.runner.run_example`), and the throughput
    benchmark takes it **exclusive**, so it times an otherwise idle GPU. A waiting exclusive holder
    has priority: it first takes a turnstile that new shared holders must pass, so examples that start
    later cannot keep it waiting. On CPU, and where ``fcntl`` is missing (Windows), nothing is locked
    and 0.0 is yielded (the CPU benchmark measures process CPU time, which other processes barely move).

    The lock files are ``<tempdir>/mpguide-<accelerator>.lock`` and ``...turnstile``
    (``tempfile.gettempdir()``; ``MPGUIDE_LOCK_DIR`` sets another folder), advisory ``flock`` locks
    that the kernel releases when a holder exits, even by a crash.

    The lock is re-entrant within a process: a request while this process already holds it (a
    ``Trainer.fit`` inside a locked run, or inside the benchmark) takes nothing more and yields 0.0.
    It is a lock between processes (the build's parallel workers), not between threads of one process.

    Args:
        accelerator: ``"cpu"`` or ``"cuda"``; only ``"cuda"`` locks unless ``MPGUIDE_LOCK_DIR`` is set
            (the test suite sets it to check the lock on CPU).
        exclusive: take the lock alone (the benchmark) rather than shared (training runs).

    Yields:
        Seconds spent waiting for the lock (wall time).

    Raises:
        ConfigurationError: ``accelerator`` is not ``"cpu"`` or ``"cuda"``.
        RuntimeError: ``exclusive`` was asked for while this process holds the shared lock (a benchmark
            started inside a training run would otherwise wait for itself forever).
    """
    if accelerator not in ("cpu", "cuda"):
        raise ConfigurationError(f"device_lock: unknown accelerator {accelerator!r}; use cpu or cuda")
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        fcntl = None  # type: ignore[assignment]
    folder = os.environ.get("MPGUIDE_LOCK_DIR")
    if fcntl is None or (accelerator != "cuda" and not folder):
        yield 0.0
        return
    if accelerator in _HELD:
        if exclusive and not _HELD[accelerator]:
            raise RuntimeError(
                f"device_lock: asked for {accelerator} exclusively while this process holds it "
                f"shared (inside a training run); time the device outside Trainer.fit and run_example"
            )
        yield 0.0
        return
    base = os.path.join(folder or tempfile.gettempdir(), f"mpguide-{accelerator}")
    started = time.perf_counter()
    with open(base + ".turnstile", "a") as turnstile, open(base + ".lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            if exclusive:  # keep the turnstile closed until this holder is done: no new shared holder gets in
                fcntl.flock(lock, fcntl.LOCK_EX)
            else:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
                fcntl.flock(lock, fcntl.LOCK_SH)
            waited = time.perf_counter() - started
            _HELD[accelerator] = exclusive
            yield waited
        finally:
            _HELD.pop(accelerator, None)
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
