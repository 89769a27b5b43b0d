"""alf_entropy: ALF's EntropyTargetAlgorithm for any PyTorch RL code.

The package mirrors ALF's layout (``algorithms/``, ``networks/``,
``environments/``, ``trainers/``, ``utils/``) so that ALF users feel at home,
while staying a small dependency: torch, gin-config, gymnasium and optree.
"""
# gin-config 0.5.0 calls ``importlib.util.find_spec`` when an ``include`` names
# a missing file, but only imports ``importlib``; on Python 3.11 that raises
# ``AttributeError: module 'importlib' has no attribute 'util'`` instead of a
# clear "file not found".  Importing the submodule once makes it an attribute.
import importlib.util  # noqa: F401  (see comment above)

__version__ = "0.1.0"
