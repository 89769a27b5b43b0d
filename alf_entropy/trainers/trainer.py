"""``Trainer``: the training loop every trainer shares; a subclass writes one iteration.

:meth:`Trainer.train` reads top to bottom (SB3's ``learn()``): until a limit is reached
or ``control.should_stop`` the callbacks decide (:mod:`~alf_entropy.trainers.callbacks`)
and the loop acts: one iteration (``_train_iteration``: collect, then train; the
algorithm's summaries recorded if ``should_log``), then logging, evaluation and a
checkpoint as asked; a run ends with a checkpoint.  Its services -- directory, agents,
envs, counters, checkpoints -- are :class:`~alf_entropy.trainers.run.Run`'s.  K agents
(``num_agents``/``seeds``) are data, not a mode: each writes to its own run directory.
Under ``torchrun`` (one agent per rank) rank 0 alone evaluates and writes.
"""

import gc
import sys
import time
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import torch
from absl import logging

from alf_entropy.algorithms.algorithm import Algorithm
from alf_entropy.controllers.base import arguments
from alf_entropy.data_structures import TimeStep
from alf_entropy.environments import run_episodes
from alf_entropy.storage.run_dir import RunDir
from alf_entropy.trainers import ranks
from alf_entropy.trainers.agents import Agents
from alf_entropy.trainers.callbacks import (
    Callback,
    CheckpointCallback,
    EvaluationCallback,
    ProgressBarCallback,
    SignalCallback,
    SummaryCallback,
    TrainerControl,
    TrainingAborted,
)
from alf_entropy.trainers.limits import Limits
from alf_entropy.trainers.run import Run
from alf_entropy.utils import distributed, summary
from alf_entropy.utils.checks import check_int

__all__ = ["EVAL_SEED_OFFSET", "Trainer", "TrainingAborted", "trainer_arguments"]

EVAL_SEED_OFFSET = 1_000_003
"""Evaluation environments are seeded ``seed + EVAL_SEED_OFFSET`` (apart from training's)."""


trainer_arguments = arguments
"""What a concrete trainer passes to :class:`Trainer`: ``trainer_arguments(locals(), *own)``, the
``locals()`` its ``__init__`` takes first thing (its arguments), without its ``own`` ones,
``self`` and the ``__class__`` that ``super()`` adds (the controllers' ``arguments``)."""


