"""One rule per guide section: each takes the :class:`~mpguide.checks.record.FitRecord` (and what the moment being
judged adds: which optimizer, which numbers) and returns :class:`~mpguide.checks.findings.Found` items.

A rule reads, never writes: the record is filled by ``mpguide.checks.recorder`` and the findings are filed,
warned and counted by the callback. A rule returns a bare ``Found`` with an empty message for a finding already
in ``rec.reported``: the callback only counts that sighting (no message is built, no device value read twice).
The general rules behind each (what keeps correct code free of findings, what is not detectable) are in the
package docstring (``help(mpguide.checks)``); ``tests/test_checks_rules.py`` calls each rule on hand-built records.
"""

from __future__ import annotations

from typing import Any

import torch

from .findings import Found, clip_numbers, fmt, link
from .record import FitRecord


def again(section: str, subject: Any) -> Found:
    """One more sighting of a finding already made (counted, not reported again)."""
    return Found(section, subject, "")


def no_gradient_step(rec: FitRecord, optimizer: int, with_grad: int = 0, at_end: bool = False) -> list[Found]:
    """An ``opt.step()`` with ``with_grad`` of its parameters holding a ``.grad``: a finding when none does (the
    wrappers call it only then). ``at_end``: an optimizer never stepped in the whole fit whose parameters did not
    change (version counters), and no ``nonfinite-guard`` finding explains why."""
    if with_grad and not at_end:
        return []
    key = ("no-gradient-step", f"never stepped {optimizer}" if at_end else optimizer)
    if key in rec.reported:
        return [again(*key)]
    if at_end:
        return [
            Found(
                *key,
                f"{rec.name(optimizer)} was never stepped in {rec.global_batch + 1} batch(es) and its parameters did "
                f"not change (their version counters did not move). If a guard skipped every step (an optimizer "
                f"without gradients), the loss of its windows never reaches that model: after manual_backward, print "
                f"[n for n, p in model.named_parameters() if p.grad is None] to see which parameters it "
                f"misses, and follow that loss's graph back (loss.grad_fn) to the detach or no_grad.",
                optimizer,
            )
        ]
    backwards = rec.step.backwards
    reached = rec.reached(set(backwards))
    return [
        Found(
            *key,
            f"{rec.name(optimizer)} stepped {rec.where()} with no gradient on any of its {rec.sizes[optimizer]} "
            "parameter(s); "
            + (
                f"the {len(backwards)} backward call(s) of this batch reached only {', '.join(reached)}"
                if reached
                else "no backward of this batch reached any trainer optimizer's parameters"
            )
            + ". In fp32/bf16 the step silently does nothing; under 16-mixed GradScaler raises 'No inf "
            "checks were recorded for this optimizer'. Fix: step only optimizers whose loss reached their "
            "parameters in this batch (a detached tensor, the wrong toggle, zero_grad between backward "
            "and step).",
            optimizer,
        )
    ]


