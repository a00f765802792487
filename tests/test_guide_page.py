"""The guide's visible code: every Python snippet compiles, and every snippet that is a
``training_step`` or a hook trains in a real ``Trainer`` here, or names the example that runs it.

Where each hook snippet of ``docs/model/manual_optimization.md`` runs (the ``% snippet: <key>``
comment above it names the key):

=================  ========================================================================
snippet            runs in
=================  ========================================================================
recipe             this file (its ``Model`` class, 16-mixed with a CPU GradScaler)
porting            this file (manual step + teacher update + per-epoch scheduler, bf16-mixed)
optimizer_math     this file (step outside autocast, 16-mixed)
accumulation       this file (16-mixed, window of 4); tests/test_windows.py: = automatic accumulation at an
                   epoch tail (18 batches, n = 4, 2 epochs: 10 steps) in 3 precisions, without ``__len__``,
                   under ``limit_train_batches``; the old ``% n`` snippet takes 8
clipping           this file (the hook, 16-mixed)
clipping_gan       this file (two optimizers; the hook clips the second only) (plot_04 prints the same trap and fix)
no_gradient_step   this file (#20116's step fixed: windows of 2 batches, accumulation,
                   toggle_model): the guard keeps a generator without gradients from crashing
                   16-mixed, and the same step without the guard raises "No inf checks"
schedulers         this file (step_skip_aware, 16-mixed)
ddp                this file (one process: ``toggle_model(sync_grad=...)`` is a no-op there); tests/test_windows.py
resuming           this file (16-mixed); tests/test_guide_edges.py: the scale grows after a resume
gradient_penalty   not a hook; tests/test_guide_edges.py runs it inside a WGAN-GP critic step in 3 precisions
fabric             not a hook; compiled only (plot_14 runs the same call)
fabric_no_library  not a hook; compiled only (plot_14's ``LibraryFree`` recipe runs the same loop and
                   ``test_the_fabric_loop_of_the_guide_is_plot_14s`` checks it is the same code)
=================  ========================================================================

The figures the guide reuses from the gallery are checked too: each ``{figure}`` names the
example's figure by number, and its ``:name:`` says which ``save_figure`` call drew it.
"""

from __future__ import annotations

import re
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT

GUIDE = ROOT / "docs" / "model" / "manual_optimization.md"
PAGES = [GUIDE, ROOT / "docs" / "releases.md"]
_FENCE = re.compile(
    r"^(?:% snippet: (?P<key>\S+)\n)?(?P<indent>[ ]*)```python\n(?P<code>.*?)^(?P=indent)```[ ]*$",
    re.MULTILINE | re.DOTALL,
)
_HOOK = re.compile(r"^\s*def (training_step|on_\w+|configure_\w+|optimizer_step|lr_scheduler_step)\(", re.MULTILINE)
#: Snippets that are no hook: where they run instead (documented, not executed here).
RUN_ELSEWHERE = {
    "gradient_penalty": "tests/test_guide_edges.py",
    "fabric": "examples/plot_14_fabric_manual_loop.py",
    "fabric_no_library": "examples/plot_14_fabric_manual_loop.py",
}


@dataclass
class Snippet:
    key: str
    code: str
    line: int
    path: Path

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


def snippets(path: Path, text: str | None = None) -> list[Snippet]:
    """The Python code blocks of a page (executed cells are ``{code-cell}``, not these)."""
    text = path.read_text() if text is None else text
    return [
        Snippet(m["key"] or "", textwrap.dedent(m["code"]), text[: m.start("code")].count("\n") + 1, path)
        for m in _FENCE.finditer(text)
    ]


def compile_errors(snips: list[Snippet]) -> list[str]:
    errors = []
    for s in snips:
        try:
            compile(s.code, s.where, "exec")
        except SyntaxError as err:
            errors.append(f"{s.where}: {err.msg} (line {err.lineno} of the snippet)")
    return errors


def unmapped_hooks(snips: list[Snippet]) -> list[str]:
    return [
        f"{s.where}: a training_step or hook snippet without a '% snippet: <key>' line that this test runs"
        for s in snips
        if _HOOK.search(s.code) and s.key not in RUNS
    ]


