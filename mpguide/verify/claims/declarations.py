"""What each example promises, read from its source without training: the ``RUNS`` and ``CLAIMS`` tables.

Every example declares two literal tables at module level, before it trains::

    RUNS = [
        # run id        recipe       precision      options (optional)
        ("auto-fp32", "automatic", "32-true"),
        ("bug-fp16-plugin", "detached once", "16-mixed", {"plugin": "ManualMixedPrecision", "label": "..."}),
    ]
    CLAIMS = [
        # kind, then the arguments of the helper of that name in mpguide.verify.claims, in order
        ("match", "manual-fp32", "auto-fp32", "same-precision", "manual port = automatic (fp32)"),
        ("expect", "flag-16-mixed", "has_scaler", False, "CPU: no GradScaler", {"only_on": "cpu"}),
    ]

and passes them to :func:`mpguide.verify.run.runner.run_example`. Because both tables are Python literals
(strings, numbers, booleans, ``None``, tuples, lists and dicts only), :func:`~mpguide.verify.claims.declarations.read`
gets them with :func:`ast.literal_eval` from the file itself: the claim gate knows what an example
declares without importing torch or running anything, and compares every record with it
(:func:`mpguide.verify.claims.compare.compare_with_declaration`). A record can therefore not decide what it verifies.

Run options: ``label`` (legend text), ``plugin`` (a key of the plugin table passed to
``run_example``), ``trainer`` (extra ``Trainer`` keyword arguments), ``plain_flag`` (pass
``Trainer(precision=...)`` even on CPU), ``seed`` (default 0). Claim options: ``only_on``
(``"cpu"`` or ``"cuda"``: the claim applies to records made on that accelerator only), ``only_if`` (a
measured condition of :mod:`mpguide.verify.claims.conditions`, e.g. ``"lightning-autocast-caches"``: the record
holds the claim everywhere, and it is judged only where the condition holds, "not applicable on this release"
elsewhere).
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import claims as claims_mod
from ..hints import EXAMPLES_ENV as EXAMPLES_ENV
from ..hints import examples_dir as examples_dir
from . import conditions
from .compare import claim_identity, compare_with_declaration
from .judging import KINDS

#: Environment variable that trains some runs with another recipe, ``"example:run_id=recipe[,...]"``
#: (used by the tests to prove that a build fails when a correct run is replaced by a broken one).
SWAP_ENV = "MPGUIDE_SWAP_RECIPE"
#: Environment variable naming the folder of the examples (the docs build sets it).
#: Names of the two module-level tables an example must assign exactly once.
TABLES = ("RUNS", "CLAIMS")
#: Precision names a run may use (Lightning's spelling; the same as :data:`mpguide.verify.hardware.RUN_PRECISIONS`).
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")
_RUN_OPTIONS = {"label": str, "plugin": str, "trainer": dict, "plain_flag": bool, "seed": int}
_CLAIM_OPTIONS = {"only_on": ("cpu", "cuda")}


#: Keys of a run that define it (what the gate compares); ``label`` is presentation only.
RUN_KEYS = ("id", "recipe", "precision", "seed", "plugin", "trainer_kwargs", "plain_flag")


class DeclarationError(ValueError):
    """An example's ``RUNS``/``CLAIMS`` tables are missing, not literal, or malformed.

    The message names the example file, the table and the entry.
    """


@dataclass(frozen=True)
class RunDecl:
    """One declared training run.

    Attributes:
        id: unique run id within the example (e.g. ``"manual-bf16"``).
        recipe: key of the example's recipe table (a LightningModule factory).
        precision: ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``, ``"bf16-true"`` or ``"16-true"``.
        seed: seeds weights, data order and recipe randomness.
        plugin: key of the example's plugin table, or ``None`` for Lightning's own precision handling.
        trainer_kwargs: extra :class:`~lightning.pytorch.Trainer` keyword arguments.
        plain_flag: pass ``Trainer(precision=...)`` as a user would, even on CPU.
        label: legend text.
    """

    id: str
    recipe: str
    precision: str
    seed: int = 0
    plugin: str | None = None
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    plain_flag: bool = False
    label: str = ""

    def spec(self) -> dict[str, Any]:
        """The defining fields (:data:`~mpguide.verify.claims.declarations.RUN_KEYS`) as a JSON-ready dict."""
        return {k: v for k, v in asdict(self).items() if k in RUN_KEYS}


@dataclass(frozen=True)
class Declaration:
    """An example's declared runs and claims.

    Attributes:
        example: the example's file stem.
        runs: declared runs in display order.
        claims: claim dicts as built by the helpers of :mod:`mpguide.verify.claims` (plus ``only_on``).
    """

    example: str
    runs: tuple[RunDecl, ...]
    claims: tuple[dict[str, Any], ...]

    def run(self, run_id: str) -> RunDecl:
        """The declared run ``run_id``. Raises ``KeyError`` naming the example when absent."""
        for run in self.runs:
            if run.id == run_id:
                return run
        raise KeyError(f"{self.example} declares no run {run_id!r}")

    def claims_for(self, accelerator: str) -> list[dict[str, Any]]:
        """Claims that apply to a record made on ``accelerator`` (``"cpu"`` or ``"cuda"``)."""
        return [c for c in self.claims if c.get("only_on") in (None, accelerator)]

    def digest(self, accelerator: str | None = None) -> str:
        """SHA-256 (hex) of every run spec and claim definition (:func:`~mpguide.verify.claims.declarations.digest_of`).

        Args:
            accelerator: ``"cpu"`` or ``"cuda"``: only the claims that apply to a record made there
                (:meth:`claims_for`), i.e. the digest of what such a record must hold (what a record's
                ``source.declaration_sha256`` stores); ``None``: every claim.
        """
        claims = self.claims if accelerator is None else self.claims_for(accelerator)
        return digest_of([r.spec() for r in self.runs], claims)

    def compare(
        self, record: dict[str, Any], stale: bool = False
    ) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]], set[str]]:
        """:func:`~mpguide.verify.claims.compare.compare_with_declaration` of ``record`` with this declaration."""
        return compare_with_declaration(record, self, stale)


def digest_of(runs: Iterable[dict[str, Any]], claims: Iterable[dict[str, Any]]) -> str:
    """SHA-256 (hex) of the canonical JSON of run specs and claim definitions, in the order given.

    Only the defining keys count (:data:`~mpguide.verify.claims.declarations.RUN_KEYS` present in each run,
    :func:`~mpguide.verify.claims.compare.claim_identity` of each claim): measured values, titles, labels
    and judged values do not. A declaration's runs and claims and the copy a record holds of them
    give the same digest (:func:`~mpguide.verify.claims.declarations.record_digest`).

    Args:
        runs: run dicts (a record's ``runs`` or :meth:`RunDecl.spec` of declared runs).
        claims: claim dicts (a record's ``claims`` or declared claims).
    """
    payload = {
        "runs": [{k: run[k] for k in RUN_KEYS if k in run} for run in runs],
        "claims": [claim_identity(c) for c in claims],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def record_digest(record: dict[str, Any]) -> str:
    """:func:`~mpguide.verify.claims.declarations.digest_of` the runs and claims a record holds, as they were declared.

    A run trained with a swapped recipe (``MPGUIDE_SWAP_RECIPE``) counts with its declared recipe
    (``swapped_from``), as the declaration digest the record stores was computed from it. Equal to
    the record's ``source.declaration_sha256`` unless a run or claim was deleted, added or edited
    after the record was written.

    Args:
        record: a record that passed :func:`mpguide.verify.records.validate_record`.
    """
    runs = [dict(run, recipe=run["swapped_from"]) if run.get("swapped_from") else run for run in record["runs"]]
    return digest_of(runs, record["claims"])


def example_names(directory: Path | None = None) -> list[str]:
    """Stems of the gallery examples that train (``plot_*.py``) in ``directory``, sorted.

    ``directory`` defaults to :func:`~mpguide.verify.hints.examples_dir`.
    """
    return sorted(p.stem for p in Path(directory or examples_dir()).glob("plot_*.py"))


def example_file(example: str, directory: Path | None = None) -> Path:
    """Path of the example ``example`` (a file stem such as ``"plot_01_porting_to_manual"``)."""
    return Path(directory or examples_dir()) / f"{example}.py"


def from_tables(example: str, runs: Any, claims: Any, where: str = "") -> Declaration:
    """Build a :class:`~mpguide.verify.claims.declarations.Declaration` from the literal ``RUNS`` and ``CLAIMS`` tables.

    Args:
        example: file stem of the example.
        runs: list of ``(id, recipe, precision)`` or ``(id, recipe, precision, options)`` tuples.
        claims: list of ``(kind, *arguments)`` tuples, optionally ending with an options dict;
            the arguments are those of the helper ``mpguide.verify.claims.<kind>``, in order.
        where: file name used in messages (default ``examples/<example>.py``).

    Raises:
        DeclarationError: naming the file, table and entry: a malformed entry, a duplicate run
            id, an unknown precision, option, claim kind or tolerance, or a claim naming a run
            that is not declared.
    """
    where = where or f"examples/{example}.py"
    if not isinstance(runs, (list, tuple)) or not runs:
        raise DeclarationError(f"{where}: RUNS must be a non-empty list of (id, recipe, precision[, options])")
    if not isinstance(claims, (list, tuple)) or not claims:
        raise DeclarationError(
            f"{where}: CLAIMS must be a non-empty list: an example that claims nothing verifies nothing"
        )
    decl_runs = tuple(_run_entry(entry, i, where) for i, entry in enumerate(runs))
    ids = [r.id for r in decl_runs]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise DeclarationError(f"{where}: RUNS declares run id(s) {dupes} more than once")
    decl_claims = tuple(_claim_entry(entry, i, where, set(ids)) for i, entry in enumerate(claims))
    return Declaration(example, decl_runs, decl_claims)


def _run_entry(entry: Any, i: int, where: str) -> RunDecl:
    at = f"{where}: RUNS[{i}]"
    if not isinstance(entry, tuple) or len(entry) not in (3, 4) or not all(isinstance(x, str) and x for x in entry[:3]):
        raise DeclarationError(
            f"{at}: expected (id, recipe, precision[, options]) with non-empty strings, found {entry!r}"
        )
    run_id, recipe, precision = entry[:3]
    if precision not in PRECISIONS:
        raise DeclarationError(f"{at} ({run_id}): unknown precision {precision!r}; use one of {list(PRECISIONS)}")
    options = entry[3] if len(entry) == 4 else {}
    if not isinstance(options, dict):
        raise DeclarationError(f"{at} ({run_id}): options must be a dict, found {options!r}")
    for key, value in options.items():
        kind = _RUN_OPTIONS.get(key)
        if kind is None:
            raise DeclarationError(f"{at} ({run_id}): unknown option {key!r}; known: {sorted(_RUN_OPTIONS)}")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise DeclarationError(f"{at} ({run_id}): option {key!r} must be {kind.__name__}, found {value!r}")
    return RunDecl(
        run_id,
        recipe,
        precision,
        seed=options.get("seed", 0),
        plugin=options.get("plugin"),
        trainer_kwargs=dict(options.get("trainer", {})),
        plain_flag=options.get("plain_flag", False),
        label=options.get("label", run_id),
    )


def _claim_entry(entry: Any, i: int, where: str, run_ids: set[str]) -> dict[str, Any]:
    at = f"{where}: CLAIMS[{i}]"
    if not isinstance(entry, tuple) or len(entry) < 2 or entry[0] not in KINDS:
        raise DeclarationError(f"{at}: expected (kind, arguments...) with kind one of {list(KINDS)}, found {entry!r}")
    args, options = list(entry[1:]), {}
    if args and isinstance(args[-1], dict):
        options = args.pop()
    for key, value in options.items():
        if key == conditions.OPTION:
            problem = conditions.check(value, at)
            if problem:
                raise DeclarationError(problem)
        elif key not in _CLAIM_OPTIONS or value not in _CLAIM_OPTIONS[key]:
            known = {**_CLAIM_OPTIONS, conditions.OPTION: tuple(sorted(conditions.CONDITIONS))}
            raise DeclarationError(f"{at}: unknown claim option {key}={value!r}; known: {known}")
    try:
        claim = getattr(claims_mod, entry[0])(*args)
    except (TypeError, claims_mod.ClaimSpecError) as err:
        raise DeclarationError(f"{at} ({entry[0]}): {err}") from None
    missing = [r for r in claim["runs"] if r not in run_ids]
    if missing:
        raise DeclarationError(
            f"{at} ({claim.get('title') or entry[0]}): names run(s) {missing} that RUNS does not declare"
        )
    claim.update(options)
    return claim


def read(path: Path) -> Declaration:
    """Read the ``RUNS`` and ``CLAIMS`` tables of an example file without running it.

    Each table must be assigned exactly once at module level to a literal (no names, calls or
    comprehensions) and never modified with ``+=``, so that what this function reads is what the
    example trains.

    Raises:
        DeclarationError: the file is missing or has no parseable tables; names the file and the fix.
    """
    path = Path(path)
    if not path.is_file():
        raise DeclarationError(
            f"{path}: example not found; a record can only be judged against the example that declares its claims"
        )
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as err:
        raise DeclarationError(f"{path}: cannot be parsed ({err})") from None
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id in TABLES:
            raise DeclarationError(
                f"{path}:{node.lineno}: {node.target.id} is modified with an augmented "
                f"assignment; write the whole table as one literal"
            )
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Name) and target.id in TABLES and node.value is not None:
                if target.id in found:
                    raise DeclarationError(f"{path}:{node.lineno}: {target.id} is assigned twice; assign it once")
                found[target.id] = node.value
    tables = {}
    for name in TABLES:
        if name not in found:
            raise DeclarationError(
                f"{path}: no module-level `{name} = [...]` table; every example declares its "
                f"runs and claims as literal RUNS and CLAIMS tables (see mpguide.verify.claims.declarations)"
            )
        try:
            tables[name] = ast.literal_eval(found[name])
        except ValueError:
            raise DeclarationError(
                f"{path}:{found[name].lineno}: {name} is not a literal (it uses names, calls "
                f"or comprehensions); write it out with strings, numbers and dicts only"
            ) from None
    return from_tables(path.stem, tables["RUNS"], tables["CLAIMS"], where=str(path))


def example_swaps(example: str, swaps: dict[tuple[str, str], str]) -> dict[str, str]:
    """The entries of parsed ``MPGUIDE_SWAP_RECIPE`` ``swaps`` that apply to ``example``: run id -> recipe."""
    return {run: recipe for (name, run), recipe in swaps.items() if name == example}


def parse_swaps(value: str | None) -> dict[tuple[str, str], str]:
    """Parse ``MPGUIDE_SWAP_RECIPE`` (``"example:run_id=recipe,..."``) into ``{(example, run_id): recipe}``.

    Raises:
        DeclarationError: an entry not of the form ``example:run_id=recipe``.
    """
    swaps: dict[tuple[str, str], str] = {}
    for item in filter(None, (s.strip() for s in (value or "").split(","))):
        target, sep, recipe = item.partition("=")
        example, colon, run = target.partition(":")
        if not sep or not colon or not example.strip() or not run.strip() or not recipe.strip():
            raise DeclarationError(
                f"{SWAP_ENV} entry {item!r} is not of the form example:run_id=recipe "
                f"(e.g. plot_01_porting_to_manual:manual-bf16=scheduler every batch)"
            )
        swaps[(example.strip(), run.strip())] = recipe.strip()
    return swaps


#: Claim fields compared between a record and its declaration (titles are compared for fresh records).
