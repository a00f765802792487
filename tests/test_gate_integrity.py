"""The gate checks every record in itself: runs and claims as written (the declaration digest in its
``source``), hardware fields that agree, and references in their device's folder. Each hole fails with
exit 1 and one message naming the file, what differs and the fix; the committed references pass."""

import json
import shutil

import pytest
from conftest import FAKE_EXAMPLE, ROOT

from mpguide.verify import gate, records
from mpguide.verify.claims import declarations

COMMITTED = ROOT / "results" / "reference"


def write(folder, record):
    return records.write_record(record, folder / f"{record['example']}.json")


def gate_run(capsys, *args):
    status = gate.main([str(a) for a in args])
    out = capsys.readouterr()
    return status, out.out + out.err


def failure_lines(out):
    return [line for line in out.splitlines() if line.startswith("  - ")]


def one_failure(capsys, *args):
    """Run the gate, which must exit 1 with exactly one failure; return that failure's line."""
    status, out = gate_run(capsys, *args)
    assert status == 1, out
    (line,) = failure_lines(out)
    return line


def stale_gpu_reference(tmp_path, good_record, fake_examples):
    """A reference made on an H200 before the example was edited (so it is stale), written honestly."""
    good_record["env"].update(accelerator="cuda", device="NVIDIA H200", cuda="13.0")
    good_record["source"]["run_env"] = {"MPGUIDE_PRESET": "test", "MPGUIDE_DEVICE": "cuda", "swaps": {}}
    good_record["source"]["commit"] = "4008df8" + "0" * 33
    (fake_examples / "plot_99_fake.py").write_text(FAKE_EXAMPLE + "LATER_EDIT = 1  # a later edit of the code\n")
    return tmp_path / "reference" / "nvidia-h200", good_record


@pytest.fixture
def real_examples(monkeypatch):
    monkeypatch.delenv(declarations.EXAMPLES_ENV, raising=False)


# --- 1. runs and claims as written ------------------------------------------------------------------


def test_honest_stale_reference_passes(tmp_path, good_record, fake_examples, capsys):
    folder, record = stale_gpu_reference(tmp_path, good_record, fake_examples)
    write(folder, record)
    status, out = gate_run(capsys, "--reference", tmp_path / "reference")
    assert status == 0, out
    assert "stale reference" in out and "0 failed" in out


def test_claim_deleted_from_a_stale_reference_fails(tmp_path, good_record, fake_examples, capsys):
    folder, record = stale_gpu_reference(tmp_path, good_record, fake_examples)
    del record["claims"][1]  # the bf16 claim, deleted after the record was written
    path = write(folder, record)
    line = one_failure(capsys, "--reference", tmp_path / "reference")
    assert line.startswith(
        "  - plot_99_fake: record FAILED [runs and claims as written]: its 4 run(s) and 3 claim(s) hash to "
    )
    assert (
        "the record was written with: a run or claim was deleted, added or edited since; restore the "
        f"committed file (git checkout -- {path}) or refresh the references on that GPU "
        "(nox -s docs_gpu -- --update-reference)" in line
    )
    assert f"(record: {path}; hardware: NVIDIA H200" in line


@pytest.mark.parametrize("edit", ["tolerance", "run precision", "claim added", "run deleted"])
def test_other_edits_of_a_stale_reference_fail(tmp_path, good_record, fake_examples, capsys, edit):
    """Edits that used to turn a judged claim into "not judged" (or go unnoticed) in a stale reference."""
    folder, record = stale_gpu_reference(tmp_path, good_record, fake_examples)
    if edit == "tolerance":
        record["claims"][0]["tolerance"] = "mixed-vs-fp32"
    elif edit == "run precision":
        record["runs"][1]["precision"] = "bf16-mixed"
    elif edit == "claim added":
        record["claims"].append({"kind": "expect", "runs": ["auto"], "key": "x", "expected": 1, "title": "mine"})
    else:
        record["runs"] = record["runs"][:3]
    write(folder, record)
    status, out = gate_run(capsys, "--reference", tmp_path / "reference")
    assert status == 1, out
    assert "record FAILED [runs and claims as written]" in out and "deleted, added or edited since" in out