def test_every_snippet_of_the_guide_compiles():
    snips = [s for page in PAGES for s in snippets(page)]
    assert len([s for s in snips if s.path == GUIDE]) >= 10
    assert not compile_errors(snips)
    assert not unmapped_hooks([s for s in snips if s.path == GUIDE])
    keys = [s.key for s in snips if s.path == GUIDE and s.key]
    assert sorted(set(keys) - set(RUN_ELSEWHERE)) == sorted(RUNS), "a mapped snippet vanished from the guide"
    for key, example in RUN_ELSEWHERE.items():
        assert (ROOT / example).is_file(), f"{key}: {example} does not exist"


def test_the_checks_fail_on_a_broken_or_unmapped_snippet(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "x\n\n% snippet: recipe\n```python\ndef training_step(self, batch):\n    return (\n```\n\n"
        "```python\ndef on_before_optimizer_step(self, optimizer):\n    pass\n```\n"
    )
    snips = snippets(page)
    assert [s.key for s in snips] == ["recipe", ""]
    (err,) = compile_errors(snips)
    assert err.startswith(f"{page}:5: ")  # the page's line of the snippet
    (unmapped,) = unmapped_hooks(snips)
    assert ":10: a training_step or hook snippet without" in unmapped


# ----------------------------------------------------------------------------- running the hooks


def _trainer(precision: str):
    import lightning.pytorch as L
    from lightning.pytorch.plugins.precision import MixedPrecision

    kw = dict(plugins=[MixedPrecision("16-mixed", "cpu")]) if precision == "16-mixed" else dict(precision=precision)
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        limit_train_batches=8,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def _harness(optimizers: str = "one", reaches: bool | str = True):
    """A LightningModule providing what the snippets call: compute_loss, critic_loss, generator_loss,
    teacher, distill, update_teacher, and the optimizers (and scheduler) of ``optimizers``."""
    import lightning.pytorch as L
    import torch
    from torch.nn import functional as F

    class Harness(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.net, self.other, self.teacher = (torch.nn.Linear(64, 10) for _ in range(3))
            self.teacher.requires_grad_(False)
            self.unused = torch.nn.Parameter(torch.ones(()))  # in no optimizer

        def compute_loss(self, batch):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        critic_loss = compute_loss
        n_batches_per_optimizer = 2  # the #20116 snippet's window

        def inner_training_step(self, batch, batch_idx, compute_model_1_loss):  # model 1: opts[0] (other)
            return self.generator_loss(batch) if compute_model_1_loss else self.critic_loss(batch)

        def training_step(self, batch, batch_idx):  # the guide's recipe, for snippets that are a hook only
            opts = self.optimizers()
            if isinstance(opts, list):  # two optimizers: a GAN-like step of both, each on its own loss
                for opt, loss in zip(opts, (self.generator_loss(batch), self.compute_loss(batch))):
                    opt.zero_grad()
                    self.manual_backward(loss)
                    opt.step()
                return
            opts.zero_grad()
            self.manual_backward(self.compute_loss(batch))
            opts.step()

        def generator_loss(self, batch):
            x, y = batch
            if reaches is True:
                return F.cross_entropy(self.other(x), y)
            if reaches == "nothing":  # cut off from every trainable tensor: backward would raise
                return F.cross_entropy(self.other(x).detach(), y)
            return self.unused * F.cross_entropy(self.other(x).detach(), y)  # never reaches opt_g's weights

        def distill(self, x, target):
            return F.mse_loss(self.net(x).float(), target.float())

        def update_teacher(self):
            with torch.no_grad():
                for t, s in zip(self.teacher.parameters(), self.net.parameters()):
                    t.lerp_(s, 0.1)

        def configure_optimizers(self):
            sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.05)  # noqa: E731
            if optimizers == "two":
                return [sgd(self.other), sgd(self.net)]  # opt_g, opt_d
            if optimizers == "lbfgs":
                return torch.optim.LBFGS(self.net.parameters(), lr=0.1, max_iter=2)
            opt = sgd(self.net)
            if optimizers == "sched":
                return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.9)}
            return opt

    return Harness


#: snippet key -> (precision, optimizers of the harness)
RUNS = {
    "recipe": ("16-mixed", None),
    "porting": ("bf16-mixed", "sched"),
    "optimizer_math": ("16-mixed", "one"),
    "accumulation": ("16-mixed", "one"),
    "clipping": ("16-mixed", "one"),
    "clipping_gan": ("16-mixed", "two"),
    "no_gradient_step": ("16-mixed", "two"),
    "schedulers": ("16-mixed", "sched"),
    "ddp": ("16-mixed", "one"),
    "resuming": ("16-mixed", "one"),
}


