"""The entropy controllers: each a named state and a pure rule, run by one driver.

``ops.py`` (the ops a rule is written in), ``target.py`` (the target entropy), ``driver.py``
(one update on the host or on tensors), ``base.py`` (the interface and shared arguments),
``alf.py`` (ALF's ``rollout_step``/``train_step``/``calc_loss``); the rules: ``staged.py``
(ALF's), ``pid.py``, ``linear_pid.py``, ``sgd.py`` (SAC's), ``fixed.py``, ``nested.py``.
"""
from alf_entropy.controllers.alf import EntropyTargetInfo, EntropyTargetLossInfo
from alf_entropy.controllers.base import UPDATE_MODES, EntropyController
from alf_entropy.controllers.fixed import FixedEntropyCoefficient
from alf_entropy.controllers.linear_pid import LinearPIDEntropyTargetAlgorithm
from alf_entropy.controllers.nested import NestedEntropyTargetAlgorithm
from alf_entropy.controllers.pid import PIDEntropyTargetAlgorithm
from alf_entropy.controllers.sgd import SGDEntropyTargetAlgorithm
from alf_entropy.controllers.staged import STUCK_UPDATES, EntropyTargetAlgorithm, describe_stage
from alf_entropy.controllers.target import PROGRESS_GRACE
from alf_entropy.controllers.watch import WATCH_EMA, WINDUP_WINDOW

__all__ = ["EntropyController", "EntropyTargetAlgorithm", "PIDEntropyTargetAlgorithm",
           "SGDEntropyTargetAlgorithm", "NestedEntropyTargetAlgorithm", "FixedEntropyCoefficient",
           "LinearPIDEntropyTargetAlgorithm",
           "EntropyTargetInfo", "EntropyTargetLossInfo", "UPDATE_MODES", "WINDUP_WINDOW",
           "WATCH_EMA", "PROGRESS_GRACE", "STUCK_UPDATES", "describe_stage"]
