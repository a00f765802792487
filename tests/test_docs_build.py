"""Real Sphinx builds of a copy of the site: one passes and renders this build's verdicts, one fails
through a real divergence (a correct run swapped for a broken recipe)."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A private copy of conf.py, docs/, examples/ and results/reference (the build writes into docs/)."""
    dest = tmp_path_factory.mktemp("site")
    shutil.copy(ROOT / "conf.py", dest / "conf.py")
    ignore = shutil.ignore_patterns("auto_examples", "jupyter_execute", "_build", "sg_execution_times.rst")
    shutil.copytree(ROOT / "docs", dest / "docs", ignore=ignore)
    shutil.copytree(ROOT / "examples", dest / "examples")
    if (ROOT / "results" / "reference").is_dir():
        shutil.copytree(ROOT / "results" / "reference", dest / "results" / "reference")
    return dest


def build(site, out, **env):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MPGUIDE_")}
    full_env.update(MPGUIDE_PRESET="test", MPGUIDE_DEVICE="cpu", MPGUIDE_RESULTS_DIR=str(out / "results"), **env)
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-c", str(site),
           str(site / "docs"), str(out / "html"), "-d", str(out / "doctrees")]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=900)


def test_strict_build_passes_and_renders_this_builds_results(site, tmp_path):
    proc = build(site, tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "[mpguide] claim gate:" in proc.stdout and "passed" in proc.stdout
    page = (tmp_path / "html" / "model" / "manual_optimization.html").read_text()
    record = (tmp_path / "results" / "plot_01_porting_to_manual.json").read_text()
    created = record.split('"created": "')[1].split('"')[0]
    assert created in page, "the page shows the record of this very build"
    assert "manual port = automatic (bf16)" in page and "<img" in page
    assert (tmp_path / "html" / "auto_examples" / "plot_01_porting_to_manual.html").is_file()


def test_strict_build_fails_when_a_match_claim_diverges(site, tmp_path):
    proc = build(site, tmp_path, MPGUIDE_SWAP_RECIPE="manual-bf16=scheduler every batch")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "claim gate: 1 failed claim(s)" in out, out[-4000:]
    assert ("plot_01_porting_to_manual: match(manual-bf16, auto-bf16) FAILED "
            "[manual port = automatic (bf16)]: max rel. diff =") in out
    assert "threshold <= 0.001" in out