def test_record_without_a_declaration_digest_fails(tmp_path, good_record, capsys):
    good_record["source"]["declaration_sha256"] = None
    path = write(tmp_path, good_record)
    line = one_failure(capsys, tmp_path)
    assert (
        "record FAILED [runs and claims as written]: source.declaration_sha256 is None, so a run or claim "
        "deleted from the record could not be noticed; rerun the example (python examples/plot_99_fake.py, "
        "or rebuild the docs with nox -s docs)"
    ) in line and str(path) in line


def test_claim_deleted_from_a_downloaded_record_fails_without_an_examples_folder(
    tmp_path, good_record, monkeypatch, capsys
):
    """A reader's record is judged on its own claims: deleting one is noticed all the same."""
    monkeypatch.setenv(declarations.EXAMPLES_ENV, str(tmp_path / "no-checkout"))
    del good_record["claims"][0]
    write(tmp_path, good_record)
    status, out = gate_run(capsys, tmp_path)
    assert status == 1 and "record FAILED [runs and claims as written]" in out
    # the hint is one a reader with a single downloaded script can follow: no examples/ folder, no nox
    (line,) = [ln for ln in failure_lines(out) if "[runs and claims as written]" in ln]
    assert "rerun the example (python plot_99_fake.py in the folder of the downloaded example)" in line, line
    assert "examples/" not in line.replace(str(tmp_path), "") and "nox" not in line, line


def test_digest_is_of_what_the_record_holds_for_its_accelerator():
    """What run_example stores equals what the gate recomputes, also with claims of the other accelerator
    (not in a CPU record) and a run trained with a swapped recipe (counted with its declared recipe)."""
    decl = declarations.from_tables(
        "plot_99_x",
        [("a", "ra", "32-true"), ("b", "rb", "16-mixed")],
        [("match", "a", "b", "mixed-vs-fp32", "t"), ("expect", "b", "k", 1, "gpu only", {"only_on": "cuda"})],
    )
    runs = [dict(spec.spec(), mode="manual", loss=[1.0], steps=1, label=spec.id) for spec in decl.runs]
    runs[1].update(recipe="broken", swapped_from="rb")
    claims = [dict(c, value=0.0, verdict="pass") for c in decl.claims_for("cpu")]
    record = {"runs": runs, "claims": claims}
    assert declarations.record_digest(record) == decl.digest("cpu") != decl.digest()
    assert decl.digest("cuda") == decl.digest()
    claims[0]["title"] = "another title"  # presentation: not part of the digest
    assert declarations.record_digest(record) == decl.digest("cpu")


def test_upgrade_v1_digests_the_records_own_runs_and_claims():
    """The committed references came from upgrade_v1: its digest is the one they now hold."""
    for path in sorted(COMMITTED.glob("*/*.json")):
        committed = json.loads(path.read_text())
        v1 = {k: v for k, v in committed.items() if k != "source"}
        v1["schema_version"] = 1
        upgraded = records.upgrade_v1(v1, committed["source"]["commit"], b"", {})
        assert upgraded["source"]["declaration_sha256"] == committed["source"]["declaration_sha256"], path
        assert committed["source"]["declaration_sha256"] == declarations.record_digest(committed), path


def test_committed_references_pass_unchanged(real_examples, capsys):
    status, out = gate_run(capsys, "--reference", COMMITTED)
    assert status == 0, out[-3000:]
    assert "record FAILED" not in out and " 0 failed" in out


def test_claim_deleted_from_a_committed_reference_fails(tmp_path, real_examples, capsys):
    folder = tmp_path / "reference" / "nvidia-h200"
    folder.mkdir(parents=True)
    source = COMMITTED / "nvidia-h200" / "plot_02_two_optimizers.json"
    shutil.copy(source, folder)
    assert gate_run(capsys, "--reference", tmp_path / "reference")[0] == 0
    record = json.loads(source.read_text())
    held = len(record["claims"])
    del record["claims"][0]  # a judged claim: it would otherwise just become "not judged"
    write(folder, record)
    line = one_failure(capsys, "--reference", tmp_path / "reference")
    assert (
        f"plot_02_two_optimizers: record FAILED [runs and claims as written]: its {len(record['runs'])} run(s) "
        f"and {held - 1} claim(s) hash to" in line
    )


