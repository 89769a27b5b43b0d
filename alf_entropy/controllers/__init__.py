"""The entropy controllers: a named state plus a pure rule, run by one driver.

* ``rules.py``: every control law over one ops namespace (host or tensor);
* ``state.py``: the rules' named states and constants, kept in buffers;
* ``target.py``: the target entropy (constant, scheduled, annealed, per member);
* ``base.py``: ``EntropyController`` and its one driver;
* ``alf.py``: ALF's sub-algorithm protocol (``rollout_step``/``train_step``/``calc_loss``);
* ``staged.py`` (ALF's rule), ``pid.py``, ``sgd.py`` (SAC's), ``fixed.py``, ``nested.py``.
"""
from alf_entropy.controllers.alf import EntropyTargetInfo, EntropyTargetLossInfo
from alf_entropy.controllers.base import UPDATE_MODES, EntropyController
from alf_entropy.controllers.fixed import FixedEntropyCoefficient
from alf_entropy.controllers.nested import NestedEntropyTargetAlgorithm
from alf_entropy.controllers.pid import PIDEntropyTargetAlgorithm
from alf_entropy.controllers.sgd import SGDEntropyTargetAlgorithm
from alf_entropy.controllers.staged import EntropyTargetAlgorithm, describe_stage

__all__ = ["EntropyController", "EntropyTargetAlgorithm", "PIDEntropyTargetAlgorithm",
           "SGDEntropyTargetAlgorithm", "NestedEntropyTargetAlgorithm", "FixedEntropyCoefficient",
           "EntropyTargetInfo", "EntropyTargetLossInfo", "UPDATE_MODES", "describe_stage"]
