"""The throughput benchmark's plumbing (mpguide.verify.run.throughput) and the device lock it times under.

The rates themselves are judged by plot_15's claims in the docs build; here: which variants run,
in which order, that tuned settings are undone, and that the GPU lock really excludes other runs.
"""

from __future__ import annotations

import dataclasses
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from mpguide.verify import hardware
from mpguide.verify.run import throughput
from mpguide.verify.run.throughput import config as throughput_config
from mpguide.verify.run.throughput import windows as throughput_windows

TINY = throughput_config.Size(width=32, layers=2, batch=16, warmup=2, steps=2, rounds=2, tuned=True)


def test_variant_keys_are_record_safe():
    assert throughput_config.variant_key("plain loop") == "plain_loop"
    assert throughput_config.variant_key("manual, compiled + fused SGD") == "manual_compiled_fused_sgd"
    for p in hardware.PRECISIONS:  # one record per precision: keys must differ within it
        keys = [throughput_config.variant_key(v) for v in throughput_config.variants_for(p, TINY)]
        assert len(keys) == len(set(keys)), keys


def test_tuned_variants_only_when_the_size_asks():
    untuned = throughput_config.Size(width=8, layers=1, batch=4, warmup=1, steps=1, rounds=1)
    offered = tuple(throughput_config.OFFERED["bf16-mixed"])
    assert offered == ("manual, PitfallChecks",) and throughput_config.OFFERED["32-true"] == {}
    assert throughput_config.variants_for("bf16-mixed", untuned) == throughput_config.VARIANTS + offered
    assert throughput_config.variants_for("32-true", untuned) == throughput_config.VARIANTS
    assert throughput_config.variants_for("bf16-mixed", TINY)[4:] == tuple(throughput_config.TUNED["bf16-mixed"])
    assert all(size.tuned == (accel == "cuda") for (accel, _), size in throughput_config.SIZES.items())


def test_every_variant_leads_one_round(monkeypatch):
    calls: list[tuple[str, str]] = []

    def fake_lightning(net, manual, batch, size, precision, accelerator, tuning=None, slowdown=0.0):
        tuning = tuning or throughput_config.Tuning()
        calls.append((precision, "automatic" if not manual else repr(tuning)))
        return 1.0

    def fake_plain(net, batch, size, precision, accelerator, state, slowdown=0.0):
        calls.append((precision, "plain"))
        return 1.0

    monkeypatch.setattr(throughput, "lightning_window", fake_lightning)
    monkeypatch.setattr(throughput, "plain_window", fake_plain)
    n = len(throughput_config.variants_for("bf16-mixed", TINY))
    size = throughput_config.Size(width=8, layers=1, batch=4, warmup=1, steps=2, rounds=n, tuned=True)
    out = throughput.interleaved(("bf16-mixed",), size, "cpu", progress=lambda line: None)
    firsts = {calls[r * n] for r in range(n)}
    assert len(firsts) == n, f"a variant led more than one round: {calls}"
    assert all(len(w) == n for w in out["bf16-mixed"].seconds.values())
    assert out["bf16-mixed"].steps_per_s("manual, compiled") == 2.0


@pytest.mark.slow
def test_tuned_variants_train_for_real_and_undo_tf32():
    """One real interleaved run on CPU with every tuned variant (torch.compile included, ~15-30 s)."""
    before = torch.get_float32_matmul_precision()
    out = throughput.interleaved(("32-true", "bf16-mixed"), TINY, "cpu", progress=lambda line: None)
    assert torch.get_float32_matmul_precision() == before
    assert set(out["32-true"].seconds) == {*throughput_config.VARIANTS, "manual, TF32 matmuls"}
    assert set(out["bf16-mixed"].seconds) == {
        *throughput_config.VARIANTS,
        "manual, PitfallChecks",
        *throughput_config.TUNED["bf16-mixed"],
    }
    for timing in out.values():
        assert all(len(w) == TINY.rounds and min(w) > 0 for w in timing.seconds.values())
    rates = out["bf16-mixed"].rates()
    assert rates["manual_compiled_fused_sgd_steps_per_s"] > 0
    assert rates["plain_loop_samples_per_s"] == pytest.approx(rates["plain_loop_steps_per_s"] * TINY.batch)


