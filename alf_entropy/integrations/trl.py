"""Hugging Face TRL: any entropy controller drives ``GRPOTrainer``'s entropy coefficient.

TRL's ``GRPOTrainer`` (1.16) is used unmodified.  With the fields of
:func:`grpo_config_kwargs` (``use_adaptive_entropy=True``,
``entropy_coef_delta=0``, ``entropy_target=inf``) its own ±delta rule and its
on/off gate do nothing, while it still

* measures, at every optimizer step, the token-weighted mean entropy of the
  completion tokens over all micro-batches and all ranks
  (``trainer._last_world_entropy``, read on the host once per step by TRL
  itself), and
* applies ``trainer.entropy_coef`` to every micro-batch of a step (it is read
  in the loss, so the value set after step N is what all of step N+1 uses).

:class:`EntropyControlCallback` (added by :func:`add_entropy_control`) runs at
``on_step_end``: it feeds TRL's ``global_step`` (``"iterations"``) and
``global_step / max_steps`` (``"percent"``) to the schedulers, advances the
controller once on that entropy and sets ``trainer.entropy_coef``.  Every rank
gets the same entropy and runs the same controller, so every rank holds the
same coefficient.  The applied coefficient, the target, the measured entropy
and the controller's state go into TRL's logs as ``entropy_control/...``; TRL
itself logs the coefficient of each step as ``entropy_coef``.  The
controller's state goes into each checkpoint's ``trainer_state.json``
(``stateful_callbacks["alf_entropy.EntropyControlCallback"]``) and is restored
on ``trainer.train(resume_from_checkpoint=...)``.

TRL internals this relies on (``check_trl_internals`` checks them, and the
tests fail if they move): ``_last_world_entropy``, ``entropy_coef``,
``_entropy_bonus_enabled`` (frozen at construction), ``_metrics``, and the
rule ``entropy_coef = min(entropy_coef + delta, entropy_coef_max)`` (so
``entropy_coef_max`` must not be below the controller's ``max_alpha``).  With
``top_entropy_quantile < 1`` TRL measures (and regularises) only the
high-entropy tokens; pass ``allow_top_entropy_quantile=True`` to accept a
target stated for those.  A non-finite entropy leaves the controller as it was
(TRL itself then turns the bonus off for one step).

This module imports ``trl`` (``pip install -e ".[trl]"``); the rest of
the package never imports it.  The user guide is ``docs/llm_rl.md``.
"""

import math
import warnings
from typing import Any, Dict, Optional

try:
    import trl
    from transformers import TrainerCallback
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        'alf_entropy.integrations.trl needs TRL: pip install -e ".[trl]" '
        "(in a checkout of alf_entropy)"
    ) from e

from alf_entropy.controllers.base import EntropyController
from alf_entropy.integrations.llm import (
    LM_SETTINGS,
    StepEntropyControl,
    check_step_controller,
    controller_alpha_bounds,
    lm_controller,
)
from alf_entropy.utils.checks import check_name

__all__ = [
    "EntropyControlCallback",
    "add_entropy_control",
    "grpo_config_kwargs",
    "check_grpo_config",
    "check_trl_internals",
    "lm_controller",
    "LM_SETTINGS",
    "SUPPORTED_TRL",
    "STATE_KEY",
]

SUPPORTED_TRL = ">=1.16,<1.17"
"""The TRL versions whose internals this module was checked against (the ``trl`` extra)."""

STATE_KEY = "alf_entropy.EntropyControlCallback"
"""Where the controller's state goes in ``TrainerState.stateful_callbacks``."""

_TRAINER_ATTRIBUTES = (
    "_last_world_entropy",
    "entropy_coef",
    "_entropy_bonus_enabled",
    "_metrics",
    "use_adaptive_entropy",
)
_CONFIG_FIELDS = (
    "use_adaptive_entropy",
    "entropy_coef",
    "entropy_coef_delta",
    "entropy_target",
    "entropy_coef_min",
    "entropy_coef_max",
    "top_entropy_quantile",
)


def grpo_config_kwargs(controller: EntropyController) -> Dict[str, Any]:
    """The ``GRPOConfig`` fields under which ``controller`` alone sets the coefficient.

    Returns:
        ``use_adaptive_entropy=True`` (TRL measures the step's entropy),
        ``entropy_coef_delta=0.0`` (its rule stays still), ``entropy_target=inf`` (its gate
        stays open), ``entropy_coef`` = the controller's ``alpha``, ``entropy_coef_min`` and
        ``entropy_coef_max`` = its ``min_alpha`` (0 for a rule that cannot go below) and
        ``max_alpha`` (``inf`` if unbounded).

    Raises:
        TypeError: if ``controller`` is not an unbatched, non-nested controller.
        ValueError: if it is not on the CPU.
    """
    check_step_controller(controller)
    lo, hi = controller_alpha_bounds(controller)
    return dict(
        use_adaptive_entropy=True,
        entropy_coef_delta=0.0,
        entropy_target=math.inf,
        entropy_coef=float(controller.alpha),
        entropy_coef_min=lo,
        entropy_coef_max=hi,
    )


