"""Judge a PitfallChecks by the corpus: crashes, false alarms and misses, case by case.

    PYTHONPATH=. python -m tests.checks_corpus.compare            # this tree's mpguide.checks
    PYTHONPATH=. python -m tests.checks_corpus.compare 5a6abb2    # mpguide/checks.py as of that commit (git show)

A crash is a fit that raised; a false alarm is a section found that the case does not expect (on a correct case,
any section); a miss is an expected section not found. ``known_miss`` cases are listed apart (they expect nothing).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

from . import all_cases, run_case

ROOT = Path(__file__).resolve().parents[2]


def checks_at(revision: str) -> Any:
    """``PitfallChecks`` from ``mpguide/checks.py`` as of ``revision``, imported as ``mpguide._checks_<revision>``
    (its relative imports resolve in this tree's package). Raises ``LookupError`` when git cannot show it."""
    try:
        source = subprocess.run(
            ["git", "show", f"{revision}:mpguide/checks.py"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise LookupError(f"git cannot show mpguide/checks.py at {revision} in {ROOT}: {err}") from err
    name = f"mpguide._checks_{revision}"
    module = types.ModuleType(name)
    module.__package__ = "mpguide"
    module.__file__ = f"<{revision}:mpguide/checks.py>"
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module.PitfallChecks


def judge(checks_cls: Any) -> dict[str, Any]:
    """Run every case; returns the rows and the counts of crashes, false alarms and misses."""
    rows = []
    counts = {"cases": 0, "crashes": 0, "false_alarms": 0, "misses": 0, "known_misses": 0}
    for case in all_cases():
        result = run_case(case, checks_cls)
        extra = sorted(result["sections"] - case.expect)
        missing = sorted(case.expect - result["sections"])
        crash = result["error"] is not None
        counts["cases"] += 1
        counts["crashes"] += crash
        counts["false_alarms"] += bool(extra)
        counts["misses"] += bool(missing) and not crash
        counts["known_misses"] += bool(case.known_miss)
        rows.append({"case": case.name, "error": result["error"], "extra": extra, "missing": missing})
    return {"rows": rows, "counts": counts}


def main(argv: list[str]) -> int:
    for name in ("lightning", "lightning.pytorch", "lightning.pytorch.utilities.rank_zero", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if argv:
        checks_cls = checks_at(argv[0])
    else:
        from mpguide.checks import PitfallChecks as checks_cls
    report = judge(checks_cls)
    for row in report["rows"]:
        bad = row["error"] or row["extra"] or row["missing"]
        print(
            f"{'BAD' if bad else 'ok ':3} {row['case']:42} error={row['error']} "
            f"extra={row['extra']} missing={row['missing']}"
        )
    print(report["counts"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
