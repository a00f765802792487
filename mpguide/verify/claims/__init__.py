"""Claims: what an example's runs must show, declared in its tables and judged on its record.

An example declares claims with :func:`~mpguide.verify.claims.match`, :func:`~mpguide.verify.claims.diverge`,
:func:`~mpguide.verify.claims.raises` and the other helpers below; they are stored in its results record
(by tolerance *name*, not by number) and judged by :func:`~mpguide.verify.claims.evaluate_record`, which
the example itself, the claim gate (:mod:`mpguide.verify.gate`) and the Sphinx extension all call. Because
thresholds are looked up in :data:`mpguide.verify.claims.tolerances.TOLERANCES` at judgement time, a committed record
(a GPU reference, say) is re-judged against today's thresholds.

The parts live in their own modules: the thresholds and their provenance in :mod:`mpguide.verify.claims.tolerances`,
the curve and rate metrics in :mod:`mpguide.verify.claims.metrics`, the judging of each claim kind in
:mod:`mpguide.verify.claims.judging`, and the outcome of a claim (:class:`~mpguide.verify.claims.verdicts.Verdict`) in
:mod:`mpguide.verify.claims.verdicts`. This module re-exports the few of their names that examples use through it
(``TOLERANCES``, ``INCONCLUSIVE_RULE``, ``decide_paired``, ``relative_gap``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..._sections import SECTIONS
from . import conditions
from .judging import evaluate_claim
from .metrics import decide_paired as decide_paired
from .metrics import relative_gap as relative_gap
from .tolerances import INCONCLUSIVE_RULE as INCONCLUSIVE_RULE
from .tolerances import TOLERANCES as TOLERANCES
from .verdicts import Verdict, hardware_label


class ClaimSpecError(ValueError):
    """A claim declaration is malformed (unknown kind or tolerance, wrong number of runs)."""


def match(candidate: str, reference: str, tolerance: str, title: str = "") -> dict[str, Any]:
    """Declare that run ``candidate``'s loss curve agrees with run ``reference``'s.

    Args:
        candidate: run id judged.
        reference: run id it is compared with (differences are relative to this curve).
        tolerance: a key of :data:`~mpguide.verify.claims.tolerances.TOLERANCES` with ``bound="max"``.
        title: one line for the verdict table, e.g. ``"manual port = automatic (bf16-mixed)"``.

    Raises:
        ClaimSpecError: unknown tolerance, or one meant for ``diverge``.
    """
    _check_tolerance(tolerance, "max")
    return {"kind": "match", "runs": [candidate, reference], "tolerance": tolerance, "title": title}


def diverge(candidate: str, reference: str, tolerance: str = "pitfall-gap", title: str = "") -> dict[str, Any]:
    """Declare that run ``candidate`` (a broken recipe) is visibly far from ``reference``.

    If upstream fixes the bug behind the pitfall, this claim fails and the page must be rewritten.

    Raises:
        ClaimSpecError: unknown tolerance, or one meant for ``match``.
    """
    _check_tolerance(tolerance, "min")
    return {"kind": "diverge", "runs": [candidate, reference], "tolerance": tolerance, "title": title}


def raises(run: str, exception: str, message: str, title: str = "") -> dict[str, Any]:
    """Declare that run ``run`` ends with ``exception`` (a type name) whose message contains ``message``."""
    if not exception or not message:
        raise ClaimSpecError("raises() needs an exception type name and a message fragment")
    return {"kind": "raises", "runs": [run], "exception": exception, "message": message, "title": title}


def warns(run: str, category: str, message: str, title: str = "") -> dict[str, Any]:
    """Declare that run ``run`` emitted a warning of class ``category`` whose text contains ``message``.

    Warnings are captured per run by :meth:`mpguide.verify.run.strategy.RunStrategy.train` as ``"Category: text"``.
    """
    if not category or not message:
        raise ClaimSpecError("warns() needs a warning class name and a message fragment")
    return {"kind": "warns", "runs": [run], "category": category, "message": message, "title": title}


def no_warning(run: str, message: str, title: str = "") -> dict[str, Any]:
    """Declare that run ``run`` emitted no warning whose text contains ``message``."""
    if not message:
        raise ClaimSpecError("no_warning() needs a message fragment")
    return {"kind": "no_warning", "runs": [run], "message": message, "title": title}


def expect(run: str, key: str, expected: Any, title: str = "") -> dict[str, Any]:
    """Declare that ``run``'s recorded value ``extra[key]`` equals ``expected`` exactly (JSON equality)."""
    return {"kind": "expect", "runs": [run], "key": key, "expected": expected, "title": title}


