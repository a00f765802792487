"""PitfallChecks on modules written in shapes unlike the examples': the right sections, and none on correct code.

Each module is small (a few linear layers, 4-6 batches on CPU). 16-mixed runs pass
``plugins=[MixedPrecision("16-mixed", "cpu")]``: ``Trainer(precision="16-mixed")`` becomes bf16-mixed on a CPU.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils.data import DataLoader, Dataset, TensorDataset

from mpguide import steps
from mpguide.checks import SECTIONS, PitfallChecks, PitfallError, PitfallWarning
from mpguide.precision import ManualMixedPrecision

PRECISIONS = ["32-true", "bf16-mixed", "16-mixed"]


def loader(n: int = 48, batch: int = 8, width: int = 12) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, width, generator=g)
    y = (x[:, 0] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch)


class DictData(Dataset):
    """Batches as dicts (``{"features", "target"}``), as many data pipelines give them."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(40, 12, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"features": self.x[i], "target": self.x[i, :3].sum(0, keepdim=True)}


def fit(module, precision="32-true", plugin=None, data=None, checks=None, batches=6, **trainer_kwargs):
    """Fit ``module`` for a few batches with a PitfallChecks; returns ``(checks, error or None)``."""
    checks = checks or PitfallChecks()
    if plugin == "manual":
        plugins = [ManualMixedPrecision(precision, "cpu")]
    elif plugin is not None:
        plugins = [plugin]
    elif precision == "16-mixed":
        plugins = [MixedPrecision("16-mixed", "cpu")]
    else:
        plugins = []
    args = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_train_batches=batches,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checks],
    )
    if not plugins:
        args["precision"] = precision
    args.update(trainer_kwargs)
    error = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            pl.Trainer(plugins=plugins, **args).fit(module, data or loader())
        except Exception as err:  # noqa: BLE001 - some of these runs are meant to fail after the finding
            error = err
    return checks, error


def sections(checks: PitfallChecks) -> set[str]:
    return {f.section for f in checks.findings}


class Manual(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    def loss(self, batch):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


# ------------------------------------------------------------------ correct code: no finding anywhere
class PlainStep(Manual):
    """The faithful port: zero_grad, forward, manual_backward, step; a scheduler stepped only after real updates."""

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=2)]

    def training_step(self, batch, batch_idx):
        opt, sch = self.optimizers(), self.lr_schedulers()
        opt.zero_grad()
        loss = self.loss(batch)
        self.manual_backward(loss)
        steps.step_skip_aware(opt, self.trainer, sch)
        return loss.detach()


class HookClipping(Manual):
    """Clipping where the guide puts it: in on_before_optimizer_step, after unscaling."""

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        opt.step()

    def on_before_optimizer_step(self, optimizer):
        torch.nn.utils.clip_grad_norm_(self.parameters(), 0.5)


class WindowOfThree(Manual):
    """Correct accumulation: loss / 3, step and zero_grad only at the end of each window."""

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        self.manual_backward(self.loss(batch) / 3)
        if (batch_idx + 1) % 3 == 0:
            opt.step()
            opt.zero_grad()


class Gan(pl.LightningModule):
    """A GAN without toggling: the generator's loss fills the discriminator's gradients, by design."""

    def __init__(self, detach_both: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.g = torch.nn.Linear(4, 12)
        self.d = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.detach_both = detach_both

    def configure_optimizers(self):
        return torch.optim.Adam(self.d.parameters(), 1e-3), torch.optim.Adam(self.g.parameters(), 1e-3)

    def training_step(self, batch, batch_idx):
        real, _ = batch
        opt_d, opt_g = self.optimizers()
        fake = self.g(torch.randn(len(real), 4))
        if self.detach_both:
            fake = fake.detach()
        d_loss = F.softplus(-self.d(real)).mean() + F.softplus(self.d(fake.detach())).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = F.softplus(-self.d(fake)).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("module", [PlainStep, HookClipping, WindowOfThree, Gan], ids=lambda m: m.__name__)
def test_correct_modules_get_no_finding(module, precision):
    checks, error = fit(module(), precision)
    assert error is None
    assert checks.findings == [], [f.message for f in checks.findings]


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "32-true"])
def test_correct_modules_get_no_finding_with_the_plugin(precision):
    for module in (PlainStep, HookClipping, Gan):
        checks, error = fit(module(), precision, plugin="manual")
        assert error is None
        assert checks.findings == [], (module.__name__, [f.message for f in checks.findings])


