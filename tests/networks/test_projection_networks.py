"""Tests for alf_entropy/networks/projection_networks.py."""

import numpy as np
import pytest
import torch
import torch.distributions as td

from alf_entropy.networks.projection_networks import (
    CategoricalProjectionNetwork,
    NormalProjectionNetwork,
)
from alf_entropy.tensor_specs import BoundedTensorSpec


def test_categorical_scalar_and_multi():
    net = CategoricalProjectionNetwork(6, BoundedTensorSpec((), torch.int64, 0, 3))
    assert net.num_actions == 4
    d = net(torch.randn(5, 6))
    assert isinstance(d, td.Categorical) and d.logits.shape == (5, 4)
    multi = CategoricalProjectionNetwork(6, BoundedTensorSpec((3,), torch.int64, 0, 1))
    d = multi(torch.randn(5, 6))
    assert isinstance(d, td.Independent) and d.batch_shape == (5,) and d.event_shape == (3,)
    s = d.sample()
    assert s.shape == (5, 3) and s.min() >= 0 and s.max() <= 1
    # entropy of Independent(Categorical) sums the per-element entropies
    assert torch.allclose(d.entropy(), d.base_dist.entropy().sum(-1))


def test_categorical_rejects_bad_specs():
    with pytest.raises(ValueError, match="minimum 0"):
        CategoricalProjectionNetwork(4, BoundedTensorSpec((), torch.int64, 1, 3))
    with pytest.raises(ValueError, match="num_actions"):
        CategoricalProjectionNetwork(4, BoundedTensorSpec((2,), torch.int64, 0, [1, 2]))
    with pytest.raises(TypeError, match="action_spec"):
        CategoricalProjectionNetwork(4, BoundedTensorSpec((), torch.float32, 0, 1))
    with pytest.raises(ValueError, match="input_size"):
        CategoricalProjectionNetwork(0, BoundedTensorSpec((), torch.int64, 0, 1))


def test_normal_state_independent_std():
    spec = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
    net = NormalProjectionNetwork(4, spec, init_log_std=-0.5)
    d = net(torch.randn(3, 4))
    assert isinstance(d, td.Independent) and isinstance(d.base_dist, td.Normal)
    assert torch.allclose(d.base_dist.scale, torch.full((3, 2), float(np.exp(-0.5))))
    assert net.log_std.shape == (2,)


def test_normal_state_dependent_std_and_clamp():
    spec = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
    net = NormalProjectionNetwork(
        4, spec, state_dependent_std=True, min_log_std=-1.0, max_log_std=0.5, init_log_std=0.0
    )
    x = torch.randn(3, 4)
    d = net(x)
    assert not torch.allclose(d.base_dist.scale[0], d.base_dist.scale[1])
    big = net(1e4 * x).base_dist.scale
    assert torch.all(big <= float(np.exp(0.5)) + 1e-6)
    assert torch.all(big >= float(np.exp(-1.0)) - 1e-6)


def test_scalar_continuous_spec_is_plain_normal():
    net = NormalProjectionNetwork(4, BoundedTensorSpec((), torch.float32, -2.0, 2.0))
    d = net(torch.randn(3, 4))
    assert isinstance(d, td.Normal) and d.batch_shape == (3,) and d.event_shape == ()
    sq = NormalProjectionNetwork(
        4, BoundedTensorSpec((), torch.float32, -2.0, 2.0), squash_to_spec=True
    )(torch.randn(3, 4))
    s = sq.sample((100,))
    assert s.shape == (100, 3) and torch.all(s.abs() <= 2.0)


def test_squashed_log_prob_finite_on_bounds():
    spec = BoundedTensorSpec((2,), torch.float32, [-1.0, 0.0], [1.0, 4.0])
    d = NormalProjectionNetwork(4, spec, squash_to_spec=True)(torch.randn(3, 4))
    lp = d.log_prob(torch.tensor([[-1.0, 4.0]]).expand(3, 2))
    assert torch.all(torch.isfinite(lp))
    s = d.sample()
    assert torch.all(torch.isfinite(d.log_prob(s)))


def test_normal_rejects_bad_arguments():
    spec = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
    with pytest.raises(ValueError, match="min_log_std"):
        NormalProjectionNetwork(4, spec, min_log_std=1.0, max_log_std=0.0)
    with pytest.raises(ValueError, match="init_log_std"):
        NormalProjectionNetwork(4, spec, init_log_std=5.0)
    with pytest.raises(TypeError, match="action_spec"):
        NormalProjectionNetwork(4, BoundedTensorSpec((), torch.int64, 0, 1))
    with pytest.raises(ValueError, match="finite"):
        NormalProjectionNetwork(
            4, BoundedTensorSpec((2,), torch.float32, -np.inf, np.inf), squash_to_spec=True
        )
    with pytest.raises(ValueError, match="finite"):
        NormalProjectionNetwork(4, BoundedTensorSpec((2,), torch.float32), squash_to_spec=True)
    with pytest.raises(ValueError, match="minimum < maximum"):
        NormalProjectionNetwork(
            4, BoundedTensorSpec((2,), torch.float32, 1.0, 1.0), squash_to_spec=True
        )
    # without squashing unbounded specs are fine
    NormalProjectionNetwork(4, BoundedTensorSpec((2,), torch.float32, -np.inf, np.inf))
