"""The state every controller holds and the one step every rule runs in.

``device_step(x, rule, c, state, inputs) -> state`` is pure: the rule, the bounds of
``log_alpha``, the span limit and the watch, kept only for a finite entropy from a non-empty
batch.  ``Driver`` holds the state as registered buffers and runs the step as NumPy over views
of CPU buffers (``x = ScalarOps``/``ArrayOps``) or as tensor ops (``TensorOps``), with the same
bits.
"""
from collections import namedtuple
from typing import Any, Callable

import torch
import torch.nn as nn

from alf_entropy.controllers.ops import WEAK_SCALARS, ArrayOps, ScalarOps, TensorOps, gate
from alf_entropy.controllers.watch import watch_rule

__all__ = ["Driver", "Inputs", "Consts", "device_step", "state_type", "SHARED_FIELDS",
           "UPDATE_MODES", "NO_SPAN"]

UPDATE_MODES = ("auto", "tensor", "host")
"""``"host"``: NumPy over CPU state; ``"tensor"``: no host read; ``"auto"``: host on the CPU
with NumPy >= 2 (``WEAK_SCALARS``: the same bits as tensor ops), else tensor ops."""
NO_SPAN = 1e30
"""The span of ``log_alpha`` between two ``step()`` calls when there is no limit (finite)."""

# target: the target in force; ema .. settled: the watch; nonfinite: updates with a NaN/inf
# entropy; span_lo/span_hi: log_alpha's range since the last step(); acc_sum/acc_count: the
# entropies accumulated for the next step().
SHARED_FIELDS = ("log_alpha", "target", "ema", "stalled_for", "count", "settled", "nonfinite",
                 "span_lo", "span_hi", "acc_sum", "acc_count")

Inputs = namedtuple("Inputs", "entropy count restart")
"""One update's inputs: the mean entropy, how many elements it is the mean of (0: none), and
whether a new span of ``log_alpha`` starts after it (a ``step()``)."""
Consts = namedtuple("Consts", "rule lo hi span anneal")
"""The step's constants: the rule's, ``log_alpha``'s bounds and span, the target's annealing."""


def state_type(name: str, fields: str = "") -> type:
    """A controller's state: the shared fields, then the rule's own ``fields``."""
    return namedtuple(name, SHARED_FIELDS + tuple(fields.split()))


def device_step(x: Any, rule: Callable, c: Consts, s: Any, inputs: Inputs) -> Any:
    """One update of the state ``s``."""
    finite = x.isfinite(inputs.entropy)
    has_data = inputs.count > 0
    entropy = x.where(finite, inputs.entropy, 0.0)
    new = rule(x, s, entropy, c.rule)
    log_alpha = x.minimum(x.maximum(new.log_alpha, c.lo), c.hi)
    log_alpha = x.minimum(x.maximum(log_alpha, s.span_hi - c.span), s.span_lo + c.span)
    new = watch_rule(x, new._replace(log_alpha=log_alpha), entropy, c.anneal, c.hi)
    new = new._replace(span_lo=x.minimum(s.span_lo, log_alpha),
                       span_hi=x.maximum(s.span_hi, log_alpha))
    new = gate(x, finite & has_data, new, s)
    new = new._replace(nonfinite=s.nonfinite + x.where(has_data & ~finite, 1, 0),
                       span_lo=x.where(inputs.restart, new.log_alpha, new.span_lo),
                       span_hi=x.where(inputs.restart, new.log_alpha, new.span_hi))
    return new


class Driver(nn.Module):
    """A controller's state, one buffer per field (``state`` reads them as one named tuple),
    and its update on the host or as tensor ops (``mode``: one of ``UPDATE_MODES``)."""

    def __init__(self, state: Any, mode: str):
        super().__init__()
        self._type = type(state)
        for field, value in zip(state._fields, state):
            self.register_buffer(field, value)
        self.mode = mode

    @property
    def state(self) -> Any:
        """The buffers as the state's named tuple."""
        return self._type(*self.buffers(recurse=False))

    def write(self, state: Any) -> None:
        """Copy ``state`` into the buffers."""
        with torch.no_grad():
            for buffer, value in zip(self.buffers(recurse=False), state):
                buffer.copy_(value)

    def on_host(self) -> bool:
        """Whether updates run as NumPy over the CPU buffers."""
        cpu = self.log_alpha.device.type == "cpu"
        if self.mode == "host" and not cpu:
            raise ValueError(f"update_mode='host' needs the controller on the CPU, it is on "
                             f"{self.log_alpha.device}; use 'tensor' or 'auto'")
        return cpu and (self.mode == "host" or (self.mode == "auto" and WEAK_SCALARS))

    def update(self, rule: Callable, consts: Consts, inputs: Inputs) -> torch.Tensor:
        """One ``device_step`` on the buffers; the new alpha."""
        if not self.on_host():
            self.write(device_step(TensorOps, rule, consts, self.state, inputs))
            return self.log_alpha.exp()
        views = [buffer.numpy() for buffer in self.buffers(recurse=False)]  # any write is seen
        x = ArrayOps if self.log_alpha.dim() else ScalarOps
        host = Inputs(*(value.cpu().numpy()[()] for value in inputs))
        new = device_step(x, rule, consts, self._type(*(v[()] for v in views)), host)
        for view, value in zip(views, new):
            view[...] = value
        return self.log_alpha.exp()
