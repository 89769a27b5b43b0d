"""Tests for alf_entropy/networks/value_network.py."""

import gin
import pytest
import torch
import torch.nn as nn

from alf_entropy.networks.value_network import ValueNetwork
from alf_entropy.tensor_specs import TensorSpec


def test_value_shape_and_gradient():
    net = ValueNetwork(TensorSpec((2, 2)), fc_layer_params=(8,))
    v = net(torch.randn(6, 2, 2))
    assert v.shape == (6,)
    v.sum().backward()
    assert all(p.grad is not None and torch.any(p.grad != 0) for p in net.parameters())


def test_value_rejects_wrong_observation():
    net = ValueNetwork(TensorSpec((3,)))
    with pytest.raises(ValueError, match="shape"):
        net(torch.randn(6, 4))


def test_value_gin_binding():
    gin.clear_config()
    try:
        gin.parse_config("ValueNetwork.fc_layer_params = (5,)\nValueNetwork.activation = 'relu'")
        net = ValueNetwork(TensorSpec((3,)))
        sizes = [m.out_features for m in net.modules() if isinstance(m, nn.Linear)]
        assert sizes == [5, 1]
        assert any(isinstance(m, nn.ReLU) for m in net.modules())
    finally:
        gin.clear_config()
