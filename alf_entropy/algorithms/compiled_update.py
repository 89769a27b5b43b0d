"""One gradient update as one compiled graph: ``CompiledUpdate`` (``SacAlgorithm``'s
``compile_update=True``), LeanRL's recipe on ALF's ``Algorithm``.

ALF runs every update eager; here the same update (the losses, their gradient by
``torch.func.vjp``, the controller's device step, Adam by ``torch.optim.adam.adam``) is
one ``torch.compile(fullgraph=True)`` graph, and on CUDA one CUDA graph.
"""

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributions as td
import torch.nn as nn
from torch.optim.adam import adam

from alf_entropy.controllers.driver import Inputs
from alf_entropy.controllers.ops import member_mean
from alf_entropy.controllers.watch import report
from alf_entropy.utils import distributed, nest
from alf_entropy.utils.optimizers import FusedAdam, clip_grads_

__all__ = ["CompiledUpdate", "device_update", "rsample_with"]


class _Call(nn.Module):
    """``fn(*args)`` as the forward of a module holding ``alg``, for ``functional_call``."""

    def __init__(self, alg: nn.Module, fn: Callable[..., Any]):
        super().__init__()
        self.alg = alg
        self.fn = fn

    def forward(self, *args: Any) -> Any:  # noqa: D102
        return self.fn(*args)


class CompiledUpdate:
    """One gradient update as one ``torch.compile(fullgraph=True, dynamic=False)`` graph; on
    CUDA captured as one CUDA graph and replayed (LeanRL's way).

    In the graph: ``terms(inputs) -> (rows, for_gradient, entropy, mask, extra)`` (the loss per
    row but its entropy term, the entropy to differentiate, the one the controller sees, the
    valid mask, detached extras) under ``torch.func.vjp`` (``Tensor.backward`` breaks a graph);
    ``coefficient(entropy, mask, extra) -> (alpha, extra)`` (a controller's device step); the
    gradient of ``A + alpha * B`` (each member's masked means of ``rows`` and ``-for_gradient``)
    clipped to ``max_grad_norm``; each Adam's step (``torch.optim.adam.adam``, capturable),
    undone for a member whose loss or gradient norm is not finite; ``after()``.  Outside:
    ``refresh()`` and the controller's target (scheduled values are device tensors: ``set``
    fills ``scalars``), the inputs' copy into static tensors, the controller's report.  A CUDA
    graph is captured after three compiled calls, and again when a tensor it holds moved (a
    load, ``.to``) or the inputs' shapes changed.
    """

    def __init__(
        self,
        alg: nn.Module,
        terms: Callable,
        coefficient: Optional[Callable],
        max_grad_norm: Optional[float],
        controller: Any = None,
        after: Callable[[], None] = lambda: None,
        refresh: Callable[[], None] = lambda: None,
    ):
        self._alg, self._terms, self._coefficient = alg, terms, coefficient
        self._clip, self._controller, self._after, self._refresh = (
            max_grad_norm,
            controller,
            after,
            refresh,
        )
        for opt in alg.optimizers():
            if not isinstance(opt, torch.optim.Adam) or any(
                g["amsgrad"] or g["maximize"] for g in opt.param_groups
            ):
                raise TypeError(
                    f"{alg.name}: compile_update needs Adam optimisers (FusedAdam, "
                    f"torch.optim.Adam or AdamW) without amsgrad or maximize, got "
                    f"{type(opt).__name__}"
                )
        self._call = _Call(alg, terms)
        self._fn = torch.compile(self._step, fullgraph=True, dynamic=False)
        self.scalars: Dict[Any, torch.Tensor] = {}
        self._static = self._graph = self._out = None
        self._key, self._calls = (), 0

    def __call__(self, inputs: Any, skipped: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        """One update on ``inputs``; ``skipped`` counts the skipped ones; ``(loss, extra)``."""
        if distributed.is_distributed():
            raise RuntimeError(
                f"{self._alg.name}: compile_update=True is for one process "
                "(its gradients are not all-reduced); use compile_update=False"
            )
        controller, self._device = self._controller, skipped.device
        if controller is not None:  # a scheduled target: fill_ from host floats
            controller.refresh_target()
        self._refresh()
        plan = self._plan()
        held = [
            t
            for t in nest.flatten((plan, list(self._alg.buffers())))
            if isinstance(t, torch.Tensor)
        ]
        key = [t.data_ptr() for t in held] + [
            (x.shape, x.dtype, x.device) for x in nest.flatten(inputs)
        ]
        if self._static is None or key != self._key:
            self._static = nest.map_structure(torch.clone, inputs)
            self._graph, self._key, self._calls = None, key, 0
        for static, value in zip(nest.flatten(self._static), nest.flatten(inputs)):
            static.copy_(value)
        args = (self._static, plan, skipped)
        self._calls += 1
        if skipped.device.type != "cuda":
            out = self._fn(*args)
        elif self._calls <= 3:  # warm-up calls (they compile) on a side stream, as torch's docs
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                out = self._fn(*args)
            torch.cuda.current_stream().wait_stream(stream)
        else:
            if self._graph is None:
                self._graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self._graph):
                    self._out = self._fn(*args)
            self._graph.replay()
            out = nest.map_structure(torch.clone, self._out)  # the graph's are overwritten
        if controller is not None:
            report(controller)
        return out

    def _plan(self) -> List[tuple]:
        """Per Adam group: params, moments, steps, its lr as a tensor, its constants."""
        plan = []
        for opt in self._alg.optimizers():
            if isinstance(opt, FusedAdam):
                opt.schedule_lr()
            for group in opt.param_groups:
                params = [p for p in group["params"] if p.requires_grad]
                states = [_adam_state(opt, group, p) for p in params]
                plan.append(
                    (
                        params,
                        *([s[k] for s in states] for k in ("exp_avg", "exp_avg_sq", "step")),
                        self.set(id(group), group["lr"]),
                        group["betas"],
                        group["eps"],
                        group["weight_decay"],
                        bool(group.get("decoupled_weight_decay")),
                    )
                )
        return plan

    def set(self, key: Any, value: float) -> torch.Tensor:
        """Fill ``scalars[key]``, a 0-d tensor on the update's device, with ``value``."""
        scalar = self.scalars.get(key)
        if scalar is None or scalar.device != self._device:
            scalar = self.scalars[key] = torch.zeros((), device=self._device)
        return scalar.fill_(value)

    def _step(self, inputs: Any, plan: List[tuple], skipped: torch.Tensor) -> Tuple[Any, Any]:
        params = [p for group in plan for p in group[0]]
        names = {id(p): name for name, p in self._call.named_parameters()}
        nb = len(self._alg.batch_shape)

        def means(ps):
            out = torch.func.functional_call(
                self._call, {names[id(p)]: q for p, q in zip(params, ps)}, (inputs,)
            )
            rows, for_gradient, entropy, mask, extra = out
            mask = mask.to(rows.dtype)
            count = mask.flatten(nb).sum(-1).clamp(min=1.0)
            a = (rows * mask).flatten(nb).sum(-1) / count
            b = (-for_gradient * mask).flatten(nb).sum(-1) / count
            return (a, b), (entropy.detach(), mask, extra)

        (a, b), pullback, (entropy, mask, extra) = torch.func.vjp(
            means, [p.detach() for p in params], has_aux=True
        )
        alpha, loss = torch.zeros_like(a), a
        if self._coefficient is not None:
            alpha, extra = self._coefficient(entropy, mask, extra)
            loss = a + alpha * b
        grads = pullback((torch.ones_like(a), alpha))[0]
        ok = torch.isfinite(loss)
        with torch.no_grad():
            if self._clip is not None:
                ok = ok & torch.isfinite(clip_grads_(grads, self._clip, nb))
            start = 0
            for group in plan:
                _masked_adam(*group, grads[start : start + len(group[0])], ok, nb)
                start += len(group[0])
            skipped.add_((~ok).to(skipped.dtype))
            self._after()
        return loss.detach(), extra


