"""
Several optimizer steps in one ``training_step`` (PPO) under mixed precision
============================================================================

PPO, k critic steps per generator step and truncated backpropagation take many optimizer steps inside one
``training_step``. Lightning counts each of them: ``trainer.global_step``, ``max_steps`` and per-step
schedulers see every ``opt.step()``, not every batch. Each optimizer's clipping must see unscaled gradients,
and under 16-mixed that means inside ``on_before_optimizer_step``, once per step.

**Run it yourself**: put this example (``.py`` or ``.ipynb``, links at the bottom) and the library
`mpguide-0.1.0-py3-none-any.whl <../_static/mpguide-0.1.0-py3-none-any.whl>`_ in one folder, install
PyTorch (CPU or CUDA build), then:

.. code-block:: shell

    pip install lightning==2.6.6 scikit-learn==1.9.1
    pip install matplotlib==3.11.2
    pip install mpguide-0.1.0-py3-none-any.whl
    python plot_19_several_steps_per_training_step.py

**What you will learn**: what ``global_step`` and ``max_steps`` count when one batch takes 8 steps; where
per-optimizer clipping goes under 16-mixed, and what clipping between ``manual_backward`` and ``opt.step()``
does there; how often the loss scale changes. **Prerequisites**: :doc:`plot_04_gradient_clipping`.
"""


# %%
# A PPO actor-critic
# ------------------
# Each batch of digits is a rollout: the actor (the policy) guesses a class, the reward is 1 for a right
# guess, the critic predicts it. Then 2 epochs over 2 minibatches, each one actor step and one critic step:
# 8 optimizer steps per ``training_step``. Each optimizer clips with its own limit.

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.precision import (
    MixedPrecision,
)
from torch.distributions import Categorical

from mpguide.data import digits_loader

# sphinx_gallery_start_ignore
from mpguide.verify.run import runner

runner.quiet_lightning()
runner.check_settings(
    "plot_19_several_steps_per_training_step"
)  # MPGUIDE_* settings, before anything trains
# sphinx_gallery_end_ignore

# PPO's update epochs over the rollout, and
# minibatches per epoch
EPOCHS, MINIBATCHES = 2, 2
MAX_NORM = {"actor": 0.05, "critic": 0.1}


