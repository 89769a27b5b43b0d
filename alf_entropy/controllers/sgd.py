"""SAC's gradient rule for ``alpha`` (ALF's ``SGDEntropyTargetAlgorithm``).

``log_alpha`` is stepped by its own optimiser on the loss ``log_alpha * (H -
target)``, ``H`` the batch-mean entropy averaged over the last ``window_size``
updates (``rules.sgd_rule``), so ``alpha`` falls while the entropy is above the
target and rises below it.  The optimiser's state is part of the controller's
``state_dict()`` (its extra state), so a resumed run continues exactly.
"""
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import gin
import torch

from alf_entropy.controllers.base import EntropyController
from alf_entropy.controllers.rules import TensorOps, sgd_rule, window_mean
from alf_entropy.controllers.state import NoConsts, SGDState
from alf_entropy.utils.checks import check_int, check_real

__all__ = ["SGDEntropyTargetAlgorithm"]

OptimizerFactory = Callable[[List[torch.Tensor]], torch.optim.Optimizer]


def sac_temperature_optimizer(params: List[torch.Tensor]) -> torch.optim.Optimizer:
    """SAC's temperature optimiser: Adam(lr=3e-4), kept on the GPU there (no host reads)."""
    return torch.optim.Adam(params, lr=3e-4, capturable=params[0].is_cuda)


@gin.configurable
class SGDEntropyTargetAlgorithm(EntropyController):
    """SAC's gradient rule for ``alpha`` (module docstring).

    Every update (``adjust_alpha``, ``entropy_loss``, ``calc_loss``, ``step``)
    takes one step of the controller's own optimiser; ``scalar_loss`` is zero,
    so a parent's optimiser never touches ``log_alpha``.  The ``LossInfo.loss``
    of ``entropy_loss`` uses ``alpha`` from before the step (as SAC's actor
    loss does).  ``min_alpha``/``max_alpha`` clamp ``log_alpha`` after every step.

    Args:
        action_spec: nest of ``BoundedTensorSpec``; used for the default target.
        initial_alpha: initial ``alpha`` (> 0, within ``[min_alpha, max_alpha]``).
        target_entropy: a number, a scheduler/zero-argument callable, a
            ``SettledAnnealing`` or None for the spec's default; per member for a batch.
        window_size: number of updates the entropy is averaged over (>= 1).
        optimizer: factory ``[log_alpha] -> torch.optim.Optimizer``; None: SAC's Adam(lr=3e-4).
        min_alpha: optional floor of ``alpha`` (> 0); None: none.
        max_alpha: optional ceiling of ``alpha`` (> 0, >= ``min_alpha``); None: none.
        update_mode: ``"auto"``, ``"host"``, ``"tensor"`` or ``"compiled"``: where the rule,
            the watch and the bounds run (the optimiser's step is its own).
        batch_shape: ``()``, or ``(K,)`` for K independent controllers.
        debug_summaries: write ``alpha``, ``entropy`` and ``target_entropy``.
        name: the name.

    Raises:
        TypeError: for an argument of the wrong type.
        ValueError: for an argument out of range, ``min_alpha > max_alpha`` or
            ``initial_alpha`` outside them.

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> spec = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
        >>> sgd = SGDEntropyTargetAlgorithm(spec, target_entropy=-2.0)  # SAC's -dim(A)
        >>> float(sgd.adjust_alpha(0.5)) < 0.1  # entropy above the target: alpha falls
        True
        >>> before = sgd.alpha
        >>> info = sgd.entropy_loss(torch.full((8,), 0.5))  # steps alpha too
        >>> bool(sgd.alpha < before), info.scalar_loss  # and leaves nothing to the caller
        (True, tensor(0.))
    """

    State = SGDState

    def __init__(self, action_spec: Any, initial_alpha: float = 0.1,
                 target_entropy: Any = None, window_size: int = 1,
                 optimizer: Optional[OptimizerFactory] = None,
                 min_alpha: Optional[float] = None, max_alpha: Optional[float] = None,
                 update_mode: str = "auto", batch_shape: Sequence[int] = (),
                 debug_summaries: bool = False, name: str = "SGDEntropyTargetAlgorithm"):
        super().__init__(action_spec, debug_summaries, name)
        self._init_driver(target_entropy, batch_shape, update_mode)
        initial_alpha = check_real("initial_alpha", initial_alpha, positive=True)
        window = check_int("window_size", window_size, minimum=1)
        if optimizer is not None and not callable(optimizer):
            raise TypeError(f"optimizer must be a callable [log_alpha] -> Optimizer, got "
                            f"{type(optimizer).__name__}")
        self._optimizer_factory = optimizer or sac_temperature_optimizer
        self._opt: Optional[Tuple[torch.Tensor, torch.optim.Optimizer]] = None
        self._init_rule(SGDState(self._full(math.log(initial_alpha)),
                                 torch.zeros(self._batch + (window,)),
                                 self._full(0, torch.int64), self._full(0.0)),
                        dict(min_alpha=min_alpha, max_alpha=max_alpha))
        if not (min_alpha or 0.0) <= initial_alpha <= (max_alpha or math.inf):
            raise ValueError(f"initial_alpha ({initial_alpha}) must be within "
                             f"[min_alpha, max_alpha] = [{min_alpha}, {max_alpha}]")

    def _constants(self, s: Dict[str, Any]) -> Tuple[NoConsts, float, float]:
        lo, hi = (None if s[k] is None else check_real(k, s[k], positive=True)
                  for k in ("min_alpha", "max_alpha"))
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min_alpha ({lo}) must be <= max_alpha ({hi})")
        return (NoConsts(), -math.inf if lo is None else math.log(lo),
                math.inf if hi is None else math.log(hi))

    def _rule(self, x: Any, s: SGDState, entropy: Any, valid: Any, target: Any, c: Any,
              b: Any) -> SGDState:
        return sgd_rule(x, s, entropy, valid, target, c)

    def optimizer(self) -> torch.optim.Optimizer:
        """The optimiser of ``log_alpha`` (rebuilt, with its state, after ``.to()``)."""
        if self._opt is None or self._opt[0] is not self._log_alpha:
            opt = self._optimizer_factory([self._log_alpha])
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(f"{self._name}: optimizer factory returned "
                                f"{type(opt).__name__}, not a torch Optimizer")
            if self._opt is not None:
                opt.load_state_dict(self._opt[1].state_dict())
            self._opt = (self._log_alpha, opt)
        return self._opt[1]

    def _actuate(self, s: SGDState, on_host: bool) -> SGDState:
        grad = torch.as_tensor(s.grad) if on_host else s.grad
        opt = self.optimizer()
        self._log_alpha.grad = grad.reshape(self._batch).to(self._log_alpha.dtype)
        opt.step()
        self._log_alpha.grad = None
        return s._replace(log_alpha=self._log_alpha.numpy()[()] if on_host else self._log_alpha)

    def _advance(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> torch.Tensor:
        alpha = self.alpha  # SAC's actor loss uses alpha before the temperature step
        super()._advance(entropy, count)
        return alpha

    def get_extra_state(self) -> Any:
        """The optimiser's state (saved with the module's ``state_dict``)."""
        return self.optimizer().state_dict()

    def set_extra_state(self, state: Any) -> None:
        """Restore :meth:`get_extra_state`."""
        self.optimizer().load_state_dict(state)

    def _debug_values(self) -> Dict[str, torch.Tensor]:
        return {"entropy": window_mean(TensorOps, self._window, self._seen)}