def device_update(controller: Any, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``controller``'s update from ``entropy``'s masked mean as its tensor step, the new alpha
    (``entropy_loss``'s without the target's refresh and the report, which stay outside)."""
    mean, count = member_mean(entropy.detach(), mask, len(controller.batch_shape))
    restart = torch.zeros_like(count, dtype=torch.bool)
    controller.driver.step(
        controller.rule, controller.consts, Inputs(mean.to(torch.float32), count, restart)
    )
    return controller.alpha


def _adam_state(opt: torch.optim.Optimizer, group: dict, p: torch.Tensor) -> dict:
    """``p``'s Adam state as torch makes it at the first step, its step on ``p``'s device."""
    state = opt.state[p]
    if not state:
        members = getattr(opt, "num_members", None)
        state["step"] = torch.zeros(() if members is None else members, device=p.device)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    if state["step"].device != p.device:  # a non-fused Adam's: capturable from now on
        state["step"] = state["step"].to(p.device)
        group["capturable"] = True
    return state


def _masked_adam(
    params, exp_avgs, exp_avg_sqs, steps, lr, betas, eps, weight_decay, decoupled, grads, ok, nb
):
    """``torch.optim.adam.adam`` (per member for K), each member's values kept where not ``ok``."""
    state = [params, exp_avgs, exp_avg_sqs, steps]
    old = [[x.clone() for x in xs] for xs in state]
    for m in range(ok.shape[0]) if nb else [None]:
        lists = [
            [x.detach() if m is None else x.detach()[m] for x in xs]
            for xs in (params, grads, exp_avgs, exp_avg_sqs, steps)
        ]
        adam(
            *lists[:4],
            [],
            lists[4],
            foreach=False,
            capturable=True,
            decoupled_weight_decay=decoupled,
            amsgrad=False,
            beta1=betas[0],
            beta2=betas[1],
            lr=lr,
            weight_decay=weight_decay,
            eps=eps,
            maximize=False,
        )
    for xs, olds in zip(state, old):
        for x, x_old in zip(xs, olds):
            x.detach().copy_(torch.where(ok.reshape(ok.shape + (1,) * (x.dim() - nb)), x, x_old))


def rsample_with(dist: td.Distribution, eps: torch.Tensor) -> torch.Tensor:
    """``dist.rsample()`` from its standard-normal draws ``eps`` (``td.Normal``'s arithmetic,
    then the transforms): a Normal, maybe ``Independent``, maybe transformed."""
    base = dist.base_dist if isinstance(dist, td.TransformedDistribution) else dist
    normal = base.base_dist if isinstance(base, td.Independent) else base
    if not isinstance(normal, td.Normal):
        raise TypeError(f"compile_update needs a Normal policy (maybe squashed), got {dist!r}")
    x = normal.loc + eps.reshape(normal.batch_shape) * normal.scale
    for transform in getattr(dist, "transforms", ()):
        x = transform(x)
    return x
