"""A corpus of training steps written after public code, to judge PitfallChecks on (issue 34, item 2).

Each :class:`Case` names its public source (repository and path, or issue), the condition under which the check of
5a6abb2 misfired on it (or would have), the precision it runs in, and what the check must report: ``expect`` is
the set of sections (empty for a correct module). ``known_miss`` marks a bug the check states it cannot see (its
module docstring says why): such a case must run without a crash and is counted apart, never as a pass.

The modules are ours, written after the sources' steps at toy size (a few linear layers, 4-8 batches on CPU);
``correct.py`` holds the correct ones, ``buggy.py`` the buggy ones. ``run_case`` fits one case with a given
``PitfallChecks`` class, so that the corpus can judge an older check too (``tests/test_checks_corpus.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils.data import DataLoader, TensorDataset


@dataclass(frozen=True)
class Case:
    """One module of the corpus, run in one precision."""

    name: str
    module: Callable[[], pl.LightningModule]
    source: str
    condition: str
    precision: str = "32-true"  # "32-true", "bf16-mixed", "16-mixed", "16-mixed-huge" (init scale 2**40)
    expect: frozenset[str] = frozenset()
    known_miss: str = ""
    data: Callable[[], Any] | None = None
    epochs: int = 1
    batches: int | None = None
    plugin: Callable[[], Any] | None = None
    trainer: dict[str, Any] = field(default_factory=dict)


def rows(n: int = 32, width: int = 8, seed: int = 0, batch: int = 8) -> DataLoader:
    """``n`` seeded random rows of ``width`` features and a regression target, in batches of ``batch``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, width, generator=g)
    return DataLoader(TensorDataset(x, x[:, :1].sin()), batch_size=batch)


class CachingMixedPrecision(MixedPrecision):
    """Lightning <= 2.5.4's MixedPrecision: its autocast region kept torch's default cache (on)."""

    def autocast_context_manager(self):
        import torch

        return torch.autocast(self.device, dtype=torch.bfloat16 if self.precision == "bf16-mixed" else torch.half)


def plugins_for(case: Case) -> list[Any]:
    if case.plugin is not None:
        return [case.plugin()]
    if case.precision == "16-mixed":
        return [MixedPrecision("16-mixed", "cpu")]  # the default init scale 65536: the first steps overflow
    if case.precision == "16-mixed-huge":  # every step of the run overflows: every epoch's last step is skipped
        return [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=2.0**40))]
    if case.precision == "bf16-mixed":
        return [MixedPrecision("bf16-mixed", "cpu")]
    return []


def run_case(case: Case, checks_cls: Any) -> dict[str, Any]:
    """Fit ``case`` with a ``checks_cls()`` callback; returns ``{"error", "sections", "messages", "notes"}``."""
    checks = checks_cls()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=case.epochs,
        limit_train_batches=case.batches,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[checks],
        plugins=plugins_for(case),
        **case.trainer,
    )
    error = None
    torch.manual_seed(0)
    module = case.module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.fit(module, case.data() if case.data else rows())
        except Exception as err:  # noqa: BLE001 - a crash is a result here
            error = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:160]}"
    return {
        "error": error,
        "sections": {f.section for f in checks.findings},
        "messages": [f.message for f in checks.findings],
        "notes": list(getattr(checks, "notes", [])),
    }


def all_cases() -> list[Case]:
    from . import buggy, correct

    return [*correct.CASES, *buggy.CASES]
