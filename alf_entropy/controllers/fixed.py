"""A fixed entropy coefficient: "no adjustment" as a controller."""
import math
from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple

import gin
import torch

from alf_entropy.controllers.base import EntropyController
from alf_entropy.controllers.state import FixedState
from alf_entropy.utils.checks import check_real

__all__ = ["FixedEntropyCoefficient"]


class _FixedConsts(NamedTuple):
    log_alpha: float


@gin.configurable
class FixedEntropyCoefficient(EntropyController):
    """A constant ``alpha``, through the same driver (and watch) as the adaptive controllers.

    ``entropy_target_cls = @FixedEntropyCoefficient`` (with
    ``enforce_entropy_target=True``) gives an actor-critic a fixed entropy
    coefficient through the same code path as the adaptive controllers;
    ``configure(alpha=...)`` changes it.

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions.
        alpha: the coefficient (>= 0).
        target_entropy: only reported; None for the spec's default.
        batch_shape: ``()``, or ``(K,)`` for K coefficients.
        debug_summaries: write the controller's summaries.
        name: the name.

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> fixed = FixedEntropyCoefficient(BoundedTensorSpec((), torch.int64, 0, 3), alpha=0.05)
        >>> fixed.entropy_loss(torch.full((4,), 1.0)).loss  # -alpha * entropy, every update
        tensor([-0.0500, -0.0500, -0.0500, -0.0500])
    """

    State = FixedState

    def __init__(self, action_spec: Any, alpha: float = 0.01,
                 target_entropy: Optional[float] = None, batch_shape: Sequence[int] = (),
                 debug_summaries: bool = False, name: str = "FixedEntropyCoefficient"):
        super().__init__(action_spec, debug_summaries, name)
        self._init_driver(target_entropy, batch_shape, "auto")
        settings = dict(alpha=alpha)
        self._init_rule(FixedState(self._full(self._constants(settings)[0].log_alpha)), settings)

    def _constants(self, s: Dict[str, Any]) -> Tuple[_FixedConsts, float, float]:
        alpha = check_real("alpha", s["alpha"], minimum=0.0)
        return _FixedConsts(math.log(alpha) if alpha > 0 else -math.inf), -math.inf, math.inf

    def configure(self, **changes: Any) -> None:
        """Change ``alpha`` (at once)."""
        super().configure(**changes)
        with torch.no_grad():
            self._log_alpha.fill_(self._consts.values.log_alpha)

    @property
    def stage(self) -> torch.Tensor:
        """Always -1 (the free stage: alpha fixed)."""
        return torch.full_like(self._watch_count, -1, dtype=torch.int32)
