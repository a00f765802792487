"""A pytest plugin that runs Lightning's own tests with this project's precision plugins in place of Lightning's.

Load it with ``-p upstream.pytest_mpguide`` (the project root on ``PYTHONPATH``) in a pytest run of a
Lightning checkout's ``tests/`` folder; ``python -m upstream.run`` does that. Options:

* ``--mpguide-patch=none`` (default): nothing is replaced; constructions are only counted.
* ``--mpguide-patch=trainer``: every ``lightning.pytorch.plugins.precision.MixedPrecision(...)`` call
  builds a :class:`mpguide.precision.ManualMixedPrecision` instead (the Trainer's accelerator connector
  for ``precision="16-mixed"``/``"bf16-mixed"`` and the tests' own ``MixedPrecision(...)`` alike).
* ``--mpguide-patch=fabric``: likewise Fabric's ``MixedPrecision`` ->
  :class:`mpguide.fabric.FabricManualMixedPrecision`.
* ``--mpguide-patch=both``: both replacements.
* ``--mpguide-report=PATH``: write every test's outcome and its plugin constructions as JSON.

How: the class's ``__new__`` is replaced, so that a call of exactly ``MixedPrecision`` with arguments
returns an instance of the subclass (Python then runs the subclass's ``__init__``). Names stay bound to
Lightning's classes, ``isinstance(plugin, MixedPrecision)`` still holds, subclasses the tests define
and ``__new__`` calls without arguments (copy, unpickling) are left alone. No file of Lightning or of
its tests is edited. The terminal summary counts the instances built per class, so a run shows
whether the replacement was active.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

COLLECTION = "<collection>"  # constructions outside any test (parametrize arguments at collection time)


def _plain_new(cls: type, *args: Any, **kwargs: Any) -> Any:
    return object.__new__(cls)


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class Patcher:
    """Replaces or counts the constructions of Lightning's two ``MixedPrecision`` classes."""

    def __init__(self, patch: str) -> None:
        from lightning.fabric.plugins.precision import MixedPrecision as FabricMixedPrecision
        from lightning.pytorch.plugins.precision import MixedPrecision

        self.patch = patch
        self.current = COLLECTION
        self.per_test: dict[str, Counter[str]] = {}
        self.redirects: dict[type, type] = {}
        if patch in ("trainer", "both"):
            from mpguide.precision import ManualMixedPrecision

            self.redirects[MixedPrecision] = ManualMixedPrecision
        if patch in ("fabric", "both"):
            from mpguide.fabric import FabricManualMixedPrecision

            self.redirects[FabricMixedPrecision] = FabricManualMixedPrecision
        self.bases = (MixedPrecision, FabricMixedPrecision)
        self._saved = {base: base.__dict__.get("__new__") for base in self.bases}

    def install(self) -> None:
        for base in self.bases:
            base.__new__ = staticmethod(self._make_new(base))  # type: ignore[method-assign]

    def uninstall(self) -> None:
        # ``del base.__new__`` would leave a slot that rejects constructor arguments (CPython keeps the
        # slot wrapper), so a class that had no ``__new__`` gets a plain one
        for base, saved in self._saved.items():
            base.__new__ = saved if saved is not None else staticmethod(_plain_new)  # type: ignore[method-assign]

    def _make_new(self, base: type):
        target = self.redirects.get(base)

        def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
            if cls is base and target is not None and (args or kwargs):
                cls = target
            if args or kwargs:  # a construction, not copy/unpickling
                self.per_test.setdefault(self.current, Counter())[_qualname(cls)] += 1
            return object.__new__(cls)

        return __new__

    def totals(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for counts in self.per_test.values():
            total.update(counts)
        return total

    def tests_with(self, name: str) -> int:
        return sum(1 for test, counts in self.per_test.items() if test != COLLECTION and counts.get(name))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mpguide", "mpguide: Lightning's tests with the project's precision plugins")
    group.addoption(
        "--mpguide-patch",
        choices=("none", "trainer", "fabric", "both"),
        default="none",
        help="which MixedPrecision to replace by the project's plugin (default: none, count only)",
    )
    group.addoption("--mpguide-report", default=None, help="write per-test outcomes and constructions as JSON here")


def pytest_configure(config: pytest.Config) -> None:
    patcher = Patcher(config.getoption("--mpguide-patch"))
    patcher.install()
    config.pluginmanager.register(Harness(config, patcher), "mpguide-harness")


def _skip_reason(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return ""


def _first_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = (crash.message if crash is not None else str(report.longrepr)).strip()
    return text.splitlines()[0][:300] if text else ""


class Harness:
    """Attributes constructions to tests, records outcomes, prints the summary and writes the report."""

    def __init__(self, config: pytest.Config, patcher: Patcher) -> None:
        self.config, self.patcher = config, patcher
        self.outcomes: dict[str, dict[str, Any]] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any):
        self.patcher.current = item.nodeid
        yield
        self.patcher.current = COLLECTION

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.outcome == "rerun":  # pytest-rerunfailures: only the final attempt counts
            return
        entry = self.outcomes.setdefault(report.nodeid, {"outcome": "passed"})
        if report.when != "call" and report.passed:
            return
        if hasattr(report, "wasxfail"):
            entry["outcome"] = "xfailed" if report.skipped else "xpassed"
        elif report.skipped:
            entry.update(outcome="skipped", reason=_skip_reason(report))
        elif report.failed:
            entry.update(outcome="failed" if report.when == "call" else "error", message=_first_line(report))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.patcher.uninstall()

    def summary_lines(self) -> list[str]:
        import lightning

        patcher = self.patcher
        totals = patcher.totals()
        targets = {_qualname(t) for t in patcher.redirects.values()}
        state = "ACTIVE" if patcher.redirects else "off (counting only)"
        lines = [
            f"lightning {lightning.__version__} from {Path(lightning.__file__).parent}",
            f"patch {patcher.patch}: {state}",
        ]
        lines += [f"  {_qualname(base)} -> {_qualname(target)}" for base, target in patcher.redirects.items()]
        lines.append("instances constructed (tests and collection):")
        for name in sorted(totals):
            marker = "  (replacement)" if name in targets else ""
            lines.append(f"  {name}: {totals[name]}, in {patcher.tests_with(name)} tests{marker}")
        if not totals:
            lines.append("  none")
        return lines

    def report(self) -> dict[str, Any]:
        import lightning

        patcher = self.patcher
        for nodeid, counts in patcher.per_test.items():
            if nodeid in self.outcomes:
                self.outcomes[nodeid]["constructed"] = dict(counts)
        return {
            "lightning": lightning.__version__,
            "lightning_path": str(Path(lightning.__file__).parent),
            "patch": patcher.patch,
            "replacements": {_qualname(b): _qualname(t) for b, t in patcher.redirects.items()},
            "constructed": dict(patcher.totals()),
            "constructed_at_collection": dict(patcher.per_test.get(COLLECTION, {})),
            "tests": self.outcomes,
        }

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.section("mpguide upstream harness")
        for line in self.summary_lines():
            terminalreporter.write_line(line)
        path = self.config.getoption("--mpguide-report")
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(self.report(), indent=1, sort_keys=True) + "\n")
            terminalreporter.write_line(f"report: {path}")
