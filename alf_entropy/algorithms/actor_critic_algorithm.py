"""``ActorCriticAlgorithm``: advantage actor-critic (A2C) with GAE.

The algorithm owns an actor (``ActorDistributionNetwork``) and a critic
(``ValueNetwork``) and, optionally, an entropy controller
(``EntropyTargetAlgorithm`` or any class with its interface) as a
sub-algorithm.  One training iteration of :class:`OnPolicyTrainer` is:

1. ``rollout_step(time_step)`` for ``T`` steps of a batch of ``B``
   environments, without gradient: sample an action and keep its
   ``log_prob`` in ``ActorCriticInfo``.
2. ``train_from_unroll(experience, final_time_step)``:

   * ``preprocess_experience`` computes the values of the ``T + 1``
     observations (the unroll's and the one after it, for bootstrapping) in
     one batched forward pass -- the same values as one pass per step, at a
     fraction of the per-call overhead -- then GAE advantages and
     TD(lambda) returns (``alf_entropy.utils.value_ops``), and flattens
     ``[T, B]`` to ``[T*B]``;
   * for each of ``num_epochs`` epochs and each of ``num_minibatches``
     (shuffled) minibatches: ``train_step`` recomputes the action
     distribution and value with gradients, ``calc_loss`` builds the loss
     and ``update_with_gradient`` takes one optimiser step.

   For A2C ``num_epochs = num_minibatches = 1`` (one update on the whole
   batch); :class:`~alf_entropy.algorithms.ppo_algorithm.PPOAlgorithm`
   changes the policy-gradient term and the loop sizes.

Episode boundaries: with ALF's time-step semantics a ``LAST`` step's action is
ignored by the environment (the next step is the ``FIRST`` step of a new
episode, with reward 0), so ``LAST`` steps get zero advantage and are masked
out of every loss term; a truncated episode (``LAST`` with discount 1) is
bootstrapped from the value of its final observation, a terminated one
(discount 0) is not.

Entropy: ``entropy_regularization`` adds ``-coef * entropy`` to the loss
(``coef`` a number or a scheduler).  With ``enforce_entropy_target=True`` the
coefficient is instead adapted by the entropy controller: the algorithm calls
its ``train_step``, adds its ``calc_loss`` (which adjusts ``alpha`` once per
call, i.e. once per minibatch) to the loss, and its state is part of this
algorithm's ``state_dict``.  With ``entropy_target_update="per_iteration"``
the minibatches read ``alpha`` (``entropy_loss(..., update=False)``) and
``train_from_unroll`` calls ``adjust_alpha`` once per unroll with the mean of
their entropies.
"""
import contextlib
import math
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import gin
import torch
import torch.distributions as td
import torch.nn as nn

from alf_entropy.algorithm import Algorithm, OptimizerArg, combine_loss_infos
from alf_entropy.data_structures import (
    AlgStep,
    Experience,
    LossInfo,
    StepType,
    TimeStep,
    namedtuple,
)
from alf_entropy.networks import ActorDistributionNetwork, ValueNetwork, mode_of
from alf_entropy.utils import entropies, nest, schedulers, summary, value_ops
from alf_entropy.utils.checks import check_callable, check_choice, check_int, check_real
from alf_entropy.utils.math_ops import masked_mean
from alf_entropy.utils.optimizers import FusedAdam

__all__ = [
    "ActorCriticInfo",
    "ActorCriticLossInfo",
    "ActorCriticAlgorithm",
    "default_optimizer",
]

ActorCriticInfo = namedtuple(
    "ActorCriticInfo",
    [
        "value",  # [B]: V(observation) (preprocess_experience: without gradient)
        "log_prob",  # [B]: log pi(action | observation)
        "advantages",  # [B]: GAE advantage (set by preprocess_experience)
        "returns",  # [B]: TD(lambda) return (set by preprocess_experience)
        "entropy",  # [B]: entropy of pi(. | observation) (train_step only)
        "entropy_for_gradient",  # [B]: entropy to differentiate (train_step only)
        "entropy_target",  # info of the entropy controller (or ())
    ],
    default_value=(),
)
"""Per-step information of ``rollout_step``/``train_step``."""

