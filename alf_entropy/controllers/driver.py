"""The one driver that runs every rule.

One update: read the state, run the rule, bound ``log_alpha``, apply
``limit_log_alpha_span``, run the windup watch (and settled annealing), write
the state.  On the host path (CPU state) that is NumPy over views of the
buffers; on the tensor path tensor ops that never read a value on the host
(optionally under ``torch.compile``); both give the same bits.
"""
import math
import warnings
from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple, Type, Union

import torch
from absl import logging

from alf_entropy.controllers import rules, state
from alf_entropy.controllers.alf import AlfSubAlgorithm
from alf_entropy.controllers.rules import ArrayOps, ScalarOps, TensorOps
from alf_entropy.controllers.state import Bounds, ControllerState, WatchConsts, WatchState
from alf_entropy.controllers.target import Target
from alf_entropy.utils import distributed, summary
from alf_entropy.utils.checks import check_int

__all__ = ["Driver", "UPDATE_MODES", "NO_SPAN", "TARGET_STATE"]

UPDATE_MODES = ("auto", "tensor", "host", "compiled")
"""``"host"`` (NumPy over CPU state), ``"tensor"`` (tensor ops, no host read), ``"compiled"``
(the tensor path under ``torch.compile``) or ``"auto"`` (host on the CPU, else tensor)."""

NO_SPAN = 1e30
"""``limit_log_alpha_span``'s span when there is none (finite: no ``inf - inf``)."""

TARGET_STATE = ("_target_now", "_ref_target")
"""A controller's ``state_dict`` entries (last name part) that hold its target: they
differ between controllers that differ only in their target."""

_RENAMED = {"_watch_entropy": "_watch_ema", "_settled": "_watch_settled",
            "_num_nonfinite": "_watch_nonfinite", "_avg_entropy._buf": "_window",
            "_avg_entropy._count": "_seen"}
"""Buffers of the earlier layout's checkpoints, and their names now."""


