"""ManualMixedPrecision under every stepping pattern (issue 11), against fp32 with a real Trainer; the
pattern table runs FabricManualMixedPrecision in a real Fabric loop too (issue 21).

Each input of the issue is run in fp32 and with the plugin; the fp32 run is the expected result. A
table of stepping patterns (optimizers x frequencies x clipping x zeroing x a forced overflow x a step
that is not taken) compares every applied update, every skip flag from ``step_skip_aware`` and the
final loss scale with what the fp32 run implies. Lightning's own MixedPrecision fails the same checks,
which shows they can fail. Runs on CUDA too when a GPU is present.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric import Fabric
from lightning.fabric.plugins.precision import MixedPrecision as FabricMixedPrecision
from lightning.pytorch.plugins.precision import MixedPrecision
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from mpguide import precision as precision_mod
from mpguide.fabric import FabricManualMixedPrecision
from mpguide.precision import ManualMixedPrecision, UnsupportedVersionError, check_versions
from mpguide.steps import step_skip_aware
from mpguide.verify.run.runner import parameter_digest, quiet_lightning

quiet_lightning()
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def loader(batches=12, width=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(batches * 4, width, generator=gen)), batch_size=4)


def fit(module, plugin=None, device="cpu", batches=12, ckpt_path=None, callbacks=(), max_epochs=1, width=6):
    trainer = pl.Trainer(
        accelerator=device,
        devices=1,
        max_epochs=max_epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(callbacks),
        callbacks=list(callbacks),
        **({"plugins": [plugin]} if plugin else {"precision": "32-true"}),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader(batches, width), ckpt_path=ckpt_path)
    return trainer


def update_norm(params, before):
    return float(torch.cat([(p.detach() - b).flatten() for p, b in zip(params, before)]).norm())


def snapshot(params):
    return [p.detach().clone() for p in params]


# ---------------------------------------------------------------------------------------------- input 1
class ProbeAndModel(pl.LightningModule):
    """Issue input 1: model A clipped and stepped every batch, a probe B on detached features stepped
    every ``b_every`` batches; only stepped optimizers are zeroed."""

    def __init__(self, b_every=2, own_backward=False):
        super().__init__()
        pl.seed_everything(0, verbose=False)
        self.automatic_optimization = False
        self.a = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
        self.b = nn.Linear(8, 1)
        self.b_every, self.own_backward = b_every, own_backward
        self.a_updates, self.b_updates = [], []

    def training_step(self, batch, batch_idx):
        (x,) = batch
        opt_a, opt_b = self.optimizers()
        features = self.a[1](self.a[0](x))
        # losses in fp32: CPU autocast keeps pow/mean in fp16, where d(65536 x loss) = 65536 overflows
        loss_a = self.a[2](features).float().pow(2).mean()
        loss_b = (self.b(features.detach()).float() - 1).pow(2).mean()
        if self.own_backward:
            self.manual_backward(loss_a)
            self.manual_backward(loss_b)
        else:
            self.manual_backward(loss_a + loss_b)
        self.clip_gradients(opt_a, gradient_clip_val=0.01, gradient_clip_algorithm="norm")
        before = snapshot(self.a.parameters())
        opt_a.step()
        opt_a.zero_grad()
        self.a_updates.append(update_norm(self.a.parameters(), before))
        if batch_idx % self.b_every == self.b_every - 1:
            self.clip_gradients(opt_b, gradient_clip_val=0.01, gradient_clip_algorithm="norm")
            before = snapshot(self.b.parameters())
            opt_b.step()
            opt_b.zero_grad()
            self.b_updates.append(update_norm(self.b.parameters(), before))
        return loss_a.detach()

    def configure_optimizers(self):
        return torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b_every,own_backward", [(2, False), (3, True)])
def test_input1_clip_with_optimizers_at_two_frequencies(device, b_every, own_backward):
    ref, fixed, stock = (ProbeAndModel(b_every, own_backward) for _ in range(3))
    fit(ref, device=device)
    fit(fixed, ManualMixedPrecision("16-mixed", device), device=device)
    fit(stock, MixedPrecision("16-mixed", device), device=device)
    # every update is lr x the clip norm (fp32 rounding aside), for both optimizers
    both = ref.a_updates + ref.b_updates
    assert both == pytest.approx([1e-3] * len(both), rel=1e-4)
    assert fixed.a_updates == pytest.approx(ref.a_updates, rel=1e-3)
    # B's first gradient overflows fp16 at scale 65536 (GradScaler skips it, by design); then lr x 0.01
    assert fixed.b_updates[0] == 0.0 and fixed.b_updates[1:] == pytest.approx(ref.b_updates[1:], rel=1e-3)
    assert min(stock.a_updates) < 1e-5  # stock clips scaled gradients: the check can fail


# ---------------------------------------------------------------------------------------------- input 2
class NotTaken(pl.LightningModule):
    """Issue input 2: zero_grad at the top, backward, clip at 1e9, and no step on batch 2."""

    def __init__(self, skip_batch=2):
        super().__init__()
        pl.seed_everything(0, verbose=False)
        self.automatic_optimization = False
        self.net = nn.Linear(6, 1)
        self.skip_batch, self.updates = skip_batch, []

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = 0.01 * (self.net(batch[0]).float() - 1).pow(2).mean()  # fp32 loss: see ProbeAndModel
        self.manual_backward(loss)
        self.clip_gradients(opt, gradient_clip_val=1e9, gradient_clip_algorithm="norm")
        if batch_idx != self.skip_batch:
            before = snapshot(self.net.parameters())
            opt.step()
            self.updates.append(update_norm(self.net.parameters(), before))
        return loss.detach()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1.0)


@pytest.mark.parametrize("device", DEVICES)
def test_input2_step_not_taken(device):
    ref, fixed, stock = NotTaken(), NotTaken(), NotTaken()
    fit(ref, device=device)
    trainer = fit(fixed, ManualMixedPrecision("16-mixed", device), device=device)
    fit(stock, MixedPrecision("16-mixed", device), device=device)
    assert len(fixed.updates) == len(ref.updates) == 11
    assert fixed.updates == pytest.approx(ref.updates, rel=2e-3)
    assert trainer.precision_plugin.scaler.get_scale() == 65536.0  # nothing overflowed, no growth yet
    # stock Lightning never unscales here: its clip threshold is never reached either (1e9), so it matches
    assert stock.updates == pytest.approx(ref.updates, rel=2e-3)


# ---------------------------------------------------------------------------------------------- table
@dataclass(frozen=True)
class Pattern:
    every: tuple[int, ...]  # optimizer i steps on batches b with b % every[i] == every[i] - 1
    clip: str = "none"  # "none", "due" (before each step) or "always" (every batch)
    zero: str = "top"  # "top": zero_grad of all at the top; "after": zero_grad after each own step
    backward: str = "shared"  # one backward of the summed losses, or "separate" (one per optimizer)
    overflow: tuple[int, int] | None = None  # (batch, optimizer): that optimizer's gradient becomes inf
    not_taken: tuple[int, int] | None = None  # (batch, optimizer): its due step is left out


class Heads(pl.LightningModule):
    """One linear head per optimizer on the same input; SGD without momentum, so an update is lr x gradient.

    In fp32 (``simulate=True``) a forced overflow is simulated: the poisoned optimizer's next step is
    left out, exactly what GradScaler does with inf gradients; this is the expected result. The same
    batch body (:meth:`run_batch`) runs in a Trainer (``training_step``) and in a Fabric loop
    (:func:`fabric_fit`), through the ``ops`` each gives it."""

    def __init__(self, pattern: Pattern, simulate: bool):
        super().__init__()
        pl.seed_everything(0, verbose=False)
        self.automatic_optimization = False
        self.p, self.simulate = pattern, simulate
        self.heads = nn.ModuleList(nn.Linear(6, 1) for _ in pattern.every)
        self.poisoned = [False] * len(pattern.every)
        self.updates, self.applied, self.stepped_batches = {}, {}, []
        for i, head in enumerate(self.heads):
            head.weight.register_hook(lambda g, i=i: self._poison(g, i))

    def _poison(self, grad, i):
        if self.p.overflow == (self.batch, i):
            self.poisoned[i] = True
            if not self.simulate:
                return grad * float("inf")
        return grad

    def _zero(self, opt, i):
        opt.zero_grad()
        self.poisoned[i] = False

    def training_step(self, batch, batch_idx):
        opts = self.optimizers()
        ops = TrainerOps(self, opts if isinstance(opts, list) else [opts])
        return self.run_batch(batch[0], batch_idx, ops)

    def run_batch(self, x, batch_idx, ops):
        self.batch, opts, p = batch_idx, ops.opts, self.p
        if p.zero == "top":
            for i, opt in enumerate(opts):
                self._zero(opt, i)
        losses = [(3 + i) * (head(x).float() - i).pow(2).mean() for i, head in enumerate(self.heads)]
        if p.backward == "shared":
            ops.backward(sum(losses))
        else:
            for loss in losses:
                ops.backward(loss)
        for i, opt in enumerate(opts):
            due = batch_idx % p.every[i] == p.every[i] - 1
            if p.clip == "always" or (p.clip == "due" and due):
                ops.clip(opt)
            if not due or p.not_taken == (batch_idx, i):
                continue
            before = snapshot(self.heads[i].parameters())
            if self.simulate and self.poisoned[i]:
                applied = False  # what GradScaler does with inf gradients
            else:
                applied = ops.step(opt)
            self.updates[(batch_idx, i)] = torch.cat(
                [(q.detach() - b).flatten().cpu() for q, b in zip(self.heads[i].parameters(), before)]
            )
            self.applied[(batch_idx, i)] = applied
            self.stepped_batches.append(batch_idx)
            if p.zero == "after":
                self._zero(opt, i)
        return sum(losses).detach()

    def configure_optimizers(self):
        return [torch.optim.SGD(h.parameters(), lr=0.05) for h in self.heads]


@dataclass
class TrainerOps:
    """Backward, clip and step as a LightningModule writes them."""

    module: Heads
    opts: list

    def backward(self, loss):
        self.module.manual_backward(loss)

    def clip(self, opt):
        self.module.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")

    def step(self, opt):
        return step_skip_aware(opt, self.module.trainer)


@dataclass
class FabricOps:
    """Backward, clip and step as a Fabric loop writes them (``fabric.clip_gradients`` clips by norm too)."""

    fabric: Fabric
    model: nn.Module
    opts: list

    def backward(self, loss):
        self.fabric.backward(loss)

    def clip(self, opt):
        # error_if_nonfinite=False: Lightning's clip_gradients does not raise on a forced overflow either
        self.fabric.clip_gradients(self.model, opt, max_norm=0.5, error_if_nonfinite=False)

    def step(self, opt):
        plugin = self.fabric.strategy.precision
        if hasattr(plugin, "step_was_skipped"):
            opt.step()
            return not plugin.step_was_skipped(opt)
        scaler = getattr(plugin, "scaler", None)
        if scaler is None:
            opt.step()
            return True
        before = scaler.get_scale()
        opt.step()
        state = scaler._per_optimizer_states.get(id(opt.optimizer))
        if state and state["found_inf_per_device"]:  # a plugin that defers update(): its inf check is still there
            return not sum(float(t) for t in state["found_inf_per_device"].values()) > 0
        return scaler.get_scale() >= before  # Fabric's plugin: update() inside the step


def fabric_fit(module: Heads, plugin=None, device="cpu", batches=12, width=6):
    """The Trainer's loop of :func:`fit` written with Fabric: same batches, same body, same optimizers."""
    fabric = Fabric(accelerator=device, devices=1, **({"plugins": [plugin]} if plugin else {"precision": "32-true"}))
    model, *opts = fabric.setup(module.heads, *module.configure_optimizers())
    ops = FabricOps(fabric, model, opts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch_idx, (x,) in enumerate(loader(batches, width)):
            module.run_batch(x.to(fabric.device), batch_idx, ops)
    getattr(plugin, "update_scale", lambda: None)()  # the update the next backward would apply
    return fabric


def scaled_plugin(cls, device, interval=2):
    # scale 1 growing every 2 updates: several scale changes while gradients are held, no natural overflow
    scaler = torch.amp.GradScaler(device, init_scale=1.0, growth_interval=interval)
    count_updates(scaler)
    return cls("16-mixed", device, scaler=scaler)


def count_updates(scaler):
    """Count ``scaler.update()`` calls in ``scaler.updates`` (an instance attribute shadows the method)."""
    update, scaler.updates = scaler.update, 0

    def counted(*args, **kwargs):
        scaler.updates += 1
        return update(*args, **kwargs)

    scaler.update = counted
    return scaler


def random_patterns(n=8, seed=11):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 3)
        every = tuple(rng.choice([1, 2, 3]) for _ in range(k))
        out.append(
            Pattern(
                every,
                clip=rng.choice(["none", "due", "always"]),
                zero=rng.choice(["top", "after"]),
                backward=rng.choice(["shared", "separate"]),
                overflow=rng.choice([None, (rng.randint(0, 9), rng.randrange(k))]),
                not_taken=rng.choice([None, (rng.randint(0, 9), rng.randrange(k))]),
            )
        )
    return out


