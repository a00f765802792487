"""Generated stepping programs judged by an oracle written from GradScaler's rules (issue 26).

Each program (:mod:`patterns.programs`) runs stock, with the plugin and in fp32 (the oracle,
:mod:`patterns.run`), in a Trainer and in a Fabric loop; :func:`patterns.run.judge` lists the rules
the plugin's run breaks. A failure is shrunk by hypothesis and printed as a pasteable ``training_step``.

A quarter of the programs have natural overflows instead of injected ones (``Program.gain``): for
them the oracle checks only that the plugin runs where stock runs, skips no more steps than stock and
updates the scale no more often. Issue 26 item 1's truncated-BPTT shape is always run (``TBPTT``):
random draws rarely combine several steps of one optimizer with natural overflows.

Budget: ``MPGUIDE_PATTERNS_EXAMPLES`` programs (default 150, the CI budget) from seed
``MPGUIDE_PATTERNS_SEED`` (default 26); ``nox -s patterns`` runs the long one.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, example, given, note, seed, settings
from lightning.fabric.plugins.precision import MixedPrecision as FabricMixedPrecision
from lightning.pytorch.plugins.precision import MixedPrecision
from patterns.programs import Op, Program, stepping_programs
from patterns.run import judge, oracle, run_fabric, run_trainer

from mpguide.fabric import FabricManualMixedPrecision
from mpguide.precision import ManualMixedPrecision
from mpguide.verify.run.runner import quiet_lightning

quiet_lightning()
EXAMPLES = int(os.environ.get("MPGUIDE_PATTERNS_EXAMPLES", "150"))
SEED = int(os.environ.get("MPGUIDE_PATTERNS_SEED", "26"))
LOOPS = {
    "trainer": (run_trainer, MixedPrecision, ManualMixedPrecision),
    "fabric": (run_fabric, FabricMixedPrecision, FabricManualMixedPrecision),
}


#: issue 26 item 1's shape, always run first: truncated BPTT, one optimizer stepped after each of 3 chunks,
#: natural overflows from init scale 65536 (5d093d9's plugin skipped all 12 steps here, stock 8)
TBPTT = Program(
    ops=tuple(op for k in range(3) for op in (Op("zero", (0,)), Op("backward", (0,), op_id=k), Op("step", (0,)))),
    optimizers=("sgd",),
    init_scale=65536.0,
    growth_interval=2000,
    enabled=True,
    poisoned=frozenset(),
    replace_at=None,
    lr=0.05 / 64,
    gain=64.0,
)


#: found by the long run (seed 2026) on e9105a9: three optimizers, one backward, natural overflows; one
#: backoff for two skipped steps left the scale higher than stock's and the plugin skipped 12 steps, stock 10
THREE_HEADS = Program(
    ops=(
        Op("backward", (0, 1, 2), op_id=0),
        Op("step", (1,)),
        Op("step", (2,)),
        Op("zero", (2,)),
        Op("step", (1,)),
    ),
    optimizers=("sgd", "sgd", "sgd"),
    init_scale=65536.0,
    growth_interval=1,
    enabled=True,
    poisoned=frozenset(),
    replace_at=None,
    lr=0.05 / 64,
    gain=64.0,
)


def check(program: Program, loop: str) -> list[str]:
    run, stock_cls, ours_cls = LOOPS[loop]
    expected = oracle(program)
    return judge(program, expected, run(program, stock_cls), run(program, ours_cls))


@pytest.mark.slow
@seed(SEED)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(program=stepping_programs())
@example(program=TBPTT)
@example(program=THREE_HEADS)
def test_generated_programs_obey_the_oracle(program):
    note(program.source())
    for loop in LOOPS:
        broken = check(program, loop)
        assert not broken, f"{loop}: " + "; ".join(broken) + "\n" + program.source()


# ------------------------------------------------------------------- the oracle can fail: known-bad inputs
TWO_HEADS_ONE_BACKWARD = Program(
    ops=(
        Op("zero", (0,)),
        Op("zero", (1,)),
        Op("backward", (0, 1), op_id=0),
        Op("step", (0,)),
        Op("step", (1,)),
    ),
    optimizers=("sgd", "sgd"),
    init_scale=16.0,
    growth_interval=1,
    enabled=True,
    poisoned=frozenset(),
    replace_at=None,
)


def test_the_oracle_flags_stock_where_it_unscales_with_a_changed_scale():
    """Two optimizers, one backward, the scale growing after every update: Lightning's plugin unscales the
    second optimizer's gradients with a doubled scale (update x0.5), so the oracle must flag its weights."""
    expected = oracle(TWO_HEADS_ONE_BACKWARD)
    ours = run_trainer(TWO_HEADS_ONE_BACKWARD, ManualMixedPrecision)
    stock = run_trainer(TWO_HEADS_ONE_BACKWARD, MixedPrecision)
    assert judge(TWO_HEADS_ONE_BACKWARD, expected, stock, ours) == []
    # stock judged as if it were the plugin: its weights break the bound
    assert any("from the oracle's" in b for b in judge(TWO_HEADS_ONE_BACKWARD, expected, stock, stock))


def test_the_oracle_flags_a_wrong_skip_a_new_exception_and_extra_updates():
    program = TWO_HEADS_ONE_BACKWARD
    expected = oracle(program)
    stock = run_trainer(program, ManualMixedPrecision)
    wrong_skip = run_trainer(program, ManualMixedPrecision)
    wrong_skip.applied[0] = False
    assert any("skip decisions" in b for b in judge(program, expected, stock, wrong_skip))
    raised = run_trainer(program, ManualMixedPrecision)
    raised.error = "ValueError: made up"
    assert judge(program, expected, stock, raised) == ["the plugin raised where stock ran: ValueError: made up"]
    chatty = run_trainer(program, ManualMixedPrecision)
    chatty.updates = chatty.steps + 1
    assert any("scale updates" in b for b in judge(program, expected, stock, chatty))


def test_a_program_prints_as_a_training_step():
    source = TWO_HEADS_ONE_BACKWARD.source()
    assert "def training_step(self, batch, batch_idx):" in source
    assert "self.manual_backward((self.heads[0](x).float().pow(2).mean() + self.heads[1](x)" in source
    compile(source, "<program>", "exec")  # pasteable: valid Python
    assert source.splitlines()[-1] == "    opts[1].step()"
