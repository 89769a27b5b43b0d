"""The PID controller at its earlier import path (see ``alf_entropy.controllers.pid``)."""
from alf_entropy.controllers.pid import PIDEntropyTargetAlgorithm

__all__ = ["PIDEntropyTargetAlgorithm"]