ActorCriticLossInfo = namedtuple(
    "ActorCriticLossInfo",
    ["pg_loss", "td_loss", "neg_entropy"],
    default_value=(),
)
"""Per-step loss terms (``LossInfo.extra`` of ``calc_loss``)."""


@gin.configurable
def default_optimizer(
    params: List[nn.Parameter], lr: float = 3e-4, eps: float = 1e-5
) -> torch.optim.Optimizer:
    """The optimiser used when none is given: ``Adam(lr=3e-4, eps=1e-5)``.

    Its learning rate is bound in gin as ``default_optimizer.lr = 1e-3``
    (``torch.optim.Adam.lr`` configures ``@torch.optim.Adam``, which the
    default does not use).

    Args:
        params: the parameters to optimise.
        lr: the learning rate (> 0).
        eps: Adam's epsilon (>= 0).

    Returns:
        torch.optim.Optimizer: the optimiser.
    """
    lr = check_real("default_optimizer.lr", lr, positive=True)
    eps = check_real("default_optimizer.eps", eps, minimum=0.0)
    return FusedAdam(params, lr=lr, eps=eps)


_ENTROPY_TARGET_UPDATES = ("per_minibatch", "per_iteration")


def _sum_leaves(value: Any) -> torch.Tensor:
    """The sum over a nest of tensors (the tensor itself if not nested)."""
    leaves = nest.flatten(value)
    total = leaves[0]
    for leaf in leaves[1:]:
        total = total + leaf
    return total


def _is_nested_spec(spec: Any) -> bool:
    return nest.is_nested(spec)


