"""PitfallChecks' own time on three corpus modules (``cost()['fraction']``, 400-800 batches of 4 rows, 3 repeats).

    PYTHONPATH=. python -m tests.checks_corpus.cost            # this tree's check
    PYTHONPATH=. python -m tests.checks_corpus.cost 5a6abb2    # the check as of that commit (its GAN row crashes)

Toy modules take about a millisecond per step, so the fraction here is an upper bound for the gallery's models.
"""

from __future__ import annotations

import logging
import sys
import warnings

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from . import Case, plugins_for
from .compare import checks_at
from .correct import DocsMinimal, LightningGan, PcGrad


def main(argv: list[str]) -> int:
    for name in ("lightning", "lightning.pytorch", "lightning.pytorch.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    if argv:
        checks_cls, modules = checks_at(argv[0]), (DocsMinimal, PcGrad)
    else:
        from mpguide.checks import PitfallChecks as checks_cls

        modules = (DocsMinimal, PcGrad, LightningGan)
    x = torch.rand(1600, 8, generator=torch.Generator().manual_seed(1))
    data = DataLoader(TensorDataset(x, x[:, :1]), batch_size=4)
    for module_cls in modules:
        for precision in ("32-true", "16-mixed"):
            fractions = []
            for _ in range(3):
                checks = checks_cls()
                trainer = pl.Trainer(
                    accelerator="cpu",
                    max_epochs=1,
                    logger=False,
                    enable_checkpointing=False,
                    enable_progress_bar=False,
                    enable_model_summary=False,
                    callbacks=[checks],
                    plugins=plugins_for(Case("cost", module_cls, "", "", precision)),
                )
                torch.manual_seed(0)
                trainer.fit(module_cls(), data)
                fractions.append(checks.cost()["fraction"])
            fractions.sort()
            print(f"{module_cls.__name__:12} {precision:9} fraction min {fractions[0]:.4f} median {fractions[1]:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