PATTERNS = [
    Pattern((1, 2), clip="due", zero="after"),  # input 1 in the table
    Pattern((1, 3), clip="due", zero="after", backward="separate"),
    Pattern((1,), clip="due", not_taken=(2, 0)),  # input 2 in the table
    Pattern((1, 2), clip="always", zero="after", overflow=(4, 0)),
    Pattern((2, 1), zero="after", overflow=(2, 0)),  # overflow held in an accumulation window
    Pattern((1, 1), clip="due", overflow=(3, 1)),  # shared backward, the second optimizer overflows
    Pattern((4,), zero="after", overflow=(5, 0)),  # accumulation windows of 4
    Pattern((1, 2, 3), clip="always", zero="after", backward="separate", overflow=(4, 2), not_taken=(5, 1)),
] + random_patterns()


# the two loops the table runs: (fit function, this plugin, the stock plugin it replaces)
LOOPS = {
    "trainer": (fit, ManualMixedPrecision, MixedPrecision),
    "fabric": (fabric_fit, FabricManualMixedPrecision, FabricMixedPrecision),
}


def check_against_fp32(pattern, device, cls=ManualMixedPrecision, loop="trainer"):
    run_loop = LOOPS[loop][0]
    ref, run = Heads(pattern, simulate=True), Heads(pattern, simulate=False)
    run_loop(ref, device=device)
    plugin = scaled_plugin(cls, device)
    run_loop(run, plugin, device=device)
    assert run.applied == ref.applied, "the skip flags disagree with the steps fp32 implies"
    assert run.updates.keys() == ref.updates.keys()
    for (batch, i), expected in ref.updates.items():
        # fp16 autocast rounds the forward (~1e-3 relative); a wrong scale is off by a factor of 2 or more
        error = float((run.updates[batch, i] - expected).norm())
        assert error <= 3e-2 * float(expected.norm()) + 1e-6, f"optimizer {i}, batch {batch}: {error:.3g}"
    # the update rule (mpguide._common.UPDATE_RULE): never more updates than steps (Lightning's plugin: one
    # per step), and with the Trainer at least one per training_step that stepped (rule 4)
    steps = len(ref.applied)
    assert plugin.scaler.updates <= steps
    if loop == "trainer":
        assert plugin.scaler.updates >= len(set(ref.stepped_batches))
        # no pending update after the run, so these bounds are the count for the whole run
        assert not any(r.stepped for r in plugin._records)


