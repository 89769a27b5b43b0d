"""How far a controller's ``log_alpha`` may move when two computations that are not
bit-identical by design (K agents' stacked networks against one agent's) feed it entropies
that differ in the last bits: each update's entropy gap times the controller's gain there.

:func:`record_updates` makes every controller keep its state before its first update and its
update calls; :func:`assert_log_alpha_close` replays them (issue 63: a fixed ``rtol`` held on
one CPU's kernels and not on another's).
"""

import copy
import math
from typing import Any, List, Optional, Tuple

import pytest
import torch

from alf_entropy.controllers import EntropyController
from alf_entropy.utils import nest

UPDATES = ("entropy_loss", "calc_loss", "adjust_alpha", "accumulate", "step")
"""The public calls that change a controller's state, recorded in order."""
WITH_ENTROPY = ("entropy_loss", "calc_loss", "adjust_alpha", "accumulate")
EPS = torch.finfo(torch.float32).eps
STEP = 1e-3
"""The entropy difference by which a gain is measured (the rules are piecewise smooth)."""


class Recording:
    """A controller's state before its first update (``start``) and its update calls."""

    def __init__(self, controller: EntropyController):
        self.start = copy.deepcopy(controller)
        self.start.__dict__["recording"] = None  # a replay records nothing
        self.calls: List[Tuple[str, tuple, dict]] = []


def _detached(x: Any) -> Any:
    return nest.map_structure(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, x)


def _entropy(name: str, args: tuple) -> torch.Tensor:
    """The entropies of an update call (``calc_loss``: its ``info``'s, negated there)."""
    return -args[0].loss.extra.neg_entropy if name == "calc_loss" else args[0]


def _shifted(name: str, args: tuple, x: float) -> tuple:
    """``args`` with the call's entropies ``+ x``."""
    if name != "calc_loss":
        return (args[0] + x, *args[1:])
    info = args[0]
    extra = info.loss.extra._replace(neg_entropy=info.loss.extra.neg_entropy - x)
    return (info._replace(loss=info.loss._replace(extra=extra)), *args[1:])


def record_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on every controller records its updates in ``controller.recording``."""
    for name in UPDATES:
        method = getattr(EntropyController, name)

        def recorded(self, *args, _name=name, _method=method, **kwargs):
            if "recording" not in self.__dict__:
                self.__dict__["recording"] = Recording(self)
            if self.__dict__["recording"] is not None:
                self.recording.calls.append(
                    (
                        _name,
                        tuple(map(_detached, args)),
                        {k: _detached(v) for k, v in kwargs.items()},
                    )
                )
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(EntropyController, name, recorded)


def _entropy_updates(recording: Recording) -> List[int]:
    return [
        t
        for t, (name, _, kwargs) in enumerate(recording.calls)
        if name in WITH_ENTROPY and kwargs.get("update", True)
    ]


def replay(recording: Recording, shift: Optional[Tuple[int, float]] = None) -> torch.Tensor:
    """``log_alpha`` (float64) after the recorded calls on a copy of the start; ``shift``
    ``(t, x)`` adds ``x`` to call ``t``'s entropies."""
    controller = copy.deepcopy(recording.start)
    for t, (name, args, kwargs) in enumerate(recording.calls):
        if shift is not None and t == shift[0]:
            args = _shifted(name, args, shift[1])
        getattr(controller, name)(*args, **kwargs)
    return controller.log_alpha.detach().double()


def assert_log_alpha_close(batch: EntropyController, k: int, single: EntropyController) -> None:
    """Member ``k`` of ``batch`` against ``single``, which took the same updates from entropies
    computed another way: each replays to its own ``log_alpha`` bit for bit, and they differ by
    at most the sum over updates of the controller's gain (``d log_alpha / d H`` by a
    difference of ``STEP``, x2 for a kink within it) times the entropy gap (the largest
    difference of the update's entropies plus each side's float32 rounding of their mean:
    pairwise sums, ``log2(n) eps |H|``), plus ``log_alpha``'s own ulps."""
    mine, theirs = batch.recording, single.recording
    assert torch.equal(replay(mine), batch.log_alpha.detach().double())
    base = replay(theirs)
    assert torch.equal(base, single.log_alpha.detach().double())
    updates = _entropy_updates(theirs)
    assert [c[0] for c in mine.calls] == [c[0] for c in theirs.calls]
    tol = 4 * EPS * max(float(base.abs()), 1.0)
    for t in updates:
        name = theirs.calls[t][0]
        h = _entropy(name, theirs.calls[t][1]).double()
        ours = _entropy(name, mine.calls[t][1])[k].double()
        rounding = 2 * math.ceil(math.log2(max(h.numel(), 2))) * EPS * float(h.abs().max())
        gap = float((ours - h).abs().max()) + rounding
        gain = float((replay(theirs, (t, STEP)) - base).abs()) / STEP
        tol += 2 * gain * gap
    difference = float((batch.log_alpha.detach().double()[k] - base).abs())
    assert difference <= tol, (difference, tol)
