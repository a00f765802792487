"""Measure a run from outside the LightningModule: callbacks the runner attaches to every fit.

A recipe (the LightningModule a reader copies) should contain only training code. What the page
needs beyond the per-step loss, learning rate and loss scale of :class:`mpguide.verify.run.strategy.StepRecorder`
comes from these callbacks, and :func:`~mpguide.verify.run.probes.collect` turns them into the ``extra`` fields
of a run:

* :class:`~mpguide.verify.run.probes.LoggedValues`: every value the module logs with ``self.log(name, value)``
  (the call a reader writes anyway), one list per name;
* :class:`~mpguide.verify.run.probes.AppliedUpdates`: whether the parameters changed during each batch, i.e.
  whether an optimizer step really updated the model (GradScaler skips steps silently,
  ``torch/amp/grad_scaler.py``; a user's own guard may skip them too);
* :class:`~mpguide.verify.run.probes.LostUpdates`: how many gradient-carrying weight elements an optimizer step
  left unchanged (an update smaller than half the spacing of the weight's dtype rounds away);
* :class:`~mpguide.verify.run.probes.FinalLossScale`: the loss scale when training ends;
* :class:`~mpguide.verify.run.probes.FinalWeights`: a digest of the final weights.

An example can attach probes of its own to the runs of chosen recipes
(``runner.run_example(..., probes={recipe: [ProbeClass, ...]})``): a Lightning callback with a
``record_extra()`` method, defined in the example's "How this page is verified" section, or one of
this module's that several examples share, such as :class:`~mpguide.verify.run.probes.WeightsDigest`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from ...checks import PitfallChecks
from ...steps import loss_scale


def parameter_digest(module: torch.nn.Module) -> str:
    """SHA-256 (hex) of every parameter's name, dtype, shape and bytes, in ``named_parameters`` order.

    Two modules have the same digest exactly when their weights are bitwise identical.
    """
    digest = hashlib.sha256()
    for name, param in module.named_parameters():
        tensor = param.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


class LoggedValues(Callback):
    """Record, after each training batch, the values the module logged with ``self.log(...)``.

    Reads ``trainer.callback_metrics`` (Lightning's store of the latest logged values, see
    ``lightning/pytorch/trainer/connectors/logger_connector/logger_connector.py``). Log per-step values
    with ``self.log(name, value)`` in ``training_step`` (``on_step=True`` is the default there): a name
    logged in every batch gives one float per batch. Names ending in ``_epoch`` (epoch aggregates) are
    not recorded.

    Attributes:
        values: name -> list of floats (the latest logged value at the end of each batch, from the
            first batch that logged the name on).
    """

    measures = {"logged": "series"}

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        for name, value in trainer.callback_metrics.items():
            if not name.endswith("_epoch"):
                self.values.setdefault(name, []).append(float(value))

    def record_extra(self) -> dict[str, Any]:
        """``{"logged": {name: [float, ...]}}``, or ``{}`` when nothing was logged."""
        return {"logged": self.values} if self.values else {}


class AppliedUpdates(Callback):
    """Record whether the module's parameters changed during each training batch.

    A copy of every parameter (as float32) is taken at batch start and compared with the parameters
    at batch end. ``applied[i]`` is ``True`` when any parameter value changed in batch ``i``; an
    optimizer step that GradScaler skipped, or that user code did not call, leaves it ``False``.

    Attributes:
        applied: one bool per batch.
    """

    measures = {
        "updates_applied": "count",
        "updates_not_applied": "count",
        "all_updates_applied": "bool",
        "applied_per_step": "list[bool]",
    }

    def __init__(self) -> None:
        self.applied: list[bool] = []
        self._before: torch.Tensor | None = None

    @staticmethod
    def _flat(module: torch.nn.Module) -> torch.Tensor:
        params = [p.detach().float().flatten() for p in module.parameters()]
        return torch.cat(params).clone() if params else torch.zeros(0)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._before = self._flat(pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        after = self._flat(pl_module)
        self.applied.append(bool(self._before is not None and not torch.equal(self._before, after)))

    def record_extra(self) -> dict[str, Any]:
        """``updates_applied`` and ``updates_not_applied`` (counts of batches), ``all_updates_applied``
        (bool) and ``applied_per_step`` (list of bools, one per batch)."""
        return {
            "updates_applied": sum(self.applied),
            "updates_not_applied": self.applied.count(False),
            "all_updates_applied": all(self.applied),
            "applied_per_step": self.applied,
        }


class LostUpdates(Callback):
    """Count, per training batch, the weight elements that had a gradient but did not change.

    ``on_before_optimizer_step`` (which Lightning calls inside ``opt.step()``, after the backward and any
    unscaling and before the optimizer runs, in manual and automatic optimization alike:
    ``plugins/precision/precision.py``, ``_after_closure``) copies every parameter of that optimizer
    that has a gradient, with the mask of its non-zero gradient elements. At batch end, each such
    element that still holds its old value was **lost**: the optimizer computed an update for it and
    the stored weight did not move. In fp32 that happens almost never; in bf16 (8 significand bits)
    an update below half the spacing of the weight's value rounds back to the old value: a weight of
    0.1 moves only by steps of 2**-11 (about 4.9e-4) and ignores any update under about 2.4e-4.

    A step GradScaler skipped (16-mixed) counts as lost too, and an element whose gradient is exactly
    zero never counts. When one parameter is stepped twice in a batch, the first copy is kept.

    Attributes:
        with_gradient: per batch, the number of elements with a non-zero gradient (``int``).
        lost: per batch, how many of them were unchanged at batch end (``int``).
    """

    measures = {
        "updates_with_gradient": "count",
        "updates_lost": "count",
        "updates_kept": "count",
        "lost_fraction_per_step": "list[fraction]",
    }

    def __init__(self) -> None:
        self.with_gradient: list[int] = []
        self.lost: list[int] = []
        self._before: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None and id(param) not in self._before:
                    self._before[id(param)] = (param, param.detach().clone(), param.grad.detach() != 0)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        with_gradient = lost = 0
        for param, before, moved in self._before.values():
            with_gradient += int(moved.sum())
            lost += int((moved & (param.detach() == before)).sum())
        self.with_gradient.append(with_gradient)
        self.lost.append(lost)
        self._before = {}

    def record_extra(self) -> dict[str, Any]:
        """``updates_with_gradient``, ``updates_lost`` and ``updates_kept`` (element counts summed over the
        run) and ``lost_fraction_per_step`` (one float per batch, 0.0 for a batch without gradients)."""
        total, lost = sum(self.with_gradient), sum(self.lost)
        per_step = [n / w if w else 0.0 for n, w in zip(self.lost, self.with_gradient, strict=True)]
        return {
            "updates_with_gradient": total,
            "updates_lost": lost,
            "updates_kept": total - lost,
            "lost_fraction_per_step": per_step,
        }


class PrecisionInUse(Callback):
    """Record which precision the ``Trainer`` really trains in, and whether it has a GradScaler.

    ``Trainer(precision="16-mixed")`` on a CPU becomes ``"bf16-mixed"`` with a warning and no GradScaler
    (``lightning/pytorch/trainer/connectors/accelerator_connector.py``), so the flag a reader passes and
    what runs can differ.
    """

    measures = {"trainer_precision": "name", "has_scaler": "bool"}

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.seen = {"trainer_precision": str(trainer.precision), "has_scaler": loss_scale(trainer) is not None}

    def record_extra(self) -> dict[str, Any]:
        """``{"trainer_precision": e.g. "bf16-mixed", "has_scaler": bool}``, or ``{}`` before training started."""
        return dict(self.seen)


class FinalLossScale(Callback):
    """Record the GradScaler's loss scale when training ends (``None`` without a GradScaler).

    Attributes:
        scale: the scale as a float after the last batch (GradScaler's initial scale is 65536 and
            only ``GradScaler.update()`` changes it, ``torch/amp/grad_scaler.py``).
    """

    measures = {"final_loss_scale": "nonnegative"}

    def __init__(self) -> None:
        self.scale: float | None = None

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.scale = loss_scale(trainer)

    def record_extra(self) -> dict[str, Any]:
        """``{"final_loss_scale": float or None}``."""
        return {"final_loss_scale": self.scale}


class FinalWeights(Callback):
    """Record a SHA-256 digest of the module's parameters when training ends.

    Two runs have the same digest exactly when their final weights are bitwise identical
    (:func:`mpguide.verify.run.probes.parameter_digest`).
    """

    measures = {"final_weights": "name"}

    def __init__(self) -> None:
        self.digest: str | None = None

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.digest = parameter_digest(pl_module)

    def record_extra(self) -> dict[str, Any]:
        """``{"final_weights": hex digest}``, or ``{}`` when training did not end normally."""
        return {"final_weights": self.digest} if self.digest else {}


class WeightsDigest(Callback):
    """Record a SHA-256 digest of the module's parameters when the record is made.

    Unlike :class:`~mpguide.verify.run.probes.FinalWeights` (a shared probe, only after training ended
    normally), this one is attached by examples that compare runs bitwise, and it also digests the
    weights a run had when an error stopped it.
    """

    measures = {"weights": "name"}

    def __init__(self) -> None:
        self.module: torch.nn.Module | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.module = pl_module

    def record_extra(self) -> dict[str, Any]:
        """``{"weights": hex digest}`` (:func:`mpguide.verify.run.probes.parameter_digest`), ``{}`` before setup."""
        return {"weights": parameter_digest(self.module)} if self.module is not None else {}


class Pitfalls(PitfallChecks):
    """:class:`mpguide.checks.PitfallChecks` as a probe: its findings go into the run's record.

    Attached by :func:`~mpguide.verify.run.probes.with_checks` to every run of an example, so the module a reader
    copies stays clean; the ``flags`` and ``clean`` claims (:mod:`mpguide.verify.claims`) judge what it recorded.
    Each finding is also warned (a ``PitfallWarning`` in the run's ``warnings``), as a reader would see it.
    """

    measures = {
        "pitfall_findings": "list[pitfall_finding]",
        "pitfall_notes": "list[text]",
        "pitfall_check_seconds": "nonnegative",
        "pitfall_setup_seconds": "nonnegative",
        "pitfall_step_seconds": "nonnegative",
    }

    def record_extra(self) -> dict[str, Any]:
        """What the check saw and cost, for ``extra``.

        ``pitfall_findings`` (list of ``{"section", "message", "batch", "epoch", "optimizer", "count"}``),
        ``pitfall_notes`` (list of strings), and seconds (:meth:`mpguide.checks.PitfallChecks.cost`):
        ``pitfall_check_seconds`` (its code during the batches), ``pitfall_setup_seconds`` (at fit start and
        train end) and ``pitfall_step_seconds`` (the batches).
        """
        cost = self.cost()
        return {
            "pitfall_findings": [f.as_dict() for f in self.findings],
            "pitfall_notes": list(self.notes),
            "pitfall_check_seconds": round(cost["check_seconds"], 6),
            "pitfall_setup_seconds": round(cost["setup_seconds"], 6),
            "pitfall_step_seconds": round(cost["step_seconds"], 6),
        }


def with_checks(recipes: Any, probes: Any = None) -> dict[str, list[Any]]:
    """An example's ``probes`` mapping with :class:`~mpguide.verify.run.probes.Pitfalls` added for every recipe.

    Args:
        recipes: the example's recipe table (name -> LightningModule factory); only its names are used.
        probes: the example's own probes (recipe name -> list of probe factories), or ``None``.

    Returns:
        recipe name -> the example's probes for it, then ``Pitfalls``; pass it as ``run_example(..., probes=...)``.
    """
    own = dict(probes or {})
    return {name: [*own.get(name, ()), Pitfalls] for name in recipes}


def print_findings(record: dict[str, Any], show: Any = print) -> None:
    """Print what :class:`mpguide.checks.PitfallChecks` told each run of ``record``, as a reader would see it.

    One line per run: ``run id: no finding``, or the run id and each finding's message (how often it was
    seen when more than once). Runs that did not carry the check are left out.
    """
    for run in record["runs"]:
        findings = run.get("extra", {}).get("pitfall_findings")
        if findings is None:
            continue
        if not findings:
            show(f"{run['id']}: no finding")
        for finding in findings:
            times = f" ({finding['count']} times)" if finding.get("count", 1) > 1 else ""
            show(f"{run['id']}{times}: {finding['message']}")


def callbacks() -> list[Callback]:
    """Fresh instances of every probe, for one ``Trainer``."""
    return [LoggedValues(), AppliedUpdates(), LostUpdates(), PrecisionInUse(), FinalLossScale(), FinalWeights()]


def collect(trainer: Any) -> dict[str, Any]:
    """Merge the ``record_extra()`` of every callback of ``trainer`` that has one into one dict."""
    extra: dict[str, Any] = {}
    for callback in trainer.callbacks:
        method = getattr(callback, "record_extra", None)
        if callable(method):
            extra.update(method())
    return extra
