"""Comparing a record with its example's declaration: the runs and claims a record holds must be the declared ones.

The gate and the pages judge the **declared** claims (:mod:`mpguide.verify.claims.declarations` reads them from the
example's source), never the record's own copy; :func:`~mpguide.verify.claims.compare.compare_with_declaration`
says where a record differs, and which declared claims a stale reference can still be judged on.
"""

from __future__ import annotations

from typing import Any

from .. import hints

#: Keys of a claim that define it (what the gate compares); judged values and titles are not among them.
CLAIM_KEYS = (
    "kind",
    "runs",
    "tolerance",
    "exception",
    "message",
    "category",
    "key",
    "expected",
    "section",
    "only_on",
    "only_if",
)


def claim_identity(claim: dict[str, Any]) -> dict[str, Any]:
    """The defining keys of a claim (:data:`~mpguide.verify.claims.compare.CLAIM_KEYS`), as compared by the gate."""
    return {k: claim[k] for k in CLAIM_KEYS if k in claim}


_DEFINING = ("tolerance", "exception", "message", "category", "key", "expected", "section", "only_on", "only_if")


def _claim_label(claim: dict[str, Any]) -> str:
    return f"{claim.get('title') or claim['kind']!r} ({claim['kind']} of {', '.join(claim['runs'])})"


def _pair_key(claim: dict[str, Any]) -> tuple[Any, ...]:
    return (
        claim.get("kind"),
        tuple(claim.get("runs") or ()),
        claim.get("key"),
        claim.get("category"),
        claim.get("section"),
    )


def compare_with_declaration(
    record: dict[str, Any], declaration: Any, stale: bool = False
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]], set[str]]:
    """Compare a record with the example's declaration (see :mod:`mpguide.verify.claims.declarations`).

    A fresh record must hold exactly the declared runs (same recipe, precision, seed, plugin,
    Trainer arguments) and exactly the declared claims (same kind, runs, tolerance, expected
    value, message, title). Every difference is one failed ``declaration`` verdict naming the
    example, the claim or run, what differs and the fix (rerun the example).

    Args:
        record: the record.
        declaration: its example's :class:`mpguide.verify.claims.declarations.Declaration`.
        stale: the record is a reference made from an older version of the example: differences
            are expected, so none is a failure; declared claims the record did not hold, or whose
            runs changed, are returned as not judged.

    Returns:
        ``(problems, claims, runs)``: keyword arguments of failed verdicts; the declared claims
        that apply to the record's accelerator, each with ``""`` or the reason it is not judged;
        the ids of the runs whose implicit checks apply.
    """
    where = f"examples/{declaration.example}.py"
    fix = f"rerun the example ({hints.rerun(declaration.example)}) to write a record that matches it"
    problems: list[dict[str, Any]] = []

    def problem(title: str, runs: list[str], detail: str) -> None:
        problems.append(
            dict(
                kind="declaration",
                runs=runs,
                title=title,
                metric="declaration",
                value=None,
                threshold=f"as declared in {where}",
                passed=False,
                observed="differs",
                detail=f"{detail}; {fix}",
            )
        )

    recorded = {run["id"]: run for run in record["runs"]}
    matching: set[str] = set()
    for decl in declaration.runs:
        run = recorded.get(decl.id)
        if run is None:
            if not stale:
                problem(
                    f"run {decl.id} is missing",
                    [decl.id],
                    f"{where} declares run {decl.id!r} but the record has no such run",
                )
            continue
        spec = dict(run)
        if run.get("swapped_from"):
            problem(
                f"run {decl.id} trained another recipe",
                [decl.id],
                f"run {decl.id!r} trained recipe {run['recipe']!r} instead of the declared "
                f"{run['swapped_from']!r} (MPGUIDE_SWAP_RECIPE)",
            )
            spec["recipe"] = run["swapped_from"]
        keys = [k for k in decl.spec() if k != "id" and (not stale or k in spec)]
        diffs = [
            f"{k} is {spec.get(k)!r} in the record, {decl.spec()[k]!r} in {where}"
            for k in keys
            if spec.get(k) != decl.spec()[k]
        ]
        if diffs and not stale:
            problem(f"run {decl.id} differs", [decl.id], f"run {decl.id!r}: " + "; ".join(diffs))
        if not diffs:
            matching.add(decl.id)
    extra_runs = sorted(set(recorded) - {r.id for r in declaration.runs})
    if extra_runs and not stale:
        problem("runs not declared", extra_runs, f"the record holds run(s) {extra_runs} that {where} does not declare")

    accelerator = record.get("env", {}).get("accelerator", "cpu")
    declared = declaration.claims_for(accelerator)
    held = [dict(c) for c in record["claims"]]
    remaining = list(held)
    to_judge: list[tuple[dict[str, Any], str]] = []
    for claim in declared:
        twin = next((c for c in remaining if _pair_key(c) == _pair_key(claim)), None)
        if twin is not None:
            remaining.remove(twin)
        if stale:
            reason = ""
            if twin is None or any(twin.get(k) != claim.get(k) for k in _DEFINING if k != "only_on"):
                reason = (
                    "not judged: this stale record was made before the example declared this claim "
                    "(or with another definition of it)"
                )
            elif any(r not in matching for r in claim["runs"]):
                reason = "not judged: this stale record's runs were made with another recipe, precision or seed"
            to_judge.append((claim, reason))
            continue
        to_judge.append((claim, ""))
        if twin is None:
            problem(
                claim.get("title") or claim["kind"],
                list(claim["runs"]),
                f"claim {_claim_label(claim)} is declared in {where} but missing from the record",
            )
            continue
        diffs = [
            f"{k} is {twin.get(k)!r} in the record, {claim.get(k)!r} in {where}"
            for k in _DEFINING + ("title",)
            if twin.get(k) != claim.get(k)
        ]
        if diffs:
            problem(
                claim.get("title") or claim["kind"],
                list(claim["runs"]),
                f"claim {_claim_label(claim)} was altered: " + "; ".join(diffs),
            )
    if not stale:
        for claim in remaining:
            identity = claim_identity(claim)
            problem(
                claim.get("title") or str(claim.get("kind")),
                list(claim.get("runs") or []),
                f"the record holds a claim {where} does not declare: {identity}",
            )
    return problems, to_judge, (matching if stale else set(recorded))
