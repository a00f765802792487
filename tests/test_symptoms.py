"""The "Find your symptom" lines of issue 35 item 7 and the several-steps section (item 2), each measured in real
Trainer fits on CPU (16-mixed: Lightning's ``MixedPrecision`` with a CPU GradScaler), each with the control that
shows the rule, on modules of their own shapes (round-5 cases 01, 02, 03, 04 and 08 reproduced small):

* the raw optimizer's step (SAM's ``first_step``/``second_step``, ``opt.optimizer.step()``) bypasses the loss
  scaling: under 16-mixed the update is the loss scale times fp32's; ``global_step`` stays 0 in every precision;
* ``retain_graph=True`` with a step between two backwards: fp32 raises, bf16-mixed silently backpropagates
  through the pre-step weights;
* ``torch.autograd.grad`` results written into ``p.grad``: 1/scale of fp32's update under 16-mixed, fp32's with
  :func:`mpguide.steps.scaled_grads`;
* several optimizer steps per ``training_step`` (PPO): ``global_step`` counts every step, and Lightning's plugin
  updates the loss scale after every step.
"""

from __future__ import annotations

import copy

import lightning.pytorch as L
import pytest
import torch
from conftest import quiet_fit
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils.data import DataLoader, TensorDataset

from mpguide.steps import scaled_grads
from mpguide.verify.run.runner import quiet_lightning

quiet_lightning()
SCALE = 1024.0


def _fit(module, precision: str, batches: int = 1, **kwargs):
    plugins = (
        {"plugins": [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=SCALE))]}
        if precision == "16-mixed"
        else {"precision": precision}
    )
    return quiet_fit(module, samples=batches * 8, batch_size=8, **plugins, **kwargs)


class _Base(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.trunk = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16))
        self.head_a, self.head_b = torch.nn.Linear(16, 1), torch.nn.Linear(16, 1)

    def losses(self, batch):
        (x,) = batch
        h = torch.tanh(self.trunk(x))  # the second layer's weight is saved for the backward through it
        return (self.head_a(h).float() - 1).pow(2).mean(), (self.head_b(h).float() + 1).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def _update(module_cls, precision: str) -> tuple[float, int]:
    module = module_cls()
    before = module.trunk[0].weight.detach().clone()
    trainer = _fit(module, precision)
    return float((module.trunk[0].weight.detach() - before).norm()), trainer.global_step


class RawStep(_Base):
    """SAM's steps call the raw optimizer: like ``opt.optimizer.step()``."""

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(sum(self.losses(batch)))
        opt.optimizer.step()


class WrapperStep(RawStep):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(sum(self.losses(batch)))
        opt.step()


@pytest.mark.slow
def test_the_raw_optimizers_step_bypasses_the_loss_scale_and_global_step():
    fp32, fp32_steps = _update(RawStep, "32-true")
    assert fp32_steps == 0  # never counted, in fp32 too
    bf16, _ = _update(RawStep, "bf16-mixed")
    assert bf16 / fp32 == pytest.approx(1.0, rel=0.02)
    raw, raw_steps = _update(RawStep, "16-mixed")
    assert raw / fp32 == pytest.approx(SCALE, rel=0.02) and raw_steps == 0
    wrapped, steps = _update(WrapperStep, "16-mixed")  # the control: the wrapper unscales and counts
    assert wrapped / fp32 == pytest.approx(1.0, rel=0.02) and steps == 1


class StepBetween(_Base):
    """Two losses of one trunk; head a's optimizer (trunk included) steps between the two backwards."""

    def training_step(self, batch, batch_idx):
        opt_a, opt_b = self.optimizers()
        loss_a, loss_b = self.losses(batch)
        opt_a.zero_grad()
        self.manual_backward(loss_a, retain_graph=True)
        self.pre = {k: v.detach().clone() for k, v in self.trunk.state_dict().items()}
        opt_a.step()
        held = self.trunk[0].weight.grad.detach().clone()  # loss a's, kept: opt_a zeroes before its backward
        opt_b.zero_grad()
        self.manual_backward(loss_b)
        self.second = self.trunk[0].weight.grad.detach().float() - held

    def configure_optimizers(self):
        a = [*self.trunk.parameters(), *self.head_a.parameters()]
        return torch.optim.SGD(a, lr=0.5), torch.optim.SGD(self.head_b.parameters(), lr=0.5)


