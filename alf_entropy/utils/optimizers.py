"""Optimiser stepping: ``FusedAdam`` and ``masked_optimizer_step``.

``masked_optimizer_step`` takes an update only if a flag (a tensor) says so,
without reading it on the host on a GPU (SAC skips non-finite updates so).

``FusedAdam`` is ``torch.optim.Adam(fused=True)`` with a lean ``step``.

For the small networks of classic-control RL, torch's ``Adam.step`` spends
most of its time in Python around one fused kernel (about 45 of 75 us for
PPO's twelve 64x64-network tensors on the CPU): hooks, per-parameter state
lookups, grouping by device and dtype and one ``step``-counter increment per
parameter.  ``FusedAdam`` keeps torch's state layout, so its ``state_dict``
is interchangeable with ``torch.optim.Adam``'s, and once that state exists it
calls the same fused kernel with the same arguments -- hence the same bits --
from cached lists, incrementing all ``step`` counters with one op (they
become views of one buffer).  Like torch's fused step it honours the
``grad_scale``/``found_inf`` attributes that ``torch.amp.GradScaler`` sets
(unscale in the kernel; skip the step where ``found_inf`` is 1).  Anything
else (a closure, a missing gradient, several devices or dtypes, options the
fused kernel is not called with here, ``torch.compile`` tracing) goes through
torch's own ``step``.
Step hooks run as for any torch optimiser.
"""
from typing import Any, Callable, Dict, Iterable, List, Optional

import gin
import torch

from alf_entropy.utils.tracing import is_compiling

__all__ = ["FusedAdam", "fused_adam", "masked_optimizer_step"]

# torch has a fused Adam kernel for CPU tensors from version 2.4 on (CUDA before).
_FUSED_ADAM_ON_CPU = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 4)


def fused_adam(params: Iterable[Any], **kwargs: Any) -> torch.optim.Adam:
    """The algorithms' default Adam: :class:`FusedAdam` where this torch has
    the fused kernel for the parameters' device, torch's ``foreach`` Adam
    otherwise (CPU parameters on torch < 2.4).

    Args:
        params: the parameters to optimise.
        **kwargs: Adam's other arguments (``lr``, ``eps``, ...).

    Returns:
        torch.optim.Adam: the optimiser.
    """
    params = list(params)
    if not _FUSED_ADAM_ON_CPU and any(p.device.type == "cpu" for p in params):
        return torch.optim.Adam(params, foreach=True, **kwargs)
    return FusedAdam(params, **kwargs)


