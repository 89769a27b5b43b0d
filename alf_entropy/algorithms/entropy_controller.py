"""An alias of ``alf_entropy.controllers`` (the earlier path of the controllers' interface)."""
from alf_entropy.controllers import *  # noqa: F401,F403
from alf_entropy.controllers import __all__  # noqa: F401