def clipping(
    rec: FitRecord,
    when: str,
    optimizer: int | None = None,
    *,
    name: str = "",
    owners: tuple = (),
    norm: Any = None,
    limit: Any = None,
    error: str = "",
) -> list[Found]:
    """Gradients clipped while still multiplied by the loss scale.

    ``when="unscale"``: ``scaler.unscale_()`` from ``training_step`` under Lightning's ``MixedPrecision``.
    ``when="clip"``: a clip function on the gradients of ``owners``, ``(index, fused, not unscaled yet)`` each,
    which returned ``norm`` (read only for a new finding). ``when="refused"``: ``self.clip_gradients`` on a fused
    optimizer, refused by the precision plugin with ``error``.
    """
    if when == "unscale":
        if not rec.in_step_fn or rec.in_lightning:
            return []
        return [
            Found(
                "clipping",
                optimizer,
                f"scaler.unscale_() was called {rec.where()} from training_step: Lightning's MixedPrecision "
                f"unscales again inside opt.step(), and GradScaler raises 'unscale_() has already been called on "
                f"this optimizer since the last update()'. Fix: clip inside on_before_optimizer_step (after "
                f"Lightning's unscale_), or use ManualMixedPrecision (Lightning 2.6).",
                optimizer,
            )
        ]
    if when == "refused":
        return [
            Found(
                "clipping",
                optimizer,
                f"self.clip_gradients {rec.where()} on {rec.name(optimizer)}, a fused optimizer, under "
                f"{rec.precision}: Lightning refuses it ({error.splitlines()[0][:120]}). Fix: fused=False, or no "
                f"clipping.",
                optimizer,
            )
        ]
    scaled = [(i, fused) for i, fused, unscaled_not in owners if fused or unscaled_not]
    if not scaled:
        return []
    i, fused = scaled[0]
    if ("clipping", i) in rec.reported:
        return [again("clipping", i)]  # seen before: reading the norm again would synchronise
    if name == "clip_grad_norm_" and isinstance(norm, torch.Tensor):
        numbers = clip_numbers(float(norm), limit, rec.scale)
    else:
        numbers = f"the values it clipped to {limit} are {fmt(rec.scale)}x the true ones"
    return [
        Found(
            "clipping",
            i,
            f"{name} {rec.where()} clipped {rec.name(i)}'s gradients while they were still multiplied "
            f"by the loss scale {fmt(rec.scale)}"
            + (
                " (a fused optimizer unscales inside its step, so even on_before_optimizer_step sees them scaled)"
                if fused
                else ""
            )
            + f": {numbers}. Fix: "
            + (
                "an unfused optimizer (fused=False) when clipping under 16-mixed."
                if fused
                else "clip inside on_before_optimizer_step(self, optimizer), which runs after unscaling, "
                "or, on Lightning 2.6, with ManualMixedPrecision's self.clip_gradients(opt, ...)."
            ),
            i,
        )
    ]


def scale_changes(rec: FitRecord, optimizer: int, scales: set[float], scale: float | None = None) -> list[Found]:
    """A step under Lightning's ``MixedPrecision`` on gradients made at other loss scales (``scales``) than the one
    it unscales with (``scale``, default the current one); never with a plugin that rescales held gradients. Judged
    after the step: a step GradScaler skipped (non-finite gradients) made no update to be off."""
    scale = rec.scale if scale is None else scale
    if not rec.scaled or rec.rescales_held or not scales - {scale}:
        return []
    if ("scale-changes", optimizer) in rec.reported:
        return [again("scale-changes", optimizer)]
    old = sorted(scales - {scale})
    return [
        Found(
            "scale-changes",
            optimizer,
            f"{rec.name(optimizer)} unscales {rec.where()} with loss scale {fmt(scale)} gradients produced at "
            f"{', '.join(fmt(s) for s in old)}: Lightning's MixedPrecision updated the scale in another "
            f"opt.step() in between, so this update is {fmt(max(old) / scale)}x what it should "
            f"be. Fix: mpguide.precision.ManualMixedPrecision (one update per training_step), or one "
            f"optimizer per backward, stepped before the next optimizer's step.",
            optimizer,
        )
    ]


def schedulers(rec: FitRecord) -> list[Found]:
    """At an epoch's end: a scheduler stepped in a batch whose step GradScaler skipped (``rec.sched_candidates``)
    is a finding when it stepped per batch (in two or more batches of that epoch, ``rec.scheduler_batches``); one
    stepped once an epoch follows epochs, not updates."""
    found = []
    for key, (kind, index, batch, before, after) in rec.sched_candidates.items():
        stepped = len(rec.scheduler_batches.get(key, ()))
        if stepped < 2:
            continue
        if ("schedulers", index) in rec.reported or any(f.subject == index for f in found):
            found.append(again("schedulers", index))
            continue
        where = "at fit start" if batch is None else f"in batch {batch} (epoch {rec.epoch})"
        found.append(
            Found(
                "schedulers",
                index,
                f"{kind}, stepped in {stepped} batches of epoch {rec.epoch}, "
                f"stepped {where} although GradScaler skipped {rec.name(index)}'s step (inf/NaN "
                f"gradients): the learning rate moved from {fmt(before)} to {fmt(after)} with no update applied. "
                f"Fix: step a per-step scheduler only after an applied step (mpguide.steps.step_skip_aware).",
                index,
                batch=batch,
            )
        )
    return found


