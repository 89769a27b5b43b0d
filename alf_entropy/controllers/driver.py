"""The state every controller holds and the one step every rule runs in.

``device_step(x, rule, c, state, inputs) -> state`` is pure: the rule, the bounds of
``log_alpha``, the span limit and the watch, kept only for a finite entropy from a non-empty
batch.  ``Driver`` holds the state as registered buffers and runs the step as NumPy over views
of CPU buffers (``x = ScalarOps``/``ArrayOps``) or as tensor ops (``TensorOps``), with the same
bits.
"""

import functools
import math
from collections import namedtuple
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn as nn

from alf_entropy import accel
from alf_entropy.controllers.ops import WEAK_SCALARS, ArrayOps, ScalarOps, TensorOps, gate
from alf_entropy.controllers.watch import watch_rule
from alf_entropy.utils import distributed

__all__ = [
    "Driver",
    "Inputs",
    "Consts",
    "device_step",
    "state_type",
    "SHARED_FIELDS",
    "UPDATE_MODES",
    "MAX_ALPHA",
    "LOG_ZERO",
]

UPDATE_MODES = ("auto", "tensor", "host", "compiled")
"""``"host"``: NumPy over CPU state; ``"tensor"``: no host read; ``"compiled"``: the tensor
step as one ``torch.compile`` graph (on CUDA also a CUDA graph); ``"auto"``: host on the CPU
with NumPy >= 2 (``WEAK_SCALARS``: the same bits as tensor ops), else tensor."""
MAX_ALPHA = 1e6
"""The ceiling of ``alpha`` when ``max_alpha`` is None: alpha stays finite on any plant."""
LOG_ZERO = -110.0
"""``log_alpha`` of an ``alpha`` of 0 (its ``exp`` is 0 in float32), for rules that reach 0."""

# target: the target in force; ema .. settled: the watch; nonfinite: updates with a NaN/inf
# entropy; span_lo/span_hi: log_alpha's range since the last step(); acc_sum/acc_count: the
# entropies accumulated for the next step().
SHARED_FIELDS = (
    "log_alpha",
    "target",
    "ema",
    "stalled_for",
    "count",
    "settled",
    "nonfinite",
    "span_lo",
    "span_hi",
    "acc_sum",
    "acc_count",
)

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
    new = new._replace(
        span_lo=x.minimum(s.span_lo, log_alpha), span_hi=x.maximum(s.span_hi, log_alpha)
    )
    new = gate(x, finite & has_data, new, s)
    return new._replace(
        nonfinite=s.nonfinite + x.where(has_data & ~finite, 1, 0),
        span_lo=x.where(inputs.restart, new.log_alpha, new.span_lo),
        span_hi=x.where(inputs.restart, new.log_alpha, new.span_hi),
    )


