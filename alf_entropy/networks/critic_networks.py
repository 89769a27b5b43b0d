"""``CriticNetworks``: ``n`` independent Q networks evaluated as one batched module.

SAC keeps two critics (and their target copies).  Evaluating them as two
``nn.Sequential`` costs two sets of small matmuls and their Python overhead;
here the ``n`` MLPs' weights are stacked (``[n, in, out]``) and every layer is
one batched matrix product over all critics at once, with the same values as ``n``
separate ``nn.Linear`` stacks (each critic is initialised like ``nn.Linear``).

* Continuous actions: ``Q(observation, action)``, the flattened observation
  concatenated with the action, gives ``[n, B]``.
* Discrete actions: ``Q(observation)`` for every action gives ``[n, B, A]``
  (the action is not an input, as in discrete SAC).

``forward(..., detach_params=True)`` evaluates with detached weights: SAC's
actor loss differentiates ``Q(s, a(s))`` with respect to the action only,
without sending gradients into the critics.

With ReLU (the default) and ``ALF_ENTROPY_ACCEL`` not ``0``, the gradients
come from a hand-written backward (:func:`alf_entropy.accel.relu_mlp`): the
values of autograd's, with fewer graph nodes and allocations.  It refuses
double backward; ``fused_backward=False`` (or ``ALF_ENTROPY_ACCEL=0``) is
plain autograd.  Under ``no_grad``, ``torch.compile``, JIT tracing,
``torch.func`` transforms (``grad``, ``vmap``) and autocast the forward is
plain ops.

:class:`StackedCritics` holds the critics of K agents (K ``CriticNetworks`` of
one shape) as one module on inputs ``[K, B, ...]``: every layer is one
batched product over the ``K * n`` critics.
"""

import math
from typing import Any, Optional, Sequence

import torch
import torch.nn as nn

from alf_entropy import accel
from alf_entropy.networks.encoding_network import (
    ActivationArg,
    flat_input_size,
    flatten_observation,
    get_activation,
)
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils import nest
from alf_entropy.utils.checks import check_int

__all__ = ["CriticNetworks", "StackedCritics"]


class CriticNetworks(nn.Module):
    """``num_critics`` Q networks with stacked weights (see the module docstring).

    Args:
        input_tensor_spec: the observation spec (nest; leaves are flattened).
        action_spec: a single ``BoundedTensorSpec``: float for ``Q(s, a)``,
            integer (scalar, ``minimum`` 0) for ``Q(s, .)`` over all actions.
        fc_layer_params: hidden layer sizes.
        activation: hidden activation (class, factory or name).
        num_critics: how many independent critics (2 for SAC's twin Q).
        fused_backward: with ReLU, use the hand-written backward of
            :func:`alf_entropy.accel.relu_mlp` (faster; no double backward).
            False: plain autograd.

    Raises:
        TypeError: if ``action_spec`` is not a single ``BoundedTensorSpec``.
        ValueError: for a non-scalar discrete spec, ``num_critics < 1`` or
            non-positive layer sizes.

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
        >>> box = BoundedTensorSpec((1,), torch.float32, -2.0, 2.0)
        >>> CriticNetworks(TensorSpec((3,)), box)(torch.randn(5, 3), torch.randn(5, 1)).shape
        torch.Size([2, 5])
        >>> two_actions = BoundedTensorSpec((), torch.int64, 0, 1)
        >>> CriticNetworks(TensorSpec((4,)), two_actions)(torch.randn(5, 4)).shape
        torch.Size([2, 5, 2])
    """

    def __init__(
        self,
        input_tensor_spec: Any,
        action_spec: BoundedTensorSpec,
        fc_layer_params: Sequence[int] = (256, 256),
        activation: ActivationArg = nn.ReLU,
        num_critics: int = 2,
        fused_backward: bool = True,
    ):
        super().__init__()
        if not isinstance(action_spec, BoundedTensorSpec):
            raise TypeError(
                "CriticNetworks: action_spec must be a single BoundedTensorSpec, got "
                f"{type(action_spec).__name__}"
            )
        check_int("num_critics", num_critics, 1)
        sizes = [check_int("fc_layer_params", size, 1) for size in fc_layer_params]
        self._input_tensor_spec = input_tensor_spec
        self._discrete = action_spec.is_discrete
        obs_size = flat_input_size(input_tensor_spec)
        if self._discrete:
            if action_spec.shape != ():
                raise ValueError(
                    "CriticNetworks: a discrete action_spec must be scalar, got shape "
                    f"{action_spec.shape}"
                )
            in_size, out_size = obs_size, action_spec.num_actions
        else:
            in_size, out_size = obs_size + action_spec.numel, 1
        self._num_critics = num_critics
        self._activation = get_activation(activation)
        # ReLU in place on the fresh matmul output: one allocation less per layer.
        self._act = torch.relu_ if isinstance(self._activation, nn.ReLU) else self._activation
        self._fused = bool(fused_backward) and self._act is torch.relu_
        dims = [in_size] + sizes + [out_size]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(dims[:-1], dims[1:]):
            # nn.Linear's default initialisation, drawn per critic.
            bound = 1.0 / math.sqrt(fan_in)
            self.weights.append(
                nn.Parameter(torch.empty(num_critics, fan_in, fan_out).uniform_(-bound, bound))
            )
            self.biases.append(
                nn.Parameter(torch.empty(num_critics, 1, fan_out).uniform_(-bound, bound))
            )

    @property
    def num_critics(self) -> int:
        """How many critics are stacked."""
        return self._num_critics

    def forward(
        self, observation: Any, action: Optional[torch.Tensor] = None, detach_params: bool = False
    ) -> torch.Tensor:
        """Evaluate every critic.

        Args:
            observation: ``[B, *obs_shape]`` (or a nest matching the spec).
            action: ``[B, *action_shape]`` for continuous critics; ignored
                (may be ``None``) for discrete ones.
            detach_params: use detached weights (gradients reach the inputs
                only).

        Returns:
            torch.Tensor: ``[n, B]`` for continuous, ``[n, B, A]`` for
            discrete actions.
        """
        out = _evaluate(self, _inputs(self, observation, action), _params(self, detach_params))
        return out if self._discrete else out.squeeze(-1)


