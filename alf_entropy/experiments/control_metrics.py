"""How well an entropy controller held the entropy at its target: pure metrics.

Every function takes plain 1-d arrays (numpy, lists) of one run, sampled at
the controller's updates or at logged training iterations, and returns
numbers; the report (``alf-entropy-report``) and the benchmarks (control
quality, LLM entropy control) use them, so each metric is defined once, here:

* :func:`warmup_end`: where tracking starts: the first sample whose entropy
  is at or below ``(1 + tol) * target`` (before it, the policy is still more
  random than asked, which the controller allows).
* :func:`tracking_rmse`: root-mean-square of ``entropy - target`` from there.
* :func:`fraction_below`: the fraction of samples from there that are more
  than ``tol`` (relative) below the target.
* :func:`minimum_variance_floor`: the tracking error no controller acting
  ``delay`` samples late could remove (Harris's minimum-variance bound).
* :func:`target_changes` / :func:`settling_times`: for each jump of the
  target, how long until the entropy entered the ``±tol`` band around the new
  target and stayed in it (until the next jump or the end).
* :func:`largest_alpha_change`: the largest multiplicative change of ``alpha``
  within one iteration (one group of updates).
* :func:`final_value`: the last finite value (e.g. the final evaluation
  return).
* :func:`bootstrap_ci`: the mean of one metric over seeds with a percentile
  bootstrap confidence interval.

Bands are relative to ``|target|`` so they also work for negative targets
(continuous actions).
"""
import math
from typing import NamedTuple, Optional, Sequence, Tuple

import numpy as np

from alf_entropy.utils.checks import check_int, check_real

__all__ = [
    "AlphaChange",
    "warmup_end",
    "tracking_rmse",
    "fraction_below",
    "minimum_variance_floor",
    "target_changes",
    "settling_times",
    "largest_alpha_change",
    "final_value",
    "bootstrap_ci",
]


def _pair(entropy: Sequence[float], target: Sequence[float]):
    """Both series as float64 arrays of one length (a scalar target broadcasts)."""
    e = np.asarray(entropy, dtype=np.float64).reshape(-1)
    t = np.asarray(target, dtype=np.float64)
    if t.ndim and t.size != e.size:
        raise ValueError(f"entropy and target must have the same length, got {e.size} and {t.size}")
    return e, np.broadcast_to(t.reshape(-1) if t.ndim else t, e.shape).astype(np.float64)


def warmup_end(entropy: Sequence[float], target: Sequence[float], tol: float = 0.05) -> int:
    """Index of the first sample with ``entropy <= target + tol * |target|``.

    Args:
        entropy: the entropy series.
        target: the target series (or one number).
        tol: relative tolerance, in ``[0, 1)``.

    Returns:
        int: the index, or ``len(entropy)`` if the entropy never got there.

    Raises:
        TypeError: if ``tol`` is not a real number.
        ValueError: for series of different lengths or a bad ``tol``.
    """
    e, t = _pair(entropy, target)
    tol = check_real("tol", tol, minimum=0, below=1)
    reached = np.nonzero(e <= t + tol * np.abs(t))[0]
    return int(reached[0]) if reached.size else int(e.size)


def tracking_rmse(entropy: Sequence[float], target: Sequence[float], start: int = 0) -> float:
    """Root-mean-square of ``entropy - target`` over ``[start:]``.

    Args:
        entropy: the entropy series.
        target: the target series (or one number).
        start: the first sample counted (e.g. :func:`warmup_end`).

    Returns:
        float: the RMSE; NaN if no sample is left.

    Raises:
        ValueError: for series of different lengths or a ``start`` that is not
            an int >= 0.
    """
    e, t = _pair(entropy, target)
    start = check_int("start", start, minimum=0)
    d = (e - t)[start:]
    return float(np.sqrt(np.mean(d * d))) if d.size else math.nan


def fraction_below(
    entropy: Sequence[float], target: Sequence[float], tol: float = 0.05, start: int = 0
) -> float:
    """Fraction of samples in ``[start:]`` below ``target - tol * |target|``.

    Args:
        entropy: the entropy series.
        target: the target series (or one number).
        tol: relative tolerance, in ``[0, 1)``.
        start: the first sample counted.

    Returns:
        float: in ``[0, 1]``; NaN if no sample is left.

    Raises:
        TypeError: if ``tol`` is not a real number.
        ValueError: for series of different lengths, a bad ``tol`` or ``start``.
    """
    e, t = _pair(entropy, target)
    tol = check_real("tol", tol, minimum=0, below=1)
    start = check_int("start", start, minimum=0)
    below = (e < t - tol * np.abs(t))[start:]
    return float(below.mean()) if below.size else math.nan