def check_grpo_config(
    args: Any, controller: EntropyController, allow_top_entropy_quantile: bool = False
) -> None:
    """Check that a ``GRPOConfig`` lets ``controller`` set the coefficient, unclipped.

    Args:
        args: the trainer's ``GRPOConfig``.
        controller: the controller.
        allow_top_entropy_quantile: accept ``top_entropy_quantile < 1`` (the
            controller then sees only the high-entropy tokens' entropy).

    Raises:
        TypeError: if ``args`` lacks a field this integration reads.
        ValueError: naming the field, its value and the value it needs.
    """
    missing = [f for f in _CONFIG_FIELDS if not hasattr(args, f)]
    if missing:
        raise TypeError(f"args must be a GRPOConfig of TRL {SUPPORTED_TRL}; it has no {missing}")
    lo, hi = controller_alpha_bounds(controller)
    fix = "use GRPOConfig(..., **grpo_config_kwargs(controller))"
    if not args.use_adaptive_entropy:
        raise ValueError(
            "use_adaptive_entropy must be True (TRL then measures each step's "
            f"entropy over all micro-batches and ranks); {fix}"
        )
    if args.entropy_coef_delta != 0:
        raise ValueError(
            f"entropy_coef_delta must be 0 (got {args.entropy_coef_delta}): TRL's "
            f"own rule would move the coefficient too; {fix}"
        )
    if args.entropy_target != math.inf:
        raise ValueError(
            f"entropy_target must be inf (got {args.entropy_target}): TRL turns the "
            "bonus off while the entropy is above it; state the target in the "
            f"controller; {fix}"
        )
    if args.entropy_coef_max < hi:
        raise ValueError(
            f"entropy_coef_max ({args.entropy_coef_max}) must be >= the "
            f"controller's max_alpha ({hi}): TRL clips the coefficient to it; {fix}"
        )
    if args.entropy_coef_min > lo:
        raise ValueError(
            f"entropy_coef_min ({args.entropy_coef_min}) must be <= the "
            f"controller's min_alpha ({lo}); {fix}"
        )
    if args.top_entropy_quantile < 1.0 and not allow_top_entropy_quantile:
        raise ValueError(
            f"top_entropy_quantile is {args.top_entropy_quantile} (< 1): TRL then "
            "measures only the high-entropy tokens' entropy; set it to 1.0, or pass "
            "allow_top_entropy_quantile=True with a target for those tokens"
        )


def check_trl_internals(trainer: Any) -> None:
    """Check that ``trainer`` has the ``GRPOTrainer`` internals this module uses.

    Raises:
        TypeError: if an attribute is missing (TRL's internals moved: see
            ``SUPPORTED_TRL``).
        ValueError: if the entropy bonus was not enabled at construction.
    """
    missing = [a for a in _TRAINER_ATTRIBUTES if not hasattr(trainer, a)]
    if missing or not isinstance(getattr(trainer, "_metrics", None), dict):
        raise TypeError(
            f"{type(trainer).__name__} lacks {missing or ['_metrics (a dict)']}: "
            f"alf_entropy.integrations.trl supports TRL {SUPPORTED_TRL}'s "
            f"GRPOTrainer, this is TRL {trl.__version__}"
        )
    if not trainer._entropy_bonus_enabled:
        raise ValueError(
            "the entropy bonus was not enabled when the trainer was built "
            "(GRPOTrainer freezes _entropy_bonus_enabled at construction): build it "
            "with GRPOConfig(..., **grpo_config_kwargs(controller))"
        )


