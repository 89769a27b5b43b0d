"""A run directory belongs to one run: the writer lock and the config check.

:class:`RunDir` is what a trainer holds.  It refuses a ``root_dir`` that is a
file or cannot be written (:func:`check_root_dir`) before anything is
created; holds an exclusive ``flock`` on ``root_dir/.run.lock``
(:class:`RunLock`), so a second trainer on the directory fails at once with
:class:`RunDirLocked` naming the holder (the OS drops the lock when the
process ends, ``kill -9`` included, so a stale lock file never blocks a
restart); removes killed checkpoint writes' leftovers; refuses a
configuration that differs from the directory's ``operative_config.gin``
beyond :data:`RESULT_NEUTRAL_PARAMETERS` (:func:`config_differences`); and
writes the config in force.  Under ``torchrun`` rank 0 alone touches the
directory and every rank raises its errors.
"""
import contextlib
import errno
import fcntl
import os
import re
import shutil
import socket
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import gin
from absl import logging

from alf_entropy.trainers import checkpoint as ckpt
from alf_entropy.utils import distributed

__all__ = ["LOCK_FILE", "RESULT_NEUTRAL_PARAMETERS", "RunDir", "RunDirLocked", "RunLock",
           "check_root_dir", "config_differences", "lock_holder", "parse_operative_config"]

LOCK_FILE = ".run.lock"
"""The lock file's name inside a run directory."""

RESULT_NEUTRAL_PARAMETERS = frozenset({
    "num_iterations", "num_env_steps", "summary_interval", "checkpoint_interval",
    "eval_interval", "num_eval_episodes", "max_checkpoints", "progress_bar",
    "summary_flush_secs", "stop_eval_return", "num_threads", "debug_summaries",
    "allow_config_change", "device", "callbacks", "max_seconds",
})
"""Parameter names (of any configurable) that may differ between a run's
``operative_config.gin`` and a resumed run: they change when or how much the
run trains, reports or saves, or where (``device``: a run may move from CPU
to GPU, not bit-exactly), not what one iteration computes."""

_NOT_COMPARED = frozenset({"train.trainer"})
# gin_config.TRAINER_BINDING: which trainer alf-entropy-train builds. Only the
# command line reads it (a run a script built does not record it); the
# trainer's own bindings, which are compared, say what the run computes.


class RunDirLocked(ValueError):
    """Another process holds the run directory's lock."""


def check_root_dir(root_dir: str) -> None:
    """Refuse (``ValueError``) an absolute ``root_dir`` that is, or lies under, a file, or
    whose nearest existing directory is not writable; creates nothing."""
    path = root_dir
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    if os.path.lexists(path) and not os.path.isdir(path):
        where = "" if path == root_dir else f" ({path} is a file)"
        raise ValueError(
            f"root_dir {root_dir} is not a directory{where}: give the path of a directory "
            "(existing or to be created)"
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"root_dir {root_dir}: {path} is not writable")


def lock_holder(root_dir: str) -> str:
    """Who holds (or last held) ``root_dir``'s lock: ``"pid N on host H"`` or
    ``"an unknown process"``."""
    try:
        with open(os.path.join(root_dir, LOCK_FILE), encoding="utf-8") as f:
            text = f.read().split()
    except OSError:
        return "an unknown process"
    if len(text) >= 2 and text[0].isdigit():
        return f"pid {text[0]} on host {text[1]}"
    return "an unknown process"


# Locks this process holds: realpath -> [fd, count].  flock is per open file,
# so a second RunLock on the same directory in this process shares the fd
# (trainers built one after another in one script or test).
_HELD: Dict[str, List[int]] = {}


class RunLock:
    """An exclusive lock on a run directory (created if missing).

    Args:
        root_dir: the run directory.

    Raises:
        RunDirLocked: if another process holds it.
        ValueError: if the directory or lock file cannot be created.
    """

    def __init__(self, root_dir: str):
        self._key: Optional[str] = None
        try:
            os.makedirs(root_dir, exist_ok=True)
        except OSError as e:
            raise ValueError(f"root_dir {root_dir}: cannot create it: {e.strerror or e}") from e
        key = os.path.realpath(root_dir)
        if key in _HELD:
            _HELD[key][1] += 1
            self._key = key
            return
        path = os.path.join(root_dir, LOCK_FILE)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ValueError(f"root_dir {root_dir}: cannot write {path}: {e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunDirLocked(
                    f"root_dir {root_dir} is already in use by another run "
                    f"({lock_holder(root_dir)}, "
                    "still running): wait for it to end or use another --root_dir"
                ) from e
            raise ValueError(f"root_dir {root_dir}: cannot lock {path}: {e.strerror or e}") from e
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        _HELD[key] = [fd, 1]
        self._key = key

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._key is not None

    def release(self) -> None:
        """Release the lock (idempotent); the lock file stays."""
        key, self._key = self._key, None
        if key is None or key not in _HELD:
            return
        _HELD[key][1] -= 1
        if _HELD[key][1] <= 0:
            fd = _HELD.pop(key)[0]
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown: the OS drops the lock anyway
            pass


_BINDING = re.compile(r"^([A-Za-z_][\w.]*(?:/[\w.]+)*)\s*=\s*(.*)$")


