"""``Trainer``: what every trainer shares; subclasses write only their loop body.

The base class owns the run around the algorithm-specific iteration:

* the root directory::

      root_dir/
        operative_config.gin           # the gin config in force (written at start)
        train/events.out.tfevents.*    # TensorBoard summaries
        checkpoints/ckpt-00000100.pt   # the last ``max_checkpoints`` checkpoints

* seeding (torch, NumPy, Python ``random``, the environments), the device and
  the torch thread count;
* the training limits (ALF's ``TrainerConfig`` rule): ``num_iterations`` and
  ``num_env_steps`` may both be given; 0 or ``None`` means "no limit from this
  one"; at least one must be positive; training stops as soon as either is
  reached (or an evaluation reaches ``stop_eval_return``);
* the scheduler progress registry (:mod:`alf_entropy.utils.schedulers`),
  updated before every iteration: ``iterations`` and ``env_steps`` done so
  far, ``global_counter`` (= ``iterations``; the summary step) and
  ``percent = min(1, max(iterations / num_iterations, env_steps /
  num_env_steps))`` with a term only for each positive limit (as in ALF) --
  the fraction of the binding limit, so a scheduled value spans the whole run
  whichever limit ends it;
* summaries every ``summary_interval`` iterations (``env_steps``,
  ``steps_per_sec``, the training episodes' ``return``/``episode_length``
  from the environment's episode statistics, plus whatever the algorithm
  records inside the iteration), a deterministic evaluation every
  ``eval_interval`` iterations (``eval/return``), a tqdm progress bar whose
  total is the binding limit in iterations;
* checkpoints every ``checkpoint_interval`` iterations, at the end and
  after the iteration in which a SIGTERM or SIGINT arrived (a second one
  stops at once: :class:`TrainingAborted`), and the resume on construction
  from the newest checkpoint that loads (damaged ones are skipped with a
  warning; see :meth:`Trainer.save_checkpoint` for the contents).  A resumed
  run with a larger limit continues; one already at its limit logs one line
  and :meth:`Trainer.train` returns ``already_done=True`` at once;
* the run directory belongs to one run (:mod:`alf_entropy.trainers.run_dir`):
  a ``flock`` held from construction until :meth:`Trainer.train` returns
  refuses a second trainer, and a configuration that differs from the
  directory's ``operative_config.gin`` beyond the result-neutral settings is
  refused unless ``allow_config_change``;
* before anything is written, a gin binding nothing used is refused
  (:func:`~alf_entropy.trainers.gin_config.check_bindings_used`).

See ``docs/robustness.md`` for these guarantees and their tests.

Data-parallel under ``torchrun`` (``WORLD_SIZE > 1``, see
:mod:`alf_entropy.utils.distributed`): every rank builds the same trainer;
``num_envs`` and the limits are global totals (each rank steps
``num_envs / W`` envs with its own seeds, progress counts all ranks' env
steps); the model starts as rank 0's and its gradients are averaged in
``update_with_gradient``; rank 0 alone evaluates (the stop verdict is
broadcast) and writes summaries, the config and checkpoints, which gather
every rank's RNG, environment and extra state; on resume rank 0 reads the
checkpoint and sends every rank its part.

Extension points for a subclass (``OnPolicyTrainer``, ``OffPolicyTrainer``):

* ``__init__``: call ``super().__init__(..., steps_per_iteration=...)``
  (env steps one iteration takes: sets the iteration count of an
  ``num_env_steps`` limit) after setting the attributes
  :meth:`_build_algorithm` needs; the base builds the algorithm and then
  resumes from the latest checkpoint.
* :meth:`_build_algorithm` ``(observation_spec, action_spec) -> Algorithm``:
  defaults to ``algorithm_ctor(observation_spec, action_spec)``.
* :meth:`_train_iteration` ``() -> int`` (required): one iteration on
  ``self._env`` starting from ``self._time_step`` (which it must advance),
  returning the env steps it took.  It runs inside the summary gate, so
  ``summary.*`` calls in the algorithm are recorded on summary iterations.
* :meth:`_extra_state` ``() -> dict`` and :meth:`_load_extra_state`
  ``(dict)``: more state for the checkpoint (e.g. a replay buffer);
  tensors and plain values only.
* :meth:`_policy_fn` ``(observation) -> action``: the evaluated policy;
  defaults to the algorithm's ``predict_step``.
"""
import copy
import logging as py_logging
import math
import os
import pickle
import random
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import gin
import numpy as np
import torch
from absl import logging
from absl.logging import ABSLHandler

from alf_entropy.utils.requirements import require_train_extra

require_train_extra()  # gymnasium>=1.1 and tqdm: the `train` extra

from tqdm import tqdm  # noqa: E402  (after the requirement check)

from alf_entropy.algorithms.algorithm import Algorithm  # noqa: E402
from alf_entropy.data_structures import TimeStep  # noqa: E402
from alf_entropy.environments import GymVectorEnv, evaluate  # noqa: E402
from alf_entropy.trainers import checkpoint as ckpt  # noqa: E402
from alf_entropy.trainers import gin_config, run_dir  # noqa: E402
from alf_entropy.trainers.checkpoint import CheckpointError  # noqa: E402
from alf_entropy.utils import distributed, schedulers, summary  # noqa: E402
from alf_entropy.utils.checks import check_int  # noqa: E402

