"""The entropy controllers, each a named state and a pure rule (``staged``, ``pid``,
``linear_pid``, ``sgd``, ``fixed``; ``nested`` composes them) run by one driver (``driver``,
``ops``, ``target``, ``watch``); ``base`` is their interface, ``alf`` ALF's protocol."""

from alf_entropy.controllers.alf import EntropyTargetInfo, EntropyTargetLossInfo
from alf_entropy.controllers.base import EntropyController
from alf_entropy.controllers.driver import MAX_ALPHA, UPDATE_MODES
from alf_entropy.controllers.fixed import FixedEntropyCoefficient
from alf_entropy.controllers.linear_pid import LinearPIDEntropyTargetAlgorithm
from alf_entropy.controllers.nested import NestedEntropyTargetAlgorithm
from alf_entropy.controllers.pid import PIDEntropyTargetAlgorithm
from alf_entropy.controllers.sgd import SGDEntropyTargetAlgorithm
from alf_entropy.controllers.staged import STUCK_UPDATES, EntropyTargetAlgorithm, describe_stage
from alf_entropy.controllers.target import PROGRESS_GRACE
from alf_entropy.controllers.watch import WATCH_EMA, WINDUP_WINDOW

__all__ = [
    "EntropyController",
    "EntropyTargetAlgorithm",
    "PIDEntropyTargetAlgorithm",
    "SGDEntropyTargetAlgorithm",
    "NestedEntropyTargetAlgorithm",
    "FixedEntropyCoefficient",
    "LinearPIDEntropyTargetAlgorithm",
    "EntropyTargetInfo",
    "EntropyTargetLossInfo",
    "UPDATE_MODES",
    "WINDUP_WINDOW",
    "WATCH_EMA",
    "PROGRESS_GRACE",
    "STUCK_UPDATES",
    "MAX_ALPHA",
    "describe_stage",
]
