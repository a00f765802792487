"""The claim gate: judge every results record of a build and fail loudly when a claim fails.

Used three ways, always through :func:`~mpguide.gate.check`:

* ``python -m mpguide.gate [PATH ...] [--expect EXAMPLE ...]`` (also installed as ``mpguide-gate``):
  exit status 0 when every claim passes, 1 when a claim fails, 2 when a record is missing or
  unreadable;
* the Sphinx extension :mod:`mpguide.sphinx_ext` at ``build-finished``;
* the test suite.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from .claims import Verdict, evaluate_record
from .records import RecordError, load_record, record_path
from .report import format_table, verdict_rows


class GateFailure(Exception):
    """At least one claim failed or one record could not be judged; ``str()`` lists every problem."""

    def __init__(self, report: "GateReport") -> None:
        self.report = report
        super().__init__(report.failure_message())


@dataclass
class GateReport:
    """Everything the gate found.

    Attributes:
        verdicts: every verdict of every readable record.
        record_errors: one message per missing or unreadable record.
        records: paths judged, in order.
    """

    verdicts: list[Verdict] = field(default_factory=list)
    record_errors: list[str] = field(default_factory=list)
    records: list[Path] = field(default_factory=list)

    @property
    def failures(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.passed]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.record_errors and bool(self.records)

    def failure_message(self) -> str:
        lines = [f"claim gate: {len(self.failures)} failed claim(s), {len(self.record_errors)} record error(s)"]
        lines += [f"  - {v.message()}" for v in self.failures]
        lines += [f"  - {e}" for e in self.record_errors]
        if not self.records and not self.record_errors:
            lines.append("  - no results records were found: nothing was verified")
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


def judge(paths: Sequence[Path], expected: Sequence[str] = (), expected_dir: Path | None = None) -> GateReport:
    """Judge the records at ``paths``; never raises for bad records, collects them instead.

    Args:
        paths: record files.
        expected: example names whose records must exist in ``expected_dir`` (a missing one is a
            record error: an example that wrote nothing verified nothing).
        expected_dir: folder of this build's records.
    """
    report = GateReport()
    paths = list(paths)
    for name in expected:
        path = record_path(name, expected_dir)
        if path not in paths:
            paths.append(path)
    for path in paths:
        try:
            record = load_record(path)
        except RecordError as err:
            report.record_errors.append(str(err))
            continue
        report.records.append(Path(path))
        report.verdicts += evaluate_record(record, str(path))
    return report


def check(paths: Sequence[Path], expected: Sequence[str] = (), expected_dir: Path | None = None) -> GateReport:
    """Like :func:`~mpguide.gate.judge`, but raise when anything failed.

    Raises:
        GateFailure: a claim failed, a record is missing or unreadable, or no record was given.
    """
    report = judge(paths, expected, expected_dir)
    if not report.ok:
        raise GateFailure(report)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry; returns the exit status (0 pass, 1 claim failed, 2 record error)."""
    parser = argparse.ArgumentParser(prog="python -m mpguide.gate", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[Path("results")],
                        help="record files or folders (searched recursively); default: results/")
    parser.add_argument("--expect", action="append", default=[], metavar="EXAMPLE",
                        help="example whose record must exist in --expect-dir (repeatable)")
    parser.add_argument("--expect-dir", type=Path, default=None, help="folder of the expected records")
    args = parser.parse_args(argv)
    report = judge(find_records(args.paths), args.expect, args.expect_dir)
    if report.verdicts:
        print(format_table(verdict_rows(report.verdicts), ("claim", "runs", "metric", "value", "threshold",
                                                           "verdict", "hardware")))
    if report.ok:
        print(f"claim gate: {len(report.verdicts)} checks in {len(report.records)} record(s) passed")
        return 0
    print(report.failure_message(), file=sys.stderr)
    return 2 if report.record_errors or not report.records else 1


if __name__ == "__main__":
    sys.exit(main())
