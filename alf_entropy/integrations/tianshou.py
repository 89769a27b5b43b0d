"""Tianshou 2.0: any entropy controller is the ``alpha`` of ``SAC`` and ``DiscreteSAC``.

:class:`ControllerAlpha` implements Tianshou's ``Alpha`` protocol: ``value``
(the float both algorithms read in the critic target, the actor loss and their
stats) is the controller's ``alpha``, and ``update(entropy)``, which they call
once per gradient step after the actor's step with the per-sample entropies,
advances the controller once on their mean.  It is an ``nn.Module`` holding the
controller, so ``algorithm.state_dict()`` (key prefix ``alpha.controller.``)
saves its state and ``algorithm.load_state_dict()`` restores it.

``SAC``'s ``log_prob`` is that of its tanh-squashed actions, in ``[-1, 1]``
units whatever the env's bounds: built from a class, the controller gets
``Box(-1, 1)`` of the action shape (as the SB3 callback does); an instance with
other continuous bounds is refused.  ``DiscreteSAC``'s entropy is the exact one.

The controller stays on the CPU unless you move it: ``value`` must be a float,
so a CPU controller costs no device sync beyond the entropy's copy per update.
This module imports ``tianshou`` (``pip install -e ".[tianshou]"``); the user
guide is ``docs/tianshou.md``.
"""

from typing import Any, Optional, Type, Union

import torch

try:
    from gymnasium import spaces
    from tianshou.algorithm.modelfree.sac import Alpha
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "alf_entropy.integrations.tianshou needs Tianshou 2: pip install -e "
        '".[tianshou]" (in a checkout of alf_entropy)'
    ) from e

from alf_entropy.controllers import EntropyController
from alf_entropy.integrations.squashed import check_squashed, squashed_space

__all__ = ["ControllerAlpha", "SUPPORTED_TIANSHOU"]

SUPPORTED_TIANSHOU = "==2.0.1"
"""The Tianshou version whose ``Alpha`` protocol this module was checked against."""


class ControllerAlpha(torch.nn.Module, Alpha):
    """An entropy controller as Tianshou's ``alpha`` (module docstring).

    Args:
        controller: an ``EntropyController`` (continuous specs in ``[-1, 1]``),
            or a controller class built with ``from_space`` from ``action_space``.
        action_space: the env's action space, with a class: a ``Box`` becomes
            ``Box(-1, 1)`` of its shape, a discrete space stays as it is.
        **controller_kwargs: the class's arguments (e.g. ``initial_alpha=1.0``,
            Tianshou's ``AutoAlpha(log_alpha=0.0)`` start).

    Raises:
        TypeError: for a controller that is neither an ``EntropyController`` nor
            a subclass, a class without ``action_space``, or arguments with an instance.
        ValueError: for a batch of controllers, or an instance whose continuous
            bounds are not ``[-1, 1]``.
    """

    def __init__(
        self,
        controller: Union[EntropyController, Type[EntropyController]],
        action_space: Optional[Any] = None,
        **controller_kwargs: Any,
    ):
        super().__init__()
        if isinstance(controller, EntropyController):
            if action_space is not None or controller_kwargs:
                raise TypeError(
                    "action_space and controller arguments are for a controller "
                    f"class; got an instance ({type(controller).__name__})"
                )
            check_squashed(controller.action_spec)
        elif isinstance(controller, type) and issubclass(controller, EntropyController):
            if action_space is None:
                raise TypeError(f"{controller.__name__} needs the env's action_space to be built")
            space = (
                squashed_space(action_space)
                if isinstance(action_space, spaces.Box)
                else action_space
            )
            controller = controller.from_space(space, **controller_kwargs)
        else:
            raise TypeError(
                f"controller must be an EntropyController or a controller class, got {controller!r}"
            )
        if controller.batch_shape != ():
            raise ValueError(
                f"Tianshou's SAC has one alpha; the controller is a batch "
                f"(batch_shape={controller.batch_shape})"
            )
        self.controller = controller

    @property
    def value(self) -> float:
        """The controller's ``alpha`` (a host read, as Tianshou's protocol asks)."""
        return float(self.controller.alpha)

    def update(self, entropy: torch.Tensor) -> None:
        """One controller update from the mean of the per-sample ``entropy``.

        Returns:
            None: no alpha loss to log.
        """
        self.controller.adjust_alpha(entropy.detach().mean())
        return None
