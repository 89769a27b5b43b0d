"""``Trainer``: the training loop every trainer shares; a subclass writes one iteration.

:meth:`Trainer.train` reads top to bottom (SB3's ``learn()``): until a limit is reached
or ``control.should_stop``, the callbacks decide (:mod:`~alf_entropy.trainers.callbacks`)
and the loop acts: one iteration (``_train_iteration``: collect, then train; the
algorithm's summaries recorded if ``should_log``), then logging, evaluation and a
checkpoint as asked; a run ends with a checkpoint.  K agents (``num_agents``/``seeds``)
are data, not a mode: the algorithm and envs are built for them (``ManyAgents`` on
``AgentEnvs``) and speak one agent's protocol; each agent writes to its own run
directory (``agent_dirs``).  Under ``torchrun`` (one agent per rank) ``num_envs`` and
the limits are totals and rank 0 alone evaluates and writes.
"""
import pickle
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from absl import logging

from alf_entropy.algorithm import Algorithm
from alf_entropy.algorithms.agent_batch import AgentBatch
from alf_entropy.data_structures import TimeStep
from alf_entropy.environments import GymVectorEnv, mean_returns, run_episodes
from alf_entropy.environments.agent_envs import agent_env_ctor, episode_statistics
from alf_entropy.trainers import agents as agents_lib
from alf_entropy.trainers import checkpoint as ckpt
from alf_entropy.trainers import ranks
from alf_entropy.trainers.bindings import check_bindings_used
from alf_entropy.trainers.callbacks import (
    Callback,
    SignalCallback,
    TrainerControl,
    TrainingAborted,
    builtin_callbacks,
)
from alf_entropy.trainers.limits import Limits
from alf_entropy.trainers.ranks import MAX_SEED, resolve_device
from alf_entropy.trainers.run_dir import RunDir
from alf_entropy.utils import distributed, schedulers, summary
from alf_entropy.utils.checks import check_int

__all__ = ["EVAL_SEED_OFFSET", "MAX_SEED", "Trainer", "TrainingAborted", "resolve_device"]

EVAL_SEED_OFFSET = 1_000_003
"""Evaluation environments are seeded ``seed + EVAL_SEED_OFFSET`` (apart from training's)."""


