"""Correct manual training steps, written after public code: PitfallChecks must report nothing on any of them.

Each runs under the condition that made the check of 5a6abb2 misfire (the ``condition`` of its :class:`Case`):
no ``batch_idx``, the epoch's last step skipped (``16-mixed-huge``: init scale 2**40, every step overflows),
the default init scale (65536), a closure, per-task backwards inside one batch.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call
from torch.utils.data import DataLoader, TensorDataset

from mpguide import steps
from mpguide.precision import ManualMixedPrecision

from . import CachingMixedPrecision, Case, rows

LIGHTNING = "Lightning-AI/pytorch-lightning@7f0c343"
DOCS = f"{LIGHTNING} docs/source-pytorch/model/manual_optimization.rst"


def mlp(i: int = 8, h: int = 16, o: int = 1) -> nn.Module:
    return nn.Sequential(nn.Linear(i, h), nn.Tanh(), nn.Linear(h, o))


class Base(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = mlp()

    def loss(self, batch) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x).float(), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


# ------------------------------------------------------------------ Lightning's GAN example, as posted
class LightningGan(pl.LightningModule):
    """``training_step(self, batch)`` without ``batch_idx``; toggle, zero_grad, manual_backward, step for G then D."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2), nn.Linear(16, 8), nn.Tanh())
        self.discriminator = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def training_step(self, batch):
        imgs, _ = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(imgs.shape[0], 4).type_as(imgs)
        valid, fake = torch.ones(imgs.size(0), 1), torch.zeros(imgs.size(0), 1)
        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z)).float(), valid)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        real_loss = F.binary_cross_entropy_with_logits(self.discriminator(imgs).float(), valid)
        fake_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z).detach()).float(), fake)
        opt_d.zero_grad()
        self.manual_backward((real_loss + fake_loss) / 2)
        opt_d.step()
        self.untoggle_optimizer(opt_d)

    def configure_optimizers(self):
        betas = (0.5, 0.999)
        return (
            torch.optim.Adam(self.generator.parameters(), 2e-4, betas=betas),
            torch.optim.Adam(self.discriminator.parameters(), 2e-4, betas=betas),
        )


# ------------------------------------------------------------------ the manual-optimization docs
class DocsMinimal(Base):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        opt.step()


class DocsAccumulation(Base):
    N = 2

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        self.manual_backward(self.loss(batch) / self.N)
        if (batch_idx + 1) % self.N == 0:
            opt.step()
            opt.zero_grad()


class DocsSimpleGan(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.G = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 8))
        self.D = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        g_opt, d_opt = self.optimizers()
        x, _ = batch
        ones, zeros = torch.ones(len(x), 1), torch.zeros(len(x), 1)
        g_x = self.G(torch.randn(len(x), 4))
        err_d = F.binary_cross_entropy_with_logits(self.D(x).float(), ones) + F.binary_cross_entropy_with_logits(
            self.D(g_x.detach()).float(), zeros
        )
        d_opt.zero_grad()
        self.manual_backward(err_d)
        d_opt.step()
        err_g = F.binary_cross_entropy_with_logits(self.D(g_x).float(), ones)
        g_opt.zero_grad()
        self.manual_backward(err_g)
        g_opt.step()

    def configure_optimizers(self):
        return torch.optim.Adam(self.G.parameters(), 1e-5), torch.optim.Adam(self.D.parameters(), 1e-5)


class DocsFrequencies(DocsSimpleGan):
    """The discriminator steps every other batch; its backward and its step under the same condition."""

    def training_step(self, batch, batch_idx):
        g_opt, d_opt = self.optimizers()
        x, _ = batch
        ones, zeros = torch.ones(len(x), 1), torch.zeros(len(x), 1)
        g_x = self.G(torch.randn(len(x), 4))
        if (batch_idx + 1) % 2 == 0:
            err_d = F.binary_cross_entropy_with_logits(self.D(x), ones) + F.binary_cross_entropy_with_logits(
                self.D(g_x.detach()), zeros
            )
            d_opt.zero_grad()
            self.manual_backward(err_d)
            d_opt.step()
        g_opt.zero_grad()
        self.manual_backward(F.binary_cross_entropy_with_logits(self.D(g_x), ones))
        g_opt.step()


class SchedulerPerStepSkipAware(Base):
    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=1e-3)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.1)]

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        steps.step_skip_aware(opt, self.trainer, self.lr_schedulers())


