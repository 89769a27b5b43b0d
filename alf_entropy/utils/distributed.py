"""Data-parallel helpers over ``torch.distributed`` for runs under ``torchrun``.

:func:`init_from_env` turns torchrun's ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` into a process group (gloo
on the CPU, NCCL with ``cuda:LOCAL_RANK``) whose collectives give up after
``timeout_s`` (else ``$ALF_ENTROPY_DIST_TIMEOUT_S``, else 300 s) with a
:class:`DistributedError`, so a dead or hung rank does not hang the others.
Everything else is a no-op in one process, so the training code calls it
unconditionally: the pooled entropy statistic (:func:`all_reduce_masked_mean`),
gradient averaging (:func:`all_reduce_gradients_`, DDP without wrapping),
rank 0's parameters (:func:`broadcast_module_`) and picklable objects
(:func:`gather_object`, :func:`scatter_object`, :func:`broadcast_object`).
"""

import datetime
import os
from typing import Any, Callable, Iterable, List, Optional, Tuple, TypeVar

import torch
import torch.distributed as dist
import torch.nn as nn

from alf_entropy.utils.checks import check_real

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_ENV",
    "DistributedError",
    "env_world_size",
    "init_from_env",
    "shutdown",
    "is_distributed",
    "world_size",
    "rank",
    "rank_device",
    "is_main_process",
    "all_reduce_masked_mean",
    "all_reduce_mean",
    "all_reduce_sum",
    "all_reduce_gradients_",
    "broadcast_module_",
    "broadcast_object",
    "gather_object",
    "scatter_object",
    "barrier",
]

DEFAULT_TIMEOUT_S = 300.0
"""Seconds a collective waits for the other ranks before failing."""

TIMEOUT_ENV = "ALF_ENTROPY_DIST_TIMEOUT_S"
"""Environment variable overriding :data:`DEFAULT_TIMEOUT_S`."""

_timeout_s = DEFAULT_TIMEOUT_S
T = TypeVar("T")


class DistributedError(RuntimeError):
    """A collective failed: another rank died, hung past the timeout or left."""


def _env_int(name: str, default: Optional[int] = None) -> int:
    value = os.environ.get(name)
    if not value:  # unset or empty
        if default is None:
            raise ValueError(f"environment variable {name} must be set (torchrun sets it)")
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def env_world_size() -> int:
    """``$WORLD_SIZE`` (1 when unset): how many ranks the launcher started."""
    n = _env_int("WORLD_SIZE", 1)
    if n < 1:
        raise ValueError(f"environment variable WORLD_SIZE must be >= 1, got {n}")
    return n


def rank_device(device: torch.device) -> torch.device:
    """This rank's device (also before :func:`init_from_env`): ``cuda:LOCAL_RANK`` for a
    CUDA ``device`` when ``WORLD_SIZE > 1``, else ``device``."""
    device = torch.device(device)
    if device.type == "cuda" and env_world_size() > 1:
        return torch.device("cuda", _env_int("LOCAL_RANK", _env_int("RANK")))
    return device


def _resolve_timeout(timeout_s: Optional[float]) -> float:
    source = "timeout_s"
    if timeout_s is None:
        env = os.environ.get(TIMEOUT_ENV)
        if not env:  # unset or empty
            return DEFAULT_TIMEOUT_S
        source = TIMEOUT_ENV
        try:
            timeout_s = float(env)
        except ValueError:
            raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {env!r}") from None
    return check_real(f"{source} (seconds)", timeout_s, positive=True)


def init_from_env(device: torch.device, timeout_s: Optional[float] = None) -> torch.device:
    """Join torchrun's process group once (nothing with ``WORLD_SIZE`` 1) and return this
    rank's device: NCCL on ``cuda:LOCAL_RANK`` for a CUDA ``device``, else gloo.

    Args:
        device: ``cpu`` or ``cuda`` (an index is replaced by ``LOCAL_RANK``).
        timeout_s: how long a collective waits for the other ranks (see the module).

    Raises:
        ValueError: torchrun's variables missing or inconsistent, a bad timeout, or fewer
            GPUs than local ranks.
        DistributedError: if the other ranks do not join within the timeout.
    """
    global _timeout_s
    device = torch.device(device)
    n = env_world_size()
    if n == 1:
        return device
    rank_ = _env_int("RANK")
    local = _env_int("LOCAL_RANK", rank_)
    if not 0 <= rank_ < n:
        raise ValueError(f"environment variable RANK must be in [0, {n}), got {rank_}")
    if local < 0:
        raise ValueError(f"environment variable LOCAL_RANK must be >= 0, got {local}")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise ValueError(f"environment variable {name} must be set (torchrun sets it)")
    if device.type == "cuda":
        device = rank_device(device)
        if local >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK {local} needs GPU {local}, but only {torch.cuda.device_count()} "
                "are visible: start at most one rank per GPU (--nproc_per_node)"
            )
        torch.cuda.set_device(device)
        backend = "nccl"
    elif device.type == "cpu":
        backend = "gloo"
    else:
        raise ValueError(f"device must be a cpu or cuda device, got {device}")
    if dist.is_initialized():
        if dist.get_world_size() != n or dist.get_backend() != backend:
            raise ValueError(
                f"a process group ({dist.get_backend()}, {dist.get_world_size()} ranks) "
                f"already exists; wanted {backend} with {n} ranks"
            )
        return device
    _timeout_s = _resolve_timeout(timeout_s)
    try:
        dist.init_process_group(
            backend,
            init_method="env://",
            rank=rank_,
            world_size=n,
            timeout=datetime.timedelta(seconds=_timeout_s),
            **({"device_id": device} if backend == "nccl" else {}),
        )
    except RuntimeError as e:  # includes dist.DistError
        raise DistributedError(
            f"rank {rank_}/{n}: could not join the process group at "
            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} within {_timeout_s:g}s: {e}"
        ) from e
    return device


