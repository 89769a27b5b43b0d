"""``ActorCriticAlgorithm``: advantage actor-critic (A2C) with GAE and an optional entropy
controller: ``train_from_unroll`` runs ``num_epochs`` x ``num_minibatches`` shuffled updates
(``PPOAlgorithm`` changes the policy-gradient term).  ``LAST`` steps are masked out of every
loss; truncated episodes bootstrap.  K agents (``batch_shape=(K,)``): the same code on
``[K, ...]`` tensors, every mean, normalisation, clip and skip per agent.
"""

import functools
import operator
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
import torch.distributions as td
import torch.nn as nn

from alf_entropy.algorithms.algorithm import Algorithm, OptimizerArg
from alf_entropy.algorithms.on_policy_unroll import (
    ActorCriticInfo,
    ActorCriticLossInfo,
    minibatches,
    time_into_rows,
    with_advantages,
)
from alf_entropy.controllers import (
    EntropyController,
    EntropyTargetAlgorithm,
    NestedEntropyTargetAlgorithm,
)
from alf_entropy.controllers.ops import member_mean
from alf_entropy.data_structures import AlgStep, Experience, LossInfo, StepType, TimeStep
from alf_entropy.networks import ActorDistributionNetwork, ValueNetwork, mode_of
from alf_entropy.networks.stacked import categorical_sampler, draw
from alf_entropy.utils import dist_utils, nest, schedulers, summary, value_ops
from alf_entropy.utils.checks import check_callable, check_choice, check_int, check_real
from alf_entropy.utils.optimizers import default_optimizer

__all__ = ["ActorCriticInfo", "ActorCriticLossInfo", "ActorCriticAlgorithm", "default_optimizer"]


def _sum_leaves(value: Any) -> torch.Tensor:
    """The sum over a nest of tensors (the tensor itself if not nested)."""
    return functools.reduce(operator.add, nest.flatten(value))


