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
stops and the others go on. The reader's run is the same, bitwise, as without the callback.

Device synchronisation: none per step beyond GradScaler's own. A skipped step is known without reading
a device value (GradScaler calls the optimizer's ``step`` only when the gradients are finite,
``torch/amp/grad_scaler.py``, ``_maybe_opt_step``); the loss scale is read once at fit start and then
followed from the skips (on a CUDA scaler) or read after each ``update()`` (a CPU scaler, where reading
costs nothing). Device values are read only to give a finding its numbers (once per finding), to tell
discarded gradients that were not finite from finite ones (when gradients that no optimizer stepped on are
zeroed: under a loss scale, or when they came from an earlier batch), and under ``*-true`` on the sampled batches of the
lost-update count (a copy of the stepped weights, batches 0, 1, 3, 7, 15, ...).

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
  start; under ``*-true``, most (over half) of the gradient-carrying weight elements left unchanged by
  the optimizer, measured on a sample of batches (0, 1, 3, 7, 15, ...), not on every step.
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

import functools
import math
import warnings
from dataclasses import dataclass, field
from time import perf_counter as _clock
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.overrides import TorchFunctionMode

from ._common import HeldGradientScales
from ._sections import GUIDE_URL, SECTION_TITLES, SECTIONS

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
_MIXED = ("16-mixed", "bf16-mixed")
_ACTIVE: Any = None  # the instance whose patches are in place (one at a time)


class PitfallWarning(UserWarning):
    """One finding of :class:`PitfallChecks` (warned once per section and subject)."""


class ChecksStoppedWarning(UserWarning):
    """The check's own code raised: it stopped watching the run (or one section's rule stopped); the fit goes on
    exactly as without the callback. Warned once per stop; the text is also in ``PitfallChecks.stopped``."""


class PitfallError(RuntimeError):
    """Raised by ``PitfallChecks(strict=True)`` at the first finding, or for an unsupported Lightning.

    Attributes:
        section: the guide's anchor of the pitfall (one of :data:`SECTIONS`), ``""`` for a refusal.
    """

    def __init__(self, message: str, section: str = "") -> None:
        super().__init__(message)
        self.section = section


@dataclass
class Finding:
    """One pitfall seen in a run.

    Attributes:
        section: the guide's anchor (one of :data:`SECTIONS`).
        message: what was seen, with numbers, the fix in one line and the link to the section.
        batch: index of the training batch (within the epoch) where it was first seen, ``None`` at fit start.
        epoch: the epoch of that batch.
        optimizer: index of the optimizer in ``configure_optimizers`` concerned, or ``None``.
        count: how many times it was seen (the message describes the first).
    """

    section: str
    message: str
    batch: int | None = None
    epoch: int | None = None
    optimizer: int | None = None
    count: int = 1

    def as_dict(self) -> dict[str, Any]:
        """The finding as a JSON-ready dict."""
        return {
            "section": self.section,
            "message": self.message,
            "batch": self.batch,
            "epoch": self.epoch,
            "optimizer": self.optimizer,
            "count": self.count,
        }


@dataclass
class _Param:
    """What the gradient hook knows about one parameter's current ``.grad``."""

    backwards: set[int] = field(default_factory=set)  # ids of the backward calls that added to it
    scales: set[float] = field(default_factory=set)  # loss scales those backward calls used


@dataclass
class _Backward:
    seq: int  # the step sequence number when it ran
    batch: int
    epoch: int = 0


class _Lazy:
    """A string computed when formatted (keeps the per-step path free of string building)."""

    def __init__(self, make: Any) -> None:
        self.make = make

    def __format__(self, spec: str) -> str:
        return format(self.make(), spec)


class _Guard:
    """Runs a piece of the check's own code: an exception in it becomes one warning, never the reader's error.

    ``section=None`` guards the recorder (what a step did): its failure stops the whole callback for the run
    (every patch is removed, the fit goes on untouched). A section's guard covers that section's rule: its
    failure stops that rule only. A :class:`PitfallError` (``strict=True``) and non-``Exception`` errors
    (``KeyboardInterrupt``) pass through.
    """

    __slots__ = ("owner", "section")

    def __init__(self, owner: Any, section: str | None) -> None:
        self.owner = owner
        self.section = section

    def __enter__(self) -> _Guard:
        return self

    def __exit__(self, kind: Any, err: Any, tb: Any) -> bool:
        if err is None or isinstance(err, PitfallError) or not isinstance(err, Exception):
            return False
        self.owner._failed(self.section, err)
        return True


class _MatrixCalls(TorchFunctionMode):
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


def _link(section: str) -> str:
    """Where to read on: the section's heading (a terminal reader searches for it) and its address on the site."""
    return f'section "{SECTION_TITLES[section]}" ({GUIDE_URL}#{section})'


def _fmt(value: float) -> str:
    """A number in 3 significant digits; a whole number (a loss scale, 65536) in full; ``inf``/``nan`` as such
    (an overflowing first step of 16-mixed clips a norm of inf: the check must report it, not raise)."""
    if not math.isfinite(value):
        return f"{value:.3g}"
    return str(int(value)) if value == int(value) and abs(value) < 1e9 else f"{value:.3g}"


def _clip_numbers(seen: float, limit: Any, scale: float) -> str:
    """What clipping the scaled total norm ``seen`` to ``limit`` did, against clipping the true gradients.

    The true norm is ``seen / scale``. Clipped while scaled, the update's norm becomes ``min(seen, c) / scale``;
    clipped after unscaling it would be ``min(seen / scale, c)``: their ratio is how much smaller this update is.
    """
    true = seen / scale
    text = f"it clipped a total norm of {_fmt(seen)} to {limit}; unscaled, the norm was {_fmt(true)}"
    try:
        c = float(limit)
    except (TypeError, ValueError):
        return text
    if not (math.isfinite(seen) and c > 0):
        return text + " (a non-finite norm: GradScaler skips this step)"
    if seen <= c:
        return text + f"; nothing was cut this time, but the limit acts on gradients {_fmt(scale)}x too large"
    shrink = min(true, c) / (c / scale)
    return text + f", so this update is about {_fmt(shrink)} times smaller than clipping the true gradients"


def _hook(method: Any) -> Any:
    """A Lightning hook of the callback: skipped once the recorder stopped; its own exceptions become one warning."""

    @functools.wraps(method)
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._off:
            return None
        with self._rec:
            return method(self, *args, **kwargs)
        return None

    return hook


