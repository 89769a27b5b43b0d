"""Tests for alf_entropy/environments/gym_vector_env.py."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from alf_entropy.data_structures import StepType, TimeStep
from alf_entropy.environments import GymVectorEnv
from alf_entropy.environments.gym_vector_env import _make_vector_env
from alf_entropy.tensor_specs import BoundedTensorSpec


def test_cartpole_specs_shapes_dtypes():
    with GymVectorEnv("CartPole-v1", num_envs=3, seed=1, device="cpu") as env:
        assert env.num_envs == 3 and env.device == torch.device("cpu")
        assert env.observation_spec.shape == (4,)
        assert env.action_spec == BoundedTensorSpec((), torch.int64, 0, 1)
        ts = env.reset()
        assert isinstance(ts, TimeStep)
        assert ts.step_type.dtype == torch.int64 and torch.all(ts.step_type == StepType.FIRST)
        assert ts.reward.dtype == torch.float32 and torch.all(ts.reward == 0)
        assert ts.discount.dtype == torch.float32 and torch.all(ts.discount == 1)
        assert ts.observation.dtype == torch.float32 and ts.observation.shape == (3, 4)
        assert ts.prev_action.dtype == torch.int64 and ts.prev_action.shape == (3,)
        assert torch.equal(ts.env_id, torch.arange(3))
        assert ts.env_info == {}
        ts = env.step(torch.tensor([0, 1, 1]))
        assert torch.all(ts.step_type == StepType.MID)
        assert torch.all(ts.reward == 1.0)
        assert torch.equal(ts.prev_action, torch.tensor([0, 1, 1]))
        for t in ts[:6]:
            assert t.device == torch.device("cpu")


def test_cartpole_termination_then_autoreset_first():
    env = GymVectorEnv("CartPole-v1", num_envs=2, seed=3, vectorization_mode="sync")
    ts = env.reset()
    gym_env = gym.make("CartPole-v1")
    ref_obs, _ = gym_env.reset(seed=3)  # env 0 is seeded with seed + 0
    assert np.allclose(ts.observation[0].numpy(), ref_obs)
    saw_last = False
    prev = ts
    ref_done = False
    for _ in range(300):
        action = env.sample_random_action()
        ts = env.step(action)
        # env 0 against a plain gymnasium env fed the same actions
        if prev.step_type[0] == StepType.LAST:
            ref_obs, _ = gym_env.reset()
            ref_done = False
            assert ts.step_type[0] == StepType.FIRST
            assert ts.reward[0] == 0 and ts.discount[0] == 1
            assert ts.prev_action[0] == 0
        else:
            ref_obs, ref_r, term, trunc, _ = gym_env.step(int(action[0]))
            ref_done = term or trunc
            assert ts.reward[0] == ref_r
            assert ts.step_type[0] == (StepType.LAST if ref_done else StepType.MID)
            assert ts.discount[0] == (0.0 if term else 1.0)
            if term:
                saw_last = True
        assert np.allclose(ts.observation[0].numpy(), ref_obs)
        # a FIRST only ever follows a LAST
        was_last = prev.step_type == StepType.LAST
        assert torch.equal(ts.step_type == StepType.FIRST, was_last)
        prev = ts
    assert saw_last, "random CartPole must terminate within 300 steps"
    env.close()
    env.close()  # idempotent


def test_pendulum_truncation_has_discount_one():
    env = GymVectorEnv("Pendulum-v1", num_envs=2, seed=0, max_episode_steps=3)
    spec = env.action_spec
    assert spec.is_continuous and spec.shape == (1,)
    ts = env.reset()
    types, discounts, rewards = [], [], []
    for _ in range(8):
        ts = env.step(torch.zeros(2, 1))
        types.append(ts.step_type.tolist())
        discounts.append(ts.discount.tolist())
        rewards.append(ts.reward.tolist())
    F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
    assert types == [[M, M], [M, M], [L, L], [F, F], [M, M], [M, M], [L, L], [F, F]]
    assert all(d == [1.0, 1.0] for d in discounts)
    assert rewards[3] == [0.0, 0.0] and all(r < 0 for r in rewards[2])
    env.close()


def test_continuous_actions_are_clipped():
    env = GymVectorEnv("Pendulum-v1", num_envs=2, seed=0)
    env.reset()
    ts = env.step(torch.tensor([[100.0], [-100.0]]))
    assert torch.equal(ts.prev_action, torch.tensor([[2.0], [-2.0]]))
    # same as sending the bounds themselves
    env2 = GymVectorEnv("Pendulum-v1", num_envs=2, seed=0)
    env2.reset()
    ts2 = env2.step(torch.tensor([[2.0], [-2.0]]))
    assert torch.equal(ts.observation, ts2.observation)
    assert torch.equal(ts.reward, ts2.reward)
    env.close()
    env2.close()


def _rollout(seed, actions):
    env = GymVectorEnv("CartPole-v1", num_envs=2, seed=seed)
    steps = [env.reset()]
    for a in actions:
        steps.append(env.step(a))
    env.close()
    return steps


def test_seeding_determinism():
    g = torch.Generator().manual_seed(0)
    actions = [torch.randint(0, 2, (2,), generator=g) for _ in range(60)]
    a = _rollout(7, actions)
    b = _rollout(7, actions)
    c = _rollout(8, actions)
    for x, y in zip(a, b):
        for fx, fy in zip(x[:6], y[:6]):
            assert torch.equal(fx, fy)
    assert not torch.equal(a[0].observation, c[0].observation)
    # random actions are seeded too
    e1 = GymVectorEnv("CartPole-v1", num_envs=4, seed=5)
    e2 = GymVectorEnv("CartPole-v1", num_envs=4, seed=5)
    assert all(torch.equal(e1.sample_random_action(), e2.sample_random_action()) for _ in range(5))
    e1.close()
    e2.close()


def test_second_reset_continues_rng():
    env = GymVectorEnv("CartPole-v1", num_envs=1, seed=0)
    o1 = env.reset().observation
    o2 = env.reset().observation
    assert not torch.equal(o1, o2)
    env.close()


def test_bad_inputs():
    with pytest.raises(ValueError, match="num_envs"):
        GymVectorEnv("CartPole-v1", num_envs=0)
    with pytest.raises(ValueError, match="max_episode_steps"):
        GymVectorEnv("CartPole-v1", max_episode_steps=0)
    with pytest.raises(TypeError, match="env_kwargs"):
        GymVectorEnv("CartPole-v1", env_kwargs=[1])
    with pytest.raises(ValueError, match="NoSuchEnv"):
        GymVectorEnv("NoSuchEnv-v0", num_envs=1)
    env = GymVectorEnv("CartPole-v1", num_envs=2)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(torch.zeros(2, dtype=torch.int64))
    env.reset()
    with pytest.raises(ValueError, match="shape"):
        env.step(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        env.step(torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="integers"):
        env.step(torch.tensor([0.5, 1.0]))
    env.step(torch.tensor([0.0, 1.0]))  # integral floats are accepted
    env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


def test_asynchronous_matches_sync():
    actions = [torch.tensor([[1.0], [-0.5]])] * 3
    results = []
    for mode in ("sync", "async"):
        env = GymVectorEnv("Pendulum-v1", num_envs=2, seed=11, vectorization_mode=mode)
        steps = [env.reset()] + [env.step(a) for a in actions]
        env.close()
        results.append(steps)
    for x, y in zip(*results):
        assert torch.allclose(x.observation, y.observation)
        assert torch.allclose(x.reward, y.reward)


def test_episode_statistics_match_the_time_steps():
    """Gymnasium's statistics equal the returns/lengths summed from our TimeSteps."""
    with GymVectorEnv("CartPole-v1", num_envs=3, seed=5) as env:
        ts = env.reset()
        gen = torch.Generator().manual_seed(0)
        running = torch.zeros(3)
        length = torch.zeros(3, dtype=torch.int64)
        finished = []
        for _ in range(200):
            ts = env.step(torch.randint(0, 2, (3,), generator=gen))
            first = ts.step_type == StepType.FIRST
            running = torch.where(first, 0.0, running + ts.reward)
            length = torch.where(first, 0, length + 1)
            for i in torch.nonzero(ts.step_type == StepType.LAST).flatten().tolist():
                finished.append((running[i].item(), length[i].item()))
        ((returns, lengths),) = env.pop_episode_statistics()
        assert len(finished) > 5
        assert sorted(zip(returns, lengths)) == sorted(finished)
        assert env.pop_episode_statistics() == [([], [])]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_episode_statistics_equal_gymnasiums_wrapper(env_id):
    """Our tracker gives gymnasium's ``RecordEpisodeStatistics`` values exactly
    (CartPole: terminations, float32 rewards; Pendulum: truncations, float64
    rewards), also across a second ``reset()``."""
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    n = 3
    with GymVectorEnv(env_id, num_envs=n, seed=2, max_episode_steps=30) as env:
        ref = RecordEpisodeStatistics(
            _make_vector_env(env_id, n, "auto", 30, {}), buffer_length=10_000
        )
        gen = torch.Generator().manual_seed(1)
        ours, theirs = [], []
        for part in range(2):
            env.reset()
            ref.reset(seed=2 if part == 0 else None)
            for _ in range(100):
                if env_id == "CartPole-v1":
                    action = torch.randint(0, 2, (n,), generator=gen)
                else:
                    action = torch.rand(n, 1, generator=gen) * 4 - 2
                env.step(action)
                ref.step(action.numpy())
            ((returns, lengths),) = env.pop_episode_statistics()
            ours += list(zip(returns, lengths))
        theirs = list(zip(ref.return_queue, ref.length_queue))
        assert len(ours) > 5
        assert ours == [(float(r), int(x)) for r, x in theirs]
        ref.close()