def nonfinite_guard(rec: FitRecord, optimizer: int, finite: Any, moved: bool = False) -> list[Found]:
    """Non-finite gradients (``finite``: an unread 0-d flag or a bool) zeroed with no step on them, the
    parameters not changed in place after the zero (``moved``: SAM's ``second_step`` by hand is not a guard)."""
    if moved or bool(finite):
        return []
    return [
        Found(
            "nonfinite-guard",
            optimizer,
            f"{rec.name(optimizer)}: gradients that are not finite were zeroed {rec.where()} without an "
            f"opt.step() on them (loss scale {fmt(rec.scale)}): a guard that skips the step also "
            f"skips the only call that lowers the scale, so it stays too high. Fix: always call "
            f"opt.step() and ask afterwards whether GradScaler skipped it (mpguide.steps.step_skip_aware).",
            optimizer,
        )
    ]


def backward_flags(rec: FitRecord, backward: int) -> list[Found]:
    """``loss.backward()`` (call ``backward``) inside ``training_step`` whose gradients reached the trainer's
    optimizers' parameters; reported once."""
    if not rec.in_step_fn or ("backward-flags", "loss.backward") in rec.reported:
        return []
    reached = rec.reached({backward})
    if not reached:
        return []
    return [
        Found(
            "backward-flags",
            "loss.backward",
            f"loss.backward() was called {rec.where()} instead of self.manual_backward(loss), and its "
            f"gradients reached {', '.join(reached)}: "
            + (
                "under 16-mixed the loss is not multiplied by the loss scale, so GradScaler then "
                "unscales gradients that were never scaled (or fails with 'Attempted unscale_ but "
                "_scale is None')"
                if rec.scaled
                else "Lightning's precision and strategy hooks are bypassed (it works here by luck: "
                "under 16-mixed it breaks)"
            )
            + ". Fix: self.manual_backward(loss).",
        )
    ]


def fp16_parameters(
    rec: FitRecord,
    half: tuple = (),
    eps: tuple = (),
    moved: int = 0,
    lost: int = 0,
) -> list[Found]:
    """At train start: trainable half-precision parameters under ``*-mixed`` (``half``: ``(name, dtype)`` each),
    an optimizer's ``eps`` that is 0 in float16 under ``16-true`` (``eps``: ``(index, type name, smallest eps)``).
    After a sampled ``*-true`` batch: over half of the ``moved`` gradient-carrying elements ``lost`` (unchanged);
    not judged in a batch whose step GradScaler skipped."""
    found = []
    if half and rec.precision in ("16-mixed", "bf16-mixed"):
        names = [n for n, _ in half]
        found.append(
            Found(
                "fp16-parameters",
                "mixed",
                f"{len(half)} trainable parameter(s) are half precision under {rec.precision} "
                f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}: {half[0][1]}); "
                f"under 16-mixed GradScaler refuses to unscale fp16 gradients, and any update below half the "
                f"weight's spacing rounds away. Fix: keep trainable weights in float32 (autocast casts them per op).",
            )
        )
    for i, kind, smallest in eps if rec.precision == "16-true" else ():
        if float(torch.tensor(smallest, dtype=torch.float16)) == 0.0:
            found.append(
                Found(
                    "fp16-parameters",
                    f"eps {i}",
                    f"optimizer {i} ({kind}) has eps={smallest:g}, which is 0 in float16 (the "
                    f"smallest float16 is 6e-08): under 16-true its update divides by the square root of a "
                    f"second moment that underflows to 0, and the weights become NaN. Fix: eps=1e-4 or larger, "
                    f"or 16-mixed with float32 weights.",
                    i,
                )
            )
    if moved and lost / moved > 0.5 and not (rec.step.skipped and rec.scaled):
        found.append(
            Found(
                "fp16-parameters",
                "true",
                f"under {rec.precision}, {lost} of {moved} weight elements with a non-zero gradient "
                f"({lost / moved:.0%}) did not change in the optimizer step {rec.where()}: the update is "
                f"smaller than half the spacing of the weight's dtype and rounds away. Fix: train in "
                f"bf16-mixed/16-mixed with float32 weights (or keep float32 master weights).",
            )
        )
    return found


