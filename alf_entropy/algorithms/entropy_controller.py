"""The interface every entropy controller shares, and the fixed coefficient.

An entropy controller turns a policy's entropy into the coefficient ``alpha``
of its entropy bonus.  Every controller (``EntropyTargetAlgorithm``,
``SGDEntropyTargetAlgorithm``, ``NestedEntropyTargetAlgorithm``,
``FixedEntropyCoefficient``, ``PIDEntropyTargetAlgorithm``) has the same members:

* ``adjust_alpha(entropy)``: one update from a batch-mean entropy (a float
  or a tensor); returns the new ``alpha``.
* ``entropy_loss(entropy, mask=None, entropy_for_gradient=None)``: one update
  from the masked mean of a batch of entropies; returns ``LossInfo(loss=-alpha
  * entropy per element, scalar_loss=a 0-d tensor)``.  Both calls move
  ``alpha`` for every controller; ``scalar_loss`` is what is left for the
  caller to minimise: the SGD rule's loss when a parent's optimiser trains
  its ``log_alpha``, else zero, so ``loss + scalar_loss`` always works.
* as a sub-algorithm (ALF): ``predict_step``, ``rollout_step``/``train_step``
  (the distribution's entropy) and ``calc_loss(experience, info,
  valid_mask)`` (masks ``LAST`` steps, calls ``entropy_loss``).
* ``alpha``, ``target_entropy``, ``stage``, ``leaf_algorithms()``,
  ``unreachable_target``, ``num_nonfinite_entropy``, ``state_dict()`` and
  ``from_space(space, **kwargs)``.

After every update the base class also applies ``limit_log_alpha_span``
(an actor-critic's per-iteration cap), runs the windup watch (``_watch``:
``unreachable_target``, one warning) and a ``SettledAnnealing`` target's rule.

Nothing on this interface reads a tensor value on the host.
"""
import functools
import math
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import gin
import numpy as np
import torch
from absl import logging

from alf_entropy.algorithms.algorithm import Algorithm, OptimizerArg
from alf_entropy.data_structures import (
    AlgStep,
    Experience,
    LossInfo,
    StepType,
    namedtuple,
)
from alf_entropy.tensor_specs import TensorSpec, from_gym_space
from alf_entropy.utils import distributed, nest, schedulers, summary
from alf_entropy.utils.checks import check_real, is_real
from alf_entropy.utils.dist_utils import (
    calc_default_target_entropy,
    calc_max_possible_entropy,
    entropy_per_log_alpha,
    entropy_with_fallback,
)
from alf_entropy.utils.math_ops import masked_mean

__all__ = [
    "EntropyTargetLossInfo",
    "EntropyTargetInfo",
    "TargetEntropy",
    "EntropyController",
    "FixedEntropyCoefficient",
]

EntropyTargetLossInfo = namedtuple("EntropyTargetLossInfo", ["neg_entropy"], default_value=())
"""``extra`` of a controller's ``LossInfo``: the per-step negative entropy."""

EntropyTargetInfo = namedtuple("EntropyTargetInfo", ["loss"], default_value=())
"""``info`` of a controller's ``rollout_step``/``train_step``."""

TargetArg = Optional[Union[float, Callable[[], float]]]
PROGRESS_GRACE = 10
"""Updates after which a scheduled target whose progress was never fed warns."""
WINDUP_CLIMB = 4.0
"""The windup watch: the climb of ``alpha`` in a spell below the target
allowed before the entropy answers."""
_LOG_WINDUP_CLIMB = math.log(WINDUP_CLIMB)
UPDATE_MODES = ("auto", "tensor", "host")
"""Where an update runs: ``"host"`` (NumPy over CPU state), ``"tensor"``
(tensor ops, never a host read) or ``"auto"`` (host on the CPU, else tensor)."""
WINDUP_RESPONSE = 0.05
"""The windup watch: a rise of the entropy under this fraction of the nominal
one (``entropy_per_log_alpha`` per unit of ``log_alpha`` climbed) is a stall."""
WINDUP_WINDOW = 500
"""The windup watch: updates of a spell below the target before a stall
counts as an unreachable target."""
WINDUP_MARGIN = 0.05
"""The windup watch: the smallest rise of the entropy (relative to the target) that counts."""
WATCH_EMA = 0.99
"""Smoothing of the entropy that the windup watch and ``SettledAnnealing`` compare."""