def test_state_round_trip_continues_identically():
    a = GymVectorEnv("Pendulum-v1", num_envs=2, seed=1)
    a.reset()
    for _ in range(50):
        a.step(torch.rand(2, 1) * 4 - 2)
    state = a.get_state()
    b = GymVectorEnv("Pendulum-v1", num_envs=2, seed=99)  # other seed: overwritten
    b.set_state(state)
    for _ in range(300):  # crosses the 200-step time limit: autoreset continues too
        action = torch.rand(2, 1) * 4 - 2
        ta, tb = a.step(action), b.step(action)
        for x, y in zip(ta[:5], tb[:5]):
            assert torch.equal(x, y)
    assert a.pop_episode_statistics() == b.pop_episode_statistics()
    with pytest.raises(ValueError, match="not a GymVectorEnv state"):
        b.set_state(b"garbage")
    c = GymVectorEnv("Pendulum-v1", num_envs=3)
    with pytest.raises(ValueError, match="2 envs"):
        c.set_state(state)
    for env in (a, b, c):
        env.close()


def test_numpy_vectorised_cartpole_is_the_same_mdp():
    """CartPole's own vector env ("auto" picks it) steps like the plain envs."""
    fast = GymVectorEnv("CartPole-v1", num_envs=4, seed=0)
    slow = GymVectorEnv("CartPole-v1", num_envs=4, seed=0, vectorization_mode="sync")
    assert type(fast.gym_env).__name__ == "CartPoleVectorEnv"
    assert type(slow.gym_env).__name__ == "SyncVectorEnv"
    fast.reset()
    slow.reset()
    state = fast.gym_env.state  # [4 (x, x_dot, theta, theta_dot), num_envs], float64
    for i, env in enumerate(slow.gym_env.envs):
        env.unwrapped.state = state[:, i].copy()
    gen = torch.Generator().manual_seed(0)
    ended = torch.zeros(4, dtype=torch.bool)
    steps = 0
    while not ended.all():  # until every env's first episode has ended
        action = torch.randint(0, 2, (4,), generator=gen)
        a, b = fast.step(action), slow.step(action)
        live = ~ended
        torch.testing.assert_close(a.observation[live], b.observation[live])
        assert torch.equal(a.reward[live], b.reward[live])
        assert torch.equal(a.step_type[live], b.step_type[live])
        assert torch.equal(a.discount[live], b.discount[live])
        ended |= a.step_type == StepType.LAST
        steps += 1
    assert steps > 8
    fast.close()
    slow.close()


