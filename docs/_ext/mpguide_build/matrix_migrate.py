"""The one-off migration of results made before code digests: matrix cells get their keys, GPU references their
code digests, only where the byte digests they hold are proven to be those of known sources.

``python -m mpguide_build.matrix migrate --from-commit 5a6abb2`` reads the example and library sources at that
commit from git (``git show``), recomputes the old **byte** digests there (the algorithms of
:func:`mpguide.verify.records.file_digest` and :func:`mpguide.verify.records.bytes_digest_of`) and, for each cell
or reference without code digests, writes the **code** digests of those same sources only where the recorded
byte digest equals the recomputed one. Anything else gets ``null`` and stays stale: today's digest is never
written into a result. A reference is also checked against the commit it names itself (``source.commit``), the
sources it was made from; a summary names none.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from mpguide.verify import records
from mpguide.verify.records.codedigest import CodeDigestError, code_digest, tree_code_digest

from .matrix_summary import MatrixError, load, write_summary


class Sources:
    """The example and library files of one commit, read from git once, with their byte and code digests."""

    def __init__(self, commit: str, root: Path | None = None) -> None:
        self.root = Path(root or records.REPO_ROOT)
        self.commit = self._git("rev-parse", "--verify", f"{commit}^{{commit}}").decode().strip()
        names = self._git("ls-tree", "-r", "--name-only", self.commit, "--", "mpguide/").decode().split("\n")
        self.library = {
            n[len("mpguide/") :]: self._git("show", f"{self.commit}:{n}")
            for n in names
            if n.endswith(".py") and "__pycache__" not in n
        }
        self._examples: dict[str, bytes | None] = {}

    def _git(self, *args: str) -> bytes:
        try:
            return subprocess.run(["git", *args], cwd=self.root, capture_output=True, check=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as err:
            raise MatrixError(
                f"git {' '.join(args)} failed in {self.root}: {err}; migrate from a git checkout"
            ) from None

    def example(self, name: str) -> bytes | None:
        """Bytes of ``examples/<name>.py`` at the commit, ``None`` when it has no such file."""
        if name not in self._examples:
            try:
                self._examples[name] = self._git("show", f"{self.commit}:examples/{name}.py")
            except MatrixError:
                self._examples[name] = None
        return self._examples[name]

    def example_code(self, name: str, recorded_sha256: str | None) -> str | None:
        """The code digest of the example at the commit when its SHA-256 is ``recorded_sha256``, else ``None``."""
        data = self.example(name)
        if data is None or not recorded_sha256 or hashlib.sha256(data).hexdigest() != recorded_sha256:
            return None
        try:
            return code_digest(data)
        except CodeDigestError:
            return None

    def library_code(self, recorded_sha256: str | None, exclude: frozenset[str] = frozenset()) -> str | None:
        """The library's code digest at the commit when its byte digest (without ``exclude``) is ``recorded_sha256``."""
        files = {k: v for k, v in self.library.items() if k not in exclude}
        if not recorded_sha256 or records.bytes_digest_of(files.items()) != recorded_sha256:
            return None
        return tree_code_digest(files.items())


def migrate_summary(summary: dict[str, Any], sources: Sources) -> tuple[dict[str, Any], int, int]:
    """``summary`` with keys on every cell that has none: ``(summary, cells migrated, cells left stale)``.

    A cell is migrated when its ``example_sha256`` and the column's ``library_sha256`` (the library without
    :data:`mpguide.verify.records.PRESENTATION_MODULES`) are the byte digests of the sources at the commit; its
    versions are the column's. Otherwise its unverified code keys are ``null`` (stale).
    """
    library = sources.library_code(summary.get("library_sha256"), records.PRESENTATION_MODULES)
    migrated = stale = 0
    out = json.loads(json.dumps(summary))
    for name, entry in out["examples"].items():
        if entry.get("keys") is not None:
            continue
        example = sources.example_code(name, entry.get("example_sha256"))
        entry["keys"] = {
            "example_code": example,
            "library_code": library,
            "python": summary.get("python"),
            "torch": summary.get("torch"),
            "lightning": summary.get("lightning_version") or summary.get("lightning"),
            "created": summary.get("created"),
            "commit": None,
            "migrated_from": sources.commit,
        }
        if example and library:
            migrated += 1
        else:
            stale += 1
    return out, migrated, stale


def migrate_reference(record: dict[str, Any], candidates: list[Sources]) -> tuple[dict[str, Any], bool]:
    """A GPU reference with ``source.example_code``/``library_code`` added where verified: ``(record, verified)``.

    Each candidate commit is tried in turn (the ``--from-commit``, then the commit the record names); the first
    whose example bytes match ``source.example_sha256`` gives ``example_code``, the first whose whole library
    matches ``source.library_sha256`` gives ``library_code``. Unverified ones are ``null`` (the reference reads
    stale and is judged on its unchanged claims, as before).
    """
    out = json.loads(json.dumps(record))
    source = out["source"]
    if source.get("example_code"):
        return out, True
    example = library = None
    for sources in candidates:
        example = example or sources.example_code(out["example"], source.get("example_sha256"))
        library = library or sources.library_code(source.get("library_sha256"))
    source["example_code"], source["library_code"] = example, library
    return out, bool(example)


def migrate(
    from_commit: str, matrix_dir: Path, reference_dir: Path | None = None, root: Path | None = None
) -> dict[str, Any]:
    """Migrate every summary in ``matrix_dir`` and every reference under ``reference_dir`` (see the module).

    Returns:
        ``{"cells_migrated", "cells_stale", "references_migrated", "references_stale", "lines"}`` (one line per file).
    """
    base = Sources(from_commit, root)
    cache: dict[str, Sources] = {base.commit: base}
    totals: dict[str, Any] = {
        "cells_migrated": 0,
        "cells_stale": 0,
        "references_migrated": 0,
        "references_stale": 0,
        "lines": [],
    }
    for path in sorted(Path(matrix_dir).glob("*.json")):
        summary, migrated, stale = migrate_summary(load(path), base)
        if migrated or stale:
            write_summary(summary, path.parent)
        totals["cells_migrated"] += migrated
        totals["cells_stale"] += stale
        totals["lines"].append(f"{path}: {migrated} cells migrated, {stale} left stale")
    for path in sorted(Path(reference_dir).glob("*/*.json")) if reference_dir else []:
        record = records.load_record(path)
        if record["source"].get("example_code"):
            continue
        candidates = [base]
        own = record["source"].get("commit")
        if own:
            try:
                candidates.append(cache.get(own) or cache.setdefault(own, Sources(own, root)))
            except MatrixError:
                pass  # a commit this clone does not have: only the --from-commit is tried
        out, verified = migrate_reference(record, candidates)
        records.write_record(out, path)
        totals["references_migrated" if verified else "references_stale"] += 1
        totals["lines"].append(f"{path}: {'code digests verified' if verified else 'left stale'}")
    return totals


def migrate_cli(from_commit: str, matrix_dir: Path, reference_dir: Path | None) -> int:
    """Print one line per file, then the totals; exit 1 (one line) when git or a file cannot be read."""
    try:
        totals = migrate(from_commit, matrix_dir, reference_dir)
    except (MatrixError, records.RecordError) as err:
        print(f"problem: {err}")
        return 1
    print("\n".join(totals["lines"]))
    print(
        f"cells: {totals['cells_migrated']} migrated, {totals['cells_stale']} left stale; references: "
        f"{totals['references_migrated']} migrated, {totals['references_stale']} left stale"
    )
    return 0