class Trainer:
    """The shared training loop (see the module docstring).

    Args:
        root_dir: where summaries, checkpoints and the config go; a run there is resumed.
        env_id: the gymnasium id.
        num_envs: parallel environments (per agent; under ``torchrun`` the total).
        algorithm_ctor: ``(observation_spec, action_spec) -> Algorithm``.
        env_ctor: ``(env_id, num_envs=, seed=, device=) -> env`` (a ``GymVectorEnv``).
        num_iterations: stop after this many iterations (0 or None: no limit from it).
        num_env_steps: stop once this many env steps are done (0 or None: no limit).
        steps_per_iteration: env steps one iteration takes (from the subclass).
        summary_interval: iterations between summaries.
        checkpoint_interval: iterations between checkpoints (``None``: at the end only).
        eval_interval: iterations between evaluations (also at the start and the end).
        num_eval_episodes: episodes per evaluation.
        max_checkpoints: how many recent checkpoints to keep.
        seed: seeds torch, NumPy, Python ``random`` and the environments.
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or a ``torch.device``.
        num_threads: if given, ``torch.set_num_threads(num_threads)``.
        progress_bar: show a tqdm progress line (on a terminal only).
        summary_flush_secs: how often summaries are flushed to disk.
        stop_eval_return: stop once every agent's evaluation reaches it.
        allow_config_change: resume a run directory whose config differs (``RunDir``).
        callbacks: more ``Callback`` s, run after the built-in ones.
        num_agents: K agents in one process, seeds ``seed, ..., seed + K - 1`` (1: a
            single run); ``env_steps`` and the limits count one agent's steps.
        seeds: the K agents' seeds instead (:func:`~alf_entropy.trainers.agents.agent_seeds`).
        target_entropies: one target entropy per agent (K > 1, agents with a controller).

    Raises:
        ValueError: for out-of-range arguments, an unusable or differently configured
            ``root_dir``, an unused binding, or K > 1 on several ranks.
        TypeError: if a callback is not a ``Callback``.
        RunDirLocked: if another process trains in ``root_dir``.
        CheckpointError: if the run directory has checkpoints and none loads.
    """

    agent_batch: type = AgentBatch
    """The class that trains K agents of this trainer's algorithms as one."""

    def __init__(
        self, root_dir: str, env_id: str, num_envs: int, algorithm_ctor: Callable[..., Algorithm],
        env_ctor: Callable[..., Any] = GymVectorEnv, num_iterations: Optional[int] = None,
        num_env_steps: Optional[int] = None, steps_per_iteration: int = 1,
        summary_interval: int = 10, checkpoint_interval: Optional[int] = 100,
        eval_interval: Optional[int] = None, num_eval_episodes: int = 10,
        max_checkpoints: int = 3, seed: int = 0, device: Any = "auto",
        num_threads: Optional[int] = None, progress_bar: bool = True,
        summary_flush_secs: float = 10.0, stop_eval_return: Optional[float] = None,
        allow_config_change: bool = False, callbacks: Sequence[Callback] = (),
        num_agents: int = 1, seeds: Optional[Sequence[int]] = None,
        target_entropies: Optional[Sequence[Any]] = None,
    ):
        self._run_dir = RunDir(root_dir, allow_config_change)
        self._limits = Limits(num_iterations, num_env_steps, steps_per_iteration)
        self._seed = check_int("seed", seed, minimum=0, below=MAX_SEED)
        self._agents = agents_lib.Agents(num_agents, seeds, target_entropies, self._seed)
        self._signals, self._num_eval_episodes = SignalCallback(), num_eval_episodes
        self._callbacks = builtin_callbacks(
            summary_interval, summary_flush_secs, progress_bar, self._signals, eval_interval,
            num_eval_episodes, stop_eval_return, checkpoint_interval, callbacks)
        self._checkpointer = ckpt.Checkpointer(self._run_dir.checkpoint_dir, max_checkpoints)
        if check_int("num_threads", num_threads, minimum=1, allow_none=True) is not None:
            torch.set_num_threads(num_threads)
        self._num_envs, self._device = ranks.join_ranks(num_envs, device, type(self).__name__)
        self._env_id, self._env_ctor = env_id, agent_env_ctor(env_ctor, self._agents.seeds, seed)
        self._algorithm_ctor = self._agents.algorithm_ctor(self.agent_batch, algorithm_ctor,
                                                           self._device)
        self._iteration, self._env_steps, self._eval_time = 0, 0, 0.0
        self._env = self._time_step = self._restored_env = self._last_checkpoint = None
        self._in_iteration, self._restored_from, self.control = False, None, TrainerControl()
        self.metrics: Dict[str, float] = {}
        """The latest values (``return``, ``eval/return`` -- the lowest agent's --, ...)."""
        self._observation_spec, self._action_spec, self._algorithm = self._build(env_ctor)
        check_bindings_used(constructing=type(self).__name__)  # before anything is written
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

    def _train_iteration(self) -> int:
        """One iteration from ``self._time_step`` on ``self._env``; returns env steps taken."""
        raise NotImplementedError

    def _extra_state(self) -> Dict[str, Any]:
        """More checkpoint state of a subclass (tensors and plain values)."""
        return {}

    def _load_extra_state(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`_extra_state` returned."""

    def _policy_fn(self, observation: Any) -> Any:
        """The evaluated (deterministic) policy: observation batch -> action batch."""
        return self._algorithm.predict_step(TimeStep(observation=observation)).output

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

    def train(self) -> Dict[str, Any]:
        """Run (or resume) training until a limit is reached or a callback stops it, holding
        the run directory's lock.  A first SIGTERM/SIGINT stops after the iteration, with a
        checkpoint; a second raises :class:`TrainingAborted`.

        Returns:
            dict: ``iteration``, ``env_steps``, ``last_return`` (training episodes' mean),
            ``eval_return`` (the lowest agent's), ``wall_time``, ``eval_time``,
            ``already_done``, ``stopped_by`` (a signal's name) and ``checkpoint``.

        Raises:
            TrainingAborted: on a second SIGTERM/SIGINT.
            CheckpointError: if a checkpoint cannot be written (a full disk).
        """
        self._run_dir.take(check_config=False)
        try:
            return self._train()
        finally:
            self.close()  # the run is over: another process may take the directory

    def _train(self) -> Dict[str, Any]:
        start, self._eval_time, self._last_checkpoint = time.time(), 0.0, None
        done = self.limit_reached is not None
        if done:
            logging.info("Nothing to do: the run in %s is already at %s (iteration %d, %d env "
                         "steps)", self.root_dir, self.limit_reached, self._iteration,
                         self._env_steps)
        else:
            self._loop(start)
        return dict(iteration=self._iteration, env_steps=self._env_steps,
                    last_return=self.metrics.get("return"),
                    eval_return=self.metrics.get("eval/return"), wall_time=time.time() - start,
                    eval_time=self._eval_time, already_done=done,
                    stopped_by=None if done else self._signals.stopped_by,
                    checkpoint=self._last_checkpoint)

    def _loop(self, start: float) -> None:
        """Callbacks decide, the loop acts (module docstring)."""
        self.control, self._since = TrainerControl(), (start, self._env_steps)
        try:
            self._call("on_training_start")
            self._act()
            self._env, self._time_step = self._start_env()
            while not self.control.should_stop and self.limit_reached is None:
                self.control = TrainerControl()
                self._limits.update_progress(self._iteration, self._env_steps)
                self._call("on_iteration_start")
                with summary.record_if(lambda: self.control.should_log):
                    self._in_iteration = True
                    self._env_steps += self._train_iteration()  # collect -> train
                    self._in_iteration = False
                self._iteration += 1
                if self.control.should_log:
                    self._log()
                if not all(self._call("on_iteration_end")):
                    self.control.should_stop = True
                self._act()
            if self._last_checkpoint != self._checkpointer.path(self._iteration):
                self.save_checkpoint()  # a run ends with a checkpoint of its last iteration
        except KeyboardInterrupt:
            if distributed.is_distributed():  # the ranks stop at different points
                logging.warning("Interrupted; resume from the last periodic checkpoint")
            else:
                logging.warning("Interrupted; saved %s", self.save_checkpoint())
            raise
        finally:
            self._call("on_training_end")
            if self._env is not None:
                self._env.close()
            self._env, self._time_step, self._in_iteration = None, None, False

    def _call(self, hook: str, *args: Any) -> List[Any]:
        return [getattr(callback, hook)(self, *args) for callback in self._callbacks]

    def _act(self) -> None:
        """Evaluate (rank 0; the others take its verdict) and checkpoint as asked."""
        if self.control.should_evaluate:
            if distributed.is_main_process():
                self.evaluate()
            self.control.should_stop = distributed.broadcast_object(self.control.should_stop)
        if self.control.should_save:
            self.save_checkpoint()

    def _log(self) -> None:
        """The iteration's logs (each agent's episodes, speed, control): ``metrics``, ``on_log``."""
        now, steps = time.time(), self._env_steps
        sps = (steps - self._since[1]) / max(now - self._since[0], 1e-9)
        self._since = (now, steps)
        ranks_stats = distributed.gather_object(episode_statistics(self._env))
        if ranks_stats is None:  # not rank 0
            return
        per_agent = list(zip(*ranks_stats))  # each agent's (returns, lengths) of each rank
        returns = [[x for stats in agent for x in stats[0]] for agent in per_agent]
        lengths = [[x for stats in agent for x in stats[1]] for agent in per_agent]
        k = len(per_agent)
        logs = dict(self._control_logs(), env_steps=[steps] * k, steps_per_sec=[sps] * k,
                    **{"return": [float(np.mean(r)) if r else None for r in returns]},
                    episode_length=[float(np.mean(n)) if n else None for n in lengths])
        finished = [r for r in logs["return"] if r is not None]
        self.metrics.update(steps_per_sec=sps * k, alpha=float(np.mean(logs["alpha"])),
                            **({"return": float(np.mean(finished))} if finished else {}))
        self._call("on_log", logs)

    def _control_logs(self) -> Dict[str, List[float]]:
        """The latest summaries, with each agent's ``alpha`` and ``target_entropy`` now."""
        logs = summary.last_scalars()
        controller = getattr(self._algorithm, "entropy_target_algorithm", None)
        for tag, value in (("alpha", self._algorithm.entropy_coefficient()),
                           ("target_entropy", getattr(controller, "target_entropy", None))):
            if value is not None:
                logs[tag] = torch.as_tensor(value, dtype=torch.float32).reshape(-1).tolist()
        return logs

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

    def evaluate(self, num_episodes: Optional[int] = None) -> float:
        """Evaluate each agent's deterministic policy on its own envs and seeds (``num_episodes``
        each, default ``num_eval_episodes``) and call ``on_evaluate``; the lowest agent's mean
        return (``metrics["eval/return"]``)."""
        start = time.time()
        self._algorithm.eval()
        try:
            returns, _ = run_episodes(
                self._env_id, self._policy_fn, seed=self._seed + EVAL_SEED_OFFSET,
                num_episodes=num_episodes or self._num_eval_episodes, device=self._device,
                env_ctor=agent_env_ctor(GymVectorEnv, self._agents.seeds, self._seed))
        finally:
            self._algorithm.train()
        per_agent = mean_returns(returns)
        self.metrics["eval/return"] = min(per_agent)
        self._eval_time += time.time() - start
        self._call("on_evaluate", dict(self._control_logs(), **{"eval/return": per_agent}))
        return min(per_agent)

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
        if env_state:  # its pickle loads and its time step is this run's batch
            pickle.loads(ckpt.tensor_to_bytes(env_state["state"]))
            shape = tuple(TimeStep(**env_state["time_step"]).step_type.shape)
            if shape != batch:
                raise ValueError(f"its environment state is of a batch {shape}, this run {batch}")
        self._load_extra_state(state.get("extra") or {})

    def _commit(self, path: str, state: Dict[str, Any]) -> None:
        """Take the counters and env state of a restored checkpoint."""
        self._iteration, self._env_steps = int(state["iteration"]), int(state["env_steps"])
        self._restored_env, self._restored_from = state.get("env") or {}, path
        logging.info("Resumed from %s (iteration %d)", path, self._iteration)
