"""OnPolicyTrainer with K agents: agent k is the single run with seed k; each agent is a run."""
import functools
from typing import Any, List, Tuple

import pytest
import torch

from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.controllers import PIDEntropyTargetAlgorithm
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

PPO = functools.partial(PPOAlgorithm, enforce_entropy_target=True)
SMALL = dict(env_id="CartPole-v1", num_envs=4, unroll_length=16, algorithm_ctor=PPO,
             progress_bar=False, device="cpu", checkpoint_interval=None)


def _recording_losses(trainer: OnPolicyTrainer) -> List[torch.Tensor]:
    """Record every update's loss: ``[K]`` per update for K agents, a scalar for one."""
    losses: List[torch.Tensor] = []
    alg = trainer.algorithm
    if trainer.num_agents > 1:
        update = alg.update

        def _batched(loss_info: Any, mask: torch.Tensor) -> torch.Tensor:
            out = update(loss_info, mask)
            losses.append(out.clone())
            return out

        alg.update = _batched
    else:
        update = alg.update_with_gradient

        def _single(loss_info: Any, **kwargs: Any) -> Any:
            out = update(loss_info, **kwargs)
            losses.append(out[0].loss.clone())
            return out

        alg.update_with_gradient = _single
    return losses


def _max_param_diff(a: dict, b: dict) -> float:
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in b
               if b[n].is_floating_point())


def _single(tmp_path: Any, seed: int, **kwargs: Any) -> Tuple[OnPolicyTrainer, torch.Tensor]:
    trainer = OnPolicyTrainer(str(tmp_path / f"single{seed}"), seed=seed, **{**SMALL, **kwargs})
    losses = _recording_losses(trainer)
    trainer.train()
    return trainer, torch.stack(losses)


def test_agent_k_of_a_batch_follows_the_single_trainer_with_seed_k(tmp_path: Any) -> None:
    trainer = OnPolicyTrainer(str(tmp_path / "batch"), seed=3, num_agents=3, num_iterations=1,
                              **SMALL)
    assert trainer.num_agents == 3 and trainer.seeds == [3, 4, 5]
    losses = _recording_losses(trainer)
    result = trainer.train()
    assert result["iteration"] == 1 and result["env_steps"] == 16 * 4  # one agent's steps
    losses = torch.stack(losses)
    for k, seed in enumerate(trainer.seeds):
        single, single_losses = _single(tmp_path, seed, num_iterations=1)
        assert losses.shape[0] == single_losses.shape[0]  # every update of the iteration
        torch.testing.assert_close(losses[:, k], single_losses, rtol=1e-5, atol=1e-5)
        assert _max_param_diff(trainer.algorithm.agent_state_dict(k),
                               single.algorithm.state_dict()) < 1e-6


def test_explicit_seeds_and_targets(tmp_path: Any) -> None:
    ctor = functools.partial(PPOAlgorithm, enforce_entropy_target=True,
                             entropy_target_cls=PIDEntropyTargetAlgorithm)
    targets = [0.3, 0.6]
    trainer = OnPolicyTrainer(str(tmp_path / "batch"), seeds=[7, 2], target_entropies=targets,
                              num_iterations=1, **{**SMALL, "algorithm_ctor": ctor})
    assert trainer.agent_dirs == ["target_entropy=0.3+seed=7", "target_entropy=0.6+seed=2"]
    losses = _recording_losses(trainer)
    trainer.train()
    losses = torch.stack(losses)
    for k, (seed, target) in enumerate(zip([7, 2], targets)):
        single_ctor = functools.partial(ctor, entropy_target_cls=functools.partial(
            PIDEntropyTargetAlgorithm, target_entropy=target))
        single, single_losses = _single(tmp_path, seed, num_iterations=1,
                                        algorithm_ctor=single_ctor)
        torch.testing.assert_close(losses[:, k], single_losses, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(trainer.algorithm.entropy_target_algorithm.alpha[k],
                                   single.algorithm.entropy_target_algorithm.alpha,
                                   rtol=1e-6, atol=0)


def test_argument_errors(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(tmp_path / "r")
    with pytest.raises(ValueError, match="num_agents"):
        OnPolicyTrainer(root, num_agents=0, num_iterations=1, **SMALL)
    with pytest.raises(ValueError, match="distinct"):
        OnPolicyTrainer(root, seeds=[1, 1], num_iterations=1, **SMALL)
    with pytest.raises(ValueError, match="at least two"):
        OnPolicyTrainer(root, seeds=[1], num_iterations=1, **SMALL)
    with pytest.raises(ValueError, match="num_agents is 3 but seeds has 2"):
        OnPolicyTrainer(root, num_agents=3, seeds=[1, 2], num_iterations=1, **SMALL)
    with pytest.raises(ValueError, match="target_entropies needs num_agents > 1"):
        OnPolicyTrainer(root, target_entropies=[0.3], num_iterations=1, **SMALL)
    with pytest.raises(ValueError, match="target_entropies has 1 entries for 2"):
        OnPolicyTrainer(root, num_agents=2, target_entropies=[0.3], num_iterations=1, **SMALL)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="several ranks"):
        OnPolicyTrainer(root, num_agents=2, num_iterations=1, **SMALL)


def test_num_agents_is_bound_in_gin(tmp_path: Any) -> None:
    import gin

    gin.parse_config("OnPolicyTrainer.num_agents = 2")
    trainer = OnPolicyTrainer(str(tmp_path / "batch"), seed=4, num_iterations=1, **SMALL)
    assert trainer.seeds == [4, 5] and trainer.algorithm.num_agents == 2
