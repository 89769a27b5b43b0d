"""verl: any entropy controller sets the entropy coefficient of verl's v1 PPO/GRPO trainer.

verl 0.9.1 reads ``actor.entropy_coeff`` at every micro-batch in ``ppo_loss`` from a frozen
``ActorConfig`` built once per worker, and measures the step's entropy on the driver
(``actor/entropy`` of ``_compute_old_log_prob``: the token mean over the whole batch, all
ranks, before the update).  :class:`EntropyControlTrainer`, verl's sync trainer registered as
``trainer.v1.trainer_mode=entropy_control``, adds one controller on the driver:

* in ``_update_actor`` it advances the controller on the step's ``actor/entropy`` (feeding
  the step to the schedulers as ``"iterations"`` and ``step / total_training_steps`` as
  ``"percent"``) and puts the coefficient in the batch's metadata (``COEFF_KEY``), which
  reaches every micro-batch of that step's update on every rank;
* it swaps the workers' loss for :func:`controlled_ppo_loss` (verl's ``ppo_loss`` with that
  coefficient) once, at the end of ``init``;
* it writes the controller's state into each ``global_step_N`` checkpoint folder
  (``STATE_FILE``) and restores it on resume;
* the coefficient, the entropy, the target and the controller's state go into verl's
  metrics as ``entropy_control/...``.

The trainer runs in a Ray process, where this module must be imported for verl to find the
mode: :func:`register` is Ray's ``worker_process_setup_hook`` for that.  The controller comes
from the config: ``entropy_control.target`` (``lm_controller(vocabulary, target)``, the
vocabulary the tokenizer's unless ``entropy_control.vocabulary``, ``LM_SETTINGS`` changed by
``entropy_control.settings``, e.g. ``+entropy_control.settings.min_alpha=0`` for a bonus only), or
``entropy_control.controller``, the import path of a function of the vocabulary size that
returns one (any controller; scheduled targets).  :func:`check_verl_config` refuses what would
silently break control.  The user guide is ``docs/llm_rl.md``.

This module imports ``verl`` (``pip install -e ".[verl]"``).
"""

import dataclasses
import json
import os
import warnings
from functools import partial
from typing import Any, Dict, Tuple

try:
    import hydra.utils
    from verl.trainer.distillation import is_distillation_enabled
    from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        'alf_entropy.integrations.verl needs verl: pip install -e ".[verl]" '
        "(in a checkout of alf_entropy)"
    ) from e

from alf_entropy.controllers.base import EntropyController
from alf_entropy.integrations.llm import StepEntropyControl, lm_controller

__all__ = [
    "EntropyControlTrainer",
    "controlled_ppo_loss",
    "check_verl_config",
    "make_controller",
    "register",
    "SUPPORTED_VERL",
    "TRAINER_MODE",
    "COEFF_KEY",
    "STATE_FILE",
]

SUPPORTED_VERL = "==0.9.1"
"""The verl versions whose trainer internals this module was checked against (the extra)."""
TRAINER_MODE = "entropy_control"
"""The ``trainer.v1.trainer_mode`` of :class:`EntropyControlTrainer`."""
COEFF_KEY = "alf_entropy_coeff"
"""The batch metadata that carries the step's coefficient to the workers."""
STATE_FILE = "alf_entropy_control.json"
"""The controller's state in each ``global_step_N`` checkpoint folder."""
PER_TOKEN_MODES: Tuple[str, ...] = ("token-mean", "seq-mean-token-mean")


def controlled_ppo_loss(
    config: Any, model_output: Any, data: Any, dp_group: Any = None
) -> Tuple[Any, Dict[str, Any]]:
    """verl's ``ppo_loss`` with ``entropy_coeff`` taken from ``data``'s metadata (``COEFF_KEY``).

    Raises:
        RuntimeError: if the batch carries no coefficient.
    """
    coeff = tu.get_non_tensor_data(data, COEFF_KEY, default=None)
    if coeff is None:
        raise RuntimeError(
            f"the batch has no {COEFF_KEY!r}: controlled_ppo_loss is the loss "
            f"of trainer.v1.trainer_mode={TRAINER_MODE} only"
        )
    return ppo_loss(dataclasses.replace(config, entropy_coeff=coeff), model_output, data, dp_group)


