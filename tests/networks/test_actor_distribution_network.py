"""Tests for alf_entropy/networks/actor_distribution_network.py."""

import gin
import numpy as np
import pytest
import torch
import torch.distributions as td
import torch.nn as nn

from alf_entropy import accel
from alf_entropy.networks import ActorDistributionNetwork, mode_of
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec

OBS = TensorSpec((4,))
DISCRETE = BoundedTensorSpec((), torch.int64, 0, 2)
BOX = BoundedTensorSpec((2,), torch.float32, [-1.0, 0.0], [1.0, 4.0])


def test_discrete():
    net = ActorDistributionNetwork(OBS, DISCRETE)
    d = net(torch.randn(5, 4))
    assert isinstance(d, td.Categorical)
    assert d.batch_shape == (5,) and d.logits.shape == (5, 3)
    a = d.sample()
    assert a.dtype == torch.int64 and a.min() >= 0 and a.max() <= 2
    # near-uniform initial policy (policy head gain 0.01)
    assert torch.allclose(d.probs, torch.full((5, 3), 1 / 3), atol=0.05)
    m = mode_of(d)
    assert torch.equal(m, d.logits.argmax(-1))


def test_continuous_unsquashed():
    net = ActorDistributionNetwork(OBS, BOX, init_log_std=-1.0)
    d = net(torch.randn(5, 4))
    assert isinstance(d, td.Independent) and isinstance(d.base_dist, td.Normal)
    assert d.batch_shape == (5,) and d.event_shape == (2,)
    assert d.log_prob(d.sample()).shape == (5,)
    assert torch.allclose(d.base_dist.scale, torch.full((5, 2), float(np.exp(-1.0))))
    assert torch.equal(mode_of(d), d.base_dist.loc)
    assert d.entropy().shape == (5,)


def test_continuous_squashed_within_bounds():
    torch.manual_seed(0)
    net = ActorDistributionNetwork(OBS, BOX, squash_to_spec=True, init_log_std=1.5)
    d = net(torch.randn(5, 4))
    assert isinstance(d, td.TransformedDistribution)
    assert isinstance(d.transforms[0], td.TanhTransform)
    assert isinstance(d.transforms[1], td.AffineTransform)
    assert d.batch_shape == (5,) and d.event_shape == (2,)
    s = d.sample((2000,))
    lo, hi = torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 4.0])
    assert torch.all(s >= lo) and torch.all(s <= hi)
    # wide std spreads samples close to both bounds
    assert torch.all(s.amin(dim=(0, 1)) < lo + 0.2) and torch.all(s.amax(dim=(0, 1)) > hi - 0.2)
    mode = mode_of(d)
    assert torch.allclose(
        mode, (hi + lo) / 2 + (hi - lo) / 2 * torch.tanh(d.base_dist.base_dist.loc)
    )
    assert torch.all(torch.isfinite(d.log_prob(s[0])))


def test_dict_and_tuple_nest_share_encoder():
    spec = {"move": BOX, "pick": DISCRETE}
    net = ActorDistributionNetwork(OBS, spec, fc_layer_params=(16,))
    d = net(torch.randn(3, 4))
    assert set(d) == {"move", "pick"}
    assert isinstance(d["pick"], td.Categorical) and isinstance(d["move"], td.Independent)
    modes = mode_of(d)
    assert modes["pick"].shape == (3,) and modes["move"].shape == (3, 2)
    # one shared encoder: exactly one hidden Linear of 16 units
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert sum(l.out_features == 16 for l in linears) == 1
    tup = ActorDistributionNetwork(OBS, (DISCRETE, BOX))(torch.randn(3, 4))
    assert isinstance(tup, tuple) and isinstance(tup[0], td.Categorical)


def test_gradients_flow_to_every_parameter():
    net = ActorDistributionNetwork(
        OBS, {"c": BOX, "d": DISCRETE}, squash_to_spec=True, state_dependent_std=True
    )
    d = net(torch.randn(8, 4))
    a = {k: v.sample() for k, v in d.items()}
    loss = -(d["c"].log_prob(a["c"]) + d["d"].log_prob(a["d"])).mean() - d["d"].entropy().mean()
    loss.backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and torch.any(p.grad != 0), name


def test_multidim_observation_is_flattened():
    net = ActorDistributionNetwork(TensorSpec((2, 3)), DISCRETE)
    assert net(torch.randn(4, 2, 3)).batch_shape == (4,)
    with pytest.raises(ValueError):
        net(torch.randn(4, 6))


