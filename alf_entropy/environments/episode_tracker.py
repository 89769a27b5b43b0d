"""``EpisodeReturnTracker``: episode returns and lengths without host syncs.

``update(time_step)`` runs every environment step on the training path, so it
only does tensor arithmetic on the device: it accumulates each env's return
and length and, for envs whose step is ``LAST``, scatters the finished
episode's return and length into a fixed-size ring buffer (positions come
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

    Raises:
        ValueError: if ``num_envs`` or ``capacity`` is not a positive int.
    """

    def __init__(self, num_envs: int, device: Any = "cpu", capacity: int = 1024):
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self._num_envs = num_envs
        self._capacity = capacity
        device = torch.device(device)
        self._episode_return = torch.zeros(num_envs, dtype=torch.float32, device=device)
        self._episode_length = torch.zeros(num_envs, dtype=torch.int64, device=device)
        # One extra slot: envs that did not finish write there (then ignored).
        self._returns = torch.zeros(capacity + 1, dtype=torch.float32, device=device)
        self._lengths = torch.zeros(capacity + 1, dtype=torch.int64, device=device)
        self._count = torch.zeros((), dtype=torch.int64, device=device)

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
        expected = (self._num_envs,)
        if tuple(step_type.shape) != expected or tuple(reward.shape) != expected:
            raise ValueError(
                f"time_step.step_type and reward must have shape {expected}, got "
                f"{tuple(step_type.shape)} and {tuple(reward.shape)}"
            )
        step_type = step_type.to(self._count.device)
        reward = reward.to(device=self._count.device, dtype=torch.float32)
        first = step_type == StepType.FIRST
        last = step_type == StepType.LAST
        self._episode_return = torch.where(
            first, torch.zeros_like(self._episode_return), self._episode_return + reward
        )
        self._episode_length = torch.where(
            first, torch.zeros_like(self._episode_length), self._episode_length + 1
        )
        last_i = last.to(torch.int64)
        position = (self._count + torch.cumsum(last_i, 0) - 1) % self._capacity
        index = torch.where(last, position, torch.full_like(position, self._capacity))
        self._returns.index_put_((index,), self._episode_return)
        self._lengths.index_put_((index,), self._episode_length)
        self._count = self._count + last_i.sum()

    def pop_finished(self) -> Tuple[List[float], List[int]]:
        """Return and forget the episodes finished since the last call.

        This reads tensors on the host (call it at summary time only).

        Returns:
            ``(returns, lengths)``: Python lists in completion order (within
            one step, by env index); at most ``capacity`` most recent ones.
        """
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
        self._episode_return.zero_()
        self._episode_length.zero_()
        self._count.zero_()