class SchedulerEveryNEpochs(SchedulerPerStepSkipAware):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        opt.step()
        if self.trainer.is_last_batch and (self.trainer.current_epoch + 1) % 1 == 0:
            self.lr_schedulers().step()


class DocsPlateau(Base):
    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=1e-3)
        return [opt], [torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.1, patience=10)]

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.loss(batch)
        self.manual_backward(loss)
        opt.step()
        self.log("loss", loss)

    def on_train_epoch_end(self):
        self.lr_schedulers().step(self.trainer.callback_metrics["loss"])


class DocsLbfgs(Base):
    def configure_optimizers(self):
        return torch.optim.LBFGS(self.parameters(), lr=0.1, max_iter=4)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()

        def closure():
            loss = self.loss(batch)
            opt.zero_grad()
            self.manual_backward(loss)
            return loss

        opt.step(closure=closure)


class PluginClipGradients(Base):
    """``self.clip_gradients`` before ``opt.step()`` with ManualMixedPrecision, which unscales first (2.6)."""

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
        opt.step()


# ------------------------------------------------------------------ SAM, closure form
class Sam(torch.optim.Optimizer):
    """Sharpness-aware minimization, written after davda54/sam sam.py: a step to ``w + rho * g / |g|``, the
    gradient there, then the base optimizer's step from ``w``."""

    def __init__(self, params, base, rho: float = 0.05, **kwargs) -> None:
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        grads = [p.grad.norm(2) for g in self.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.stack(grads).norm(2)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.state[p]["e_w"] = e_w = p.grad * (group["rho"] / (norm + 1e-12))
                    p.add_(e_w)
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if "e_w" in self.state[p]:
                    p.sub_(self.state[p]["e_w"])
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is not None, "SAM needs a closure"
        self.first_step(zero_grad=True)
        torch.enable_grad()(closure)()
        self.second_step()


class SamClosure(Base):
    def configure_optimizers(self):
        return Sam(self.parameters(), torch.optim.SGD, lr=0.05)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.loss(batch)
        self.manual_backward(loss)

        def closure():
            again = self.loss(batch)
            self.manual_backward(again)
            return again

        opt.step(closure=closure)
        opt.zero_grad()


# ------------------------------------------------------------------ gradient surgery (PCGrad)
class TwoTasks(pl.LightningModule):
    """A shared trunk and two regression heads, one SGD optimizer: the shape of the gradient-surgery cases."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.trunk = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(16, 1), nn.Linear(16, 1)])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class PcGrad(TwoTasks):
    """Per task: zero_grad, manual_backward(retain_graph), read the trunk's gradients; then project, write them
    into ``p.grad`` and step (after abdelrahmanashat/Pytorch-PCGrad-GradVac-AMP-GradAccum-StableMemory
    pcgrad_amp.py@7d50f48)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        h = self.trunk(x)
        losses = [F.mse_loss(head(h).float(), y * (i + 1)) for i, head in enumerate(self.heads)]
        params = list(self.parameters())
        grads = []
        for i, loss in enumerate(losses):
            opt.zero_grad()
            self.manual_backward(loss, retain_graph=i < len(losses) - 1)
            grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params])
        flat = [torch.cat([g.flatten() for g in gs]) for gs in grads]
        dot = torch.dot(flat[0], flat[1])
        if dot < 0:  # project task 0's gradient off task 1's
            grads[0] = [g0 - dot / flat[1].pow(2).sum() * g1 for g0, g1 in zip(grads[0], grads[1])]
        opt.zero_grad()
        for p, g0, g1 in zip(params, grads[0], grads[1]):
            p.grad = g0 + g1
        opt.step()