def test_automatic_optimization_is_left_alone():
    class Auto(Manual):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = True

        def training_step(self, batch, batch_idx):
            return self.loss(batch)

    checks, error = fit(Auto(), "16-mixed")
    assert error is None and checks.findings == []


# ------------------------------------------------------------------ buggy code: the right sections
class DetachedGenerator(Gan):
    def __init__(self):
        super().__init__(detach_both=True)


def test_no_gradient_step_is_found_before_gradscalers_assertion():
    checks, error = fit(DetachedGenerator(), "16-mixed")
    assert isinstance(error, AssertionError) and "No inf checks" in str(error)
    assert [f.section for f in checks.findings] == ["no-gradient-step"]
    finding = checks.findings[0]
    assert finding.optimizer == 1 and finding.batch == 0
    assert "optimizer 1 (Adam)" in finding.message and "reached only d" in finding.message
    strict = PitfallChecks(strict=True)
    _, error = fit(DetachedGenerator(), "16-mixed", checks=strict)
    assert isinstance(error, PitfallError) and error.section == "no-gradient-step"


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_no_gradient_step_is_found_where_it_is_silent(precision):
    checks, error = fit(DetachedGenerator(), precision)
    assert error is None and sections(checks) == {"no-gradient-step"}
    assert checks.findings[0].count == 6  # once per batch, warned once


class GuardedDetachedGenerator(DetachedGenerator):
    """Lightning #20116's guard on a generator whose loss never reaches it: no crash, no training."""

    def training_step(self, batch, batch_idx):
        real, _ = batch
        opt_d, opt_g = self.optimizers()
        fake = self.g(torch.randn(len(real), 4)).detach()
        d_loss = F.softplus(-self.d(real)).mean() + F.softplus(self.d(fake)).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        opt_g.zero_grad()
        self.manual_backward(F.softplus(-self.d(fake)).mean())
        if any(p.grad is not None for p in self.g.parameters()):  # the guard: never true here
            opt_g.step()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_an_optimizer_a_guard_never_lets_step_is_found(precision):
    checks, error = fit(GuardedDetachedGenerator(), precision)
    # the generator's loss also fills the discriminator's gradients, and no step uses them: "accumulation"
    assert error is None and "no-gradient-step" in sections(checks)
    (finding,) = [f for f in checks.findings if f.section == "no-gradient-step"]
    assert finding.optimizer == 1 and "never stepped in 6 batch(es)" in finding.message
    assert "p.grad is None" in finding.message  # the way to find the parameters the loss misses


class ClipValueBeforeStep(Manual):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        torch.nn.utils.clip_grad_value_(self.net.parameters(), 0.01)
        opt.step()


class LightningClipBeforeStep(ClipValueBeforeStep):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
        opt.step()


@pytest.mark.parametrize("module", [ClipValueBeforeStep, LightningClipBeforeStep], ids=lambda m: m.__name__)
def test_clipping_scaled_gradients_is_found_only_under_16_mixed(module):
    checks, _ = fit(module(), "16-mixed")
    assert sections(checks) == {"clipping"}
    assert "loss scale 65536" in checks.findings[0].message
    for precision in ("32-true", "bf16-mixed"):
        assert fit(module(), precision)[0].findings == []


def test_self_clip_gradients_is_right_with_the_plugin_and_a_direct_clip_is_not():
    assert fit(LightningClipBeforeStep(), "16-mixed", plugin="manual")[0].findings == []
    assert sections(fit(ClipValueBeforeStep(), "16-mixed", plugin="manual")[0]) == {"clipping"}


