"""How well an entropy controller held the entropy at its target: pure metrics.

Each function takes plain 1-d series of one run (at the controller's updates
or at logged iterations) and returns numbers; ``alf-entropy-report`` and the
benchmarks use them, so each metric is defined once, here.  Tracking starts
(:func:`warmup_end`) at the first sample at or below ``(1 + tol) * target``
(before it the policy is more random than asked, which the controller
allows).  Bands are relative to ``|target|``, so negative targets work.
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


def _series(values, finite=False):
    """``values`` as a 1-d float64 array (its finite values only with ``finite``)."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    return v[np.isfinite(v)] if finite else v


def _pair(entropy: Sequence[float], target: Sequence[float], tol: float = 0.05, start: int = 0):
    """Both series from ``start`` as float64 arrays of one length (a scalar target
    broadcasts), with ``tol`` and ``start`` checked."""
    check_real("tol", tol, minimum=0, below=1)
    check_int("start", start, minimum=0)
    e = _series(entropy)
    t = np.asarray(target, dtype=np.float64)
    if t.ndim and t.size != e.size:
        raise ValueError(f"entropy and target must have the same length, got {e.size} and {t.size}")
    return e[start:], np.broadcast_to(t.reshape(-1) if t.ndim else t, e.shape)[start:]


def warmup_end(entropy: Sequence[float], target: Sequence[float], tol: float = 0.05) -> int:
    """Index of the first sample with ``entropy <= target + tol * |target|`` (``tol`` in
    ``[0, 1)``; ``target`` a series or one number), ``len(entropy)`` if none."""
    e, t = _pair(entropy, target, tol)
    reached = np.nonzero(e <= t + tol * np.abs(t))[0]
    return int(reached[0]) if reached.size else int(e.size)


def tracking_rmse(entropy: Sequence[float], target: Sequence[float], start: int = 0) -> float:
    """Root-mean-square of ``entropy - target`` over ``[start:]`` (NaN if empty)."""
    e, t = _pair(entropy, target, start=start)
    d = e - t
    return float(np.sqrt(np.mean(d * d))) if d.size else math.nan


def fraction_below(
    entropy: Sequence[float], target: Sequence[float], tol: float = 0.05, start: int = 0
) -> float:
    """Fraction of samples in ``[start:]`` below ``target - tol * |target|`` (NaN if
    empty)."""
    e, t = _pair(entropy, target, tol, start)
    below = e < t - tol * np.abs(t)
    return float(below.mean()) if below.size else math.nan


def minimum_variance_floor(
    entropy: Sequence[float],
    target: Sequence[float],
    start: int = 0,
    delay: int = 2,
    order: int = 4,
) -> float:
    """The RMS error no controller acting ``delay`` samples late could remove.

    Harris's minimum-variance bound (Harris, "Assessment of closed-loop
    performance", 1989) from the run itself: an AR(``order``) fit of
    ``entropy - target`` over ``[start:]`` (mean removed) gives the innovations'
    variance ``s2`` and impulse response ``psi``; what was unpredictable
    ``delay`` samples earlier, ``s2 * sum(psi[:delay] ** 2)``, no controller
    whose action shows ``delay`` samples later can cancel.  Returns its square
    root, NaN with fewer than ``2 * order + delay`` samples.
    """
    e, t = _pair(entropy, target, start=start)
    delay = check_int("delay", delay, minimum=1)
    order = check_int("order", order, minimum=1)
    y = e - t
    if y.size < 2 * order + delay:
        return math.nan
    y = y - y.mean()
    lags = np.column_stack([y[order - k : y.size - k] for k in range(1, order + 1)])
    coef = np.linalg.lstsq(lags, y[order:], rcond=None)[0]
    residual = y[order:] - lags @ coef
    s2 = float(residual @ residual) / (residual.size - order)
    psi = [1.0]
    for k in range(1, delay):
        psi.append(sum(coef[i] * psi[k - 1 - i] for i in range(min(order, k))))
    return math.sqrt(s2 * sum(v * v for v in psi))


def target_changes(target: Sequence[float], min_change: float = 0.05) -> np.ndarray:
    """Indices ``i > 0`` (int64) where the target jumps, ``|t[i] - t[i-1]| > min_change *
    |t[i-1]|`` (a step is a jump, a slow ramp is not)."""
    min_change = check_real("min_change", min_change, positive=True)
    t = _series(target)
    jump = np.abs(np.diff(t)) > min_change * np.abs(t[:-1])
    return np.nonzero(jump)[0].astype(np.int64) + 1


