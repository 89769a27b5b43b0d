"""ALF's sub-algorithm protocol, as ALF's ``Agent`` calls it: the one place where the entropy
travels negated (``neg_entropy``, as ALF's infos hold it)."""

import functools
from typing import Any, Dict, Optional, Tuple

import torch

from alf_entropy.data_structures import AlgStep, LossInfo, StepType, namedtuple
from alf_entropy.tensor_specs import from_gym_space
from alf_entropy.utils import nest
from alf_entropy.utils.dist_utils import entropy_with_fallback

__all__ = ["EntropyTargetLossInfo", "EntropyTargetInfo", "AlfSubAlgorithm"]

EntropyTargetLossInfo = namedtuple("EntropyTargetLossInfo", ["neg_entropy"], default_value=())
"""``extra`` of ``calc_loss``'s ``LossInfo``: the per-step negative entropy."""
EntropyTargetInfo = namedtuple("EntropyTargetInfo", ["step_type", "loss"], default_value=())
"""``info`` of ``rollout_step``/``train_step``: the steps' types and their ``LossInfo``."""

_neg = functools.partial(nest.map_structure, torch.neg)


class AlfSubAlgorithm:
    """ALF's steps over a controller's ``entropy`` and ``entropy_loss``; and what every
    controller, nested too, shares: ``from_space``, ``entropy``, ``leaf_algorithms``."""

    on_policy: Optional[bool] = None
    """Whether the parent trains on-policy (``rollout_step`` then trains too), as ALF's."""

    @classmethod
    def from_space(cls, space: Any, **kwargs: Any) -> Any:
        """``cls(from_gym_space(space), **kwargs)`` for a gymnasium space or a TorchRL spec."""
        return cls(from_gym_space(space), **kwargs)

    NESTED = False
    """Whether the entropies are one a leaf, nested like the spec (else summed)."""

    def entropy(self, distribution: Any) -> Tuple[Any, Any]:
        """``(entropy, entropy_for_gradient)`` of the policy's distribution, as
        ``entropy_loss`` takes them."""
        return entropy_with_fallback(
            distribution, return_sum=not self.NESTED, action_spec=self.action_spec
        )

    def leaf_algorithms(self) -> Dict[str, Any]:
        """The per-action controllers by path in the spec (``{"": self}`` unless nested)."""
        return {"": self}

    def set_on_policy(self, is_on_policy: bool) -> None:
        """Set ``on_policy`` (the parent algorithm does)."""
        self.on_policy = is_on_policy

    def predict_step(self, inputs: Any, state: Any = None) -> AlgStep:
        """Nothing to do when acting for evaluation."""
        return AlgStep()

    def rollout_step(self, inputs: Tuple[Any, torch.Tensor], state: Any = None) -> AlgStep:
        """``train_step`` when training on-policy, else an empty ``AlgStep``."""
        return self.train_step(inputs) if self.on_policy else AlgStep()

    def train_step(
        self, inputs: Tuple[Any, torch.Tensor], state: Any = None, rollout_info: Any = None
    ) -> AlgStep:
        """``inputs = (distribution, step_type)``: the info ``calc_loss`` takes."""
        distribution, step_type = inputs
        entropy, for_gradient = self.entropy(distribution)
        loss = LossInfo(loss=_neg(for_gradient), extra=EntropyTargetLossInfo(_neg(entropy)))
        return AlgStep(output=(), state=(), info=EntropyTargetInfo(step_type, loss))

    def calc_loss(
        self, info: EntropyTargetInfo, valid_mask: Optional[torch.Tensor] = None
    ) -> LossInfo:
        """One update from the entropy of the valid steps not ``LAST``; ``-alpha * entropy``."""
        mask = info.step_type != StepType.LAST
        if valid_mask is not None:
            try:
                mask = mask & (valid_mask != 0)
            except RuntimeError as e:
                raise ValueError(
                    f"valid_mask of shape {tuple(valid_mask.shape)} does not "
                    f"broadcast with step_type of shape {tuple(mask.shape)}"
                ) from e
        loss = self.entropy_loss(_neg(info.loss.extra.neg_entropy), mask, _neg(info.loss.loss))
        return loss._replace(extra=info.loss.extra)