def test_clipping_a_fused_optimizer_in_the_hook_is_found():
    class Fused(HookClipping):
        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3, fused=True)

    checks, _ = fit(Fused(), "16-mixed")
    assert sections(checks) == {"clipping"} and "fused" in checks.findings[0].message


class LossBackwardOnDicts(pl.LightningModule):
    """A regression on dict batches that calls loss.backward()."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.body = torch.nn.Linear(12, 1)

    def configure_optimizers(self):
        return torch.optim.RMSprop(self.parameters(), lr=1e-3)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = F.mse_loss(self.body(batch["features"]), batch["target"])
        loss.backward()
        opt.step()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_loss_backward_is_found_in_every_precision(precision):
    checks, _ = fit(LossBackwardOnDicts(), precision, data=DataLoader(DictData(), batch_size=8))
    assert sections(checks) == {"backward-flags"}
    strict = PitfallChecks(strict=True)
    _, error = fit(LossBackwardOnDicts(), precision, data=DataLoader(DictData(), batch_size=8), checks=strict)
    assert isinstance(error, PitfallError) and error.section == "backward-flags"


class StepsInBatchEndHook(Manual):
    def training_step(self, batch, batch_idx):
        self.optimizers().zero_grad()
        self.manual_backward(self.loss(batch))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.optimizers().step()


def test_a_step_in_a_hook_is_found():
    checks, error = fit(StepsInBatchEndHook(), "32-true")
    assert error is None and sections(checks) == {"step-frequencies"}


class AutomaticHabits(Manual):
    """Ported from automatic optimization, keeping its hooks and a per-step scheduler dict."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.9**step)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sch, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, 1.0, "norm")

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        optimizer.zero_grad()

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        opt.step()


def test_porting_finds_hooks_and_the_unstepped_scheduler():
    checks, error = fit(AutomaticHabits(), "bf16-mixed")
    assert error is None and sections(checks) == {"porting"}
    text = " ".join(f.message for f in checks.findings)
    assert "configure_gradient_clipping" in text and "optimizer_zero_grad" in text and "never stepped" in text


class ZeroAtEveryMicroBatch(Manual):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()  # the mistake: the window keeps only its last micro-batch
        self.manual_backward(self.loss(batch) / 3)
        if (batch_idx + 1) % 3 == 0:
            opt.step()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_zeroing_inside_a_window_is_found(precision):
    checks, error = fit(ZeroAtEveryMicroBatch(), precision)
    assert error is None and sections(checks) == {"accumulation"}


class GuardOnGradients(Manual):
    """Skips the step when any gradient is not finite (an fp32 habit)."""

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        if all(torch.isfinite(p.grad).all() for p in self.parameters()):
            opt.step()


def huge_scale_plugin():
    # a loss scale fp16 overflows at for sure (the tiny model's gradients never reach 65504 / 65536)
    return MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=2.0**40))


def test_a_guard_that_skips_the_step_under_16_mixed_is_found():
    checks, error = fit(GuardOnGradients(), "16-mixed", plugin=huge_scale_plugin())
    assert error is None and sections(checks) == {"nonfinite-guard"}
    assert fit(GuardOnGradients(), "32-true")[0].findings == []


class SchedulerEveryBatch(Manual):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.ExponentialLR(opt, 0.5)]

    def training_step(self, batch, batch_idx):
        opt, sch = self.optimizers(), self.lr_schedulers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        opt.step()
        sch.step()


def test_a_scheduler_stepped_on_a_skipped_step_is_found():
    checks, error = fit(SchedulerEveryBatch(), "16-mixed", plugin=huge_scale_plugin())
    assert error is None and sections(checks) == {"schedulers"}
    assert "from 0.1 to 0.05" in checks.findings[0].message
    assert fit(SchedulerEveryBatch(), "32-true")[0].findings == []


