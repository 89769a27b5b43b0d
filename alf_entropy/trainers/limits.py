"""The training limits (ALF's ``TrainerConfig`` rule) and the progress they define.

``num_iterations`` and ``num_env_steps`` may both be given, 0 or ``None``
meaning no limit from that one; at least one must be positive, and training
stops as soon as either is reached.  The scheduler progress
(:mod:`alf_entropy.utils.schedulers`) is the fraction of the binding limit,
so a scheduled value spans the whole run whichever limit ends it.
"""
import math
from typing import Optional

from alf_entropy.utils import schedulers
from alf_entropy.utils.checks import check_int

__all__ = ["Limits"]


class Limits:
    """When a run ends (ALF's rule): at ``num_iterations`` or ``num_env_steps``, the first reached.

    Args:
        num_iterations: 0 or ``None``: no limit from it.
        num_env_steps: 0 or ``None``: no limit from it (whole iterations: rounded up).
        steps_per_iteration: env steps one iteration takes.

    Raises:
        ValueError: for a negative limit, or no positive one.
    """

    def __init__(self, num_iterations: Optional[int], num_env_steps: Optional[int],
                 steps_per_iteration: int):
        no_limit = "0 or None: no limit"
        self.num_iterations = check_int("num_iterations", num_iterations, minimum=0,
                                        allow_none=True, none_means=no_limit) or 0
        self.num_env_steps = check_int("num_env_steps", num_env_steps, minimum=0,
                                       allow_none=True, none_means=no_limit) or 0
        if not (self.num_iterations or self.num_env_steps):
            raise ValueError(
                "at least one of num_iterations and num_env_steps must be positive (0 or "
                f"None means no limit), got num_iterations={num_iterations!r}, "
                f"num_env_steps={num_env_steps!r}"
            )
        self.steps_per_iteration = check_int("steps_per_iteration", steps_per_iteration,
                                             minimum=1)
        self.total_iterations = min(n for n in (
            self.num_iterations, math.ceil(self.num_env_steps / steps_per_iteration)) if n)

    def reached(self, iteration: int, env_steps: int) -> Optional[str]:
        """The limit reached (e.g. ``"num_iterations = 3"``), or ``None``."""
        if self.num_iterations and iteration >= self.num_iterations:
            return f"num_iterations = {self.num_iterations}"
        if self.num_env_steps and env_steps >= self.num_env_steps:
            return f"num_env_steps = {self.num_env_steps}"
        return None

    def percent(self, iteration: int, env_steps: int) -> float:
        """The fraction of the binding limit done (the larger fraction, at most 1)."""
        return min(1.0, max(done / limit for done, limit in (
            (iteration, self.num_iterations), (env_steps, self.num_env_steps)) if limit))

    def update_progress(self, iteration: int, env_steps: int) -> None:
        """Set the scheduler progress (``iterations``, ``env_steps``, ``percent``, ...)."""
        for name, value in (("iterations", iteration), ("env_steps", env_steps),
                            ("percent", self.percent(iteration, env_steps)),
                            ("global_counter", iteration)):
            schedulers.update_progress(name, value)
