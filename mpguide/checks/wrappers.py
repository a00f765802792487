"""The wrappers :class:`~mpguide.checks.PitfallChecks` installs for one fit, and when each feeds the recorder and
calls which rule.

Every wrapper calls the original exactly once with the same arguments and returns its value; an exception from the
original passes through unchanged. They are made with ``functools.wraps``, so the reader's signature stays
visible: Lightning's ``is_param_in_hook_signature`` follows ``__wrapped__`` (``utilities/signature_utils.py``,
since 2.1) and passes ``batch_idx`` only to a ``training_step`` that takes it, and a ``training_step(self,
dataloader_iter)`` still gets the iterator (checked with ``explicit=True``, ``loops/utilities.py``); torch's LR
schedulers mark the optimizer's step ``_wrapped_by_lr_sched`` (``torch/optim/lr_scheduler.py``) and the mark
stays. The recorder's work runs in the callback's recorder guard (an exception there stops the whole check), each
rule in its section's guard (an exception there stops that rule); each times its own code for ``cost()``.
"""

from __future__ import annotations

import functools
from time import perf_counter as _clock
from typing import Any

import torch

from . import rules
from .record import Region
from .recorder import MatrixCalls, autocast_device


class Patches:
    """What one fit installed, and how to take it back: attributes replaced on objects, classes and modules
    (restored in reverse order, an instance attribute that was not there before is deleted again), gradient hook
    handles, and the module-wide forward pre-hook that watches forwards after a step in a caching region."""

    def __init__(self) -> None:
        self._restore: list[Any] = []
        self._forward_hook: Any = None

    def add(self, owner: Any, name: str, make: Any) -> None:
        """Replace ``owner.name`` by ``make(current)``, remembering what to put back."""
        had = name in vars(owner) if not isinstance(owner, type) else True
        old = vars(owner).get(name) if not isinstance(owner, type) else owner.__dict__[name]
        setattr(owner, name, make(getattr(owner, name)))
        self._restore.append((owner, name, had, old))

    def undo_later(self, undo: Any) -> None:
        """Call ``undo()`` when the patches are removed (a hook handle's ``remove``)."""
        self._restore.append(undo)

    def undo(self) -> None:
        """Remove everything, newest first."""
        while self._restore:
            item = self._restore.pop()
            if callable(item):
                item()
                continue
            owner, name, had, old = item
            if had:
                setattr(owner, name, old)
            else:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
        self.stop_forwards()

    def watch_forwards(self, hook: Any) -> None:
        """Call ``hook(module, inputs)`` before every module's forward, until :meth:`stop_forwards`."""
        if self._forward_hook is None:
            self._forward_hook = torch.nn.modules.module.register_module_forward_pre_hook(hook)

    def stop_forwards(self) -> None:
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None


def install(c: Any, trainer: Any, pl_module: Any) -> None:
    """Wrap, for this fit, everything a manual ``training_step`` reaches (see the package docstring's list)."""
    recorder, plugin = c.recorder, trainer.precision_plugin
    for params in recorder.opt_params:
        for p in params:
            if p.requires_grad:
                handle = p.register_hook(functools.partial(c._grad_hook, p))
                c.patches.undo_later(handle.remove)
    if recorder.scaler is not None:
        c.patches.add(recorder.scaler, "update", functools.partial(update, c))
        c.patches.add(recorder.scaler, "scale", functools.partial(scale, c))
        if not recorder.rec.rescales_held:
            c.patches.add(recorder.scaler, "unscale_", functools.partial(unscale, c))
    for opt in recorder.opts:
        c.patches.add(opt, "step", functools.partial(inner_step, c, opt))
        c.patches.add(opt, "zero_grad", functools.partial(zero_grad, c, opt))
    for lopt in getattr(trainer.strategy, "_lightning_optimizers", []):
        c.patches.add(lopt, "zero_grad", functools.partial(zero_grad, c, lopt.optimizer))
    c.patches.add(plugin, "optimizer_step", functools.partial(plugin_step, c))
    c.patches.add(plugin, "clip_gradients", functools.partial(plugin_clip, c))
    c.patches.add(trainer.strategy, "backward", functools.partial(strategy_backward, c))
    c.patches.add(pl_module, "training_step", functools.partial(training_step, c))
    c.patches.add(pl_module, "zero_grad", functools.partial(zero_grad, c, None))
    c.patches.add(torch.Tensor, "backward", functools.partial(tensor_backward, c))
    c.patches.add(torch.autograd, "backward", functools.partial(tensor_backward, c))
    c.patches.add(torch.autograd, "grad", functools.partial(autograd_grad, c))
    c.patches.add(torch.nn.utils, "clip_grad_norm_", functools.partial(clip, c, "clip_grad_norm_"))
    c.patches.add(torch.nn.utils, "clip_grad_value_", functools.partial(clip, c, "clip_grad_value_"))
    c.patches.add(torch.autocast, "__enter__", functools.partial(autocast_enter, c))
    c.patches.add(torch.autocast, "__exit__", functools.partial(autocast_exit, c))
    for scheduler in recorder.schedulers:
        c.patches.add(scheduler, "step", functools.partial(scheduler_step, c, scheduler))


