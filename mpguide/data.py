"""Real data that ships inside a package: scikit-learn's handwritten digits.

:func:`sklearn.datasets.load_digits` reads 1,797 8x8 grey-scale images from a file inside the
scikit-learn wheel, so nothing is downloaded at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

#: Number of input features (8 x 8 pixels) and of classes.
NUM_FEATURES = 64
NUM_CLASSES = 10


def digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """Return the digits as tensors.

    Returns:
        ``(images, labels)``: images float32 of shape ``(1797, 64)`` scaled to ``[0, 1]``
        (raw pixel values are 0..16), labels int64 of shape ``(1797,)`` in ``0..9``.
    """
    import torch
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.as_tensor(bunch.data, dtype=torch.float32) / 16.0
    labels = torch.as_tensor(bunch.target, dtype=torch.int64)
    return images, labels


def digits_loader(batch_size: int = 64, seed: int = 0) -> DataLoader:
    """A training :class:`~torch.utils.data.DataLoader` over the digits with a fixed data order.

    The shuffle order depends only on ``seed``, so runs that share a seed see the same batches in
    the same order whatever their precision or optimization mode. Incomplete last batches are
    dropped (28 batches per epoch at ``batch_size=64``).

    Args:
        batch_size: samples per batch.
        seed: seed of the shuffling generator.

    Returns:
        A loader yielding ``(images, labels)``: float32 ``(batch_size, 64)``, int64 ``(batch_size,)``.
    """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    images, labels = digits_tensors()
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(
        TensorDataset(images, labels), batch_size=batch_size, shuffle=True, drop_last=True, generator=generator
    )


def steps_per_epoch(batch_size: int = 64) -> int:
    """Optimizer steps per epoch (one per batch) of :func:`digits_loader` at ``batch_size``.

    Needs no torch (the module imports it where tensors are made), so the claim gate and the pages that
    judge records count batches without importing it.
    """
    return 1797 // batch_size
