"""Optimiser stepping: ``FusedAdam``, per-member gradient clipping and the masked step.

``FusedAdam`` is ``torch.optim.Adam(fused=True)`` (``foreach`` where torch has no fused
CPU kernel, torch < 2.4), gin-configurable, with an optional scheduled learning rate
(read before each step, as torch's ``LambdaLR`` would)::

    default_optimizer.lr = 1e-3                 # A2C/PPO's default optimiser
    FusedAdam.lr_schedule = @lr/LinearScheduler()
    lr/LinearScheduler.progress_type = 'percent'
    lr/LinearScheduler.schedule = [(0, 1.0), (1.0, 0.0)]   # 1e-3 linearly to 0

:func:`clip_grad_norms_` is ``torch.nn.utils.clip_grad_norm_`` for each member of a
stacked batch of agents; :func:`masked_optimizer_step` steps only where a flag (one per
member) says so, without waiting for a GPU.  Together they are the one gradient step of
every algorithm (``Algorithm.update_with_gradient``), one agent or K.
"""

from typing import Any, Callable, Iterable, List, Optional

import torch

from alf_entropy import accel
from alf_entropy.utils.checks import check_callable, check_real

__all__ = [
    "FusedAdam",
    "clip_grad_norms_",
    "clip_grads_",
    "default_optimizer",
    "masked_optimizer_step",
]

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


class FusedAdam(torch.optim.Adam):
    """``torch.optim.Adam(params, ..., fused=True)`` with an optional scheduled learning rate.

    Its ``state_dict`` is ``torch.optim.Adam``'s.  With an ``lr_schedule`` each
    :meth:`step` first sets every group's rate to its initial one times the schedule's
    value (host floats: no device sync).

    Args:
        params: the parameters (or parameter groups) to optimise.
        lr: the learning rate (>= 0).
        betas: the running averages' coefficients.
        eps: added to the denominator.
        weight_decay: L2 penalty.
        lr_schedule: ``None`` (constant) or a zero-argument callable (a scheduler) of
            the factor (>= 0) the initial rates are multiplied by.

    Raises:
        ValueError: if ``lr`` (or, at a step, the factor) is negative or not finite.
        TypeError: if ``lr`` is not a real number or ``lr_schedule`` not callable.
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
        self._lr_factor = (
            None if lr_schedule is None else check_callable("lr_schedule", lr_schedule)
        )
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

    def schedule_lr(self) -> None:
        """Set each group's ``lr`` to its initial rate times the schedule's factor now."""
        if self._lr_factor is not None:
            factor = check_real("lr_schedule's value", self._lr_factor(), minimum=0.0)
            for group in self.param_groups:
                # A checkpoint of a run without a schedule may lack initial_lr.
                group["lr"] = group.setdefault("initial_lr", group["lr"]) * factor

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Adam's step, at the scheduled learning rate if there is an ``lr_schedule``."""
        self.schedule_lr()
        if closure is None and accel.fused_adam_step(self):
            return None
        return super().step(closure)


def default_optimizer(
    params: List[torch.nn.Parameter], lr: float = 3e-4, eps: float = 1e-5
) -> torch.optim.Optimizer:
    """A2C/PPO's optimiser when none is given: ``FusedAdam(lr=3e-4, eps=1e-5)`` (gin:
    ``default_optimizer.lr = 1e-3``; ``torch.optim.Adam.lr`` is ``@torch.optim.Adam``'s)."""
    return FusedAdam(
        params,
        lr=check_real("default_optimizer.lr", lr, positive=True),
        eps=check_real("default_optimizer.eps", eps, minimum=0.0),
    )


