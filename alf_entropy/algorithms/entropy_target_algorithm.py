"""The entropy controllers (their shared interface: ``entropy_controller.py``).

* :class:`EntropyTargetAlgorithm`: ALF's staged controller (the PyTorch seed,
  reproduced step for step).  Stages: estimate ``max_entropy`` from the first
  ``average_window`` updates (``stage < -2``); init (``-2``): ``log_alpha``
  moves down by ``very_slow_update_rate`` while the average entropy rises and
  up by half of it while it falls, until the entropy is below ``max_entropy``;
  free (``-1``): ``alpha`` fixed until the entropy falls below the target;
  adjust (``0`` below / ``1`` above the target): ``log_alpha`` moves by
  ``update_rate`` times +1 (below, falling), +0.5 (above, falling), -0.5
  (below, rising) or -1 (above, rising); ``update_rate`` shrinks by 0.9 at each
  crossing (not below ``slow_update_rate``) and resets to
  ``fast_update_rate`` when the entropy drops under half a positive target
  (twice a negative one).  The checks are sequential ``if``s, so one update
  may cascade through several stages.
* :class:`SGDEntropyTargetAlgorithm`: SAC's gradient rule on ``log_alpha``.
* :class:`NestedEntropyTargetAlgorithm`: one staged controller per action.
* :class:`FixedEntropyCoefficient`: a constant ``alpha``.

The differences from ALF are listed in ``docs/differences.md``.
"""
import functools
import math
import warnings
from typing import Any, Callable, Dict, Optional, Tuple, Union

import gin
import numpy as np
import torch
import torch.nn as nn
from absl import logging

from alf_entropy.algorithms.algorithm import OptimizerArg
from alf_entropy.algorithms.entropy_controller import (
    UPDATE_MODES,
    EntropyController,
    EntropyTargetInfo,
    EntropyTargetLossInfo,
    FixedEntropyCoefficient,
    TargetArg,
    _HostOps,
    _scalar_entropy,
    _TensorOps,
)
from alf_entropy.data_structures import LossInfo
from alf_entropy.utils import nest, summary
from alf_entropy.utils.averager import ScalarWindowAverager
from alf_entropy.utils.checks import check_int, check_real, is_real
from alf_entropy.utils.dist_utils import entropy_with_fallback

__all__ = [
    "EntropyTargetLossInfo",
    "EntropyTargetInfo",
    "EntropyController",
    "EntropyTargetAlgorithm",
    "FixedEntropyCoefficient",
    "NestedEntropyTargetAlgorithm",
    "SGDEntropyTargetAlgorithm",
    "describe_stage",
]

# track_target_changes: a target move larger than this (relative) restarts the adjust stage.
_TARGET_MOVE = 0.05
STUCK_UPDATES = 1000
"""A staged controller still before its adjust stage after
``max(STUCK_UPDATES, 10 * average_window)`` updates warns once (see
``EntropyTargetAlgorithm``)."""


# ------------------------------------------------------------ stage machine
def describe_stage(stage: Any) -> str:
    """What a staged controller's ``stage`` means, in words (for printing).

    Args:
        stage: :attr:`EntropyTargetAlgorithm.stage` (a 0-d integer tensor,
            read on the host) or an int.

    Returns:
        str: e.g. ``"stage -1: free (alpha frozen until the entropy falls
        below the target)"``.

    Raises:
        TypeError: if ``stage`` is not an integer (or a 0-d integer tensor).

    Example:
        >>> describe_stage(-3)
        'stage -3: estimating max_entropy (1 more update), then init, free and adjust'
        >>> describe_stage(1)
        'stage 1: adjust (the average entropy is above the target)'
    """
    if isinstance(stage, torch.Tensor) and stage.numel() == 1 and not stage.is_floating_point():
        stage = int(stage)
    if isinstance(stage, bool) or not isinstance(stage, (int, np.integer)):
        raise TypeError(f"stage must be an int or a 0-d integer tensor, got {stage!r}")
    stage = int(stage)
    if stage < -2:
        left = -2 - stage
        what = (f"estimating max_entropy ({left} more update{'s' if left > 1 else ''}), "
                "then init, free and adjust")
    elif stage == -2:
        what = "init (alpha moves until the average entropy is below max_entropy)"
    elif stage == -1:
        what = "free (alpha frozen until the entropy falls below the target)"
    else:
        side = "above" if stage > 0 else "at or below"
        what = f"adjust (the average entropy is {side} the target)"
    return f"stage {stage}: {what}"


