"""Entropy helpers for action distributions and action specs.

This module mirrors the entropy-related part of ALF's ``alf/utils/dist_utils.py``:

* Spec-level numbers used to configure an entropy controller:
  :func:`calc_default_target_entropy` (the entropy of a "mostly decided"
  policy), :func:`calc_default_max_entropy` (a cap close to the uniform
  entropy) and :func:`calc_max_possible_entropy` (the exact upper bound, used
  to reject unreachable targets).  They run once at construction time and
  return Python floats.
* Distribution-level estimates used on the training path:
  :func:`estimated_entropy` (Monte-Carlo estimate for distributions without a
  closed form) and :func:`entropy_with_fallback` (closed form when torch has
  one, the affine change-of-variables shortcut for affinely transformed
  distributions, sampling otherwise).  They never move data from the device
  to the host (no ``.item()`` and no Python branching on tensor values).

Terminology: for a ``BoundedTensorSpec`` every element ``i`` has inclusive
bounds ``[m_i, M_i]``.  A continuous element is an interval of width
``M_i - m_i``; a discrete element has ``N_i = M_i - m_i + 1`` choices.
"""
import functools
import math
from typing import Any, Callable, List, Optional, Tuple

import gin
import numpy as np
import torch
import torch.distributions as td

from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
from alf_entropy.utils import nest
from alf_entropy.utils.checks import check_int, check_real

__all__ = [
    "greedy_probability_target",
    "entropy_per_log_alpha",
    "calc_default_target_entropy",
    "calc_default_max_entropy",
    "calc_max_possible_entropy",
    "estimated_entropy",
    "entropy_with_fallback",
]


# --------------------------------------------------------------------------
# Spec-level entropy numbers
# --------------------------------------------------------------------------


def _spec_leaves(spec: Any, fn_name: str) -> List[TensorSpec]:
    """Flatten ``spec`` and check every leaf is a ``TensorSpec``."""
    if spec is None:
        raise TypeError(f"{fn_name}: spec must be a TensorSpec or a nest of them, got None")
    leaves = nest.flatten(spec)
    if not leaves:
        raise ValueError(
            f"{fn_name}: spec is an empty nest; it must contain at least one TensorSpec"
        )
    for leaf in leaves:
        if not isinstance(leaf, TensorSpec):
            raise TypeError(
                f"{fn_name}: spec must be a TensorSpec or a nest of them, found a "
                f"leaf of type {type(leaf).__name__}: {leaf!r}"
            )
    return leaves


def _element_bounds(spec: TensorSpec) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """Per-element ``(minimum, maximum)`` float64 arrays of ``spec``'s shape.

    Returns ``None`` for a spec without bounds (a plain ``TensorSpec``).
    """
    if not isinstance(spec, BoundedTensorSpec):
        return None
    lo = np.broadcast_to(np.asarray(spec.minimum, dtype=np.float64), spec.shape)
    hi = np.broadcast_to(np.asarray(spec.maximum, dtype=np.float64), spec.shape)
    return lo.reshape(-1), hi.reshape(-1)


def _is_unbounded(spec: TensorSpec) -> bool:
    bounds = _element_bounds(spec)
    if bounds is None:
        return True
    lo, hi = bounds
    return bool(np.any(~np.isfinite(lo)) or np.any(~np.isfinite(hi)))


def _check_bounded(spec: TensorSpec, fn_name: str) -> Tuple[np.ndarray, np.ndarray]:
    """Bounds of ``spec``; ValueError if unbounded or a continuous element is degenerate."""
    if _is_unbounded(spec):
        raise ValueError(
            f"{fn_name}: spec must be a BoundedTensorSpec with finite minimum and "
            f"maximum, got {spec!r}"
        )
    lo, hi = _element_bounds(spec)
    if spec.is_continuous and np.any(hi - lo <= 0):
        raise ValueError(
            f"{fn_name}: continuous spec {spec!r} has an element with maximum == "
            f"minimum; every distribution over it has entropy -inf"
        )
    return lo, hi


