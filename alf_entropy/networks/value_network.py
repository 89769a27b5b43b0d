"""``ValueNetwork``: observation -> scalar state value (ALF's name).

An ``EncodingNetwork`` with a one-unit output layer initialised with
orthogonal gain 1.0 (the PPO standard for value heads).
"""

from typing import Any, Sequence

import torch
import torch.nn as nn

from alf_entropy.networks.encoding_network import (
    ActivationArg,
    EncodingNetwork,
    flat_input_size,
    flatten_observation,
)

__all__ = ["ValueNetwork"]

VALUE_INIT_SCALE = 1.0
"""Orthogonal gain of the value output layer."""


class ValueNetwork(nn.Module):
    """Critic network ``V(observation)``.

    Args:
        input_tensor_spec: observation ``TensorSpec`` (or a nest of them;
            leaves are flattened and concatenated).
        fc_layer_params: hidden layer sizes.
        activation: hidden activation (class, factory or name).

    Raises:
        TypeError: if a spec leaf is not a ``TensorSpec``.
        ValueError: for invalid layer sizes or an unknown activation name.
    """

    def __init__(
        self,
        input_tensor_spec: Any,
        fc_layer_params: Sequence[int] = (64, 64),
        activation: ActivationArg = nn.Tanh,
    ):
        super().__init__()
        self._input_tensor_spec = input_tensor_spec
        self._encoder = EncodingNetwork(
            flat_input_size(input_tensor_spec),
            fc_layer_params=fc_layer_params,
            activation=activation,
            last_layer_size=1,
            last_layer_init_scale=VALUE_INIT_SCALE,
        )

    def forward(self, observation: Any) -> torch.Tensor:
        """Compute state values.

        Args:
            observation: tensor ``[B, *obs_shape]`` (or nest matching
                ``input_tensor_spec``).

        Returns:
            Float tensor ``[B]``.

        Raises:
            ValueError: if the observation does not match the spec.
        """
        x = flatten_observation(observation, self._input_tensor_spec, self._encoder.dtype)
        return self._encoder(x).squeeze(-1)