class SharedBackwardTwoOptimizers(Manual):
    """One backward feeds two optimizers (body and head), stepped one after the other."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.net[0].parameters(), 0.05), torch.optim.SGD(self.net[2].parameters(), 0.05)

    def training_step(self, batch, batch_idx):
        body, head = self.optimizers()
        body.zero_grad()
        head.zero_grad()
        self.manual_backward(self.loss(batch))
        body.step()
        head.step()


def test_steps_that_straddle_a_scale_update_are_found_with_stock_only():
    scaler = torch.amp.GradScaler("cpu", growth_interval=1)  # the scale changes at every update
    checks, error = fit(SharedBackwardTwoOptimizers(), "16-mixed", plugin=MixedPrecision("16-mixed", "cpu", scaler))
    assert error is None and sections(checks) == {"scale-changes"}
    assert checks.findings[0].optimizer == 1
    plugin = ManualMixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", growth_interval=1))
    assert fit(SharedBackwardTwoOptimizers(), "16-mixed", plugin=plugin)[0].findings == []


def test_a_skipped_step_on_gradients_of_an_older_scale_is_no_finding():
    """Every step overflows: the body's skip halves the scale before the head unscales gradients made at the old
    one, but GradScaler skips the head's step too, so no update is off (a reader's trial: "this update is 2x" of a
    step that made none)."""
    checks, error = fit(SharedBackwardTwoOptimizers(), "16-mixed", plugin=huge_scale_plugin())
    assert error is None and "scale-changes" not in sections(checks)


def test_trainable_half_parameters_under_mixed_precision_are_found():
    class HalfHead(Manual):
        def __init__(self):
            super().__init__()
            self.net[2].to(torch.bfloat16)

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(self.loss(batch))
            opt.step()

    checks, _ = fit(HalfHead(), "bf16-mixed")
    assert "fp16-parameters" in sections(checks)


def test_a_penalty_on_the_unscaled_output_is_found_and_the_scaled_one_is_not():
    """Found when the measured underflow is real (an output of about 1e-6, as a mean critic score times a small
    weight); the same penalty on an output whose input gradient fp16 holds is a note with the measured shares."""

    class Penalty(Manual):
        scaled = False
        tiny = 1e-6

        def training_step(self, batch, batch_idx):
            x, y = batch
            x = x.clone().requires_grad_(True)
            opt = self.optimizers()
            opt.zero_grad()
            out = self.net(x).sum() * self.tiny
            scaler = self.trainer.precision_plugin.scaler
            if self.scaled:
                (g,) = torch.autograd.grad(scaler.scale(out), x, create_graph=True)
                g = g / scaler.get_scale()
            else:
                (g,) = torch.autograd.grad(out, x, create_graph=True)
            self.manual_backward(F.cross_entropy(self.net(x), y) + g.pow(2).mean())
            opt.step()

    checks = fit(Penalty(), "16-mixed")[0]
    assert sections(checks) == {"gradient-penalty"}
    assert re.search(r"\d+ \((\d+\.\d)%\) are 0 as computed and non-zero", checks.findings[0].message)
    Penalty.tiny = 1.0  # gradients of about 0.1: fp16 holds them, nothing underflows
    checks = fit(Penalty(), "16-mixed")[0]
    assert checks.findings == [] and any(n.startswith("[gradient-penalty] note") for n in checks.notes)
    Penalty.scaled, Penalty.tiny = True, 1e-6
    assert fit(Penalty(), "16-mixed")[0].findings == []


def test_everything_is_restored_after_a_fit_that_raised():
    originals = (
        torch.Tensor.backward,
        torch.autograd.backward,
        torch.autograd.grad,
        torch.nn.utils.clip_grad_norm_,
        torch.nn.utils.clip_grad_value_,
        torch.autocast.__enter__,
        torch.autocast.__exit__,
    )
    module = DetachedGenerator()
    _, error = fit(module, "16-mixed")
    assert isinstance(error, AssertionError)
    now = (
        torch.Tensor.backward,
        torch.autograd.backward,
        torch.autograd.grad,
        torch.nn.utils.clip_grad_norm_,
        torch.nn.utils.clip_grad_value_,
        torch.autocast.__enter__,
        torch.autocast.__exit__,
    )
    assert now == originals
    assert "training_step" not in vars(module) and "zero_grad" not in vars(module)
    assert all(not p._backward_hooks for p in module.parameters())


def test_findings_warn_once_and_name_a_known_section_with_a_link():
    checks = PitfallChecks()
    with pytest.warns(PitfallWarning) as caught:
        module = DetachedGenerator()
        pl.Trainer(
            accelerator="cpu",
            max_epochs=1,
            limit_train_batches=4,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[checks],
        ).fit(module, loader())
    ours = [w for w in caught if issubclass(w.category, PitfallWarning)]
    assert len(ours) == 1 and checks.findings[0].count == 4
    assert all(f.section in SECTIONS and f"#{f.section}" in f.message for f in checks.findings)


class AutomaticTeacher(pl.LightningModule):
    """An automatic-optimization parent that updates an EMA teacher in optimizer_step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.student = torch.nn.Linear(12, 2)
        self.teacher = torch.nn.Linear(12, 2).requires_grad_(False)

    def configure_optimizers(self):
        return torch.optim.SGD(self.student.parameters(), lr=0.1)

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)
        self.follow()

    @torch.no_grad()
    def follow(self):
        for t, s in zip(self.teacher.parameters(), self.student.parameters(), strict=True):
            t.lerp_(s, 0.1)


