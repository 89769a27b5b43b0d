"""``Run``: a training run's services -- its directory, agents, envs, counters and checkpoints.

:class:`~alf_entropy.trainers.trainer.Trainer` is the loop on top.  A run is composed of
parts the trainer builds from its arguments, each checked where it is built: the run
directory (``RunDir``: lock, config check, ``operative_config.gin``), the ``Limits``, the
``Agents`` (one, or K built as one batch speaking one agent's protocol) and this rank's
share of the environments.  The run builds the algorithm (K agents: the trainer's
``agent_batch`` of them) and environments for them, holds the counters and its
checkpoints (``Checkpointer``): it resumes from the newest that fits, environments
included.
"""

import functools
from typing import Any, Callable, Dict, Optional

import torch
from absl import logging

from alf_entropy.algorithms.agent_batch import AgentBatch
from alf_entropy.algorithms.algorithm import Algorithm
from alf_entropy.config.bindings import check_bindings_used
from alf_entropy.controllers import EntropyController
from alf_entropy.data_structures import TimeStep
from alf_entropy.environments.agent_envs import agent_env_ctor
from alf_entropy.environments.env_state import check_pickle
from alf_entropy.storage import checkpoints as ckpt
from alf_entropy.storage.run_dir import RunDir
from alf_entropy.trainers import ranks
from alf_entropy.trainers.agents import Agents
from alf_entropy.trainers.limits import Limits
from alf_entropy.utils import distributed, nest, schedulers

__all__ = ["Run"]


