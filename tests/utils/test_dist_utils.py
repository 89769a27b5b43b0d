"""Tests for alf_entropy.utils.dist_utils."""

import collections
import math

import numpy as np
import pytest
import torch
import torch.distributions as td

from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
from alf_entropy.utils.dist_utils import (
    calc_default_max_entropy,
    calc_default_target_entropy,
    calc_max_possible_entropy,
    entropy_with_fallback,
    estimated_entropy,
)

F32 = torch.float32
I64 = torch.int64


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _discrete_target(n: int, p: float) -> float:
    # entropy of [1-p, p/(n-1), ..., p/(n-1)] computed directly
    probs = np.array([1 - p] + [p / (n - 1)] * (n - 1))
    return float(-(probs * np.log(probs)).sum())


# ---------------------------------------------------------------- spec numbers


def test_default_target_entropy_continuous_and_discrete_values():
    assert calc_default_target_entropy(BoundedTensorSpec((), F32, 0, 3)) == pytest.approx(
        -1.2039728, abs=1e-6
    )
    assert calc_default_target_entropy(BoundedTensorSpec((), I64, 0, 3)) == pytest.approx(
        0.4349442, abs=1e-6
    )
    # the closed form equals the entropy of the described distribution
    for n, p in [(2, 0.1), (4, 0.1), (7, 0.3)]:
        spec = BoundedTensorSpec((), I64, 5, 5 + n - 1)
        assert calc_default_target_entropy(spec, min_prob=p) == pytest.approx(
            _discrete_target(n, p), rel=1e-9
        )
    # a single choice has zero entropy
    assert calc_default_target_entropy(BoundedTensorSpec((), I64, 2, 2)) == 0.0


def test_default_target_entropy_per_element_bounds_and_nest():
    cont = BoundedTensorSpec((2,), F32, [0.0, -1.0], [3.0, 1.0])
    expected_cont = math.log(3) + math.log(2) + 2 * math.log(0.1)
    assert calc_default_target_entropy(cont) == pytest.approx(expected_cont)
    disc = BoundedTensorSpec((3,), I64, 0, [3, 1, 0])  # N = 4, 2, 1
    expected_disc = _discrete_target(4, 0.1) + _discrete_target(2, 0.1)
    assert calc_default_target_entropy(disc) == pytest.approx(expected_disc)
    nested = {"c": cont, "d": (disc, [disc])}
    assert calc_default_target_entropy(nested) == pytest.approx(expected_cont + 2 * expected_disc)
    assert calc_default_target_entropy(cont, min_prob=0.5) == pytest.approx(
        math.log(3) + math.log(2) + 2 * math.log(0.5)
    )


def test_default_target_entropy_errors():
    spec = BoundedTensorSpec((), F32, 0, 1)
    for bad in [0.0, 1.0, -0.1, 1.5]:
        with pytest.raises(ValueError, match="min_prob"):
            calc_default_target_entropy(spec, min_prob=bad)
    inf_spec = BoundedTensorSpec((2,), F32, -np.inf, np.inf)
    with pytest.raises(ValueError, match="BoundedTensorSpec"):
        calc_default_target_entropy({"a": spec, "b": inf_spec})
    with pytest.raises(ValueError, match="TensorSpec"):
        calc_default_target_entropy(TensorSpec((2,)))
    with pytest.raises(ValueError, match="maximum == minimum"):
        calc_default_target_entropy(BoundedTensorSpec((), F32, 1, 1))
    with pytest.raises(TypeError):
        calc_default_target_entropy(3)
    with pytest.raises(TypeError):
        calc_default_target_entropy({"a": spec, "b": "x"})
    with pytest.raises(TypeError):
        calc_default_target_entropy(None)
    with pytest.raises(ValueError, match="empty"):
        calc_default_target_entropy({})


def test_default_max_entropy_follows_alf():
    disc = BoundedTensorSpec((), I64, 0, 3)
    assert calc_default_max_entropy(disc) == pytest.approx(0.8 * math.log(4))
    wide = BoundedTensorSpec((), F32, -1, 3)  # width 4 > 1: fraction * log 4
    assert calc_default_max_entropy(wide, fraction=0.5) == pytest.approx(0.5 * math.log(4))
    narrow = BoundedTensorSpec((), F32, 0, 0.5)  # width <= 1: log(0.5) / fraction
    assert calc_default_max_entropy(narrow, fraction=0.5) == pytest.approx(math.log(0.5) / 0.5)
    # the default cap never exceeds the uniform upper bound
    for s in [disc, wide, narrow]:
        assert calc_default_max_entropy(s) <= calc_max_possible_entropy(s)
    assert calc_default_max_entropy({"a": disc, "b": (wide,)}) == pytest.approx(
        0.8 * math.log(4) + 0.8 * math.log(4)
    )
    assert calc_default_max_entropy(disc, fraction=1.0) == pytest.approx(math.log(4))
    for bad in [0.0, 1.01, -1.0]:
        with pytest.raises(ValueError, match="fraction"):
            calc_default_max_entropy(disc, fraction=bad)
    with pytest.raises(ValueError):
        calc_default_max_entropy(BoundedTensorSpec((), F32, 0, np.inf))
    with pytest.raises(TypeError):
        calc_default_max_entropy([disc, object()])