def test_unknown_precision_is_refused_before_training():
    with pytest.raises(hardware.ConfigurationError, match="unknown precision 'bf16'"):
        throughput.interleaved(("bf16",), TINY, "cpu")


HOLD_SHARED = """
import sys
from mpguide.verify import hardware
print("asking", flush=True)
with hardware.device_lock("cpu"):
    print("held", flush=True)
    sys.stdin.read()
"""


def _holder(env: dict[str, str]) -> subprocess.Popen:
    """A process that takes the shared lock like a training run; it says "asking", then "held" once it has it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_SHARED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env
    )  # unbuffered: readline() never reads past one line
    assert proc.stdout.readline() == b"asking\n"
    return proc


def _says_within(proc: subprocess.Popen, seconds: float) -> bool:
    return bool(select.select([proc.stdout], [], [], seconds)[0])


def test_exclusive_lock_waits_for_training_runs_and_goes_first(tmp_path, monkeypatch):
    monkeypatch.setenv("MPGUIDE_LOCK_DIR", str(tmp_path))
    env = {**os.environ, "MPGUIDE_LOCK_DIR": str(tmp_path)}
    first = _holder(env)
    assert first.stdout.readline() == b"held\n"
    got, done = threading.Event(), threading.Event()
    waited: list[float] = []

    def benchmark():
        with hardware.device_lock("cpu", exclusive=True) as w:
            waited.append(w)
            got.set()
            time.sleep(1.0)  # hold it: a run asking now must wait until this ends
        done.set()

    thread = threading.Thread(target=benchmark)
    thread.start()
    assert not got.wait(1.0), "the exclusive lock was granted while a training run held the shared one"
    late = _holder(env)  # a training run that asks while the benchmark waits
    assert not _says_within(late, 1.0), "a run that asked after the benchmark got the GPU before it"
    first.stdin.close()
    assert got.wait(10), "the exclusive lock never came after the training run ended"
    assert waited[0] >= 1.0
    assert late.stdout.readline() == b"held\n"
    assert done.is_set(), "the late run got the lock while the benchmark still held it"
    thread.join()
    late.stdin.close()
    assert late.wait(10) == 0 and first.wait(10) == 0


def test_no_lock_on_cpu_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("MPGUIDE_LOCK_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with hardware.device_lock("cpu", exclusive=True) as waited:
        assert waited == 0.0
    assert list(tmp_path.iterdir()) == []


def test_speedup_rows_of_the_guide_table():
    """The guide's GPU table: a row per tuned (and plain manual) variant of CUDA records, none for CPU ones."""
    from pathlib import Path

    from mpguide_build import pages

    size = throughput_config.Size(width=4096, layers=8, batch=8192, warmup=1, steps=20, rounds=2, tuned=True)
    timing = throughput.Timing(
        "bf16-mixed", size, {v: [0.25, 0.25] for v in throughput_config.variants_for("bf16-mixed", size)}
    )
    timing.seconds["manual, compiled"] = [0.2, 0.2]  # 100 steps/s against the manual loop's 80
    run = {
        "id": "bench-bf16",
        "precision": "bf16-mixed",
        "extra": {"benchmark": timing.summary(), "peak_bf16_tflops": 800.0, "size": dataclasses.asdict(size)},
    }
    gpu_env = {"accelerator": "cuda", "device": "NVIDIA H200", "torch": "2.11.0", "lightning": "2.6.6", "cuda": "13.0"}
    gpu = pages.PageRecord(
        "reference: nvidia-h200",
        {"env": gpu_env, "runs": [run], "preset": "full", "created": "2026-12-01T00:00:00Z"},
        [],
        "",
        Path("x.json"),
    )
    cpu = pages.PageRecord("this build", {"env": {"accelerator": "cpu"}, "runs": [run]}, [], "", Path("y.json"))
    rows = pages.speedup_rows([cpu, gpu])
    assert [r["variant"] for r in rows] == ["manual", "manual, PitfallChecks", *throughput_config.TUNED["bf16-mixed"]]
    compiled = rows[[r["variant"] for r in rows].index("manual, compiled")]
    tflops = 100 * size.flops_per_step() / 1e12
    assert compiled["record"].startswith("reference: NVIDIA H200") and "preset full, 2026-12-01" in compiled["record"]
    assert compiled == {
        "record": compiled["record"],
        "precision": "bf16-mixed",
        "variant": "manual, compiled",
        "steps/s": "100.0",
        "vs manual": "x1.25",
        "TFLOP/s": f"{tflops:.0f}",
        "of bf16 peak": f"{tflops / 800:.0%}",
    }
    assert pages.speedup_rows([cpu]) == []