class EntropyControlCallback(TrainerCallback):
    """A ``TrainerCallback`` that sets ``GRPOTrainer.entropy_coef`` from a controller.

    Build it with :func:`add_entropy_control`, which checks the settings and
    binds it to the trainer.

    Args:
        controller: an unbatched, non-nested ``EntropyController`` on the CPU.
        log_prefix: the prefix of the logged keys.
        allow_top_entropy_quantile: see :func:`check_grpo_config`.

    Raises:
        TypeError: if ``controller`` is not such a controller or ``log_prefix`` not a string.
        ValueError: if the controller is not on the CPU or ``log_prefix`` is empty.
    """

    def __init__(
        self,
        controller: EntropyController,
        log_prefix: str = "entropy_control",
        allow_top_entropy_quantile: bool = False,
    ):
        self._control = StepEntropyControl(controller)
        self._prefix = check_name("log_prefix", log_prefix)
        self._allow_quantile = bool(allow_top_entropy_quantile)
        self._trainer: Optional[Any] = None
        self.history: list = []
        """Per step: ``{"step", "coef_applied", "entropy", "target", "coef_next"}``."""

    @property
    def controller(self) -> EntropyController:
        """The controller."""
        return self._control.controller

    @property
    def control(self) -> StepEntropyControl:
        """The trainer-independent part (the controller, its step, its state)."""
        return self._control

    def bind(self, trainer: Any) -> "EntropyControlCallback":
        """Check ``trainer`` and its ``GRPOConfig``, and remember it (not added as a callback).

        Raises:
            TypeError, ValueError: as :func:`check_trl_internals` and
                :func:`check_grpo_config`.
        """
        check_trl_internals(trainer)
        check_grpo_config(trainer.args, self.controller, self._allow_quantile)
        self._trainer = trainer
        return self

    def _bound(self) -> Any:
        if self._trainer is None:
            raise RuntimeError(
                "EntropyControlCallback is not bound to a trainer: use "
                "add_entropy_control(trainer, controller)"
            )
        return self._trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Restore the controller from a resumed checkpoint; apply its coefficient."""
        trainer = self._bound()
        check_grpo_config(args, self.controller, self._allow_quantile)
        saved = (state.stateful_callbacks or {}).get(STATE_KEY)
        if saved is not None and state.global_step > 0:
            self._control.load_state_dict(saved)
            if self._control.step != state.global_step:
                raise ValueError(
                    f"the checkpoint's controller state is of step "
                    f"{self._control.step}, its trainer state of step "
                    f"{state.global_step}"
                )
        elif state.global_step > 0 and self._control.step != state.global_step:
            warnings.warn(
                f"resuming at step {state.global_step} from a checkpoint without "
                "controller state: the controller continues from its own state "
                f"(step {self._control.step})",
                stacklevel=2,
            )
        trainer.entropy_coef = self._control.coefficient

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Advance the controller on the step's entropy; set the next step's coefficient."""
        trainer = self._bound()
        entropy = trainer._last_world_entropy
        if entropy == math.inf:
            raise RuntimeError(
                "GRPOTrainer measured no entropy this step (_last_world_entropy "
                "is inf): is use_adaptive_entropy on and TRL "
                f"{SUPPORTED_TRL}? (TRL {trl.__version__})"
            )
        applied = float(trainer.entropy_coef)
        total = state.max_steps if state.max_steps and state.max_steps > 0 else None
        coef = self._control.update(float(entropy), 1.0, state.global_step, total)
        trainer.entropy_coef = coef
        record = self._control.record()
        record["coef_applied"] = applied
        metrics = trainer._metrics["train"]
        for key, value in record.items():
            metrics[f"{self._prefix}/{key}"].append(value)
        self.history.append(
            {
                "step": state.global_step,
                "coef_applied": applied,
                "entropy": record["entropy"],
                "target": record["target"],
                "coef_next": coef,
            }
        )
        # Saved into trainer_state.json by any checkpoint of this step (only
        # process 0 writes it; every rank holds the same state).
        state.stateful_callbacks[STATE_KEY] = self._control.state_dict()


def add_entropy_control(
    trainer: Any,
    controller: EntropyController,
    log_prefix: str = "entropy_control",
    allow_top_entropy_quantile: bool = False,
) -> EntropyControlCallback:
    """Let ``controller`` set a ``GRPOTrainer``'s entropy coefficient at every step.

    Args:
        trainer: a ``trl.GRPOTrainer`` built with
            ``GRPOConfig(..., **grpo_config_kwargs(controller))``.
        controller: an unbatched, non-nested ``EntropyController`` on the CPU, its target
            in nats per completion token (e.g. ``lm_controller(len(tokenizer), 2.5)``).
        log_prefix: the prefix of the keys logged into TRL's logs.
        allow_top_entropy_quantile: see :func:`check_grpo_config`.

    Returns:
        The callback, added to the trainer.

    Raises:
        TypeError, ValueError: as :class:`EntropyControlCallback`, :func:`check_trl_internals`
            and :func:`check_grpo_config`.
    """
    callback = EntropyControlCallback(controller, log_prefix, allow_top_entropy_quantile)
    callback.bind(trainer)
    trainer.add_callback(callback)
    return callback