class Driver(nn.Module):
    """A controller's state, one buffer per field (``state`` reads them as one named tuple),
    and its update on the host or as tensor ops (``mode``: one of ``UPDATE_MODES``).

    Args:
        state_type: the state (``state_type``); the shared fields start from ``log_alpha`` and
            ``target``, the rule's from ``own``: tensors, or numbers (or one a member) that
            become ``batch_shape``'s in their own dtype.
    """

    def __init__(
        self,
        state_type: type,
        batch_shape: Tuple[int, ...],
        mode: str,
        log_alpha: float,
        target: Any,
        **own: Any,
    ):
        super().__init__()
        acc = torch.zeros(batch_shape, dtype=torch.float64)
        fields = dict(
            log_alpha=log_alpha,
            target=target,
            ema=0.0,
            stalled_for=0,
            count=0,
            settled=0,
            nonfinite=0,
            span_lo=log_alpha,
            span_hi=log_alpha,
            acc_sum=acc,
            acc_count=acc,
            **own,
        )
        self._type = state_type
        for field, value in fields.items():
            if not torch.is_tensor(value):
                value = torch.as_tensor(value).reshape(-1).expand(math.prod(batch_shape))
                value = value.reshape(batch_shape)
            self.register_buffer(field, value.clone())
        self.mode = mode
        self._cache = ((), [])
        self.register_state_dict_pre_hook(_refuse_pending_accumulation)

    def accumulate(self, mean: torch.Tensor, count: torch.Tensor) -> None:
        """Add ``count`` entropies of mean ``mean`` to the next ``pooled``."""
        with torch.no_grad():
            self.acc_sum.add_(mean * count)
            self.acc_count.add_(count)

    def pooled(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The accumulated entropies' mean and count over every rank; the sums start again."""
        total, count = distributed.all_reduce_sum(
            torch.stack([self.acc_sum, self.acc_count]), "all_reduce of the entropy"
        ).unbind()
        with torch.no_grad():
            self.acc_sum.zero_()
            self.acc_count.zero_()
        return (total / count.clamp(min=1)).float(), count

    @property
    def state(self) -> Any:
        """The buffers as the state's named tuple."""
        return self._type._make(accel.buffers(self))

    def on_host(self) -> bool:
        """Whether updates run as NumPy over the CPU buffers."""
        cpu = self.log_alpha.device.type == "cpu"
        if self.mode == "host" and not cpu:
            raise ValueError(
                f"update_mode='host' needs the controller on the CPU, it is on "
                f"{self.log_alpha.device}; use 'tensor' or 'auto'"
            )
        return cpu and (self.mode == "host" or (self.mode == "auto" and WEAK_SCALARS))

    def step(self, rule: Callable, consts: Consts, inputs: Inputs) -> None:
        """One ``device_step`` as tensor ops, copied into the buffers."""
        state = self.state
        with torch.no_grad():
            for buffer, value in zip(state, device_step(TensorOps, rule, consts, state, inputs)):
                buffer.copy_(value)

    def _views(self):
        """NumPy views of the CPU buffers, made again when any buffer's memory changed (an
        assigned or moved buffer; the cached views keep the old memory, so no address is
        reused while they live)."""
        buffers = accel.buffers(self)
        key = tuple(buffer.data_ptr() for buffer in buffers)
        if self._cache[0] != key:
            self._cache = (key, [buffer.numpy() for buffer in buffers])
        return self._cache[1]

    def update(
        self,
        rule: Callable,
        consts: Consts,
        entropy: torch.Tensor,
        count: Optional[torch.Tensor] = None,
        restart: bool = False,
    ) -> None:
        """One ``device_step`` from the mean ``entropy`` of ``count`` elements (None: one);
        ``restart``: a new span of ``log_alpha`` starts."""
        entropy = entropy.detach().to(self.log_alpha.device, torch.float32)
        count = entropy.new_ones(()) if count is None else count
        inputs = Inputs(entropy, count, torch.full_like(count, restart, dtype=torch.bool))
        if self.mode == "compiled":
            _compiled(self.log_alpha.device.type)(self, rule, consts, inputs)
        elif not self.on_host():
            self.step(rule, consts, inputs)
        else:
            views = self._views()
            x = ArrayOps if self.log_alpha.dim() else ScalarOps
            host = Inputs(*(value.cpu().numpy()[()] for value in inputs))
            new = device_step(x, rule, consts, self._type(*(v[()] for v in views)), host)
            for view, value in zip(views, new):
                view[...] = value


@functools.lru_cache(maxsize=None)
def _compiled(device_type):
    """``Driver.step`` compiled whole (on CUDA replayed as a CUDA graph)."""
    mode = "reduce-overhead" if device_type == "cuda" else None
    return torch.compile(Driver.step, fullgraph=True, dynamic=False, mode=mode)


def _refuse_pending_accumulation(driver, prefix, keep_vars):
    if distributed.is_distributed() and bool((driver.acc_count > 0).any()):
        raise RuntimeError(
            "state_dict() between accumulate() and step() in a multi-rank run "
            "would save one rank's partial entropy sum; call step() first (save "
            "between optimizer steps)"
        )
