"""Configs: the package's gin configurables, registered in one module (``configurables``),
and loading configs as ``alf-entropy-train`` does (``loading``)."""

import os

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
"""The directory of the shipped ``.gin`` files (the package's ``configs/``)."""
