"""The controllers' shared interface at its earlier import path (``alf_entropy.controllers``)."""
from alf_entropy.controllers.alf import EntropyTargetInfo, EntropyTargetLossInfo
from alf_entropy.controllers.base import UPDATE_MODES, EntropyController
from alf_entropy.controllers.fixed import FixedEntropyCoefficient
from alf_entropy.controllers.rules import WATCH_EMA, WINDUP_WINDOW
from alf_entropy.controllers.target import PROGRESS_GRACE, Target

__all__ = ["EntropyTargetLossInfo", "EntropyTargetInfo", "EntropyController",
           "FixedEntropyCoefficient", "Target", "UPDATE_MODES", "PROGRESS_GRACE", "WATCH_EMA",
           "WINDUP_WINDOW"]
