"""The fast paths that need torch internals, behind one switch.

The rest of the package uses torch's public APIs only (a test greps the source
for private names outside this module).  Each path here was measured to earn at
least 3% of a PPO iteration or of a SAC update on the CPU
(``docs/benchmarks/ppo_speed.md``), gives what the plain path gives (the same
distribution and random draws), and returns None or False, doing nothing, where
it cannot promise that: the caller then runs the plain path.  It receives
tensors, modules and plain callables and imports nothing from the package.

Switch: ``ALF_ENTROPY_ACCEL=0`` (read at import) turns every fast path off.
Seeded runs draw the same actions either way; log-probabilities may differ in
the last bits.
"""

import itertools
import operator
import os
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.nn as nn
from torch.nn.modules import module as _torch_module
from torch.optim import optimizer as _torch_optimizer

__all__ = [
    "ENABLED",
    "buffers",
    "categorical_sample_with_log_prob",
    "forward_only",
    "fused_adam_step",
    "relu_mlp",
    "unwrapped_step",
]

ENABLED: bool = os.environ.get("ALF_ENTROPY_ACCEL", "1").strip() != "0"
"""Whether the fast paths are on (``ALF_ENTROPY_ACCEL=0`` turns them off)."""


def buffers(module: nn.Module) -> Tuple[torch.Tensor, ...]:
    """``module``'s own buffers in registration order, read from its dict (``buffers()``
    walks a generator: a tenth of a controller's host update)."""
    if ENABLED:
        return tuple(module._buffers.values())
    return tuple(module.buffers(recurse=False))


def forward_only(*modules: nn.Module) -> bool:
    """Whether ``module(x)`` would run only ``module.forward(x)`` for each module: no hooks
    (the module's or global ones), no ``module.compile()``, no JIT tracing, the switch on."""
    if (
        not ENABLED
        or _torch_module._global_forward_hooks
        or _torch_module._global_forward_pre_hooks
        or _torch_module._global_backward_hooks
        or _torch_module._global_backward_pre_hooks
        or torch._C._get_tracing_state()
    ):
        return False
    for m in modules:
        if (
            m._forward_hooks
            or m._forward_pre_hooks
            or m._backward_hooks
            or m._backward_pre_hooks
            or m._compiled_call_impl is not None
        ):
            return False
    return True


def categorical_sample_with_log_prob(
    logits: torch.Tensor, sample: Callable[[torch.Tensor], torch.Tensor]
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """One draw from ``Categorical(logits=logits)`` and its log-probability, cheaply.

    What ``dist = Categorical(logits=logits); action = dist.sample();
    dist.log_prob(action)`` gives -- the same random draws, when ``sample``
    is the distribution's sampler -- without the distribution object.  The
    switch off returns None; the caller then builds the distribution.

    Args:
        logits: unnormalised log-probabilities ``[B, num_actions]``.
        sample: draws int64 indices ``[B]`` from probabilities ``[B,
            num_actions]`` as ``Categorical.sample`` does
            (``alf_entropy.networks.distributions.sample_categorical``).

    Returns:
        ``(action, log_prob)`` (int64 ``[B]``, float ``[B]``), or None.

    Raises:
        TypeError: if ``logits`` is not a tensor or ``sample`` not callable.
        ValueError: if ``logits`` is not two-dimensional.
    """
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a tensor, got {type(logits).__name__}")
    if not callable(sample):
        raise TypeError(f"sample must be callable, got {type(sample).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, num_actions], got shape {tuple(logits.shape)}")
    if not ENABLED:
        return None
    logits = torch.log_softmax(logits, dim=-1)
    action = sample(torch.softmax(logits, dim=-1))
    return action, logits.gather(-1, action.unsqueeze(-1)).squeeze(-1)


def unwrapped_step(optimizer: torch.optim.Optimizer) -> bool:
    """``optimizer.step()`` without torch's wrapper, where that changes nothing.

    Returns:
        True if it stepped; False, having done nothing, where ``step()`` must run: the switch
        off, a step hook (the optimiser's or a global one), a profiler running, a ``step`` that
        torch did not wrap, or one the instance overrides (an LR scheduler's, which counts it).
    """
    step = type(optimizer).step
    if (
        not ENABLED
        or "step" in optimizer.__dict__
        or not getattr(step, "hooked", False)
        or not hasattr(step, "__wrapped__")
        or optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
        or _torch_optimizer._global_optimizer_pre_hooks
        or _torch_optimizer._global_optimizer_post_hooks
        or torch._C._autograd._profiler_enabled()
    ):
        return False
    step.__wrapped__(optimizer)
    return True


_ADAM_OPTIONS = (
    "fused",
    "amsgrad",
    "maximize",
    "capturable",
    "differentiable",
    "decoupled_weight_decay",
)
_PLAIN_ADAM = (True, False, False, False, False, False)
_PLAIN_ADAMS = (_PLAIN_ADAM, _PLAIN_ADAM[:-1] + (None,))  # torch < 2.6 lacks the last option
_NONES = itertools.repeat(None)


def fused_adam_step(optimizer: torch.optim.Adam) -> bool:
    """What ``torch.optim.Adam(fused=True).step()`` does, with its kernel called directly.

    The tensor lists it passes are gathered once and kept while the optimiser keeps its
    state and groups (``load_state_dict`` and ``add_param_group`` make it gather them again).

    Args:
        optimizer: a ``torch.optim.Adam`` (or subclass) built with ``fused=True``.

    Returns:
        True if it stepped; False, having done nothing, where ``step()`` must run: the
        switch off, a grad scaler's ``grad_scale``/``found_inf``, an option other than
        ``_PLAIN_ADAM``, a tensor ``lr`` or betas, a parameter without a gradient or without
        state (its first step), or a group's parameters on several devices or dtypes.
    """
    if (
        not ENABLED
        or getattr(optimizer, "grad_scale", None) is not None
        or getattr(optimizer, "found_inf", None) is not None
    ):
        return False
    plan = optimizer.__dict__.get("_accel_adam")
    if plan is None or not _adam_plan_holds(plan, optimizer):
        plan = _adam_plan(optimizer)
        if plan is None:
            return False
        optimizer._accel_adam = plan
    calls = []
    for group, (params, *state) in zip(optimizer.param_groups, plan[2]):
        grads = [p.grad for p in params]
        if (
            any(map(operator.is_, grads, _NONES))
            or type(group["lr"]) is not float
            or tuple(map(group.get, _ADAM_OPTIONS)) not in _PLAIN_ADAMS
        ):
            return False
        calls.append((group, params, grads, *state))
    with torch.no_grad():
        for group, params, grads, exp_avgs, exp_avg_sqs, steps in calls:
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                amsgrad=False,
                lr=group["lr"],
                beta1=group["betas"][0],
                beta2=group["betas"][1],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=False,
                grad_scale=None,
                found_inf=None,
            )
    return True


