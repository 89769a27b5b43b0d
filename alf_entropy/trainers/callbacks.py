"""Callbacks: what runs around a trainer's iterations, one service each.

The trainer calls each :class:`Callback`'s hooks in the order of its list:
``on_training_start`` once, ``on_iteration_start`` and ``on_iteration_end``
around every iteration (``False`` from any stops the run cleanly, with a
checkpoint), ``on_training_end`` always, also after an error.  It builds the
built-in ones from its arguments (:func:`builtin_callbacks`) and runs
``callbacks=[...]`` after them.  The classes here but ``SignalCallback``
(every trainer has one) are ``@gin.configurable``:
``OnPolicyTrainer.callbacks = [@TimeBudgetCallback()]``.
"""
import logging as py_logging
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gin
import numpy as np
import torch
from absl import logging
from absl.logging import ABSLHandler

from alf_entropy.utils import distributed, summary
from alf_entropy.utils.checks import check_int, check_real
from alf_entropy.utils.requirements import require_train_extra

require_train_extra()  # gymnasium>=1.1 and tqdm: the `train` extra

from tqdm import tqdm  # noqa: E402  (after the requirement check)

__all__ = ["Callback", "CheckpointCallback", "EvaluationCallback",
           "ProgressBarCallback", "SignalCallback", "SummaryCallback", "TimeBudgetCallback",
           "TrainingAborted", "builtin_callbacks"]


class Callback:
    """The base class: hooks that do nothing; override the ones you need.

    ``trainer`` is the running :class:`~alf_entropy.trainers.trainer.Trainer`:
    read its ``iteration``, ``env_steps``, ``algorithm``, ``metrics``
    (the latest ``return``, ``eval/return``, ...), ``root_dir``.
    """

    def on_training_start(self, trainer: Any) -> None:
        """Before the first iteration of a ``train()`` call (also when resumed)."""

    def on_iteration_start(self, trainer: Any) -> None:
        """Before each iteration (``trainer.iteration`` iterations done)."""

    def on_iteration_end(self, trainer: Any) -> bool:
        """After each iteration (``trainer.iteration`` counts it).

        Returns:
            bool: False stops the run after this iteration, with a checkpoint.
        """
        return True

    def on_training_end(self, trainer: Any) -> None:
        """When ``train()`` ends, however it ends (release what you hold here)."""


