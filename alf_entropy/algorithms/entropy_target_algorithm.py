"""ALF's entropy controllers at their ALF import path (see ``alf_entropy.controllers``)."""
from alf_entropy.controllers.alf import EntropyTargetInfo, EntropyTargetLossInfo
from alf_entropy.controllers.base import EntropyController
from alf_entropy.controllers.fixed import FixedEntropyCoefficient
from alf_entropy.controllers.nested import NestedEntropyTargetAlgorithm
from alf_entropy.controllers.sgd import SGDEntropyTargetAlgorithm
from alf_entropy.controllers.staged import STUCK_UPDATES, EntropyTargetAlgorithm, describe_stage

__all__ = ["EntropyTargetLossInfo", "EntropyTargetInfo", "EntropyController",
           "EntropyTargetAlgorithm", "FixedEntropyCoefficient", "NestedEntropyTargetAlgorithm",
           "SGDEntropyTargetAlgorithm", "describe_stage", "STUCK_UPDATES"]
