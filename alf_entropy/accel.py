"""The fast paths that need torch internals, behind one switch.

Everything else in the package uses torch's public APIs only (a test greps
the source for private names outside this module).  What is here was kept
because it was measured to earn at least 3% of a PPO iteration or of a SAC
update on the CPU (``docs/benchmarks/ppo_speed.md``); each fast path gives
what the plain path gives (the same distribution; the same random draws),
and falls back to the plain path whenever it cannot promise that.

* :func:`forward_only`: whether calling modules would run nothing but their
  ``forward`` (no hooks, no ``module.compile()``, no JIT tracing).  torch has
  no public API for this; it reads ``nn.Module``'s hook registries.  The fast
  paths below, and SAC's closed-form policy sample
  (``ActorDistributionNetwork.rsample_and_log_prob``), are taken only when it
  holds, so that hooks always run.
* :func:`categorical_sample_with_log_prob`: PPO's acting step for a single
  categorical head, ``dist = actor(obs); a = dist.sample(); dist.log_prob(a)``
  without the module-call frames and the distribution object (and with one
  ``log_softmax`` instead of ``Categorical``'s ``logsumexp``).
* :func:`relu_mlp`: ``CriticNetworks``' stacked ReLU MLP with a hand-written
  backward (one graph node; the ReLU masks applied in place with
  ``aten.threshold_backward``); it steps aside under ``torch.compile``, JIT
  tracing, ``torch.func`` transforms (found with private checks) and autocast.

Switch: the environment variable ``ALF_ENTROPY_ACCEL=0`` turns every fast
path off (read once, when this module is imported); the plain, public-API
path then runs everywhere.  Any other value, or none, leaves them on.
Seeded runs draw the same actions either way; log-probabilities may differ
in the last bits.
"""
import os
from typing import Any, List, Optional, Tuple

import torch
import torch.nn as nn
from torch.nn.modules import module as _torch_module

__all__ = ["ENABLED", "categorical_sample_with_log_prob", "forward_only", "relu_mlp"]

ENABLED: bool = os.environ.get("ALF_ENTROPY_ACCEL", "1").strip() != "0"
"""Whether the fast paths are on (``ALF_ENTROPY_ACCEL=0`` turns them off)."""


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
    actor: nn.Module, observation: torch.Tensor
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """One draw from ``actor(observation)`` and its log-probability, cheaply.

    For an ``ActorDistributionNetwork`` (not a subclass overriding
    ``forward``) with a single scalar categorical head over a flat tensor
    observation, and when calling its modules would run only their
    ``forward`` (:func:`forward_only`), this runs ``dist = actor(observation);
    action = dist.sample(); dist.log_prob(action)`` -- the same random draws
    -- without the distribution object and the module-call frames.  Anything
    else (or the switch off) returns None; the caller then calls the actor.

    Args:
        actor: the policy network.
        observation: tensor ``[B, *obs_shape]``.

    Returns:
        ``(action, log_prob)`` (int64 ``[B]``, float ``[B]``), or None.
    """
    from alf_entropy.networks.actor_distribution_network import ActorDistributionNetwork
    from alf_entropy.networks.distributions import sample_categorical
    from alf_entropy.networks.encoding_network import EncodingNetwork
    from alf_entropy.networks.projection_networks import CategoricalProjectionNetwork
    from alf_entropy.tensor_specs import TensorSpec

    if not (
        ENABLED
        and type(actor) is ActorDistributionNetwork
        and isinstance(observation, torch.Tensor)
        and actor._single_head
    ):
        return None
    head, encoder, spec = actor._heads[0], actor._encoder, actor.input_tensor_spec
    if (
        type(head) is not CategoricalProjectionNetwork
        or head.action_spec_shape
        or type(encoder) is not EncodingNetwork
        or not isinstance(spec, TensorSpec)
        or observation.dim() != 2
        or observation.shape[1:] != spec.shape
        or observation.dtype != encoder.dtype
    ):
        return None
    layers, linear = encoder.layers, head.linear
    if not forward_only(actor, encoder, head, linear, *layers):
        return None
    x = observation  # flatten_observation would return it as it is
    for layer in layers:
        x = layer.forward(x)
    logits = torch.log_softmax(linear.forward(x), dim=-1)
    action = sample_categorical(torch.softmax(logits, dim=-1))
    return action, logits.gather(-1, action.unsqueeze(-1)).squeeze(-1)


