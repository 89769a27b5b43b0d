"""Checkpoint files: atomic writes, the latest checkpoint, RNG and pickled state.

Shared by every trainer (see :class:`alf_entropy.trainers.trainer.Trainer`):

* :func:`atomic_write_bytes` writes to a temporary file in the same directory,
  ``fsync``s it and renames it over the destination, so a crash (even
  ``SIGKILL``) at any moment leaves either the old file or the complete new
  one, never a partial file under the final name;
* :func:`save_checkpoint` / :func:`load_checkpoint` write and read
  ``ckpt-<iteration>.pt`` with ``torch.save`` / ``torch.load(weights_only=True)``
  and keep the last ``max_to_keep``; :func:`latest_checkpoint` finds the newest;
* :func:`rng_state` / :func:`set_rng_state` capture and restore the torch
  (and CUDA), NumPy and Python ``random`` generators as tensors and plain
  values that ``weights_only`` loading accepts;
* :func:`bytes_to_tensor` / :func:`tensor_to_bytes` carry opaque bytes (e.g. a
  pickled environment) as a ``uint8`` tensor, the form ``weights_only``
  loading accepts.
"""
import glob
import os
import random
import re
import tempfile
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

__all__ = [
    "CheckpointError",
    "REQUIRED_KEYS",
    "atomic_write_bytes",
    "checkpoints_newest_first",
    "bytes_to_tensor",
    "checkpoint_path",
    "latest_checkpoint",
    "load_checkpoint",
    "remove_partial_checkpoints",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "tensor_to_bytes",
]

_CKPT_PATTERN = re.compile(r"^ckpt-(\d+)\.pt$")

REQUIRED_KEYS = ("iteration", "env_steps", "progress", "algorithm", "optimizers", "rng")
"""The keys every checkpoint written by a trainer holds."""


class CheckpointError(ValueError):
    """A checkpoint cannot be read or written, or does not fit the run."""


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


def _checkpoints(checkpoint_dir: str) -> Dict[int, str]:
    found = {}
    for path in glob.glob(os.path.join(checkpoint_dir, "ckpt-*.pt")):
        m = _CKPT_PATTERN.match(os.path.basename(path))
        if m:
            found[int(m.group(1))] = path
    return found


def remove_partial_checkpoints(checkpoint_dir: str) -> List[str]:
    """Delete the temporary files of checkpoint writes that were killed.

    Call it only where no other process writes checkpoints to the directory.

    Args:
        checkpoint_dir: the checkpoint directory.

    Returns:
        List[str]: the removed paths.
    """
    stale = glob.glob(os.path.join(checkpoint_dir, ".ckpt-*.tmp"))
    for path in stale:
        os.remove(path)
    return stale


def checkpoint_path(checkpoint_dir: str, iteration: int) -> str:
    """The file name of the checkpoint of ``iteration``.

    Args:
        checkpoint_dir: the checkpoint directory.
        iteration: the iteration count the checkpoint holds.

    Returns:
        str: ``checkpoint_dir/ckpt-<iteration:08d>.pt``.
    """
    return os.path.join(checkpoint_dir, f"ckpt-{iteration:08d}.pt")


def latest_checkpoint(checkpoint_dir: str) -> Optional[str]:
    """The path of the checkpoint with the largest iteration, or ``None``.

    Temporary files of an interrupted write (``.ckpt-*.tmp``) are ignored.

    Args:
        checkpoint_dir: the directory holding ``ckpt-<iteration>.pt`` files.

    Returns:
        Optional[str]: the path, ``None`` if there is none.
    """
    found = _checkpoints(checkpoint_dir)
    return found[max(found)] if found else None


def checkpoints_newest_first(checkpoint_dir: str) -> List[str]:
    """The paths of all ``ckpt-<iteration>.pt`` files, newest first.

    Args:
        checkpoint_dir: the checkpoint directory (may be missing).

    Returns:
        List[str]: the paths, largest iteration first.
    """
    found = _checkpoints(checkpoint_dir)
    return [found[it] for it in sorted(found, reverse=True)]


def save_checkpoint(
    checkpoint_dir: str, iteration: int, state: Dict[str, Any], max_to_keep: int
) -> str:
    """Atomically write ``state`` as ``ckpt-<iteration>.pt``; keep the newest few.

    Args:
        checkpoint_dir: the checkpoint directory (created if missing).
        iteration: the iteration count ``state`` holds (names the file).
        state: a nest of tensors and plain Python values (what
            ``torch.load(weights_only=True)`` accepts).
        max_to_keep: how many of the newest checkpoints to keep.

    Returns:
        str: the written path.

    Raises:
        CheckpointError: if the file cannot be written (a full disk, no
            permission, ...); the earlier checkpoints are left as they were
            and no partial file remains.
    """
    path = checkpoint_path(checkpoint_dir, iteration)
    try:
        atomic_write_bytes(path, lambda f: torch.save(state, f))
    except OSError as e:
        raise CheckpointError(
            f"cannot write checkpoint {path}: {e.strerror or e} (errno {e.errno}); the earlier "
            f"checkpoints in {checkpoint_dir} are intact"
        ) from e
    found = _checkpoints(checkpoint_dir)
    for it in sorted(found)[: max(0, len(found) - max_to_keep)]:
        os.remove(found[it])
    return path


def load_checkpoint(path: str) -> Dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` onto the CPU.

    Args:
        path: the checkpoint file.

    Returns:
        dict: the saved state (tensors on the CPU; ``load_state_dict`` copies
        them onto the devices of the existing tensors).

    Raises:
        CheckpointError: if the file cannot be read (truncated, not a
            checkpoint, unreadable) or lacks one of :data:`REQUIRED_KEYS`.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch.load raises many types for a damaged file
        # The first sentence: torch's zip errors go on for several more.
        message = " ".join(str(e).split()).split(". ")[0][:200]
        raise CheckpointError(
            f"{path} cannot be read ({type(e).__name__}: {message})"
        ) from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a checkpoint (it holds a {type(state).__name__})")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"{path} is not a complete checkpoint: it lacks {', '.join(missing)}")
    return state


def bytes_to_tensor(data: bytes) -> torch.Tensor:
    """``data`` as a 1-D ``uint8`` tensor (storable with ``weights_only``).

    Args:
        data: any bytes.

    Returns:
        torch.Tensor: a ``uint8`` copy of ``data``.
    """
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes stored by :func:`bytes_to_tensor`.

    Args:
        tensor: a 1-D ``uint8`` tensor.

    Returns:
        bytes: its content.

    Raises:
        TypeError: if ``tensor`` is not a ``uint8`` tensor.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8:
        raise TypeError(f"tensor must be a uint8 tensor, got {tensor!r:.80}")
    return tensor.cpu().numpy().tobytes()


def rng_state() -> Dict[str, Any]:
    """The states of torch (and CUDA), NumPy's global and Python's ``random``.

    Returns:
        dict: tensors and plain values (``weights_only``-loadable).
    """
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


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore the generators captured by :func:`rng_state`.

    Args:
        state: what :func:`rng_state` returned (possibly saved and loaded).
    """
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
