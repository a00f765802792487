"""The harness that runs Lightning's own tests with the project's plugins (upstream/): it replaces what it
should, leaves the rest, says so in its summary, and skips without a Lightning checkout."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT
from lightning.fabric.plugins.precision import MixedPrecision as FabricMixedPrecision
from lightning.pytorch.plugins.precision import MixedPrecision

from mpguide.fabric import FabricManualMixedPrecision
from mpguide.precision import ManualMixedPrecision

pytest_plugins = ["pytester"]


@pytest.fixture
def harness(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from upstream import pytest_mpguide

    return pytest_mpguide


class OwnAMP(MixedPrecision):
    pass


def test_patch_replaces_both_classes_and_nothing_else(harness):
    patcher = harness.Patcher("both")
    patcher.install()
    try:
        trainer_plugin = MixedPrecision("16-mixed", "cpu")
        fabric_plugin = FabricMixedPrecision(precision="bf16-mixed", device="cpu")
        own = OwnAMP("bf16-mixed", "cpu")
        copied = copy.deepcopy(trainer_plugin)
    finally:
        patcher.uninstall()
    assert type(trainer_plugin) is ManualMixedPrecision and isinstance(trainer_plugin, MixedPrecision)
    assert trainer_plugin.scaler is not None and trainer_plugin._records == []  # the subclass's __init__ ran
    assert type(fabric_plugin) is FabricManualMixedPrecision and fabric_plugin.precision == "bf16-mixed"
    assert type(own) is OwnAMP and type(copied) is ManualMixedPrecision
    assert patcher.totals() == {
        "mpguide.precision.ManualMixedPrecision": 1,
        "mpguide.fabric.FabricManualMixedPrecision": 1,
        f"{__name__}.OwnAMP": 1,
    }  # the deepcopy is no construction
    assert type(MixedPrecision("16-mixed", "cpu")) is MixedPrecision  # uninstalled


def test_counting_only_replaces_nothing(harness):
    patcher = harness.Patcher("none")
    patcher.install()
    try:
        plugin = MixedPrecision("bf16-mixed", "cpu")
    finally:
        patcher.uninstall()
    assert type(plugin) is MixedPrecision
    assert patcher.totals() == {"lightning.pytorch.plugins.precision.amp.MixedPrecision": 1}


@pytest.mark.slow
def test_pytest_plugin_reports_the_replacement(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(
        test_trainer="""
        import lightning.pytorch as pl

        def test_connector_builds_the_plugin():
            trainer = pl.Trainer(accelerator="cpu", precision="bf16-mixed", logger=False)
            assert type(trainer.precision_plugin).__name__ == "ManualMixedPrecision"

        def test_untouched():
            assert True
    """
    )
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "upstream.pytest_mpguide",
        "--mpguide-patch=trainer",
        f"--mpguide-report={report}",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["patch trainer: ACTIVE", "*mpguide.precision.ManualMixedPrecision: 1, in 1 tests*"])
    data = json.loads(report.read_text())
    assert data["constructed"] == {"mpguide.precision.ManualMixedPrecision": 1}
    built = {n: t.get("constructed") for n, t in data["tests"].items()}
    assert built == {
        "test_trainer.py::test_connector_builds_the_plugin": {"mpguide.precision.ManualMixedPrecision": 1},
        "test_trainer.py::test_untouched": None,
    }


def test_run_skips_without_a_checkout():
    """CI has no Lightning checkout: the runner says so and succeeds."""
    env = {k: v for k, v in os.environ.items() if k != "MPGUIDE_LIGHTNING_SRC"}
    proc = subprocess.run(
        [sys.executable, "-m", "upstream.run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("upstream tests skipped: no Lightning checkout given")


def test_outcome_changes_are_listed(harness):
    from upstream import run

    before = {
        "tests": {
            "a::x": {"outcome": "passed"},
            "a::y": {"outcome": "skipped", "reason": "Requires: [GPUs>=1]"},
            "a::z": {"outcome": "xfailed"},
        },
        "replacements": {},
    }
    after = {
        "tests": {
            "a::x": {"outcome": "failed", "message": "boom"},
            "a::y": {"outcome": "skipped"},
            "a::z": {"outcome": "xfailed", "constructed": {"m.Manual": 1}},
        },
        "replacements": {"m.Stock": "m.Manual"},
    }
    assert run.differences(before, after) == ["- `a::x`: passed -> failed: boom"]
    rows = run.counts_table({"unpatched": before, "patched": after})
    assert rows[2:] == ["| a | unpatched | 2 | 0 | 1 (1) | - |", "| a | patched | 1 | 1 | 1 (0) | 1 |"]
