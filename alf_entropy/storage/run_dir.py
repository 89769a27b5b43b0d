"""A run directory belongs to one run: the writer lock and the config check.

:class:`RunDir` refuses a ``root_dir`` that is a file or not writable before
creating anything; holds ``root_dir/.run.lock`` (a ``filelock.FileLock``: an
``flock`` the OS drops when the process ends, ``kill -9`` included), so a
second trainer fails at once with :class:`RunDirLocked` naming the holder;
removes killed checkpoint writes' leftovers; refuses a configuration that
differs from the directory's ``operative_config.gin`` beyond
:data:`RESULT_NEUTRAL_PARAMETERS`; writes the config in force.  Under
``torchrun`` rank 0 alone touches the directory; every rank raises its errors.
"""

import contextlib
import glob
import os
import shutil
import socket
from typing import Iterator, List, Optional, Tuple

import filelock
import gin
from absl import logging

from alf_entropy.config.bindings import TRAINER_BINDING, read_bindings
from alf_entropy.storage import checkpoints as ckpt
from alf_entropy.utils import distributed

__all__ = ["LOCK_FILE", "RESULT_NEUTRAL_PARAMETERS", "RunDir", "RunDirLocked", "config_differences"]

LOCK_FILE = ".run.lock"
"""The lock file's name inside a run directory."""

RESULT_NEUTRAL_PARAMETERS = frozenset(
    {
        "num_iterations",
        "num_env_steps",
        "summary_interval",
        "checkpoint_interval",
        "eval_interval",
        "num_eval_episodes",
        "max_checkpoints",
        "progress_bar",
        "summary_flush_secs",
        "stop_eval_return",
        "num_threads",
        "debug_summaries",
        "allow_config_change",
        "device",
        "callbacks",
        "max_seconds",
    }
)
"""Parameters (of any configurable) a resumed run may change: when or how much it
trains, reports or saves, or where (``device``: not bit-exactly), not what one
iteration computes."""


class RunDirLocked(ValueError):
    """Another process holds the run directory's lock."""


def _take_lock(root_dir):
    """Create ``root_dir`` and lock it, recording this process as the holder."""
    os.makedirs(root_dir, exist_ok=True)  # an OSError: take() names root_dir
    path = os.path.join(root_dir, LOCK_FILE)
    holder = "an unknown process"
    with contextlib.suppress(OSError, ValueError):  # missing, or not what we write there
        with open(path, encoding="utf-8") as f:  # read first: a losing filelock < 3.30
            pid, host = f.read().split()  # truncates the file
        holder = f"pid {pid} on host {host}"
    # One lock object per path in a process: trainers built one after another share it.
    lock = filelock.FileLock(path, timeout=0, thread_local=False, is_singleton=True)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise RunDirLocked(
            f"root_dir {root_dir} is already in use by another run ({holder}, still "
            "running): wait for it to end or use another --root_dir"
        ) from None
    if lock.lock_counter > 1:  # the singleton is re-entrant: another holder in this process
        lock.release()
        raise RunDirLocked(
            f"root_dir {root_dir} is already in use by another trainer in this "
            "process: train() it to its end (or close() it) first, or use "
            "another root_dir"
        )
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{os.getpid()} {socket.gethostname()}\n")
    return lock


def config_differences(saved: str, current: str) -> List[Tuple[str, Optional[str], Optional[str]]]:
    """``(binding, saved value or None, current value or None)`` of each binding two
    configs' texts disagree on, changed values first (they say more than parameters of
    classes one side lacks), then by binding; :data:`RESULT_NEUTRAL_PARAMETERS` and the
    trainer binding (only the command line reads it) left out."""
    old, new = read_bindings(saved), read_bindings(current)
    keys = [
        k
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k)
        and k != TRAINER_BINDING
        and k.rsplit(".", 1)[-1] not in RESULT_NEUTRAL_PARAMETERS
    ]
    return sorted([(k, old.get(k), new.get(k)) for k in keys], key=lambda d: None in d)


