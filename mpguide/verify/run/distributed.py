"""Data-parallel runs for the examples: ``Trainer(strategy="ddp_fork", devices=2)`` on CPU over gloo.

An example trains as a plain script *and* inside sphinx-gallery, in the ``sphinx-build`` process.
That rules out two of Lightning's DDP launchers (Lightning 2.6.6, ``pytorch/strategies/launchers/``):

* ``strategy="ddp"`` starts the other ranks by running ``sys.argv[0]`` again
  (``subprocess_script.py``); inside sphinx-gallery that is ``sphinx-build``, not the example.
* ``strategy="ddp_spawn"`` pickles the LightningModule and, in every child, re-runs the ``__main__``
  script (``multiprocessing.spawn``): an example without a ``__main__`` guard trains again in each
  child, and a class defined on a gallery page cannot be unpickled.

``strategy="ddp_fork"`` (``DDPStrategy(start_method="fork")``, ``multiprocessing.py``) forks the
process that calls ``fit``: the ranks inherit the module, its class and the data loader in both
contexts, and nothing is re-run. Lightning refuses to fork once CUDA is initialised, so these runs
always train on CPU with the gloo backend, on ``127.0.0.1`` and a free port; the synchronisation
semantics shown (when DDP all-reduces, what the ranks then agree on) are the same with NCCL on GPUs.

Each rank records its own steps with :class:`RankRecorder` and writes them to a file; the parent
process merges the ranks into one :class:`mpguide.verify.run.strategy.RunResult` (the loss of the global batch
is the mean of the ranks' losses, since every rank's batch has the same size). Counting all-reduces:
Lightning registers ``DDPStrategy(ddp_comm_hook=...)`` only on CUDA (``_register_ddp_hooks`` in
``strategies/ddp.py``) and silently ignores it on CPU, so :class:`RankRecorder` registers a counting
hook on the ``DistributedDataParallel`` module itself.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler, TensorDataset

from ...data import digits_tensors
from .. import hardware
from ..records.measures import measures_of
from .probes import parameter_digest
from .strategy import RunResult, StepRecorder, TrainerRun, captured_warnings

#: Number of processes of every DDP run.
WORLD_SIZE = 2

#: The ``extra`` keys a two-rank DDP run adds (the ranks' own probes declare theirs).
MEASURES = {
    "ranks": "count",
    "allreduce_calls": "count",
    "allreduce_bytes": "count",
    "allreduce_counts_agree": "bool",
    "weights_agree_across_ranks": "bool",
    "skipped_batches_per_rank": "list[list[count]]",
    "skip_decisions_agree": "bool",
    "record_extra_per_rank": "list[json]",
    "allreduces_per_optimizer_step": "nonnegative",
    "allreduce_bytes_per_optimizer_step": "nonnegative",
}


def free_port() -> int:
    """A TCP port on ``127.0.0.1`` that was free a moment ago (bound and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_and_world() -> tuple[int, int]:
    """``(rank, world size)`` of this process: from :mod:`torch.distributed` once initialised, else ``(0, 1)``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class RankSlices(Sampler):
    """Split each global batch of index lists among the ranks: rank ``r`` of ``w`` gets the ``r``-th of ``w``
    equal parts.

    The rank is read when iteration starts (:func:`rank_and_world`), so one loader built before
    ``fit`` serves every forked rank, and yields whole global batches in a single process.

    Args:
        batches: a sampler of index lists (global batches); each length must divide by the world size.

    Raises:
        ValueError: (when iterated) a global batch that does not split evenly.
    """

    def __init__(self, batches: Iterable[list[int]]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[list[int]]:
        rank, world = rank_and_world()
        for batch in self.batches:
            if len(batch) % world:
                raise ValueError(f"a global batch of {len(batch)} samples does not split among {world} ranks")
            part = len(batch) // world
            yield batch[rank * part : (rank + 1) * part]

    def __len__(self) -> int:
        return len(self.batches)


def sharded_digits_loader(batch_size: int = 64, seed: int = 0) -> DataLoader:
    """The global batches of :func:`mpguide.data.digits_loader`, split among the DDP ranks.

    Built exactly like ``digits_loader(batch_size, seed)`` (a :class:`~torch.utils.data.RandomSampler`
    drawing from one seeded generator, incomplete last batch dropped), so in one process it yields
    the same batches in the same order; with ``w`` ranks each rank gets ``batch_size / w`` samples
    of every global batch (use ``Trainer(use_distributed_sampler=False)``, or Lightning replaces the
    sampler with a :class:`~torch.utils.data.DistributedSampler` that has another order).

    Args:
        batch_size: samples per global batch.
        seed: seed of the shuffling generator.

    Returns:
        A loader of ``(images float32 (batch_size / w, 64), labels int64 (batch_size / w,))``; its
        length is the number of global batches (28 per epoch at ``batch_size=64``).
    """
    images, labels = digits_tensors()
    dataset = TensorDataset(images, labels)
    generator = torch.Generator().manual_seed(seed)
    batches = BatchSampler(RandomSampler(dataset, generator=generator), batch_size, drop_last=True)
    return DataLoader(dataset, batch_sampler=RankSlices(batches), generator=generator)


@dataclass
class CommCounter:
    """All-reduces a DDP module launched, and their payload in bytes (gradient buckets, this rank)."""

    calls: int = 0
    bytes: int = 0


def counting_allreduce_hook(state, bucket):  # no annotations: DDP's register_comm_hook checks them
    """A DDP communication hook: count the bucket, then all-reduce it as DDP does by default (sum, divide).

    Args:
        state: the :class:`CommCounter`, updated in place.
        bucket: ``torch.distributed.GradBucket``; ``bucket.buffer()`` is the flat gradient tensor.

    Returns:
        A future holding the averaged buffer, as ``register_comm_hook`` requires
        (``torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py`` documents the contract).
    """
    buffer = bucket.buffer()
    state.calls += 1
    state.bytes += buffer.numel() * buffer.element_size()
    world = dist.get_world_size()
    future = dist.all_reduce(buffer, async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0].div_(world))


class RankRecorder(StepRecorder):
    """:class:`mpguide.verify.run.strategy.StepRecorder` for one DDP rank: also counts all-reduces and writes a file.

    In every rank (a forked child) it captures warnings from ``setup`` on, registers
    :func:`counting_allreduce_hook` when the model is a ``DistributedDataParallel``, and at the end
    of training writes ``rank<r>.json`` into ``out_dir`` with the per-step lists, the counts, the
    digest of the final weights (:func:`mpguide.verify.run.probes.parameter_digest`), ``global_step`` and the
    ``record_extra()`` of the example's probes (the other callbacks of the ``Trainer`` that have one).

    Args:
        out_dir: folder shared with the parent process.
    """

    def __init__(self, out_dir: str) -> None:
        super().__init__()
        self.out_dir = out_dir
        self.comm = CommCounter()
        self._warnings: Any = None
        self._caught: list[Any] = []

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._warnings = warnings.catch_warnings(record=True)
        self._caught = self._warnings.__enter__()
        warnings.simplefilter("always")

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        model = trainer.strategy.model
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model.register_comm_hook(self.comm, counting_allreduce_hook)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        rank = trainer.global_rank
        extra: dict[str, Any] = {}
        measures: dict[str, str] = {}
        for callback in trainer.callbacks:  # the example's probes, forked into this rank with the Trainer
            if callback is not self and callable(getattr(callback, "record_extra", None)):
                extra.update(callback.record_extra())
                measures.update(measures_of(callback))
        data = {
            "rank": rank,
            "loss": self.loss,
            "lr": self.lr,
            "scale": self.scale,
            "skipped": self.skipped_per_step,
            "allreduce_calls": self.comm.calls,
            "allreduce_bytes": self.comm.bytes,
            "weights": parameter_digest(pl_module),
            "global_step": trainer.global_step,
            "extra": extra,
            "measures": measures,
            "warnings": captured_warnings(self._caught),
        }
        path = Path(self.out_dir) / f"rank{rank}.json"
        path.write_text(json.dumps(data), encoding="utf-8")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._warnings is not None:
            self._warnings.__exit__(None, None, None)
            self._warnings = None


def is_ddp(spec: Any) -> bool:
    """Whether a declared run (:class:`mpguide.verify.claims.declarations.RunDecl`) asks for several processes."""
    return int(spec.trainer_kwargs.get("devices", 1)) > 1


class DDPRun(TrainerRun):
    """:class:`mpguide.verify.run.strategy.TrainerRun` in :data:`WORLD_SIZE` forked CPU ranks over gloo, merged.

    A run declared with ``{"trainer": {"strategy": "ddp_fork", "devices": 2}}`` trains in forked processes
    (see the module docstring for why fork, and why CPU, whatever accelerator was asked for) on
    :func:`sharded_digits_loader`: each rank sees its share of every global batch of ``preset.batch_size``
    samples, in the order one process would see them whole. Each rank measures with a :class:`RankRecorder`
    and the example's probes; the probes' ``record_extra()`` is called there, from :class:`RankRecorder`'s
    ``on_train_end`` (before theirs: a probe measures in earlier hooks or in ``record_extra`` itself).

    The result has the fields of a single-process run, merged over the ranks: ``loss`` is the mean
    of the ranks' losses per step (the loss of the global batch for a mean-reduced loss), ``lr`` and
    ``loss_scale`` are rank 0's, ``warnings`` the union. ``extra`` adds ``ranks`` (world size),
    ``allreduce_calls`` and ``allreduce_bytes`` (rank 0; ``allreduce_counts_agree`` says whether
    every rank counted the same), ``weights_agree_across_ranks`` (final weights bitwise equal),
    ``allreduces_per_optimizer_step`` and ``allreduce_bytes_per_optimizer_step`` (divided by rank
    0's ``global_step``, i.e. by the optimizer steps of a one-optimizer module),
    ``skipped_batches_per_rank`` (batch indices after which each rank's loss scale went down, i.e.
    GradScaler skipped a step), ``skip_decisions_agree``, ``global_step`` and ``batches``, plus rank
    0's probe measurements and ``record_extra_per_rank`` (each rank's). An exception in any rank is stored
    in ``error`` (type and message) and leaves the per-step lists empty.
    """

    precisions = hardware.PRECISIONS
    unbuilt = "?"

    @property
    def device(self) -> str:
        """Always ``"cpu"``, since Lightning refuses to fork once CUDA is initialised."""
        return "cpu"

    def check(self, spec: Any) -> None:
        """Refuse a DDP run declared with another number of devices than :data:`WORLD_SIZE`, or a strategy other
        than ``"ddp_fork"``, then an unknown precision (``hardware.ConfigurationError``)."""
        kwargs = dict(spec.trainer_kwargs)
        if kwargs.get("devices") != WORLD_SIZE or kwargs.get("strategy") != "ddp_fork":
            raise hardware.ConfigurationError(
                f"run {spec.id!r}: DDP runs are declared with {{'strategy': 'ddp_fork', 'devices': {WORLD_SIZE}}} "
                f"(fork works both in scripts and inside sphinx-gallery); found {kwargs}"
            )
        super().check(spec)

    def make_loader(self, batch_size: int, seed: int) -> DataLoader:
        """:func:`sharded_digits_loader`: the global batches of one process, split among the ranks."""
        return sharded_digits_loader(batch_size, seed=seed)

    def fit(self) -> None:
        self.ranks: list[dict[str, Any]] = []
        saved_env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))  # nothing leaves this host
        with tempfile.TemporaryDirectory(prefix="mpguide-ddp-") as out_dir:
            try:
                trainer = self.build_trainer(
                    "cpu",
                    [RankRecorder(out_dir), *self.probes],
                    hardware.trainer_precision_kwargs(self.spec.precision, "cpu", self.plugin_factory),
                    use_distributed_sampler=False,
                    **self.spec.trainer_kwargs,
                )
                self.start_clock()
                trainer.fit(self.module, self.loader)
            finally:
                for key, value in saved_env.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
                self.ranks = [
                    json.loads(p.read_text(encoding="utf-8")) for p in sorted(Path(out_dir).glob("rank*.json"))
                ]

    def collect(self) -> None:
        result, ranks = self.result, self.ranks
        if result.error is None and len(ranks) != WORLD_SIZE:
            result.error = {"type": "RuntimeError", "message": f"{len(ranks)} of {WORLD_SIZE} ranks wrote their record"}
        result.warnings = sorted({*result.warnings, *(w for rank in ranks for w in rank["warnings"])})
        if result.error is not None:
            return
        first = ranks[0]
        result.loss = [sum(values) / len(values) for values in zip(*(r["loss"] for r in ranks))]
        result.lr = first["lr"]
        result.loss_scale = first["scale"] or None
        result.skipped_steps = sum(first["skipped"])
        skipped = [[i for i, flag in enumerate(r["skipped"]) if flag] for r in ranks]
        result.extra.update(first["extra"])
        result.measures.update(first.get("measures") or {})
        result.extra.update(
            ranks=len(ranks),
            global_step=first["global_step"],
            batches=len(result.loss),
            allreduce_calls=first["allreduce_calls"],
            allreduce_bytes=first["allreduce_bytes"],
            allreduce_counts_agree=len({(r["allreduce_calls"], r["allreduce_bytes"]) for r in ranks}) == 1,
            weights_agree_across_ranks=len({r["weights"] for r in ranks}) == 1,
            skipped_batches_per_rank=skipped,
            skip_decisions_agree=all(s == skipped[0] for s in skipped),
            record_extra_per_rank=[r["extra"] for r in ranks],
        )
        if first["global_step"]:
            result.extra.update(
                allreduces_per_optimizer_step=first["allreduce_calls"] / first["global_step"],
                allreduce_bytes_per_optimizer_step=first["allreduce_bytes"] / first["global_step"],
            )


def train_run(spec: Any, *args: Any, **kwargs: Any) -> RunResult:
    """Train one declared run: with :class:`DDPRun` when its ``trainer`` options ask for ``devices`` > 1
    (:func:`is_ddp`), else with :class:`mpguide.verify.run.strategy.TrainerRun` in one process.

    Arguments ``(spec, module_factory, accelerator, preset, plugin_factory=None, probes=())``, result and errors
    as :meth:`mpguide.verify.run.strategy.RunStrategy.train`; :func:`mpguide.verify.run.runner.run_example` makes
    the same choice by itself.

    Raises:
        hardware.ConfigurationError: a DDP run not declared as :meth:`DDPRun.check` requires, or an unknown
            precision.
    """
    strategy = DDPRun() if is_ddp(spec) else TrainerRun()
    return strategy.train(spec, *args, **kwargs)
