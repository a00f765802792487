"""Random stepping programs for the plugins (issue 26), drawn with hypothesis.

A :class:`Program` is one ``training_step`` body, run on every batch: a list of :class:`Op` over
1-3 optimizers, each owning one small linear head on the batch. An op is guarded by an
accumulation window (``every``: it runs on batches where ``batch_idx % every == every - 1``).
The program also fixes the GradScaler's settings, the optimizers' kinds, the batches whose
backward is made non-finite (an injected overflow) and an optimizer replaced mid-run.
``Program.source()`` prints it as a pasteable ``training_step``: hypothesis shrinks a failing
program, and the test prints the shrunk one.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adam-foreach", "adam-fused")
#: where a clip happens: the plugin's clip before the step, in on_before_optimizer_step (after the
#: plugin unscaled), or a direct torch.nn.utils.clip_grad_norm_ between backward and step (a stated limit)
CLIPS = ("plugin", "hook", "direct")
BATCHES = 4
WIDTH = 4


@dataclass(frozen=True)
class Op:
    kind: str  # "zero" | "backward" | "clip" | "step"
    optimizers: tuple[int, ...]  # zero/clip/step: one optimizer; backward: the heads its loss reaches
    every: int = 1  # runs on batches with batch_idx % every == every - 1
    clip: str = ""  # for kind == "clip": one of CLIPS

    def line(self) -> str:
        guard = "" if self.every == 1 else f"if batch_idx % {self.every} == {self.every - 1}: "
        i = self.optimizers[0]
        if self.kind == "zero":
            return f"{guard}opts[{i}].zero_grad()"
        if self.kind == "step":
            return f"{guard}opts[{i}].step()"
        if self.kind == "backward":
            heads = " + ".join(f"self.heads[{j}](x).float().pow(2).mean()" for j in self.optimizers)
            return f"{guard}self.manual_backward(({heads}) * GAIN * POISON.get((batch_idx, {self.op_id}), 1.0))"
        code = {
            "plugin": f"self.clip_gradients(opts[{i}], gradient_clip_val=CLIP)",
            "hook": f"self.clip_in_hook.add({i})  # on_before_optimizer_step clips opts[{i}] (unscaled by then)",
            "direct": f"torch.nn.utils.clip_grad_norm_(self.heads[{i}].parameters(), CLIP)",
        }[self.clip]
        return f"{guard}{code}"

    op_id: int = 0  # position among the backward ops (the poison table's key)


@dataclass(frozen=True)
class Program:
    ops: tuple[Op, ...]
    optimizers: tuple[str, ...]
    init_scale: float
    growth_interval: int
    enabled: bool
    poisoned: frozenset[tuple[int, int]]  # (batch, backward op id) whose loss is multiplied by inf
    replace_at: int | None  # batch at whose start optimizer 0 is replaced by a fresh one of its kind
    lr: float = 0.05
    clip_val: float = 0.5
    #: > 1: a "natural overflow" program: the loss is multiplied by ``gain`` (and lr divided by it) at the
    #: default init scale 65536, so fp16 gradients overflow by themselves at first, as at the start of any
    #: fp16 run; which steps overflow is then not predicted by the oracle (see ``judge``)
    gain: float = 1.0

    @property
    def n(self) -> int:
        return len(self.optimizers)

    def source(self) -> str:
        """The program as a ``training_step`` a reader can paste (with its settings as comments)."""
        lines = [
            f"# optimizers: {', '.join(self.optimizers)} (lr {self.lr}), one Linear({WIDTH}, 1) head each",
            f"# GradScaler(init_scale={self.init_scale}, growth_interval={self.growth_interval}, "
            f"enabled={self.enabled}); CLIP = {self.clip_val}; GAIN = {self.gain}; {BATCHES} batches",
            "POISON = {"
            + ", ".join(f"{key}: float('inf')" for key in sorted(self.poisoned))
            + "}  # injected overflows",
        ]
        if self.replace_at is not None:
            lines.append(f"# a callback replaces optimizer 0 with a fresh one at batch {self.replace_at}")
        lines += ["def training_step(self, batch, batch_idx):", "    (x,) = batch", "    opts = self.optimizers()"]
        lines += [f"    {op.line()}" for op in self.ops]
        return "\n".join(lines)


def _stepping_programs(draw) -> Program:
    n = draw(st.integers(1, 3))
    kinds = tuple(draw(st.sampled_from(OPTIMIZERS)) for _ in range(n))
    ops: list[Op] = []
    backward_id = 0
    for _ in range(draw(st.integers(1, 3))):  # one or several rounds of backward(s), then steps
        for _ in range(draw(st.integers(0, 2))):
            heads = tuple(sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n))))
            ops.append(Op("backward", heads, op_id=backward_id))
            backward_id += 1
        for i in range(n):
            for _ in range(draw(st.integers(0, 1))):  # 0-3 steps of each per training_step over the rounds
                every = draw(st.sampled_from((1, 1, 2, 3)))
                if draw(st.booleans()) and kinds[i] != "adam-fused":  # a fused optimizer cannot be clipped
                    ops.append(Op("clip", (i,), every, clip=draw(st.sampled_from(CLIPS))))
                ops.append(Op("step", (i,), every))
                if draw(st.booleans()):
                    ops.append(Op("zero", (i,), every))
    if not any(op.kind == "backward" for op in ops):
        ops.insert(0, Op("backward", tuple(range(n)), op_id=0))
        backward_id = max(backward_id, 1)
    enabled = draw(st.booleans()) or draw(st.booleans())  # enabled=False in about a quarter
    poisoned = frozenset()
    if enabled:
        poisoned = frozenset(
            draw(st.sets(st.tuples(st.integers(0, BATCHES - 1), st.integers(0, backward_id - 1)), max_size=2))
        )
    growth_interval = draw(st.sampled_from((1, 2, 2000)))
    # no natural fp16 overflow (the oracle predicts only the injected ones): stock updates at most once per
    # step, so the scale stays below init * 2**(steps // growth_interval); keep that under 2**12
    steps = BATCHES * sum(op.kind == "step" for op in ops)
    init_scale = min(draw(st.sampled_from((1.0, 16.0, 1024.0))), 2.0 ** (12 - steps // growth_interval))
    replace_at = draw(st.one_of(st.none(), st.integers(1, BATCHES - 1)))
    if draw(st.integers(0, 3)) == 3:  # about a quarter: natural overflows (no injected ones)
        return Program(tuple(ops), kinds, 65536.0, growth_interval, True, frozenset(), replace_at, 0.05 / 64, gain=64.0)
    return Program(tuple(ops), kinds, init_scale, growth_interval, enabled, poisoned, replace_at)


stepping_programs = st.composite(_stepping_programs)