def shutdown() -> None:
    """Leave the process group, if one was created (safe to call always)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_distributed() -> bool:
    """Whether a process group with more than one rank is initialised."""
    return world_size() > 1


def world_size() -> int:
    """The number of ranks (1 without a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main_process() -> bool:
    """True on rank 0 (and in a single process): the one that writes files."""
    return rank() == 0


def _collective(what: str, fn: Callable[[], T]) -> T:
    """Run a collective, turning a backend failure into a clear error."""
    try:
        return fn()
    except RuntimeError as e:  # includes dist.DistError
        raise DistributedError(
            f"rank {rank()}/{world_size()}: {what} failed: another rank died, left, or did "
            f"not reach the same point within the {_timeout_s:g}s timeout ({TIMEOUT_ENV}). "
            f"Cause: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from e


def all_reduce_masked_mean(
    mean: torch.Tensor, count: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The mean and count of every rank's elements, the same bits on every rank.

    With ``count`` (0-d int; ``mean`` may be anything where it is 0) the sums and
    counts are all-reduced in one float64 collective (NaN if a rank's elements hold
    one); with ``count=None`` each rank's 0-d ``mean`` weighs the same.  Returned in
    the input dtypes.
    """
    if not is_distributed():
        return mean, count
    if count is None:
        return all_reduce_mean(mean), None
    n = count.to(torch.float64)
    total = torch.where(n > 0, mean.detach().to(torch.float64) * n, 0.0)
    packed = torch.stack([total, n])
    _collective("all_reduce of the entropy statistic", lambda: dist.all_reduce(packed))
    total, n = packed.unbind()
    return (total / n.clamp(min=1)).to(mean.dtype), n.to(count.dtype)


def all_reduce_sum(value: torch.Tensor, what: str = "all_reduce of a sum") -> torch.Tensor:
    """The element-wise sum over all ranks (``what`` names it in a failure's message)."""
    if not is_distributed():
        return value
    value = value.clone()
    _collective(what, lambda: dist.all_reduce(value))
    return value


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """The element-wise mean over all ranks."""
    if not is_distributed():
        return value
    return all_reduce_sum(value.detach(), "all_reduce of a mean") / dist.get_world_size()


def all_reduce_gradients_(params: Iterable[nn.Parameter]) -> Optional[torch.Tensor]:
    """Average ``.grad`` over all ranks in place, one collective per dtype and device (a
    missing gradient counts as zeros, so every rank steps the same parameters).

    Returns:
        None in one process; else a 0-d bool tensor, the same on every rank: whether
        the averaged gradients are all finite.
    """
    if not is_distributed():
        return None
    params = [p for p in params if p.requires_grad]
    groups = {}
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        groups.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    n = dist.get_world_size()
    finite = None
    for group in groups.values():
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        _collective("all_reduce of the gradients", lambda f=flat: dist.all_reduce(f))
        flat.div_(n)
        ok = torch.isfinite(flat).all()
        finite = ok if finite is None else finite & ok.to(finite.device)
        offset = 0
        for p in group:
            k = p.grad.numel()
            p.grad.copy_(flat[offset : offset + k].view_as(p.grad))
            offset += k
    return finite if finite is not None else torch.ones((), dtype=torch.bool)


def broadcast_module_(module: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers into ``module`` (built alike) on every rank."""
    if not is_distributed():
        return
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            _collective("broadcast of the model", lambda t=t: dist.broadcast(t.data, src))


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank ``src``'s picklable ``obj`` on every rank."""
    if not is_distributed():
        return obj
    box = [obj]
    _collective("broadcast of an object", lambda: dist.broadcast_object_list(box, src))
    return box[0]


def gather_object(obj: Any) -> Optional[List[Any]]:
    """Every rank's picklable ``obj`` as a list on rank 0 (``[obj]`` in one process), None
    on the other ranks."""
    if not is_distributed():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    _collective("gather of per-rank state", lambda: dist.gather_object(obj, out, dst=0))
    return out


def scatter_object(objs: Optional[List[Any]], src: int = 0) -> Any:
    """Rank ``r`` gets ``objs[r]`` of rank ``src`` (``objs`` ignored elsewhere)."""
    if not is_distributed():
        return objs[0]
    out = [None]
    send = objs if dist.get_rank() == src else None
    _collective("scatter of per-rank state", lambda: dist.scatter_object_list(out, send, src))
    return out[0]


def barrier() -> None:
    """Wait for every rank (no-op in one process)."""
    if is_distributed():
        _collective("barrier", dist.barrier)
