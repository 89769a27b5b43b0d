"""``EpisodeReturnTracker``: episode returns and lengths without host syncs.

``update(time_step)`` runs every environment step on the training path, so it
only does tensor arithmetic on the device, and as little as possible: it
accumulates each env's return and length and remembers (as references to the
new tensors) which envs finished and with what return and length.  Every
``flush_steps`` updates, and whenever the finished episodes are read, those
steps are scattered in one go into a fixed-size ring buffer (positions come
from a cumulative sum, so no count is read on the host).  ``pop_finished()``
is meant for summary time: it reads the buffer (one sync) and empties it.

Conventions (ALF's): the reward of a ``FIRST`` step is not part of any
episode; an episode's return is the sum of the rewards of its ``MID`` and
``LAST`` steps and its length is their number (= the number of actions,
gymnasium's episode length).
"""
from typing import Any, List, Tuple

import torch

from alf_entropy.data_structures import StepType, TimeStep

__all__ = ["EpisodeReturnTracker"]


class EpisodeReturnTracker:
    """Track per-env episode returns/lengths and the finished episodes.

    Args:
        num_envs: the batch size ``B`` of the time steps.
        device: device of the accumulators (that of the time steps).
        capacity: how many finished episodes are kept between two
            ``pop_finished`` calls; older ones are dropped beyond that.
        flush_steps: how many updates are batched before their finished
            episodes are written to the ring buffer (a memory/speed trade-off
            with no effect on the results).

    Raises:
        ValueError: if ``num_envs``, ``capacity`` or ``flush_steps`` is not a
            positive int.
    """

    def __init__(
        self, num_envs: int, device: Any = "cpu", capacity: int = 1024, flush_steps: int = 256
    ):
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if isinstance(flush_steps, bool) or not isinstance(flush_steps, int) or flush_steps < 1:
            raise ValueError(f"flush_steps must be a positive int, got {flush_steps!r}")
        self._num_envs = num_envs
        self._batch_shape = torch.Size([num_envs])
        self._capacity = capacity
        device = torch.device(device)
        self._episode_return = torch.zeros(num_envs, dtype=torch.float32, device=device)
        self._episode_length = torch.zeros(num_envs, dtype=torch.int64, device=device)
        # One extra slot: envs that did not finish write there (then ignored).
        self._returns = torch.zeros(capacity + 1, dtype=torch.float32, device=device)
        self._lengths = torch.zeros(capacity + 1, dtype=torch.int64, device=device)
        self._count = torch.zeros((), dtype=torch.int64, device=device)
        # ``(last, episode_return, episode_length)`` of the updates not yet
        # written to the ring buffer (each a ``[B]`` tensor no one modifies).
        self._flush_steps = flush_steps
        self._pending: List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    @property
    def num_envs(self) -> int:
        """The batch size ``B``."""
        return self._num_envs

    @property
    def episode_return(self) -> torch.Tensor:
        """Return so far of each env's current episode, ``[B]`` float32."""
        return self._episode_return

    @property
    def episode_length(self) -> torch.Tensor:
        """Length so far of each env's current episode, ``[B]`` int64."""
        return self._episode_length

    @property
    def num_finished(self) -> torch.Tensor:
        """Episodes finished since the last ``pop_finished`` (int64 scalar tensor)."""
        self._flush()
        return self._count

    def update(self, time_step: TimeStep) -> None:
        """Account for one batched time step (no host sync).

        Args:
            time_step: a ``TimeStep`` whose ``step_type`` and ``reward`` are
                ``[B]`` tensors.

        Raises:
            ValueError: if ``step_type``/``reward`` are not of shape ``[B]``.
        """
        step_type = time_step.step_type
        reward = time_step.reward
        if step_type.shape != self._batch_shape or reward.shape != self._batch_shape:
            expected = (self._num_envs,)
            raise ValueError(
                f"time_step.step_type and reward must have shape {expected}, got "
                f"{tuple(step_type.shape)} and {tuple(reward.shape)}"
            )
        # ``.to`` returns the tensor itself when device and dtype already match.
        step_type = step_type.to(self._count.device)
        reward = reward.to(device=self._count.device, dtype=torch.float32)
        first = step_type == StepType.FIRST
        # Python-scalar ``torch.where`` branches: no zero tensors to allocate,
        # and the dtypes stay float32 / int64.  Both accumulators are rebound
        # to new tensors (never modified in place), so the references kept in
        # ``_pending`` stay valid.
        self._episode_return = torch.where(first, 0.0, self._episode_return + reward)
        self._episode_length = torch.where(first, 0, self._episode_length + 1)
        self._pending.append(
            (step_type == StepType.LAST, self._episode_return, self._episode_length)
        )
        if len(self._pending) >= self._flush_steps:
            self._flush()

    def _flush(self) -> None:
        """Write the finished episodes of the pending updates to the ring buffer.

        The pending ``[B]`` tensors are stacked into ``[K * B]`` (step-major,
        so completion order, by env index within a step).  Finished episode
        ``k`` (1-based, in that order) goes to ring position
        ``(count + k - 1) % capacity``; of this batch only the ``capacity``
        most recent are written (older ones would be overwritten anyway) so
        that no position is written twice.  Everything else writes to the
        spare slot.  No host sync.
        """
        if not self._pending:
            return
        lasts, returns, lengths = zip(*self._pending)
        self._pending = []
        last = torch.cat(lasts)
        finished = torch.cumsum(last, 0)  # int64 (cumsum of bool)
        total = finished[-1]
        keep = last & (total - finished < self._capacity)
        position = (finished + (self._count - 1)) % self._capacity
        index = torch.where(keep, position, self._capacity)
        self._returns.index_put_((index,), torch.cat(returns))
        self._lengths.index_put_((index,), torch.cat(lengths))
        self._count = self._count + total

    def pop_finished(self) -> Tuple[List[float], List[int]]:
        """Return and forget the episodes finished since the last call.

        This reads tensors on the host (call it at summary time only).

        Returns:
            ``(returns, lengths)``: Python lists in completion order (within
            one step, by env index); at most ``capacity`` most recent ones.
        """
        self._flush()
        count = int(self._count.item())
        n = min(count, self._capacity)
        start = (count - n) % self._capacity
        order = [(start + k) % self._capacity for k in range(n)]
        returns = self._returns[order].tolist() if n else []
        lengths = self._lengths[order].tolist() if n else []
        self._count.zero_()
        return returns, lengths

    def reset(self) -> None:
        """Forget the running episodes and the finished ones."""
        self._pending = []
        self._episode_return.zero_()
        self._episode_length.zero_()
        self._count.zero_()
