"""Projection networks: map an encoding to an action distribution.

Mirrors ALF's ``projection_networks``:

* ``CategoricalProjectionNetwork`` for an integer ``BoundedTensorSpec``:
  ``Categorical(logits)`` over ``maximum - minimum + 1`` choices (wrapped in
  ``Independent`` for a non-scalar spec such as ``MultiDiscrete``).  Samples
  are *indices*; since a sample must be a valid action as is, the spec's
  ``minimum`` must be 0 (a ``ValueError`` says so otherwise).
* ``NormalProjectionNetwork`` for a float spec: ``Independent(Normal(mean,
  std), len(shape))`` (a plain ``Normal`` for a scalar spec), the std being
  either a state-independent parameter or a second head, with ``log_std``
  clamped to ``[min_log_std, max_log_std]``.  With ``squash_to_spec=True`` the
  Normal is followed by ``StableTanh`` and an affine map onto
  ``[minimum, maximum]``, so every sample lies inside the bounds.

Every distribution is created with ``validate_args=False``: argument
validation would read tensors on the host (a GPU sync) at every step.
"""

import math
from typing import Optional, Tuple

import numpy as np
import torch
import torch.distributions as td
import torch.nn as nn
import torch.nn.functional as F

from alf_entropy.networks.distributions import Categorical, StableTanh
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils.checks import check_int

__all__ = ["CategoricalProjectionNetwork", "NormalProjectionNetwork", "POLICY_INIT_SCALE"]

POLICY_INIT_SCALE = 0.01
"""Orthogonal gain of policy output layers (near-uniform initial policy)."""

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_LOG_2 = math.log(2.0)


def _policy_linear(input_size, output_size, bias=0.0):
    layer = nn.Linear(input_size, output_size)
    nn.init.orthogonal_(layer.weight, gain=POLICY_INIT_SCALE)
    nn.init.constant_(layer.bias, bias)
    return layer


class CategoricalProjectionNetwork(nn.Module):
    """Linear layer producing a ``Categorical`` over a discrete action spec.

    Args:
        input_size: size of the encoding fed to the layer.
        action_spec: an integer ``BoundedTensorSpec`` with ``minimum == 0``
            and the same number of choices for every element.

    Raises:
        TypeError: if ``action_spec`` is not a discrete ``BoundedTensorSpec``.
        ValueError: if ``minimum != 0`` or the bounds differ per element.
    """

    def __init__(self, input_size: int, action_spec: BoundedTensorSpec):
        super().__init__()
        check_int("input_size", input_size, 1)
        if not isinstance(action_spec, BoundedTensorSpec) or not action_spec.is_discrete:
            raise TypeError(
                f"action_spec must be an integer BoundedTensorSpec, got {action_spec!r}"
            )
        if np.any(action_spec.minimum != 0):
            raise ValueError(
                "discrete action_spec must have minimum 0 (Categorical samples are "
                f"indices 0..N-1), got minimum={action_spec.minimum.tolist()}; "
                "shift the action space (e.g. gymnasium Discrete(n, start=0))"
            )
        self._num_actions = action_spec.num_actions  # ValueError if bounds differ
        self._shape = action_spec.shape
        numel = action_spec.numel
        self._layer = _policy_linear(input_size, numel * self._num_actions)

    @property
    def linear(self) -> nn.Linear:
        """The layer computing the logits."""
        return self._layer

    @property
    def action_spec_shape(self) -> tuple:
        """The action spec's shape (``()`` for a single choice)."""
        return self._shape

    @property
    def num_actions(self) -> int:
        """Number of choices of each action element."""
        return self._num_actions

    def forward(self, encoding: torch.Tensor) -> td.Distribution:
        """Compute the action distribution.

        Args:
            encoding: float tensor ``[B, input_size]``.

        Returns:
            ``Categorical`` with batch shape ``[B]`` for a scalar spec, else
            ``Independent(Categorical, len(shape))`` with event shape
            ``shape``.
        """
        logits = self._layer(encoding)
        if not self._shape:  # a scalar action: the logits have their shape already
            return Categorical(logits)
        logits = logits.reshape(encoding.shape[:-1] + self._shape + (self._num_actions,))
        return td.Independent(Categorical(logits), len(self._shape), validate_args=False)


