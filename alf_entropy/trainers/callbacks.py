"""Callbacks decide, the trainer's loop acts (Hugging Face's ``TrainerControl``).

The loop calls each :class:`Callback`'s hooks in list order.  A callback reads the
trainer (``iteration``, ``env_steps``, ``metrics``, ``algorithm``, ``agent_dirs``, ...)
and asks through ``trainer.control`` (``False`` from ``on_iteration_end`` stops too); it
calls no trainer method.  The trainer builds the built-in ones from its arguments and
runs ``callbacks=[...]`` after them; all but ``SignalCallback`` are gin-configurable.
"""

import contextlib
import dataclasses
import logging as py_logging
import os
import signal
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from absl import logging

from alf_entropy.utils import distributed, summary
from alf_entropy.utils.checks import check_int, check_real
from alf_entropy.utils.requirements import require_train_extra

require_train_extra()  # gymnasium>=1.1 and tqdm: the `train` extra

from tqdm import tqdm  # noqa: E402  (after the requirement check)
from tqdm.contrib.logging import logging_redirect_tqdm  # noqa: E402

__all__ = [
    "Callback",
    "CheckpointCallback",
    "EvaluationCallback",
    "ProgressBarCallback",
    "SignalCallback",
    "SummaryCallback",
    "TimeBudgetCallback",
    "TrainerControl",
    "TrainingAborted",
    "control_line",
]

Logs = Dict[str, List[Optional[float]]]


@dataclasses.dataclass
class TrainerControl:
    """What the callbacks ask of the loop (fresh each iteration): record the algorithm's
    summaries and log, evaluate, checkpoint, stop (with a checkpoint)."""

    should_log: bool = False
    should_evaluate: bool = False
    should_save: bool = False
    should_stop: bool = False


class Callback:
    """The base class: hooks that do nothing; override the ones you need (module docstring)."""

    def on_training_start(self, trainer: Any) -> None:
        """Before the first iteration of a ``train()`` call (also when resumed)."""

    def on_iteration_start(self, trainer: Any) -> None:
        """Before each iteration (``trainer.iteration`` iterations done)."""

    def on_iteration_end(self, trainer: Any) -> bool:
        """After each iteration (counted); False stops the run, with a checkpoint."""
        return True

    def on_log(self, trainer: Any, logs: Logs) -> None:
        """After an iteration with summaries: ``return``, ``alpha``, ... (each agent's)."""

    def on_evaluate(self, trainer: Any, logs: Logs) -> None:
        """After an evaluation: ``eval/return`` (each agent's) and ``on_log``'s latest."""

    def on_training_end(self, trainer: Any) -> None:
        """When ``train()`` ends, however it ends (release what you hold here)."""


def control_line(logs: Logs) -> str:
    """``eval return 187.30 alpha 0.125 entropy 0.68 target 0.68`` (K: ``min/mean/max``)."""
    parts = []
    for tag, label, fmt in (
        ("eval/return", "eval return", ".2f"),
        ("alpha", "alpha", ".4g"),
        ("entropy", "entropy", ".4g"),
        ("target_entropy", "target", ".4g"),
    ):
        values = [v for v in logs.get(tag) or [] if v is not None]
        if len(values) > 1:
            label, values = f"{label} min/mean/max", (min(values), np.mean(values), max(values))
        if values:
            parts.append(f"{label} " + "/".join(f"{v:{fmt}}" for v in values))
    return " ".join(parts)


class SummaryCallback(Callback):
    """TensorBoard summaries every ``interval`` iterations (rank 0) in ``root_dir/train``
    (K agents: ``<agent dir>/train`` each), flushed every ``flush_secs``."""

    def __init__(self, interval: int = 10, flush_secs: float = 10.0):
        self.interval = check_int("summary_interval", interval, minimum=1)
        self.flush_secs = check_real("summary_flush_secs", flush_secs, positive=True)

    def on_training_start(self, trainer: Any) -> None:
        summary.set_default_writer(
            [
                summary.create_summary_writer(
                    os.path.join(trainer.root_dir, name, "train"), flush_secs=self.flush_secs
                )
                for name in trainer.agent_dirs
            ]
            if distributed.is_main_process()
            else None
        )

    def on_iteration_start(self, trainer: Any) -> None:
        trainer.control.should_log = trainer.iteration % self.interval == 0

    def on_log(self, trainer: Any, logs: Logs) -> None:
        for tag in ("env_steps", "steps_per_sec", "return", "episode_length"):
            summary.scalar(tag, logs[tag])
        summary.scalar("return_vs_env_steps", logs["return"], step=trainer.env_steps)

    def on_evaluate(self, trainer: Any, logs: Logs) -> None:
        with summary.record_if(lambda: True):
            summary.scalar("eval/return", logs["eval/return"], step=trainer.iteration)
            summary.scalar("eval/return_vs_env_steps", logs["eval/return"], step=trainer.env_steps)

    def on_training_end(self, trainer: Any) -> None:
        summary.close()  # flushed


