"""Configs: the package's gin configurables, registered in one module (``configurables``),
loading configs as ``alf-entropy-train`` does (``loading``), and gin text's bindings read,
written and checked for use (``bindings``)."""

import os

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
"""The directory of the shipped ``.gin`` files (the package's ``configs/``)."""
