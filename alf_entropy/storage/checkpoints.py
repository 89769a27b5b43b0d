"""Checkpoints: the :class:`Checkpointer` a trainer holds, and the file primitives.

:class:`Checkpointer` keeps the newest ``max_to_keep`` files, falls back past
damaged ones (named in one warning, renamed ``*.damaged``), rolls back what a
checkpoint that does not fit had changed, and under ``torchrun`` gathers each
rank's own part to rank 0 (which alone writes) and hands it back on restore.
Files are written atomically (temp file, ``fsync``, rename: a ``SIGKILL``
leaves the old file or the new one) and read with
``torch.load(weights_only=True)`` (RNG states and pickled environments are
stored as tensors and plain values).
"""

import copy
import glob
import os
import tempfile
import zipfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from absl import logging

from alf_entropy.utils import distributed, nest, schedulers
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.seeding import rng_state, set_rng_state

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "REQUIRED_KEYS",
    "atomic_write_bytes",
    "checkpoints_newest_first",
    "bytes_to_tensor",
    "latest_checkpoint",
    "load_checkpoint",
    "tensor_to_bytes",
]

REQUIRED_KEYS = ("iteration", "env_steps", "progress", "algorithm", "optimizers", "rng")
"""The keys every checkpoint written by a trainer holds."""


class CheckpointError(ValueError):
    """A checkpoint cannot be read or written, or does not fit the run."""


