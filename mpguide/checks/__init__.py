"""Find the guide's pitfalls in your own ``training_step``: a Lightning callback that watches it train.

Add it to the ``Trainer``'s callbacks and run a few batches::

    from mpguide.checks import PitfallChecks

    checks = PitfallChecks()                  # each finding warned once, as a PitfallWarning
    trainer = Trainer(..., callbacks=[checks])
    trainer.fit(model, data)
    for finding in checks.findings:           # what it saw: .section, .message, .batch, .optimizer
        print(finding.message)

``PitfallChecks(strict=True)`` raises :class:`PitfallError` (with ``.section``) at the first finding,
as soon as it is known: for a step without gradients, before GradScaler's ``AssertionError``.

How it is built: record, then judge. ``mpguide.checks.record`` holds what a fit and each training step did
as plain data (backward calls and the parameters they reached, clips, steps, skips, ``zero_grad`` calls, scheduler
steps, autocast regions, loss scales, version counters); ``mpguide.checks.recorder`` writes it;
``mpguide.checks.rules`` holds one small function per section that takes that record and returns findings
(testable without a ``Trainer``, ``tests/test_checks_rules.py``); ``mpguide.checks.wrappers`` are the
pass-through wrappers that feed the recorder and call the rules; :class:`PitfallChecks`
(``mpguide.checks.callback``) installs them for a fit and files, warns or raises the findings;
``mpguide.checks.findings`` holds the finding, warning and error classes.

How it watches (from outside the module: nothing in the reader's code changes). From ``on_fit_start``
until the fit ends (normally or by an exception) it wraps, as instance attributes that it removes again:
each optimizer's ``step`` and ``zero_grad`` (the torch optimizer and the ``LightningOptimizer`` that
``self.optimizers()`` returns), every scheduler's ``step``, the precision plugin's ``optimizer_step``
and ``clip_gradients``, the GradScaler's ``scale`` and ``update``, the strategy's ``backward``, the
module's ``training_step`` and ``zero_grad``; for the same time it replaces ``torch.Tensor.backward``,
``torch.autograd.grad``, ``torch.nn.utils.clip_grad_norm_``/``clip_grad_value_`` and
``torch.autocast.__enter__``/``__exit__``, and registers a gradient hook on every trainable parameter
of the trainer's optimizers (which backward reached which parameter, at which loss scale). Everything
is restored on ``on_fit_end``, ``on_exception`` and ``teardown``. It does nothing in automatic
optimization except the ``fp16-parameters`` check (Lightning runs those steps itself).

It never alters the reader's code. Every wrapper calls the original exactly once with the same arguments and
returns its value; an exception from the original passes through unchanged. The wrappers are made with
``functools.wraps``, so the reader's signature stays visible: Lightning's ``is_param_in_hook_signature``
follows ``__wrapped__`` (``utilities/signature_utils.py``, since 2.1) and passes ``batch_idx`` only to a
``training_step`` that takes it, and a ``training_step(self, dataloader_iter)`` still gets the iterator
(checked with ``explicit=True``, ``loops/utilities.py``). An exception raised by the check's own code becomes
one :class:`ChecksStoppedWarning` (its text also in ``PitfallChecks.stopped``): raised while recording what
a step did, the whole callback stops for the run (every patch removed); raised in one section's rule, that rule
stops and the others go on. The reader's run is the same, bitwise, as without the callback. A traceback of the
run's own error still shows the wrappers' frames (``mpguide/checks/wrappers.py``) between Lightning's: the
exception is the original's, as a run without the callback shows.

Device synchronisation: none per step beyond GradScaler's own. A skipped step is known without reading
a device value (GradScaler calls the optimizer's ``step`` only when the gradients are finite,
``torch/amp/grad_scaler.py``, ``_maybe_opt_step``); the loss scale is read once at fit start and then
followed from the skips (on a CUDA scaler) or read after each ``update()`` (a CPU scaler, where reading
costs nothing). Device values are read only to give a finding its numbers (once per finding), to tell
discarded gradients that were not finite from finite ones (when gradients that no optimizer stepped on are
zeroed: under a loss scale, or when they came from an earlier batch), and under ``16-true``/``bf16-true`` on
the sampled batches of the lost-update count (a copy of the stepped weights, batches 0, 1, 3, 7, 15, ...).

Cost: every wrapper times its own code with ``time.perf_counter``; :meth:`PitfallChecks.cost` gives that
time against the batches' time (``check_seconds / step_seconds``), apart from the one-off work at fit
start and train end (``setup_seconds``).

Rules that keep correct code free of findings (general, stated here, not tied to any module's shape):

* Gradients zeroed in the batch whose backward made them were read by that batch's own code (gradient
  surgery such as PCGrad: per-task ``zero_grad`` + ``manual_backward``, then gradients written and one step;
  SAM's ``first_step(zero_grad=True)`` inside a closure): not ``accumulation``. Only a backward of an earlier
  batch zeroed before any step used it is a window's lost micro-batch. Non-finite gradients zeroed in their own
  batch are ``nonfinite-guard`` only if that optimizer takes no step in the batch (gradient surgery steps, and
  GradScaler sees the inf in what it writes) and its parameters are not changed in place after the zero (SAM's
  ``second_step`` by hand: an update outside the wrapper, named as that under ``step-frequencies``).
* A scheduler stepped in a batch whose step GradScaler skipped is ``schedulers`` only when it steps per batch
  (in two or more batches of that epoch, judged at the epoch's end). A scheduler stepped once an epoch (at
  ``is_last_batch``, or ``ReduceLROnPlateau`` in ``on_train_epoch_end``, which is not charged with the last
  batch's skip at all) follows epochs, not updates: skipping it would drop that epoch's decay.
* A configured scheduler never stepped is ``porting`` only when its optimizer had at least one applied step
  (a skip-aware scheduler rightly never steps when every step was skipped).
* Matrix products inside an optimizer's step are ``optimizer-math`` only when gradient recording is off: torch's
  optimizers update under ``no_grad`` and run a closure under ``enable_grad`` (LBFGS, SAM), so a product with
  gradients on is the closure's forward, which autocast is meant to cover.
* ``gradient-penalty`` reports what it measured: the share of the returned gradient's elements that are 0 as
  computed and non-zero when the same gradient is taken of the output times the loss scale (two extra
  ``autograd.grad`` calls with ``retain_graph=True``, once per fit). A finding from 1 % on; below, a note with
  the numbers (a second-order MAML inner loop's ReLU zeros are zero either way). The extra calls run the
  reader's own tensor hooks on that graph once more.
* "did not train" is said only when the parameters did not change: their in-place version counters
  (``Tensor._version``, bumped by every in-place update, optimizers' included) are summed at fit start and at
  train end, without a copy of the weights.

What may still raise a false alarm: stepping an optimizer whose parameters are meant to have no gradient in
that batch (``no-gradient-step``: a no-op in fp32, an error under 16-mixed); a penalty loss multiplied by the
scale by hand (``gradient-penalty``, when its measured underflow reaches 1 %).

What each section's check sees (the section is the anchor on the guide page, :data:`GUIDE_URL`):

* ``no-gradient-step``: an ``opt.step()`` whose parameters have no ``.grad`` at all, seen before the
  step (so before GradScaler's "No inf checks were recorded for this optimizer"); the message names the
  modules this batch's backward calls did reach. Gradients zeroed in place (``set_to_none=False``) are
  tensors and are not seen as missing (telling needs a device read). At the end of training, an optimizer
  of ``configure_optimizers`` that was never stepped at all (a guard such as ``has_gradients`` skipped
  every step: Lightning #20116's window whose loss never reaches the second model).
* ``clipping``: ``torch.nn.utils.clip_grad_norm_``/``clip_grad_value_`` (also through
  ``self.clip_gradients``) on gradients GradScaler has not unscaled yet (its per-optimizer stage), with
  the norm it clipped and the unscaled norm; any clip of a fused optimizer's gradients under a loss
  scale (fused optimizers unscale inside ``step``, so even ``on_before_optimizer_step`` sees scaled
  ones); ``self.clip_gradients`` on a fused optimizer that the precision plugin refuses (Lightning
  2.6.6 raises for bf16-mixed too). A clip function imported by name before the fit
  (``from torch.nn.utils import clip_grad_norm_``) is not seen.
* ``scale-changes``: under Lightning's ``MixedPrecision`` (which updates the scale inside every
  ``opt.step()``), an optimizer stepping on gradients produced at another loss scale than the one it
  unscales with (one backward for several optimizers, or a window held across another optimizer's
  step). Not reported with :class:`mpguide.precision.ManualMixedPrecision`, which rescales held
  gradients.
* ``schedulers``: a scheduler stepped in a batch whose optimizer step GradScaler skipped, with the
  learning rate it consumed. Fused optimizers skip inside their kernel, so their skips are not seen.
* ``nonfinite-guard``: under a loss scale, gradients that are not finite zeroed without any
  ``opt.step()`` on them (a guard that skips the step also skips the scale's only way down).
* ``backward-flags``: ``loss.backward()`` (or ``torch.autograd.backward``) inside ``training_step``
  instead of ``self.manual_backward(loss)``, when its gradients reach the trainer's optimizers'
  parameters (a backward through another model, such as an inner loop's, is not reported); seen right
  after that backward, before the ``opt.step()`` that fails under 16-mixed.
* ``fp16-parameters``: trainable float16/bfloat16 parameters under a ``*-mixed`` precision, at train
  start; under ``16-true`` and ``bf16-true``, most (over half) of the gradient-carrying weight elements left
  unchanged by the optimizer, measured on a sample of batches (0, 1, 3, 7, 15, ...), not on every step.
  Under ``32-true`` a parameter the reader made half precision is not sampled.
* ``step-frequencies``: an optimizer step outside ``training_step`` (a hook), which ``global_step``
  and ``max_steps`` do not count there. A step that bypasses Lightning's optimizer wrapper: the torch
  optimizer's own ``step()`` called inside ``training_step`` (``opt.optimizer.step()``, seen at the call), or
  an optimizer never stepped through ``opt.step()`` whose parameters changed in place all the same (SAM's
  ``first_step``/``second_step``, a hand-written update; seen at train end from the version counters):
  ``global_step`` does not advance, ``max_steps`` never stops, and under 16-mixed the update uses gradients
  still multiplied by the loss scale.
* ``porting``: the module overrides hooks manual optimization never calls (``optimizer_step``,
  ``optimizer_zero_grad``, ``configure_gradient_clipping``, ``lr_scheduler_step``,
  ``on_before_zero_grad``), at fit start; a configured scheduler that no one stepped by the end of
  training (Lightning steps no scheduler in manual optimization, ``interval="step"`` included).
* ``accumulation``: an optimizer's gradients from an earlier batch zeroed before any optimizer stepped on them,
  when that optimizer steps later (only the last micro-batch of a window survives). A window that leaks across
  an epoch's end: a step in epoch e+1 on gradients that include backwards of epoch e (the epoch's last
  micro-batches carried into the next window; fix: also step at ``is_last_batch``). Gradients that a backward
  left on another optimizer's parameters after which another optimizer stepped (a GAN's generator
  loss fills the discriminator's gradients) are by design and not reported.
* ``autocast-cache``: an own ``torch.autocast`` with the cache on, inside ``training_step``, around a
  forward after an ``opt.step()`` in the same region (stale casts of the stepped weights). The cache
  setting is the region's own (``cache_enabled=None`` inherits it: Lightning 2.6.6 opens its region with
  the cache off, ``plugins/precision/amp.py``, so a default own autocast inside it does not cache). An own
  autocast that only repeats Lightning's is a note (:attr:`PitfallChecks.notes`), not a finding. The same for
  the precision plugin's own region around ``training_step`` when it caches (``torch.is_autocast_cache_enabled()``
  at ``training_step``'s start: Lightning <= 2.5.4's ``MixedPrecision`` kept torch's default cache on).
  Only a forward through a module whose own parameters that step updated counts (a forward through another
  model after the step casts unchanged weights). Limit: a module first forwarded after its step in the region
  casts fresh weights and is reported too (the check does not record which casts were made before the step).
* ``optimizer-math``: an optimizer step that runs under autocast and calls matrix functions (``mm``,
  ``matmul``, ``linear``, ``einsum``...), watched on each optimizer's first three steps under autocast.
* ``gradient-penalty``: ``torch.autograd.grad(..., create_graph=True)`` inside ``training_step``
  under a loss scale, on outputs that did not come from the GradScaler's ``scale()``, when at least 1 % of the
  returned gradient's elements measurably underflowed (see the rules above); below that, a note.

Not detectable from outside, so not reported: a loss not divided by the accumulation window (the
intended size is unknown); ``zero_grad`` between two micro-batches of one ``training_step`` (taken as the
step's own gradient surgery, see the rules above); a ``backward(retain_graph=True)``, an ``opt.step()``, then a
second backward through the same graph (under bf16/16-mixed autograd saved the cast copies, so the second
backward silently uses the pre-step weights; fp32 raises "modified by an inplace operation"): telling which
saved tensors predate the step needs a walk of the graph at every backward, which costs more than the check's
budget; gradients written into ``p.grad`` by the reader's code (``torch.autograd.grad`` results, PCGrad/LibMTL
projections) under 16-mixed: a tensor assigned to ``.grad`` carries no trace of whether it was scaled, and
its size has no reference (the update is then 1/scale of fp32's); an optimizer's inner base optimizer (SAM's
``base_optimizer``) is not watched, only the optimizer ``configure_optimizers`` returned; a per-step scheduler
in an epoch of a single batch (its cadence cannot be told from once-an-epoch);
a scheduler stepped at the wrong cadence (per batch is right for a schedule
meant per step, wrong for one meant per epoch: the intent is not in the code); a teacher or EMA update
outside the optimizer losing updates in ``*-true``; gradients read directly (``p.grad``) for anything
but clipping; an ``opt.step()`` taken from a closure the check cannot see (another thread, a compiled
region).

Tested with Lightning 2.6.6 and torch 2.13 (Lightning's ``MixedPrecision`` and
:class:`mpguide.precision.ManualMixedPrecision`); the corpus of public training steps it is judged on is
``tests/checks_corpus``. A ``training_step`` without ``batch_idx`` relies on Lightning following ``__wrapped__``
(2.1 and later). It reads GradScaler's private
``_per_optimizer_states`` (torch/amp/grad_scaler.py) and Lightning's ``strategy._lightning_optimizers``;
on a Lightning older than 2.0 it refuses in one line (:class:`PitfallError` at construction).
"""

from __future__ import annotations

from .._sections import GUIDE_URL, SECTIONS
from . import recorder as _recorder
from .callback import PitfallChecks
from .findings import ChecksStoppedWarning, Finding, PitfallError, PitfallWarning

__all__ = [
    "GUIDE_URL",
    "SECTIONS",
    "ChecksStoppedWarning",
    "Finding",
    "PitfallChecks",
    "PitfallError",
    "PitfallWarning",
]

#: Hooks that Lightning calls only in automatic optimization (``lightning/pytorch/loops/optimization/automatic.py``).
AUTOMATIC_ONLY_HOOKS = _recorder.AUTOMATIC_ONLY_HOOKS
