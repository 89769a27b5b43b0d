"""Tests for alf_entropy/environments/evaluation.py."""

import gin
import gymnasium as gym
import pytest
import torch

from alf_entropy.environments import evaluate, run_episodes


def _always(action):
    return lambda obs: torch.full((obs.shape[0],), action, dtype=torch.int64)


def test_run_episodes_matches_plain_gym():
    gin.bind_parameter("GymVectorEnv.vectorization_mode", "sync")  # env i seeded with 4 + i
    returns, lengths = run_episodes("CartPole-v1", _always(1), num_episodes=3, seed=4)
    for i in range(3):
        env = gym.make("CartPole-v1")
        env.reset(seed=4 + i)
        total, n, done = 0.0, 0, False
        while not done:
            _, r, term, trunc, _ = env.step(1)
            total += r
            n += 1
            done = term or trunc
        assert returns[i] == total and lengths[i] == n


def test_evaluate_mean_and_truncation():
    # Pendulum with a 5-step limit: every episode has exactly 5 rewards
    returns, lengths = run_episodes(
        "Pendulum-v1",
        lambda obs: torch.zeros(obs.shape[0], 1),
        num_episodes=2,
        seed=0,
        max_episode_steps=5,
    )
    assert lengths == [5, 5]
    mean = evaluate(
        "Pendulum-v1",
        lambda obs: torch.zeros(obs.shape[0], 1),
        num_episodes=2,
        seed=0,
        max_episode_steps=5,
    )
    assert mean == pytest.approx(sum(returns) / 2)


def test_pass_time_step_and_errors():
    seen = []

    def policy(ts):
        seen.append(ts.step_type)
        return torch.zeros(ts.observation.shape[0], dtype=torch.int64)

    evaluate("CartPole-v1", policy, num_episodes=1, seed=0, pass_time_step=True)
    assert int(seen[0][0]) == 0 and len(seen) > 1
    with pytest.raises(ValueError, match="num_episodes"):
        evaluate("CartPole-v1", policy, num_episodes=0)
    with pytest.raises(ValueError, match="max_steps"):
        run_episodes("CartPole-v1", policy, max_steps=0)


def test_evaluate_takes_run_episodes_arguments_declared_once():
    import inspect

    run = inspect.signature(run_episodes).parameters
    ev = inspect.signature(evaluate).parameters
    assert list(ev) == list(run)
    assert all(ev[n].default == run[n].default for n in run)
    gin.parse_config("evaluate.max_steps = 3")  # run_episodes' arguments bind through evaluate
    try:
        assert evaluate("CartPole-v1", _always(1), num_episodes=1, seed=0) == 3.0
    finally:
        gin.clear_config()
    with pytest.raises(ValueError, match="num_episode"):
        gin.parse_config("evaluate.num_episode = 2")  # a misspelt binding still fails