class Trainer(Run):
    """The shared training loop (see the module docstring).

    A concrete trainer passes its arguments but its own here (:func:`trainer_arguments`):
    this builds the run's parts from them, each checked where it is built, and the
    callbacks from the loop's.  Those not listed below are
    :class:`~alf_entropy.trainers.on_policy_trainer.OnPolicyTrainer`'s.

    Args:
        summary_interval: iterations between summaries.
        checkpoint_interval: iterations between checkpoints (``None``: at the end only).
        eval_interval: iterations between evaluations (also at the start and the end).
        num_eval_episodes: episodes per evaluation.
        progress_bar: a tqdm line (on a terminal only).
        summary_flush_secs: how often summaries are flushed to disk.
        stop_eval_return: stop once every agent's evaluation reaches it.
        callbacks: more ``Callback`` s, run after the built-in ones.
        steps_per_env: env steps per environment per iteration.

    Raises:
        ValueError: for bad arguments, a ``root_dir`` in use by another configuration, an
            unused binding, or K > 1 on several ranks.
        TypeError: if a callback is not a ``Callback``.
        RunDirLocked: if another process trains in ``root_dir``.
        CheckpointError: if the run directory has checkpoints and none loads.
    """

    def __init__(
        self,
        root_dir: str,
        *,
        env_id: str,
        num_envs: int,
        steps_per_env: int,
        algorithm_ctor: Callable[..., Algorithm],
        num_iterations: Optional[int],
        num_env_steps: Optional[int],
        seed: int,
        num_agents: int,
        seeds: Optional[Sequence[int]],
        target_entropies: Optional[Sequence[Any]],
        env_ctor: Callable[..., Any],
        device: Any,
        num_threads: Optional[int],
        max_checkpoints: int,
        allow_config_change: bool,
        summary_interval: int,
        checkpoint_interval: Optional[int],
        eval_interval: Optional[int],
        num_eval_episodes: int,
        progress_bar: bool,
        summary_flush_secs: float,
        stop_eval_return: Optional[float],
        callbacks: Sequence[Callback],
    ):
        self._num_eval_episodes = check_int("num_eval_episodes", num_eval_episodes, minimum=1)
        for callback in callbacks:
            if not isinstance(callback, Callback):
                raise TypeError(f"callbacks must be Callback instances, got {callback!r}")
        if stop_eval_return is not None and eval_interval is None:
            raise ValueError("stop_eval_return needs eval_interval to be set")
        # The built-in callbacks its arguments ask for (each checks its own), then the user's.
        self._signals = SignalCallback()
        self._callbacks = [SummaryCallback(summary_interval, summary_flush_secs)]
        if progress_bar:
            self._callbacks.append(ProgressBarCallback())
        self._callbacks.append(self._signals)
        if eval_interval is not None:
            self._callbacks.append(EvaluationCallback(eval_interval, stop_eval_return))
        if checkpoint_interval is not None:
            self._callbacks.append(CheckpointCallback(checkpoint_interval))
        self._callbacks += callbacks
        self.control, self._eval_time = TrainerControl(), 0.0
        self.metrics: Dict[str, float] = {}
        """The latest values (``return``, ``eval/return`` -- the lowest agent's --, ...)."""
        # The run's parts, each checking its arguments.
        run_dir = RunDir(root_dir, allow_config_change)
        rank_envs = ranks.per_rank(f"{type(self).__name__}.num_envs", num_envs)
        limits = Limits(num_iterations, num_env_steps, steps_per_env * num_envs)
        agents = Agents(num_agents, seeds, target_entropies, seed)
        check_int("num_threads", num_threads, minimum=1, allow_none=True)
        super().__init__(
            run_dir,
            limits,
            agents,
            env_id=env_id,
            num_envs=rank_envs,
            algorithm_ctor=algorithm_ctor,
            env_ctor=env_ctor,
            device=device,
            max_checkpoints=max_checkpoints,
        )
        if num_threads is not None:  # once every argument is known to be good
            torch.set_num_threads(num_threads)

    def _train_iteration(self) -> int:
        """One iteration from ``self._time_step`` on ``self.env``; returns env steps taken."""
        raise NotImplementedError

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
        start, self._eval_time, self.last_checkpoint = time.time(), 0.0, None
        done = self.limit_reached is not None
        # Python's full collections skip every object made before the loop (a process that
        # froze its own heap keeps its freeze): each rescanned the ~330k objects of torch and
        # the run, 0.2 s, 3 % of a CartPole PPO run's training time.
        freeze = not done and gc.get_freeze_count() == 0
        if freeze:
            gc.freeze()
        try:
            if done:
                logging.info(
                    "Nothing to do: the run in %s is already at %s (iteration %d, %d env steps)",
                    self.root_dir,
                    self.limit_reached,
                    self.iteration,
                    self.env_steps,
                )
            else:
                self._loop(start)
        finally:
            if freeze:
                gc.unfreeze()
            self.close()  # the run is over: another process may take the directory
        return dict(
            iteration=self.iteration,
            env_steps=self.env_steps,
            last_return=self.metrics.get("return"),
            eval_return=self.metrics.get("eval/return"),
            wall_time=time.time() - start,
            eval_time=self._eval_time,
            already_done=done,
            stopped_by=None if done else self._signals.stopped_by,
            checkpoint=self.last_checkpoint,
        )

    def _loop(self, start):
        """Callbacks decide, the loop acts (module docstring)."""
        self.control, self._since = TrainerControl(), (start, self.env_steps)
        try:
            self._call("on_training_start")
            self._act()
            self.env, self._time_step = self._start_env()
            while not self.control.should_stop and self.limit_reached is None:
                self.control = TrainerControl()
                self._limits.update_progress(self.iteration, self.env_steps)
                self._call("on_iteration_start")
                with summary.record_if(lambda: self.control.should_log):
                    self._in_iteration = True
                    self.env_steps += self._train_iteration()  # collect -> train
                    self._in_iteration = False
                self.iteration += 1
                if self.control.should_log:
                    self._log()
                if not all(self._call("on_iteration_end")):
                    self.control.should_stop = True
                self._act()
            if self.last_checkpoint != self._checkpointer.path(self.iteration):
                self.save_checkpoint()  # a run ends with a checkpoint of its last iteration
        except KeyboardInterrupt:
            if distributed.is_distributed():  # the ranks stop at different points
                logging.warning("Interrupted; resume from the last periodic checkpoint")
            else:
                logging.warning("Interrupted; saved %s", self.save_checkpoint())
            raise
        finally:
            errors = []  # every callback's, also after one raised (a later one may restore
            try:  # signal handlers or close files)
                for callback in self._callbacks:
                    try:
                        callback.on_training_end(self)
                    except Exception as error:
                        errors.append(error)
            finally:
                if self.env is not None:
                    self.env.close()
                self.env, self._time_step, self._in_iteration = None, None, False
            running = sys.exc_info()[1] is not None  # the run's own error goes on unhidden
            for error in errors[0 if running else 1 :]:
                logging.error("on_training_end failed", exc_info=error)
            if errors and not running:
                raise errors[0]

    def _call(self, hook, *args):
        return [getattr(callback, hook)(self, *args) for callback in self._callbacks]

    def _act(self):
        """Evaluate (rank 0; the others take its verdict) and checkpoint as asked."""
        if self.control.should_evaluate:
            if distributed.is_main_process():
                self.evaluate()
            self.control.should_stop = distributed.broadcast_object(self.control.should_stop)
        if self.control.should_save:
            self.save_checkpoint()

    def _log(self):
        """The iteration's logs (each agent's episodes, speed, control): ``metrics``, ``on_log``."""
        now, steps = time.time(), self.env_steps
        sps = (steps - self._since[1]) / max(now - self._since[0], 1e-9)
        self._since = (now, steps)
        ranks_stats = distributed.gather_object(self.env.pop_episode_statistics())
        if ranks_stats is None:  # not rank 0
            return
        logs, k = self._control_logs(), self.num_agents
        for i, tag in enumerate(("return", "episode_length")):  # each agent's, of all ranks
            values = [[x for stats in agent for x in stats[i]] for agent in zip(*ranks_stats)]
            logs[tag] = [float(np.mean(v)) if v else None for v in values]
        logs.update(env_steps=[steps] * k, steps_per_sec=[sps] * k)
        self.metrics["steps_per_sec"] = sps * k
        for tag in ("alpha", "return"):
            values = [v for v in logs.get(tag, []) if v is not None]
            if values:
                self.metrics[tag] = float(np.mean(values))
        self._call("on_log", logs)

    def _control_logs(self):
        """The latest summaries, with each agent's ``alpha`` and ``target_entropy`` now (where
        the algorithm has ``entropy_coefficient()`` and a controller: neither is required)."""
        logs = summary.last_scalars()
        controller = getattr(self.algorithm, "entropy_target_algorithm", None)
        coefficient = getattr(self.algorithm, "entropy_coefficient", None)
        for tag, value in (
            ("alpha", coefficient() if callable(coefficient) else None),
            ("target_entropy", getattr(controller, "target_entropy", None)),
        ):
            if value is not None:
                logs[tag] = torch.as_tensor(value, dtype=torch.float32).reshape(-1).tolist()
        return logs

    def evaluate(self, num_episodes: Optional[int] = None) -> float:
        """Evaluate each agent's deterministic policy on its own envs and seeds (``num_episodes``
        each, default ``num_eval_episodes``) and call ``on_evaluate``; the lowest agent's mean
        return (``metrics["eval/return"]``)."""
        start = time.time()
        self.algorithm.eval()
        try:
            returns, _ = run_episodes(  # the deterministic policy's
                self._env_id,
                lambda observation: (
                    self.algorithm.predict_step(TimeStep(observation=observation)).output
                ),
                seed=self._agents.seed + EVAL_SEED_OFFSET,
                num_episodes=num_episodes or self._num_eval_episodes,
                device=self.device,
                env_ctor=self._env_ctor,
            )  # the training envs' own ctor, per agent
        finally:
            self.algorithm.train()
        per_agent = np.reshape(returns, (self.num_agents, -1)).mean(1).tolist()
        self.metrics["eval/return"] = min(per_agent)
        self._eval_time += time.time() - start
        self._call("on_evaluate", dict(self._control_logs(), **{"eval/return": per_agent}))
        return min(per_agent)