@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
def test_stepping_patterns_match_fp32(pattern, device, loop):
    check_against_fp32(pattern, device, LOOPS[loop][1], loop)


@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("pattern", [PATTERNS[0], PATTERNS[2], PATTERNS[4]], ids=str)
def test_stock_plugin_fails_the_same_checks(pattern, loop):
    # Fabric's plugin also crashes on the step not taken: a second clip before any update() makes
    # GradScaler raise "unscale_() has already been called on this optimizer since the last update()"
    with pytest.raises(AssertionError if loop == "trainer" else (AssertionError, RuntimeError)):
        check_against_fp32(pattern, "cpu", LOOPS[loop][2], loop)


def test_random_patterns_cover_every_dimension():
    seen = {
        (f, v)
        for p in PATTERNS
        for f, v in [
            ("clip", p.clip),
            ("zero", p.zero),
            ("backward", p.backward),
            ("k", len(p.every)),
            ("overflow", p.overflow is None),
            ("not_taken", p.not_taken is None),
        ]
    }
    assert len(seen) == 3 + 2 + 2 + 3 + 2 + 2, sorted(seen)


# ---------------------------------------------------------------------------------------------- input 3
class Scaled(pl.LightningModule):
    """One optimizer; an overflow at batch 1 and growth every 3 updates move the scale off its start."""

    def __init__(self):
        super().__init__()
        pl.seed_everything(0, verbose=False)
        self.automatic_optimization = False
        self.net = nn.Linear(6, 1)
        self.scales = []
        self.net.weight.register_hook(lambda g: g * float("inf") if self.global_step == 1 else g)

    def training_step(self, batch, batch_idx):
        self.scales.append(self.trainer.precision_plugin.scaler.get_scale())  # scale the backward uses
        opt = self.optimizers()
        opt.zero_grad()
        loss = (self.net(batch[0]) - 1).pow(2).mean()
        self.manual_backward(loss)
        opt.step()
        return loss.detach()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def scaler_plugin(cls):
    return cls("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=3))


@pytest.mark.parametrize(
    "writer,reader",
    [
        (MixedPrecision, ManualMixedPrecision),
        (ManualMixedPrecision, MixedPrecision),
        (ManualMixedPrecision, ManualMixedPrecision),
        (MixedPrecision, MixedPrecision),
    ],
)
def test_input3_checkpoint_keeps_the_scale_across_plugin_classes(tmp_path, writer, reader):
    first = Scaled()
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)
    fit(first, scaler_plugin(writer), callbacks=[ckpt], batches=7)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    final = first.trainer.precision_plugin.scaler.get_scale()
    assert final == 256.0  # halved at batch 1 (to 128), doubled after 3 clean updates (batches 2-4)
    assert saved[writer.__qualname__]["scale"] == final
    resumed = Scaled()
    fit(resumed, scaler_plugin(reader), ckpt_path=str(tmp_path / "last.ckpt"), max_epochs=2, batches=7)
    assert resumed.scales[0] == final
    assert saved[writer.__qualname__]["_growth_tracker"] == 2  # batches 5-6 clean; the next update grows
    assert resumed.scales[1] == 2 * final


