"""``OffPolicyTrainer``: the training loop of SAC (any replay-buffer algorithm).

One iteration (``_train_iteration``) is one step of each of the ``num_envs``
environments, then ``num_updates_per_train_iter`` gradient updates, CleanRL-style::

    action = random_action() if env_steps < initial_collect_steps \\
        else algorithm.rollout_step(time_step).output
    next_time_step = env.step(action)
    replay_buffer.add(Transition(o, a, r', d', o', valid=time_step is not LAST))
    if replay_buffer.size >= initial_collect_steps:      # learning has started
        for _ in range(num_updates_per_train_iter):
            algorithm.train_step(replay_buffer.sample(mini_batch_size))

The replay buffer lives on the training device and is sampled there without
host reads; random actions come from torch's generator, so the checkpointed
RNG states reproduce them.  The buffer is part of the checkpoint
(``checkpoint_replay_buffer=True``), so a resumed run continues bit for bit.
Everything else is :class:`~alf_entropy.trainers.trainer.Trainer`'s.

With ``num_agents = K > 1`` (or ``seeds``) the same loop trains K SAC agents as
one batch (:class:`~alf_entropy.algorithms.many_sac_agents.ManySacAgents` on
:class:`~alf_entropy.environments.agent_envs.AgentEnvs`, the K-agent parts
shared with ``OnPolicyTrainer`` in :mod:`alf_entropy.trainers.agents`): a
buffer row holds the K agents' transitions of one step, and agent ``k`` draws
its random actions and its replay rows from its own generator, so it is the
run a single trainer with seed ``seeds[k]`` would be.
"""
from typing import Any, Callable, Dict, Optional, Sequence

import gin
import torch
from absl import logging

from alf_entropy.algorithm import Algorithm
from alf_entropy.algorithms.many_sac_agents import ManySacAgents
from alf_entropy.algorithms.sac_algorithm import SacAlgorithm
from alf_entropy.data_structures import StepType
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.trainers.agents import AgentsTrainerMixin
from alf_entropy.trainers.limits import Limits
from alf_entropy.trainers.trainer import Trainer, resolve_device
from alf_entropy.utils import distributed, nest
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.replay_buffer import ReplayBuffer, Transition
from alf_entropy.utils.signatures import forwards_arguments

__all__ = ["OffPolicyTrainer"]


