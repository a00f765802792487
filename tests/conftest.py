"""Shared fixtures: small, hand-made records (inputs to the gate, never its expected verdicts)."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path

import pytest

from mpguide.verify import records
from mpguide.verify.claims import declarations

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs" / "_ext"))  # the build code (mpguide_build), as conf.py does

#: The declaration tables of the fake example the hand-made records belong to.
FAKE_EXAMPLE = '''"""A fake example for the tests: only its declaration tables matter."""
RUNS = [
    ("auto", "auto", "32-true"),
    ("manual", "manual", "32-true"),
    ("bf16", "bf16", "bf16-mixed"),
    ("broken", "broken", "32-true"),
]
CLAIMS = [
    ("match", "manual", "auto", "same-precision", "port"),
    ("match", "bf16", "auto", "mixed-vs-fp32", "bf16"),
    ("diverge", "broken", "auto", "pitfall-gap", "pitfall"),
    ("expect", "broken", "stalled", True, "the broken recipe stalls"),
]
'''


def curve(n: int = 140, scale: float = 1.0, floor: float = 0.2) -> list[float]:
    """A decaying loss curve with a deterministic wiggle; 140 steps is what the "test" preset plans."""
    return [scale * (floor + math.exp(-i / 15)) + 0.01 * math.sin(i) for i in range(n)]


def run(run_id: str, loss: list[float], precision: str = "32-true", mode: str = "manual", error=None) -> dict:
    return {
        "id": run_id,
        "mode": mode,
        "precision": precision,
        "precision_plugin": "Precision",
        "recipe": run_id,
        "seed": 0,
        "steps": len(loss),
        "plugin": None,
        "trainer_kwargs": {},
        "plain_flag": False,
        "swapped_from": None,
        "label": run_id,
        "loss": loss,
        "lr": [1e-3] * len(loss),
        "loss_scale": None,
        "skipped_steps": 0,
        "seconds": 0.1,
        "error": error,
        "warnings": [],
        "extra": {},
    }


def make_record(runs: list[dict], declared: list[dict], example: str = "plot_99_fake") -> dict:
    """A schema-valid record whose ``source`` names the current example file (if any) and library, and
    the digest of the runs and claims it is made with (edit them afterwards and the gate notices).

    Each run declares what its extra holds and what the claims read, as the runner writes it: the harness's
    type where the harness declares the key, else ``"json"`` (a fake example's probe declaring any JSON value).
    """
    from mpguide.verify.records import schema
    from mpguide.verify.records.measures import harness_declared

    harness = harness_declared()
    read = [key for claim in declared for key in schema.claim_keys(claim)]
    for r in runs:
        if "measures" not in r:
            r["measures"] = {k: schema.declared_type(harness, k) or "json" for k in [*r["extra"], *read]}
    return {
        "example": example,
        "schema_version": records.SCHEMA_VERSION,
        "created": records.utc_now(),
        "preset": "test",
        "env": {
            "python": "3",
            "torch": "t",
            "lightning": "l",
            "accelerator": "cpu",
            "device": "CPU (2 cores)",
            "cuda": "cpu",
            "platform": "x",
        },
        "source": {
            "example_code": records.example_code_digest(declarations.example_file(example)),
            "library_code": records.library_code_digest(),
            "declaration_sha256": declarations.digest_of(runs, declared),
            "commit": None,
            "dirty": None,
            "run_env": {},
        },
        "runs": runs,
        "claims": declared,
    }


def reseal(record: dict) -> dict:
    """Store the digest of the record's runs and claims as they are now: a record honestly made that way."""
    record["source"]["declaration_sha256"] = declarations.record_digest(record)
    return record


@pytest.fixture
def fake_examples(tmp_path_factory, monkeypatch) -> Path:
    """A folder holding the fake example ``plot_99_fake.py``, exported as ``MPGUIDE_EXAMPLES_DIR``."""
    folder = tmp_path_factory.mktemp("examples")
    (folder / "plot_99_fake.py").write_text(FAKE_EXAMPLE)
    monkeypatch.setenv(declarations.EXAMPLES_ENV, str(folder))
    return folder


@pytest.fixture
def good_record(fake_examples) -> dict:
    """Reference, a faithful copy, a close mixed-precision run and a clearly broken recipe, with the
    claims ``plot_99_fake.py`` declares."""
    ref = curve()
    declared = declarations.read(fake_examples / "plot_99_fake.py").claims
    broken = run("broken", curve(scale=2.0))
    broken["extra"] = {"stalled": True}
    return make_record(
        [
            run("auto", ref, mode="automatic"),
            run("manual", list(ref)),
            run("bf16", [v * 1.002 for v in ref], "bf16-mixed"),
            broken,
        ],
        [dict(c) for c in declared],
    )


def copy_site(dest: Path) -> Path:
    """A private copy of conf.py, docs/, examples/ and results/reference (a build writes into docs/)."""
    import shutil

    shutil.copy(ROOT / "conf.py", dest / "conf.py")
    ignore = shutil.ignore_patterns("auto_examples", "jupyter_execute", "_build", "sg_execution_times.rst")
    shutil.copytree(ROOT / "docs", dest / "docs", ignore=ignore)
    shutil.copytree(ROOT / "examples", dest / "examples")
    if (ROOT / "results" / "reference").is_dir():
        shutil.copytree(ROOT / "results" / "reference", dest / "results" / "reference")
    return dest


def sphinx_build(site: Path, out: Path, **env: str):
    """Run the strict build of ``site`` into ``out/html`` at the test preset; returns the CompletedProcess."""
    import os
    import subprocess
    import sys

    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MPGUIDE_")}
    # MPLBACKEND=Agg: the pages must render their figures whatever the backend (mpguide_build.pagecheck)
    full_env.update(
        MPLBACKEND="Agg", MPGUIDE_PRESET="test", MPGUIDE_DEVICE="cpu", MPGUIDE_RESULTS_DIR=str(out / "results")
    )
    full_env.update(env)
    cmd = [
        sys.executable,
        "-m",
        "sphinx",
        "-W",
        "--keep-going",
        "-b",
        "html",
        "-c",
        str(site),
        str(site / "docs"),
        str(out / "html"),
        "-d",
        str(out / "doctrees"),
    ]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=1200)