@gin.configurable
class ActorCriticAlgorithm(Algorithm):
    """Advantage actor-critic with GAE (see the module docstring).

    Args:
        observation_spec: the observation spec (nest of ``TensorSpec``).
        action_spec: the action spec (nest of ``BoundedTensorSpec``).
        actor_network_ctor: ``(input_tensor_spec, action_spec) -> network``
            returning a (nest of) action distribution(s).
        value_network_ctor: ``(input_tensor_spec) -> network`` returning
            values ``[B]``.
        optimizer: an optimiser factory ``params -> Optimizer`` (e.g.
            ``functools.partial(torch.optim.Adam, lr=1e-3)``, or in gin
            ``@torch.optim.Adam``) or ``None`` for :func:`default_optimizer`.
        gamma: reward discount in ``[0, 1]``; multiplies the environment's
            discount (0 on termination).
        td_lambda: GAE lambda in ``[0, 1]``.
        normalize_advantages: normalise advantages to zero mean and unit std
            over the valid steps of each minibatch.
        td_loss_weight: weight (>= 0) of the squared TD error
            ``(V - return)^2``.
        reward_scale: rewards are multiplied by this (> 0) before computing
            advantages and returns (e.g. 0.1 for Pendulum's large negative
            rewards, so value errors do not dominate gradient clipping).
        entropy_regularization: a fixed entropy coefficient (a number >= 0 or
            a scheduler), or ``None`` for none.  Exclusive with
            ``enforce_entropy_target``.
        enforce_entropy_target: adapt the entropy coefficient with an entropy
            controller so that the policy entropy follows its target.
        entropy_target_cls: the controller class, called as
            ``entropy_target_cls(action_spec, debug_summaries=...)``; ``None``
            means ``EntropyTargetAlgorithm`` (``NestedEntropyTargetAlgorithm``
            for a nested ``action_spec``).  Only used with
            ``enforce_entropy_target``.
        entropy_target_update: when the controller advances:
            ``"per_minibatch"`` (ALF's, the default: once per gradient update)
            or ``"per_iteration"`` (once per unroll, after all updates, from
            the mean entropy of its minibatches; the minibatches use the
            ``alpha`` of the iteration's start).  With many minibatches per
            unroll the fast rate (log 2 per update) can swing ``alpha`` by
            orders of magnitude within one unroll; once per unroll it moves
            at most one step per unroll.
        max_alpha_change_per_iteration: opt-in cap (> 1): within one
            iteration (``num_epochs x num_minibatches`` updates) the largest
            and smallest ``alpha`` (each action's, for a nested controller)
            differ by at most this factor, whatever the controller.  None: no
            cap.
        max_grad_norm: clip the global gradient norm to this (``None``: no
            clipping).
        num_epochs: passes over each unroll (1 for A2C).
        num_minibatches: minibatches per pass (1 for A2C: the whole unroll).
        fast_acting: act through the actor network's ``sample_with_log_prob``
            where it offers one (an ``ActorDistributionNetwork`` with one
            categorical head: the draws of ``dist.sample()`` and
            ``dist.log_prob``, without building ``dist``); the controller's
            ``rollout_step`` is then not called (off-policy it returns
            nothing).  ``False``: always build the distribution and pass it
            to the controller's ``rollout_step`` (for a controller that
            watches the rollouts, or a subclass that changes ``_log_prob``).
        debug_summaries: write extra summaries (passed to the controller too).
        name: the name (summary scope).

    Raises:
        ValueError: for out-of-range arguments, or when both
            ``entropy_regularization`` and ``enforce_entropy_target`` are set.
        TypeError: if a network ctor is not callable, or a numeric argument
            is not a number.
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
        entropy_target_cls: Optional[Callable[..., Algorithm]] = None,
        entropy_target_update: str = "per_minibatch",
        max_alpha_change_per_iteration: Optional[float] = None,
        max_grad_norm: Optional[float] = 0.5,
        num_epochs: int = 1,
        num_minibatches: int = 1,
        fast_acting: bool = True,
        debug_summaries: bool = False,
        name: str = "ActorCriticAlgorithm",
    ):
        super().__init__(
            optimizer=default_optimizer if optimizer is None else optimizer,
            debug_summaries=debug_summaries,
            name=name,
        )
        check_callable("actor_network_ctor", actor_network_ctor)
        check_callable("value_network_ctor", value_network_ctor)
        check_choice("entropy_target_update", entropy_target_update, _ENTROPY_TARGET_UPDATES)
        self._entropy_target_update = entropy_target_update
        self._per_iteration = entropy_target_update == "per_iteration"
        cap = check_real("max_alpha_change_per_iteration", max_alpha_change_per_iteration,
                         above=1.0, allow_none=True)
        self._log_alpha_cap = None if cap is None else math.log(cap)
        if enforce_entropy_target and entropy_regularization is not None:
            raise ValueError(
                "entropy_regularization must be None when enforce_entropy_target is "
                "True (the entropy controller sets the coefficient)"
            )
        if entropy_regularization is not None and not callable(entropy_regularization):
            check_real("entropy_regularization", entropy_regularization, minimum=0.0)

        self._observation_spec = observation_spec
        self._action_spec = action_spec
        self._gamma = check_real("gamma", gamma, minimum=0.0, maximum=1.0)
        self._td_lambda = check_real("td_lambda", td_lambda, minimum=0.0, maximum=1.0)
        self._normalize_advantages = bool(normalize_advantages)
        self._td_loss_weight = check_real("td_loss_weight", td_loss_weight, minimum=0.0)
        self._reward_scale = check_real("reward_scale", reward_scale, positive=True)
        self._max_grad_norm = check_real("max_grad_norm", max_grad_norm, positive=True,
                                         allow_none=True)
        self._num_epochs = check_int("num_epochs", num_epochs, minimum=1)
        self._num_minibatches = check_int("num_minibatches", num_minibatches, minimum=1)
        self._entropy_regularization = (
            None
            if entropy_regularization is None
            else schedulers.as_scheduler(entropy_regularization)
        )

        self._actor_network = actor_network_ctor(observation_spec, action_spec)
        self._value_network = value_network_ctor(observation_spec)

        self._entropy_target_algorithm: Optional[Algorithm] = None
        if enforce_entropy_target:
            if entropy_target_cls is None:
                from alf_entropy.algorithms import entropy_target_algorithm as eta

                entropy_target_cls = (
                    eta.NestedEntropyTargetAlgorithm
                    if _is_nested_spec(action_spec)
                    else eta.EntropyTargetAlgorithm
                )
            self._entropy_target_algorithm = entropy_target_cls(
                action_spec, debug_summaries=debug_summaries
            )
        self._fast_acting = bool(fast_acting) and isinstance(
            self._actor_network, ActorDistributionNetwork
        )
        # Created now so that a checkpoint can restore its state at once.
        self.optimizers()

    # ------------------------------------------------------------ properties
    @property
    def observation_spec(self) -> Any:
        """The observation spec."""
        return self._observation_spec

    @property
    def action_spec(self) -> Any:
        """The action spec."""
        return self._action_spec

    @property
    def actor_network(self) -> nn.Module:
        """The policy network."""
        return self._actor_network

    @property
    def value_network(self) -> nn.Module:
        """The value network."""
        return self._value_network

    @property
    def entropy_target_algorithm(self) -> Optional[Algorithm]:
        """The entropy controller, or ``None`` when the target is not enforced."""
        return self._entropy_target_algorithm

    @property
    def num_epochs(self) -> int:
        """Passes over each unroll."""
        return self._num_epochs

    @property
    def num_minibatches(self) -> int:
        """Minibatches per pass."""
        return self._num_minibatches

    @property
    def settings(self) -> Dict[str, Any]:
        """The training settings, as constructed (a copy: changing it changes nothing).

        Returns:
            dict: ``gamma``, ``td_lambda``, ``reward_scale``, ``normalize_advantages``,
            ``td_loss_weight``, ``max_grad_norm`` (None: no clipping),
            ``entropy_target_update``, ``num_epochs`` and ``num_minibatches``: what a
            batch of K such agents applies per agent.
        """
        return dict(gamma=self._gamma, td_lambda=self._td_lambda,
                    reward_scale=self._reward_scale,
                    normalize_advantages=self._normalize_advantages,
                    td_loss_weight=self._td_loss_weight, max_grad_norm=self._max_grad_norm,
                    entropy_target_update=self._entropy_target_update,
                    num_epochs=self._num_epochs, num_minibatches=self._num_minibatches)

    def entropy_coefficient(self) -> Union[float, torch.Tensor]:
        """The current entropy coefficient, for summaries.

        Returns:
            The controller's ``alpha`` when the target is enforced, else the
            (scheduled) ``entropy_regularization``, else 0.
        """
        if self._entropy_target_algorithm is not None:
            return self._entropy_target_algorithm.alpha
        if self._entropy_regularization is not None:
            return float(self._entropy_regularization())
        return 0.0

    # ----------------------------------------------------------------- steps
    def _log_prob(self, dist: Any, action: Any) -> torch.Tensor:
        """``log pi(action)`` summed over the action nest."""
        if isinstance(dist, td.Distribution):  # no nest walking
            return dist.log_prob(action)
        log_probs = nest.map_structure(lambda d, a: d.log_prob(a), dist, action)
        flat = nest.flatten(log_probs)
        total = flat[0]
        for lp in flat[1:]:
            total = total + lp
        return total

    def predict_step(self, inputs: TimeStep, state: Any = ()) -> AlgStep:
        """The deterministic (mode) action, for evaluation.

        Args:
            inputs: a ``TimeStep`` with batched ``observation``.
            state: unused (no recurrent state).

        Returns:
            AlgStep: ``output`` is the action nest.
        """
        dist = self._actor_network(inputs.observation)
        return AlgStep(output=mode_of(dist), state=state)

    def _draw(self, observation: Any) -> Tuple[Any, torch.Tensor, Any]:
        """One draw from the policy: ``(action, log_prob, dist)``.

        With ``fast_acting`` the network draws without building the
        distribution (``dist`` is then None); it declines (None) what it does
        not cover (a hook, ``ALF_ENTROPY_ACCEL=0``), which can change after
        construction, so that is asked per call.
        """
        if self._fast_acting:
            drawn = self._actor_network.sample_with_log_prob(observation)
            if drawn is not None:
                return drawn[0], drawn[1], None
        dist = self._actor_network(observation)
        if isinstance(dist, td.Distribution):
            action = dist.sample()
        else:
            action = nest.map_structure(lambda d: d.sample(), dist)
        return action, self._log_prob(dist, action), dist

    def rollout_step(self, inputs: TimeStep, state: Any = ()) -> AlgStep:
        """Sample an action; keep its log-probability.

        Call it under ``torch.no_grad()``: everything is recomputed with
        gradient in ``train_step``.  The state values are computed for the
        whole unroll at once by ``preprocess_experience``.

        Args:
            inputs: a ``TimeStep`` with batched ``observation`` and
                ``step_type``.
            state: unused (no recurrent state).

        Returns:
            AlgStep: ``output`` the action nest, ``info`` an
            ``ActorCriticInfo(log_prob, entropy_target)``.
        """
        action, log_prob, dist = self._draw(inputs.observation)
        entropy_target_info = ()
        if not self._fast_acting and self._entropy_target_algorithm is not None:
            # Rollout infos are not trained on directly: train_step
            # recomputes the distribution, so the controller only acts there.
            entropy_target_info = self._entropy_target_algorithm.rollout_step(
                dist, inputs.step_type, on_policy_training=False
            ).info
        return AlgStep(
            output=action,
            state=state,
            info=ActorCriticInfo(log_prob=log_prob, entropy_target=entropy_target_info),
        )

    def train_step(self, inputs: Experience, state: Any = (), rollout_info: Any = ()) -> AlgStep:
        """Recompute the distribution and value of a batch, with gradients.

        Args:
            inputs: an ``Experience`` with flat batch ``[N]`` (from
                ``preprocess_experience``).
            state: unused (no recurrent state).
            rollout_info: unused (``inputs.rollout_info`` is used).

        Returns:
            AlgStep: ``info`` an ``ActorCriticInfo`` with ``value``,
            ``log_prob`` of the stored action, ``entropy``,
            ``entropy_for_gradient`` and the controller's ``entropy_target``
            info.
        """
        observation = inputs.time_step.observation
        dist = self._actor_network(observation)
        value = self._value_network(observation)
        log_prob = self._log_prob(dist, inputs.action)
        entropy_target_info = ()
        if self._entropy_target_algorithm is None:
            entropy, entropy_for_gradient = entropies.entropy_with_fallback(dist)
        else:
            # The entropy is computed once, by the controller; the summaries
            # and the loss use the same values (and samples).
            entropy_target_info = self._entropy_target_algorithm.train_step(
                dist, inputs.step_type
            ).info
            entropy = -_sum_leaves(entropy_target_info.loss.extra.neg_entropy)
            entropy_for_gradient = -_sum_leaves(entropy_target_info.loss.loss)
        return AlgStep(
            output=(),
            state=state,
            info=ActorCriticInfo(
                value=value,
                log_prob=log_prob,
                entropy=entropy,
                entropy_for_gradient=entropy_for_gradient,
                entropy_target=entropy_target_info,
            ),
        )

    # -------------------------------------------------------------- training
    def preprocess_experience(
        self, experience: Experience, final_time_step: TimeStep
    ) -> Experience:
        """Add values, advantages and returns; flatten ``[T, B]`` to ``[T*B]``.

        Args:
            experience: the unroll, every leaf ``[T, B, ...]``, with
                ``rollout_info`` an ``ActorCriticInfo`` from ``rollout_step``.
            final_time_step: the time step after the unroll (``[B, ...]``),
                whose value bootstraps the last transitions.

        Returns:
            Experience: flat ``[T*B, ...]`` leaves; ``rollout_info`` has
            ``value``, ``advantages`` and ``returns`` filled in.
        """
        with torch.no_grad():
            T, B = experience.step_type.shape[:2]
            # All T + 1 observations in one forward pass ([(T+1)*B, ...]).
            observations = nest.map_structure(
                lambda x, y: torch.cat([x, y.unsqueeze(0)]).reshape(-1, *x.shape[2:]),
                experience.time_step.observation,
                final_time_step.observation,
            )
            values = self._value_network(observations).reshape(T + 1, B)
            experience = self.with_advantages(experience, final_time_step, values)
            return nest.map_structure(lambda x: x.reshape(-1, *x.shape[2:]), experience)

    def with_advantages(
        self, experience: Experience, final_time_step: TimeStep, values: torch.Tensor
    ) -> Experience:
        """The unroll with ``value``, GAE ``advantages`` and ``returns`` in its ``rollout_info``.

        GAE (:func:`~alf_entropy.utils.value_ops.generalized_advantage_estimation`)
        with this algorithm's ``gamma``, ``td_lambda`` and ``reward_scale``, the
        final time step bootstrapping the last transitions; ``returns`` is
        ``advantages + value``.  Any batch shape (``[B]`` for one agent,
        ``[K, B]`` for K agents): the recursion runs over time alone.

        Args:
            experience: the unroll, leaves ``[T, *batch, ...]``.
            final_time_step: the time step after it, leaves ``[*batch, ...]``.
            values: ``[T + 1, *batch]``, the values of the unroll's observations
                and of the final one (without gradient).

        Returns:
            Experience: ``experience`` with ``value`` (``values[:-1]``),
            ``advantages`` and ``returns`` (``[T, *batch]``) filled in.
        """
        time_step = experience.time_step

        def _with_final(x: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, final.unsqueeze(0)], dim=0)

        advantages = value_ops.generalized_advantage_estimation(
            _with_final(time_step.reward, final_time_step.reward).to(values.dtype)
            * self._reward_scale,
            values,
            _with_final(experience.step_type, final_time_step.step_type),
            _with_final(time_step.discount, final_time_step.discount).to(values.dtype)
            * self._gamma,
            td_lambda=self._td_lambda,
        )
        value = values[:-1]
        return experience._replace(rollout_info=experience.rollout_info._replace(
            value=value, advantages=advantages, returns=advantages + value))

    def _policy_gradient_loss(
        self, experience: Experience, train_info: ActorCriticInfo, advantages: torch.Tensor
    ) -> torch.Tensor:
        """Per-step policy-gradient loss ``-advantage * log_prob`` (A2C).

        Args:
            experience: the minibatch.
            train_info: ``train_step``'s info.
            advantages: the (possibly normalised) advantages.

        Returns:
            torch.Tensor: ``[N]`` loss.
        """
        return -advantages * train_info.log_prob

    def calc_loss(self, experience: Experience, train_info: ActorCriticInfo) -> LossInfo:
        """Policy-gradient + TD + entropy loss (+ the controller's loss).

        Args:
            experience: a flat minibatch from ``preprocess_experience``.
            train_info: ``train_step(experience).info``.

        Returns:
            LossInfo: per-step ``loss`` ``[N]`` (mask ``LAST`` steps when
            averaging, see :meth:`valid_mask`); ``extra`` holds
            ``ActorCriticLossInfo`` under ``"main"`` and the controller's
            extra under ``"entropy_target"``.
        """
        mask = self.valid_mask(experience)
        rollout_info = experience.rollout_info
        advantages = rollout_info.advantages
        if self._normalize_advantages:
            advantages = value_ops.normalize_advantages(advantages, mask)
        pg_loss = self._policy_gradient_loss(experience, train_info, advantages)
        td_loss = (train_info.value - rollout_info.returns).square()
        loss = pg_loss + self._td_loss_weight * td_loss
        if self._entropy_regularization is not None:
            loss = loss - float(self._entropy_regularization()) * train_info.entropy_for_gradient
        main = LossInfo(
            loss=loss,
            extra=ActorCriticLossInfo(
                pg_loss=pg_loss, td_loss=td_loss, neg_entropy=-train_info.entropy
            ),
        )
        if self._entropy_target_algorithm is None:
            return main
        controller = self._entropy_target_algorithm
        if self._per_iteration:
            # Read alpha only: train_from_unroll adjusts it once per unroll.
            info = train_info.entropy_target
            entropy_loss = controller.entropy_loss(
                nest.map_structure(torch.neg, info.loss.extra.neg_entropy),
                mask,
                nest.map_structure(torch.neg, info.loss.loss),
                update=False,
            )
        else:
            entropy_loss = controller.calc_loss(
                experience, train_info.entropy_target, valid_mask=mask
            )
        return combine_loss_infos(main, entropy_target=entropy_loss)

    @staticmethod
    def valid_mask(experience: Experience) -> torch.Tensor:
        """Steps that take part in the loss: all but ``LAST`` ones.

        Args:
            experience: any experience with a ``step_type`` tensor.

        Returns:
            torch.Tensor: a bool mask of ``step_type``'s shape.
        """
        return experience.step_type != StepType.LAST

    def _minibatches(self, exp: Experience) -> List[Experience]:
        """The minibatches of one epoch: a shuffled split into ``num_minibatches``.

        The experience is permuted once (one gather per leaf) and split into
        contiguous slices (views), which gives exactly the batches
        ``x[perm_chunk]`` for the chunks of ``torch.tensor_split(perm,
        num_minibatches)``, with fewer gathers.
        """
        num_samples = exp.step_type.shape[0]
        if self._num_minibatches == 1 and self._num_epochs == 1:
            return [exp]  # the whole unroll, unshuffled
        if num_samples < self._num_minibatches:
            raise ValueError(
                f"{self.name}: an unroll of {num_samples} steps cannot be split into "
                f"num_minibatches={self._num_minibatches}"
            )
        perm = torch.randperm(num_samples, device=exp.step_type.device)
        shuffled = nest.map_structure(lambda x: x.index_select(0, perm), exp)
        splits = [x.tensor_split(self._num_minibatches) for x in nest.flatten(shuffled)]
        return [nest.pack_sequence_as(shuffled, leaves) for leaves in zip(*splits)]

    def train_from_unroll(
        self, experience: Experience, final_time_step: TimeStep
    ) -> Tuple[LossInfo, ActorCriticInfo, torch.Tensor]:
        """Train on one unroll: ``num_epochs`` x ``num_minibatches`` updates.

        Args:
            experience: the unroll, leaves ``[T, B, ...]`` (see
                ``preprocess_experience``).
            final_time_step: the time step after the unroll.

        Returns:
            ``(loss_info, train_info, valid_mask)`` of the last minibatch, for
            summaries (``loss_info.loss`` is the scalar that was minimised).
        """
        exp = self.preprocess_experience(experience, final_time_step)
        loss_info = train_info = mask = None
        controller = self._entropy_target_algorithm
        once_per_unroll = self._per_iteration and controller is not None
        means = []  # once_per_unroll: each minibatch's mean entropy (per action leaf)
        with self.alpha_change_capped():
            for _ in range(self._num_epochs):
                for batch in self._minibatches(exp):
                    train_info = self.train_step(batch).info
                    loss_info = self.calc_loss(batch, train_info)
                    mask = self.valid_mask(batch)
                    if once_per_unroll:
                        neg_entropy = train_info.entropy_target.loss.extra.neg_entropy
                        means.append(nest.map_structure(
                            lambda e: masked_mean(-e.detach(), mask)[0], neg_entropy))
                    loss_info, _ = self.update_with_gradient(
                        loss_info, valid_masks=mask, max_grad_norm=self._max_grad_norm
                    )
                    self.after_update()
                    last_batch = batch
            if once_per_unroll:
                controller.adjust_alpha(
                    nest.map_structure(lambda *m: torch.stack(m).mean(), *means))
        if summary.should_record_summaries():
            self.summarize_train(last_batch, loss_info, train_info, mask)
        return loss_info, train_info, mask

    @contextlib.contextmanager
    def alpha_change_capped(self) -> Iterator[None]:
        """Within the block (one iteration), ``max_alpha_change_per_iteration`` holds.

        Every leaf controller limits the span of its ``log alpha`` to the cap on
        entry and lifts the limit on exit; without a cap or a controller it does
        nothing.

        Yields:
            None.
        """
        leaves = ([] if self._log_alpha_cap is None or self._entropy_target_algorithm is None
                  else list(self._entropy_target_algorithm.leaf_algorithms().values()))
        for leaf in leaves:
            leaf.limit_log_alpha_span(self._log_alpha_cap)
        try:
            yield
        finally:
            for leaf in leaves:
                leaf.limit_log_alpha_span(None)

    def summarize_train(
        self,
        experience: Experience,
        loss_info: LossInfo,
        train_info: ActorCriticInfo,
        mask: torch.Tensor,
    ) -> None:
        """Write loss and entropy summaries (call only when recording).

        Always written (top level): ``alpha`` (the entropy coefficient),
        ``entropy`` and, with an entropy controller, ``target_entropy`` and
        ``stage`` (for a nested controller also ``alpha/<leaf>`` etc.).
        Under ``loss/``: ``total`` (the minimised scalar), ``pg`` and ``td``
        (masked means); with ``debug_summaries`` also advantage, value and
        explained-variance statistics under the algorithm's name.

        Args:
            experience: the minibatch of the last update.
            loss_info: the ``LossInfo`` returned by ``update_with_gradient``.
            train_info: the ``train_step`` info of that minibatch.
            mask: its valid mask.
        """
        extra = loss_info.extra
        main = extra["main"] if isinstance(extra, dict) else extra
        summary.scalar("loss/total", loss_info.loss)
        summary.scalar("loss/pg", masked_mean(main.pg_loss, mask)[0])
        summary.scalar("loss/td", masked_mean(main.td_loss, mask)[0])
        entropy = masked_mean(train_info.entropy, mask)[0]
        summary.scalar("entropy", entropy)
        summary.scalar("alpha", self.entropy_coefficient())
        controller = self._entropy_target_algorithm
        if controller is not None:
            leaves = controller.leaf_algorithms()
            if len(leaves) > 1:  # a nested controller: also each action's values
                for key, leaf in leaves.items():
                    summary.scalar(f"alpha/{key}", leaf.alpha)
                    summary.scalar(f"target_entropy/{key}", leaf.target_entropy)
                    summary.scalar(f"stage/{key}", leaf.stage)
            summary.scalar("target_entropy", controller.target_entropy)
            summary.scalar("stage", controller.stage)
        if self._debug_summaries:
            with summary.scope(self.name):
                adv = experience.rollout_info.advantages
                summary.scalar("advantage_mean", masked_mean(adv, mask)[0])
                summary.scalar("value_mean", masked_mean(train_info.value, mask)[0])
                returns = experience.rollout_info.returns
                var_ret = masked_mean((returns - masked_mean(returns, mask)[0]).square(), mask)[0]
                var_err = masked_mean((returns - train_info.value).square(), mask)[0]
                summary.scalar(
                    "explained_variance", 1.0 - var_err / var_ret.clamp(min=1e-8)
                )