@gin.configurable
class OffPolicyTrainer(AgentsTrainerMixin, Trainer):
    """Train an off-policy algorithm (``SacAlgorithm``) from a replay buffer.

    Takes :class:`~alf_entropy.trainers.trainer.Trainer`'s arguments, with
    these defaults and the replay buffer's.

    Args:
        root_dir: where summaries, checkpoints and the config go (see
            :mod:`alf_entropy.trainers.trainer`); an existing run is resumed.
        env_id: the gymnasium id.
        num_envs: parallel environments ``B`` (one iteration steps each once).
        algorithm_ctor: ``(observation_spec, action_spec) -> Algorithm``
            with ``rollout_step``, ``predict_step`` and ``train_step(batch)``
            taking a ``Transition`` batch.
        num_iterations: stop after this many iterations (see ``Trainer``).
        num_env_steps: stop once this many env steps are done (see
            ``Trainer``).
        initial_collect_steps: env steps of uniformly random actions before
            the policy acts; updates start once the buffer holds this many
            rows (at least one).  Must not exceed ``num_env_steps``.
        replay_buffer_length: rows the buffer keeps (ALF's name).
        mini_batch_size: rows per update; at most ``replay_buffer_length``.
            Under ``torchrun`` with ``W`` ranks, ``num_envs``,
            ``replay_buffer_length`` and ``mini_batch_size`` are totals: each
            rank keeps ``1/W`` of each (they must divide) and the gradients
            are averaged, so an update sees ``mini_batch_size`` rows.
        num_updates_per_train_iter: gradient updates per iteration (per
            ``num_envs`` env steps).
        checkpoint_replay_buffer: save the buffer in checkpoints (exact
            resume).  Turn off for huge buffers: resume is then approximate
            (a warning says so).
        summary_interval: write summaries every this many iterations.
        checkpoint_interval: checkpoint every this many iterations (and at
            the end); ``None``: only at the end.
        device: the training device (see ``Trainer``); the replay buffer
            lives there.
        num_agents: K, agents trained side by side in this process
            (:class:`~alf_entropy.algorithms.many_sac_agents.ManySacAgents`),
            as ``OnPolicyTrainer``'s: seeds ``seed, ..., seed + K - 1``, each
            agent a run of its own (``root_dir/seed=N``) with its own
            environments, random actions and replay rows; the limits and
            ``initial_collect_steps`` count one agent's steps.  1: a single run.
        seeds: the K agents' seeds instead (at least two; distinct unless
            ``target_entropies`` gives each agent its own (target, seed)).
        target_entropies: one target entropy per agent (needs K > 1).
        **kwargs: ``Trainer``'s other arguments (``eval_interval``,
            ``seed``, ``num_threads``, ``callbacks``, ...).

    Raises:
        ValueError: for out-of-range arguments, a buffer smaller than the
            mini-batch, or ``initial_collect_steps > num_env_steps``.
    """

    @forwards_arguments(Trainer.__init__, supplied=("steps_per_iteration",))
    def __init__(
        self,
        root_dir: str,
        *,
        env_id: str = "Pendulum-v1",
        num_envs: int = 1,
        algorithm_ctor: Callable[..., Algorithm] = SacAlgorithm,
        num_iterations: Optional[int] = None,
        num_env_steps: Optional[int] = None,
        initial_collect_steps: int = 1000,
        replay_buffer_length: int = 1_000_000,
        mini_batch_size: int = 256,
        num_updates_per_train_iter: int = 1,
        checkpoint_replay_buffer: bool = True,
        summary_interval: int = 1000,
        checkpoint_interval: Optional[int] = 10000,
        device: Any = "auto",
        num_agents: int = 1,
        seeds: Optional[Sequence[int]] = None,
        target_entropies: Optional[Sequence[Any]] = None,
        **kwargs: Any,
    ):
        self._init_agents(num_agents, seeds, target_entropies, kwargs.get("seed", 0))
        check_int("num_envs", num_envs, minimum=1)
        check_int("replay_buffer_length", replay_buffer_length, minimum=1)
        check_int("mini_batch_size", mini_batch_size, minimum=1)
        check_int("num_updates_per_train_iter", num_updates_per_train_iter, minimum=1)
        check_int("initial_collect_steps", initial_collect_steps, minimum=0)
        if mini_batch_size > replay_buffer_length:
            raise ValueError(
                f"mini_batch_size ({mini_batch_size}) must be <= replay_buffer_length "
                f"({replay_buffer_length})"
            )
        limits = Limits(num_iterations, num_env_steps, steps_per_iteration=num_envs)
        if limits.num_env_steps and initial_collect_steps > limits.num_env_steps:
            raise ValueError(
                f"initial_collect_steps ({initial_collect_steps}) must be <= num_env_steps "
                f"({num_env_steps}): the run would end before learning starts"
            )
        if limits.num_iterations and initial_collect_steps > num_iterations * num_envs:
            raise ValueError(
                f"initial_collect_steps ({initial_collect_steps}) must be <= the env steps "
                f"num_iterations allows ({num_iterations} iterations x {num_envs} envs = "
                f"{num_iterations * num_envs}): the run would end before learning starts; "
                "raise num_iterations or lower initial_collect_steps"
            )
        # Data-parallel (torchrun): each rank holds its share of the totals.
        world = distributed.env_world_size()
        for name, value in (
            ("replay_buffer_length", replay_buffer_length),
            ("mini_batch_size", mini_batch_size),
        ):
            if value % world:
                raise ValueError(
                    f"{name} ({value}) is the total over all ranks and must be divisible by "
                    f"the number of ranks ({world})"
                )
        replay_buffer_length //= world
        mini_batch_size //= world
        self._initial_collect_steps = initial_collect_steps
        self._learning_starts = max(1, min(initial_collect_steps // world, replay_buffer_length))
        self._mini_batch_size = mini_batch_size
        self._num_updates_per_train_iter = num_updates_per_train_iter
        self._checkpoint_replay_buffer = bool(checkpoint_replay_buffer)
        if not self._checkpoint_replay_buffer:
            logging.warning(
                "checkpoint_replay_buffer=False: checkpoints omit the replay buffer, so a "
                "resumed run refills it and is only approximately the same as an "
                "uninterrupted one"
            )
        self._replay_buffer = ReplayBuffer(
            replay_buffer_length, device=distributed.rank_device(resolve_device(device))
        )
        super().__init__(
            root_dir,
            env_id=env_id,
            num_envs=num_envs,
            algorithm_ctor=algorithm_ctor,
            num_iterations=num_iterations,
            num_env_steps=num_env_steps,
            steps_per_iteration=num_envs,
            summary_interval=summary_interval,
            checkpoint_interval=checkpoint_interval,
            device=device,
            **kwargs,
        )
        self._agent_callbacks()
        spec, buffer_device = self._action_spec, self._replay_buffer.device
        self._random_low = torch.as_tensor(spec.minimum, device=buffer_device)
        self._random_high = torch.as_tensor(spec.maximum, device=buffer_device)

    @property
    def replay_buffer(self) -> ReplayBuffer:
        """The replay buffer."""
        return self._replay_buffer

    def _build_algorithm(self, observation_spec: Any, action_spec: Any) -> Algorithm:
        _check_action_spec(action_spec)
        return super()._build_algorithm(observation_spec, action_spec)

    def _build_agents(self, observation_spec: Any, action_spec: Any) -> ManySacAgents:
        _check_action_spec(action_spec)
        return ManySacAgents(observation_spec, action_spec, self._seeds,
                             algorithm_ctor=self._algorithm_ctor,
                             target_entropies=self._target_entropies, device=self._device)

    def _random_action(self, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Uniform random actions ``[B, ...]`` from ``generator`` (None: torch's)."""
        spec = self._action_spec
        shape = (self._num_envs,) + tuple(spec.shape)
        low, high = self._random_low, self._random_high
        if spec.is_discrete:  # integers in [low, high]
            u = torch.rand(shape, dtype=torch.float64, device=low.device, generator=generator)
            return (low + (u * (high - low + 1)).floor()).to(spec.dtype)
        u = torch.rand(shape, dtype=spec.dtype, device=low.device, generator=generator)
        return low.to(spec.dtype) + u * (high - low).to(spec.dtype)

    def _train_iteration(self) -> int:
        """Step every env once, store the transitions, update; return the env steps."""
        algorithm, env, time_step = self._algorithm, self._env, self._time_step
        agents = None if self._seeds is None else algorithm.generators  # K agents: [K, B]
        if self._env_steps < self._initial_collect_steps:
            action = (self._random_action() if agents is None
                      else torch.stack([self._random_action(g) for g in agents]))
        else:
            with torch.no_grad():
                action = algorithm.rollout_step(time_step).output
        action = action.to(self._action_spec.dtype)
        next_time_step = env.step(action)
        transition = Transition(
            observation=time_step.observation,
            action=action,
            reward=next_time_step.reward,
            discount=next_time_step.discount,
            next_observation=next_time_step.observation,
            valid=time_step.step_type != StepType.LAST,
        )
        if agents is not None:  # a row holds the K agents' transitions: [B, K, ...]
            transition = nest.map_structure(lambda x: x.transpose(0, 1), transition)
        self._replay_buffer.add(transition)
        self._time_step = next_time_step
        if self._replay_buffer.size >= self._learning_starts:
            for _ in range(self._num_updates_per_train_iter):
                if agents is None:
                    algorithm.train_step(self._replay_buffer.sample(self._mini_batch_size))
                else:
                    batch = self._replay_buffer.sample_members(self._mini_batch_size, agents)
                    self._last_train = (algorithm.train_step(batch).info, batch.valid)
        return self._limits.steps_per_iteration  # all ranks' env steps

    def _example_transition(self) -> Transition:
        """A one-row ``Transition`` with the stored shapes and dtypes."""
        lead = (1,) if self._seeds is None else (1, len(self._seeds))
        obs = nest.map_structure(lambda s: s.zeros(lead), self._observation_spec)
        return Transition(
            observation=obs,
            action=self._action_spec.zeros(lead),
            reward=torch.zeros(lead),
            discount=torch.zeros(lead),
            next_observation=obs,
            valid=torch.zeros(lead, dtype=torch.bool),
        )

    def _extra_state(self) -> Dict[str, Any]:
        state = super()._extra_state()
        if self._checkpoint_replay_buffer:
            state["replay_buffer"] = self._replay_buffer.state_dict()
        return state

    def _load_extra_state(self, state: Dict[str, Any]) -> None:
        super()._load_extra_state(state)
        if "replay_buffer" in state:
            # Into a new buffer, swapped in only once it loaded: a damaged
            # buffer leaves the current one as it was.
            buffer = ReplayBuffer(self._replay_buffer.capacity, device=self._replay_buffer.device)
            buffer.load_state_dict(state["replay_buffer"], self._example_transition())
            self._replay_buffer = buffer
        else:
            logging.warning(
                "The checkpoint holds no replay buffer: it is refilled before updates "
                "resume, so this run is not bit-exact with an uninterrupted one."
            )


def _check_action_spec(action_spec: Any) -> None:
    if nest.is_nested(action_spec) or not isinstance(action_spec, BoundedTensorSpec):
        raise TypeError(
            "OffPolicyTrainer: the environment must have a single bounded action "
            f"space (Box or Discrete), got {action_spec!r}"
        )
