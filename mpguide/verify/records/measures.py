"""The ``extra`` keys a run measures and their types, read from where they are declared.

A probe (a Lightning or Fabric callback with ``record_extra()``) declares what it measures as a class attribute,
``measures = {"updates_applied": "count", "final_weights": "name"}``; the harness's own writers declare theirs as a
module-level ``MEASURES`` literal (:mod:`mpguide.verify.run.strategy`, :mod:`mpguide.verify.run.distributed`,
:mod:`mpguide.verify.run.throughput`). Type names are those of :data:`mpguide.verify.records.schema.MEASURE_TYPES`.

The runner writes each run's declarations into its record (``runs[].measures``), so the gate, which reads JSON
only, types every run's ``extra`` with what its probes declared, and refuses a claim that reads a key its runs
do not declare. A record written before probes declared their keys (a committed GPU reference, an upgraded
record) carries none: :func:`declared` reads the same literals from the sources, without importing or running
them (like :mod:`mpguide.verify.claims.declarations` reads ``RUNS`` and ``CLAIMS``).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import hints
from .schema import declared_type

#: The harness folder whose modules write ``extra`` keys (their probes and ``MEASURES``).
RUN_DIR = Path(__file__).resolve().parents[1] / "run"


def measures_of(obj: Any) -> dict[str, str]:
    """The ``measures`` a probe instance (or class) declares; ``{}`` when it declares none."""
    found = getattr(obj if isinstance(obj, type) else type(obj), "measures", None)
    return dict(found) if isinstance(found, dict) else {}


def merge(declarations: Iterable[dict[str, str]]) -> dict[str, str]:
    """One dict from several declarations, in order (a later probe redeclaring a key wins, as its value does)."""
    out: dict[str, str] = {}
    for declaration in declarations:
        out.update(declaration)
    return out


def _literal_dicts(tree: ast.Module) -> list[dict[str, str]]:
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        value = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        if not names & {"measures", "MEASURES"} or not isinstance(value, ast.Dict):
            continue
        try:
            literal = ast.literal_eval(value)
        except ValueError:
            continue
        if all(isinstance(k, str) and isinstance(v, str) for k, v in literal.items()):
            found.append(literal)
    return found


@functools.cache
def declared_in(path: Path) -> dict[str, str]:
    """Every ``measures``/``MEASURES`` dict literal of one source file, merged (``{}`` if it has none or is gone)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}
    return merge(_literal_dicts(tree))


def harness_declared() -> dict[str, str]:
    """What the harness's own writers and probes declare (every module under ``mpguide/verify/run``)."""
    return merge(declared_in(p) for p in sorted(RUN_DIR.rglob("*.py")))


def declared(example: str, examples: Path | None = None) -> dict[str, str]:
    """The declarations a run of ``example`` can carry: the harness's and the example's own probes' (from source)."""
    folder = Path(examples or hints.examples_dir())
    return merge([harness_declared(), declared_in(folder / f"{example}.py")])


def with_harness_declarations(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` with ``measures`` complete: its probes' declarations, and the harness's for every other key it holds.

    The runner gathers what the run's probes declare (their ``measures``); a key a harness writer adds
    (``global_step``, a DDP count, a throughput rate declared by a pattern) is declared here by name.
    """
    own = dict(run.get("measures") or {})
    harness = harness_declared()
    for key in run.get("extra") or {}:
        kind = declared_type(harness, key)
        if key not in own and kind is not None:
            own[key] = kind
    return {**run, "measures": dict(sorted(own.items()))}