def test_input3_the_check_fails_without_the_alias(tmp_path):
    first = Scaled()
    fit(
        first,
        scaler_plugin(ManualMixedPrecision),
        callbacks=[pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)],
        batches=8,
    )
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    del saved[MixedPrecision.__qualname__]  # what Lightning alone writes
    saved[ManualMixedPrecision.__qualname__]["scale"] = 8.0
    torch.save(saved, tmp_path / "stripped.ckpt")
    resumed = Scaled()
    fit(resumed, scaler_plugin(MixedPrecision), ckpt_path=str(tmp_path / "stripped.ckpt"), max_epochs=2, batches=8)
    assert resumed.scales[0] == 256.0  # the stock plugin restarts at its initial scale without a word
    again = Scaled()
    fit(again, scaler_plugin(ManualMixedPrecision), ckpt_path=str(tmp_path / "stripped.ckpt"), max_epochs=2, batches=8)
    assert again.scales[0] == 8.0


# ---------------------------------------------------------------------------------------------- input 4
class MuonSquare(pl.LightningModule):
    """A 32x32 weight trained by torch.optim.Muon; ``manual`` selects a faithful manual port."""

    def __init__(self, manual: bool):
        super().__init__()
        pl.seed_everything(0, verbose=False)
        self.automatic_optimization = not manual
        self.w = nn.Linear(32, 32, bias=False)
        self.autocast_in_step = []

    def training_step(self, batch, batch_idx):
        (x,) = batch
        loss = (self.w(x) - x.flip(1)).pow(2).mean()
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss.detach()

    def on_before_optimizer_step(self, optimizer):
        self.autocast_in_step.append(torch.is_autocast_enabled("cpu"))

    def configure_optimizers(self):
        return torch.optim.Muon(self.parameters(), lr=0.02)


