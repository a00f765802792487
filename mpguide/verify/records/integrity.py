"""What is wrong with a record whatever its example declares today: stale sources, edited runs or claims,
hardware fields that disagree, a reference in another device's folder.

The gate (:func:`mpguide.verify.gate.evaluate`) reports these first, as failed verdicts of kind ``stale`` or
``record``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import hints
from ..claims import declarations
from . import CodeDigestError, example_code_digest, library_code_digest
from .measures import declared
from .schema import claim_keys, declared_type


def staleness(record: dict[str, Any], examples: Path | None = None, include_library: bool = False) -> str:
    """Why ``record`` no longer describes the current sources, or ``""`` when it does.

    Compares the record's code digests (``source.example_code``, ``source.library_code``) with today's
    (:mod:`mpguide.verify.records.codedigest`): a docstring or comment edit keeps a record fresh; a record
    without code digests (written before them, or a reference the migration could not verify) is stale.

    Args:
        record: a schema-2 record.
        examples: folder of the examples (default :func:`mpguide.verify.hints.examples_dir`).
        include_library: also call it stale when the helper library changed (this build's records
            must come from the current library; a GPU reference only from the current example).
    """
    try:
        return _staleness(record, examples, include_library)
    except CodeDigestError as err:  # an example or library file that does not parse: it cannot be current
        return str(err)


def _staleness(record: dict[str, Any], examples: Path | None, include_library: bool) -> str:
    source = record.get("source") or {}
    reasons = []
    at = f" at commit {source['commit'][:7]}" if source.get("commit") else ""
    if not source.get("example_code"):
        reasons.append(
            f"the record has no code digest of examples/{record['example']}.py (source.example_code): it was made"
            f"{at} before records carried code digests, or its sources could not be verified"
        )
    elif source["example_code"] != example_code_digest(declarations.example_file(record["example"], examples)):
        reasons.append(
            f"the code of examples/{record['example']}.py changed since the record was made{at}"
            " (or the record's source digest was edited)"
        )
    if include_library and source.get("library_code") != library_code_digest():
        reasons.append("the code of the mpguide library changed since the record was made")
    return "; ".join(reasons)


def _fix(record: dict[str, Any], path: Path | str, reference: bool) -> str:
    """How to get a good record again: restore or refresh a committed reference, rerun a build's example."""
    if reference:
        return (
            f"restore the committed file (git checkout -- {path}) or refresh the references on that GPU "
            f"(nox -s docs_gpu -- --update-reference)"
        )
    return f"rerun the example ({hints.rerun(record['example'])})"