def _stage_machine(x: Any, state: Tuple, entropy: Any, prev_avg: Any, avg: Any, valid: Any,
                   target: Any, consts: Tuple, track: Optional[Tuple] = None,
                   max_log_alpha: Any = None) -> Tuple:
    """The seed's ``adjust_alpha`` written once over ``x``'s select primitive.

    Each of the seed's sequential ``if``s becomes a condition (including the
    validity gate ``valid``) and every state write a ``where`` on it, so the
    same cascade runs without branching.  Arithmetic uses the seed's dtypes:
    float32 state, float64 ``log_alpha`` steps, floor and slow/fast rates.

    Two opt-in additions (not in the seed; ``None`` runs the seed's machine
    unchanged): ``track = (ref_target, retarget_rate)``: when the target has
    moved by more than ``_TARGET_MOVE`` (relative) from ``ref_target`` (the
    target when tracking last restarted), the adjust stage restarts from
    ``retarget_rate`` and ``ref_target`` becomes the target;
    ``max_log_alpha``: a ceiling of ``log_alpha`` (float32).

    Returns:
        The new ``(log_alpha, stage, update_rate, max_entropy)``, and the new
        ``ref_target`` when tracking.
    """
    log_alpha, stage, rate, max_entropy = state
    very_slow, slow, fast, min_log_alpha = consts
    decreasing = avg < prev_avg
    # Estimate max entropy from the first `average_window` updates.
    a = valid & (stage < -2)
    max_entropy = x.where(a, x.minimum(0.8 * avg, avg / 0.8), max_entropy)
    stage = stage + a
    # Init: down while the entropy rises, up by half while it falls.
    b = valid & (stage == -2)
    step = x.where(decreasing, 0.5, -1.0) * very_slow
    log_alpha = x.where(b, x.f32(x.maximum(x.f64(log_alpha + step), min_log_alpha)), log_alpha)
    stage = stage + (b & (avg < max_entropy))
    # Free: wait for the entropy to fall below the target.
    stage = stage + (valid & (stage == -1) & (avg < target))
    # Adjust.
    d = valid & (stage >= 0)
    if track is not None:
        ref_target, retarget_rate = track
        moved = valid & (x.abs(target - ref_target) > _TARGET_MOVE * x.abs(ref_target))
        rate = x.where(d & moved, retarget_rate, rate)
        ref_target = x.where(moved, target, ref_target)
    above = avg > target
    new_rate = x.where(above != (stage != 0), rate * 0.9, rate)
    new_rate = x.maximum(x.f64(new_rate), slow)
    new_rate = x.where(entropy < x.where(target > 0, 0.5 * target, 2.0 * target), fast, new_rate)
    coef = x.where(above, x.where(decreasing, 0.5, -1.0), x.where(decreasing, 1.0, -0.5))
    new_log_alpha = x.f32(x.maximum(x.f64(log_alpha) + coef * new_rate, min_log_alpha))
    log_alpha = x.where(d, new_log_alpha, log_alpha)
    if max_log_alpha is not None:
        log_alpha = x.minimum(log_alpha, max_log_alpha)
    new = (
        log_alpha, x.where(d, x.i32(above), stage), x.where(d, x.f32(new_rate), rate), max_entropy
    )
    return new if track is None else new + (ref_target,)


def _seed_rate(rate: float) -> float:
    """The value the seed's ``torch.tensor(rate)`` holds (float32 for a Python
    float, float64 for a numpy float64 such as the default ``np.log(2)``)."""
    return float(torch.tensor(rate).to(torch.float64))


