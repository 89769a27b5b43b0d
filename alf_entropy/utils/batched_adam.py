"""``BatchedAdam``: Adam over stacked parameters, one independent optimiser per member.

Every parameter has a leading dimension ``K`` (member ``k``'s values at index
``k``, as :class:`~alf_entropy.networks.stacked.StackedModule` stores them).
Adam is element-wise except for one thing: its step counter (the bias
correction).  ``torch.optim.Adam`` keeps one counter per parameter tensor,
which would tie the members together as soon as one of them skips an update;
here every member has its own counter (``step``, ``[K]`` per parameter), and
:meth:`BatchedAdam.masked_step` takes a ``[K]`` flag: a member whose flag is
false keeps its parameters, moments and counter exactly, the others step.
Nothing else couples members: all arithmetic is element-wise (or, for the
optional gradient clipping, per member).

Member ``k``'s step is torch's fused Adam kernel (``torch.optim.adam.adam(...,
fused=True)``, what ``FusedAdam`` runs for a single agent) on its slices of the
parameters, gradients and moments, with its flag as the kernel's ``found_inf``
(as ``GradScaler`` skips a step): one kernel call per member, one pass over the
memory, nothing read on the host.  Where torch has no fused kernel for the
device (CPU tensors on torch < 2.4) it is torch's single-tensor Adam, and a
skipped member is not stepped (reading the CPU flag costs no device sync).
So member ``k`` matches ``FusedAdam`` bit for bit (``tests/many_agents``
checks it).
"""
from typing import Callable, Iterable, List, Optional, Tuple

import gin
import torch
from torch.optim.adam import adam

from alf_entropy.utils.checks import check_callable, check_real
from alf_entropy.utils.optimizers import _FUSED_ADAM_ON_CPU

__all__ = ["BatchedAdam"]


@gin.configurable
class BatchedAdam(torch.optim.Optimizer):
    """Adam for stacked parameters ``[K, ...]``, with a per-member skip (module docstring).

    Args:
        params: the stacked parameters (each with the same leading ``K``).
        lr: the learning rate (>= 0).
        betas: the running averages' coefficients, each in ``[0, 1)``.
        eps: added to the denominator (>= 0).
        weight_decay: L2 penalty (>= 0).
        lr_schedule: ``None`` (a constant rate) or a zero-argument callable (a
            scheduler) of the factor (>= 0) each group's initial rate is
            multiplied by before each step, as ``FusedAdam``'s.

    Raises:
        ValueError: for out-of-range arguments, no parameters, or parameters
            whose leading dimensions differ.
        TypeError: if ``lr_schedule`` is not callable.
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, lr_schedule: Optional[Callable[[], float]] = None):
        self._lr_factor = None if lr_schedule is None else check_callable("lr_schedule",
                                                                          lr_schedule)
        betas = (check_real("betas[0]", betas[0], minimum=0.0, below=1.0),
                 check_real("betas[1]", betas[1], minimum=0.0, below=1.0))
        defaults = dict(lr=check_real("lr", lr, minimum=0.0), betas=betas,
                        eps=check_real("eps", eps, minimum=0.0),
                        weight_decay=check_real("weight_decay", weight_decay, minimum=0.0))
        super().__init__(params, defaults)
        sizes = {p.shape[0] if p.dim() else None for g in self.param_groups for p in g["params"]}
        if len(sizes) != 1 or None in sizes:
            raise ValueError("BatchedAdam needs parameters with one common leading dimension K, "
                             f"got leading sizes {sorted(map(str, sizes))}")
        self.num_members = sizes.pop()
        for group in self.param_groups:  # what lr_schedule scales
            group.setdefault("initial_lr", group["lr"])

    @property
    def lr_schedule(self) -> Optional[Callable[[], float]]:
        """The scheduler of the learning rates' factor, or ``None`` (constant rates)."""
        return self._lr_factor

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One step of every member.

        Args:
            closure: as for ``torch.optim.Optimizer.step``.

        Returns:
            The closure's loss, if a closure was given.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.masked_step(None)
        return loss

    @torch.no_grad()
    def masked_step(self, ok: Optional[torch.Tensor],
                    max_grad_norm: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """One step of the members whose flag is true; the others keep everything.

        One fused-kernel call per member (see the module docstring); reads nothing
        on the host: a member's flag is the kernel's ``found_inf``.

        Args:
            ok: bool ``[K]`` on the parameters' device, or None for all.
            max_grad_norm: if given, first scale each member's gradients so that
                their global norm (over all groups) is at most this, as
                ``torch.nn.utils.clip_grad_norm_`` does for one model, and skip
                the members whose norm is not finite.

        Returns:
            ``(norms, ok)``: each member's gradient norm before clipping (``[K]``;
            zeros without ``max_grad_norm``) and the flags the step used.

        Raises:
            ValueError: if ``ok`` does not have ``K`` elements, or a parameter
                has no gradient.
        """
        k = self.num_members
        if ok is not None and ok.shape != (k,):
            raise ValueError(f"ok must have shape ({k},), got {tuple(ok.shape)}")
        if self._lr_factor is not None:
            factor = check_real("lr_schedule's value", self._lr_factor(), minimum=0.0)
            for group in self.param_groups:
                group["lr"] = group.setdefault("initial_lr", group["lr"]) * factor
        grads = []
        for group in self.param_groups:
            missing = [i for i, p in enumerate(group["params"]) if p.grad is None]
            if missing:
                raise ValueError(f"BatchedAdam steps a group's parameters together: parameters "
                                 f"{missing} have no gradient")
            grads.append([p.grad if p.grad.is_contiguous() else p.grad.contiguous()
                          for p in group["params"]])
        first = self.param_groups[0]["params"][0]
        norms = first.new_zeros(k)
        if max_grad_norm is not None:
            norms = torch.linalg.vector_norm(
                torch.cat([g.reshape(k, -1) for gs in grads for g in gs], dim=1), dim=1)
            coef = (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)  # clip_grad_norm_'s
            grads = [[g * coef.reshape(k, *(1,) * (g.dim() - 1)).to(g.dtype) for g in gs]
                     for gs in grads]
            finite = torch.isfinite(norms)
            ok = finite if ok is None else ok & finite
        skip = None if ok is None else (~ok).to(torch.float32)
        for group, group_grads in zip(self.param_groups, grads):
            self._step_group(group, group_grads, skip)
        return norms, (first.new_ones(k, dtype=torch.bool) if ok is None else ok)

    def _step_group(self, group: dict, grads: List[torch.Tensor],
                    skip: Optional[torch.Tensor]) -> None:
        params, k = group["params"], self.num_members
        states = []
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros(k, dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            elif state["exp_avg"].shape != p.shape or state["step"].shape != (k,):
                raise ValueError("BatchedAdam: the optimiser state does not fit the parameters "
                                 f"(a moment of shape {tuple(state['exp_avg'].shape)} for a "
                                 f"parameter of shape {tuple(p.shape)})")
            states.append(state)
        beta1, beta2 = group["betas"]
        fused = _FUSED_ADAM_ON_CPU or params[0].device.type != "cpu"
        for m in range(k):
            if not fused and skip is not None and bool(skip[m]):
                continue  # CPU without the fused kernel: a host read, no device sync
            adam([p.detach()[m] for p in params], [g[m] for g in grads],
                 [s["exp_avg"][m] for s in states], [s["exp_avg_sq"][m] for s in states], [],
                 [s["step"][m] for s in states], fused=fused, foreach=False,
                 grad_scale=None, found_inf=None if skip is None or not fused else skip[m],
                 amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                 weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
