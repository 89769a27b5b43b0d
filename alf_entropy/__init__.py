"""alf_entropy: ALF's EntropyTargetAlgorithm for any PyTorch RL code.

The package mirrors ALF's layout (``algorithms/``, ``networks/``,
``environments/``, ``trainers/``, ``utils/``) so that ALF users feel at home,
while staying a small dependency: the controller needs torch, gin-config,
absl-py, tensorboard, numpy and optree (and works next to any gymnasium, or
none); the trainers need the ``train`` extra (``gymnasium>=1.1``, ``tqdm``).

The public API is importable from here; ``import alf_entropy`` itself stays
light (each name is imported on first use):

Examples:
    >>> import torch
    >>> import alf_entropy as ae
    >>> controller = ae.EntropyTargetAlgorithm(
    ...     ae.BoundedTensorSpec((), torch.int64, 0, 3), target_entropy=0.5)
    >>> controller.target_entropy
    0.5
    >>> sorted(set(ae.__all__) - set(dir(ae)))
    []
"""

# gin-config 0.5.0 calls ``importlib.util.find_spec`` when an ``include`` names
# a missing file, but only imports ``importlib``; on Python 3.11 that raises
# ``AttributeError: module 'importlib' has no attribute 'util'`` instead of a
# clear "file not found".  Importing the submodule once makes it an attribute.
import importlib
import importlib.util  # noqa: F401  (see comment above)
from typing import Any, Dict, List

__version__ = "0.1.0"

# Public name -> the module that defines it.  None of these modules needs
# gymnasium (only ``from_space`` does, when called).
_EXPORTS: Dict[str, str] = {
    # The entropy controllers (one interface: controllers/base.py).
    "EntropyController": "alf_entropy.controllers",
    "EntropyTargetAlgorithm": "alf_entropy.controllers",
    "SGDEntropyTargetAlgorithm": "alf_entropy.controllers",
    "NestedEntropyTargetAlgorithm": "alf_entropy.controllers",
    "FixedEntropyCoefficient": "alf_entropy.controllers",
    "PIDEntropyTargetAlgorithm": "alf_entropy.controllers",
    "LinearPIDEntropyTargetAlgorithm": "alf_entropy.controllers",
    # The algorithms that use them.
    "ActorCriticAlgorithm": "alf_entropy.algorithms.actor_critic_algorithm",
    "PPOAlgorithm": "alf_entropy.algorithms.ppo_algorithm",
    "SacAlgorithm": "alf_entropy.algorithms.sac_algorithm",
    # Schedules (e.g. of the target entropy) and the progress they read.
    "Scheduler": "alf_entropy.utils.schedulers",
    "ConstantScheduler": "alf_entropy.utils.schedulers",
    "StepScheduler": "alf_entropy.utils.schedulers",
    "LinearScheduler": "alf_entropy.utils.schedulers",
    "ExponentialScheduler": "alf_entropy.utils.schedulers",
    "CyclicalScheduler": "alf_entropy.utils.schedulers",
    "SettledAnnealing": "alf_entropy.utils.schedulers",
    "update_progress": "alf_entropy.utils.schedulers",
    # Targets users can state.
    "greedy_probability_target": "alf_entropy.utils.dist_utils",
    # Specs of actions and observations.
    "TensorSpec": "alf_entropy.tensor_specs",
    "BoundedTensorSpec": "alf_entropy.tensor_specs",
    "from_gym_space": "alf_entropy.tensor_specs",
}

__all__: List[str] = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'alf_entropy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_EXPORTS))
