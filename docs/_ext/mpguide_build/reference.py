"""Copy a GPU build's records into ``results/reference/<device-slug>/`` with a README that says what ran.

Used by ``nox -s docs_gpu -- --update-reference`` after a strict GPU build passed::

    python -m mpguide_build.reference _build/results results/reference

Only the records (``plot_*.json``) are copied, never figures. The device, versions and preset come
from the records' own ``env`` (what really ran), so this module needs no GPU and no torch.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from mpguide.verify.hardware import device_slug
from mpguide.verify.records import RecordError, load_record


class ReferenceError(ValueError):
    """The records cannot become GPU references (missing, unreadable, not from one CUDA device)."""


def git_commit(repo: Path) -> str:
    """``git rev-parse HEAD`` of ``repo``, plus ``-dirty`` if tracked files differ, or ``"unknown"``."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def update_reference(results_dir: Path, reference_root: Path, commit: str = "unknown") -> Path:
    """Replace the reference records of the build's device with the records in ``results_dir``.

    Args:
        results_dir: the GPU build's records folder (``_build/results``).
        reference_root: ``results/reference``; the records go to ``<reference_root>/<device-slug>/``.
        commit: the commit the build ran (written to the README).

    Returns:
        The device folder written.

    Raises:
        ReferenceError: no record, a record that does not load, records of a CPU run, or records of
            more than one device (each names the record and the fix).
    """
    paths = sorted(Path(results_dir).glob("plot_*.json"))
    if not paths:
        raise ReferenceError(f"no records (plot_*.json) in {results_dir}; run the GPU build first: nox -s docs_gpu")
    loaded = []
    for path in paths:
        try:
            loaded.append((path, load_record(path)))
        except RecordError as err:
            raise ReferenceError(f"{path}: {err}; rebuild with nox -s docs_gpu") from None
    devices = {rec["env"].get("device") for _, rec in loaded}
    cpu = [p.name for p, rec in loaded if rec["env"].get("accelerator") != "cuda"]
    if cpu:
        raise ReferenceError(
            f"records {cpu} in {results_dir} were not made on a CUDA device; GPU references "
            "must come from nox -s docs_gpu on a GPU machine"
        )
    if len(devices) != 1:
        raise ReferenceError(
            f"records in {results_dir} come from several devices "
            f"{sorted(map(str, devices))}; "
            "rebuild them in one GPU build: nox -s docs_gpu"
        )
    env = loaded[0][1]["env"]
    folder = Path(reference_root) / device_slug(env["device"])
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink()
    for path, _ in loaded:
        (folder / path.name).write_bytes(path.read_bytes())
    presets = sorted({rec.get("preset", "?") for _, rec in loaded})
    rows = [
        ("device", env["device"]),
        ("CUDA", env.get("cuda", "?")),
        ("torch", env.get("torch", "?")),
        ("Lightning", env.get("lightning", "?")),
        ("Python", env.get("python", "?")),
        ("preset", ", ".join(presets)),
        ("records", ", ".join(p.name for p, _ in loaded)),
        ("written", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("commit", commit),
    ]
    (folder / "README.md").write_text(
        f"# GPU reference records: {env['device']}\n\n"
        "Written by `nox -s docs_gpu -- --update-reference` after a strict GPU build passed; judged by the\n"
        "claim gate and shown on the guide page by every build. Do not edit by hand: rerun the command.\n\n"
        "| what | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    )
    return folder


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m mpguide_build.reference RESULTS_DIR REFERENCE_ROOT``; exit 0 written, 2 refused."""
    parser = argparse.ArgumentParser(prog="python -m mpguide_build.reference", description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("reference_root", type=Path)
    args = parser.parse_args(argv)
    try:
        folder = update_reference(
            args.results_dir, args.reference_root, git_commit(Path(args.reference_root).resolve().parent)
        )
    except ReferenceError as err:
        print(f"mpguide_build.reference: {err}", file=sys.stderr)
        return 2
    print(f"GPU reference records written to {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
