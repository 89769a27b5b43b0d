"""What a controller's ``state_dict`` needs beyond ``nn.Module``'s: earlier layouts load, and
no multi-rank checkpoint holds one rank's partial entropy sum."""
from typing import Any, Dict

import torch.nn as nn

from alf_entropy.utils import distributed

__all__ = ["register_hooks"]

_RENAMED = {"_watch_entropy": "_watch_ema", "_settled": "_watch_settled",
            "_num_nonfinite": "_watch_nonfinite", "_avg_entropy._buf": "_window",
            "_avg_entropy._count": "_seen"}
_GONE = ("_watch_ref", "_watch_trough", "_watch_below", "_watch_stalled", "_stalled", "_grad")
_ADDED = ("_ref_target", "_target_now", "_watch_settled", "_watch_stalled_for", "_span_lo",
          "_span_hi", "_acc_sum", "_acc_count", "_gain", "_exp_avg", "_exp_avg_sq",
          "_adam_step", "_noise")
"""Buffers earlier layouts lacked: a fresh controller's values are taken."""
_ADAM = {"exp_avg": "_exp_avg", "exp_avg_sq": "_exp_avg_sq", "step": "_adam_step"}
"""The SGD rule's ``torch.optim.Adam`` state (earlier, its ``_extra_state``): now buffers."""


def _upgrade(module: nn.Module, state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
    for old, new in _RENAMED.items():
        if prefix + old in state_dict and prefix + new not in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)
    for gone in _GONE:
        state_dict.pop(prefix + gone, None)
    extra = state_dict.pop(prefix + "_extra_state", None) or {}
    for old, new in _ADAM.items():
        if old in extra.get("state", {}).get(0, {}) and new in module._buffers:
            state_dict[prefix + new] = extra["state"][0][old].to(module._buffers[new].dtype)
    if prefix + "_fast" in state_dict and prefix + "_level" not in state_dict:  # the PID's
        for name in ("_level", "_reading", "_before"):  # the recent entropy: its fast average
            state_dict[prefix + name] = state_dict[prefix + "_fast"].clone()
    for name in _ADDED:
        if module._buffers.get(name) is not None and prefix + name not in state_dict:
            state_dict[prefix + name] = module._buffers[name].detach().clone()


def _refuse_pending_accumulation(module: nn.Module, prefix: str, keep_vars: bool) -> None:
    if distributed.is_distributed() and bool((module._acc_count > 0).any()):
        raise RuntimeError(f"{module.name}: state_dict() between accumulate() and step() in a "
                           "multi-rank run would save one rank's partial entropy sum; call "
                           "step() first (save between optimizer steps)")


def register_hooks(module: nn.Module) -> None:
    """Install both on a controller."""
    module.register_load_state_dict_pre_hook(_upgrade)
    module.register_state_dict_pre_hook(_refuse_pending_accumulation)
