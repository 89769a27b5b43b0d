"""Distribution helpers used by the networks: a fast Categorical, a stable tanh, ``mode_of``.

* ``Categorical`` is ``torch``'s ``Categorical(logits=...)`` (built by its
  own constructor) that samples by inverting the CDF with one ``torch.rand``
  per draw instead of ``torch.multinomial`` (several times slower on the CPU
  for the small batches of a rollout).  The sampled distribution is the
  same; the random draws differ from torch's class for the same seed.

* ``StableTanh`` is ``torch``'s ``TanhTransform`` whose inverse clamps its
  input just inside ``(-1, 1)`` (as ALF's ``StableTanh`` does), so that
  ``log_prob`` of a stored action lying exactly on an action bound is finite
  instead of ``inf``/``nan``.  It is still a ``TanhTransform`` (``isinstance``
  checks keep working).
* ``mode_of`` returns the deterministic (greedy) action of a distribution or
  a nest of distributions, for evaluation.

Nothing here reads tensor values on the host, so both are safe on CUDA.
"""

from typing import Any, Sequence, Tuple

import torch
import torch.distributions as td

from alf_entropy.utils import nest

__all__ = [
    "Categorical",
    "StableTanh",
    "categorical_from_uniform",
    "categorical_log_prob_and_entropy",
    "mode_of",
    "sample_categorical",
]


class Categorical(td.Categorical):
    """``td.Categorical(logits=logits)`` that samples by inverting the CDF.

    Built by torch's own constructor; only ``sample`` differs: one
    ``torch.rand`` per draw instead of ``torch.multinomial`` (several times
    slower on the CPU for a rollout-sized batch), with no host sync.

    Args:
        logits: unnormalised log-probabilities ``[..., num_events]``.
        validate_args: as for ``torch.distributions``.
    """

    def __init__(self, logits: torch.Tensor, validate_args: bool = False):
        # (torch's own constructor raises a ValueError for 0-d logits)
        super().__init__(logits=logits, validate_args=validate_args)

    def sample(self, sample_shape: Sequence[int] = ()) -> torch.Tensor:
        """Draw indices by inverting the CDF (no host sync).

        Args:
            sample_shape: leading sample dimensions.

        Returns:
            torch.Tensor: int64 indices of shape ``sample_shape + batch_shape``.
        """
        return sample_categorical(self.probs, sample_shape)


def sample_categorical(probs: torch.Tensor, sample_shape: Sequence[int] = ()) -> torch.Tensor:
    """``Categorical.sample``: draw indices from ``probs`` by inverting the CDF.

    Args:
        probs: probabilities ``[..., num_events]`` (summing to 1).
        sample_shape: leading sample dimensions.

    Returns:
        torch.Tensor: int64 indices of shape ``sample_shape + probs.shape[:-1]``.
    """
    # A plain tuple: torch parses it faster than a ``torch.Size``.
    shape = (*sample_shape, *probs.shape[:-1], 1)
    return categorical_from_uniform(
        probs, torch.rand(shape, dtype=probs.dtype, device=probs.device)
    )


def categorical_from_uniform(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The categorical draw that uniforms ``u`` give: the inverse of ``probs``' CDF.

    Args:
        probs: probabilities ``[..., num_events]`` (summing to 1).
        u: uniforms in ``[0, 1)``, ``[*sample_shape, ..., 1]``.

    Returns:
        torch.Tensor: int64 indices ``u.shape[:-1]``.
    """
    cdf = probs.cumsum(-1)
    if u.dim() > cdf.dim():  # leading sample dimensions
        cdf = cdf.expand(*u.shape[:-1], cdf.shape[-1]).contiguous()
    # Index k is drawn when cdf[k-1] < u <= cdf[k] (the number of entries
    # below u); clamp guards against a last cdf entry that rounds below 1.
    return torch.searchsorted(cdf, u).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def categorical_log_prob_and_entropy(
    logits: torch.Tensor, action: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(log_prob(action), entropy())`` of ``Categorical(logits=logits)`` with torch's ops,
    so the same bits, without the distribution object (``[..., n]`` logits, ``[...]`` action)."""
    logits = logits - logits.logsumexp(dim=-1, keepdim=True)
    log_prob = logits.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    p_log_p = logits.clamp(min=torch.finfo(logits.dtype).min) * logits.softmax(-1)
    return log_prob, -p_log_p.sum(-1)


class StableTanh(td.TanhTransform):
    """``y = tanh(x)`` with an inverse that clamps ``y`` into ``(-1, 1)``.

    Args:
        cache_size: as for ``torch.distributions.TanhTransform``; use ``1`` so
            that ``log_prob`` of a freshly drawn sample reuses its pre-tanh
            value exactly.
    """

    def _inverse(self, y: torch.Tensor) -> torch.Tensor:
        # The largest float below 1 is 1 - eps/2; clamp to 1 - eps to stay safe.
        bound = 1.0 - torch.finfo(y.dtype).eps
        return torch.atanh(y.clamp(-bound, bound))


def _mode_of_one(dist):
    if isinstance(dist, td.Categorical):
        return dist.logits.argmax(dim=-1)
    if isinstance(dist, td.Independent):
        return _mode_of_one(dist.base_dist)
    if isinstance(dist, td.TransformedDistribution):
        x = _mode_of_one(dist.base_dist)
        for transform in dist.transforms:
            x = transform(x)
        return x
    try:
        return dist.mode
    except (AttributeError, NotImplementedError) as e:
        raise TypeError(
            f"mode_of does not support distributions of type {type(dist).__name__}"
        ) from e


def mode_of(dist: Any) -> Any:
    """The deterministic action of a distribution (or of a nest of them).

    * ``Categorical``: ``argmax`` of the logits (an index, int64).
    * ``Normal`` / ``Independent(Normal)``: the mean.
    * ``TransformedDistribution`` (e.g. the tanh-squashed Normal of
      ``ActorDistributionNetwork(squash_to_spec=True)``): the transforms
      applied to the base distribution's mode, i.e. ``loc + scale *
      tanh(mean)``, which lies inside the action bounds.
    * Others: ``dist.mode`` when torch defines it.

    Args:
        dist: a ``torch.distributions.Distribution`` or a nest (dict, tuple,
            namedtuple) of them.

    Returns:
        A tensor (or the same nest of tensors) with the distribution's batch
        and event shape.

    Raises:
        TypeError: for a distribution type without a known mode.
    """
    if isinstance(dist, td.Distribution):
        return _mode_of_one(dist)
    return nest.map_structure(_mode_of_one, dist)
