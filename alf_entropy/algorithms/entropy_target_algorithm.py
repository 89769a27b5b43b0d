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
from alf_entropy.tensor_specs import TensorSpec
from alf_entropy.utils import distributed, nest, summary
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
    "EntropyTargetAlgorithm",
    "NestedEntropyTargetAlgorithm",
    "SGDEntropyTargetAlgorithm",
]

EntropyTargetLossInfo = namedtuple("EntropyTargetLossInfo", ["neg_entropy"], default_value=())
"""``extra`` of the controller's ``LossInfo``: the per-step negative entropy."""

EntropyTargetInfo = namedtuple("EntropyTargetInfo", ["loss"], default_value=())
"""``info`` of the controller's ``rollout_step``/``train_step``."""

TargetArg = Optional[Union[float, Callable[[], float]]]

_UPDATE_MODES = ("auto", "tensor", "host", "compiled")


# --------------------------------------------------------------------- checks
def _check_real(name: str, value: Any, *, positive: bool = False) -> float:
    """Return ``value`` as a float, raising if it is not a finite real."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}: {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return float(value)


def _as_target_fn(target_entropy: TargetArg, action_spec: Any) -> Callable[[], float]:
    """Turn the ``target_entropy`` argument into a zero-argument callable."""
    if target_entropy is None:
        target_entropy = float(
            sum(calc_default_target_entropy(s) for s in nest.flatten(action_spec))
        )
        logging.info("target_entropy=%s (default for the action spec)", target_entropy)
    if callable(target_entropy):
        return target_entropy
    return ConstantScheduler(_check_real("target_entropy", target_entropy))


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


def _masked_mean_entropy(
    experience: Experience, neg_entropy: torch.Tensor, valid_mask: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean entropy over the steps that count, as ALF's ``calc_loss`` takes it.

    A step counts unless it is ``LAST`` (its action was never taken) or
    ``valid_mask`` (bool or 0/1, shape of ``experience.step_type``) drops it.

    Returns:
        ``(entropy, num, mask)``: the mean (0 when no step counts), the
        number of steps that count and the bool mask.

    Raises:
        ValueError: if ``neg_entropy`` or ``valid_mask`` does not have the
            shape of ``experience.step_type``.
    """
    step_type = experience.step_type
    if neg_entropy.shape != step_type.shape:
        raise ValueError(
            f"info's entropy has shape {tuple(neg_entropy.shape)} but "
            f"experience.step_type has shape {tuple(step_type.shape)}"
        )
    mask = step_type != StepType.LAST
    if valid_mask is not None:
        if valid_mask.shape != step_type.shape:
            raise ValueError(
                f"valid_mask must have the shape of experience.step_type "
                f"{tuple(step_type.shape)}, got {tuple(valid_mask.shape)}"
            )
        mask = mask & (valid_mask != 0)
    # Masked-out steps may hold anything (even NaN): select, don't multiply.
    total, num = torch.where(mask, neg_entropy, 0.0).sum(), mask.sum()
    # Data-parallel: the statistic of the global batch, the same on all ranks.
    total, num = distributed.all_reduce_sum_count(total, num)
    entropy = -total / num.clamp(min=1)
    return entropy, num, mask


