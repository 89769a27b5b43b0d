"""Stable-Baselines3: any entropy controller drives PPO's, A2C's or SAC's ``ent_coef``.

:class:`EntropyControllerCallback` runs at the end of every rollout, before
SB3's ``train()``: it measures the entropy, advances the controller once and
writes ``alpha`` where ``train()`` reads the coefficient.

* **PPO / A2C**: the float ``model.ent_coef``; the entropy is the current
  policy's mean ``get_distribution(obs).entropy()`` over the rollout.
* **SAC**: ``ent_coef_tensor``, with SB3's own rule off
  (``ent_coef_optimizer = None``; assigning ``model.ent_coef`` changes
  nothing, SB3 issue #1403).  The entropy is the mean ``-log_prob`` of the
  actor's fresh actions on a replay batch, in SB3's squashed ``[-1, 1]`` units:
  the controller is built for ``Box(-1, 1)`` of the action shape
  (``integrations/squashed.py``).  One update per ``train()`` call.

Schedules get SB3's progress before each update (``"percent"``,
``"env_steps"``, ``"iterations"``); ``<log_prefix>/alpha``, ``entropy``,
``target_entropy`` and ``stage`` go to SB3's logger.  This module imports
``stable_baselines3`` (``pip install -e ".[sb3]"``); the guide is ``docs/sb3.md``.
"""

from typing import Any, Dict, Optional, Type, Union

import numpy as np
import torch

try:
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
    from stable_baselines3.common.utils import obs_as_tensor
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        'alf_entropy.integrations.sb3 needs Stable-Baselines3: pip install -e ".[sb3]" '
        "(in a checkout of alf_entropy)"
    ) from e

from alf_entropy.controllers import EntropyController, EntropyTargetAlgorithm
from alf_entropy.integrations.squashed import check_squashed, squashed_space
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils import schedulers
from alf_entropy.utils.checks import check_int, check_name
from alf_entropy.utils.dist_utils import GreedyProbabilityTarget

__all__ = ["EntropyControllerCallback"]

_ON_POLICY, _SAC = "on_policy", "sac"
SAVED = "alf_entropy_controller"
"""The model attribute that ``model.save()`` writes the controller's state under."""


class _SavedState:
    """On the model while training: pickled (by ``model.save()``) as a plain dict of the
    controller's state now, which ``Algorithm.load()`` puts back on the model."""

    __slots__ = ("callback",)

    def __init__(self, callback: "EntropyControllerCallback"):
        self.callback = callback

    def __reduce__(self) -> Any:
        c = self.callback
        return dict, (
            [
                ("controller", type(c.controller).__name__),
                ("state", c.controller.state_dict()),
                ("updates", c.num_updates),
            ],
        )


def _probe_spec(kwargs: Dict[str, Any]) -> BoundedTensorSpec:
    """An action spec on which a controller built with ``kwargs`` checks every setting that
    does not depend on the model's actions (a stated target is checked at ``learn()``)."""
    target = kwargs.get("target_entropy")
    if isinstance(target, GreedyProbabilityTarget):
        return BoundedTensorSpec((), torch.int64, 0, target.num_actions - 1)
    return BoundedTensorSpec((1,), torch.float32, -1e6, 1e6)


def _flatten_rollout_observations(buffer: Any) -> Any:
    """The rollout buffer's observations as ``[n_steps * n_envs, *obs_shape]`` arrays."""
    obs, shape = buffer.observations, buffer.obs_shape
    if isinstance(obs, dict):
        return {k: np.asarray(v).reshape((-1,) + tuple(shape[k])) for k, v in obs.items()}
    return np.asarray(obs).reshape((-1,) + tuple(shape))


def _slice(obs: Any, start: int, stop: int) -> Any:
    if isinstance(obs, dict):
        return {k: v[start:stop] for k, v in obs.items()}
    return obs[start:stop]


def _length(obs: Any) -> int:
    return len(next(iter(obs.values()))) if isinstance(obs, dict) else len(obs)


