"""Small tensor helpers shared by algorithms (no host synchronisation)."""
from typing import Optional, Tuple

import torch

__all__ = ["masked_mean"]


def masked_mean(
    x: torch.Tensor, mask: Optional[torch.Tensor] = None, name: str = "mask"
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``x`` over the elements where ``mask`` is non-zero.

    ``mask`` (bool or 0/1) may have any shape that broadcasts with ``x``; the
    mean is over the broadcast elements.  Masked-out elements are selected
    away, not multiplied, so they may hold NaN/inf.

    Args:
        x: a tensor.
        mask: a mask broadcastable with ``x``, or None for all elements.
        name: the mask argument's name, for the error message.

    Returns:
        ``(mean, count)``: the mean (0 when nothing counts) and the number of
        elements that count (an int64 0-d tensor).

    Raises:
        ValueError: if ``mask`` does not broadcast with ``x``.
    """
    if mask is None:
        count = x.new_full((), x.numel(), dtype=torch.int64)
        return x.sum() / count.clamp(min=1), count
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
    count = mask.sum()
    return torch.where(mask, x, 0.0).sum() / count.clamp(min=1), count
