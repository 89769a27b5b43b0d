"""``OnPolicyTrainer``: the training loop for A2C/PPO (and their controllers).

One iteration (``_train_iteration``) reads top to bottom like CleanRL::

    for t in range(unroll_length):                 # collect, no gradient
        alg_step = algorithm.rollout_step(time_step)
        experiences.append(make_experience(time_step, alg_step))
        time_step = env.step(alg_step.output)
    algorithm.train_from_unroll(stack(experiences), time_step)  # epochs x minibatches

around which ``train`` updates the scheduler progress registry
(``iterations``, ``env_steps``, ``percent``; the summary global counter is
the iteration), writes summaries every ``summary_interval`` iterations,
evaluates the deterministic policy every ``eval_interval`` iterations and
checkpoints every ``checkpoint_interval`` iterations (and at the end, and on
``KeyboardInterrupt``).

Root directory layout::

    root_dir/
      operative_config.gin       # the gin config in force (written at start)
      train/events.out.tfevents.*  # TensorBoard summaries
      checkpoints/ckpt-00000100.pt # the last ``max_checkpoints`` checkpoints

A checkpoint holds the algorithm's ``state_dict`` (networks and entropy
controller), the optimisers, the progress registry, the iteration and env
step counts and the torch/numpy/python RNG states.  It is written to a
temporary file and renamed, so a crash never leaves a truncated checkpoint.
Constructing a trainer on a root dir with checkpoints resumes from the latest
one; the environments are rebuilt (their internal state is not saved) with a
seed derived from the resumed iteration.

Nothing in the rollout or training path reads tensors on the host except the
environment step itself (which must hand actions to gymnasium); episode
statistics, losses and alpha are read only at summary time.
"""
import glob
import math
import os
import random
import re
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

import gin
import numpy as np
import torch
from absl import logging
from tqdm import tqdm

from alf_entropy.algorithms.algorithm import Algorithm
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.data_structures import TimeStep, make_experience
from alf_entropy.environments import EpisodeReturnTracker, GymVectorEnv, evaluate
from alf_entropy.utils import nest, schedulers, summary

__all__ = [
    "OnPolicyTrainer",
    "resolve_device",
    "stack_experiences",
    "latest_checkpoint",
    "atomic_write_bytes",
]

_CKPT_PATTERN = re.compile(r"^ckpt-(\d+)\.pt$")
_EVAL_SEED_OFFSET = 1_000_003


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