class EntropyControllerCallback(BaseCallback):
    """Drive SB3's entropy coefficient (PPO, A2C, SAC) with an entropy controller.

    Args:
        controller: an ``EntropyController`` instance, or a controller class
            (default ``EntropyTargetAlgorithm``) that the callback builds
            with ``controller.from_space(space, **controller_kwargs)`` when
            training starts: ``space`` is the model's action space for
            PPO/A2C, and ``Box(-1, 1, shape)`` for SAC (its squashed
            actions; see the module docstring).
        batch_size: observations per forward pass for the entropy: PPO/A2C
            evaluate the whole rollout in chunks of this size (None: 4096),
            SAC samples one replay batch of this size (None: the model's
            ``batch_size``).
        log_prefix: the logger key prefix of the recorded values.
        verbose: SB3's verbosity; ``>= 1`` prints when SAC's own rule is
            turned off.
        **controller_kwargs: constructor arguments of a controller class
            (e.g. ``target_entropy=0.6``); none with an instance.

    Raises:
        TypeError: if ``controller`` is neither an ``EntropyController`` nor
            a subclass of it, or kwargs come with an instance; when training
            starts, if the model is not an on-policy algorithm (PPO, A2C) or
            SAC; ``ValueError`` then for a SAC whose controller instance has
            continuous bounds other than ``[-1, 1]`` (e.g. the env's ``Box(-2, 2)``).
        ValueError: if ``batch_size`` is not a positive integer or ``log_prefix`` is empty
            (not a string: ``TypeError``).

    Examples:
        >>> import gymnasium as gym
        >>> from stable_baselines3 import PPO
        >>> callback = EntropyControllerCallback(target_entropy=0.6)
        >>> model = PPO("MlpPolicy", gym.make("CartPole-v1"), n_steps=64, batch_size=32,
        ...             n_epochs=1, seed=0)
        >>> model = model.learn(128, callback=callback)
        >>> model.ent_coef == float(callback.controller.alpha)  # what train() used
        True
    """

    def __init__(
        self,
        controller: Union[EntropyController, Type[EntropyController]] = EntropyTargetAlgorithm,
        batch_size: Optional[int] = None,
        log_prefix: str = "entropy_controller",
        verbose: int = 0,
        **controller_kwargs: Any,
    ):
        super().__init__(verbose=verbose)
        if isinstance(controller, EntropyController):
            if controller_kwargs:
                raise TypeError(
                    "controller_kwargs are for a controller class; got an instance "
                    f"({type(controller).__name__}) and {sorted(controller_kwargs)}"
                )
            self._controller: Optional[EntropyController] = controller
            self._controller_cls = type(controller)
        elif isinstance(controller, type) and issubclass(controller, EntropyController):
            self._controller, self._controller_cls = None, controller
            controller(_probe_spec(controller_kwargs), **controller_kwargs)  # checks them now
        else:
            raise TypeError(
                "controller must be an EntropyController (e.g. EntropyTargetAlgorithm(...)) or a "
                f"controller class, got {controller!r}"
            )
        if batch_size is not None:
            batch_size = check_int("batch_size", batch_size, minimum=1)
        self._batch_size = batch_size
        self._log_prefix = check_name("log_prefix", log_prefix)
        self._controller_kwargs = controller_kwargs
        self._kind: Optional[str] = None
        self._updates = 0

    @property
    def controller(self) -> EntropyController:
        """The controller (built when training starts if a class was given).

        Raises:
            RuntimeError: if a class was given and training has not started.
        """
        if self._controller is None:
            raise RuntimeError(
                "the controller is built from the model's action space when "
                "training starts (model.learn(..., callback=this))"
            )
        return self._controller

    @property
    def num_updates(self) -> int:
        """How many times this callback advanced the controller."""
        return self._updates

    # --------------------------------------------------------------- set-up
    def _init_callback(self) -> None:
        model = self.model
        if isinstance(model, OnPolicyAlgorithm) and hasattr(model, "ent_coef"):
            self._kind, space = _ON_POLICY, model.action_space
        elif hasattr(model, "ent_coef_tensor") or hasattr(model, "ent_coef_optimizer"):
            self._kind = _SAC
            space = squashed_space(model.action_space)
        else:
            raise TypeError(
                "EntropyControllerCallback drives PPO, A2C (on-policy, model.ent_coef) and SAC "
                f"(model.ent_coef_tensor); got {type(model).__name__}"
            )
        if self._controller is None:  # built once: a second learn() keeps its state
            self._controller = self._controller_cls.from_space(space, **self._controller_kwargs)
        elif self._kind == _SAC:  # an instance: built for the squashed box, as Tianshou checks
            check_squashed(self._controller.action_spec)
        saved = model.__dict__.get(SAVED)
        if isinstance(saved, dict):  # a loaded model: continue from the saved controller
            if saved["controller"] != type(self.controller).__name__:
                raise ValueError(
                    f"this model was saved with a {saved['controller']}; the "
                    f"callback's controller is a {type(self.controller).__name__}"
                )
            self.controller.load_state_dict(saved["state"])
            self._updates = saved["updates"]
        model.__dict__[SAVED] = _SavedState(self)
        if self._kind == _SAC and getattr(model, "ent_coef_optimizer", None) is not None:
            # SB3's own rule would train log_ent_coef and use it; with the
            # optimiser gone, train() (and save()) use ent_coef_tensor.
            model.ent_coef_optimizer = None
            if self.verbose >= 1:
                print(
                    "EntropyControllerCallback: SAC's ent_coef='auto' rule is off; "
                    f"{type(self.controller).__name__} sets ent_coef_tensor"
                )
        self._apply(float(self.controller.alpha))

    def _apply(self, alpha: float) -> None:
        """Write ``alpha`` where SB3's ``train()`` reads the entropy coefficient."""
        model = self.model
        if self._kind == _ON_POLICY:
            model.ent_coef = alpha
        else:
            model.ent_coef_tensor = torch.tensor(alpha, dtype=torch.float32, device=model.device)
            model.ent_coef = alpha  # what SAC(ent_coef=...) would hold; informative only

    # --------------------------------------------------------------- entropy
    @torch.no_grad()
    def _rollout_entropy(self) -> torch.Tensor:
        """Mean entropy of the current policy over the rollout buffer's observations."""
        model = self.model
        obs = _flatten_rollout_observations(model.rollout_buffer)
        n, chunk = _length(obs), self._batch_size or 4096
        total = torch.zeros((), dtype=torch.float64, device=model.device)
        for start in range(0, n, chunk):
            batch = obs_as_tensor(_slice(obs, start, start + chunk), model.device)
            entropy = model.policy.get_distribution(batch).entropy()
            if entropy is None:
                raise TypeError(
                    f"{type(model.policy.action_dist).__name__} has no closed-form "
                    "entropy; EntropyControllerCallback needs one for PPO/A2C"
                )
            total += entropy.sum(dtype=torch.float64)
        return (total / max(n, 1)).to(torch.float32)

    @torch.no_grad()
    def _replay_entropy(self) -> torch.Tensor:
        """Mean ``-log_prob`` of the current actor's fresh actions on a replay batch."""
        model = self.model
        batch_size = self._batch_size or model.batch_size
        data = model.replay_buffer.sample(batch_size, env=model.get_vec_normalize_env())
        _, log_prob = model.actor.action_log_prob(data.observations)
        return -log_prob.mean()

    def _will_train(self) -> bool:
        """Whether SB3 calls ``train()`` after this rollout (off-policy: past learning_starts)."""
        model = self.model
        if self._kind == _ON_POLICY:
            return True
        return model.num_timesteps > 0 and model.num_timesteps > model.learning_starts

    # --------------------------------------------------------------- events
    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if not self._will_train():
            return
        model = self.model
        total = getattr(model, "_total_timesteps", 0) or 0
        if total > 0:
            schedulers.update_progress("percent", min(1.0, model.num_timesteps / total))
        schedulers.update_progress("env_steps", model.num_timesteps)
        schedulers.update_progress("iterations", self._updates)
        entropy = self._rollout_entropy() if self._kind == _ON_POLICY else self._replay_entropy()
        alpha = float(self.controller.adjust_alpha(entropy))
        self._updates += 1
        self._apply(alpha)
        for key, value in self._record(float(entropy), alpha).items():
            self.logger.record(f"{self._log_prefix}/{key}", value)

    def _record(self, entropy: float, alpha: float) -> Dict[str, float]:
        controller = self.controller
        return {
            "alpha": alpha,
            "entropy": entropy,
            "target_entropy": float(controller.target_entropy),
            "stage": int(controller.stage),
        }