class PPO(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.actor = torch.nn.Sequential(
            torch.nn.Linear(64, 32),
            torch.nn.Tanh(),
            torch.nn.Linear(32, 10),
        )
        self.critic = torch.nn.Sequential(
            torch.nn.Linear(64, 32),
            torch.nn.Tanh(),
            torch.nn.Linear(32, 1),
        )

    def training_step(self, batch, batch_idx):
        x, labels = batch
        with torch.no_grad():  # the rollout
            policy = Categorical(
                logits=self.actor(x).float()
            )
            actions = policy.sample()
            old_log_prob, reward = (
                policy.log_prob(actions),
                (actions == labels).float(),
            )
            advantage = reward - self.critic(
                x
            ).float().squeeze(-1)
        actor_opt, critic_opt = (
            self.optimizers()
        )
        for _ in range(EPOCHS):
            for idx in torch.randperm(
                len(x)
            ).chunk(MINIBATCHES):
                ratio = (
                    Categorical(
                        logits=self.actor(
                            x[idx]
                        ).float()
                    ).log_prob(actions[idx])
                    - old_log_prob[idx]
                ).exp()
                surrogate = torch.min(
                    ratio * advantage[idx],
                    ratio.clamp(0.8, 1.2)
                    * advantage[idx],
                )
                self.update(
                    actor_opt,
                    -surrogate.mean(),
                )
                value_loss = (
                    (
                        self.critic(x[idx])
                        .float()
                        .squeeze(-1)
                        - reward[idx]
                    )
                    .pow(2)
                    .mean()
                )
                self.update(
                    critic_opt, value_loss
                )
        return value_loss.detach()

    def update(self, opt, loss):
        opt.zero_grad()
        self.manual_backward(loss)
        # Lightning unscales, calls
        # on_before_optimizer_step, steps,
        # updates the loss scale
        opt.step()

    def on_before_optimizer_step(
        self, optimizer
    ):
        # inside opt.step(), after GradScaler
        # unscaled this optimizer's gradients
        actor_opt, _ = self.optimizers()
        name = (
            "actor"
            if optimizer
            is actor_opt.optimizer
            else "critic"
        )
        torch.nn.utils.clip_grad_norm_(
            getattr(self, name).parameters(),
            MAX_NORM[name],
        )

    def configure_optimizers(self):
        return torch.optim.Adam(
            self.actor.parameters(), 3e-3
        ), torch.optim.Adam(
            self.critic.parameters(), 3e-3
        )


# %%
# ``max_steps`` counts optimizer steps
# ------------------------------------
# The ``Trainer`` call to copy, under 16-mixed (on a CPU the plugin is passed explicitly: the flag alone
# becomes bf16-mixed there). ``max_steps=30`` looks like 30 batches; it is 30 ``opt.step()`` calls, and the
# fit loop checks it between ``training_step`` calls, so it stops after the fourth batch, at 32.

device = (
    "cuda"
    if torch.cuda.is_available()
    else "cpu"
)
pl.seed_everything(0)
model = PPO()
trainer = pl.Trainer(
    accelerator=device,
    devices=1,
    max_steps=30,
    plugins=[
        MixedPrecision("16-mixed", device)
    ],
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(
    model, digits_loader(batch_size=64)
)
progress = (
    trainer.fit_loop.epoch_loop.batch_progress
)
print(
    "max_steps=30: stopped after "
    f"{progress.total.completed} batches"
)
print(
    "trainer.global_step: "
    f"{trainer.global_step}"
)


# %%
# Size ``max_steps`` and step-interval schedulers in optimizer steps: batches x 8 here (a scheduler that
# ``configure_optimizers`` returns with ``"interval": "step"`` is stepped by your code in manual
# optimization; step it where you mean it, e.g. once per ``training_step``).
#
# The old advice: clip between ``manual_backward`` and ``opt.step()``
# --------------------------------------------------------------------
# Under 16-mixed the gradients after ``manual_backward`` are still multiplied by the loss scale, so the
# clip cuts them to ``MAX_NORM`` and GradScaler then divides them by the scale.


class ClipBeforeStep(PPO):
    def update(self, opt, loss):
        opt.zero_grad()
        self.manual_backward(loss)
        name = (
            "actor"
            if opt is self.optimizers()[0]
            else "critic"
        )
        # scaled gradients
        torch.nn.utils.clip_grad_norm_(
            getattr(self, name).parameters(),
            MAX_NORM[name],
        )
        opt.step()

    def on_before_optimizer_step(
        self, optimizer
    ):
        pass


# %%
# Evidence: the runs and their claims
# -----------------------------------
# The recipe in fp32, bf16-mixed and 16-mixed, the old advice under 16-mixed, and the recipe with
# ``max_steps=30``. A probe (a callback: the recipes carry no measuring code) reads the true gradient norm after
# each backward (divided by the loss scale), hooks each optimizer's ``step`` to read the norm it applied, and
# counts GradScaler's ``update`` calls.

from lightning.pytorch.callbacks import Callback

from mpguide.steps import loss_scale
from mpguide.verify.show import plotting, report


class StepProbe(Callback):
    measures = {
        "optimizer_steps_per_batch": "number",
        "actor_clip_factor": "list[number]",
        "critic_clip_factor": "list[number]",
        "actor_scaled_prediction": "list[number]",
        "critic_scaled_prediction": "list[number]",
        "scale_updates_per_optimizer_step": "number",
        "scale_updates": "count",
        "steps_skipped": "count",
    }

    def __init__(self):
        self.true_norm, self.updates, self.skipped, self.batch = {}, 0, 0, None
        self.factors = {"actor": [], "critic": [], "actor_pred": [], "critic_pred": []}

    def on_train_start(self, trainer, pl_module):
        self.trainer, self.module = trainer, pl_module
        for name, opt in zip(("actor", "critic"), trainer.optimizers):
            opt.register_step_post_hook(lambda o, args, kwargs, name=name: self.applied(name, o))
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            update = scaler.update

            def counted(*args, **kwargs):
                before = scaler.get_scale()
                update(*args, **kwargs)
                self.updates += 1
                self.skipped += scaler.get_scale() < before

            scaler.update = counted

    @staticmethod
    def norm(params):
        return float(torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))

    def on_after_backward(self, trainer, pl_module):  # right after manual_backward: scaled under 16-mixed
        scale = loss_scale(trainer) or 1.0
        for name in ("actor", "critic"):
            self.true_norm[name] = self.norm(getattr(pl_module, name).parameters()) / scale

    def applied(self, name, opt):  # after the real optimizer.step() (GradScaler did not skip it): what it applied
        true, limit, scale = self.true_norm[name], MAX_NORM[name], loss_scale(self.trainer) or 1.0
        if true > 0:  # what was applied, over what clipping the true gradient gives
            self.batch[name].append(self.norm(p for g in opt.param_groups for p in g["params"]) / min(true, limit))
            # the same for a clip of the gradient times the scale, then unscaled (the old advice under 16-mixed)
            self.batch[f"{name}_pred"].append(min(true * scale, limit) / scale / min(true, limit))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch = {key: [] for key in self.factors}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        for key, values in self.batch.items():  # per batch: the mean over the steps GradScaler applied
            self.factors[key].append(sum(values) / max(len(values), 1))

    def record_extra(self):
        batches, steps = len(self.factors["actor"]), self.trainer.global_step
        return {
            "optimizer_steps_per_batch": steps / batches if batches else 0.0,
            "actor_clip_factor": self.factors["actor"],
            "critic_clip_factor": self.factors["critic"],
            "actor_scaled_prediction": self.factors["actor_pred"],
            "critic_scaled_prediction": self.factors["critic_pred"],
            "scale_updates": self.updates,
            "scale_updates_per_optimizer_step": self.updates / steps if steps else 0.0,
            "steps_skipped": self.skipped,
        }


recipes = {"PPO": PPO, "clip before step": ClipBeforeStep}
probes = {name: [StepProbe] for name in recipes}
RUNS = [
    # run id          recipe               precision     options
    ("ppo-fp32", "PPO", "32-true", {"label": "PPO, fp32", "trainer": {"limit_train_batches": 3}}),
    ("ppo-bf16", "PPO", "bf16-mixed", {"label": "PPO, bf16-mixed", "trainer": {"limit_train_batches": 3}}),
    ("ppo-fp16", "PPO", "16-mixed", {"label": "PPO, 16-mixed", "trainer": {"limit_train_batches": 3}}),
    (
        "old-clip-fp16",
        "clip before step",
        "16-mixed",
        {"label": "clip before opt.step(), 16-mixed", "trainer": {"limit_train_batches": 3}},
    ),
    ("max-steps-fp32", "PPO", "32-true", {"label": "PPO, fp32, max_steps=30", "trainer": {"max_steps": 30}}),
]
CLAIMS = [
    (
        "expect",
        "ppo-fp32",
        "optimizer_steps_per_batch",
        8.0,
        "fp32: global_step counts all 8 optimizer steps of each batch",
    ),
    (
        "expect",
        "ppo-bf16",
        "optimizer_steps_per_batch",
        8.0,
        "bf16-mixed: global_step counts all 8 steps of each batch",
    ),
    (
        "expect",
        "ppo-fp16",
        "optimizer_steps_per_batch",
        8.0,
        "16-mixed: global_step counts all 8 steps of each batch",
    ),
    ("expect", "max-steps-fp32", "global_step", 32, "max_steps=30 stops after the fourth batch, at global_step 32"),
    ("expect", "max-steps-fp32", "batches", 4, "max_steps=30: four batches trained"),
    (
        "ratio",
        "ppo-fp16",
        "ppo-fp32",
        "actor_clip_factor",
        1.0,
        "clipped-norm",
        "16-mixed: the actor's clip acts as in fp32",
    ),
    (
        "ratio",
        "ppo-fp16",
        "ppo-fp32",
        "critic_clip_factor",
        1.0,
        "clipped-norm",
        "16-mixed: the critic's clip acts as in fp32",
    ),
    (
        "ratio",
        "ppo-bf16",
        "ppo-fp32",
        "actor_clip_factor",
        1.0,
        "clipped-norm",
        "bf16-mixed: the actor's clip acts as in fp32",
    ),
    (
        "ratio",
        "old-clip-fp16",
        "ppo-fp32",
        "actor_clip_factor",
        "actor_scaled_prediction",
        "clipped-norm",
        "old advice, 16-mixed: the actor's clip cuts the scaled gradient",
    ),
    (
        "ratio",
        "old-clip-fp16",
        "ppo-fp32",
        "critic_clip_factor",
        "critic_scaled_prediction",
        "clipped-norm",
        "old advice, 16-mixed: the critic's clip cuts the scaled gradient",
    ),
    (
        "expect",
        "ppo-fp16",
        "scale_updates_per_optimizer_step",
        1.0,
        "16-mixed: GradScaler.update runs once per optimizer step",
    ),
]

record = runner.run_example("plot_19_several_steps_per_training_step", recipes, RUNS, CLAIMS, probes=probes)


# %%
# What each clip did
# ------------------
# Per batch, the gradient norm each optimizer applied over what clipping its true gradient gives (the norm,
# or the limit if the norm is larger): 1 means the clip did what fp32 does. Inside
# ``on_before_optimizer_step`` that holds in every precision. Before ``opt.step()`` under 16-mixed the clip
# cut the scaled gradient, which is always above the limit, so each step applied the limit divided by the
# loss scale, thousands of times less than asked.

import matplotlib.pyplot as plt

fig, axes = plotting.figure(
    1, 2, 12, 4.0, sharey=True
)
plotting.describe(
    fig,
    "Clipped inside "
    "on_before_optimizer_step, each "
    "optimizer's clip acts as in fp32 in "
    "every precision; "
    "clipped before opt.step() under "
    "16-mixed, it applies the limit divided "
    "by the loss scale",
)
for ax, name in zip(
    axes, ("actor", "critic")
):
    for run_id in (
        "ppo-fp32",
        "ppo-bf16",
        "ppo-fp16",
        "old-clip-fp16",
    ):
        run = plotting.run_by_id(
            record, run_id
        )
        ax.plot(
            run["extra"][
                f"{name}_clip_factor"
            ],
            marker=".",
            label=run["label"],
        )
    ax.set(
        yscale="log",
        xlabel="batch (8 optimizer steps each)",
        title=f"{name}, limit {MAX_NORM[name]}",
    )
    ax.grid(alpha=0.3)
axes[0].set_ylabel(
    "applied norm / fp32's clip of the true "
    "gradient"
)
axes[1].legend(
    fontsize=plotting.LEGEND_SIZE,
    frameon=False,
)
plotting.save_figure(
    fig, record["example"], "clipped_norms"
)
plt.show()


# %%
# Steps and loss-scale updates
# ----------------------------

for run_id in (
    "ppo-fp32",
    "ppo-bf16",
    "ppo-fp16",
    "old-clip-fp16",
    "max-steps-fp32",
):
    extra = plotting.run_by_id(
        record, run_id
    )["extra"]
    print(
        f"{run_id:15s} batches "
        f"{extra['batches']:4d}, global_step "
        f"{extra['global_step']:5d}, "
        "GradScaler.update calls "
        f"{extra['scale_updates']:5d} "
        "(skipped steps "
        f"{extra['steps_skipped']})"
    )


# %%
# Conclusion
# ----------
# With several steps per ``training_step``, count in optimizer steps: ``global_step``, ``max_steps`` and
# per-step schedules see each ``opt.step()`` (skipped ones too, :doc:`plot_05_skipped_steps`), and
# Lightning updates the loss scale after each. Clip per optimizer inside ``on_before_optimizer_step``,
# which Lightning calls within every ``opt.step()`` after unscaling that optimizer's gradients. Under
# 16-mixed a clip between ``manual_backward`` and ``opt.step()`` cuts the scaled gradients.


# %%
# Evidence: the verdicts
# ----------------------

report.verdicts(record)