def test_bad_specs():
    with pytest.raises(TypeError, match="BoundedTensorSpec"):
        ActorDistributionNetwork(OBS, TensorSpec((2,)))
    with pytest.raises(ValueError, match="minimum 0"):
        ActorDistributionNetwork(OBS, BoundedTensorSpec((), torch.int64, 1, 2))
    with pytest.raises(ValueError, match="action_spec"):
        ActorDistributionNetwork(OBS, {})


def test_gin_binding():
    gin.clear_config()
    try:
        gin.parse_config(
            "ActorDistributionNetwork.fc_layer_params = (12, 6)\n"
            "ActorDistributionNetwork.activation = 'relu'\n"
            "ActorDistributionNetwork.squash_to_spec = True\n"
        )
        net = ActorDistributionNetwork(OBS, BOX)
        sizes = [m.out_features for m in net.modules() if isinstance(m, nn.Linear)]
        assert sizes[:2] == [12, 6]
        assert any(isinstance(m, nn.ReLU) for m in net.modules())
        assert isinstance(net(torch.randn(2, 4)), td.TransformedDistribution)
    finally:
        gin.clear_config()


def test_module_to_moves_affine_buffers():
    net = ActorDistributionNetwork(OBS, BOX, squash_to_spec=True).to(torch.float64)
    d = net(torch.randn(2, 4, dtype=torch.float64))
    assert d.sample().dtype == torch.float64


@pytest.mark.skipif(not accel.ENABLED, reason="ALF_ENTROPY_ACCEL=0: no closed form")
@pytest.mark.parametrize("squash", [False, True])
@pytest.mark.parametrize(
    "spec", [BOX, BoundedTensorSpec((), torch.float32, -2.0, 2.0)], ids=["vector", "scalar"]
)
def test_rsample_and_log_prob_matches_the_distribution(squash, spec):
    torch.manual_seed(0)
    net = ActorDistributionNetwork(
        OBS, spec, squash_to_spec=squash, state_dependent_std=True, init_log_std=0.5
    )
    obs = torch.randn(4000, 4)
    action, log_prob = net.rsample_and_log_prob(obs)
    dist = net(obs)
    assert action.shape == (4000,) + spec.shape and log_prob.shape == (4000,)
    # The closed form is the distribution's own log-probability of that action
    # (which re-inverts tanh in float32: a little rounding near the bounds) ...
    torch.testing.assert_close(log_prob, dist.log_prob(action), rtol=1e-4, atol=2e-3)
    # ... its samples follow the distribution (same mean as rsample's) ...
    reference = dist.rsample()
    torch.testing.assert_close(action.mean(0), reference.mean(0), rtol=0.0, atol=0.06)
    # ... stay in bounds when squashed, and are reparameterised.
    if squash:
        lo, hi = torch.as_tensor(spec.minimum), torch.as_tensor(spec.maximum)
        assert torch.all(action >= lo) and torch.all(action <= hi)
    (action.sum() + log_prob.sum()).backward()
    assert all(p.grad is not None for p in net.parameters())
    # Without the log-probability (acting): the same draw.
    torch.manual_seed(1)
    with_lp, _ = net.rsample_and_log_prob(obs[:5])
    torch.manual_seed(1)
    without, none = net.rsample_and_log_prob(obs[:5], log_prob=False)
    assert none is None and torch.equal(without, with_lp)


@pytest.mark.skipif(not accel.ENABLED, reason="ALF_ENTROPY_ACCEL=0: no closed form")
def test_rsample_and_log_prob_declines_when_forward_must_run():
    """A hook or an overridden forward on the network or its head gives None."""
    net = ActorDistributionNetwork(OBS, BOX, squash_to_spec=True)
    obs = torch.randn(3, 4)
    assert net.rsample_and_log_prob(obs) is not None
    handle = net.register_forward_hook(lambda *args: None)
    assert net.rsample_and_log_prob(obs) is None
    handle.remove()
    handle = net._heads[0].register_forward_pre_hook(lambda *args: None)
    assert net.rsample_and_log_prob(obs) is None
    handle.remove()

    class Shifted(ActorDistributionNetwork):
        def forward(self, observation):
            return super().forward(observation + 1.0)

    assert Shifted(OBS, BOX).rsample_and_log_prob(obs) is None


def test_rsample_and_log_prob_needs_one_continuous_spec():
    with pytest.raises(TypeError, match="single continuous"):
        ActorDistributionNetwork(OBS, DISCRETE).rsample_and_log_prob(torch.randn(2, 4))
    with pytest.raises(TypeError, match="single continuous"):
        ActorDistributionNetwork(OBS, {"a": BOX}).rsample_and_log_prob(torch.randn(2, 4))
