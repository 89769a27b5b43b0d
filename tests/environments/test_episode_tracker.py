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


@pytest.mark.parametrize("flush_steps", [1, 3, 7, 256])
@pytest.mark.parametrize("capacity", [1, 4, 1024])
def test_batched_flush_matches_reference(flush_steps, capacity):
    # Random episodes (several may end in the same step), read back at
    # irregular points: the result must not depend on how updates are batched.
    g = torch.Generator().manual_seed(flush_steps * 100 + capacity)
    B = 5
    tr = EpisodeReturnTracker(B, capacity=capacity, flush_steps=flush_steps)
    # plain-Python reference bookkeeping
    ret, length, done = [0.0] * B, [0] * B, []
    prev = [StepType.LAST] * B
    for t in range(60):
        st = []
        for i in range(B):
            if prev[i] == StepType.LAST:
                st.append(StepType.FIRST)
            else:
                st.append(StepType.LAST if torch.rand((), generator=g) < 0.3 else StepType.MID)
        rw = torch.randint(-3, 4, (B,), generator=g).float().tolist()
        tr.update(_ts(st, rw))
        for i in range(B):
            if st[i] == StepType.FIRST:
                ret[i], length[i] = 0.0, 0
                continue
            ret[i] += rw[i]
            length[i] += 1
            if st[i] == StepType.LAST:
                done.append((ret[i], length[i]))
        prev = st
        if t in (17, 41, 59):
            assert int(tr.num_finished) == len(done)
            kept = done[-capacity:]
            assert tr.pop_finished() == ([r for r, _ in kept], [n for _, n in kept])
            done = []
        assert tr.episode_return.tolist() == ret and tr.episode_length.tolist() == length
    assert len(done) == 0 and tr.pop_finished() == ([], [])


def test_flush_steps_validated_and_reset_drops_pending():
    with pytest.raises(ValueError, match="flush_steps"):
        EpisodeReturnTracker(2, flush_steps=0)
    with pytest.raises(ValueError, match="flush_steps"):
        EpisodeReturnTracker(2, flush_steps=True)
    F, L = StepType.FIRST, StepType.LAST
    tr = EpisodeReturnTracker(2, flush_steps=100)
    tr.update(_ts([F, F], [0.0, 0.0]))
    tr.update(_ts([L, L], [1.0, 2.0]))  # pending, not yet flushed
    tr.reset()
    assert int(tr.num_finished) == 0 and tr.pop_finished() == ([], [])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_update_and_flush_never_sync_and_match_cpu():
    F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
    steps = [([F, F, F], [0.0, 0.0, 0.0]), ([M, L, M], [1.0, 2.0, 3.0]),
             ([L, F, M], [4.0, 0.0, 5.0]), ([F, M, L], [0.0, 6.0, 7.0])] * 5
    cpu = EpisodeReturnTracker(3, "cpu", capacity=4, flush_steps=3)
    gpu = EpisodeReturnTracker(3, "cuda", capacity=4, flush_steps=3)
    gpu_steps = [
        TimeStep(step_type=torch.tensor(s, device="cuda"), reward=torch.tensor(r, device="cuda"))
        for s, r in steps
    ]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for ts in gpu_steps:  # includes several flushes (every 3 updates)
            gpu.update(ts)
        gpu._flush()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for s, r in steps:
        cpu.update(_ts(s, r))
    assert gpu.pop_finished() == cpu.pop_finished()
    assert torch.equal(gpu.episode_return.cpu(), cpu.episode_return)