class ActorCriticAlgorithm(Algorithm):
    """Advantage actor-critic with GAE (see the module docstring).

    Args:
        observation_spec: the observation spec (nest of ``TensorSpec``).
        action_spec: the action spec (nest of ``BoundedTensorSpec``).
        actor_network_ctor: ``(observation_spec, action_spec) -> network`` of distributions.
        value_network_ctor: ``(observation_spec) -> network`` of values ``[B]``.
        optimizer: a factory ``params -> Optimizer``; ``None``: :func:`default_optimizer`.
        gamma: reward discount in ``[0, 1]`` (times the env's discount).
        td_lambda: GAE lambda in ``[0, 1]``.
        normalize_advantages: normalise each minibatch's advantages (over valid steps).
        td_loss_weight: weight (>= 0) of the squared TD error.
        reward_scale: rewards are multiplied by this (> 0) first.
        entropy_regularization: a fixed entropy coefficient (>= 0, or a scheduler).
        enforce_entropy_target: let an entropy controller set the coefficient instead.
        entropy_target_cls: ``(action_spec, debug_summaries=) -> controller`` (None: ALF's).
        entropy_target_update: ``"per_minibatch"`` (ALF's) or ``"per_iteration"`` (one update
            from the iteration's entropies: the controller's ``accumulate`` and ``step``).
        max_grad_norm: clip the gradient norm to this (``None``: no clipping).
        num_epochs: passes over each unroll (1 for A2C).
        num_minibatches: minibatches per pass (1 for A2C: the whole unroll).
        fast_acting: act and train through the actor's closed forms where it has them
            (``sample_with_log_prob``, ``log_prob_and_entropy``: the same values).
        debug_summaries: write extra summaries (passed to the controller too).
        name: the name (summary scope).
        batch_shape: ``()`` for one agent, ``(K,)`` for K stacked agents.
    """

    def __init__(
        self,
        observation_spec: Any,
        action_spec: Any,
        actor_network_ctor: Callable[..., nn.Module] = ActorDistributionNetwork,
        value_network_ctor: Callable[..., nn.Module] = ValueNetwork,
        optimizer: OptimizerArg = None,
        gamma: float = 0.99,
        td_lambda: float = 0.95,
        normalize_advantages: bool = False,
        td_loss_weight: float = 0.5,
        reward_scale: float = 1.0,
        entropy_regularization: Optional[Union[float, Callable[[], float]]] = None,
        enforce_entropy_target: bool = False,
        entropy_target_cls: Optional[Callable] = None,
        entropy_target_update: str = "per_minibatch",
        max_grad_norm: Optional[float] = 0.5,
        num_epochs: int = 1,
        num_minibatches: int = 1,
        fast_acting: bool = True,
        debug_summaries: bool = False,
        name: str = "ActorCriticAlgorithm",
        batch_shape: Tuple[int, ...] = (),
    ):
        super().__init__(
            optimizer=default_optimizer if optimizer is None else optimizer,
            debug_summaries=debug_summaries,
            name=name,
            batch_shape=batch_shape,
        )
        check_callable("actor_network_ctor", actor_network_ctor)
        check_callable("value_network_ctor", value_network_ctor)
        check_choice(
            "entropy_target_update", entropy_target_update, ("per_minibatch", "per_iteration")
        )
        if enforce_entropy_target and entropy_regularization is not None:
            raise ValueError(
                "entropy_regularization must be None when enforce_entropy_target "
                "is True (the entropy controller sets the coefficient)"
            )
        if entropy_regularization is not None and not callable(entropy_regularization):
            check_real("entropy_regularization", entropy_regularization, minimum=0.0)
        self._settings = dict(
            gamma=check_real("gamma", gamma, minimum=0.0, maximum=1.0),
            td_lambda=check_real("td_lambda", td_lambda, minimum=0.0, maximum=1.0),
            reward_scale=check_real("reward_scale", reward_scale, positive=True),
            normalize_advantages=bool(normalize_advantages),
            td_loss_weight=check_real("td_loss_weight", td_loss_weight, minimum=0.0),
            max_grad_norm=check_real(
                "max_grad_norm", max_grad_norm, positive=True, allow_none=True
            ),
            entropy_target_update=entropy_target_update,
            num_epochs=check_int("num_epochs", num_epochs, minimum=1),
            num_minibatches=check_int("num_minibatches", num_minibatches, minimum=1),
        )
        self._observation_spec, self._action_spec = observation_spec, action_spec
        self._entropy_regularization = (
            None
            if entropy_regularization is None
            else schedulers.as_scheduler(entropy_regularization)
        )
        self._actor_network = actor_network_ctor(observation_spec, action_spec)
        self._value_network = value_network_ctor(observation_spec)
        self._entropy_target_algorithm: Optional[EntropyController] = None
        self.entropy_target_cls = entropy_target_cls or (
            NestedEntropyTargetAlgorithm if nest.is_nested(action_spec) else EntropyTargetAlgorithm
        )
        if enforce_entropy_target:
            self._entropy_target_algorithm = self.entropy_target_cls(
                action_spec, debug_summaries=debug_summaries
            )
        self._fast_acting = fast_acting and hasattr(self._actor_network, "sample_with_log_prob")
        own_entropy = getattr(type(self._entropy_target_algorithm), "entropy", None)
        self._fast_training = (
            fast_acting
            and hasattr(self._actor_network, "log_prob_and_entropy")
            and own_entropy in (None, EntropyController.entropy)
        )
        # One agent's count is not saved: its checkpoints keep their layout.
        self.register_buffer(
            "_num_skipped",
            torch.zeros(self.batch_shape, dtype=torch.int64),
            persistent=bool(self.batch_shape),
        )
        self.optimizers()  # made now, so that a checkpoint can restore their state at once

    observation_spec = property(lambda self: self._observation_spec, doc="The observation spec.")
    action_spec = property(lambda self: self._action_spec, doc="The action spec.")
    actor_network = property(lambda self: self._actor_network, doc="The policy network.")
    value_network = property(lambda self: self._value_network, doc="The value network.")
    entropy_target_algorithm = property(
        lambda self: self._entropy_target_algorithm, doc="The entropy controller, or ``None``."
    )
    num_skipped_updates = property(
        lambda self: self._num_skipped, doc="Updates skipped as not finite (``batch_shape`` int64)."
    )

    @property
    def settings(self) -> Dict[str, Any]:
        """The training settings as constructed (a copy; ``gamma``, ``num_epochs``, ...)."""
        return dict(self._settings)

    def entropy_coefficient(self) -> Union[float, torch.Tensor]:
        """The controller's ``alpha``, else the (scheduled) ``entropy_regularization``, else 0."""
        if self._entropy_target_algorithm is not None:
            return self._entropy_target_algorithm.alpha
        regularization = self._entropy_regularization
        return 0.0 if regularization is None else float(regularization())

    def _mean(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The masked mean of each member (``batch_shape``)."""
        return member_mean(x, mask, len(self.batch_shape))[0]

    def _log_prob(self, dist: Any, action: Any) -> torch.Tensor:
        """``log pi(action)`` summed over the action nest."""
        if isinstance(dist, td.Distribution):  # no nest walking
            return dist.log_prob(action)
        return _sum_leaves(nest.map_structure(lambda d, a: d.log_prob(a), dist, action))

    def predict_step(self, inputs: TimeStep, state: Any = ()) -> AlgStep:
        """The deterministic (mode) action, for evaluation."""
        return AlgStep(output=mode_of(self._actor_network(inputs.observation)), state=state)

    def rollout_step(self, inputs: TimeStep, state: Any = ()) -> AlgStep:
        """Sample an action, keep its ``log_prob`` (under ``torch.no_grad()``)."""
        gens = self.generators
        drawn = self._fast_acting and self._actor_network.sample_with_log_prob(
            inputs.observation, categorical_sampler(gens)
        )
        if not drawn:
            dist = self._actor_network(inputs.observation)
            action = nest.map_structure(lambda d: draw(d, gens), dist)
            drawn = action, self._log_prob(dist, action)
        return AlgStep(output=drawn[0], state=state, info=ActorCriticInfo(log_prob=drawn[1]))

    def train_step(self, inputs: Experience, state: Any = (), rollout_info: Any = ()) -> AlgStep:
        """Recompute a flat minibatch's distribution, entropy and value, with gradients."""
        observation, controller = inputs.time_step.observation, self._entropy_target_algorithm
        fast = self._fast_training and self._actor_network.log_prob_and_entropy(
            observation, inputs.action
        )  # the same bits, without the distribution object
        if fast:
            log_prob, entropy = fast
            for_gradient = entropy
        else:
            dist = self._actor_network(observation)
            log_prob = self._log_prob(dist, inputs.action)
            entropy_of = (
                dist_utils.entropy_with_fallback if controller is None else controller.entropy
            )
            entropy, for_gradient = entropy_of(dist)
        return AlgStep(
            output=(),
            state=state,
            info=ActorCriticInfo(
                value=self._value_network(observation),
                log_prob=log_prob,
                entropy=entropy,
                entropy_for_gradient=for_gradient,
            ),
        )

    def preprocess_experience(
        self, experience: Experience, final_time_step: TimeStep
    ) -> Experience:
        """Values, advantages and returns; ``[T, *batch_shape, B]`` -> ``[*batch_shape, T*B]``."""
        nb = len(self.batch_shape)
        with torch.no_grad():
            t, b = experience.step_type.shape[0], experience.step_type.shape[-1]
            observations = nest.map_structure(  # all T + 1 in one forward pass
                lambda x, y: time_into_rows(torch.cat([x, y.unsqueeze(0)]), nb),
                experience.time_step.observation,
                final_time_step.observation,
            )
            values = self._value_network(observations).unflatten(nb, (t + 1, b)).movedim(nb, 0)
            experience = self.with_advantages(experience, final_time_step, values)
            return nest.map_structure(lambda x: time_into_rows(x, nb), experience)

    def with_advantages(
        self, experience: Experience, final_time_step: TimeStep, values: torch.Tensor
    ) -> Experience:
        """The unroll with ``value``, GAE ``advantages`` and ``returns`` from ``values``
        ``[T + 1, ...]`` (the last bootstraps): :func:`.on_policy_unroll.with_advantages`."""
        return with_advantages(experience, final_time_step, values, self._settings)

    def _policy_gradient_loss(
        self, experience: Experience, train_info: ActorCriticInfo, advantages: torch.Tensor
    ) -> torch.Tensor:
        """Per-step policy-gradient loss ``-advantage * log_prob`` (A2C)."""
        return -advantages * train_info.log_prob

    def calc_loss(self, experience: Experience, train_info: ActorCriticInfo) -> LossInfo:
        """Per-step policy-gradient + TD + entropy loss (+ the controller's)."""
        mask = self.valid_mask(experience)
        rollout_info = experience.rollout_info
        advantages = rollout_info.advantages
        if self._settings["normalize_advantages"]:
            advantages = value_ops.normalize_advantages(
                advantages, mask, batch_ndim=len(self.batch_shape)
            )
        pg_loss = self._policy_gradient_loss(experience, train_info, advantages)
        td_loss = (train_info.value - rollout_info.returns).square()
        loss = pg_loss + self._settings["td_loss_weight"] * td_loss
        if self._entropy_regularization is not None:
            loss = loss - float(self._entropy_regularization()) * train_info.entropy_for_gradient
        controller = self._entropy_target_algorithm
        if controller is not None:
            per_minibatch = self._settings["entropy_target_update"] == "per_minibatch"
            if not per_minibatch:  # one update an iteration, from all its entropies
                controller.accumulate(train_info.entropy, mask)
            li = controller.entropy_loss(
                train_info.entropy, mask, train_info.entropy_for_gradient, per_minibatch
            )
            loss = loss + li.loss
        return LossInfo(
            loss=loss,
            extra=ActorCriticLossInfo(
                pg_loss=pg_loss, td_loss=td_loss, entropy=_sum_leaves(train_info.entropy)
            ),
        )

    @staticmethod
    def valid_mask(experience: Experience) -> torch.Tensor:
        """Steps that take part in the loss: all but ``LAST`` ones (bool, ``step_type``'s shape)."""
        return experience.step_type != StepType.LAST

    def train_from_unroll(
        self, experience: Experience, final_time_step: TimeStep
    ) -> Tuple[LossInfo, ActorCriticInfo, torch.Tensor]:
        """All updates of an unroll; the last's ``(loss_info, train_info, valid_mask)``."""
        exp = self.preprocess_experience(experience, final_time_step)
        with self.fixed_tree():
            for _ in range(self._settings["num_epochs"]):
                for batch in minibatches(self, exp):
                    train_info = self.train_step(batch).info
                    loss_info = self.calc_loss(batch, train_info)
                    mask = self.valid_mask(batch)
                    loss_info, _ = self.update_with_gradient(
                        loss_info,
                        valid_masks=mask,
                        max_grad_norm=self._settings["max_grad_norm"],
                        skipped_counter=self._num_skipped,
                    )
                    self.after_update()
                    last_batch = batch
        if self._entropy_target_algorithm is not None:
            self._entropy_target_algorithm.step()  # the iteration's end
        if summary.should_record_summaries():
            self.summarize_train(last_batch, loss_info, train_info, mask)
        return loss_info, train_info, mask

    def summarize_train(
        self,
        experience: Experience,
        loss_info: LossInfo,
        train_info: ActorCriticInfo,
        mask: torch.Tensor,
    ) -> None:
        """Each agent's ``alpha``, ``entropy``, ``target_entropy``, ``stage`` (nested: also
        per leaf), ``loss/total|pg|td``; debug: advantage, value, explained variance."""
        main = loss_info.extra
        summary.scalar("loss/total", loss_info.loss)
        summary.scalar("loss/pg", self._mean(main.pg_loss, mask))
        summary.scalar("loss/td", self._mean(main.td_loss, mask))
        summary.scalar("entropy", self._mean(_sum_leaves(train_info.entropy), mask))
        summary.scalar("alpha", self.entropy_coefficient())
        controller = self._entropy_target_algorithm
        if controller is not None:
            leaves = controller.leaf_algorithms()
            for key, leaf in leaves.items() if len(leaves) > 1 else ():  # nested: each action's
                for tag in ("alpha", "target_entropy", "stage"):
                    summary.scalar(f"{tag}/{key}", getattr(leaf, tag))
            summary.scalar("target_entropy", controller.target_entropy)
            summary.scalar("stage", controller.stage)
        if self._debug_summaries:
            with summary.scope(self.name):
                info = experience.rollout_info
                summary.scalar("advantage_mean", self._mean(info.advantages, mask))
                summary.scalar("value_mean", self._mean(train_info.value, mask))
                centered = info.returns - self._mean(info.returns, mask).unsqueeze(-1)
                var_ret = self._mean(centered.square(), mask)
                var_err = self._mean((info.returns - train_info.value).square(), mask)
                summary.scalar("explained_variance", 1.0 - var_err / var_ret.clamp(min=1e-8))
