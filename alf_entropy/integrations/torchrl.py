"""TorchRL: any entropy controller sets the ``alpha`` of ``SACLoss`` and ``DiscreteSACLoss``.

:func:`control_alpha` turns the loss's own ``log_alpha`` parameter into a buffer
(TorchRL's ``fixed_alpha=True`` form: no optimiser can step it, and
``loss_alpha`` has no gradient), adds the controller to the loss as the
submodule ``alpha_controller`` (so ``loss_module.state_dict()``, ``.to()`` and
``load_state_dict()`` carry its state) and returns an :class:`AlphaStep`.  Call
that after each ``optimizer.step()`` with ``loss_td["entropy"]``: the
controller takes one update and its ``log_alpha`` is copied into the loss's,
which ``SACLoss._alpha`` reads in every term (actor, critic target, value).

TorchRL's ``log_prob`` is in the env's action units (``TanhNormal(low, high)``
includes the scaling), so build a continuous controller from the env's own
bounds: ``Cls.from_space(env.action_spec_unbatched, ...)``.
``DiscreteSACLoss``'s ``entropy`` is the policy's exact entropy.

TorchRL internals relied on (checked at wiring, and by the tests):
``log_alpha``, ``alpha_init``, ``min_log_alpha``/``max_log_alpha`` (the clamp
in ``_alpha``, refused here), ``fixed_alpha``, ``reduction`` and
``scalar_output_mode``.  This module imports
``torchrl`` (``pip install -e ".[torchrl]"``); the user guide is ``docs/torchrl.md``.
"""

import math
from typing import Union

import torch

try:
    import torchrl
    from torchrl.objectives import DiscreteSACLoss, SACLoss
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "alf_entropy.integrations.torchrl needs TorchRL: pip install -e "
        '".[torchrl]" (in a checkout of alf_entropy)'
    ) from e

from alf_entropy.controllers import EntropyController

__all__ = ["control_alpha", "AlphaStep", "SUPPORTED_TORCHRL", "CONTROLLER_NAME"]

SUPPORTED_TORCHRL = "==0.14.1"
"""The TorchRL version whose ``SACLoss`` internals this module was checked against."""

CONTROLLER_NAME = "alpha_controller"
"""The controller's submodule name in the loss (its ``state_dict`` prefix)."""

_LOSS_ATTRIBUTES = (
    "log_alpha",
    "alpha_init",
    "min_log_alpha",
    "max_log_alpha",
    "fixed_alpha",
    "reduction",
    "scalar_output_mode",
)


class AlphaStep:
    """One controller update from the step's entropy, written into the loss.

    Args:
        loss_module: the wired loss.
        controller: its controller.
    """

    def __init__(self, loss_module: Union[SACLoss, DiscreteSACLoss], controller: EntropyController):
        self.loss_module, self.controller = loss_module, controller

    def __call__(self, entropy: Union[float, torch.Tensor]) -> torch.Tensor:
        """Advance the controller on ``loss_td["entropy"]``; the loss's next forward uses it.

        Returns:
            The new ``alpha``.

        Raises:
            RuntimeError: inside a CUDA graph capture (call it after the captured update).
        """
        log_alpha = self.loss_module.log_alpha
        if log_alpha.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "AlphaStep runs on the host between updates (schedules, the "
                "host-side rule state): call it after the CUDA-graph/compiled "
                "update returns, with its loss_td['entropy']"
            )
        alpha = self.controller.adjust_alpha(entropy)
        with torch.no_grad():
            log_alpha.copy_(self.controller.log_alpha)
        return alpha


def control_alpha(
    loss_module: Union[SACLoss, DiscreteSACLoss], controller: EntropyController
) -> AlphaStep:
    """Make ``loss_module`` use ``controller``'s ``alpha`` (module docstring).

    Args:
        loss_module: a TorchRL ``SACLoss`` or ``DiscreteSACLoss`` as built (any
            ``fixed_alpha``), without ``min_alpha``/``max_alpha``.
        controller: a single controller (``batch_shape == ()``) whose ``alpha``
            equals the loss's ``alpha_init``; it moves to the loss's device.

    Returns:
        The step to call after each ``optimizer.step()`` with ``loss_td["entropy"]``.

    Raises:
        TypeError: for another loss or controller type, or a TorchRL whose
            internals moved (see ``SUPPORTED_TORCHRL``).
        ValueError: if the loss clamps alpha, starts from another alpha, has no
            ``entropy`` output, or is wired already, or the controller is a batch.
    """
    if not isinstance(loss_module, (SACLoss, DiscreteSACLoss)):
        raise TypeError(
            f"loss_module must be a TorchRL SACLoss or DiscreteSACLoss, got "
            f"{type(loss_module).__name__}"
        )
    missing = [a for a in _LOSS_ATTRIBUTES if not hasattr(loss_module, a)]
    if missing:
        raise TypeError(
            f"{type(loss_module).__name__} lacks {missing}: "
            f"alf_entropy.integrations.torchrl supports TorchRL {SUPPORTED_TORCHRL}, "
            f"this is TorchRL {torchrl.__version__}"
        )
    if not isinstance(controller, EntropyController):
        raise TypeError(f"controller must be an EntropyController, got {type(controller).__name__}")
    if controller.batch_shape != ():
        raise ValueError(
            f"the loss has one alpha; the controller is a batch "
            f"(batch_shape={controller.batch_shape})"
        )
    if hasattr(loss_module, CONTROLLER_NAME):
        raise ValueError(f"loss_module is wired already (it has {CONTROLLER_NAME})")
    if loss_module.min_log_alpha is not None or loss_module.max_log_alpha is not None:
        raise ValueError(
            "the loss was built with min_alpha/max_alpha, which SACLoss._alpha "
            "clamps log_alpha to: the loss could use another alpha than the "
            "controller; build it without them and give the controller min_alpha/"
            "max_alpha instead"
        )
    if controller.SIGNED and controller.settings["min_alpha"] < 0:
        raise ValueError("the controller's min_alpha must be >= 0: TorchRL's loss holds log(alpha)")
    init, alpha = float(loss_module.alpha_init), float(controller.alpha)
    if not math.isclose(init, alpha, rel_tol=1e-5):
        raise ValueError(
            f"the loss's alpha_init ({init:g}) differs from the controller's alpha "
            f"({alpha:g}); build them with the same start (alpha_init= or "
            "initial_alpha=)"
        )
    if loss_module.reduction == "none" and loss_module.scalar_output_mode != "non_tensor":
        raise ValueError(
            "with reduction='none' the loss outputs no 'entropy' unless "
            "scalar_output_mode='non_tensor'"
        )
    device = loss_module.log_alpha.device
    controller.to(device)
    # TorchRL's fixed_alpha=True form: a buffer no optimiser steps (a parameter already
    # handed to an optimiser is no longer read by the loss).
    delattr(loss_module, "log_alpha")
    loss_module.register_buffer("log_alpha", controller.log_alpha.clone())
    loss_module.fixed_alpha = True
    loss_module.add_module(CONTROLLER_NAME, controller)
    return AlphaStep(loss_module, controller)
