"""One controller per action of a nested action spec (ALF's ``NestedEntropyTargetAlgorithm``)."""
import functools
from typing import Any, Callable, Dict, List, Optional, Sequence

import gin
import torch
import torch.nn as nn

from alf_entropy.algorithm import Algorithm
from alf_entropy.controllers.base import EntropyController
from alf_entropy.controllers.staged import EntropyTargetAlgorithm
from alf_entropy.data_structures import LossInfo
from alf_entropy.utils import nest
from alf_entropy.utils.checks import is_real
from alf_entropy.utils.entropies import entropy_with_fallback

__all__ = ["NestedEntropyTargetAlgorithm"]


@gin.configurable
class NestedEntropyTargetAlgorithm(EntropyController):
    """One controller per action leaf: each sees only its own action's entropy (a discrete
    "which tool" and a continuous "how hard" keep their own targets); the losses are summed.

    The common properties aggregate: ``alpha`` the mean over the leaves, ``target_entropy``
    the sum, ``stage`` the least advanced, ``unreachable_target`` any, ``num_nonfinite_entropy``
    the sum; ``leaf_algorithms()`` gives each leaf.  Entropy arguments are nests like the spec.

    The shared arguments are ``EntropyController``'s, passed to every leaf; its own:

    Args:
        leaf_cls: each leaf's controller class.
        target_entropy: None (each leaf's default), a nest like ``action_spec``, or a list with
            one entry per leaf (``nest.flatten`` order).
        max_entropy: None, one number for every leaf, or a nest/list as ``target_entropy``.
        **leaf_settings: the leaf controller's own settings, shared.
    """

    def __init__(self, action_spec: Any,
                 leaf_cls: Callable[..., EntropyController] = EntropyTargetAlgorithm,
                 target_entropy: Any = None, max_entropy: Any = None,
                 initial_alpha: float = 0.1, min_alpha: float = 1e-4,
                 max_alpha: Optional[float] = None, update_mode: str = "auto",
                 batch_shape: Sequence[int] = (), debug_summaries: bool = False,
                 name: str = "NestedEntropyTargetAlgorithm", **leaf_settings: Any):
        Algorithm.__init__(self, debug_summaries=debug_summaries, name=name)
        self._action_spec, self._batch = action_spec, tuple(batch_shape)
        self._paths = [p for p, _ in nest.flatten_with_path(action_spec)]
        specs = nest.flatten(action_spec)
        if is_real(max_entropy):
            max_entropy = [max_entropy] * len(specs)
        shared = dict(leaf_settings, initial_alpha=initial_alpha, min_alpha=min_alpha,
                      max_alpha=max_alpha, update_mode=update_mode, batch_shape=batch_shape,
                      debug_summaries=debug_summaries)
        # Keyed by path ("." is not allowed in module names): "_leaves.arm/grip._log_alpha".
        self._leaves = nn.ModuleDict(
            (path.replace(".", "/") or "action",
             leaf_cls(spec, target_entropy=t, name=f"{name}/{path}",
                      **(shared if m is None else dict(shared, max_entropy=m))))
            for path, spec, t, m in zip(self._paths, specs, self._per_leaf(target_entropy,
                                        "target_entropy"), self._per_leaf(max_entropy,
                                                                          "max_entropy")))

    def _per_leaf(self, value: Any, arg_name: str = "entropy") -> List[Any]:
        """``value`` as one entry per leaf: None, a nest like the spec, or a flat list."""
        if value is None:
            return [None] * len(self._paths)
        try:
            return nest.flatten_up_to(self._action_spec, value)
        except ValueError as e:
            if isinstance(value, (list, tuple)) and len(value) == len(self._paths):
                return list(value)
            raise ValueError(f"{arg_name} must be None, a nest shaped like action_spec or a list "
                             f"with one entry per action ({len(self._paths)}): {e}") from e

    def leaf_algorithms(self) -> Dict[str, EntropyController]:
        """The per-leaf controllers keyed by their path in the action spec."""
        return dict(zip(self._paths, self._leaves.values()))

    def _each(self, fn: Callable[[EntropyController], Any]) -> List[Any]:
        return [fn(leaf) for leaf in self._leaves.values()]

    @property
    def alpha(self) -> torch.Tensor:
        """The mean ``alpha`` over the leaves."""
        return torch.stack(self._each(lambda c: c.alpha)).mean(0)

    @property
    def log_alpha(self) -> torch.Tensor:
        return self.alpha.log()

    @property
    def target_entropy(self) -> float:
        """The sum of the leaves' targets (comparable with the total entropy)."""
        return sum(self._each(lambda c: c.target_entropy))

    @property
    def settings(self) -> Dict[str, Any]:
        """The first leaf's settings (``configure`` changes every leaf's)."""
        return self._each(lambda c: c.settings)[0]

    @property
    def stage(self) -> torch.Tensor:
        return torch.stack(self._each(lambda c: c.stage)).min(0).values

    @property
    def unreachable_target(self) -> torch.Tensor:
        return torch.stack(self._each(lambda c: c.unreachable_target)).any(0)

    @property
    def num_nonfinite_entropy(self) -> torch.Tensor:
        return torch.stack(self._each(lambda c: c.num_nonfinite_entropy)).sum(0)

    def configure(self, **changes: Any) -> None:
        self._each(lambda c: c.configure(**changes))

    def limit_log_alpha_span(self, span: Optional[float]) -> None:
        self._each(lambda c: c.limit_log_alpha_span(span))

    def _entropy(self, distribution: Any) -> Any:
        return entropy_with_fallback(distribution, return_sum=False, action_spec=self._action_spec)

    def _zip(self, *nests: Any) -> List[Any]:
        return list(zip(self._leaves.values(), *(self._per_leaf(n) for n in nests)))

    def adjust_alpha(self, entropy: Any) -> torch.Tensor:
        """Each leaf advances once with its own entropy (a nest); the mean ``alpha``."""
        for leaf, e in self._zip(entropy):
            leaf.adjust_alpha(e)
        return self.alpha

    def accumulate(self, entropy: Any, mask: Optional[torch.Tensor] = None) -> None:
        for leaf, e in self._zip(entropy):
            leaf.accumulate(e, mask)

    def step(self) -> torch.Tensor:
        self._each(lambda c: c.step())
        return self.alpha

    def _loss(self, neg_entropy: Any, mask: Optional[torch.Tensor], neg_grad: Any,
              update: bool) -> LossInfo:
        """Each leaf's loss on its own entropy; ``loss`` summed, ``extra`` a nest."""
        losses = [leaf._loss(e, mask, g, update) for leaf, e, g in self._zip(neg_entropy, neg_grad)]
        return LossInfo(loss=functools.reduce(torch.add, [li.loss for li in losses]),
                        scalar_loss=functools.reduce(torch.add, [li.scalar_loss for li in losses]),
                        extra=nest.pack_sequence_as(self._action_spec, [li.extra for li in losses]))
