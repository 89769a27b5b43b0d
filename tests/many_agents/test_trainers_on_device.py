"""K agents through the trainers on CUDA: agent k of a batch ends where the single run
with seed k ends, its state on the device.  On the CPU the same holds more tightly in
``tests/trainers/test_many_agents_trainer.py`` (PPO) and
``tests/many_agents/test_many_sac_agents.py`` (SAC)."""

from typing import Any, Callable

import pytest
import torch

from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.trainers.off_policy_trainer import OffPolicyTrainer
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

SEEDS = [3, 5]
DEVICES = [
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    )
]


def _ppo(root: str, device: str, **agents: Any) -> OnPolicyTrainer:
    return OnPolicyTrainer(
        root,
        env_id="CartPole-v1",
        num_envs=4,
        unroll_length=16,
        algorithm_ctor=PPOAlgorithm,
        num_iterations=2,
        progress_bar=False,
        checkpoint_interval=None,
        device=device,
        **agents,
    )


def _sac(root: str, device: str, **agents: Any) -> OffPolicyTrainer:
    return OffPolicyTrainer(
        root,
        env_id="Pendulum-v1",
        initial_collect_steps=8,
        mini_batch_size=16,
        num_iterations=12,
        progress_bar=False,
        checkpoint_interval=None,
        device=device,
        **agents,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", [_ppo, _sac], ids=["ppo", "sac"])
def test_agent_k_ends_as_the_single_run_with_seed_k(
    tmp_path: Any, device: str, make: Callable[..., Any]
) -> None:
    batch = make(str(tmp_path / "batch"), device, seeds=SEEDS)
    batch.train()
    for k, seed in enumerate(SEEDS):
        single = make(str(tmp_path / f"seed={seed}"), device, seed=seed)
        single.train()
        _assert_close(
            batch.algorithm.agent_state_dict(k), single.algorithm.state_dict(), device, f"agent {k}"
        )


def _assert_close(got: Any, want: Any, device: str, name: str) -> None:
    """Tensors on ``device`` and within 1e-4 of each other (floats) or equal, in nested dicts."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), name
        for key in want:
            _assert_close(got[key], want[key], device, f"{name}/{key}")
    elif torch.is_tensor(want):
        assert got.device.type == device, name
        if want.is_floating_point():
            torch.testing.assert_close(
                got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}"
            )
        else:
            assert torch.equal(got, want), name
    else:
        assert got == want, name
