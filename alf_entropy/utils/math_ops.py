"""Small tensor helpers shared by algorithms (no host synchronisation)."""

import math
from typing import Optional, Tuple

import torch

__all__ = ["masked_mean"]


def masked_mean(
    x: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    name: str = "mask",
    dim: Optional[Tuple[int, ...]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``x`` over the elements where ``mask`` is non-zero.

    ``mask`` (bool or 0/1) may have any shape that broadcasts with ``x``; the
    mean is over the broadcast elements.  Masked-out elements are selected
    away, not multiplied, so they may hold NaN/inf.

    Args:
        x: a tensor.
        mask: a mask broadcastable with ``x``, or None for all elements.
        name: the mask argument's name, for the error message.
        dim: the dims to average over (after broadcasting); None: all.

    Returns:
        ``(mean, count)``: the mean (0 when nothing counts) and the number of
        elements that count (int64), of the shape left after ``dim``.

    Raises:
        ValueError: if ``mask`` does not broadcast with ``x``.
    """
    if mask is None and dim is None:
        count = x.new_full((), x.numel(), dtype=torch.int64)
        return x.sum() / count.clamp(min=1), count
    if mask is None:
        count = x.new_full((), math.prod(x.shape[d] for d in dim), dtype=torch.int64)
        total = x.sum(dim)
        return total / count.clamp(min=1), count.expand(total.shape)
    if mask.shape != x.shape:
        try:
            x, mask = torch.broadcast_tensors(x, mask)
        except RuntimeError as e:
            raise ValueError(
                f"{name} of shape {tuple(mask.shape)} does not broadcast against the "
                f"shape {tuple(x.shape)}"
            ) from e
    if mask.dtype != torch.bool:
        mask = mask != 0
    if dim is None:
        count = mask.sum()
        return torch.where(mask, x, 0.0).sum() / count.clamp(min=1), count
    count = mask.sum(dim)
    return torch.where(mask, x, 0.0).sum(dim) / count.clamp(min=1), count
