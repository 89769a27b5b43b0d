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
import re
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import gin
import torch
from absl import logging

from alf_entropy.algorithms.algorithm import Algorithm
from alf_entropy.algorithms.many_agents import ManyAgents
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.data_structures import TimeStep, make_experience
from alf_entropy.environments import evaluate
from alf_entropy.environments.agent_envs import AgentEnvs
from alf_entropy.trainers import callbacks as callbacks_lib
from alf_entropy.trainers import checkpoint as ckpt
from alf_entropy.trainers import ranks
from alf_entropy.trainers.agent_summaries import AgentSummaryCallback
from alf_entropy.trainers.trainer import _EVAL_SEED_OFFSET, Trainer
from alf_entropy.utils import distributed, nest, schedulers
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
        seeds: the K agents' seeds instead (distinct, at least two);
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
        self._seeds = _agent_seeds(num_agents, seeds, kwargs.get("seed", 0))
        self._target_entropies = None if target_entropies is None else list(target_entropies)
        self._last_train: Optional[Tuple[Any, ...]] = None
        if self._seeds is None:
            if target_entropies is not None:
                raise ValueError("target_entropies needs num_agents > 1 (or seeds); for one "
                                 "agent bind the controller's target_entropy")
        else:
            if distributed.env_world_size() > 1:
                raise ValueError(f"num_agents = {len(self._seeds)} does not run on several ranks "
                                 "(WORLD_SIZE > 1): run K agents in one process, or one agent "
                                 "per rank")
            if (self._target_entropies is not None
                    and len(self._target_entropies) != len(self._seeds)):
                raise ValueError(f"target_entropies has {len(self._target_entropies)} entries "
                                 f"for {len(self._seeds)} agents")
        super().__init__(
            root_dir,
            env_id=env_id,
            num_envs=num_envs,
            algorithm_ctor=algorithm_ctor,
            steps_per_iteration=unroll_length * num_envs,
            **kwargs,
        )
        if self._seeds is not None:  # each agent's summaries in its own run directory
            self._callbacks = [
                AgentSummaryCallback.like(c)
                if type(c) is callbacks_lib.SummaryCallback else c for c in self._callbacks]

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

    # ------------------------------------------------------------ K agents
    @property
    def num_agents(self) -> int:
        """K, the agents trained side by side (1: a single run)."""
        return 1 if self._seeds is None else len(self._seeds)

    @property
    def seeds(self) -> List[int]:
        """Each agent's seed (``[seed]`` for a single run)."""
        return [self._seed] if self._seeds is None else list(self._seeds)

    @property
    def agent_dirs(self) -> List[str]:
        """Each agent's run directory, relative to ``root_dir`` (``""`` for a single run)."""
        if self._seeds is None:
            return [""]
        if self._target_entropies is None:
            return [f"seed={s}" for s in self._seeds]
        return [f"target_entropy={_UNSAFE.sub('_', str(t))}+seed={s}"
                for t, s in zip(self._target_entropies, self._seeds)]

    def agent_summary_values(self) -> Dict[str, torch.Tensor]:
        """K agents: each agent's training summaries of the last iteration (tag -> ``[K]``)."""
        if self._seeds is None or self._last_train is None:
            return {}
        return self._algorithm.summary_values(*self._last_train)

    def _build(self) -> Tuple[Any, Any, Algorithm]:
        if self._seeds is None:
            return super()._build()
        ranks.seed_all(self._seed)
        schedulers.reset_progress()
        probe = self._env_ctor(self._env_id, num_envs=1, seed=self._seeds[0],
                               device=self._device)
        observation_spec, action_spec = probe.observation_spec, probe.action_spec
        probe.close()
        agents = ManyAgents(observation_spec, action_spec, self._seeds,
                            algorithm_ctor=self._algorithm_ctor,
                            target_entropies=self._target_entropies, device=self._device)
        return observation_spec, action_spec, agents

    def _start_env(self) -> Tuple[Any, TimeStep]:
        if self._seeds is None:
            return super()._start_env()
        # As a single run numbers its env seeds: seed + iteration * num_envs.
        env = AgentEnvs(self._env_id, self._num_envs,
                        [s + self._iteration * self._num_envs for s in self._seeds],
                        device=self._device, env_ctor=self._env_ctor)
        restored, self._restored_env = self._restored_env, None
        if restored:
            env.set_state([ckpt.tensor_to_bytes(t) for t in restored["state"]])
            return env, TimeStep(**{
                k: v.to(self._device) if isinstance(v, torch.Tensor) else v
                for k, v in restored["time_step"].items()
            })
        if restored is not None:
            logging.warning("The checkpoint holds no state of the %s environments: their "
                            "episodes restart, so the resumed run is not bit-exact with an "
                            "uninterrupted one.", self._env_id)
        return env, env.reset()

    def _env_state(self) -> Dict[str, Any]:
        if self._seeds is None:
            return super()._env_state()
        if self._env is None or self._in_iteration:
            return {}
        states = self._env.get_state()
        if any(state is None for state in states):
            return {}
        return {"state": [ckpt.bytes_to_tensor(state) for state in states],
                "time_step": self._time_step._asdict()}

    def _load_own(self, state: Dict[str, Any]) -> None:
        if self._seeds is None:
            return super()._load_own(state)
        env_state = state.get("env") or {}
        if env_state:
            if (not isinstance(env_state["state"], (list, tuple))
                    or len(env_state["state"]) != len(self._seeds)):
                raise ValueError(f"its environment state is not one per agent of "
                                 f"{len(self._seeds)}")
            TimeStep(**env_state["time_step"])
        self._load_extra_state(state.get("extra") or {})

    def _extra_state(self) -> Dict[str, Any]:
        if self._seeds is None:
            return super()._extra_state()
        return {"generators": [g.get_state() for g in self._algorithm.generators]}

    def _load_extra_state(self, state: Dict[str, Any]) -> None:
        if self._seeds is None:
            return super()._load_extra_state(state)
        generators = state.get("generators")
        if generators is None or len(generators) != len(self._seeds):
            raise ValueError(f"it holds no generator state for each of {len(self._seeds)} "
                             "agents")
        for generator, generator_state in zip(self._algorithm.generators, generators):
            generator.set_state(generator_state)

    def evaluate(self, num_episodes: Optional[int] = None) -> float:
        """The deterministic policy's mean return (see ``Trainer.evaluate``).

        K agents: each agent on its own environments (seeded as its single
        run's), written to its summaries; returns (and puts in
        ``metrics["eval/return"]``) the lowest agent's mean return.
        """
        if self._seeds is None:
            return super().evaluate(num_episodes)
        start, values = time.time(), []
        try:
            for k, seed in enumerate(self._seeds):
                agent = self._algorithm.agent_algorithm(k)
                agent.eval()

                def _policy(observation: Any, agent: Any = agent) -> Any:
                    return agent.predict_step(TimeStep(observation=observation)).output

                values.append(evaluate(self._env_id, _policy, seed=seed + _EVAL_SEED_OFFSET,
                                       num_episodes=num_episodes or self._num_eval_episodes,
                                       device=self._device))
        finally:
            self._algorithm.train()
        for callback in self._callbacks:
            if isinstance(callback, AgentSummaryCallback):
                callback.write("eval/return", values, self._iteration)
                callback.write("eval/return_vs_env_steps", values, self._env_steps)
        self.metrics["eval/return"] = min(values)
        self._eval_time += time.time() - start
        return min(values)


_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")  # as the sweep names its run directories


def _agent_seeds(num_agents: int, seeds: Optional[Sequence[int]], seed: int
                 ) -> Optional[List[int]]:
    """The K agents' seeds, or None for a single run."""
    num_agents = check_int("num_agents", num_agents, minimum=1)
    if seeds is None:
        if num_agents == 1:
            return None
        check_int("seed + num_agents - 1", seed + num_agents - 1, minimum=0,
                  below=ranks.MAX_SEED)
        return [seed + k for k in range(num_agents)]
    seeds = [check_int("seeds[i]", s, minimum=0, below=ranks.MAX_SEED) for s in seeds]
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be at least two distinct seeds (for one agent use "
                         f"seed), got {seeds}")
    if num_agents not in (1, len(seeds)):
        raise ValueError(f"num_agents is {num_agents} but seeds has {len(seeds)} entries")
    return seeds
