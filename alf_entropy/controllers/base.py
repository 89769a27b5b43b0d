"""``EntropyController``: the interface every controller shares, and the one driver.

A controller is a named state (``state.py``) plus a pure rule (``rules.py``).
One driver runs every rule: read the state, run the rule, apply the bounds of
``alpha`` and ``limit_log_alpha_span``, run the windup watch (and settled
annealing), write the state.  On the host path (CPU state) that is NumPy over
views of the buffers; on the tensor path it is tensor ops that never read a
value on the host; both give the same bits.

Every controller has: ``adjust_alpha(entropy)``; ``entropy_loss(entropy,
mask=None, entropy_for_gradient=None, update=True)`` (``LossInfo(loss=-alpha *
entropy per element, scalar_loss=0)``); ``accumulate(entropy, mask=None)`` then
``step()`` (one update per optimizer step over many micro-batches and ranks);
ALF's ``rollout_step``/``train_step``/``calc_loss``; ``alpha``, ``log_alpha``,
``target_entropy`` (settable), ``stage``, ``configure(**settings)``,
``unreachable_target``, ``num_nonfinite_entropy``, ``leaf_algorithms()``,
``limit_log_alpha_span(span)`` and ``from_space(space, **kwargs)``.  With
``batch_shape=(K,)`` one module holds K independent controllers.
"""
import math
import warnings
from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple, Type, Union

import torch
from absl import logging

from alf_entropy.controllers import rules, state
from alf_entropy.controllers.alf import AlfSubAlgorithm, EntropyTargetLossInfo, neg
from alf_entropy.controllers.rules import ArrayOps, ScalarOps, TensorOps
from alf_entropy.controllers.state import Bounds, ControllerState, WatchConsts, WatchState
from alf_entropy.controllers.target import Target
from alf_entropy.data_structures import LossInfo
from alf_entropy.tensor_specs import TensorSpec, from_gym_space
from alf_entropy.utils import distributed, nest, summary
from alf_entropy.utils.checks import check_int, check_real, is_real
from alf_entropy.utils.dist_utils import entropy_per_log_alpha
from alf_entropy.utils.math_ops import masked_mean

__all__ = ["EntropyController", "UPDATE_MODES"]

UPDATE_MODES = ("auto", "tensor", "host", "compiled")
"""Where an update runs: ``"host"`` (NumPy over CPU state), ``"tensor"`` (tensor ops, never a
host read), ``"compiled"`` (the tensor path under ``torch.compile``) or ``"auto"`` (host on
the CPU, else tensor)."""

NO_SPAN = 1e30
"""``limit_log_alpha_span``'s span when there is none (finite: no ``inf - inf``)."""

_RENAMED = {"_watch_entropy": "_watch_ema", "_stalled": "_watch_stalled",
            "_settled": "_watch_settled", "_num_nonfinite": "_watch_nonfinite",
            "_avg_entropy._buf": "_window", "_avg_entropy._count": "_seen"}
"""Buffers of earlier versions' checkpoints, and their names now."""


