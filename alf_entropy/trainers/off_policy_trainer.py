"""``OffPolicyTrainer``: the training loop of SAC (any replay-buffer algorithm).

One iteration (``_train_iteration``) is one step of each of the ``num_envs``
environments, then ``num_updates_per_train_iter`` updates, CleanRL-style::

    action = random_action() if env_steps < initial_collect_steps \\
        else algorithm.rollout_step(time_step).output
    next_time_step = env.step(action)
    replay_buffer.add(Transition(o, a, r', d', o', valid=time_step is not LAST))
    if replay_buffer.size >= initial_collect_steps:      # learning has started
        for _ in range(num_updates_per_train_iter):
            algorithm.train_step(replay_buffer.sample(mini_batch_size))

The buffer lives on the training device, is sampled without host reads and is part of
the checkpoint (``checkpoint_replay_buffer``), as are torch's generators that draw the
random actions: a resumed run continues bit for bit.  K agents
(:class:`~alf_entropy.algorithms.many_sac_agents.ManySacAgents`): a buffer row holds the
K agents' transitions of one env step; each agent draws its random actions and rows
from its own generator (``algorithm.generators``).
"""

from typing import Any, Callable, Dict, Optional, Sequence

import torch
from absl import logging

from alf_entropy.algorithms.algorithm import Algorithm
from alf_entropy.algorithms.many_sac_agents import ManySacAgents
from alf_entropy.algorithms.sac_algorithm import SacAlgorithm
from alf_entropy.data_structures import StepType
from alf_entropy.environments.gym_vector_env import GymVectorEnv
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.trainers import ranks
from alf_entropy.trainers.callbacks import Callback
from alf_entropy.trainers.trainer import Trainer, trainer_arguments
from alf_entropy.utils import distributed, nest
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.replay_buffer import ReplayBuffer, Transition
from alf_entropy.utils.seeding import per_member

__all__ = ["OffPolicyTrainer"]