def test_max_possible_entropy():
    assert calc_max_possible_entropy(BoundedTensorSpec((), I64, 0, 3)) == pytest.approx(math.log(4))
    assert calc_max_possible_entropy(BoundedTensorSpec((), I64, 0, 0)) == 0.0
    cont = BoundedTensorSpec((2,), F32, [0.0, -1.0], [3.0, 1.0])
    assert calc_max_possible_entropy(cont) == pytest.approx(math.log(3) + math.log(2))
    nested = {"a": BoundedTensorSpec((3,), I64, 0, 1), "b": cont}
    assert calc_max_possible_entropy(nested) == pytest.approx(3 * math.log(2) + math.log(6))
    half_inf = BoundedTensorSpec((2,), F32, [0.0, 0.0], [1.0, np.inf])
    assert calc_max_possible_entropy(half_inf) == math.inf
    assert calc_max_possible_entropy((TensorSpec((2,)), cont)) == math.inf
    assert calc_max_possible_entropy(BoundedTensorSpec((2,), F32, 0.0, [1.0, 0.0])) == -math.inf
    # the default target is always reachable
    for s in [cont, nested, BoundedTensorSpec((), I64, 0, 9)]:
        assert calc_default_target_entropy(s) < calc_max_possible_entropy(s)
    with pytest.raises(TypeError):
        calc_max_possible_entropy(1.0)


# ---------------------------------------------------------- estimated_entropy


def test_estimated_entropy_shapes_and_value_rsample():
    loc = torch.zeros(3, 2, requires_grad=True)
    log_scale = torch.zeros(3, 2, requires_grad=True)
    dist = td.Independent(td.Normal(loc, log_scale.exp()), 1)
    ent, ent_g = estimated_entropy(dist, num_samples=20000)
    assert ent.shape == (3,) and ent_g.shape == (3,)
    assert torch.allclose(ent, dist.entropy(), atol=0.05)
    assert ent_g is ent  # reparameterized: the estimate itself is differentiated
    ent_g.sum().backward()
    # dH/dlog_scale = 1 per element for a Normal
    assert torch.allclose(log_scale.grad, torch.ones(3, 2), atol=0.05)


def test_estimated_entropy_surrogate_gradient_matches_analytic():
    logits = torch.tensor([[0.5, -1.0, 2.0, 0.0], [0.0, 0.0, 0.0, 3.0]], requires_grad=True)
    dist = td.Categorical(logits=logits)
    ent, ent_g = estimated_entropy(dist, num_samples=40000)
    assert ent.shape == (2,) and ent_g.shape == (2,)
    assert torch.allclose(ent, dist.entropy(), atol=0.03)
    # the surrogate's value is not the entropy, only its gradient is
    assert not torch.allclose(ent_g, ent, atol=0.1)
    (grad_est,) = torch.autograd.grad(ent_g.sum(), logits, retain_graph=True)
    (grad_true,) = torch.autograd.grad(dist.entropy().sum(), logits)
    assert grad_est.abs().sum() > 0
    assert torch.allclose(grad_est, grad_true, atol=0.05)


def test_estimated_entropy_errors():
    dist = td.Normal(torch.zeros(2), torch.ones(2))
    with pytest.raises(ValueError, match="num_samples"):
        estimated_entropy(dist, num_samples=0)
    with pytest.raises(ValueError, match="num_samples"):
        estimated_entropy(dist, num_samples=1.5)
    with pytest.raises(TypeError):
        estimated_entropy(torch.zeros(2))
    ent, _ = estimated_entropy(dist, check_numerics=True)
    assert torch.isfinite(ent).all()
    # a degenerate categorical sample can have -log p = inf only if p = 0; use a
    # distribution whose log_prob returns inf to trigger the check
    bad = td.Normal(torch.zeros(2), torch.ones(2))
    bad.log_prob = lambda x: torch.full_like(x, float("nan"))
    with pytest.raises(ValueError, match="non-finite"):
        estimated_entropy(bad, check_numerics=True)


# ------------------------------------------------------- entropy_with_fallback


