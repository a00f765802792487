"""Real Sphinx builds of the site: one passes and renders this build's verdicts (the shared build:
``MPGUIDE_BUILT_SITE`` or the tests' own), one fails through a real divergence (a correct run swapped for a broken
recipe, rebuilt from the shared build's records so that only that example reruns)."""

import json
import re

import pytest
from conftest import ROOT, copy_site

pytestmark = pytest.mark.build


def test_strict_build_passes_and_renders_this_builds_results(built_site):
    out, proc = built_site
    assert "[mpguide] claim gate:" in proc.stdout and "passed" in proc.stdout
    # the build-time line counts every example and notebook page this clean build executed
    examples = len(list((ROOT / "examples").glob("plot_*.py")))
    assert f"{examples} example(s) executed" in proc.stdout and "wall / (examples + pages) = " in proc.stdout
    page = (out / "html" / "model" / "manual_optimization.html").read_text()
    evidence = (out / "html" / "verification.html").read_text()
    record = json.loads((out / "results" / "plot_01_porting_to_manual.json").read_text())
    assert record["created"][:10] in evidence, "the verification page shows the results of this very build"
    assert "manual port = automatic (bf16)" in evidence and "largest gap between smoothed loss curves" in evidence
    assert "the bug still reproduces: yes" in evidence and 'href="#tol-same-precision"' in evidence
    assert "sphx_glr_plot_01_porting_to_manual_002.png" in page and "<img" in page  # the example's own figure
    assert "checks of" in page and 'href="../releases.html"' in page  # each section's closing lines
    for example in ("plot_01_porting_to_manual", "plot_04_gradient_clipping", "plot_08_autocast_cache"):
        assert (out / "html" / "auto_examples" / f"{example}.html").is_file()
    # reader-facing text without build jargon; the first screen says what "verified" means
    text = re.sub(r"<[^>]+>", " ", page.split("<article", 1)[1].split("</article>", 1)[0])
    for word in ("preset", "record written", "claim gate", "source digest", "the gate"):
        assert word not in text, f"the guide's text says {word!r}"
    assert not re.search(r"\b(?:commit|at) [0-9a-f]{7}\b", text), "a commit hash in the guide's text"
    assert "Verified" in text[:3000] and "means" in text[:3000]
    crash = json.loads((out / "results" / "plot_02_two_optimizers.json").read_text())
    assert "No inf checks were recorded for this optimizer" in " ".join(text.split())  # quoted, and checked captured
    assert any(r["error"] for r in crash["runs"])


def test_strict_build_fails_when_a_match_claim_diverges(swapped_build):
    _, proc = swapped_build
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "claim gate: 2 failed claim(s)" in out, out[-4000:]
    assert "run 'manual-bf16' trained recipe 'scheduler every batch' instead of the declared 'manual port'" in out
    assert (
        "plot_01_porting_to_manual: match(manual-bf16, auto-bf16) FAILED "
        "[manual port = automatic (bf16)]: max rel. diff ="
    ) in out
    assert "threshold <= 0.001" in out
    # the rebuild reused the shared build's records: the swapped example alone ran again
    assert re.findall(r"\[mpguide\] (plot_\w+) runs: ", out) == ["plot_01_porting_to_manual"], out[-4000:]


def test_preview_build_executes_nothing_and_passes(tmp_path):
    """`nox -s docs_preview`: no example and no page cell runs (no page may force its execution)."""
    import ast
    import os
    import subprocess
    import sys

    tree = ast.parse((ROOT / "noxfile.py").read_text())
    preview = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PREVIEW"
    )
    site = copy_site(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPGUIDE_")}
    env.update(MPLBACKEND="Agg", MPGUIDE_RESULTS_DIR=str(tmp_path / "results"))
    cmd = [sys.executable, "-m", "sphinx", "-c", str(site), str(site / "docs"), str(tmp_path / "html"), *preview]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert (tmp_path / "html" / "model" / "manual_optimization.html").is_file()
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").glob("*.json"))