class GreedyProbabilityTarget(float):
    """A target entropy from :func:`greedy_probability_target`, remembering its ``num_actions``.

    A float in every use; the controllers read ``num_actions`` to refuse it
    for an action spec it was not computed for (a continuous one, or another
    number of actions).
    """

    num_actions: int

    def __new__(cls, value: float, num_actions: int) -> "GreedyProbabilityTarget":
        target = super().__new__(cls, value)
        target.num_actions = num_actions
        return target

    def __reduce__(self) -> Tuple[Any, Tuple[float, int]]:
        return GreedyProbabilityTarget, (float(self), self.num_actions)


@gin.configurable
def greedy_probability_target(p: float, num_actions: int) -> GreedyProbabilityTarget:
    r"""The entropy of a policy that picks its greedy action with probability ``p``.

    The other ``N - 1`` actions share ``1 - p`` evenly:
    :math:`-p \log p - (1 - p) \log\frac{1 - p}{N - 1}`.  A target users can
    state ("act greedily 80% of the time") for a ``Categorical`` policy; in
    gin: ``target_entropy = @greedy_probability_target()`` with
    ``greedy_probability_target.p`` and ``.num_actions`` bound.

    Args:
        p: the greedy action's probability, in ``[1/N, 1]``.
        num_actions: ``N >= 2``.

    Returns:
        The entropy in nats (``log N`` at ``p = 1/N``, 0 at ``p = 1``), a float
        that remembers ``N`` (a controller refuses it for another action spec).

    Raises:
        TypeError: if ``p`` is not a real number.
        ValueError: if ``num_actions < 2`` or ``p`` is outside ``[1/N, 1]``.
    """
    n = check_int("num_actions", num_actions, minimum=2)
    p = check_real("p", p)
    if not 1.0 / n <= p <= 1.0:
        raise ValueError(f"p must be in [1/num_actions, 1] = [{1.0 / n:.4g}, 1], got {p!r}")
    rest = 1.0 - p
    h = -p * math.log(p) if p > 0 else 0.0
    return GreedyProbabilityTarget(h - rest * math.log(rest / (n - 1)) if rest > 0 else h, n)


def entropy_per_log_alpha(spec: Any) -> float:
    """How much the entropy of ``spec``'s policies moves per unit of ``log_alpha``.

    A Boltzmann-like policy's nominal sensitivity: ``0.5`` per continuous
    element (a Gaussian's std grows as ``sqrt(alpha)``), ``0.5 log N`` per
    discrete element with ``N`` actions, summed over the elements and the
    nest.  It scales the PID controller's error and the windup watch.

    Args:
        spec: a ``BoundedTensorSpec`` or a nest of them.

    Returns:
        The sensitivity (> 0).

    Raises:
        ValueError: if no element of the spec admits any entropy.
    """
    scale = 0.0
    for leaf in _spec_leaves(spec, "entropy_per_log_alpha"):
        if leaf.is_continuous or not isinstance(leaf, BoundedTensorSpec):
            scale += 0.5 * leaf.numel
        else:
            lo, hi = _element_bounds(leaf)
            scale += float(np.sum(0.5 * np.log(np.maximum(hi - lo + 1, 1))))
    if scale <= 0:
        raise ValueError(f"entropy_per_log_alpha: spec {spec!r} admits no entropy to control")
    return scale


