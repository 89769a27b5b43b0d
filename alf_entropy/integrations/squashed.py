"""A tanh-squashed SAC's ``log_prob`` is in ``[-1, 1]`` action units, whatever the env's bounds.

SB3's and Tianshou's SAC squash a Gaussian with ``tanh`` and rescale the action
to the env's bounds outside the distribution, so their entropies are those of
a ``Box(-1, 1)`` action: a controller's default target and its reachable
maximum (``log 2`` per dimension) must come from that box, not the env's.
"""

from typing import Any

import numpy as np

from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils import nest

__all__ = ["squashed_space", "check_squashed"]


def squashed_space(space: Any) -> Any:
    """``Box(-1, 1)`` of the shape of ``space`` (a gymnasium ``Box``).

    Raises:
        TypeError: if ``space`` is not a ``Box``.
    """
    from gymnasium import spaces

    if not isinstance(space, spaces.Box):
        raise TypeError(f"SAC needs a Box action space, got {space}")
    return spaces.Box(-1.0, 1.0, space.shape, dtype=np.float32)


def check_squashed(action_spec: Any) -> None:
    """Check that every continuous spec in ``action_spec`` spans ``[-1, 1]``.

    Raises:
        ValueError: naming the first spec with other bounds.
    """
    for spec in nest.flatten(action_spec):
        if (
            isinstance(spec, BoundedTensorSpec)
            and spec.is_continuous
            and not (np.all(spec.minimum == -1.0) and np.all(spec.maximum == 1.0))
        ):
            raise ValueError(
                f"the controller's action spec {spec} is not [-1, 1]: a tanh-squashed SAC's "
                "log_prob is in [-1, 1] units, so build it from Box(-1, 1) of the action shape "
                "(pass the controller class and the env's action space to have that done)"
            )