def _guide_snippet(key: str) -> Snippet:
    found = [s for s in snippets(GUIDE) if s.key == key]
    assert len(found) == 1, f"{GUIDE.name}: {len(found)} snippets named {key!r}"
    return found[0]


def _module_from(snippet: Snippet, optimizers: str | None, reaches: bool | str = True):
    import lightning.pytorch as L
    import torch

    namespace = {"torch": torch, "L": L}
    exec(compile(snippet.code, snippet.where, "exec"), namespace)
    if optimizers is None:
        return namespace["Model"]()
    hooks = {k: v for k, v in namespace.items() if callable(v) and _HOOK.search(f"def {k}(")}
    assert hooks, f"{snippet.where}: no training_step or hook found"
    # the snippet's own helpers (has_gradients, step_skip_aware) stay globals of its functions
    base = _harness(optimizers, reaches)
    return type("Snippet", (base,), hooks)()


def _weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(RUNS))
def test_each_hook_snippet_trains_in_a_real_trainer(key):
    from mpguide.data import digits_loader

    precision, optimizers = RUNS[key]
    snippet = _guide_snippet(key)
    module = _module_from(snippet, optimizers)
    before = _weights(module)
    _trainer(precision).fit(module, digits_loader(batch_size=64))
    after = _weights(module)
    changed = [k for k in before if not bool((before[k] == after[k]).all())]
    assert any(k.startswith("net.") for k in changed), f"{snippet.where}: the snippet did not train ({changed})"


@pytest.mark.slow
def test_the_guard_snippet_is_what_keeps_16_mixed_alive():
    """The no-gradient guard of the guide, against the same step without it, on a generator whose
    loss never reaches its weights: with the guard 16-mixed trains; without it, it raises."""
    from mpguide.data import digits_loader

    snippet = _guide_snippet("no_gradient_step")
    module = _module_from(snippet, "two", reaches=False)
    before = _weights(module)
    with pytest.warns(UserWarning, match=r"optimizer 0 skipped at batch 1") as seen:
        _trainer("16-mixed").fit(module, digits_loader(batch_size=64))
    after = _weights(module)
    assert not bool((before["net.weight"] == after["net.weight"]).all())  # the critic trained
    assert bool((before["other.weight"] == after["other.weight"]).all())  # the generator had nothing to step
    # the skip is visible: one warning per skipped window of the generator (2 epochs x 2 windows)
    assert len([w for w in seen if "skipped at batch" in str(w.message)]) == 4
    # on a loss that reaches the generator the same snippet trains it and never warns
    reached = _module_from(snippet, "two")
    before = _weights(reached)
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        _trainer("16-mixed").fit(reached, digits_loader(batch_size=64))
    assert not [w for w in quiet if "skipped at batch" in str(w.message)]
    assert not bool((before["other.weight"] == _weights(reached)["other.weight"]).all())
    unguarded = Snippet(
        snippet.key,
        snippet.code.replace("if has_gradients(opt):", "if True:"),
        snippet.line,
        snippet.path,
    )
    assert unguarded.code != snippet.code
    with pytest.raises(AssertionError, match="No inf checks were recorded for this optimizer"):
        _trainer("16-mixed").fit(_module_from(unguarded, "two", reaches=False), digits_loader(batch_size=64))


@pytest.mark.slow
def test_the_guard_snippet_warns_on_a_loss_cut_off_from_every_weight():
    """Under toggle_model a detached loss reaches nothing trainable: the snippet skips its backward and warns
    (the reader's own #20116 mistake); without the ``loss.requires_grad`` line backward raises."""
    from mpguide.data import digits_loader

    snippet = _guide_snippet("no_gradient_step")
    module = _module_from(snippet, "two", reaches="nothing")
    before = _weights(module)
    with pytest.warns(UserWarning, match=r"optimizer 0 skipped at batch 1"):
        _trainer("16-mixed").fit(module, digits_loader(batch_size=64))
    assert bool((before["other.weight"] == _weights(module)["other.weight"]).all())
    assert not bool((before["net.weight"] == _weights(module)["net.weight"]).all())  # the critic trained
    always = snippet.code.replace(
        "if loss.requires_grad:\n            self.manual_backward", "if True:\n            self.manual_backward"
    )
    assert always != snippet.code
    unchecked = Snippet(snippet.key, always, snippet.line, snippet.path)
    with pytest.raises(RuntimeError, match="does not require grad"):
        _trainer("16-mixed").fit(_module_from(unchecked, "two", reaches="nothing"), digits_loader(batch_size=64))


