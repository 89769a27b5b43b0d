"""The entropy of a distribution or a nest of them, on the training path and never reading
the device (ALF's ``dist_utils``, re-exported there): :func:`entropy_with_fallback` (a
closed form where there is one) and :func:`estimated_entropy` (Monte Carlo)."""

import functools
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributions as td

from alf_entropy.tensor_specs import TensorSpec
from alf_entropy.utils import nest
from alf_entropy.utils.checks import check_int

__all__ = ["estimated_entropy", "entropy_with_fallback"]


def estimated_entropy(
    dist: td.Distribution, num_samples: int = 1, check_numerics: bool = False
) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Monte-Carlo estimate of ``dist``'s entropy, ``-mean(log_prob(x))`` over
    ``num_samples`` draws, and a tensor whose *gradient* estimates the entropy's.

    A reparameterizable ``dist`` differentiates through ``rsample()``, so both are
    the same tensor.  Otherwise the score-function identity
    :math:`\nabla H = \nabla E[-\tfrac12 (\log p_\theta(x))^2]` (``x`` fixed)
    gives the surrogate ``-0.5 * log_prob(x)**2``, whose value is not the entropy.

    Args:
        dist: the distribution, any ``batch_shape``.
        num_samples: draws per batch element (>= 1).
        check_numerics: raise on NaN/Inf (reads the device: debugging only).

    Returns:
        ``(entropy, entropy_for_gradient)``, both of shape ``dist.batch_shape``.
    """
    if not isinstance(dist, td.Distribution):
        raise TypeError(
            f"estimated_entropy: dist must be a torch.distributions.Distribution, "
            f"got {type(dist).__name__}"
        )
    sample_shape = torch.Size([check_int("num_samples", num_samples, minimum=1)])
    x = dist.rsample(sample_shape) if dist.has_rsample else dist.sample(sample_shape)
    reparameterized = dist.has_rsample and x.dtype.is_floating_point
    neg_log_prob = -dist.log_prob(x if reparameterized else x.detach())
    entropy = neg_log_prob.mean(dim=0)
    entropy_for_gradient = (
        entropy if reparameterized else (-0.5 * neg_log_prob.square()).mean(dim=0)
    )
    if check_numerics and not bool(torch.isfinite(neg_log_prob).all()):
        raise ValueError(f"estimated_entropy: non-finite entropy estimate for {dist!r}")
    return entropy, entropy_for_gradient


def _affine_parts(transforms: Sequence[td.Transform]) -> Optional[List[td.AffineTransform]]:
    """The ``AffineTransform`` s making up ``transforms`` (``ComposeTransform`` s unpacked),
    or None if a part is not affine."""
    parts: List[td.AffineTransform] = []
    for t in transforms:
        sub = (
            _affine_parts(t.parts)
            if isinstance(t, td.ComposeTransform)
            else ([t] if isinstance(t, td.AffineTransform) else None)
        )
        if sub is None:
            return None
        parts.extend(sub)
    return parts


def _sum_rightmost(x: torch.Tensor, ndims: int) -> torch.Tensor:
    return x.sum(dim=tuple(range(-ndims, 0))) if ndims > 0 else x


def _analytic_entropy(dist: td.Distribution) -> Optional[torch.Tensor]:
    """Closed-form entropy (``dist.batch_shape``), through ``Independent`` and all-affine
    ``TransformedDistribution``; None where torch has none."""
    if isinstance(dist, td.Independent):
        base = _analytic_entropy(dist.base_dist)
        if base is None:
            return None
        return _sum_rightmost(base, dist.reinterpreted_batch_ndims)
    if isinstance(dist, td.TransformedDistribution):
        affines = _affine_parts(dist.transforms)
        base = None if affines is None else _analytic_entropy(dist.base_dist)
        if base is None:
            return None
        # H(f(X)) = H(X) + log|det J_f|, constant for an element-wise affine f.
        batch_shape = dist.batch_shape
        full_shape = batch_shape + dist.event_shape
        extra = len(dist.base_dist.batch_shape) - len(batch_shape)
        base = torch.broadcast_to(_sum_rightmost(base, max(extra, 0)), batch_shape)
        log_det = None
        for t in affines:
            log_scale = torch.as_tensor(t.scale, dtype=base.dtype, device=base.device).abs().log()
            log_scale = torch.broadcast_to(log_scale, full_shape)
            log_det = log_scale if log_det is None else log_det + log_scale
        if log_det is None:  # no transforms at all
            return base
        return base + _sum_rightmost(log_det, len(dist.event_shape))
    try:
        return dist.entropy()
    except NotImplementedError:
        return None


def _leaf_entropy(dist: td.Distribution) -> Tuple[torch.Tensor, torch.Tensor]:
    entropy = _analytic_entropy(dist)
    return estimated_entropy(dist) if entropy is None else (entropy, entropy)


def _reduce_to_spec(
    path: str, dist: td.Distribution, spec: Any, entropies: Tuple[torch.Tensor, torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sum per-element entropies over the spec dims not covered by the event shape."""
    where = f" at '{path}'" if path else ""
    if not isinstance(spec, TensorSpec):
        raise TypeError(
            f"entropy_with_fallback: action_spec leaves must be TensorSpec, got "
            f"{type(spec).__name__}{where}"
        )
    full_shape = tuple(dist.batch_shape + dist.event_shape)
    spec_shape = tuple(spec.shape)
    k = len(spec_shape) - len(dist.event_shape)
    tail = full_shape[len(full_shape) - len(spec_shape) :]
    if not 0 <= k <= len(dist.batch_shape) or tail != spec_shape:
        raise ValueError(
            f"entropy_with_fallback: distribution{where} with batch_shape "
            f"{tuple(dist.batch_shape)} and event_shape {tuple(dist.event_shape)} "
            f"does not end with the action_spec shape {spec_shape}"
        )
    return tuple(_sum_rightmost(e, k) for e in entropies)