def test_categorical_normal_independent_beta_are_analytic():
    cat = td.Categorical(logits=torch.randn(5, 4))
    normal = td.Normal(torch.randn(5), torch.rand(5) + 0.5)
    ind = td.Independent(td.Normal(torch.randn(5, 3), torch.rand(5, 3) + 0.5), 1)
    beta = td.Beta(torch.rand(5) + 1, torch.rand(5) + 1)
    for dist in [cat, normal, ind, beta]:
        ent, ent_g = entropy_with_fallback(dist)
        assert ent.shape == (5,)
        assert torch.equal(ent, dist.entropy())
        assert torch.equal(ent_g, ent)


def test_affine_transformed_normal_is_exact():
    loc = torch.randn(4, 3)
    scale = torch.rand(4, 3) + 0.5
    a_scale = torch.tensor([2.0, -0.5, 3.0])
    base = td.Independent(td.Normal(loc, scale), 1)
    dist = td.TransformedDistribution(base, [td.AffineTransform(1.0, a_scale)])
    ent, ent_g = entropy_with_fallback(dist)
    expected = td.Independent(td.Normal(loc, scale * a_scale.abs()), 1).entropy()
    assert ent.shape == (4,)
    torch.testing.assert_close(ent, expected)
    torch.testing.assert_close(ent_g, expected)
    # deterministic: the shortcut does not sample
    torch.testing.assert_close(entropy_with_fallback(dist)[0], ent)

    # element-wise base with a composed, event_dim=1 affine and a scalar scale
    dist2 = td.TransformedDistribution(
        td.Normal(loc, scale),
        [
            td.ComposeTransform(
                [td.AffineTransform(0.0, 2.0), td.AffineTransform(0.0, a_scale, event_dim=1)]
            )
        ],
    )
    assert dist2.batch_shape == (4,) and dist2.event_shape == (3,)
    expected2 = td.Independent(td.Normal(loc, 2.0 * scale * a_scale.abs()), 1).entropy()
    torch.testing.assert_close(entropy_with_fallback(dist2)[0], expected2)

    # per-batch-element scale on an element-wise Normal
    b_scale = torch.rand(4, 3) + 0.1
    dist3 = td.TransformedDistribution(td.Normal(loc, scale), td.AffineTransform(0.0, b_scale))
    torch.testing.assert_close(
        entropy_with_fallback(dist3)[0], td.Normal(loc, scale * b_scale).entropy()
    )


def test_affine_shortcut_gradient_reaches_scale():
    a_scale = torch.tensor([2.0, 3.0], requires_grad=True)
    dist = td.TransformedDistribution(
        td.Independent(td.Normal(torch.zeros(2), torch.ones(2)), 1),
        [td.AffineTransform(0.0, a_scale)],
    )
    _, ent_g = entropy_with_fallback(dist)
    ent_g.backward()
    torch.testing.assert_close(a_scale.grad, 1.0 / a_scale.detach())


def _tanh_normal(loc, scale, low=-2.0, high=2.0):
    half = (high - low) / 2
    return td.TransformedDistribution(
        td.Independent(td.Normal(loc, scale), 1),
        [td.TanhTransform(cache_size=1), td.AffineTransform(low + half, half)],
    )


def _tanh_normal_entropy_reference(mu, sigma, half):
    # H(Y) = H(X) + E[log|dy/dx|], dy/dx = half * (1 - tanh(x)^2); the
    # expectation is integrated numerically on a fine grid (deterministic).
    x = torch.linspace(mu - 12 * sigma, mu + 12 * sigma, 400001, dtype=torch.float64)
    dens = torch.exp(td.Normal(torch.tensor(mu, dtype=torch.float64), sigma).log_prob(x))
    log_jac = math.log(half) + 2 * (math.log(2) - x - torch.nn.functional.softplus(-2 * x))
    e_log_jac = torch.trapezoid(dens * log_jac, x).item()
    h_x = 0.5 * math.log(2 * math.pi * math.e * sigma**2)
    return h_x + e_log_jac


def test_tanh_squashed_normal_uses_sampling_estimate():
    mu, sigma = [0.3, -0.7], [0.8, 1.5]
    batch = 20000
    loc = torch.tensor(mu).expand(batch, 2).clone().requires_grad_()
    scale = torch.tensor(sigma).expand(batch, 2).clone().requires_grad_()
    dist = _tanh_normal(loc, scale)
    ent, ent_g = entropy_with_fallback(dist)
    assert ent.shape == (batch,)
    ref = sum(_tanh_normal_entropy_reference(m, s, 2.0) for m, s in zip(mu, sigma))
    assert abs(ent.mean().item() - ref) < 0.05
    # it is a sampled estimate: individual values vary
    assert ent.std().item() > 0.1
    ent_g.mean().backward()
    assert loc.grad.abs().sum() > 0 and scale.grad.abs().sum() > 0


