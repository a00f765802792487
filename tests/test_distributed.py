"""mpguide.verify.run.distributed: the sharded loader, the DDP run checks, and real two-process runs over gloo."""

import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from mpguide.data import digits_loader
from mpguide.models import DigitsClassifier
from mpguide.verify import gate, hardware, records
from mpguide.verify.claims.declarations import RunDecl
from mpguide.verify.run import distributed

DDP = {"strategy": "ddp_fork", "devices": 2}


def test_sharded_loader_in_one_process_equals_digits_loader():
    plain, sharded = digits_loader(64, seed=3), distributed.sharded_digits_loader(64, seed=3)
    assert len(plain) == len(sharded) == 28
    for _ in range(2):  # two epochs, each iterated to the end: the generator must advance the same way
        for (x1, y1), (x2, y2) in zip(list(plain), list(sharded)):
            assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_rank_slices_give_each_rank_its_share(monkeypatch):
    whole = [b[1] for b in distributed.sharded_digits_loader(64, seed=0)]
    monkeypatch.setattr(distributed, "rank_and_world", lambda: (1, 2))
    second = [b[1] for b in distributed.sharded_digits_loader(64, seed=0)]
    assert all(torch.equal(s, w[32:]) for s, w in zip(second, whole))
    monkeypatch.setattr(distributed, "rank_and_world", lambda: (0, 3))
    with pytest.raises(ValueError, match="does not split among 3 ranks"):
        next(iter(distributed.sharded_digits_loader(64, seed=0)))


@pytest.mark.parametrize("kwargs", [{"strategy": "ddp", "devices": 2}, {"strategy": "ddp_fork", "devices": 3}])
def test_unsupported_ddp_declarations_are_refused(kwargs):
    spec = RunDecl("x", "r", "32-true", trainer_kwargs=kwargs)
    with pytest.raises(hardware.ConfigurationError, match="ddp_fork"):
        distributed.train_run(spec, DigitsClassifier, "cpu", hardware.PRESETS["test"])


class EveryBatch(DigitsClassifier):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.compute_loss(batch)
        with opt.toggle_model(sync_grad=self.sync):
            self.manual_backward(loss)
        opt.step()
        return loss.detach()


@pytest.mark.slow
@pytest.mark.parametrize("sync", [True, False])
def test_real_ddp_run_counts_allreduces_and_merges_ranks(sync):
    preset = hardware.Preset("tiny", epochs=1, batch_size=64)
    factory = type("M", (EveryBatch,), {"sync": sync})
    result = distributed.train_run(RunDecl("ddp", "r", "32-true", trainer_kwargs=DDP), factory, "cpu", preset)
    assert result.error is None, result.error
    assert len(result.loss) == result.steps == 28 and result.extra["ranks"] == 2
    assert result.extra["allreduce_calls"] == (28 if sync else 0)  # one bucket per backward, none under no_sync
    assert result.extra["allreduce_bytes"] == (28 * 4810 * 4 if sync else 0)
    assert result.extra["allreduce_counts_agree"]
    assert result.extra["weights_agree_across_ranks"] is sync  # unsynchronised replicas drift apart


@pytest.mark.slow
def test_master_address_and_port_are_restored(monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    preset = hardware.Preset("tiny", epochs=1, batch_size=64)
    factory = type("M", (EveryBatch,), {"sync": True})
    result = distributed.train_run(RunDecl("ddp", "r", "32-true", trainer_kwargs=DDP), factory, "cpu", preset)
    assert result.error is None
    assert os.environ["MASTER_PORT"] == "1" and "MASTER_ADDR" not in os.environ


@pytest.mark.build
def test_ddp_example_ran_in_process_in_the_build(built_site):
    """The example as sphinx-gallery executes it, in-process in a process whose sys.argv[0] is not the example: its
    page in the shared build (``MPGUIDE_BUILT_SITE`` or the tests' own) shows its runs once and its checks hold."""
    import html

    out, build = built_site
    page = html.unescape((out / "html" / "auto_examples" / "plot_13_ddp_accumulation.html").read_text())
    # no rank re-ran the example: the page shows its line once, and no child process wrote it to the build's log
    assert page.count("plot_13_ddp_accumulation: 5 runs") == 1
    assert "plot_13_ddp_accumulation: 5 runs" not in build.stdout
    held = re.search(r"(\d+) of (\d+) checks in the table hold", page)
    assert held and held.group(1) == held.group(2), page[-2000:]  # every shown check holds
    gate.check([out / "results" / "plot_13_ddp_accumulation.json"])
    record = records.load_record(out / "results" / "plot_13_ddp_accumulation.json")
    assert record["source"]["run_env"]["MPGUIDE_PRESET"] == build.run_env["MPGUIDE_PRESET"]


@pytest.mark.slow
def test_the_gate_fails_when_the_window_end_run_synchronises_every_micro_batch(tmp_path):
    """If toggle_model(sync_grad=False) stopped blocking the all-reduce, the claims would catch it."""
    env = dict(
        os.environ,
        MPGUIDE_PRESET="test",
        MPGUIDE_DEVICE="cpu",
        MPGUIDE_RESULTS_DIR=str(tmp_path),
        MPLBACKEND="Agg",
        PYTHONPATH=str(ROOT),
        MPGUIDE_SWAP_RECIPE="plot_13_ddp_accumulation:ddp-fp32-window-end=sync every micro-batch",
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "plot_13_ddp_accumulation.py")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = {v.title for v in gate.judge([tmp_path / "plot_13_ddp_accumulation.json"]).failures}
    assert "sync at window end: 1 all-reduce/step" in failed
    assert "one all-reduce = 4810 fp32 gradients" in failed
