"""The controllers as ALF sub-algorithms: what ALF's ``Agent`` builds from
``entropy_target_cls``, bound in ALF's gin files or ``alf.config``.

Each controller gets a name no ALF class has (``AlfEntropyTargetAlgorithm``,
``AlfPIDEntropyTargetAlgorithm``, ...), its own signature, ALF's specs, ``set_path`` and its
summaries under ALF's ``alf.summary`` scope; ALF's ``Checkpointer`` saves its state, and a
checkpoint of ALF's own ``EntropyTargetAlgorithm`` loads into ``AlfEntropyTargetAlgorithm``.

This module imports ``alf`` (ALF is not on the package registry: use the ALF you have).
"""

import inspect
from typing import Any, Dict

import alf
import alf.summary
import torch

from alf_entropy import controllers
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
from alf_entropy.utils import nest

__all__ = [
    "AlfEntropyTargetAlgorithm",
    "AlfPIDEntropyTargetAlgorithm",
    "AlfLinearPIDEntropyTargetAlgorithm",
    "AlfSGDEntropyTargetAlgorithm",
    "AlfFixedEntropyCoefficient",
    "AlfNestedEntropyTargetAlgorithm",
]

# ALF's EntropyTargetAlgorithm's buffers -> the staged controller's state fields.
ALF_STAGED_STATE = {
    "_log_alpha": "log_alpha",
    "_stage": "stage",
    "_update_rate": "update_rate",
    "_max_entropy": "max_entropy",
    "_avg_entropy._buf._buffer0": "window",
    "_avg_entropy._buf._current_pos": "seen",
}


def _ours(spec: Any) -> Any:
    """An ALF spec nest as the package's."""

    def one(s: Any) -> TensorSpec:
        if hasattr(s, "minimum"):
            return BoundedTensorSpec(s.shape, s.dtype, s.minimum, s.maximum)
        return TensorSpec(s.shape, s.dtype)

    return nest.map_structure(one, spec)


def _from_alf(module: Any, state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
    """Read a checkpoint of ALF's ``EntropyTargetAlgorithm`` as the staged controller's."""
    if prefix + "_log_alpha" not in state_dict:
        return
    state = module.driver.state._asdict()
    for alf_name, field in ALF_STAGED_STATE.items():
        value = state_dict.pop(prefix + alf_name)
        state[field] = value.reshape(state[field].shape).to(state[field].dtype)
    state_dict.pop(prefix + "_avg_entropy._buf._current_size", None)  # min(seen, window)
    for field, value in state.items():
        state_dict[prefix + "driver." + field] = value


class _AlfSide:
    """What ALF asks of a sub-algorithm beyond the controllers' protocol."""

    SUMMARY = alf.summary  # the summaries go to ALF's writer, under its scopes
    _path = ""

    def set_path(self, path: str) -> None:
        """ALF names its sub-algorithms by their path in the algorithm tree."""
        self._path = path

    @property
    def path(self) -> str:
        """The path ``set_path`` gave."""
        return self._path


def _alf(cls: type, **defaults: Any) -> type:
    """``cls`` taking ALF's specs, named ``Alf`` + its name; ``defaults`` replace its own."""

    def __init__(self: Any, action_spec: Any, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, _ours(action_spec), *args, **{**defaults, **kwargs})
        if isinstance(self, controllers.EntropyTargetAlgorithm):
            self.register_load_state_dict_pre_hook(_from_alf)

    signature = inspect.signature(cls.__init__)
    __init__.__signature__ = signature.replace(
        parameters=[
            p.replace(default=defaults.get(name, p.default))
            for name, p in signature.parameters.items()
        ]
    )
    name = "Alf" + cls.__name__
    doc = f"``{cls.__name__}`` as an ALF sub-algorithm."
    return type(
        name,
        (_AlfSide, cls),
        dict(__init__=__init__, __module__=__name__, __qualname__=name, __doc__=doc),
    )


class AlfEntropyTargetAlgorithm(_alf(controllers.EntropyTargetAlgorithm)):
    """``EntropyTargetAlgorithm`` as an ALF sub-algorithm (a checkpoint of ALF's loads)."""

    @property
    def _stage(self) -> torch.Tensor:
        """ALF's name of ``stage``; settable, as ALF's tests set it."""
        return self.stage

    @_stage.setter
    def _stage(self, value: torch.Tensor) -> None:
        with torch.no_grad():
            self.driver.stage.copy_(value)


AlfEntropyTargetAlgorithm = alf.configurable(AlfEntropyTargetAlgorithm)
AlfPIDEntropyTargetAlgorithm = alf.configurable(_alf(controllers.PIDEntropyTargetAlgorithm))
AlfLinearPIDEntropyTargetAlgorithm = alf.configurable(
    _alf(controllers.LinearPIDEntropyTargetAlgorithm)
)
AlfSGDEntropyTargetAlgorithm = alf.configurable(_alf(controllers.SGDEntropyTargetAlgorithm))
AlfFixedEntropyCoefficient = alf.configurable(_alf(controllers.FixedEntropyCoefficient))
AlfNestedEntropyTargetAlgorithm = alf.configurable(
    _alf(controllers.NestedEntropyTargetAlgorithm, leaf_cls=AlfEntropyTargetAlgorithm)
)
