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

from alf_entropy.data_structures import AlgStep, LossInfo
from alf_entropy.utils import distributed
from alf_entropy.utils.checks import check_batch_shape, check_name
from alf_entropy.utils.optimizers import clip_grad_norms_, masked_optimizer_step

__all__ = ["Algorithm", "OptimizerArg", "combine_loss_infos"]

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
        self._members = check_batch_shape(batch_shape)
        self._generators: Optional[List[torch.Generator]] = None
        self._name = check_name("name", name)
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
                f"{self._name}: on_policy is already {self._on_policy}; it can be set only once"
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
                loss = (loss * mask).flatten(nb).sum(-1) / mask.flatten(nb).sum(-1).clamp(min=1.0)
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
