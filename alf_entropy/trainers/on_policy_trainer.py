"""``OnPolicyTrainer``: the training loop of A2C/PPO (and their controllers).

One iteration (``_train_iteration``) reads like CleanRL::

    for t in range(unroll_length):                 # collect, no gradient
        alg_step = algorithm.rollout_step(time_step)
        experiences.append(make_experience(time_step, alg_step))
        time_step = env.step(alg_step.output)
    algorithm.train_from_unroll(stack(experiences), time_step)  # epochs x minibatches

Everything around it is :class:`~alf_entropy.trainers.trainer.Trainer`'s.  Nothing on
the path reads tensors on the host but the environment step.  K agents are
:class:`~alf_entropy.algorithms.many_agents.ManyAgents` on ``AgentEnvs``: the same loop.
"""
from typing import Any, Callable, List

import torch

from alf_entropy.algorithm import Algorithm
from alf_entropy.algorithms.many_agents import ManyAgents
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.data_structures import make_experience
from alf_entropy.trainers.trainer import Trainer
from alf_entropy.utils import nest
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.signatures import forwards_arguments

__all__ = ["OnPolicyTrainer", "stack_experiences"]


def stack_experiences(experiences: List[Any]) -> Any:
    """Stack ``T`` nests of ``[B, ...]`` tensors into one of ``[T, B, ...]``.

    Raises:
        ValueError: if the list is empty.
    """
    if not experiences:
        raise ValueError("experiences must be a non-empty list")
    stacked = [torch.stack(leaves) for leaves in zip(*[nest.flatten(e) for e in experiences])]
    return nest.pack_sequence_as(experiences[0], stacked)


class OnPolicyTrainer(Trainer):
    """Train an on-policy algorithm (A2C/PPO) on a gymnasium environment.

    Takes :class:`~alf_entropy.trainers.trainer.Trainer`'s arguments (``num_env_steps``
    counts whole iterations of ``unroll_length * num_envs`` steps: rounded up).  K agents
    (``num_agents``/``seeds``, see ``docs/many_agents.md``): agent ``k`` is the run of a
    single trainer with seed ``seeds[k]``, writing to ``root_dir/seed=N``.

    Args:
        root_dir: where summaries, checkpoints and the config go; a run there is resumed.
        env_id: the gymnasium id.
        num_envs: parallel environments ``B`` (per agent).
        algorithm_ctor: ``(observation_spec, action_spec) -> Algorithm`` with
            ``rollout_step``, ``predict_step`` and ``train_from_unroll``.
        unroll_length: steps per env per iteration ``T``.
        **kwargs: ``Trainer``'s other arguments.
    """

    agent_batch = ManyAgents

    @forwards_arguments(Trainer.__init__, supplied=("steps_per_iteration",))
    def __init__(self, root_dir: str, *, env_id: str = "CartPole-v1", num_envs: int = 8,
                 algorithm_ctor: Callable[..., Algorithm] = PPOAlgorithm,
                 unroll_length: int = 128, **kwargs: Any):
        check_int("num_envs", num_envs, minimum=1)
        self._unroll_length = check_int("unroll_length", unroll_length, minimum=1)
        super().__init__(root_dir, env_id=env_id, num_envs=num_envs, algorithm_ctor=algorithm_ctor,
                         steps_per_iteration=unroll_length * num_envs, **kwargs)

    def _train_iteration(self) -> int:
        """Collect ``unroll_length`` steps and train on them; return the env steps."""
        algorithm, env, time_step = self._algorithm, self._env, self._time_step
        experiences = []
        # inference_mode: cheaper than no_grad; the unroll is only read afterwards.
        with torch.inference_mode():
            for _ in range(self._unroll_length):
                alg_step = algorithm.rollout_step(time_step)
                experiences.append(make_experience(time_step._replace(env_info=()), alg_step))
                time_step = env.step(alg_step.output)
        self._time_step = time_step
        algorithm.train_from_unroll(stack_experiences(experiences), time_step)
        return self._limits.steps_per_iteration