class RunDir:
    """The run directory a trainer owns (see the module docstring).

    Args:
        root_dir: the directory (created by :meth:`take` if missing).
        allow_config_change: resume a directory whose config differs anyway (the
            differences logged, the old config kept as ``operative_config.<iteration>.gin``).

    Raises:
        ValueError: if ``root_dir`` is empty, a file, or not writable.
    """

    def __init__(self, root_dir: str, allow_config_change: bool = False):
        if not isinstance(root_dir, str) or not root_dir:
            raise ValueError(f"root_dir must be a non-empty path, got {root_dir!r}")
        self.path = path = os.path.abspath(os.path.expanduser(root_dir))
        while not os.path.lexists(path):  # the nearest existing: "/" at the latest
            path = os.path.dirname(path)
        if not os.path.isdir(path):
            where = "" if path == self.path else f" ({path} is a file)"
            raise ValueError(
                f"root_dir {self.path} is not a directory{where}: give the path "
                "of a directory (existing or to be created)"
            )
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"root_dir {self.path}: {path} is not writable")
        self.checkpoint_dir = os.path.join(self.path, "checkpoints")
        self._config_path = os.path.join(self.path, "operative_config.gin")
        self._allow_config_change = bool(allow_config_change)
        self._config_change = None  # the differences shown, if allowed
        self._lock = None  # rank 0's
        self._held = False

    def take(self, check_config: bool = True) -> None:
        """Lock the directory (if not held, rank 0); with ``check_config`` (a run's start,
        not another ``train()``) also remove killed writes' leftovers and check the config.

        Raises:
            RunDirLocked: if another process holds it.
            ValueError: if the config differs (without ``allow_config_change``) or the
                directory cannot be written.
        """
        if self._held:
            return
        error = None  # rank 0's, raised on every rank
        if distributed.is_main_process():
            try:
                self._lock = _take_lock(self.path)
                if check_config:
                    for stale in glob.glob(os.path.join(self.checkpoint_dir, ".ckpt-*.tmp")):
                        os.remove(stale)  # a checkpoint write that was killed
                        logging.info(
                            "Removed %s, left by a checkpoint write that was killed", stale
                        )
                    self._check_config()
            except ValueError as e:
                error = e
            except OSError as e:  # e.g. no permission inside an existing root_dir
                error = ValueError(f"root_dir {self.path}: {e}")
        error = distributed.broadcast_object(error)
        if error is not None:
            raise error
        self._held = True

    def release(self) -> None:
        """Release the lock (idempotent)."""
        lock, self._lock, self._held = self._lock, None, False
        if lock is not None:
            lock.release()

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter exit the OS drops it anyway
            self.release()

    @contextlib.contextmanager
    def opening(self) -> Iterator[None]:
        """Around a trainer's start: on an error, release and remove a directory it made."""
        created = distributed.is_main_process() and not os.path.exists(self.path)
        try:
            yield
        except BaseException:
            self.release()
            if created:  # leave no half-made run directory behind
                shutil.rmtree(self.path, ignore_errors=True)
            raise

    def _check_config(self):
        """Refuse a configuration that differs from the directory's."""
        if not os.path.isfile(self._config_path):
            return
        with open(self._config_path, encoding="utf-8") as f:
            diffs = config_differences(f.read(), gin.operative_config_str())
        if not diffs:
            return
        shown = "; ".join(
            f"{key}: {'unset' if old is None else old} -> {'unset' if new is None else new}"
            for key, old, new in diffs[:5]
        ) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
        if not self._allow_config_change:
            raise ValueError(
                f"root_dir {self.path} holds a run with another configuration "
                f"({len(diffs)} difference(s): {shown}); use a new --root_dir, or "
                "--allow_config_change to resume it with the new configuration anyway"
            )
        self._config_change = shown

    def write_operative_config(self, iteration: int) -> None:
        """Write ``operative_config.gin`` (rank 0); a changed one's predecessor is kept
        as ``operative_config.<iteration>.gin``."""
        if not distributed.is_main_process():
            return
        if self._config_change is not None:  # the directory's config differed
            keep = os.path.join(self.path, f"operative_config.{iteration}.gin")
            os.replace(self._config_path, keep)
            logging.warning(
                "allow_config_change: resuming %s at iteration %d with a changed configuration "
                "(%s); the previous config is kept as %s",
                self.path,
                iteration,
                self._config_change,
                keep,
            )
        text = gin.operative_config_str().encode("utf-8")
        ckpt.atomic_write_bytes(self._config_path, lambda f: f.write(text))
