"""The one driver of every rule: the shared state, and one update (rule, bounds, watch; only
the NaN/inf count without a finite entropy from a non-empty batch) as NumPy over views of CPU
buffers or as tensor ops, with the same bits."""
import math
import warnings
from collections import namedtuple
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch
from absl import logging

from alf_entropy.controllers.alf import AlfSubAlgorithm
from alf_entropy.controllers.checkpoints import register_hooks
from alf_entropy.controllers.ops import ArrayOps, ScalarOps, TensorOps, f32, gate
from alf_entropy.controllers.target import Target
from alf_entropy.controllers.watch import (
    WINDUP_WINDOW,
    WatchState,
    anneal_of,
    unreachable_message,
    watch_rule,
)
from alf_entropy.tensor_specs import TensorSpec
from alf_entropy.utils import nest, summary
from alf_entropy.utils.checks import check_choice, check_int, check_real

__all__ = ["Driver", "UPDATE_MODES", "NO_SPAN", "WatchState"]

UPDATE_MODES = ("auto", "tensor", "host")
"""``"host"``: NumPy over CPU state; ``"tensor"``: no host read; ``"auto"``: host on the CPU."""
NO_SPAN = 1e30
"""``limit_log_alpha_span``'s span when there is none (finite: no ``inf - inf``)."""

Bounds = namedtuple("Bounds", "lo hi span")
Update = namedtuple("Update", "rule watch target span_lo span_hi")  # what an update reads, writes