def atomic_write_bytes(path: str, write: Callable[[Any], None]) -> None:
    """Write ``path`` atomically: ``write(f)`` (a binary file) into a temp file, ``fsync``,
    rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):  # the write failed
            os.remove(tmp)


def checkpoints_newest_first(checkpoint_dir: str) -> List[str]:
    """The ``ckpt-<iteration>.pt`` files in ``checkpoint_dir`` (may be missing), newest first."""
    paths = glob.glob(os.path.join(checkpoint_dir, "ckpt-[0-9]*.pt"))
    return sorted(paths, key=lambda path: (len(path), path), reverse=True)  # 8 digits or more


def latest_checkpoint(checkpoint_dir: str) -> Optional[str]:
    """The newest checkpoint in ``checkpoint_dir`` (temp files ignored), or ``None``."""
    return next(iter(checkpoints_newest_first(checkpoint_dir)), None)


def load_checkpoint(path: str) -> Dict[str, Any]:
    """Read a checkpoint :meth:`Checkpointer.save` wrote onto the CPU.

    Raises:
        CheckpointError: if it cannot be read (truncated, not a checkpoint) or lacks one
            of :data:`REQUIRED_KEYS`.
    """
    if os.path.isfile(path) and not zipfile.is_zipfile(path):  # what torch.save writes
        raise CheckpointError(
            f"{path} cannot be read: it is not a checkpoint (not a whole "
            "archive as torch.save writes one: truncated, or another file)"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch.load raises many types for a damaged file
        # The first sentence: torch's zip errors go on for several more.
        message = " ".join(str(e).split()).split(". ")[0][:200]
        raise CheckpointError(f"{path} cannot be read ({type(e).__name__}: {message})") from e
    missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{path} is not a complete checkpoint: it lacks {', '.join(missing)}")
    return state


def bytes_to_tensor(data: bytes) -> torch.Tensor:
    """``data`` as a 1-D ``uint8`` tensor (storable with ``weights_only``)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes :func:`bytes_to_tensor` stored."""
    return tensor.cpu().numpy().tobytes()


_RANK_KEYS = ("rng", "env", "extra")  # each rank's own part of a checkpoint


def _move_aside(path):
    """Rename a checkpoint that was skipped to ``<path>.damaged`` (``.damaged.N`` if taken)."""
    target, k = f"{path}.damaged", 0
    while os.path.exists(target):
        k += 1
        target = f"{path}.damaged.{k}"
    try:
        os.replace(path, target)
    except OSError as e:  # it stays counted, but the run goes on
        return f"{path} (not moved: {e.strerror or e})"
    return target


class Checkpointer:
    """Saves and restores a run's ``ckpt-<iteration>.pt`` files in ``checkpoint_dir``,
    keeping the newest ``max_to_keep``.

    A checkpoint holds ``iteration``, ``env_steps``, the scheduler ``progress``, the
    ``algorithm``'s and its ``optimizers``' state dicts, rank 0's own ``rng``, ``env``
    and ``extra``, and ``world_size`` and ``rank_states`` (the other ranks' parts).
    """

    def __init__(self, checkpoint_dir: str, max_to_keep: int = 3):
        self.checkpoint_dir = checkpoint_dir
        self._max_to_keep = check_int("max_checkpoints", max_to_keep, minimum=1)

    def path(self, iteration: int) -> str:
        """The file of the checkpoint of ``iteration``: ``ckpt-<iteration:08d>.pt``."""
        return os.path.join(self.checkpoint_dir, f"ckpt-{iteration:08d}.pt")

    def save(self, iteration: int, env_steps: int, algorithm: Any, own: Dict[str, Any]) -> str:
        """Write a checkpoint atomically, keeping the newest ``max_to_keep`` (every rank
        calls it; rank 0 writes); ``own`` is this rank's ``env`` and ``extra`` (its ``rng``
        is added here).  Returns the path.

        Raises:
            CheckpointError: if it cannot be written (the earlier ones are intact).
        """
        own = nest.map_structure(
            lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, dict(own, rng=rng_state())
        )
        ranks, path = distributed.gather_object(own), self.path(iteration)
        if not distributed.is_main_process():
            return path
        state = dict(
            iteration=iteration,
            env_steps=env_steps,
            progress=schedulers.get_all_progress(),
            algorithm=algorithm.state_dict(),
            optimizers=[opt.state_dict() for opt in algorithm.optimizers()],
            **ranks[0],
            world_size=len(ranks),
            rank_states=ranks[1:],
        )
        try:  # what torch.load(weights_only=True) reads
            atomic_write_bytes(path, lambda f: torch.save(state, f))
        except OSError as e:
            raise CheckpointError(
                f"cannot write checkpoint {path}: {e.strerror or e} (errno {e.errno}); the "
                f"earlier checkpoints in {self.checkpoint_dir} are intact"
            ) from e
        for old in checkpoints_newest_first(self.checkpoint_dir)[self._max_to_keep :]:
            os.remove(old)
        return path

    def restore_newest(
        self, algorithm: Any, load_own: Callable[[Dict[str, Any]], None]
    ) -> Optional[Tuple[str, Dict[str, Any]]]:
        """Restore the newest checkpoint that loads and fits (``load_own`` loads this
        rank's ``env`` and ``extra`` or raises); the newer ones are named and moved aside.

        Returns:
            ``(path, state)`` of the restored checkpoint, ``None`` if there is none.

        Raises:
            CheckpointError: if there are checkpoints and none can be restored (none moved).
        """
        main = distributed.is_main_process()
        paths = distributed.broadcast_object(
            checkpoints_newest_first(self.checkpoint_dir) if main else []
        )
        skipped = []
        for path in paths:
            try:
                state = self.restore(path, algorithm, load_own)
            except CheckpointError as e:
                skipped.append(str(e))
                continue
            if skipped:
                # Out of the ckpt-*.pt pattern: kept as evidence, not among max_to_keep.
                moved = [_move_aside(p) for p in paths[: len(skipped)]] if main else []
                logging.warning(
                    "Skipped %d damaged checkpoint(s) (moved aside: %s): %s; resumed from %s "
                    "instead",
                    len(skipped),
                    ", ".join(moved),
                    " | ".join(skipped),
                    path,
                )
            return path, state
        if skipped:
            raise CheckpointError(
                f"no checkpoint in {self.checkpoint_dir} can be loaded (left in place): "
                f"{' | '.join(skipped)}; move them away to start afresh, or use a new --root_dir"
            )
        return None

    def restore(
        self, path: str, algorithm: Any, load_own: Callable[[Dict[str, Any]], None]
    ) -> Dict[str, Any]:
        """Restore ``path`` on every rank, all or nothing: the algorithm, its optimisers,
        the rank's own part (``load_own``), then the progress and RNGs.  Returns this
        rank's state.

        Raises:
            CheckpointError: if the file cannot be read or a part does not fit on any rank
                (every rank raises; the algorithm and optimisers are put back).
        """
        state, error = None, None
        if distributed.is_main_process():
            try:
                state = load_checkpoint(path)
            except CheckpointError as e:
                state = e  # raised on every rank
        state = self._share(path, state)
        stateful = [algorithm, *algorithm.optimizers()]
        saved = [copy.deepcopy(obj.state_dict()) for obj in stateful]
        try:
            if len(stateful) != 1 + len(state["optimizers"]):
                raise ValueError(
                    f"{len(state['optimizers'])} optimizers saved, {len(stateful) - 1} now"
                )
            for obj, obj_state in zip(stateful, [state["algorithm"], *state["optimizers"]]):
                obj.load_state_dict(obj_state)
            load_own(state)  # last: a replay buffer is swapped in only if all else fits
        except Exception as e:  # any failure: a damaged or foreign checkpoint
            error = f"{path} does not match this run: {' '.join(str(e).split())[:300]}"
        # A rank's own part (its buffer) may fail alone: every rank rolls back if any failed.
        if distributed.broadcast_object(any(distributed.gather_object(error) or [])):
            for obj, obj_state in zip(stateful, saved):
                obj.load_state_dict(obj_state)
            raise CheckpointError(error or f"{path}: another rank could not restore its part")
        schedulers.set_all_progress(state["progress"])
        if state["rng"] is not None:
            set_rng_state(state["rng"])
        return state

    @staticmethod
    def _share(path, state):
        """Rank 0's ``state`` on every rank, each with its own part (none from a
        checkpoint of another number of ranks: fresh RNGs, episodes restart); rank 0's
        ``CheckpointError`` raised on every rank."""
        per_rank, world = None, distributed.world_size()
        if isinstance(state, dict):  # rank 0's, read
            per_rank = [{k: state.pop(k, None) for k in _RANK_KEYS}] + state.pop("rank_states", [])
            if state.pop("world_size", 1) != world:
                logging.warning(
                    "%s was written by %d rank(s), this run has %d: networks, optimisers, "
                    "controllers and progress are restored, the ranks' RNG and environment "
                    "state are not (episodes restart; not bit-exact).",
                    path,
                    len(per_rank),
                    world,
                )
                per_rank = [{"rng": None, "env": {}, "extra": {}}] * world
        state = distributed.broadcast_object(state)
        if isinstance(state, CheckpointError):
            raise state
        state.update(distributed.scatter_object(per_rank))
        return state