# ---------------------------------------------------------------------- backward calls
def strategy_backward(c: Any, original: Any) -> Any:
    rec = c.recorder.rec

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if c._off:
            return original(*args, **kwargs)
        with c._rec:
            start = _clock()
            c._start_backward()
            c._timed(start)
        rec.in_backward += 1
        rec.in_lightning += 1
        try:
            return original(*args, **kwargs)
        finally:
            rec.in_backward -= 1
            rec.in_lightning -= 1

    return backward


def tensor_backward(c: Any, original: Any) -> Any:
    rec = c.recorder.rec

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if c._off or rec.in_backward:  # manual_backward (or a nested call): Lightning's own
            return original(*args, **kwargs)
        own = -1
        with c._rec:
            start = _clock()
            own = c._start_backward()
            c._timed(start)
        rec.in_backward += 1
        try:
            result = original(*args, **kwargs)
        finally:
            rec.in_backward -= 1
        if rec.in_step_fn:  # reported after it ran, before the opt.step() that fails under 16-mixed
            c._judge("backward-flags", rules.backward_flags, own)
        return result

    return backward


def autograd_grad(c: Any, original: Any) -> Any:
    rec = c.recorder.rec

    @functools.wraps(original)
    def grad(outputs: Any, *args: Any, **kwargs: Any) -> Any:
        if c._off:
            return original(outputs, *args, **kwargs)
        with c._rule["gradient-penalty"]:
            create_graph = kwargs.get("create_graph", args[3] if len(args) > 3 else False)
            if rec.in_step_fn and rec.scaled and create_graph and not rec.in_lightning:
                outs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
                if not any(id(o) in rec.step.scaled_ids for o in outs) and not c._known(
                    "gradient-penalty", "autograd.grad"
                ):
                    penalty(c, original, outs, args, kwargs)
        rec.in_grad += 1
        try:
            return original(outputs, *args, **kwargs)
        finally:
            rec.in_grad -= 1

    return grad


def penalty(c: Any, original: Any, outs: list[torch.Tensor], args: tuple, kwargs: dict) -> None:
    """Measure, once, what the missing loss scale costs this gradient, then judge (``rules.gradient_penalty``).

    The same gradient is taken twice more (``retain_graph=True``, nothing accumulates into ``.grad``): of the
    outputs as given and of the outputs times the loss scale. An element that is exactly 0 in the first and
    not in the second underflowed in fp16 (exact zeros that are zero either way come from the function itself:
    ReLU, masks). The extra calls run the reader's own tensor hooks on that graph once more.
    """
    rec = c.recorder.rec
    start = _clock()
    inputs = kwargs.get("inputs", args[0] if args else None)
    given = kwargs.get("grad_outputs", args[1] if len(args) > 1 else None)
    ins = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    if given is None:
        given = [None] * len(outs)
    elif isinstance(given, torch.Tensor):
        given = [given]
    plain_out = [torch.ones_like(o) if g is None else g for o, g in zip(outs, given)]
    rec.in_grad += 1
    try:
        plain = original(outs, ins, grad_outputs=plain_out, retain_graph=True, allow_unused=True)
        scaled = original(
            outs, ins, grad_outputs=[g * rec.scale for g in plain_out], retain_graph=True, allow_unused=True
        )
    finally:
        rec.in_grad -= 1
    total = zeros = under = 0
    for p, q in zip(plain, scaled):
        if p is None or q is None:
            continue
        total += p.numel()
        zero = p == 0
        zeros += int(zero.sum())
        under += int((zero & (q != 0)).sum())
    c._timed(start)
    c._emit(rules.gradient_penalty(rec, total, zeros, under))


