"""Fabric at the edges round 5 found (issue 35 item 5), in real Fabric runs (CPU fp16 autocast + CPU GradScaler),
stock and with ``FabricManualMixedPrecision``; each fact the plugin's docstring or the guide states, and each
shown to fail on the code the evidence found wrong.

* ``fabric.clip_gradients`` raises at the first fp16 overflow (its ``error_if_nonfinite=True`` default); with
  ``error_if_nonfinite=False`` the step is skipped and training goes on (round-5 case 05);
* a method of a set-up module other than ``forward`` runs without autocast; ``fabric.autocast()`` fixes it (05);
* an optimizer Fabric never set up steps on the scaled gradients: its SGD update is the loss scale times fp32's (06);
* the guide's library-free loop runs when an optimizer gets no gradient, and equals the plugin bitwise otherwise.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from lightning.fabric.plugins.precision import MixedPrecision
from test_guide_page import _guide_snippet

from mpguide.fabric import FabricManualMixedPrecision

PLUGINS = {
    "stock": lambda scale=65536.0: MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=scale)),
    "plugin": lambda scale=65536.0: FabricManualMixedPrecision(
        "16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=scale)
    ),
}


class Agent(torch.nn.Module):
    """An actor-critic (PPO-shaped): its loss is computed by ``training_step``, a method other than forward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.actor = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
        self.critic = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))

    def forward(self, obs):
        logits = self.actor(obs)
        self.logits_dtype = logits.dtype  # as computed (Fabric casts forward's outputs back to float32)
        return logits, self.critic(obs)

    def training_step(self, obs, actions, returns):
        logits, values = self(obs)
        return F.cross_entropy(logits.float(), actions) + F.mse_loss(values.float().squeeze(-1), returns)


def _batches(n=6):
    gen = torch.Generator().manual_seed(4)
    obs = [torch.randn(16, 8, generator=gen) * 30 for _ in range(n)]
    return [(o, torch.randint(0, 4, (16,), generator=gen), torch.randn(16, generator=gen)) for o in obs]


def _ppo(plugin, error_if_nonfinite: bool | None = None, method: str = "forward", autocast: bool = False):
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[plugin])
    agent = Agent()
    agent, opt = fabric.setup(agent, torch.optim.SGD(agent.parameters(), lr=1e-3))
    skipped = 0
    for obs, actions, returns in _batches():
        opt.zero_grad()
        if method == "forward":
            logits, values = agent(obs)
            loss = F.cross_entropy(logits.float(), actions) + F.mse_loss(values.float().squeeze(-1), returns)
        elif autocast:
            with fabric.autocast():
                loss = agent.training_step(obs, actions, returns)
        else:
            loss = agent.training_step(obs, actions, returns)
        fabric.backward(loss * 1e3)  # large enough that the first fp16 steps overflow at 65536
        if error_if_nonfinite is not None:
            fabric.clip_gradients(agent, opt, max_norm=0.5, error_if_nonfinite=error_if_nonfinite)
        scale = plugin.scaler.get_scale()
        opt.step()
        if isinstance(plugin, FabricManualMixedPrecision):
            skipped += plugin.step_was_skipped(opt)
        else:
            skipped += plugin.scaler.get_scale() < scale
    weights = torch.cat([p.detach().flatten() for p in agent.parameters()])
    return skipped, weights, agent.logits_dtype


@pytest.mark.parametrize("name", list(PLUGINS))
def test_fabric_clip_gradients_raises_at_the_first_overflow_unless_told_not_to(name):
    with pytest.raises(RuntimeError, match="non-finite"):
        _ppo(PLUGINS[name](), error_if_nonfinite=True)
    skipped, weights, _ = _ppo(PLUGINS[name](), error_if_nonfinite=False)
    assert skipped >= 1 and bool(weights.isfinite().all())


@pytest.mark.parametrize("name", list(PLUGINS))
def test_a_method_other_than_forward_runs_without_autocast_unless_in_fabric_autocast(name):
    assert _ppo(PLUGINS[name](), method="training_step")[2] == torch.float32
    assert _ppo(PLUGINS[name](), method="training_step", autocast=True)[2] == torch.float16
    assert _ppo(PLUGINS[name]())[2] == torch.float16  # through forward