class PitfallChecks(Callback):
    """A callback that names the guide section of each manual-optimization pitfall its run shows.

    See the module docstring (``help(mpguide.checks)``) for what each section's check sees, how, and
    what it cannot see.

    Args:
        strict: raise :class:`PitfallError` at the first finding instead of warning.

    Attributes:
        findings: every :class:`Finding`, in the order seen (one per section and subject; ``count``
            says how often).
        notes: remarks that are not pitfalls (an own autocast that only repeats Lightning's), as strings.
        check_seconds: wall time spent in this callback's own code during the training batches (seconds).
        setup_seconds: its wall time at fit start, train start and train end, once per fit (seconds).
        step_seconds: wall time of the training steps: from each batch's start to the next batch's start
            (the period a reader's steps per second measure: data loading, Lightning's loop and every
            callback included), the epoch's last batch to its end (seconds).

    Raises:
        PitfallError: at construction on a Lightning older than 2.0 (its hooks differ); with
            ``strict=True``, at the first finding.
    """

    def __init__(self, strict: bool = False) -> None:
        if not isinstance(strict, bool):
            raise TypeError(f"PitfallChecks(strict=...) takes True or False, not {strict!r}")
        major = int(pl.__version__.split(".")[0])
        if major < 2:
            raise PitfallError(
                f"mpguide.checks.PitfallChecks needs Lightning >= 2.0 (found {pl.__version__}); "
                f"it was tested with 2.6.6"
            )
        self.strict = strict
        self.findings: list[Finding] = []
        self.notes: list[str] = []
        self.check_seconds = 0.0
        self.setup_seconds = 0.0
        self.step_seconds = 0.0
        self.stopped: list[str] = []
        self._restore: list[Any] = []
        self._off = False  # the recorder failed: nothing is watched until the next fit
        self._off_rules: set[str] = set()  # sections whose rule failed in this fit
        self._rec = _Guard(self, None)
        self._rule = {section: _Guard(self, section) for section in SECTIONS}
        self._reset()

    # ------------------------------------------------------------------ bookkeeping
    def _reset(self) -> None:
        self._keys: dict[tuple[str, Any], Finding] = {}
        self._batch: int | None = None
        self._global_batch = -1
        self._epoch = 0
        self._batch_start: float | None = None
        self._batch_end = 0.0
        self._in_step_fn = 0  # inside the user's training_step
        self._in_lightning = 0  # inside Lightning's backward / step / clip (its own autocast, its backward)
        self._in_backward = 0
        self._in_grad = 0
        self._opt_index: dict[int, int] = {}  # id(torch optimizer) -> index
        self._opts: list[Any] = []
        self._opt_params: list[list[torch.Tensor]] = []
        self._params: dict[int, _Param] = {}
        self._param_opt: dict[int, int] = {}
        self._param_module: dict[int, str] = {}
        self._backwards: dict[int, _Backward] = {}
        self._backward_id = 0
        self._batch_backwards: list[int] = []
        self._consumed: set[int] = set()
        self._seq = 0
        self._last_step_seq: dict[int, int] = {}
        self._applied: bool | None = None
        self._skipped_in_batch: set[int] = set()
        self._stepped_in_batch: set[int] = set()
        self._pending_accumulation: dict[int, tuple[int, int]] = {}
        self._scaler: Any = None
        self._scale = 1.0
        self._tracker = 0
        self._skipped_since_update = False
        self._rescales_held = False
        self._scaled_ids: set[int] = set()
        self._autocast_stack: list[dict[str, Any]] = []
        self._noted: set[Any] = set()
        self._forward_hook: Any = None
        self._math_samples: dict[int, int] = {}
        self._lost_sample: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._scheduler_steps: dict[int, int] = {}
        self._schedulers: list[Any] = []
        self._module: Any = None
        self._precision = ""
        self._manual = False
        self._active = False
        self._outside: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self._dead_hooks: list[tuple[str, str]] = []
        self._guard_pending: dict[int, Any] = {}  # optimizer -> (finite flag of what it zeroed, version sum then)
        self._applied_steps: dict[int, int] = {}  # optimizer -> steps not skipped (fused steps count as applied)
        self._raw_steps: dict[int, int] = {}  # optimizer index -> steps through the torch optimizer's own step()
        self._versions: list[int] = []  # per optimizer: the sum of its parameters' in-place version counters
        self._sched_candidates: dict[int, tuple] = {}  # scheduler stepped on a skipped step, judged at epoch end
        self._scheduler_batches: dict[int, set[int]] = {}  # batches of this epoch in which each scheduler stepped

    def _failed(self, section: str | None, err: Exception) -> None:
        """The check's own code raised ``err``: stop the recorder (``section=None``) or that rule; warn once."""
        what = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:160]}"
        if section is None:
            if self._off:
                return
            self._off = True
            text = (
                f"PitfallChecks stopped watching this run {self._where()}: its own bookkeeping raised {what}. "
                f"Your training_step, backward calls and steps ran unchanged; there are no findings from here on. "
                f"Please report this message."
            )
            self._unpatch()
        else:
            if section in self._off_rules:
                return
            self._off_rules.add(section)
            text = (
                f"PitfallChecks stopped its [{section}] rule {self._where()}: the rule raised {what}. The other "
                f"sections and your run go on unchanged. Please report this message."
            )
        self.stopped.append(text)
        warnings.warn(text, ChecksStoppedWarning, stacklevel=2)

    def _known(self, section: str, subject: Any) -> bool:
        """Whether this finding is already recorded; if so, count one more sighting (cheap: no message is built)."""
        finding = self._keys.get((section, subject))
        if finding is None:
            return False
        finding.count += 1
        return True

    def _find(self, section: str, subject: Any, message: str, optimizer: int | None = None) -> None:
        """Record a finding (once per section and subject), warn once, or raise when strict."""
        if self._off or section in self._off_rules:
            return
        key = (section, subject)
        if key in self._keys:
            self._keys[key].count += 1
            return
        text = f"[{section}] {message} See the guide, {_link(section)}"
        finding = Finding(section, text, self._batch, self._epoch, optimizer)
        self._keys[key] = finding
        self.findings.append(finding)
        if self.strict:
            raise PitfallError(text, section)
        warnings.warn(text, PitfallWarning, stacklevel=3)

    def _where(self) -> str:
        return "at fit start" if self._batch is None else f"in batch {self._batch} (epoch {self._epoch})"

    def _name(self, index: int) -> str:
        opt = self._opts[index]
        return f"optimizer {index} ({type(opt).__name__})"

    def cost(self) -> dict[str, float]:
        """The check's own time against the step time, measured with ``time.perf_counter`` around its code.

        Returns:
            ``{"check_seconds", "setup_seconds", "step_seconds", "fraction"}``: seconds in its code during the
            batches, seconds at fit start and train end, seconds of the training steps (``step_seconds``:
            each batch's start to the next's, its own time included), and ``check_seconds / step_seconds``.
        """
        fraction = self.check_seconds / self.step_seconds if self.step_seconds else 0.0
        return {
            "check_seconds": self.check_seconds,
            "setup_seconds": self.setup_seconds,
            "step_seconds": self.step_seconds,
            "fraction": fraction,
        }

    # ------------------------------------------------------------------ patching
    def _patch(self, owner: Any, name: str, make: Any) -> None:
        had = name in vars(owner) if not isinstance(owner, type) else True
        old = vars(owner).get(name) if not isinstance(owner, type) else owner.__dict__[name]
        current = getattr(owner, name)
        setattr(owner, name, make(current))
        self._restore.append((owner, name, had, old))

    def _unpatch(self) -> None:
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
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None
        self._active = False
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None

    def _timed(self, start: float, once: bool = False) -> None:
        if once:  # fit start and train end: not part of any step
            self.setup_seconds += _clock() - start
        else:
            self.check_seconds += _clock() - start

    # ------------------------------------------------------------------ Lightning hooks
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._off = False
        self._off_rules = set()
        self.stopped = []
        with self._rec:
            self._fit_start(trainer, pl_module)

    def _fit_start(self, trainer: Any, pl_module: Any) -> None:
        global _ACTIVE
        self._unpatch()
        if _ACTIVE is not None and _ACTIVE is not self:
            # two instances would wrap torch's functions twice and could not restore them in order
            raise PitfallError("only one PitfallChecks can watch a fit at a time; pass a single instance")
        _ACTIVE = self
        self._reset()
        self.findings, self.notes = [], []  # each fit is reported on its own (a reused instance starts empty)
        self.check_seconds = self.setup_seconds = self.step_seconds = 0.0
        start = _clock()
        self._module = pl_module
        plugin = trainer.precision_plugin
        self._precision = str(getattr(plugin, "precision", trainer.precision))
        self._manual = not pl_module.automatic_optimization
        self._active = True
        if not self._manual:
            self._timed(start, once=True)
            return
        self._opts = list(trainer.optimizers)
        names = {id(p): name.split(".")[0] for name, p in pl_module.named_parameters()}
        self._opt_params = [[p for g in opt.param_groups for p in g["params"]] for opt in self._opts]
        self._versions = [sum(p._version for p in params) for params in self._opt_params]
        for i, opt in enumerate(self._opts):
            self._opt_index[id(opt)] = i
            for group in opt.param_groups:
                for p in group["params"]:
                    self._param_opt.setdefault(id(p), i)
                    self._param_module[id(p)] = names.get(id(p), "?")
                    if p.requires_grad:
                        handle = p.register_hook(functools.partial(self._grad_hook, p))
                        self._restore.append(handle.remove)
        scaler = getattr(plugin, "scaler", None)
        if scaler is not None and scaler.is_enabled():
            self._scaler = scaler
            self._rescales_held = isinstance(plugin, HeldGradientScales)
            self._scale = float(scaler.get_scale()) if scaler._scale is not None else float(scaler._init_scale)
            tracker = scaler._get_growth_tracker()
            self._tracker = int(tracker) if not isinstance(tracker, torch.Tensor) else int(tracker.item())
            self._patch(scaler, "update", self._wrap_update)
            self._patch(scaler, "scale", self._wrap_scale)
            if not self._rescales_held:
                self._patch(scaler, "unscale_", self._wrap_unscale)
        for opt in self._opts:
            self._patch(opt, "step", functools.partial(self._wrap_inner_step, opt))
            self._patch(opt, "zero_grad", functools.partial(self._wrap_zero_grad, opt))
        for lopt in getattr(trainer.strategy, "_lightning_optimizers", []):
            self._patch(lopt, "zero_grad", functools.partial(self._wrap_zero_grad, lopt.optimizer))
        self._patch(plugin, "optimizer_step", self._wrap_plugin_step)
        self._patch(plugin, "clip_gradients", self._wrap_plugin_clip)
        self._patch(trainer.strategy, "backward", self._wrap_strategy_backward)
        self._patch(pl_module, "training_step", self._wrap_training_step)
        self._patch(pl_module, "zero_grad", functools.partial(self._wrap_zero_grad, None))
        self._patch(torch.Tensor, "backward", self._wrap_tensor_backward)
        self._patch(torch.autograd, "backward", self._wrap_tensor_backward)
        self._patch(torch.autograd, "grad", self._wrap_autograd_grad)
        self._patch(torch.nn.utils, "clip_grad_norm_", functools.partial(self._wrap_clip, "clip_grad_norm_"))
        self._patch(torch.nn.utils, "clip_grad_value_", functools.partial(self._wrap_clip, "clip_grad_value_"))
        self._patch(torch.autocast, "__enter__", self._wrap_autocast_enter)
        self._patch(torch.autocast, "__exit__", self._wrap_autocast_exit)
        for config in trainer.lr_scheduler_configs:
            self._schedulers.append(config.scheduler)
            self._scheduler_steps[id(config.scheduler)] = 0
            self._patch(config.scheduler, "step", functools.partial(self._wrap_scheduler_step, config.scheduler))
        in_optimizers = {id(p) for opt in self._opts for g in opt.param_groups for p in g["params"]}
        self._outside = [
            (n, p, p.detach().clone()) for n, p in pl_module.named_parameters() if id(p) not in in_optimizers
        ]
        self._dead_hooks = []
        step_owner = _defining_class(type(pl_module), "training_step")
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
                self._dead_hooks.append((hook, owner.__name__))  # decided at train end: did its work happen?
            elif leftover:
                self.notes.append(
                    f"[porting] note: {type(pl_module).__name__} inherits {hook}() from {owner.__name__}; manual "
                    f"optimization never calls it, so training_step must do its work. See the guide, {_link('porting')}"
                )
            else:
                self._find(
                    "porting",
                    hook,
                    f"{type(pl_module).__name__} overrides {hook}(), which Lightning never calls in manual "
                    f"optimization, so its code does not run. Fix: move that code into training_step (clipping: "
                    f"on_before_optimizer_step or self.clip_gradients before opt.step()).",
                )
        self._timed(start, once=True)

    @_hook
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        start = _clock()
        if self._precision in _MIXED:
            half = [
                name
                for name, p in pl_module.named_parameters()
                if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16)
            ]
            if half:
                self._find(
                    "fp16-parameters",
                    "mixed",
                    f"{len(half)} trainable parameter(s) are half precision under {self._precision} "
                    f"({', '.join(half[:3])}{', ...' if len(half) > 3 else ''}: "
                    f"{pl_module.get_parameter(half[0]).dtype}); "
                    f"under 16-mixed GradScaler refuses to unscale fp16 gradients, and any update below half the "
                    f"weight's spacing rounds away. Fix: keep "
                    f"trainable weights in float32 (autocast casts them per op).",
                )
        if self._precision == "16-true":
            for i, opt in enumerate(trainer.optimizers):
                eps = [g["eps"] for g in opt.param_groups if isinstance(g.get("eps"), float)]
                if eps and float(torch.tensor(min(eps), dtype=torch.float16)) == 0.0:
                    self._find(
                        "fp16-parameters",
                        f"eps {i}",
                        f"optimizer {i} ({type(opt).__name__}) has eps={min(eps):g}, which is 0 in float16 (the "
                        f"smallest float16 is 6e-08): under 16-true its update divides by the square root of a "
                        f"second moment that underflows to 0, and the weights become NaN. Fix: eps=1e-4 or larger, "
                        f"or 16-mixed with float32 weights.",
                        optimizer=i,
                    )
        self._timed(start, once=True)

    @_hook
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._sched_candidates:
            with self._rule["schedulers"]:
                self._judge_schedulers()
        if self._batch_start is not None:  # the epoch's last batch: its start to its end
            self.step_seconds += self._batch_end - self._batch_start
            self._batch_start = None

    @_hook
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._epoch = trainer.current_epoch

    @_hook
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._batch = batch_idx
        self._global_batch += 1
        self._batch_backwards = []
        self._skipped_in_batch = set()
        self._stepped_in_batch = set()
        self._scaled_ids = set()
        now = _clock()
        if self._batch_start is not None:  # the previous batch's period: its start to this one's
            self.step_seconds += now - self._batch_start
        self._batch_start = now

    @_hook
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if not self._active or not self._precision.endswith("-true") or self._precision == "32-true":
            return
        start = _clock()
        if (self._global_batch + 1) & self._global_batch == 0:  # batches 0, 1, 3, 7, 15, ...: a sample, not every step
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None and id(p) not in self._lost_sample:
                        self._lost_sample[id(p)] = (p, p.detach().clone(), p.grad.detach() != 0)
        self._timed(start)

    @_hook
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        end = _clock()
        self._batch_end = end
        if self._guard_pending:
            with self._rule["nonfinite-guard"]:
                for owner, (all_finite, version) in self._guard_pending.items():
                    # parameters changed in place after the zero (SAM's second_step): an update outside the
                    # wrapper, named by step-frequencies, not a guard that skipped the step
                    moved = sum(p._version for p in self._opt_params[owner]) != version
                    if not moved and not bool(all_finite):
                        self._flag_guard(owner)
            self._guard_pending = {}
        skipped, self._skipped_in_batch = self._skipped_in_batch, set()  # a scheduler stepped after the batch
        # (ReduceLROnPlateau in on_train_epoch_end) is not charged with this batch's skip
        if self._lost_sample:
            moved = lost = 0
            for p, before, nonzero in self._lost_sample.values():
                moved += int(nonzero.sum())
                lost += int((nonzero & (p.detach() == before)).sum())
            self._lost_sample = {}
            if moved and lost / moved > 0.5 and not (skipped and self._scaler is not None):
                self._find(
                    "fp16-parameters",
                    "true",
                    f"under {self._precision}, {lost} of {moved} weight elements with a non-zero gradient "
                    f"({lost / moved:.0%}) did not change in the optimizer step {self._where()}: the update is "
                    f"smaller than half the spacing of the weight's dtype and rounds away. Fix: train in "
                    f"bf16-mixed/16-mixed with float32 weights (or keep float32 master weights).",
                )
        self._timed(end)

    @_hook
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if not self._manual:
            return
        start = _clock()
        frozen = [n for n, p, before in self._outside if torch.equal(p.detach(), before)]
        for hook, owner in self._dead_hooks:
            if self._outside and len(frozen) == len(self._outside):
                self._find(
                    "porting",
                    hook,
                    f"{type(pl_module).__name__} inherits {hook}() from {owner}, which Lightning never calls in "
                    f"manual optimization, and none of the {len(frozen)} parameter(s) outside every optimizer "
                    f"({', '.join(frozen[:3])}{', ...' if len(frozen) > 3 else ''}) changed during training: the "
                    f"work that hook did (an EMA or teacher update?) never ran. Fix: call it in training_step, "
                    f"after opt.step().",
                )
            else:
                self.notes.append(
                    f"[porting] note: {type(pl_module).__name__} inherits {hook}() from {owner}; manual optimization "
                    f"never calls it, so training_step must do its work. See {_link('porting')}"
                )
        if self._sched_candidates:
            with self._rule["schedulers"]:
                self._judge_schedulers()
        batches = self._global_batch + 1
        for index in range(len(self._opts)):
            guarded = any(f.section == "nonfinite-guard" and f.optimizer in (index, None) for f in self.findings)
            if index in self._last_step_seq or batches <= 0 or index in self._raw_steps:
                continue  # a step through the torch optimizer is already named
            # a guard that skips empty steps (has_gradients) stops GradScaler's AssertionError, and with it
            # the only sign that this optimizer's loss never reaches its parameters. Whether its parameters
            # changed is told by their in-place version counters (no copy of the weights is kept)
            changed = sum(p._version for p in self._opt_params[index]) - self._versions[index]
            if changed:
                with self._rule["step-frequencies"]:
                    self._find(
                        "step-frequencies",
                        f"bypass {index}",
                        self._bypass_message(
                            index,
                            f"was never stepped through opt.step() in {batches} batch(es), yet its parameters were "
                            f"changed in place (their version counters moved by {changed}): something else "
                            f"updated them (SAM's first_step/second_step, a hand-written update)",
                        ),
                        optimizer=index,
                    )
                continue
            if guarded:
                continue  # a non-finite guard says why
            with self._rule["no-gradient-step"]:
                self._find(
                    "no-gradient-step",
                    f"never stepped {index}",
                    f"{self._name(index)} was never stepped in {batches} batch(es) and its parameters did not "
                    f"change (their version counters did not move). If a guard skipped every step (an optimizer "
                    f"without gradients), the loss of its windows never reaches that model: after manual_backward, "
                    f"print "
                    f"[n for n, p in model.named_parameters() if p.grad is None] to see which parameters it "
                    f"misses, and follow that loss's graph back (loss.grad_fn) to the detach or no_grad.",
                    optimizer=index,
                )
        for index, scheduler in enumerate(self._schedulers):
            owner = self._opt_index.get(id(getattr(scheduler, "optimizer", None)))
            if owner is not None and not self._applied_steps.get(owner):
                continue  # every step of its optimizer was skipped: a skip-aware scheduler rightly never stepped
            if self._scheduler_steps.get(id(scheduler)) == 0:
                self._find(
                    "porting",
                    f"scheduler {index}",
                    f"scheduler {index} ({type(scheduler).__name__}) from configure_optimizers was never stepped: "
                    f"in manual optimization Lightning steps no scheduler ('interval' and 'frequency' are "
                    f"ignored). Fix: call sch.step() yourself (self.lr_schedulers()), per batch or in "
                    f"on_train_epoch_end.",
                )
        self._timed(start, once=True)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._unpatch()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._unpatch()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._unpatch()

    # ------------------------------------------------------------------ gradients
    def _grad_hook(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        if self._off or (self._in_grad and not self._in_backward):
            return  # torch.autograd.grad: nothing is accumulated into .grad
        with self._rec:
            start = _clock()
            state = self._params.get(id(param))
            if state is None or param.grad is None:
                state = self._params[id(param)] = _Param()
            state.backwards.add(self._backward_id)
            state.scales.add(self._scale)
            self.check_seconds += _clock() - start

    def _reached(self, backwards: set[int]) -> list[str]:
        """The top-level modules whose parameters hold gradients from these backward calls (for messages)."""
        return sorted(
            {self._param_module.get(pid, "?") for pid, st in self._params.items() if st.backwards & backwards}
        )

    def _start_backward(self) -> None:
        self._backward_id += 1
        self._backwards[self._backward_id] = _Backward(
            self._seq, self._batch if self._batch is not None else -1, self._epoch
        )
        self._batch_backwards.append(self._backward_id)
        if len(self._backwards) > 256:  # keep the recent ones only
            for key in sorted(self._backwards)[:128]:
                del self._backwards[key]

    def _wrap_strategy_backward(self, original: Any) -> Any:
        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if self._off:
                return original(*args, **kwargs)
            with self._rec:
                start = _clock()
                self._start_backward()
                self._timed(start)
            self._in_backward += 1
            self._in_lightning += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._in_backward -= 1
                self._in_lightning -= 1

        return backward

    def _wrap_tensor_backward(self, original: Any) -> Any:
        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if self._off or self._in_backward:  # manual_backward (or a nested call): Lightning's own
                return original(*args, **kwargs)
            own = -1
            with self._rec:
                start = _clock()
                self._start_backward()
                own = self._backward_id
                self._timed(start)
            self._in_backward += 1
            try:
                result = original(*args, **kwargs)
            finally:
                self._in_backward -= 1
            with self._rule["backward-flags"]:
                self._flag_backward(own)
            return result

        return backward

    def _flag_backward(self, own: int) -> None:
        """The ``backward-flags`` rule, after a ``Tensor.backward`` that was not Lightning's."""
        # only a backward that reached the trainer's optimizers' parameters (not an unrelated model's):
        # reported after it ran and before the opt.step() that fails under 16-mixed
        reached = (
            self._reached({own}) if self._in_step_fn and ("backward-flags", "loss.backward") not in self._keys else []
        )
        if reached and not self._known("backward-flags", "loss.backward"):
            self._find(
                "backward-flags",
                "loss.backward",
                f"loss.backward() was called {self._where()} instead of self.manual_backward(loss), and its "
                f"gradients reached {', '.join(reached)}: "
                + (
                    "under 16-mixed the loss is not multiplied by the loss scale, so GradScaler then "
                    "unscales gradients that were never scaled (or fails with 'Attempted unscale_ but "
                    "_scale is None')"
                    if self._scaler is not None
                    else "Lightning's precision and strategy hooks are bypassed (it works here by luck: "
                    "under 16-mixed it breaks)"
                )
                + ". Fix: self.manual_backward(loss).",
            )

    def _wrap_autograd_grad(self, original: Any) -> Any:
        @functools.wraps(original)
        def grad(outputs: Any, *args: Any, **kwargs: Any) -> Any:
            if self._off:
                return original(outputs, *args, **kwargs)
            with self._rule["gradient-penalty"]:
                create_graph = kwargs.get("create_graph", args[3] if len(args) > 3 else False)
                if self._in_step_fn and self._scaler is not None and create_graph and not self._in_lightning:
                    outs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
                    if not any(id(o) in self._scaled_ids for o in outs) and not self._known(
                        "gradient-penalty", "autograd.grad"
                    ):
                        self._penalty(original, outs, args, kwargs)
            self._in_grad += 1
            try:
                return original(outputs, *args, **kwargs)
            finally:
                self._in_grad -= 1

        return grad

    def _penalty(self, original: Any, outs: list[torch.Tensor], args: tuple, kwargs: dict) -> None:
        """The ``gradient-penalty`` rule: measure, once, what the missing loss scale costs this gradient.

        The same gradient is taken twice more (``retain_graph=True``, nothing accumulates into ``.grad``): of the
        outputs as given and of the outputs times the loss scale. An element that is exactly 0 in the first and
        not in the second underflowed in fp16. A finding when at least 1 % of the elements did; otherwise a note
        with the numbers (exact zeros that are zero either way come from the function itself: ReLU, masks).
        """
        start = _clock()
        inputs = kwargs.get("inputs", args[0] if args else None)
        given = kwargs.get("grad_outputs", args[1] if len(args) > 1 else None)
        ins = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
        if given is None:
            given = [None] * len(outs)
        elif isinstance(given, torch.Tensor):
            given = [given]
        plain_out = [torch.ones_like(o) if g is None else g for o, g in zip(outs, given)]
        scale = self._scale
        self._in_grad += 1
        try:
            plain = original(outs, ins, grad_outputs=plain_out, retain_graph=True, allow_unused=True)
            scaled = original(
                outs, ins, grad_outputs=[g * scale for g in plain_out], retain_graph=True, allow_unused=True
            )
        finally:
            self._in_grad -= 1
        total = zeros = under = 0
        for p, q in zip(plain, scaled):
            if p is None or q is None:
                continue
            total += p.numel()
            zero = p == 0
            zeros += int(zero.sum())
            under += int((zero & (q != 0)).sum())
        self._timed(start)
        if not total:
            return
        numbers = (
            f"of its {total} gradient element(s), {under} ({under / total:.1%}) are 0 as computed and non-zero when "
            f"the same gradient is taken of the output times the loss scale {_fmt(scale)} (fp16 underflow); "
            f"{zeros} ({zeros / total:.1%}) are 0 as computed"
        )
        if under / total >= 0.01:
            self._find(
                "gradient-penalty",
                "autograd.grad",
                f"torch.autograd.grad(..., create_graph=True) {self._where()} differentiates an output that was not "
                f"multiplied by the loss scale: {numbers}. Fix: torch.autograd.grad(scaler.scale(out), ...), then "
                f"divide by the scale.",
            )
        else:
            self._keys[("gradient-penalty", "autograd.grad")] = Finding("gradient-penalty", "note")  # measured once
            self.notes.append(
                f"[gradient-penalty] note: torch.autograd.grad(..., create_graph=True) {self._where()} on an output "
                f"not multiplied by the loss scale: {numbers}; under 1 % underflowed, not a finding. "
                f"See {_link('gradient-penalty')}"
            )

    def _wrap_scale(self, original: Any) -> Any:
        @functools.wraps(original)
        def scale(outputs: Any) -> Any:
            result = original(outputs)
            if not self._off and isinstance(result, torch.Tensor):
                self._scaled_ids.add(id(result))
            return result

        return scale

    def _wrap_unscale(self, original: Any) -> Any:
        @functools.wraps(original)
        def unscale_(optimizer: Any) -> Any:
            if self._off:
                return original(optimizer)
            with self._rule["clipping"]:
                self._flag_unscale(optimizer)
            return original(optimizer)

        return unscale_

    def _flag_unscale(self, optimizer: Any) -> None:
        if self._in_step_fn and not self._in_lightning:
            index = self._opt_index.get(id(getattr(optimizer, "_optimizer", optimizer)))
            self._find(
                "clipping",
                index,
                f"scaler.unscale_() was called {self._where()} from training_step: Lightning's MixedPrecision "
                f"unscales again inside opt.step(), and GradScaler raises 'unscale_() has already been called on "
                f"this optimizer since the last update()'. Fix: clip inside on_before_optimizer_step (after "
                f"Lightning's unscale_), or use ManualMixedPrecision (Lightning 2.6).",
                optimizer=index,
            )

    def _wrap_update(self, original: Any) -> Any:
        @functools.wraps(original)
        def update(new_scale: Any = None) -> Any:
            result = original(new_scale)
            if not self._off:
                with self._rec:
                    self._updated(new_scale)
            return result

        return update

    def _updated(self, new_scale: Any) -> None:
        start = _clock()
        scaler = self._scaler
        if new_scale is not None or scaler._scale is None or scaler._scale.device.type == "cpu":
            self._scale = float(scaler.get_scale())  # a CPU tensor: reading it costs no synchronisation
        elif self._skipped_since_update:
            self._scale *= scaler.get_backoff_factor()
            self._tracker = 0
        else:  # follow GradScaler's growth rule (torch/amp/grad_scaler.py, _amp_update_scale_)
            self._tracker += 1
            if self._tracker == scaler.get_growth_interval():
                self._scale *= scaler.get_growth_factor()
                self._tracker = 0
        self._skipped_since_update = False
        self._timed(start)

    def _wrap_zero_grad(self, optimizer: Any, original: Any) -> Any:
        @functools.wraps(original)
        def zero_grad(*args: Any, **kwargs: Any) -> Any:
            if not self._off:
                with self._rec:
                    start = _clock()
                    index = None if optimizer is None else self._opt_index.get(id(optimizer))
                    params = list(self._module.parameters()) if index is None else self._opt_params[index]
                    self._discard(params, index)
                    self._timed(start)
            return original(*args, **kwargs)

        return zero_grad

    def _flag_guard(self, owner: Any) -> None:
        self._find(
            "nonfinite-guard",
            owner,
            f"{self._name(owner)}: gradients that are not finite were zeroed {self._where()} without an "
            f"opt.step() on them (loss scale {_fmt(self._scale)}): a guard that skips the step also "
            f"skips the only call that lowers the scale, so it stays too high. Fix: always call "
            f"opt.step() and ask afterwards whether GradScaler skipped it (mpguide.steps.step_skip_aware).",
            optimizer=owner,
        )

    @staticmethod
    def _all_finite(params: list[torch.Tensor]) -> torch.Tensor:
        """A 0-d bool tensor, not read: inf/NaN anywhere in these gradients makes their norm non-finite."""
        return torch.stack(torch._foreach_norm([p.grad for p in params])).isfinite().all()

    def _discard(self, params: list[torch.Tensor], index: int | None) -> None:
        """Gradients are about to be zeroed: were they stepped on, or thrown away?"""
        thrown: list[torch.Tensor] = []
        thrown_backwards: set[int] = set()
        earlier: set[int] = set()  # of those, backwards of an earlier batch (a window's micro-batches)
        here = (self._epoch, self._batch)
        for p in params:
            state = self._params.pop(id(p), None)
            if state is None or p.grad is None:
                continue
            owner = self._param_opt.get(id(p))
            fresh = set()
            for b in state.backwards - self._consumed:
                record = self._backwards.get(b)
                # a backward after which another optimizer stepped was meant for that one (a GAN's G loss)
                if record is not None and any(seq > record.seq for i, seq in self._last_step_seq.items() if i != owner):
                    continue
                fresh.add(b)
                if record is not None and (record.epoch, record.batch) != here:
                    earlier.add(b)
            if fresh:
                thrown.append(p)
                thrown_backwards |= fresh
        if not thrown:
            return
        owner = index if index is not None else self._param_opt.get(id(thrown[0]))
        if ("accumulation", owner) in self._keys or ("nonfinite-guard", owner) in self._keys:
            self._consumed |= thrown_backwards  # already reported: no second device read
            self._keys.get(("accumulation", owner), self._keys.get(("nonfinite-guard", owner))).count += 1
            return
        if self._scaler is None and not earlier:  # nothing to report: no device read
            self._consumed |= thrown_backwards
            return
        if not earlier:
            # zeroed in the batch that made them: a finding only if this optimizer takes no step in this batch
            # (gradient surgery reads them, writes its own and steps: GradScaler sees the inf). The first such
            # set of the batch is kept as a flag, read at the batch's end only if no step came: no device read
            if self._scaler is not None and owner is not None and owner not in self._guard_pending:
                version = sum(p._version for p in self._opt_params[owner])
                self._guard_pending[owner] = (self._all_finite(thrown), version)
            self._consumed |= thrown_backwards
            return
        all_finite = self._all_finite(thrown)
        if not bool(all_finite):
            if self._scaler is not None:
                with self._rule["nonfinite-guard"]:
                    self._flag_guard(owner)
            self._consumed |= thrown_backwards
            return
        if owner is not None and earlier:
            first = min(self._backwards[b].batch for b in earlier if b in self._backwards)
            pending = self._pending_accumulation.get(owner, (first, 0))
            self._pending_accumulation[owner] = (pending[0], pending[1] + len(earlier))
        self._consumed |= thrown_backwards

    # ------------------------------------------------------------------ steps
    def _wrap_training_step(self, original: Any) -> Any:
        # functools.wraps keeps the reader's signature visible: Lightning's is_param_in_hook_signature follows
        # __wrapped__ (since 2.1, utilities/signature_utils.py), so it passes batch_idx, dataloader_idx or a
        # dataloader_iter exactly as it would to the reader's own method
        @functools.wraps(original)
        def training_step(*args: Any, **kwargs: Any) -> Any:
            if self._off:
                return original(*args, **kwargs)
            with self._rec:
                self._enter_step()
            try:
                return original(*args, **kwargs)
            finally:
                if not self._off:
                    with self._rec:
                        self._leave_step()

        return training_step

    def _enter_step(self) -> None:
        self._in_step_fn += 1
        # Lightning's own autocast region is open around training_step: when it caches casts (Lightning <= 2.5's
        # MixedPrecision opened it with torch's default cache on; 2.6 turns it off, plugins/precision/amp.py),
        # a forward after an opt.step() inside this training_step reuses casts of the old weights
        device = self._autocast_device()
        if device is not None and torch.is_autocast_cache_enabled() and self._in_step_fn == 1:
            self._autocast_stack.append(
                {"region": None, "caching": True, "stepped": False, "dtype": None, "enabled": False, "own": False}
            )

    def _leave_step(self) -> None:
        self._in_step_fn -= 1
        if self._autocast_stack and self._autocast_stack[0]["region"] is None and self._in_step_fn == 0:
            self._autocast_stack.pop(0)
            if not any(e["stepped"] for e in self._autocast_stack) and self._forward_hook is not None:
                self._forward_hook.remove()
                self._forward_hook = None

    def _wrap_plugin_step(self, original: Any) -> Any:
        @functools.wraps(original)
        def optimizer_step(optimizer: Any, model: Any, closure: Any, **kwargs: Any) -> Any:
            index = None if self._off else self._opt_index.get(id(optimizer))
            if index is None:
                return original(optimizer, model, closure, **kwargs)

            def checked_closure() -> Any:
                result = closure()
                if not self._off:
                    with self._rec:
                        start = _clock()
                        self._before_step(index, optimizer)
                        self._timed(start)
                return result

            self._applied = None
            self._in_lightning += 1
            try:
                return original(optimizer, model, checked_closure, **kwargs)
            finally:
                self._in_lightning -= 1
                if not self._off:
                    with self._rec:
                        start = _clock()
                        self._after_step(index, optimizer)
                        self._timed(start)

        return optimizer_step

    def _before_step(self, index: int, optimizer: Any) -> None:
        name = _Lazy(lambda: self._name(index))  # built only when a message is
        if not self._in_step_fn and self._batch is not None and not self._known("step-frequencies", index):
            with self._rule["step-frequencies"]:
                self._find(
                    "step-frequencies",
                    index,
                    f"{name} stepped {self._where()} outside training_step (in a hook): trainer.global_step "
                    f"and max_steps do not count steps taken there. Fix: call opt.step() inside training_step.",
                    optimizer=index,
                )
        params = self._opt_params[index]
        with_grad = [p for p in params if p.grad is not None]
        if not with_grad:
            if not self._known("no-gradient-step", index):
                with self._rule["no-gradient-step"]:
                    self._flag_no_gradient(index, name, params)
            return
        pending = self._pending_accumulation.pop(index, None)
        if pending is not None:
            with self._rule["accumulation"]:
                self._find(
                    "accumulation",
                    index,
                    f"{name} steps {self._where()}, but {pending[1]} backward(s) of earlier batches in its window "
                    f"(from batch {pending[0]} on) were zeroed before any step used them: only the micro-batches "
                    f"since the last zero_grad count. Fix: zero_grad only right after the step (once per window).",
                    optimizer=index,
                )
        backs: set[int] = set()
        scales: set[float] = set()
        for p in with_grad:
            state = self._params.get(id(p))
            if state is not None:
                backs |= state.backwards
                scales |= state.scales
        fresh = backs - self._consumed
        self._consumed |= backs
        if fresh and self._epoch > 0 and not self._known("accumulation", f"epoch tail {index}"):
            with self._rule["accumulation"]:
                tail = sorted(
                    (r.epoch, r.batch)
                    for b in fresh
                    if (r := self._backwards.get(b)) is not None and r.epoch < self._epoch
                )
                if tail:
                    self._find(
                        "accumulation",
                        f"epoch tail {index}",
                        f"{name} steps {self._where()} on gradients that include {len(tail)} backward(s) of epoch "
                        f"{tail[0][0]} (from its batch {tail[0][1]} on): that epoch ended inside a window, and its "
                        f"last micro-batches were carried into this epoch's first window. Fix: also step at the "
                        f"epoch's last batch (if (batch_idx + 1) % N == 0 or self.trainer.is_last_batch).",
                        optimizer=index,
                    )
        if (
            self._scaler is not None
            and not self._rescales_held
            and scales - {self._scale}
            and not self._known("scale-changes", index)
        ):
            with self._rule["scale-changes"]:
                old = sorted(scales - {self._scale})
                self._find(
                    "scale-changes",
                    index,
                    f"{name} unscales {self._where()} with loss scale {_fmt(self._scale)} gradients produced at "
                    f"{', '.join(_fmt(s) for s in old)}: Lightning's MixedPrecision updated the scale in another "
                    f"opt.step() in between, so this update is {_fmt(max(old) / self._scale)}x what it should "
                    f"be. Fix: mpguide.precision.ManualMixedPrecision (one update per training_step), or one "
                    f"optimizer per backward, stepped before the next optimizer's step.",
                    optimizer=index,
                )
        if self._scaler is not None and getattr(optimizer, "_step_supports_amp_scaling", False):
            self._applied = None  # a fused step skips inside its kernel: not observable without a sync
        else:
            self._applied = False

    def _flag_no_gradient(self, index: int, name: Any, params: list[torch.Tensor]) -> None:
        reached = self._reached(set(self._batch_backwards))
        self._find(
            "no-gradient-step",
            index,
            f"{name} stepped {self._where()} with no gradient on any of its {len(params)} parameter(s); "
            + (
                f"the {len(self._batch_backwards)} backward call(s) of this batch reached only {', '.join(reached)}"
                if reached
                else "no backward of this batch reached any trainer optimizer's parameters"
            )
            + ". In fp32/bf16 the step silently does nothing; under 16-mixed GradScaler raises 'No inf "
            "checks were recorded for this optimizer'. Fix: step only optimizers whose loss reached their "
            "parameters in this batch (a detached tensor, the wrong toggle, zero_grad between backward "
            "and step).",
            optimizer=index,
        )

    def _after_step(self, index: int, optimizer: Any) -> None:
        self._guard_pending.pop(index, None)
        if self._scaler is None or self._applied is not False:  # without a scaler nothing skips a step
            self._applied_steps[index] = self._applied_steps.get(index, 0) + 1
        self._seq += 1
        self._last_step_seq[index] = self._seq
        self._stepped_in_batch.add(index)
        if self._scaler is not None and self._applied is False:
            self._skipped_in_batch.add(index)
            self._skipped_since_update = True
        self._applied = None
        if self._autocast_stack:
            self._stepped_in_caching_region(self._opt_params[index])

    def _consume(self, index: int) -> None:
        """The gradients on this optimizer's parameters were used by a step: not thrown away by a later zero_grad."""
        for p in self._opt_params[index]:
            state = self._params.get(id(p))
            if state is not None:
                self._consumed |= state.backwards

    def _bypass_message(self, index: int, how: str) -> str:
        scaled = (
            f"; under {self._precision} GradScaler neither unscales these gradients nor checks them for inf/NaN, so "
            f"the update is applied to gradients still multiplied by the loss scale ({_fmt(self._scale)} at this "
            f"point)"
            if self._scaler is not None
            else ""
        )
        return (
            f"{self._name(index)} {how}, outside Lightning's optimizer wrapper (the LightningOptimizer that "
            f"self.optimizers() returns): trainer.global_step does not advance, so max_steps never stops training"
            f"{scaled}. Fix: call opt.step() (opt.step(closure=...) for LBFGS- or SAM-like optimizers) on the "
            f"LightningOptimizer."
        )

    def _wrap_inner_step(self, optimizer: Any, original: Any) -> Any:
        index = self._opt_index[id(optimizer)]

        # functools.wraps keeps the marks others left on the step (torch's LR schedulers mark theirs
        # ``_wrapped_by_lr_sched``, torch/optim/lr_scheduler.py, and warn when the mark is gone)
        @functools.wraps(original)
        def step(*args: Any, **kwargs: Any) -> Any:
            if self._off:
                return original(*args, **kwargs)
            mode = None
            raw = False
            with self._rec:
                start = _clock()
                if self._applied is False:
                    self._applied = True  # GradScaler calls the optimizer's step only for finite gradients
                if not self._in_lightning and self._batch is not None:
                    self._raw_steps[index] = self._raw_steps.get(index, 0) + 1
                    raw = True
                    self._consume(index)
                    if not self._known("step-frequencies", f"bypass {index}"):
                        with self._rule["step-frequencies"]:
                            self._find(
                                "step-frequencies",
                                f"bypass {index}",
                                self._bypass_message(
                                    index, f"stepped {self._where()} through the torch optimizer's own step()"
                                ),
                                optimizer=index,
                            )
                device = self._autocast_device() if self._math_samples.get(index, 0) < 3 else None
                if device is not None and "optimizer-math" not in self._off_rules:
                    self._math_samples[index] = self._math_samples.get(index, 0) + 1
                    mode = _MatrixCalls(torch.get_autocast_dtype(device))
                self._timed(start)
            if mode is None:
                result = original(*args, **kwargs)
            else:
                with mode:
                    result = original(*args, **kwargs)
            if raw and not self._off:
                with self._rec:
                    self._consume(index)  # a closure's backward inside that step was used by it too
            if mode is None:
                return result
            if mode.seen:
                with self._rule["optimizer-math"]:
                    self._find(
                        "optimizer-math",
                        index,
                        f"{self._name(index)}'s step runs under {device} autocast {self._where()} and calls "
                        f"{', '.join(sorted(set(mode.seen)))} with gradient recording off (the update's own math, "
                        f"not a closure's forward), which autocast recasts to "
                        f"{torch.get_autocast_dtype(device)}: its matrix math changes precision, unlike "
                        f"automatic optimization. Fix: mpguide.precision.ManualMixedPrecision, or wrap opt.step() "
                        f"in torch.autocast(device_type, enabled=False).",
                        optimizer=index,
                    )
            return result

        return step

    def _autocast_device(self) -> str | None:
        for device in ("cuda", "cpu"):
            try:
                if torch.is_autocast_enabled(device):
                    return device
            except (TypeError, RuntimeError):
                return None
        return None

    def _wrap_scheduler_step(self, scheduler: Any, original: Any) -> Any:
        @functools.wraps(original)
        def step(*args: Any, **kwargs: Any) -> Any:
            if self._off:
                return original(*args, **kwargs)
            skipped = False
            before: list[float] = []
            index = None
            with self._rec:
                start = _clock()
                self._scheduler_steps[id(scheduler)] = self._scheduler_steps.get(id(scheduler), 0) + 1
                index = self._opt_index.get(id(getattr(scheduler, "optimizer", None)))
                if self._batch is not None:
                    self._scheduler_batches.setdefault(id(scheduler), set()).add(self._batch)
                skipped = index is not None and index in self._skipped_in_batch and not self._known("schedulers", index)
                before = [g["lr"] for g in scheduler.optimizer.param_groups] if skipped else []
                self._timed(start)
            result = original(*args, **kwargs)
            if skipped and not self._off:
                with self._rule["schedulers"]:
                    after = [g["lr"] for g in scheduler.optimizer.param_groups]
                    self._sched_candidates.setdefault(
                        id(scheduler), (scheduler, index, self._batch, before[0], after[0])
                    )
            return result

        return step

    def _judge_schedulers(self) -> None:
        """The ``schedulers`` rule, at each epoch's end: a scheduler stepped in a batch whose step GradScaler skipped
        is a finding when it steps per batch (in two or more batches of that epoch). One stepped once an epoch (at
        ``is_last_batch``, or after the batches as ``ReduceLROnPlateau`` in ``on_train_epoch_end``) follows the
        epoch count, and a skipped step does not shift it: skipping its step would drop the epoch's decay."""
        candidates, self._sched_candidates = self._sched_candidates, {}
        batches, self._scheduler_batches = self._scheduler_batches, {}
        for key, (scheduler, index, batch, before, after) in candidates.items():
            if len(batches.get(key, ())) < 2 or self._known("schedulers", index):
                continue
            finding_batch, self._batch = self._batch, batch
            try:
                self._find(
                    "schedulers",
                    index,
                    f"{type(scheduler).__name__}, stepped in {len(batches[key])} batches of epoch {self._epoch}, "
                    f"stepped {self._where()} although GradScaler skipped {self._name(index)}'s step (inf/NaN "
                    f"gradients): the learning rate moved from {_fmt(before)} to {_fmt(after)} with no update applied. "
                    f"Fix: step a per-step scheduler only after an applied step (mpguide.steps.step_skip_aware).",
                    optimizer=index,
                )
            finally:
                self._batch = finding_batch

    # ------------------------------------------------------------------ clipping
    def _owners(self, parameters: Any) -> tuple[list[torch.Tensor], set[int]]:
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        owners = {self._param_opt[id(p)] for p in params if id(p) in self._param_opt}
        return params, owners

    def _wrap_clip(self, name: str, original: Any) -> Any:
        @functools.wraps(original)
        def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            if self._off:
                return original(parameters, *args, **kwargs)
            params = parameters
            scaled: list[tuple[int, bool]] = []
            with self._rule["clipping"]:
                params, scaled = self._scaled_owners(parameters)
            result = original(params, *args, **kwargs)
            if scaled:
                with self._rule["clipping"]:
                    self._flag_clip(name, scaled, result, args, kwargs)
            return result

        return clip

    def _scaled_owners(self, parameters: Any) -> tuple[Any, list[tuple[int, bool]]]:
        """The optimizers whose gradients a clip is about to cut while still scaled (and whether fused)."""
        start = _clock()
        params, owners = self._owners(parameters)
        scaled = []
        if self._scaler is not None and self._batch is not None:
            from torch.amp.grad_scaler import OptState

            for i in sorted(owners):
                opt = self._opts[i]
                fused = getattr(opt, "_step_supports_amp_scaling", False)
                state = self._scaler._per_optimizer_states.get(id(opt))
                stage = OptState.READY if state is None else state["stage"]
                if fused or stage is OptState.READY:
                    scaled.append((i, fused))
        if scaled and self._known("clipping", scaled[0][0]):
            scaled = []  # seen before: no numbers to read again (reading the norm would synchronise)
        self._timed(start)
        return params, scaled

    def _flag_clip(self, name: str, scaled: list, result: Any, args: tuple, kwargs: dict) -> None:
        start = _clock()
        i, fused = scaled[0]
        limit = args[0] if args else kwargs.get("max_norm", kwargs.get("clip_value"))
        if name == "clip_grad_norm_" and isinstance(result, torch.Tensor):
            numbers = _clip_numbers(float(result), limit, self._scale)
        else:
            numbers = f"the values it clipped to {limit} are {_fmt(self._scale)}x the true ones"
        self._find(
            "clipping",
            i,
            f"{name} {self._where()} clipped {self._name(i)}'s gradients while they were still multiplied "
            f"by the loss scale {_fmt(self._scale)}"
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
            optimizer=i,
        )
        self._timed(start)

    def _wrap_plugin_clip(self, original: Any) -> Any:
        @functools.wraps(original)
        def clip_gradients(optimizer: Any, clip_val: Any = 0.0, *args: Any, **kwargs: Any) -> Any:
            if self._off:
                return original(optimizer, clip_val, *args, **kwargs)
            inner = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer wraps the torch one
            index = self._opt_index.get(id(inner))
            fused = getattr(inner, "_step_supports_amp_scaling", False)
            self._in_lightning += 1
            try:
                return original(optimizer, clip_val, *args, **kwargs)
            except RuntimeError as err:
                if fused and index is not None and clip_val and "clipping" in str(err):
                    with self._rule["clipping"]:
                        self._find(
                            "clipping",
                            index,
                            f"self.clip_gradients {self._where()} on {self._name(index)}, a fused optimizer, under "
                            f"{self._precision}: Lightning refuses it ({str(err).splitlines()[0][:120]}). Fix: "
                            f"fused=False, or no clipping.",
                            optimizer=index,
                        )
                raise
            finally:
                self._in_lightning -= 1

        return clip_gradients

    # ------------------------------------------------------------------ autocast
    def _wrap_autocast_enter(self, original: Any) -> Any:
        @functools.wraps(original)
        def enter(region: Any) -> Any:
            if self._off or not self._in_step_fn or self._in_lightning:
                return original(region)
            with self._rec:
                self._autocast_stack.append(
                    {
                        "region": region,
                        "caching": bool(getattr(region, "_cache_enabled", False)) and bool(region._enabled),
                        "stepped": False,
                        "dtype": getattr(region, "fast_dtype", None),
                        "enabled": bool(getattr(region, "_enabled", False)),
                    }
                )
            return original(region)

        return enter

    def _wrap_autocast_exit(self, original: Any) -> Any:
        @functools.wraps(original)
        def exit_(region: Any, *args: Any) -> Any:
            if self._off or not self._autocast_stack or self._autocast_stack[-1]["region"] is not region:
                return original(region, *args)
            with self._rec:
                entry = self._autocast_stack.pop()
                if entry["enabled"] and not entry.get("flagged") and self._precision in _MIXED:
                    if entry["dtype"] not in self._noted:
                        self._noted.add(entry["dtype"])
                        self.notes.append(
                            f"[autocast-cache] note: an own torch.autocast({entry['dtype']}) inside training_step "
                            f"{self._where()} repeats the autocast Lightning already opens around training_step "
                            f"under {self._precision}; it is redundant (not a finding). See {_link('autocast-cache')}"
                        )
                if not any(e["stepped"] for e in self._autocast_stack) and self._forward_hook is not None:
                    self._forward_hook.remove()
                    self._forward_hook = None
            return original(region, *args)

        return exit_

    def _stepped_in_caching_region(self, params: Any) -> None:
        open_caching = [e for e in self._autocast_stack if e["caching"]]
        if not open_caching:
            return
        stepped = {id(p) for p in params}
        for entry in open_caching:
            entry["stepped"] = True
            entry.setdefault("stepped_params", set()).update(stepped)
        if self._forward_hook is None:
            self._forward_hook = torch.nn.modules.module.register_module_forward_pre_hook(self._forward_after_step)

    def _forward_after_step(self, module: Any, inputs: Any) -> None:
        if self._off:
            return
        with self._rule["autocast-cache"]:
            self._flag_stale_forward(module)

    def _flag_stale_forward(self, module: Any) -> None:
        if self._in_lightning or not any(e["stepped"] for e in self._autocast_stack):
            return
        # only a module whose own weights were stepped in a caching region reads stale casts: a forward through
        # another model after this step (a GAN's discriminator after the generator's step) casts weights that
        # did not change
        stepped = set().union(*(e.get("stepped_params", ()) for e in self._autocast_stack if e["stepped"]))
        if not any(id(p) in stepped for p in module.parameters(recurse=False)):
            return
        if self._known("autocast-cache", "forward after step"):
            return
        for entry in self._autocast_stack:
            entry["flagged"] = True
        own = any(e["stepped"] and e["region"] is not None for e in self._autocast_stack)
        self._find(
            "autocast-cache",
            "forward after step",
            f"a forward through {type(module).__name__} {self._where()} runs after an opt.step() inside "
            + (
                "an own torch.autocast with its cache on: the casts of the weights made before the step are reused, "
                "so this forward sees the old weights. Fix: close the own autocast before opt.step(), or "
                "torch.autocast(..., cache_enabled=False) (Lightning's own region already runs the whole "
                "training_step)."
                if own
                else "the autocast region the precision plugin opens around training_step, and that region caches "
                "casts (torch.is_autocast_cache_enabled() is True in it; Lightning <= 2.5 opened it so): the casts "
                "of the weights made before the step are reused, so this forward sees the old weights. Fix: "
                "Lightning 2.6 or later (its region does not cache), or one forward per training_step before the "
                "step, or mpguide.precision.ManualMixedPrecision."
            ),
        )
