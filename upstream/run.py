"""Run Lightning's own AMP and manual-optimization tests unmodified and with this project's plugins patched in.

    python -m upstream.run --lightning /path/to/lightning-checkout            # both modes, compared
    python -m upstream.run --lightning PATH --mode patched --patch fabric     # one mode, one replacement
    python -m upstream.run --lightning PATH tests_fabric/test_connector.py -- -k precision

The checkout is only read: its ``tests/`` folder is the pytest root, the ``lightning`` package is the
installed one (the run says which file it imports and refuses one from the checkout). Without a
checkout (no ``--lightning``, no ``MPGUIDE_LIGHTNING_SRC``) it prints why it skips and exits 0: CI
cannot fetch GitHub. Each mode writes ``<out>/<mode>.json`` (see :mod:`upstream.pytest_mpguide`) and
its pytest log; with ``--mode both`` the per-file counts and the tests whose outcome differs are
printed and written to ``<out>/comparison.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV_VAR = "MPGUIDE_LIGHTNING_SRC"
#: Lightning's test files that construct MixedPrecision or test manual optimization (relative to tests/).
FILES = [
    "tests_pytorch/trainer/optimization/test_manual_optimization.py",
    "tests_pytorch/plugins/precision/test_amp.py",
    "tests_pytorch/plugins/precision/test_amp_integration.py",
    "tests_pytorch/plugins/test_amp_plugins.py",
    "tests_pytorch/models/test_amp.py",
    "tests_pytorch/models/test_hooks.py",
    "tests_pytorch/trainer/connectors/test_accelerator_connector.py",
    "tests_pytorch/deprecated_api/test_no_removal_version.py",
    "tests_pytorch/utilities/test_model_summary.py",
    "tests_fabric/plugins/precision/test_amp.py",
    "tests_fabric/plugins/precision/test_amp_integration.py",
    "tests_fabric/test_connector.py",
    "tests_fabric/test_fabric.py",
    "tests_fabric/strategies/test_single_device.py",
]
#: Test dependencies of Lightning's suite that the project environment lacks (requirements/*/test.txt).
TEST_DEPS = ["pytest-rerunfailures==16.1", "pytest-timeout==2.4.0"]
PASSING = ("passed", "xfailed")


def checkout_version(checkout: Path) -> str:
    path = checkout / "src" / "version.info"
    return path.read_text().strip() if path.is_file() else "?"


def run_mode(checkout: Path, mode: str, patch: str, files: list[str], extra: list[str], out: Path) -> dict:
    """One pytest run of ``files`` in ``checkout/tests``; returns the harness report."""
    report = out / f"{mode}.json"
    report.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "upstream.pytest_mpguide",
        f"--mpguide-patch={patch if mode == 'patched' else 'none'}",
        f"--mpguide-report={report}",
        "-q",
        "-rfE",
        "--color=no",
        "-p",
        "no:cacheprovider",
        *files,
        *extra,
    ]
    log = out / f"{mode}.log"
    print(f"[{mode}] {' '.join(cmd[1:])}\n[{mode}] log: {log}", flush=True)
    with open(log, "w") as stream:
        subprocess.run(cmd, cwd=checkout / "tests", env=env, stdout=stream, stderr=subprocess.STDOUT, check=False)
    text = log.read_text()
    tail = text[text.rfind("mpguide upstream harness") :] if "mpguide upstream harness" in text else text[-3000:]
    print(tail.rstrip(), flush=True)
    if not report.is_file():
        raise SystemExit(f"[{mode}] pytest wrote no report; see {log}")
    data = json.loads(report.read_text())
    if Path(data["lightning_path"]).resolve().is_relative_to(checkout.resolve()):
        raise SystemExit(f"lightning was imported from the checkout ({data['lightning_path']}), not the installed one")
    return data


def is_cuda_only(reason: str) -> bool:
    """A skip by Lightning's ``RunIf`` for want of a CUDA GPU.

    Its reason reads ``Requires: [GPUs>=1 + ...]`` or ``[CUDA device bf16]``.
    """
    return "GPUs>=" in reason or "CUDA device" in reason


def missing_deps() -> list[str]:
    import importlib.util

    modules = {"pytest-rerunfailures": "pytest_rerunfailures", "pytest-timeout": "pytest_timeout"}
    return [spec for spec in TEST_DEPS if importlib.util.find_spec(modules[spec.split("==")[0]]) is None]


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def counts_table(reports: dict[str, dict]) -> list[str]:
    """Markdown rows: per file and mode, passed/failed/skipped (xfailed counts as passed, errors as failed)."""
    rows = [
        "| file | mode | passed | failed | skipped (CUDA-only) | built by the patch |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for name in sorted({file_of(n) for r in reports.values() for n in r["tests"]}):
        for mode, report in reports.items():
            tests = {n: t for n, t in report["tests"].items() if file_of(n) == name}
            c = Counter(t["outcome"] for t in tests.values())
            cuda = sum(1 for t in tests.values() if t["outcome"] == "skipped" and is_cuda_only(t.get("reason", "")))
            targets = set(report["replacements"].values())
            built = sum(1 for t in tests.values() if targets & set(t.get("constructed", {})))
            rows.append(
                f"| {name} | {mode} | {c['passed'] + c['xfailed']} | {c['failed'] + c['error'] + c['xpassed']} "
                f"| {c['skipped']} ({cuda}) | {built if targets else '-'} |"
            )
    return rows


def differences(unpatched: dict, patched: dict) -> list[str]:
    rows = []
    for nodeid in sorted(set(unpatched["tests"]) | set(patched["tests"])):
        before = unpatched["tests"].get(nodeid, {}).get("outcome", "absent")
        after = patched["tests"].get(nodeid, {})
        if (before in PASSING) != (after.get("outcome", "absent") in PASSING) or (before == "skipped") != (
            after.get("outcome") == "skipped"
        ):
            rows.append(
                f"- `{nodeid}`: {before} -> {after.get('outcome', 'absent')}"
                + (f": {after['message']}" if after.get("message") else "")
            )
    return rows or ["- none"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m upstream.run", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--lightning",
        default=os.environ.get(ENV_VAR),
        help=f"a Lightning checkout (source tree with tests/); default: ${ENV_VAR}",
    )
    parser.add_argument("--mode", choices=("unpatched", "patched", "both"), default="both")
    parser.add_argument(
        "--patch",
        choices=("trainer", "fabric", "both"),
        default="both",
        help="what the patched mode replaces (default both)",
    )
    parser.add_argument("--out", default=str(ROOT / "_build" / "upstream"), help="folder for reports and logs")
    parser.add_argument(
        "--deps",
        type=Path,
        default=None,
        help="install Lightning's extra test plugins (TEST_DEPS) into this folder when missing",
    )
    parser.add_argument(
        "files",
        nargs="*",
        help="test files relative to the checkout's tests/ (default: FILES), or first the checkout itself",
    )
    args = parser.parse_args(argv)
    if not args.lightning and args.files and (Path(args.files[0]) / "tests").is_dir():
        args.lightning, args.files = args.files[0], args.files[1:]  # `nox -s upstream -- /path/to/checkout`
    if not args.lightning:
        print(
            f"upstream tests skipped: no Lightning checkout given (pass --lightning PATH or set {ENV_VAR}). "
            "They need Lightning's source tree, which CI cannot fetch; run them by hand (notes/upstream_tests.md)."
        )
        return 0
    checkout = Path(args.lightning).resolve()
    if not (checkout / "tests" / "tests_pytorch").is_dir():
        print(f"{checkout} is not a Lightning checkout (no tests/tests_pytorch)", file=sys.stderr)
        return 2
    if missing_deps() and args.deps is not None:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(args.deps), *TEST_DEPS],
            check=True,
        )
        sys.path.insert(0, str(args.deps))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(args.deps), os.environ.get("PYTHONPATH", "")] if p)
    if missing_deps():
        print(
            f"Lightning's tests need {' '.join(missing_deps())} (its requirements/*/test.txt): pip install them, "
            "or run `nox -s upstream -- PATH`, which installs them into .nox/upstream-deps",
            file=sys.stderr,
        )
        return 2
    import lightning

    print(
        f"checkout {checkout} (src/version.info {checkout_version(checkout)}); "
        f"installed lightning {lightning.__version__}",
        flush=True,
    )
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    modes = ["unpatched", "patched"] if args.mode == "both" else [args.mode]
    reports = {mode: run_mode(checkout, mode, args.patch, args.files or FILES, extra, out) for mode in modes}
    lines = counts_table(reports)
    if args.mode == "both":
        lines += ["", "Outcome changed by the patch:", *differences(reports["unpatched"], reports["patched"])]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.mode == "both":
        (out / "comparison.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