@pytest.mark.slow
def test_the_gan_clipping_snippet_clips_only_the_second_optimizer():
    """In ``on_before_optimizer_step`` the hook gets the raw optimizer: the guide's comparison with
    ``self.optimizers()[1].optimizer`` clips the second optimizer at every step and never the first,
    and the natural ``optimizer is self.optimizers()[1]`` never clips at all."""
    from mpguide.data import digits_loader

    def clipped_params(code: str) -> list[str]:
        snippet = _guide_snippet("clipping_gan")
        module = _module_from(Snippet(snippet.key, code, snippet.line, snippet.path), "two")
        calls: list[str] = []
        clip = module.clip_gradients

        def recorded(optimizer, *args, **kwargs):
            calls.append("net" if optimizer.param_groups[0]["params"][0] is module.net.weight else "other")
            return clip(optimizer, *args, **kwargs)

        module.clip_gradients = recorded
        _trainer("16-mixed").fit(module, digits_loader(batch_size=64))
        return calls

    code = _guide_snippet("clipping_gan").code
    assert clipped_params(code) == ["net"] * 16  # 2 epochs x 8 batches, the second optimizer only
    trap = code.replace("self.optimizers()[1].optimizer", "self.optimizers()[1]")
    assert trap != code and clipped_params(trap) == []


def test_no_snippet_hard_codes_cuda():
    assert not [s.where for s in snippets(GUIDE) if '"cuda"' in s.code]


def test_the_fabric_loop_of_the_guide_is_plot_14s():
    """Each statement of the guide's library-free Fabric loop appears in plot_14's ``LibraryFree`` recipe
    (with ``self.``/``dev`` spelled out), so the claims that verify the recipe verify the snippet."""
    example = (ROOT / "examples" / "plot_14_fabric_manual_loop.py").read_text()
    recipe = example[example.index("class LibraryFree") : example.index("class FabricAutocast32")]
    recipe = recipe.replace("self.fabric.device.type", "dev").replace("self.", "")
    code = _guide_snippet("fabric_no_library").code
    loop = code[code.index("\nfor ") :].splitlines()[2:]
    body = [line.strip() for line in loop if line.strip() and not line.strip().startswith("#")]
    assert len(body) == 17  # its 14 lines as ruff wraps them at the guide's 46 columns (docs/model/ruff.toml)
    # layout aside (the example is formatted for its page, the guide for its own): no whitespace, no magic commas
    flat = "".join(recipe.split()).replace(",)", ")")
    missing = [line for line in body if "".join(line.split()).replace(",)", ")") not in flat]
    assert not missing, missing
    assert 'precision="32-true"' in code and "GradScaler(dev)" in code and "GradScaler(fabric.device.type)" in flat
    assert "accelerator=device" not in code  # round 5: a name the snippet never defines


# ----------------------------------------------------------------------------- reused figures

_FIGURE = re.compile(
    r"^```\{figure\} \.\./auto_examples/images/sphx_glr_(?P<example>plot_\d+_\w+?)_(?P<n>\d{3})\.png\n"
    r":name: fig-(?P<short>plot_\d+)-(?P<name>\w+)$",
    re.MULTILINE,
)


def test_each_reused_figure_is_the_one_its_name_says():
    text = GUIDE.read_text()
    figures = list(_FIGURE.finditer(text))
    assert len(figures) == text.count("```{figure}") >= 10, "every figure needs a ':name: fig-plot_NN-<name>' line"
    for m in figures:
        source = (ROOT / "examples" / f"{m['example']}.py").read_text()
        drawn = re.findall(r"save_figure\(\s*fig,\s*record\[\"example\"\],\s*\"(\w+)\",?\s*\)", source)
        n = int(m["n"])
        assert m["example"].startswith(m["short"])
        assert n <= len(drawn) and drawn[n - 1] == m["name"], (
            f"{GUIDE.name}: figure {n} of {m['example']} is {drawn[n - 1] if n <= len(drawn) else 'missing'!r}, "
            f"the page says {m['name']!r} (the example's figures changed: update the number)"
        )