def check_verl_config(config: Any) -> None:
    """Check that verl's config lets a controller set the coefficient.

    Raises:
        ValueError: naming the field that would silently break control, and its fix.
    """
    actor = config.actor_rollout_ref.actor
    control = config.get("entropy_control") or {}
    if not actor.calculate_entropy:
        raise ValueError(
            "actor_rollout_ref.actor.calculate_entropy must be True: verl computes "
            "the entropy in the update only if it is set or entropy_coeff != 0, so a "
            "coefficient from the controller would regularise nothing"
        )
    if actor.entropy_coeff != 0:
        raise ValueError(
            f"actor_rollout_ref.actor.entropy_coeff must be 0 (got "
            f"{actor.entropy_coeff}): the controller sets the coefficient"
        )
    if actor.loss_agg_mode not in PER_TOKEN_MODES and not control.get("allow_loss_agg_mode"):
        raise ValueError(
            f"actor_rollout_ref.actor.loss_agg_mode is {actor.loss_agg_mode!r}: its "
            f"actor/entropy is not nats per token ({' or '.join(PER_TOKEN_MODES)}); "
            "set +entropy_control.allow_loss_agg_mode=True with a target in its units"
        )
    if config.algorithm.get("rollout_correction", {}).get("bypass_mode"):
        raise ValueError(
            "algorithm.rollout_correction.bypass_mode must be False: verl then skips "
            "_compute_old_log_prob, which measures the step's entropy"
        )
    if is_distillation_enabled(config.get("distillation")):
        raise ValueError("distillation.enabled must be False: its loss is not ppo_loss")
    if (control.get("target") is None) == (control.get("controller") is None):
        raise ValueError(
            "entropy_control needs one of target (+entropy_control.target=2.5) and "
            "controller (+entropy_control.controller=module.function)"
        )


def make_controller(config: Any, vocabulary: int) -> EntropyController:
    """The controller of ``config.entropy_control``: its ``controller(vocabulary)``, or
    ``lm_controller(vocabulary, target, **settings)`` (``vocabulary`` unless it gives one)."""
    control = config.entropy_control
    if control.get("controller") is not None:
        return hydra.utils.get_method(control.controller)(vocabulary)
    settings = control.get("settings") or {}
    return lm_controller(control.get("vocabulary") or vocabulary, control.target, **settings)


class EntropyControlTrainer(PPOTrainerSync):
    """verl's ``PPOTrainerSync`` whose entropy coefficient a controller sets at every step.

    Raises:
        ValueError: as :func:`check_verl_config`.
    """

    def __init__(self, config: Any):
        check_verl_config(config)
        self.control: StepEntropyControl = None
        super().__init__(config)

    def _build_replay_buffer(self) -> Any:
        # verl switches on the mode's name (replay buffer, refills, checkpoints): run as "sync"
        self.trainer_mode = "sync"
        return super()._build_replay_buffer()

    def on_init_end(self) -> None:
        """Give the workers :func:`controlled_ppo_loss`, then what verl does."""
        config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(partial(controlled_ppo_loss, config=config))
        super().on_init_end()

    def _load_checkpoint(self) -> None:
        super()._load_checkpoint()
        self.control = StepEntropyControl(make_controller(self.config, len(self.tokenizer)))
        if self.global_steps == 0:
            return
        trainer = self.config.trainer
        folder = (
            trainer.resume_from_path
            if trainer.resume_mode == "resume_path"
            else os.path.join(trainer.default_local_dir, f"global_step_{self.global_steps}")
        )
        path = os.path.join(folder, STATE_FILE)
        if not os.path.exists(path):
            warnings.warn(
                f"resuming at step {self.global_steps} from a checkpoint without "
                f"{STATE_FILE}: the controller starts afresh",
                stacklevel=2,
            )
            return
        with open(path, encoding="utf-8") as f:
            self.control.load_state_dict(json.load(f))

    def _save_checkpoint(self) -> None:
        # before verl's, which marks the checkpoint complete (latest_checkpointed_iteration.txt)
        folder = os.path.join(
            self.config.trainer.default_local_dir, f"global_step_{self.global_steps}"
        )
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, STATE_FILE), "w", encoding="utf-8") as f:
            json.dump(self.control.state_dict(), f)
        super()._save_checkpoint()

    def _update_actor(self, batch: Any, metrics: Dict[str, Any]) -> Any:
        if "actor/entropy" not in metrics:
            raise RuntimeError("verl measured no actor/entropy this step (_compute_old_log_prob)")
        coeff = self.control.update(
            metrics["actor/entropy"], 1.0, self.global_steps, self.total_training_steps
        )
        batch.extra_info[COEFF_KEY] = coeff
        for key, value in self.control.record().items():
            metrics[f"entropy_control/{key}"] = value
        return super()._update_actor(batch, metrics)


def register() -> None:
    """Register :class:`EntropyControlTrainer` as ``trainer.v1.trainer_mode=entropy_control``.

    Ray's ``worker_process_setup_hook``, so that verl's trainer process (a Ray actor) finds
    the mode: ``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=`` this function's
    path, ``alf_entropy.integrations.verl.register``.
    """
    register_trainer(TRAINER_MODE)(EntropyControlTrainer)