class PortedTeacher(AutomaticTeacher):
    follows = True

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(F.cross_entropy(self.student(x), y))
        opt.step()
        if self.follows:
            self.follow()


def test_an_inherited_hook_is_a_finding_only_when_its_work_never_happens():
    checks, error = fit(PortedTeacher(), "bf16-mixed")
    assert error is None and checks.findings == []
    assert any("inherits optimizer_step() from AutomaticTeacher" in n for n in checks.notes)
    PortedTeacher.follows = False
    try:
        checks, error = fit(PortedTeacher(), "bf16-mixed")
    finally:
        PortedTeacher.follows = True
    assert error is None and sections(checks) == {"porting"}
    assert "teacher.weight" in checks.findings[0].message


class PowerIteration(torch.optim.Optimizer):
    """SGD on a direction found by matrix products of the gradient (a stand-in for Shampoo or Muon)."""

    def __init__(self, params, lr=0.05):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad if p.grad.dim() == 2 else p.grad.unsqueeze(0)
                direction = (g @ g.mT @ g) / (g.norm() ** 2 + 1e-12)
                p.add_(direction.reshape(p.shape), alpha=-group["lr"])


def test_matrix_math_in_a_step_under_autocast_is_found_with_stock_only():
    class Stepper(PlainStep):
        def configure_optimizers(self):
            return PowerIteration(self.parameters())

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(self.loss(batch))
            opt.step()

    checks, error = fit(Stepper(), "bf16-mixed")
    assert error is None and sections(checks) == {"optimizer-math"}
    assert "matmul on torch.float32" in checks.findings[0].message
    assert fit(Stepper(), "bf16-mixed", plugin="manual")[0].findings == []
    assert fit(Stepper(), "32-true")[0].findings == []


def test_a_caching_autocast_around_a_forward_after_the_step_is_found_and_a_redundant_one_is_a_note():
    class OwnAutocast(Manual):
        cache = True

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            # inside Lightning 2.6's region (cache off) a default autocast inherits the cache setting: off
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=self.cache or None):
                opt.zero_grad()
                loss = self.loss(batch)
                self.manual_backward(loss)
                opt.step()
                self.log("after_step", self.loss(batch).float())  # a forward after the step

    checks, error = fit(OwnAutocast(), "bf16-mixed")
    assert error is None and sections(checks) == {"autocast-cache"}
    OwnAutocast.cache = False
    checks, error = fit(OwnAutocast(), "bf16-mixed")
    assert error is None and checks.findings == []
    assert len(checks.notes) == 1 and "redundant (not a finding)" in checks.notes[0]


def test_an_adam_eps_that_float16_rounds_to_zero_is_found_under_16_true():
    class HalfAdam(PlainStep):
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3, eps=1e-8)

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(self.loss((batch[0].half(), batch[1])))
            opt.step()

    checks, _ = fit(HalfAdam(), "16-true", batches=2)
    assert "fp16-parameters" in sections(checks)
    assert "eps=1e-08, which is 0 in float16" in " ".join(f.message for f in checks.findings)


