"""An alias of ``alf_entropy.controllers`` at ALF's import path
(``alf.algorithms.entropy_target_algorithm``)."""

from alf_entropy.controllers import *  # noqa: F401,F403
from alf_entropy.controllers import __all__  # noqa: F401