# ---------------------------------------------------------------------- the loss scale
def scale(c: Any, original: Any) -> Any:
    rec = c.recorder.rec

    @functools.wraps(original)
    def scale(outputs: Any) -> Any:
        result = original(outputs)
        if not c._off and isinstance(result, torch.Tensor):
            rec.step.scaled_ids.add(id(result))
        return result

    return scale


def unscale(c: Any, original: Any) -> Any:
    rec = c.recorder.rec

    @functools.wraps(original)
    def unscale_(optimizer: Any) -> Any:
        if c._off:
            return original(optimizer)
        if rec.in_step_fn and not rec.in_lightning:  # not Lightning's own unscale_ inside opt.step()
            index = c.recorder.opt_index.get(id(getattr(optimizer, "_optimizer", optimizer)))
            c._judge("clipping", rules.clipping, "unscale", index)
        return original(optimizer)

    return unscale_


def update(c: Any, original: Any) -> Any:
    @functools.wraps(original)
    def update(new_scale: Any = None) -> Any:
        result = original(new_scale)
        if not c._off:
            with c._rec:
                start = _clock()
                c.recorder.scale_updated(new_scale)
                c._timed(start)
        return result

    return update


def zero_grad(c: Any, optimizer: Any, original: Any) -> Any:
    @functools.wraps(original)
    def zero_grad(*args: Any, **kwargs: Any) -> Any:
        if not c._off:
            owner = None
            with c._rec:
                start = _clock()
                owner = c.recorder.discard(None if optimizer is None else c.recorder.opt_index.get(id(optimizer)))
                if owner is not None:  # non-finite gradients of an earlier batch thrown away
                    c._judge("nonfinite-guard", rules.nonfinite_guard, owner, False)
                c._timed(start)
        return original(*args, **kwargs)

    return zero_grad


# ---------------------------------------------------------------------- steps
def training_step(c: Any, original: Any) -> Any:
    @functools.wraps(original)
    def training_step(*args: Any, **kwargs: Any) -> Any:
        if c._off:
            return original(*args, **kwargs)
        with c._rec:
            c.recorder.enter_step()
        try:
            return original(*args, **kwargs)
        finally:
            if not c._off:
                with c._rec:
                    if c.recorder.leave_step():
                        c.patches.stop_forwards()

    return training_step


def plugin_step(c: Any, original: Any) -> Any:
    rec = c.recorder.rec

    @functools.wraps(original)
    def optimizer_step(optimizer: Any, model: Any, closure: Any, **kwargs: Any) -> Any:
        index = None if c._off else c.recorder.opt_index.get(id(optimizer))
        if index is None:
            return original(optimizer, model, closure, **kwargs)

        def checked_closure() -> Any:
            result = closure()
            if not c._off:
                with c._rec:
                    start = _clock()
                    before_step(c, index, optimizer)
                    c._timed(start)
            return result

        rec.applied = None
        rec.in_lightning += 1
        try:
            return original(optimizer, model, checked_closure, **kwargs)
        finally:
            rec.in_lightning -= 1
            if not c._off:
                with c._rec:
                    start = _clock()
                    held = rec.step.scale_change.pop(index, None)
                    if held is not None and rec.applied is not False:  # a skipped step made no update
                        c._judge("scale-changes", rules.scale_changes, index, *held)
                    if c.recorder.stepped(index):
                        c.patches.watch_forwards(functools.partial(forward_after_step, c))
                    c._timed(start)

    return optimizer_step


