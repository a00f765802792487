"""What a fit and each of its training steps did, as plain data: the one place :class:`~mpguide.checks.PitfallChecks`
writes what it sees and its rules read.

:class:`FitRecord` holds a fit (optimizers by index and type, the precision, the loss scale as followed, every
backward call still of interest and which parameters' gradients it reached, steps, skips, ``zero_grad`` calls,
scheduler steps, open autocast regions, in-place version counters); :class:`StepRecord` holds one training batch
(its backward calls, skipped and applied steps, outputs of ``scaler.scale``, the pending ``nonfinite-guard``
flags and the ``*-true`` lost-update sample). Parameters are named by ``id()``; the only tensors held are the
unread 0-d finite flags and the sampled copies, so a record built by hand (``tests/test_checks_rules.py``)
is enough to exercise every rule without a ``Trainer``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .findings import Finding


@dataclass
class ParamGrads:
    """What the gradient hook knows about one parameter's current ``.grad``."""

    backwards: set[int] = field(default_factory=set)  # ids of the backward calls that added to it
    scales: set[float] = field(default_factory=set)  # loss scales those backward calls used


@dataclass
class BackwardCall:
    """One backward call (``manual_backward``, ``loss.backward()``, ``torch.autograd.backward``)."""

    seq: int  # the step sequence number when it ran
    batch: int
    epoch: int = 0


@dataclass
class Region:
    """An autocast region open inside ``training_step``: an own ``torch.autocast`` (``region`` is it) or the
    precision plugin's caching region around ``training_step`` (``region`` is ``None``)."""

    region: Any
    caching: bool
    dtype: Any = None
    enabled: bool = False
    stepped: bool = False  # an optimizer stepped while it was open
    stepped_params: set[int] = field(default_factory=set)  # ids of the parameters those steps updated
    flagged: bool = False  # an autocast-cache finding was made in it


@dataclass
class StepRecord:
    """What one training batch did so far (reset at each batch's start)."""

    backwards: list[int] = field(default_factory=list)  # ids of this batch's backward calls
    skipped: set[int] = field(default_factory=set)  # optimizers whose step GradScaler skipped in this batch
    stepped: set[int] = field(default_factory=set)  # optimizers stepped in this batch
    scaled_ids: set[int] = field(default_factory=set)  # ids of the tensors scaler.scale() returned
    guard_pending: dict[int, Any] = field(default_factory=dict)  # optimizer -> (finite flag, version sum then)
    lost_sample: dict[int, tuple[Any, Any, Any]] = field(default_factory=dict)  # *-true: (param, before, nonzero)
    # optimizer -> (loss scales its gradients were made at, the scale it unscales with): judged once the step applied
    scale_change: dict[int, tuple[set[float], float]] = field(default_factory=dict)


@dataclass
class FitRecord:
    """What one fit did: the single record the recorder writes and every rule reads."""

    precision: str = ""
    manual: bool = False
    module: str = ""  # the LightningModule's class name
    optimizers: list[str] = field(default_factory=list)  # type names, by index in configure_optimizers
    sizes: list[int] = field(default_factory=list)  # parameters per optimizer
    scaled: bool = False  # a GradScaler is on
    rescales_held: bool = False  # the plugin rescales held gradients (ManualMixedPrecision)
    scale: float = 1.0  # the loss scale as followed
    tracker: int = 0  # GradScaler's growth tracker as followed
    skipped_since_update: bool = False
    batch: int | None = None  # the batch being watched (within the epoch), None at fit start
    epoch: int = 0
    global_batch: int = -1
    step: StepRecord = field(default_factory=StepRecord)
    in_step_fn: int = 0  # inside the reader's training_step
    in_lightning: int = 0  # inside Lightning's backward / step / clip
    in_backward: int = 0
    in_grad: int = 0
    params: dict[int, ParamGrads] = field(default_factory=dict)
    param_opt: dict[int, int] = field(default_factory=dict)  # parameter id -> its optimizer's index
    param_module: dict[int, str] = field(default_factory=dict)  # parameter id -> top-level module name
    backwards: dict[int, BackwardCall] = field(default_factory=dict)
    backward_id: int = 0
    consumed: set[int] = field(default_factory=set)  # backward calls some step used
    seq: int = 0  # steps so far
    last_step_seq: dict[int, int] = field(default_factory=dict)  # optimizer -> seq of its last step
    applied: bool | None = None  # the step in flight: False until GradScaler calls the optimizer's step
    pending_accumulation: dict[int, tuple[int, int]] = field(default_factory=dict)  # opt -> (first batch, lost)
    regions: list[Region] = field(default_factory=list)
    noted: set[Any] = field(default_factory=set)  # autocast dtypes already noted
    math_samples: dict[int, int] = field(default_factory=dict)  # optimizer -> steps watched for optimizer-math
    scheduler_steps: dict[int, int] = field(default_factory=dict)  # id(scheduler) -> steps
    scheduler_batches: dict[int, set[int]] = field(default_factory=dict)  # id(scheduler) -> batches of the epoch
    sched_candidates: dict[int, tuple] = field(default_factory=dict)  # (name, optimizer, batch, lr before, after)
    applied_steps: dict[int, int] = field(default_factory=dict)  # optimizer -> steps not skipped
    raw_steps: dict[int, int] = field(default_factory=dict)  # optimizer -> steps through the torch optimizer
    versions: list[int] = field(default_factory=list)  # per optimizer: its parameters' version sum at fit start
    dead_hooks: list[tuple[str, str]] = field(default_factory=list)  # (hook, class) inherited, judged at the end
    reported: dict[tuple[str, Any], Finding] = field(default_factory=dict)  # (section, subject) -> finding

    def where(self) -> str:
        """The batch being watched, in words."""
        return "at fit start" if self.batch is None else f"in batch {self.batch} (epoch {self.epoch})"

    def name(self, index: int) -> str:
        """An optimizer in words: its index and type."""
        return f"optimizer {index} ({self.optimizers[index]})"

    def reached(self, backwards: set[int]) -> list[str]:
        """The top-level modules whose parameters hold gradients from these backward calls (for messages)."""
        return sorted({self.param_module.get(pid, "?") for pid, st in self.params.items() if st.backwards & backwards})