def minimum_variance_floor(entropy: Sequence[float], target: Sequence[float], start: int = 0,
                           delay: int = 2, order: int = 4) -> float:
    """The RMS error no controller acting ``delay`` samples late could remove.

    Harris's minimum-variance bound (Harris, "Assessment of closed-loop
    performance", 1989), estimated from the run itself: an AR(``order``) fit
    of ``entropy - target`` over ``[start:]`` (mean removed: an offset is
    removable) gives the innovations' variance ``s2`` and impulse response
    ``psi``; what was unpredictable ``delay`` samples earlier has variance
    ``s2 * sum(psi[:delay] ** 2)``, and a controller whose action first shows
    ``delay`` samples later (e.g. a coefficient set after step ``t`` moves
    the entropy measured at ``t + 2``) cannot cancel it.  On a linear plant
    the estimate is the same under every linear controller.

    Args:
        entropy: the entropy series.
        target: the target series (or one number).
        start: the first sample counted (e.g. :func:`warmup_end`).
        delay: samples between an action and its first effect (>= 1).
        order: the AR model's order (>= 1).

    Returns:
        float: the bound's square root (an RMS, in the entropy's unit); NaN
        with fewer than ``2 * order + delay`` samples.

    Raises:
        ValueError: for series of different lengths, or a bad ``start``,
            ``delay`` or ``order``.
    """
    e, t = _pair(entropy, target)
    start = check_int("start", start, minimum=0)
    delay = check_int("delay", delay, minimum=1)
    order = check_int("order", order, minimum=1)
    y = (e - t)[start:]
    if y.size < 2 * order + delay:
        return math.nan
    y = y - y.mean()
    lags = np.column_stack([y[order - k:y.size - k] for k in range(1, order + 1)])
    coef = np.linalg.lstsq(lags, y[order:], rcond=None)[0]
    residual = y[order:] - lags @ coef
    s2 = float(residual @ residual) / (residual.size - order)
    psi = [1.0]
    for k in range(1, delay):
        psi.append(sum(coef[i] * psi[k - 1 - i] for i in range(min(order, k))))
    return math.sqrt(s2 * sum(v * v for v in psi))


def target_changes(target: Sequence[float], min_change: float = 0.05) -> np.ndarray:
    """Indices ``i > 0`` where the target jumps: ``|t[i] - t[i-1]| > min_change * |t[i-1]|``.

    A slow schedule (a ramp) moves by tiny amounts per sample and is not a
    jump; a step is.

    Args:
        target: the target series.
        min_change: the relative size of a jump (> 0).

    Returns:
        np.ndarray: the indices (int64), possibly empty.

    Raises:
        TypeError: if ``min_change`` is not a real number.
        ValueError: if ``min_change <= 0``.
    """
    min_change = check_real("min_change", min_change, positive=True)
    t = np.asarray(target, dtype=np.float64).reshape(-1)
    jump = np.abs(np.diff(t)) > min_change * np.abs(t[:-1])
    return np.nonzero(jump)[0].astype(np.int64) + 1


def settling_times(
    entropy: Sequence[float],
    target: Sequence[float],
    tol: float = 0.05,
    min_change: float = 0.05,
    x: Optional[Sequence[float]] = None,
) -> list:
    """For each target jump, the time until the entropy settled in ``±tol``.

    The entropy has settled at the first sample after which it stays within
    ``tol * |target|`` of the target until the next jump (or the end).

    Args:
        entropy: the entropy series.
        target: the target series.
        tol: relative band, in ``[0, 1)``.
        min_change: relative size of a target jump (see :func:`target_changes`).
        x: optional sample positions (e.g. env steps); times are then
            differences of ``x``, else numbers of samples.

    Returns:
        list: one float per jump: the settling time, or NaN if the entropy
        was outside the band at the last sample before the next jump (it
        never settled).

    Raises:
        TypeError: if ``tol`` or ``min_change`` is not a real number.
        ValueError: for series of different lengths or bad ``tol``/``min_change``.
    """
    e, t = _pair(entropy, target)
    tol = check_real("tol", tol, minimum=0, below=1)
    pos = np.arange(e.size, dtype=np.float64) if x is None else np.asarray(x, dtype=np.float64)
    if pos.shape != e.shape:
        raise ValueError(f"x must have the length of entropy ({e.size}), got {pos.size}")
    inside = np.abs(e - t) <= tol * np.abs(t)
    changes = target_changes(t, min_change)
    ends = list(changes[1:]) + [e.size]
    result = []
    for begin, end in zip(changes, ends):
        seg = inside[begin:end]
        if not seg[-1]:
            result.append(math.nan)
            continue
        outside = np.nonzero(~seg)[0]
        settled = begin + (int(outside[-1]) + 1 if outside.size else 0)
        result.append(float(pos[settled] - pos[begin]))
    return result