def before_step(c: Any, index: int, optimizer: Any) -> None:
    """Right before an optimizer's step (after its closure): which rules see what it is about to step on."""
    rec, recorder = c.recorder.rec, c.recorder
    if not rec.in_step_fn and rec.batch is not None:
        c._judge("step-frequencies", rules.step_frequencies, "hook", index)
    if not any(p.grad is not None for p in recorder.opt_params[index]):
        c._judge("no-gradient-step", rules.no_gradient_step, index, 0)
        return
    pending = rec.pending_accumulation.pop(index, None)
    if pending is not None:
        c._judge("accumulation", rules.accumulation, index, pending)
    fresh, scales = recorder.held_gradients(index)
    if fresh and rec.epoch > 0 and not c._known("accumulation", f"epoch tail {index}"):
        tail = recorder.epoch_tail(fresh)
        if tail:
            c._judge("accumulation", rules.accumulation, index, tail=tail)
    if rec.scaled and not rec.rescales_held and scales - {rec.scale}:
        rec.step.scale_change[index] = (scales, rec.scale)  # judged once the step applied (plugin_step)
    if rec.scaled and getattr(optimizer, "_step_supports_amp_scaling", False):
        rec.applied = None  # a fused step skips inside its kernel: not observable without a sync
    else:
        rec.applied = False


def inner_step(c: Any, optimizer: Any, original: Any) -> Any:
    rec, recorder = c.recorder.rec, c.recorder
    index = recorder.opt_index[id(optimizer)]

    @functools.wraps(original)
    def step(*args: Any, **kwargs: Any) -> Any:
        if c._off:
            return original(*args, **kwargs)
        mode = None
        raw = False
        device = None
        with c._rec:
            start = _clock()
            if rec.applied is False:
                rec.applied = True  # GradScaler calls the optimizer's step only for finite gradients
            if not rec.in_lightning and rec.batch is not None:
                rec.raw_steps[index] = rec.raw_steps.get(index, 0) + 1
                raw = True
                recorder.consume(index)
                c._judge("step-frequencies", rules.step_frequencies, "raw", index)
            device = autocast_device() if rec.math_samples.get(index, 0) < 3 else None
            if device is not None and "optimizer-math" not in c._off_rules:
                rec.math_samples[index] = rec.math_samples.get(index, 0) + 1
                mode = MatrixCalls(torch.get_autocast_dtype(device))
            c._timed(start)
        if mode is None:
            result = original(*args, **kwargs)
        else:
            with mode:
                result = original(*args, **kwargs)
        if raw and not c._off:
            with c._rec:
                recorder.consume(index)  # a closure's backward inside that step was used by it too
                if recorder.mark_regions(index):  # a raw step inside a caching region stales its casts too
                    c.patches.watch_forwards(functools.partial(forward_after_step, c))
        if mode is not None and mode.seen:
            c._judge("optimizer-math", rules.optimizer_math, index, device, mode.dtype, tuple(mode.seen))
        return result

    return step


def scheduler_step(c: Any, scheduler: Any, original: Any) -> Any:
    rec = c.recorder.rec

    @functools.wraps(original)
    def step(*args: Any, **kwargs: Any) -> Any:
        if c._off:
            return original(*args, **kwargs)
        skipped = False
        before: list[float] = []
        index = None
        with c._rec:
            start = _clock()
            rec.scheduler_steps[id(scheduler)] = rec.scheduler_steps.get(id(scheduler), 0) + 1
            index = c.recorder.opt_index.get(id(getattr(scheduler, "optimizer", None)))
            if rec.batch is not None:
                rec.scheduler_batches.setdefault(id(scheduler), set()).add(rec.batch)
            skipped = index is not None and index in rec.step.skipped and not c._known("schedulers", index)
            before = [g["lr"] for g in scheduler.optimizer.param_groups] if skipped else []
            c._timed(start)
        result = original(*args, **kwargs)
        if skipped and not c._off:
            with c._rule["schedulers"]:  # judged at the epoch's end (rules.schedulers)
                after = [g["lr"] for g in scheduler.optimizer.param_groups]
                rec.sched_candidates.setdefault(
                    id(scheduler), (type(scheduler).__name__, index, rec.batch, before[0], after[0])
                )
        return result

    return step