def _bypass(rec: FitRecord, index: int, how: str) -> str:
    scaled = (
        f"; under {rec.precision} GradScaler neither unscales these gradients nor checks them for inf/NaN, so "
        f"the update is applied to gradients still multiplied by the loss scale ({fmt(rec.scale)} at this "
        f"point)"
        if rec.scaled
        else ""
    )
    return (
        f"{rec.name(index)} {how}, outside Lightning's optimizer wrapper (the LightningOptimizer that "
        f"self.optimizers() returns): trainer.global_step does not advance, so max_steps never stops training"
        f"{scaled}. Fix: call opt.step() on the LightningOptimizer (opt.step(closure=...) for LBFGS); for SAM, "
        f"climb by hand and step the base optimizer through opt.step() (under 16-mixed Lightning steps a "
        f"closure-taking optimizer without its closure)."
    )


def step_frequencies(rec: FitRecord, when: str, optimizer: int, changed: int = 0) -> list[Found]:
    """Steps ``global_step`` does not count. ``when="hook"``: an ``opt.step()`` outside ``training_step``;
    ``"raw"``: the torch optimizer's own ``step()`` inside it; ``"end"``: an optimizer never stepped through
    ``opt.step()`` whose parameters' version counters moved by ``changed`` all the same."""
    if when == "hook":
        if rec.in_step_fn or rec.batch is None:
            return []
        if ("step-frequencies", optimizer) in rec.reported:
            return [again("step-frequencies", optimizer)]
        return [
            Found(
                "step-frequencies",
                optimizer,
                f"{rec.name(optimizer)} stepped {rec.where()} outside training_step (in a hook): trainer.global_step "
                f"and max_steps do not count steps taken there. Fix: call opt.step() inside training_step.",
                optimizer,
            )
        ]
    key = ("step-frequencies", f"bypass {optimizer}")
    if key in rec.reported:
        return [again(*key)]
    if when == "raw":
        how = f"stepped {rec.where()} through the torch optimizer's own step()"
    elif changed:
        how = (
            f"was never stepped through opt.step() in {rec.global_batch + 1} batch(es), yet its parameters were "
            f"changed in place (their version counters moved by {changed}): something else updated them (SAM's "
            f"first_step/second_step, a hand-written update)"
        )
    else:
        return []
    return [Found(*key, _bypass(rec, optimizer, how), optimizer)]