class Driver(AlfSubAlgorithm):
    """Runs a controller's rule.  A controller sets ``State``, calls ``_init_driver``
    then ``_init_rule``, and implements ``_constants`` and ``_rule``."""

    State: Type[NamedTuple] = state.FixedState

    def _init_driver(self, target_entropy: Any, batch_shape: Sequence[int],
                     update_mode: str) -> None:
        """The target, the watch, the span limit and the accumulators."""
        if not isinstance(batch_shape, (tuple, list)) or len(batch_shape) > 1:
            raise ValueError(f"batch_shape must be () or (K,), got {batch_shape!r}")
        self._batch = tuple(check_int("batch_shape[0]", k, minimum=1) for k in batch_shape)
        if update_mode not in UPDATE_MODES:
            raise ValueError(f"update_mode must be one of {UPDATE_MODES}, got {update_mode!r}")
        self._update_mode = update_mode
        self._target = Target(target_entropy, self._action_spec, self._batch, self._name)
        self.register_buffer("_target_now", self._full(self._target.initial))
        state.register(self, "_watch_", WatchState(
            **{f: self._full(0, dtype) for f, dtype in state.WATCH_DTYPES.items()}))
        for buf in ("_span_lo", "_span_hi", "_acc_sum", "_acc_count"):
            self.register_buffer(buf, self._full(0, torch.float64 if "acc" in buf else None))
        self._span, self._warned, self._host, self._compiled = NO_SPAN, set(), None, None
        self.register_load_state_dict_pre_hook(_upgrade_checkpoint)
        self.register_state_dict_pre_hook(_refuse_pending_accumulation)

    def _full(self, value: Union[float, Sequence[float]],
              dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """A new tensor of ``batch_shape`` (float32 unless ``dtype``) on the state's device."""
        dtype = dtype or torch.float32
        device = self._log_alpha.device if hasattr(self, "_log_alpha") else None
        if isinstance(value, (list, tuple)):
            return torch.tensor(value, dtype=dtype).reshape(self._batch).to(device)
        return torch.full(self._batch, value, dtype=dtype, device=device)

    def _init_rule(self, initial: NamedTuple, settings: Dict[str, Any]) -> None:
        """Register the rule's state (a ``State`` of tensors); check and take its settings."""
        state.register(self, "_", initial)
        self._settings = settings
        consts, lo, hi = self._constants(settings)
        self._consts = state.Constants(self, "_rule_consts", consts)
        self._bounds = state.Constants(self, "_bound_consts", Bounds(lo, hi, self._span))
        self._watch_consts = state.Constants(self, "_watch_consts", self._watch_constants())

    def _constants(self, settings: Dict[str, Any]) -> Tuple[NamedTuple, float, float]:
        """Check ``settings``; the rule's constants and ``log_alpha``'s floor and ceiling."""
        raise NotImplementedError

    def _watch_constants(self) -> WatchConsts:
        a = self._target.annealing
        if a is None:
            return WatchConsts(0.0, math.inf, 0.0, -math.inf)
        return WatchConsts(a.tolerance, a.window, 1 - a.factor, a.final)

    def _rule(self, x: Any, s: NamedTuple, entropy: Any, valid: Any, target: Any, c: Any,
              b: Bounds) -> NamedTuple:
        """One step of the control law (``rules.py``): the new ``State``."""
        return s

    def _actuate(self, s: NamedTuple, on_host: bool) -> NamedTuple:
        """Between the rule and the bounds (the SGD rule's optimiser step); ``s`` by default."""
        return s

    def _phase1(self, x: Any, s: ControllerState, entropy: Any, has_data: Any, c: Any,
                b: Bounds) -> Tuple:
        finite = x.isfinite(entropy)
        valid = finite & has_data
        entropy = x.where(finite, entropy, 0.0)
        rule = self._rule(x, s.rule, entropy, valid, s.target, c, b)
        return rule, entropy, valid

    def _phase2(self, x: Any, s: ControllerState, rule: NamedTuple, entropy: Any, has_data: Any,
                valid: Any, b: Bounds, w: WatchConsts) -> ControllerState:
        log_alpha = x.minimum(x.maximum(rule.log_alpha, b.lo), b.hi)
        log_alpha, lo, hi = rules.span_rule(x, log_alpha, s.span_lo, s.span_hi, b.span)
        watch, target = rules.watch_rule(x, s.watch, entropy, has_data, valid, s.target,
                                         log_alpha, w, b.hi)
        return ControllerState(rule._replace(log_alpha=log_alpha), watch, target, lo, hi)

    def _tensor_phase1(self, s: ControllerState, entropy: Any, has_data: Any, c: Any,
                       b: Any) -> Tuple:
        # Constants come packed (no 0-d float64 tensor, whose value torch.compile would guard).
        return self._phase1(TensorOps, s, entropy, has_data, self._consts.unpack(c),
                            self._bounds.unpack(b))

    def _tensor_phase2(self, s: ControllerState, rule: NamedTuple, entropy: Any, has_data: Any,
                       valid: Any, b: Any, w: Any) -> ControllerState:
        return self._phase2(TensorOps, s, rule, entropy, has_data, valid, self._bounds.unpack(b),
                            self._watch_consts.unpack(w))

    def _state(self) -> ControllerState:
        return ControllerState(state.read(self, "_", self.State), state.read(
            self, "_watch_", WatchState), self._target_now, self._span_lo, self._span_hi)

    def _on_host(self) -> bool:
        cpu = self._log_alpha.device.type == "cpu"
        if self._update_mode == "host" and not cpu:
            raise ValueError(f"{self._name}: update_mode='host' needs the controller on the CPU, "
                             f"it is on {self._log_alpha.device}; use 'tensor' or 'auto'")
        return cpu and self._update_mode in ("host", "auto")

    def _advance(self, entropy: torch.Tensor, count: Optional[torch.Tensor]) -> torch.Tensor:
        """One update from the batch-mean ``entropy`` (of ``count`` elements); the new alpha."""
        entropy = entropy.detach().to(self._log_alpha.device, torch.float32)
        if not self._target.constant:
            values = self._target.values(counting=True)
            if self._target.shared:
                self._target_now.fill_(values[0])
            else:
                for k, v in enumerate(values):
                    self._target_now.view(-1)[k].fill_(v)
        on_host, unreachable = self._on_host(), None
        if on_host:
            if self._host is None or self._host[0] is not self._log_alpha:
                self._host = (self._log_alpha, state.views(self._state()))
            x, arrays = ScalarOps if self._batch == () else ArrayOps, self._host[1]
            h = entropy.cpu().numpy()[()]
            has = True if count is None else count.cpu().numpy()[()] > 0
            s = state.values(arrays)
            rule, h, valid = self._phase1(x, s, h, has, self._consts.host, self._bounds.host)
            new = self._phase2(x, s, self._actuate(rule, True), h, has, valid, self._bounds.host,
                               self._watch_consts.host)
            state.write(arrays, new)
            # Read back from the views (arrays; the rule may return a Python int).
            unreachable = rules.unreachable(arrays.watch.stalled_for).any()
        else:
            if self._compiled is None:  # update_mode="compiled": compiled once, on first use
                self._compiled = (self._tensor_phase1, self._tensor_phase2)
                if self._update_mode == "compiled":
                    self._compiled = tuple(torch.compile(f, fullgraph=True, dynamic=False)
                                           for f in self._compiled)
            s, (c, b, w) = self._state(), (
                self._consts.packed(), self._bounds.packed(), self._watch_consts.packed())
            has = entropy.new_ones((), dtype=torch.bool) if count is None else count > 0
            rule, h, valid = self._compiled[0](s, entropy, has, c, b)
            new = self._compiled[1](s, self._actuate(rule, False), h, has, valid, b, w)
            with torch.no_grad():
                state.write(s, new)
        self._after_update(on_host, unreachable)
        return self.alpha

    def _after_update(self, on_host: bool, unreachable: Any) -> None:
        """Summaries, and warnings read on the host only where that costs nothing more
        (``unreachable``: the watch's verdict on the host path, else None)."""
        if summary.should_record_summaries():
            unreachable = self.unreachable_target  # the summary step reads the device anyway
            values = {"unreachable_target": unreachable}
            if self._debug_summaries:
                values.update(alpha=self.alpha, nonfinite_entropy=self._watch_nonfinite,
                              **self._debug_values())
            if not self._target.constant or self._target.annealing:
                values["target_entropy"] = self._target_now
            with summary.scope(self._name):
                for tag, value in values.items():
                    for k, v in enumerate(value.reshape(-1)):
                        summary.scalar(tag if self._batch == () else f"{tag}/{k}", v)
        if "unreachable" not in self._warned and unreachable is not None and unreachable.any():
            self._warn("unreachable", (
                f"the entropy ({_show(self._watch_ema)}) has stayed below the target "
                f"({_show(self._target_now)}) for {_show(self._watch_stalled_for)} updates with "
                f"alpha at its ceiling ({_show(self.alpha)}); the target looks unreachable for "
                "this policy. Lower target_entropy (e.g. greedy_probability_target or "
                "SettledAnnealing), or raise max_alpha if a larger coefficient is sensible."))

    def _warn(self, key: str, message: str) -> None:
        self._warned.add(key)
        message = f"{self._name}: {message}"
        logging.warning(message)
        warnings.warn(message, stacklevel=5)

    def _debug_values(self) -> Dict[str, torch.Tensor]:
        """The rule's own debug summaries."""
        return {}


def _show(value: torch.Tensor) -> str:
    values = [f"{float(v):.4g}" for v in value.reshape(-1)]
    return values[0] if len(values) == 1 else "[" + ", ".join(values) + "]"


def _upgrade_checkpoint(module: Driver, state_dict: Dict[str, Any], prefix: str,
                        *args: Any) -> None:
    """Load the earlier layout's checkpoints: renamed buffers, and new ones kept as they are."""
    for old, new in _RENAMED.items():
        if prefix + old in state_dict and prefix + new not in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)
    for gone in ("_watch_ref", "_watch_trough", "_watch_below", "_watch_stalled",
                 "_stalled"):  # the climb-based watch's
        state_dict.pop(prefix + gone, None)
    for name in ("_ref_target", "_target_now", "_watch_settled", "_watch_stalled_for",
                 "_span_lo", "_span_hi", "_acc_sum", "_acc_count", "_grad", "_gain"):
        buf = getattr(module, name, None)
        if buf is not None and prefix + name not in state_dict:
            state_dict[prefix + name] = buf.detach().clone()


def _refuse_pending_accumulation(module: Driver, prefix: str, keep_vars: bool) -> None:
    """A multi-rank checkpoint holds rank 0's state: one rank's partial sum would be wrong."""
    if distributed.is_distributed() and bool((module._acc_count > 0).any()):
        raise RuntimeError(f"{module.name}: state_dict() between accumulate() and step() in a "
                           "multi-rank run would save one rank's partial entropy sum; call "
                           "step() first (save between optimizer steps)")