def atomic_write_bytes(path: str, write: Callable[[Any], None]) -> None:
    """Write a file atomically: ``write(f)`` into a temp file, then rename.

    Args:
        path: the destination.
        write: called with a binary file object opened for writing.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def latest_checkpoint(checkpoint_dir: str) -> Optional[str]:
    """The path of the checkpoint with the largest iteration, or ``None``.

    Args:
        checkpoint_dir: the directory holding ``ckpt-<iteration>.pt`` files.

    Returns:
        Optional[str]: the path, ``None`` if there is none.
    """
    best, best_iter = None, -1
    for path in glob.glob(os.path.join(checkpoint_dir, "ckpt-*.pt")):
        m = _CKPT_PATTERN.match(os.path.basename(path))
        if m and int(m.group(1)) > best_iter:
            best, best_iter = path, int(m.group(1))
    return best


def _rng_state() -> Dict[str, Any]:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (
            np_state[0],
            torch.from_numpy(np_state[1].astype(np.int64)),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _check_positive_int(value: Any, name: str, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int{' or None' if allow_none else ''}, "
                         f"got {value!r}")


@gin.configurable
class OnPolicyTrainer:
    """Train an on-policy algorithm (A2C/PPO) on a gymnasium environment.

    Args:
        root_dir: where summaries, checkpoints and the config go (see the
            module docstring); an existing run there is resumed.
        env_id: the gymnasium id.
        num_envs: parallel environments ``B``.
        algorithm_ctor: ``(observation_spec, action_spec) -> Algorithm``
            with ``rollout_step``, ``predict_step`` and ``train_from_unroll``
            (``ActorCriticAlgorithm``/``PPOAlgorithm``).
        env_ctor: ``(env_id, num_envs=, seed=, device=) -> env`` (a
            ``GymVectorEnv``, configurable through gin).
        num_iterations: training iterations; exactly one of this and
            ``num_env_steps`` must be given.
        num_env_steps: train until this many env steps (rounded up to whole
            iterations of ``unroll_length * num_envs`` steps).
        unroll_length: steps per env per iteration ``T``.
        summary_interval: write summaries every this many iterations.
        checkpoint_interval: checkpoint every this many iterations (and at
            the end); ``None`` checkpoints only at the end.
        eval_interval: evaluate the deterministic policy every this many
            iterations (and at the end); ``None`` never.
        num_eval_episodes: episodes per evaluation.
        max_checkpoints: how many recent checkpoints to keep.
        seed: seeds torch, numpy, python ``random`` and the environments.
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or a ``torch.device``.
        num_threads: if given, ``torch.set_num_threads(num_threads)`` (1 is
            fastest for small MLPs on CPU).
        progress_bar: show a tqdm progress line (steps, steps/s, return,
            alpha).
        summary_flush_secs: how often summaries are flushed to disk.
        stop_eval_return: if given, stop (and checkpoint) as soon as an
            evaluation's mean return reaches it (needs ``eval_interval``).

    Raises:
        ValueError: for out-of-range arguments (``num_iterations`` and
            ``num_env_steps`` both or neither given, non-positive sizes, an
            unknown device).
    """

    def __init__(
        self,
        root_dir: str,
        env_id: str = "CartPole-v1",
        num_envs: int = 8,
        algorithm_ctor: Callable[..., Algorithm] = PPOAlgorithm,
        env_ctor: Callable[..., Any] = GymVectorEnv,
        num_iterations: Optional[int] = None,
        num_env_steps: Optional[int] = None,
        unroll_length: int = 128,
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
    ):
        if not isinstance(root_dir, str) or not root_dir:
            raise ValueError(f"root_dir must be a non-empty path, got {root_dir!r}")
        if (num_iterations is None) == (num_env_steps is None):
            raise ValueError(
                "exactly one of num_iterations and num_env_steps must be given, got "
                f"num_iterations={num_iterations!r}, num_env_steps={num_env_steps!r}"
            )
        _check_positive_int(num_iterations, "num_iterations", allow_none=True)
        _check_positive_int(num_env_steps, "num_env_steps", allow_none=True)
        _check_positive_int(num_envs, "num_envs")
        _check_positive_int(unroll_length, "unroll_length")
        _check_positive_int(summary_interval, "summary_interval")
        _check_positive_int(checkpoint_interval, "checkpoint_interval", allow_none=True)
        _check_positive_int(eval_interval, "eval_interval", allow_none=True)
        _check_positive_int(num_eval_episodes, "num_eval_episodes")
        _check_positive_int(max_checkpoints, "max_checkpoints")
        _check_positive_int(num_threads, "num_threads", allow_none=True)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        if stop_eval_return is not None and eval_interval is None:
            raise ValueError("stop_eval_return needs eval_interval to be set")

        self._root_dir = os.path.abspath(os.path.expanduser(root_dir))
        self._checkpoint_dir = os.path.join(self._root_dir, "checkpoints")
        self._env_id = env_id
        self._num_envs = num_envs
        self._env_ctor = env_ctor
        self._unroll_length = unroll_length
        self._steps_per_iteration = unroll_length * num_envs
        self._num_iterations = (
            num_iterations
            if num_iterations is not None
            else math.ceil(num_env_steps / self._steps_per_iteration)
        )
        self._summary_interval = summary_interval
        self._checkpoint_interval = checkpoint_interval
        self._eval_interval = eval_interval
        self._num_eval_episodes = num_eval_episodes
        self._max_checkpoints = max_checkpoints
        self._seed = seed
        self._device = resolve_device(device)
        self._progress_bar = bool(progress_bar)
        self._summary_flush_secs = summary_flush_secs
        self._stop_eval_return = None if stop_eval_return is None else float(stop_eval_return)
        self._eval_time = 0.0
        if num_threads is not None:
            torch.set_num_threads(num_threads)

        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        self._iteration = 0
        self._env_steps = 0
        schedulers.reset_progress()

        # A throw-away env gives the specs; training envs are built in train().
        probe = env_ctor(env_id, num_envs=1, seed=seed, device=self._device)
        self._observation_spec = probe.observation_spec
        self._action_spec = probe.action_spec
        probe.close()
        self._algorithm = algorithm_ctor(self._observation_spec, self._action_spec)
        self._algorithm.to(self._device)
        self._last_return: Optional[float] = None
        self._last_eval_return: Optional[float] = None
        self._restored_from: Optional[str] = None
        path = latest_checkpoint(self._checkpoint_dir)
        if path is not None:
            self.load_checkpoint(path)
        self._write_operative_config()

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
        """Total iterations of the run."""
        return self._num_iterations

    @property
    def restored_from(self) -> Optional[str]:
        """The checkpoint this trainer resumed from, if any."""
        return self._restored_from

    @property
    def last_eval_return(self) -> Optional[float]:
        """The mean return of the latest evaluation, if any."""
        return self._last_eval_return

    # ----------------------------------------------------------- checkpoints
    def _write_operative_config(self) -> None:
        text = gin.operative_config_str().encode("utf-8")
        atomic_write_bytes(
            os.path.join(self._root_dir, "operative_config.gin"), lambda f: f.write(text)
        )

    def save_checkpoint(self) -> str:
        """Write a checkpoint of the current state (atomically).

        Returns:
            str: the checkpoint path.
        """
        state = {
            "iteration": self._iteration,
            "env_steps": self._env_steps,
            "progress": schedulers.get_all_progress(),
            "algorithm": self._algorithm.state_dict(),
            "optimizers": [opt.state_dict() for opt in self._algorithm.optimizers()],
            "rng": _rng_state(),
        }
        path = os.path.join(self._checkpoint_dir, f"ckpt-{self._iteration:08d}.pt")
        atomic_write_bytes(path, lambda f: torch.save(state, f))
        old = sorted(
            p
            for p in glob.glob(os.path.join(self._checkpoint_dir, "ckpt-*.pt"))
            if _CKPT_PATTERN.match(os.path.basename(p))
        )
        for stale in old[: max(0, len(old) - self._max_checkpoints)]:
            os.remove(stale)
        return path

    def load_checkpoint(self, path: str) -> None:
        """Restore algorithm, optimisers, progress, counters and RNG states.

        Args:
            path: a checkpoint written by :meth:`save_checkpoint`.

        Raises:
            ValueError: if the checkpoint does not match the algorithm.
        """
        # Loaded on the CPU: RNG states must stay CPU tensors, and
        # ``load_state_dict`` copies parameters and optimiser state onto the
        # devices of the existing tensors anyway.
        state = torch.load(path, map_location="cpu", weights_only=True)
        try:
            self._algorithm.load_state_dict(state["algorithm"])
            optimizers = self._algorithm.optimizers()
            if len(optimizers) != len(state["optimizers"]):
                raise ValueError(
                    f"{len(state['optimizers'])} optimizers saved, {len(optimizers)} now"
                )
            for opt, opt_state in zip(optimizers, state["optimizers"]):
                opt.load_state_dict(opt_state)
        except (RuntimeError, ValueError, KeyError) as e:
            raise ValueError(
                f"checkpoint {path} does not match the configured algorithm: {e}"
            ) from e
        self._iteration = int(state["iteration"])
        self._env_steps = int(state["env_steps"])
        schedulers.set_all_progress(state["progress"])
        _set_rng_state(state["rng"])
        self._restored_from = path
        logging.info("Resumed from %s (iteration %d)", path, self._iteration)

    # -------------------------------------------------------------- training
    def _should_summarize(self, iteration: int) -> bool:
        return iteration % self._summary_interval == 0

    def _update_progress(self) -> None:
        schedulers.update_progress("iterations", self._iteration)
        schedulers.update_progress("env_steps", self._env_steps)
        schedulers.update_progress("percent", min(1.0, self._iteration / self._num_iterations))
        schedulers.update_progress("global_counter", self._iteration)

    def _train_iteration(self, env: Any, time_step: TimeStep, tracker: EpisodeReturnTracker):
        """Collect ``unroll_length`` steps and train on them; return the next time step."""
        algorithm = self._algorithm
        experiences = []
        with torch.no_grad():
            for _ in range(self._unroll_length):
                alg_step = algorithm.rollout_step(time_step)
                experiences.append(make_experience(time_step._replace(env_info=()), alg_step))
                time_step = env.step(alg_step.output)
                tracker.update(time_step)
        algorithm.train_from_unroll(stack_experiences(experiences), time_step)
        return time_step

    def _policy_fn(self, observation: Any) -> Any:
        return self._algorithm.predict_step(TimeStep(observation=observation)).output

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

    def _write_summaries(self, tracker: EpisodeReturnTracker) -> str:
        """Write the trainer's summaries; return the progress-bar status text.

        Reads the finished episodes and ``alpha`` on the host (summary time
        only).
        """
        now = time.time()
        sps = (self._env_steps - self._last_summary_steps) / max(
            now - self._last_summary_time, 1e-9
        )
        self._last_summary_time, self._last_summary_steps = now, self._env_steps
        returns, lengths = tracker.pop_finished()
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

    def _evaluate_and_checkpoint(self) -> bool:
        """After an iteration: evaluate and checkpoint when due; True to stop."""
        done = self._iteration >= self._num_iterations
        if self._eval_interval is not None and (
            done or self._iteration % self._eval_interval == 0
        ):
            value = self._evaluate_and_record()
            if self._stop_eval_return is not None and value >= self._stop_eval_return:
                logging.info("eval return %.2f >= stop_eval_return: stopping", value)
                done = True
        if done or (
            self._checkpoint_interval is not None
            and self._iteration % self._checkpoint_interval == 0
        ):
            self._update_progress()
            self.save_checkpoint()
        return done

    def train(self) -> Dict[str, Any]:
        """Run (or resume) training until ``num_iterations``.

        Returns:
            dict: ``iteration``, ``env_steps``, ``last_return`` (mean return of
            the training episodes at the last summary), ``eval_return`` (the
            latest evaluation, or ``None``), ``wall_time`` (seconds of this
            call) and ``eval_time`` (seconds of it spent evaluating).

        Raises:
            KeyboardInterrupt: re-raised after saving a checkpoint.
        """
        start_time = time.time()
        self._eval_time = 0.0
        writer = summary.create_summary_writer(
            os.path.join(self._root_dir, "train"), flush_secs=self._summary_flush_secs
        )
        summary.set_default_writer(writer)
        env = self._env_ctor(
            self._env_id,
            num_envs=self._num_envs,
            seed=self._seed + self._iteration * self._num_envs,
            device=self._device,
        )
        tracker = EpisodeReturnTracker(self._num_envs, device=self._device)
        bar = tqdm(
            total=self._num_iterations,
            initial=self._iteration,
            unit="it",
            disable=not self._progress_bar,
            dynamic_ncols=True,
        )
        self._last_summary_time, self._last_summary_steps = time.time(), self._env_steps
        status = ""
        try:
            if self._eval_interval is not None and self._iteration == 0:
                self._evaluate_and_record()  # the untrained policy: the curve's start
            time_step = env.reset()
            tracker.update(time_step)
            while self._iteration < self._num_iterations:
                self._update_progress()
                iteration = self._iteration
                with summary.record_if(lambda: self._should_summarize(iteration)):
                    time_step = self._train_iteration(env, time_step, tracker)
                    self._env_steps += self._steps_per_iteration
                    if self._should_summarize(iteration):
                        status = self._write_summaries(tracker)
                self._iteration += 1
                bar.set_postfix_str(f"steps={self._env_steps} {status}", refresh=False)
                bar.update(1)
                if self._evaluate_and_checkpoint():
                    break
        except KeyboardInterrupt:
            self._update_progress()
            path = self.save_checkpoint()
            logging.warning("Interrupted; saved %s", path)
            raise
        finally:
            bar.close()
            env.close()
            summary.flush()
            summary.set_default_writer(None)
            writer.close()
        return {
            "iteration": self._iteration,
            "env_steps": self._env_steps,
            "last_return": self._last_return,
            "eval_return": self._last_eval_return,
            "wall_time": time.time() - start_time,
            "eval_time": self._eval_time,
        }