def test_the_lock_is_reentrant_within_a_process(tmp_path, monkeypatch):
    monkeypatch.setenv("MPGUIDE_LOCK_DIR", str(tmp_path))
    with hardware.device_lock("cpu"):
        with hardware.device_lock("cpu") as nested:  # a Trainer.fit inside a locked run
            assert nested == 0.0
        with pytest.raises(RuntimeError, match="exclusively while this process holds it shared"):
            with hardware.device_lock("cpu", exclusive=True):
                pass
    with hardware.device_lock("cpu", exclusive=True):
        with hardware.device_lock("cpu") as nested:  # the benchmark's own Trainer windows
            assert nested == 0.0
    assert hardware._HELD == {}


FIT_UNDER_THE_HOOK = """
import lightning.pytorch as pl, torch
from mpguide.verify.run import runner
from mpguide_build import sphinx_ext
runner.quiet_lightning()
sphinx_ext.share_device_in_fits({}, None, when="before")
sphinx_ext.share_device_in_fits({}, None, when="before")  # a second example in the same worker
assert pl.Trainer.fit.__wrapped__.__name__ == "fit", "wrapped twice"

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2)
trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
print("asking", flush=True)
trainer.fit(Tiny(), data)
print("fitted", flush=True)
"""


def test_gallery_hook_makes_every_fit_wait_for_the_benchmark(tmp_path, monkeypatch):
    """conf.py's reset_modules hook: an example's own Trainer.fit holds the shared lock, so it waits."""
    monkeypatch.setenv("MPGUIDE_LOCK_DIR", str(tmp_path))
    env = {**os.environ, "MPGUIDE_LOCK_DIR": str(tmp_path)}
    with hardware.device_lock("cpu", exclusive=True):
        proc = subprocess.Popen([sys.executable, "-c", FIT_UNDER_THE_HOOK], stdout=subprocess.PIPE, bufsize=0, env=env)
        assert proc.stdout.readline() == b"asking\n"
        assert not _says_within(proc, 2.0), "a Trainer.fit ran while the benchmark held the device"
    assert proc.stdout.readline() == b"fitted\n"
    assert proc.wait(60) == 0


def test_short_windows_get_more_steps(monkeypatch):
    """min_window_s: a precision whose steps are fast gets longer windows, measured once before the rounds."""
    seen: list[int] = []

    def fake_plain(net, batch, size, precision, accelerator, state, slowdown=0.0):
        seen.append(size.steps)
        return 0.005 * size.steps  # 5 ms a step

    def fake_lightning(net, manual, batch, size, precision, accelerator, tuning=None, slowdown=0.0):
        seen.append(size.steps)
        return 0.005 * size.steps

    monkeypatch.setattr(throughput, "plain_window", fake_plain)
    monkeypatch.setattr(throughput, "lightning_window", fake_lightning)
    size = throughput_config.Size(width=8, layers=1, batch=4, warmup=1, steps=3, rounds=2, min_window_s=0.05)
    out = throughput.interleaved(("32-true",), size, "cpu", progress=lambda line: None)
    assert seen[0] == 3 and set(seen[1:]) == {10}, seen  # one calibration window, then 50 ms / 5 ms
    assert out["32-true"].size.steps == 10 and out["32-true"].steps_per_s("manual") == pytest.approx(200.0)
    assert out["32-true"].summary()["manual"]["steps_per_window"] == 10
    slow = throughput_config.Size(width=8, layers=1, batch=4, warmup=1, steps=30, rounds=1, min_window_s=0.05)
    seen.clear()
    assert throughput.interleaved(("32-true",), slow, "cpu", progress=lambda line: None)["32-true"].size.steps == 30


