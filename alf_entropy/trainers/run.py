"""``Run``: a training run's services -- its directory, agents, envs, counters and checkpoints.

:class:`~alf_entropy.trainers.trainer.Trainer` is the loop on top.  A run holds its
directory (``RunDir``: lock, config check, ``operative_config.gin``), its agents
(``trainers.agents``: one, or K built as one batch speaking one agent's protocol), the
algorithm and environments built for them, the counters and limits, and its checkpoints
(``Checkpointer``): it resumes from the newest that fits, environments included.
"""
from typing import Any, Callable, Dict, Optional, Sequence

import torch
from absl import logging

from alf_entropy.algorithm import Algorithm
from alf_entropy.algorithms.agent_batch import AgentBatch
from alf_entropy.controllers import EntropyController
from alf_entropy.data_structures import TimeStep
from alf_entropy.environments import GymVectorEnv
from alf_entropy.environments.agent_envs import agent_env_ctor
from alf_entropy.environments.env_state import check_pickle
from alf_entropy.storage import checkpoints as ckpt
from alf_entropy.storage.bindings import check_bindings_used
from alf_entropy.storage.run_dir import RunDir
from alf_entropy.trainers import agents as agents_lib
from alf_entropy.trainers import ranks
from alf_entropy.trainers.limits import Limits
from alf_entropy.trainers.ranks import MAX_SEED
from alf_entropy.utils import distributed, schedulers
from alf_entropy.utils.checks import check_int

__all__ = ["Run"]


