"""Writes what a fit does into its :class:`~mpguide.checks.record.FitRecord`: the bookkeeping behind every rule.

It keeps the live objects a record cannot (the optimizers, their parameters, the GradScaler, the schedulers) and
turns each event the callback's wrappers see into record entries: a backward call and the parameters its
gradients reached (at which loss scale), a ``zero_grad`` (were those gradients stepped on, or thrown away?),
a step before and after it, the loss scale after each ``update()``, an autocast region opened and closed.

Device reads: none per step. The loss scale is read once at fit start and then followed from the skips (on a CUDA
scaler: GradScaler's growth rule, ``torch/amp/grad_scaler.py``'s ``_amp_update_scale_``) or read after each
``update()`` (a CPU scaler, where reading costs nothing). Gradients zeroed in their own batch keep a 0-d finite
flag that is read only if no step follows in that batch.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.overrides import TorchFunctionMode

from .record import BackwardCall, FitRecord, ParamGrads, Region

#: Hooks that Lightning calls only in automatic optimization (``lightning/pytorch/loops/optimization/automatic.py``).
AUTOMATIC_ONLY_HOOKS = (
    "optimizer_step",
    "optimizer_zero_grad",
    "configure_gradient_clipping",
    "lr_scheduler_step",
    "on_before_zero_grad",
)
_MATRIX_FUNCTIONS = frozenset(
    {"mm", "matmul", "bmm", "addmm", "addmv", "mv", "baddbmm", "addbmm", "einsum", "linear", "__matmul__", "inner"}
)


class MatrixCalls(TorchFunctionMode):
    """Record the matrix functions that autocast would run in ``dtype`` although their inputs are in another
    floating dtype (used around a sampled optimizer step). A matrix product whose inputs already have
    autocast's dtype (Muon's Newton-Schulz iteration in bfloat16 under bf16-mixed) computes the same
    either way and is not recorded. Nor is one made while gradient recording is on: torch's optimizers run
    their update under ``no_grad`` and their closure (LBFGS, SAM) under ``enable_grad``, so such a call is
    the closure's forward, which autocast is meant to cover (``torch/optim/lbfgs.py``, ``optimizer.py``'s
    ``_use_grad_for_differentiable``)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.seen: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if (
            name in _MATRIX_FUNCTIONS
            and not torch.is_grad_enabled()
            and any(isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != self.dtype for a in args)
        ):
            self.seen.append(f"{name} on {next(a.dtype for a in args if isinstance(a, torch.Tensor))}")
        return func(*args, **(kwargs or {}))