class Driver(AlfSubAlgorithm):
    """Holds the shared state and runs a rule: a controller defines ``State`` (and a buffer
    ``"_" + field`` for each field), ``_constants`` and ``_rule`` (here: ``alpha`` stays)."""

    State: Any = namedtuple("State", "log_alpha")
    CLAMPED = True  # alpha stays in [min_alpha, max_alpha] (not a fixed coefficient)
    ZERO_ALPHA = False  # alpha may be 0 (a log-space rule cannot start there)

    def __init__(self, action_spec: Any, target_entropy: Any = None, initial_alpha: float = 0.1,
                 min_alpha: float = 1e-4, max_alpha: Optional[float] = None,
                 update_mode: str = "auto", batch_shape: Sequence[int] = (),
                 debug_summaries: bool = False, name: str = "EntropyController"):
        super().__init__(debug_summaries=debug_summaries, name=name)
        specs = nest.flatten(action_spec)
        if not specs or not all(isinstance(s, TensorSpec) for s in specs):
            raise TypeError(f"action_spec must be a non-empty nest of TensorSpec: {action_spec!r}")
        if not isinstance(batch_shape, (tuple, list)) or len(batch_shape) > 1:
            raise ValueError(f"batch_shape must be () or (K,), got {batch_shape!r}")
        check_choice("update_mode", update_mode, UPDATE_MODES)
        self._action_spec, self._update_mode = action_spec, update_mode
        self._batch = tuple(check_int("batch_shape[0]", k, minimum=1) for k in batch_shape)
        self._target = Target(target_entropy, action_spec, self._batch, name)
        alpha = check_real("initial_alpha", initial_alpha, positive=not self.ZERO_ALPHA,
                           minimum=0.0)
        self._settings: Dict[str, Any] = dict(min_alpha=min_alpha, max_alpha=max_alpha)
        self._log_bounds(self._settings)
        if self.CLAMPED and not min_alpha <= alpha <= (max_alpha or math.inf):
            raise ValueError(f"initial_alpha ({initial_alpha}) must be in [min_alpha, max_alpha] "
                             f"= [{min_alpha}, {max_alpha}]")
        log_alpha = math.log(alpha) if alpha > 0 else -math.inf
        self.register_buffer("_log_alpha", self._full(log_alpha))
        self.register_buffer("_target_now", self._full(self._target.initial))
        self.register_buffer("_watch_ema", self._full(0.0))
        for field in ("stalled_for", "count", "settled", "nonfinite"):
            self.register_buffer("_watch_" + field, self._full(0, torch.int64))
        self.register_buffer("_span_lo", self._full(log_alpha))
        self.register_buffer("_span_hi", self._full(log_alpha))
        self.register_buffer("_acc_sum", self._full(0.0, torch.float64))
        self.register_buffer("_acc_count", self._full(0.0, torch.float64))
        self._span, self._warned, self._host = NO_SPAN, set(), None
        register_hooks(self)

    def _full(self, value: Union[float, Sequence[float]],
              dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """A tensor of ``batch_shape`` (float32 unless ``dtype``) on the state's device."""
        device = getattr(self._buffers.get("_log_alpha"), "device", None)
        if isinstance(value, (list, tuple)):
            return torch.tensor(value, dtype=dtype).reshape(self._batch).to(device)
        return torch.full(self._batch, value, dtype=dtype or torch.float32, device=device)

    def _configure(self, changes: Dict[str, Any]) -> None:
        """Check and take settings: the rule's constants and the bounds of ``log_alpha``."""
        settings = {**self._settings, **changes}
        lo, hi = self._log_bounds(settings)
        self._settings, self._c = settings, self._constants(settings)
        self._b = Bounds(*((lo, hi) if self.CLAMPED else (-math.inf, math.inf)), self._span)
        self._w = anneal_of(self._target.annealing)

    @staticmethod
    def _log_bounds(s: Dict[str, Any]) -> Tuple[float, float]:
        """Check ``min_alpha`` and ``max_alpha``: ``log_alpha``'s floor and ceiling."""
        low = check_real("min_alpha", s["min_alpha"])  # <= 0: exp(-100), as ALF
        high = check_real("max_alpha", s["max_alpha"], positive=True, allow_none=True)
        if high is not None and high < low:
            raise ValueError(f"min_alpha ({low}) must be <= max_alpha ({high})")
        return (f32(math.log(low)) if low > 0 else -math.inf,
                math.inf if high is None else f32(math.log(high)))

    def _constants(self, settings: Dict[str, Any]) -> Any:
        """Check the rule's settings; its constants (Python floats)."""
        return ()

    @staticmethod
    def _rule(x: Any, s: Any, entropy: Any, target: Any, c: Any) -> Any:
        """The control law (``x``: the ops; ``c``: the constants): the new ``State``."""
        return s

    def _read(self) -> Update:
        return self._unflat([self._buffers["_" + f] for f in self.State._fields] + [
            self._buffers["_watch_" + f] for f in WatchState._fields] + [
            self._target_now, self._span_lo, self._span_hi])

    def _unflat(self, values: list) -> Update:
        n = len(self.State._fields)
        return Update(self.State(*values[:n]), WatchState(*values[n:n + 5]), *values[n + 5:])

    def _on_host(self) -> bool:
        cpu = self._log_alpha.device.type == "cpu"
        if self._update_mode == "host" and not cpu:
            raise ValueError(f"{self._name}: update_mode='host' needs the controller on the CPU, "
                             f"it is on {self._log_alpha.device}; use 'tensor' or 'auto'")
        return cpu and self._update_mode != "tensor"

    def _host_views(self) -> Optional[list]:
        """NumPy views of the buffers on the host path (made again when they move), else None."""
        ptr = self._log_alpha.data_ptr()
        if self._host is None or self._host[0] != ptr:
            self._host = (ptr, [t.detach().numpy() for t in _flat(self._read())]
                          if self._on_host() else None)
        return self._host[1]

    def _update(self, x: Any, s: Update, entropy: Any, has_data: Any) -> Update:
        """One update of the rule, the bounds, the span limit and the watch."""
        finite = x.isfinite(entropy)
        entropy = x.where(finite, entropy, 0.0)
        rule = self._rule(x, s.rule, entropy, s.target, self._c)
        b = self._b
        log_alpha = x.minimum(x.maximum(rule.log_alpha, b.lo), b.hi)
        if b.span < NO_SPAN:  # a constant: no branch on a value
            log_alpha = x.minimum(x.maximum(log_alpha, s.span_hi - b.span), s.span_lo + b.span)
        watch, target = watch_rule(x, s.watch, entropy, s.target, log_alpha, self._w, b.hi)
        new = gate(x, finite & has_data, Update(
            rule._replace(log_alpha=log_alpha), watch, target,
            x.minimum(s.span_lo, log_alpha), x.maximum(s.span_hi, log_alpha)), s)
        nonfinite = s.watch.nonfinite + x.where(has_data & ~finite, 1, 0)
        return new._replace(watch=new.watch._replace(nonfinite=nonfinite))

    def _advance(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> torch.Tensor:
        """One update from the batch-mean ``entropy`` (of ``count`` elements); the new alpha."""
        self._target.refresh(self._target_now)
        views = self._host_views()
        if views is not None:
            has = True if count is None else count.cpu().numpy()[()] > 0
            x = ScalarOps if self._batch == () else ArrayOps
            s = self._unflat([v[()] for v in views])
            new = self._update(x, s, entropy.detach().to("cpu", torch.float32).numpy()[()], has)
            for view, value in zip(views, _flat(new)):
                view[...] = value
            unreachable = x.any(new.watch.stalled_for >= WINDUP_WINDOW)
        else:
            entropy = entropy.detach().to(self._log_alpha.device, torch.float32)
            s = self._read()
            has = entropy.new_ones((), dtype=torch.bool) if count is None else count > 0
            with torch.no_grad():
                for buf, value in zip(_flat(s), _flat(self._update(TensorOps, s, entropy, has))):
                    buf.copy_(value)
            unreachable = None
        self._after_update(unreachable)
        return self.alpha

    def _after_update(self, unreachable: Any) -> None:
        """Summaries; the unreachable warning where reading costs nothing (host path; summary)."""
        if summary.should_record_summaries():
            stalled = self._watch_stalled_for >= WINDUP_WINDOW
            unreachable = bool(stalled.any())  # a summary step reads the device anyway
            values = {"unreachable_target": stalled}
            if self._debug_summaries:
                values.update(alpha=self.alpha, nonfinite_entropy=self._watch_nonfinite,
                              **self._debug_values())
            if not self._target.constant or self._target.annealing:
                values["target_entropy"] = self._target_now
            self._scalars(values)
        if unreachable and "unreachable" not in self._warned:
            self._warn("unreachable", unreachable_message(self))

    def _scalars(self, values: Dict[str, torch.Tensor]) -> None:
        """Summaries of ``values`` (one a member, ``tag/k``, for a batch)."""
        with summary.scope(self._name):
            for tag, value in values.items():
                for k, v in enumerate(value.reshape(-1)):
                    summary.scalar(tag if self._batch == () else f"{tag}/{k}", v)

    def _warn(self, key: str, message: str) -> None:
        self._warned.add(key)
        logging.warning(f"{self._name}: {message}")
        warnings.warn(f"{self._name}: {message}", stacklevel=5)

    def _debug_values(self) -> Dict[str, torch.Tensor]:
        return {}  # the rule's own debug summaries


def _flat(s: Update) -> list:
    return [*s.rule, *s.watch, s.target, s.span_lo, s.span_hi]
