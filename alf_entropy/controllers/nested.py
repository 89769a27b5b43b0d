"""One controller per action of a nested action spec (ALF's ``NestedEntropyTargetAlgorithm``)."""

import functools
from typing import Any, Callable, Dict, Optional, Sequence

import torch
import torch.nn as nn

from alf_entropy.controllers.alf import AlfSubAlgorithm
from alf_entropy.controllers.base import EntropyController, arguments
from alf_entropy.controllers.staged import EntropyTargetAlgorithm
from alf_entropy.data_structures import LossInfo
from alf_entropy.utils import nest
from alf_entropy.utils.checks import is_real

__all__ = ["NestedEntropyTargetAlgorithm"]


class NestedEntropyTargetAlgorithm(AlfSubAlgorithm, nn.Module):
    """One controller per action leaf, on its own action's entropy (nests like the spec); the
    losses summed.  ``alpha`` is the leaves' mean, ``target_entropy`` and
    ``num_nonfinite_entropy`` the sum, ``stage`` the least advanced, ``unreachable_target`` any,
    ``settings`` the first leaf's.  Shared arguments: ``EntropyController``'s, for every leaf;

    Args:
        leaf_cls: the leaves' controller class.
        target_entropy: None (each leaf's default), a nest like ``action_spec``, or a list with
            one entry per leaf (``nest.flatten`` order).
        max_entropy: None, one number for every leaf, or a nest/list as ``target_entropy``.
        **leaf_settings: the leaf controller's own settings, shared.
    """

    NESTED = True

    def __init__(
        self,
        action_spec: Any,
        leaf_cls: Callable[..., EntropyController] = EntropyTargetAlgorithm,
        target_entropy: Any = None,
        max_entropy: Any = None,
        initial_alpha: float = 0.1,
        min_alpha: float = 1e-4,
        max_alpha: Optional[float] = None,
        max_alpha_change_per_iteration: Optional[float] = None,
        update_mode: str = "auto",
        batch_shape: Sequence[int] = (),
        debug_summaries: bool = False,
        name: str = "NestedEntropyTargetAlgorithm",
        **leaf_settings: Any,
    ):
        super().__init__()
        self.action_spec = action_spec
        self.batch_shape = tuple(batch_shape)
        self.name = name
        self.debug_summaries = debug_summaries
        shared = arguments(
            locals(),
            "action_spec",
            "leaf_cls",
            "target_entropy",
            "max_entropy",
            "name",
            "leaf_settings",
        )
        shared.update(leaf_settings)
        self._paths, specs = zip(*nest.flatten_with_path(action_spec))
        if is_real(max_entropy):
            max_entropy = [max_entropy] * len(self._paths)
        targets = self._per_leaf(target_entropy, "target_entropy")
        maxima = self._per_leaf(max_entropy, "max_entropy")
        # Keyed by path ("." is not allowed in module names): "_leaves.arm/grip.driver.log_alpha".
        self._leaves = nn.ModuleDict(
            (
                path.replace(".", "/") or "action",
                leaf_cls(
                    spec,
                    target_entropy=t,
                    name=f"{name}/{path}",
                    **(shared if m is None else dict(shared, max_entropy=m)),
                ),
            )
            for path, spec, t, m in zip(self._paths, specs, targets, maxima)
        )

    def _per_leaf(self, value, arg_name="entropy"):
        """``value`` as one entry per leaf: None, a nest like the spec, or a flat list."""
        if value is None:
            return [None] * len(self._paths)
        try:
            return nest.flatten_up_to(self.action_spec, value)
        except ValueError as e:
            if isinstance(value, (list, tuple)) and len(value) == len(self._paths):
                return list(value)
            raise ValueError(
                f"{arg_name} must be None, a nest shaped like action_spec or a list "
                f"with one entry per action ({len(self._paths)}): {e}"
            ) from e

    def leaf_algorithms(self) -> Dict[str, EntropyController]:
        """The per-leaf controllers keyed by their path in the action spec."""
        return dict(zip(self._paths, self._leaves.values()))

    def _each(self, fn):
        return [fn(leaf) for leaf in self._leaves.values()]

    def _stack(self, attr):
        return torch.stack(self._each(lambda c: getattr(c, attr)))

    @property
    def alpha(self) -> torch.Tensor:
        """The leaves' mean alpha."""
        return self._stack("alpha").mean(0)

    @property
    def log_alpha(self) -> torch.Tensor:
        """``log(alpha)``."""
        return self.alpha.log()

    @property
    def target_entropy(self) -> Any:
        """The sum of the leaves' targets."""
        return sum(self._each(lambda c: c.target_entropy))

    @property
    def settings(self) -> Dict[str, Any]:
        """The first leaf's settings."""
        return self._each(lambda c: c.settings)[0]

    @property
    def stage(self) -> torch.Tensor:
        """The least advanced leaf's stage."""
        return self._stack("stage").min(0).values

    @property
    def unreachable_target(self) -> torch.Tensor:
        """Whether any leaf's target is unreachable."""
        return self._stack("unreachable_target").any(0)

    @property
    def num_nonfinite_entropy(self) -> torch.Tensor:
        """The leaves' NaN/inf entropies."""
        return self._stack("num_nonfinite_entropy").sum(0)

    def configure(self, **changes: Any) -> None:
        """Change every leaf's settings."""
        self._each(lambda c: c.configure(**changes))

    def _zip(self, *nests):
        return zip(self._leaves.values(), *(self._per_leaf(n) for n in nests))

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

    def entropy_loss(
        self,
        entropy: Any,
        mask: Optional[torch.Tensor] = None,
        entropy_for_gradient: Any = None,
        update: bool = True,
    ) -> LossInfo:
        """Each leaf's ``entropy_loss`` on its own entropy (nests like the spec); summed."""
        grads = entropy if entropy_for_gradient is None else entropy_for_gradient
        losses = [
            leaf.entropy_loss(e, mask, g, update).loss for leaf, e, g in self._zip(entropy, grads)
        ]
        return LossInfo(loss=functools.reduce(torch.add, losses))