@gin.configurable
def calc_default_target_entropy(spec: Any, min_prob: float = 0.1) -> float:
    r"""Default target entropy for an action spec (ALF's formula).

    The target describes a policy that is "mostly decided" but keeps
    exploring, with ``p = min_prob``:

    * Continuous element on ``[m, M]``: the probability mass concentrates
      uniformly on a sub-interval of width ``p * (M - m)``, whose entropy is
      :math:`\log(M - m) + \log p`.  E.g. ``[0, 3]`` with ``p = 0.1`` gives
      :math:`\log 3 + \log 0.1 \approx -1.204`.
    * Discrete element with :math:`N = M - m + 1` choices: the peak action gets
      probability :math:`1 - p` and the remaining :math:`N - 1` actions share
      :math:`p` uniformly, so the entropy is
      :math:`-(1-p)\log(1-p) - (N-1)\frac{p}{N-1}\log\frac{p}{N-1}
      = p(\log(N-1) - \log p) - (1-p)\log(1-p)`, and 0 when :math:`N = 1`.
      E.g. ``N = 4``, ``p = 0.1`` gives :math:`\approx 0.435`.

    Elements are independent, so the entropies add: the result is summed over
    the elements of each spec (bounds may differ per element) and over the
    leaves of a nest.

    Args:
        spec: a ``BoundedTensorSpec`` or a nest (dict/tuple/list/namedtuple)
            of them.
        min_prob: the probability ``p`` described above, in the open interval
            ``(0, 1)``.

    Returns:
        The target entropy as a Python float.

    Raises:
        ValueError: if ``min_prob`` is not in ``(0, 1)``, if a spec is
            unbounded (a plain ``TensorSpec`` or infinite bounds), if a
            continuous element has zero width, or if the nest is empty.
        TypeError: if ``spec`` (or a leaf of it) is not a ``TensorSpec``.
    """
    min_prob = float(min_prob)
    if not 0.0 < min_prob < 1.0:
        raise ValueError(f"calc_default_target_entropy: min_prob must be in (0, 1), got {min_prob}")
    log_p = math.log(min_prob)
    total = 0.0
    for leaf in _spec_leaves(spec, "calc_default_target_entropy"):
        lo, hi = _check_bounded(leaf, "calc_default_target_entropy")
        if leaf.is_continuous:
            total += float(np.sum(np.log(hi - lo) + log_p))
        else:
            n = hi - lo + 1
            rest = np.maximum(n - 1, 1)  # avoid log(0); N == 1 is masked below
            ent = min_prob * (np.log(rest) - log_p) - (1.0 - min_prob) * math.log1p(-min_prob)
            total += float(np.sum(np.where(n > 1, ent, 0.0)))
    return total


@gin.configurable
def calc_default_max_entropy(spec: Any, fraction: float = 0.8) -> float:
    r"""Default maximum entropy: a fraction of the uniform-distribution entropy.

    Follows ALF's ``calc_default_max_entropy``.  The uniform distribution has
    the largest entropy over a bounded element, :math:`\log N` for a discrete
    element with ``N`` choices and :math:`\log(M - m)` for a continuous
    element on ``[m, M]``.  The default cap is ``fraction`` of that bound, i.e.
    a value slightly *below* it:

    * discrete: :math:`\text{fraction} \cdot \log N`;
    * continuous with :math:`M - m > 1` (positive bound):
      :math:`\text{fraction} \cdot \log(M - m)`;
    * continuous with :math:`M - m \le 1` (bound :math:`\le 0`):
      :math:`\log(M - m) / \text{fraction}`, which is again below the bound
      because scaling a negative number down would move it *above*.

    Summed over the elements of each spec and the leaves of a nest.

    Args:
        spec: a ``BoundedTensorSpec`` or a nest of them.
        fraction: the fraction in ``(0, 1]``.

    Returns:
        The default maximum entropy as a Python float.

    Raises:
        ValueError: if ``fraction`` is not in ``(0, 1]``, if a spec is
            unbounded, if a continuous element has zero width, or if the nest
            is empty.
        TypeError: if ``spec`` (or a leaf of it) is not a ``TensorSpec``.
    """
    fraction = float(fraction)
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"calc_default_max_entropy: fraction must be in (0, 1], got {fraction}")
    total = 0.0
    for leaf in _spec_leaves(spec, "calc_default_max_entropy"):
        lo, hi = _check_bounded(leaf, "calc_default_max_entropy")
        if leaf.is_continuous:
            width = hi - lo
            total += float(np.sum(np.log(width) * np.where(width > 1, fraction, 1.0 / fraction)))
        else:
            total += float(np.sum(np.log(hi - lo + 1) * fraction))
    return total