def test_lock_refuses_an_unknown_accelerator():
    with pytest.raises(hardware.ConfigurationError, match="device_lock: unknown accelerator 'gpu'; use cpu or cuda"):
        with hardware.device_lock("gpu"):
            pass


# ----------------------------------------------------------------------------------------------
# The rule that decides the parity claims (mpguide.verify.claims.metrics.decide_paired), on synthetic rounds

from mpguide.verify import claims, gate  # noqa: E402
from mpguide.verify.claims import metrics, tolerances, verdicts  # noqa: E402
from mpguide.verify.show import report  # noqa: E402
from mpguide_build import matrix_outcomes, matrix_summarize  # noqa: E402

CPU_BAND = tolerances.TOLERANCES["throughput-parity-cpu"]  # band 0.85-1.15


def _noisy(centre: float, n: int, spread: float, seed: int = 0) -> list[float]:
    """``n`` paired ratios around ``centre``: uniform noise of +-``spread`` (deterministic)."""
    import random

    rng = random.Random(seed)
    return [centre * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_median_interval_has_the_binomial_coverage():
    assert metrics.median_interval([1.0, 2, 3, 4, 5]) is None  # min..max of 5 covers only 93.75 %
    low, high, k, coverage = metrics.median_interval([6.0, 1, 5, 2, 4, 3])
    assert (low, high, k) == (1.0, 6.0, 1) and coverage == pytest.approx(1 - 2 / 64)
    low, high, k, coverage = metrics.median_interval(list(range(1, 10)))
    assert (low, high, k) == (2, 8, 2) and coverage == pytest.approx(1 - 2 * 10 / 512)
    low, high, k, coverage = metrics.median_interval(list(range(1, 21)))
    assert k == 6 and coverage >= 0.95 and (low, high) == (6, 15)


def test_clear_parity_passes():
    decision = metrics.decide_paired(_noisy(1.0, 6, 0.05), CPU_BAND)
    assert decision.verdict == "pass" and 0.85 <= decision.low <= decision.high <= 1.15


def test_a_clear_30_percent_slowdown_fails():
    decision = metrics.decide_paired(_noisy(1 / 1.3, 6, 0.05), CPU_BAND)  # each step 30 % longer
    assert decision.verdict == "fail" and decision.high < 0.85
    fast = metrics.decide_paired(_noisy(1.3, 6, 0.05), CPU_BAND)  # 30 % faster breaks parity too
    assert fast.verdict == "fail" and fast.low > 1.15


def test_noise_across_the_band_edge_is_inconclusive_at_any_number_of_rounds():
    for n in (6, 12, 20):
        decision = metrics.decide_paired(_noisy(0.85, n, 0.2, seed=n), CPU_BAND)  # median on the edge
        assert decision.verdict == "inconclusive", (n, decision)
    assert metrics.decide_paired([1.0] * 5, CPU_BAND).verdict == "inconclusive"  # too few rounds for 95 %
    one_bad = [1.0, 1.01, 0.99, 1.0, 0.7, 1.02]  # one outlier round: min..max reaches outside
    assert metrics.decide_paired(one_bad, CPU_BAND).verdict == "inconclusive"
    assert metrics.decide_paired(one_bad + [1.0, 0.99, 1.01], CPU_BAND).verdict == "pass"  # k = 2 drops it


def _record_with(manual: list[float], automatic: list[float]) -> dict:
    from conftest import curve, run

    extra = {"manual_round_steps_per_s": manual, "automatic_round_steps_per_s": automatic}
    return {
        "example": "x",
        "env": {},
        "preset": "test",
        "runs": [dict(run("r", curve()), extra=extra)],
        "claims": [
            claims.rate_ratio(
                "r",
                "manual_round_steps_per_s/automatic_round_steps_per_s",
                "throughput-parity-cpu",
                "manual as fast as automatic",
            )
        ],
    }


def test_inconclusive_is_never_reported_as_pass(capsys):
    ratios = _noisy(0.85, 8, 0.2, seed=3)
    record = _record_with([100 * q for q in ratios], [100.0] * len(ratios))
    verdict = claims.evaluate_record(record)[0]
    assert verdict.status == "inconclusive" and not verdict.passed and not verdict.failed and verdict.undecided
    assert "inconclusive" in verdict.message() and "passed" not in verdict.message()
    with pytest.raises(ValueError, match="inconclusive and cannot also pass"):
        verdicts.Verdict("x", "rate_ratio", ["r"], "t", "m", 1.0, "t", passed=True, inconclusive=True)
    # the gate: not a failure, not a pass, one line of its own
    found = gate.GateReport(verdicts=claims.evaluate_record(record), records=[Path("x.json")])
    assert found.ok and found.inconclusive == [verdict] and not found.failures
    line = found.summary()
    assert "0 failed, 1 inconclusive" in line and "INCONCLUSIVE (not a pass): x: rate_ratio(r) inconclusive" in line
    assert line.startswith("claim gate: 1 checks passed")  # the finite check of run r, not the claim
    # the example's own verdict table and closing line
    text = report.summary(record)
    assert "inconclusive (not a pass)" in text.splitlines()[2]
    assert "0 of 1 checks in the table hold, 1 inconclusive (not a pass)" in text.splitlines()[-1]
    assert report.verdict_rows([verdict])[0]["verdict"] == "inconclusive"
    # the version matrix cell
    assert (
        matrix_summarize._word(verdict.status) == "inconclusive"
        and matrix_outcomes.CELL_WORDS["inconclusive"] == "inconclusive"
    )


def test_the_sphinx_build_logs_inconclusive_claims_without_failing(monkeypatch):
    from mpguide_build import sphinx_ext

    ratios = _noisy(0.85, 8, 0.2, seed=3)
    found = gate.GateReport(
        verdicts=claims.evaluate_record(_record_with([100 * q for q in ratios], [100.0] * 8)), records=[Path("x.json")]
    )
    monkeypatch.setattr(gate, "judge", lambda *a, **k: found)
    monkeypatch.setattr(sphinx_ext, "_record_files", lambda app, references: [])
    logged: list[tuple[str, dict]] = []
    monkeypatch.setattr(sphinx_ext.logger, "info", lambda msg, **kw: logged.append((msg, kw)))
    monkeypatch.setattr(sphinx_ext.logger, "warning", lambda *a, **k: pytest.fail("a warning fails -W builds"))

    class App:
        class config:
            mpguide_gate, mpguide_results_dir = True, "r"
            mpguide_examples_dir = str(Path(__file__).resolve().parents[1] / "examples")

    sphinx_ext._on_build_finished(App, None)  # no ExtensionError
    assert any(m.startswith("[mpguide] INCONCLUSIVE (not a pass)") and kw.get("color") for m, kw in logged), logged


def test_the_example_stops_when_its_parity_claims_are_decided(monkeypatch):
    """claims_decided reads plot_15's own tables: the CPU parity claims, by precision."""
    from mpguide.verify.claims import declarations

    decl = declarations.read(declarations.example_file("plot_15_throughput"))
    tables = (list(_tables("RUNS")), list(_tables("CLAIMS")))
    assert len([c for c in decl.claims if c.get("only_on") == "cpu"]) == 7
    size = throughput_config.Size(width=8, layers=1, batch=4, warmup=1, steps=1, rounds=6, max_rounds=9)

    def timings(*manual: float) -> dict:  # manual's window seconds, repeated over 6 rounds (others: 1 s)
        out = {}
        for p in hardware.PRECISIONS:
            seconds = {"automatic": [1.0] * 6, "manual": list(manual) * (6 // len(manual)), "plain loop": [1.0] * 6}
            if throughput_config.OFFERED[p]:  # the manual step with PitfallChecks, as fast as automatic
                seconds["manual, PitfallChecks"] = [1.0] * 6
            out[p] = throughput.Timing(p, size, seconds)
        return out

    decided = throughput.claims_decided(*tables, "cpu")
    assert decided(timings(1.0))  # parity everywhere: decided (pass)
    assert decided(timings(1.3))  # 30 % slower: decided (fail)
    assert not decided(timings(1 / 0.75, 1 / 0.95))  # ratios 0.75 and 0.95 round after round: go on timing
    cuda = throughput.claims_decided(*tables, "cuda")  # the GPU claims (5 %) on the same rounds
    assert not cuda(timings(1 / 0.97, 1 / 1.07))


def _tables(name: str):
    import ast

    source = (Path(__file__).resolve().parents[1] / "examples" / "plot_15_throughput.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(name)


def _fake_windows(monkeypatch, seconds_of):
    """Replace both window timers by ``seconds_of(variant, round)`` (no training)."""
    rounds: dict[str, int] = {}

    def lightning(net, manual, batch, size, precision, accelerator, tuning=None, slowdown=0.0):
        variant = "automatic" if not manual else "manual, PitfallChecks" if tuning and tuning.checks else "manual"
        rounds[variant] = rounds.get(variant, 0) + 1
        return seconds_of(variant, rounds[variant] - 1) * (1 + slowdown)

    def plain(net, batch, size, precision, accelerator, state, slowdown=0.0):
        rounds["plain loop"] = rounds.get("plain loop", 0) + 1
        return seconds_of("plain loop", rounds["plain loop"] - 1) * (1 + slowdown)

    monkeypatch.setattr(throughput, "lightning_window", lightning)
    monkeypatch.setattr(throughput, "plain_window", plain)


def test_rounds_go_on_until_decided_or_the_cap(monkeypatch):
    size = throughput_config.Size(width=8, layers=1, batch=4, warmup=1, steps=2, rounds=6, max_rounds=12)
    tables = (_tables("RUNS"), _tables("CLAIMS"))
    until = throughput.claims_decided(*tables, "cpu")
    # quiet: every round agrees, so 6 rounds decide every claim
    _fake_windows(monkeypatch, lambda v, r: 1.0)
    out = throughput.interleaved(hardware.PRECISIONS, size, "cpu", progress=lambda line: None, until=until)
    assert len(out["32-true"].seconds["manual"]) == 6
    # noisy: the manual rounds swing +-30 %, the claims stay undecided, the cap ends it
    _fake_windows(monkeypatch, lambda v, r: 1.0 if v != "manual" else (0.7, 1.3)[r % 2])
    out = throughput.interleaved(hardware.PRECISIONS, size, "cpu", progress=lambda line: None, until=until)
    assert len(out["32-true"].seconds["manual"]) == 12
    # without a stopping test: exactly `rounds`
    out = throughput.interleaved(("32-true",), size, "cpu", progress=lambda line: None)
    assert len(out["32-true"].seconds["manual"]) == 6


def test_injected_slowdown_reaches_the_timed_variant_only(monkeypatch):
    _fake_windows(monkeypatch, lambda v, r: 1.0)
    size = throughput_config.Size(width=8, layers=1, batch=4, warmup=1, steps=2, rounds=6, max_rounds=6)
    monkeypatch.setenv(throughput_windows.SLOWDOWN_ENV, "manual=0.3")
    lines: list[str] = []
    out = throughput.interleaved(("32-true",), size, "cpu", progress=lines.append)
    assert out["32-true"].seconds["manual"] == [pytest.approx(1.3)] * 6
    assert out["32-true"].seconds["automatic"] == [1.0] * 6 and out["32-true"].injected_slowdown == {"manual": 0.3}
    assert lines[0].startswith("  TEST HOOK: injected slowdown {'manual': 0.3}")
    for bad in ("manual", "manual=fast", "manaul=0.3", "manual=-0.1"):
        with pytest.raises(hardware.ConfigurationError, match="must be 'variant=fraction'"):
            throughput_windows.parse_slowdown(bad)


def test_the_slowdown_hook_really_lengthens_a_step(monkeypatch):
    """The busy-wait runs on the benchmark's own clock: a step of 10 ms of fake CPU time gets 3 ms more."""
    now = [0.0]

    def fake_clock(accelerator):
        now[0] += 0.0001  # every reading costs 0.1 ms, as a busy loop would
        return now[0]

    monkeypatch.setattr(throughput_windows, "clock", fake_clock)
    timer = throughput_windows._WindowClock(warmup=1, accelerator="cpu", slowdown=0.3)
    timer.on_train_batch_end(None, None, None, None, 0)  # end of the warm-up: the window starts
    start = timer.start
    now[0] += 0.01  # a 10 ms step
    timer.on_train_batch_end(None, None, None, None, 1)
    assert timer.end - start == pytest.approx(0.013, abs=0.0005)
