"""``BatchedAdam``: Adam over stacked parameters, one independent optimiser per member.

Every parameter has a leading dimension ``K`` (member ``k``'s values at index
``k``, as :class:`~alf_entropy.networks.stacked.StackedModule` stores them).
Adam is element-wise except for one thing: its step counter (the bias
correction).  ``torch.optim.Adam`` keeps one counter per parameter tensor,
which would tie the members together as soon as one of them skips an update;
here every member has its own counter (``step``, ``[K]``), and
:meth:`BatchedAdam.masked_step` takes a ``[K]`` flag: a member whose flag is
false keeps its parameters, moments and counter exactly, the others step.
Nothing else couples members: all arithmetic is element-wise (or, for the
optional gradient clipping, per member).

A parameter group is stepped as one ``[K, P]`` matrix (its parameters
concatenated): a dozen operations per step instead of a dozen per parameter,
which is most of the cost for small networks.  Its state (``step``,
``exp_avg``, ``exp_avg_sq``, each ``[K, ...]``) is kept, in that layout, under
the group's first parameter.

The arithmetic is torch's single-tensor Adam's (``lerp`` for the first
moment, ``mul``/``addcmul`` for the second, bias corrections in float64 then
applied in the parameter's dtype), so one member matches ``torch.optim.Adam``
to an ulp or so (``tests/many_agents`` checks it against ``FusedAdam``).
"""
from typing import Callable, Iterable, Optional, Tuple

import gin
import torch

from alf_entropy.utils.checks import check_callable, check_real

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

        Every parameter of a group is updated together, on one ``[K, P]`` view of
        all of them (a few operations whatever the number of parameters); reads
        nothing on the host: the flag is applied with ``torch.where``.

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
            grads.append(torch.cat([p.grad.reshape(k, -1) for p in group["params"]], dim=1))
        first = self.param_groups[0]["params"][0]
        norms = first.new_zeros(k)
        if max_grad_norm is not None:
            norms = torch.linalg.vector_norm(torch.cat(grads, dim=1), dim=1)
            coef = (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)  # clip_grad_norm_'s
            grads = [g * coef.unsqueeze(1).to(g.dtype) for g in grads]
            finite = torch.isfinite(norms)
            ok = finite if ok is None else ok & finite
        for group, grad in zip(self.param_groups, grads):
            self._step_group(group, grad, ok)
        return norms, (first.new_ones(k, dtype=torch.bool) if ok is None else ok)

    def _step_group(self, group: dict, grad: torch.Tensor, ok: Optional[torch.Tensor]) -> None:
        params, k = group["params"], self.num_members
        beta1, beta2 = group["betas"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        state = self.state[params[0]]  # the group's state, [K, P] (P: all its elements)
        flat = torch.cat([p.detach().reshape(k, -1) for p in params], dim=1)
        if not state:
            state["step"] = torch.zeros(k, dtype=torch.float64, device=flat.device)
            state["exp_avg"] = torch.zeros_like(flat)
            state["exp_avg_sq"] = torch.zeros_like(flat)
        if weight_decay != 0:
            grad = grad.add(flat, alpha=weight_decay)
        step = state["step"] + (1.0 if ok is None else ok.to(torch.float64))
        exp_avg = state["exp_avg"].lerp(grad, 1 - beta1)
        exp_avg_sq = state["exp_avg_sq"].mul(beta2).addcmul_(grad, grad, value=1 - beta2)
        # float64 bias corrections (as torch computes its Python floats), applied in the
        # parameters' dtype.  A member that never stepped (step 0) gets any finite value:
        # its update is discarded.
        step_clamped = step.clamp(min=1.0)
        step_size = (lr / (1 - beta1 ** step_clamped)).to(flat.dtype).unsqueeze(1)
        bias_correction2_sqrt = (1 - beta2 ** step_clamped).sqrt().to(flat.dtype).unsqueeze(1)
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        new = flat + (-step_size * exp_avg) / denom
        if ok is not None:
            keep = ok.unsqueeze(1)
            new = torch.where(keep, new, flat)
            exp_avg = torch.where(keep, exp_avg, state["exp_avg"])
            exp_avg_sq = torch.where(keep, exp_avg_sq, state["exp_avg_sq"])
        state["exp_avg"], state["exp_avg_sq"], state["step"] = exp_avg, exp_avg_sq, step
        for p, chunk in zip(params, new.split([p[0].numel() for p in params], dim=1)):
            p.copy_(chunk.reshape(p.shape))