@gin.configurable
class EntropyTargetAlgorithm(Algorithm):
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
        super().__init__(debug_summaries=debug_summaries, name=name)
        if not all(isinstance(s, TensorSpec) for s in nest.flatten(action_spec)) or not nest.flatten(
            action_spec
        ):
            raise TypeError(f"action_spec must be a non-empty nest of TensorSpec, got {action_spec!r}")
        _check_real("initial_alpha", initial_alpha, positive=True)
        for arg, value in (
            ("very_slow_update_rate", very_slow_update_rate),
            ("slow_update_rate", slow_update_rate),
            ("fast_update_rate", fast_update_rate),
        ):
            _check_real(arg, value, positive=True)
        _check_real("min_alpha", min_alpha)
        if isinstance(average_window, bool) or not isinstance(average_window, int) or average_window < 1:
            raise ValueError(f"average_window must be an int >= 1, got {average_window!r}")
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
            max_entropy = _check_real("max_entropy", max_entropy)
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

    # ----------------------------------------------------------------- steps
    def rollout_step(self, distribution: Any, step_type: torch.Tensor, on_policy_training: bool) -> AlgStep:
        """Rollout step: ``train_step`` when training on-policy, else nothing.

        Args:
            distribution: nest of action distributions from the policy.
            step_type: the ``StepType`` of each step (``[B]``).
            on_policy_training: if False, return an empty ``AlgStep``.

        Returns:
            AlgStep: ``info`` is an ``EntropyTargetInfo`` (empty off-policy).
        """
        if on_policy_training:
            return self.train_step(distribution, step_type)
        return AlgStep()

    def train_step(self, distribution: Any, step_type: torch.Tensor) -> AlgStep:
        """Compute the entropy (and its gradient surrogate) of the policy.

        Args:
            distribution: nest of action distributions from the policy.
            step_type: the ``StepType`` of each step (unused here; masking is
                done in ``calc_loss`` from the experience).

        Returns:
            AlgStep: ``info=EntropyTargetInfo(loss=LossInfo(loss=-entropy_for_gradient,
            extra=EntropyTargetLossInfo(neg_entropy=-entropy)))``.
        """
        # The spec lets a per-dimension distribution (e.g. a plain Normal of
        # shape [T, B, D]) be summed over the action dims to [T, B].
        entropy, entropy_for_gradient = entropy_with_fallback(
            distribution, action_spec=self._action_spec
        )
        return AlgStep(
            output=(),
            state=(),
            info=EntropyTargetInfo(
                loss=LossInfo(
                    loss=-entropy_for_gradient,
                    extra=EntropyTargetLossInfo(neg_entropy=-entropy),
                )
            ),
        )

    def calc_loss(
        self,
        experience: Experience,
        info: EntropyTargetInfo,
        valid_mask: Optional[torch.Tensor] = None,
    ) -> LossInfo:
        """Update ``alpha`` from the batch's entropy and return the weighted loss.

        The entropy is averaged over the steps that are not ``LAST`` (whose
        action was never taken) and are valid in ``valid_mask``.  An empty
        batch or a non-finite entropy leaves all state unchanged.

        Args:
            experience: anything with a ``step_type`` tensor (``[T, B]``).
            info: the (time-stacked) ``EntropyTargetInfo`` of ``train_step``.
            valid_mask: optional ``[T, B]`` bool or 0/1 float mask of the
                steps to use.

        Returns:
            LossInfo: ``loss = alpha * -entropy_for_gradient`` per step, with
            ``extra`` the ``EntropyTargetLossInfo``.

        Raises:
            ValueError: if ``valid_mask`` or the entropy does not have the
                shape of ``experience.step_type``.
        """
        loss_info = info.loss
        neg_entropy = loss_info.extra.neg_entropy.detach()
        entropy, num, mask = _masked_mean_entropy(experience, neg_entropy, valid_mask)
        alpha = self._adjust(entropy, num)
        if self._debug_summaries and summary.should_record_summaries():
            ent = torch.where(mask, -neg_entropy, 0.0)
            n = num.clamp(min=1)
            entropy2 = (ent * ent).sum() / n
            with summary.scope(self._name):
                summary.scalar(
                    "entropy_std", torch.sqrt(torch.clamp(entropy2 - entropy * entropy, min=0.0))
                )
        return loss_info._replace(loss=loss_info.loss * alpha)

    def adjust_alpha(self, entropy: torch.Tensor) -> torch.Tensor:
        """Advance the controller with one entropy value and return ``alpha``.

        Under data-parallel training every rank must call it together: the
        ranks' values are averaged (each rank's batch counts equally).

        Args:
            entropy: a scalar tensor, the current (batch mean) entropy.  A
                NaN/inf value leaves the state unchanged.

        Returns:
            The new ``alpha`` (a 0-d tensor on the controller's device).
        """
        if not isinstance(entropy, torch.Tensor) or entropy.numel() != 1:
            raise TypeError("adjust_alpha: entropy must be a one-element tensor")
        entropy = distributed.all_reduce_mean(entropy.detach().reshape(()))
        return self._adjust(entropy, None)

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

    def _adjust(self, entropy: torch.Tensor, num: Optional[torch.Tensor]) -> torch.Tensor:
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
        return alpha

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
class NestedEntropyTargetAlgorithm(Algorithm):
    """One ``EntropyTargetAlgorithm`` per action of a nested action spec.

    Each leaf's controller sees only the entropy of its own action's
    distribution, so e.g. a discrete "which tool" action and a continuous
    "how hard" action each keep their own target.  Losses are summed.

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
        super().__init__(debug_summaries=debug_summaries, name=name)
        paths = [p for p, _ in nest.flatten_with_path(action_spec)]
        specs = nest.flatten(action_spec)
        if not specs:
            raise TypeError("action_spec must be a non-empty nest of TensorSpec")

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
        self._action_spec = action_spec
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

    def leaf_algorithms(self) -> Dict[str, EntropyTargetAlgorithm]:
        """The per-leaf controllers keyed by their path in the action spec."""
        return dict(zip(self._paths, self._leaves.values()))

    @property
    def alpha(self) -> Dict[str, torch.Tensor]:
        """``alpha`` of each leaf, keyed by path."""
        return {p: a.alpha for p, a in zip(self._paths, self._leaves.values())}

    @property
    def log_alpha(self) -> Dict[str, torch.Tensor]:
        """``log_alpha`` of each leaf, keyed by path."""
        return {p: a.log_alpha for p, a in zip(self._paths, self._leaves.values())}

    @property
    def stage(self) -> Dict[str, torch.Tensor]:
        """Stage of each leaf, keyed by path."""
        return {p: a.stage for p, a in zip(self._paths, self._leaves.values())}

    @property
    def target_entropy(self) -> Dict[str, float]:
        """Current target of each leaf, keyed by path."""
        return {p: a.target_entropy for p, a in zip(self._paths, self._leaves.values())}

    def rollout_step(self, distribution: Any, step_type: torch.Tensor, on_policy_training: bool) -> AlgStep:
        """Per-leaf ``rollout_step`` (see ``EntropyTargetAlgorithm``).

        Args:
            distribution: nest of distributions shaped like ``action_spec``.
            step_type: the ``StepType`` of each step.
            on_policy_training: if False, return an empty ``AlgStep``.

        Returns:
            AlgStep: ``info`` is a tuple of the leaves' ``EntropyTargetInfo``.
        """
        if on_policy_training:
            return self.train_step(distribution, step_type)
        return AlgStep()

    def train_step(self, distribution: Any, step_type: torch.Tensor) -> AlgStep:
        """Per-leaf ``train_step``: each leaf's entropy, kept apart.

        Args:
            distribution: nest of distributions shaped like ``action_spec``.
            step_type: the ``StepType`` of each step.

        Returns:
            AlgStep: ``info`` is a tuple of the leaves' ``EntropyTargetInfo``.
        """
        dists = nest.flatten_up_to(self._action_spec, distribution)
        infos = tuple(
            alg.train_step(d, step_type).info for alg, d in zip(self._leaves.values(), dists)
        )
        return AlgStep(output=(), state=(), info=infos)

    def calc_loss(
        self, experience: Experience, info: Tuple[EntropyTargetInfo, ...], valid_mask: Optional[torch.Tensor] = None
    ) -> LossInfo:
        """Each leaf adjusts its own ``alpha``; the losses are summed.

        Args:
            experience: anything with a ``step_type`` tensor.
            info: the tuple returned by ``train_step`` (time-stacked).
            valid_mask: optional mask, as for ``EntropyTargetAlgorithm``.

        Returns:
            LossInfo: summed ``loss``; ``extra`` maps each path to its leaf's
            ``EntropyTargetLossInfo``.
        """
        losses = [
            alg.calc_loss(experience, leaf_info, valid_mask)
            for alg, leaf_info in zip(self._leaves.values(), info)
        ]
        total = losses[0].loss
        for li in losses[1:]:
            total = total + li.loss
        return LossInfo(loss=total, extra={p: li.extra for p, li in zip(self._paths, losses)})


@gin.configurable
class SGDEntropyTargetAlgorithm(Algorithm):
    """SAC's gradient rule for ``alpha``, with the controller's interface.

    ``log_alpha`` is a parameter trained by its own optimiser on
    ``log_alpha * (entropy - target)`` (the batch-mean entropy, detached), so
    ``alpha`` falls while the entropy is above the target and rises below it.
    Swap it for ``EntropyTargetAlgorithm`` with one gin line
    (``PPOAlgorithm.entropy_target_cls = @SGDEntropyTargetAlgorithm``).

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
        super().__init__(optimizer=optimizer, debug_summaries=debug_summaries, name=name)
        _check_real("initial_alpha", initial_alpha, positive=True)
        self._action_spec = action_spec
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

    def rollout_step(self, distribution: Any, step_type: torch.Tensor, on_policy_training: bool) -> AlgStep:
        """As ``EntropyTargetAlgorithm.rollout_step``.

        Args:
            distribution: nest of action distributions.
            step_type: the ``StepType`` of each step.
            on_policy_training: if False, return an empty ``AlgStep``.

        Returns:
            AlgStep: with an ``EntropyTargetInfo``.
        """
        if on_policy_training:
            return self.train_step(distribution, step_type)
        return AlgStep()

    def train_step(self, distribution: Any, step_type: torch.Tensor) -> AlgStep:
        """As ``EntropyTargetAlgorithm.train_step``.

        Args:
            distribution: nest of action distributions.
            step_type: the ``StepType`` of each step.

        Returns:
            AlgStep: with an ``EntropyTargetInfo``.
        """
        return EntropyTargetAlgorithm.train_step(self, distribution, step_type)

    def calc_loss(
        self, experience: Experience, info: EntropyTargetInfo, valid_mask: Optional[torch.Tensor] = None
    ) -> LossInfo:
        """Entropy bonus weighted by ``alpha`` plus SAC's loss for ``log_alpha``.

        Args:
            experience: anything with a ``step_type`` tensor.
            info: the time-stacked ``EntropyTargetInfo``.
            valid_mask: optional ``[T, B]`` mask of the steps to use.

        Returns:
            LossInfo: ``loss = alpha.detach() * -entropy_for_gradient`` per
            step and ``scalar_loss = log_alpha * (entropy - target)``.
        """
        loss_info = info.loss
        entropy, num, _ = _masked_mean_entropy(
            experience, loss_info.extra.neg_entropy.detach(), valid_mask
        )
        if not self._constant_target:
            self._target.fill_(self.target_entropy)
        # An empty batch or a non-finite entropy contributes no gradient.
        ok = (num > 0) & torch.isfinite(entropy)
        gap = torch.where(ok, entropy - self._target, 0.0)
        alpha_loss = self._log_alpha * gap
        alpha = self._log_alpha.detach().exp()
        if self._debug_summaries and summary.should_record_summaries():
            with summary.scope(self._name):
                summary.scalar("alpha", alpha)
                summary.scalar("entropy", entropy)
                summary.scalar("target_entropy", self._target)
        return LossInfo(loss=loss_info.loss * alpha, scalar_loss=alpha_loss, extra=loss_info.extra)
