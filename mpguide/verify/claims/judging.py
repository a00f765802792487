"""Judging one declared claim on one record's runs, by claim kind.

:func:`~mpguide.verify.claims.judging.evaluate_claim` dispatches on the claim's kind
(:data:`~mpguide.verify.claims.judging.KINDS`):
curve claims (``match``, ``diverge``) use the metrics of :mod:`mpguide.verify.claims.metrics`, ``ratio`` compares
recorded
per-step values with expected factors, ``rate_ratio`` compares two recorded rates (paired by round:
:func:`mpguide.verify.claims.metrics.decide_paired`), and ``raises``, ``warns``, ``no_warning``, ``expect`` and ``same``
read what the run recorded. :func:`mpguide.verify.claims.evaluate_record` calls it for every declared claim.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .metrics import decide_paired, first_non_finite, relative_gap, warmup_steps
from .tolerances import TOLERANCES, Tolerance
from .verdicts import Verdict


def evaluate_claim(claim: dict[str, Any], runs: dict[str, Any], verdict: Any) -> Verdict:
    """Judge one claim (a dict as the declaration helpers of :mod:`mpguide.verify.claims` return it).

    Args:
        claim: the claim.
        runs: the record's runs by id.
        verdict: makes a :class:`~mpguide.verify.claims.verdicts.Verdict` from keyword arguments, with the record's
            example, path and hardware filled in.
    """
    kind, ids = claim["kind"], list(claim["runs"])
    title = claim.get("title") or f"{kind}({', '.join(ids)})"
    base = dict(kind=kind, runs=ids, title=title)
    missing = [r for r in ids if r not in runs]
    if kind not in KINDS:
        return verdict(
            **base, metric="?", value=None, threshold="?", passed=False, detail=f"unknown claim kind {kind!r}"
        )
    if missing:
        return verdict(
            **base,
            metric="?",
            value=None,
            threshold="?",
            passed=False,
            observed="run missing",
            detail=f"run(s) {missing} missing from the record",
        )
    if kind == "rate_ratio":
        return _evaluate_rate_ratio(claim, runs[ids[0]], base, verdict)
    if kind in ("flags", "clean"):
        return _evaluate_findings(claim, runs[ids[0]], base, verdict)

    if kind == "raises":
        run = runs[ids[0]]
        error = run.get("error") or {}
        want = f"raises {claim['exception']}"
        first = (error.get("message") or "").splitlines()[:1]
        got = f"{error.get('type')}: {first[0] if first else ''}" if error else "no exception"
        ok = (
            bool(error) and error.get("type") == claim["exception"] and claim["message"] in (error.get("message") or "")
        )
        return verdict(
            **base,
            metric="exception",
            value=None,
            threshold=want,
            passed=ok,
            observed=got[:80] + ("..." if len(got) > 80 else ""),
            detail=(
                f"expected {claim['exception']} containing {claim['message']!r}, got {got}"
                if not ok
                else f"raised {got}"
            ),
        )

    if kind in ("warns", "no_warning"):
        seen = runs[ids[0]].get("warnings") or []
        if kind == "warns":
            want = f"warns {claim['category']}"
            hits = [w for w in seen if w.startswith(claim["category"] + ":") and claim["message"] in w]
        else:
            want = "no such warning"
            hits = [w for w in seen if claim["message"] in w]
        ok = bool(hits) == (kind == "warns")
        return verdict(
            **base,
            metric="warnings",
            value=float(len(hits)),
            threshold=want,
            passed=ok,
            observed=f"{len(hits)} matching warning{'s' if len(hits) != 1 else ''}",
            detail=(
                hits[0][:200] if hits else f"no {claim.get('category', '')} warning containing {claim['message']!r}"
            ).strip(),
        )

    if kind in ("expect", "same"):
        key = claim["key"]
        values = [runs[r].get("extra", {}).get(key, _MISSING) for r in ids]
        if any(v is _MISSING for v in values):
            return verdict(
                **base,
                metric=key,
                value=None,
                threshold="recorded",
                passed=False,
                observed="not recorded",
                detail=f"run(s) {[r for r, v in zip(ids, values) if v is _MISSING]} did not record {key!r}",
            )
        expected = claim["expected"] if kind == "expect" else values[1]
        ok = values[0] == expected
        if kind == "same":
            observed = "identical" if ok else f"differ: {_short(values[0], 20)} vs {_short(values[1], 20)}"
            threshold = f"{key} identical"
        else:
            observed, threshold = f"{key} = {_short(values[0], 40)}", f"== {_short(expected, 24)}"
        return verdict(
            **base,
            metric=key,
            value=None,
            threshold=threshold,
            passed=ok,
            observed=observed,
            detail=f"recorded {_short(values[0])}" + ("" if ok else f", expected {_short(expected)}"),
        )

    name = claim.get("tolerance", "")
    tol = TOLERANCES.get(name)
    if tol is None:
        return verdict(
            **base,
            metric="?",
            value=None,
            threshold="?",
            passed=False,
            detail=f"unknown tolerance {name!r}; known: {sorted(TOLERANCES)}",
        )
    bound = "min" if kind == "diverge" else "max"
    if tol.bound != bound:  # the declaration helpers refuse this; a record must not slip it in
        return verdict(
            **base,
            metric="?",
            value=None,
            threshold=f"{tol.value:g}",
            passed=False,
            tolerance=name,
            detail=f"tolerance {name!r} is a {tol.bound!r} bound, a {kind} claim needs a {bound!r} one",
        )
    cand, ref = runs[ids[0]], runs[ids[1]]
    if kind == "ratio":
        return _evaluate_ratio(claim, cand, ref, tol, base, verdict)
    threshold = f"<= {tol.value:g}" if kind == "match" else f">= {tol.value:g}"
    metric = "max rel. diff" if kind == "match" else "mean rel. gap"
    for run in (cand, ref):
        if run.get("error"):
            return verdict(
                **base,
                metric=metric,
                value=None,
                threshold=threshold,
                passed=False,
                tolerance=name,
                observed=f"{run['id']} raised",
                detail=f"run {run['id']} raised {run['error'].get('type')}, so there is no curve to compare",
            )
    if len(cand["loss"]) != len(ref["loss"]):
        short_run, long_run = sorted((cand, ref), key=lambda r: len(r["loss"]))
        return verdict(
            **base,
            metric=metric,
            value=None,
            threshold=threshold,
            passed=False,
            tolerance=name,
            observed="curve too short",
            detail=f"run {short_run['id']} is too short: {len(short_run['loss'])} steps recorded, "
            f"run {long_run['id']} has {len(long_run['loss'])}",
        )
    for run in (cand, ref):
        bad = first_non_finite(run["loss"])
        if bad:
            return verdict(
                **base,
                metric=metric,
                value=math.nan,
                threshold=threshold,
                passed=False,
                tolerance=name,
                observed=f"{bad[1]} loss",
                detail=f"run {run['id']} has a loss of {bad[1]} at step {bad[0]} (counted from the start "
                f"of the run), so the curves cannot be compared",
            )
    try:
        gap = relative_gap(cand["loss"], ref["loss"])
    except ValueError as err:
        return verdict(
            **base,
            metric=metric,
            value=None,
            threshold=threshold,
            passed=False,
            tolerance=name,
            observed="not comparable",
            detail=str(err),
        )
    skip = warmup_steps(len(ref["loss"]))
    if kind == "match":
        value = float(np.max(gap))
        ok = value <= tol.value
        return verdict(
            **base,
            metric=metric,
            value=value,
            threshold=threshold,
            passed=ok,
            tolerance=name,
            detail=""
            if ok
            else f"smoothed curves differ by up to {value:.2%} at step {int(np.argmax(gap)) + skip} (counted "
            f"from the start of the run; steps 0-{skip - 1} are warm-up)",
        )
    value = float(np.mean(gap))
    ok = value >= tol.value
    return verdict(
        **base,
        metric=metric,
        value=value,
        threshold=threshold,
        passed=ok,
        tolerance=name,
        detail=""
        if ok
        else f"the pitfall no longer reproduces: curves only {value:.2%} apart on average over steps "
        f"{skip}-{len(ref['loss']) - 1}",
    )


_MISSING = object()
#: Every claim kind, each the name of its declaration helper in :mod:`mpguide.verify.claims`.
KINDS = (
    "match",
    "diverge",
    "raises",
    "warns",
    "no_warning",
    "expect",
    "same",
    "ratio",
    "rate_ratio",
    "flags",
    "clean",
)


def _evaluate_findings(claim: dict[str, Any], run: dict[str, Any], base: dict[str, Any], verdict: Any) -> Verdict:
    """Judge a ``flags`` or ``clean`` claim on what :class:`mpguide.checks.PitfallChecks` recorded in ``run``."""
    findings = run.get("extra", {}).get("pitfall_findings")
    want = f"flags {claim.get('section')}" if claim["kind"] == "flags" else "no finding"
    if not isinstance(findings, list):
        return verdict(
            **base,
            metric="findings",
            value=None,
            threshold=want,
            passed=False,
            observed="not recorded",
            detail=f"run {run['id']} has no extra.pitfall_findings: attach the check to its recipe "
            f"(run_example(..., probes=runner.with_checks(recipes, probes))) and rerun the example",
        )
    sections = [f.get("section") for f in findings if isinstance(f, dict)]
    if claim["kind"] == "flags":
        hits = [f for f in findings if isinstance(f, dict) and f.get("section") == claim.get("section")]
        ok = bool(hits)
        observed = f"{len(hits)} {claim.get('section')} finding{'s' if len(hits) != 1 else ''}"
        detail = (
            hits[0].get("message", "")[:300]
            if hits
            else f"no {claim.get('section')!r} finding; the check reported {sorted(set(sections)) or 'nothing'}"
        )
    else:
        ok = not findings
        observed = "no finding" if ok else f"{len(findings)} finding(s): {', '.join(sorted(set(map(str, sections))))}"
        detail = "" if ok else str(findings[0].get("message", ""))[:300]
    return verdict(
        **base,
        metric="findings",
        value=float(len(findings)),
        threshold=want,
        passed=ok,
        observed=observed,
        detail=detail,
    )


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _evaluate_ratio(
    claim: dict[str, Any], cand: dict[str, Any], ref: dict[str, Any], tol: Tolerance, base: dict[str, Any], verdict: Any
) -> Verdict:
    key, expected = claim["key"], claim["expected"]
    a, b = cand.get("extra", {}).get(key), ref.get("extra", {}).get(key)
    factors = cand.get("extra", {}).get(expected) if isinstance(expected, str) else None
    problem = ""
    if a is None or b is None:
        problem = f"{key!r} not recorded by {cand['id'] if a is None else ref['id']}"
    elif len(a) != len(b) or not a:
        problem = f"{key!r} has {len(a)} values in {cand['id']} and {len(b)} in {ref['id']}"
    elif isinstance(expected, str) and (factors is None or len(factors) != len(a)):
        problem = f"expected factors {expected!r} not recorded per step by {cand['id']}"
    if problem:
        return verdict(
            **base,
            metric="max |ratio/expected - 1|",
            value=None,
            threshold=f"<= {tol.value:g}",
            passed=False,
            tolerance=tol.name,
            detail=problem,
        )
    want = np.asarray(factors if factors is not None else [expected] * len(a), dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        got = np.asarray(a, dtype=np.float64) / np.asarray(b, dtype=np.float64)
        # an expected factor of 0 (a skipped step) requires exactly no update
        dev = np.where(want == 0, np.abs(got), np.abs(got / np.where(want == 0, 1.0, want) - 1.0))
    value = float(np.max(dev)) if np.all(np.isfinite(dev)) else math.inf
    worst = int(np.argmax(np.where(np.isfinite(dev), dev, np.inf)))
    ok = value <= tol.value
    return verdict(
        **base,
        metric="max |ratio/expected - 1|",
        value=value,
        threshold=f"<= {tol.value:g}",
        passed=ok,
        tolerance=tol.name,
        detail=f"step {worst}: ratio {got[worst]:.4g}, expected {want[worst]:.4g}",
    )


def _evaluate_rate_ratio(claim: dict[str, Any], run: dict[str, Any], base: dict[str, Any], verdict: Any) -> Verdict:
    """Judge a :func:`~mpguide.verify.claims.rate_ratio` claim: parity (``max`` bound) or speed-up (``min`` bound)."""
    tol = TOLERANCES.get(claim.get("tolerance", ""))
    num_key, _, den_key = str(claim.get("key", "")).partition("/")
    extra = run.get("extra", {})
    num, den = extra.get(num_key), extra.get(den_key)
    paired = isinstance(num, list) or isinstance(den, list)
    parity = tol is not None and tol.bound == "max"
    metric = "|ratio - 1|" if parity else "ratio"
    threshold = "?" if tol is None else (f"<= {tol.value:g}" if parity else f">= {tol.value:g}")
    problem = (
        "unknown tolerance " + repr(claim.get("tolerance"))
        if tol is None
        else f"{run['id']} raised {run['error'].get('type')}, so nothing was timed"
        if run.get("error")
        else _paired_problem(run["id"], num_key, num, den_key, den)
        if paired
        else f"{run['id']} did not record a number {num_key!r}"
        if not _is_number(num)
        else f"{run['id']} did not record a positive number {den_key!r}"
        if not _is_number(den) or den <= 0
        else ""
    )
    if problem:
        return verdict(
            **base,
            metric=metric,
            value=None,
            threshold=threshold,
            passed=False,
            tolerance=claim.get("tolerance", ""),
            observed="not measured",
            detail=problem,
        )
    if paired:  # decided by the interval rule (PAIRED_RULE), not by the median alone
        quotients = [a / b for a, b in zip(num, den, strict=True)]
        decision = decide_paired(quotients, tol)
        quotient = decision.median
        shown = f"median over {len(quotients)} rounds of {num_key} / {den_key} = {quotient:.3f}; " + (
            "no 95 % interval (too few rounds)"
            if decision.low is None
            else f"{decision.coverage:.0%} interval {decision.low:.3f}-{decision.high:.3f}"
        )
        detail = (
            decision.describe()
            + ". Per-round ratios "
            + ", ".join(f"{q:.3f}" for q in quotients)
            + (
                ". Inconclusive: not a pass; the benchmark reached its cap of rounds (or the record has "
                "too few) before the interval settled on one side of the band"
                if decision.verdict == "inconclusive"
                else ""
            )
        )
        band = f"{decision.band[0]:g}-{decision.band[1]:g}" if parity else f">= {decision.band[0]:g}"
        return verdict(
            **base,
            metric="median ratio, 95 % interval",
            value=quotient,
            threshold=f"interval inside {band}",
            passed=decision.verdict == "pass",
            inconclusive=decision.verdict == "inconclusive",
            tolerance=tol.name,
            observed=shown,
            detail=detail,
        )
    quotient = num / den  # two single numbers (e.g. medians): a point comparison, no interval
    shown = f"{num_key} / {den_key} = {quotient:.3f}"
    detail = f"{num_key} = {num:.4g}, {den_key} = {den:.4g}, ratio {quotient:.4f}"
    value = abs(quotient - 1.0) if parity else quotient
    ok = value <= tol.value if parity else value >= tol.value
    if parity:  # the bound is on the deviation, so show it next to the ratio
        shown += f" (|ratio - 1| = {value:.3f})"
    return verdict(
        **base,
        metric=metric,
        value=value,
        threshold=threshold,
        passed=ok,
        tolerance=tol.name,
        observed=shown,
        detail=detail,
    )


def _paired_problem(run_id: str, num_key: str, num: Any, den_key: str, den: Any) -> str:
    """Why two per-round rate lists cannot be paired ("" when they can)."""
    for key, rates in ((num_key, num), (den_key, den)):
        if not isinstance(rates, list) or not rates or not all(_is_number(r) and r > 0 for r in rates):
            return f"{run_id} did not record a non-empty list of positive numbers {key!r}"
    if len(num) != len(den):
        return (
            f"{run_id} recorded {len(num)} rounds of {num_key!r} but {len(den)} of {den_key!r}; "
            f"a paired ratio needs the same rounds"
        )
    return ""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
