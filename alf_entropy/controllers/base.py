"""``EntropyController``: the interface every controller shares.

A controller is a named state (``state.py``) plus a pure rule (``rules.py``),
run by one driver (``driver.py``).  Every controller has ``adjust_alpha``,
``entropy_loss``, ``accumulate``/``step``, ALF's ``rollout_step``/
``train_step``/``calc_loss`` (``alf.py``), ``alpha``, ``log_alpha``,
``target_entropy`` (settable), ``stage``, ``configure``, ``unreachable_target``,
``num_nonfinite_entropy``, ``leaf_algorithms``, ``limit_log_alpha_span`` and
``from_space``.  With ``batch_shape=(K,)`` one module holds K independent
controllers, each of whose values has a leading ``K``.
"""
import math
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch

from alf_entropy.controllers import rules
from alf_entropy.controllers.alf import EntropyTargetLossInfo, neg
from alf_entropy.controllers.driver import NO_SPAN, UPDATE_MODES, Driver
from alf_entropy.data_structures import LossInfo
from alf_entropy.tensor_specs import TensorSpec, from_gym_space
from alf_entropy.utils import distributed, nest, summary
from alf_entropy.utils.checks import check_real, is_real
from alf_entropy.utils.math_ops import masked_mean

__all__ = ["EntropyController", "UPDATE_MODES", "NO_SPAN"]


