"""``EntropyController``: the interface and the shared arguments of every controller."""
import inspect
import math
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch

from alf_entropy.controllers.alf import EntropyTargetLossInfo, neg
from alf_entropy.controllers.driver import NO_SPAN, UPDATE_MODES, Driver
from alf_entropy.controllers.watch import WINDUP_WINDOW
from alf_entropy.data_structures import LossInfo
from alf_entropy.tensor_specs import from_gym_space
from alf_entropy.utils import distributed, summary
from alf_entropy.utils.checks import check_real, is_real
from alf_entropy.utils.math_ops import masked_mean

__all__ = ["EntropyController", "UPDATE_MODES", "NO_SPAN"]


class EntropyController(Driver):
    """The base of every controller; its arguments are the shared ones.

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions.
        target_entropy: a number, a ``Scheduler`` or zero-argument callable, a
            ``SettledAnnealing``, or None (the spec's default); a list, one per member, for a batch.
        initial_alpha: the first ``alpha``, in ``[min_alpha, max_alpha]``.
        min_alpha: floor of ``alpha`` (<= 0: ``exp(-100)``).
        max_alpha: ceiling of ``alpha`` (> ``min_alpha``; None: none, as ALF).  Below the
            target at the ceiling for ``WINDUP_WINDOW`` updates the target is unreachable.
        update_mode: ``"auto"``, ``"host"`` or ``"tensor"`` (``UPDATE_MODES``).
        batch_shape: ``()``, or ``(K,)`` for K independent controllers in one module.
        debug_summaries: write the controller's own summaries.
        name: the summary scope.

    Raises:
        TypeError: for an argument of the wrong type, or one that is another rule's setting.
        ValueError: for an argument out of range.
    """

    def __init__(self, action_spec: Any, target_entropy: Any = None, initial_alpha: float = 0.1,
                 min_alpha: float = 1e-4, max_alpha: Optional[float] = None,
                 update_mode: str = "auto", batch_shape: Sequence[int] = (),
                 debug_summaries: bool = False, name: str = "EntropyController"):
        super().__init__(action_spec, target_entropy, initial_alpha, min_alpha, max_alpha,
                         update_mode, batch_shape, debug_summaries, name)

    def _refuse(self, unknown: Dict[str, Any]) -> None:
        """A ``TypeError`` for an unknown argument, naming the controllers that take it."""
        classes, owners = [EntropyController], set()
        for cls in classes if unknown else ():
            classes.extend(cls.__subclasses__())
            if min(unknown) in inspect.signature(cls.__init__).parameters:
                owners.add(cls.__name__)
        if unknown:
            where = f"a setting of {', '.join(sorted(owners))}" if owners else "a typo?"
            raise TypeError(f"{type(self).__name__} has no argument {min(unknown)!r} ({where}); "
                            f"its settings are {sorted(self._settings)}")

    @classmethod
    def from_space(cls, space: Any, **kwargs: Any) -> "EntropyController":
        """``cls(from_gym_space(space), **kwargs)`` for a gymnasium space or a TorchRL spec."""
        return cls(from_gym_space(space), **kwargs)

    action_spec = property(lambda self: self._action_spec)

    @property
    def batch_shape(self) -> Tuple[int, ...]:
        """``()`` for one controller, ``(K,)`` for K."""
        return self._batch

    @property
    def log_alpha(self) -> torch.Tensor:
        """``log(alpha)``, detached."""
        return self._log_alpha.detach()

    @property
    def alpha(self) -> torch.Tensor:
        """The entropy coefficient, detached."""
        return self.log_alpha.exp()

    @property
    def target_entropy(self) -> Union[float, torch.Tensor]:
        """The target now (a tensor for a batch); settable (from the next update)."""
        if self._target.annealing is not None:  # the annealed target is state
            return float(self._target_now) if self._batch == () else self._target_now.clone()
        values = self._target.values()
        return values[0] if self._batch == () else self._full(values)

    @target_entropy.setter
    def target_entropy(self, target: Any) -> None:
        self._target.set(target)
        with torch.no_grad():
            self._target_now.copy_(self._full(self._target.initial))
        self._configure({})

    @property
    def settings(self) -> Dict[str, Any]:
        """What ``configure`` changes."""
        return dict(self._settings)

    def configure(self, **changes: Any) -> None:
        """Change settings mid-run, checked as in the constructor (nothing changes on an
        error); the state is kept."""
        unknown = sorted(set(changes) - set(self._settings))
        if unknown:
            raise TypeError(f"{self._name}: {unknown} are not settings; the settings are "
                            f"{sorted(self._settings)}")
        self._configure(changes)

    @property
    def stage(self) -> torch.Tensor:
        """The stage (int32): < -2 estimating, -2 init, -1 free, 0/1 adjust; 1 if unstaged."""
        return torch.ones_like(self._watch_count, dtype=torch.int32)

    @property
    def unreachable_target(self) -> torch.Tensor:
        """Whether the entropy stayed below the target for ``WINDUP_WINDOW`` updates with
        ``alpha`` at ``max_alpha``: alpha can do no more."""
        return self._watch_stalled_for >= WINDUP_WINDOW

    @property
    def num_nonfinite_entropy(self) -> torch.Tensor:
        """Updates with a NaN/inf entropy from a non-empty batch (int64)."""
        return self._watch_nonfinite

    def leaf_algorithms(self) -> Dict[str, "EntropyController"]:
        """The per-action controllers by path in the spec: ``{"": self}`` unless nested."""
        return {"": self}

    def limit_log_alpha_span(self, span: Optional[float]) -> None:
        """From now on keep ``max(log_alpha) - min(log_alpha) <= span`` (None: no limit)."""
        self._span = NO_SPAN if span is None else check_real("span", span, minimum=0.0)
        with torch.no_grad():
            self._span_lo.copy_(self._log_alpha)
            self._span_hi.copy_(self._log_alpha)
        self._b = self._b._replace(span=self._span)

    def adjust_alpha(self, entropy: Union[float, Sequence[float], torch.Tensor]) -> torch.Tensor:
        """One update from the batch-mean entropy (a number or one-element tensor; for a batch
        one per member, or one shared); NaN/inf changes nothing.  Returns the new alpha."""
        members = math.prod(self._batch)
        if isinstance(entropy, torch.Tensor):
            if entropy.numel() != members:
                raise ValueError(f"entropy must be a number or a tensor of {members} "
                                 f"element(s), got shape {tuple(entropy.shape)}")
            entropy = entropy.detach().reshape(self._batch)
        elif is_real(entropy) or (isinstance(entropy, (list, tuple)) and self._batch != ()):
            entropy = self._full(entropy if is_real(entropy) else [float(e) for e in entropy])
        else:
            raise TypeError(f"entropy must be a number or a tensor, got {type(entropy).__name__}")
        entropy = distributed.all_reduce_masked_mean(entropy.to(self._log_alpha.device), None)[0]
        return self._advance(entropy, None)

    def entropy_loss(self, entropy: torch.Tensor, mask: Optional[torch.Tensor] = None,
                     entropy_for_gradient: Optional[torch.Tensor] = None,
                     update: bool = True) -> LossInfo:
        """One update from the masked mean of ``entropy``; the bonus as a loss.

        Args:
            entropy: per-step entropies, any shape (``[*batch_shape, ...]`` for a batch).
            mask: bool or 0/1, broadcastable with ``entropy``; None: all count.
            entropy_for_gradient: what to differentiate instead of ``entropy``.
            update: False: the loss with the current ``alpha``, no update.

        Returns:
            ``LossInfo(loss=-alpha * entropy_for_gradient)`` per element with ``alpha`` after
            the update, detached (every controller alike); ``extra`` an ``EntropyTargetLossInfo``.
        """
        grad = entropy if entropy_for_gradient is None else entropy_for_gradient
        return self._loss(neg(entropy), mask, neg(grad), update)

    def _member_dims(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> Tuple:
        """``x`` and ``mask`` with an element dim per member; the dims to reduce."""
        if self._batch == ():
            return x, mask, None
        if x.dim() == len(self._batch):
            x, mask = x.unsqueeze(-1), None if mask is None else mask.unsqueeze(-1)
        return x, mask, tuple(range(len(self._batch), x.dim()))

    def _loss(self, neg_entropy: Any, mask: Optional[torch.Tensor], neg_grad: Any,
              update: bool) -> LossInfo:
        """``entropy_loss`` on negated entropies (the form ``train_step`` stores)."""
        alpha = self.alpha
        if update:
            x, m, dim = self._member_dims(neg_entropy.detach(), mask)
            neg_mean, count = masked_mean(x, m, dim=dim)
            pooled, pooled_count = distributed.all_reduce_masked_mean(neg_mean, count)
            alpha = self._advance(-pooled, pooled_count)
            if self._debug_summaries and summary.should_record_summaries():
                square = masked_mean(x * x, m, dim=dim)[0]
                std = torch.sqrt(torch.clamp(square - neg_mean * neg_mean, min=0.0))
                with summary.scope(self._name):
                    for k, v in enumerate(std.reshape(-1)):
                        summary.scalar(f"entropy_std{'/' + str(k) if self._batch else ''}", v)
        alpha = alpha.reshape(self._batch + (1,) * (neg_grad.dim() - len(self._batch)))
        return LossInfo(loss=neg_grad * alpha, scalar_loss=neg_grad.new_zeros(()),
                        extra=EntropyTargetLossInfo(neg_entropy=neg_entropy))

    def accumulate(self, entropy: torch.Tensor, mask: Optional[torch.Tensor] = None) -> None:
        """Add a micro-batch's entropies (``mask`` as in ``entropy_loss``) to this step's."""
        x, m, dim = self._member_dims(entropy.detach().to(torch.float64), mask)
        mean, count = masked_mean(x, m, dim=dim)
        with torch.no_grad():
            self._acc_sum.add_(mean * count)
            self._acc_count.add_(count)

    def step(self) -> torch.Tensor:
        """One update from what was accumulated since the last step, pooled over ranks."""
        total, count = distributed.all_reduce_sum(
            torch.stack([self._acc_sum, self._acc_count]), "all_reduce of the entropy").unbind()
        self._acc_sum.zero_()
        self._acc_count.zero_()
        return self._advance((total / count.clamp(min=1)).to(torch.float32), count)
