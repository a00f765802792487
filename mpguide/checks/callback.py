"""The :class:`PitfallChecks` callback: it installs the wrappers for a fit (:mod:`mpguide.checks.wrappers`), feeds
the recorder (:mod:`mpguide.checks.recorder`), calls the rules (:mod:`mpguide.checks.rules`) and files, warns
or raises their findings. What it finds and what it cannot see: the package docstring (``help(mpguide.checks)``).
"""

from __future__ import annotations

import functools
import warnings
from time import perf_counter as _clock
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from .._common import HeldGradientScales
from .._sections import SECTIONS
from . import rules, wrappers
from .findings import CURRENT, ChecksStoppedWarning, Finding, Found, PitfallError, PitfallWarning, link
from .record import StepRecord
from .recorder import Recorder

_ACTIVE: Any = None  # the instance whose patches are in place (one at a time)


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

    See the package docstring (``help(mpguide.checks)``) for what each section's check sees, how, and
    what it cannot see.

    Args:
        strict: raise :class:`PitfallError` at the first finding instead of warning.

    Attributes:
        findings: every :class:`Finding`, in the order seen (one per section and subject; ``count``
            says how often).
        notes: remarks that are not pitfalls (an own autocast that only repeats Lightning's), as strings.
        stopped: the text of each :class:`ChecksStoppedWarning` of the last fit.
        recorder: the bookkeeping of the last fit (``mpguide.checks.recorder.Recorder``); its ``rec`` is the
            plain record every rule reads (``mpguide.checks.record.FitRecord``).
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
        self.check_seconds = self.setup_seconds = self.step_seconds = 0.0
        self.stopped: list[str] = []
        self.patches = wrappers.Patches()
        self._off = False  # the recorder failed: nothing is watched until the next fit
        self._off_rules: set[str] = set()  # sections whose rule failed in this fit
        self._rec = _Guard(self, None)
        self._rule = {section: _Guard(self, section) for section in SECTIONS}
        self._active = False
        self._reset()

    # ------------------------------------------------------------------ filing what the rules return
    def _reset(self) -> None:
        self.recorder = Recorder()
        self._batch_start: float | None = None
        self._batch_end = 0.0

    def _failed(self, section: str | None, err: Exception) -> None:
        """The check's own code raised ``err``: stop the recorder (``section=None``) or that rule; warn once."""
        what = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:160]}"
        where = self.recorder.rec.where()
        if section is None:
            if self._off:
                return
            self._off = True
            text = (
                f"PitfallChecks stopped watching this run {where}: its own bookkeeping raised {what}. "
                f"Your training_step, backward calls and steps ran unchanged; there are no findings from here on. "
                f"Please report this message."
            )
            self._unpatch()
        else:
            if section in self._off_rules:
                return
            self._off_rules.add(section)
            text = (
                f"PitfallChecks stopped its [{section}] rule {where}: the rule raised {what}. The other "
                f"sections and your run go on unchanged. Please report this message."
            )
        self.stopped.append(text)
        warnings.warn(text, ChecksStoppedWarning, stacklevel=2)

    def _known(self, section: str, subject: Any) -> bool:
        """Whether this finding is already recorded; if so, count one more sighting (cheap: no message is built)."""
        finding = self.recorder.rec.reported.get((section, subject))
        if finding is None:
            return False
        finding.count += 1
        return True

    def _judge(self, section: str, rule: Any, *args: Any, **kwargs: Any) -> None:
        """Call one section's rule on the record, in that section's guard, and file what it returns."""
        if self._off or section in self._off_rules:
            return
        with self._rule[section]:
            self._emit(rule(self.recorder.rec, *args, **kwargs))

    def _emit(self, found: list[Found]) -> None:
        """File findings (once per section and subject, later sightings counted), warn once, or raise when strict."""
        rec = self.recorder.rec
        for item in found:
            key = (item.section, item.subject)
            if item.note:
                self.notes.append(item.message)
                if item.subject is not None:
                    rec.reported[key] = Finding(item.section, "note")  # measured once
                continue
            if self._off or item.section in self._off_rules:
                continue
            if key in rec.reported:
                rec.reported[key].count += 1
                continue
            text = f"[{item.section}] {item.message} See the guide, {link(item.section)}"
            batch = rec.batch if item.batch == CURRENT else item.batch
            finding = Finding(item.section, text, batch, rec.epoch, item.optimizer)
            rec.reported[key] = finding
            self.findings.append(finding)
            if self.strict:
                raise PitfallError(text, item.section)
            warnings.warn(text, PitfallWarning, stacklevel=4)

    def _judge_schedulers(self) -> None:
        """The ``schedulers`` rule on this epoch's candidates; both the candidates and the epoch's batches per
        scheduler start again afterwards."""
        rec = self.recorder.rec
        try:
            self._judge("schedulers", rules.schedulers)
        finally:
            rec.sched_candidates, rec.scheduler_batches = {}, {}

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
    def _unpatch(self) -> None:
        self.patches.undo()
        self._active = False
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None

    def _timed(self, start: float, once: bool = False) -> None:
        if once:  # fit start and train end: not part of any step
            self.setup_seconds += _clock() - start
        else:
            self.check_seconds += _clock() - start

    def _start_backward(self) -> int:
        return self.recorder.start_backward()

    def _grad_hook(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        rec = self.recorder.rec
        if self._off or (rec.in_grad and not rec.in_backward):
            return  # torch.autograd.grad: nothing is accumulated into .grad
        with self._rec:
            start = _clock()
            self.recorder.gradient(param)
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
        self._active = True
        self.recorder.start(trainer, pl_module, isinstance(trainer.precision_plugin, HeldGradientScales))
        if self.recorder.rec.manual:
            wrappers.install(self, trainer, pl_module)
            self._judge("porting", rules.porting, "start", hooks=self.recorder.overridden_hooks(pl_module))
        self._timed(start, once=True)

    @_hook
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        start = _clock()
        half, eps = self.recorder.half_parameters(pl_module), self.recorder.small_eps(trainer.optimizers)
        self._judge("fp16-parameters", rules.fp16_parameters, half=half, eps=eps)
        self._timed(start, once=True)

    @_hook
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.recorder.rec.epoch = trainer.current_epoch

    @_hook
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.recorder.rec.sched_candidates:
            self._judge_schedulers()
        if self._batch_start is not None:  # the epoch's last batch: its start to its end
            self.step_seconds += self._batch_end - self._batch_start
            self._batch_start = None

    @_hook
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        rec = self.recorder.rec
        rec.batch = batch_idx
        rec.global_batch += 1
        rec.step = StepRecord(guard_pending=rec.step.guard_pending, lost_sample=rec.step.lost_sample)
        now = _clock()
        if self._batch_start is not None:  # the previous batch's period: its start to this one's
            self.step_seconds += now - self._batch_start
        self._batch_start = now

    @_hook
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        precision = self.recorder.rec.precision
        if self._active and precision.endswith("-true") and precision != "32-true":
            start = _clock()
            self.recorder.sample_lost(optimizer)
            self._timed(start)

    @_hook
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        end = self._batch_end = _clock()
        rec = self.recorder.rec
        if rec.step.guard_pending:
            for owner, (finite, version) in rec.step.guard_pending.items():
                # parameters changed in place after the zero (SAM's second_step): an update outside the wrapper,
                # named by step-frequencies, not a guard that skipped the step
                moved = self.recorder.version_sum(owner) != version
                self._judge("nonfinite-guard", rules.nonfinite_guard, owner, finite, moved)
            rec.step.guard_pending = {}
        if rec.step.lost_sample:
            moved, lost = self.recorder.lost_updates()
            self._judge("fp16-parameters", rules.fp16_parameters, moved=moved, lost=lost)
        rec.step.skipped = set()  # a scheduler stepped after the batch (ReduceLROnPlateau in on_train_epoch_end)
        # is not charged with this batch's skip
        self._timed(end)

    @_hook
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        rec, recorder = self.recorder.rec, self.recorder
        if not rec.manual:
            return
        start = _clock()
        frozen = tuple(n for n, p, before in recorder.outside if torch.equal(p.detach(), before))
        self._judge("porting", rules.porting, "end", frozen=frozen, outside=len(recorder.outside))
        if rec.sched_candidates:
            self._judge_schedulers()
        for index in range(len(rec.optimizers)):
            if index in rec.last_step_seq or rec.global_batch < 0 or index in rec.raw_steps:
                continue  # stepped, or a step through the torch optimizer already named
            # a guard that skips empty steps (has_gradients) stops GradScaler's AssertionError, and with it the only
            # sign that this optimizer's loss never reaches its parameters; whether its parameters changed is told
            # by their in-place version counters (no copy of the weights is kept)
            changed = recorder.version_sum(index) - rec.versions[index]
            if changed:
                self._judge("step-frequencies", rules.step_frequencies, "end", index, changed)
            elif not any(f.section == "nonfinite-guard" and f.optimizer in (index, None) for f in self.findings):
                self._judge("no-gradient-step", rules.no_gradient_step, index, at_end=True)
        schedulers = tuple(
            (
                i,
                type(s).__name__,
                recorder.opt_index.get(id(getattr(s, "optimizer", None))),
                rec.scheduler_steps.get(id(s)),
            )
            for i, s in enumerate(recorder.schedulers)
        )
        self._judge("porting", rules.porting, "schedulers", schedulers=schedulers)
        self._timed(start, once=True)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._unpatch()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._unpatch()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._unpatch()
