"""``EncodingNetwork``: the fully connected torso shared by actor and critic.

A stack of ``Linear`` + activation layers with PPO-standard orthogonal
initialisation (gain ``sqrt(2)`` for hidden layers, zero biases) and an
optional last layer whose orthogonal gain is chosen by the caller (``0.01``
for a policy head, ``1.0`` for a value head).  ``MLP`` is an alias.

Activations may be given as a module class/factory (``torch.nn.Tanh``) or as
a name (``"tanh"``, ``"relu"``, ...), so a gin file can say
``EncodingNetwork.activation = "relu"`` without registering torch classes.

This module also holds the helpers that turn a (nest of) observation
tensor(s) ``[B, ...]`` into one flat ``[B, N]`` float input.
"""

import math
from typing import Any, Callable, Optional, Sequence, Union

import torch
import torch.nn as nn

from alf_entropy.tensor_specs import TensorSpec
from alf_entropy.utils import nest
from alf_entropy.utils.checks import check_choice, check_int, check_real

__all__ = [
    "EncodingNetwork",
    "MLP",
    "ActivationArg",
    "get_activation",
    "flat_input_size",
    "flatten_observation",
]

ActivationArg = Optional[Union[str, Callable[[], nn.Module]]]

_ACTIVATIONS = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "leaky_relu": nn.LeakyReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "sigmoid": nn.Sigmoid,
    "softplus": nn.Softplus,
    "identity": nn.Identity,
}

HIDDEN_INIT_GAIN = math.sqrt(2.0)
"""Orthogonal gain of hidden layers (the PPO/baselines standard)."""


def get_activation(activation: ActivationArg) -> nn.Module:
    """Build an activation module.

    Args:
        activation: ``None`` (identity), a name among ``tanh, relu, elu,
            leaky_relu, gelu, silu, swish, sigmoid, softplus, identity``
            (case-insensitive), an ``nn.Module`` class or any zero-argument
            callable returning an ``nn.Module``.

    Returns:
        A new ``nn.Module`` instance.

    Raises:
        ValueError: if ``activation`` is an unknown name.
        TypeError: if ``activation`` is neither a name nor a module factory.
    """
    if activation is None:
        return nn.Identity()
    if isinstance(activation, str):
        return _ACTIVATIONS[check_choice("activation", activation.lower(), sorted(_ACTIVATIONS))]()
    # A module instance is not a factory: calling it would run its forward.
    factory = callable(activation) and not isinstance(activation, nn.Module)
    module = activation() if factory else None
    if not isinstance(module, nn.Module):
        raise TypeError(
            "activation must be a name or a factory of an nn.Module (e.g. "
            f"torch.nn.Tanh, not torch.nn.Tanh()), got {activation!r}"
        )
    return module


def flat_input_size(input_tensor_spec: Any) -> int:
    """Total number of elements of one (unbatched) sample of a spec nest.

    Args:
        input_tensor_spec: a ``TensorSpec`` or a nest (dict/tuple) of them.

    Returns:
        The size of the flattened, concatenated input.

    Raises:
        TypeError: if a leaf is not a ``TensorSpec``.
        ValueError: if the nest has no leaves.
    """
    leaves = nest.flatten(input_tensor_spec)
    if not leaves:
        raise ValueError("input_tensor_spec must contain at least one TensorSpec")
    for leaf in leaves:
        if not isinstance(leaf, TensorSpec):
            raise TypeError(
                f"input_tensor_spec leaves must be TensorSpec, got {type(leaf).__name__}"
            )
    return sum(leaf.numel for leaf in leaves)


