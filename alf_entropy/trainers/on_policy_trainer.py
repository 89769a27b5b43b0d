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

from typing import Any, Callable, List, Optional, Sequence

import torch

from alf_entropy.algorithms.algorithm import Algorithm
from alf_entropy.algorithms.many_agents import ManyAgents
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.data_structures import make_experience
from alf_entropy.environments.gym_vector_env import GymVectorEnv
from alf_entropy.trainers.callbacks import Callback
from alf_entropy.trainers.trainer import Trainer, trainer_arguments
from alf_entropy.utils import nest
from alf_entropy.utils.checks import check_int

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

    K agents (``num_agents``/``seeds``, see ``docs/many_agents.md``): agent ``k`` is the
    run of a single trainer with seed ``seeds[k]``, writing to ``root_dir/seed=N``.  The
    loop's arguments (``summary_interval`` to ``callbacks``) are
    :class:`~alf_entropy.trainers.trainer.Trainer`'s.

    Args:
        root_dir: where summaries, checkpoints and the config go; a run there is resumed.
        env_id: the gymnasium id.
        num_envs: parallel environments ``B`` (per agent; under ``torchrun`` the total).
        algorithm_ctor: ``(observation_spec, action_spec) -> Algorithm`` with
            ``rollout_step``, ``predict_step`` and ``train_from_unroll``.
        unroll_length: steps per env per iteration ``T``.
        num_iterations: a limit (0 or None: none from it; see ``Limits``).
        num_env_steps: a limit in (one agent's) env steps, rounded up to whole iterations
            of ``unroll_length * num_envs``.
        seed: seeds torch, NumPy, Python ``random`` and the environments.
        num_agents: K agents in one process, seeds ``seed, ..., seed + K - 1``.
        seeds: the K agents' seeds instead.
        target_entropies: one target entropy per agent (K > 1, agents with a controller).
        env_ctor: ``(env_id, num_envs=, seed=, device=) -> env`` (a ``GymVectorEnv``).
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or a ``torch.device``.
        num_threads: if given, ``torch.set_num_threads(num_threads)``.
        max_checkpoints: how many recent checkpoints to keep.
        allow_config_change: resume a run directory whose config differs (``RunDir``).
    """

    agent_batch = ManyAgents

    def __init__(
        self,
        root_dir: str,
        *,
        env_id: str = "CartPole-v1",
        num_envs: int = 8,
        algorithm_ctor: Callable[..., Algorithm] = PPOAlgorithm,
        unroll_length: int = 128,
        num_iterations: Optional[int] = None,
        num_env_steps: Optional[int] = None,
        seed: int = 0,
        num_agents: int = 1,
        seeds: Optional[Sequence[int]] = None,
        target_entropies: Optional[Sequence[Any]] = None,
        env_ctor: Callable[..., Any] = GymVectorEnv,
        device: Any = "auto",
        num_threads: Optional[int] = None,
        max_checkpoints: int = 3,
        allow_config_change: bool = False,
        summary_interval: int = 10,
        checkpoint_interval: Optional[int] = 100,
        eval_interval: Optional[int] = None,
        num_eval_episodes: int = 10,
        progress_bar: bool = True,
        summary_flush_secs: float = 10.0,
        stop_eval_return: Optional[float] = None,
        callbacks: Sequence[Callback] = (),
    ):
        run = trainer_arguments(locals(), "unroll_length")
        self._unroll_length = check_int("unroll_length", unroll_length, minimum=1)
        super().__init__(steps_per_env=self._unroll_length, **run)

    def _train_iteration(self) -> int:
        """Collect ``unroll_length`` steps and train on them; return the env steps."""
        algorithm, env, time_step = self.algorithm, self.env, self._time_step
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