__all__ = ["MAX_SEED", "Trainer", "TrainingAborted", "resolve_device"]

MAX_SEED = 2**31
"""Seeds are below this, so that the seeds derived from one (per rank, per
env, the evaluation's) stay below 2**32, as NumPy's seeding needs."""
_EVAL_SEED_OFFSET = 1_000_003
_RANK_SEED_OFFSET = 7_919_993


class _BarLogHandler(py_logging.Handler):
    """Writes another console handler's lines with ``tqdm.write``.

    ``tqdm.write`` clears the progress bar, writes the line and redraws the
    bar, so a log line starts on its own line instead of after the bar's text.
    """

    def __init__(self, console: py_logging.Handler):
        super().__init__(console.level)
        self._console = console

    def emit(self, record: py_logging.LogRecord) -> None:
        try:
            tqdm.write(self._console.format(record), file=sys.stderr)
        except Exception:  # logging must not raise; report it as logging does
            self.handleError(record)


def _is_console_handler(handler: py_logging.Handler) -> bool:
    """Whether ``handler`` writes to the terminal (stdout or stderr)."""
    if isinstance(handler, ABSLHandler):  # absl's, installed by app.run
        handler = handler.python_handler
    return isinstance(handler, py_logging.StreamHandler) and handler.stream in (
        sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__,
    )


_Swapped = List[Tuple[py_logging.Handler, py_logging.Handler]]


def _log_through_bar(bar: Any) -> _Swapped:
    """Route the root logger's console handlers through ``bar`` (``tqdm.write``).

    Args:
        bar: a tqdm bar; a disabled one changes nothing.

    Returns:
        The ``(console handler, its stand-in)`` pairs, for :func:`_restore_logging`.
    """
    root = py_logging.getLogger()
    swapped: _Swapped = []
    if not getattr(bar, "disable", True):
        for handler in list(root.handlers):
            if _is_console_handler(handler):
                proxy = _BarLogHandler(handler)
                root.removeHandler(handler)
                root.addHandler(proxy)
                swapped.append((handler, proxy))
    return swapped


def _restore_logging(swapped: _Swapped) -> None:
    """Undo :func:`_log_through_bar`."""
    root = py_logging.getLogger()
    for handler, proxy in swapped:
        root.removeHandler(proxy)
        root.addHandler(handler)


class TrainingAborted(Exception):
    """A second SIGTERM/SIGINT stopped training at once, without a checkpoint.

    Attributes:
        signum: the signal's number.
    """

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(
            f"stopped at once by a second {signal.Signals(signum).name}: no checkpoint written; "
            "run the same command to resume from the last checkpoint"
        )


def resolve_device(device: Any) -> torch.device:
    """Turn ``"auto"``/``"cpu"``/``"cuda"``/a ``torch.device`` into a device.

    Args:
        device: ``"auto"`` picks CUDA when available, else CPU.

    Returns:
        torch.device: the device.

    Raises:
        ValueError: for an unknown name, or ``"cuda"`` without CUDA.
    """
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(
            f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}"
        ) from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def _time_step_to_dict(time_step: TimeStep) -> Dict[str, Any]:
    return dict(time_step._asdict())


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def _to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor (in dicts, lists, tuples) moved to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