def test_non_reparameterized_fallback_uses_surrogate():
    # a mixture of categoricals has neither entropy() nor rsample()
    batch = 20000
    mix_logits = torch.tensor([0.2, -0.3], requires_grad=True)
    comp_logits = torch.tensor([[1.0, 0.0, -1.0], [-1.0, 0.5, 2.0]])
    dist = td.MixtureSameFamily(
        td.Categorical(logits=mix_logits.expand(batch, 2)),
        td.Categorical(logits=comp_logits.expand(batch, 2, 3)),
    )
    ent, ent_g = entropy_with_fallback(dist)
    assert ent.shape == (batch,)
    probs = (mix_logits.softmax(-1)[:, None] * comp_logits.softmax(-1)).sum(0)
    true_ent = -(probs * probs.log()).sum()
    assert abs(ent.mean().item() - true_ent.item()) < 0.03
    assert not torch.allclose(ent_g, ent)  # surrogate, not the value
    (g_est,) = torch.autograd.grad(ent_g.mean(), mix_logits)
    (g_true,) = torch.autograd.grad(true_ent, mix_logits)
    assert g_est.abs().sum() > 0
    torch.testing.assert_close(g_est, g_true, atol=0.03, rtol=0.0)


def test_nest_sum_and_return_nests():
    Pair = collections.namedtuple("Pair", ["x", "y"])
    cat = td.Categorical(logits=torch.randn(6, 3))
    ind = td.Independent(td.Normal(torch.randn(6, 2), torch.rand(6, 2) + 0.5), 1)
    beta = td.Beta(torch.rand(6) + 1, torch.rand(6) + 1)
    dists = {"a": cat, "b": Pair(x=ind, y=beta)}
    ent, ent_g = entropy_with_fallback(dists)
    expected = cat.entropy() + ind.entropy() + beta.entropy()
    torch.testing.assert_close(ent, expected)
    torch.testing.assert_close(ent_g, expected)
    ents, ents_g = entropy_with_fallback(dists, return_sum=False)
    assert set(ents) == {"a", "b"} and isinstance(ents["b"], Pair)
    torch.testing.assert_close(ents["b"].x, ind.entropy())
    torch.testing.assert_close(ents_g["a"], cat.entropy())


def test_action_spec_reduces_elementwise_dims():
    loc, scale = torch.randn(5, 3), torch.rand(5, 3) + 0.5
    normal = td.Normal(loc, scale)
    multi_cat = td.Categorical(logits=torch.randn(5, 3, 4))
    cat = td.Categorical(logits=torch.randn(5, 4))
    specs = {
        "c": BoundedTensorSpec((3,), F32, -1, 1),
        "d": BoundedTensorSpec((3,), I64, 0, 3),
        "e": BoundedTensorSpec((), I64, 0, 3),
    }
    dists = {"c": normal, "d": multi_cat, "e": cat}
    # without a spec the element-wise [5, 3] and the [5] results do not sum
    with pytest.raises(ValueError, match="different shapes"):
        entropy_with_fallback(dists)
    ents, _ = entropy_with_fallback(dists, return_sum=False)
    assert ents["c"].shape == (5, 3) and ents["e"].shape == (5,)
    ent, _ = entropy_with_fallback(dists, action_spec=specs)
    assert ent.shape == (5,)
    torch.testing.assert_close(
        ent, normal.entropy().sum(-1) + multi_cat.entropy().sum(-1) + cat.entropy()
    )
    # an Independent already covers the spec: nothing more is summed
    ind = td.Independent(normal, 1)
    ent_i, _ = entropy_with_fallback(ind, action_spec=specs["c"])
    torch.testing.assert_close(ent_i, ind.entropy())
    # mismatching shapes / structures / leaf types are rejected
    with pytest.raises(ValueError, match="action_spec shape"):
        entropy_with_fallback(normal, action_spec=BoundedTensorSpec((4,), F32, -1, 1))
    with pytest.raises(ValueError, match="action_spec shape"):
        entropy_with_fallback(ind, action_spec=BoundedTensorSpec((), F32, -1, 1))
    with pytest.raises(ValueError):
        entropy_with_fallback(dists, action_spec={"c": specs["c"], "d": specs["d"]})
    with pytest.raises(TypeError):
        entropy_with_fallback(normal, action_spec=3)


def test_entropy_with_fallback_errors():
    with pytest.raises(TypeError, match="Distribution"):
        entropy_with_fallback({"a": torch.zeros(3)})
    with pytest.raises(ValueError, match="at least one"):
        entropy_with_fallback({})
