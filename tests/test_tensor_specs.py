"""Tests for alf_entropy.tensor_specs (specs and gymnasium conversion)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec, from_gym_space


# ------------------------------------------------------------------ TensorSpec
def test_tensor_spec_shape_and_dtype():
    spec = TensorSpec((2, 3), torch.float64)
    assert spec.shape == (2, 3)
    assert spec.dtype == torch.float64
    assert spec.numel == 6
    assert TensorSpec().shape == () and TensorSpec().numel == 1
    assert TensorSpec().dtype == torch.float32
    assert TensorSpec(4).shape == (4,)


@pytest.mark.parametrize(
    "dtype,expected",
    [(np.int32, torch.int32), ("float64", torch.float64), (np.dtype("uint8"), torch.uint8)],
)
def test_tensor_spec_accepts_numpy_dtypes(dtype, expected):
    assert TensorSpec((1,), dtype).dtype == expected


def test_tensor_spec_bad_dtype_and_shape():
    with pytest.raises(TypeError):
        TensorSpec((1,), object)
    with pytest.raises(ValueError, match="non-negative"):
        TensorSpec((2, -1))


@pytest.mark.parametrize(
    "dtype,discrete",
    [
        (torch.float32, False),
        (torch.float64, False),
        (torch.int64, True),
        (torch.int32, True),
        (torch.bool, True),
    ],
)
def test_is_discrete_is_continuous(dtype, discrete):
    spec = TensorSpec((), dtype)
    assert spec.is_discrete is discrete
    assert spec.is_continuous is (not discrete)


def test_zeros_with_outer_dims():
    spec = TensorSpec((3,), torch.int64)
    z = spec.zeros((4, 2))
    assert z.shape == (4, 2, 3)
    assert z.dtype == torch.int64
    assert torch.count_nonzero(z) == 0
    assert spec.zeros().shape == (3,)


def test_tensor_spec_equality_and_hash():
    a = TensorSpec((2,), torch.float32)
    assert a == TensorSpec((2,), torch.float32)
    assert hash(a) == hash(TensorSpec((2,), torch.float32))
    assert a != TensorSpec((3,), torch.float32)
    assert a != TensorSpec((2,), torch.float64)
    assert a != BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
    assert len({a, TensorSpec((2,)), TensorSpec((3,))}) == 2


# ------------------------------------------------------------ BoundedTensorSpec
def test_bounded_spec_scalar_bounds_broadcast():
    spec = BoundedTensorSpec((2, 3), torch.float32, -1.0, [1.0, 2.0, 3.0])
    assert spec.shape == (2, 3)
    assert isinstance(spec.minimum, np.ndarray) and isinstance(spec.maximum, np.ndarray)
    assert np.broadcast_to(spec.maximum, (2, 3))[1].tolist() == [1.0, 2.0, 3.0]
    assert float(spec.minimum) == -1.0


def test_bounded_spec_bounds_that_do_not_broadcast_raise():
    with pytest.raises(ValueError, match="broadcast"):
        BoundedTensorSpec((3,), torch.float32, [0.0, 0.0], 1.0)


@pytest.mark.parametrize("minimum,maximum", [(1.0, 0.0), ([0.0, 5.0], [1.0, 4.0])])
def test_bounded_spec_minimum_above_maximum_raises(minimum, maximum):
    with pytest.raises(ValueError, match="minimum must be <= maximum"):
        BoundedTensorSpec((2,), torch.float32, minimum, maximum)


def test_bounded_spec_equal_bounds_allowed():
    spec = BoundedTensorSpec((), torch.int64, 3, 3)
    assert spec.num_actions == 1


def test_bounded_spec_default_maximum():
    assert int(BoundedTensorSpec((), torch.int64).maximum) == np.iinfo(np.int32).max
    assert float(BoundedTensorSpec((), torch.float32).maximum) == float(np.finfo(np.float32).max)


def test_num_actions():
    assert BoundedTensorSpec((), torch.int64, 0, 4).num_actions == 5
    assert BoundedTensorSpec((), torch.int64, 2, 4).num_actions == 3
    # Same bounds for every element of a vector spec is fine.
    assert BoundedTensorSpec((3,), torch.int64, 0, 1).num_actions == 2


def test_num_actions_errors():
    with pytest.raises(ValueError, match="discrete"):
        BoundedTensorSpec((), torch.float32, 0.0, 1.0).num_actions
    with pytest.raises(ValueError, match="same bounds"):
        BoundedTensorSpec((2,), torch.int64, 0, [1, 2]).num_actions


def test_bounded_spec_equality_and_hash():
    a = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
    assert a == BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
    assert hash(a) == hash(BoundedTensorSpec((2,), torch.float32, -1.0, 1.0))
    assert a != BoundedTensorSpec((2,), torch.float32, -2.0, 1.0)
    assert a != BoundedTensorSpec((2,), torch.float32, -1.0, 2.0)
    assert a != BoundedTensorSpec((2,), torch.float64, -1.0, 1.0)
    assert a != TensorSpec((2,), torch.float32)


def test_bounded_spec_scalar_and_full_bounds_are_equal():
    scalar = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
    full = BoundedTensorSpec((2,), torch.float32, [-1.0, -1.0], [1.0, 1.0])
    assert scalar == full
    assert hash(scalar) == hash(full)


def test_from_spec_and_zeros():
    spec = BoundedTensorSpec.from_spec(TensorSpec((2,), torch.int64), 0, 3)
    assert spec.shape == (2,) and spec.dtype == torch.int64 and spec.num_actions == 4
    assert spec.zeros((5,)).shape == (5, 2)


# --------------------------------------------------------------- from_gym_space
def test_from_gym_box_float():
    space = gym.spaces.Box(low=np.array([-1.0, -2.0]), high=np.array([1.0, 3.0]), dtype=np.float64)
    spec = from_gym_space(space)
    assert isinstance(spec, BoundedTensorSpec)
    assert spec.shape == (2,)
    assert spec.dtype == torch.float32
    assert spec.is_continuous
    assert spec.minimum.tolist() == [-1.0, -2.0]
    assert spec.maximum.tolist() == [1.0, 3.0]


def test_from_gym_box_integer_keeps_dtype():
    spec = from_gym_space(gym.spaces.Box(0, 255, (2, 2), np.uint8))
    assert spec.dtype == torch.uint8
    assert spec.is_discrete
    assert spec.num_actions == 256


def test_from_gym_discrete():
    spec = from_gym_space(gym.spaces.Discrete(4))
    assert spec == BoundedTensorSpec((), torch.int64, 0, 3)
    assert spec.num_actions == 4


def test_from_gym_discrete_with_start():
    spec = from_gym_space(gym.spaces.Discrete(5, start=2))
    assert spec.shape == ()
    assert spec.dtype == torch.int64
    assert int(spec.minimum) == 2 and int(spec.maximum) == 6
    assert spec.num_actions == 5


def test_from_gym_multi_discrete():
    spec = from_gym_space(gym.spaces.MultiDiscrete([3, 4]))
    assert spec.shape == (2,)
    assert spec.dtype == torch.int64
    assert spec.minimum.tolist() == [0, 0]
    assert spec.maximum.tolist() == [2, 3]


def test_from_gym_multi_discrete_with_start():
    spec = from_gym_space(gym.spaces.MultiDiscrete([3, 4], start=[1, -2]))
    assert spec.minimum.tolist() == [1, -2]
    assert spec.maximum.tolist() == [3, 1]


def test_from_gym_dict_and_tuple():
    space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
            "sub": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3))),
        }
    )
    spec = from_gym_space(space)
    assert isinstance(spec, dict) and set(spec) == {"pos", "sub"}
    assert spec["pos"] == BoundedTensorSpec((3,), torch.float32, -1.0, 1.0)
    assert isinstance(spec["sub"], tuple) and len(spec["sub"]) == 2
    assert [s.num_actions for s in spec["sub"]] == [2, 3]


@pytest.mark.parametrize("space", [gym.spaces.MultiBinary(3), gym.spaces.Text(5), "not a space"])
def test_from_gym_unsupported_space_raises(space):
    with pytest.raises(TypeError, match="Unsupported"):
        from_gym_space(space)


# ------------------------------------------------------- replace and sample (ALF)
def test_replace_keeps_what_is_not_given():
    spec = TensorSpec((2,), torch.float32)
    assert spec.replace(dtype=torch.int32) == TensorSpec((2,), torch.int32)
    assert spec.replace(shape=(3, 1)) == TensorSpec((3, 1), torch.float32)
    bounded = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
    assert bounded.replace(maximum=2.0) == BoundedTensorSpec((2,), torch.float32, -1.0, 2.0)
    assert bounded.replace(shape=(4,)).shape == (4,)
    assert isinstance(bounded.replace(dtype=torch.float64), BoundedTensorSpec)
    with pytest.raises(ValueError, match="minimum"):
        bounded.replace(minimum=3.0)


@pytest.mark.parametrize(
    "dtype,lo,hi",
    [
        (torch.int64, 0, 3),
        (torch.uint8, 0, 255),
        (torch.int8, -128, 127),
        (torch.int64, np.iinfo(np.int64).max - 2, np.iinfo(np.int64).max),
        (torch.int32, np.iinfo(np.int32).min, np.iinfo(np.int32).min + 1),
    ],
)
def test_integer_sample_includes_the_upper_bound_and_stays_in_the_dtype(dtype, lo, hi):
    torch.manual_seed(0)
    x = BoundedTensorSpec((2,), dtype, lo, hi).sample(outer_dims=(5000,))
    assert x.shape == (5000, 2) and x.dtype == dtype
    values = set(x.flatten().tolist())
    assert values == set(range(int(lo), int(hi) + 1))


def test_float_sample_is_within_bounds_even_when_they_round_in_float32():
    torch.manual_seed(0)
    spec = BoundedTensorSpec((3,), torch.float32, [-1.0, 0.0, 0.1], [0.1, 1e-30, 0.3])
    x = spec.sample(outer_dims=(5, 2000)).double().numpy()
    assert x.shape == (5, 2000, 3)
    assert (x >= spec.minimum).all() and (x <= spec.maximum).all()
    assert x[..., 0].max() > 0.09 and x[..., 0].min() < -0.99  # it covers the range
    torch.manual_seed(1)
    a = spec.sample((4,))
    torch.manual_seed(1)
    assert torch.equal(a, spec.sample((4,)))  # reproducible from torch's seed
    with pytest.raises(ValueError, match="finite"):
        BoundedTensorSpec((), torch.float32, -np.inf, 0.0).sample()