def _defining_class(cls: type, name: str) -> type | None:
    """The class in ``cls``'s MRO whose body defines ``name`` (``None`` if only LightningModule does)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return None if klass is pl.LightningModule else klass
    return None


def autocast_device() -> str | None:
    """The device type whose autocast is on here, or ``None``."""
    for device in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(device):
                return device
        except (TypeError, RuntimeError):
            return None
    return None


def all_finite(params: list[torch.Tensor]) -> torch.Tensor:
    """A 0-d bool tensor, not read: inf/NaN anywhere in these gradients makes their norm non-finite."""
    return torch.stack(torch._foreach_norm([p.grad for p in params])).isfinite().all()


class Recorder:
    """The live objects of one fit and the bookkeeping that writes its record (``self.rec``)."""

    def __init__(self) -> None:
        self.rec = FitRecord()
        self.opts: list[Any] = []
        self.opt_params: list[list[torch.Tensor]] = []
        self.opt_index: dict[int, int] = {}  # id(torch optimizer) -> index
        self.scaler: Any = None
        self.module: Any = None
        self.schedulers: list[Any] = []
        self.outside: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # parameters of no optimizer, at fit start

    def start(self, trainer: Any, pl_module: Any, rescales_held: bool) -> None:
        """What the fit is: optimizers, parameters, precision, the loss scale (read once)."""
        rec = self.rec
        self.module = pl_module
        plugin = trainer.precision_plugin
        rec.precision = str(getattr(plugin, "precision", trainer.precision))
        rec.manual = not pl_module.automatic_optimization
        rec.module = type(pl_module).__name__
        if not rec.manual:
            return
        self.opts = list(trainer.optimizers)
        rec.optimizers = [type(opt).__name__ for opt in self.opts]
        names = {id(p): name.split(".")[0] for name, p in pl_module.named_parameters()}
        self.opt_params = [[p for g in opt.param_groups for p in g["params"]] for opt in self.opts]
        rec.sizes = [len(params) for params in self.opt_params]
        rec.versions = [sum(p._version for p in params) for params in self.opt_params]
        for i, opt in enumerate(self.opts):
            self.opt_index[id(opt)] = i
            for p in self.opt_params[i]:
                rec.param_opt.setdefault(id(p), i)
                rec.param_module[id(p)] = names.get(id(p), "?")
        scaler = getattr(plugin, "scaler", None)
        if scaler is not None and scaler.is_enabled():
            self.scaler = scaler
            rec.scaled = True
            rec.rescales_held = rescales_held
            rec.scale = float(scaler.get_scale()) if scaler._scale is not None else float(scaler._init_scale)
            tracker = scaler._get_growth_tracker()
            rec.tracker = int(tracker) if not isinstance(tracker, torch.Tensor) else int(tracker.item())
        for config in trainer.lr_scheduler_configs:
            self.schedulers.append(config.scheduler)
            rec.scheduler_steps[id(config.scheduler)] = 0
        in_optimizers = {id(p) for params in self.opt_params for p in params}
        self.outside = [
            (n, p, p.detach().clone()) for n, p in pl_module.named_parameters() if id(p) not in in_optimizers
        ]

    def overridden_hooks(self, pl_module: Any) -> tuple:
        """The automatic-only hooks the module overrides, ``(hook, class defining it, inherited from the automatic
        parent its manual training_step replaced)`` each. An inherited ``optimizer_step`` or ``on_before_zero_grad``
        goes to ``rec.dead_hooks`` instead: whether its work happened is told at train end."""
        step_owner = _defining_class(type(pl_module), "training_step")
        hooks = []
        for hook in AUTOMATIC_ONLY_HOOKS:
            if not is_overridden(hook, pl_module):
                continue
            owner = _defining_class(type(pl_module), hook)
            leftover = (
                owner is not None
                and step_owner is not None
                and owner is not step_owner
                and issubclass(step_owner, owner)
            )  # inherited from the automatic parent the manual training_step replaced
            if leftover and hook in ("optimizer_step", "on_before_zero_grad"):
                self.rec.dead_hooks.append((hook, owner.__name__))
            else:
                hooks.append((hook, owner.__name__ if owner is not None else None, leftover))
        return tuple(hooks)

    def version_sum(self, index: int) -> int:
        """The sum of an optimizer's parameters' in-place version counters (every in-place update bumps one)."""
        return sum(p._version for p in self.opt_params[index])

    # ------------------------------------------------------------------ backward calls and gradients
    def start_backward(self) -> int:
        rec = self.rec
        rec.backward_id += 1
        rec.backwards[rec.backward_id] = BackwardCall(rec.seq, rec.batch if rec.batch is not None else -1, rec.epoch)
        rec.step.backwards.append(rec.backward_id)
        if len(rec.backwards) > 256:  # keep the recent ones only
            for key in sorted(rec.backwards)[:128]:
                del rec.backwards[key]
        return rec.backward_id

    def gradient(self, param: torch.Tensor) -> None:
        """A backward call reached ``param`` (its gradient hook)."""
        rec = self.rec
        state = rec.params.get(id(param))
        if state is None or param.grad is None:
            state = rec.params[id(param)] = ParamGrads()
        state.backwards.add(rec.backward_id)
        state.scales.add(rec.scale)

    def scale_updated(self, new_scale: Any) -> None:
        """GradScaler's ``update()`` ran: follow the loss scale."""
        rec, scaler = self.rec, self.scaler
        if new_scale is not None or scaler._scale is None or scaler._scale.device.type == "cpu":
            rec.scale = float(scaler.get_scale())  # a CPU tensor: reading it costs no synchronisation
        elif rec.skipped_since_update:
            rec.scale *= scaler.get_backoff_factor()
            rec.tracker = 0
        else:  # follow GradScaler's growth rule (torch/amp/grad_scaler.py, _amp_update_scale_)
            rec.tracker += 1
            if rec.tracker == scaler.get_growth_interval():
                rec.scale *= scaler.get_growth_factor()
                rec.tracker = 0
        rec.skipped_since_update = False

    def discard(self, index: int | None) -> int | None:
        """Gradients are about to be zeroed (optimizer ``index``, ``None``: the whole module's): were they stepped
        on, or thrown away? Records a window's lost micro-batches and the batch's pending finite flag; returns the
        optimizer whose thrown gradients of an earlier batch were not finite (for ``nonfinite-guard``), else None.
        """
        rec = self.rec
        params = list(self.module.parameters()) if index is None else self.opt_params[index]
        thrown: list[torch.Tensor] = []
        thrown_backwards: set[int] = set()
        earlier: set[int] = set()  # of those, backwards of an earlier batch (a window's micro-batches)
        here = (rec.epoch, rec.batch)
        for p in params:
            state = rec.params.pop(id(p), None)
            if state is None or p.grad is None:
                continue
            owner = rec.param_opt.get(id(p))
            fresh = set()
            for b in state.backwards - rec.consumed:
                call = rec.backwards.get(b)
                # a backward after which another optimizer stepped was meant for that one (a GAN's G loss)
                if call is not None and any(seq > call.seq for i, seq in rec.last_step_seq.items() if i != owner):
                    continue
                fresh.add(b)
                if call is not None and (call.epoch, call.batch) != here:
                    earlier.add(b)
            if fresh:
                thrown.append(p)
                thrown_backwards |= fresh
        if not thrown:
            return None
        owner = index if index is not None else rec.param_opt.get(id(thrown[0]))
        rec.consumed |= thrown_backwards
        if ("accumulation", owner) in rec.reported or ("nonfinite-guard", owner) in rec.reported:
            # already reported: no second device read
            rec.reported.get(("accumulation", owner), rec.reported.get(("nonfinite-guard", owner))).count += 1
            return None
        if not earlier:
            # zeroed in the batch that made them: a finding only if this optimizer takes no step in this batch
            # (gradient surgery reads them, writes its own and steps: GradScaler sees the inf). The first such
            # set of the batch is kept as a flag, read at the batch's end only if no step came: no device read
            if rec.scaled and owner is not None and owner not in rec.step.guard_pending:
                rec.step.guard_pending[owner] = (all_finite(thrown), self.version_sum(owner))
            return None
        if not bool(all_finite(thrown)):
            return owner if rec.scaled else None
        if owner is not None:
            first = min(rec.backwards[b].batch for b in earlier if b in rec.backwards)
            pending = rec.pending_accumulation.get(owner, (first, 0))
            rec.pending_accumulation[owner] = (pending[0], pending[1] + len(earlier))
        return None

    # ------------------------------------------------------------------ steps
    def held_gradients(self, index: int) -> tuple[set[int], set[float]]:
        """The backward calls and loss scales behind the gradients an optimizer is about to step on; they are
        used from now on (a later ``zero_grad`` does not throw them away)."""
        rec = self.rec
        backs: set[int] = set()
        scales: set[float] = set()
        for p in self.opt_params[index]:
            if p.grad is None:
                continue
            state = rec.params.get(id(p))
            if state is not None:
                backs |= state.backwards
                scales |= state.scales
        fresh = backs - rec.consumed
        rec.consumed |= backs
        return fresh, scales

    def epoch_tail(self, fresh: set[int]) -> list[tuple[int, int]]:
        """``(epoch, batch)`` of the backward calls among ``fresh`` made in an earlier epoch, in order."""
        rec = self.rec
        return sorted(
            (call.epoch, call.batch)
            for b in fresh
            if (call := rec.backwards.get(b)) is not None and call.epoch < rec.epoch
        )

    def consume(self, index: int) -> None:
        """The gradients on this optimizer's parameters were used by a step: not thrown away by a later zero_grad."""
        rec = self.rec
        for p in self.opt_params[index]:
            state = rec.params.get(id(p))
            if state is not None:
                rec.consumed |= state.backwards

    def stepped(self, index: int) -> bool:
        """An optimizer's step through the precision plugin ended; returns whether it updated a caching autocast
        region's weights (then forwards are watched)."""
        rec = self.rec
        rec.step.guard_pending.pop(index, None)
        if not rec.scaled or rec.applied is not False:  # without a scaler nothing skips a step
            rec.applied_steps[index] = rec.applied_steps.get(index, 0) + 1
        rec.seq += 1
        rec.last_step_seq[index] = rec.seq
        rec.step.stepped.add(index)
        if rec.scaled and rec.applied is False:
            rec.step.skipped.add(index)
            rec.skipped_since_update = True
        rec.applied = None
        return self.mark_regions(index)

    def mark_regions(self, index: int) -> bool:
        """Optimizer ``index`` stepped (through Lightning's wrapper or around it): note its parameters in every open
        caching autocast region; returns whether there was one (then forwards are watched)."""
        caching = [r for r in self.rec.regions if r.caching]
        if not caching:
            return False
        ids = {id(p) for p in self.opt_params[index]}
        for region in caching:
            region.stepped = True
            region.stepped_params.update(ids)
        return True

    # ------------------------------------------------------------------ autocast regions
    def enter_step(self) -> None:
        """The reader's ``training_step`` starts. Lightning's own autocast region is open around it: when it caches
        casts (Lightning <= 2.5's ``MixedPrecision`` opened it with torch's default cache on; 2.6 turns it off,
        ``plugins/precision/amp.py``), a forward after an ``opt.step()`` inside this step reuses casts of the old
        weights: that region is recorded as the first one."""
        rec = self.rec
        rec.in_step_fn += 1
        if rec.in_step_fn == 1 and autocast_device() is not None and torch.is_autocast_cache_enabled():
            rec.regions.append(Region(None, True))

    def leave_step(self) -> bool:
        """The reader's ``training_step`` ended; returns whether no open region holds a step any more."""
        rec = self.rec
        rec.in_step_fn -= 1
        if rec.regions and rec.regions[0].region is None and rec.in_step_fn == 0:
            rec.regions.pop(0)
            return not any(r.stepped for r in rec.regions)
        return False

    def stale_forward(self, module: Any) -> bool:
        """Whether a forward through ``module`` reads casts made before a step updated its own weights."""
        rec = self.rec
        if rec.in_lightning or not any(r.stepped for r in rec.regions):
            return False
        if not torch.is_autocast_cache_enabled():  # an inner torch.autocast(..., cache_enabled=False): no cast reused
            return False
        # only a module whose own weights were stepped in a caching region reads stale casts: a forward through
        # another model after this step (a GAN's discriminator after the generator's step) casts weights that
        # did not change
        # torch reuses a cached cast only of a leaf that requires grad at the forward (autocast_mode.cpp,
        # cached_cast): a module frozen by toggle_optimizer/toggle_model casts afresh
        stepped = set().union(*(r.stepped_params for r in rec.regions if r.stepped))
        return any(id(p) in stepped and p.requires_grad for p in module.parameters(recurse=False))

    def half_parameters(self, pl_module: Any) -> tuple:
        """Under ``*-mixed``: ``(name, dtype)`` of each trainable float16/bfloat16 parameter."""
        if self.rec.precision not in ("16-mixed", "bf16-mixed"):
            return ()
        half = (torch.float16, torch.bfloat16)
        return tuple((name, p.dtype) for name, p in pl_module.named_parameters() if p.requires_grad and p.dtype in half)

    def small_eps(self, optimizers: list[Any]) -> tuple:
        """Under ``16-true``: ``(index, type name, smallest float eps)`` of each optimizer with an ``eps``."""
        if self.rec.precision != "16-true":
            return ()
        found = []
        for i, opt in enumerate(optimizers):
            values = [g["eps"] for g in opt.param_groups if isinstance(g.get("eps"), float)]
            if values:
                found.append((i, type(opt).__name__, min(values)))
        return tuple(found)

    def sample_lost(self, optimizer: Any) -> bool:
        """Under ``*-true`` but fp32, before a step on a sampled batch (0, 1, 3, 7, 15, ...): copy the weights that
        have a gradient, and where it is non-zero (judged after the batch). Returns whether this precision samples.
        """
        rec = self.rec
        if not rec.precision.endswith("-true") or rec.precision == "32-true":
            return False
        if (rec.global_batch + 1) & rec.global_batch == 0:  # a sample, not every step
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None and id(p) not in rec.step.lost_sample:
                        rec.step.lost_sample[id(p)] = (p, p.detach().clone(), p.grad.detach() != 0)
        return True

    def lost_updates(self) -> tuple[int, int]:
        """``*-true``: of the sampled gradient-carrying weight elements, how many (moved, lost: left unchanged)."""
        moved = lost = 0
        for p, before, nonzero in self.rec.step.lost_sample.values():
            moved += int(nonzero.sum())
            lost += int((nonzero & (p.detach() == before)).sum())
        self.rec.step.lost_sample = {}
        return moved, lost
