"""Tests for alf_entropy/networks/encoding_network.py."""

import math

import gin
import pytest
import torch
import torch.nn as nn

from alf_entropy.networks.encoding_network import (
    MLP,
    EncodingNetwork,
    flat_input_size,
    flatten_observation,
    get_activation,
)
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec


def _linears(net):
    return [m for m in net.modules() if isinstance(m, nn.Linear)]


def test_shapes_and_layers():
    net = EncodingNetwork(5, fc_layer_params=(16, 8), last_layer_size=3)
    assert net.input_size == 5 and net.output_size == 3
    assert net(torch.randn(7, 5)).shape == (7, 3)
    assert net(torch.randn(2, 7, 5)).shape == (2, 7, 3)
    assert [l.out_features for l in _linears(net)] == [16, 8, 3]
    assert MLP is EncodingNetwork


def test_no_last_layer_output_size():
    net = EncodingNetwork(5, fc_layer_params=(16,))
    assert net.output_size == 16
    empty = EncodingNetwork(5, fc_layer_params=())
    assert empty.output_size == 5
    x = torch.randn(3, 5)
    assert torch.equal(empty(x), x)


def test_orthogonal_init_gains_and_zero_bias():
    torch.manual_seed(0)
    net = EncodingNetwork(32, fc_layer_params=(32,), last_layer_size=4, last_layer_init_scale=0.01)
    hidden, last = _linears(net)
    w = hidden.weight
    # Square orthogonal matrix scaled by sqrt(2): W W^T = 2 I.
    assert torch.allclose(w @ w.T, 2.0 * torch.eye(32), atol=1e-4)
    assert torch.all(hidden.bias == 0) and torch.all(last.bias == 0)
    # Rows of the output layer are orthonormal times the 0.01 gain.
    assert torch.allclose(last.weight @ last.weight.T, 1e-4 * torch.eye(4), atol=1e-7)


def test_default_last_scale_is_one():
    torch.manual_seed(0)
    net = EncodingNetwork(8, fc_layer_params=(), last_layer_size=1)
    (last,) = _linears(net)
    assert math.isclose(last.weight.norm().item(), 1.0, rel_tol=1e-5)


def test_activations():
    net = EncodingNetwork(
        3, fc_layer_params=(4,), activation="relu", last_layer_size=2, last_activation=nn.Sigmoid
    )
    mods = list(net.modules())
    assert any(isinstance(m, nn.ReLU) for m in mods)
    assert any(isinstance(m, nn.Sigmoid) for m in mods)
    out = net(torch.randn(10, 3))
    assert torch.all((out > 0) & (out < 1))
    assert isinstance(get_activation(None), nn.Identity)
    assert isinstance(get_activation("TANH"), nn.Tanh)
    assert isinstance(get_activation(lambda: nn.ELU(alpha=0.5)), nn.ELU)


def test_bad_arguments():
    with pytest.raises(ValueError, match="input_size"):
        EncodingNetwork(0)
    with pytest.raises(ValueError, match="fc_layer_params"):
        EncodingNetwork(3, fc_layer_params=(4, -1))
    with pytest.raises(ValueError, match="last_layer_size"):
        EncodingNetwork(3, last_layer_size=0)
    with pytest.raises(ValueError, match="last_layer_init_scale"):
        EncodingNetwork(3, last_layer_size=1, last_layer_init_scale=-1.0)
    with pytest.raises(ValueError, match="activation"):
        get_activation("nope")
    with pytest.raises(TypeError, match="activation"):
        get_activation(nn.Tanh())
    with pytest.raises(TypeError, match="activation"):
        get_activation(lambda: 3)
    with pytest.raises(ValueError, match="last dimension 3"):
        EncodingNetwork(3)(torch.randn(2, 4))


def test_gin_binding():
    gin.clear_config()
    try:
        gin.parse_config(
            "EncodingNetwork.fc_layer_params = (7, 5)\nEncodingNetwork.activation = 'elu'"
        )
        net = EncodingNetwork(3)
        assert [l.out_features for l in _linears(net)] == [7, 5]
        assert any(isinstance(m, nn.ELU) for m in net.modules())
    finally:
        gin.clear_config()


def test_flatten_observation_nest():
    spec = {"a": TensorSpec((2, 3)), "b": BoundedTensorSpec((), torch.int64, 0, 4)}
    assert flat_input_size(spec) == 7
    obs = {"a": torch.arange(12.0).reshape(2, 2, 3), "b": torch.tensor([1, 4])}
    flat = flatten_observation(obs, spec)
    assert flat.dtype == torch.float32 and flat.shape == (2, 7)
    assert torch.equal(flat[1], torch.tensor([6.0, 7, 8, 9, 10, 11, 4]))
    with pytest.raises(ValueError, match="shape"):
        flatten_observation({"a": torch.zeros(2, 3), "b": torch.zeros(2)}, spec)
    with pytest.raises(ValueError, match="input_tensor_spec"):
        flatten_observation(torch.zeros(2, 6), spec)
    with pytest.raises(TypeError):
        flat_input_size({"a": 3})
    with pytest.raises(ValueError):
        flat_input_size({})


def test_layer_hooks_run():
    torch.manual_seed(0)
    net = EncodingNetwork(4, (8, 8), last_layer_size=2)
    x = torch.randn(5, 4)
    plain = net._layers(x)
    seen = []
    handle = net._layers[1].register_forward_hook(lambda m, inp, out: seen.append("layer"))
    assert torch.equal(net(x), plain) and seen == ["layer"]
    handle.remove()