def clip_grad_norms_(
    params: List[torch.Tensor], max_norm: float, batch_ndim: int = 0
) -> torch.Tensor:
    """Clip each member's gradient norm to ``max_norm``; return the norms before clipping.

    ``torch.nn.utils.clip_grad_norm_``'s arithmetic (the norm of the parameters' norms,
    scaled by ``max_norm / (norm + 1e-6)`` clamped at 1) over the dims after the first
    ``batch_ndim``: 0 for one model (a 0-d norm), 1 for K stacked agents (norms ``[K]``).
    """
    return clip_grads_([p.grad for p in params if p.grad is not None], max_norm, batch_ndim)


def clip_grads_(grads: List[torch.Tensor], max_norm: float, batch_ndim: int = 0) -> torch.Tensor:
    """:func:`clip_grad_norms_` of the gradient tensors ``grads`` themselves (a compiled
    update's), in place."""
    norms = torch.linalg.vector_norm(
        torch.stack(
            [
                torch.linalg.vector_norm(
                    g, dim=tuple(range(batch_ndim, g.dim())) if batch_ndim else None
                )
                for g in grads
            ]
        ),
        dim=0,
    )
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    views = {}  # coef shaped once per gradient rank (not once per gradient)
    for g in grads:
        view = views.get(g.dim())
        if view is None:
            view = views[g.dim()] = coef.reshape(coef.shape + (1,) * (g.dim() - batch_ndim))
        g.mul_(view)
    return norms


def _step(opt: torch.optim.Optimizer) -> None:
    """``opt.step()``, without torch's wrapper where nothing needs it (tens of us a step)."""
    if not accel.unwrapped_step(opt):
        opt.step()


def _takes_found_inf(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` skips in its kernel when given ``found_inf`` (torch's fused
    Adam/AdamW, as ``GradScaler`` uses them; ``BatchedAdam`` per member)."""
    return getattr(opt, "takes_found_inf", False) or (
        isinstance(opt, (torch.optim.Adam, torch.optim.AdamW))
        and all(g.get("fused") for g in opt.param_groups)
    )


def _keep_steps_on_device(optimizers: List[torch.optim.Optimizer]) -> None:
    """Adam-like optimisers keep their ``step`` counters on the parameters' (non-CPU)
    device (``capturable=True``), so that restoring them reads nothing on the host."""
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
    """Step every optimiser where ``ok`` is true: a 0-d flag, or one per member ``[K]``.

    ``sync_free=False`` (CPU flags): the flags are read on the host, which waits for no
    device; all true is torch's plain step (cheaper than a masked one), all false no
    step.  Otherwise nothing waits: fused optimisers get ``~ok`` as ``found_inf`` and
    skip in their kernel (per member for ``BatchedAdam``); any other optimiser (one
    flag) steps and has its parameters and state put back with ``torch.where`` where
    ``ok`` is false (a state this step created goes back to zeros).
    """
    if not sync_free and bool(ok.all()):
        for opt in optimizers:
            _step(opt)
        return
    if not sync_free and not bool(ok.any()):
        return
    skip = (~ok).to(torch.float32)
    rest = []
    for opt in optimizers:
        if not _takes_found_inf(opt):
            rest.append(opt)
            continue
        opt.found_inf = skip
        try:
            _step(opt)
        finally:
            del opt.found_inf
    if not rest:
        return
    params = [p for opt in rest for g in opt.param_groups for p in g["params"]]
    _keep_steps_on_device(rest)
    old_states = [
        {k: v.clone() for k, v in opt.state.get(p, {}).items() if torch.is_tensor(v)}
        for opt in rest
        for g in opt.param_groups
        for p in g["params"]
    ]
    old_params = [p.detach().clone() for p in params]
    for opt in rest:
        _step(opt)
    with torch.no_grad():
        for p, old in zip(params, old_params):
            p.copy_(torch.where(ok, p, old))
        states = [
            opt.state.get(p, {}) for opt in rest for g in opt.param_groups for p in g["params"]
        ]
        for state, old_state in zip(states, old_states):
            for k, v in state.items():
                if torch.is_tensor(v):
                    old = old_state.get(k)
                    v.copy_(torch.where(ok, v, torch.zeros_like(v) if old is None else old))
