"""ALF's PyTorch ``EntropyTargetAlgorithm.adjust_alpha``, transliterated.

This is the specification (``shared/seed/entropy_target_algorithm_history.txt``,
last version) turned into a standalone oracle for parity tests: the same
tensor ops, dtypes and sequential ``if`` checks (Python branching and all), and
ALF's ``ScalarWindowAverager`` (circular buffer, ``sum * (1 / n)``).  It is test
code only; the package never branches on tensor values.
"""

from typing import Callable, Union

import numpy as np
import torch


class SeedWindowAverager:
    """ALF's ``ScalarWindowAverager`` (DataBuffer semantics)."""

    def __init__(self, window_size: int):
        self.buf = torch.zeros(window_size)
        self.window_size = window_size
        self.current_size = torch.tensor(0)
        self.pos = 0

    def get(self) -> torch.Tensor:
        n = torch.max(self.current_size, torch.as_tensor(1)).to(torch.float32)
        return torch.sum(self.buf[: int(self.current_size)], dim=0) * (1.0 / n)

    def average(self, x: torch.Tensor) -> torch.Tensor:
        self.buf[self.pos] = x
        self.pos = (self.pos + 1) % self.window_size
        self.current_size = torch.clamp(self.current_size + 1, max=self.window_size)
        return self.get()


class SeedController:
    """The seed's state machine, with its dtypes (float64 numpy constants)."""

    def __init__(
        self,
        initial_alpha=0.1,
        skip_free_stage=False,
        max_entropy=None,
        target_entropy: Union[float, Callable[[], float]] = 0.5,
        very_slow_update_rate=0.001,
        slow_update_rate=0.01,
        fast_update_rate=np.log(2),
        min_alpha=1e-4,
        average_window=2,
    ):
        self.log_alpha = torch.tensor(np.log(initial_alpha), dtype=torch.float32)
        self.stage = torch.tensor(-2, dtype=torch.int32)
        self.avg_entropy = SeedWindowAverager(average_window)
        self.update_rate = torch.tensor(fast_update_rate, dtype=torch.float32)
        # The seed's code: log(min_alpha) for min_alpha >= 0 (-inf at 0); its
        # docstring (which we follow): exp(-100) for min_alpha <= 0.
        self.min_log_alpha = torch.tensor(np.log(min_alpha) if min_alpha > 0 else -100.0)
        if not callable(target_entropy):
            value = target_entropy
            target_entropy = lambda: value  # noqa: E731
        if max_entropy is None:
            max_entropy = 0.0
            self.stage.fill_(-2 - average_window)
        self.max_entropy = torch.tensor(max_entropy, dtype=torch.float32)
        if skip_free_stage:
            self.stage.fill_(1)
        self.target_entropy = target_entropy
        self.very_slow_update_rate = very_slow_update_rate
        self.slow_update_rate = torch.tensor(slow_update_rate)
        self.fast_update_rate = torch.tensor(fast_update_rate)

    def adjust_alpha(self, entropy: torch.Tensor) -> torch.Tensor:
        prev_avg_entropy = self.avg_entropy.get()
        avg_entropy = self.avg_entropy.average(entropy)
        target_entropy = self.target_entropy()
        if target_entropy > 0:
            fast_stage_thresh = 0.5 * target_entropy
        else:
            fast_stage_thresh = 2.0 * target_entropy

        if self.stage < -2:
            self.max_entropy.fill_(torch.min(0.8 * avg_entropy, avg_entropy / 0.8))
            self.stage.add_(1)
        if self.stage == -2:
            below = avg_entropy < self.max_entropy
            decreasing = (avg_entropy < prev_avg_entropy).type(torch.float32)
            update_rate = (-1 + 1.5 * decreasing) * self.very_slow_update_rate
            self.stage.add_(below.type(torch.int32))
            self.log_alpha.fill_(torch.max(self.log_alpha + update_rate, self.min_log_alpha))
        if self.stage == -1:
            crossing = avg_entropy < target_entropy
            self.stage.add_(crossing.type(torch.int32))
        if self.stage >= 0:
            previous_above = self.stage.type(torch.bool)
            above = avg_entropy > target_entropy
            self.stage.fill_(above.type(torch.int32))
            crossing = above != previous_above
            update_rate = self.update_rate
            update_rate = torch.where(crossing, 0.9 * update_rate, update_rate)
            update_rate = torch.max(update_rate, self.slow_update_rate)
            update_rate = torch.where(
                entropy < fast_stage_thresh, self.fast_update_rate, update_rate
            )
            self.update_rate.fill_(update_rate)
            above = above.type(torch.float32)
            below = 1 - above
            decreasing = (avg_entropy < prev_avg_entropy).type(torch.float32)
            increasing = 1 - decreasing
            log_alpha = (
                self.log_alpha
                + ((below + 0.5 * above) * decreasing - (above + 0.5 * below) * increasing)
                * update_rate
            )
            log_alpha = torch.max(log_alpha, self.min_log_alpha)
            self.log_alpha.fill_(log_alpha)
        return torch.exp(self.log_alpha)

    def calc_loss_entropy(self, neg_entropy, step_type, valid_mask=None):
        """The seed's ``calc_loss`` statistics, with ``if valid_mask`` fixed."""
        mask = (step_type != 2).type(torch.float32)
        if valid_mask is not None:
            mask = mask * valid_mask.type(torch.float32)
        entropy = -neg_entropy * mask
        num = torch.sum(mask)
        if num > 0:
            self.adjust_alpha(torch.sum(entropy) / num)
        return torch.exp(self.log_alpha)