def integrity_problems(record: dict[str, Any], path: Path | str = "", reference: bool = False) -> list[tuple[str, str]]:
    """What is wrong with a record in itself, whatever its example declares today.

    Four checks, each giving at most one ``(title, detail)`` problem whose detail says what differs
    and the fix:

    * **runs and claims as written**: the record's runs and claims must still hash to the
      ``source.declaration_sha256`` it was written with (:func:`mpguide.verify.claims.declarations.record_digest`),
      so a run or claim deleted, added or edited later is noticed even in a stale reference, which
      is not compared with today's declaration;
    * **hardware fields agree**: ``env.accelerator`` is ``"cpu"`` or ``"cuda"``; a CPU record has a
      CPU device label (``"CPU (<n> cores)"``) and ``env.cuda == "cpu"``, a CUDA record neither; the
      torch build tag (``+cpu``, ``+cu130``) fits the accelerator and ``env.cuda``; the
      ``MPGUIDE_DEVICE`` and ``MPGUIDE_PRESET`` in ``source.run_env`` (when set) agree with
      ``env.accelerator`` and ``preset``;
    * **claims read declared keys**: every ``extra`` key a claim reads is declared with a type, by a probe
      or harness writer (its ``measures``: in the record's runs, or in the example's and the harness's
      sources, :func:`mpguide.verify.records.measures.declared`), so no claim absorbs an untyped value;
    * **reference folder** (``reference=True``): a committed reference was made on CUDA and lies in
      the folder named by its device (``results/reference/<slug>/``, :func:`mpguide.verify.hardware.device_slug`
      of ``env.device``), as :func:`mpguide_build.reference.update_reference` writes it.

    Args:
        record: a record that passed :func:`mpguide.verify.records.validate_record`.
        path: where it was read from (its folder name is checked for a reference).
        reference: a committed reference rather than this build's record.

    Returns:
        ``[(title, detail), ...]``, empty for a sound record.
    """
    fix = _fix(record, path, reference)
    problems: list[tuple[str, str]] = []
    stored = (record.get("source") or {}).get("declaration_sha256")
    actual = declarations.record_digest(record)
    counts = f"its {len(record['runs'])} run(s) and {len(record['claims'])} claim(s)"
    if not isinstance(stored, str) or not stored:
        problems.append(
            (
                "runs and claims as written",
                f"source.declaration_sha256 is {stored!r}, so a run or claim deleted from the record "
                f"could not be noticed; {fix}",
            )
        )
    elif stored != actual:
        problems.append(
            (
                "runs and claims as written",
                f"{counts} hash to {actual[:12]}, not to the source.declaration_sha256 {stored[:12]} "
                f"the record was written with: a run or claim was deleted, added or edited since; {fix}",
            )
        )

    env = record["env"]
    run_env = (record.get("source") or {}).get("run_env") or {}
    accelerator, device, cuda = env.get("accelerator"), str(env.get("device", "")), env.get("cuda")
    cpu_label = device.startswith("CPU")
    clashes = []
    if accelerator not in ("cpu", "cuda"):
        clashes.append(f"env.accelerator is {accelerator!r}, not 'cpu' or 'cuda'")
    elif accelerator == "cuda" and cpu_label:
        clashes.append(f"env.accelerator is 'cuda' but env.device is {device!r}, a CPU label")
    elif accelerator == "cpu" and not cpu_label:
        clashes.append(f"env.accelerator is 'cpu' but env.device is {device!r}, not a CPU label ('CPU (<n> cores)')")
    if accelerator == "cuda" and cuda == "cpu":
        clashes.append("env.accelerator is 'cuda' but env.cuda is 'cpu'")
    elif accelerator == "cpu" and cuda != "cpu":
        clashes.append(f"env.accelerator is 'cpu' but env.cuda is {cuda!r}, not 'cpu'")
    tag = str(env.get("torch", "")).partition("+")[2]  # the wheel's build: "cpu", "cu130", "" (built from source)
    if accelerator == "cuda" and tag == "cpu":
        clashes.append(f"env.accelerator is 'cuda' but env.torch is {env.get('torch')!r}, a CPU build")
    elif tag.startswith("cu") and isinstance(cuda, str) and cuda != "cpu" and tag != "cu" + cuda.replace(".", ""):
        clashes.append(f"env.torch {env.get('torch')!r} is a {tag} build but env.cuda is {cuda!r}")
    if run_env.get("MPGUIDE_DEVICE") in ("cpu", "cuda") and run_env["MPGUIDE_DEVICE"] != accelerator:
        clashes.append(
            f"source.run_env.MPGUIDE_DEVICE is {run_env['MPGUIDE_DEVICE']!r} but env.accelerator is {accelerator!r}"
        )
    if isinstance(run_env.get("MPGUIDE_PRESET"), str) and run_env["MPGUIDE_PRESET"] != record["preset"]:
        clashes.append(
            f"source.run_env.MPGUIDE_PRESET is {run_env['MPGUIDE_PRESET']!r} but preset is {record['preset']!r}"
        )
    if clashes:
        problems.append(
            ("hardware fields agree", "; ".join(clashes) + f": the fields were edited or come from two records; {fix}")
        )

    if reference:
        from ..hardware import ConfigurationError, device_slug  # imports torch: only when judging references

        folder = Path(path).parent.name
        try:
            slug = device_slug(device)
        except ConfigurationError:
            slug = ""
        if accelerator != "cuda":
            problems.append(
                (
                    "reference made on a GPU",
                    f"a committed GPU reference has env.accelerator {accelerator!r} ({device!r}); "
                    f"references come from nox -s docs_gpu -- --update-reference on a CUDA machine: "
                    f"delete it or refresh the folder there",
                )
            )
        elif slug != folder:
            problems.append(
                (
                    "reference in its device's folder",
                    f"it lies in reference folder {folder!r} but env.device is {device!r} (device slug "
                    f"{slug!r}); move it to results/reference/{slug or '<device-slug>'}/, or refresh "
                    f"the references on that GPU (nox -s docs_gpu -- --update-reference)",
                )
            )
    problems += undeclared_keys(record)
    return problems


def undeclared_keys(record: dict[str, Any]) -> list[tuple[str, str]]:
    """One problem per claim that reads an ``extra`` key no probe declares (see :func:`integrity_problems`)."""
    runs = [run for run in record.get("runs") or [] if isinstance(run, dict)]
    known = [declared(str(record.get("example", "")))] + [run["measures"] for run in runs if run.get("measures")]
    problems = []
    for claim in record.get("claims") or []:
        missing = [key for key in claim_keys(claim) if not any(declared_type(m, key) for m in known)]
        if missing:
            problems.append(
                (
                    "claims read declared keys",
                    f"claim {claim.get('title', '')!r} reads extra key {missing[0]!r}, which no probe declares; "
                    f"declare it where it is measured (the measures of the probe that records it, type names in "
                    f"mpguide.verify.records.schema.MEASURE_TYPES)",
                )
            )
    return problems