@gin.configurable
class SummaryCallback(Callback):
    """TensorBoard summaries in ``root_dir/train`` (rank 0 writes).

    Every ``interval`` iterations the algorithm's own ``summary.*`` calls
    inside the iteration are recorded, and after it ``env_steps``,
    ``steps_per_sec`` and the finished training episodes' ``return`` and
    ``episode_length`` (of all ranks) are written; ``trainer.metrics`` gets
    them and ``alpha``.

    Args:
        interval: iterations between summaries (the ``interval`` attribute).
        flush_secs: how often the writer flushes to disk (``flush_secs``).
    """

    def __init__(self, interval: int = 10, flush_secs: float = 10.0):
        self.interval = check_int("summary_interval", interval, minimum=1)
        self.flush_secs = flush_secs
        self._writer: Any = None
        self._gate: Optional[summary.record_if] = None
        self._since = (0.0, 0)  # (time, env steps) of the last summary

    def on_training_start(self, trainer: Any) -> None:
        if distributed.is_main_process():
            self._writer = summary.create_summary_writer(
                os.path.join(trainer.root_dir, "train"), flush_secs=self.flush_secs
            )
        summary.set_default_writer(self._writer)
        self._since = (time.time(), trainer.env_steps)

    def _due(self, trainer: Any) -> bool:
        return trainer.iteration % self.interval == 0

    def on_iteration_start(self, trainer: Any) -> None:
        due = self._due(trainer)
        self._gate = summary.record_if(lambda: due)
        self._gate.__enter__()

    def on_iteration_end(self, trainer: Any) -> bool:
        if self._gate is not None and (trainer.iteration - 1) % self.interval == 0:
            self._write(trainer)
        self._close_gate()
        return True

    def _close_gate(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.__exit__(None, None, None)

    def _write(self, trainer: Any) -> None:
        """The trainer's summaries (reads episodes and alpha on the host: summary time only)."""
        now, steps = time.time(), trainer.env_steps
        sps = (steps - self._since[1]) / max(now - self._since[0], 1e-9)
        self._since = (now, steps)
        returns, lengths = trainer.env.pop_episode_statistics()
        stats = distributed.gather_object((list(returns), list(lengths)))
        if stats is None:  # not rank 0
            return
        returns = [x for r, _ in stats for x in r]
        lengths = [x for _, n in stats for x in n]
        summary.scalar("env_steps", steps)
        summary.scalar("steps_per_sec", sps)
        trainer.metrics["steps_per_sec"] = sps
        if returns:
            trainer.metrics["return"] = float(np.mean(returns))
            summary.scalar("return", trainer.metrics["return"])
            summary.scalar("episode_length", float(np.mean(lengths)))
            summary.scalar("return_vs_env_steps", trainer.metrics["return"], step=steps)
        trainer.metrics["alpha"] = float(trainer.algorithm.entropy_coefficient())

    def on_training_end(self, trainer: Any) -> None:
        self._close_gate()
        summary.flush()
        summary.set_default_writer(None)
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class _BarLogHandler(py_logging.Handler):
    """Writes another console handler's lines with ``tqdm.write`` (on a line of their own)."""

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


@gin.configurable
class ProgressBarCallback(Callback):
    """A tqdm bar on a terminal (none where stderr is not one: a log gets log lines only).

    Its total is the binding limit in iterations; it shows the env steps and
    the latest ``steps_per_sec``, ``return`` and ``alpha``.  While it shows,
    log lines go through ``tqdm.write``, so they do not glue onto the bar.
    """

    def __init__(self) -> None:
        self._bar: Any = None
        self._swapped: List[Tuple[py_logging.Handler, py_logging.Handler]] = []

    def on_training_start(self, trainer: Any) -> None:
        self._bar = tqdm(
            total=trainer.total_iterations,
            initial=trainer.iteration,
            unit="it",
            disable=None if distributed.is_main_process() else True,  # None: a terminal only
            dynamic_ncols=True,
        )
        root = py_logging.getLogger()
        if not self._bar.disable:
            for handler in [h for h in root.handlers if _is_console_handler(h)]:
                proxy = _BarLogHandler(handler)
                root.removeHandler(handler)
                root.addHandler(proxy)
                self._swapped.append((handler, proxy))

    def on_iteration_end(self, trainer: Any) -> bool:
        status, m = f"steps={trainer.env_steps}", trainer.metrics
        if "steps_per_sec" in m:
            ret = f"{m['return']:.1f}" if "return" in m else "n/a"
            status += f" sps={m['steps_per_sec']:.0f} return={ret} alpha={m.get('alpha', 0):.4g}"
        self._bar.set_postfix_str(status, refresh=False)
        self._bar.update(1)
        return True

    def on_training_end(self, trainer: Any) -> None:
        root = py_logging.getLogger()
        for handler, proxy in self._swapped:
            root.removeHandler(proxy)
            root.addHandler(handler)
        self._swapped = []
        if self._bar is not None:
            self._bar.close()
            self._bar = None


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


class SignalCallback(Callback):
    """SIGTERM or SIGINT: stop after the current iteration (checkpointed); a second: at once.

    Handlers are installed in the main thread only and restored at the end.
    Under ``torchrun`` the ranks agree: a signal to any rank stops all after
    the same iteration.  The second signal raises :class:`TrainingAborted`.

    Attributes:
        stopped_by: ``"SIGTERM"`` or ``"SIGINT"`` once a signal stopped the run.
    """

    def __init__(self) -> None:
        self.stopped_by: Optional[str] = None
        self._signum: Optional[int] = None
        self._old: Dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._signum is not None:
            raise TrainingAborted(signum)
        self._signum = signum
        logging.warning(
            "%s received: stopping after the current iteration and writing a checkpoint "
            "(send it again to stop at once, without one)", signal.Signals(signum).name,
        )

    def on_training_start(self, trainer: Any) -> None:
        self.stopped_by, self._signum = None, None
        if threading.current_thread() is threading.main_thread():  # else: keep the defaults
            self._old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM,
                                                                         signal.SIGINT)}

    def on_iteration_end(self, trainer: Any) -> bool:
        signum = self._signum
        if distributed.is_distributed():  # one vote per rank
            votes = distributed.all_reduce_mean(
                torch.tensor([0.0 if signum is None else 1.0], device=trainer.device)
            )
            if float(votes) > 0 and signum is None:
                signum = int(signal.SIGTERM)  # another rank's signal
        if signum is None:
            return True
        self.stopped_by = signal.Signals(signum).name
        return False

    def on_training_end(self, trainer: Any) -> None:
        for signum, handler in self._old.items():
            signal.signal(signum, handler)
        self._old = {}
        if self.stopped_by is not None:
            logging.warning("Stopped by %s at iteration %d; saved %s",
                            self.stopped_by, trainer.iteration, trainer.last_checkpoint)