def flatten_observation(
    observation: Any, input_tensor_spec: Any, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Flatten a (nest of) batched observation(s) into one ``[B, N]`` tensor.

    Each leaf ``[B, *spec.shape]`` is reshaped to ``[B, numel]``, cast to
    ``dtype`` (integer observations are used as numbers, not one-hot) and
    the leaves are concatenated in ``nest.flatten`` order.

    Args:
        observation: tensor or nest of tensors matching ``input_tensor_spec``
            with one leading batch dimension.
        input_tensor_spec: the spec nest the observation follows.
        dtype: floating dtype of the result (networks pass their own).

    Returns:
        A ``dtype`` tensor ``[B, flat_input_size(input_tensor_spec)]``.

    Raises:
        ValueError: if the structure or a leaf's shape does not match.
    """
    if isinstance(observation, torch.Tensor) and isinstance(input_tensor_spec, TensorSpec):
        # Fast path (every rollout step): a single spec and a tensor are both
        # leaves, so no nest walking is needed.
        return _flatten_leaf(input_tensor_spec, observation, dtype)
    specs = nest.flatten(input_tensor_spec)
    try:
        nest.assert_same_structure(input_tensor_spec, observation)
    except ValueError as e:
        raise ValueError(f"observation does not match input_tensor_spec: {e}") from e
    obs = nest.flatten(observation)
    flat = [_flatten_leaf(spec, x, dtype) for spec, x in zip(specs, obs)]
    return flat[0] if len(flat) == 1 else torch.cat(flat, dim=-1)


def _flatten_leaf(spec, x, dtype):
    """Check one observation leaf against its spec and flatten it to ``[B, numel]``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"observation leaves must be tensors, got {type(x).__name__}")
    if tuple(x.shape[1:]) != spec.shape or x.dim() != len(spec.shape) + 1:
        raise ValueError(
            f"observation leaf has shape {tuple(x.shape)}, expected [B, *{spec.shape}]"
        )
    return x.reshape(x.shape[0], -1).to(dtype)


def _init_linear(layer, gain):
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)


class EncodingNetwork(nn.Module):
    """Fully connected network with orthogonal initialisation.

    ``input -> [Linear(h) -> activation] for h in fc_layer_params ->
    (Linear(last_layer_size) -> last_activation)``.

    Args:
        input_size: size of the last input dimension.
        fc_layer_params: hidden layer sizes (may be empty).
        activation: hidden activation (see ``get_activation``).
        last_layer_size: size of an optional output layer; ``None`` means the
            network ends with the last hidden layer.
        last_activation: activation after the output layer (``None``: none).
        last_layer_init_scale: orthogonal gain of the output layer; ``None``
            means ``1.0``.  Use ``0.01`` for policy logits/means.

    Raises:
        ValueError: if a size is not a positive integer or the scale is
            negative.
    """

    def __init__(
        self,
        input_size: int,
        fc_layer_params: Sequence[int] = (64, 64),
        activation: ActivationArg = nn.Tanh,
        last_layer_size: Optional[int] = None,
        last_activation: ActivationArg = None,
        last_layer_init_scale: Optional[float] = None,
    ):
        super().__init__()
        check_int("input_size", input_size, 1)
        fc_layer_params = [check_int("fc_layer_params", h, 1) for h in fc_layer_params or ()]
        check_int("last_layer_size", last_layer_size, 1, allow_none=True, none_means="none")
        scale = check_real(
            "last_layer_init_scale", last_layer_init_scale, minimum=0, allow_none=True
        )
        layers = []
        size = input_size
        for h in fc_layer_params:
            linear = nn.Linear(size, h)
            _init_linear(linear, HIDDEN_INIT_GAIN)
            layers += [linear, get_activation(activation)]
            size = h
        if last_layer_size is not None:
            linear = nn.Linear(size, last_layer_size)
            _init_linear(linear, 1.0 if scale is None else scale)
            layers.append(linear)
            if last_activation is not None:
                layers.append(get_activation(last_activation))
            size = last_layer_size
        self._layers = nn.Sequential(*layers)
        self._input_size = input_size
        self._output_size = size
        # Kept on the module so that ``.to(dtype)`` is reflected in ``dtype``.
        self.register_buffer("_dtype_probe", torch.zeros(()), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the parameters (follows ``.to(dtype)``)."""
        return self._dtype_probe.dtype

    @property
    def input_size(self) -> int:
        """Size of the last input dimension."""
        return self._input_size

    @property
    def layers(self) -> nn.Sequential:
        """The layers, in order (``Linear`` and activation modules)."""
        return self._layers

    @property
    def output_size(self) -> int:
        """Size of the last output dimension."""
        return self._output_size

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Apply the network.

        Args:
            inputs: float tensor ``[..., input_size]``.

        Returns:
            Tensor ``[..., output_size]``.

        Raises:
            ValueError: if the last dimension is not ``input_size``.
        """
        if inputs.shape[-1] != self._input_size:
            raise ValueError(
                f"inputs must have last dimension {self._input_size}, got "
                f"shape {tuple(inputs.shape)}"
            )
        return self._layers(inputs)


MLP = EncodingNetwork
"""Alias of ``EncodingNetwork``."""
