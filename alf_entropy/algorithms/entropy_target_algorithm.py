"""Entropy target controllers: keep a policy's entropy near a target.

``EntropyTargetAlgorithm`` is ALF's adaptive entropy regulariser (the PyTorch
version of ``alf/algorithms/entropy_target_algorithm.py``).  It is a
sub-algorithm: an actor-critic calls its ``rollout_step``/``train_step`` with
the action distribution, adds its ``calc_loss`` to the policy loss, and the
controller turns the entropy it sees into a coefficient ``alpha`` for the
entropy bonus (the loss it returns is ``-alpha * entropy`` per step).

How ``alpha`` moves is a small state machine over ``stage``:

* **estimate max entropy** (``stage < -2``, only when ``max_entropy`` is not
  given): for the first ``average_window`` calls, ``max_entropy`` is set to
  ``min(0.8 * H, H / 0.8)`` of the running average entropy ``H``, i.e. a
  little less random than the initial policy.
* **stage 0 / init** (``stage == -2``): if the average entropy is above
  ``max_entropy``, ``log_alpha`` is nudged down by ``very_slow_update_rate``
  each call (up by half of it while the entropy is falling), so a user may
  start with an over-large ``initial_alpha``.  Once the average entropy drops
  below ``max_entropy`` the controller moves on.
* **stage 1 / free** (``stage == -1``): ``alpha`` stays fixed and the policy
  learns freely until the average entropy falls below ``target_entropy``.
* **stage 2 / adjust** (``stage`` is 0 below the target, 1 above it):
  ``log_alpha`` changes by ``update_rate`` times ``+1`` (below target and
  decreasing), ``+0.5`` (above and decreasing), ``-0.5`` (below and
  increasing) or ``-1`` (above and increasing).  Pushing against the trend even
  on the "wrong" side of the target damps oscillation.  ``update_rate`` starts
  at ``fast_update_rate``, shrinks by 0.9 at each crossing of the target (not
  below ``slow_update_rate``), and jumps back to ``fast_update_rate`` when the
  current entropy falls under ``fast_stage_thresh`` (half the target if it is
  positive, twice it if negative).

The stage checks are sequential, so one call may cascade through several
stages (e.g. init -> free -> adjust), exactly as in ALF.  ``log_alpha`` never
goes below ``log(min_alpha)``.

Differences from ALF (defects fixed, behaviour otherwise step-for-step equal):

* No host synchronisation: the stage machine is expressed with
  ``torch.where`` over tensors held in registered buffers ("tensor" mode), so
  on a GPU a training step never waits for the device.  When the state lives
  on the CPU there is nothing to synchronise with, and an equivalent plain
  Python implementation over the same buffers is used ("host" mode, several
  times faster for scalars); tests prove the two and ALF's code agree.
* ``valid_mask`` is a real ``[T, B]`` mask (ALF tested it with a Python ``if``,
  which fails for a tensor); an empty mask, or a NaN/inf entropy, leaves all
  state unchanged (the latter is counted in ``num_nonfinite_entropy``).
* ``min_alpha <= 0`` means "no floor but ``exp(-100)``", as ALF documents
  (ALF's code took ``log(0) = -inf``).
* User errors raise ``ValueError``/``TypeError`` naming the argument instead
  of ``assert``.

``SGDEntropyTargetAlgorithm`` is SAC's gradient rule for the same job and
``NestedEntropyTargetAlgorithm`` runs one controller per action of a nested
action spec; all three share the same interface, so a gin line swaps them.
"""
import functools
import math
import numbers
import warnings
from typing import Any, Callable, Dict, Optional, Tuple, Union

import gin
import numpy as np
import torch
import torch.nn as nn
from absl import logging

from alf_entropy.algorithms.algorithm import Algorithm, OptimizerArg
from alf_entropy.data_structures import AlgStep, Experience, LossInfo, StepType, namedtuple
from alf_entropy.tensor_specs import TensorSpec, from_gym_space
from alf_entropy.utils import nest, summary
from alf_entropy.utils.checks import check_int, check_real, is_real
from alf_entropy.utils.math_ops import masked_mean
from alf_entropy.utils.averager import ScalarWindowAverager
from alf_entropy.utils.dist_utils import (
    calc_default_target_entropy,
    calc_max_possible_entropy,
    entropy_with_fallback,
)
from alf_entropy.utils.schedulers import ConstantScheduler

__all__ = [
    "EntropyTargetLossInfo",
    "EntropyTargetInfo",
    "EntropyController",
    "EntropyTargetAlgorithm",
    "FixedEntropyCoefficient",
    "NestedEntropyTargetAlgorithm",
    "SGDEntropyTargetAlgorithm",
]

EntropyTargetLossInfo = namedtuple("EntropyTargetLossInfo", ["neg_entropy"], default_value=())
"""``extra`` of the controller's ``LossInfo``: the per-step negative entropy."""

EntropyTargetInfo = namedtuple("EntropyTargetInfo", ["loss"], default_value=())
"""``info`` of the controller's ``rollout_step``/``train_step``."""

TargetArg = Optional[Union[float, Callable[[], float]]]

_UPDATE_MODES = ("auto", "tensor", "host", "compiled")


