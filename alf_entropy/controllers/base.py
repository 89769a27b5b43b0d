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
    """The base of every controller.  Its arguments are the shared ones, described once, in the
    table of docs/controllers.md ("The shared arguments"); a bad one raises a ``TypeError`` or
    ``ValueError`` naming it."""

    def _take(self, unknown: Dict[str, Any], **settings: Any) -> None:
        """Check and take the rule's ``settings``; refuse ``unknown`` arguments."""
        self._settings.update(settings)
        if unknown:
            arg, classes = min(unknown), [EntropyController]
            for cls in classes:
                classes.extend(cls.__subclasses__())
            owners = sorted({c.__name__ for c in classes
                             if arg in inspect.signature(c.__init__).parameters})
            where = f"a setting of {', '.join(owners)}" if owners else "a typo?"
            raise TypeError(f"{type(self).__name__} has no argument {arg!r} ({where}); "
                            f"its settings are {sorted(self._settings)}")
        self._configure({})

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
        """The target now (a tensor for a batch); settable."""
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
        """Change settings mid-run, checked as at construction (an error changes nothing)."""
        unknown = sorted(set(changes) - set(self._settings))
        if unknown:
            raise TypeError(f"{self._name}: {unknown} are not settings; the settings are "
                            f"{sorted(self._settings)}")
        self._configure(changes)

    @property
    def stage(self) -> torch.Tensor:
        """The stage (int32; ``describe_stage``): < -2 estimating, -2 init, -1 free (a fixed
        alpha), 0/1 adjust (an unstaged rule)."""
        return torch.ones_like(self._watch_count, dtype=torch.int32)

    @property
    def unreachable_target(self) -> torch.Tensor:
        """Whether the entropy stayed below the target at ``max_alpha`` for ``WINDUP_WINDOW``."""
        return self._watch_stalled_for >= WINDUP_WINDOW

    @property
    def num_nonfinite_entropy(self) -> torch.Tensor:
        """Updates with a NaN/inf entropy from a non-empty batch (int64)."""
        return self._watch_nonfinite

    def leaf_algorithms(self) -> Dict[str, "EntropyController"]:
        """The per-action controllers by path in the spec (``{"": self}`` unless nested)."""
        return {"": self}

    def limit_log_alpha_span(self, span: Optional[float]) -> None:
        """From now on keep ``max(log_alpha) - min(log_alpha) <= span`` (None: no limit)."""
        self._span = NO_SPAN if span is None else check_real("span", span, minimum=0.0)
        with torch.no_grad():
            self._span_lo.copy_(self._log_alpha)
            self._span_hi.copy_(self._log_alpha)
        self._b = self._b._replace(span=self._span)

    def adjust_alpha(self, entropy: Union[float, Sequence[float], torch.Tensor]) -> torch.Tensor:
        """One update from the batch-mean entropy (a batch's: one each, or shared); new alpha."""
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
        """One update from the masked mean of ``entropy`` (``[*batch_shape, ...]`` for a batch;
        ``mask`` bool or 0/1, broadcastable; ``update=False``: none); ``LossInfo(loss=-alpha *
        entropy_for_gradient)`` per element with the post-update ``alpha`` (detached)."""
        grad = entropy if entropy_for_gradient is None else entropy_for_gradient
        return self._loss(neg(entropy), mask, neg(grad), update)

    def _member_dims(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> Tuple:
        """``(x, mask, dims to reduce)``, each member with an element dim."""
        if self._batch == ():
            return x, mask, None
        if x.dim() == len(self._batch):
            x, mask = x.unsqueeze(-1), None if mask is None else mask.unsqueeze(-1)
        return x, mask, tuple(range(len(self._batch), x.dim()))

    def _loss(self, neg_entropy: Any, mask: Optional[torch.Tensor], neg_grad: Any,
              update: bool) -> LossInfo:  # on negated entropies, as train_step stores them
        alpha = None if update else self.alpha  # an update returns the new one
        if update:
            x, m, dim = self._member_dims(neg_entropy.detach(), mask)
            neg_mean, count = masked_mean(x, m, dim=dim)
            pooled, pooled_count = distributed.all_reduce_masked_mean(neg_mean, count)
            alpha = self._advance(-pooled, pooled_count)
            if self._debug_summaries and summary.should_record_summaries():
                square = masked_mean(x * x, m, dim=dim)[0]
                self._scalars({"entropy_std": torch.sqrt(
                    torch.clamp(square - neg_mean * neg_mean, min=0.0))})
        alpha = alpha.reshape(self._batch + (1,) * (neg_grad.dim() - len(self._batch)))
        return LossInfo(loss=neg_grad * alpha, scalar_loss=neg_grad.new_zeros(()),
                        extra=EntropyTargetLossInfo(neg_entropy=neg_entropy))

    def accumulate(self, entropy: torch.Tensor, mask: Optional[torch.Tensor] = None) -> None:
        """Add a micro-batch's entropies (as ``entropy_loss``'s) to this ``step``'s."""
        x, m, dim = self._member_dims(entropy.detach().to(torch.float64), mask)
        mean, count = masked_mean(x, m, dim=dim)
        with torch.no_grad():
            self._acc_sum.add_(mean * count)
            self._acc_count.add_(count)

    def step(self) -> torch.Tensor:
        """One update from what was accumulated, pooled over ranks; the new alpha."""
        total, count = distributed.all_reduce_sum(
            torch.stack([self._acc_sum, self._acc_count]), "all_reduce of the entropy").unbind()
        self._acc_sum.zero_()
        self._acc_count.zero_()
        return self._advance((total / count.clamp(min=1)).to(torch.float32), count)
