"""When a run ends (ALF's ``TrainerConfig`` rule) and the scheduler progress it defines."""

import math
from typing import Optional

from alf_entropy.utils import schedulers
from alf_entropy.utils.checks import check_int

__all__ = ["Limits"]


class Limits:
    """At ``num_iterations`` or ``num_env_steps`` (whole iterations of ``steps_per_iteration``
    env steps), the first reached; 0 or ``None`` is no limit from it.  The progress is the
    binding limit's fraction.

    Raises:
        ValueError: for a negative limit, or no positive one.
    """

    def __init__(
        self, num_iterations: Optional[int], num_env_steps: Optional[int], steps_per_iteration: int
    ):
        no = "0 or None: no limit"
        self.num_iterations = (
            check_int("num_iterations", num_iterations, minimum=0, allow_none=True, none_means=no)
            or 0
        )
        self.num_env_steps = (
            check_int("num_env_steps", num_env_steps, minimum=0, allow_none=True, none_means=no)
            or 0
        )
        if not (self.num_iterations or self.num_env_steps):
            raise ValueError(
                "at least one of num_iterations and num_env_steps must be positive "
                f"(0 or None means no limit), got num_iterations={num_iterations!r}"
                f", num_env_steps={num_env_steps!r}"
            )
        self.steps_per_iteration = steps_per_iteration
        self.total_iterations = min(
            n
            for n in (self.num_iterations, math.ceil(self.num_env_steps / steps_per_iteration))
            if n
        )

    def reached(self, iteration: int, env_steps: int) -> Optional[str]:
        """The limit reached (e.g. ``"num_iterations = 3"``), or ``None``."""
        if self.num_iterations and iteration >= self.num_iterations:
            return f"num_iterations = {self.num_iterations}"
        if self.num_env_steps and env_steps >= self.num_env_steps:
            return f"num_env_steps = {self.num_env_steps}"
        return None

    def update_progress(self, iteration: int, env_steps: int) -> None:
        """Set the scheduler progress (``iterations``, ``env_steps``, ``percent``, ...)."""
        percent = min(
            1.0,
            max(
                done / limit
                for done, limit in (
                    (iteration, self.num_iterations),
                    (env_steps, self.num_env_steps),
                )
                if limit
            ),
        )
        schedulers.set_all_progress(
            dict(
                iterations=iteration, env_steps=env_steps, percent=percent, global_counter=iteration
            )
        )
