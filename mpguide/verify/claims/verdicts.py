"""Verdicts: the outcome of one claim or check on one record, as the tables, the gate and the records show it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Verdict:
    """The outcome of one claim (or implicit check) on one record.

    Attributes:
        example: the record's example name.
        kind: a claim kind (``match``, ``diverge``, ``raises``, ...), an implicit check (``finite``,
            ``completes``), or a gate check of the record itself (``declaration``: it differs from
            its example's declaration; ``stale``: made from older sources; ``record``: its runs and
            claims were edited after it was written, or its hardware fields disagree).
        runs: run ids involved.
        title: human description.
        metric: what ``value`` measures (e.g. ``"max rel. diff"``).
        value: measured value (``None`` where not numeric).
        threshold: text such as ``"<= 0.001"``.
        passed: the verdict.
        detail: one sentence explaining a failure (or the evidence of a pass).
        record: path of the record file, when known.
        hardware: device and versions, e.g. ``"CPU (2 cores), torch 2.13.0+cpu, Lightning 2.6.6"``.
        observed: what was seen, as text, for claims without a numeric value (the exception type
            and first message line, the recorded value, the number of matching warnings).
        judged: ``False`` for a claim that could not be judged on this record (a stale reference
            record made before the claim existed); it neither passes nor fails.
        applicable: ``False`` for a claim declared ``only_if`` a measured condition the record's ``env`` does not
            meet (:mod:`mpguide.verify.claims.conditions`): "not applicable on this release", never a pass
            (``passed`` must be ``False``) and never a failure.
        inconclusive: ``True`` for a claim the data could not decide (a paired rate claim whose
            interval reaches across its band edge; :data:`~mpguide.verify.claims.tolerances.PAIRED_RULE`). It is never a
            pass (``passed`` must be ``False``) and never a failure; what it does to a build:
            :data:`~mpguide.verify.claims.tolerances.INCONCLUSIVE_RULE`.
    """

    example: str
    kind: str
    runs: list[str]
    title: str
    metric: str
    value: float | None
    threshold: str
    passed: bool
    detail: str = ""
    record: str = ""
    hardware: str = ""
    tolerance: str = ""
    observed: str = ""
    judged: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    inconclusive: bool = False
    applicable: bool = True

    def __post_init__(self) -> None:
        if self.inconclusive and self.passed:
            raise ValueError(f"{self.example}: claim {self.title!r} is inconclusive and cannot also pass")
        if not self.applicable and self.passed:
            raise ValueError(f"{self.example}: claim {self.title!r} does not apply and cannot also pass")

    @property
    def status(self) -> str:
        """``"pass"``, ``"FAIL"``, ``"inconclusive"``, ``"not judged"`` or ``"not applicable"``."""
        if not self.judged:
            return "not judged"
        if not self.applicable:
            return "not applicable"
        return "inconclusive" if self.inconclusive else "pass" if self.passed else "FAIL"

    @property
    def failed(self) -> bool:
        """A judged, decided claim that did not pass (what fails the gate)."""
        return self.judged and self.applicable and not self.passed and not self.inconclusive

    @property
    def undecided(self) -> bool:
        """A judged claim the data could not decide (see ``inconclusive``)."""
        return self.judged and self.applicable and self.inconclusive

    def shown_value(self) -> str:
        """The observed value as table text: the number (4 significant digits) or the observed text."""
        if self.value is not None and not self.observed:
            prefix = {
                "max rel. diff": "max ",
                "mean rel. gap": "mean ",
                "max |ratio/expected - 1|": "max dev. ",
                "non-finite steps": "non-finite: ",
            }.get(self.metric, "")
            return prefix + ("NaN" if math.isnan(self.value) else f"{self.value:.3g}")
        return self.observed or "n/a"

    def message(self) -> str:
        """One line naming example, claim, runs, metric vs threshold, record and hardware."""
        if self.kind in ("declaration", "stale", "record"):
            return (
                f"{self.example}: {self.kind} FAILED [{self.title}]: {self.detail}"
                f" (record: {self.record or 'in memory'}; hardware: {self.hardware})"
            )
        value = "n/a" if self.value is None else f"{self.value:.4g}"
        if self.observed:
            value = self.observed
        word = {"pass": "passed", "FAIL": "FAILED", "not applicable": "not applicable on this release"}.get(
            self.status, self.status
        )
        measured = value if value.startswith(f"{self.metric} =") else f"{self.metric} = {value}"
        return (
            f"{self.example}: {self.kind}({', '.join(self.runs)}) {word}"
            f" [{self.title}]: {measured}, threshold {self.threshold}. {self.detail}"
            f" (record: {self.record or 'in memory'}; hardware: {self.hardware})"
        )


def hardware_label(env: dict[str, Any]) -> str:
    """Short hardware and version label of a record's ``env`` field."""
    cuda = env.get("cuda", "cpu")
    extra = f", CUDA {cuda}" if cuda not in ("cpu", "", None) else ""
    return f"{env.get('device', '?')}{extra}, torch {env.get('torch', '?')}, Lightning {env.get('lightning', '?')}"