class EntropyController(AlfSubAlgorithm):
    """Base of the entropy controllers (module docstring).

    A subclass sets ``State``, calls ``_init_driver(target_entropy,
    batch_shape, update_mode)`` (a target as in ``target.Target``, per member
    for a batch; ``batch_shape`` ``()`` or ``(K,)``; one of ``UPDATE_MODES``),
    then ``_init_rule`` with its initial state and settings, and implements
    ``_constants(settings)`` and ``_rule``.  A composite (``nested.py``)
    overrides the interface instead.

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions.
        debug_summaries: write the controller's own summaries.
        name: the name (summary scope).

    Raises:
        TypeError: if ``action_spec`` is not a non-empty nest of ``TensorSpec``.
    """

    State: Type[NamedTuple] = state.FixedState

    def __init__(self, action_spec: Any, debug_summaries: bool = False,
                 name: str = "EntropyController"):
        super().__init__(debug_summaries=debug_summaries, name=name)
        specs = nest.flatten(action_spec)
        if not specs or not all(isinstance(s, TensorSpec) for s in specs):
            raise TypeError(
                f"action_spec must be a non-empty nest of TensorSpec, got {action_spec!r}")
        self._action_spec = action_spec

    def _init_driver(self, target_entropy: Any, batch_shape: Sequence[int],
                     update_mode: str) -> None:
        """The target, the watch, the span limit and the accumulators (before ``_init_rule``)."""
        if not isinstance(batch_shape, (tuple, list)) or len(batch_shape) > 1:
            raise ValueError(f"batch_shape must be () or (K,), got {batch_shape!r}")
        self._batch = tuple(check_int("batch_shape[0]", k, minimum=1) for k in batch_shape)
        if update_mode not in UPDATE_MODES:
            raise ValueError(f"update_mode must be one of {UPDATE_MODES}, got {update_mode!r}")
        self._update_mode = update_mode
        self._target = Target(target_entropy, self._action_spec, self._batch, self._name)
        self.register_buffer("_target_now", self._full(self._target.initial))
        zeros = {f: self._full(0, dtype) for f, dtype in WatchState.dtypes.items()}
        state.register(self, "_watch_", WatchState(**zeros))
        for buf in ("_span_lo", "_span_hi", "_acc_sum", "_acc_count"):
            self.register_buffer(buf, self._full(0, torch.float64 if "acc" in buf else None))
        self._span, self._warned, self._host, self._compiled = NO_SPAN, set(), None, None
        self._settings: Dict[str, Any] = {}
        self.register_load_state_dict_pre_hook(_upgrade_checkpoint)
        self.register_state_dict_pre_hook(_refuse_pending_accumulation)

    def _full(self, value: Union[float, Sequence[float]],
              dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """A new tensor of ``batch_shape`` (float32 unless ``dtype``), on the controller's
        device once it has state."""
        dtype = dtype or torch.float32
        device = self._log_alpha.device if hasattr(self, "_log_alpha") else None
        if isinstance(value, (list, tuple)):
            return torch.tensor(value, dtype=dtype).reshape(self._batch).to(device)
        return torch.full(self._batch, value, dtype=dtype, device=device)

    def _init_rule(self, initial: NamedTuple, settings: Dict[str, Any]) -> None:
        """Register the rule's state (``State`` of tensors) and take its settings."""
        state.register(self, "_", initial)
        self._settings = settings
        self.configure()

    # ------------------------------------------------------------- settings
    def configure(self, **changes: Any) -> None:
        """Change settings mid-run (e.g. gains, bounds, rates): the state is kept.

        They take effect at the next update, with the constructor's checks.

        Args:
            **changes: constructor arguments of the controller's settings.

        Raises:
            TypeError: for a name that is not a setting, or a value of the wrong type.
            ValueError: for a value out of range.
        """
        unknown = sorted(set(changes) - set(self._settings))
        if unknown:
            raise TypeError(f"{self._name}: {unknown} are not settings; the settings are "
                            f"{sorted(self._settings)}")
        settings = {**self._settings, **changes}
        consts, lo, hi = self._constants(settings)
        self._settings = settings
        self._set_constants(consts, lo, hi)

    @property
    def settings(self) -> Dict[str, Any]:
        """The settings now (``configure`` changes them)."""
        return dict(self._settings)

    def _set_constants(self, consts: Optional[NamedTuple], lo: float, hi: float) -> None:
        if not hasattr(self, "_consts"):
            self._consts = state.Constants(self, "_rule_consts", consts)
            self._bounds = state.Constants(self, "_bound_consts", Bounds(lo, hi, self._span))
            self._watch_consts = state.Constants(self, "_watch_consts", self._watch_constants())
            return
        self._consts.set(consts)
        self._bounds.set(Bounds(lo, hi, self._span))

    def _constants(self, settings: Dict[str, Any]) -> Tuple[NamedTuple, float, float]:
        """Check ``settings``; the rule's constants and ``log_alpha``'s floor and ceiling."""
        raise NotImplementedError

    def _watch_constants(self) -> WatchConsts:
        a = self._target.annealing
        response = rules.WINDUP_RESPONSE * entropy_per_log_alpha(self._action_spec)
        if a is None:
            return WatchConsts(response, 0.0, math.inf, 0.0, -math.inf)
        return WatchConsts(response, a.tolerance, a.window, 1 - a.factor, a.final)

    # ---------------------------------------------------------- the driver
    def _rule(self, x: Any, s: NamedTuple, entropy: Any, valid: Any, target: Any, c: Any,
              b: Bounds, stalled: Any) -> NamedTuple:
        """One step of the control law (``rules.py``): the new ``State``."""
        return s

    def _actuate(self, s: NamedTuple, on_host: bool) -> NamedTuple:
        """Between the rule and the bounds (the SGD rule's optimiser step); ``s`` by default."""
        return s

    def _phase1(self, x: Any, s: ControllerState, entropy: Any, has_data: Any, c: Any,
                b: Bounds) -> Tuple:
        finite = x.isfinite(entropy)
        valid = finite & has_data
        entropy = x.where(finite, entropy, 0.0)
        rule = self._rule(x, s.rule, entropy, valid, s.target, c, b, s.watch.stalled)
        return rule, entropy, valid

    def _phase2(self, x: Any, s: ControllerState, rule: NamedTuple, entropy: Any, has_data: Any,
                valid: Any, b: Bounds, w: WatchConsts) -> ControllerState:
        log_alpha = x.minimum(x.maximum(rule.log_alpha, b.lo), b.hi)
        log_alpha, lo, hi = rules.span_rule(x, log_alpha, s.span_lo, s.span_hi, b.span)
        watch, target = rules.watch_rule(x, s.watch, entropy, has_data, valid, s.target,
                                         log_alpha, w)
        return ControllerState(rule._replace(log_alpha=log_alpha), watch, target, lo, hi)

    def _packed_phase1(self, s: ControllerState, entropy: Any, has_data: Any, c: Any,
                       b: Any) -> Tuple:
        """``_phase1`` on packed constants (``update_mode="compiled"``)."""
        return self._phase1(TensorOps, s, entropy, has_data, self._consts.unpack(c),
                            self._bounds.unpack(b))

    def _packed_phase2(self, s: ControllerState, rule: NamedTuple, entropy: Any, has_data: Any,
                       valid: Any, b: Any, w: Any) -> ControllerState:
        """``_phase2`` on packed constants (``update_mode="compiled"``)."""
        return self._phase2(TensorOps, s, rule, entropy, has_data, valid, self._bounds.unpack(b),
                            self._watch_consts.unpack(w))

    def _state(self) -> ControllerState:
        return ControllerState(state.read(self, "_", self.State), state.read(
            self, "_watch_", WatchState), self._target_now, self._span_lo, self._span_hi)

    def _on_host(self) -> bool:
        cpu = self._log_alpha.device.type == "cpu"
        if self._update_mode == "host" and not cpu:
            raise ValueError(f"{self._name}: update_mode='host' needs the controller on the CPU, "
                             f"it is on {self._log_alpha.device}; use 'tensor' or 'auto'")
        return cpu and self._update_mode in ("host", "auto")

    def _advance(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> torch.Tensor:
        """One update from the batch-mean ``entropy`` (and its element ``count``); new alpha."""
        entropy = entropy.detach().to(self._log_alpha.device, torch.float32)
        if not self._target.constant:
            values = self._target.values(counting=True)
            if self._target.shared:
                self._target_now.fill_(values[0])
            else:
                for k, v in enumerate(values):
                    self._target_now.view(-1)[k].fill_(v)
        on_host = self._on_host()
        if on_host:
            if self._host is None or self._host[0] is not self._log_alpha:
                self._host = (self._log_alpha, state.views(self._state()))
            arrays = self._host[1]
            x = ScalarOps if self._batch == () else ArrayOps
            h = entropy.cpu().numpy()[()]
            has = True if count is None else count.cpu().numpy()[()] > 0
            s = state.values(arrays)
            rule, h, valid = self._phase1(x, s, h, has, self._consts.host, self._bounds.host)
            rule = self._actuate(rule, True)
            new = self._phase2(x, s, rule, h, has, valid, self._bounds.host,
                               self._watch_consts.host)
            state.write(arrays, new)
            unreachable = rules.unreachable(new.watch.below, new.watch.stalled,
                                            new.rule.log_alpha, self._bounds.host.hi)
        else:
            s = self._state()
            has = entropy.new_ones((), dtype=torch.bool) if count is None else count > 0
            if self._update_mode == "compiled":
                if self._compiled is None:  # compiled once, on first use
                    self._compiled = tuple(torch.compile(f, fullgraph=True, dynamic=False)
                                           for f in (self._packed_phase1, self._packed_phase2))
                consts = (self._consts.packed(), self._bounds.packed(), self._watch_consts.packed())
                rule, h, valid = self._compiled[0](s, entropy, has, *consts[:2])
                new = self._compiled[1](s, self._actuate(rule, False), h, has, valid, *consts[1:])
            else:
                b = self._bounds.tensors()
                rule, h, valid = self._phase1(TensorOps, s, entropy, has, self._consts.tensors(), b)
                new = self._phase2(TensorOps, s, self._actuate(rule, False), h, has, valid, b,
                                   self._watch_consts.tensors())
            with torch.no_grad():
                state.write(s, new)
            unreachable = None
        self._after_update(on_host, unreachable)
        return self.alpha

    def _after_update(self, on_host: bool, unreachable: Any) -> None:
        """Summaries, and warnings read on the host only where that costs nothing more
        (``unreachable``: the watch's verdict on the host path, else None)."""
        recording = summary.should_record_summaries()
        if recording:
            values = {"unreachable_target": self.unreachable_target}
            if self._debug_summaries:
                values.update(alpha=self.alpha, nonfinite_entropy=self._watch_nonfinite,
                              **self._debug_values())
            if not self._target.constant or self._target.annealing:
                values["target_entropy"] = self._target_now
            with summary.scope(self._name):
                for tag, value in values.items():
                    for k, v in enumerate(value.reshape(-1)):
                        summary.scalar(tag if self._batch == () else f"{tag}/{k}", v)
        if unreachable is None and recording:
            unreachable = self.unreachable_target  # the summary step reads the device anyway
        if "unreachable" not in self._warned and unreachable is not None and unreachable.any():
            self._warn("unreachable", (
                f"the entropy ({_show(self._watch_ema)}) has stayed below the target "
                f"({_show(self._target_now)}) for {_show(self._watch_below)} updates while alpha "
                f"climbed to {_show(self.alpha)}; the target looks unreachable for this policy. "
                "Lower target_entropy (e.g. greedy_probability_target or SettledAnnealing) or set "
                "max_alpha."))

    def _warn(self, key: str, message: str) -> None:
        self._warned.add(key)
        message = f"{self._name}: {message}"
        logging.warning(message)
        warnings.warn(message, stacklevel=5)

    def _debug_values(self) -> Dict[str, torch.Tensor]:
        """The rule's own debug summaries."""
        return {}

    # ----------------------------------------------------------- interface
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
        """``log(alpha)`` (detached), of ``batch_shape``."""
        return self._log_alpha.detach()

    @property
    def alpha(self) -> torch.Tensor:
        """The entropy coefficient ``exp(log_alpha)`` (detached), of ``batch_shape``."""
        return self.log_alpha.exp()

    @property
    def target_entropy(self) -> Union[float, torch.Tensor]:
        """The target now: a host float (a tensor of ``batch_shape`` for a batch)."""
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
    def stage(self) -> torch.Tensor:
        """The stage (int32): < -2 estimating, -2 init, -1 free, 0/1 adjust; 1 if unstaged."""
        return torch.ones_like(self._watch_count, dtype=torch.int32)

    @property
    def unreachable_target(self) -> torch.Tensor:
        """True (bool, per member) while the entropy has stayed below the target for
        ``WINDUP_WINDOW`` updates with ``alpha`` stalled (the watch) or at its ceiling."""
        return rules.unreachable(self._watch_below, self._watch_stalled, self.log_alpha,
                                 self._bounds.tensors().hi)

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
            entropy: a number or one-element tensor (one per member for a batch:
                a sequence or a tensor of ``batch_shape``; a number is shared).

        Returns:
            The new ``alpha``, on the controller's device.

        Raises:
            TypeError: if ``entropy`` is neither a number, a sequence nor a tensor.
            ValueError: if it has the wrong number of elements.
        """
        if isinstance(entropy, torch.Tensor):
            if entropy.numel() != math.prod(self._batch):
                raise ValueError(f"entropy must be a number or a tensor of {math.prod(self._batch)}"
                                 f" element(s), got shape {tuple(entropy.shape)}")
            entropy = entropy.detach().reshape(self._batch)
        elif is_real(entropy) or (isinstance(entropy, (list, tuple)) and self._batch != ()):
            entropy = self._full(entropy if is_real(entropy) else [float(e) for e in entropy])
        else:
            raise TypeError(f"entropy must be a number or a tensor, got {type(entropy).__name__}")
        self._advance(distributed.all_reduce_masked_mean(entropy.to(self._log_alpha.device),
                                                         None)[0], None)
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
            LossInfo: ``loss = -alpha * entropy_for_gradient`` per element
            (``alpha`` detached), ``scalar_loss`` a zero 0-d tensor (add it
            freely), ``extra`` an ``EntropyTargetLossInfo``.

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
            self._acc_sum.add_(torch.where(count > 0, mean * count, 0.0))
            self._acc_count.add_(count)

    def step(self) -> torch.Tensor:
        """One update from everything accumulated since the last step (every rank's).

        The mean is the count-weighted one: the pooled sum over the pooled
        count of every micro-batch on every rank.  With nothing counted the
        controller stays as it is.

        Returns:
            The new ``alpha``.
        """
        total, count = distributed.all_reduce_sum(
            torch.stack([self._acc_sum, self._acc_count]), "all_reduce of the entropy").unbind()
        self._acc_sum.zero_()
        self._acc_count.zero_()
        return self._advance((total / count.clamp(min=1)).to(torch.float32), count)


def _show(value: torch.Tensor) -> str:
    values = [f"{float(v):.4g}" for v in value.reshape(-1)]
    return values[0] if len(values) == 1 else "[" + ", ".join(values) + "]"


def _upgrade_checkpoint(module: EntropyController, state_dict: Dict[str, Any], prefix: str,
                        *args: Any) -> None:
    """Load earlier versions' checkpoints: renamed buffers, and new ones kept as they are."""
    for old, new in _RENAMED.items():
        if prefix + old in state_dict and prefix + new not in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)
    for name in ("_ref_target", "_target_now", "_watch_settled", "_span_lo", "_span_hi",
                 "_acc_sum", "_acc_count", "_grad"):
        buf = getattr(module, name, None)
        if buf is not None and prefix + name not in state_dict:
            state_dict[prefix + name] = buf.detach().clone()


def _refuse_pending_accumulation(module: EntropyController, prefix: str, keep_vars: bool) -> None:
    """A multi-rank checkpoint holds rank 0's state: a partial sum of one rank would be wrong."""
    if distributed.is_distributed() and bool((module._acc_count > 0).any()):
        raise RuntimeError(f"{module.name}: state_dict() between accumulate() and step() in a "
                           "multi-rank run would save one rank's partial entropy sum; call "
                           "step() first (save between optimizer steps)")