#: A strict build made before the tests (``.ci/run`` sets it to ``_build`` after ``nox -s docs -- --clean``): a
#: folder holding ``html/``, ``results/`` and ``build.log`` (the build's output), of this checkout's sources.
BUILT_SITE_ENV = "MPGUIDE_BUILT_SITE"
BUILD_LOG = "build.log"


@dataclasses.dataclass
class BuiltSite:
    """What the tests read of one passing strict build: its output, its log, its gallery and its settings.

    ``stdout``, ``stderr`` and ``returncode`` stand where a ``CompletedProcess`` of the build stood; ``run_env`` is
    the ``MPGUIDE_PRESET`` and ``MPGUIDE_DEVICE`` its records were made with (a rebuild that reuses them needs the
    same, or every example reruns).
    """

    out: Path
    stdout: str
    gallery: Path
    run_env: dict[str, str]
    stderr: str = ""
    returncode: int = 0


def _settings_of(results: Path, source: str) -> dict[str, str]:
    """The preset and device the records of ``results`` share; a test failure naming the problem otherwise."""
    settings = set()
    for path in sorted(results.glob("plot_*.json")):
        run_env = records.load_record(path)["source"]["run_env"]
        settings.add((run_env["MPGUIDE_PRESET"], run_env["MPGUIDE_DEVICE"]))
    if len(settings) != 1:
        pytest.fail(
            f"{source}: the records of {results} hold presets and devices {sorted(settings)}; one expected",
            pytrace=False,
        )
    (preset, device) = settings.pop()
    return {"MPGUIDE_PRESET": preset, "MPGUIDE_DEVICE": device}