@pytest.mark.parametrize("name", list(PLUGINS))
def test_an_optimizer_fabric_did_not_set_up_steps_on_scaled_gradients(name):
    def update(plugin) -> float:
        fabric = Fabric(accelerator="cpu", devices=1, plugins=plugin)
        torch.manual_seed(0)
        net = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)  # never passed to fabric.setup
        before = net.weight.detach().clone()
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
        fabric.backward(net(x).float().pow(2).mean())
        opt.step()
        return float((net.weight.detach() - before).norm())

    ratio = update(PLUGINS[name](1024.0)) / update([])
    assert ratio == pytest.approx(1024.0, rel=1e-2)


# ----------------------------------------------------------------------------- the guide's library-free loop


class Head(torch.nn.Module):
    def __init__(self, used: bool):
        super().__init__()
        self.fc = torch.nn.Linear(16, 3)
        self.used = used

    def forward(self, x):
        return self.fc(x) if self.used else x[:, :3]


def _library_free(code: str, head_used: bool, **names):
    torch.manual_seed(0)
    body, head = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU()), Head(head_used)
    gen = torch.Generator().manual_seed(5)
    data = torch.utils.data.TensorDataset(torch.randn(64, 6, generator=gen), torch.randint(0, 3, (64,), generator=gen))
    namespace = {
        "Fabric": Fabric,
        "torch": torch,
        "F": F,
        "body": body,
        "head": head,
        "opt_body": torch.optim.SGD(body.parameters(), lr=0.1),
        "opt_head": torch.optim.SGD(head.parameters(), lr=0.1),
        "loader": torch.utils.data.DataLoader(data, batch_size=8),
        **names,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, "fabric_no_library snippet", "exec"), namespace)
    return torch.cat([p.detach().flatten() for p in (*body.parameters(), *head.parameters())])


def _with_the_plugin(head_used: bool = True):
    torch.manual_seed(0)
    body, head = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU()), Head(head_used)
    gen = torch.Generator().manual_seed(5)
    data = torch.utils.data.TensorDataset(torch.randn(64, 6, generator=gen), torch.randint(0, 3, (64,), generator=gen))
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[FabricManualMixedPrecision("16-mixed", "cpu")])
    body, opt_body = fabric.setup(body, torch.optim.SGD(body.parameters(), lr=0.1))
    head, opt_head = fabric.setup(head, torch.optim.SGD(head.parameters(), lr=0.1))
    for images, labels in fabric.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=8)):
        opt_body.zero_grad()
        opt_head.zero_grad()
        fabric.backward(F.cross_entropy(head(body(images)), labels))
        opt_body.step()
        opt_head.step()
    return torch.cat([p.detach().flatten() for p in (*body.parameters(), *head.parameters())])


OLD_LOOP_BODY = """    scaler.step(opt_body)
    scaler.step(opt_head)
"""


def test_the_library_free_loop_equals_the_plugin_and_survives_an_optimizer_without_gradients():
    code = _guide_snippet("fabric_no_library").code
    assert torch.equal(_library_free(code, head_used=True), _with_the_plugin())
    before = _with_the_plugin(head_used=False)  # the plugin: the empty step is a warned no-op
    assert torch.equal(_library_free(code, head_used=False), before)
    # the round-5 loop: steps every optimizer; GradScaler raises on the one without gradients
    start = code.index("    for opt in opts:\n        ps = [")
    end = code.index("    # once per iteration")
    old = code[:start] + OLD_LOOP_BODY + code[end:]
    assert torch.equal(_library_free(old, head_used=True), _with_the_plugin())
    with pytest.raises(AssertionError, match="No inf checks were recorded for this optimizer"):
        _library_free(old, head_used=False)
    # and its accelerator=device named a variable the snippet never defined
    with pytest.raises(NameError, match="device"):
        _library_free(code.replace('accelerator="auto"', "accelerator=device"), head_used=True)