@gin.configurable
class FusedAdam(torch.optim.Adam):
    """``torch.optim.Adam(params, ..., fused=True)`` with a leaner ``step``.

    Args:
        params: the parameters (or parameter groups) to optimise.
        lr: the learning rate.
        betas: the coefficients of the running averages of the gradient and
            its square.
        eps: added to the denominator.
        weight_decay: L2 penalty.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
        self._lean: Optional[Dict[str, Any]] = None

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        self._lean = None

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """torch's ``load_state_dict`` (the cached lists are rebuilt on the next step).

        Args:
            state_dict: an ``Adam``/``FusedAdam`` state dict.
        """
        super().load_state_dict(state_dict)
        self._lean = None

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch's ``add_param_group`` (the cached lists are rebuilt on the next step).

        Args:
            param_group: the new group.
        """
        super().add_param_group(param_group)
        self._lean = None

    def _build_lean(self) -> Optional[Dict[str, Any]]:
        """The cached lists, or None when the lean step does not apply."""
        params: List[torch.Tensor] = [p for g in self.param_groups for p in g["params"]]
        if not params:
            return None
        for g in self.param_groups:
            if (g["amsgrad"] or g["maximize"] or g["capturable"] or g["differentiable"]
                    or g.get("decoupled_weight_decay", False) or not g["fused"]
                    or any(isinstance(g[k], torch.Tensor) for k in ("lr", "betas"))
                    or any(isinstance(b, torch.Tensor) for b in g["betas"])):
                return None
        first = params[0]
        states = [self.state.get(p, {}) for p in params]
        if any(
            p.device != first.device or p.dtype != first.dtype or p.is_complex()
            or "step" not in s or "exp_avg" not in s or "exp_avg_sq" not in s
            for p, s in zip(params, states)
        ):
            return None  # e.g. no state before the first step: torch's step creates it
        counters = torch.stack([s["step"] for s in states])
        steps = list(counters.unbind(0))
        for s, step in zip(states, steps):
            s["step"] = step  # a view: one add_ on ``counters`` advances them all
        bounds, start = [], 0
        for g in self.param_groups:
            bounds.append((start, start + len(g["params"])))
            start += len(g["params"])
        return {
            "params": params,
            "exp_avgs": [s["exp_avg"] for s in states],
            "exp_avg_sqs": [s["exp_avg_sq"] for s in states],
            "steps": steps,
            "counters": counters,
            "bounds": bounds,
        }

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One Adam step (see the module docstring for when torch's ``step`` runs).

        Args:
            closure: re-evaluates the model and returns the loss (torch's
                ``step`` is used then).

        Returns:
            The closure's loss, or None.
        """
        # torch wraps ``step`` with its hooks and profiler label (for this
        # class too); the fallback calls torch's unwrapped step so that they
        # run once.
        adam_step = getattr(torch.optim.Adam.step, "__wrapped__", torch.optim.Adam.step)
        if closure is not None or is_compiling():  # (its cached views confuse dynamo)
            return adam_step(self, closure)
        lean = self._lean if self._lean is not None else self._build_lean()
        self._lean = lean
        if lean is None:
            return adam_step(self)
        grads = [p.grad for p in lean["params"]]
        if any(g is None or g.is_sparse for g in grads):
            return adam_step(self)
        # Set by GradScaler (or masked_optimizer_step) as torch's fused step
        # expects: the kernel unscales, and skips the step where found_inf is 1.
        device = lean["params"][0].device
        grad_scale, found_inf = (
            None if t is None else t.to(device, non_blocking=True)
            for t in (getattr(self, "grad_scale", None), getattr(self, "found_inf", None))
        )
        lean["counters"].add_(1)
        for g, (lo, hi) in zip(self.param_groups, lean["bounds"]):
            beta1, beta2 = g["betas"]
            torch._fused_adam_(
                lean["params"][lo:hi], grads[lo:hi], lean["exp_avgs"][lo:hi],
                lean["exp_avg_sqs"][lo:hi], [], lean["steps"][lo:hi],
                amsgrad=False, lr=g["lr"], beta1=beta1, beta2=beta2,
                weight_decay=g["weight_decay"], eps=g["eps"], maximize=False,
                grad_scale=grad_scale, found_inf=found_inf,
            )
        if found_inf is not None:  # a skipped step does not count
            lean["counters"].sub_(found_inf)
        return None


def _keep_steps_on_device(optimizers: List[torch.optim.Optimizer]) -> None:
    """Make Adam-like optimisers keep their ``step`` counters on the
    parameters' (non-CPU) device (``capturable=True``), so restoring them
    with ``torch.where`` reads nothing back to the host."""
    for opt in optimizers:
        for group in opt.param_groups:
            if group.get("capturable", True) or group["params"][0].device.type == "cpu":
                continue
            group["capturable"] = True
            for p in group["params"]:
                state = opt.state.get(p, {})
                if torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(p.device)


def masked_optimizer_step(
    optimizers: List[torch.optim.Optimizer], ok: torch.Tensor, sync_free: bool
) -> None:
    """Step every optimiser only if ``ok`` (a 0-d bool tensor) is true.

    With ``sync_free=False`` the flag is read on the host (free for CPU
    tensors). With ``sync_free=True`` (for GPUs) nothing waits for the
    device: fused optimisers (``FusedAdam``, torch's ``fused=True``) get the
    flag as ``found_inf``, as ``torch.amp.GradScaler`` hands it to them, and
    skip the step in their kernel; any other optimiser steps and its
    parameters and state are then restored with ``torch.where`` where ``ok``
    is false (a state created by this very step is restored to zeros, the
    optimiser's initial state). Adam-like optimisers are switched to
    ``capturable=True`` there, so that their step counters live on the
    device too.

    Args:
        optimizers: the optimisers (their gradients are already computed).
        ok: whether the update is valid.
        sync_free: see above.
    """
    if not sync_free:
        if bool(ok):
            for opt in optimizers:
                opt.step()
        return
    skip = (~ok).to(torch.float32)
    rest = []
    for opt in optimizers:
        # GradScaler's test for an optimiser that takes ``found_inf``.
        if not getattr(opt, "_step_supports_amp_scaling", False):
            rest.append(opt)
            continue
        opt.found_inf = skip
        try:
            opt.step()
        finally:
            del opt.found_inf
    if not rest:
        return
    params = [p for opt in rest for g in opt.param_groups for p in g["params"]]
    _keep_steps_on_device(rest)
    old_states = []
    for opt in rest:
        for g in opt.param_groups:
            for p in g["params"]:
                st = opt.state.get(p, {})
                old_states.append({k: v.clone() for k, v in st.items() if torch.is_tensor(v)})
    old_params = [p.detach().clone() for p in params]
    for opt in rest:
        opt.step()
    with torch.no_grad():
        for p, old in zip(params, old_params):
            p.copy_(torch.where(ok, p, old))
        i = 0
        for opt in rest:
            for g in opt.param_groups:
                for p in g["params"]:
                    for k, v in opt.state.get(p, {}).items():
                        if torch.is_tensor(v):
                            old = old_states[i].get(k)
                            v.copy_(torch.where(ok, v, torch.zeros_like(v) if old is None else old))
                    i += 1
