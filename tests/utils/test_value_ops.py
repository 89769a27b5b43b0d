"""Tests for alf_entropy.utils.value_ops (GAE)."""

import numpy as np
import pytest
import torch

from alf_entropy.data_structures import StepType
from alf_entropy.utils import value_ops

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST


def _reference_gae(rewards, values, step_types, discounts, lam):
    """Straightforward per-env GAE, written independently of the library."""
    T, B = values.shape
    advs = np.zeros((T - 1, B))
    for b in range(B):
        for t in range(T - 1):
            if step_types[t, b] == L:
                continue
            acc, coef = 0.0, 1.0
            for k in range(t, T - 1):
                if step_types[k, b] == L:
                    break
                delta = rewards[k + 1, b] + discounts[k + 1, b] * values[k + 1, b] - values[k, b]
                acc += coef * delta
                coef *= lam * discounts[k + 1, b]
            advs[t, b] = acc
    return advs


def _episode_batch(seed=0, T=12, B=3):
    rng = np.random.default_rng(seed)
    step_types = np.full((T, B), M)
    step_types[0] = F
    step_types[4, 0], step_types[5, 0] = L, F
    step_types[7, 1], step_types[8, 1] = L, F
    step_types[T - 1, 2] = L
    discounts = np.full((T, B), 0.97)
    discounts[4, 0] = 0.0  # termination
    # step 7 of env 1 is a truncation: LAST with discount kept.
    rewards = rng.normal(size=(T, B))
    rewards[5, 0] = rewards[8, 1] = 0.0  # FIRST after LAST has reward 0
    values = rng.normal(size=(T, B))
    return rewards, values, step_types, discounts


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
def test_gae_matches_reference(lam):
    r, v, st, d = _episode_batch()
    advs = value_ops.generalized_advantage_estimation(
        torch.tensor(r), torch.tensor(v), torch.tensor(st), torch.tensor(d), td_lambda=lam
    )
    assert advs.shape == (11, 3)
    np.testing.assert_allclose(advs.numpy(), _reference_gae(r, v, st, d, lam), atol=1e-10)


def test_gae_zero_at_last_and_no_credit_across_boundary():
    r, v, st, d = _episode_batch()
    advs = value_ops.generalized_advantage_estimation(
        torch.tensor(r), torch.tensor(v), torch.tensor(st), torch.tensor(d), td_lambda=1.0
    )
    assert advs[4, 0] == 0 and advs[7, 1] == 0
    # Step 3 of env 0 leads into a termination: advantage is r - v, no bootstrap.
    assert advs[3, 0].item() == pytest.approx(r[4, 0] - v[3, 0])
    # Step 6 of env 1 leads into a truncation: bootstrap from the LAST value.
    assert advs[6, 1].item() == pytest.approx(r[7, 1] + 0.97 * v[7, 1] - v[6, 1])
    # Changing rewards of the next episode does not change the previous one.
    r2 = r.copy()
    r2[6:, 0] += 100.0
    advs2 = value_ops.generalized_advantage_estimation(
        torch.tensor(r2), torch.tensor(v), torch.tensor(st), torch.tensor(d), td_lambda=1.0
    )
    torch.testing.assert_close(advs2[:5, 0], advs[:5, 0])


def test_batch_major_and_extra_dims():
    r, v, st, d = (torch.tensor(x) for x in _episode_batch(seed=5))
    tm = value_ops.generalized_advantage_estimation(r, v, st, d, td_lambda=0.9)
    bm = value_ops.generalized_advantage_estimation(
        r.T, v.T, st.T, d.T, td_lambda=0.9, time_major=False
    )
    torch.testing.assert_close(bm, tm.T)
    # A trailing value dimension (e.g. multi-dim reward) broadcasts the masks.
    v3 = torch.stack([v, 2 * v], -1)
    r3 = torch.stack([r, 2 * r], -1)
    adv3 = value_ops.generalized_advantage_estimation(r3, v3, st, d, td_lambda=0.9)
    torch.testing.assert_close(adv3[..., 1], 2 * tm)


def test_no_gradient_and_dtype_follow_values():
    r, v, st, d = _episode_batch()
    v = torch.tensor(v, dtype=torch.float32, requires_grad=True)
    advs = value_ops.generalized_advantage_estimation(
        torch.tensor(r), v, torch.tensor(st), torch.tensor(d)
    )
    assert not advs.requires_grad and advs.dtype == torch.float32


def test_bad_inputs():
    x = torch.zeros(5, 2)
    with pytest.raises(ValueError, match="td_lambda"):
        value_ops.generalized_advantage_estimation(x, x, x.long(), x, td_lambda=1.5)
    with pytest.raises(ValueError, match="td_lambda"):
        value_ops.generalized_advantage_estimation(x, x, x.long(), x, td_lambda=-0.1)
    with pytest.raises(TypeError, match="td_lambda"):
        value_ops.generalized_advantage_estimation(x, x, x.long(), x, td_lambda="0.9")
    with pytest.raises(ValueError, match="at least 2"):
        value_ops.generalized_advantage_estimation(x[:1], x[:1], x[:1].long(), x[:1])
    with pytest.raises(ValueError, match="rewards"):
        value_ops.generalized_advantage_estimation(torch.zeros(4, 2), x, x.long(), x)
    with pytest.raises(TypeError, match="values"):
        value_ops.generalized_advantage_estimation(x, np.zeros((5, 2)), x.long(), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lam", [0.95, "tensor"])
def test_gae_bitwise_equal_to_torch_buffer_recursion(dtype, lam):
    # The speed-oriented recursion (NumPy on the CPU) must give bit-for-bit
    # the values of the textbook in-place torch buffer recursion, so that
    # training results do not change.
    g = torch.Generator().manual_seed(0)
    T, B = 129, 8
    values = torch.randn(T, B, generator=g, dtype=dtype)
    rewards = torch.randn(T, B, generator=g, dtype=dtype)
    step_types = torch.randint(0, 3, (T, B), generator=g)
    discounts = (torch.rand(T, B, generator=g) > 0.1).to(dtype) * 0.99
    lam = torch.tensor(0.95, dtype=dtype) if lam == "tensor" else lam
    is_lasts = (step_types == L).to(dtype)
    advs = torch.zeros_like(values)
    delta = rewards[1:] + discounts[1:] * values[1:] - values[:-1]
    weighted = discounts[1:] * lam
    for t in reversed(range(T - 1)):
        advs[t] = (1 - is_lasts[t]) * (delta[t] + weighted[t] * advs[t + 1])
    got = value_ops.generalized_advantage_estimation(
        rewards, values, step_types, discounts, td_lambda=lam
    )
    assert got.dtype == dtype and torch.equal(got, advs[:-1])