def calc_max_possible_entropy(spec: Any) -> float:
    r"""The largest entropy any distribution over ``spec`` can have.

    Per element the maximum is reached by the uniform distribution:
    :math:`\log N` for a discrete element with ``N`` choices and
    :math:`\log(M - m)` for a continuous element on ``[m, M]``.  A continuous
    element without finite bounds admits arbitrarily large (differential)
    entropy, so the bound is ``+inf``; the same holds for a discrete spec
    without bounds (a plain ``TensorSpec``).  A continuous element of zero
    width admits no density, so the bound is ``-inf`` (and this wins over any
    ``+inf`` of other elements).  Summed over elements and nest leaves.

    An entropy controller can compare a requested target with this value to
    reject targets that no policy could reach.

    Args:
        spec: a ``TensorSpec``/``BoundedTensorSpec`` or a nest of them.

    Returns:
        The upper bound as a Python float (possibly ``inf`` or ``-inf``).

    Raises:
        ValueError: if the nest is empty.
        TypeError: if ``spec`` (or a leaf of it) is not a ``TensorSpec``.
    """
    parts = []
    for leaf in _spec_leaves(spec, "calc_max_possible_entropy"):
        bounds = _element_bounds(leaf)
        if bounds is None:
            parts.append(math.inf)
            continue
        lo, hi = bounds
        if leaf.is_continuous:
            with np.errstate(divide="ignore", invalid="ignore"):
                per_elem = np.where(np.isfinite(lo) & np.isfinite(hi), np.log(hi - lo), np.inf)
        else:
            per_elem = np.log(hi - lo + 1)
        parts.extend(per_elem.tolist())
    if any(p == -math.inf for p in parts):
        return -math.inf
    return float(math.fsum(parts)) if all(math.isfinite(p) for p in parts) else math.inf


# --------------------------------------------------------------------------
# Distribution-level entropy
# --------------------------------------------------------------------------