class EntropyController(Driver):
    """Base of the entropy controllers (module docstring); a composite (``nested.py``)
    overrides the interface instead of running the driver.

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions.
        debug_summaries: write the controller's own summaries.
        name: the name (summary scope).

    Raises:
        TypeError: if ``action_spec`` is not a non-empty nest of ``TensorSpec``.
    """

    def __init__(self, action_spec: Any, debug_summaries: bool = False,
                 name: str = "EntropyController"):
        super().__init__(debug_summaries=debug_summaries, name=name)
        specs = nest.flatten(action_spec)
        if not specs or not all(isinstance(s, TensorSpec) for s in specs):
            raise TypeError(
                f"action_spec must be a non-empty nest of TensorSpec, got {action_spec!r}")
        self._action_spec = action_spec

    @classmethod
    def from_space(cls, space: Any, **kwargs: Any) -> "EntropyController":
        """``cls(from_gym_space(space), **kwargs)`` for a gymnasium action space."""
        return cls(from_gym_space(space), **kwargs)

    @property
    def action_spec(self) -> Any:
        """The action spec."""
        return self._action_spec

    @property
    def batch_shape(self) -> Tuple[int, ...]:
        """``()`` for one controller, ``(K,)`` for K."""
        return self._batch

    @property
    def log_alpha(self) -> torch.Tensor:
        """``log(alpha)`` (detached)."""
        return self._log_alpha.detach()

    @property
    def alpha(self) -> torch.Tensor:
        """The entropy coefficient ``exp(log_alpha)`` (detached)."""
        return self.log_alpha.exp()

    @property
    def target_entropy(self) -> Union[float, torch.Tensor]:
        """The target now: a float (a tensor of ``batch_shape`` for a batch).  Settable
        (a number, a schedule, ...; per member for a batch): it applies from the next update."""
        if self._target.annealing is not None:  # the annealed target is state
            return float(self._target_now) if self._batch == () else self._target_now.clone()
        values = self._target.values()
        return values[0] if self._batch == () else self._full(values)

    @target_entropy.setter
    def target_entropy(self, target: Any) -> None:
        self._target.set(target)
        with torch.no_grad():
            self._target_now.copy_(self._full(self._target.initial))
        self._watch_consts.set(self._watch_constants())

    @property
    def settings(self) -> Dict[str, Any]:
        """The settings now (``configure`` changes them)."""
        return dict(self._settings)

    def configure(self, **changes: Any) -> None:
        """Change settings mid-run (gains, rates, bounds, the rate cap): the state is kept.

        Args:
            **changes: settings by their constructor argument's name; they take
                effect at the next update, with the constructor's checks.

        Raises:
            TypeError: for a name that is not a setting, or a value of the wrong type.
            ValueError: for a value out of range (the settings stay as they were).
        """
        unknown = sorted(set(changes) - set(self._settings))
        if unknown:
            raise TypeError(f"{self._name}: {unknown} are not settings; the settings are "
                            f"{sorted(self._settings)}")
        settings = {**self._settings, **changes}
        consts, lo, hi = self._constants(settings)
        self._settings = settings
        self._consts.set(consts)
        self._bounds.set(self._bounds.values._replace(lo=lo, hi=hi))

    @property
    def stage(self) -> torch.Tensor:
        """The stage (int32): < -2 estimating, -2 init, -1 free, 0/1 adjust; 1 if unstaged."""
        return torch.ones_like(self._watch_count, dtype=torch.int32)

    @property
    def unreachable_target(self) -> torch.Tensor:
        """True (bool) while the entropy has stayed below the target for ``WINDUP_WINDOW``
        updates with ``alpha`` at its ceiling (``max_alpha``): alpha can do no more."""
        return rules.unreachable(self._watch_stalled_for)

    @property
    def num_nonfinite_entropy(self) -> torch.Tensor:
        """How many updates had a NaN/inf entropy from a non-empty batch (int64)."""
        return self._watch_nonfinite

    def leaf_algorithms(self) -> Dict[str, "EntropyController"]:
        """The per-action controllers by path in the spec; ``{"": self}`` unless nested."""
        return {"": self}

    def limit_log_alpha_span(self, span: Optional[float]) -> None:
        """From now on keep ``max(log_alpha) - min(log_alpha) <= span`` (until None).

        Args:
            span: the largest spread of ``log_alpha`` (>= 0), or None to stop.
        """
        self._span = NO_SPAN if span is None else check_real("span", span, minimum=0.0)
        with torch.no_grad():
            self._span_lo.copy_(self._log_alpha)
            self._span_hi.copy_(self._log_alpha)
        self._bounds.set(self._bounds.values._replace(span=self._span))

    def adjust_alpha(self, entropy: Union[float, Sequence[float], torch.Tensor]) -> torch.Tensor:
        """One update from the (batch-mean) entropy; NaN/inf changes nothing.

        Args:
            entropy: a number or one-element tensor (for a batch: one per member,
                a sequence or a tensor of ``batch_shape``; a number is shared).

        Returns:
            The new ``alpha``.

        Raises:
            TypeError: if ``entropy`` is neither a number, a sequence nor a tensor.
            ValueError: if it has the wrong number of elements.
        """
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
        self._advance(entropy, None)  # not its value: SAC's rule gives alpha before its step
        return self.alpha

    def entropy_loss(self, entropy: torch.Tensor, mask: Optional[torch.Tensor] = None,
                     entropy_for_gradient: Optional[torch.Tensor] = None,
                     update: bool = True) -> LossInfo:
        """One update from the masked mean of ``entropy``; the bonus as a loss.

        Args:
            entropy: per-step entropies, any shape (``[*batch_shape, ...]`` for a batch).
            mask: bool or 0/1, broadcastable with ``entropy``; None: all count.
            entropy_for_gradient: what to differentiate instead of ``entropy``.
            update: False: only the loss with the current ``alpha``.

        Returns:
            LossInfo: ``loss = -alpha * entropy_for_gradient`` per element (``alpha``
            detached), ``scalar_loss`` a 0-d zero, ``extra`` an ``EntropyTargetLossInfo``.

        Raises:
            ValueError: if ``mask`` does not broadcast with ``entropy``.
        """
        grad = entropy if entropy_for_gradient is None else entropy_for_gradient
        return self._loss(neg(entropy), mask, neg(grad), update)

    def _member_dims(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> Tuple:
        """``x`` and ``mask`` with an element dim for each member, and the dims to reduce."""
        if self._batch == ():
            return x, mask, None
        if x.dim() == len(self._batch):
            x, mask = x.unsqueeze(-1), None if mask is None else mask.unsqueeze(-1)
        return x, mask, tuple(range(len(self._batch), x.dim()))

    def _loss(self, neg_entropy: Any, mask: Optional[torch.Tensor], neg_grad: Any,
              update: bool) -> LossInfo:
        """``entropy_loss`` on negated entropies (the form ``train_step`` stores)."""
        if not update:
            alpha = self.alpha
        else:
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
        """Add one micro-batch's entropies (per token or sample) to this step's statistic.

        Args:
            entropy: entropies of any shape (``[*batch_shape, ...]`` for a batch).
            mask: bool or 0/1, broadcastable with ``entropy``; None: all count.
        """
        x, m, dim = self._member_dims(entropy.detach().to(torch.float64), mask)
        mean, count = masked_mean(x, m, dim=dim)
        with torch.no_grad():
            self._acc_sum.add_(mean * count)
            self._acc_count.add_(count)

    def step(self) -> torch.Tensor:
        """One update from everything accumulated since the last step, on every rank: the
        pooled sum over the pooled count (nothing counted: no change).

        Returns:
            The new ``alpha``.
        """
        total, count = distributed.all_reduce_sum(
            torch.stack([self._acc_sum, self._acc_count]), "all_reduce of the entropy").unbind()
        self._acc_sum.zero_()
        self._acc_count.zero_()
        return self._advance((total / count.clamp(min=1)).to(torch.float32), count)