def porting(
    rec: FitRecord,
    when: str,
    hooks: tuple = (),
    frozen: tuple = (),
    outside: int = 0,
    schedulers: tuple = (),
) -> list[Found]:
    """Hooks manual optimization never calls and schedulers no one steps.

    ``when="start"``: ``hooks``, ``(hook, class it is inherited from or None, inherited from the automatic
    parent)`` each. ``when="end"``: ``rec.dead_hooks`` judged on whether any of the ``outside`` parameters outside
    every optimizer changed (``frozen``: the names of those that did not). ``when="schedulers"`` (at train end):
    ``schedulers``, ``(index, type name, its optimizer's index or None, steps)`` each: never stepped although
    its optimizer applied a step.
    """
    found = []
    for hook, owner, leftover in hooks:
        if leftover:
            found.append(
                Found(
                    "porting",
                    None,
                    f"[porting] note: {rec.module} inherits {hook}() from {owner}; manual "
                    f"optimization never calls it, so training_step must do its work. See the guide, {link('porting')}",
                    note=True,
                )
            )
        else:
            found.append(
                Found(
                    "porting",
                    hook,
                    f"{rec.module} overrides {hook}(), which Lightning never calls in manual "
                    f"optimization, so its code does not run. Fix: move that code into training_step (clipping: "
                    f"on_before_optimizer_step or self.clip_gradients before opt.step()).",
                )
            )
    for hook, owner in rec.dead_hooks if when == "end" else ():
        if outside and len(frozen) == outside:
            found.append(
                Found(
                    "porting",
                    hook,
                    f"{rec.module} inherits {hook}() from {owner}, which Lightning never calls in "
                    f"manual optimization, and none of the {len(frozen)} parameter(s) outside every optimizer "
                    f"({', '.join(frozen[:3])}{', ...' if len(frozen) > 3 else ''}) changed during training: the "
                    f"work that hook did (an EMA or teacher update?) never ran. Fix: call it in training_step, "
                    f"after opt.step().",
                )
            )
        else:
            found.append(
                Found(
                    "porting",
                    None,
                    f"[porting] note: {rec.module} inherits {hook}() from {owner}; manual optimization "
                    f"never calls it, so training_step must do its work. See {link('porting')}",
                    note=True,
                )
            )
    for index, kind, owner, steps in schedulers if when == "schedulers" else ():
        if owner is not None and not rec.applied_steps.get(owner):
            continue  # every step of its optimizer was skipped: a skip-aware scheduler rightly never stepped
        if steps == 0:
            found.append(
                Found(
                    "porting",
                    f"scheduler {index}",
                    f"scheduler {index} ({kind}) from configure_optimizers was never stepped: "
                    f"in manual optimization Lightning steps no scheduler ('interval' and 'frequency' are "
                    f"ignored). Fix: call sch.step() yourself (self.lr_schedulers()), per batch or in "
                    f"on_train_epoch_end.",
                )
            )
    return found


def accumulation(rec: FitRecord, optimizer: int, pending: tuple | None = None, tail: tuple = ()) -> list[Found]:
    """At a step: ``pending``, ``(first batch, count)`` of earlier batches' backward calls zeroed before any step
    used them; ``tail``, the ``(epoch, batch)`` of earlier epochs' backward calls this step uses (a window that
    leaks across the epoch's end)."""
    found = []
    name = rec.name(optimizer) if pending is not None or tail else ""
    if pending is not None:
        found.append(
            Found(
                "accumulation",
                optimizer,
                f"{name} steps {rec.where()}, but {pending[1]} backward(s) of earlier batches in its window "
                f"(from batch {pending[0]} on) were zeroed before any step used them: only the micro-batches "
                f"since the last zero_grad count. Fix: zero_grad only right after the step (once per window).",
                optimizer,
            )
        )
    if tail:
        found.append(
            Found(
                "accumulation",
                f"epoch tail {optimizer}",
                f"{name} steps {rec.where()} on gradients that include {len(tail)} backward(s) of epoch "
                f"{tail[0][0]} (from its batch {tail[0][1]} on): that epoch ended inside a window, and its "
                f"last micro-batches were carried into this epoch's first window. Fix: also step at the "
                f"epoch's last batch (if (batch_idx + 1) % N == 0 or self.trainer.is_last_batch).",
                optimizer,
            )
        )
    return found