def test_footer_and_numbers_fail_clearly_on_bad_input(monkeypatch):
    from mpguide_build import guide

    with pytest.raises(KeyError, match="unknown guide section 'nope'; known: "):
        guide.footer("nope")
    with pytest.raises(KeyError, match="reads run 'gone', which the record does not have"):
        guide._run({"example": "plot_01", "runs": [{"id": "x"}]}, "gone")
    assert set(guide.SECTIONS) >= {"porting", "clipping", "no_gradient_step"}
    assert all(f'guide.footer("{key}")' in GUIDE.read_text() for key in guide.SECTIONS)


# ----------------------------------------------------------------------------- resuming under 16-mixed


@pytest.mark.slow
def test_resume_keeps_the_checkpoints_scaler_settings_unless_set_in_on_train_start(tmp_path):
    """The guide's resuming section: ``Trainer.fit(ckpt_path=...)`` restores the GradScaler's saved state over
    the settings of a new GradScaler (``growth_interval`` stays 2000), and settings made in
    ``on_train_start`` (after the restore) hold. That the scale then grows only with the growth count reset too:
    ``tests/test_guide_edges.py::test_the_resuming_snippet_makes_the_scale_grow_after_a_resume``."""
    import lightning.pytorch as L
    import torch
    from lightning.pytorch.plugins.precision import MixedPrecision

    from mpguide.data import digits_loader

    class Resumed(_harness("one")):
        def on_train_start(self):
            if self.set_on_start:
                self.trainer.precision_plugin.scaler.set_growth_interval(1)

    def fit(growth_interval: int, steps: int, ckpt=None, set_on_start=False):
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=growth_interval)
        plugin = MixedPrecision("16-mixed", "cpu", scaler=scaler)
        trainer = L.Trainer(
            accelerator="cpu",
            max_steps=steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            plugins=[plugin],
        )
        module = Resumed()
        module.set_on_start = set_on_start
        trainer.fit(module, digits_loader(batch_size=64), ckpt_path=ckpt)
        return trainer, scaler

    first, _ = fit(2000, 4)
    ckpt = tmp_path / "c.ckpt"
    first.save_checkpoint(ckpt)
    _, kept = fit(1, 6, ckpt)
    assert kept.get_growth_interval() == 2000  # the checkpoint's setting silently wins
    _, changed = fit(1, 6, ckpt, set_on_start=True)
    assert changed.get_growth_interval() == 1


def test_gpu_overview_says_which_examples_have_a_record_and_how_old(monkeypatch):
    from types import SimpleNamespace

    import mpguide.verify.claims.declarations as declarations
    from mpguide_build import guide, pages

    def entry(stale: str):
        record = {"created": "2026-11-30T01:05:39Z", "env": {"device": "NVIDIA H200"}}
        return SimpleNamespace(record=record, stale=stale)

    refs = {"plot_01_porting_to_manual": [entry("the example changed")], "plot_02_two_optimizers": [entry("")]}
    names = ["plot_01_porting_to_manual", "plot_02_two_optimizers", "plot_03_shared_backward"]
    monkeypatch.setattr(declarations, "example_names", lambda: names)
    monkeypatch.setattr(pages, "page_entries", lambda name: [None, *refs.get(name, [])])
    text = guide.gpu_overview()
    assert text.startswith("2 of 3 examples have a committed GPU record: 01 (NVIDIA H200, 2026-11-30, older than")
    assert "02 (NVIDIA H200, 2026-11-30, made from the current example)" in text
    assert "1 of them are older" in text and "Examples 03 have no GPU record" in text
    refs.clear()
    assert guide.gpu_overview().startswith("No example has a GPU record")


