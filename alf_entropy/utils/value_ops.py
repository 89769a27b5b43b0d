"""Advantages for actor-critic learning: generalised advantage estimation (GAE).

These follow ALF's ``alf.utils.value_ops`` conventions exactly, so code
ported from ALF gives the same numbers:

* All inputs are time-major ``[T, B, ...]`` tensors (``time_major=False``
  accepts ``[B, T, ...]``) describing ``T`` consecutive time steps.
* ``rewards[t]`` and ``discounts[t]`` belong to time step ``t``: they are the
  reward received and the discount of arriving *at* step ``t``, so the
  transition ``t -> t+1`` uses ``rewards[t+1]`` and ``discounts[t+1]``.
  ``discounts`` is 0 only on true termination, so a truncated episode is
  bootstrapped from the value of its ``LAST`` observation.
* A ``LAST`` step has no transition out of it (the action taken there is
  ignored by the environment, which resets), so its advantage is 0: it
  contributes nothing to a masked loss and no
  credit flows across an episode boundary.
* The outputs cover the first ``T - 1`` steps (the last step only serves to
  bootstrap).

The function is a fixed-length loop of tensor operations: no host
synchronisation, on whatever device the inputs live on (GAE's loop runs in
NumPy for CPU tensors: the same arithmetic, with less overhead per step).
"""

from typing import Union

import numpy as np
import torch

from alf_entropy.data_structures import StepType
from alf_entropy.utils.checks import check_real

__all__ = ["generalized_advantage_estimation", "normalize_advantages"]


def _check_inputs(
    rewards: torch.Tensor,
    values: torch.Tensor,
    step_types: torch.Tensor,
    discounts: torch.Tensor,
    time_major: bool,
):
    """Validate shapes and return time-major tensors (values' dtype)."""
    for name, x in (
        ("rewards", rewards),
        ("values", values),
        ("step_types", step_types),
        ("discounts", discounts),
    ):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1:
            raise ValueError(f"{name} must have a time dimension, got shape {tuple(x.shape)}")
    if not time_major:
        rewards, values, step_types, discounts = (
            x.transpose(0, 1) for x in (rewards, values, step_types, discounts)
        )
    shape = values.shape
    for name, x in (("rewards", rewards), ("step_types", step_types), ("discounts", discounts)):
        if x.shape != shape[: x.dim()] or x.dim() > values.dim():
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}, which is not a prefix of values' "
                f"shape {tuple(shape)}"
            )
    if shape[0] < 2:
        raise ValueError(f"need at least 2 time steps (the last one bootstraps), got {shape[0]}")

    def _expand(x: torch.Tensor) -> torch.Tensor:
        while x.dim() < values.dim():
            x = x.unsqueeze(-1)
        return x

    is_lasts = _expand((step_types == StepType.LAST).to(values.dtype))
    return _expand(rewards.to(values.dtype)), values, is_lasts, _expand(discounts.to(values.dtype))


def normalize_advantages(
    advantages: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, batch_ndim: int = 0
) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` with the statistics over the masked elements.

    Args:
        advantages: any shape.
        mask: bool (or 0/1) of ``advantages``' shape: the elements counted.
        eps: added to the standard deviation.
        batch_ndim: leading dims kept apart (1 for K agents: each its own statistics).

    Returns:
        torch.Tensor: the normalised advantages (every element, masked or not).
    """
    # ``masked_mean`` twice, with the mask conversion, the count and ``x - mean``
    # computed once (the same operations, so the same values).
    dims = tuple(range(batch_ndim, advantages.dim())) if batch_ndim else None
    mask = mask.to(advantages.dtype)

    def _sum(x: torch.Tensor) -> torch.Tensor:
        return x.sum() if dims is None else x.sum(dims, keepdim=True)

    count = _sum(mask).clamp(min=1.0)
    centered = advantages - _sum(advantages * mask) / count
    var = _sum(centered.square() * mask) / count
    return centered / (var.sqrt() + eps)


def _to_batch_major(x: torch.Tensor, time_major: bool) -> torch.Tensor:
    return x if time_major else x.transpose(0, 1)


def generalized_advantage_estimation(
    rewards: torch.Tensor,
    values: torch.Tensor,
    step_types: torch.Tensor,
    discounts: torch.Tensor,
    td_lambda: Union[float, torch.Tensor] = 1.0,
    time_major: bool = True,
) -> torch.Tensor:
    """Generalised advantage estimation (Schulman et al., 2016).

    ``delta[t] = rewards[t+1] + discounts[t+1] * values[t+1] - values[t]`` and
    ``adv[t] = delta[t] + td_lambda * discounts[t+1] * adv[t+1]``, with
    ``adv[T-1] = 0`` and ``adv[t] = 0`` at ``LAST`` steps, so no credit is
    assigned across an episode boundary.  ``advantages + values[:-1]`` is the
    TD(lambda) return.

    Args:
        rewards: ``[T, B, ...]`` rewards.
        values: ``[T, B, ...]`` value estimates.
        step_types: ``[T, B]`` ``StepType`` values.
        discounts: ``[T, B]`` discounts (0 on termination).
        td_lambda: the GAE lambda in ``[0, 1]``; 1 gives Monte-Carlo
            advantages, 0 one-step TD errors.
        time_major: False if the inputs are ``[B, T, ...]``.

    Returns:
        torch.Tensor: ``[T-1, B, ...]`` advantages, without gradient.

    Raises:
        TypeError: if an input is not a tensor.
        ValueError: if the shapes disagree, ``T < 2`` or ``td_lambda`` is a
            number outside ``[0, 1]``.
    """
    if not isinstance(td_lambda, torch.Tensor):
        check_real("td_lambda", td_lambda, minimum=0.0, maximum=1.0)
    rewards, values, is_lasts, discounts = _check_inputs(
        rewards, values, step_types, discounts, time_major
    )
    with torch.no_grad():
        values = values.detach()
        delta = rewards[1:] + discounts[1:] * values[1:] - values[:-1]
        weighted_discounts = discounts[1:] * td_lambda
        not_lasts = 1 - is_lasts[:-1]
        # The recursion is inherently sequential.  On the CPU it runs in NumPy,
        # whose float32/float64 multiply and add round like torch's (the same
        # bits) at a fraction of torch's per-op cost for a small batch.
        rows = (delta, weighted_discounts, not_lasts)
        if (
            delta.device.type == "cpu"
            and all(x.dtype == delta.dtype for x in rows)
            and (delta.dtype in (torch.float32, torch.float64))
        ):
            deltas, weights, masks = (torch.broadcast_to(x, delta.shape).numpy() for x in rows)
            advs = np.empty(delta.shape, dtype=deltas.dtype)
            adv = np.zeros(delta.shape[1:], dtype=deltas.dtype)  # adv[T-1] = 0
            for t in reversed(range(delta.shape[0])):
                adv = masks[t] * (deltas[t] + weights[t] * adv)
                advs[t] = adv
            return _to_batch_major(torch.from_numpy(advs), time_major)
        # Elsewhere the per-step rows are unbound once (views) so that each
        # step costs three tensor ops.
        deltas = delta.unbind(0)
        weights = weighted_discounts.unbind(0)
        masks = not_lasts.unbind(0)
        adv = torch.zeros_like(values[-1])  # adv[T-1] = 0
        advs = [adv] * (values.shape[0] - 1)
        for t in reversed(range(values.shape[0] - 1)):
            adv = masks[t] * (deltas[t] + weights[t] * adv)
            advs[t] = adv
        advs = torch.stack(advs)
    return _to_batch_major(advs, time_major)
