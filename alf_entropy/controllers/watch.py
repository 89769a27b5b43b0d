"""The windup watch, settled annealing, and what a controller reports: its summaries and its
warnings (each once).

An update below the target with ``alpha`` at its ceiling counts ``stalled_for`` up, any other
update counts it down (not below 0): noise cannot hide an unreachable target.
"""

import math
import warnings
from collections import namedtuple
from typing import Any, Optional

import torch
from absl import logging

__all__ = [
    "WINDUP_WINDOW",
    "WATCH_EMA",
    "Anneal",
    "anneal_of",
    "watch_rule",
    "WarnOnce",
    "report",
    "scalars",
]

WINDUP_WINDOW = 500
"""Net updates below the target with ``alpha`` at its ceiling: then the target is unreachable."""
WATCH_EMA = 0.99
"""Smoothing of the entropy that the watch and settled annealing compare."""

Anneal = namedtuple("Anneal", "tolerance window drop final")


def anneal_of(annealing: Any) -> Anneal:
    """The constants of a ``SettledAnnealing`` (None: never)."""
    if annealing is None:
        return Anneal(0.0, math.inf, 0.0, -math.inf)
    return Anneal(annealing.tolerance, annealing.window, 1 - annealing.factor, annealing.final)


def watch_rule(x: Any, s: Any, entropy: Any, w: Anneal, max_log_alpha: float) -> Any:
    """The watch's fields of ``s``; after ``w.window`` updates near the target (or stalled)
    the target drops."""
    ema = x.where(s.count == 0, entropy, WATCH_EMA * s.ema + (1 - WATCH_EMA) * entropy)
    stalled = (ema < s.target) & (s.log_alpha >= max_log_alpha - 1e-6)
    near = x.abs(ema - s.target) <= w.tolerance * x.abs(s.target)
    settled = x.where(near | stalled, s.settled + 1, 0)
    fire = settled >= w.window
    lowered = x.maximum(s.target - w.drop * x.abs(s.target), w.final)
    stalled_for = x.where(stalled, s.stalled_for + 1, x.maximum(s.stalled_for - 1, 0))
    return s._replace(
        ema=ema,
        stalled_for=stalled_for,
        count=s.count + 1,
        settled=x.where(fire, 0, settled),
        target=x.where(fire, lowered, s.target),
    )


class WarnOnce:
    """A controller's warnings: each kind once, to ``warnings`` and the log."""

    def __init__(self, name):
        self.name = name
        self.said = set()

    def __call__(self, key, message):
        if key in self.said:
            return
        self.said.add(key)
        message = f"{self.name}: {message}"
        logging.warning(message)
        warnings.warn(message, stacklevel=5)


def _show(value):
    values = [f"{float(v):.4g}" for v in value.reshape(-1)]
    return values[0] if len(values) == 1 else "[" + ", ".join(values) + "]"


def report(c: Any, count: Optional[torch.Tensor] = None) -> None:
    """A controller's summaries after an update of ``count`` entropies (an empty ``step``
    writes none); its warnings where reading costs nothing (the host path, a summary step)."""
    # a summary step reads the values anyway
    record = c.SUMMARY.should_record_summaries() and (count is None or bool((count > 0).any()))
    if record:
        values = {"unreachable_target": c.unreachable_target}
        if c.debug_summaries:
            values.update(
                alpha=c.alpha, nonfinite_entropy=c.num_nonfinite_entropy, **c.debug_values()
            )
        if c.scheduled_target:
            values["target_entropy"] = c.driver.target
        scalars(c, **values)
    if not (record or c.driver.on_host()):
        return
    if "unreachable" not in c.warn.said and bool(c.unreachable_target.any()):
        s = c.driver.state
        c.warn(
            "unreachable",
            f"the entropy ({_show(s.ema)}) has stayed below the target "
            f"({_show(s.target)}) for {_show(s.stalled_for)} updates with alpha at its ceiling "
            f"({_show(c.alpha)}); the target looks unreachable for this policy. Lower "
            "target_entropy (e.g. greedy_probability_target or SettledAnnealing), or raise "
            "max_alpha if a larger coefficient is sensible.",
        )
    c.check_progress()


def scalars(c: Any, **values: torch.Tensor) -> None:
    """Summaries under a controller's name (a batch's: one value a member)."""
    with c.SUMMARY.scope(c.name):
        for tag, value in values.items():
            c.SUMMARY.scalar(tag, value)