def same(candidate: str, reference: str, key: str, title: str = "") -> dict[str, Any]:
    """Declare that two runs recorded exactly the same ``extra[key]`` (e.g. a digest of final weights)."""
    return {"kind": "same", "runs": [candidate, reference], "key": key, "title": title}


def ratio(
    candidate: str, reference: str, key: str, expected: float | str, tolerance: str = "update-ratio", title: str = ""
) -> dict[str, Any]:
    """Declare ``extra[key][i]`` of ``candidate`` / the same of ``reference`` equals the expected factor.

    Args:
        candidate: run id judged; its ``extra[key]`` is a list of numbers (one per step).
        reference: run id with the same list.
        key: name of the list in both runs' ``extra``.
        expected: a number, or the name of a list in ``candidate``'s ``extra`` giving the expected
            factor per step (a prediction recorded by the run itself). An expected factor of 0
            (a step GradScaler skipped) requires the candidate's value to be exactly 0.
        tolerance: a key of :data:`~mpguide.verify.claims.tolerances.TOLERANCES` with ``bound="max"``; the metric is the
            largest ``|actual / expected - 1|`` over steps.
    """
    _check_tolerance(tolerance, "max")
    return {
        "kind": "ratio",
        "runs": [candidate, reference],
        "key": key,
        "expected": expected,
        "tolerance": tolerance,
        "title": title,
    }


def rate_ratio(run: str, key: str, tolerance: str, title: str = "") -> dict[str, Any]:
    """Declare a bound on the quotient of two numbers recorded by one run.

    For example two rates of variants timed together, or a count and the total it is part of
    (``"updates_lost/updates_with_gradient"``: the share of optimizer updates that rounded away).

    Args:
        run: run id whose ``extra`` holds both numbers (rates measured in one interleaved benchmark,
            so machine noise affects both alike, see :mod:`mpguide.verify.run.throughput`; or counts).
        key: ``"numerator_key/denominator_key"``, two entries of that run's ``extra``: two numbers
            (the quotient is theirs, compared as a point), or two equally long lists of per-round rates
            of an interleaved benchmark: a paired comparison, one quotient per round (a stretch of machine
            load hitting some rounds moves both rates of a round alike), decided by
            :func:`~mpguide.verify.claims.metrics.decide_paired`: pass when the 95 % interval of the median quotient
            lies inside the band, fail when wholly outside, **inconclusive** otherwise
            (:data:`~mpguide.verify.claims.tolerances.PAIRED_RULE`,
            :data:`~mpguide.verify.claims.tolerances.INCONCLUSIVE_RULE`).
        tolerance: a key of :data:`~mpguide.verify.claims.tolerances.TOLERANCES`. A ``"max"`` bound means parity:
            ``|numerator / denominator - 1| <= value`` (band ``[1 - value, 1 + value]``); a ``"min"``
            bound means a speed-up: ``numerator / denominator >= value``.

    Raises:
        ClaimSpecError: ``key`` is not two names joined by ``/``, or the tolerance is unknown.
    """
    parts = key.split("/")
    if len(parts) != 2 or not all(parts):
        raise ClaimSpecError(f"rate_ratio() needs key 'numerator/denominator', found {key!r}")
    if tolerance not in TOLERANCES:
        raise ClaimSpecError(f"unknown tolerance {tolerance!r}; known: {sorted(TOLERANCES)}")
    return {"kind": "rate_ratio", "runs": [run], "key": key, "tolerance": tolerance, "title": title}


