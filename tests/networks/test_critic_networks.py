"""CriticNetworks: equal to separate nn.Linear stacks; detached weights; specs."""
import pytest
import torch
import torch.nn.functional as F

from alf_entropy.networks import CriticNetworks
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec

OBS = TensorSpec((3,))
BOX = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
DISCRETE = BoundedTensorSpec((), torch.int64, 0, 3)


def _reference(net, k, x):
    """Critic ``k`` computed as a plain stack of linear layers."""
    n = len(net.weights)
    for i in range(n):
        x = F.linear(x, net.weights[i][k].t(), net.biases[i][k, 0])
        if i < n - 1:
            x = torch.relu(x)
    return x


def test_continuous_critics_equal_separate_linear_stacks():
    torch.manual_seed(0)
    net = CriticNetworks(OBS, BOX, fc_layer_params=(8, 5), num_critics=3)
    obs, act = torch.randn(4, 3), torch.rand(4, 2)
    q = net(obs, act)
    assert q.shape == (3, 4)
    x = torch.cat([obs, act], -1)
    for k in range(3):
        torch.testing.assert_close(q[k], _reference(net, k, x).squeeze(-1))
    # independently initialised critics differ
    assert not torch.allclose(q[0], q[1])


def test_discrete_critics_give_one_value_per_action():
    net = CriticNetworks(OBS, DISCRETE, fc_layer_params=(8,))
    obs = torch.randn(5, 3)
    q = net(obs)
    assert q.shape == (2, 5, 4)
    for k in range(2):
        torch.testing.assert_close(q[k], _reference(net, k, obs))


def test_detached_weights_send_gradients_to_the_inputs_only():
    net = CriticNetworks(OBS, BOX, fc_layer_params=(8,))
    act = torch.rand(4, 2, requires_grad=True)
    net(torch.randn(4, 3), act, detach_params=True).sum().backward()
    assert act.grad is not None and act.grad.abs().sum() > 0
    assert all(p.grad is None for p in net.parameters())
    net(torch.randn(4, 3), act).sum().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_bad_specs():
    with pytest.raises(TypeError, match="single BoundedTensorSpec"):
        CriticNetworks(OBS, {"a": BOX})
    with pytest.raises(ValueError, match="scalar"):
        CriticNetworks(OBS, BoundedTensorSpec((2,), torch.int64, 0, 3))
    with pytest.raises(ValueError, match="num_critics"):
        CriticNetworks(OBS, BOX, num_critics=0)
    with pytest.raises(ValueError, match="fc_layer_params"):
        CriticNetworks(OBS, BOX, fc_layer_params=(0,))
