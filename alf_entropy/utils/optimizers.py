"""Optimiser stepping: ``FusedAdam`` and ``masked_optimizer_step``.

``FusedAdam`` is ``torch.optim.Adam(fused=True)`` (torch's own class and
``step``), registered with gin so that configs can bind its arguments; on
torch < 2.4 with CPU parameters, which has no fused CPU kernel, it is the
multi-tensor (``foreach``) Adam.  A scheduler may scale its learning rate
(as torch's ``LambdaLR`` does), read before each step; the algorithms'
default optimisers are ``FusedAdam``, so in gin::

    default_optimizer.lr = 1e-3                 # A2C/PPO's default optimiser
    FusedAdam.lr_schedule = @lr/LinearScheduler()
    lr/LinearScheduler.progress_type = 'percent'
    lr/LinearScheduler.schedule = [(0, 1.0), (1.0, 0.0)]   # 1e-3 linearly to 0

``masked_optimizer_step`` takes an update only if a flag (a tensor) says so,
without waiting for a GPU: fused optimisers get the flag as ``found_inf``, as
``torch.amp.GradScaler`` hands it to them, and skip the step in their kernel
(every algorithm's update skips non-finite ones so, see
``Algorithm.update_with_gradient``).
"""
from typing import Any, Callable, Iterable, List, Optional

import gin
import torch

from alf_entropy.utils.checks import check_callable, check_real

__all__ = ["FusedAdam", "masked_optimizer_step"]

# torch has a fused Adam kernel for CPU tensors from version 2.4 on (CUDA before).
_FUSED_ADAM_ON_CPU = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 4)


def _flat_params(params: List[Any]) -> List[torch.Tensor]:
    """The tensors of a parameter list or of a list of parameter groups."""
    out: List[torch.Tensor] = []
    for item in params:
        if isinstance(item, dict):
            group = item["params"]
            out.extend([group] if isinstance(group, torch.Tensor) else list(group))
        else:
            out.append(item)
    return out


@gin.configurable
class FusedAdam(torch.optim.Adam):
    """``torch.optim.Adam(params, ..., fused=True)``, with an optional scheduled
    learning rate.

    Torch's Adam with the fused kernel chosen (so its ``state_dict`` is
    ``torch.optim.Adam``'s); where this torch has no fused kernel for the
    parameters' device (CPU parameters on torch < 2.4) it is torch's
    ``foreach`` Adam.  With an ``lr_schedule``, each :meth:`step` first sets
    every parameter group's learning rate to its initial one times the
    schedule's value (host-side floats, so no device synchronisation).

    Args:
        params: the parameters (or parameter groups) to optimise.
        lr: the learning rate (>= 0).
        betas: the coefficients of the running averages of the gradient and
            its square.
        eps: added to the denominator.
        weight_decay: L2 penalty.
        lr_schedule: ``None`` (a constant learning rate) or a scheduler (any
            zero-argument callable, e.g. a ``LinearScheduler``) of the factor
            (>= 0) each group's initial learning rate is multiplied by.

    Raises:
        ValueError: if ``lr`` (or, at a step, the scheduled factor) is
            negative or not finite.
        TypeError: if ``lr`` is not a real number or ``lr_schedule`` not
            callable.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        lr_schedule: Optional[Callable[[], float]] = None,
    ):
        params = list(params)
        fused = _FUSED_ADAM_ON_CPU or all(p.device.type != "cpu" for p in _flat_params(params))
        self._lr_factor = None if lr_schedule is None else check_callable("lr_schedule",
                                                                          lr_schedule)
        super().__init__(
            params,
            lr=check_real("lr", lr, minimum=0.0),
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            **({"fused": True} if fused else {"foreach": True}),
        )
        for group in self.param_groups:  # what lr_schedule scales (kept in checkpoints)
            group.setdefault("initial_lr", group["lr"])

    @property
    def lr_schedule(self) -> Optional[Callable[[], float]]:
        """The scheduler of the learning rates' factor, or ``None`` (constant rates)."""
        return self._lr_factor

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Adam's step, at the scheduled learning rate if there is an ``lr_schedule``.

        Args:
            closure: as for ``torch.optim.Adam.step``.

        Returns:
            The closure's loss, if a closure was given.
        """
        if self._lr_factor is not None:
            factor = check_real("lr_schedule's value", self._lr_factor(), minimum=0.0)
            for group in self.param_groups:
                # A checkpoint of a run without a schedule may lack initial_lr.
                group["lr"] = group.setdefault("initial_lr", group["lr"]) * factor
        return super().step(closure)


def _takes_found_inf(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` skips its step in the kernel when given ``found_inf``
    (torch's fused Adam and AdamW, as ``GradScaler`` uses them)."""
    return isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)) and all(
        g.get("fused") for g in opt.param_groups
    )


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

    With ``sync_free=False`` (CPU tensors) the flag is read on the host:
    that waits for no device, and torch's plain step is cheaper than its
    masked one (about 2% of a PPO iteration).  With ``sync_free=True`` (for
    GPUs) nothing waits for the device: fused optimisers (``FusedAdam``,
    torch's Adam/AdamW with ``fused=True``) get the flag as ``found_inf``, as
    ``torch.amp.GradScaler`` hands it to them, and skip the step in their
    kernel; any other optimiser steps and its
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
    if not sync_free:  # a CPU flag: reading it costs no device sync
        if bool(ok):
            for opt in optimizers:
                opt.step()
        return
    skip = (~ok).to(torch.float32)
    rest = []
    for opt in optimizers:
        if not _takes_found_inf(opt):
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
