"""Every control law, written once as a pure function over an ops namespace.

A rule takes its state (a ``NamedTuple`` of ``state.py``), the update's
entropy, whether the update counts (``valid``), the target and its constants,
and returns the new state.  It never branches in Python on a value: every
decision is a ``x.where`` on a condition, so the same code runs

* on the host (``ScalarOps``: NumPy scalars, one controller; ``ArrayOps``:
  NumPy arrays, a batch of controllers), where reading CPU state is a memory
  read, and
* on tensors (``TensorOps``), where it never reads a value on the host (no
  GPU synchronisation),

with the same dtypes and so the same bits.
"""
from typing import Any, Tuple

import numpy as np
import torch

from alf_entropy.controllers.state import PIDState, SGDState, StagedState, WatchState

__all__ = ["ScalarOps", "ArrayOps", "TensorOps", "window_mean", "window_average", "staged_rule",
           "pid_rule", "sgd_rule", "watch_rule", "span_rule", "unreachable"]

WINDUP_WINDOW = 500
"""Updates in a row below the target with ``alpha`` at its ceiling before the target counts
as unreachable."""
WATCH_EMA = 0.99
"""Smoothing of the entropy that the windup watch and settled annealing compare."""
TARGET_MOVE = 0.05
"""``track_target_changes``: a target move larger than this (relative) restarts adjusting."""


class ScalarOps:
    """NumPy scalars (one controller on the CPU): a Python select."""

    where = staticmethod(lambda cond, a, b: a if cond else b)
    maximum, minimum, abs = staticmethod(max), staticmethod(min), staticmethod(abs)
    clip = staticmethod(lambda v, lo, hi: min(max(v, lo), hi))
    f32, f64, i32, isfinite = np.float32, np.float64, np.int32, np.isfinite

    @staticmethod
    def push(window: np.ndarray, seen: Any, value: Any, valid: Any) -> np.ndarray:
        """``window`` with ``value`` written at slot ``seen % len`` if ``valid``."""
        if not valid:
            return window
        window = window.copy()
        window[seen % window.shape[-1]] = value
        return window


class ArrayOps(ScalarOps):
    """NumPy arrays (a batch of controllers on the CPU)."""

    maximum, minimum, abs = staticmethod(np.maximum), staticmethod(np.minimum), staticmethod(np.abs)
    clip = staticmethod(lambda v, lo, hi: np.minimum(np.maximum(v, lo), hi))

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        # A Python float keeps the other operand's dtype under torch and scalar NumPy;
        # np.where would make it float64, so it becomes float32 here (np.float64 is a
        # float subclass: hence ``type(...) is float``).
        return np.where(cond, np.float32(a) if type(a) is float else a,
                        np.float32(b) if type(b) is float else b)

    @staticmethod
    def push(window: np.ndarray, seen: Any, value: Any, valid: Any) -> np.ndarray:
        hit = np.arange(window.shape[-1]) == (seen % window.shape[-1])[..., None]
        return np.where(hit & np.asarray(valid)[..., None], np.asarray(value)[..., None], window)


class TensorOps:
    """Tensors: never reads a value on the host."""

    where, maximum, minimum, abs = torch.where, torch.maximum, torch.minimum, torch.abs
    isfinite, clip = torch.isfinite, torch.clamp
    f32 = staticmethod(lambda t: t.to(torch.float32))
    f64 = staticmethod(lambda t: t.to(torch.float64))
    i32 = staticmethod(lambda t: t.to(torch.int32))

    @staticmethod
    def push(window: torch.Tensor, seen: torch.Tensor, value: torch.Tensor,
             valid: torch.Tensor) -> torch.Tensor:
        slots = torch.arange(window.shape[-1], device=window.device)
        hit = (slots == (seen % window.shape[-1]).unsqueeze(-1)) & valid.unsqueeze(-1)
        return torch.where(hit, value.unsqueeze(-1).to(window.dtype), window)


def window_mean(x: Any, window: Any, seen: Any) -> Any:
    """The mean of the values in ``window`` (``seen`` so far): ``sum * (1 / n)`` as in ALF."""
    total = window[..., 0]
    for i in range(1, window.shape[-1]):  # a fixed order: the same bits on every path
        total = total + window[..., i]
    return total * (1.0 / x.f32(x.clip(seen, 1, window.shape[-1])))


