"""The claim gate: judge every results record against what its example declares, and fail loudly.

Each record is compared with the ``RUNS`` and ``CLAIMS`` tables of the example it names, read
from the example's source without running it (:mod:`mpguide.verify.claims.declarations`); the declared claims
are judged, never the record's own copy (:func:`mpguide.verify.claims.evaluate_record`). Two kinds of
records:

* **this build's records** (``_build/results`` by default) must be current: produced from the
  example's and the library's code as it is now (code digests, :mod:`mpguide.verify.records.codedigest`:
  a docstring or comment edit keeps a record current), with exactly the declared runs and claims; a
  stale record of this build fails the gate;
* **committed references** (``results/reference/<device>/``, from a GPU) may be **stale**: made
  from older example code. A stale reference is labelled as such (STALE on the pages), and only the
  declared claims it already held, on unchanged runs, are judged; the others are "not judged". This
  rule for references is kept as it was, and differs on purpose from the version matrix's stale cells,
  which show no verdict at all (:mod:`mpguide_build.matrix_summary`): a reference's claims are
  compared one by one with today's declaration, a matrix cell's verdicts are not.

Every record is also checked in itself (:func:`mpguide.verify.records.integrity.integrity_problems`): its runs and
claims must still hash to the ``source.declaration_sha256`` it was written with (so a claim deleted
from a stale reference fails instead of turning into "not judged"), its hardware fields must agree
with each other, and a reference must lie in the folder of the device it was made on.

A claim can also be **inconclusive** (a throughput parity claim whose interval still straddles its
band edge at the benchmark's cap of rounds; :data:`mpguide.verify.claims.tolerances.PAIRED_RULE`). It is counted
apart, never as a pass: the summary line counts it, one line per such claim follows ("INCONCLUSIVE
(not a pass)"), the exit status stays 0 and a Sphinx build does not fail
(:data:`mpguide.verify.claims.tolerances.INCONCLUSIVE_RULE` says why).

Used three ways, always through :func:`~mpguide.verify.gate.judge`:

* ``python -m mpguide.verify.gate`` (also installed as ``mpguide-gate``; see ``--help`` for exit codes);
* the Sphinx extension :mod:`mpguide_build.sphinx_ext` at ``build-finished``;
* the test suite.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import hints
from .claims import declarations, evaluate_record
from .claims.conditions import NOT_APPLICABLE
from .claims.verdicts import Verdict, hardware_label
from .records import REPO_ROOT, RecordError, load_record, record_path, reference_dir
from .records.integrity import integrity_problems, staleness
from .show.report import format_table, verdict_rows

#: Where ``python -m mpguide.verify.gate`` looks without arguments (what ``nox -s docs`` writes).
DEFAULT_BUILD_RESULTS = REPO_ROOT / "_build" / "results"

#: The exit statuses of ``python -m mpguide.verify.gate``, as ``--help`` prints them.
EXIT_CODES = """exit status:
  0  every judged claim passed, or is inconclusive (a noisy throughput claim the data could not decide: listed
     as INCONCLUSIVE, never counted as passed; stale references are reported, not failed)
  1  a claim failed, or a record differs from its example's declaration, or a build record is stale,
     or a record was edited after it was written (its runs or claims no longer hash to its
     source.declaration_sha256, its hardware fields disagree, a reference lies in another device's folder)
  2  a record is missing, unreadable, of another schema version or malformed (a field missing or of
     the wrong type, a number not finite where the schema says so: mpguide.verify.records.schema), or no record was
     found"""


class GateFailure(Exception):
    """At least one claim failed or one record could not be judged; ``str()`` lists every problem."""

    def __init__(self, report: GateReport) -> None:
        self.report = report
        super().__init__(report.failure_message())


@dataclass
class GateReport:
    """Everything the gate found.

    Attributes:
        verdicts: every verdict of every readable record.
        record_errors: one message per missing or unreadable record.
        records: paths judged, in order.
        stale: path -> why that reference is stale (what changed since it was recorded).
    """

    verdicts: list[Verdict] = field(default_factory=list)
    record_errors: list[str] = field(default_factory=list)
    records: list[Path] = field(default_factory=list)
    stale: dict[str, str] = field(default_factory=dict)

    @property
    def failures(self) -> list[Verdict]:
        """Judged verdicts that did not pass."""
        return [v for v in self.verdicts if v.failed]

    @property
    def inconclusive(self) -> list[Verdict]:
        """Judged verdicts the data could not decide (neither passed nor failed)."""
        return [v for v in self.verdicts if v.undecided]

    @property
    def ok(self) -> bool:
        """No failure, no record error, and at least one record judged (inconclusive claims do not fail it;
        they are listed by :meth:`summary`)."""
        return not self.failures and not self.record_errors and bool(self.records)

    def failure_message(self) -> str:
        """Every failure and record error, one per line, under a count."""
        if not self.records and not self.record_errors and not self.failures:
            return (
                "claim gate: no results records were found, so nothing was verified; run the examples "
                f"({hints.rerun('plot_XX')}), then judge their records"
            )
        lines = [f"claim gate: {len(self.failures)} failed claim(s), {len(self.record_errors)} record error(s)"]
        lines += [f"  - {v.message()}" for v in self.failures]
        lines += [f"  - {e}" for e in self.record_errors]
        return "\n".join(lines)

    def summary(self) -> str:
        """One line: checks passed, failed, inconclusive, not judged, not applicable on this release (claims
        declared ``only_if`` a measured condition the record does not meet); plus a line per inconclusive claim
        and per stale reference."""
        judged = [v for v in self.verdicts if v.judged]
        inapplicable = [v for v in judged if not v.applicable]
        lines = [
            f"claim gate: {sum(v.passed for v in judged)} checks passed, {len(self.failures)} failed, "
            f"{len(self.inconclusive)} inconclusive, {len(self.verdicts) - len(judged)} not judged, "
            f"{len(inapplicable)} {NOT_APPLICABLE} (only_if), in {len(self.records)} record(s)"
        ]
        lines += [f"  INCONCLUSIVE (not a pass): {v.message()}" for v in self.inconclusive]
        lines += [f"  stale reference {path}: {why}" for path, why in self.stale.items()]
        return "\n".join(lines)


def find_records(locations: Iterable[Path]) -> list[Path]:
    """Record files at ``locations``: files as given, folders searched recursively for ``*.json``."""
    found: list[Path] = []
    for loc in map(Path, locations):
        if loc.is_dir():
            found += sorted(p for p in loc.rglob("*.json") if not p.name.startswith("."))
        else:
            found.append(loc)
    return found


def evaluate(
    record: dict[str, Any], path: Path | str = "", reference: bool = False, examples: Path | None = None
) -> tuple[list[Verdict], str]:
    """Judge one record against its example's declaration.

    Args:
        record: a validated record.
        path: where it was read from (for messages).
        reference: a committed reference (may be stale) rather than this build's record.
        examples: folder of the examples.

    Returns:
        ``(verdicts, stale)``: the verdicts, and why a reference is stale (``""`` when current).
        A stale record of this build is one failed verdict instead. Each problem of the record in
        itself (:func:`~mpguide.verify.records.integrity.integrity_problems`) comes first, as a failed verdict of kind
        ``"record"``.
    """
    hardware = hardware_label(record.get("env", {}))
    checks = [
        Verdict(
            record["example"],
            "record",
            [],
            title,
            "record",
            None,
            "as written",
            False,
            record=str(path),
            hardware=hardware,
            observed="differs",
            detail=detail,
        )
        for title, detail in integrity_problems(record, path, reference)
    ]
    source = declarations.example_file(record["example"], examples)
    if not source.parent.is_dir():  # a reader's folder with a downloaded example: no checkout to compare with
        note = Verdict(
            record["example"],
            "declaration",
            [],
            "compared with the example's declaration",
            "declaration",
            None,
            "examples/ present",
            False,
            record=str(path),
            hardware=hardware,
            judged=False,
            observed="not compared",
            detail=f"there is no examples folder ({source.parent}), as after downloading one example: "
            f"the record's own claims are judged, not compared with a declaration",
        )
        return checks + [note] + evaluate_record(record, str(path)), ""
    try:
        declaration = declarations.read(source)
    except declarations.DeclarationError as err:
        detail = (
            f"the record is of example {record['example']!r}, which no longer exists; delete the record"
            if not source.is_file()
            else f"{err}; fix the example's tables"
        )
        return checks + [
            Verdict(
                record["example"],
                "declaration",
                [],
                "the example declares these claims",
                "declaration",
                None,
                "example exists",
                False,
                detail=detail,
                record=str(path),
                hardware=hardware,
                observed="no declaration",
            )
        ], ""
    stale = staleness(record, examples, include_library=not reference)
    if stale and not reference:
        verdict = Verdict(
            record["example"],
            "stale",
            [],
            "the record is current",
            "source",
            None,
            "made from the current sources",
            False,
            record=str(path),
            hardware=hardware,
            observed="stale",
            detail=f"{stale}; rerun the example ({hints.rerun(record['example'])})",
        )
        return checks + [verdict] + evaluate_record(record, str(path), declaration), ""
    return checks + evaluate_record(record, str(path), declaration, stale=bool(stale)), stale


def judge(
    paths: Sequence[Path],
    expected: Sequence[str] = (),
    expected_dir: Path | None = None,
    references: Sequence[Path] = (),
    examples: Path | None = None,
) -> GateReport:
    """Judge this build's records at ``paths`` and the committed ``references``; never raises for bad records.

    Args:
        paths: this build's record files.
        expected: example names whose records must exist in ``expected_dir`` (a missing one is a
            record error: an example that wrote nothing verified nothing).
        expected_dir: folder of this build's records.
        references: committed reference record files (may be stale).
        examples: folder of the examples whose declarations are compared.
    """
    report = GateReport()
    paths = list(paths)
    for name in expected:
        path = record_path(name, expected_dir)
        if path not in paths:
            paths.append(path)
    for path, reference in [(p, False) for p in paths] + [(p, True) for p in references]:
        try:
            record = load_record(path)
        except RecordError as err:
            report.record_errors.append(str(err))
            continue
        report.records.append(Path(path))
        verdicts, stale = evaluate(record, path, reference, examples)
        report.verdicts += verdicts
        if stale:
            report.stale[str(path)] = stale
    return report


def check(
    paths: Sequence[Path],
    expected: Sequence[str] = (),
    expected_dir: Path | None = None,
    references: Sequence[Path] = (),
) -> GateReport:
    """Like :func:`~mpguide.verify.gate.judge`, but raise when anything failed.

    Raises:
        GateFailure: a claim failed, a record is missing, unreadable or differs from its
            declaration, or no record was given.
    """
    report = judge(paths, expected, expected_dir, references)
    if not report.ok:
        raise GateFailure(report)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry; returns the exit status (see :data:`~mpguide.verify.gate.EXIT_CODES`)."""
    parser = argparse.ArgumentParser(
        prog="python -m mpguide.verify.gate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Judge results records against the claims their examples declare.\n\nWithout record paths: "
        "this build's records in _build/results (one for every example in examples/ must be "
        "there) and the committed references in results/reference (what `nox -s gate` does).",
        epilog=EXIT_CODES,
    )
    parser.add_argument(
        "paths", nargs="*", type=Path, help="this build's record files or folders (searched recursively)"
    )
    parser.add_argument(
        "--reference",
        action="append",
        default=None,
        type=Path,
        metavar="PATH",
        help="committed reference records (file or folder; repeatable); these may be stale",
    )
    parser.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="EXAMPLE",
        help="example whose record must exist in --expect-dir (repeatable)",
    )
    parser.add_argument("--expect-dir", type=Path, default=None, help="folder of the expected records")
    args = parser.parse_args(argv)
    paths, refs, expect, expect_dir = args.paths, args.reference, args.expect, args.expect_dir
    problems = []
    if not paths and refs is None:  # the last build (every example must have left its record) + references
        paths, refs, expect_dir = (
            [DEFAULT_BUILD_RESULTS],
            [r for r in [reference_dir()] if r.exists()],
            DEFAULT_BUILD_RESULTS,
        )
        expect = expect or declarations.example_names()
    else:  # paths named on the command line must exist and hold records: an empty folder verified nothing
        problems += [
            f"{r}: no such reference file or folder; fix the path, or leave --reference out"
            for r in refs or []
            if not r.exists()
        ]
    found = find_records(paths)
    if args.paths and refs and not found and not expect:  # without --reference: "nothing was verified"
        problems.append(
            f"{', '.join(map(str, paths))}: no record found (no *.json); run the examples or "
            f"build the docs first, or name the folder that holds their records"
        )
    report = judge(found, expect, expect_dir, find_records(r for r in refs or [] if r.exists()))
    report.record_errors = problems + report.record_errors
    if report.verdicts:
        print(
            format_table(verdict_rows(report.verdicts), ("verdict", "claim", "runs", "value", "threshold", "hardware"))
        )
    print(report.summary())
    if report.ok:
        return 0
    print(report.failure_message(), file=sys.stderr)
    return 2 if report.record_errors or not report.records else 1


if __name__ == "__main__":
    sys.exit(main())