class _Marker:
    """Unpickling this would create ``path`` (what a crafted checkpoint could do)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


class _Walk(gym.Env):
    """An env outside gymnasium: its state is this module's class."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = np.zeros(1, np.float32)
        return self.x.copy(), {}

    def step(self, action):
        self.x += np.float32(self.np_random.normal() + action)
        return self.x.copy(), float(self.x[0]), bool(abs(self.x[0]) > 20), False, {}


def test_a_state_runs_nothing_it_names_but_an_envs_own_classes(tmp_path):
    """set_state finds only what an env's state holds: a crafted state that would open a file
    is refused before it runs; a custom env's own classes still round-trip."""
    import pickle

    env = GymVectorEnv("Pendulum-v1", num_envs=2, seed=1)
    env.reset()
    marker = tmp_path / "ran"
    with pytest.raises(ValueError, match="not part of an environment state"):
        env.set_state(pickle.dumps(_Marker(str(marker))))
    assert not marker.exists()
    env.close()
    gym.register("AlfEntropyTestWalk-v0", entry_point=_Walk, max_episode_steps=50)
    try:
        a, b = (GymVectorEnv("AlfEntropyTestWalk-v0", num_envs=2, seed=s) for s in (3, 4))
        a.reset(), b.reset()
        for _ in range(5):
            a.step(torch.tensor([0, 1]))
        b.set_state(a.get_state())
        for _ in range(60):
            assert torch.equal(
                a.step(torch.tensor([1, 0])).reward, b.step(torch.tensor([1, 0])).reward
            )
    finally:
        gym.registry.pop("AlfEntropyTestWalk-v0")