def settling_times(
    entropy: Sequence[float],
    target: Sequence[float],
    tol: float = 0.05,
    min_change: float = 0.05,
    x: Optional[Sequence[float]] = None,
) -> list:
    """For each target jump (:func:`target_changes`), the time until the entropy stays
    within ``tol * |target|`` until the next jump or the end: a difference of ``x``
    (e.g. env steps; default: sample numbers), NaN if it never settled."""
    e, t = _pair(entropy, target, tol)
    pos = np.arange(e.size, dtype=np.float64) if x is None else np.asarray(x, dtype=np.float64)
    if pos.shape != e.shape:
        raise ValueError(f"x must have the length of entropy ({e.size}), got {pos.size}")
    inside = np.abs(e - t) <= tol * np.abs(t)
    changes = target_changes(t, min_change)
    result = []
    for begin, end in zip(changes, np.r_[changes[1:], e.size]):
        seg = inside[begin:end]
        if not seg[-1]:
            result.append(math.nan)
            continue
        outside = np.nonzero(~seg)[0]
        settled = begin + (int(outside[-1]) + 1 if outside.size else 0)
        result.append(float(pos[settled] - pos[begin]))
    return result


class AlphaChange(NamedTuple):
    """The largest change of alpha within one iteration (``group``): ``factor`` =
    max / min (>= 1), ``before`` and ``after`` the two extremes in time order."""

    factor: float
    group: float
    before: float
    after: float


def largest_alpha_change(
    alpha: Sequence[float], group: Optional[Sequence[float]] = None
) -> AlphaChange:
    """The iteration in which alpha (> 0, after each update) changed by the largest factor
    (NaNs if empty).  ``group[i]`` is update ``i``'s iteration (default: one each); an
    iteration starts from the previous one's last value when that is ``group - 1``."""
    a = _series(alpha)
    g = np.arange(a.size, dtype=np.float64) if group is None else np.asarray(group, np.float64)
    if g.shape != a.shape:
        raise ValueError(f"group must have the length of alpha ({a.size}), got {g.size}")
    if a.size == 0:
        return AlphaChange(*[math.nan] * 4)
    if np.any(~(a > 0)):
        raise ValueError("alpha must be > 0 everywhere")
    best = AlphaChange(1.0, float(g[0]), float(a[0]), float(a[0]))
    bounds = np.nonzero(np.diff(g) != 0)[0] + 1
    for s, e in zip(np.r_[0, bounds], np.r_[bounds, a.size]):
        lo = s - 1 if s > 0 and g[s - 1] == g[s] - 1 else s
        seg = a[lo:e]
        i_min, i_max = int(np.argmin(seg)), int(np.argmax(seg))
        factor = float(seg[i_max] / seg[i_min])
        if factor > best.factor:
            first, last = sorted((i_min, i_max))
            best = AlphaChange(factor, float(g[s]), float(seg[first]), float(seg[last]))
    return best


def final_value(values: Sequence[float]) -> float:
    """The last finite value of a series (e.g. evaluation returns), NaN if none."""
    v = _series(values, finite=True)
    return float(v[-1]) if v.size else math.nan


def bootstrap_ci(
    values: Sequence[float], confidence: float = 0.95, resamples: int = 10000, seed: int = 0
) -> Tuple[float, float, float]:
    """``(mean, low, high)`` of ``values`` (NaNs dropped; all NaN if none is finite) with
    the middle ``confidence`` of ``resamples`` bootstrap means (seeded: reproducible); an
    interval needs 2 values (``low``, ``high`` NaN from one).  With 3 seeds it is wide and
    optimistic: it says how far the seeds disagree."""
    confidence = check_real("confidence", confidence, above=0, below=1)
    resamples = check_int("resamples", resamples, minimum=1)
    v = _series(values, finite=True)
    if v.size < 2:  # resampling one value gives it back: no interval
        return float(v.mean()) if v.size else math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(int(resamples), v.size))].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, tail), np.percentile(means, 100 - tail)
    return float(v.mean()), float(low), float(high)