class Run:
    """A training run's services (module docstring).

    Args:
        root_dir: where summaries, checkpoints and the config go; a run there is resumed.
        env_id: the gymnasium id.
        num_envs: parallel environments (per agent; under ``torchrun`` the total).
        algorithm_ctor: ``(observation_spec, action_spec) -> Algorithm``.
        env_ctor: ``(env_id, num_envs=, seed=, device=) -> env`` (a ``GymVectorEnv``).
        num_iterations: a limit (0 or None: none from it; see ``Limits``).
        num_env_steps: a limit in (one agent's) env steps, rounded up to iterations.
        steps_per_iteration: env steps one iteration takes (from the subclass).
        max_checkpoints: how many recent checkpoints to keep.
        seed: seeds torch, NumPy, Python ``random`` and the environments.
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or a ``torch.device``.
        num_threads: if given, ``torch.set_num_threads(num_threads)``.
        allow_config_change: resume a run directory whose config differs (``RunDir``).
        num_agents: K agents in one process, seeds ``seed, ..., seed + K - 1``.
        seeds: the K agents' seeds instead (:func:`~alf_entropy.trainers.agents.agent_seeds`).
        target_entropies: one target entropy per agent (K > 1, agents with a controller).

    Raises:
        ValueError: for bad arguments, an unusable or differently configured ``root_dir``,
            an unused binding, or K > 1 on several ranks.
        RunDirLocked: if another process trains in ``root_dir``.
        CheckpointError: if the run directory has checkpoints and none loads.
    """

    agent_batch: type = AgentBatch
    """The class that trains K agents of this trainer's algorithms as one."""

    def __init__(
        self, root_dir: str, env_id: str, num_envs: int, algorithm_ctor: Callable[..., Algorithm],
        env_ctor: Callable[..., Any] = GymVectorEnv, num_iterations: Optional[int] = None,
        num_env_steps: Optional[int] = None, steps_per_iteration: int = 1,
        max_checkpoints: int = 3, seed: int = 0, device: Any = "auto",
        num_threads: Optional[int] = None, allow_config_change: bool = False,
        num_agents: int = 1, seeds: Optional[Sequence[int]] = None,
        target_entropies: Optional[Sequence[Any]] = None,
    ):
        self._run_dir = RunDir(root_dir, allow_config_change)
        self._limits = Limits(num_iterations, num_env_steps, steps_per_iteration)
        self._seed = check_int("seed", seed, minimum=0, below=MAX_SEED)
        self._agents = agents_lib.Agents(num_agents, seeds, target_entropies, self._seed)
        self._checkpointer = ckpt.Checkpointer(self._run_dir.checkpoint_dir, max_checkpoints)
        if check_int("num_threads", num_threads, minimum=1, allow_none=True) is not None:
            torch.set_num_threads(num_threads)
        self._num_envs, self._device = ranks.join_ranks(num_envs, device, type(self).__name__)
        self._env_id, self._env_ctor = env_id, agent_env_ctor(env_ctor, self._agents.seeds, seed)
        self._algorithm_ctor = self._agents.algorithm_ctor(self.agent_batch, algorithm_ctor,
                                                           self._device)
        self._iteration, self._env_steps = 0, 0
        self._env = self._time_step = self._restored_env = self._last_checkpoint = None
        self._in_iteration, self._restored_from = False, None
        self._observation_spec, self._action_spec, self._algorithm = self._build(env_ctor)
        check_bindings_used(type(self).__name__,  # before anything is written
                            getattr(self._algorithm, "entropy_target_algorithm", None),
                            EntropyController)
        with self._run_dir.opening():
            self._run_dir.take()
            self._resume()
            self._run_dir.write_operative_config(self._iteration)
            self._agents.write_configs(self.root_dir, type(self).__name__, self._algorithm)

    def _build(self, env_ctor: Callable[..., Any]) -> Any:
        """Seed everything, read the specs from a throw-away env, build the algorithm."""
        ranks.seed_all(self._seed)
        schedulers.reset_progress()
        probe = env_ctor(self._env_id, num_envs=1, seed=self._seed, device=self._device)
        observation_spec, action_spec = probe.observation_spec, probe.action_spec
        probe.close()
        algorithm = self._build_algorithm(observation_spec, action_spec)
        algorithm.to(self._device)
        if distributed.is_distributed():
            distributed.broadcast_module_(algorithm)  # the same start everywhere
            ranks.seed_all(self._seed + distributed.rank() * ranks.RANK_SEED_OFFSET)  # own samples
        return observation_spec, action_spec, algorithm

    def _build_algorithm(self, observation_spec: Any, action_spec: Any) -> Algorithm:
        """Build the algorithm (K agents: their batch); override to check the specs."""
        return self._algorithm_ctor(observation_spec, action_spec)

    def _extra_state(self) -> Dict[str, Any]:
        """More checkpoint state of a subclass (tensors and plain values)."""
        return {}

    def _load_extra_state(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`_extra_state` returned."""

    root_dir = property(lambda self: self._run_dir.path, doc="The absolute root directory.")
    algorithm = property(lambda self: self._algorithm, doc="The algorithm being trained.")
    device = property(lambda self: self._device, doc="The device of networks and time steps.")
    env = property(lambda self: self._env, doc="The training envs while ``train()`` runs.")
    iteration = property(lambda self: self._iteration, doc="Training iterations completed.")
    env_steps = property(lambda self: self._env_steps, doc="Env steps taken (one agent's).")
    num_agents = property(lambda self: len(self.seeds), doc="K (1: a single run).")
    seeds = property(lambda self: self._agents.seeds or [self._seed], doc="Each agent's seed.")
    agent_dirs = property(lambda self: self._agents.dirs,
                          doc="Each agent's run directory under ``root_dir`` (one: ``''``).")
    num_iterations = property(lambda self: self._limits.num_iterations or None,
                              doc="The ``num_iterations`` limit (``None``: none from it).")
    total_iterations = property(lambda self: self._limits.total_iterations,
                                doc="Iterations the run takes (the binding limit).")
    limit_reached = property(lambda self: self._limits.reached(self._iteration, self._env_steps),
                             doc="The limit reached now (``'num_iterations = 3'``), or None.")
    restored_from = property(lambda self: self._restored_from, doc="The checkpoint resumed.")
    last_checkpoint = property(lambda self: self._last_checkpoint,
                               doc="The checkpoint the current (or last) ``train()`` wrote last.")

    def _start_env(self) -> Any:
        """Build the training envs; restore their saved state or reset them."""
        env = self._env_ctor(self._env_id, num_envs=self._num_envs, device=self._device,
                             # Rank r's envs continue the numbering of the global batch.
                             seed=self._seed + (self._iteration * distributed.world_size()
                                                + distributed.rank()) * self._num_envs)
        restored, self._restored_env = self._restored_env, None
        if restored:
            env.set_state(ckpt.tensor_to_bytes(restored["state"]))
            return env, TimeStep(**{k: v.to(self._device) if isinstance(v, torch.Tensor) else v
                                    for k, v in restored["time_step"].items()})
        if restored is not None:  # resumed from a checkpoint without env state
            logging.warning("The checkpoint holds no state of the %s environments (they cannot "
                            "be pickled, or training was interrupted mid-iteration): their "
                            "episodes restart, so the resumed run is not bit-exact with an "
                            "uninterrupted one.", self._env_id)
        return env, env.reset()

    def close(self) -> None:
        """Release the run directory's lock (idempotent; ``train()`` takes it again)."""
        self._run_dir.release()

    def save_checkpoint(self) -> str:
        """Write a checkpoint (every rank calls it) with this rank's ``env`` (pickled envs and
        time step; empty if unpicklable or mid-iteration) and ``extra``; returns its path."""
        self._limits.update_progress(self._iteration, self._env_steps)
        get_state = None if self._in_iteration else getattr(self._env, "get_state", None)
        state = None if get_state is None else get_state()
        env = {} if state is None else {"state": ckpt.bytes_to_tensor(state),
                                        "time_step": self._time_step._asdict()}
        self._last_checkpoint = self._checkpointer.save(
            self._iteration, self._env_steps, self._algorithm,
            {"env": env, "extra": self._extra_state()})
        return self._last_checkpoint

    def load_checkpoint(self, path: str) -> None:
        """Restore everything :meth:`save_checkpoint` wrote to ``path``, or nothing.

        Raises:
            CheckpointError: if it cannot be read or does not fit (nothing changes).
        """
        self._commit(path, self._checkpointer.restore(path, self._algorithm, self._load_own))

    def _resume(self) -> None:
        """Load the newest checkpoint that fits (damaged ones are skipped with a warning)."""
        found = self._checkpointer.restore_newest(self._algorithm, self._load_own)
        if found is not None:
            self._commit(*found)

    def _load_own(self, state: Dict[str, Any]) -> None:
        """Check this rank's env state (applied when ``train()`` builds the envs); load extra."""
        env_state, batch = state.get("env") or {}, (*self._algorithm.batch_shape, self._num_envs)
        if env_state:  # a whole pickle (read, not run: set_state loads it) of this batch
            check_pickle(ckpt.tensor_to_bytes(env_state["state"]))
            shape = tuple(TimeStep(**env_state["time_step"]).step_type.shape)
            if shape != batch:
                raise ValueError(f"its environment state is of a batch {shape}, this run {batch}")
        self._load_extra_state(state.get("extra") or {})

    def _commit(self, path: str, state: Dict[str, Any]) -> None:
        """Take the counters and env state of a restored checkpoint."""
        self._iteration, self._env_steps = int(state["iteration"]), int(state["env_steps"])
        self._restored_env, self._restored_from = state.get("env") or {}, path
        logging.info("Resumed from %s (iteration %d)", path, self._iteration)