def _given_build(folder: str) -> BuiltSite:
    """The build ``MPGUIDE_BUILT_SITE`` names (relative paths from the repository root), checked for its parts."""
    out = Path(folder) if Path(folder).is_absolute() else ROOT / folder
    where = f"{BUILT_SITE_ENV}={folder}"
    for part in ("html/index.html", "results", BUILD_LOG):
        if not (out / part).exists():
            pytest.fail(
                f"{where}: {out / part} does not exist; point it at a strict build's output folder holding html/, "
                f"results/ and {BUILD_LOG} (bash .ci/run makes _build), or unset it to let the tests build their own",
                pytrace=False,
            )
    log = (out / BUILD_LOG).read_text(errors="replace")
    settings = _settings_of(out / "results", where)
    return BuiltSite(out, log, ROOT / "docs" / "auto_examples", settings)


@pytest.fixture(scope="session")
def site_build(tmp_path_factory) -> BuiltSite:
    """One passing strict build of the site, shared by the tests marked ``build`` that read it.

    With ``MPGUIDE_BUILT_SITE`` set, the build it names (made from this checkout, ``.ci/run``'s one build per CI
    run); else a build of a private copy of the site at the test preset, made here (the full suite run locally).
    """
    given = os.environ.get(BUILT_SITE_ENV)
    if given:
        return _given_build(given)
    site = copy_site(tmp_path_factory.mktemp("site"))
    out = tmp_path_factory.mktemp("build")
    proc = sphinx_build(site, out)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return BuiltSite(
        out, proc.stdout, site / "docs" / "auto_examples", _settings_of(out / "results", "build"), proc.stderr
    )


@pytest.fixture(scope="session")
def built_site(site_build) -> tuple[Path, BuiltSite]:
    """``(output folder, build)`` of :func:`site_build`: ``out / "html"``, ``out / "results"``, ``build.stdout``."""
    return site_build.out, site_build


#: The recipe swap the swap tests train: plot_01's bf16 manual port with the scheduler stepped every batch.
SWAP_01 = "plot_01_porting_to_manual:manual-bf16=scheduler every batch"


@pytest.fixture(scope="session")
def swapped_build(site_build, tmp_path_factory):
    """``(output folder, CompletedProcess)`` of a strict rebuild of a copy of the site with :data:`SWAP_01`.

    It starts from :func:`site_build`'s records and gallery, with its preset and device, so only the swapped
    example reruns (``tests/test_docs_build.py`` checks that); the build must fail at the gate.
    """
    import shutil

    tmp = tmp_path_factory.mktemp("swapped")
    (tmp / "site").mkdir()
    site = copy_site(tmp / "site")
    shutil.copytree(site_build.gallery, site / "docs" / "auto_examples")
    shutil.copytree(site_build.out / "results", tmp / "out" / "results")
    return tmp / "out", sphinx_build(site, tmp / "out", **site_build.run_env, MPGUIDE_SWAP_RECIPE=SWAP_01)


def pytest_collection_modifyitems(config, items):
    """A test that reads the built site must carry the ``build`` marker, so that it never lands in the fast tier."""
    unmarked = [
        item.nodeid for item in items if "site_build" in item.fixturenames and not item.get_closest_marker("build")
    ]
    if unmarked:
        raise pytest.UsageError(f"these tests read the built site without the 'build' marker (add it): {unmarked}")


def quiet_trainer(**trainer_kwargs):
    """A one-epoch CPU ``Trainer`` of one device without logger, progress bar, summary or checkpoint (the small
    real runs of the plugin tests, the generated programs and the cost test); ``trainer_kwargs`` add to it."""
    import lightning.pytorch as pl

    quiet = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False)
    quiet.update(enable_model_summary=False, enable_checkpointing=False)
    return pl.Trainer(**{**quiet, **trainer_kwargs})


def quiet_fit(module, samples: int, features: int = 6, batch_size: int = 4, **trainer_kwargs):
    """Fit ``module`` for one epoch on CPU over ``samples`` seeded random rows, without logs or warnings.

    The small real Trainer runs of the plugin tests: no logger, progress bar, summary or checkpoint;
    a ``TensorDataset`` of ``torch.randn(samples, features)`` (generator seed 0) in batches of
    ``batch_size``. Returns the Trainer.
    """
    import warnings

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    trainer = quiet_trainer(**trainer_kwargs)
    data = TensorDataset(torch.randn(samples, features, generator=torch.Generator().manual_seed(0)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, DataLoader(data, batch_size=batch_size))
    return trainer