_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (
    torch._dynamo.is_compiling  # torch < 2.3
)


def _transformed() -> bool:
    """Whether ``torch.compile`` or ``torch.jit.trace`` is recording, or a
    ``torch.func`` transform (``grad``, ``vmap``, ...) is active: they get
    plain ops (the hand-written backward is not written for them)."""
    functorch_active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(
        torch._C._get_tracing_state()
        or _is_compiling()
        or (functorch_active and functorch_active())
    )


def _autocast(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (its mixed dtypes get plain ops)."""
    try:
        return torch.is_autocast_enabled(device_type)  # torch >= 2.4
    except TypeError:
        if device_type == "cuda":
            return torch.is_autocast_enabled()
        return device_type == "cpu" and torch.is_autocast_cpu_enabled()


def relu_mlp(x: torch.Tensor, params: List[torch.Tensor]) -> Optional[torch.Tensor]:
    """``CriticNetworks``' stacked ReLU MLP with the hand-written backward.

    Args:
        x: the input ``[B, in]``.
        params: weights ``[n, in, out]`` and biases ``[n, 1, out]``, alternating.

    Returns:
        The output ``[n, B, out]``, or None where the plain path must run
        (the switch off, no gradient wanted, a transform, tracing or autocast).
    """
    if not ENABLED or not torch.is_grad_enabled() or _transformed() or _autocast(x.device.type):
        return None
    return _ReluMLP.apply(x, *params)


class _ReluMLP(torch.autograd.Function):
    """The ReLU stacked MLP with a hand-written backward.

    The same values and gradients as autograd through ``_mlp_forward`` of
    ``critic_networks``, with one graph node instead of about a dozen, the
    ReLU masks applied in place (``threshold_backward`` written into the
    incoming gradient, not a fresh tensor), no weight gradients for detached
    weights and no input gradient for an input that needs none.  SAC's
    update runs three critic passes; this makes it about 4% faster on the
    CPU.  Double backward is not supported (``CriticNetworks(fused_backward=
    False)`` is plain autograd).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:  # noqa: D102
        from alf_entropy.networks.critic_networks import _mlp_forward

        out, inputs = _mlp_forward(x, list(params), torch.relu_)
        ctx.num_inputs = len(inputs)
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
        needs = ctx.needs_input_grad  # (x, w0, b0, w1, b1, ...)
        grads: List[Optional[torch.Tensor]] = [None] * len(params)
        d = grad
        for i in reversed(range(len(inputs))):
            h, w = inputs[i], params[2 * i]
            if needs[1 + 2 * i]:
                last = i == len(inputs) - 1  # few output columns: per critic
                grads[2 * i] = (
                    torch.stack([hk.t().mm(dk) for hk, dk in zip(h, d)])
                    if last
                    else torch.bmm(h.transpose(1, 2), d)
                )
            if needs[2 + 2 * i]:
                grads[2 * i + 1] = d.sum(1, keepdim=True)
            if i == 0 and not needs[0]:
                break
            d = d * w.transpose(1, 2) if w.shape[-1] == 1 else torch.bmm(d, w.transpose(1, 2))
            if i > 0:  # through the ReLU, in place: the gradient where h > 0, else 0
                torch.ops.aten.threshold_backward.grad_input(d, h, 0.0, grad_input=d)
        dx = d.sum(0) if needs[0] else None  # x was broadcast to every critic
        return (dx, *grads)