# ---------------------------------------------------------------------- clipping
def clip(c: Any, name: str, original: Any) -> Any:
    rec = c.recorder.rec

    @functools.wraps(original)
    def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
        if c._off:
            return original(parameters, *args, **kwargs)
        params = parameters
        owners: tuple = ()
        if rec.scaled and rec.batch is not None:
            with c._rec:
                start = _clock()
                params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                owners = clip_owners(c, params)
                c._timed(start)
        result = original(params, *args, **kwargs)
        if owners:
            start = _clock()
            limit = args[0] if args else kwargs.get("max_norm", kwargs.get("clip_value"))
            c._judge("clipping", rules.clipping, "clip", name=name, owners=owners, norm=result, limit=limit)
            c._timed(start)
        return result

    return clip


def clip_owners(c: Any, params: list[torch.Tensor]) -> tuple:
    """``(index, fused, not unscaled yet)`` of each optimizer whose gradients a clip is about to cut."""
    from torch.amp.grad_scaler import OptState

    recorder = c.recorder
    owners = sorted({recorder.rec.param_opt[id(p)] for p in params if id(p) in recorder.rec.param_opt})
    found = []
    for i in owners:
        opt = recorder.opts[i]
        state = recorder.scaler._per_optimizer_states.get(id(opt))
        stage = OptState.READY if state is None else state["stage"]
        found.append((i, getattr(opt, "_step_supports_amp_scaling", False), stage is OptState.READY))
    return tuple(found)


def plugin_clip(c: Any, original: Any) -> Any:
    rec = c.recorder.rec

    @functools.wraps(original)
    def clip_gradients(optimizer: Any, clip_val: Any = 0.0, *args: Any, **kwargs: Any) -> Any:
        if c._off:
            return original(optimizer, clip_val, *args, **kwargs)
        inner = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer wraps the torch one
        index = c.recorder.opt_index.get(id(inner))
        fused = getattr(inner, "_step_supports_amp_scaling", False)
        rec.in_lightning += 1
        try:
            return original(optimizer, clip_val, *args, **kwargs)
        except RuntimeError as err:
            if fused and index is not None and clip_val and "clipping" in str(err):
                c._judge("clipping", rules.clipping, "refused", index, error=str(err))
            raise
        finally:
            rec.in_lightning -= 1

    return clip_gradients


# ---------------------------------------------------------------------- autocast
def autocast_enter(c: Any, original: Any) -> Any:
    rec = c.recorder.rec

    @functools.wraps(original)
    def enter(region: Any) -> Any:
        if c._off or not rec.in_step_fn or rec.in_lightning:
            return original(region)
        with c._rec:
            enabled = bool(getattr(region, "_enabled", False))
            caching = bool(getattr(region, "_cache_enabled", False)) and bool(region._enabled)
            rec.regions.append(Region(region, caching, getattr(region, "fast_dtype", None), enabled))
        return original(region)

    return enter


def autocast_exit(c: Any, original: Any) -> Any:
    rec = c.recorder.rec

    @functools.wraps(original)
    def exit_(region: Any, *args: Any) -> Any:
        if c._off or not rec.regions or rec.regions[-1].region is not region:
            return original(region, *args)
        with c._rec:
            entry = rec.regions.pop()
            if entry.enabled and not entry.flagged:
                c._judge("autocast-cache", rules.autocast_cache, "exit", dtype=entry.dtype)
                rec.noted.add(entry.dtype)
            if not any(r.stepped for r in rec.regions):
                c.patches.stop_forwards()
        return original(region, *args)

    return exit_


def forward_after_step(c: Any, module: Any, inputs: Any) -> None:
    """A module's forward pre-hook while a caching region holds a step: stale casts?"""
    if c._off:
        return
    rec = c.recorder.rec
    with c._rule["autocast-cache"]:
        if not c.recorder.stale_forward(module) or c._known("autocast-cache", "forward after step"):
            return
        for region in rec.regions:
            region.flagged = True
        own = any(r.stepped and r.region is not None for r in rec.regions)
        c._judge("autocast-cache", rules.autocast_cache, "forward", type(module).__name__, own)
