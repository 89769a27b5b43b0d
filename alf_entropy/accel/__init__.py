"""The fast paths that need torch internals, behind one switch.

Everything else in the package uses torch's public APIs only (a test greps
the source for private names outside this module).  What is here was kept
because it was measured to earn at least 3% of a PPO iteration or of a SAC
update on the CPU (``docs/benchmarks/ppo_speed.md``; the optimiser's two steps
2-3% each, so together); each fast path gives
what the plain path gives (the same distribution; the same random draws),
and falls back to the plain path whenever it cannot promise that.

* :func:`buffers`: a module's own buffers from its ``_buffers`` dict, where ``buffers()``
  costs a generator's walk: a controller reads its whole state on every update.
* :func:`forward_only`: whether calling modules would run nothing but their
  ``forward`` (no hooks, no ``module.compile()``, no JIT tracing).  torch has
  no public API for this; it reads ``nn.Module``'s hook registries.  The fast
  paths below, and SAC's closed-form policy sample
  (``ActorDistributionNetwork.rsample_and_log_prob``), are taken only when it
  holds, so that hooks always run.
* :func:`categorical_sample_with_log_prob`: PPO's acting step for a single
  categorical head, ``dist = Categorical(logits); a = dist.sample();
  dist.log_prob(a)`` without the distribution object (and with one
  ``log_softmax`` instead of ``Categorical``'s ``logsumexp``).  The network
  computes the logits without its module-call frames where
  :func:`forward_only` allows (``ActorDistributionNetwork.sample_with_log_prob``).
* :func:`unwrapped_step`: ``optimizer.step()`` without the wrapper torch puts
  around every optimiser's ``step`` (a profiler range and the hook loops)
  where no step hook is registered and no profiler runs: 2-3% of a CartPole
  PPO iteration (the range alone costs tens of microseconds in the loop).
* :func:`fused_adam_step`: ``FusedAdam``'s step as torch's own fused Adam
  kernel call (``torch._fused_adam_``) on the same state, without
  ``Adam.step``'s per-step Python (gathering its lists, grouping by device):
  the same bits, 2-3% of a CartPole PPO iteration (the step hooks still run
  around it).  A first step, a grad scaler's flags or any option but the
  plain ones take torch's step.
* :func:`relu_mlp`: ``CriticNetworks``' stacked ReLU MLP with a hand-written
  backward (one graph node; the ReLU masks applied in place with
  ``aten.threshold_backward``); it steps aside under ``torch.compile``, JIT
  tracing, ``torch.func`` transforms (found with private checks) and autocast
  (:mod:`~alf_entropy.accel.mlp_backward`).

This module receives tensors, modules and plain callables (the networks pass
their own sampler and stacked-MLP forward), and imports nothing from the
rest of the package: the networks and algorithms call it, never the reverse.

Switch: the environment variable ``ALF_ENTROPY_ACCEL=0`` turns every fast
path off (read once, when this module is imported); the plain, public-API
path then runs everywhere.  Any other value, or none, leaves them on.
Seeded runs draw the same actions either way; log-probabilities may differ
in the last bits.
"""

import itertools
import operator
import os
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn as nn
from torch.nn.modules import module as _torch_module
from torch.optim import optimizer as _torch_optimizer

from alf_entropy.accel.mlp_backward import MLPForward, ReluMLP, autocast_on, transformed

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
    """Whether calling each of ``modules`` would run nothing but its ``forward``.

    That is what ``nn.Module.__call__`` checks before calling ``forward``
    directly: no hooks on the module or global ones, no ``module.compile()``,
    no JIT tracing.

    Args:
        *modules: the modules.

    Returns:
        bool: True if ``module.forward(x)`` is ``module(x)`` for each of them;
        always False when the fast paths are switched off.
    """
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