class ProgressBarCallback(Callback):
    """A tqdm bar on a terminal (the binding limit's iterations; env steps, ``steps_per_sec``,
    ``return``, ``alpha``); meanwhile console log lines go through ``logging_redirect_tqdm``."""

    def __init__(self) -> None:
        self._open = contextlib.ExitStack()  # the bar and the redirection

    def on_training_start(self, trainer: Any) -> None:
        self._bar = self._open.enter_context(
            tqdm(
                total=trainer.total_iterations,
                initial=trainer.iteration,
                unit="it",
                dynamic_ncols=True,
                disable=None if distributed.is_main_process() else True,
            )
        )
        if not self._bar.disable:
            root = py_logging.getLogger()
            self._open.callback(setattr, root, "handlers", root.handlers)
            # absl's handler (app.run installs it) wraps a StreamHandler tqdm recognises.
            root.handlers = [getattr(h, "python_handler", h) for h in root.handlers]
            self._open.enter_context(logging_redirect_tqdm())

    def on_iteration_end(self, trainer: Any) -> bool:
        status, m = f"steps={trainer.env_steps}", trainer.metrics
        if "steps_per_sec" in m:
            ret = f"{m['return']:.1f}" if "return" in m else "n/a"
            status += f" sps={m['steps_per_sec']:.0f} return={ret} alpha={m.get('alpha', 0):.4g}"
        self._bar.set_postfix_str(status, refresh=False)
        self._bar.update(1)
        return True

    def on_training_end(self, trainer: Any) -> None:
        self._open.close()


class TrainingAborted(Exception):
    """A second SIGTERM/SIGINT stopped training at once, without a checkpoint (``signum``)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(
            f"stopped at once by a second {signal.Signals(signum).name}: no "
            "checkpoint written; run the same command to resume from the last "
            "checkpoint"
        )


class SignalCallback(Callback):
    """SIGTERM or SIGINT: stop after the current iteration (checkpointed; ``stopped_by``
    names it); a second raises :class:`TrainingAborted`.  Main thread only; under
    ``torchrun`` a signal to any rank stops all after the same iteration."""

    def __init__(self) -> None:
        self.stopped_by: Optional[str] = None
        self._signum = None
        self._old = {}

    def _on_signal(self, signum, frame):
        if self._signum is not None:
            raise TrainingAborted(signum)
        self._signum = signum
        logging.warning(
            "%s received: stopping after the current iteration and writing a "
            "checkpoint (send it again to stop at once, without one)",
            signal.Signals(signum).name,
        )

    def on_training_start(self, trainer: Any) -> None:
        self.stopped_by, self._signum = None, None
        if threading.current_thread() is threading.main_thread():  # else: keep the defaults
            self._old = {
                s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)
            }

    def on_iteration_end(self, trainer: Any) -> bool:
        signum = self._signum
        if distributed.is_distributed():  # one vote per rank
            votes = distributed.all_reduce_mean(
                torch.tensor([0.0 if signum is None else 1.0], device=trainer.device)
            )
            if float(votes) > 0 and signum is None:
                signum = int(signal.SIGTERM)  # another rank's signal
        if signum is not None:
            self.stopped_by = signal.Signals(signum).name
        return signum is None

    def on_training_end(self, trainer: Any) -> None:
        for signum, handler in self._old.items():
            signal.signal(signum, handler)
        self._old = {}
        if self.stopped_by is not None:
            logging.warning(
                "Stopped by %s at iteration %d; saved %s",
                self.stopped_by,
                trainer.iteration,
                trainer.last_checkpoint,
            )


class EvaluationCallback(Callback):
    """Evaluate at the start, every ``interval`` iterations and at the end (rank 0), logging
    ``iteration ... env_steps ...`` and :func:`control_line`; stop once every agent's mean
    return reaches ``stop_return`` (episodes: the trainer's ``num_eval_episodes``)."""

    def __init__(self, interval: int, stop_return: Optional[float] = None):
        self._interval = check_int("eval_interval", interval, minimum=1)
        self._stop_return = None if stop_return is None else float(stop_return)

    def on_training_start(self, trainer: Any) -> None:
        trainer.control.should_evaluate |= trainer.iteration == 0  # the curve's start

    def on_iteration_end(self, trainer: Any) -> bool:
        trainer.control.should_evaluate |= (
            trainer.iteration % self._interval == 0 or trainer.limit_reached is not None
        )
        return True

    def on_evaluate(self, trainer: Any, logs: Logs) -> None:
        logging.info(
            "iteration %d env_steps %d %s", trainer.iteration, trainer.env_steps, control_line(logs)
        )
        lowest = min(logs["eval/return"])
        if self._stop_return is not None and trainer.iteration > 0 and lowest >= self._stop_return:
            logging.info("eval return %.2f >= stop_eval_return: stopping", lowest)
            trainer.control.should_stop = True


class CheckpointCallback(Callback):
    """A checkpoint every ``interval`` iterations (the loop also writes one at the end)."""

    def __init__(self, interval: int):
        self._interval = check_int("checkpoint_interval", interval, minimum=1)

    def on_iteration_end(self, trainer: Any) -> bool:
        trainer.control.should_save |= trainer.iteration % self._interval == 0
        return True


class TimeBudgetCallback(Callback):
    """Stop once ``max_seconds`` of this ``train()`` call have passed (rank 0's clock)."""

    def __init__(self, max_seconds: float):
        self._max_seconds = check_real("max_seconds", max_seconds, positive=True)

    def on_training_start(self, trainer: Any) -> None:
        self._start = time.time()

    def on_iteration_end(self, trainer: Any) -> bool:
        if distributed.broadcast_object(time.time() - self._start >= self._max_seconds):
            logging.info(
                "time budget of %.0f s spent: stopping at iteration %d",
                self._max_seconds,
                trainer.iteration,
            )
            return False
        return True
