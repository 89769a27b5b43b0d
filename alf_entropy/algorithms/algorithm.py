"""``Algorithm``: the base class every learner and sub-learner derives from.

As in ALF, an algorithm is an ``nn.Module`` with ``predict_step`` (acting for
evaluation), ``rollout_step`` (acting while collecting; its ``info`` is kept),
``train_step`` (recomputing with gradients) and ``calc_loss``.  Algorithms compose: an
``Algorithm`` attribute of another (e.g. a controller inside ``PPOAlgorithm``) is a
sub-algorithm, part of its ``parameters()`` and ``state_dict()``.

Optimisers: an algorithm may own one (a factory ``params -> Optimizer``, bound in gin as
``@torch.optim.Adam``, or an instance); it updates its own parameters and those of its
sub-algorithms without one.

One agent or K: ``batch_shape`` is ``()`` for one agent and ``(K,)`` for K agents
stacked in one module (``ManyAgents``): every tensor then leads with ``K``, and each
member has its own random generator (``generators``).  ``update_with_gradient`` is the
one gradient step of both: per member the masked mean of the loss, the gradient norm's
clipping and the skip of a non-finite update, without waiting for a GPU
(:func:`~alf_entropy.utils.optimizers.masked_optimizer_step`).
"""
import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.nn as nn
from torch.optim.adam import adam

from alf_entropy.controllers.driver import Inputs
from alf_entropy.controllers.ops import member_mean
from alf_entropy.controllers.watch import report
from alf_entropy.data_structures import AlgStep, LossInfo
from alf_entropy.utils import distributed, nest
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.optimizers import FusedAdam, clip_grad_norms_, masked_optimizer_step

__all__ = ["Algorithm", "CompiledUpdate", "OptimizerArg", "combine_loss_infos", "device_update"]

OptimizerArg = Optional[
    Union[torch.optim.Optimizer, Callable[[List[nn.Parameter]], torch.optim.Optimizer]]
]


def combine_loss_infos(main: LossInfo, **sub_losses: LossInfo) -> LossInfo:
    """Add the ``LossInfo`` of sub-algorithms to a main one.

    ``loss`` and ``scalar_loss`` are summed (empty ``()`` terms are skipped);
    ``extra`` becomes a dict holding the main ``extra`` under ``"main"`` (if
    any) and each sub-algorithm's ``extra`` under its keyword, so summaries
    keep every term apart.

    Args:
        main: the parent's own loss.
        **sub_losses: each sub-algorithm's loss, keyed by a name.

    Returns:
        LossInfo: the combined loss.
    """

    def _add(a: Any, b: Any) -> Any:
        if isinstance(a, tuple) and a == ():
            return b
        if isinstance(b, tuple) and b == ():
            return a
        return a + b

    loss, scalar_loss = main.loss, main.scalar_loss
    extra: Dict[str, Any] = {}
    if not (isinstance(main.extra, tuple) and main.extra == ()):
        extra["main"] = main.extra
    for name, sub in sub_losses.items():
        loss = _add(loss, sub.loss)
        scalar_loss = _add(scalar_loss, sub.scalar_loss)
        extra[name] = sub.extra
    return LossInfo(loss=loss, scalar_loss=scalar_loss, extra=extra, priority=main.priority)