@pytest.mark.parametrize("device", DEVICES)
def test_input4_muon_manual_equals_automatic_with_the_plugin(device):
    digests = {}
    for name, plugin in [("stock", MixedPrecision), ("plugin", ManualMixedPrecision)]:
        for manual in (False, True):
            module = MuonSquare(manual)
            fit(module, plugin("16-mixed", device), device=device, batches=16, width=32)
            digests[name, manual] = parameter_digest(module)
            if device == "cpu":
                assert module.autocast_in_step == [manual and name == "stock"] * 16
    assert digests["plugin", True] == digests["plugin", False] == digests["stock", False]
    assert digests["stock", True] != digests["stock", False]  # stock: the step ran under fp16 autocast


def test_version_guard(monkeypatch):
    check_versions()  # the installed version is supported
    with pytest.raises(UnsupportedVersionError, match="tested with Lightning 2.6.x .*found 2.7.0"):
        check_versions("2.7.0")
    monkeypatch.setattr(precision_mod.lightning, "__version__", "2.4.1")
    with pytest.raises(UnsupportedVersionError, match="found 2.4.1"):
        ManualMixedPrecision("16-mixed", "cpu")


class Critic(pl.LightningModule):
    """Several critic steps in one training_step (WGAN style), then one generator step; the critic's
    gradient overflows on one inner step. fp32 (``simulate=True``) leaves that step out instead."""

    def __init__(self, simulate: bool, n_critic=3, overflow=(3, 1)):
        super().__init__()
        pl.seed_everything(0, verbose=False)
        self.automatic_optimization = False
        self.critic, self.gen = nn.Linear(6, 1), nn.Linear(6, 6)
        self.simulate, self.n_critic, self.overflow = simulate, n_critic, overflow
        self.updates, self.applied, self.scales = [], [], []
        self.critic.weight.register_hook(self._poison)

    def _poison(self, grad):
        if (self.batch, self.inner) == self.overflow and not self.simulate:
            return grad * float("inf")
        return grad

    def training_step(self, batch, batch_idx):
        (x,) = batch
        opt_c, opt_g = self.optimizers()
        self.batch, scaler = batch_idx, getattr(self.trainer.precision_plugin, "scaler", None)
        self.scales.append(scaler.get_scale() if scaler else None)
        for inner in range(self.n_critic):
            self.inner = inner
            opt_c.zero_grad()
            self.manual_backward((self.critic(self.gen(x).detach()).float() - 1).pow(2).mean())
            before = snapshot(self.critic.parameters())
            if self.simulate and (batch_idx, self.inner) == self.overflow:
                applied = False
            else:
                applied = step_skip_aware(opt_c, self.trainer)
            self.applied.append(applied)
            self.updates.append(
                torch.cat([(p.detach() - b).flatten() for p, b in zip(self.critic.parameters(), before)]).cpu()
            )
        self.inner = None
        opt_g.zero_grad()
        loss_g = self.critic(self.gen(x)).float().pow(2).mean()
        self.manual_backward(loss_g)
        opt_g.step()
        return loss_g.detach()

    def configure_optimizers(self):
        return (torch.optim.SGD(self.critic.parameters(), lr=0.05), torch.optim.SGD(self.gen.parameters(), lr=0.05))


@pytest.mark.parametrize("device", DEVICES)
def test_optimizer_stepped_several_times_in_one_training_step(device):
    ref, run = Critic(simulate=True), Critic(simulate=False)
    fit(ref, device=device)
    trainer = fit(run, scaled_plugin(ManualMixedPrecision, device), device=device)
    assert run.applied == ref.applied and ref.applied.count(False) == 1
    for i, (got, expected) in enumerate(zip(run.updates, ref.updates)):
        assert float((got - expected).norm()) <= 3e-2 * float(expected.norm()) + 1e-6, f"critic step {i}"
    # rule 3 applies the update between two critic steps (GradScaler's contract), rule 1 after the generator's
    # step: 12 training_steps x 4 steps (3 critic, 1 generator); never more updates than steps (stock: 48)
    # and at least one per training_step (rule 4); measured: 37
    assert 12 <= trainer.precision_plugin.scaler.updates <= 48