class NormalProjectionNetwork(nn.Module):
    """Linear layers producing a (possibly squashed) diagonal Normal.

    Args:
        input_size: size of the encoding fed to the layers.
        action_spec: a float ``BoundedTensorSpec``.
        squash_to_spec: if True, apply ``StableTanh`` then an affine map onto
            ``[minimum, maximum]`` (bounds must be finite and
            ``minimum < maximum``).  Otherwise the mean is unbounded and the
            environment clips actions.
        init_log_std: initial ``log(std)`` (the bias of the std head when
            ``state_dependent_std``).
        state_dependent_std: if True, ``log_std`` is a second head of the
            encoding; otherwise it is a free parameter of shape
            ``action_spec.shape``.
        min_log_std: lower clamp of ``log_std``.
        max_log_std: upper clamp of ``log_std``.

    Raises:
        TypeError: if ``action_spec`` is not a float ``BoundedTensorSpec``.
        ValueError: for ``min_log_std >= max_log_std``, ``init_log_std``
            outside that range, or unusable bounds with ``squash_to_spec``.
    """

    def __init__(
        self,
        input_size: int,
        action_spec: BoundedTensorSpec,
        squash_to_spec: bool = False,
        init_log_std: float = 0.0,
        state_dependent_std: bool = False,
        min_log_std: float = -20.0,
        max_log_std: float = 2.0,
    ):
        super().__init__()
        check_int("input_size", input_size, 1)
        if not isinstance(action_spec, BoundedTensorSpec) or not action_spec.is_continuous:
            raise TypeError(f"action_spec must be a float BoundedTensorSpec, got {action_spec!r}")
        if not min_log_std < max_log_std:
            raise ValueError(
                f"min_log_std must be < max_log_std, got {min_log_std} and {max_log_std}"
            )
        if not min_log_std <= init_log_std <= max_log_std:
            raise ValueError(
                f"init_log_std must be in [min_log_std, max_log_std] = "
                f"[{min_log_std}, {max_log_std}], got {init_log_std}"
            )
        self._shape = action_spec.shape
        numel = action_spec.numel
        self._min_log_std = float(min_log_std)
        self._max_log_std = float(max_log_std)
        self._state_dependent_std = bool(state_dependent_std)
        self._mean_layer = _policy_linear(input_size, numel)
        if self._state_dependent_std:
            self._log_std_layer = _policy_linear(input_size, numel, bias=init_log_std)
        else:
            self.log_std = nn.Parameter(
                torch.full(self._shape, float(init_log_std), dtype=torch.float32)
            )
        self._squash = bool(squash_to_spec)
        if self._squash:
            # (a float spec's bounds are float64 already)
            lo = np.broadcast_to(action_spec.minimum, self._shape)
            hi = np.broadcast_to(action_spec.maximum, self._shape)
            # (NaN and inf fail the comparison; half float32's range keeps (hi - lo) / 2 finite)
            if not np.all(np.abs([lo, hi]) < np.finfo(np.float32).max / 2):
                raise ValueError(
                    "squash_to_spec needs finite action bounds, got minimum="
                    f"{action_spec.minimum.tolist()} maximum={action_spec.maximum.tolist()}"
                )
            if np.any(hi <= lo):
                raise ValueError(
                    "squash_to_spec needs minimum < maximum for every element, got "
                    f"minimum={action_spec.minimum.tolist()} "
                    f"maximum={action_spec.maximum.tolist()}"
                )
            self.register_buffer("_action_loc", torch.as_tensor((hi + lo) / 2, dtype=torch.float32))
            self.register_buffer(
                "_action_scale", torch.as_tensor((hi - lo) / 2, dtype=torch.float32)
            )

    def _mean_and_log_std(self, encoding):
        """The Normal's mean and clamped ``log_std``, ``[B, *action_shape]`` each."""
        out_shape = encoding.shape[:-1] + self._shape
        mean = self._mean_layer(encoding).reshape(out_shape)
        if self._state_dependent_std:
            log_std = self._log_std_layer(encoding).reshape(out_shape)
        else:
            log_std = self.log_std.expand(out_shape)
        return mean, log_std.clamp(self._min_log_std, self._max_log_std)

    def rsample_and_log_prob(
        self, encoding: torch.Tensor, log_prob: bool = True
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """A reparameterised action sample and its log-probability.

        The same distribution as ``forward(encoding)``'s ``rsample`` and
        ``log_prob``, computed in closed form without building
        ``torch.distributions`` objects (SAC does this twice per update, and
        the generic path costs several times more Python).  The squashed
        log-probability uses torch's stable ``log(1 - tanh(u)^2) =
        2 (log 2 - u - softplus(-2u))``.

        Args:
            encoding: float tensor ``[B, input_size]``.
            log_prob: False to skip the log-probability (acting needs none;
                the draw is the same).

        Returns:
            tuple: the action ``[B, *action_shape]`` and its log-probability
            ``[B]`` (summed over the action's elements; None when
            ``log_prob`` is False).
        """
        mean, log_std = self._mean_and_log_std(encoding)
        eps = torch.randn_like(mean)
        u = mean + log_std.exp() * eps
        action = self._action_loc + self._action_scale * torch.tanh(u) if self._squash else u
        if not log_prob:
            return action, None
        lp = -0.5 * eps.square() - log_std - _HALF_LOG_2PI
        if self._squash:
            lp = lp - 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u)) - self._action_scale.log()
        if self._shape:
            lp = lp.flatten(-len(self._shape)).sum(-1)
        return action, lp

    def forward(self, encoding: torch.Tensor) -> td.Distribution:
        """Compute the action distribution.

        Args:
            encoding: float tensor ``[B, input_size]``.

        Returns:
            ``Independent(Normal)`` with batch shape ``[B]`` and event shape
            ``action_spec.shape`` (a plain ``Normal`` for a scalar spec), or
            that distribution transformed by ``[StableTanh, AffineTransform]``
            when ``squash_to_spec``.
        """
        mean, log_std = self._mean_and_log_std(encoding)
        dist = td.Normal(mean, log_std.exp(), validate_args=False)
        event_dims = len(self._shape)
        if event_dims:
            dist = td.Independent(dist, event_dims, validate_args=False)
        if self._squash:
            dist = td.TransformedDistribution(
                dist,
                [
                    StableTanh(cache_size=1),
                    td.AffineTransform(
                        loc=self._action_loc,
                        scale=self._action_scale,
                        event_dim=event_dims,
                        cache_size=1,
                    ),
                ],
                validate_args=False,
            )
        return dist