def test_a_backward_through_another_model_is_not_a_finding():
    class InnerLoop(PlainStep):
        """Fits a throwaway probe with its own backward, then trains the module as the guide says."""

        def training_step(self, batch, batch_idx):
            x, y = batch
            probe = torch.nn.Linear(12, 2)
            F.cross_entropy(probe(x), y).backward()  # not the trainer's parameters
            return super().training_step(batch, batch_idx)

    checks, error = fit(InnerLoop(), "16-mixed")
    assert error is None and checks.findings == []


def test_torchs_scheduler_warning_survives_the_check():
    checks = PitfallChecks()
    with pytest.warns(UserWarning, match="Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`"):
        pl.Trainer(
            accelerator="cpu",
            max_epochs=1,
            limit_train_batches=3,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            plugins=[huge_scale_plugin()],
            callbacks=[checks],
        ).fit(SchedulerEveryBatch(), loader())
    assert sections(checks) == {"schedulers"}


def test_a_second_instance_in_the_same_fit_is_refused_in_one_line():
    _, error = fit(PlainStep(), "32-true", callbacks=[PitfallChecks(), PitfallChecks()])
    assert isinstance(error, PitfallError) and "only one PitfallChecks" in str(error)
    assert fit(PlainStep(), "32-true")[0].findings == []  # and the next fit is watched again


# ------------------------------------------------------------------ round 5: what a reader's trial found
class NormClipBeforeStep(Manual):
    """clip_grad_norm_ on the scaled gradients, as many GAN ports write it."""

    limit = 0.5

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.loss(batch))
        self.norm = float(torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.limit))
        opt.step()


def test_an_overflowing_first_step_is_reported_not_raised():
    # the scaled norm of the first step is inf: the check used int(inf) and killed the fit (OverflowError)
    checks, error = fit(NormClipBeforeStep(), "16-mixed", plugin=huge_scale_plugin())
    assert error is None, repr(error)
    assert sections(checks) == {"clipping"}
    message = checks.findings[0].message  # fp16's backward overflows: inf, or nan where inf - inf met
    assert re.search(r"total norm of (inf|nan) to 0\.5", message) and "GradScaler skips this step" in message


def test_the_clipping_finding_says_how_much_smaller_this_update_is():
    module = NormClipBeforeStep()
    module.limit = 5.0  # above the true norm (about 0.5), far below the scaled one
    checks, error = fit(module, "16-mixed", batches=1)
    assert error is None and sections(checks) == {"clipping"}
    seen, scale, limit = module.norm, 65536.0, module.limit
    expected = min(seen / scale, limit) / (limit / scale)  # clipped while scaled vs clipped after unscaling
    assert seen > limit and 1 < expected < scale
    words = checks.findings[0].message.split("so this update is about ")[1]
    assert abs(float(words.split(" ")[0]) / expected - 1) < 0.01, (words, expected)


def test_a_finding_names_its_section_heading_for_a_terminal_reader():
    from mpguide._sections import SECTION_TITLES

    checks, _ = fit(ClipValueBeforeStep(), "16-mixed")
    assert 'section "Gradient clipping" (model/manual_optimization.html#clipping)' in checks.findings[0].message
    guide = (Path(__file__).parents[1] / "docs" / "model" / "manual_optimization.md").read_text()
    assert set(SECTION_TITLES) == set(SECTIONS)
    for anchor, title in SECTION_TITLES.items():
        assert re.search(f"^\\({re.escape(anchor)}\\)=\n#+ {re.escape(title)}$", guide, re.M), (anchor, title)


def test_strict_takes_a_bool_and_a_reused_instance_reports_each_fit_on_its_own():
    with pytest.raises(TypeError, match="strict=...\\) takes True or False, not 'no'"):
        PitfallChecks(strict="no")
    checks = PitfallChecks()
    fit(ClipValueBeforeStep(), "16-mixed", checks=checks)
    fit(ClipValueBeforeStep(), "16-mixed", checks=checks)
    assert len(checks.findings) == 1, [f.message for f in checks.findings]