def _adam_plan_holds(plan: tuple, optimizer: torch.optim.Adam) -> bool:
    groups = optimizer.param_groups
    if plan[0] is not optimizer.state or len(plan[1]) != len(groups):
        return False
    for group, (same, params, n, betas) in zip(groups, plan[1]):
        if (
            group is not same
            or group["params"] is not params
            or len(params) != n
            or (group["betas"] is not betas)
        ):
            return False
    return True


def _adam_plan(optimizer: torch.optim.Adam) -> Optional[tuple]:
    """``(state, group keys, [(params, exp_avgs, exp_avg_sqs, steps)] per group)``, or None
    where ``fused_adam_step`` cannot step."""
    lists = []
    for group in optimizer.param_groups:
        params = list(group["params"])
        states = [optimizer.state.get(p) for p in params]
        if (
            not params
            or not all(states)
            or len({(p.device, p.dtype) for p in params}) > 1
            or not all(type(b) is float for b in group["betas"])
        ):
            return None
        lists.append((params, *([s[k] for s in states] for k in ("exp_avg", "exp_avg_sq", "step"))))
    keys = [(g, g["params"], len(g["params"]), g["betas"]) for g in optimizer.param_groups]
    return optimizer.state, keys, lists


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
    """The stacked ReLU MLP with one graph node: the values and gradients of autograd through
    ``mlp_forward``, the ReLU masks applied in place, no gradients nobody needs.  SAC's
    update is about 4% faster on the CPU; double backward is refused."""

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


def relu_mlp(
    x: torch.Tensor, params: List[torch.Tensor], mlp_forward: MLPForward
) -> Optional[torch.Tensor]:
    """``CriticNetworks``' stacked ReLU MLP with the hand-written backward.

    Args:
        x: the input ``[B, in]`` (broadcast to every critic) or ``[n, B, in]``
            (one block of rows per critic).
        params: weights ``[n, in, out]`` and biases ``[n, 1, out]``, alternating.
        mlp_forward: the plain stacked MLP (``critic_networks``' own), called
            as ``mlp_forward(x, params, torch.relu_)`` without autograd
            recording: it returns the output ``[n, B, out]`` (what this
            function returns) and the input of every layer (``[n, B, in]``
            for the first, ``x`` broadcast to every critic), which the
            hand-written backward needs.

    Returns:
        The output ``[n, B, out]``, or None where the plain path must run
        (the switch off, no gradient wanted, a transform, tracing or autocast).

    Raises:
        TypeError: if ``mlp_forward`` is not callable.
        ValueError: if ``params`` is empty or odd in length.
    """
    if not callable(mlp_forward):
        raise TypeError(f"mlp_forward must be callable, got {type(mlp_forward).__name__}")
    if not params or len(params) % 2:
        raise ValueError(
            "params must alternate weights and biases (an even, non-zero number of "
            f"tensors), got {len(params)}"
        )
    if not ENABLED or not torch.is_grad_enabled() or transformed() or autocast_on(x.device.type):
        return None
    return ReluMLP.apply(x, mlp_forward, *params)