@pytest.mark.slow
def test_fabric_resume_keeps_the_loss_scale_only_with_the_precision_plugin_in_the_state(tmp_path):
    """The guide's Fabric resume: ``fabric.save`` stores only ``state``; without the precision plugin the
    resumed scaler starts again at 65536, with ``state["precision"] = fabric.strategy.precision`` it
    continues at the saved scale."""
    import torch
    import torch.nn.functional as F
    from lightning.fabric import Fabric
    from lightning.fabric.plugins.precision import MixedPrecision

    gen = torch.Generator().manual_seed(7)
    xs, ys = torch.randn(8, 32, 16, generator=gen), torch.randint(0, 4, (8, 32), generator=gen)

    def setup():
        fabric = Fabric(accelerator="cpu", devices=1, plugins=[MixedPrecision("16-mixed", "cpu")])
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=1e-3))
        return fabric, model, opt

    fabric, model, opt = setup()
    for x, y in zip(xs, ys):
        opt.zero_grad()
        fabric.backward(F.cross_entropy(model(x), y) * 2000.0)  # large enough that the first steps overflow
        opt.step()
    saved = fabric.strategy.precision.scaler.get_scale()
    assert saved < 65536.0
    for with_plugin in (False, True):
        state = {"model": model, "optimizer": opt}
        if with_plugin:
            state["precision"] = fabric.strategy.precision
        path = tmp_path / f"last-{with_plugin}.ckpt"
        fabric.save(path, state)
        fabric2, model2, opt2 = setup()
        state2 = {"model": model2, "optimizer": opt2}
        if with_plugin:
            state2["precision"] = fabric2.strategy.precision
        fabric2.load(path, state2)
        scaler = fabric2.strategy.precision.scaler
        resumed = scaler.get_scale() if scaler._scale is not None else scaler._init_scale
        assert resumed == (saved if with_plugin else 65536.0), (with_plugin, resumed, saved)


@pytest.mark.slow
def test_loss_backward_after_another_manual_backward_silently_shrinks_the_update():
    """The guide's ``loss.backward()`` sentence: under 16-mixed it raises at the first step, unless another
    optimizer of the step went through ``manual_backward`` first (a GAN); then nothing fails and that
    optimizer's update is divided by the loss scale (fp32 and ``manual_backward`` for both: the full update)."""
    from mpguide.data import digits_loader

    def net_change(precision: str, plain_backward: bool) -> float:
        class Step(_harness("two")):
            def training_step(self, batch, batch_idx):
                opt_g, opt_d = self.optimizers()
                for opt, loss, plain in ((opt_g, self.generator_loss(batch), False), (opt_d, None, plain_backward)):
                    opt.zero_grad()
                    loss = self.compute_loss(batch) if loss is None else loss
                    loss.backward() if plain else self.manual_backward(loss)
                    opt.step()

        module = Step()
        before = module.net.weight.detach().clone()
        _trainer(precision).fit(module, digits_loader(batch_size=64))
        return float((module.net.weight.detach() - before).norm())

    fp32 = net_change("32-true", plain_backward=True)
    assert abs(net_change("16-mixed", plain_backward=False) / fp32 - 1) < 0.05
    shrunk = net_change("16-mixed", plain_backward=True) / fp32
    print(f"loss.backward() after a manual_backward, 16-mixed: update / fp32 update = {shrunk:.3g}")
    assert shrunk < 1e-2  # no error, and almost no update


@pytest.mark.slow
def test_detect_anomaly_stops_a_correct_16_mixed_run_at_its_first_overflow():
    """The guide's ``detect_anomaly`` sentence: on a model whose first fp16 steps overflow (scale 65536), the
    same correct step trains without it and raises at step 0 with it; bf16-mixed with it trains."""
    import lightning.pytorch as L
    import torch
    import torch.nn.functional as F
    from lightning.pytorch.plugins.precision import MixedPrecision
    from torch.utils.data import DataLoader, TensorDataset

    class Overflowing(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(16, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 4)
            )
            self.steps = 0

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(F.cross_entropy(self.net(batch[0]), batch[1]) * 100)
            opt.step()
            self.steps += 1

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    gen = torch.Generator().manual_seed(10)
    data = TensorDataset(torch.randn(160, 16, generator=gen) * 10, torch.randint(0, 4, (160,), generator=gen))

    def fit(precision: str, anomaly: bool) -> Overflowing:
        module = Overflowing()
        trainer = L.Trainer(
            accelerator="cpu",
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            detect_anomaly=anomaly,
            plugins=[MixedPrecision(precision, "cpu")],
        )
        trainer.fit(module, DataLoader(data, batch_size=16))
        return module

    assert fit("16-mixed", anomaly=False).steps == 10
    assert fit("bf16-mixed", anomaly=True).steps == 10
    with pytest.raises(RuntimeError, match="returned nan values"):
        fit("16-mixed", anomaly=True)