def flags(run: str, section: str, title: str = "") -> dict[str, Any]:
    """Declare that :class:`mpguide.checks.PitfallChecks`, attached to ``run``, reported a pitfall of ``section``.

    The run must carry the check as a probe (``runner.run_example(..., probes=runner.with_checks(recipes, ...))``),
    which records its findings as ``extra["pitfall_findings"]``; a run without that record fails the claim.

    Args:
        run: run id judged (a buggy run of the example).
        section: the guide's anchor of the pitfall, one of :data:`mpguide.checks.SECTIONS`.
        title: one line for the verdict table.

    Raises:
        ClaimSpecError: ``section`` is not one of the guide's pitfall sections.
    """
    if section not in SECTIONS:
        raise ClaimSpecError(f"flags() needs a section among {list(SECTIONS)}, found {section!r}")
    return {"kind": "flags", "runs": [run], "section": section, "title": title}


def clean(run: str, title: str = "") -> dict[str, Any]:
    """Declare that :class:`mpguide.checks.PitfallChecks`, attached to ``run``, reported no finding at all.

    Its notes (remarks that are not pitfalls) do not count. The run must carry the check as a probe (see
    :func:`~mpguide.verify.claims.flags`); a run without ``extra["pitfall_findings"]`` fails the claim.
    """
    return {"kind": "clean", "runs": [run], "title": title}


def _check_tolerance(name: str, bound: str) -> None:
    tol = TOLERANCES.get(name)
    if tol is None:
        raise ClaimSpecError(f"unknown tolerance {name!r}; known: {sorted(TOLERANCES)}")
    if tol.bound != bound:
        raise ClaimSpecError(f"tolerance {name!r} is a {tol.bound!r} bound and cannot be used here")


def batches_per_epoch(loader_batches: int, trainer_kwargs: dict[str, Any]) -> int:
    """Batches one epoch trains: the loader's, capped by an integer ``limit_train_batches`` run option
    (``Trainer(limit_train_batches=n)``; a fraction is not a run option the harness plans)."""
    limit = trainer_kwargs.get("limit_train_batches")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
        return min(loader_batches, limit)
    return loader_batches


def planned_steps(preset: str, trainer_kwargs: dict[str, Any] | None = None) -> int | None:
    """Batches a training run of a record made with ``preset`` must have.

    An integer ``limit_train_batches`` among the run's ``trainer_kwargs`` caps the batches of each epoch
    (:func:`~mpguide.verify.claims.batches_per_epoch`). Returns ``None`` for an unknown preset name, which
    then fails every run's ``finite`` check.
    """
    from ...data import steps_per_epoch
    from ..hardware import PRESETS

    size = PRESETS.get(preset)
    if size is None:
        return None
    return size.epochs * batches_per_epoch(steps_per_epoch(size.batch_size), trainer_kwargs or {})


def stopped_by_max_steps(run: dict[str, Any]) -> bool:
    """Whether ``run`` declares ``Trainer(max_steps=n)`` and its ``global_step`` reached ``n``: it stopped there,
    before the batches its preset plans (Lightning checks ``max_steps`` between ``training_step`` calls,
    ``lightning/pytorch/loops/training_epoch_loop.py``)."""
    limit = run.get("trainer_kwargs", {}).get("max_steps")
    reached = run.get("extra", {}).get("global_step")
    return isinstance(limit, int) and limit > 0 and isinstance(reached, int) and reached >= limit


