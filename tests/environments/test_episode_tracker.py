"""Tests for alf_entropy/environments/episode_tracker.py."""
import gymnasium as gym
import pytest
import torch

from alf_entropy.data_structures import StepType, TimeStep
from alf_entropy.environments import EpisodeReturnTracker, GymVectorEnv


def _ts(step_type, reward):
    return TimeStep(step_type=torch.tensor(step_type), reward=torch.tensor(reward))


def test_manual_sequence():
    F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
    tr = EpisodeReturnTracker(2, "cpu")
    tr.update(_ts([F, F], [0.0, 0.0]))
    tr.update(_ts([M, M], [1.0, 2.0]))
    tr.update(_ts([L, M], [3.0, 2.0]))
    assert torch.equal(tr.episode_length, torch.tensor([2, 2]))
    tr.update(_ts([F, L], [0.0, 5.0]))
    tr.update(_ts([M, F], [1.0, 0.0]))
    assert int(tr.num_finished) == 2
    returns, lengths = tr.pop_finished()
    assert returns == [4.0, 9.0] and lengths == [2, 3]
    assert tr.pop_finished() == ([], [])
    tr.update(_ts([L, M], [1.0, 1.0]))
    assert tr.pop_finished() == ([2.0], [2])


def test_capacity_keeps_most_recent():
    F, L = StepType.FIRST, StepType.LAST
    tr = EpisodeReturnTracker(2, capacity=3)
    for k in range(3):
        tr.update(_ts([F, F], [0.0, 0.0]))
        tr.update(_ts([L, L], [float(2 * k), float(2 * k + 1)]))
    returns, lengths = tr.pop_finished()
    assert returns == [3.0, 4.0, 5.0] and lengths == [1, 1, 1]


def test_matches_gym_sums_on_cartpole():
    env = GymVectorEnv("CartPole-v1", num_envs=3, seed=2)
    tracker = EpisodeReturnTracker(3, env.device)
    ts = env.reset()
    tracker.update(ts)
    # reference: per-env plain gymnasium envs with the same seeds and actions
    refs = [gym.make("CartPole-v1") for _ in range(3)]
    for i, r in enumerate(refs):
        r.reset(seed=2 + i)
    ref_ret, ref_len = [0.0] * 3, [0] * 3
    expected = []
    prev_last = [False] * 3
    for _ in range(200):
        a = env.sample_random_action()
        ts = env.step(a)
        tracker.update(ts)
        for i, r in enumerate(refs):
            if prev_last[i]:
                r.reset()
                prev_last[i] = False
                continue
            _, rew, term, trunc, _ = r.step(int(a[i]))
            ref_ret[i] += rew
            ref_len[i] += 1
            if term or trunc:
                expected.append((ref_ret[i], ref_len[i]))
                ref_ret[i], ref_len[i] = 0.0, 0
                prev_last[i] = True
    returns, lengths = tracker.pop_finished()
    assert len(expected) >= 3
    # order within a step is by env index, matching the reference loop
    assert returns == [e[0] for e in expected]
    assert lengths == [e[1] for e in expected]
    env.close()


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_envs"):
        EpisodeReturnTracker(0)
    with pytest.raises(ValueError, match="capacity"):
        EpisodeReturnTracker(2, capacity=0)
    with pytest.raises(ValueError, match="shape"):
        EpisodeReturnTracker(2).update(_ts([0, 0, 0], [0.0, 0.0, 0.0]))


def test_reset_clears():
    tr = EpisodeReturnTracker(1)
    tr.update(_ts([StepType.MID], [2.0]))
    tr.update(_ts([StepType.LAST], [2.0]))
    tr.reset()
    assert float(tr.episode_return[0]) == 0.0 and tr.pop_finished() == ([], [])