class Algorithm(nn.Module):
    """Base class of all algorithms (see the module docstring).

    Args:
        optimizer: an optimiser factory ``params -> Optimizer`` or a built
            optimiser, or ``None`` to leave this algorithm's parameters to the
            parent's optimiser.
        debug_summaries: whether to write debug summaries.
        name: the name, used as the summary scope.
        batch_shape: ``()`` for one agent, ``(K,)`` for K stacked agents.
    """

    def __init__(
        self,
        optimizer: OptimizerArg = None,
        debug_summaries: bool = False,
        name: str = "Algorithm",
        batch_shape: Tuple[int, ...] = (),
    ):
        super().__init__()
        if not isinstance(batch_shape, (tuple, list)) or len(batch_shape) > 1:
            raise ValueError(f"batch_shape must be () or (K,), got {batch_shape!r}")
        self._members = tuple(check_int("batch_shape[0]", k, minimum=1) for k in batch_shape)
        self._generators: Optional[List[torch.Generator]] = None
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        self._name = name
        self._debug_summaries = bool(debug_summaries)
        self._optimizer_arg = optimizer
        self._optimizer: Optional[torch.optim.Optimizer] = (
            optimizer if isinstance(optimizer, torch.optim.Optimizer) else None
        )
        self._on_policy: Optional[bool] = None
        self._parent_optimizer: Optional[torch.optim.Optimizer] = None
        self._fixed: Optional[Tuple[list, list]] = None  # (optimizers, subs) in ``fixed_tree``

    # ------------------------------------------------------------------ info
    @property
    def name(self) -> str:
        """The algorithm's name (its summary scope)."""
        return self._name

    @property
    def debug_summaries(self) -> bool:
        """Whether debug summaries are written."""
        return self._debug_summaries

    @property
    def on_policy(self) -> Optional[bool]:
        """True/False once set by ``set_on_policy``; ``None`` before."""
        return self._on_policy

    @property
    def parent_optimizer(self) -> Optional[torch.optim.Optimizer]:
        """The ancestor's optimiser that trains this algorithm's parameters.

        Set when the ancestor's ``optimizers()`` is built; None for an
        algorithm with its own optimiser or outside any tree.
        """
        return self._parent_optimizer

    @property
    def batch_shape(self) -> Tuple[int, ...]:
        """``()`` for one agent, ``(K,)`` for K stacked agents."""
        return self._members

    @property
    def generators(self) -> Optional[List[torch.Generator]]:
        """Each member's random generator; None: torch's default one (one agent)."""
        return self._generators

    def use_generators(self, generators: Optional[List[torch.Generator]]) -> None:
        """Draw member ``k``'s random numbers from ``generators[k]`` (None: torch's)."""
        self._generators = None if generators is None else list(generators)

    def set_on_policy(self, on_policy: bool) -> None:
        """Declare whether training is on-policy; propagates to sub-algorithms.

        Args:
            on_policy: True for on-policy training (rollout infos are trained
                on directly), False for off-policy.

        Raises:
            ValueError: if it was already set to the other value.
        """
        on_policy = bool(on_policy)
        if self._on_policy is not None and self._on_policy != on_policy:
            raise ValueError(
                f"{self._name}: on_policy is already {self._on_policy}; it can be "
                "set only once"
            )
        self._on_policy = on_policy
        for alg in self.sub_algorithms():
            alg.set_on_policy(on_policy)

    @contextlib.contextmanager
    def fixed_tree(self) -> Iterator[None]:
        """Within the block (an unroll's updates) ``optimizers()`` and ``sub_algorithms()`` are
        the ones at its start: the tree is walked once, not at every update."""
        outer, self._fixed = self._fixed, None
        self._fixed = (self.optimizers(), self.sub_algorithms())
        try:
            yield
        finally:
            self._fixed = outer

    def sub_algorithms(self) -> List["Algorithm"]:
        """The nearest ``Algorithm`` descendants (through plain modules too)."""
        if self._fixed is not None:
            return list(self._fixed[1])
        subs: List[Algorithm] = []

        def _walk(module: nn.Module) -> None:
            for child in module.children():
                if isinstance(child, Algorithm):
                    subs.append(child)
                else:
                    _walk(child)

        _walk(self)
        return subs

    # ---------------------------------------------------------------- steps
    def predict_step(self, inputs: Any, state: Any = ()) -> AlgStep:
        """Act for evaluation. Defaults to ``rollout_step``.

        Args:
            inputs: the input (usually a ``TimeStep``).
            state: the algorithm's recurrent state.

        Returns:
            AlgStep: ``output`` is the action.
        """
        return self.rollout_step(inputs, state)

    def rollout_step(self, inputs: Any, state: Any = ()) -> AlgStep:
        """Act while collecting experience. Defaults to ``train_step``.

        Args:
            inputs: the input (usually a ``TimeStep``).
            state: the algorithm's recurrent state.

        Returns:
            AlgStep: ``info`` is kept for training.
        """
        return self.train_step(inputs, state)

    def train_step(self, inputs: Any, state: Any = (), rollout_info: Any = ()) -> AlgStep:
        """Compute what ``calc_loss`` needs, with gradients.

        Args:
            inputs: the input (usually a ``TimeStep`` or ``Experience``).
            state: the algorithm's recurrent state.
            rollout_info: the info from ``rollout_step`` for this step.

        Returns:
            AlgStep: ``info`` is passed to ``calc_loss``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement train_step")

    def calc_loss(self, info: Any) -> LossInfo:
        """Turn training infos into a ``LossInfo``.

        Args:
            info: the ``info`` of ``train_step`` (batched over time).

        Returns:
            LossInfo: the loss to minimise.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement calc_loss")

    def after_update(self, *args: Any, **kwargs: Any) -> None:
        """Called after each gradient update; calls the sub-algorithms'."""
        for alg in self.sub_algorithms():
            alg.after_update(*args, **kwargs)

    # ------------------------------------------------------------ optimisers
    def _own_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters that are not inside an optimiser-owning sub-algorithm."""
        seen = set()

        def _walk(module: nn.Module) -> Iterator[nn.Parameter]:
            for p in module.parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p
            for child in module.children():
                if isinstance(child, Algorithm) and child._optimizer_arg is not None:
                    continue
                yield from _walk(child)

        return _walk(self)

    def optimizers(self) -> List[torch.optim.Optimizer]:
        """All optimisers of this algorithm tree, creating them on first use.

        Returns:
            The list of optimisers (this algorithm's first, if it has one).

        Raises:
            ValueError: if some trainable parameter has no optimiser.
        """
        if self._fixed is not None:
            return list(self._fixed[0])
        return self._collect_optimizers(is_root=True)

    def _collect_optimizers(
        self, is_root: bool, inherited: Optional[torch.optim.Optimizer] = None
    ) -> List[torch.optim.Optimizer]:
        result: List[torch.optim.Optimizer] = []
        if self._optimizer_arg is not None:
            if self._optimizer is None:
                params = [p for p in self._own_parameters() if p.requires_grad]
                self._optimizer = self._optimizer_arg(params)
                if not isinstance(self._optimizer, torch.optim.Optimizer):
                    raise TypeError(
                        f"{self._name}: optimizer factory returned "
                        f"{type(self._optimizer).__name__}, not a torch Optimizer"
                    )
            result.append(self._optimizer)
            inherited = self._optimizer
        else:
            self._parent_optimizer = inherited
            orphans = is_root and [p for p in self._own_parameters() if p.requires_grad]
            if orphans:
                raise ValueError(
                    f"{self._name}: {len(orphans)} trainable parameters have no "
                    "optimizer; pass optimizer=... to this algorithm"
                )
        for alg in self.sub_algorithms():
            result.extend(alg._collect_optimizers(is_root=False, inherited=inherited))
        return result

    def update_with_gradient(
        self,
        loss_info: LossInfo,
        valid_masks: Optional[torch.Tensor] = None,
        max_grad_norm: Optional[float] = None,
        skipped_counter: Optional[torch.Tensor] = None,
    ) -> Tuple[LossInfo, List[nn.Parameter]]:
        """One gradient step on ``loss_info`` per member, skipped where it is not finite.

        Per member (the dims after ``batch_shape``): the mean of ``loss_info.loss`` (over
        ``valid_masks`` if given: ``sum(loss * mask) / max(sum(mask), 1)``, so a NaN even
        in an invalid row makes it NaN) plus ``scalar_loss``; gradients averaged over the
        ranks of a data-parallel run, clipped to ``max_grad_norm``; then every optimiser
        steps -- but not for a member whose loss, averaged gradients or gradient norm is
        not finite (its parameters and optimiser state keep their values), without a host
        read on a GPU.

        Args:
            loss_info: the loss from ``calc_loss``.
            valid_masks: optional float/bool mask of ``loss_info.loss``'s shape.
            max_grad_norm: clip each member's gradient norm to this if given.
            skipped_counter: an integer tensor of ``batch_shape``, incremented (on its
                device) where the update is skipped.

        Returns:
            ``(loss_info, params)``: ``loss`` replaced by the (detached) loss minimised,
            of ``batch_shape``, and the parameters updated.
        """
        loss, nb = loss_info.loss, len(self._members)
        if isinstance(loss, torch.Tensor):
            if valid_masks is not None:
                # Multiplied, not selected (utils.math_ops.masked_mean): a NaN in an
                # invalid row still reaches the weight gradients, so the loss must be
                # non-finite too and the update skipped.
                mask = valid_masks.to(loss.dtype)
                loss = ((loss * mask).flatten(nb).sum(-1)
                        / mask.flatten(nb).sum(-1).clamp(min=1.0))
            else:
                loss = loss.flatten(nb).mean(-1)
        else:
            loss = 0.0
        if isinstance(loss_info.scalar_loss, torch.Tensor):
            loss = loss + loss_info.scalar_loss
        if not isinstance(loss, torch.Tensor):
            raise ValueError(f"{self._name}: loss_info has neither loss nor scalar_loss")
        optimizers = self.optimizers()
        params = [p for opt in optimizers for g in opt.param_groups for p in g["params"]]
        for p in params:  # ``zero_grad(set_to_none=True)``, without its per-call overhead
            p.grad = None
        (loss.sum() if nb else loss).backward()
        # Data-parallel: every rank steps with the gradient averaged over all,
        # or skips (on every rank) if any rank's was not finite.
        finite = distributed.all_reduce_gradients_(params)
        ok = torch.isfinite(loss.detach()) if finite is None else finite
        if max_grad_norm is not None:
            ok = ok & torch.isfinite(clip_grad_norms_(params, max_grad_norm, nb))
        masked_optimizer_step(optimizers, ok, sync_free=loss.device.type != "cpu")
        if skipped_counter is not None:
            skipped_counter.add_((~ok).to(skipped_counter.device, skipped_counter.dtype))
        return loss_info._replace(loss=loss.detach()), params



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

    def __init__(self, alg: "Algorithm", terms: Callable, coefficient: Optional[Callable],
                 max_grad_norm: Optional[float], controller: Any = None,
                 after: Callable[[], None] = lambda: None,
                 refresh: Callable[[], None] = lambda: None):
        self._alg, self._terms, self._coefficient = alg, terms, coefficient
        self._clip, self._controller, self._after, self._refresh = (max_grad_norm, controller,
                                                                     after, refresh)
        for opt in alg.optimizers():
            if not isinstance(opt, torch.optim.Adam) or any(
                    g["amsgrad"] or g["maximize"] for g in opt.param_groups):
                raise TypeError(f"{alg.name}: compile_update needs Adam optimisers (FusedAdam, "
                                f"torch.optim.Adam or AdamW) without amsgrad or maximize, got "
                                f"{type(opt).__name__}")
        self._call = _Call(alg, terms)
        self._fn = torch.compile(self._step, fullgraph=True, dynamic=False)
        self.scalars: Dict[Any, torch.Tensor] = {}
        self._static = self._graph = self._out = None
        self._key, self._calls = (), 0

    def __call__(self, inputs: Any, skipped: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        """One update on ``inputs``; ``skipped`` counts the skipped ones; ``(loss, extra)``."""
        if distributed.is_distributed():
            raise RuntimeError(f"{self._alg.name}: compile_update=True is for one process "
                               "(its gradients are not all-reduced); use compile_update=False")
        controller, self._device = self._controller, skipped.device
        if controller is not None:  # a scheduled target: fill_ from host floats
            controller._target.refresh(controller.driver.target)
        self._refresh()
        plan = self._plan()
        held = [t for t in nest.flatten((plan, list(self._alg.buffers())))
                if isinstance(t, torch.Tensor)]
        key = [t.data_ptr() for t in held] + [(x.shape, x.dtype, x.device)
                                              for x in nest.flatten(inputs)]
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
                opt._schedule_lr()
            for group in opt.param_groups:
                params = [p for p in group["params"] if p.requires_grad]
                states = [_adam_state(opt, group, p) for p in params]
                plan.append((params, *([s[k] for s in states] for k in (
                    "exp_avg", "exp_avg_sq", "step")), self.set(id(group), group["lr"]),
                    group["betas"], group["eps"],
                    group["weight_decay"], bool(group.get("decoupled_weight_decay"))))
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
                self._call, {names[id(p)]: q for p, q in zip(params, ps)}, (inputs,))
            rows, for_gradient, entropy, mask, extra = out
            mask = mask.to(rows.dtype)
            count = mask.flatten(nb).sum(-1).clamp(min=1.0)
            a = (rows * mask).flatten(nb).sum(-1) / count
            b = (-for_gradient * mask).flatten(nb).sum(-1) / count
            return (a, b), (entropy.detach(), mask, extra)

        (a, b), pullback, (entropy, mask, extra) = torch.func.vjp(
            means, [p.detach() for p in params], has_aux=True)
        alpha, loss = torch.zeros_like(a), a
        if self._coefficient is not None:
            alpha, extra = self._coefficient(entropy, mask, extra)
            loss = a + alpha * b
        grads = pullback((torch.ones_like(a), alpha))[0]
        ok = torch.isfinite(loss)
        with torch.no_grad():
            if self._clip is not None:
                norms = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(
                    g, dim=tuple(range(nb, g.dim())) if nb else None) for g in grads]), dim=0)
                ok = ok & torch.isfinite(norms)
                coef = (self._clip / (norms + 1e-6)).clamp(max=1.0)
                grads = [g * coef.reshape(coef.shape + (1,) * (g.dim() - nb)) for g in grads]
            start = 0
            for group in plan:
                _masked_adam(*group, grads[start:start + len(group[0])], ok, nb)
                start += len(group[0])
            skipped.add_((~ok).to(skipped.dtype))
            self._after()
        return loss.detach(), extra


def device_update(controller: Any, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``controller``'s update from ``entropy``'s masked mean as its tensor step, the new alpha
    (``entropy_loss``'s without the target's refresh and the report, which stay outside)."""
    mean, count = member_mean(entropy.detach(), mask, len(controller.batch_shape))
    restart = torch.zeros_like(count, dtype=torch.bool)
    controller.driver.step(controller.rule, controller._consts,
                           Inputs(mean.to(torch.float32), count, restart))
    return controller.driver.log_alpha.exp()


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


def _masked_adam(params, exp_avgs, exp_avg_sqs, steps, lr, betas, eps, weight_decay, decoupled,
                 grads, ok, nb):
    """``torch.optim.adam.adam`` (per member for K), each member's values kept where not ``ok``."""
    state = [params, exp_avgs, exp_avg_sqs, steps]
    old = [[x.clone() for x in xs] for xs in state]
    for m in range(ok.shape[0]) if nb else [None]:
        lists = [[x.detach() if m is None else x.detach()[m] for x in xs]
                 for xs in (params, grads, exp_avgs, exp_avg_sqs, steps)]
        adam(*lists[:4], [], lists[4], foreach=False, capturable=True,
             decoupled_weight_decay=decoupled, amsgrad=False, beta1=betas[0], beta2=betas[1],
             lr=lr, weight_decay=weight_decay, eps=eps, maximize=False)
    for xs, olds in zip(state, old):
        for x, x_old in zip(xs, olds):
            x.detach().copy_(torch.where(ok.reshape(ok.shape + (1,) * (x.dim() - nb)), x, x_old))