@gin.configurable
class EvaluationCallback(Callback):
    """Evaluate the deterministic policy at the start, every ``interval`` iterations and at the end.

    Rank 0 evaluates (:meth:`Trainer.evaluate`), writes ``eval/return`` and
    ``eval/return_vs_env_steps`` and logs a line; with ``stop_return`` the
    run stops once an evaluation reaches it (every rank gets the verdict).

    Args:
        interval: iterations between evaluations.
        num_episodes: episodes per evaluation.
        stop_return: stop as soon as an evaluation's mean return reaches it.
    """

    def __init__(self, interval: int, num_episodes: int = 10,
                 stop_return: Optional[float] = None):
        self._interval = check_int("eval_interval", interval, minimum=1)
        self._num_episodes = check_int("num_eval_episodes", num_episodes, minimum=1)
        self._stop_return = None if stop_return is None else float(stop_return)

    def _evaluate(self, trainer: Any) -> float:
        value = trainer.evaluate(self._num_episodes)
        with summary.record_if(lambda: True):
            summary.scalar("eval/return", value, step=trainer.iteration)
            summary.scalar("eval/return_vs_env_steps", value, step=trainer.env_steps)
        logging.info("iteration %d env_steps %d eval return %.2f",
                     trainer.iteration, trainer.env_steps, value)
        return value

    def on_training_start(self, trainer: Any) -> None:
        if trainer.iteration == 0 and distributed.is_main_process():
            self._evaluate(trainer)  # the untrained policy: the curve's start

    def on_iteration_end(self, trainer: Any) -> bool:
        if trainer.iteration % self._interval and trainer.limit_reached is None:
            return True
        stop = False
        if distributed.is_main_process():  # one evaluation; the others wait for its verdict
            value = self._evaluate(trainer)
            stop = self._stop_return is not None and value >= self._stop_return
            if stop:
                logging.info("eval return %.2f >= stop_eval_return: stopping", value)
        return not distributed.broadcast_object(stop)


@gin.configurable
class CheckpointCallback(Callback):
    """A checkpoint every ``interval`` iterations (the trainer also writes one at the end).

    Args:
        interval: iterations between checkpoints.
    """

    def __init__(self, interval: int):
        self._interval = check_int("checkpoint_interval", interval, minimum=1)

    def on_iteration_end(self, trainer: Any) -> bool:
        if trainer.iteration % self._interval == 0:
            trainer.save_checkpoint()
        return True


@gin.configurable
class TimeBudgetCallback(Callback):
    """Stop (with a checkpoint) once ``max_seconds`` of this ``train()`` call have passed.

    Under ``torchrun`` rank 0's clock decides for all ranks.

    Args:
        max_seconds: the budget in seconds of wall time.
    """

    def __init__(self, max_seconds: float):
        self._max_seconds = check_real("max_seconds", max_seconds, positive=True)
        self._start = 0.0

    def on_training_start(self, trainer: Any) -> None:
        self._start = time.time()

    def on_iteration_end(self, trainer: Any) -> bool:
        over = time.time() - self._start >= self._max_seconds
        if distributed.broadcast_object(over):
            logging.info("time budget of %.0f s spent: stopping at iteration %d",
                         self._max_seconds, trainer.iteration)
            return False
        return True


def builtin_callbacks(
    summary_interval: int, summary_flush_secs: float, progress_bar: bool,
    signals: SignalCallback, eval_interval: Optional[int], num_eval_episodes: int,
    stop_eval_return: Optional[float], checkpoint_interval: Optional[int],
    callbacks: Sequence[Callback] = (),
) -> List[Callback]:
    """The callbacks a trainer runs, in order: those its arguments ask for, then ``callbacks``.

    Raises:
        ValueError: for out-of-range arguments.
        TypeError: if one of ``callbacks`` is not a :class:`Callback`.
    """
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise TypeError(f"callbacks must be Callback instances, got {callback!r}")
    check_int("eval_interval", eval_interval, minimum=1, allow_none=True)
    check_int("checkpoint_interval", checkpoint_interval, minimum=1, allow_none=True)
    if stop_eval_return is not None and eval_interval is None:
        raise ValueError("stop_eval_return needs eval_interval to be set")
    out: List[Callback] = [SummaryCallback(summary_interval, summary_flush_secs)]
    out += [ProgressBarCallback()] if progress_bar else []
    out.append(signals)
    if eval_interval is not None:
        out.append(EvaluationCallback(eval_interval, num_eval_episodes, stop_eval_return))
    if checkpoint_interval is not None:
        out.append(CheckpointCallback(checkpoint_interval))
    return out + list(callbacks)
