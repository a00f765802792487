"""The version matrix: which claims hold on which Lightning release, summarised, checked for staleness, rendered.

``nox -s matrix`` installs each release of :data:`~mpguide_build.matrix_summary.RELEASES` into its own environment
(sharing one CPU torch), runs every example there at the ``test`` preset and calls
``python -m mpguide_build.matrix run`` in that environment, which judges the records with the claim gate
(:func:`mpguide.verify.gate.judge`) and writes one compact **summary** per release (its format:
:mod:`mpguide_build.matrix_summary`). This module runs a release and is the command line; the other parts
live in their own modules: the summaries' format, files and staleness (:mod:`mpguide_build.matrix_summary`),
turning records into a summary (:mod:`mpguide_build.matrix_summarize`), the outcome class of each cell
(:mod:`mpguide_build.matrix_outcomes`) and what the pages show (:mod:`mpguide_build.matrix_page`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mpguide.verify import records
from mpguide.verify.claims import declarations

from .matrix_outcomes import REFUSAL_MARK
from .matrix_page import render_table
from .matrix_summarize import new_summary, summarize_example
from .matrix_summary import (
    MATRIX_DIR,
    TORCH_EXAMPLES,
    TORCH_LIGHTNING,
    MatrixError,
    check_matrix,
    column_label,
    is_unreleased,
    load,
    load_matrix,
    load_torch_matrix,
    stale_cells,
    summary_file,
    summary_path,
    write_summary,
)

# the cell-by-cell runner of the examples, run as a file: a column environment has no build code on its path
CELLS = Path(__file__).with_name("cells.py")

#: The tests of the plugin run in every environment.
PLUGIN_TESTS = "tests/test_precision.py"


# ------------------------------------------------------------------------------------ producing


def run_plugin_tests(python: str, root: Path, timeout: float = 600) -> dict[str, Any]:
    """Run :data:`~mpguide_build.matrix.PLUGIN_TESTS` with ``python -m pytest`` and classify the outcome.

    ``refused`` when every failing test of pytest's short summary carries
    :data:`~mpguide_build.matrix_outcomes.REFUSAL_MARK` (the plugin declines that Lightning release with a clear
    error and nothing else went wrong), ``pass`` when nothing failed, else ``fail``.
    """
    proc = subprocess.run(
        [python, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", PLUGIN_TESTS],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONPATH=str(root), COLUMNS="1000"),
    )  # no cut summary lines
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|error|errors)", tail[-1] if tail else "")}
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    # pytest's short summary (-ra) has one "FAILED ..."/"ERROR ..." line per failing test
    summary = [line for line in tail if line.startswith(("FAILED ", "ERROR "))]
    if proc.returncode == 0:
        status = "pass"
    elif summary and all(REFUSAL_MARK in line for line in summary):
        status = "refused"  # every failure is the plugin declining this release, nothing else
    else:
        status = "fail" if counts else "could not run"
    first_error = next((line for line in tail if line.startswith(("E ", "FAILED", "ERROR"))), "")
    return {
        "status": status,
        "passed": counts.get("passed", 0),
        "failed": failed,
        "message": (first_error + " | " if first_error else "") + (tail[-1] if tail else "no output"),
    }


def probe_autocast_cache(forward: Any = None) -> dict[str, Any]:
    """The minimal reproduction of the autocast-cache bug on the installed torch.

    In one ``torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=True)`` region, a
    ``nn.Linear(8, 4)`` forwards a ``(3, 8)`` float32 batch under ``torch.no_grad()``, then again with
    gradients; the second output is summed and backpropagated. On affected torch the second forward
    reuses the bf16 weight cast cached without autograd history, so the output has no ``grad_fn`` and
    the weight gets no gradient (PyTorch issues #65766, #112583, #158232; fixed by pull request
    #165068, merged 2025-12-10, in ``aten/src/ATen/autocast_mode.cpp``). CPU autocast shares that code.

    Args:
        forward: ``forward(layer, x) -> Tensor`` (default ``layer(x)``); tests pass a broken one to
            prove the probe reports a lost gradient.

    Returns:
        ``{"torch": torch.__version__, "gradient_lost": bool, "detail": str}``.
    """
    import torch

    forward = forward or (lambda layer, x: layer(x))
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=True):
        with torch.no_grad():
            forward(layer, x)
        out = forward(layer, x)
        has_graph = out.requires_grad
        if has_graph:
            out.float().sum().backward()
    grad = layer.weight.grad
    lost = grad is None or not bool(torch.isfinite(grad).all()) or not bool(grad.abs().sum() > 0)
    if not has_graph:
        detail = "the graded forward after a no_grad forward returned an output without grad_fn (weight.grad None)"
    elif grad is None:
        detail = "backward ran but weight.grad is None"
    else:
        detail = f"weight.grad present, |grad| sum {float(grad.abs().sum()):.4g}" + (
            "" if not lost else " (zero or not finite)"
        )
    return {"torch": torch.__version__, "gradient_lost": lost, "detail": detail}


def run_release(
    version: str,
    out_dir: Path,
    names: Sequence[str],
    timeout: float = 600,
    source: dict[str, str] | None = None,
    torch_pin: str | None = None,
    scope: Sequence[str] | None = None,
    plugin_tests: bool = True,
) -> dict[str, Any]:
    """In the current environment: run ``names`` at the test preset, judge them, write the summary.

    Each example runs cell by cell (:mod:`mpguide_build.cells`: a cell that raises, such as a call to copy
    that needs a newer Lightning, is recorded and the Evidence cells after it still run) with
    ``MPGUIDE_PRESET=test`` and ``MPGUIDE_DEVICE=cpu``; a script that fails or times out is recorded, not raised.

    Args:
        version: the release this environment must import, or the branch name of an unreleased
            column (``source`` of kind ``git``: any version string is accepted and recorded).
        source: ``{"kind": "git", "repository", "branch", "commit", "date"}`` for the unreleased column.
        torch_pin: the torch release this environment must import (older-torch columns).
        scope: the examples such a column runs (stored; others read "not run").
        plugin_tests: run :data:`PLUGIN_TESTS` (else the previous summary's outcome is kept, see
            :func:`merge_into_previous`).

    Returns:
        The summary written to :func:`~mpguide_build.matrix_summary.summary_file` in ``out_dir``.
    """
    root = records.REPO_ROOT
    summary = new_summary(version, source=source, torch_pin=torch_pin, scope=scope)
    try:
        import lightning
        import torch
    except Exception as err:  # noqa: BLE001 - a release that installs but does not import is a result
        summary.update(status="could not run", error={"stage": "import", "message": f"{type(err).__name__}: {err}"})
        write_summary(summary, out_dir)
        return summary
    if not is_unreleased(summary) and lightning.__version__ != version:
        summary.update(
            status="could not run",
            error={
                "stage": "import",
                "message": f"this environment imports Lightning {lightning.__version__}, not {version}",
            },
        )
        write_summary(summary, out_dir)  # the column shows why
        return summary
    if torch_pin and torch.__version__.split("+")[0] != torch_pin:
        summary.update(
            status="could not run",
            error={
                "stage": "import",
                "message": f"this environment imports torch {torch.__version__}, not {torch_pin}",
            },
        )
        write_summary(summary, out_dir)
        return summary
    summary["autocast_cache_probe"] = probe_autocast_cache()
    print(
        f"  Lightning {column_label(summary)}: autocast cache probe on torch {torch.__version__}: "
        f"{summary['autocast_cache_probe']['detail']}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="mpguide-matrix-") as tmp:
        for name in names:
            start = time.perf_counter()
            env = dict(
                os.environ,
                MPGUIDE_PRESET="test",
                MPGUIDE_DEVICE="cpu",
                MPGUIDE_RESULTS_DIR=tmp,
                MPLBACKEND="Agg",
                PYTHONPATH=str(root),
            )
            try:
                proc = subprocess.run(
                    [sys.executable, str(CELLS), str(declarations.example_file(name))],
                    cwd=tmp,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
                err = "" if proc.returncode == 0 else _last_error(proc.stderr)
            except subprocess.TimeoutExpired:
                err = f"timed out after {timeout:.0f} s"
            seconds = round(time.perf_counter() - start, 1)
            summary["examples"][name] = summarize_example(name, Path(tmp), version, err, seconds, torch_pin=torch_pin)
            entry = summary["examples"][name]
            bad = sum(c["verdict"] not in ("pass", "not applicable") for c in entry["claims"])
            print(
                f"  Lightning {column_label(summary)}: {name}: {entry['status']}, {len(entry['claims']) - bad} pass, "
                f"{bad} not passing, {seconds} s" + (f" ({err.splitlines()[-1][:120]})" if err else ""),
                flush=True,
            )
    if plugin_tests:
        summary["plugin_tests"] = run_plugin_tests(sys.executable, root, timeout)
        print(
            f"  Lightning {column_label(summary)}: plugin tests {summary['plugin_tests']['status']}: "
            f"{summary['plugin_tests']['message'][:160]}",
            flush=True,
        )
    summary = merge_into_previous(summary, out_dir)
    write_summary(summary, out_dir)
    return summary


def merge_into_previous(summary: dict[str, Any], directory: Path | None = None) -> dict[str, Any]:
    """``summary`` with the cells it did not run taken from the column's previous summary.

    Lets ``MPGUIDE_MATRIX_EXAMPLES`` (or ``--stale-only``) rerun only some examples. Per cell: every cell of
    the previous summary the new run did not produce is taken over with its own keys, so
    :func:`~mpguide_build.matrix_summary.cell_staleness` still judges each by what it was produced with (a
    cell made under older code or another torch reads stale, never current). Nothing is taken over from a
    column that could not run, from another commit of the unreleased branch, or for an example that no
    longer exists.
    """
    path = summary_file(summary, directory)
    try:
        previous = load(path)
    except MatrixError:
        return summary
    if previous.get("status") != "ran" or summary.get("status") != "ran":
        return summary
    if previous.get("source") != summary.get("source"):  # another commit of the branch: nothing carries over
        return summary
    existing = {p.stem for p in declarations.examples_dir().glob("plot_*.py")}
    carried = {k: v for k, v in previous["examples"].items() if k not in summary["examples"] and k in existing}
    merged = dict(
        summary,
        examples=dict(sorted({**carried, **summary["examples"]}.items())),
        plugin_tests=summary.get("plugin_tests") or previous.get("plugin_tests"),
    )
    return merged


def _last_error(stderr: str, lines: int = 3) -> str:
    """The exception lines at the end of a traceback (without machine paths), or the last lines."""
    text = [line for line in stderr.strip().splitlines() if line.strip()]
    tail = "\n".join(text[-lines:])
    return re.sub(r"/[^\s\"']*/(site-packages|examples|mpguide)/", r"\1/", tail)


def check_command(directory: Path | None = None, max_stale: int | None = None, **columns: Any) -> int:
    """``python -m mpguide_build.matrix check``: one line per stale cell, then exactly ``stale cells: N of M``.

    Exit 0 when the only findings are stale cells (the pages show them as "not re-run"); 1 with one line per
    problem (:func:`~mpguide_build.matrix_summary.check_matrix`: file, field, fix) for a missing column, an
    unreadable or malformed summary or a cell without keys, or when more than ``max_stale`` cells are stale.
    ``columns``: the ``releases``/``main``/``torch_columns`` of
    :func:`~mpguide_build.matrix_summary.check_matrix` (tests pass fewer).
    """
    stale, problems, cells = check_matrix(directory, **columns)
    for line in stale:
        print(f"stale: {line}")
    for line in problems:
        print(f"problem: {line}")
    print(f"stale cells: {len(stale)} of {cells}")
    if max_stale is not None and len(stale) > max_stale:
        print(
            f"problem: {len(stale)} stale cells, more than --max-stale {max_stale}; rerun them: "
            f"nox -s matrix -- --stale-only (and matrix_torch, matrix_main)"
        )
        return 1
    return 1 if problems else 0


def stale_command(
    lightning: str, torch_pin: str | None, directory: Path | None = None, git_commit: str | None = None
) -> int:
    """``python -m mpguide_build.matrix stale``: the stale examples of one column, one per line on stdout (every
    example of the column when it has no summary yet, that summary cannot be read, or for the unreleased column
    another ``git_commit`` than the summary's), a count on stderr. A last line ``plugin-tests`` when a cell is
    stale for another reason than its own example's code (the library, the versions, no keys, no summary): the
    plugin's tests depend on those too and rerun with the cells; after example edits alone they are kept."""
    every = sorted(p.stem for p in declarations.examples_dir().glob("plot_*.py"))
    scope = list(TORCH_EXAMPLES) if torch_pin else None
    path = summary_path(lightning, directory, torch_pin)
    plugin = True
    try:
        summary = load(path)
        found = stale_cells(summary)
        names = [n for n in found if (scope is None or n in scope) and n in every]
        plugin = any("examples/" not in why for n, why in found.items() if n in names)
        other_commit = git_commit and (summary.get("source") or {}).get("commit") != git_commit
        if summary.get("status") != "ran" or other_commit:
            names, plugin = [n for n in every if scope is None or n in scope], True
    except MatrixError:
        names = [n for n in every if scope is None or n in scope]
    print("\n".join(names + (["plugin-tests"] if names and plugin else [])))
    print(
        f"{len(names)} stale examples" + (", nothing to run" if not names else "") + f" ({path.name})", file=sys.stderr
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mpguide_build.matrix run|error|check|table|probe``; see ``--help``."""
    parser = argparse.ArgumentParser(prog="python -m mpguide_build.matrix", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the examples in this environment and write its summary")
    err = sub.add_parser("error", help="write the summary of a release that could not be installed")
    for command in (run, err):
        command.add_argument(
            "--lightning",
            required=True,
            help="the release this environment should import, or the branch name with --git-commit",
        )
        command.add_argument("--out", type=Path, default=MATRIX_DIR)
        command.add_argument(
            "--examples",
            nargs="*",
            default=None,
            help="example stems (default: every plot_*.py, or TORCH_EXAMPLES with --torch)",
        )
        command.add_argument("--torch", default=None, help="an older-torch column: the torch release it pins")
        command.add_argument("--git-commit", default=None, help="an unreleased column: the commit installed")
        command.add_argument("--git-date", default=None, help="its committer date (ISO 8601)")
        command.add_argument("--git-repository", default="Lightning-AI/pytorch-lightning")
    run.add_argument(
        "--no-plugin-tests",
        action="store_true",
        help="leave plugin_tests as in the previous summary (for a partial rerun of examples)",
    )
    run.add_argument(
        "--timeout",
        type=float,
        default=float(os.environ.get("MPGUIDE_MATRIX_TIMEOUT", 600)),
        help="seconds per example and for the plugin tests (default: MPGUIDE_MATRIX_TIMEOUT or 600)",
    )
    err.add_argument("--stage", default="install")
    what = err.add_mutually_exclusive_group(required=True)
    what.add_argument("--message-file", type=Path, help="a log whose last error lines say why")
    what.add_argument("--message", help="why, in words")
    check = sub.add_parser(
        "check",
        help="one line per stale cell, then 'stale cells: N of M'; exit 1 on a missing column, an unreadable "
        "summary or a cell without keys (one line each), or with more stale cells than --max-stale",
    )
    check.add_argument("--dir", type=Path, default=MATRIX_DIR)
    check.add_argument("--max-stale", type=int, default=None, help="exit 1 when more cells than this are stale")
    stale = sub.add_parser("stale", help="print the stale examples of one column, one per line (for --stale-only)")
    stale.add_argument("--lightning", required=True)
    stale.add_argument("--torch", default=None)
    stale.add_argument("--git-commit", default=None, help="the unreleased column's commit: another one stales all")
    stale.add_argument("--git-date", default=None, help="ignored (the nox session passes the column's arguments)")
    stale.add_argument("--dir", type=Path, default=MATRIX_DIR)
    migrate = sub.add_parser(
        "migrate",
        help="add per-cell code keys to summaries (and code digests to GPU references) made before them, "
        "only where their byte digests equal those of the sources at --from-commit",
    )
    migrate.add_argument("--from-commit", required=True)
    migrate.add_argument("--dir", type=Path, default=MATRIX_DIR)
    migrate.add_argument("--references", type=Path, default=records.REPO_ROOT / "results" / "reference")
    table = sub.add_parser("table", help="print the Markdown table")
    table.add_argument("--dir", type=Path, default=MATRIX_DIR)
    table.add_argument("--torch", action="store_true", help="the older-torch columns and the site's TORCH_LIGHTNING")
    sub.add_parser("probe", help="print the minimal autocast-cache reproduction's outcome on this torch (JSON)")
    args = parser.parse_args(argv)
    every = sorted(p.stem for p in declarations.examples_dir().glob("plot_*.py"))
    if args.command in ("run", "error"):
        if bool(args.git_commit) != bool(args.git_date):
            parser.error("--git-commit and --git-date go together (the unreleased column names both)")
        source = (
            {
                "kind": "git",
                "repository": args.git_repository,
                "branch": args.lightning,
                "commit": args.git_commit,
                "date": args.git_date,
            }
            if args.git_commit
            else None
        )
        scope = list(TORCH_EXAMPLES) if args.torch else None
        names = args.examples or scope or every
    if args.command == "run":
        run_release(
            args.lightning,
            args.out,
            names,
            args.timeout,
            source=source,
            torch_pin=args.torch,
            scope=scope,
            plugin_tests=not args.no_plugin_tests,
        )
        return 0
    if args.command == "error":
        message = args.message or _last_error(args.message_file.read_text(encoding="utf-8", errors="replace"), lines=6)
        summary = new_summary(
            args.lightning,
            "could not run",
            {"stage": args.stage, "message": message},
            names,
            source=source,
            torch_pin=args.torch,
            scope=scope,
        )
        print(f"  Lightning {column_label(summary)}: could not {args.stage}: {message.splitlines()[-1][:160]}")
        write_summary(summary, args.out)
        return 0
    if args.command == "probe":
        print(json.dumps(probe_autocast_cache()))
        return 0
    if args.command == "check":
        return check_command(args.dir, args.max_stale)
    if args.command == "stale":
        return stale_command(args.lightning, args.torch, args.dir, args.git_commit)
    if args.command == "migrate":
        from .matrix_migrate import migrate_cli

        return migrate_cli(args.from_commit, args.dir, args.references)
    if args.torch:
        site = [s for s in load_matrix(args.dir) if s["lightning"] == TORCH_LIGHTNING and not is_unreleased(s)]
        print(render_table(load_torch_matrix(args.dir) + site, examples=TORCH_EXAMPLES))
        return 0
    print(render_table(load_matrix(args.dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