def autocast_cache(rec: FitRecord, when: str, module: str = "", own: bool = False, dtype: Any = None) -> list[Found]:
    """``when="forward"``: a forward through ``module``, whose own parameters a step updated inside a caching
    autocast region (``own``: an own ``torch.autocast``; else the precision plugin's region). ``when="exit"``: an
    own enabled autocast of ``dtype`` that only repeats Lightning's under ``*-mixed``: a note, once per dtype."""
    if when == "exit":
        lightning_dtype = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(rec.precision)
        if dtype != lightning_dtype or dtype in rec.noted:  # another dtype than Lightning's is not redundant
            return []
        return [
            Found(
                "autocast-cache",
                None,
                f"[autocast-cache] note: an own torch.autocast({dtype}) inside training_step "
                f"{rec.where()} repeats the autocast Lightning already opens around training_step "
                f"under {rec.precision}; it is redundant (not a finding). See {link('autocast-cache')}",
                note=True,
            )
        ]
    return [
        Found(
            "autocast-cache",
            "forward after step",
            f"a forward through {module} {rec.where()} runs after an opt.step() inside "
            + (
                "an own torch.autocast with its cache on: the casts of the weights made before the step are reused, "
                "so this forward sees the old weights. Fix: close the own autocast before opt.step(), or "
                "torch.autocast(..., cache_enabled=False) (Lightning's own region already runs the whole "
                "training_step)."
                if own
                else "the autocast region the precision plugin opens around training_step, and that region caches "
                "casts (torch.is_autocast_cache_enabled() is True in it: this Lightning opens it with torch's "
                "default cache on): the casts of the weights made before the step are reused, so this forward sees "
                "the old weights. Fix: run the forwards after a step inside torch.autocast(..., "
                "cache_enabled=False), or a Lightning release whose region does not cache, or one forward per "
                "training_step before the step, or mpguide.precision.ManualMixedPrecision."
            ),
        )
    ]


def optimizer_math(rec: FitRecord, optimizer: int, device: str, dtype: Any, seen: tuple) -> list[Found]:
    """A sampled step under ``device`` autocast (casting to ``dtype``) that called the matrix functions ``seen``
    with gradient recording off (the update's own math, not a closure's forward)."""
    if not seen:
        return []
    return [
        Found(
            "optimizer-math",
            optimizer,
            f"{rec.name(optimizer)}'s step runs under {device} autocast {rec.where()} and calls "
            f"{', '.join(sorted(set(seen)))} with gradient recording off (the update's own math, "
            f"not a closure's forward), which autocast recasts to "
            f"{dtype}: its matrix math changes precision, unlike "
            f"automatic optimization. Fix: mpguide.precision.ManualMixedPrecision, or wrap opt.step() "
            f"in torch.autocast(device_type, enabled=False).",
            optimizer,
        )
    ]


def gradient_penalty(rec: FitRecord, total: int, zeros: int, under: int) -> list[Found]:
    """``autograd.grad(..., create_graph=True)`` on an unscaled output under a loss scale, measured once: of its
    ``total`` gradient elements, ``zeros`` are 0 as computed, ``under`` of them non-zero times the scale. A finding
    from 1 % underflowed on; below, a note filed under the same key (not measured again)."""
    if not total:
        return []
    numbers = (
        f"of its {total} gradient element(s), {under} ({under / total:.1%}) are 0 as computed and non-zero when "
        f"the same gradient is taken of the output times the loss scale {fmt(rec.scale)} (fp16 underflow); "
        f"{zeros} ({zeros / total:.1%}) are 0 as computed"
    )
    if under / total >= 0.01:
        return [
            Found(
                "gradient-penalty",
                "autograd.grad",
                f"torch.autograd.grad(..., create_graph=True) {rec.where()} differentiates an output that was not "
                f"multiplied by the loss scale: {numbers}. Fix: torch.autograd.grad(scaler.scale(out), ...), then "
                f"divide by the scale.",
            )
        ]
    return [
        Found(
            "gradient-penalty",
            "autograd.grad",
            f"[gradient-penalty] note: torch.autograd.grad(..., create_graph=True) {rec.where()} on an output "
            f"not multiplied by the loss scale: {numbers}; under 1 % underflowed, not a finding. "
            f"See {link('gradient-penalty')}",
            note=True,
        )
    ]