class Trainer:
    """The shared part of the trainers (see the module docstring).

    Args:
        root_dir: where summaries, checkpoints and the config go; an existing
            run there is resumed.
        env_id: the gymnasium id.
        num_envs: parallel environments ``B`` in total; under ``torchrun``
            each of the ``W`` ranks steps ``B / W`` of them (``B`` must be
            divisible by ``W``).
        algorithm_ctor: ``(observation_spec, action_spec) -> Algorithm``.
        env_ctor: ``(env_id, num_envs=, seed=, device=) -> env`` (a
            ``GymVectorEnv``).
        num_iterations: stop after this many iterations; ``None`` or 0: no
            limit from it.
        num_env_steps: stop once this many env steps are done (whole
            iterations, so rounded up); ``None`` or 0: no limit from it.  At
            least one of the two must be positive.
        steps_per_iteration: env steps one iteration takes (from the
            subclass).
        summary_interval: write summaries every this many iterations.
        checkpoint_interval: checkpoint every this many iterations (and at
            the end); ``None``: only at the end.
        eval_interval: evaluate the deterministic policy every this many
            iterations (and at the start and the end); ``None``: never.
        num_eval_episodes: episodes per evaluation.
        max_checkpoints: how many recent checkpoints to keep.
        seed: seeds torch, NumPy, Python ``random`` and the environments
            (rank ``r`` of a data-parallel run: its own seeds derived from it).
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or a ``torch.device``
            (under ``torchrun`` with CUDA: ``cuda:LOCAL_RANK``).
        num_threads: if given, ``torch.set_num_threads(num_threads)``.
        progress_bar: show a tqdm progress line (on a terminal only).
        summary_flush_secs: how often summaries are flushed to disk.
        stop_eval_return: stop (and checkpoint) as soon as an evaluation's
            mean return reaches it (needs ``eval_interval``).
        allow_config_change: resume a run directory whose
            ``operative_config.gin`` differs from the configuration in force
            (beyond :data:`~alf_entropy.trainers.run_dir.RESULT_NEUTRAL_PARAMETERS`);
            the differences are logged and the old config is kept as
            ``operative_config.<iteration>.gin``.  Without it such a resume is
            refused.

    Raises:
        ValueError: for out-of-range arguments (no positive limit, negative
            limits, non-positive sizes, an unknown device, ``num_envs`` not
            divisible by the number of ranks, ...), a ``root_dir`` that is a
            file or not writable, a configuration that differs from the run
            directory's, or a binding nothing uses
            (:class:`~alf_entropy.trainers.gin_config.GinConfigError`).
        RunDirLocked: if another process trains in ``root_dir``.
        CheckpointError: if the run directory has checkpoints and none of
            them can be loaded.
        DistributedError: if ``WORLD_SIZE > 1`` and the ranks cannot form
            a process group.
    """

    def __init__(
        self,
        root_dir: str,
        env_id: str,
        num_envs: int,
        algorithm_ctor: Callable[..., Algorithm],
        env_ctor: Callable[..., Any] = GymVectorEnv,
        num_iterations: Optional[int] = None,
        num_env_steps: Optional[int] = None,
        steps_per_iteration: int = 1,
        summary_interval: int = 10,
        checkpoint_interval: Optional[int] = 100,
        eval_interval: Optional[int] = None,
        num_eval_episodes: int = 10,
        max_checkpoints: int = 3,
        seed: int = 0,
        device: Any = "auto",
        num_threads: Optional[int] = None,
        progress_bar: bool = True,
        summary_flush_secs: float = 10.0,
        stop_eval_return: Optional[float] = None,
        allow_config_change: bool = False,
    ):
        if not isinstance(root_dir, str) or not root_dir:
            raise ValueError(f"root_dir must be a non-empty path, got {root_dir!r}")
        run_dir.check_root_dir(os.path.abspath(os.path.expanduser(root_dir)))
        # A training limit: None or 0 is no limit from it (held as 0).
        max_iterations = check_int("num_iterations", num_iterations, minimum=0,
                                   allow_none=True, none_means="0 or None: no limit") or 0
        max_env_steps = check_int("num_env_steps", num_env_steps, minimum=0,
                                  allow_none=True, none_means="0 or None: no limit") or 0
        if max_iterations == 0 and max_env_steps == 0:
            raise ValueError(
                "at least one of num_iterations and num_env_steps must be positive (0 or "
                f"None means no limit), got num_iterations={num_iterations!r}, "
                f"num_env_steps={num_env_steps!r}"
            )
        check_int("num_envs", num_envs, minimum=1)
        check_int("steps_per_iteration", steps_per_iteration, minimum=1)
        check_int("summary_interval", summary_interval, minimum=1)
        check_int("checkpoint_interval", checkpoint_interval, minimum=1, allow_none=True)
        check_int("eval_interval", eval_interval, minimum=1, allow_none=True)
        check_int("num_eval_episodes", num_eval_episodes, minimum=1)
        check_int("max_checkpoints", max_checkpoints, minimum=1)
        check_int("num_threads", num_threads, minimum=1, allow_none=True)
        check_int("seed", seed, minimum=0, below=MAX_SEED)
        if stop_eval_return is not None and eval_interval is None:
            raise ValueError("stop_eval_return needs eval_interval to be set")

        self._root_dir = os.path.abspath(os.path.expanduser(root_dir))
        self._checkpoint_dir = os.path.join(self._root_dir, "checkpoints")
        self._env_id = env_id
        # Data-parallel (under torchrun): join the group; sizes stay global.
        if num_envs % distributed.env_world_size():
            raise ValueError(
                f"num_envs ({num_envs}) is the total over all ranks and must be divisible "
                f"by the number of ranks ({distributed.env_world_size()}): e.g. --gin_param "
                f"'{type(self).__name__}.num_envs = {distributed.env_world_size()}'"
            )
        self._device = distributed.init_from_env(resolve_device(device))
        self._world_size, self._rank = distributed.world_size(), distributed.rank()
        self._total_envs = num_envs
        self._num_envs = num_envs // self._world_size  # this rank's
        self._algorithm_ctor = algorithm_ctor
        self._env_ctor = env_ctor
        self._max_iterations = max_iterations
        self._max_env_steps = max_env_steps
        self._steps_per_iteration = steps_per_iteration
        limits = []
        if max_iterations:
            limits.append(max_iterations)
        if max_env_steps:
            limits.append(math.ceil(max_env_steps / steps_per_iteration))
        self._num_iterations = min(limits)
        self._summary_interval = summary_interval
        self._checkpoint_interval = checkpoint_interval
        self._eval_interval = eval_interval
        self._num_eval_episodes = num_eval_episodes
        self._max_checkpoints = max_checkpoints
        self._seed = seed
        self._is_main = distributed.is_main_process()
        self._progress_bar = bool(progress_bar) and self._is_main
        self._summary_flush_secs = summary_flush_secs
        self._stop_eval_return = None if stop_eval_return is None else float(stop_eval_return)
        self._eval_time = 0.0
        if num_threads is not None:
            torch.set_num_threads(num_threads)

        _seed_all(seed)
        self._iteration = 0
        self._env_steps = 0
        schedulers.reset_progress()

        # A throw-away env gives the specs; training envs are built in train().
        probe = env_ctor(env_id, num_envs=1, seed=seed, device=self._device)
        self._observation_spec = probe.observation_spec
        self._action_spec = probe.action_spec
        probe.close()
        self._algorithm = self._build_algorithm(self._observation_spec, self._action_spec)
        self._algorithm.to(self._device)
        if self._world_size > 1:
            distributed.broadcast_module_(self._algorithm)  # the same start everywhere
            _seed_all(seed + self._rank * _RANK_SEED_OFFSET)  # each rank its own samples
        self._env: Any = None
        self._time_step: Optional[TimeStep] = None
        self._restored_env: Optional[Dict[str, Any]] = None
        self._in_iteration = False
        self._last_return: Optional[float] = None
        self._last_eval_return: Optional[float] = None
        self._restored_from: Optional[str] = None
        self._stop_signal: Optional[int] = None
        self._last_checkpoint: Optional[str] = None
        self._allow_config_change = bool(allow_config_change)
        self._config_change: Optional[str] = None
        # Nothing is written before the configuration is known to be good: a
        # binding nothing uses is an error now, not a silently ignored value.
        gin_config.check_bindings_used(constructing=type(self).__name__)
        self._lock: Optional[run_dir.RunLock] = None  # rank 0's
        self._released = False
        created = self._is_main and not os.path.exists(self._root_dir)
        try:
            self._take_run_dir()
            self._resume()
            if self._is_main:
                self._write_operative_config()
        except BaseException:
            self.close()
            if created:  # leave no half-made run directory behind
                shutil.rmtree(self._root_dir, ignore_errors=True)
            raise

    # ------------------------------------------------------- extension points
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

    # ------------------------------------------------------------ properties
    @property
    def root_dir(self) -> str:
        """The absolute root directory."""
        return self._root_dir

    @property
    def algorithm(self) -> Algorithm:
        """The algorithm being trained."""
        return self._algorithm

    @property
    def device(self) -> torch.device:
        """The device of networks and time steps."""
        return self._device

    @property
    def iteration(self) -> int:
        """Training iterations completed (restored from a checkpoint)."""
        return self._iteration

    @property
    def env_steps(self) -> int:
        """Environment steps taken (restored from a checkpoint)."""
        return self._env_steps

    @property
    def num_iterations(self) -> int:
        """Iterations the run takes: the binding limit expressed in iterations."""
        return self._num_iterations

    @property
    def restored_from(self) -> Optional[str]:
        """The checkpoint this trainer resumed from, if any."""
        return self._restored_from

    @property
    def last_eval_return(self) -> Optional[float]:
        """The mean return of the latest evaluation, if any."""
        return self._last_eval_return

    # ---------------------------------------------------------------- limits
    def _limit_reached(self) -> Optional[str]:
        """The limit that is reached (e.g. ``"num_iterations = 3"``), or ``None``."""
        if self._max_iterations and self._iteration >= self._max_iterations:
            return f"num_iterations = {self._max_iterations}"
        if self._max_env_steps and self._env_steps >= self._max_env_steps:
            return f"num_env_steps = {self._max_env_steps}"
        return None

    def _percent(self) -> float:
        fractions = []
        if self._max_iterations:
            fractions.append(self._iteration / self._max_iterations)
        if self._max_env_steps:
            fractions.append(self._env_steps / self._max_env_steps)
        return min(1.0, max(fractions))

    def _update_progress(self) -> None:
        schedulers.update_progress("iterations", self._iteration)
        schedulers.update_progress("env_steps", self._env_steps)
        schedulers.update_progress("percent", self._percent())
        schedulers.update_progress("global_counter", self._iteration)

    # ----------------------------------------------------------- checkpoints

    def _env_state(self) -> Dict[str, Any]:
        """The environments' state and the current time step (empty if unsaveable)."""
        if self._env is None or self._in_iteration or not hasattr(self._env, "get_state"):
            return {}
        state = self._env.get_state()
        if state is None:
            return {}
        return {
            "state": ckpt.bytes_to_tensor(state),
            "time_step": _time_step_to_dict(self._time_step),
        }

    def save_checkpoint(self) -> str:
        """Atomically write a checkpoint of the current state.

        It holds ``iteration``, ``env_steps``, the scheduler ``progress``
        registry, the ``algorithm``'s ``state_dict`` (networks, entropy
        controllers and their buffers), the ``optimizers``' state dicts, the
        ``rng`` states (torch, CUDA, NumPy, Python), ``env`` (the pickled
        environments -- episodes in progress, their RNGs and episode
        statistics -- as a ``uint8`` tensor, and the current ``time_step``;
        empty when the environments cannot be pickled or when saving mid-iteration
        on ``KeyboardInterrupt``) and ``extra`` (see :meth:`_extra_state`).

        In a data-parallel run every rank must call it: ``rng``, ``env`` and
        ``extra`` are rank 0's, ``rank_states`` holds those of ranks 1, 2, ...
        (gathered to rank 0) and ``world_size`` the number of ranks; rank 0
        alone writes the file.

        Returns:
            str: the checkpoint path.
        """
        local = {"rng": ckpt.rng_state(), "env": self._env_state(), "extra": self._extra_state()}
        path = ckpt.checkpoint_path(self._checkpoint_dir, self._iteration)
        if self._world_size > 1:
            ranks = distributed.gather_object(_to_cpu(local))
            if not self._is_main:
                return path
            local = dict(ranks[0], world_size=self._world_size, rank_states=ranks[1:])
        state = {
            "iteration": self._iteration,
            "env_steps": self._env_steps,
            "progress": schedulers.get_all_progress(),
            "algorithm": self._algorithm.state_dict(),
            "optimizers": [opt.state_dict() for opt in self._algorithm.optimizers()],
            **local,
        }
        self._last_checkpoint = ckpt.save_checkpoint(
            self._checkpoint_dir, self._iteration, state, self._max_checkpoints
        )
        return self._last_checkpoint

    def _share_checkpoint(self, state: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """Rank 0's loaded ``state`` on every rank, with each rank's own part.

        A checkpoint of another number of ranks restores the shared state
        only: ranks keep their fresh RNGs and restart their episodes.
        """
        per_rank = None
        if self._is_main:
            local_keys = ("rng", "env", "extra")
            saved = [{k: state.pop(k, None) for k in local_keys}]
            saved += state.pop("rank_states", [])
            if state.pop("world_size", 1) == self._world_size:
                per_rank = saved
            else:
                logging.warning(
                    "%s was written by %d rank(s), this run has %d: networks, optimisers, "
                    "controllers and progress are restored, the ranks' RNG and environment "
                    "state are not (episodes restart; not bit-exact).",
                    self._restored_from, len(saved), self._world_size,
                )
                per_rank = [{"rng": None, "env": {}, "extra": {}}] * self._world_size
        state = distributed.broadcast_object(state)
        state.update(distributed.scatter_object(per_rank))
        return state

    def load_checkpoint(self, path: str) -> None:
        """Restore everything :meth:`save_checkpoint` wrote.

        Every part is checked before the trainer changes: the file is read,
        the environments' pickled state is unpickled (it is applied when
        :meth:`train` builds them), then the algorithm and optimisers are
        loaded and then the subclass's extra state (e.g. the replay buffer);
        if any of it fails the algorithm and optimisers are put back, so
        nothing is half-restored.

        Args:
            path: a checkpoint written by :meth:`save_checkpoint`.

        Raises:
            CheckpointError: if the file cannot be read, lacks a part, or its
                algorithm, optimiser, environment or extra state does not fit
                this trainer (every rank raises it in a data-parallel run).
        """
        state, error = None, None
        if self._is_main:
            try:
                state = ckpt.load_checkpoint(path)
            except CheckpointError as e:
                error = str(e)
        if self._world_size > 1:
            error = distributed.broadcast_object(error)
        if error is not None:
            raise CheckpointError(error)
        self._restored_from = path
        if self._world_size > 1:
            state = self._share_checkpoint(state)
        saved = {
            "algorithm": copy.deepcopy(self._algorithm.state_dict()),
            "optimizers": [copy.deepcopy(o.state_dict()) for o in self._algorithm.optimizers()],
        }
        error = None
        try:
            env_state = self._check_env_state(state.get("env") or {})
            self._algorithm.load_state_dict(state["algorithm"])
            optimizers = self._algorithm.optimizers()
            if len(optimizers) != len(state["optimizers"]):
                raise ValueError(
                    f"{len(state['optimizers'])} optimizers saved, {len(optimizers)} now"
                )
            for opt, opt_state in zip(optimizers, state["optimizers"]):
                opt.load_state_dict(opt_state)
            self._load_extra_state(state.get("extra") or {})
        except Exception as e:  # any failure: a damaged or foreign checkpoint
            error = f"{path} does not match this run: {gin_config.one_line(e)[:300]}"
        if self._world_size > 1:  # a rank's own part (its buffer) may fail alone
            failed = distributed.all_reduce_mean(
                torch.tensor([0.0 if error is None else 1.0], device=self._device)
            )
            if error is None and float(failed) > 0:
                error = f"{path}: another rank could not restore its part"
        if error is not None:
            self._algorithm.load_state_dict(saved["algorithm"])
            for opt, opt_state in zip(self._algorithm.optimizers(), saved["optimizers"]):
                opt.load_state_dict(opt_state)
            self._restored_from = None
            raise CheckpointError(error)
        self._iteration = int(state["iteration"])
        self._env_steps = int(state["env_steps"])
        schedulers.set_all_progress(state["progress"])
        if state["rng"] is not None:
            ckpt.set_rng_state(state["rng"])
        self._restored_env = env_state
        logging.info("Resumed from %s (iteration %d)", path, self._iteration)

    def _check_env_state(self, env_state: Dict[str, Any]) -> Dict[str, Any]:
        """``env_state`` if its pickle loads and holds this rank's envs; raises otherwise."""
        if not env_state:
            return env_state
        fields = pickle.loads(ckpt.tensor_to_bytes(env_state["state"]))
        env = fields[0] if isinstance(fields, tuple) and fields else None
        num_envs = getattr(env, "num_envs", None)
        if num_envs != self._num_envs:
            raise ValueError(
                f"its environment state holds {num_envs} envs, this run steps {self._num_envs}"
            )
        TimeStep(**env_state["time_step"])
        return env_state

    # ------------------------------------------------------ the run directory
    def _on_main(self, check: Callable[[], None]) -> None:
        """Run ``check`` on rank 0; every rank raises the error it raised."""
        error: Optional[Tuple[type, str]] = None
        if self._is_main:
            try:
                check()
            except ValueError as e:
                error = (type(e), str(e))
            except OSError as e:  # e.g. no permission inside an existing root_dir
                error = (ValueError, f"root_dir {self._root_dir}: {e}")
        if self._world_size > 1:
            error = distributed.broadcast_object(error)
        if error is not None:
            raise error[0](error[1])

    def _take_run_dir(self) -> None:
        """Lock the run directory, remove killed writes' leftovers, check the config."""

        def take() -> None:
            self._lock = run_dir.RunLock(self._root_dir)
            for stale in ckpt.remove_partial_checkpoints(self._checkpoint_dir):
                logging.info("Removed %s, left by a checkpoint write that was killed", stale)
            self._check_config()

        self._on_main(take)

    def _check_config(self) -> None:
        """Refuse a configuration that differs from the run directory's."""
        path = os.path.join(self._root_dir, "operative_config.gin")
        if not os.path.isfile(path):
            return
        with open(path, encoding="utf-8") as f:
            saved = f.read()
        diffs = run_dir.config_differences(saved, gin.operative_config_str())
        if not diffs:
            return
        # Changed values first: they say more than parameters of classes one side lacks.
        diffs.sort(key=lambda d: d[1] is None or d[2] is None)
        shown = "; ".join(
            f"{key}: {'unset' if old is None else old} -> {'unset' if new is None else new}"
            for key, old, new in diffs[:5]
        ) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
        if not self._allow_config_change:
            raise ValueError(
                f"root_dir {self._root_dir} holds a run with another configuration "
                f"({len(diffs)} difference(s): {shown}); use a new --root_dir, or "
                "--allow_config_change to resume it with the new configuration anyway"
            )
        self._config_change = shown

    def _write_operative_config(self) -> None:
        """Write ``operative_config.gin``; keep a changed one's predecessor."""
        path = os.path.join(self._root_dir, "operative_config.gin")
        if self._config_change is not None and os.path.isfile(path):
            keep = os.path.join(self._root_dir, f"operative_config.{self._iteration}.gin")
            os.replace(path, keep)
            logging.warning(
                "allow_config_change: resuming %s at iteration %d with a changed configuration "
                "(%s); the previous config is kept as %s",
                self._root_dir, self._iteration, self._config_change, keep,
            )
        text = gin.operative_config_str().encode("utf-8")
        ckpt.atomic_write_bytes(path, lambda f: f.write(text))

    def _resume(self) -> None:
        """Load the newest checkpoint that loads; skip (and name) damaged ones.

        Raises:
            CheckpointError: if there are checkpoints and none loads.
        """
        paths = ckpt.checkpoints_newest_first(self._checkpoint_dir) if self._is_main else None
        if self._world_size > 1:
            paths = distributed.broadcast_object(paths)
        skipped = []
        for path in paths:
            try:
                self.load_checkpoint(path)
            except CheckpointError as e:
                skipped.append(str(e))
                continue
            if skipped:
                logging.warning(
                    "Skipped %d damaged checkpoint(s) (left in place): %s; resumed from %s instead",
                    len(skipped), " | ".join(skipped), path,
                )
            return
        if skipped:
            raise CheckpointError(
                f"no checkpoint in {self._checkpoint_dir} can be loaded (left in place): "
                f"{' | '.join(skipped)}; move them away to start afresh, or use a new --root_dir"
            )

    def close(self) -> None:
        """Release the run directory's lock (idempotent; also at exit)."""
        lock, self._lock = getattr(self, "_lock", None), None
        self._released = True
        if lock is not None:
            lock.release()

    # ------------------------------------------------------------ evaluation
    def evaluate(self) -> float:
        """Mean return of the deterministic policy over ``num_eval_episodes``.

        Returns:
            float: the mean undiscounted return.
        """
        self._algorithm.eval()
        try:
            value = evaluate(
                self._env_id,
                self._policy_fn,
                num_episodes=self._num_eval_episodes,
                seed=self._seed + _EVAL_SEED_OFFSET,
                device=self._device,
            )
        finally:
            self._algorithm.train()
        self._last_eval_return = value
        return value

    def _evaluate_and_record(self) -> float:
        """Evaluate, write ``eval/return`` summaries and log one line."""
        start = time.time()
        value = self.evaluate()
        self._eval_time += time.time() - start
        with summary.record_if(lambda: True):
            summary.scalar("eval/return", value, step=self._iteration)
            summary.scalar("eval/return_vs_env_steps", value, step=self._env_steps)
        logging.info(
            "iteration %d env_steps %d eval return %.2f", self._iteration, self._env_steps, value
        )
        return value

    # -------------------------------------------------------------- training
    def _should_summarize(self, iteration: int) -> bool:
        return iteration % self._summary_interval == 0

    def _write_summaries(self) -> str:
        """Write the trainer's summaries; return the progress-bar status text.

        Reads the finished episodes and ``alpha`` on the host (summary time
        only).
        """
        now = time.time()
        sps = (self._env_steps - self._last_summary_steps) / max(
            now - self._last_summary_time, 1e-9
        )
        self._last_summary_time, self._last_summary_steps = now, self._env_steps
        returns, lengths = self._env.pop_episode_statistics()
        if self._world_size > 1:  # the episodes of all ranks
            stats = distributed.gather_object((list(returns), list(lengths)))
            if not self._is_main:
                return ""
            returns = [x for r, _ in stats for x in r]
            lengths = [x for _, n in stats for x in n]
        summary.scalar("env_steps", self._env_steps)
        summary.scalar("steps_per_sec", sps)
        if returns:
            self._last_return = float(np.mean(returns))
            summary.scalar("return", self._last_return)
            summary.scalar("episode_length", float(np.mean(lengths)))
            summary.scalar("return_vs_env_steps", self._last_return, step=self._env_steps)
        ret = "n/a" if self._last_return is None else f"{self._last_return:.1f}"
        alpha = float(self._algorithm.entropy_coefficient())
        return f"sps={sps:.0f} return={ret} alpha={alpha:.4g}"

    def _evaluate_and_checkpoint(self) -> Tuple[bool, bool]:
        """After an iteration: evaluate and checkpoint when due.

        Returns:
            ``(stop, saved)``: whether training ends here and whether a
            checkpoint of this iteration was written.
        """
        done = self._limit_reached() is not None
        if self._eval_interval is not None and (
            done or self._iteration % self._eval_interval == 0
        ):
            stop = False
            if self._is_main:  # one evaluation; the others wait for its verdict
                value = self._evaluate_and_record()
                stop = self._stop_eval_return is not None and value >= self._stop_eval_return
                if stop:
                    logging.info("eval return %.2f >= stop_eval_return: stopping", value)
            done = distributed.broadcast_object(stop) or done
        if done or (
            self._checkpoint_interval is not None
            and self._iteration % self._checkpoint_interval == 0
        ):
            self._update_progress()
            self.save_checkpoint()
            return done, True
        return done, False

    # ------------------------------------------------------------- signals
    def _on_signal(self, signum: int, frame: Any) -> None:
        """First SIGTERM/SIGINT: stop after this iteration; the second: at once."""
        if self._stop_signal is not None:
            raise TrainingAborted(signum)
        self._stop_signal = signum
        logging.warning(
            "%s received: stopping after the current iteration and writing a checkpoint "
            "(send it again to stop at once, without one)", signal.Signals(signum).name,
        )

    def _install_signal_handlers(self) -> Dict[int, Any]:
        """Route SIGTERM and SIGINT to :meth:`_on_signal`; return the old handlers."""
        if threading.current_thread() is not threading.main_thread():
            return {}  # only the main thread may set handlers: keep the defaults
        old = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            old[signum] = signal.signal(signum, self._on_signal)
        return old

    def _stop_requested(self) -> bool:
        """Whether a signal asked to stop (on any rank: every rank then agrees)."""
        flag = self._stop_signal is not None
        if self._world_size > 1:
            votes = distributed.all_reduce_mean(
                torch.tensor([1.0 if flag else 0.0], device=self._device)
            )
            flag = float(votes) > 0
            if flag and self._stop_signal is None:
                self._stop_signal = int(signal.SIGTERM)  # another rank's signal
        return flag

    def _start_env(self) -> Tuple[Any, TimeStep]:
        """Build the training envs; restore their saved state or reset them."""
        env = self._env_ctor(
            self._env_id,
            num_envs=self._num_envs,
            # Rank r's envs continue the numbering of the global batch.
            seed=self._seed + self._iteration * self._total_envs + self._rank * self._num_envs,
            device=self._device,
        )
        restored, self._restored_env = self._restored_env, None
        if restored:
            env.set_state(ckpt.tensor_to_bytes(restored["state"]))
            time_step = TimeStep(**{
                k: v.to(self._device) if isinstance(v, torch.Tensor) else v
                for k, v in restored["time_step"].items()
            })
            return env, time_step
        if restored is not None:  # resumed from a checkpoint without env state
            logging.warning(
                "The checkpoint holds no state of the %s environments (they cannot be pickled, "
                "or training was interrupted mid-iteration): their episodes restart, so the "
                "resumed run is not bit-exact with an uninterrupted one.",
                self._env_id,
            )
        return env, env.reset()

    def _result(self, start_time: float, already_done: bool = False) -> Dict[str, Any]:
        return {
            "iteration": self._iteration,
            "env_steps": self._env_steps,
            "last_return": self._last_return,
            "eval_return": self._last_eval_return,
            "wall_time": time.time() - start_time,
            "eval_time": self._eval_time,
            "already_done": already_done,
            "stopped_by": getattr(self, "_stopped_by", None),
            "checkpoint": self._last_checkpoint,
        }

    def train(self) -> Dict[str, Any]:
        """Run (or resume) training until a limit (or ``stop_eval_return``).

        The run directory's lock is released when it returns (taken again by
        another call).

        Returns:
            dict: ``iteration``, ``env_steps``, ``last_return`` (mean return of
            the training episodes at the last summary), ``eval_return`` (the
            latest evaluation, or ``None``), ``wall_time`` (seconds of this
            call), ``eval_time`` (seconds of it spent evaluating) and
            ``already_done`` (True if the resumed run was already at its
            limit: nothing was done), ``stopped_by`` (``"SIGTERM"`` or
            ``"SIGINT"`` if a signal ended the run early, else ``None``) and
            ``checkpoint`` (the last checkpoint written, or ``None``).

        SIGTERM and SIGINT (Ctrl-C) received while training (in the main
        thread) end the current iteration, write a checkpoint and return
        (``stopped_by``); under ``torchrun`` the ranks agree on the iteration
        (a signal to any rank stops all at the same one).  A second signal
        raises :class:`TrainingAborted` at once, without a checkpoint.

        Raises:
            TrainingAborted: on a second SIGTERM/SIGINT.
            KeyboardInterrupt: (outside the main thread, where no handlers
                are installed) re-raised after saving a checkpoint.
            CheckpointError: if a checkpoint cannot be written (a full disk):
                the earlier ones are intact.
        """
        if self._released:  # by an earlier train() or close(): take it again (every rank)
            self._on_main(lambda: setattr(self, "_lock", run_dir.RunLock(self._root_dir)))
            self._released = False
        try:
            return self._train()
        finally:
            self.close()  # the run is over: another process may take the directory

    def _train(self) -> Dict[str, Any]:
        """:meth:`train` under the run directory's lock."""
        start_time = time.time()
        self._eval_time = 0.0
        self._stop_signal = None
        self._stopped_by: Optional[str] = None
        self._last_checkpoint = None
        reached = self._limit_reached()
        if reached is not None:
            logging.info(
                "Nothing to do: the run in %s is already at %s (iteration %d, %d env steps)",
                self._root_dir, reached, self._iteration, self._env_steps,
            )
            return self._result(start_time, already_done=True)
        writer = None
        if self._is_main:  # rank 0 alone writes summaries
            writer = summary.create_summary_writer(
                os.path.join(self._root_dir, "train"), flush_secs=self._summary_flush_secs
            )
        summary.set_default_writer(writer)
        bar = tqdm(
            total=self._num_iterations,
            initial=self._iteration,
            unit="it",
            # None: off where stderr is not a terminal (a log file gets log lines only).
            disable=None if self._progress_bar else True,
            dynamic_ncols=True,
        )
        self._last_summary_time, self._last_summary_steps = time.time(), self._env_steps
        status = ""
        old_handlers = self._install_signal_handlers()
        swapped_handlers = _log_through_bar(bar)  # log lines do not glue onto the bar
        try:
            if self._eval_interval is not None and self._iteration == 0 and self._is_main:
                self._evaluate_and_record()  # the untrained policy: the curve's start
            self._env, self._time_step = self._start_env()
            while self._limit_reached() is None:
                self._update_progress()
                iteration = self._iteration
                with summary.record_if(lambda: self._should_summarize(iteration)):
                    self._in_iteration = True
                    self._env_steps += self._train_iteration()
                    self._in_iteration = False
                    if self._should_summarize(iteration):
                        status = self._write_summaries()
                self._iteration += 1
                bar.set_postfix_str(f"steps={self._env_steps} {status}", refresh=False)
                bar.update(1)
                done, saved = self._evaluate_and_checkpoint()
                if done:
                    break
                if self._stop_requested():
                    if not saved:
                        self._update_progress()
                        self.save_checkpoint()
                    self._stopped_by = signal.Signals(self._stop_signal).name
                    logging.warning(
                        "Stopped by %s at iteration %d; saved %s",
                        self._stopped_by, self._iteration, self._last_checkpoint,
                    )
                    break
        except KeyboardInterrupt:
            if self._world_size > 1:
                # The ranks stop at different points: no common checkpoint.
                logging.warning("Interrupted; resume from the last periodic checkpoint")
                raise
            self._update_progress()
            path = self.save_checkpoint()
            logging.warning("Interrupted; saved %s", path)
            raise
        finally:
            for signum, handler in old_handlers.items():
                signal.signal(signum, handler)
            _restore_logging(swapped_handlers)
            bar.close()
            if self._env is not None:
                self._env.close()
            self._env, self._time_step, self._in_iteration = None, None, False
            summary.flush()
            summary.set_default_writer(None)
            if writer is not None:
                writer.close()
        return self._result(start_time)
