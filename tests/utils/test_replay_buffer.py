"""ReplayBuffer: ring-buffer writes, uniform sampling, state round trip, errors."""

import numpy as np
import pytest
import torch

from alf_entropy.utils.replay_buffer import ReplayBuffer, Transition


def _batch(start, n):
    x = torch.arange(start, start + n, dtype=torch.float32)
    return Transition(
        observation={"a": x.unsqueeze(1).repeat(1, 3), "b": x.long()},
        action=x.unsqueeze(1),
        reward=x,
        discount=torch.ones(n),
        next_observation={"a": x.unsqueeze(1).repeat(1, 3) + 1, "b": x.long() + 1},
        valid=torch.ones(n, dtype=torch.bool),
    )


def test_add_wraps_around_and_keeps_the_newest_rows():
    buf = ReplayBuffer(5)
    buf.add(_batch(0, 3))
    assert len(buf) == 3
    buf.add(_batch(3, 3))  # rows 3, 4 then 5 overwrites row 0
    assert len(buf) == 5
    stored = buf.state_dict()["data"]
    reward = stored[
        [i for i, x in enumerate(stored) if x.dim() == 1 and x.dtype == torch.float32][0]
    ]
    assert sorted(reward.tolist()) == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_sample_draws_consistent_rows_from_the_filled_part():
    torch.manual_seed(0)
    buf = ReplayBuffer(100)
    buf.add(_batch(0, 7))
    s = buf.sample(500)
    assert s.reward.shape == (500,) and s.observation["a"].shape == (500, 3)
    assert set(s.reward.tolist()) == set(float(i) for i in range(7))  # uniform over 7 rows
    # every field of a sampled row comes from the same stored row
    assert torch.equal(s.observation["b"].float(), s.reward)
    assert torch.equal(s.next_observation["a"][:, 0], s.reward + 1)
    assert s.observation["b"].dtype == torch.int64


def test_state_dict_round_trip_continues_identically():
    buf = ReplayBuffer(6)
    for k in range(4):
        buf.add(_batch(3 * k, 3))
    other = ReplayBuffer(6)
    other.load_state_dict(buf.state_dict(), _batch(0, 1))
    assert (other.size, other.state_dict()["pos"]) == (buf.size, buf.state_dict()["pos"])
    buf.add(_batch(100, 2))
    other.add(_batch(100, 2))
    for a, b in zip(buf.state_dict()["data"], other.state_dict()["data"]):
        assert torch.equal(a, b)
    torch.manual_seed(1)
    s1 = buf.sample(8)
    torch.manual_seed(1)
    s2 = other.sample(8)
    assert torch.equal(s1.reward, s2.reward)


def test_bad_inputs():
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0)
    buf = ReplayBuffer(4)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(2)
    with pytest.raises(TypeError, match="torch.Tensor, got ndarray"):  # first add
        buf.add({"obs": np.zeros((2, 3), np.float32)})
    with pytest.raises(ValueError, match="capacity"):
        buf.add(_batch(0, 5))
    buf.add(_batch(0, 2))
    with pytest.raises(ValueError, match="fields"):
        buf.add((torch.zeros(2),))
    bad = _batch(0, 2)._replace(action=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="shape"):
        buf.add(bad)
    small = ReplayBuffer(2)
    with pytest.raises(ValueError, match="fit capacity"):
        small.load_state_dict(buf.state_dict() | {"size": 3}, _batch(0, 1))