def window_average(x: Any, window: Any, seen: Any, value: Any, valid: Any) -> Tuple:
    """ALF's ``ScalarWindowAverager`` as a rule: the mean of the last ``len(window)`` values.

    Returns:
        ``(previous average, new average, new window, new seen)`` (0 before any value).
    """
    new_window = x.push(window, seen, value, valid)
    new_seen = seen + x.where(valid, 1, 0)
    return window_mean(x, window, seen), window_mean(x, new_window, new_seen), new_window, new_seen


def staged_rule(x: Any, s: StagedState, entropy: Any, valid: Any, target: Any,
                c: Any) -> StagedState:
    """ALF's staged ``adjust_alpha`` (the PyTorch version), its ``if``s as selects.

    Each of ALF's sequential ``if``s is a condition (with the gate ``valid``)
    and each state write a select on it, so one update can cascade through
    several stages as in ALF.  Dtypes are ALF's: float32 state, float64
    ``log_alpha`` steps, floor and slow/fast rates.  ``c.track`` (not in ALF;
    0 keeps ALF's machine): a target moved by more than ``TARGET_MOVE`` from
    ``ref_target`` restarts the adjust stage from ``c.retarget_rate``.
    """
    prev_avg, avg, window, seen = window_average(x, s.window, s.seen, entropy, valid)
    log_alpha, stage, rate, max_entropy = s.log_alpha, s.stage, s.update_rate, s.max_entropy
    decreasing = avg < prev_avg
    estimating = valid & (stage < -2)
    max_entropy = x.where(estimating, x.minimum(0.8 * avg, avg / 0.8), max_entropy)
    stage = stage + estimating
    init = valid & (stage == -2)  # down while the entropy rises, up by half while it falls
    step = x.where(decreasing, 0.5, -1.0) * c.very_slow_update_rate
    log_alpha = x.where(init, x.f32(x.maximum(x.f64(log_alpha + step), c.min_log_alpha)),
                        log_alpha)
    stage = stage + (init & (avg < max_entropy))
    stage = stage + (valid & (stage == -1) & (avg < target))  # free: wait for the target
    adjust = valid & (stage >= 0)
    moved = valid & (c.track > 0) & (x.abs(target - s.ref_target) > TARGET_MOVE
                                     * x.abs(s.ref_target))
    rate = x.where(adjust & moved, c.retarget_rate, rate)
    above = avg > target
    new_rate = x.where(above != (stage != 0), rate * 0.9, rate)  # a crossing
    new_rate = x.maximum(x.f64(new_rate), c.slow_update_rate)
    fast = entropy < x.where(target > 0, 0.5 * target, 2.0 * target)
    new_rate = x.where(fast, c.fast_update_rate, new_rate)
    coef = x.where(above, x.where(decreasing, 0.5, -1.0), x.where(decreasing, 1.0, -0.5))
    new_log_alpha = x.f32(x.maximum(x.f64(log_alpha) + coef * new_rate, c.min_log_alpha))
    return StagedState(
        log_alpha=x.where(adjust, new_log_alpha, log_alpha),
        stage=x.where(adjust, x.i32(above), stage),
        update_rate=x.where(adjust, x.f32(new_rate), rate),
        max_entropy=max_entropy,
        ref_target=x.where(moved, target, s.ref_target),
        window=window, seen=seen)