@gin.configurable
def estimated_entropy(
    dist: td.Distribution, num_samples: int = 1, check_numerics: bool = False
) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Monte-Carlo estimate of the entropy of ``dist``.

    With samples :math:`x_j \sim p_\theta`, :math:`-\frac{1}{n}\sum_j \log
    p_\theta(x_j)` is an unbiased estimate of :math:`H(p_\theta) =
    -E_{x\sim p_\theta}[\log p_\theta(x)]`.  Its gradient, however, depends on
    how the samples were drawn, so a second tensor, ``entropy_for_gradient``,
    is returned whose *gradient* is an unbiased estimate of
    :math:`\nabla_\theta H`:

    * Reparameterizable ``dist`` (``dist.has_rsample`` and floating samples):
      :math:`x = g_\theta(\epsilon)` and
      :math:`\nabla_\theta E_\epsilon[-\log p_\theta(g_\theta(\epsilon))]`
      is estimated by differentiating through the sample, so
      ``entropy_for_gradient = entropy = -log_prob(rsample())``.  (The direct
      score term :math:`E[\nabla_\theta \log p_\theta(x)]` is zero.)
    * Otherwise the samples are constants and the score-function identity
      gives :math:`\nabla_\theta H = -E[\log p_\theta(x)\,\nabla_\theta \log
      p_\theta(x)] = \nabla_\theta E[-\tfrac{1}{2}(\log p_\theta(x))^2]`
      with :math:`x` held fixed, hence the surrogate
      ``entropy_for_gradient = -0.5 * log_prob(x.detach())**2``.  Its value is
      *not* the entropy; only its gradient is meaningful.

    Args:
        dist: the distribution, with any ``batch_shape``.
        num_samples: number of samples averaged per batch element (>= 1).
        check_numerics: if True, raise when the estimate contains NaN/Inf.
            This reads a flag from the device (a GPU sync); use it for
            debugging only.

    Returns:
        ``(entropy, entropy_for_gradient)``, both of shape ``dist.batch_shape``.

    Raises:
        TypeError: if ``dist`` is not a ``torch.distributions.Distribution``.
        ValueError: if ``num_samples < 1``, or, with ``check_numerics``, if the
            estimate is not finite.
    """
    if not isinstance(dist, td.Distribution):
        raise TypeError(
            f"estimated_entropy: dist must be a torch.distributions.Distribution, "
            f"got {type(dist).__name__}"
        )
    check_int("num_samples", num_samples, minimum=1)
    sample_shape = torch.Size([num_samples])
    if dist.has_rsample:
        x = dist.rsample(sample_shape)
    else:
        x = dist.sample(sample_shape)
    if dist.has_rsample and x.dtype.is_floating_point:
        neg_log_prob = -dist.log_prob(x)
        entropy = neg_log_prob.mean(dim=0)
        entropy_for_gradient = entropy
    else:
        neg_log_prob = -dist.log_prob(x.detach())
        entropy = neg_log_prob.mean(dim=0)
        entropy_for_gradient = (-0.5 * neg_log_prob.square()).mean(dim=0)
    if check_numerics and not bool(torch.isfinite(neg_log_prob).all()):
        raise ValueError(f"estimated_entropy: non-finite entropy estimate for {dist!r}")
    return entropy, entropy_for_gradient


def _affine_parts(transform: td.Transform) -> Optional[List[td.AffineTransform]]:
    """The ``AffineTransform`` s making up ``transform``, or None if any part is not affine."""
    if isinstance(transform, td.AffineTransform):
        return [transform]
    if isinstance(transform, td.ComposeTransform):
        parts = []
        for part in transform.parts:
            sub = _affine_parts(part)
            if sub is None:
                return None
            parts.extend(sub)
        return parts
    return None


def _sum_rightmost(x: torch.Tensor, ndims: int) -> torch.Tensor:
    return x.sum(dim=tuple(range(-ndims, 0))) if ndims > 0 else x


def _analytic_entropy(dist: td.Distribution) -> Optional[torch.Tensor]:
    """Closed-form entropy of shape ``dist.batch_shape``, or None if unavailable.

    Handles ``Independent`` and all-affine ``TransformedDistribution``
    recursively; anything else uses ``dist.entropy()`` when torch implements it.
    """
    if isinstance(dist, td.Independent):
        base = _analytic_entropy(dist.base_dist)
        if base is None:
            return None
        return _sum_rightmost(base, dist.reinterpreted_batch_ndims)
    if isinstance(dist, td.TransformedDistribution):
        affines = []
        for t in dist.transforms:
            parts = _affine_parts(t)
            if parts is None:
                return None
            affines.extend(parts)
        base = _analytic_entropy(dist.base_dist)
        if base is None:
            return None
        # Change of variables y = f(x): H(Y) = H(X) + E[log|det J_f(x)|]; for an
        # element-wise affine f the Jacobian is constant, prod(|scale|) over
        # the event elements of the transformed distribution.
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
    if entropy is None:
        return estimated_entropy(dist)
    return entropy, entropy


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
    if (
        k < 0
        or k > len(dist.batch_shape)
        or full_shape[len(full_shape) - len(spec_shape):] != spec_shape
    ):
        raise ValueError(
            f"entropy_with_fallback: distribution{where} with batch_shape "
            f"{tuple(dist.batch_shape)} and event_shape {tuple(dist.event_shape)} does not "
            f"end with the action_spec shape {spec_shape}"
        )
    return tuple(_sum_rightmost(e, k) for e in entropies)


def entropy_with_fallback(
    distributions: Any, return_sum: bool = True, action_spec: Any = None
) -> Tuple[Any, Any]:
    r"""Entropy of a nest of distributions, using a closed form when possible.

    For every leaf distribution:

    1. If torch implements ``entropy()`` (``Categorical``, ``Normal``,
       ``Beta``, ``Independent`` of those, ...) the closed form is used and
       ``entropy_for_gradient = entropy``.
    2. For a ``TransformedDistribution`` whose transforms are all
       ``AffineTransform`` (possibly inside ``ComposeTransform``) over a base
       with a closed form, the change-of-variables formula
       :math:`H(a + bX) = H(X) + \sum_{\text{event}} \log|b|` is exact; the
       :math:`\log|b|` terms are broadcast to ``batch_shape + event_shape``
       and summed over the event dims of the transformed distribution.
    3. Otherwise (e.g. a tanh-squashed Normal,
       ``TransformedDistribution(Independent(Normal), [TanhTransform(),
       AffineTransform(...)])``) the entropy is estimated by sampling with
       :func:`estimated_entropy` (one sample).  Build ``TanhTransform`` with
       ``cache_size=1`` so the log-density of a sample does not go through
       ``atanh`` of a rounded value.

    Each leaf result has the leaf's ``batch_shape``.  If ``action_spec`` is
    given, per-element results are additionally summed over the dims of the
    spec's shape that the distribution treats as batch dims (e.g. a ``Normal``
    with batch_shape ``[B, D]`` for a spec of shape ``(D,)`` gives ``[B]``).

    Args:
        distributions: a ``torch.distributions.Distribution`` or a nest of them.
        return_sum: if True, return the sum over the nest (all leaf results
            must then have the same shape); otherwise return nests with the
            structure of ``distributions``.
        action_spec: optional nest of ``TensorSpec`` with the structure of
            ``distributions``; see above.

    Returns:
        ``(entropy, entropy_for_gradient)``: use ``entropy`` for its value and
        ``entropy_for_gradient`` to back-propagate (for sampled estimates of
        non-reparameterizable distributions its value is a surrogate).

    Raises:
        TypeError: if a leaf is not a ``Distribution`` or a spec leaf is not a
            ``TensorSpec``.
        ValueError: if the nest is empty, if ``action_spec`` has a different
            structure or a shape the distribution does not end with, or if
            ``return_sum`` is True and leaf results differ in shape.
    """
    if isinstance(distributions, td.Distribution) and (
        action_spec is None or isinstance(action_spec, TensorSpec)
    ):
        # A single distribution (the common case): no nest walking; the
        # sums below would return its results unchanged.
        results = _leaf_entropy(distributions)
        if action_spec is not None:
            results = _reduce_to_spec("", distributions, action_spec, results)
        return results[0], results[1]
    flat_paths = nest.flatten_with_path(distributions)
    if not flat_paths:
        raise ValueError(
            "entropy_with_fallback: distributions must contain at least one Distribution"
        )
    for path, dist in flat_paths:
        if not isinstance(dist, td.Distribution):
            where = f" at '{path}'" if path else ""
            raise TypeError(
                f"entropy_with_fallback: leaves must be torch.distributions.Distribution, "
                f"got {type(dist).__name__}{where}"
            )
    results = [_leaf_entropy(d) for _, d in flat_paths]
    if action_spec is not None:
        nest.assert_same_structure(distributions, action_spec)
        specs = nest.flatten(action_spec)
        results = [
            _reduce_to_spec(path, dist, spec, res)
            for (path, dist), spec, res in zip(flat_paths, specs, results)
        ]
    entropies = [r[0] for r in results]
    grads = [r[1] for r in results]
    if not return_sum:
        return (
            nest.pack_sequence_as(distributions, entropies),
            nest.pack_sequence_as(distributions, grads),
        )
    shapes = {tuple(e.shape) for e in entropies}
    if len(shapes) > 1:
        detail = ", ".join(f"'{p}': {tuple(e.shape)}" for (p, _), e in zip(flat_paths, entropies))
        raise ValueError(
            f"entropy_with_fallback: cannot sum entropies of different shapes ({detail}); "
            f"pass action_spec to reduce them or use return_sum=False"
        )
    add: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.add
    return functools.reduce(add, entropies), functools.reduce(add, grads)