# ------------------------------------------------------------------ second-order MAML
class Maml(Base):
    """One inner step with ``create_graph=True`` on the support half, the meta-loss on the query half (after
    Lightning's examples/fabric/meta_learning/train_fabric.py@7f0c343, learn2learn's MAML, first_order=False)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        opt.zero_grad()
        params = dict(self.net.named_parameters())
        inner = F.mse_loss(functional_call(self.net, params, (x[:4],)).float(), y[:4])
        grads = torch.autograd.grad(inner, list(params.values()), create_graph=True)
        fast = {k: v - 0.5 * g for (k, v), g in zip(params.items(), grads)}
        self.manual_backward(F.mse_loss(functional_call(self.net, fast, (x[4:],)).float(), y[4:]))
        opt.step()


# ------------------------------------------------------------------ WGAN-GP, n_critic = 5
class WganGp(pl.LightningModule):
    """The critic steps every batch, the generator every fifth (Lightning #3665); the penalty's input gradient
    loss-scaled with mpguide.steps.scaled_input_grad (PyTorch's AMP recipe)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
        self.D = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def configure_optimizers(self):
        return torch.optim.Adam(self.D.parameters(), 1e-4, betas=(0.5, 0.9)), torch.optim.Adam(
            self.G.parameters(), 1e-4, betas=(0.5, 0.9)
        )

    def training_step(self, batch, batch_idx):
        real, _ = batch
        opt_d, opt_g = self.optimizers()
        fake = self.G(torch.randn(len(real), 4))
        eps = torch.rand(len(real), 1)
        mixed = (eps * real + (1 - eps) * fake.detach()).requires_grad_(True)
        (grad,) = steps.scaled_input_grad(self.D(mixed), mixed, self.trainer)
        penalty = (grad.norm(2, dim=1) - 1).pow(2).mean()
        loss_d = self.D(fake.detach()).float().mean() - self.D(real).float().mean() + 10 * penalty
        opt_d.zero_grad()
        self.manual_backward(loss_d)
        opt_d.step()
        if (batch_idx + 1) % 5 == 0:
            opt_g.zero_grad()
            self.manual_backward(-self.D(fake).float().mean())
            opt_g.step()


# ------------------------------------------------------------------ TBPTT
class Tbptt(pl.LightningModule):
    """Truncated backpropagation through time: the sequence in chunks, the hidden state detached, one step per
    chunk (Lightning 2.x docs/source-pytorch/common/tbptt.rst)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.rnn = nn.GRU(2, 8, batch_first=True)
        self.out = nn.Linear(8, 1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), 1e-3)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        seq = x.view(len(x), 4, 2)
        opt = self.optimizers()
        hidden = None
        for t in range(0, 4, 2):
            chunk = seq[:, t : t + 2]
            out, hidden = self.rnn(chunk, hidden)
            loss = F.mse_loss(self.out(out).float(), chunk[..., :1].float())
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            hidden = hidden.detach()


# ------------------------------------------------------------------ diffusion: accumulation + EMA
class DiffusionEmaAccumulation(Base):
    """A denoiser trained on noised rows, accumulating 2 batches (stepping at the epoch's last batch too), with an
    EMA copy outside the optimizer updated after each applied window (after huggingface/diffusers
    examples/unconditional_image_generation/train_unconditional.py: accumulation + EMAModel)."""

    N = 2

    def __init__(self) -> None:
        super().__init__()
        self.ema = mlp()
        self.ema.load_state_dict(self.net.state_dict())
        self.ema.requires_grad_(False)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        opt = self.optimizers()
        t = torch.rand(len(x), 1)
        noise = torch.randn_like(x)
        noisy = (1 - t).sqrt() * x + t.sqrt() * noise
        self.manual_backward(F.mse_loss(self.net(noisy).float(), noise[:, :1]) / self.N)
        if (batch_idx + 1) % self.N == 0 or self.trainer.is_last_batch:
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                for e, p in zip(self.ema.parameters(), self.net.parameters()):
                    e.mul_(0.99).add_(p, alpha=0.01)


# ------------------------------------------------------------------ momentum encoder
class MomentumEncoder(pl.LightningModule):
    """A query encoder trained with InfoNCE against a key encoder that follows it by momentum, outside the
    optimizer (after facebookresearch/moco moco/builder.py, _momentum_update_key_encoder)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.q = mlp(8, 16, 8)
        self.k = mlp(8, 16, 8)
        self.k.load_state_dict(self.q.state_dict())
        self.k.requires_grad_(False)

    def configure_optimizers(self):
        return torch.optim.SGD(self.q.parameters(), lr=0.05, momentum=0.9)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        opt = self.optimizers()
        q = F.normalize(self.q(x + 0.1 * torch.randn_like(x)).float(), dim=1)
        with torch.no_grad():
            for pk, pq in zip(self.k.parameters(), self.q.parameters()):
                pk.mul_(0.99).add_(pq.detach(), alpha=0.01)
            k = F.normalize(self.k(x + 0.1 * torch.randn_like(x)).float(), dim=1)
        logits = q @ k.t() / 0.2
        opt.zero_grad()
        self.manual_backward(F.cross_entropy(logits, torch.arange(len(x))))
        opt.step()


# ------------------------------------------------------------------ several dataloaders
class TwoLoaders(Base):
    """Two training dataloaders (a list): Lightning passes a list of two batches (CombinedLoader)."""

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch[0]) + self.loss(batch[1]))
        opt.step()


def two_loaders():
    return [rows(seed=0), rows(seed=1)]


class DataloaderIterStep(Base):
    """``training_step(self, dataloader_iter)`` (Lightning loops/fetchers.py's _DataLoaderIterDataFetcher)."""

    def training_step(self, dataloader_iter):
        batch, _, _ = next(dataloader_iter)
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        opt.step()


# ------------------------------------------------------------------ PPO, the loop moved into training_step
class PpoInStep(pl.LightningModule):
    """Lightning's PPO example with its optimizer loop where manual optimization runs it: each batch of
    trajectories updates actor and critic for 4 epochs of 2 minibatches (examples/pytorch/domain_templates/
    reinforce_learn_ppo.py@7f0c343; sidhantls/ppo_lightning#2). ``training_step(self, batch)``."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.actor = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        self.critic = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def configure_optimizers(self):
        return torch.optim.Adam(self.actor.parameters(), 3e-4), torch.optim.Adam(self.critic.parameters(), 1e-3)

    def training_step(self, batch):
        obs, ret = batch
        opt_a, opt_c = self.optimizers()
        with torch.no_grad():
            old_logp = torch.log_softmax(self.actor(obs).float(), -1)[:, 0]
            adv = ret[:, 0] - self.critic(obs).float()[:, 0]
        for _ in range(4):
            for idx in (slice(0, 4), slice(4, 8)):
                logp = torch.log_softmax(self.actor(obs[idx]).float(), -1)[:, 0]
                ratio = (logp - old_logp[idx]).exp()
                clipped = torch.clamp(ratio, 0.8, 1.2) * adv[idx]
                loss_a = -torch.min(ratio * adv[idx], clipped).mean()
                opt_a.zero_grad()
                self.manual_backward(loss_a)
                opt_a.step()
                loss_c = (ret[idx, 0] - self.critic(obs[idx]).float()[:, 0]).pow(2).mean()
                opt_c.zero_grad()
                self.manual_backward(loss_c)
                opt_c.step()


# ------------------------------------------------------------------ VITS: epoch schedulers at is_last_batch
class VitsEpochSchedulers(DocsSimpleGan):
    """Two optimizers, two ExponentialLR stepped once an epoch at ``is_last_batch`` (voicepaw/so-vits-svc-fork
    src/so_vits_svc_fork/train.py@6232876)."""

    def configure_optimizers(self):
        g = torch.optim.AdamW(self.G.parameters(), 2e-4)
        d = torch.optim.AdamW(self.D.parameters(), 2e-4)
        return [g, d], [
            torch.optim.lr_scheduler.ExponentialLR(g, 0.999),
            torch.optim.lr_scheduler.ExponentialLR(d, 0.999),
        ]

    def training_step(self, batch, batch_idx):
        super().training_step(batch, batch_idx)
        if self.trainer.is_last_batch:
            for scheduler in self.lr_schedulers():
                scheduler.step()


class CycleGanThree(pl.LightningModule):
    """Two generators under one optimizer and two discriminators with one each: three optimizers per iteration
    (junyanz/pytorch-CycleGAN-and-pix2pix models/cycle_gan_model.py@032e884, optimize_parameters; #177)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.g_ab, self.g_ba = mlp(8, 16, 8), mlp(8, 16, 8)
        self.d_a, self.d_b = mlp(8, 16, 1), mlp(8, 16, 1)

    def configure_optimizers(self):
        gens = list(self.g_ab.parameters()) + list(self.g_ba.parameters())
        return (
            torch.optim.Adam(gens, 2e-4),
            torch.optim.Adam(self.d_a.parameters(), 2e-4),
            torch.optim.Adam(self.d_b.parameters(), 2e-4),
        )

    def training_step(self, batch, batch_idx):
        a, _ = batch
        b = a.flip(1)
        opt_g, opt_da, opt_db = self.optimizers()
        fake_b, fake_a = self.g_ab(a), self.g_ba(b)
        loss_g = (
            (self.d_b(fake_b).float() - 1).pow(2).mean()
            + (self.d_a(fake_a).float() - 1).pow(2).mean()
            + 10 * (self.g_ba(fake_b) - a).abs().mean()
            + 10 * (self.g_ab(fake_a) - b).abs().mean()
        )
        opt_g.zero_grad()
        self.manual_backward(loss_g)
        opt_g.step()
        for opt, d, real, fake in ((opt_da, self.d_a, a, fake_a), (opt_db, self.d_b, b, fake_b)):
            loss_d = 0.5 * ((d(real).float() - 1).pow(2).mean() + d(fake.detach()).float().pow(2).mean())
            opt.zero_grad()
            self.manual_backward(loss_d)
            opt.step()


def gan_rows():
    g = torch.Generator().manual_seed(1)
    return DataLoader(TensorDataset(torch.rand(40, 8, generator=g) * 2 - 1, torch.zeros(40)), batch_size=8)


def ppo_rows():
    g = torch.Generator().manual_seed(2)
    return DataLoader(TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)), batch_size=8)