def pid_rule(x: Any, s: PIDState, entropy: Any, valid: Any, target: Any, c: Any,
             b: Any) -> PIDState:
    """PID on ``e = (target - H) / error_scale``: ``log_alpha = I + kp ema(e) - kd trend``.

    ``I`` integrates ``ki * gain * e`` (at most ``c.max_step`` a step).  ``gain``
    grows ``c.gain_growth``-fold per update while the entropy stays below the
    target (outside ``c.gain_band`` of it) and is not rising, shrinks while it
    rises, within ``[1, c.max_gain]``, and restarts at 1 at a crossing: a slow
    plant (PPO's entropy, answering alpha over many updates) gets the integral
    rate it needs, a fast one keeps ``ki``.  The integral holds inside the dead
    band and while the P and D terms already push the other way, and absorbs
    what the bounds ``b`` cut off (back-calculation).  The first update sets
    ``I`` so that the output is the initial ``alpha`` (bumpless start);
    ``alpha`` moves by at most ``c.max_step`` in log per update.
    """
    first = s.count == 0
    err = (target - entropy) * c.inv_scale
    err_ema = x.where(first, err, c.err_beta * s.err_ema + (1 - c.err_beta) * err)
    fast = x.where(first, entropy, c.fast_beta * s.fast + (1 - c.fast_beta) * entropy)
    slow = x.where(first, entropy, c.slow_beta * s.slow + (1 - c.slow_beta) * entropy)
    trend = (fast - slow) * c.inv_scale  # > 0: rising
    pd = c.kp * err_ema - c.kd * trend
    below = err_ema > 0
    outside = x.abs(err_ema) > c.gain_band * x.abs(target) * c.inv_scale
    same_side = x.where(below, s.gain > 0, s.gain < 0)
    gain = x.abs(s.gain) * x.where(below & (trend <= 0), c.gain_growth, c.gain_shrink)
    gain = x.minimum(x.where(gain < 1.0, 1.0, gain), c.max_gain)
    gain = x.where(same_side & outside, gain, 1.0)
    inside = x.abs(target - entropy) <= c.deadband * x.abs(target)
    hold = inside | ((err > 0) & (pd < 0)) | ((err < 0) & (pd > 0))
    step = x.minimum(x.maximum(c.ki * gain * err, -c.max_step), c.max_step)
    integral = s.integral + x.where(hold, 0.0, step)
    integral = x.where(first, s.log_alpha - pd, integral)
    wanted = integral + pd
    bounded = x.minimum(x.maximum(wanted, b.lo), b.hi)
    integral = integral + (bounded - wanted)
    log_alpha = x.minimum(x.maximum(bounded, s.log_alpha - c.max_step), s.log_alpha + c.max_step)
    new = PIDState(log_alpha, integral, err_ema, fast, slow, s.count + 1,
                   x.where(below, gain, -gain))
    return PIDState(*(x.where(valid, n, o) for n, o in zip(new, s)))


def sgd_rule(x: Any, s: SGDState, entropy: Any, valid: Any, target: Any, c: Any) -> SGDState:
    """SAC's temperature gradient ``H - target`` (``H`` averaged over a window); 0 if invalid.

    ``grad`` is the gradient of ``log_alpha * (H - target)``: the controller's
    optimiser then steps ``log_alpha`` with it.
    """
    _, avg, window, seen = window_average(x, s.window, s.seen, entropy, valid)
    return SGDState(s.log_alpha, window, seen, x.where(valid, avg - target, 0.0))


def watch_rule(x: Any, s: WatchState, entropy: Any, has_data: Any, valid: Any, target: Any,
               log_alpha: Any, c: Any, max_log_alpha: Any) -> Tuple[WatchState, Any]:
    """The windup watch, the NaN/inf count and settled annealing of the target.

    A stall: the smoothed entropy below the target with ``alpha`` at its ceiling
    (``max_log_alpha``), the one state in which alpha provably can do no more (a
    slow plant may need alpha to climb a thousandfold before its entropy
    answers, so no climb counts); ``stalled_for`` counts them in a row.  Annealing: after
    ``c.anneal_window`` updates within ``c.anneal_tolerance`` of the target (or
    stalled short of it) the target steps down by ``c.anneal_drop`` of itself,
    not below ``c.anneal_final``.

    Returns:
        ``(new state, new target)``.
    """
    ema = x.where(s.count == 0, entropy, WATCH_EMA * s.ema + (1 - WATCH_EMA) * entropy)
    stalled = (ema < target) & (log_alpha >= max_log_alpha - 1e-6)
    near = x.abs(ema - target) <= c.anneal_tolerance * x.abs(target)
    settled = x.where(near | stalled, s.settled + 1, 0)
    fire = settled >= c.anneal_window
    lowered = x.maximum(target - c.anneal_drop * x.abs(target), c.anneal_final)
    new = WatchState(ema, x.where(stalled, s.stalled_for + 1, 0), s.count + 1,
                     x.where(fire, 0, settled), s.nonfinite)
    new = WatchState(*(x.where(valid, n, o) for n, o in zip(new, s)))
    nonfinite = s.nonfinite + x.where(valid, 0, x.where(has_data, 1, 0))  # NaN/inf, not empty
    return new._replace(nonfinite=nonfinite), x.where(valid & fire, lowered, target)


def span_rule(x: Any, log_alpha: Any, lowest: Any, highest: Any, span: Any) -> Tuple:
    """``log_alpha`` kept within ``span`` of every value since the limit began.

    Returns:
        ``(log_alpha, lowest, highest)``.
    """
    log_alpha = x.minimum(x.maximum(log_alpha, highest - span), lowest + span)
    return log_alpha, x.minimum(lowest, log_alpha), x.maximum(highest, log_alpha)


def unreachable(stalled_for: Any) -> Any:
    """The watch's verdict: ``WINDUP_WINDOW`` updates in a row below the target with ``alpha``
    at its ceiling."""
    return stalled_for >= WINDUP_WINDOW