class _HostOps:
    """The select primitive over numpy scalars (CPU state, no torch calls)."""

    where = staticmethod(lambda cond, a, b: a if cond else b)
    maximum, minimum, abs = staticmethod(max), staticmethod(min), staticmethod(abs)
    f32, f64, i32 = np.float32, np.float64, np.int32


class _TensorOps:
    """The select primitive over tensors (never reads a value on the host)."""

    where, maximum, minimum, abs = torch.where, torch.maximum, torch.minimum, torch.abs
    f32 = staticmethod(lambda x: x.to(torch.float32))
    f64 = staticmethod(lambda x: x.to(torch.float64))
    i32 = staticmethod(lambda x: x.to(torch.int32))


def _watch_rule(x: Any, state: Tuple, entropy: Any, valid: Any, target: Any, log_alpha: Any,
                scale: float, anneal: Optional[Any] = None) -> Tuple[Tuple, Any]:
    """One step of the windup watch (and an annealing target) over ``x``'s select primitive.

    Args:
        x: ``_HostOps`` or ``_TensorOps``.
        state: ``(ema, ref, trough, below, count, stalled)``, and ``settled``
            with ``anneal``: the smoothed entropy, the spell's lowest
            ``log_alpha`` and entropy, its length, the updates seen, the
            stall flag, the updates settled.
        entropy: the update's entropy (finite: NaN replaced).
        valid: whether the update counts (finite, non-empty).
        target: the target entropy now.
        log_alpha: ``log_alpha`` after the update.
        scale: ``entropy_per_log_alpha`` of the action spec.
        anneal: a ``SettledAnnealing`` target, or None.

    Returns:
        ``(new_state, new_target)``: the target lowered by the annealing rule
        (``target`` itself without ``anneal``).
    """
    ema_before, ref, trough_before, below, count, stalled = state[:6]
    ema = x.where(count == 0, entropy, WATCH_EMA * ema_before + (1 - WATCH_EMA) * entropy)
    # A spell: consecutive updates with the smoothed entropy under the
    # target.  Reaching the target (tracking it) ends it, so a later step up
    # is judged from where it began; one that hovers just under the target
    # while alpha climbs (discrete SAC at 0.98 log|A|) goes on.
    below = x.where(ema < target, below + 1, 0)
    restart = below <= 1
    # Within a spell: the lowest log_alpha and the lowest entropy; once
    # stalled, the trough stays where the stall began (a drift of the entropy
    # down and back is no answer).
    climbed = log_alpha - ref
    trough = x.where(stalled, trough_before, x.minimum(trough_before, ema))
    # An answer: a rise that clears both the nominal share of the climb and
    # the noise (WINDUP_MARGIN of the target).
    answered = (ema - trough) >= x.maximum(WINDUP_RESPONSE * scale * climbed,
                                           WINDUP_MARGIN * x.abs(target))
    stalled = x.where(restart | answered, False, stalled | (climbed >= _LOG_WINDUP_CLIMB))
    new = (ema, x.where(restart, log_alpha, x.minimum(ref, log_alpha)),
           x.where(restart, ema, trough), below, count + 1, stalled)
    if anneal is not None:
        # Settled on the target, or stalled short of it: both count.
        near = x.abs(ema - target) <= anneal.tolerance * x.abs(target)
        settled = x.where(near | stalled, state[6] + 1, 0)
        fire = settled >= anneal.window
        lowered = target - (1 - anneal.factor) * x.abs(target)
        lowered = x.where(lowered < anneal.final, anneal.final, lowered)
        new += (x.where(fire, 0, settled),)
        target = x.where(valid & fire, lowered, target)
    return tuple(x.where(valid, n, o) for n, o in zip(new, state)), target


def _span_rule(x: Any, log_alpha: Any, lowest: Any, highest: Any, span: float) -> Tuple:
    """``limit_log_alpha_span``: ``log_alpha`` clamped to within ``span`` of
    every value since the limit began; the new ``(log_alpha, lowest, highest)``."""
    log_alpha = x.minimum(x.maximum(log_alpha, highest - span), lowest + span)
    return log_alpha, x.minimum(lowest, log_alpha), x.maximum(highest, log_alpha)