class OffPolicyTrainer(Trainer):
    """Train an off-policy algorithm (``SacAlgorithm``) from a replay buffer.

    Takes :class:`~alf_entropy.trainers.on_policy_trainer.OnPolicyTrainer`'s arguments
    but ``unroll_length`` (K agents too: the limits and ``initial_collect_steps`` count one
    agent's steps; one iteration steps each of the ``num_envs`` envs once), with these
    defaults, and those of the replay buffer.

    Args:
        initial_collect_steps: env steps of uniformly random actions before the policy
            acts; updates start once the buffer holds this many rows (at least one).
        replay_buffer_length: rows the buffer keeps (ALF's name).
        mini_batch_size: rows per update (at most ``replay_buffer_length``).  Under
            ``torchrun`` this, ``num_envs`` and ``replay_buffer_length`` are totals.
        num_updates_per_train_iter: updates per iteration (per ``num_envs`` env steps).
        checkpoint_replay_buffer: save the buffer in checkpoints (exact resume); off for
            huge buffers (resume is then approximate, a warning says so).

    Attributes:
        replay_buffer (ReplayBuffer): the replay buffer.

    Raises:
        ValueError: for out-of-range arguments, a buffer smaller than the mini-batch, or
            a run that would end before learning starts.
        TypeError: if the environment's action space is not a single bounded one.
    """

    agent_batch = ManySacAgents

    def __init__(
        self,
        root_dir: str,
        *,
        env_id: str = "Pendulum-v1",
        num_envs: int = 1,
        algorithm_ctor: Callable[..., Algorithm] = SacAlgorithm,
        initial_collect_steps: int = 1000,
        replay_buffer_length: int = 1_000_000,
        mini_batch_size: int = 256,
        num_updates_per_train_iter: int = 1,
        checkpoint_replay_buffer: bool = True,
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
        summary_interval: int = 1000,
        checkpoint_interval: Optional[int] = 10000,
        eval_interval: Optional[int] = None,
        num_eval_episodes: int = 10,
        progress_bar: bool = True,
        summary_flush_secs: float = 10.0,
        stop_eval_return: Optional[float] = None,
        callbacks: Sequence[Callback] = (),
    ):
        run = trainer_arguments(
            locals(),
            "initial_collect_steps",
            "replay_buffer_length",
            "mini_batch_size",
            "num_updates_per_train_iter",
            "checkpoint_replay_buffer",
        )
        name = type(self).__name__  # the sizes are totals over all ranks, as num_envs
        self._replay_buffer_length = ranks.per_rank(
            f"{name}.replay_buffer_length", replay_buffer_length
        )
        self._mini_batch_size = ranks.per_rank(f"{name}.mini_batch_size", mini_batch_size)
        n = check_int("initial_collect_steps", initial_collect_steps, minimum=0)
        self._initial_collect_steps = n
        self._learning_starts = max(
            1, min(n // distributed.env_world_size(), self._replay_buffer_length)
        )
        self._num_updates = check_int(
            "num_updates_per_train_iter", num_updates_per_train_iter, minimum=1
        )
        self._checkpoint_replay_buffer = bool(checkpoint_replay_buffer)
        if not self._checkpoint_replay_buffer:
            logging.warning(
                "checkpoint_replay_buffer=False: checkpoints omit the replay "
                "buffer, so a resumed run refills it and is only approximately "
                "the same as an uninterrupted one"
            )
        super().__init__(steps_per_env=1, **run)

    def _check_parts(self) -> None:
        """Check the rows against the buffer and the limits."""
        name, world = type(self).__name__, distributed.env_world_size()
        # a step adds num_envs rows, an update samples mini_batch_size (totals in the message)
        for arg, rows in (("num_envs", self._num_envs), ("mini_batch_size", self._mini_batch_size)):
            if rows > self._replay_buffer_length:
                raise ValueError(
                    f"{arg} ({rows * world}) must be <= replay_buffer_length "
                    f"({self._replay_buffer_length * world})"
                )
        limits = self._limits
        steps = limits.total_iterations * limits.steps_per_iteration
        if self._initial_collect_steps > steps:
            raise ValueError(
                f"initial_collect_steps ({self._initial_collect_steps}) must be <= the env "
                f"steps the run takes ({steps}: num_iterations={limits.num_iterations or None}"
                f", num_env_steps={limits.num_env_steps or None}, num_envs="
                f"{self._num_envs * world}): it would end before learning starts; e.g. "
                f"--gin_param '{name}.initial_collect_steps = {steps}'"
            )

    def _build_algorithm(self, algorithm_ctor: Callable[..., Algorithm]) -> Algorithm:
        """Check the action spec; make the buffer and the random actions' bounds."""
        action_spec = self._action_spec
        if not isinstance(action_spec, BoundedTensorSpec):  # a nest is none
            raise TypeError(
                "OffPolicyTrainer: the environment must have a single bounded "
                f"action space (Box or Discrete), got {action_spec!r}"
            )
        self.replay_buffer = ReplayBuffer(self._replay_buffer_length, device=self.device)
        self._random_low = torch.as_tensor(action_spec.minimum, device=self.device)
        self._random_high = torch.as_tensor(action_spec.maximum, device=self.device)
        return super()._build_algorithm(algorithm_ctor)

    def _random_action(self, generator):
        """Uniform random actions ``[B, ...]`` from ``generator`` (None: torch's)."""
        spec, low, high = self._action_spec, self._random_low, self._random_high
        shape = (self._num_envs,) + tuple(spec.shape)
        if spec.is_discrete:  # integers in [low, high]
            u = torch.rand(shape, dtype=torch.float64, device=low.device, generator=generator)
            return (low + (u * (high - low + 1)).floor()).to(spec.dtype)
        u = torch.rand(shape, dtype=spec.dtype, device=low.device, generator=generator)
        return low.to(spec.dtype) + u * (high - low).to(spec.dtype)

    def _train_iteration(self) -> int:
        """Step every env once, store the transitions, update; return the env steps."""
        algorithm, time_step = self.algorithm, self._time_step
        generators, nb = algorithm.generators, len(algorithm.batch_shape)
        if self.env_steps < self._initial_collect_steps:
            action = per_member(self._random_action, generators)
        else:
            with torch.no_grad():
                action = algorithm.rollout_step(time_step).output
        action = action.to(self._action_spec.dtype)
        self._time_step = self.env.step(action)
        transition = Transition(
            observation=time_step.observation,
            action=action,
            reward=self._time_step.reward,
            discount=self._time_step.discount,
            next_observation=self._time_step.observation,
            valid=time_step.step_type != StepType.LAST,
        )
        # A row is one env's step (of every agent: [B, K, ...]).
        self.replay_buffer.add(nest.map_structure(lambda x: x.movedim(nb, 0), transition))
        if self.replay_buffer.size >= self._learning_starts:
            for _ in range(self._num_updates):
                algorithm.train_step(self.replay_buffer.sample(self._mini_batch_size, generators))
        return self._limits.steps_per_iteration  # all ranks' env steps

    def _extra_state(self) -> Dict[str, Any]:
        if self._checkpoint_replay_buffer:
            return {"replay_buffer": self.replay_buffer.state_dict()}
        return {}

    def _load_extra_state(self, state: Dict[str, Any]) -> None:
        if "replay_buffer" not in state:
            logging.warning(
                "The checkpoint holds no replay buffer: it is refilled before "
                "updates resume, so this run is not bit-exact with an "
                "uninterrupted one."
            )
            return
        # Into a new buffer, swapped in once it loaded: a damaged one changes nothing.
        lead = (1, *self.algorithm.batch_shape)
        obs = nest.map_structure(lambda s: s.zeros(lead), self._observation_spec)
        zeros = torch.zeros(lead)
        example = Transition(obs, self._action_spec.zeros(lead), zeros, zeros, obs, zeros.bool())
        buffer = ReplayBuffer(self._replay_buffer_length, device=self.replay_buffer.device)
        buffer.load_state_dict(state["replay_buffer"], example)
        self.replay_buffer = buffer
