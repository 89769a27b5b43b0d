"""ALF's sub-algorithm protocol: the entropy of a distribution, the loss of its steps."""
import functools
from typing import Any, Optional, Tuple

import torch

from alf_entropy.algorithm import Algorithm
from alf_entropy.data_structures import AlgStep, Experience, LossInfo, StepType, namedtuple
from alf_entropy.utils import nest
from alf_entropy.utils.entropies import entropy_with_fallback

__all__ = ["EntropyTargetLossInfo", "EntropyTargetInfo", "AlfSubAlgorithm"]

EntropyTargetLossInfo = namedtuple("EntropyTargetLossInfo", ["neg_entropy"], default_value=())
"""``extra`` of a controller's ``LossInfo``: the per-step negative entropy."""
EntropyTargetInfo = namedtuple("EntropyTargetInfo", ["loss"], default_value=())
"""``info`` of a controller's ``rollout_step``/``train_step``."""

neg = functools.partial(nest.map_structure, torch.neg)


class AlfSubAlgorithm(Algorithm):
    """The ALF steps over a subclass's ``action_spec`` and ``_loss`` (on negated entropies)."""

    def predict_step(self, *args: Any, **kwargs: Any) -> AlgStep:
        """Nothing to do when acting for evaluation."""
        return AlgStep()

    def rollout_step(self, distribution: Any, step_type: Any = None,
                     on_policy_training: bool = True) -> AlgStep:
        """``train_step`` when training on-policy, else an empty ``AlgStep``."""
        return self.train_step(distribution, step_type) if on_policy_training else AlgStep()

    def train_step(self, distribution: Any, step_type: Any = None) -> AlgStep:
        """``entropy_step`` of the policy's distribution."""
        return self.entropy_step(*self._entropy(distribution))

    def entropy_step(self, entropy: Any, entropy_for_gradient: Any) -> AlgStep:
        """The info: loss ``-entropy_for_gradient``, ``extra.neg_entropy`` ``-entropy``."""
        ne = neg(entropy)  # negated once where both are one
        return AlgStep(info=EntropyTargetInfo(loss=LossInfo(extra=EntropyTargetLossInfo(ne), loss=(
            ne if entropy_for_gradient is entropy else neg(entropy_for_gradient)))))

    def _entropy(self, distribution: Any) -> Tuple[Any, Any]:
        return entropy_with_fallback(distribution, action_spec=self.action_spec)

    def calc_loss(self, experience: Experience, info: Any,
                  valid_mask: Optional[torch.Tensor] = None) -> LossInfo:
        """``entropy_loss`` of ``train_step``'s stacked ``info`` over valid steps not ``LAST``."""
        mask = experience.step_type != StepType.LAST
        if valid_mask is not None:
            try:
                mask = mask & (valid_mask != 0)
            except RuntimeError as e:
                raise ValueError(f"valid_mask of shape {tuple(valid_mask.shape)} does not broadcast"
                                 f" with experience.step_type of shape {tuple(mask.shape)}") from e
        return self._loss(info.loss.extra.neg_entropy, mask, info.loss.loss, True)