def _unreachable(below: Any, stalled: Any, log_alpha: Any, ceiling: float) -> Any:
    """The watch's verdict (tensors or numpy scalars): a long spell below
    the target with ``alpha`` stalled or at its ceiling."""
    return (below >= WINDUP_WINDOW) & (stalled | (log_alpha >= ceiling - 1e-6))


class TargetEntropy:
    """A target entropy (number, scheduler or callable), evaluated on the host.

    No value above the largest entropy the action spec allows (``reachable``)
    is ever used: a constant, or a scheduler whose values are known
    (``Scheduler.max_value``), above it is rejected here; any other callable
    is clamped to it with one warning.  A scheduler whose progress is never
    fed warns once after ``PROGRESS_GRACE`` updates.

    Args:
        target_entropy: a number, a zero-argument callable, or None for the
            sum of ``calc_default_target_entropy`` over the spec.
        action_spec: nest of ``BoundedTensorSpec``.
        name: the controller's name, for messages.

    Raises:
        TypeError: if ``target_entropy`` is neither a number nor callable.
        ValueError: if it is not finite or can exceed the reachable entropy.
    """

    def __init__(self, target_entropy: TargetArg, action_spec: Any, name: str):
        specs = nest.flatten(action_spec)
        self.reachable = float(sum(calc_max_possible_entropy(s) for s in specs))
        if target_entropy is None:
            target_entropy = float(sum(calc_default_target_entropy(s) for s in specs))
            logging.info("%s: target_entropy=%s (the action spec's default)", name, target_entropy)
        if not callable(target_entropy):
            target_entropy = schedulers.ConstantScheduler(
                check_real("target_entropy", target_entropy))
        self.fn = target_entropy
        # Constant on the host; an annealing target moves on the device (the
        # controller's watch).
        self.constant = isinstance(target_entropy, schedulers.ConstantScheduler)
        annealing = isinstance(target_entropy, schedulers.SettledAnnealing)
        self.annealing = target_entropy if annealing else None
        self._name, self._updates, self._warned = name, 0, set()
        try:
            known_max = target_entropy.max_value()
        except (AttributeError, NotImplementedError):
            known_max = None
        if known_max is not None and known_max > self.reachable:
            raise ValueError(
                f"{name}: target_entropy reaches {known_max:.4g}, above the largest entropy the "
                f"action spec allows ({self.reachable:.4g}, e.g. log N for N discrete actions); "
                "the controller would push alpha up forever"
            )
        self.initial = self()

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"{self._name}: {message}", stacklevel=4)

    def __call__(self, counting: bool = False) -> float:
        """The current value; ``counting=True`` for a controller update."""
        value = self.fn()
        if not is_real(value) or not math.isfinite(value):
            raise ValueError(
                f"target_entropy must be a number or a zero-argument callable returning a finite "
                f"number; {self.fn!r} returned {type(value).__name__}: {value!r}"
            )
        if value > self.reachable:
            self._warn_once("clamp", f"target_entropy {value:.4g} is above the largest entropy the "
                            f"action spec allows ({self.reachable:.4g}); clamped to it")
            value = self.reachable
        progress_type = getattr(self.fn, "progress_type", None)
        if counting and progress_type is not None:
            self._updates += 1
            if self._updates >= PROGRESS_GRACE and not schedulers.progress_was_fed(progress_type):
                self._warn_once(
                    "progress",
                    f"the target's progress {progress_type!r} was never fed in {self._updates} "
                    "updates, so the target stays at its first value; call "
                    f"alf_entropy.utils.schedulers.update_progress({progress_type!r}, value)",
                )
        return float(value)


