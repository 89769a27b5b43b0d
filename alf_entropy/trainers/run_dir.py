"""A run directory belongs to one run: the writer lock and the config check.

* :func:`check_root_dir` refuses a ``root_dir`` that is a file, lies under a
  file, or cannot be written, before anything is created;
* :class:`RunLock` holds an exclusive ``fcntl.flock`` on
  ``root_dir/.run.lock`` for as long as a trainer uses the directory, so a
  second trainer started on the same directory (on this host or, on a file
  system with working ``flock``, another) fails at once with
  :class:`RunDirLocked`, naming the holder's pid and host.  The operating
  system drops the lock when the process ends, however it ends (``kill -9``
  included), so a stale lock file never blocks a restart;
* :func:`parse_operative_config` / :func:`config_differences` compare the
  configuration in force with the ``operative_config.gin`` a run directory
  already holds, ignoring the settings in :data:`RESULT_NEUTRAL_PARAMETERS`
  (training limits, intervals, the progress bar, ...), which may change when
  a run is resumed.
"""
import errno
import fcntl
import os
import re
import socket
from typing import Dict, List, Optional, Tuple

__all__ = [
    "LOCK_FILE",
    "RESULT_NEUTRAL_PARAMETERS",
    "RunDirLocked",
    "RunLock",
    "check_root_dir",
    "config_differences",
    "lock_holder",
    "parse_operative_config",
]

LOCK_FILE = ".run.lock"
"""The lock file's name inside a run directory."""

RESULT_NEUTRAL_PARAMETERS = frozenset({
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
    """Refuse a ``root_dir`` that cannot become a run directory (creates nothing).

    Args:
        root_dir: an absolute path.

    Raises:
        ValueError: if it (or the nearest existing path above it) is not a
            directory, or that directory is not writable.
    """
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
    """Who holds (or last held) the lock, as written in the lock file.

    Args:
        root_dir: the run directory.

    Returns:
        str: ``"pid N on host H"``, or ``"an unknown process"``.
    """
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
