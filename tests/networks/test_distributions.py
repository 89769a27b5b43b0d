"""Tests for alf_entropy/networks/distributions.py."""

import pytest
import torch
import torch.distributions as td

from alf_entropy.networks.distributions import StableTanh, mode_of


def test_mode_of_basic_distributions():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]])
    assert torch.equal(mode_of(td.Categorical(logits=logits)), torch.tensor([1, 0]))
    loc = torch.tensor([[0.5, -0.3]])
    normal = td.Independent(td.Normal(loc, torch.ones_like(loc)), 1)
    assert torch.equal(mode_of(normal), loc)
    squashed = td.TransformedDistribution(
        normal, [StableTanh(cache_size=1), td.AffineTransform(1.0, 2.0, event_dim=1)]
    )
    assert torch.allclose(mode_of(squashed), 1.0 + 2.0 * torch.tanh(loc))


def test_mode_of_nest_and_fallback():
    d = {
        "c": td.Categorical(logits=torch.tensor([[0.0, 1.0]])),
        "n": (td.Normal(torch.tensor([2.0]), torch.tensor([1.0])),),
    }
    m = mode_of(d)
    assert torch.equal(m["c"], torch.tensor([1]))
    assert torch.equal(m["n"][0], torch.tensor([2.0]))
    beta = td.Beta(torch.tensor([2.0]), torch.tensor([2.0]))
    assert torch.allclose(mode_of(beta), torch.tensor([0.5]))


def test_mode_of_unsupported():
    class NoMode(td.Distribution):
        arg_constraints = {}

        def __init__(self):
            super().__init__(validate_args=False)

    with pytest.raises(TypeError, match="NoMode"):
        mode_of(NoMode())


def test_stable_tanh_inverse_finite_at_bounds():
    t = StableTanh()
    assert isinstance(t, td.TanhTransform)
    x = t.inv(torch.tensor([-1.0, 1.0, 0.5]))
    assert torch.all(torch.isfinite(x))
    assert torch.allclose(x[2], torch.atanh(torch.tensor(0.5)))
    # plain torch tanh gives inf on the bound
    assert torch.isinf(td.TanhTransform().inv(torch.tensor(1.0)))
    assert isinstance(StableTanh(cache_size=0).with_cache(1), StableTanh)


def test_fast_categorical_is_torch_categorical():
    from alf_entropy.networks.distributions import Categorical

    torch.manual_seed(0)
    logits = torch.tensor([[0.0, 1.0, -1.0], [2.0, 2.0, 2.0], [-30.0, 0.0, 5.0]])
    fast, ref = Categorical(logits), td.Categorical(logits=logits)
    assert isinstance(fast, td.Categorical) and fast.batch_shape == ref.batch_shape
    torch.testing.assert_close(fast.logits, ref.logits)
    torch.testing.assert_close(fast.entropy(), ref.entropy())
    action = torch.tensor([1, 0, 2])
    torch.testing.assert_close(fast.log_prob(action), ref.log_prob(action))
    samples = fast.sample((100_000,))
    assert samples.shape == (100_000, 3) and samples.dtype == torch.int64
    assert samples.min() >= 0 and samples.max() <= 2
    freq = torch.stack([(samples == k).float().mean(0) for k in range(3)], -1)
    torch.testing.assert_close(freq, ref.probs, atol=0.01, rtol=0)
    with pytest.raises(ValueError, match="logits"):
        Categorical(torch.tensor(1.0))


def test_fast_categorical_probs_are_lazy_softmax_and_differentiable():
    from alf_entropy.networks.distributions import Categorical

    logits = torch.randn(4, 3, requires_grad=True)
    fast = Categorical(logits)
    with torch.no_grad():  # first read under no_grad: still differentiable, as torch's
        probs = fast.probs
    assert probs.requires_grad and fast.probs is probs
    assert torch.equal(probs, torch.softmax(fast.logits, dim=-1))
    probs[:, 0].sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    with torch.inference_mode():
        assert torch.equal(Categorical(logits.detach()).probs, probs.detach())


@pytest.mark.parametrize("shape, sample_shape", [((8, 2), ()), ((5, 3, 7), (4,)), ((6,), (2, 3))])
def test_sample_categorical_inverts_the_cdf(shape, sample_shape):
    """The index drawn is the number of CDF entries below the uniform draw
    (so zero-probability actions are never drawn)."""
    from alf_entropy.networks.distributions import sample_categorical

    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(*shape), -1)
    probs[..., 0] = 0.0  # never drawn
    probs = probs / probs.sum(-1, keepdim=True)
    state = torch.random.get_rng_state()
    drawn = sample_categorical(probs, sample_shape)
    torch.random.set_rng_state(state)
    u = torch.rand((*sample_shape, *shape[:-1], 1))
    expected = (probs.cumsum(-1) < u).sum(-1).clamp(max=shape[-1] - 1)
    assert drawn.shape == (*sample_shape, *shape[:-1]) and torch.equal(drawn, expected)
    assert (drawn > 0).all()
