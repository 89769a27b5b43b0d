"""A fixed coefficient: "no adjustment" as a controller."""
import math
from typing import Any, Dict, NamedTuple, Optional, Sequence

import gin
import torch

from alf_entropy.controllers.base import EntropyController
from alf_entropy.utils.checks import check_real

__all__ = ["FixedEntropyCoefficient"]


class FixedState(NamedTuple):
    log_alpha: Any


@gin.configurable
class FixedEntropyCoefficient(EntropyController):
    """A constant ``alpha`` through the same driver (and watch) as the adaptive controllers.

    The shared arguments are ``EntropyController``'s (``initial_alpha`` is the
    coefficient, >= 0 and not clamped by ``min_alpha``/``max_alpha``; ``target_entropy`` is
    only reported); its own:

    Args:
        alpha: the coefficient, another name of ``initial_alpha`` (``configure(alpha=...)``
            changes it at once).

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> fixed = FixedEntropyCoefficient(BoundedTensorSpec((), torch.int64, 0, 3),
        ...                                 initial_alpha=0.05)
        >>> fixed.entropy_loss(torch.full((4,), 1.0)).loss  # -alpha * entropy, every update
        tensor([-0.0500, -0.0500, -0.0500, -0.0500])
    """

    State = FixedState
    CLAMPED, ZERO_ALPHA = False, True

    def __init__(self, action_spec: Any, initial_alpha: float = 0.1,
                 target_entropy: Any = None, min_alpha: float = 1e-4,
                 max_alpha: Optional[float] = None, update_mode: str = "auto",
                 batch_shape: Sequence[int] = (), alpha: Optional[float] = None,
                 debug_summaries: bool = False, name: str = "FixedEntropyCoefficient",
                 **unknown: Any):
        if alpha is not None:
            if initial_alpha != 0.1:
                raise TypeError("give the coefficient as initial_alpha or as alpha, not both")
            initial_alpha = alpha
        super().__init__(action_spec, target_entropy, initial_alpha, min_alpha, max_alpha,
                         update_mode, batch_shape, debug_summaries, name)
        self._settings.update(alpha=initial_alpha)
        self._refuse(unknown)
        self._configure({})

    def _constants(self, s: Dict[str, Any]) -> Any:
        alpha = check_real("alpha", s["alpha"], minimum=0.0)
        return (math.log(alpha) if alpha > 0 else -math.inf,)

    def configure(self, **changes: Any) -> None:
        """Change ``alpha`` (at once) or the bounds."""
        super().configure(**changes)
        with torch.no_grad():
            self._log_alpha.fill_(self._c[0])

    def _rule(self, x: Any, s: FixedState, entropy: Any, target: Any) -> FixedState:
        return s

    @property
    def stage(self) -> torch.Tensor:
        """Always -1 (the free stage: alpha fixed)."""
        return torch.full_like(self._watch_count, -1, dtype=torch.int32)