def _as_target_fn(target_entropy: TargetArg, action_spec: Any) -> Callable[[], float]:
    """Turn the ``target_entropy`` argument into a zero-argument callable."""
    if target_entropy is None:
        target_entropy = float(
            sum(calc_default_target_entropy(s) for s in nest.flatten(action_spec))
        )
        logging.info("target_entropy=%s (default for the action spec)", target_entropy)
    if callable(target_entropy):
        return target_entropy
    return ConstantScheduler(check_real("target_entropy", target_entropy))


def _target_value(target_fn: Callable[[], float]) -> float:
    """Evaluate the target on the host (schedulers are host-side floats)."""
    value = target_fn()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(
            "target_entropy must be a number or a zero-argument callable returning "
            f"a number; the callable {target_fn!r} returned {type(value).__name__}: {value!r}"
        )
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"target_entropy callable {target_fn!r} returned {value}")
    return value


def _seed_rate(rate: float) -> float:
    """The value ALF's ``torch.tensor(rate)`` holds (float32 for a Python float,
    float64 for a numpy float64 such as the default ``np.log(2)``)."""
    return float(torch.tensor(rate).to(torch.float64))


def _scalar_entropy(entropy: Union[float, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """``adjust_alpha``'s input as a detached 0-d tensor on ``like``'s device."""
    if isinstance(entropy, torch.Tensor):
        if entropy.numel() != 1:
            raise ValueError(
                f"entropy must be a number or a one-element tensor, got shape {tuple(entropy.shape)}"
            )
        return entropy.detach().reshape(()).to(like.device)
    if not is_real(entropy):
        raise TypeError(f"entropy must be a number or a tensor, got {type(entropy).__name__}")
    # A fill, not a host-to-device copy: no synchronisation on a GPU.
    return like.new_full((), float(entropy), dtype=torch.float32)


class EntropyController(Algorithm):
    """The interface every entropy controller shares.

    A controller turns the policy's entropy into the entropy coefficient
    ``alpha``.  Two calls cover every use:

    * ``adjust_alpha(entropy)``: one update from a (batch-mean) entropy, a
      Python float or a tensor; returns the new ``alpha``.
    * ``entropy_loss(entropy, mask)``: one update from the masked mean of a
      batch of entropies, returning the loss ``-alpha * entropy`` per element
      (and, for the SGD rule, the loss of ``log_alpha`` as ``scalar_loss``).

    As a sub-algorithm of an actor-critic, ``train_step(distribution)``
    computes the entropy and ``calc_loss(experience, info, valid_mask)``
    masks ``LAST`` steps and calls ``entropy_loss``.  ``alpha``,
    ``target_entropy`` and ``stage`` are readable on every controller;
    ``leaf_algorithms()`` gives the per-action controllers of a nested one.
    Nothing here reads a tensor on the host.

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions.
        optimizer: optimiser of the controller's parameters (SGD rule only).
        debug_summaries: write the controller's own summaries.
        name: the name (summary scope).

    Raises:
        TypeError: if ``action_spec`` is not a non-empty nest of ``TensorSpec``.
    """

    def __init__(
        self,
        action_spec: Any,
        optimizer: OptimizerArg = None,
        debug_summaries: bool = False,
        name: str = "EntropyController",
    ):
        super().__init__(optimizer=optimizer, debug_summaries=debug_summaries, name=name)
        specs = nest.flatten(action_spec)
        if not specs or not all(isinstance(s, TensorSpec) for s in specs):
            raise TypeError(f"action_spec must be a non-empty nest of TensorSpec, got {action_spec!r}")
        self._action_spec = action_spec

    @classmethod
    def from_space(cls, space: Any, **kwargs: Any) -> "EntropyController":
        """Build the controller for a gymnasium action space.

        Args:
            space: a ``gymnasium.spaces.Space`` (``Box``, ``Discrete``,
                ``MultiDiscrete``, ``Dict``, ``Tuple``).
            **kwargs: the other constructor arguments.

        Returns:
            The controller, for ``from_gym_space(space)`` as action spec.
        """
        return cls(from_gym_space(space), **kwargs)

    # ------------------------------------------------------------ interface
    @property
    def action_spec(self) -> Any:
        """The action spec."""
        return self._action_spec

    @property
    def alpha(self) -> torch.Tensor:
        """The current entropy coefficient (a detached 0-d tensor)."""
        raise NotImplementedError

    @property
    def target_entropy(self) -> float:
        """The current target entropy (host float)."""
        raise NotImplementedError

    @property
    def stage(self) -> torch.Tensor:
        """The stage (0-d int32 tensor); see ``EntropyTargetAlgorithm.stage``."""
        raise NotImplementedError

    def leaf_algorithms(self) -> Dict[str, "EntropyController"]:
        """The per-action controllers keyed by path (``{"": self}`` if not nested)."""
        return {"": self}

    def adjust_alpha(self, entropy: Union[float, torch.Tensor]) -> torch.Tensor:
        """One controller update from the (batch-mean) entropy.

        Args:
            entropy: a Python float or a one-element tensor.  NaN/inf
                leaves the controller unchanged.

        Returns:
            The new ``alpha``, a 0-d tensor on the controller's device.

        Raises:
            TypeError: if ``entropy`` is neither a number nor a tensor.
            ValueError: if it is a tensor with more than one element.
        """
        alpha, _ = self._update(_scalar_entropy(entropy, self.alpha), None)
        return alpha

    def entropy_loss(
        self,
        entropy: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        entropy_for_gradient: Optional[torch.Tensor] = None,
    ) -> LossInfo:
        """One update from a batch of entropies; the entropy bonus as a loss.

        The controller advances once with the mean of ``entropy`` (detached)
        over the elements where ``mask`` is non-zero.  No element counting
        (all masked out) or a NaN/inf mean leaves the controller unchanged.

        Args:
            entropy: per-step entropies, any shape.
            mask: bool or 0/1 mask broadcastable with ``entropy``; masked-out
                entries may be NaN.  None uses every element.
            entropy_for_gradient: what to differentiate instead of
                ``entropy`` (e.g. a sampled estimate's surrogate).

        Returns:
            LossInfo: ``loss = -alpha * entropy_for_gradient`` per element
            (``alpha`` detached), ``scalar_loss`` the controller's own loss
            (SGD rule: ``log_alpha * (mean_entropy - target)``; ``()`` for the
            others) and ``extra`` an ``EntropyTargetLossInfo``.

        Raises:
            ValueError: if ``mask`` does not broadcast with ``entropy``.
        """
        detached = entropy.detach()
        mean, count = masked_mean(detached, mask)
        alpha, scalar_loss = self._update(mean, count)
        if self._debug_summaries and summary.should_record_summaries():
            self._summarize_batch(detached, mask, mean, count)
        grad = entropy if entropy_for_gradient is None else entropy_for_gradient
        return LossInfo(
            loss=-alpha.detach() * grad,
            scalar_loss=scalar_loss,
            extra=EntropyTargetLossInfo(neg_entropy=-entropy),
        )

    def _update(
        self, entropy: torch.Tensor, count: Optional[torch.Tensor]
    ) -> Tuple[torch.Tensor, Any]:
        """Advance once (skipped when ``count == 0``); return ``(alpha, scalar_loss)``."""
        raise NotImplementedError

    def _summarize_batch(
        self, entropy: torch.Tensor, mask: Optional[torch.Tensor], mean: torch.Tensor, count: torch.Tensor
    ) -> None:
        """Debug summaries of a batch (``entropy_loss``); none by default."""

    # ---------------------------------------------------------------- steps
    def predict_step(self, *args: Any, **kwargs: Any) -> AlgStep:
        """Nothing to do when acting for evaluation.

        Returns:
            AlgStep: empty.
        """
        return AlgStep()

    def rollout_step(
        self, distribution: Any, step_type: Any = None, on_policy_training: bool = True
    ) -> AlgStep:
        """``train_step`` when training on-policy, else an empty ``AlgStep``.

        Args:
            distribution: nest of action distributions from the policy.
            step_type: unused (masking happens in ``calc_loss``).
            on_policy_training: if False, return an empty ``AlgStep``.

        Returns:
            AlgStep: as ``train_step`` (empty off-policy).
        """
        if on_policy_training:
            return self.train_step(distribution, step_type)
        return AlgStep()

    def train_step(self, distribution: Any, step_type: Any = None) -> AlgStep:
        """Compute the entropy (and its gradient surrogate) of the policy.

        Args:
            distribution: nest of action distributions from the policy; a
                per-dimension one (e.g. ``Normal`` of shape ``[T, B, D]``) is
                summed over the action dims of the spec.
            step_type: unused (masking happens in ``calc_loss``).

        Returns:
            AlgStep: ``info=EntropyTargetInfo(loss=LossInfo(loss=-entropy_for_gradient,
            extra=EntropyTargetLossInfo(neg_entropy=-entropy)))``.
        """
        entropy, entropy_for_gradient = self._entropy(distribution)
        neg = functools.partial(nest.map_structure, torch.neg)
        return AlgStep(
            info=EntropyTargetInfo(
                loss=LossInfo(
                    loss=neg(entropy_for_gradient),
                    extra=EntropyTargetLossInfo(neg_entropy=neg(entropy)),
                )
            )
        )

    def _entropy(self, distribution: Any) -> Tuple[Any, Any]:
        return entropy_with_fallback(distribution, action_spec=self._action_spec)

    def calc_loss(
        self,
        experience: Experience,
        info: EntropyTargetInfo,
        valid_mask: Optional[torch.Tensor] = None,
    ) -> LossInfo:
        """``entropy_loss`` over the steps that are not ``LAST`` and valid.

        Args:
            experience: anything with a ``step_type`` tensor broadcastable
                with the entropies (e.g. ``[T, B]``, ``[B]`` or 0-d).
            info: the (time-stacked) ``EntropyTargetInfo`` of ``train_step``.
            valid_mask: optional bool or 0/1 mask, broadcastable likewise.

        Returns:
            LossInfo: see ``entropy_loss``.

        Raises:
            ValueError: if ``valid_mask`` and ``step_type`` do not broadcast
                together or with the entropy.
        """
        mask = experience.step_type != StepType.LAST
        if valid_mask is not None:
            try:
                mask = mask & (valid_mask != 0)
            except RuntimeError as e:
                raise ValueError(
                    f"valid_mask of shape {tuple(valid_mask.shape)} does not broadcast "
                    f"with experience.step_type of shape {tuple(mask.shape)}"
                ) from e
        neg = functools.partial(nest.map_structure, torch.neg)
        return self.entropy_loss(
            neg(info.loss.extra.neg_entropy), mask, entropy_for_gradient=neg(info.loss.loss)
        )


@gin.configurable
class EntropyTargetAlgorithm(EntropyController):
    """Adjusts the entropy coefficient ``alpha`` so entropy stays >= a target.

    See the module docstring for the algorithm.  To approximately reproduce
    SAC's learned temperature, use SAC's ``target_entropy``, set
    ``skip_free_stage=True`` and ``slow_update_rate = fast_update_rate = 4 *``
    SAC's temperature learning rate.

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions; used for
            the default ``target_entropy`` and to reject unreachable targets.
        initial_alpha: initial ``alpha`` (> 0, >= ``min_alpha``); large enough
            for meaningful initial exploration.
        skip_free_stage: start directly in the adjust stage.
        max_entropy: upper bound of the entropy; if None it is estimated from
            the first ``average_window`` calls as ``min(0.8 H, H / 0.8)``.
        target_entropy: the lower bound of the entropy: a number, a
            ``Scheduler`` or any zero-argument callable returning a number
            (evaluated at every update, e.g. ``@LinearScheduler()`` in gin).
            None uses ``calc_default_target_entropy`` summed over the spec.
        very_slow_update_rate: the ``log_alpha`` step in stage 0 (> 0).
        slow_update_rate: the smallest ``log_alpha`` step in the adjust stage.
        fast_update_rate: the largest ``log_alpha`` step in the adjust stage.
        min_alpha: floor of ``alpha``; ``<= 0`` means ``exp(-100)``.
        average_window: how many calls the entropy is averaged over (>= 1).
        update_mode: ``"tensor"`` (``torch.where`` stage machine, never syncs a
            GPU), ``"compiled"`` (the same under ``torch.compile``: fused into
            a few kernels, after a one-off compilation on the first update),
            ``"host"`` (plain Python over CPU buffers; only valid on the CPU)
            or ``"auto"`` (host on the CPU, tensor elsewhere).
        debug_summaries: write ``alpha``, ``avg_entropy``, ``stage``,
            ``update_rate``, ``entropy_std``, ``nonfinite_entropy`` and (for a
            non-constant target) ``target_entropy`` under ``name``.
        name: the name (summary scope).

    Raises:
        TypeError: for an argument of the wrong type.
        ValueError: for an argument out of range, ``target_entropy >
            max_entropy``, or a constant target above the largest entropy the
            action spec allows.
    """

    def __init__(
        self,
        action_spec: Any,
        initial_alpha: float = 0.1,
        skip_free_stage: bool = False,
        max_entropy: Optional[float] = None,
        target_entropy: TargetArg = None,
        very_slow_update_rate: float = 0.001,
        slow_update_rate: float = 0.01,
        fast_update_rate: float = np.log(2),
        min_alpha: float = 1e-4,
        average_window: int = 2,
        update_mode: str = "auto",
        debug_summaries: bool = False,
        name: str = "EntropyTargetAlgorithm",
    ):
        super().__init__(action_spec, debug_summaries=debug_summaries, name=name)
        check_real("initial_alpha", initial_alpha, positive=True)
        for arg, value in (
            ("very_slow_update_rate", very_slow_update_rate),
            ("slow_update_rate", slow_update_rate),
            ("fast_update_rate", fast_update_rate),
        ):
            check_real(arg, value, positive=True)
        check_real("min_alpha", min_alpha)
        check_int("average_window", average_window, minimum=1)
        if update_mode not in _UPDATE_MODES:
            raise ValueError(f"update_mode must be one of {_UPDATE_MODES}, got {update_mode!r}")
        min_log_alpha = math.log(min_alpha) if min_alpha > 0 else -100.0
        if min_alpha > 0 and initial_alpha < min_alpha:
            raise ValueError(
                f"initial_alpha ({initial_alpha}) must be >= min_alpha ({min_alpha})"
            )

        self._action_spec = action_spec
        self._target_entropy = _as_target_fn(target_entropy, action_spec)
        self._constant_target = isinstance(self._target_entropy, ConstantScheduler)
        target0 = _target_value(self._target_entropy)
        reachable = float(sum(calc_max_possible_entropy(s) for s in nest.flatten(action_spec)))
        if target0 > reachable:
            msg = (
                f"{name}: target_entropy {target0:.4g} is above the largest entropy the "
                f"action spec allows ({reachable:.4g}, e.g. log N for an N-way discrete "
                "action); the controller would push alpha up forever"
            )
            if self._constant_target:
                raise ValueError(msg)
            warnings.warn(msg + " (at the schedule's initial value)")
        if max_entropy is not None:
            max_entropy = check_real("max_entropy", max_entropy)
            if target0 > max_entropy:
                raise ValueError(
                    f"target_entropy ({target0}) must be <= max_entropy ({max_entropy})"
                )

        self._average_window = average_window
        self._update_mode = update_mode
        self._avg_entropy = ScalarWindowAverager(average_window)
        # Changing state (saved by state_dict).
        self.register_buffer(
            "_log_alpha", torch.tensor(np.log(initial_alpha), dtype=torch.float32)
        )
        if skip_free_stage:
            stage = 1
        elif max_entropy is None:
            stage = -2 - average_window
        else:
            stage = -2
        self.register_buffer("_stage", torch.tensor(stage, dtype=torch.int32))
        self.register_buffer(
            "_update_rate", torch.tensor(fast_update_rate, dtype=torch.float32)
        )
        self.register_buffer(
            "_max_entropy",
            torch.tensor(0.0 if max_entropy is None else max_entropy, dtype=torch.float32),
        )
        self.register_buffer("_num_nonfinite", torch.zeros((), dtype=torch.int64))
        # Constants (not saved; buffers so that .to(device) moves them).  Their
        # dtypes reproduce ALF's arithmetic exactly (see _seed_rate).
        # min_log_alpha, slow and fast rates in float64 (ALF's dtypes), as one
        # vector: torch.compile guards every 0-d float64 tensor with a host
        # read of its value, which would be a sync per call on a GPU.
        self.register_buffer(
            "_consts64",
            torch.tensor(
                [min_log_alpha, _seed_rate(slow_update_rate), _seed_rate(fast_update_rate)],
                dtype=torch.float64,
            ),
            persistent=False,
        )
        self.register_buffer(
            "_very_slow_update_rate",
            torch.tensor(very_slow_update_rate, dtype=torch.float32),
            persistent=False,
        )
        self.register_buffer("_target", torch.tensor(target0, dtype=torch.float32), persistent=False)
        # Python copies of the constants for the host path.
        self._host_consts = (
            np.float32(very_slow_update_rate),
            _seed_rate(slow_update_rate),
            _seed_rate(fast_update_rate),
            float(min_log_alpha),
        )
        self._compiled_update: Optional[Callable[..., None]] = None

    # ------------------------------------------------------------ properties
    @property
    def alpha(self) -> torch.Tensor:
        """The current entropy coefficient ``exp(log_alpha)`` (a 0-d tensor)."""
        return self._log_alpha.exp()

    @property
    def log_alpha(self) -> torch.Tensor:
        """The current ``log_alpha`` (the buffer itself; read only)."""
        return self._log_alpha

    @property
    def stage(self) -> torch.Tensor:
        """The stage: < -2 estimating max entropy, -2 init, -1 free, 0/1 adjust
        (1 when the average entropy was above the target)."""
        return self._stage

    @property
    def update_rate(self) -> torch.Tensor:
        """The current adjust-stage update rate of ``log_alpha``."""
        return self._update_rate

    @property
    def max_entropy(self) -> torch.Tensor:
        """The (given or estimated) upper bound of the entropy."""
        return self._max_entropy

    @property
    def avg_entropy(self) -> torch.Tensor:
        """The running average entropy the stage machine compares."""
        return self._avg_entropy.get()

    @property
    def num_nonfinite_entropy(self) -> torch.Tensor:
        """How many updates were skipped because the entropy was NaN/inf."""
        return self._num_nonfinite

    @property
    def target_entropy(self) -> float:
        """The target's current value (evaluated now, on the host)."""
        return _target_value(self._target_entropy)

    @property
    def target_entropy_fn(self) -> Callable[[], float]:
        """The target as a zero-argument callable (a scheduler)."""
        return self._target_entropy

    def _summarize_batch(
        self, entropy: torch.Tensor, mask: Optional[torch.Tensor], mean: torch.Tensor, count: torch.Tensor
    ) -> None:
        square, _ = masked_mean(entropy * entropy, mask)
        with summary.scope(self._name):
            summary.scalar("entropy_std", torch.sqrt(torch.clamp(square - mean * mean, min=0.0)))

    # ---------------------------------------------------------- the machine
    def _use_host(self) -> bool:
        mode = self._update_mode
        on_cpu = self._log_alpha.device.type == "cpu"
        if mode == "host" and not on_cpu:
            raise ValueError(
                f"{self._name}: update_mode='host' needs the controller on the CPU, "
                f"it is on {self._log_alpha.device}; use 'tensor' or 'auto'"
            )
        return mode == "host" or (mode == "auto" and on_cpu)

    def _update(self, entropy: torch.Tensor, num: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Any]:
        """Run one update (gated on ``num > 0`` and a finite entropy)."""
        if self._constant_target:
            target = None
        else:
            target = _target_value(self._target_entropy)
        if self._use_host():
            self._adjust_host(entropy, num, target)
        else:
            if target is not None:
                self._target.fill_(target)
            update = self._adjust_tensor
            if self._update_mode == "compiled":
                if self._compiled_update is None:
                    # One fused graph instead of ~90 tiny ops; compiled on the
                    # first update (tens of seconds on a CPU) and reused.
                    self._compiled_update = torch.compile(
                        self._adjust_tensor, fullgraph=True, dynamic=False
                    )
                update = self._compiled_update
            update(entropy.to(self._log_alpha.device, torch.float32), num)
        alpha = self._log_alpha.exp()
        if self._debug_summaries and summary.should_record_summaries():
            self._summarize(alpha, target)
        return alpha, ()

    def _adjust_tensor(self, entropy: torch.Tensor, num: Optional[torch.Tensor]) -> None:
        """The stage machine as tensor ops: no value ever reaches the host.

        Each stage of ALF's sequential ``if``s becomes a condition tensor
        (which includes the validity gate), and every state write is a
        ``torch.where`` on it, so the same cascade happens without branching.
        """
        finite = torch.isfinite(entropy)
        nonfinite = ~finite
        if num is None:
            valid = finite
        else:
            has_data = num > 0
            valid = finite & has_data
            nonfinite = nonfinite & has_data
        self._num_nonfinite.add_(nonfinite)
        min_log_alpha, slow_rate, fast_rate = self._consts64.unbind()
        averager = self._avg_entropy
        prev_avg = averager.get()
        avg = averager.average(entropy, valid)
        target = self._target
        stage = self._stage
        log_alpha = self._log_alpha
        # Estimate max entropy from the first `average_window` calls.
        a = valid & (stage < -2)
        max_entropy = torch.where(
            a, torch.minimum(0.8 * avg, avg / 0.8), self._max_entropy
        )
        stage = stage + a  # int32 + bool stays int32
        # Stage 0 (init): slowly lower alpha until the entropy is below max.
        decreasing = avg < prev_avg
        b = valid & (stage == -2)
        init_step = torch.where(decreasing, 0.5, -1.0) * self._very_slow_update_rate
        log_alpha_b = torch.maximum(
            (log_alpha + init_step).to(torch.float64), min_log_alpha
        ).to(torch.float32)
        log_alpha = torch.where(b, log_alpha_b, log_alpha)
        stage = stage + (b & (avg < max_entropy))
        # Stage 1 (free): wait for the entropy to fall below the target.
        c = valid & (stage == -1)
        stage = stage + (c & (avg < target))
        # Stage 2 (adjust).
        d = valid & (stage >= 0)
        above = avg > target
        crossing = above != (stage != 0)
        rate = self._update_rate
        rate = torch.where(crossing, rate * 0.9, rate)
        rate64 = torch.maximum(rate.to(torch.float64), slow_rate)
        fast_thresh = torch.where(target > 0, 0.5 * target, 2.0 * target)
        rate64 = torch.where(entropy < fast_thresh, fast_rate, rate64)
        coef = torch.where(
            above, torch.where(decreasing, 0.5, -1.0), torch.where(decreasing, 1.0, -0.5)
        )
        log_alpha_d = torch.maximum(
            log_alpha.to(torch.float64) + coef * rate64, min_log_alpha
        ).to(torch.float32)
        self._log_alpha.copy_(torch.where(d, log_alpha_d, log_alpha))
        self._update_rate.copy_(torch.where(d, rate64.to(torch.float32), self._update_rate))
        self._stage.copy_(torch.where(d, above.to(torch.int32), stage))
        self._max_entropy.copy_(max_entropy)

    def _adjust_host(
        self, entropy: torch.Tensor, num: Optional[torch.Tensor], target: Optional[float]
    ) -> None:
        """The same stage machine in plain Python over the CPU buffers.

        Only used when the state is on the CPU, where reading a value has no
        device to wait for.  Arithmetic is done in numpy float32/float64
        exactly as the tensor path (and ALF) does it, so both paths produce
        bit-identical trajectories.
        """
        f32 = np.float32
        # .cpu() is a no-op for CPU inputs (the usual case on this path).
        ent = np.float32(entropy.detach().cpu().numpy()[()])
        if num is not None and num.cpu().numpy()[()] <= 0:
            return
        if not np.isfinite(ent):
            self._num_nonfinite.add_(1)
            return
        very_slow, slow, fast, min_log_alpha = self._host_consts
        target32 = self._target.numpy()[()] if target is None else f32(target)
        if target is not None:
            self._target.fill_(target)
        averager = self._avg_entropy
        prev_avg = _host_window_get(averager)
        _host_window_update(averager, ent)
        avg = _host_window_get(averager)

        stage_v = self._stage.numpy()
        log_alpha_v = self._log_alpha.numpy()
        rate_v = self._update_rate.numpy()
        max_entropy_v = self._max_entropy.numpy()
        stage = int(stage_v[()])
        if stage < -2:
            max_entropy_v[()] = min(f32(0.8) * avg, avg / f32(0.8))
            stage += 1
        if stage == -2:
            step = (f32(0.5) if avg < prev_avg else f32(-1.0)) * very_slow
            log_alpha_v[()] = f32(max(float(log_alpha_v[()] + step), min_log_alpha))
            stage += int(avg < max_entropy_v[()])
        if stage == -1:
            stage += int(avg < target32)
        if stage >= 0:
            above = bool(avg > target32)
            rate = rate_v[()]
            if above != (stage != 0):
                rate = rate * f32(0.9)
            rate = max(float(rate), slow)
            fast_thresh = f32(0.5) * target32 if target32 > 0 else f32(2.0) * target32
            if ent < fast_thresh:
                rate = fast
            decreasing = avg < prev_avg
            if above:
                coef = 0.5 if decreasing else -1.0
            else:
                coef = 1.0 if decreasing else -0.5
            log_alpha_v[()] = f32(max(float(log_alpha_v[()]) + coef * rate, min_log_alpha))
            rate_v[()] = f32(rate)
            stage = int(above)
        stage_v[()] = stage

    def _summarize(self, alpha: torch.Tensor, target: Optional[float]) -> None:
        with summary.scope(self._name):
            summary.scalar("alpha", alpha)
            summary.scalar("avg_entropy", self._avg_entropy.get())
            summary.scalar("stage", self._stage)
            summary.scalar("update_rate", self._update_rate)
            summary.scalar("nonfinite_entropy", self._num_nonfinite)
            if target is not None:
                summary.scalar("target_entropy", target)


def _host_window_get(averager: ScalarWindowAverager) -> np.float32:
    """``averager.get()`` on the host, with the same float32 arithmetic."""
    n = min(max(int(averager._count.numpy()[()]), 1), averager.window_size)
    return averager._buf.sum().numpy()[()] * (np.float32(1.0) / np.float32(n))


def _host_window_update(averager: ScalarWindowAverager, value: np.float32) -> None:
    """``averager.update(value)`` on the host (writes the CPU buffers)."""
    count = averager._count.numpy()
    averager._buf.numpy()[int(count[()]) % averager.window_size] = value
    count[()] += 1


@gin.configurable
class NestedEntropyTargetAlgorithm(EntropyController):
    """One ``EntropyTargetAlgorithm`` per action of a nested action spec.

    Each leaf's controller sees only the entropy of its own action's
    distribution, so e.g. a discrete "which tool" action and a continuous
    "how hard" action each keep their own target.  Losses are summed.  The
    common properties are aggregates (``alpha``: mean over the leaves,
    ``target_entropy``: sum, comparable with the total entropy, ``stage``: the
    least advanced leaf); ``leaf_algorithms()`` gives each leaf's controller.

    Args:
        action_spec: a nest of ``BoundedTensorSpec``.
        target_entropy: None (default per leaf), or a nest shaped like
            ``action_spec`` whose leaves are numbers, callables or None.
        max_entropy: None, or a nest like ``action_spec`` of numbers/None.
        debug_summaries: passed to every leaf controller.
        name: the name; leaf controllers are named ``name/path``.
        **kwargs: other ``EntropyTargetAlgorithm`` arguments, shared by all
            leaves.

    Raises:
        ValueError: if ``target_entropy``/``max_entropy`` are not shaped like
            ``action_spec``.
    """

    def __init__(
        self,
        action_spec: Any,
        target_entropy: Any = None,
        max_entropy: Any = None,
        debug_summaries: bool = False,
        name: str = "NestedEntropyTargetAlgorithm",
        **kwargs: Any,
    ):
        super().__init__(action_spec, debug_summaries=debug_summaries, name=name)
        paths = [p for p, _ in nest.flatten_with_path(action_spec)]
        specs = nest.flatten(action_spec)

        def _per_leaf(arg_name: str, value: Any):
            if value is None:
                return [None] * len(specs)
            try:
                return nest.flatten_up_to(action_spec, value)
            except ValueError as e:
                raise ValueError(
                    f"{arg_name} must be None or a nest shaped like action_spec: {e}"
                ) from e

        targets = _per_leaf("target_entropy", target_entropy)
        maxes = _per_leaf("max_entropy", max_entropy)
        self._paths = paths
        # Keyed by path ("." is not allowed in module names, "/" is), so the
        # state_dict reads e.g. "_leaves.arm/grip._log_alpha".
        self._leaves = nn.ModuleDict(
            (
                path.replace(".", "/") or "action",
                EntropyTargetAlgorithm(
                    spec,
                    target_entropy=t,
                    max_entropy=m,
                    debug_summaries=debug_summaries,
                    name=f"{name}/{path}",
                    **kwargs,
                ),
            )
            for path, spec, t, m in zip(paths, specs, targets, maxes)
        )

    def leaf_algorithms(self) -> Dict[str, "EntropyTargetAlgorithm"]:
        """The per-leaf controllers keyed by their path in the action spec."""
        return dict(zip(self._paths, self._leaves.values()))

    @property
    def alpha(self) -> torch.Tensor:
        """Mean ``alpha`` over the leaves (see ``leaf_algorithms`` for each)."""
        return torch.stack([a.alpha for a in self._leaves.values()]).mean()

    @property
    def target_entropy(self) -> float:
        """Sum of the leaves' targets (comparable with the total entropy)."""
        return float(sum(a.target_entropy for a in self._leaves.values()))

    @property
    def stage(self) -> torch.Tensor:
        """The least advanced leaf's stage."""
        return torch.stack([a.stage for a in self._leaves.values()]).min()

    def _entropy(self, distribution: Any) -> Tuple[Any, Any]:
        return entropy_with_fallback(distribution, return_sum=False, action_spec=self._action_spec)

    def _per_leaf(self, value: Any) -> list:
        return nest.flatten_up_to(self._action_spec, value)

    def adjust_alpha(self, entropy: Any) -> torch.Tensor:
        """Each leaf advances once with its own entropy.

        Args:
            entropy: a nest shaped like ``action_spec`` of floats or
                one-element tensors.

        Returns:
            The mean ``alpha`` over the leaves.
        """
        for leaf, e in zip(self._leaves.values(), self._per_leaf(entropy)):
            leaf.adjust_alpha(e)
        return self.alpha

    def entropy_loss(
        self,
        entropy: Any,
        mask: Optional[torch.Tensor] = None,
        entropy_for_gradient: Any = None,
    ) -> LossInfo:
        """Each leaf's ``entropy_loss``; losses summed.

        Args:
            entropy: a nest shaped like ``action_spec`` of per-step entropies.
            mask: as for ``EntropyController.entropy_loss``, shared by all.
            entropy_for_gradient: None, or a nest like ``entropy``.

        Returns:
            LossInfo: summed ``loss``; ``extra`` a nest shaped like
            ``action_spec`` of the leaves' ``EntropyTargetLossInfo``.
        """
        grads = (
            [None] * len(self._paths)
            if entropy_for_gradient is None
            else self._per_leaf(entropy_for_gradient)
        )
        losses = [
            leaf.entropy_loss(e, mask, g)
            for leaf, e, g in zip(self._leaves.values(), self._per_leaf(entropy), grads)
        ]
        total = functools.reduce(torch.add, [li.loss for li in losses])
        extra = nest.pack_sequence_as(self._action_spec, [li.extra for li in losses])
        return LossInfo(loss=total, extra=extra)


def _step_one_parameter(
    optimizer: torch.optim.Optimizer, param: nn.Parameter, grad: torch.Tensor
) -> None:
    """``optimizer.step()`` for ``param`` alone (other parameters untouched)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None  # optimisers skip parameters without a gradient
    param.grad = grad
    optimizer.step()
    for p, g in zip(params, saved):
        p.grad = g


@gin.configurable
class SGDEntropyTargetAlgorithm(EntropyController):
    """SAC's gradient rule for ``alpha``, with the controller's interface.

    ``log_alpha`` is a parameter trained on ``log_alpha * (entropy - target)``
    (the batch-mean entropy, detached), so ``alpha`` falls while the entropy
    is above the target and rises below it.  ``entropy_loss`` returns that
    loss as ``scalar_loss`` for the parent's update; ``adjust_alpha`` takes
    one optimiser step itself.  Swap it for ``EntropyTargetAlgorithm`` with
    one gin line (``PPOAlgorithm.entropy_target_cls = @SGDEntropyTargetAlgorithm``).

    Args:
        action_spec: nest of ``BoundedTensorSpec``; used for the default
            target.
        initial_alpha: initial ``alpha`` (> 0).
        target_entropy: a number, a scheduler/zero-argument callable, or None
            for the default of ``calc_default_target_entropy``.
        optimizer: factory ``params -> Optimizer`` for ``log_alpha``; default
            Adam with SAC's learning rate 3e-4.
        debug_summaries: write ``alpha``, ``entropy`` and ``target_entropy``.
        name: the name.
    """

    def __init__(
        self,
        action_spec: Any,
        initial_alpha: float = 0.1,
        target_entropy: TargetArg = None,
        optimizer: OptimizerArg = None,
        debug_summaries: bool = False,
        name: str = "SGDEntropyTargetAlgorithm",
    ):
        if optimizer is None:
            optimizer = functools.partial(torch.optim.Adam, lr=3e-4)
        super().__init__(action_spec, optimizer=optimizer, debug_summaries=debug_summaries, name=name)
        check_real("initial_alpha", initial_alpha, positive=True)
        self._target_entropy = _as_target_fn(target_entropy, action_spec)
        self._constant_target = isinstance(self._target_entropy, ConstantScheduler)
        target0 = _target_value(self._target_entropy)
        self._log_alpha = nn.Parameter(torch.tensor(math.log(initial_alpha), dtype=torch.float32))
        self.register_buffer("_target", torch.tensor(target0, dtype=torch.float32), persistent=False)
        # Always "adjusting": reported as stage 1 so logs read alike.
        self.register_buffer("_stage", torch.tensor(1, dtype=torch.int32), persistent=False)

    @property
    def alpha(self) -> torch.Tensor:
        """The current ``alpha`` (detached 0-d tensor)."""
        return self._log_alpha.detach().exp()

    @property
    def log_alpha(self) -> torch.Tensor:
        """The ``log_alpha`` parameter (detached view)."""
        return self._log_alpha.detach()

    @property
    def stage(self) -> torch.Tensor:
        """Always 1: the SGD rule has no stages."""
        return self._stage

    @property
    def target_entropy(self) -> float:
        """The target's current value."""
        return _target_value(self._target_entropy)

    def adjust_alpha(self, entropy: Union[float, torch.Tensor]) -> torch.Tensor:
        """One step of the optimiser of ``log_alpha`` on SAC's loss.

        Args:
            entropy: a Python float or a one-element tensor.

        Returns:
            The new ``alpha``.
        """
        _, loss = self._update(_scalar_entropy(entropy, self._log_alpha), None)
        (grad,) = torch.autograd.grad(loss, [self._log_alpha])
        _step_one_parameter(self.optimizers()[0], self._log_alpha, grad)
        return self.alpha

    def _update(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Any]:
        if not self._constant_target:
            self._target.fill_(self.target_entropy)
        # An empty batch or a non-finite entropy contributes no gradient.
        ok = torch.isfinite(entropy) if count is None else (count > 0) & torch.isfinite(entropy)
        gap = torch.where(ok, entropy.to(self._target.dtype) - self._target, 0.0)
        alpha = self.alpha
        if self._debug_summaries and summary.should_record_summaries():
            with summary.scope(self._name):
                summary.scalar("alpha", alpha)
                summary.scalar("entropy", entropy)
                summary.scalar("target_entropy", self._target)
        return alpha, self._log_alpha * gap


@gin.configurable
class FixedEntropyCoefficient(EntropyController):
    """A constant ``alpha``: "no adjustment" as a controller.

    With ``enforce_entropy_target=True`` and ``entropy_target_cls =
    @FixedEntropyCoefficient`` an actor-critic uses the fixed coefficient
    ``alpha`` through the same code path as the adaptive controllers.

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions.
        alpha: the coefficient (>= 0).
        target_entropy: only reported (summaries); None for the spec's
            default.
        debug_summaries: unused (nothing changes to report).
        name: the name.
    """

    def __init__(
        self,
        action_spec: Any,
        alpha: float = 0.01,
        target_entropy: Optional[float] = None,
        debug_summaries: bool = False,
        name: str = "FixedEntropyCoefficient",
    ):
        super().__init__(action_spec, debug_summaries=debug_summaries, name=name)
        alpha = check_real("alpha", alpha, minimum=0.0)
        self._target_entropy = _target_value(_as_target_fn(target_entropy, action_spec))
        self.register_buffer("_alpha", torch.tensor(alpha, dtype=torch.float32), persistent=False)
        # -1: the "free" stage, where alpha stays fixed.
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
        """Always -1 (free: alpha fixed)."""
        return self._stage

    def _update(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Any]:
        return self._alpha, ()
