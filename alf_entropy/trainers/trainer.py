"""``Trainer``: the training loop every trainer shares; a subclass writes one iteration.

:meth:`Trainer.train` reads top to bottom: the callbacks' ``on_training_start``;
then, until a limit is reached, ``on_iteration_start``, one iteration
(``_train_iteration``: collect, then train) and ``on_iteration_end`` (any
False stops); a checkpoint of the last iteration; ``on_training_end``.

The services are pieces with their own names: the run directory
(:class:`~alf_entropy.trainers.run_dir.RunDir`: lock, config check,
``operative_config.gin``), the checkpointer
(:class:`~alf_entropy.trainers.checkpoint.Checkpointer`) and the callbacks
(:mod:`alf_entropy.trainers.callbacks`: summaries in ``root_dir/train``,
progress bar, signals, evaluation, periodic checkpoints in
``root_dir/checkpoints``, and yours).  Before every iteration the scheduler
progress is set (:mod:`alf_entropy.utils.schedulers`: ``iterations``,
``env_steps``, ``global_counter`` and ``percent`` of the binding limit).

Under ``torchrun`` every rank builds the same trainer; ``num_envs`` and the
limits are global totals; the model starts as rank 0's; rank 0 alone
evaluates and writes (see :mod:`alf_entropy.utils.distributed`).

A subclass calls ``super().__init__(..., steps_per_iteration=...)`` and
writes ``_train_iteration``; it may override ``_build_algorithm``,
``_extra_state`` / ``_load_extra_state`` and ``_policy_fn``.
"""
import pickle
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from absl import logging

from alf_entropy.algorithm import Algorithm
from alf_entropy.data_structures import TimeStep
from alf_entropy.environments import GymVectorEnv, evaluate
from alf_entropy.trainers import callbacks as callbacks_lib
from alf_entropy.trainers import checkpoint as ckpt
from alf_entropy.trainers import ranks
from alf_entropy.trainers.callbacks import Callback, SignalCallback, TrainingAborted
from alf_entropy.trainers.limits import Limits
from alf_entropy.trainers.ranks import MAX_SEED, resolve_device
from alf_entropy.trainers.run_dir import RunDir
from alf_entropy.utils import distributed, schedulers
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.gin_config import check_bindings_used

__all__ = ["EVAL_SEED_OFFSET", "MAX_SEED", "Trainer", "TrainingAborted", "resolve_device"]

EVAL_SEED_OFFSET = 1_000_003
"""Evaluation environments are seeded ``seed + EVAL_SEED_OFFSET`` (apart from training's)."""