def evaluate_record(
    record: dict[str, Any], path: str = "", declaration: Any = None, stale: bool = False
) -> list[Verdict]:
    """Judge a record: its example's declared claims, plus the implicit checks on every run.

    With ``declaration`` (a :class:`mpguide.verify.claims.declarations.Declaration`, what the gate and the pages
    pass), the record is first compared with it (:meth:`mpguide.verify.claims.declarations.Declaration.compare`)
    and the **declared** claims are judged, never the record's own copy: a record cannot loosen a
    tolerance, flip an expected value or drop a claim. Without it (a record just built in memory
    by :func:`mpguide.verify.run.runner.run_example` from the same tables) the record's claims are judged.

    ``stale=True`` (a committed reference made from an older version of the example) judges only
    the declared claims the record already held, on runs whose recipe and precision are unchanged;
    the other declared claims come back ``judged=False`` with the reason.

    A claim declared ``only_if`` a measured condition (:mod:`mpguide.verify.claims.conditions`) is judged only
    where the record's ``env`` meets it; elsewhere its verdict is "not applicable on this release"
    (``applicable=False``: neither a pass nor a failure), and "not judged" when ``env`` lacks the measurement.

    Implicit checks: a run that is not the subject of a ``raises`` claim must complete without an
    exception (``completes``) and have only finite losses, one per step, as many steps as the
    record's preset plans with the run's ``limit_train_batches`` (``finite``; see
    :func:`~mpguide.verify.claims.planned_steps`), or fewer when the run declares ``max_steps`` and its
    ``global_step`` reached it (:func:`~mpguide.verify.claims.stopped_by_max_steps`).

    Args:
        record: a record as validated by :func:`mpguide.verify.records.validate_record`.
        path: where it was read from, for messages.
        declaration: the example's declaration, or ``None`` to trust the record's claims.
        stale: judge as a stale reference (see above).

    Returns:
        One :class:`~mpguide.verify.claims.verdicts.Verdict` per declaration problem, claim and implicit check.
    """
    runs = {run["id"]: run for run in record["runs"]}
    example = record["example"]
    hardware = hardware_label(record.get("env", {}))

    def verdict(**kw: Any) -> Verdict:
        return Verdict(example=example, record=str(path), hardware=hardware, **kw)

    verdicts: list[Verdict] = []
    judged_runs = set(runs)
    if declaration is None:
        to_judge = [(c, "") for c in record["claims"]]
    else:
        problems, to_judge, judged_runs = declaration.compare(record, stale)
        verdicts += [verdict(**p) for p in problems]
    expected_errors = {c["runs"][0] for c, _ in to_judge if c.get("kind") == "raises" and c.get("runs")}

    for claim, not_judged in to_judge:
        if not_judged:
            verdicts.append(
                verdict(
                    kind=claim["kind"],
                    runs=list(claim["runs"]),
                    title=claim.get("title") or claim["kind"],
                    metric="-",
                    value=None,
                    threshold="-",
                    passed=False,
                    judged=False,
                    observed="not judged",
                    detail=not_judged,
                )
            )
        else:
            judged_claim = evaluate_claim(claim, runs, verdict)
            applies, why = conditions.applies(claim, record.get("env", {}))
            if applies is not True:  # the metric and threshold stay the judged ones: the claim keeps its identity
                judged_claim = dataclasses.replace(
                    judged_claim,
                    value=None,
                    passed=False,
                    inconclusive=False,
                    judged=applies is False,
                    applicable=False,
                    observed=conditions.NOT_APPLICABLE if applies is False else "not judged",
                    detail=why,
                    extra={**judged_claim.extra, conditions.OPTION: claim[conditions.OPTION]},
                )
            verdicts.append(judged_claim)

    for run_id, run in runs.items():
        if run_id in expected_errors or run_id not in judged_runs:
            continue
        error = run.get("error")
        if error:
            first = (error.get("message") or "").splitlines()[:1]
            verdicts.append(
                verdict(
                    kind="completes",
                    runs=[run_id],
                    title=f"{run_id} trains to the end",
                    metric="exception",
                    value=None,
                    threshold="none",
                    passed=False,
                    observed=f"{error.get('type')}: {first[0] if first else ''}",
                    detail=f"unexpected {error.get('type')}: {error.get('message')}",
                )
            )
            continue
        loss = run["loss"]
        bad = [i for i, v in enumerate(loss) if not math.isfinite(v)]
        planned = planned_steps(record.get("preset", ""), run.get("trainer_kwargs"))
        stopped = stopped_by_max_steps(run) and 0 < len(loss) <= run["steps"]
        short = (len(loss) != run["steps"] and not stopped) or not loss or run["steps"] != planned
        detail = ""
        if bad:
            detail = (
                f"the loss is {loss[bad[0]]} at step {bad[0]} (counted from 0); {len(bad)} of {len(loss)} "
                f"steps are not finite"
            )
        elif (len(loss) != run["steps"] and not stopped) or not loss:
            detail = f"run too short: {len(loss)} losses recorded for {run['steps']} steps"
        elif short:
            detail = (
                f"the run has {run['steps']} steps, but preset {record.get('preset')!r} plans "
                f"{planned}: the record's preset and its runs disagree"
            )
        verdicts.append(
            verdict(
                kind="finite",
                runs=[run_id],
                title=f"{run_id} has a finite loss at every step",
                metric="non-finite steps",
                value=float(len(bad)),
                threshold="== 0",
                passed=not bad and not short,
                detail=detail,
            )
        )
    return verdicts