class StackedCritics(nn.Module):
    """K agents' ``CriticNetworks`` (one shape) as one module on inputs ``[K, B, ...]``.

    Parameters keep the critics' names (``weights.i``, ``biases.i``) with a
    leading ``K`` (``[K, n, in, out]``): agent ``k``'s are at index ``k``.
    Member ``k`` computes what critic ``k`` computes (the same batched matrix
    products, and the critics' hand-written backward where they have it);
    nothing mixes members.

    Args:
        critics: the K critics; their current values are copied.

    Raises:
        ValueError: if ``critics`` is empty or their shapes differ.
        TypeError: if an element is not a ``CriticNetworks``.
    """

    def __init__(self, critics: Sequence[CriticNetworks]):
        super().__init__()
        critics = list(critics)
        if not critics:
            raise ValueError("critics must hold at least one CriticNetworks")
        if not all(type(c) is CriticNetworks for c in critics):
            raise TypeError("critics must be CriticNetworks instances")
        first = critics[0]
        signatures = {
            (c._discrete, type(c._activation), *(p.shape for p in c.parameters())) for c in critics
        }
        if len(signatures) != 1:
            raise ValueError("critics must all have the same shapes and activation")
        self.num_members = len(critics)
        self._input_tensor_spec, self._discrete = first._input_tensor_spec, first._discrete
        self._num_critics, self._act, self._fused = first._num_critics, first._act, first._fused
        # Layer i's tensor of every critic, stacked (torch.stack copies: nothing is shared).
        self.weights = nn.ParameterList(
            nn.Parameter(torch.stack(ws).detach()) for ws in zip(*(c.weights for c in critics))
        )
        self.biases = nn.ParameterList(
            nn.Parameter(torch.stack(bs).detach()) for bs in zip(*(c.biases for c in critics))
        )

    def forward(
        self, observation: Any, action: Optional[torch.Tensor] = None, detach_params: bool = False
    ) -> torch.Tensor:
        """Evaluate every agent's critics on its own rows.

        Args:
            observation: ``[K, B, *obs_shape]`` (or a nest of such leaves).
            action: ``[K, B, *action_shape]`` for continuous critics; ignored
                for discrete ones.
            detach_params: use detached weights (gradients reach the inputs only).

        Returns:
            torch.Tensor: ``[n, K, B]`` for continuous, ``[n, K, B, A]`` for
            discrete actions (critic first, as ``CriticNetworks``').
        """
        k, n = self.num_members, self._num_critics
        rows = nest.map_structure(lambda o: o.reshape(-1, *o.shape[2:]), observation)
        x = _inputs(self, rows, action)
        b = x.shape[0] // k
        x = x.reshape(k, 1, b, -1).expand(k, n, b, x.shape[-1]).reshape(k * n, b, -1)
        params = [p.reshape(k * n, *p.shape[2:]) for p in _params(self, detach_params)]
        out = _evaluate(self, x, params).reshape(k, n, b, -1).transpose(0, 1)
        return out if self._discrete else out.squeeze(-1)


def _inputs(critics, observation, action):
    """The critics' input rows: the flattened observation, and the action if continuous."""
    x = flatten_observation(observation, critics._input_tensor_spec, critics.weights[0].dtype)
    if critics._discrete:
        return x
    return torch.cat([x, action.reshape(x.shape[0], -1).to(x.dtype)], dim=-1)


def _params(critics, detach):
    """The critics' weights and biases, alternating (detached if ``detach``)."""
    params = [p for wb in zip(critics.weights, critics.biases) for p in wb]
    return [p.detach() for p in params] if detach else params


def _evaluate(critics, x, params):
    """The stacked MLP's output ``[n, B, out]``: the hand-written backward where it
    applies (see :func:`alf_entropy.accel.relu_mlp`), else plain autograd."""
    out = accel.relu_mlp(x, params, _mlp_forward) if critics._fused else None
    return _mlp_forward(x, params, critics._act)[0] if out is None else out


def _mlp_forward(x, params, act):
    """The stacked MLP: ``[B, in]`` (or ``[n, B, in]``) -> ``[n, B, out]``, and its layer inputs.

    ``params`` alternates weights ``[n, in, out]`` and biases ``[n, 1, out]``.
    """
    n = params[0].shape[0]
    h = x if x.dim() == 3 else x.unsqueeze(0).expand(n, *x.shape)  # [n, B, in]: per critic
    inputs = [h]
    for w, b in zip(params[:-2:2], params[1:-2:2]):
        # Not baddbmm(b, h, w): it first writes the broadcast bias into the whole
        # output and the product then re-reads it; for many critics (K agents')
        # the output outgrows the CPU's cache and that costs 10-20 %.
        h = act(torch.bmm(h, w).add_(b))
        inputs.append(h)
    # Batched matmuls with a few output columns take a slow (matrix-vector)
    # path on the CPU; per-critic ones do not.
    # (unbind, not h[k]: the backward of n selects would zero-fill n full-size gradients)
    w, b = params[-2], params[-1]
    out = torch.stack(
        [torch.addmm(bk, hk, wk) for bk, hk, wk in zip(b.unbind(0), h.unbind(0), w.unbind(0))]
    )
    return out, inputs