@pytest.mark.slow
def test_retain_graph_with_a_step_between_backwards_raises_in_fp32_and_is_silent_in_bf16():
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _fit(StepBetween(), "32-true")
    module = StepBetween()
    _fit(module, "bf16-mixed")  # no error
    (x,) = next(iter(DataLoader(TensorDataset(torch.randn(8, 6, generator=torch.Generator().manual_seed(0))), 8)))

    def trunk_grad(trunk_state):  # loss b's gradient for the first trunk layer, in fp32
        trunk = copy.deepcopy(module.trunk)
        trunk.load_state_dict(trunk_state)
        h = torch.tanh(trunk(x))
        (grad,) = torch.autograd.grad((module.head_b(h) + 1).pow(2).mean(), trunk[0].weight)
        return grad

    pre = trunk_grad(module.pre)
    post = trunk_grad(module.trunk.state_dict())
    err_pre = float((module.second - pre).norm() / pre.norm())
    err_post = float((module.second - post).norm() / post.norm())
    print(f"bf16-mixed second backward vs pre-step trunk {err_pre:.3g}, vs post-step {err_post:.3g}")
    assert err_pre < err_post / 5  # it used the weights from before the step


class Surgery(_Base):
    """Per-task gradients with autograd.grad, summed and written into p.grad (PCGrad without the projection)."""

    use_helper = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        params = list(self.parameters())
        total = [torch.zeros_like(p) for p in params]
        losses = self.losses(batch)
        for loss in losses:
            if self.use_helper:
                grads = scaled_grads(loss, params, self.trainer, retain_graph=True)
            else:
                grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            total = [t + (g if g is not None else 0) for t, g in zip(total, grads)]
        self.manual_backward(sum(losses))  # LibMTL's order: the usual backward, then p.grad replaced
        for p, g in zip(params, total):
            p.grad = g
        opt.step()


class SurgeryHelper(Surgery):
    use_helper = True


@pytest.mark.slow
def test_autograd_grad_into_p_grad_is_unscaled_by_the_step_unless_taken_at_the_loss_scale():
    fp32, _ = _update(Surgery, "32-true")
    naive, _ = _update(Surgery, "16-mixed")
    assert naive / fp32 == pytest.approx(1 / SCALE, rel=0.02)
    for precision in ("32-true", "bf16-mixed", "16-mixed"):
        fixed, _ = _update(SurgeryHelper, precision)
        assert fixed / fp32 == pytest.approx(1.0, rel=0.02), precision


class PPO(L.LightningModule):
    """An actor and a critic, 3 update epochs x 4 minibatches per training_step, each stepping its optimizer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.actor, self.critic = torch.nn.Linear(6, 3), torch.nn.Linear(6, 1)

    def training_step(self, batch, batch_idx):
        opt_actor, opt_critic = self.optimizers()
        (x,) = batch
        for _ in range(3):
            for mb in x.split(2):
                for opt, loss in ((opt_actor, self.actor(mb).float().logsumexp(-1).mean()),
                                  (opt_critic, self.critic(mb).float().pow(2).mean())):  # fmt: skip
                    opt.zero_grad()
                    self.manual_backward(loss)
                    opt.step()

    def configure_optimizers(self):
        return torch.optim.Adam(self.actor.parameters(), 1e-3), torch.optim.Adam(self.critic.parameters(), 1e-3)


@pytest.mark.slow
def test_several_steps_per_training_step_each_count_and_each_update_the_scale():
    module = PPO()
    updates = []
    original = torch.amp.GradScaler.update

    def counted(self, *args, **kwargs):
        updates.append(1)
        return original(self, *args, **kwargs)

    torch.amp.GradScaler.update = counted
    try:
        trainer = _fit(module, "16-mixed", batches=6)
    finally:
        torch.amp.GradScaler.update = original
    assert trainer.global_step == 6 * 3 * 4 * 2 == 144
    assert len(updates) == 144  # Lightning's plugin: one update per step
    assert _fit(PPO(), "32-true", batches=6).global_step == 144
    # max_steps counts the same steps and is checked between training_steps: 30 stops after the second (48)
    assert _fit(PPO(), "32-true", batches=6, max_steps=30).global_step == 48


def test_a_nested_autocast_without_cache_sees_the_stepped_weights_inside_a_caching_one():
    """The autocast-cache fix for Lightning <= 2.5.4 and master 7f0c343, whose own autocast caches (emulated by an
    outer caching autocast): dropping an own autocast leaves the outer cache, so the forward after the step sees the
    pre-step casts; that forward inside ``torch.autocast(..., cache_enabled=False)`` sees the new weights."""

    def after_step(nested: bool) -> torch.Tensor:
        torch.manual_seed(0)
        net = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(net.parameters(), lr=1.0)
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
        with torch.autocast("cpu", torch.bfloat16, cache_enabled=True):  # Lightning 2.5.4's region
            net(x).float().pow(2).mean().backward()
            opt.step()
            if nested:
                with torch.autocast("cpu", torch.bfloat16, cache_enabled=False):
                    return net(x).float()
            return net(x).float()

    # the reference: the same step with no cache anywhere
    torch.manual_seed(0)
    ref_net = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(ref_net.parameters(), lr=1.0)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", torch.bfloat16, cache_enabled=False):
        ref_net(x).float().pow(2).mean().backward()
        opt.step()
        expected = ref_net(x).float()
    assert torch.equal(after_step(nested=True), expected)
    assert not torch.equal(after_step(nested=False), expected)  # stale casts: the pre-step weights