def parse_operative_config(text: str) -> Dict[str, str]:
    """The bindings of a gin config text (``operative_config_str()``'s format).

    Args:
        text: gin config text; comments, ``import`` and ``include`` lines are
            ignored and continuation lines are joined to their binding.

    Returns:
        dict: ``"Configurable.parameter"`` -> the value's text, whitespace
        normalised.
    """
    bindings: Dict[str, str] = {}
    current: Optional[str] = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if line[0].isspace() and current is not None:
            bindings[current] += " " + stripped
            continue
        m = _BINDING.match(stripped)
        if m:
            current = m.group(1)
            bindings[current] = m.group(2).strip()
        else:
            current = None  # import/include lines
    return {k: " ".join(v.split()) for k, v in bindings.items()}


def config_differences(
    saved: str, current: str
) -> List[Tuple[str, Optional[str], Optional[str]]]:
    """The bindings that differ between two configs, neutral ones left out.

    Args:
        saved: the run directory's ``operative_config.gin`` text.
        current: the configuration in force now (the same format).

    Returns:
        list: ``(binding, saved value or None, current value or None)``,
        sorted by binding; empty if the configs agree on everything but
        :data:`RESULT_NEUTRAL_PARAMETERS` and the trainer binding
        (``train.trainer``, which only the command line reads).
    """
    old, new = parse_operative_config(saved), parse_operative_config(current)
    out = []
    for key in sorted(set(old) | set(new)):
        if key.rsplit(".", 1)[-1] in RESULT_NEUTRAL_PARAMETERS or key in _NOT_COMPARED:
            continue
        if old.get(key) != new.get(key):
            out.append((key, old.get(key), new.get(key)))
    return out


def _on_main(action: Callable[[], None], root_dir: str) -> None:
    """Run ``action`` on rank 0 alone; every rank raises the ``ValueError`` (or, as a
    ``ValueError`` naming ``root_dir``, the ``OSError``) it raised."""
    error: Optional[Tuple[type, str]] = None
    if distributed.is_main_process():
        try:
            action()
        except ValueError as e:
            error = (type(e), str(e))
        except OSError as e:  # e.g. no permission inside an existing root_dir
            error = (ValueError, f"root_dir {root_dir}: {e}")
    error = distributed.broadcast_object(error)
    if error is not None:
        raise error[0](error[1])


class RunDir:
    """The run directory a trainer owns (see the module docstring).

    Args:
        root_dir: the directory (created by :meth:`take` if missing).
        allow_config_change: resume a directory whose ``operative_config.gin``
            differs from the configuration in force (beyond
            :data:`RESULT_NEUTRAL_PARAMETERS`): the differences are logged and
            the old config is kept as ``operative_config.<iteration>.gin``.

    Raises:
        ValueError: if ``root_dir`` is empty, a file, or not writable.
    """

    def __init__(self, root_dir: str, allow_config_change: bool = False):
        if not isinstance(root_dir, str) or not root_dir:
            raise ValueError(f"root_dir must be a non-empty path, got {root_dir!r}")
        self.path = os.path.abspath(os.path.expanduser(root_dir))
        check_root_dir(self.path)
        self.checkpoint_dir = os.path.join(self.path, "checkpoints")
        self._config_path = os.path.join(self.path, "operative_config.gin")
        self._allow_config_change = bool(allow_config_change)
        self._config_change: Optional[str] = None
        self._lock: Optional[RunLock] = None  # rank 0's
        self._held = False

    def take(self, check_config: bool = True) -> None:
        """Lock the directory (if not held); remove leftovers and check the config (rank 0).

        Args:
            check_config: also remove killed checkpoint writes' leftovers and
                refuse a changed configuration (when the run starts; not when
                it takes the directory again for another ``train()``).

        Raises:
            RunDirLocked: if another process holds it.
            ValueError: if the configuration differs (without
                ``allow_config_change``) or the directory cannot be written.
        """
        if self._held:
            return

        def take() -> None:
            self._lock = RunLock(self.path)
            if check_config:
                for stale in ckpt.remove_partial_checkpoints(self.checkpoint_dir):
                    logging.info("Removed %s, left by a checkpoint write that was killed", stale)
                self._check_config()

        _on_main(take, self.path)
        self._held = True

    def release(self) -> None:
        """Release the lock (idempotent)."""
        lock, self._lock, self._held = self._lock, None, False
        if lock is not None:
            lock.release()

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

    def _check_config(self) -> None:
        """Refuse a configuration that differs from the directory's."""
        if not os.path.isfile(self._config_path):
            return
        with open(self._config_path, encoding="utf-8") as f:
            diffs = config_differences(f.read(), gin.operative_config_str())
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
                f"root_dir {self.path} holds a run with another configuration "
                f"({len(diffs)} difference(s): {shown}); use a new --root_dir, or "
                "--allow_config_change to resume it with the new configuration anyway"
            )
        self._config_change = shown

    def write_operative_config(self, iteration: int) -> None:
        """Write ``operative_config.gin`` (rank 0); keep a changed one's predecessor.

        Args:
            iteration: the iteration the run resumes at (names the kept file).
        """
        if not distributed.is_main_process():
            return
        if self._config_change is not None and os.path.isfile(self._config_path):
            keep = os.path.join(self.path, f"operative_config.{iteration}.gin")
            os.replace(self._config_path, keep)
            logging.warning(
                "allow_config_change: resuming %s at iteration %d with a changed configuration "
                "(%s); the previous config is kept as %s",
                self.path, iteration, self._config_change, keep,
            )
        text = gin.operative_config_str().encode("utf-8")
        ckpt.atomic_write_bytes(self._config_path, lambda f: f.write(text))
