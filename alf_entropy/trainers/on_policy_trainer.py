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

With ``num_agents = K > 1`` (or ``seeds``) the same loop trains K agents as
one batch (:class:`~alf_entropy.algorithms.many_agents.ManyAgents` on
:class:`~alf_entropy.environments.agent_envs.AgentEnvs`): agent ``k`` is the
run a single trainer with seed ``seeds[k]`` would be, and writes its
summaries to its own run directory (``root_dir/seed=N``, see
``docs/many_agents.md``).
"""
from typing import Any, Callable, List, Optional, Sequence

import gin
import torch

from alf_entropy.algorithm import Algorithm
from alf_entropy.algorithms.many_agents import ManyAgents
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.data_structures import make_experience
from alf_entropy.trainers.agents import AgentsTrainerMixin
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
class OnPolicyTrainer(AgentsTrainerMixin, Trainer):
    """Train an on-policy algorithm (A2C/PPO) on a gymnasium environment.

    Takes :class:`~alf_entropy.trainers.trainer.Trainer`'s arguments
    (``num_iterations``, ``num_env_steps``, ``eval_interval``, ``seed``,
    ``device``, ...; ``num_env_steps`` counts whole iterations of
    ``unroll_length * num_envs`` steps, so it is rounded up), with these
    defaults and the ones below.

    K agents (``num_agents > 1`` or ``seeds``): each agent is a run of its own
    with ``num_envs`` environments seeded from its seed; ``num_env_steps``,
    ``env_steps`` and the summaries count one agent's steps (the process steps
    K times as many); agent ``k``'s summaries go to ``root_dir/seed=N/train``
    (``root_dir/target_entropy=T+seed=N/train`` with ``target_entropies``), the
    checkpoints of the whole batch to ``root_dir/checkpoints``; every agent is
    evaluated on its own environments, ``eval/return`` in ``metrics`` is the
    lowest agent's, so ``stop_eval_return`` stops once every agent reaches it.
    Not with several ranks (``ValueError``).

    Args:
        root_dir: where summaries, checkpoints and the config go (see
            :mod:`alf_entropy.trainers.trainer`); an existing run is resumed.
        env_id: the gymnasium id.
        num_envs: parallel environments ``B``.
        algorithm_ctor: ``(observation_spec, action_spec) -> Algorithm``
            with ``rollout_step``, ``predict_step`` and ``train_from_unroll``
            (``ActorCriticAlgorithm``/``PPOAlgorithm``).
        unroll_length: steps per env per iteration ``T``.
        num_agents: K, agents trained side by side in this process, with seeds
            ``seed, seed + 1, ..., seed + K - 1``; 1: a single run.
        seeds: the K agents' seeds instead (at least two; distinct unless
            ``target_entropies`` gives each agent its own (target, seed));
            ``num_agents`` must then be 1 or ``len(seeds)``.
        target_entropies: one target entropy (a number or a schedule, as the
            controller's ``target_entropy``) per agent; needs K > 1 and agents
            with an entropy controller.  None: the configured one for all.
        **kwargs: ``Trainer``'s other arguments.

    Raises:
        ValueError: for out-of-range arguments, K > 1 under several ranks, or
            ``target_entropies`` of the wrong length or for one agent.
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
        num_agents: int = 1,
        seeds: Optional[Sequence[int]] = None,
        target_entropies: Optional[Sequence[Any]] = None,
        **kwargs: Any,
    ):
        check_int("num_envs", num_envs, minimum=1)
        check_int("unroll_length", unroll_length, minimum=1)
        self._unroll_length = unroll_length
        self._init_agents(num_agents, seeds, target_entropies, kwargs.get("seed", 0))
        super().__init__(
            root_dir,
            env_id=env_id,
            num_envs=num_envs,
            algorithm_ctor=algorithm_ctor,
            steps_per_iteration=unroll_length * num_envs,
            **kwargs,
        )
        self._agent_callbacks()

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
        out = algorithm.train_from_unroll(stack_experiences(experiences), time_step)
        if self._seeds is not None:
            self._last_train = out  # what agent_summary_values reads (no host sync here)
        return self._limits.steps_per_iteration

    def _build_agents(self, observation_spec: Any, action_spec: Any) -> ManyAgents:
        return ManyAgents(observation_spec, action_spec, self._seeds,
                          algorithm_ctor=self._algorithm_ctor,
                          target_entropies=self._target_entropies, device=self._device)