def sequence_rows():
    return rows(width=8)


class GanFakeOnceCaching(LightningGan):
    """G's samples made once, before G's step: after it only the discriminator forwards, and its weights have
    not stepped yet, so even a caching autocast region casts current weights (no stale cast)."""

    def training_step(self, batch):
        imgs, _ = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(imgs.shape[0], 4).type_as(imgs)
        valid, fake = torch.ones(imgs.size(0), 1), torch.zeros(imgs.size(0), 1)
        samples = self.generator(z)
        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(samples).float(), valid)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        real_loss = F.binary_cross_entropy_with_logits(self.discriminator(imgs).float(), valid)
        fake_loss = F.binary_cross_entropy_with_logits(self.discriminator(samples.detach()).float(), fake)
        opt_d.zero_grad()
        self.manual_backward((real_loss + fake_loss) / 2)
        opt_d.step()
        self.untoggle_optimizer(opt_d)


class TwoForwardsNoCacheRegion(Base):
    """Two updates in one training_step, each forward inside ``torch.autocast(..., cache_enabled=False)``: the fix
    of example 08 that holds on every release, also where Lightning's own region caches casts."""

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        for _ in range(2):
            with torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=False):
                loss = self.loss(batch)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()


CASES = [
    Case("lightning-gan-no-batch-idx-fp32", LightningGan,
         f"{LIGHTNING} examples/pytorch/domain_templates/generative_adversarial_net.py",
         "training_step(self, batch): 5a6abb2's wrapper made Lightning pass batch_idx (TypeError)", data=gan_rows),
    Case("lightning-gan-no-batch-idx-16", LightningGan,
         f"{LIGHTNING} examples/pytorch/domain_templates/generative_adversarial_net.py",
         "no batch_idx, 16-mixed with the default init scale", "16-mixed", data=gan_rows),
    Case("gan-fake-once-caching-bf16", GanFakeOnceCaching,
         f"{LIGHTNING} examples/pytorch/domain_templates/generative_adversarial_net.py (samples made once)",
         "forwards through the discriminator after the generator's step, in Lightning <= 2.5.4's caching region",
         "bf16-mixed", data=gan_rows, plugin=lambda: CachingMixedPrecision("bf16-mixed", "cpu")),
    Case("no-cache-region-in-caching-lightning-bf16", TwoForwardsNoCacheRegion,
         f"{LIGHTNING} src/lightning/pytorch/plugins/precision/amp.py (<= 2.5.4: cache on); examples/plot_08",
         "forwards after opt.step() inside autocast(cache_enabled=False) in Lightning's caching region "
         "(flagged before this rule read the cache flag at the forward)", "bf16-mixed",
         plugin=lambda: CachingMixedPrecision("bf16-mixed", "cpu")),
    Case("docs-minimal-16", DocsMinimal, DOCS, "default init scale: the first steps are skipped", "16-mixed"),
    Case("docs-accumulation-16", DocsAccumulation, DOCS, "N=2 over 4 batches, default init scale", "16-mixed"),
    Case("docs-simple-gan-bf16", DocsSimpleGan, DOCS, "two optimizers, G's loss fills D's gradients", "bf16-mixed"),
    Case("docs-frequencies", DocsFrequencies, DOCS, "D steps every other batch", "32-true"),
    Case("docs-scheduler-skip-aware-16", SchedulerPerStepSkipAware, DOCS,
         "per-step StepLR through step_skip_aware, every step skipped", "16-mixed-huge"),
    Case("docs-scheduler-every-n-epochs-16", SchedulerEveryNEpochs, DOCS,
         "epoch StepLR at is_last_batch whose step was skipped (5a6abb2: schedulers)", "16-mixed-huge", epochs=2),
    Case("docs-plateau-16", DocsPlateau, DOCS,
         "ReduceLROnPlateau in on_train_epoch_end after a skipped last step (5a6abb2: schedulers)", "16-mixed-huge",
         epochs=2),
    Case("docs-lbfgs-bf16", DocsLbfgs, f"{DOCS} (Use Closure for LBFGS-like Optimizers); PINA-org/PINA#100",
         "the closure's forward runs inside the step under autocast (5a6abb2: optimizer-math)", "bf16-mixed"),
    Case("docs-lbfgs-fp32", DocsLbfgs, f"{DOCS} (Use Closure for LBFGS-like Optimizers)", "closure, fp32"),
    Case("plugin-clip-gradients-16", PluginClipGradients, DOCS,
         "self.clip_gradients before opt.step() with ManualMixedPrecision", "16-mixed",
         plugin=lambda: ManualMixedPrecision("16-mixed", "cpu")),
    Case("sam-closure-fp32", SamClosure, "davda54/sam sam.py + README (closure form); round-5 case 01 C",
         "first_step(zero_grad=True) inside the step (5a6abb2: accumulation)", "32-true"),
    Case("sam-closure-bf16", SamClosure, "davda54/sam sam.py + README (closure form); round-5 case 01 C",
         "the closure's forward under autocast (5a6abb2: accumulation, optimizer-math)", "bf16-mixed"),
    Case("pcgrad-fp32", PcGrad,
         "abdelrahmanashat/Pytorch-PCGrad-GradVac-AMP-GradAccum-StableMemory pcgrad_amp.py@7d50f48; round-5 case 08 A",
         "per-task zero_grad + manual_backward in one batch (5a6abb2: accumulation even in fp32)", "32-true"),
    Case("pcgrad-16", PcGrad,
         "abdelrahmanashat/Pytorch-PCGrad-GradVac-AMP-GradAccum-StableMemory pcgrad_amp.py@7d50f48",
         "per-task backwards under 16-mixed, default init scale", "16-mixed"),
    Case("maml-second-order-16", Maml, f"{LIGHTNING} examples/fabric/meta_learning/train_fabric.py; round-5 case 06",
         "autograd.grad(create_graph=True) of an unscaled inner loss (5a6abb2: gradient-penalty)", "16-mixed"),
    Case("wgan-gp-ncritic-16", WganGp, "Lightning-AI/pytorch-lightning#3665; the guide's gradient-penalty fix",
         "n_critic=5, penalty through scaled_input_grad", "16-mixed", data=gan_rows, batches=5),
    Case("tbptt-16", Tbptt, "Lightning docs/source-pytorch/common/tbptt.rst (2.x)",
         "several steps per training_step, default init scale", "16-mixed", data=sequence_rows),
    Case("diffusion-ema-accumulation-16", DiffusionEmaAccumulation,
         "huggingface/diffusers examples/unconditional_image_generation/train_unconditional.py",
         "accumulation over an odd epoch (3 batches) stepped at is_last_batch, EMA outside the optimizer, 2 epochs",
         "16-mixed", epochs=2, batches=3),
    Case("momentum-encoder-bf16", MomentumEncoder, "facebookresearch/moco moco/builder.py",
         "key encoder updated in place outside the optimizer", "bf16-mixed"),
    Case("two-dataloaders", TwoLoaders, "Lightning docs/source-pytorch/data/iterables.rst (multiple dataloaders)",
         "a list of batches from two training dataloaders", "32-true", data=two_loaders),
    Case("dataloader-iter", DataloaderIterStep, f"{LIGHTNING} src/lightning/pytorch/loops/fetchers.py (docstring)",
         "training_step(self, dataloader_iter): a wrapper without __wrapped__ hides it", "32-true"),
    Case("ppo-loop-in-training-step-16", PpoInStep,
         f"{LIGHTNING} examples/pytorch/domain_templates/reinforce_learn_ppo.py; sidhantls/ppo_lightning#2",
         "training_step(self, batch), 16 steps per batch, default init scale", "16-mixed", data=ppo_rows),
    Case("vits-epoch-schedulers-16", VitsEpochSchedulers,
         "voicepaw/so-vits-svc-fork src/so_vits_svc_fork/train.py@6232876; round-5 case 07",
         "two epoch schedulers at is_last_batch, the last step skipped (5a6abb2: schedulers)", "16-mixed-huge",
         data=gan_rows),
    Case("cyclegan-three-optimizers-plugin-16", CycleGanThree,
         "junyanz/pytorch-CycleGAN-and-pix2pix models/cycle_gan_model.py@032e884; round-5 case 11",
         "three optimizers per iteration with ManualMixedPrecision", "16-mixed",
         plugin=lambda: ManualMixedPrecision("16-mixed", "cpu")),
]  # fmt: skip