def _scalar_entropy(entropy: Union[float, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """``adjust_alpha``'s input as a detached 0-d tensor on ``like``'s device
    (averaged over the ranks of a data-parallel run: one alpha)."""
    if isinstance(entropy, torch.Tensor):
        if entropy.numel() != 1:
            raise ValueError(
                "entropy must be a number or a one-element tensor, got shape "
                f"{tuple(entropy.shape)}"
            )
        entropy = entropy.detach().reshape(()).to(like.device)
    elif not is_real(entropy):
        raise TypeError(f"entropy must be a number or a tensor, got {type(entropy).__name__}")
    else:
        # A fill, not a host-to-device copy: no synchronisation on a GPU.
        entropy = like.new_full((), float(entropy), dtype=torch.float32)
    return distributed.all_reduce_masked_mean(entropy, None)[0]


_neg = functools.partial(nest.map_structure, torch.neg)


class EntropyController(Algorithm):
    """Base of the entropy controllers: the shared interface (module docstring).

    Subclasses provide ``alpha``, ``target_entropy``, ``stage`` and
    ``_update(mean_entropy, count) -> (alpha, scalar_loss)``.

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions.
        optimizer: optimiser of the controller's parameters (SGD rule only).
        debug_summaries: write the controller's own summaries.
        name: the name (summary scope).

    Raises:
        TypeError: if ``action_spec`` is not a non-empty nest of ``TensorSpec``.
    """

    _adaptive = True
    """Whether the controller moves its own ``log_alpha`` (and is watched)."""

    def __init__(self, action_spec: Any, optimizer: OptimizerArg = None,
                 debug_summaries: bool = False, name: str = "EntropyController"):
        super().__init__(optimizer=optimizer, debug_summaries=debug_summaries, name=name)
        specs = nest.flatten(action_spec)
        if not specs or not all(isinstance(s, TensorSpec) for s in specs):
            raise TypeError(
                f"action_spec must be a non-empty nest of TensorSpec, got {action_spec!r}")
        self._action_spec = action_spec
        self._target: Optional[TargetEntropy] = None
        # The windup watch (``_watch``): saved, so a resumed run warns alike.
        if self._adaptive:
            zeros = functools.partial(torch.zeros, ())
            self.register_buffer("_watch_entropy", zeros(dtype=torch.float32))
            self.register_buffer("_watch_ref", zeros(dtype=torch.float32))
            self.register_buffer("_watch_trough", zeros(dtype=torch.float32))
            self.register_buffer("_watch_below", zeros(dtype=torch.int64))
            self.register_buffer("_watch_count", zeros(dtype=torch.int64))
            self.register_buffer("_stalled", zeros(dtype=torch.bool))
            self.register_buffer("_num_nonfinite", zeros(dtype=torch.int64))
        self._max_log_alpha_watch = math.inf
        self._entropy_scale = entropy_per_log_alpha(action_spec)
        self._warned_unreachable = False
        self._log_alpha_span: Optional[Tuple[float, torch.Tensor, torch.Tensor]] = None

    def _init_target(self, target_entropy: TargetArg) -> TargetEntropy:
        """Make ``self._target`` and the ``_target_now`` buffer the update reads.

        An annealing target (``SettledAnnealing``) is state: its buffers are saved.
        """
        self._target = TargetEntropy(target_entropy, self._action_spec, self._name)
        annealing = self._target.annealing is not None
        self.register_buffer("_target_now", torch.tensor(self._target.initial, dtype=torch.float32),
                             persistent=annealing)
        if annealing:
            self.register_buffer("_settled", torch.zeros((), dtype=torch.int64))
        return self._target

    def _refresh_target(self) -> Optional[float]:
        """Evaluate a scheduled target on the host into ``_target_now``; its value, or None."""
        if self._target.constant:
            return None
        value = self._target(counting=True)
        self._target_now.fill_(value)
        return value

    def _current_target(self) -> float:
        """The target now, on the host (an annealed one is read from its buffer)."""
        if self._target.annealing is not None:
            return float(self._target_now)
        return self._target()

    _update_mode: Optional[str] = None
    """``"host"``, ``"tensor"`` or ``"auto"`` (or ``"compiled"``) for controllers with both
    update paths."""

    def _init_update_mode(self, update_mode: str, modes: Tuple[str, ...] = UPDATE_MODES) -> None:
        """Check ``update_mode`` against ``modes`` and keep it."""
        if update_mode not in modes:
            raise ValueError(f"update_mode must be one of {modes}, got {update_mode!r}")
        self._update_mode = update_mode

    def _use_host(self) -> bool:
        """Whether this update runs on the host path (numpy over CPU buffers)."""
        if self._update_mode is None:
            return False
        on_cpu = self._log_alpha.device.type == "cpu"
        if self._update_mode == "host" and not on_cpu:
            raise ValueError(
                f"{self._name}: update_mode='host' needs the controller on the CPU, "
                f"it is on {self._log_alpha.device}; use 'tensor' or 'auto'"
            )
        return self._update_mode == "host" or (self._update_mode == "auto" and on_cpu)

    def _reads_host(self) -> bool:
        """Whether the update already runs on the host (then reading its state is free)."""
        return self._use_host()

    @property
    def unreachable_target(self) -> torch.Tensor:
        """True (0-d bool) while the target looks unreachable: the entropy has
        stayed below it for ``WINDUP_WINDOW`` updates while ``alpha`` climbed
        without the entropy answering (``_watch``) or sits at its ceiling;
        for a nested controller, any leaf's."""
        if not self._adaptive:
            result = self.stage.new_zeros((), dtype=torch.bool)
            for leaf in self._adaptive_leaves():
                result = result | leaf.unreachable_target
            return result
        return _unreachable(self._watch_below, self._stalled, self.log_alpha,
                            self._max_log_alpha_watch)

    @property
    def num_nonfinite_entropy(self) -> torch.Tensor:
        """How many updates had a NaN/inf entropy from a non-empty batch (and
        left the controller as it was); 0-d int64, summed over the leaves of
        a nested controller."""
        total = self.stage.new_zeros((), dtype=torch.int64)
        for leaf in self._adaptive_leaves():
            total = total + leaf._num_nonfinite
        return total

    def _adaptive_leaves(self) -> List["EntropyController"]:
        return [c for c in self.leaf_algorithms().values() if c._adaptive]

    def _windup_stalled(self) -> torch.Tensor:
        """True (0-d bool) while ``alpha`` has climbed without the entropy
        answering (``_watch``)."""
        return self._stalled

    def limit_log_alpha_span(self, span: Optional[float]) -> None:
        """From now on keep ``max(log_alpha) - min(log_alpha) <= span`` (until None).

        Each update is clamped to within ``span`` of every value since the
        call, so ``alpha`` moves by at most ``exp(span)`` over the whole
        stretch, e.g. one iteration of an actor-critic.  No host reads.

        Args:
            span: the largest spread of ``log_alpha`` (>= 0), or None to stop.
        """
        if span is None or not self._adaptive:
            self._log_alpha_span = None
            return
        now = self._log_alpha.detach().clone()
        self._log_alpha_span = (float(span), now, now.clone())  # (span, lowest, highest)

    def _advance(self, entropy: torch.Tensor,
                 count: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Any]:
        """``_update``, then the watch (windup, annealing); ``(alpha, scalar_loss)``."""
        alpha, scalar_loss = self._update(entropy, count)
        if self._finish(entropy, count):
            alpha = self.alpha
        return alpha, scalar_loss

    def _finish(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> bool:
        """After an update: the span limit, the watch, the debug summaries.

        Returns:
            Whether the span limit may have moved ``log_alpha``.
        """
        limited = self._adaptive and self._apply_log_alpha_limits()
        if self._adaptive:
            self._watch(entropy, count)
        if self._debug_summaries and summary.should_record_summaries():
            self._summarize()
        return limited

    def _summarize(self) -> None:
        """Write the controller's debug summaries (after the update and its limits)."""

    def _apply_log_alpha_limits(self) -> bool:
        """Clamp ``log_alpha`` to ``limit_log_alpha_span``'s range; whether one is set."""
        if self._log_alpha_span is None:
            return False
        span, lowest, highest = self._log_alpha_span
        state = (self._log_alpha, lowest, highest)
        if self._reads_host():
            views = [buf.detach().numpy() for buf in state]
            for view, value in zip(views, _span_rule(_HostOps, *(v[()] for v in views), span)):
                view[()] = value
        else:
            with torch.no_grad():
                for buf, value in zip(state, _span_rule(_TensorOps, *state, span)):
                    buf.copy_(value)
        return True

    def _watch_state(self) -> Tuple[torch.Tensor, ...]:
        state = (self._watch_entropy, self._watch_ref, self._watch_trough, self._watch_below,
                 self._watch_count, self._stalled)
        return state if self._target.annealing is None else state + (self._settled,)

    def _watch(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> None:
        """Count a NaN/inf entropy; track a smoothed entropy against the target (``_watch_rule``).

        * windup: in a spell of updates below the target, ``_stalled`` once
          ``alpha`` has climbed ``WINDUP_CLIMB``-fold while the entropy rose
          from its trough by less than ``WINDUP_RESPONSE`` of the nominal
          ``entropy_per_log_alpha`` for that climb (the PID controller then
          holds alpha), until it does or the spell ends.
        * ``SettledAnnealing``: after ``window`` consecutive updates within
          ``tolerance`` of the target or stalled short of it, lower it.

        On the host path (CPU state) the rule runs on numpy scalars, else in
        tensor ops (no host read).
        """
        anneal, state = self._target.annealing, self._watch_state()
        log_alpha = self.log_alpha.detach()
        on_host = self._reads_host()
        if on_host:
            h = entropy.detach().to("cpu", torch.float32).numpy()[()]
            has_data = count is None or count.cpu().numpy()[()] > 0
            valid = has_data and np.isfinite(h)
            if has_data and not valid:
                self._num_nonfinite.add_(1)
            views = [buf.numpy() for buf in state + (self._target_now,)]
            la = log_alpha.numpy()[()]
            new, target = _watch_rule(_HostOps, tuple(v[()] for v in views[:-1]),
                                      h if valid else np.float32(0.0), valid, views[-1][()], la,
                                      self._entropy_scale, anneal)
            for view, value in zip(views, new + (target,)):
                view[()] = value
            unreachable = _unreachable(new[3], new[5], la, self._max_log_alpha_watch)
        else:
            finite = torch.isfinite(entropy)
            has_data = True if count is None else count > 0
            self._num_nonfinite.add_(~finite & has_data)
            h = torch.nan_to_num(entropy.detach().to(torch.float32))
            new, target = _watch_rule(_TensorOps, state, h, finite & has_data, self._target_now,
                                      log_alpha, self._entropy_scale, anneal)
            if anneal is not None:
                state, new = state + (self._target_now,), new + (target,)
            for buf, value in zip(state, new):
                buf.copy_(value)
            unreachable = None
        recording = summary.should_record_summaries()
        if recording:
            with summary.scope(self._name):
                summary.scalar("unreachable_target", self.unreachable_target)
                if anneal is not None:
                    summary.scalar("target_entropy", self._target_now)
        # Read on the host only where it costs nothing more: a summary step
        # (already synchronising) or a host-path update.
        if not self._warned_unreachable and (recording or on_host):
            if unreachable is None:  # a summary step: it reads the device anyway
                unreachable = self.unreachable_target
            if bool(unreachable):
                self._warned_unreachable = True
                message = (
                    f"{self._name}: the entropy ({float(self._watch_entropy):.4g}) has stayed "
                    f"below the target ({float(self._target_now):.4g}) for "
                    f"{int(self._watch_below)} updates while alpha climbed to "
                    f"{float(log_alpha.exp()):.4g}; the target looks unreachable for this policy. "
                    "Lower target_entropy (e.g. greedy_probability_target or SettledAnnealing) "
                    "or set max_alpha."
                )
                logging.warning(message)
                warnings.warn(message, stacklevel=3)

    @classmethod
    def from_space(cls, space: Any, **kwargs: Any) -> "EntropyController":
        """The controller for a gymnasium action space.

        Args:
            space: a ``gymnasium.spaces.Space`` (``Box``, ``Discrete``,
                ``MultiDiscrete``, ``Dict``, ``Tuple``).
            **kwargs: the other constructor arguments.

        Returns:
            ``cls(from_gym_space(space), **kwargs)``.
        """
        return cls(from_gym_space(space), **kwargs)

    @property
    def action_spec(self) -> Any:
        """The action spec."""
        return self._action_spec

    @property
    def alpha(self) -> torch.Tensor:
        """The current entropy coefficient, ``exp(log_alpha)`` (a detached 0-d tensor)."""
        return self.log_alpha.exp()

    @property
    def log_alpha(self) -> torch.Tensor:
        """``log(alpha)`` (a detached view of the state)."""
        return self._log_alpha.detach()

    @property
    def target_entropy(self) -> float:
        """The current target entropy (a host float; a scheduled one evaluated now)."""
        return self._current_target()

    @property
    def stage(self) -> torch.Tensor:
        """The stage (0-d int32): < -2 estimating, -2 init, -1 free, 0/1 adjust."""
        raise NotImplementedError

    def leaf_algorithms(self) -> Dict[str, "EntropyController"]:
        """The per-action controllers by path in the spec; ``{"": self}`` unless nested."""
        return {"": self}

    def adjust_alpha(self, entropy: Union[float, torch.Tensor]) -> torch.Tensor:
        """One update from the (batch-mean) entropy; NaN/inf changes nothing.

        Args:
            entropy: a Python float or a one-element tensor.

        Returns:
            The new ``alpha``, a 0-d tensor on the controller's device.

        Raises:
            TypeError: if ``entropy`` is neither a number nor a tensor.
            ValueError: if it is a tensor with more than one element.
        """
        alpha, _ = self._advance(_scalar_entropy(entropy, self.stage), None)
        return alpha

    def entropy_loss(self, entropy: torch.Tensor, mask: Optional[torch.Tensor] = None,
                     entropy_for_gradient: Optional[torch.Tensor] = None,
                     update: bool = True) -> LossInfo:
        """One update from the masked mean of ``entropy`` (detached); the bonus as a loss.

        No element counting, or a NaN/inf mean, leaves the controller as is.

        Args:
            entropy: per-step entropies, any shape.
            mask: bool or 0/1, broadcastable with ``entropy`` (the mean is over
                the broadcast elements); masked-out entries may be NaN.  None:
                every element counts.
            entropy_for_gradient: what to differentiate instead of ``entropy``.
            update: False: only the loss with the current ``alpha`` (no
                update, ``scalar_loss`` zero), for a caller that advances the
                controller itself, e.g. once per iteration with ``adjust_alpha``.

        Returns:
            LossInfo: ``loss = -alpha * entropy_for_gradient`` per element
            (``alpha`` detached); ``scalar_loss``: a 0-d tensor to add to the
            total loss: the SGD rule's ``log_alpha * (mean_entropy - target)``
            when a parent's optimiser trains ``log_alpha`` (the rule steps
            itself otherwise), zero for the others;
            ``extra``: an ``EntropyTargetLossInfo``.

        Raises:
            ValueError: if ``mask`` does not broadcast with ``entropy``.
        """
        grad = entropy if entropy_for_gradient is None else entropy_for_gradient
        return self._loss(_neg(entropy), mask, _neg(grad), update)

    def _loss(self, neg_entropy: Any, mask: Optional[torch.Tensor], neg_grad: Any,
              update: bool) -> LossInfo:
        """``entropy_loss`` on negated entropies (the form ``train_step`` stores)."""
        if not update:
            return LossInfo(loss=neg_grad * self.alpha.detach(),
                            scalar_loss=torch.zeros((), device=neg_grad.device),
                            extra=EntropyTargetLossInfo(neg_entropy=neg_entropy))
        detached = neg_entropy.detach()
        neg_mean, count = masked_mean(detached, mask)
        # Data-parallel: the mean over every rank's batch, so alpha is one.
        pooled, pooled_count = distributed.all_reduce_masked_mean(neg_mean, count)
        alpha, scalar_loss = self._advance(-pooled, pooled_count)
        if not isinstance(scalar_loss, torch.Tensor):  # no loss of its own: a zero to add
            scalar_loss = torch.zeros((), device=neg_grad.device)
        if self._debug_summaries and summary.should_record_summaries():
            square, _ = masked_mean(detached * detached, mask)
            with summary.scope(self._name):
                std = torch.sqrt(torch.clamp(square - neg_mean * neg_mean, min=0.0))
                summary.scalar("entropy_std", std)
        return LossInfo(loss=neg_grad * alpha.detach(), scalar_loss=scalar_loss,
                        extra=EntropyTargetLossInfo(neg_entropy=neg_entropy))

    def _update(self, entropy: torch.Tensor,
                count: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Any]:
        """Advance once (not if ``count == 0``); return ``(alpha, scalar_loss)``
        (``scalar_loss``: a 0-d tensor, or ``()`` for none)."""
        raise NotImplementedError

    def predict_step(self, *args: Any, **kwargs: Any) -> AlgStep:
        """Nothing to do when acting for evaluation: an empty ``AlgStep``."""
        return AlgStep()

    def rollout_step(self, distribution: Any, step_type: Any = None,
                     on_policy_training: bool = True) -> AlgStep:
        """``train_step`` when training on-policy, else an empty ``AlgStep``.

        Args:
            distribution: nest of action distributions from the policy.
            step_type: unused (masking happens in ``calc_loss``).
            on_policy_training: if False, return an empty ``AlgStep``.

        Returns:
            AlgStep: as ``train_step`` (empty off-policy).
        """
        return self.train_step(distribution, step_type) if on_policy_training else AlgStep()

    def train_step(self, distribution: Any, step_type: Any = None) -> AlgStep:
        """The policy's entropy and its gradient surrogate, for ``calc_loss``.

        Args:
            distribution: nest of action distributions; a per-dimension one
                (e.g. ``Normal`` ``[T, B, D]``) is summed over the spec's dims.
            step_type: unused (masking happens in ``calc_loss``).

        Returns:
            AlgStep: ``info=EntropyTargetInfo(loss=LossInfo(loss=-entropy_for_gradient,
            extra=EntropyTargetLossInfo(neg_entropy=-entropy)))``.
        """
        entropy, for_gradient = self._entropy(distribution)
        return AlgStep(info=EntropyTargetInfo(loss=LossInfo(
            loss=_neg(for_gradient), extra=EntropyTargetLossInfo(neg_entropy=_neg(entropy)))))

    def _entropy(self, distribution: Any) -> Tuple[Any, Any]:
        return entropy_with_fallback(distribution, action_spec=self._action_spec)

    def calc_loss(self, experience: Experience, info: EntropyTargetInfo,
                  valid_mask: Optional[torch.Tensor] = None) -> LossInfo:
        """``entropy_loss`` over the steps that are not ``LAST`` and are valid.

        Args:
            experience: anything with a ``step_type`` tensor broadcastable
                with the entropies (e.g. ``[T, B]``, ``[B]`` or 0-d).
            info: the (time-stacked) ``EntropyTargetInfo`` of ``train_step``.
            valid_mask: optional bool or 0/1 mask, broadcastable likewise.

        Returns:
            LossInfo: see ``entropy_loss``.

        Raises:
            ValueError: if ``valid_mask``, ``step_type`` and the entropy do
                not broadcast together.
        """
        mask = experience.step_type != StepType.LAST
        if valid_mask is not None:
            try:
                mask = mask & (valid_mask != 0)
            except RuntimeError as e:
                raise ValueError(f"valid_mask of shape {tuple(valid_mask.shape)} does not "
                                 "broadcast with experience.step_type of shape "
                                 f"{tuple(mask.shape)}") from e
        return self._loss(info.loss.extra.neg_entropy, mask, info.loss.loss, True)


@gin.configurable
class FixedEntropyCoefficient(EntropyController):
    """A constant ``alpha``: "no adjustment" as a controller.

    ``entropy_target_cls = @FixedEntropyCoefficient`` (with
    ``enforce_entropy_target=True``) gives an actor-critic a fixed entropy
    coefficient through the same code path as the adaptive controllers.

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions.
        alpha: the coefficient (>= 0).
        target_entropy: only reported; None for the spec's default.
        debug_summaries: write ``entropy_std`` of each batch.
        name: the name.

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> fixed = FixedEntropyCoefficient(BoundedTensorSpec((), torch.int64, 0, 3), alpha=0.05)
        >>> fixed.entropy_loss(torch.full((4,), 1.0)).loss  # -alpha * entropy, every update
        tensor([-0.0500, -0.0500, -0.0500, -0.0500])
    """

    _adaptive = False

    def __init__(self, action_spec: Any, alpha: float = 0.01,
                 target_entropy: Optional[float] = None,
                 debug_summaries: bool = False, name: str = "FixedEntropyCoefficient"):
        super().__init__(action_spec, debug_summaries=debug_summaries, name=name)
        alpha = check_real("alpha", alpha, minimum=0.0)
        self._target_entropy = TargetEntropy(target_entropy, action_spec, name).initial
        self.register_buffer("_alpha", torch.tensor(alpha, dtype=torch.float32), persistent=False)
        self.register_buffer("_stage", torch.tensor(-1, dtype=torch.int32), persistent=False)

    @property
    def alpha(self) -> torch.Tensor:
        """The constant ``alpha``."""
        return self._alpha

    @property
    def target_entropy(self) -> float:
        """The reported target."""
        return self._target_entropy

    @property
    def stage(self) -> torch.Tensor:
        """Always -1 (the free stage: alpha fixed)."""
        return self._stage

    def _update(self, entropy: torch.Tensor,
                count: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Any]:
        return self._alpha, ()