class Trainer:
    """The shared training loop (see the module docstring).

    Args:
        root_dir: where summaries, checkpoints and the config go; a run there is resumed.
        env_id: the gymnasium id.
        num_envs: parallel environments in total (under ``torchrun`` split over the ranks).
        algorithm_ctor: ``(observation_spec, action_spec) -> Algorithm``.
        env_ctor: ``(env_id, num_envs=, seed=, device=) -> env`` (a ``GymVectorEnv``).
        num_iterations: stop after this many iterations; ``None`` or 0: no limit from it.
        num_env_steps: stop once this many env steps are done (whole iterations,
            so rounded up); ``None`` or 0: no limit from it.  One limit must be positive.
        steps_per_iteration: env steps one iteration takes (from the subclass).
        summary_interval: write summaries every this many iterations.
        checkpoint_interval: checkpoint every this many iterations (and at the
            end); ``None``: only at the end.
        eval_interval: evaluate the deterministic policy every this many
            iterations (and at the start and the end); ``None``: never.
        num_eval_episodes: episodes per evaluation.
        max_checkpoints: how many recent checkpoints to keep.
        seed: seeds torch, NumPy, Python ``random`` and the environments.
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or a ``torch.device``.
        num_threads: if given, ``torch.set_num_threads(num_threads)``.
        progress_bar: show a tqdm progress line (on a terminal only).
        summary_flush_secs: how often summaries are flushed to disk.
        stop_eval_return: stop (with a checkpoint) once an evaluation's mean
            return reaches it (needs ``eval_interval``).
        allow_config_change: resume a run directory whose config differs
            (see :class:`~alf_entropy.trainers.run_dir.RunDir`).
        callbacks: more :class:`~alf_entropy.trainers.callbacks.Callback` s,
            run after the built-in ones.

    Raises:
        ValueError: for out-of-range arguments, an unusable ``root_dir``, a
            config that differs from the run directory's, or a binding nothing
            uses (``GinConfigError``).
        TypeError: if a callback is not a ``Callback``.
        RunDirLocked: if another process trains in ``root_dir``.
        CheckpointError: if the run directory has checkpoints and none loads.
        DistributedError: if ``WORLD_SIZE > 1`` and the ranks cannot form a group.
    """

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
    ):
        self._run_dir = RunDir(root_dir, allow_config_change)
        self._limits = Limits(num_iterations, num_env_steps, steps_per_iteration)
        self._num_eval_episodes = check_int("num_eval_episodes", num_eval_episodes, minimum=1)
        self._signals = SignalCallback()
        self._callbacks = callbacks_lib.builtin_callbacks(
            summary_interval, summary_flush_secs, progress_bar, self._signals, eval_interval,
            num_eval_episodes, stop_eval_return, checkpoint_interval, callbacks)
        self._checkpointer = ckpt.Checkpointer(self._run_dir.checkpoint_dir, max_checkpoints)
        self._seed = check_int("seed", seed, minimum=0, below=MAX_SEED)
        if check_int("num_threads", num_threads, minimum=1, allow_none=True) is not None:
            torch.set_num_threads(num_threads)
        self._env_id, self._env_ctor, self._algorithm_ctor = env_id, env_ctor, algorithm_ctor
        self._num_envs, self._device = ranks.join_ranks(num_envs, device, type(self).__name__)
        self._iteration, self._env_steps, self._eval_time = 0, 0, 0.0
        self._env: Any = None
        self._time_step: Optional[TimeStep] = None
        self._restored_env: Optional[Dict[str, Any]] = None
        self._in_iteration = False
        self._last_checkpoint: Optional[str] = None
        self._restored_from: Optional[str] = None
        self.metrics: Dict[str, float] = {}
        """The latest values the callbacks report (``return``, ``eval/return``, ...)."""
        self._observation_spec, self._action_spec, self._algorithm = self._build()
        check_bindings_used(constructing=type(self).__name__)  # before anything is written
        with self._run_dir.opening():
            self._run_dir.take()
            self._resume()
            self._run_dir.write_operative_config(self._iteration)

    def _build(self) -> Tuple[Any, Any, Algorithm]:
        """Seed everything, read the specs from a throw-away env, build the algorithm."""
        ranks.seed_all(self._seed)
        schedulers.reset_progress()
        probe = self._env_ctor(self._env_id, num_envs=1, seed=self._seed, device=self._device)
        observation_spec, action_spec = probe.observation_spec, probe.action_spec
        probe.close()
        algorithm = self._build_algorithm(observation_spec, action_spec)
        algorithm.to(self._device)
        if distributed.is_distributed():
            distributed.broadcast_module_(algorithm)  # the same start everywhere
            ranks.seed_all(self._seed + distributed.rank() * ranks.RANK_SEED_OFFSET)  # own samples
        return observation_spec, action_spec, algorithm

    def _build_algorithm(self, observation_spec: Any, action_spec: Any) -> Algorithm:
        """Build the algorithm (override for more constructor arguments)."""
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

    @property
    def root_dir(self) -> str:
        """The absolute root directory."""
        return self._run_dir.path

    @property
    def algorithm(self) -> Algorithm:
        """The algorithm being trained."""
        return self._algorithm

    @property
    def device(self) -> torch.device:
        """The device of networks and time steps."""
        return self._device

    @property
    def env(self) -> Any:
        """The training environments (this rank's) while ``train()`` runs, else ``None``."""
        return self._env

    @property
    def iteration(self) -> int:
        """Training iterations completed (restored from a checkpoint)."""
        return self._iteration

    @property
    def env_steps(self) -> int:
        """Environment steps taken, all ranks' (restored from a checkpoint)."""
        return self._env_steps

    @property
    def num_iterations(self) -> Optional[int]:
        """The ``num_iterations`` limit as given (``None``: no limit from it)."""
        return self._limits.num_iterations or None

    @property
    def total_iterations(self) -> int:
        """Iterations the run takes: the binding limit expressed in iterations."""
        return self._limits.total_iterations

    @property
    def limit_reached(self) -> Optional[str]:
        """The limit reached now (e.g. ``"num_iterations = 3"``), or ``None``."""
        return self._limits.reached(self._iteration, self._env_steps)

    @property
    def restored_from(self) -> Optional[str]:
        """The checkpoint this trainer resumed from, if any."""
        return self._restored_from

    @property
    def last_checkpoint(self) -> Optional[str]:
        """The checkpoint the current (or last) ``train()`` wrote last, if any."""
        return self._last_checkpoint

    def train(self) -> Dict[str, Any]:
        """Run (or resume) training until a limit is reached or a callback stops it.

        Holds the run directory's lock while it runs.  A first SIGTERM/SIGINT
        ends the run after the current iteration, with a checkpoint; a second
        raises :class:`TrainingAborted` (see ``SignalCallback``).

        Returns:
            dict: ``iteration``, ``env_steps``, ``last_return`` (the training
            episodes' mean return at the last summary), ``eval_return`` (the
            latest evaluation's, or ``None``), ``wall_time`` and ``eval_time``
            (seconds of this call, and of it evaluating), ``already_done``
            (the resumed run was at its limit: nothing done), ``stopped_by``
            (``"SIGTERM"``/``"SIGINT"`` if a signal ended it, else ``None``)
            and ``checkpoint`` (the last one written, or ``None``).

        Raises:
            TrainingAborted: on a second SIGTERM/SIGINT.
            KeyboardInterrupt: (outside the main thread, where no handlers
                are installed) re-raised after saving a checkpoint.
            CheckpointError: if a checkpoint cannot be written (a full disk).
        """
        self._run_dir.take(check_config=False)
        try:
            return self._train()
        finally:
            self.close()  # the run is over: another process may take the directory

    def _train(self) -> Dict[str, Any]:
        """:meth:`train` under the run directory's lock."""
        start, self._eval_time, self._last_checkpoint = time.time(), 0.0, None
        if self.limit_reached is not None:
            logging.info(
                "Nothing to do: the run in %s is already at %s (iteration %d, %d env steps)",
                self.root_dir, self.limit_reached, self._iteration, self._env_steps,
            )
            return self._result(start, already_done=True)
        try:
            for callback in self._callbacks:
                callback.on_training_start(self)
            self._env, self._time_step = self._start_env()
            keep_going = True
            while keep_going and self.limit_reached is None:
                self._update_progress()
                for callback in self._callbacks:
                    callback.on_iteration_start(self)
                self._in_iteration = True
                self._env_steps += self._train_iteration()  # collect -> train
                self._in_iteration = False
                self._iteration += 1
                keep_going = all([callback.on_iteration_end(self) for callback in self._callbacks])
            if self._last_checkpoint != self._checkpointer.path(self._iteration):
                self.save_checkpoint()  # a run ends with a checkpoint of its last iteration
        except KeyboardInterrupt:
            if distributed.is_distributed():  # the ranks stop at different points
                logging.warning("Interrupted; resume from the last periodic checkpoint")
            else:
                logging.warning("Interrupted; saved %s", self.save_checkpoint())
            raise
        finally:
            for callback in self._callbacks:
                callback.on_training_end(self)
            if self._env is not None:
                self._env.close()
            self._env, self._time_step, self._in_iteration = None, None, False
        return self._result(start)

    def _result(self, start: float, already_done: bool = False) -> Dict[str, Any]:
        return dict(iteration=self._iteration, env_steps=self._env_steps,
                    last_return=self.metrics.get("return"),
                    eval_return=self.metrics.get("eval/return"), wall_time=time.time() - start,
                    eval_time=self._eval_time, already_done=already_done,
                    stopped_by=None if already_done else self._signals.stopped_by,
                    checkpoint=self._last_checkpoint)

    def _update_progress(self) -> None:
        self._limits.update_progress(self._iteration, self._env_steps)

    def _start_env(self) -> Tuple[Any, TimeStep]:
        """Build the training envs; restore their saved state or reset them."""
        env = self._env_ctor(
            self._env_id,
            num_envs=self._num_envs,
            # Rank r's envs continue the numbering of the global batch.
            seed=self._seed + (self._iteration * distributed.world_size() + distributed.rank())
            * self._num_envs,
            device=self._device,
        )
        restored, self._restored_env = self._restored_env, None
        if restored:
            env.set_state(ckpt.tensor_to_bytes(restored["state"]))
            return env, TimeStep(**{
                k: v.to(self._device) if isinstance(v, torch.Tensor) else v
                for k, v in restored["time_step"].items()
            })
        if restored is not None:  # resumed from a checkpoint without env state
            logging.warning("The checkpoint holds no state of the %s environments (they cannot be "
                            "pickled, or training was interrupted mid-iteration): their episodes "
                            "restart, so the resumed run is not bit-exact with an uninterrupted "
                            "one.", self._env_id)
        return env, env.reset()

    def evaluate(self, num_episodes: Optional[int] = None) -> float:
        """The deterministic policy's mean return over ``num_episodes`` (default
        ``num_eval_episodes``) on its own environments and seeds."""
        start = time.time()
        self._algorithm.eval()
        try:
            value = evaluate(self._env_id, self._policy_fn, seed=self._seed + EVAL_SEED_OFFSET,
                             num_episodes=num_episodes or self._num_eval_episodes,
                             device=self._device)
        finally:
            self._algorithm.train()
        self.metrics["eval/return"] = value
        self._eval_time += time.time() - start
        return value

    def close(self) -> None:
        """Release the run directory's lock (idempotent; ``train()`` takes it again)."""
        self._run_dir.release()

    def save_checkpoint(self) -> str:
        """Write a checkpoint (every rank calls it): what ``Checkpointer`` saves, with
        this rank's ``env`` (the pickled environments and time step; empty if
        unpicklable or mid-iteration) and ``extra`` (``_extra_state``).

        Returns:
            str: the checkpoint path.
        """
        self._update_progress()
        own = {"env": self._env_state(), "extra": self._extra_state()}
        self._last_checkpoint = self._checkpointer.save(
            self._iteration, self._env_steps, self._algorithm, own)
        return self._last_checkpoint

    def _env_state(self) -> Dict[str, Any]:
        """The environments' state and the current time step (empty if unsaveable)."""
        if self._env is None or self._in_iteration or not hasattr(self._env, "get_state"):
            return {}
        state = self._env.get_state()
        if state is None:
            return {}
        return {"state": ckpt.bytes_to_tensor(state), "time_step": self._time_step._asdict()}

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
        env_state = state.get("env") or {}
        if env_state:  # its pickle loads and holds this rank's envs
            fields = pickle.loads(ckpt.tensor_to_bytes(env_state["state"]))
            num_envs = getattr(fields[0] if isinstance(fields, tuple) and fields else None,
                               "num_envs", None)
            if num_envs != self._num_envs:
                raise ValueError(f"its environment state holds {num_envs} envs, this run "
                                 f"steps {self._num_envs}")
            TimeStep(**env_state["time_step"])
        self._load_extra_state(state.get("extra") or {})

    def _commit(self, path: str, state: Dict[str, Any]) -> None:
        """Take the counters and env state of a restored checkpoint."""
        self._iteration, self._env_steps = int(state["iteration"]), int(state["env_steps"])
        self._restored_env, self._restored_from = state.get("env") or {}, path
        logging.info("Resumed from %s (iteration %d)", path, self._iteration)