def entropy_with_fallback(
    distributions: Any, return_sum: bool = True, action_spec: Any = None
) -> Tuple[Any, Any]:
    r"""Entropy of a nest of distributions, in closed form where possible.

    Per leaf: torch's ``entropy()`` where it has one; for a
    ``TransformedDistribution`` of affine transforms over such a base, the exact
    :math:`H(a + bX) = H(X) + \sum \log|b|`; else (a tanh-squashed Normal: build
    its ``TanhTransform`` with ``cache_size=1``) one sample of
    :func:`estimated_entropy`.  Each result has the leaf's ``batch_shape``, summed
    over the dims of ``action_spec``'s shape the leaf treats as batch dims (a
    ``Normal`` of batch ``[B, D]`` for a spec ``(D,)`` gives ``[B]``).

    Args:
        distributions: a ``torch.distributions.Distribution`` or a nest of them.
        return_sum: sum over the nest (equal shapes), else nests like ``distributions``.
        action_spec: optional nest of ``TensorSpec`` like ``distributions``.

    Returns:
        ``(entropy, entropy_for_gradient)``: back-propagate the second (a surrogate for
        sampled, non-reparameterizable leaves).
    """
    if isinstance(distributions, td.Distribution) and (
        action_spec is None or isinstance(action_spec, TensorSpec)
    ):
        # A single distribution (the common case): no nest walking; the
        # sums below would return its results unchanged.
        results = _leaf_entropy(distributions)
        if action_spec is not None:
            results = _reduce_to_spec("", distributions, action_spec, results)
        return results  # (entropy, entropy_for_gradient): a tuple either way
    flat_paths = nest.flatten_with_path(distributions)
    if not flat_paths:
        raise ValueError(
            "entropy_with_fallback: distributions must contain at least one Distribution"
        )
    for path, dist in flat_paths:
        if not isinstance(dist, td.Distribution):
            where = f" at '{path}'" if path else ""
            raise TypeError(
                f"entropy_with_fallback: leaves must be "
                f"torch.distributions.Distribution, got {type(dist).__name__}{where}"
            )
    results = [_leaf_entropy(d) for _, d in flat_paths]
    if action_spec is not None:
        nest.assert_same_structure(distributions, action_spec)
        specs = nest.flatten(action_spec)
        results = [
            _reduce_to_spec(path, dist, spec, res)
            for (path, dist), spec, res in zip(flat_paths, specs, results)
        ]
    entropies, grads = [r[0] for r in results], [r[1] for r in results]
    if not return_sum:
        return (
            nest.pack_sequence_as(distributions, entropies),
            nest.pack_sequence_as(distributions, grads),
        )
    shapes = {tuple(e.shape) for e in entropies}
    if len(shapes) > 1:
        detail = ", ".join(f"'{p}': {tuple(e.shape)}" for (p, _), e in zip(flat_paths, entropies))
        raise ValueError(
            f"entropy_with_fallback: cannot sum entropies of different shapes "
            f"({detail}); pass action_spec to reduce them or use return_sum=False"
        )
    return functools.reduce(torch.add, entropies), functools.reduce(torch.add, grads)