class Run:
    """A training run's services (module docstring).

    Args:
        run_dir: the run directory; a run there is resumed.
        limits: when the run ends.
        agents: the agents (one, or K trained as one batch).
        env_id: the gymnasium id.
        num_envs: this rank's environments per agent.
        algorithm_ctor: ``(observation_spec, action_spec) -> Algorithm``.
        env_ctor: ``(env_id, num_envs=, seed=, device=) -> env`` (a ``GymVectorEnv``).
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or a ``torch.device``.
        max_checkpoints: how many recent checkpoints to keep.

    Attributes:
        root_dir (str): the absolute root directory.
        algorithm: the algorithm being trained.
        device (torch.device): the device of networks and time steps.
        env: the training envs while ``train()`` runs.
        iteration (int): training iterations completed.
        env_steps (int): env steps taken (one agent's).
        seeds (List[int]): each agent's seed; ``num_agents`` (int): K (1: a single run).
        agent_dirs (List[str]): each agent's directory under ``root_dir`` (one: ``''``).
        num_iterations (Optional[int]): the ``num_iterations`` limit (``None``: none).
        total_iterations (int): iterations the run takes (the binding limit).
        restored_from (Optional[str]): the checkpoint resumed.
        last_checkpoint (Optional[str]): the checkpoint the current (or last) ``train()``
            wrote last.

    Raises:
        ValueError: for bad arguments, a run directory in use by another configuration, an
            unused binding, or K > 1 on several ranks.
        RunDirLocked: if another process trains in the run directory.
        CheckpointError: if the run directory has checkpoints and none loads.
    """

    agent_batch: type = AgentBatch
    """The class that trains K agents of this trainer's algorithms as one."""

    def __init__(
        self,
        run_dir: RunDir,
        limits: Limits,
        agents: Agents,
        *,
        env_id: str,
        num_envs: int,
        algorithm_ctor: Callable[..., Algorithm],
        env_ctor: Callable[..., Any],
        device: Any,
        max_checkpoints: int,
    ):
        self._run_dir = run_dir
        self._limits = limits
        self._agents = agents
        self._num_envs = num_envs
        self.root_dir, self.agent_dirs = run_dir.path, agents.dirs
        self.seeds = list(agents.seeds or [agents.seed])
        self.num_agents = len(self.seeds)
        self.num_iterations = limits.num_iterations or None
        self.total_iterations = limits.total_iterations
        self._checkpointer = ckpt.Checkpointer(run_dir.checkpoint_dir, max_checkpoints)
        self._env_id = env_id
        self.device = distributed.rank_device(ranks.resolve_device(device))
        self.iteration, self.env_steps = 0, 0
        self.env = self._time_step = self._restored_env = self.last_checkpoint = None
        self._in_iteration, self.restored_from = False, None
        self._check_parts()
        # Seed everything, read the specs from a throw-away env, build the algorithm, join
        # torchrun's ranks (a no-op in one process) and give them all rank 0's start.
        seed = agents.seed
        ranks.seed_all(seed)
        schedulers.reset_progress()
        probe = env_ctor(env_id, num_envs=1, seed=seed, device=self.device)
        self._observation_spec, self._action_spec = probe.observation_spec, probe.action_spec
        probe.close()
        if agents.seeds is not None:  # K agents: their batch
            algorithm_ctor = functools.partial(
                self.agent_batch,
                seeds=agents.seeds,
                algorithm_ctor=algorithm_ctor,
                target_entropies=agents.targets,
                device=self.device,
            )
        self.algorithm = self._build_algorithm(algorithm_ctor)
        self.algorithm.to(self.device)
        self.device = distributed.init_from_env(self.device)
        if distributed.is_distributed():
            distributed.broadcast_module_(self.algorithm)  # the same start everywhere
            ranks.seed_all(seed + distributed.rank() * ranks.RANK_SEED_OFFSET)  # own samples
        self._env_ctor = agent_env_ctor(env_ctor, agents.seeds, seed)  # seeds checked
        check_bindings_used(
            type(self).__name__,  # before anything is written
            getattr(self.algorithm, "entropy_target_algorithm", None),
            EntropyController,
        )
        with self._run_dir.opening():
            self._run_dir.take()
            found = self._checkpointer.restore_newest(self.algorithm, self._load_own)
            if found is not None:  # the newest that fits (damaged ones skipped, warned of)
                self._commit(*found)
            self._run_dir.write_operative_config(self.iteration)
            self._agents.write_configs(self.root_dir, type(self).__name__, self.algorithm)

    def _check_parts(self) -> None:
        """Check a subclass's arguments against the parts, before anything is seeded or built."""

    def _build_algorithm(self, algorithm_ctor: Callable[..., Algorithm]) -> Algorithm:
        """Build the algorithm (K agents: their batch) for the env's specs; override to check
        them."""
        return algorithm_ctor(self._observation_spec, self._action_spec)

    def _extra_state(self) -> Dict[str, Any]:
        """More checkpoint state of a subclass (tensors and plain values)."""
        return {}

    def _load_extra_state(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`_extra_state` returned."""

    @property
    def limit_reached(self) -> Optional[str]:
        """The limit reached now (``'num_iterations = 3'``), or None."""
        return self._limits.reached(self.iteration, self.env_steps)

    def _start_env(self):
        """Build the training envs; restore their saved state or reset them."""
        env = self._env_ctor(
            self._env_id,
            num_envs=self._num_envs,
            device=self.device,
            # Rank r's envs continue the numbering of the global batch.
            seed=self._agents.seed
            + (self.iteration * distributed.world_size() + distributed.rank()) * self._num_envs,
        )
        restored, self._restored_env = self._restored_env, None
        if restored:
            env.set_state(ckpt.tensor_to_bytes(restored["state"]))
            time_step = TimeStep(**restored["time_step"])  # nested fields too (dict spaces)
            return env, nest.map_structure(
                lambda v: v.to(self.device) if isinstance(v, torch.Tensor) else v, time_step
            )
        if restored is not None:  # resumed from a checkpoint without env state
            logging.warning(
                "The checkpoint holds no state of the %s environments (they cannot "
                "be pickled, or training was interrupted mid-iteration): their "
                "episodes restart, so the resumed run is not bit-exact with an "
                "uninterrupted one.",
                self._env_id,
            )
        return env, env.reset()

    def close(self) -> None:
        """Release the run directory's lock (idempotent; ``train()`` takes it again)."""
        self._run_dir.release()

    def save_checkpoint(self) -> str:
        """Write a checkpoint (every rank calls it) with this rank's ``env`` (pickled envs and
        time step; empty if unpicklable or mid-iteration) and ``extra``; returns its path."""
        self._limits.update_progress(self.iteration, self.env_steps)
        get_state = None if self._in_iteration else getattr(self.env, "get_state", None)
        state = None if get_state is None else get_state()
        env = (
            {}
            if state is None
            else {"state": ckpt.bytes_to_tensor(state), "time_step": self._time_step._asdict()}
        )
        self.last_checkpoint = self._checkpointer.save(
            self.iteration,
            self.env_steps,
            self.algorithm,
            {"env": env, "extra": self._extra_state()},
        )
        return self.last_checkpoint

    def load_checkpoint(self, path: str) -> None:
        """Restore everything :meth:`save_checkpoint` wrote to ``path``, or nothing.

        Raises:
            CheckpointError: if it cannot be read or does not fit (nothing changes).
        """
        self._commit(path, self._checkpointer.restore(path, self.algorithm, self._load_own))

    def _load_own(self, state):
        """Check this rank's env state (applied when ``train()`` builds the envs); load extra."""
        env_state, batch = state.get("env") or {}, (*self.algorithm.batch_shape, self._num_envs)
        if env_state:  # a whole pickle (read, not run: set_state loads it) of this batch
            check_pickle(ckpt.tensor_to_bytes(env_state["state"]))
            shape = tuple(env_state["time_step"]["step_type"].shape)
            if shape != batch:
                raise ValueError(f"its environment state is of a batch {shape}, this run {batch}")
        self._load_extra_state(state.get("extra") or {})

    def _commit(self, path, state):
        """Take the counters and env state of a restored checkpoint."""
        self.iteration, self.env_steps = int(state["iteration"]), int(state["env_steps"])
        self._restored_env, self.restored_from = state.get("env") or {}, path
        logging.info("Resumed from %s (iteration %d)", path, self.iteration)
