"""``BatchedAdam``: Adam over stacked parameters ``[K, ...]``, one optimiser per member.

Adam is element-wise but for its step counter (the bias correction), which torch keeps
per parameter tensor and which would tie the members together once one of them skips an
update: here every member has its own (``step`` is ``[K]``).  Member ``k``'s step is
torch's fused Adam kernel (what ``FusedAdam`` runs for one agent) on its slices, with its
flag of ``found_inf`` (``[K]``, as ``masked_optimizer_step`` hands it over) skipping it in
the kernel: nothing read on the host, and member ``k`` is ``FusedAdam`` bit for bit.
Without a fused CPU kernel (torch < 2.4) it is torch's single-tensor Adam, and a skipped
member is not stepped (a CPU flag: reading it costs no device sync).
"""

import functools
from typing import Callable, Iterable, Optional, Tuple

import torch
from torch.optim.adam import adam

from alf_entropy.utils.optimizers import _FUSED_ADAM_ON_CPU, FusedAdam

__all__ = ["BatchedAdam", "batched_adam_like"]


class BatchedAdam(FusedAdam):
    """Adam for stacked parameters ``[K, ...]``, with a per-member skip (module docstring).

    Args:
        params: the stacked parameters (each with the same leading ``K``).
        lr: the learning rate (>= 0).
        betas: the running averages' coefficients.
        eps: added to the denominator.
        weight_decay: L2 penalty.
        lr_schedule: ``None`` or a scheduler of the rates' factor (``FusedAdam``'s).

    Raises:
        ValueError: for out-of-range arguments, or parameters whose leading dims differ.
        TypeError: if ``lr_schedule`` is not callable.
    """

    takes_found_inf = True

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        lr_schedule: Optional[Callable[[], float]] = None,
    ):
        super().__init__(
            params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, lr_schedule=lr_schedule
        )
        sizes = {p.shape[0] if p.dim() else None for g in self.param_groups for p in g["params"]}
        if len(sizes) != 1 or None in sizes:
            raise ValueError(
                "BatchedAdam needs parameters with one common leading dimension K, "
                f"got leading sizes {sorted(map(str, sizes))}"
            )
        self.num_members = sizes.pop()

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One step of every member but those ``found_inf`` (if set) flags; as torch's Adam,
        parameters without a gradient are left alone."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.schedule_lr()
        skip = getattr(self, "found_inf", None)
        for group in self.param_groups:
            self._step_group(group, skip)
        return loss

    def _step_group(self, group: dict, skip: Optional[torch.Tensor]) -> None:
        # As torch's Adam: a parameter without a gradient is not stepped (nor its counter).
        params, k = [p for p in group["params"] if p.grad is not None], self.num_members
        if not params:
            return
        states = []
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros(k, dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            elif state["exp_avg"].shape != p.shape or state["step"].shape != (k,):
                raise ValueError(
                    "BatchedAdam: the optimiser state does not fit the parameters "
                    f"(a moment of shape {tuple(state['exp_avg'].shape)} for a "
                    f"parameter of shape {tuple(p.shape)})"
                )
            states.append(state)
        grads = [p.grad if p.grad.is_contiguous() else p.grad.contiguous() for p in params]
        beta1, beta2 = group["betas"]
        fused = _FUSED_ADAM_ON_CPU or params[0].device.type != "cpu"
        kinds = [params, grads] + [
            [s[n] for s in states] for n in ("exp_avg", "exp_avg_sq", "step")
        ]
        # Member m's slices of each kind: one unbind a tensor, not K indexing ops.
        members = zip(
            *[[list(x) for x in zip(*(t.detach().unbind() for t in kind))] for kind in kinds]
        )
        for m, (p, g, exp_avg, exp_avg_sq, step) in enumerate(members):
            if not fused and skip is not None and bool(skip[m]):
                continue  # CPU without the fused kernel: a host read, no device sync
            adam(
                p,
                g,
                exp_avg,
                exp_avg_sq,
                [],
                step,
                fused=fused,
                foreach=False,
                grad_scale=None,
                found_inf=None if skip is None or not fused else skip[m],
                amsgrad=False,
                beta1=beta1,
                beta2=beta2,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=False,
            )


def batched_adam_like(opt: torch.optim.Optimizer) -> Callable[..., BatchedAdam]:
    """A factory ``params -> BatchedAdam`` with the settings of ``opt``, one agent's Adam
    (its initial learning rate, betas, eps, weight decay and ``lr_schedule``).

    Raises:
        TypeError: if ``opt`` is not an Adam with one parameter group and no amsgrad,
            maximize or decoupled decay (``AdamW``): the batch would step otherwise.
    """
    group = opt.param_groups[0]
    # AdamW subclasses Adam; its decoupled decay, amsgrad, maximize or a second group
    # would silently become another optimiser in the batch.
    if (
        not isinstance(opt, torch.optim.Adam)
        or isinstance(opt, torch.optim.AdamW)
        or len(opt.param_groups) != 1
        or group.get("amsgrad")
        or group.get("maximize")
        or group.get("decoupled_weight_decay")
    ):
        raise TypeError(
            f"the batch needs agents optimised by Adam (FusedAdam) with one "
            f"parameter group and no amsgrad/maximize/decoupled decay, got "
            f"{type(opt).__name__} with {len(opt.param_groups)} group(s)"
        )
    return functools.partial(
        BatchedAdam,
        lr=group.get("initial_lr", group["lr"]),
        betas=group["betas"],
        eps=group["eps"],
        weight_decay=group["weight_decay"],
        lr_schedule=getattr(opt, "lr_schedule", None),
    )