@gin.configurable
class EntropyTargetAlgorithm(EntropyController):
    """ALF's staged controller: ``alpha`` keeps the entropy >= a target.

    To approximate SAC's learned temperature, use SAC's ``target_entropy``,
    ``skip_free_stage=True`` and ``slow_update_rate = fast_update_rate = 4 *``
    SAC's temperature learning rate.

    A controller still in its init or free stage (or estimating) after
    ``max(STUCK_UPDATES, 10 * average_window)`` updates (1,000 by default)
    is not acting on its target; it says so once (``warnings.warn`` and an
    absl warning) with its ``max_entropy``, the entropy it sees, the target
    and what to change (``max_entropy``, ``skip_free_stage``, a smaller
    ``initial_alpha``).  The stage is read on the host only where that costs
    nothing or happens anyway: on the host update path (CPU) or at an update
    where summaries are recorded; on the GPU tensor path without summaries
    it never checks.

    Args:
        action_spec: nest of ``BoundedTensorSpec`` of the actions (the
            default target and the reachable maximum come from it).
        initial_alpha: initial ``alpha`` (> 0, >= ``min_alpha``).
        skip_free_stage: start directly in the adjust stage.
        max_entropy: upper bound of the entropy; None estimates it from the
            first ``average_window`` updates as ``min(0.8 H, H / 0.8)``.
        target_entropy: a number, a ``Scheduler`` or any zero-argument
            callable (evaluated at every update); None: the spec's default.
        very_slow_update_rate: the ``log_alpha`` step of the init stage (> 0).
        slow_update_rate: the smallest adjust-stage step (> 0).
        fast_update_rate: the largest adjust-stage step (> 0).
        min_alpha: floor of ``alpha``; ``<= 0`` means ``exp(-100)``.
        average_window: how many updates the entropy is averaged over (>= 1).
        update_mode: ``"tensor"`` (``torch.where``, never syncs a GPU),
            ``"compiled"`` (the same under ``torch.compile``), ``"host"``
            (numpy over CPU buffers; CPU only) or ``"auto"`` (host on the
            CPU, tensor elsewhere).  All run the same ``_stage_machine``.
        track_target_changes: opt-in responsive mode (not in ALF): whenever
            the target has moved by more than 5% since the adjust stage last
            (re)started -- a step, or a schedule's accumulated drift -- the
            adjust stage restarts from ``retarget_update_rate`` instead of
            the update rate it had decayed to.  False (the default) keeps
            ALF's behaviour exactly.
        retarget_update_rate: the update rate the adjust stage restarts from
            with ``track_target_changes`` (> 0).  0.1 settles a step of the
            target within ±5% in about 220 updates on the control-quality
            benchmark's synthetic task, where ``fast_update_rate`` (log 2)
            overshoots and takes about 310 and ALF's mode about 1,000.
        max_alpha: optional ceiling of ``alpha`` (> ``min_alpha``, >=
            ``initial_alpha``), like ALF SAC's ``max_log_alpha``; None: none.
        debug_summaries: write ``alpha``, ``avg_entropy``, ``stage``,
            ``update_rate``, ``entropy_std``, ``nonfinite_entropy`` and (for a
            scheduled target) ``target_entropy`` under ``name``.
        name: the name (summary scope).

    Raises:
        TypeError: for an argument of the wrong type.
        ValueError: for an argument out of range, ``target_entropy >
            max_entropy``, or a target above the largest entropy the spec allows.

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> spec = BoundedTensorSpec((), torch.int64, 0, 3)  # 4 actions
        >>> controller = EntropyTargetAlgorithm(spec, target_entropy=0.5, skip_free_stage=True)
        >>> for h in (1.2, 1.0, 0.8, 0.6, 0.45, 0.4):  # a policy losing entropy
        ...     info = controller.entropy_loss(torch.full((16,), h))  # one update a batch
        >>> round(float(controller.alpha), 4), int(controller.stage)  # 0.1 at first
        (0.3732, 0)
        >>> info.loss.shape  # -alpha * entropy per element: add it to the policy loss
        torch.Size([16])
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
        track_target_changes: bool = False,
        retarget_update_rate: float = 0.1,
        max_alpha: Optional[float] = None,
        debug_summaries: bool = False,
        name: str = "EntropyTargetAlgorithm",
    ):
        super().__init__(action_spec, debug_summaries=debug_summaries, name=name)
        check_real("initial_alpha", initial_alpha, positive=True)
        if not isinstance(track_target_changes, bool):
            raise TypeError(
                f"track_target_changes must be a bool, got {type(track_target_changes).__name__}"
            )
        check_real("retarget_update_rate", retarget_update_rate, positive=True)
        if max_alpha is not None:
            check_real("max_alpha", max_alpha, positive=True)
            if max_alpha < initial_alpha or (min_alpha > 0 and max_alpha <= min_alpha):
                raise ValueError(
                    f"max_alpha ({max_alpha}) must be >= initial_alpha ({initial_alpha}) "
                    f"and > min_alpha ({min_alpha})"
                )
        for arg, value in (
            ("very_slow_update_rate", very_slow_update_rate),
            ("slow_update_rate", slow_update_rate),
            ("fast_update_rate", fast_update_rate),
        ):
            check_real(arg, value, positive=True)
        check_real("min_alpha", min_alpha)
        check_int("average_window", average_window, minimum=1)
        if min_alpha > 0 and initial_alpha < min_alpha:
            raise ValueError(f"initial_alpha ({initial_alpha}) must be >= min_alpha ({min_alpha})")
        self._init_target(target_entropy)
        if max_entropy is not None:
            max_entropy = check_real("max_entropy", max_entropy)
            if self._target.initial > max_entropy:
                raise ValueError(
                    f"target_entropy ({self._target.initial}) must be <= max_entropy "
                    f"({max_entropy})"
                )
        self._init_update_mode(update_mode, UPDATE_MODES + ("compiled",))
        self._avg_entropy = ScalarWindowAverager(average_window)
        if skip_free_stage:
            stage = 1
        else:
            stage = -2 - average_window if max_entropy is None else -2
        # The changing state (saved by state_dict).
        f32 = functools.partial(torch.tensor, dtype=torch.float32)
        self.register_buffer("_log_alpha", f32(np.log(initial_alpha)))
        self.register_buffer("_stage", torch.tensor(stage, dtype=torch.int32))
        self.register_buffer("_update_rate", f32(fast_update_rate))
        self.register_buffer("_max_entropy", f32(0.0 if max_entropy is None else max_entropy))
        # Constants in the seed's dtypes (buffers so that .to(device) moves
        # them; not saved).  The float64 ones form one vector: torch.compile
        # guards every 0-d float64 tensor with a host read of its value.
        min_log_alpha = math.log(min_alpha) if min_alpha > 0 else -100.0
        consts = (min_log_alpha, _seed_rate(slow_update_rate), _seed_rate(fast_update_rate))
        self.register_buffer(
            "_consts64", torch.tensor(consts, dtype=torch.float64), persistent=False
        )
        self.register_buffer("_very_slow", f32(very_slow_update_rate), persistent=False)
        self._host_consts = (np.float32(very_slow_update_rate), *map(np.float64, consts[1:]),
                             np.float64(min_log_alpha))
        # Opt-in additions: buffers only when used, so the default state_dict
        # (and checkpoints) stay as they were.
        self._track = track_target_changes
        if track_target_changes:
            self.register_buffer("_ref_target", f32(self._target.initial))
            self.register_buffer("_retarget_rate", f32(retarget_update_rate), persistent=False)
        self._max_log_alpha = None
        if max_alpha is not None:
            self._max_log_alpha = np.float32(math.log(max_alpha))
            self._max_log_alpha_watch = float(self._max_log_alpha)
            self.register_buffer("_max_log_alpha_t", f32(self._max_log_alpha), persistent=False)
        self._compiled_update: Optional[Callable[..., None]] = None
        # The stuck-stage warning: updates counted on the host (no tensor read).
        self._max_entropy_given = max_entropy is not None
        self._stuck_after = max(STUCK_UPDATES, 10 * average_window)
        self._host_updates, self._stuck_checked = 0, False

    @property
    def stage(self) -> torch.Tensor:
        """< -2 estimating max entropy, -2 init, -1 free, 0/1 adjust (1: above target).

        :func:`describe_stage` says it in words.
        """
        return self._stage

    @property
    def update_rate(self) -> torch.Tensor:
        """The adjust stage's current step of ``log_alpha``."""
        return self._update_rate

    @property
    def max_entropy(self) -> torch.Tensor:
        """The given or estimated upper bound of the entropy."""
        return self._max_entropy

    @property
    def avg_entropy(self) -> torch.Tensor:
        """The running average entropy the stages compare."""
        return self._avg_entropy.get()

    @property
    def target_entropy_fn(self) -> Callable[[], float]:
        """The target as a zero-argument callable (a scheduler)."""
        return self._target.fn

    def _update(
        self, entropy: torch.Tensor, count: Optional[torch.Tensor]
    ) -> Tuple[torch.Tensor, Any]:
        target = None if self._target.constant else self._target(counting=True)
        if target is not None:
            self._target_now.fill_(target)
        # The state is float32; so is the entropy it moves on (half-precision
        # entropies from an autocast policy too).
        entropy = entropy.to(self._log_alpha.device, torch.float32)
        use_host = self._use_host()
        if use_host:
            self._update_host(entropy, count)
        else:
            update = self._update_tensor
            if self._update_mode == "compiled":
                if self._compiled_update is None:  # compiled once, on first use
                    self._compiled_update = torch.compile(update, fullgraph=True, dynamic=False)
                update = self._compiled_update
            update(entropy, count)
        self._host_updates += 1
        if (not self._stuck_checked and self._host_updates >= self._stuck_after
                and (use_host or summary.should_record_summaries())):
            self._warn_if_stuck()
        return self._log_alpha.exp(), ()

    def _summarize(self) -> None:
        with summary.scope(self._name):
            for tag, value in (("alpha", self.alpha), ("avg_entropy", self._avg_entropy.get()),
                               ("stage", self._stage), ("update_rate", self._update_rate),
                               ("nonfinite_entropy", self._num_nonfinite)):
                summary.scalar(tag, value)
            if not self._target.constant:
                summary.scalar("target_entropy", self._target_now)

    def _warn_if_stuck(self) -> None:
        """Warn once if still before the adjust stage (reads the state on the host)."""
        self._stuck_checked = True  # the adjust stage never ends, so one look suffices
        stage = int(self._stage)
        if stage >= 0:
            return
        n, avg, max_entropy = self._host_updates, float(self.avg_entropy), float(self._max_entropy)
        target, alpha = float(self._target_now), float(self.alpha)
        bound = (f"max_entropy {max_entropy:.3f} (given)" if self._max_entropy_given else
                 f"max_entropy {max_entropy:.3f} (estimated from the first entropies)")
        if stage < -2:
            why = (f"is still estimating max_entropy after {n} updates: no update had a finite "
                   f"entropy from a non-empty batch ({int(self._num_nonfinite)} NaN/inf)")
            todo = "check the entropies fed to it, or give max_entropy"
        elif stage == -2:
            why = (f"is still in its init stage after {n} updates: until the average entropy "
                   f"({avg:.3f}) falls below {bound}, log_alpha only creeps by "
                   f"very_slow_update_rate per update and the target ({target:.3f}) is not "
                   "acted on")
            todo = (f"give max_entropy (e.g. a little above the target), set skip_free_stage=True "
                    f"to act on the target at once, or start from a smaller initial_alpha (alpha "
                    f"is {alpha:.3g}) so that the entropy can fall")
        else:
            why = (f"is still in its free stage after {n} updates: alpha ({alpha:.3g}) is frozen "
                   f"until the average entropy ({avg:.3f}) falls below the target ({target:.3f}); "
                   f"{bound}")
            todo = ("if the entropy should be held at the target, not only kept above it, set "
                    "skip_free_stage=True, or start from a smaller initial_alpha so that it falls "
                    "to the target (max_entropy only shortens the init stage)")
        message = f"{self._name} {why}. To make it act: {todo}."
        warnings.warn(message, stacklevel=4)
        logging.warning(message)

    def _state(self) -> Tuple[torch.Tensor, ...]:
        state = self._log_alpha, self._stage, self._update_rate, self._max_entropy
        return state + (self._ref_target,) if self._track else state

    def _update_tensor(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> None:
        finite = torch.isfinite(entropy)
        has_data = True if count is None else count > 0
        valid = finite & has_data
        prev_avg = self._avg_entropy.get()
        avg = self._avg_entropy.average(entropy, valid)
        min_log_alpha, slow, fast = self._consts64.unbind()
        new = _stage_machine(
            _TensorOps, self._state()[:4], entropy, prev_avg, avg, valid, self._target_now,
            (self._very_slow, slow, fast, min_log_alpha),
            track=(self._ref_target, self._retarget_rate) if self._track else None,
            max_log_alpha=None if self._max_log_alpha is None else self._max_log_alpha_t,
        )
        for buf, value in zip(self._state(), new):
            buf.copy_(value)

    def _update_host(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> None:
        # Reading CPU buffers is a memory read: there is no device to wait for.
        if count is not None and count.cpu().numpy()[()] <= 0:
            return
        ent = np.float32(entropy.detach().cpu().numpy()[()])
        if not np.isfinite(ent):
            return
        prev_avg, avg = self._avg_entropy.average_on_host(ent)
        views = [buf.numpy() for buf in self._state()]
        track = (views[4][()], self._retarget_rate.numpy()[()]) if self._track else None
        new = _stage_machine(_HostOps, tuple(v[()] for v in views[:4]), ent, prev_avg, avg, True,
                             self._target_now.numpy()[()], self._host_consts, track=track,
                             max_log_alpha=self._max_log_alpha)
        for view, value in zip(views, new):
            view[()] = value


@gin.configurable
class NestedEntropyTargetAlgorithm(EntropyController):
    """One ``EntropyTargetAlgorithm`` per action of a nested action spec (ALF's).

    Each leaf controller sees only its own action's entropy, so e.g. a
    discrete "which tool" and a continuous "how hard" keep their own targets;
    the losses are summed.  The common properties are aggregates (``alpha``:
    mean over the leaves; ``target_entropy``: sum, comparable with the total
    entropy; ``stage``: the least advanced leaf); ``leaf_algorithms()`` gives
    each leaf's controller.  ``adjust_alpha``/``entropy_loss`` take nests of
    entropies shaped like ``action_spec``.

    Args:
        action_spec: a nest of ``BoundedTensorSpec``.
        leaf_cls: the controller of each leaf (``EntropyTargetAlgorithm``,
            ``PIDEntropyTargetAlgorithm``, ...).
        target_entropy: None (each leaf's default), a nest shaped like
            ``action_spec``, or a list with one entry per leaf (in
            ``nest.flatten`` order); entries are numbers, callables or None.
        max_entropy: None, one number for every leaf, or a nest/list as for
            ``target_entropy`` of numbers/None.
        debug_summaries: passed to every leaf controller.
        name: the name; leaf controllers are named ``name/path``.
        **kwargs: the leaf controller's other arguments, shared.

    Raises:
        ValueError: if ``target_entropy``/``max_entropy`` do not match
            ``action_spec``.
    """

    _adaptive = False  # the leaves are

    def __init__(
        self,
        action_spec: Any,
        leaf_cls: Callable[..., EntropyController] = EntropyTargetAlgorithm,
        target_entropy: Any = None,
        max_entropy: Any = None,
        debug_summaries: bool = False,
        name: str = "NestedEntropyTargetAlgorithm",
        **kwargs: Any,
    ):
        super().__init__(action_spec, debug_summaries=debug_summaries, name=name)
        self._paths = [p for p, _ in nest.flatten_with_path(action_spec)]
        specs = nest.flatten(action_spec)
        if is_real(max_entropy):
            max_entropy = [max_entropy] * len(specs)
        targets = self._per_leaf(target_entropy, "target_entropy")
        maxes = self._per_leaf(max_entropy, "max_entropy")
        if any(m is not None for m in maxes):
            kwargs_of = [dict(kwargs, max_entropy=m) for m in maxes]
        else:  # leaf controllers without max_entropy (the PID one) accept this too
            kwargs_of = [kwargs] * len(maxes)
        # Keyed by path ("." is not allowed in module names): the state_dict
        # reads e.g. "_leaves.arm/grip._log_alpha".
        self._leaves = nn.ModuleDict(
            (path.replace(".", "/") or "action",
             leaf_cls(spec, target_entropy=t, debug_summaries=debug_summaries,
                      name=f"{name}/{path}", **kw))
            for path, spec, t, kw in zip(self._paths, specs, targets, kwargs_of)
        )

    def _per_leaf(self, value: Any, arg_name: str = "entropy") -> list:
        """``value`` as one entry per leaf: None, a nest like the spec, or a flat list."""
        n = len(self._paths)
        if value is None:
            return [None] * n
        try:
            return nest.flatten_up_to(self._action_spec, value)
        except ValueError as e:
            if isinstance(value, (list, tuple)) and len(value) == n:
                return list(value)
            raise ValueError(
                f"{arg_name} must be None, a nest shaped like action_spec or a list with "
                f"one entry per action ({n}): {e}"
            ) from e

    def leaf_algorithms(self) -> Dict[str, EntropyController]:
        """The per-leaf controllers keyed by their path in the action spec."""
        return dict(zip(self._paths, self._leaves.values()))

    @property
    def alpha(self) -> torch.Tensor:
        """Mean ``alpha`` over the leaves."""
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

    def adjust_alpha(self, entropy: Any) -> torch.Tensor:
        """Each leaf advances once with its own entropy.

        Args:
            entropy: floats or one-element tensors, a nest shaped like
                ``action_spec`` (or a list with one per leaf).

        Returns:
            The mean ``alpha`` over the leaves.
        """
        for leaf, e in zip(self._leaves.values(), self._per_leaf(entropy)):
            leaf.adjust_alpha(e)
        return self.alpha

    def _loss(self, neg_entropy: Any, mask: Optional[torch.Tensor], neg_grad: Any,
              update: bool) -> LossInfo:
        """Each leaf's loss on its own entropy (nests shaped like ``action_spec``);
        ``loss`` summed, ``extra`` a nest of the leaves' ``EntropyTargetLossInfo``."""
        losses = [leaf._loss(e, mask, g, update) for leaf, e, g in
                  zip(self._leaves.values(), self._per_leaf(neg_entropy), self._per_leaf(neg_grad))]
        return LossInfo(
            loss=functools.reduce(torch.add, [li.loss for li in losses]),
            scalar_loss=functools.reduce(torch.add, [li.scalar_loss for li in losses]),
            extra=nest.pack_sequence_as(self._action_spec, [li.extra for li in losses]),
        )


@gin.configurable
class SGDEntropyTargetAlgorithm(EntropyController):
    """SAC's gradient rule for ``alpha`` (ALF's ``SGDEntropyTargetAlgorithm``).

    ``log_alpha`` is a parameter trained on ``log_alpha * (H - target)``,
    ``H`` the batch-mean entropy averaged over the last ``window_size``
    updates (detached), so ``alpha`` falls while the entropy is above the
    target and rises below it.

    Who takes the gradient step (every call moves ``alpha``, once):

    * **Trained by a parent.** When a parent algorithm's ``optimizers()``
      collects this controller (``ActorCriticAlgorithm`` and ``SacAlgorithm``
      do so in their constructors; ``trained_by_parent`` is then True), the
      tree's optimiser (this controller's ``optimizer``, or the parent's)
      trains ``log_alpha``: ``entropy_loss``/``calc_loss`` return the rule's
      loss as ``scalar_loss`` for the parent's ``update_with_gradient``, as in
      ALF, and step nothing themselves.
    * **Otherwise** (used alone, in your own loop), ``entropy_loss``/
      ``calc_loss`` take the step themselves and return ``scalar_loss = 0``
      (a 0-d tensor without gradient: adding it to your loss changes nothing,
      and an optimiser of yours that holds ``log_alpha`` skips it).
    * ``adjust_alpha`` always takes the step itself.

    The step is ``optimizer``'s; with ``optimizer=None`` the parent's
    optimiser's (stepping ``log_alpha`` alone), or, alone, SAC's default
    Adam(lr=3e-4), computed here on 0-d buffers without a host read.
    The ``LossInfo.loss`` of ``entropy_loss`` uses ``alpha`` before the step
    (as SAC's actor loss does).  ``min_alpha``/``max_alpha`` clamp
    ``log_alpha`` after every step this controller takes and before every
    update (a parent's optimiser steps it in between); ``alpha`` is always
    read within them.

    Args:
        action_spec: nest of ``BoundedTensorSpec``; used for the default target.
        initial_alpha: initial ``alpha`` (> 0, within ``[min_alpha, max_alpha]``).
        target_entropy: a number, a scheduler/zero-argument callable, or None
            for the spec's default.
        window_size: number of updates the entropy is averaged over (>= 1).
        optimizer: factory ``params -> Optimizer`` for ``log_alpha``; None
            (ALF's default): the parent's optimiser trains it, or alone a
            built-in Adam(lr=3e-4).
        min_alpha: optional floor of ``alpha`` (> 0); None: none (SAC's rule).
        max_alpha: optional ceiling of ``alpha`` (> 0, >= ``min_alpha``), like
            ALF SAC's ``max_log_alpha``; None: none.
        update_mode: where the windup watch and ``limit_log_alpha_span`` run:
            ``"tensor"`` (never syncs a GPU), ``"host"`` (numpy over CPU state)
            or ``"auto"`` (host on the CPU).  The rule's step is tensor ops.
        debug_summaries: write ``alpha``, ``entropy`` and ``target_entropy``.
        name: the name.

    Raises:
        TypeError: for an argument of the wrong type.
        ValueError: for an argument out of range, ``min_alpha > max_alpha``
            or ``initial_alpha`` outside them.

    Examples:
        >>> import torch
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec
        >>> spec = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
        >>> sgd = SGDEntropyTargetAlgorithm(spec, target_entropy=-2.0)  # SAC's -dim(A)
        >>> float(sgd.adjust_alpha(0.5)) < 0.1  # entropy above the target: alpha falls
        True
        >>> before = sgd.alpha
        >>> info = sgd.entropy_loss(torch.full((8,), 0.5))  # alone: steps alpha too
        >>> bool(sgd.alpha < before), info.scalar_loss  # and leaves nothing to the caller
        (True, tensor(0.))
    """

    # SAC's default temperature optimiser, used when nothing else steps log_alpha.
    ADAM_LR, ADAM_BETAS, ADAM_EPS = 3e-4, (0.9, 0.999), 1e-8

    def __init__(
        self,
        action_spec: Any,
        initial_alpha: float = 0.1,
        target_entropy: TargetArg = None,
        window_size: int = 1,
        optimizer: OptimizerArg = None,
        min_alpha: Optional[float] = None,
        max_alpha: Optional[float] = None,
        update_mode: str = "auto",
        debug_summaries: bool = False,
        name: str = "SGDEntropyTargetAlgorithm",
    ):
        super().__init__(
            action_spec, optimizer=optimizer, debug_summaries=debug_summaries, name=name
        )
        initial_alpha = check_real("initial_alpha", initial_alpha, positive=True)
        check_int("window_size", window_size, minimum=1)
        self._init_update_mode(update_mode)
        bounds = [None if v is None else check_real(arg, v, positive=True)
                  for arg, v in (("min_alpha", min_alpha), ("max_alpha", max_alpha))]
        if None not in bounds and bounds[0] > bounds[1]:
            raise ValueError(f"min_alpha ({min_alpha}) must be <= max_alpha ({max_alpha})")
        if (bounds[0] is not None and initial_alpha < bounds[0]) or (
                bounds[1] is not None and initial_alpha > bounds[1]):
            raise ValueError(f"initial_alpha ({initial_alpha}) must be within "
                             f"[min_alpha, max_alpha] = [{min_alpha}, {max_alpha}]")
        self._init_target(target_entropy)
        if bounds[1] is not None:
            self._max_log_alpha_watch = math.log(bounds[1])
        self._log_alpha = nn.Parameter(torch.tensor(math.log(initial_alpha), dtype=torch.float32))
        # log_alpha's bounds as Python floats (clamp_ takes them without a copy); None: no clamp.
        self._log_bounds = None if bounds == [None, None] else tuple(
            None if v is None else float(np.float32(math.log(v))) for v in bounds)
        self._avg_entropy = ScalarWindowAverager(window_size)
        # Always "adjusting": reported as stage 1 so logs read alike.
        self.register_buffer("_stage", torch.tensor(1, dtype=torch.int32), persistent=False)
        # The built-in Adam's moments and step count (not saved, as an
        # optimiser's state is not part of a module's state_dict).
        self.register_buffer("_adam", torch.zeros(3), persistent=False)
        self._trained_by_parent = False

    @property
    def alpha(self) -> torch.Tensor:
        """The current ``alpha`` (detached, within ``[min_alpha, max_alpha]``)."""
        return self.log_alpha.exp()

    @property
    def log_alpha(self) -> torch.Tensor:
        """``log_alpha`` (detached, within the bounds of ``alpha``)."""
        log_alpha = self._log_alpha.detach()
        return log_alpha if self._log_bounds is None else log_alpha.clamp(*self._log_bounds)

    @property
    def stage(self) -> torch.Tensor:
        """Always 1: the SGD rule has no stages."""
        return self._stage

    @property
    def target_entropy(self) -> float:
        """The target's current value."""
        return self._current_target()

    @property
    def trained_by_parent(self) -> bool:
        """Whether a parent's optimisers train ``log_alpha`` via ``scalar_loss`` (see the class)."""
        return self._trained_by_parent

    def _collect_optimizers(self, is_root: bool,
                            inherited: Optional[torch.optim.Optimizer] = None) -> list:
        # Collected by a parent: from now on the parent's update_with_gradient
        # minimises scalar_loss, so entropy_loss must not step log_alpha too.
        if not is_root:
            self._trained_by_parent = True
        return super()._collect_optimizers(is_root, inherited)

    def after_update(self, *args: Any, **kwargs: Any) -> None:
        """After a parent's gradient step: clamp ``log_alpha`` to its bounds (and span)."""
        self._clamp()
        self._apply_log_alpha_limits()
        super().after_update(*args, **kwargs)

    def _clamp(self) -> None:
        if self._log_bounds is not None:
            with torch.no_grad():
                self._log_alpha.clamp_(*self._log_bounds)

    def adjust_alpha(self, entropy: Union[float, torch.Tensor]) -> torch.Tensor:
        """One optimiser step of ``log_alpha`` on SAC's loss (see the class).

        Args:
            entropy: a Python float or a one-element tensor.

        Returns:
            The new ``alpha``.
        """
        entropy = _scalar_entropy(entropy, self._log_alpha)
        self._step(self._gap(entropy, None))
        self._finish(entropy, None)
        return self.alpha

    def _update(
        self, entropy: torch.Tensor, count: Optional[torch.Tensor]
    ) -> Tuple[torch.Tensor, Any]:
        gap = self._gap(entropy, count)
        alpha = self.alpha
        if self._trained_by_parent:
            return alpha, self._log_alpha * gap
        self._step(gap)
        return alpha, torch.zeros((), device=gap.device)

    def _gap(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> torch.Tensor:
        """``H - target`` (the gradient of the rule's loss); 0 for no data or NaN/inf."""
        self._clamp()  # a parent's optimiser may have stepped log_alpha out of its bounds
        if not self._target.constant:
            self._target_now.fill_(self._target(counting=True))
        ok = torch.isfinite(entropy) if count is None else (count > 0) & torch.isfinite(entropy)
        avg = self._avg_entropy.average(entropy.to(torch.float32), ok)
        return torch.where(ok, avg - self._target_now, 0.0)

    def _summarize(self) -> None:
        with summary.scope(self._name):
            for tag, value in (("alpha", self.alpha), ("entropy", self._avg_entropy.get()),
                               ("target_entropy", self._target_now)):
                summary.scalar(tag, value)

    def _step(self, gap: torch.Tensor) -> None:
        """One step of ``log_alpha`` with gradient ``gap``, then the clamp."""
        if self._optimizer_arg is not None:
            optimizer = self.optimizers()[0]
        else:
            optimizer = self.parent_optimizer
        if optimizer is None:
            self._adam_step(gap)
        else:
            # Step log_alpha alone, whatever else the optimiser holds.
            params = [p for group in optimizer.param_groups for p in group["params"]]
            saved = [p.grad for p in params]
            for p in params:
                p.grad = None  # optimisers skip parameters without a gradient
            self._log_alpha.grad = gap.to(self._log_alpha.dtype)
            optimizer.step()
            for p, g in zip(params, saved):
                p.grad = g
        self._clamp()

    @torch.no_grad()
    def _adam_step(self, grad: torch.Tensor) -> None:
        """torch's Adam(lr=3e-4) on the 0-d ``log_alpha``, in tensor ops (no host read)."""
        (b1, b2), eps = self.ADAM_BETAS, self.ADAM_EPS
        m, v, t = self._adam.unbind()
        t = t + 1
        m = m * b1 + (1 - b1) * grad
        v = v * b2 + (1 - b2) * grad * grad
        self._adam.copy_(torch.stack([m, v, t]))
        denom = (v.sqrt() / (1 - b2 ** t).sqrt()) + eps
        self._log_alpha.sub_(self.ADAM_LR / (1 - b1 ** t) * m / denom)
