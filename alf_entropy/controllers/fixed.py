"""A fixed coefficient: "no adjustment" as a controller."""

import math
from typing import Any, Optional, Sequence

import torch

from alf_entropy.controllers.base import EntropyController, arguments
from alf_entropy.controllers.driver import LOG_ZERO, state_type
from alf_entropy.utils.checks import check_real

__all__ = ["FixedEntropyCoefficient"]


class FixedEntropyCoefficient(EntropyController):
    """A constant ``alpha`` through the same driver (and watch) as the adaptive controllers.

    Shared arguments: ``EntropyController``'s (``initial_alpha``, the coefficient, is >= 0 and
    not clamped; ``target_entropy`` is only reported); its own:

    Args:
        alpha: another name of ``initial_alpha`` (``configure(alpha=...)`` sets it at once).

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> fixed = FixedEntropyCoefficient(BoundedTensorSpec((), torch.int64, 0, 3),
        ...                                 initial_alpha=0.05)
        >>> fixed.entropy_loss(torch.full((4,), 1.0)).loss  # -alpha * entropy, every update
        tensor([-0.0500, -0.0500, -0.0500, -0.0500])
    """

    State = state_type("State")
    CLAMPED = False
    ZERO_ALPHA = True
    STAGE = -1

    def __init__(
        self,
        action_spec: Any,
        initial_alpha: float = 0.1,
        target_entropy: Any = None,
        min_alpha: float = 1e-4,
        max_alpha: Optional[float] = None,
        max_alpha_change_per_iteration: Optional[float] = None,
        update_mode: str = "auto",
        batch_shape: Sequence[int] = (),
        alpha: Optional[float] = None,
        debug_summaries: bool = False,
        name: str = "FixedEntropyCoefficient",
    ):
        if alpha is not None:
            if initial_alpha != 0.1:
                raise TypeError("give the coefficient as initial_alpha or as alpha, not both")
            initial_alpha = alpha
        super().__init__(**arguments(locals(), "alpha"), alpha=initial_alpha)
        self.make_state()

    @staticmethod
    def rule(x: Any, s: Any, entropy: Any, c: float) -> Any:
        """The state as it is (``configure`` sets ``log_alpha``)."""
        return s

    def _constants(self, s, lo, hi):
        alpha = check_real("alpha", s["alpha"], minimum=0.0)
        return math.log(alpha) if alpha > 0 else LOG_ZERO

    def configure(self, **changes: Any) -> None:
        """Change ``alpha`` (at once) or the bounds."""
        super().configure(**changes)
        with torch.no_grad():
            self.driver.log_alpha.fill_(self.consts.rule)
