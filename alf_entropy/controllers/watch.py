"""The driver's own state: the windup watch, settled annealing and the NaN/inf count.  A stall
(the smoothed entropy below the target, ``alpha`` at its ceiling) counts ``stalled_for`` up,
other updates count it down (not below 0): noise cannot hide an unreachable target."""
import math
from collections import namedtuple
from typing import Any, Tuple

import torch

__all__ = ["WINDUP_WINDOW", "WATCH_EMA", "WatchState", "Anneal", "anneal_of", "watch_rule",
           "unreachable_message", "stuck_message"]

WINDUP_WINDOW = 500
"""Net updates below the target with ``alpha`` at its ceiling: then the target is unreachable."""
WATCH_EMA = 0.99
"""Smoothing of the entropy that the watch and settled annealing compare."""

# ema: the smoothed entropy; settled: updates in a row near the target (or stalled)
WatchState = namedtuple("WatchState", "ema stalled_for count settled nonfinite")
Anneal = namedtuple("Anneal", "tolerance window drop final")


def anneal_of(annealing: Any) -> Anneal:
    """The constants of a ``SettledAnnealing`` (None: never)."""
    if annealing is None:
        return Anneal(0.0, math.inf, 0.0, -math.inf)
    return Anneal(annealing.tolerance, annealing.window, 1 - annealing.factor, annealing.final)


def watch_rule(x: Any, s: WatchState, entropy: Any, target: Any, log_alpha: Any, w: Anneal,
               max_log_alpha: Any) -> Tuple[WatchState, Any]:
    """``(watch, target)``: after ``w.window`` updates near the target (or stalled) it drops."""
    ema = x.where(s.count == 0, entropy, WATCH_EMA * s.ema + (1 - WATCH_EMA) * entropy)
    stalled = (ema < target) & (log_alpha >= max_log_alpha - 1e-6)
    near = x.abs(ema - target) <= w.tolerance * x.abs(target)
    settled = x.where(near | stalled, s.settled + 1, 0)
    fire = settled >= w.window
    lowered = x.maximum(target - w.drop * x.abs(target), w.final)
    stalled_for = x.where(stalled, s.stalled_for + 1, x.maximum(s.stalled_for - 1, 0))
    return (WatchState(ema, stalled_for, s.count + 1,
                       x.where(fire, 0, settled), s.nonfinite), x.where(fire, lowered, target))


def _show(value: torch.Tensor) -> str:
    values = [f"{float(v):.4g}" for v in value.reshape(-1)]
    return values[0] if len(values) == 1 else "[" + ", ".join(values) + "]"


def unreachable_message(c: Any) -> str:
    """What a controller ``c`` found unreachable says."""
    return (f"the entropy ({_show(c._watch_ema)}) has stayed below the target "
            f"({_show(c._target_now)}) for {_show(c._watch_stalled_for)} updates with alpha at "
            f"its ceiling ({_show(c.alpha)}); the target looks unreachable for this policy. "
            "Lower target_entropy (e.g. greedy_probability_target or SettledAnnealing), or raise "
            "max_alpha if a larger coefficient is sensible.")


def stuck_message(c: Any, stage: int) -> str:
    """What a staged controller ``c`` still before its adjust stage says."""
    n, avg, alpha = c._target.updates, float(c.avg_entropy.min()), float(c.alpha.min())
    if stage < -2:
        return (f"is still estimating max_entropy after {n} updates: no finite entropy from a "
                f"non-empty batch ({int(c._watch_nonfinite.max())} NaN/inf). To make it "
                "act: check the entropies fed to it, or give max_entropy.")
    given = "given" if c._max_entropy_given else "estimated from the first entropies"
    bound = f"max_entropy {float(c._max_entropy.min()):.3f} ({given})"
    target = f"the target ({float(c._target_now.min()):.3f})"
    why = (f"until the average entropy ({avg:.3f}) falls below {bound}, log_alpha only creeps by "
           f"very_slow_update_rate and {target} is not acted on. To make it act: give "
           "max_entropy (e.g. a little above the target)," if stage == -2 else
           f"alpha is frozen until the average entropy ({avg:.3f}) falls below {target}; "
           f"{bound}. To hold the entropy at the target, not only above it,")
    return (f"is still in its {'init' if stage == -2 else 'free'} stage after {n} updates: {why} "
            f"set skip_free_stage=True, or start from a smaller initial_alpha (alpha {alpha:.3g}).")
