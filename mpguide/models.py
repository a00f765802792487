"""A small model shared by the examples that are not about the model itself.

:class:`~mpguide.models.DigitsClassifier` is an MLP on the bundled digits (see :mod:`mpguide.data`) with the
optimizer, learning rate and loss reduction as arguments. Examples subclass it and write only the
``training_step`` they teach; the measuring helpers record what an optimizer step really did.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from .data import NUM_CLASSES, NUM_FEATURES


class DigitsClassifier(pl.LightningModule):
    """MLP classifier ``64 -> hidden -> 10`` (Tanh) with cross-entropy loss.

    Args:
        optimizer: ``"sgd"`` (momentum 0.9), ``"adamw"`` or ``"adamw-fused"`` (``fused=True``).
        lr: learning rate.
        hidden: hidden width.
        reduction: ``"mean"`` or ``"sum"`` over the batch (``"sum"`` makes gradients 64x larger at
            batch size 64, enough to overflow fp16 at GradScaler's initial scale of 65536).
        manual: ``True`` sets ``automatic_optimization = False``.
        scheduler_gamma: if given, an :class:`~torch.optim.lr_scheduler.ExponentialLR` with this
            factor is returned too (Lightning's default interval: once per epoch).

    Raises:
        ValueError: unknown optimizer or reduction.
    """

    def __init__(
        self,
        optimizer: str = "sgd",
        lr: float = 0.05,
        hidden: int = 64,
        reduction: str = "mean",
        manual: bool = True,
        scheduler_gamma: float | None = None,
    ) -> None:
        super().__init__()
        if optimizer not in ("sgd", "adamw", "adamw-fused"):
            raise ValueError(f"unknown optimizer {optimizer!r}; use sgd, adamw or adamw-fused")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"unknown reduction {reduction!r}; use mean or sum")
        self.automatic_optimization = not manual
        self.optimizer_name, self.lr, self.reduction, self.scheduler_gamma = optimizer, lr, reduction, scheduler_gamma
        self.net = nn.Sequential(nn.Linear(NUM_FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, NUM_CLASSES))

    def compute_loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Cross-entropy of a batch ``(images (B, 64) float32, labels (B,) int64)``; a 0-dim tensor."""
        images, labels = batch
        return F.cross_entropy(self.net(images), labels, reduction=self.reduction)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Automatic optimization: return the loss. Manual subclasses override this."""
        return self.compute_loss(batch)

    def configure_optimizers(self) -> object:
        """The optimizer named at construction, plus the optional per-epoch scheduler."""
        if self.optimizer_name == "sgd":
            opt: torch.optim.Optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        else:
            opt = torch.optim.AdamW(self.parameters(), lr=self.lr, fused=self.optimizer_name == "adamw-fused")
        if self.scheduler_gamma is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.ExponentialLR(opt, self.scheduler_gamma)}

    # ----------------------------------------------------------------- measuring helpers
    def gradient_norm(self) -> float:
        """L2 norm over all parameter gradients as currently stored (scaled or not); 0.0 if none."""
        grads = [p.grad.detach().float().norm() for p in self.parameters() if p.grad is not None]
        return float(torch.stack(grads).norm()) if grads else 0.0

    def weights(self) -> torch.Tensor:
        """All parameters flattened into one float32 vector (a copy), shape ``(n_params,)``."""
        return torch.cat([p.detach().float().flatten() for p in self.parameters()]).clone()