# --- 3. hardware fields --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, run_env, preset, message",
    [
        (
            {"accelerator": "cuda"},
            {},
            None,
            "env.accelerator is 'cuda' but env.device is 'CPU (2 cores)', a CPU label; env.accelerator is 'cuda' but "
            "env.cuda is 'cpu'",
        ),
        (
            {"device": "NVIDIA H200"},
            {},
            None,
            "env.accelerator is 'cpu' but env.device is 'NVIDIA H200', not a CPU label ('CPU (<n> cores)')",
        ),
        ({"cuda": "13.0"}, {}, None, "env.accelerator is 'cpu' but env.cuda is '13.0', not 'cpu'"),
        ({"accelerator": "tpu"}, {}, None, "env.accelerator is 'tpu', not 'cpu' or 'cuda'"),
        ({}, {"MPGUIDE_DEVICE": "cuda"}, None, "source.run_env.MPGUIDE_DEVICE is 'cuda' but env.accelerator is 'cpu'"),
        ({}, {"MPGUIDE_PRESET": "full"}, None, "source.run_env.MPGUIDE_PRESET is 'full' but preset is 'test'"),
        (
            {"accelerator": "cuda", "device": "NVIDIA H200", "cuda": "13.0", "torch": "2.11.0+cpu"},
            {},
            None,
            "env.accelerator is 'cuda' but env.torch is '2.11.0+cpu', a CPU build",
        ),
        (
            {"accelerator": "cuda", "device": "NVIDIA H200", "cuda": "12.1", "torch": "2.11.0+cu130"},
            {},
            None,
            "env.torch '2.11.0+cu130' is a cu130 build but env.cuda is '12.1'",
        ),
    ],
)
def test_hardware_fields_that_disagree_fail(tmp_path, good_record, capsys, env, run_env, preset, message):
    good_record["env"].update(env)
    good_record["source"]["run_env"].update(run_env)
    path = write(tmp_path, good_record)
    status, out = gate_run(capsys, tmp_path)
    assert status == 1, out
    (line,) = [ln for ln in failure_lines(out) if "[hardware fields agree]" in ln]
    assert (
        f"record FAILED [hardware fields agree]: {message}: the fields were edited or come from two records; "
        "rerun the example (python examples/plot_99_fake.py, or rebuild the docs with nox -s docs)" in line
    )
    assert f"(record: {path};" in line


def test_reference_in_another_devices_folder_fails(tmp_path, good_record, fake_examples, capsys):
    folder, record = stale_gpu_reference(tmp_path, good_record, fake_examples)
    path = write(folder.parent / "nvidia-h100-80gb-hbm3", record)
    line = one_failure(capsys, "--reference", tmp_path / "reference")
    assert (
        "record FAILED [reference in its device's folder]: it lies in reference folder 'nvidia-h100-80gb-hbm3' "
        "but env.device is 'NVIDIA H200' (device slug 'nvidia-h200'); move it to results/reference/nvidia-h200/, "
        "or refresh the references on that GPU (nox -s docs_gpu -- --update-reference)"
    ) in line
    assert str(path) in line


def test_cpu_record_among_the_references_fails(tmp_path, good_record, capsys):
    write(tmp_path / "reference" / "nvidia-h200", good_record)  # a CPU build's record copied by hand
    line = one_failure(capsys, "--reference", tmp_path / "reference")
    assert (
        "record FAILED [reference made on a GPU]: a committed GPU reference has env.accelerator 'cpu' "
        "('CPU (2 cores)'); references come from nox -s docs_gpu -- --update-reference on a CUDA machine: "
        "delete it or refresh the folder there"
    ) in line
