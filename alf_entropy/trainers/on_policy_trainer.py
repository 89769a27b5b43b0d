"""``OnPolicyTrainer``: the training loop of A2C/PPO (and their controllers).

One iteration (``_train_iteration``) reads top to bottom like CleanRL::

    for t in range(unroll_length):                 # collect, no gradient
        alg_step = algorithm.rollout_step(time_step)
        experiences.append(make_experience(time_step, alg_step))
        time_step = env.step(alg_step.output)
    algorithm.train_from_unroll(stack(experiences), time_step)  # epochs x minibatches

Everything around it -- limits, progress, checkpoints, exact resume and the
callbacks (summaries, evaluation, ...) -- is
:class:`~alf_entropy.trainers.trainer.Trainer`'s.

Nothing in the rollout or training path reads tensors on the host except the
environment step itself (which must hand actions to gymnasium); episode
statistics, losses and alpha are read only at summary time.
"""
from typing import Any, Callable, List

import gin
import torch

from alf_entropy.algorithms.algorithm import Algorithm
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.data_structures import make_experience
from alf_entropy.trainers.trainer import Trainer
from alf_entropy.utils import nest
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.signatures import forwards_arguments

__all__ = ["OnPolicyTrainer", "stack_experiences"]


def stack_experiences(experiences: List[Any]) -> Any:
    """Stack a list of ``T`` nests of ``[B, ...]`` tensors into ``[T, B, ...]``.

    Args:
        experiences: nests of identical structure.

    Returns:
        The nest of stacked tensors.

    Raises:
        ValueError: if the list is empty.
    """
    if not experiences:
        raise ValueError("experiences must be a non-empty list")
    flats = [nest.flatten(e) for e in experiences]
    stacked = [torch.stack(leaves) for leaves in zip(*flats)]
    return nest.pack_sequence_as(experiences[0], stacked)


@gin.configurable
class OnPolicyTrainer(Trainer):
    """Train an on-policy algorithm (A2C/PPO) on a gymnasium environment.

    Takes :class:`~alf_entropy.trainers.trainer.Trainer`'s arguments
    (``num_iterations``, ``num_env_steps``, ``eval_interval``, ``seed``,
    ``device``, ...; ``num_env_steps`` counts whole iterations of
    ``unroll_length * num_envs`` steps, so it is rounded up), with these
    defaults and one more.

    Args:
        root_dir: where summaries, checkpoints and the config go (see
            :mod:`alf_entropy.trainers.trainer`); an existing run is resumed.
        env_id: the gymnasium id.
        num_envs: parallel environments ``B``.
        algorithm_ctor: ``(observation_spec, action_spec) -> Algorithm``
            with ``rollout_step``, ``predict_step`` and ``train_from_unroll``
            (``ActorCriticAlgorithm``/``PPOAlgorithm``).
        unroll_length: steps per env per iteration ``T``.
        **kwargs: ``Trainer``'s other arguments.

    Raises:
        ValueError: for out-of-range arguments.
    """

    @forwards_arguments(Trainer.__init__, supplied=("steps_per_iteration",))
    def __init__(
        self,
        root_dir: str,
        *,
        env_id: str = "CartPole-v1",
        num_envs: int = 8,
        algorithm_ctor: Callable[..., Algorithm] = PPOAlgorithm,
        unroll_length: int = 128,
        **kwargs: Any,
    ):
        check_int("num_envs", num_envs, minimum=1)
        check_int("unroll_length", unroll_length, minimum=1)
        self._unroll_length = unroll_length
        super().__init__(
            root_dir,
            env_id=env_id,
            num_envs=num_envs,
            algorithm_ctor=algorithm_ctor,
            steps_per_iteration=unroll_length * num_envs,
            **kwargs,
        )

    def _train_iteration(self) -> int:
        """Collect ``unroll_length`` steps and train on them; return the env steps."""
        algorithm, env, time_step = self._algorithm, self._env, self._time_step
        experiences = []
        # inference_mode: cheaper than no_grad (no version counters or view
        # tracking); the unroll's tensors are only read (stacked) afterwards.
        with torch.inference_mode():
            for _ in range(self._unroll_length):
                alg_step = algorithm.rollout_step(time_step)
                experiences.append(make_experience(time_step._replace(env_info=()), alg_step))
                time_step = env.step(alg_step.output)
        self._time_step = time_step
        algorithm.train_from_unroll(stack_experiences(experiences), time_step)
        return self._limits.steps_per_iteration
