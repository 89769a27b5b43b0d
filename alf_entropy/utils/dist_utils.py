"""Entropies of action specs and distributions (ALF's ``alf/utils/dist_utils.py``, its
entropy part).

Spec-level numbers, Python floats computed once at construction:
:func:`calc_default_target_entropy`, :func:`calc_default_max_entropy`,
:func:`calc_max_possible_entropy`, :func:`entropy_per_log_alpha`,
:func:`greedy_probability_target`.  Distribution-level, on the training path
and never reading the device (:mod:`~alf_entropy.utils.dist_entropy`, re-exported here):
:func:`estimated_entropy` (Monte Carlo) and :func:`entropy_with_fallback` (a closed form
where there is one).  A
``BoundedTensorSpec`` element has inclusive bounds ``[m, M]``: a continuous one
is an interval of width ``M - m``, a discrete one has ``N = M - m + 1`` choices.
"""

import math
from typing import Any, List, Optional, Tuple

import numpy as np

from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
from alf_entropy.utils import nest
from alf_entropy.utils.checks import check_int, check_real
from alf_entropy.utils.dist_entropy import entropy_with_fallback, estimated_entropy

__all__ = [
    "greedy_probability_target",
    "entropy_per_log_alpha",
    "calc_default_target_entropy",
    "calc_default_max_entropy",
    "calc_max_possible_entropy",
    "estimated_entropy",
    "entropy_with_fallback",
]


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
    """Flat per-element ``(minimum, maximum)`` float64 arrays; None without bounds."""
    if not isinstance(spec, BoundedTensorSpec):
        return None
    lo = np.broadcast_to(np.asarray(spec.minimum, dtype=np.float64), spec.shape)
    hi = np.broadcast_to(np.asarray(spec.maximum, dtype=np.float64), spec.shape)
    return lo.reshape(-1), hi.reshape(-1)


def _check_bounded(spec: TensorSpec, fn_name: str) -> Tuple[np.ndarray, np.ndarray]:
    """Bounds of ``spec``; ValueError if unbounded or a continuous element is degenerate."""
    bounds = _element_bounds(spec)
    if bounds is None or not np.isfinite(bounds).all():
        raise ValueError(
            f"{fn_name}: spec must be a BoundedTensorSpec with finite minimum and "
            f"maximum, got {spec!r}"
        )
    lo, hi = bounds
    if spec.is_continuous and np.any(hi - lo <= 0):
        raise ValueError(
            f"{fn_name}: continuous spec {spec!r} has an element with maximum == "
            "minimum; every distribution over it has entropy -inf"
        )
    return lo, hi


class GreedyProbabilityTarget(float):
    """A float from :func:`greedy_probability_target` that remembers ``num_actions``
    (a controller refuses it for another action spec)."""

    num_actions: int

    def __new__(cls, value: float, num_actions: int) -> "GreedyProbabilityTarget":
        target = super().__new__(cls, value)
        target.num_actions = num_actions
        return target

    def __reduce__(self) -> Tuple[Any, Tuple[float, int]]:
        return GreedyProbabilityTarget, (float(self), self.num_actions)

    def check(self, spec: Any, name: str) -> None:
        """``ValueError`` unless ``spec``'s actions are discrete (``num_actions`` of them if
        it is one scalar action); ``name`` heads the message."""
        leaves = nest.flatten(spec)
        if any(not leaf.is_discrete for leaf in leaves):
            raise ValueError(
                f"{name}: target_entropy is a greedy_probability_target (for "
                f"{self.num_actions} discrete actions), but the action spec has "
                "continuous actions; state a target in nats"
            )
        n = int(leaves[0].maximum.max() - leaves[0].minimum.min()) + 1
        if len(leaves) == 1 and not leaves[0].shape and n != self.num_actions:
            raise ValueError(
                f"{name}: target_entropy is a greedy_probability_target for "
                f"{self.num_actions} actions, but the action spec has {n}"
            )


def greedy_probability_target(p: float, num_actions: int) -> GreedyProbabilityTarget:
    r"""The entropy of a policy that picks its greedy action with probability ``p``
    (``p`` in ``[1/N, 1]``), the other ``N - 1 >= 1`` actions sharing ``1 - p`` evenly:
    :math:`-p \log p - (1 - p) \log\frac{1 - p}{N - 1}` nats.

    A target users can state ("act greedily 80% of the time"); in gin:
    ``target_entropy = @greedy_probability_target()`` with ``.p`` and ``.num_actions``.
    """
    n = check_int("num_actions", num_actions, minimum=2)
    p = check_real("p", p)
    if not 1.0 / n <= p <= 1.0:
        raise ValueError(f"p must be in [1/num_actions, 1] = [{1.0 / n:.4g}, 1], got {p!r}")
    rest = 1.0 - p
    h = -p * math.log(p) if p > 0 else 0.0
    return GreedyProbabilityTarget(h - rest * math.log(rest / (n - 1)) if rest > 0 else h, n)


def entropy_per_log_alpha(spec: Any) -> float:
    """How much the entropy of ``spec``'s policies moves per unit of ``log_alpha``: 0.5 per
    continuous element (a Gaussian's std grows as ``sqrt(alpha)``), ``0.5 log N`` per
    discrete one, summed (> 0; it scales the PID controller's error)."""
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


def calc_default_target_entropy(spec: Any, min_prob: float = 0.1) -> float:
    r"""ALF's default target entropy: a policy "mostly decided" with ``p = min_prob``
    in ``(0, 1)``, summed over the elements and the nest of a bounded ``spec``.

    A continuous element on ``[m, M]`` spreads uniformly over a width
    ``p (M - m)``: :math:`\log(M - m) + \log p` (``[0, 3]``, 0.1: -1.204).  A
    discrete one gives :math:`1 - p` to one action and shares ``p`` among the
    other ``N - 1``: :math:`p(\log(N-1) - \log p) - (1-p)\log(1-p)` (0 for
    ``N = 1``; ``N = 4``, 0.1: 0.435).
    """
    min_prob = check_real("min_prob", min_prob, above=0.0, below=1.0)
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


def calc_default_max_entropy(spec: Any, fraction: float = 0.8) -> float:
    r"""ALF's default maximum entropy: slightly below the uniform distribution's, per
    element ``fraction * log N`` (discrete), ``fraction * log(M - m)`` (continuous,
    width > 1) or ``log(M - m) / fraction`` (width <= 1: the bound is negative),
    ``fraction`` in ``(0, 1]``; summed over the elements and the nest."""
    fraction = check_real("fraction", fraction, above=0.0, maximum=1.0)
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
    r"""The largest entropy any distribution over ``spec`` can have (controllers refuse
    targets above it): the uniform one's, ``log N`` or ``log(M - m)`` per element,
    summed; ``+inf`` without finite bounds, ``-inf`` if a continuous element has
    zero width (which wins)."""
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