class AlphaChange(NamedTuple):
    """The largest change of ``alpha`` within one iteration.

    Attributes:
        factor: ``max / min`` of alpha in that iteration (>= 1; 1 if constant).
        group: the iteration (group id) where it happened.
        before: the earlier of the two extreme values.
        after: the later one.
    """

    factor: float
    group: float
    before: float
    after: float


def largest_alpha_change(
    alpha: Sequence[float], group: Optional[Sequence[float]] = None
) -> AlphaChange:
    """The iteration in which ``alpha`` changed by the largest factor.

    ``group[i]`` is the iteration of update ``i`` (several updates per
    iteration, in order).  An iteration also includes the last value of the
    previous iteration when that is ``group - 1`` (the value it started from),
    so with one update per iteration this is the largest step-to-step factor.

    Args:
        alpha: alpha after each update (> 0).
        group: the iteration of each update; None means one per update.

    Returns:
        AlphaChange: NaNs if ``alpha`` is empty.

    Raises:
        ValueError: for series of different lengths or a non-positive alpha.
    """
    a = np.asarray(alpha, dtype=np.float64).reshape(-1)
    g = np.arange(a.size, dtype=np.float64) if group is None else np.asarray(group, np.float64)
    if g.shape != a.shape:
        raise ValueError(f"group must have the length of alpha ({a.size}), got {g.size}")
    if a.size == 0:
        return AlphaChange(math.nan, math.nan, math.nan, math.nan)
    if np.any(~(a > 0)):
        raise ValueError("alpha must be > 0 everywhere")
    best = AlphaChange(1.0, float(g[0]), float(a[0]), float(a[0]))
    bounds = np.nonzero(np.diff(g) != 0)[0] + 1
    starts = np.concatenate([[0], bounds])
    stops = np.concatenate([bounds, [a.size]])
    for s, e in zip(starts, stops):
        lo = s - 1 if s > 0 and g[s - 1] == g[s] - 1 else s
        seg = a[lo:e]
        i_min, i_max = int(np.argmin(seg)), int(np.argmax(seg))
        factor = float(seg[i_max] / seg[i_min])
        if factor > best.factor:
            first, last = sorted((i_min, i_max))
            best = AlphaChange(factor, float(g[s]), float(seg[first]), float(seg[last]))
    return best


def final_value(values: Sequence[float]) -> float:
    """The last finite value of a series (e.g. evaluation returns).

    Args:
        values: the series.

    Returns:
        float: the value, NaN if there is none.
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    v = v[np.isfinite(v)]
    return float(v[-1]) if v.size else math.nan


def bootstrap_ci(values: Sequence[float], confidence: float = 0.95, resamples: int = 10000,
                 seed: int = 0) -> Tuple[float, float, float]:
    """Mean of ``values`` (e.g. one metric over seeds) and its bootstrap interval.

    The percentile bootstrap: ``resamples`` means of samples drawn with
    replacement; the interval holds the middle ``confidence`` of them.  With
    3 seeds it is wide and optimistic; it says how far the seeds disagree.
    NaNs are dropped.

    Args:
        values: the per-seed values.
        confidence: in ``(0, 1)``.
        resamples: number of bootstrap means (>= 1).
        seed: the resampling's seed (the interval is reproducible).

    Returns:
        ``(mean, low, high)``; all NaN when no value is finite.

    Raises:
        TypeError: if ``confidence`` is not a real number.
        ValueError: for a bad ``confidence`` or ``resamples``.
    """
    confidence = check_real("confidence", confidence, above=0, below=1)
    resamples = check_int("resamples", resamples, minimum=1)
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    v = v[np.isfinite(v)]
    if not v.size:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(int(resamples), v.size))].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, tail), np.percentile(means, 100 - tail)
    return float(v.mean()), float(low), float(high)
