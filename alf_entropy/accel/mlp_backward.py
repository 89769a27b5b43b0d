"""The stacked ReLU MLP's hand-written backward (:func:`alf_entropy.accel.relu_mlp`'s), and
the guards that send it to plain ops: ``torch.compile``, JIT tracing and ``torch.func``
transforms (found with private checks), and autocast."""

from typing import Any, Callable, List, Optional, Tuple

import torch

__all__ = ["MLPForward", "ReluMLP", "autocast_on", "transformed"]


def transformed() -> bool:
    """Whether ``torch.compile`` or ``torch.jit.trace`` is recording, or a
    ``torch.func`` transform (``grad``, ``vmap``, ...) is active: they get
    plain ops (the hand-written backward is not written for them)."""
    functorch_active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(
        torch._C._get_tracing_state()
        or torch.compiler.is_compiling()
        or (functorch_active and functorch_active())
    )


def autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (its mixed dtypes get plain ops)."""
    try:
        return torch.is_autocast_enabled(device_type)  # torch >= 2.4
    except TypeError:
        if device_type == "cuda":
            return torch.is_autocast_enabled()
        return device_type == "cpu" and torch.is_autocast_cpu_enabled()


MLPForward = Callable[
    [torch.Tensor, List[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]],
    Tuple[torch.Tensor, List[torch.Tensor]],
]
"""A stacked MLP's plain forward: ``(x, params, activation) -> (out, layer_inputs)``."""


class ReluMLP(torch.autograd.Function):
    """The ReLU stacked MLP with a hand-written backward.

    The same values and gradients as autograd through the ``mlp_forward`` it
    is given (``critic_networks``' plain path), with one graph node instead
    of about a dozen, the ReLU masks applied in place (``threshold_backward``
    written into the incoming gradient, not a fresh tensor), no weight
    gradients for detached weights and no input gradient for an input that
    needs none.  SAC's
    update runs three critic passes; this makes it about 4% faster on the
    CPU.  Double backward is not supported (``CriticNetworks(fused_backward=
    False)`` is plain autograd).
    """

    @staticmethod
    def forward(  # noqa: D102
        ctx: Any, x: torch.Tensor, mlp_forward: MLPForward, *params: torch.Tensor
    ) -> torch.Tensor:
        out, inputs = mlp_forward(x, list(params), torch.relu_)
        ctx.num_inputs, ctx.broadcast = len(inputs), x.dim() == 2
        ctx.save_for_backward(*inputs, *params)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:  # noqa: D102
        if torch.is_grad_enabled():  # create_graph=True: the result would not be differentiable
            raise RuntimeError(
                "CriticNetworks: double backward (create_graph=True, e.g. a gradient "
                "penalty) is not supported by the fused ReLU critics; build them with "
                "fused_backward=False (or set ALF_ENTROPY_ACCEL=0)"
            )
        saved = ctx.saved_tensors
        inputs, params = saved[: ctx.num_inputs], saved[ctx.num_inputs :]
        needs = ctx.needs_input_grad  # (x, mlp_forward, w0, b0, w1, b1, ...)
        grads: List[Optional[torch.Tensor]] = [None] * len(params)
        d = grad
        for i in reversed(range(len(inputs))):
            h, w = inputs[i], params[2 * i]
            if needs[2 + 2 * i]:
                last = i == len(inputs) - 1  # few output columns: per critic
                grads[2 * i] = (
                    torch.stack([hk.t().mm(dk) for hk, dk in zip(h, d)])
                    if last
                    else torch.bmm(h.transpose(1, 2), d)
                )
            if needs[3 + 2 * i]:
                grads[2 * i + 1] = d.sum(1, keepdim=True)
            if i == 0 and not needs[0]:
                break
            d = d * w.transpose(1, 2) if w.shape[-1] == 1 else torch.bmm(d, w.transpose(1, 2))
            if i > 0:  # through the ReLU, in place: the gradient where h > 0, else 0
                torch.ops.aten.threshold_backward.grad_input(d, h, 0.0, grad_input=d)
        if not needs[0]:
            return (None, None, *grads)
        return (d.sum(0) if ctx.broadcast else d, None, *grads)  # a broadcast x: summed
