"""``SacAlgorithm``: soft actor-critic whose temperature comes from a controller.

SAC (Haarnoja et al., 2018) with twin Q critics, Polyak-averaged target
critics and an entropy bonus whose coefficient ``alpha`` is set by any entropy
controller (``entropy_target_cls``): ``SGDEntropyTargetAlgorithm`` (SAC's own
gradient rule, the default), ``EntropyTargetAlgorithm`` (ALF's staged
controller, with a schedulable target) or ``FixedEntropyCoefficient``.

One update on a batch of ``Transition``s (``o, a, r, d, o'``), CleanRL-style::

    with no_grad:                                   # the soft TD target
        a' ~ pi(o');  y = r + gamma * d * (min_i Qtarg_i(o', a') - alpha * log pi(a'|o'))
    critic_loss = 0.5 * sum_i (Q_i(o, a) - y)^2
    a~ ~ pi(o) (reparameterised);  H = -log pi(a~|o)
    li = controller.entropy_loss(H)                 # advances alpha once
    actor_loss = -min_i Q_i(o, a~) + li.loss         # li.loss = alpha * log pi
    loss = mean(critic_loss + actor_loss)            # one backward, one step
    Qtarg <- lerp(Qtarg, Q, tau)

Discrete actions (Christodoulou, 2019): the critics output ``Q(o, .)`` for every
action, the TD target and the actor loss take the expectation over the
policy's probabilities instead of a sample, and ``H`` is the exact entropy.
``alpha`` is used detached everywhere; the actor's gradient does not reach the
critics (they are evaluated with detached weights for the actor loss).

Faults: an update whose loss (or, with clipping, gradient norm) is not finite
is skipped (networks, optimiser states and ``log_alpha`` keep their values)
by ``Algorithm.update_with_gradient``, the one gradient step of every
algorithm, and counted in ``num_skipped_updates``, without reading the flag on
the host on a GPU (see
:func:`~alf_entropy.utils.optimizers.masked_optimizer_step`).
"""

import copy
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.nn as nn

from alf_entropy.algorithms.algorithm import Algorithm, OptimizerArg
from alf_entropy.algorithms.compiled_update import CompiledUpdate, device_update, rsample_with
from alf_entropy.controllers import EntropyController, SGDEntropyTargetAlgorithm
from alf_entropy.data_structures import AlgStep, LossInfo, TimeStep, namedtuple
from alf_entropy.networks import ActorDistributionNetwork, mode_of
from alf_entropy.networks.critic_networks import CriticNetworks
from alf_entropy.networks.stacked import draw
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils import nest, summary
from alf_entropy.utils.checks import check_callable, check_int, check_real
from alf_entropy.utils.math_ops import masked_mean
from alf_entropy.utils.optimizers import FusedAdam
from alf_entropy.utils.replay_buffer import Transition
from alf_entropy.utils.seeding import per_member

__all__ = ["SacAlgorithm", "SacLossInfo"]

SacLossInfo = namedtuple(
    "SacLossInfo", ["critic", "actor", "entropy", "q", "alpha"], default_value=()
)
"""``LossInfo.extra`` of an update, for summaries: detached per-row ``[N]``
tensors, and ``alpha`` (0-d)."""


def _default_actor(observation_spec: Any, action_spec: Any) -> nn.Module:
    return ActorDistributionNetwork(
        observation_spec,
        action_spec,
        fc_layer_params=(256, 256),
        activation=nn.ReLU,
        squash_to_spec=True,
        state_dependent_std=True,
    )


def _default_optimizer(params: List[nn.Parameter], lr: float = 3e-4) -> torch.optim.Optimizer:
    """SAC's optimiser when none is given: Adam with ``lr`` (gin:
    ``sac_default_optimizer.lr``)."""
    return FusedAdam(params, lr=check_real("sac_default_optimizer.lr", lr, positive=True))


class SacAlgorithm(Algorithm):
    """Soft actor-critic with a pluggable temperature controller.

    Args:
        observation_spec: the observation spec (nest of ``TensorSpec``).
        action_spec: one ``BoundedTensorSpec``: float (any shape, finite
            bounds) or integer (scalar, ``minimum`` 0).
        actor_network_ctor: ``(observation_spec, action_spec) -> network``
            returning the action distribution; the default is a 256x256 ReLU
            ``ActorDistributionNetwork`` with a tanh-squashed Normal and
            state-dependent std.
        critic_network_ctor: ``(observation_spec, action_spec) -> module``
            with :class:`CriticNetworks`' ``forward``; default twin 256x256.
        entropy_target_cls: the temperature controller class, called as
            ``entropy_target_cls(action_spec, debug_summaries=...)``;
            ``None`` means ``SGDEntropyTargetAlgorithm`` (SAC's rule).
        optimizer: factory ``params -> Optimizer`` for actor and critics;
            ``None`` for ``FusedAdam(lr=3e-4)`` (Adam).  The SGD controller keeps its own
            optimiser for ``log_alpha``.
        gamma: discount in ``[0, 1]``.
        target_update_tau: Polyak factor in ``(0, 1]`` of the target critics.
        target_update_period: update the target critics every this many
            updates.
        reward_scale: rewards are multiplied by this (> 0).
        max_grad_norm: clip the global gradient norm (``None``: no clipping).
        debug_summaries: extra summaries (passed to the controller).
        name: the name (summary scope).
        batch_shape: ``()`` for one agent, ``(K,)`` for K stacked agents (``ManySacAgents``).
        compile_update: run each update as one compiled graph, on CUDA one CUDA graph
            (:class:`~alf_entropy.algorithms.compiled_update.CompiledUpdate`; Adam optimisers only,
            one process); the policy's draws are made outside it, as eager makes them.

    Raises:
        TypeError: for a nested or non-``BoundedTensorSpec`` action spec, or a
            non-callable ctor.
        ValueError: for out-of-range arguments or an action spec SAC cannot
            handle (see above), or a nested controller with ``compile_update``; the
            controller raises for a target its spec cannot reach.

    Examples:
        >>> import torch
        >>> from alf_entropy.algorithms.entropy_target_algorithm import EntropyTargetAlgorithm
        >>> from alf_entropy.data_structures import TimeStep
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
        >>> from alf_entropy.utils.replay_buffer import Transition
        >>> sac = SacAlgorithm(TensorSpec((3,)), BoundedTensorSpec((1,), torch.float32, -2.0, 2.0),
        ...                    entropy_target_cls=EntropyTargetAlgorithm)  # the staged controller
        >>> obs = torch.randn(256, 3)
        >>> action = sac.rollout_step(TimeStep(observation=obs)).output
        >>> action.shape, bool(action.abs().max() <= 2.0)
        (torch.Size([256, 1]), True)
        >>> batch = Transition(observation=obs, action=action, reward=torch.randn(256),
        ...                    discount=torch.ones(256), next_observation=torch.randn(256, 3),
        ...                    valid=torch.ones(256, dtype=torch.bool))
        >>> info = sac.train_step(batch).info  # one step of actor, critics and alpha
        >>> info.extra._fields
        ('critic', 'actor', 'entropy', 'q', 'alpha')
    """

    def __init__(
        self,
        observation_spec: Any,
        action_spec: BoundedTensorSpec,
        actor_network_ctor: Callable[..., nn.Module] = _default_actor,
        critic_network_ctor: Callable[..., nn.Module] = CriticNetworks,
        entropy_target_cls: Optional[Callable[..., EntropyController]] = None,
        optimizer: OptimizerArg = None,
        gamma: float = 0.99,
        target_update_tau: float = 0.005,
        target_update_period: int = 1,
        reward_scale: float = 1.0,
        max_grad_norm: Optional[float] = None,
        debug_summaries: bool = False,
        name: str = "SacAlgorithm",
        batch_shape: Tuple[int, ...] = (),
        compile_update: bool = False,
    ):
        super().__init__(
            optimizer=_default_optimizer if optimizer is None else optimizer,
            debug_summaries=debug_summaries,
            name=name,
            batch_shape=batch_shape,
        )
        if nest.is_nested(action_spec) or not isinstance(action_spec, BoundedTensorSpec):
            raise TypeError(
                "SacAlgorithm: action_spec must be a single BoundedTensorSpec (one "
                f"discrete or one continuous action), got {action_spec!r}"
            )
        if action_spec.is_discrete and action_spec.shape != ():
            raise ValueError(
                "SacAlgorithm: a discrete action must be scalar (gymnasium "
                f"Discrete), got shape {action_spec.shape}"
            )
        self._gamma = check_real("gamma", gamma, minimum=0.0, maximum=1.0)
        self._tau = check_real("target_update_tau", target_update_tau, above=0.0, maximum=1.0)
        self._target_update_period = check_int("target_update_period", target_update_period, 1)
        self._reward_scale = check_real("reward_scale", reward_scale, positive=True)
        self._max_grad_norm = check_real(
            "max_grad_norm", max_grad_norm, positive=True, allow_none=True
        )
        check_callable("actor_network_ctor", actor_network_ctor)
        check_callable("critic_network_ctor", critic_network_ctor)

        self._observation_spec = observation_spec
        self._action_spec = action_spec
        self._discrete = action_spec.is_discrete

        self._actor_network = actor_network_ctor(observation_spec, action_spec)
        self._critic_networks = critic_network_ctor(observation_spec, action_spec)
        # One explicit choice: a continuous action drawn by our actor network
        # in closed form (see _sample); anything else goes through the distribution.
        self._closed_form = not self._discrete and isinstance(
            self._actor_network, ActorDistributionNetwork
        )
        self._target_critic_networks = copy.deepcopy(self._critic_networks)
        self._target_critic_networks.requires_grad_(False)
        self.entropy_target_cls = entropy_target_cls or SGDEntropyTargetAlgorithm
        self._entropy_target_algorithm = self.entropy_target_cls(
            action_spec, debug_summaries=debug_summaries
        )
        self.register_buffer("_num_skipped", torch.zeros(self.batch_shape, dtype=torch.int64))
        self.optimizers()  # fails now, not at the first update, if a parameter has none
        self._target_pairs: Optional[tuple] = None
        # Host-counted updates (target period; extra state): no tensor is read to decide.
        self._host_updates = 0
        self._compiled: Optional[CompiledUpdate] = None
        if compile_update:
            controller = self._entropy_target_algorithm
            if len(controller.leaf_algorithms()) != 1:
                raise ValueError(
                    "SacAlgorithm: compile_update=True needs a controller with "
                    f"one alpha, got {type(controller).__name__}"
                )
            self._compiled = CompiledUpdate(
                self,
                self._terms,
                self._coefficient,
                self._max_grad_norm,
                controller,
                after=lambda: self._lerp_targets(self._compiled.scalars["tau"]),
                refresh=self._refresh,
            )

    # ------------------------------------------------------------ properties
    @property
    def action_spec(self) -> BoundedTensorSpec:
        """The action spec."""
        return self._action_spec

    @property
    def actor_network(self) -> nn.Module:
        """The policy network."""
        return self._actor_network

    @property
    def critic_networks(self) -> nn.Module:
        """The (twin) critics."""
        return self._critic_networks

    @property
    def target_critic_networks(self) -> nn.Module:
        """The Polyak-averaged target critics."""
        return self._target_critic_networks

    @property
    def entropy_target_algorithm(self) -> EntropyController:
        """The temperature controller."""
        return self._entropy_target_algorithm

    @property
    def max_grad_norm(self) -> Optional[float]:
        """The gradient-norm clip of an update (None: no clipping)."""
        return self._max_grad_norm

    @property
    def num_skipped_updates(self) -> torch.Tensor:
        """Updates skipped because the loss was not finite (0-d int64 tensor)."""
        return self._num_skipped

    def entropy_coefficient(self) -> torch.Tensor:
        """The controller's current ``alpha`` (for summaries and progress bars)."""
        return self._entropy_target_algorithm.alpha

    # ----------------------------------------------------------------- acting
    def predict_step(self, inputs: TimeStep, state: Any = ()) -> AlgStep:
        """The deterministic action (mode of the policy), for evaluation.

        Args:
            inputs: a ``TimeStep`` with a batched ``observation``.
            state: unused.

        Returns:
            AlgStep: ``output`` the action ``[B, ...]``.
        """
        return AlgStep(output=mode_of(self._actor_network(inputs.observation)), state=state)

    def rollout_step(self, inputs: TimeStep, state: Any = ()) -> AlgStep:
        """A sampled action, for collecting experience (call under no_grad).

        Args:
            inputs: a ``TimeStep`` with a batched ``observation``.
            state: unused.

        Returns:
            AlgStep: ``output`` the action ``[B, ...]``.
        """
        return AlgStep(output=self._sample(inputs.observation, acting=True)[0], state=state)

    # --------------------------------------------------------------- training
    def _sample(self, observation: Any, acting: bool = False, noise: Any = None):
        """The one sampling path: ``(action_or_probs, log_prob)``.

        Continuous: a reparameterised sample and its log-probability (acting:
        a plain sample, no log-probability); from the standard-normal draws ``noise`` if
        given (a compiled update's).  Discrete (not acting): all
        probabilities and log-probs ``[B, A]``.  With ``_closed_form`` the
        network draws from the same distribution without building it; it
        returns None for what it does not cover (a hook registered later,
        ``ALF_ENTROPY_ACCEL=0``), which is asked per call for that reason.
        """
        if self._closed_form and self.generators is None and noise is None:
            drawn = self._actor_network.rsample_and_log_prob(observation, log_prob=not acting)
            if drawn is not None:
                return drawn
        dist = self._actor_network(observation)
        if acting:
            return draw(dist, self.generators), None
        if self._discrete:
            log_probs = dist.logits  # torch normalises Categorical logits
            return log_probs.exp(), log_probs
        if noise is None:
            action = draw(dist, self.generators, reparameterize=True)
        else:
            action = rsample_with(dist, noise)
        return action, dist.log_prob(action)

    def _noise(self, batch: Transition) -> Tuple[torch.Tensor, ...]:
        """The standard-normal draws of an update's two samples (``o'``, then ``o``), from the
        generators that eager's samples draw from, in their order (none if discrete)."""
        if self._discrete:
            return ()
        a = batch.action
        shape = a.shape[len(self.batch_shape) :]
        return tuple(
            per_member(
                lambda g: torch.randn(shape, dtype=torch.float32, device=a.device, generator=g),
                self.generators,
            )
            for _ in range(2)
        )

    def _losses(self, batch: Transition, noise: Any = ()) -> tuple:
        """Per row: the critic loss, ``min_i Q_i(o, a~)``, the entropy, the critics' ``q``;
        and the ``alpha`` of the TD target."""
        controller = self._entropy_target_algorithm
        alpha = controller.alpha.detach()
        critics, targets = self._critic_networks, self._target_critic_networks
        next_noise, noise = noise or (None, None)
        with torch.no_grad():
            next_a, next_logp = self._sample(batch.next_observation, noise=next_noise)
            # K agents (a batch controller): alpha [K] against rows [K, N, ...].
            a = alpha.reshape(*alpha.shape, *(1,) * (next_logp.dim() - 1)) if alpha.dim() else alpha
            if self._discrete:
                target_q = targets(batch.next_observation).min(dim=0).values  # [N, A]
                next_v = (next_a * (target_q - a * next_logp)).sum(-1)
            else:
                target_q = targets(batch.next_observation, next_a).min(dim=0).values
                next_v = target_q - a * next_logp
            y = (
                self._reward_scale * batch.reward
                + self._gamma * batch.discount.to(next_v.dtype) * next_v
            )
        if self._discrete:
            q_all = critics(batch.observation)  # [n, N, A]
            index = batch.action.long().unsqueeze(-1).expand(*q_all.shape[:-1], 1)
            q = q_all.gather(-1, index).squeeze(-1)
            probs, logp = self._sample(batch.observation)
            q_pi = (probs * q_all.detach().min(dim=0).values).sum(-1)
            entropy = -(probs * logp).sum(-1)
        else:
            q = critics(batch.observation, batch.action)  # [n, N]
            action, logp = self._sample(batch.observation, noise=noise)
            q_pi = critics(batch.observation, action, detach_params=True).min(dim=0).values
            entropy = -logp
        critic_loss = 0.5 * (q - y.unsqueeze(0)).square().sum(0)
        return critic_loss, q_pi, entropy, q, alpha

    def calc_loss(self, batch: Transition) -> LossInfo:
        """SAC's losses on a batch (advances the controller once).

        Args:
            batch: a ``Transition`` of ``[N, ...]`` tensors.

        Returns:
            LossInfo: ``loss`` the per-row critic + actor loss ``[N]``, ``extra`` a
            ``SacLossInfo`` of detached scalars.
        """
        critic_loss, q_pi, entropy, q, alpha = self._losses(batch)
        li = self._entropy_target_algorithm.entropy_loss(entropy, mask=batch.valid)
        actor_loss = -q_pi + li.loss
        return LossInfo(
            loss=critic_loss + actor_loss,
            extra=SacLossInfo(
                critic=critic_loss.detach(),
                actor=actor_loss.detach(),
                entropy=entropy.detach(),
                q=q.detach().mean(0),
                alpha=alpha,
            ),
        )

    def _terms(self, inputs: tuple) -> tuple:
        """``CompiledUpdate``'s terms: ``calc_loss`` but the entropy term (``actor`` is
        ``-min Q`` until ``_coefficient``)."""
        batch, noise = inputs
        critic_loss, q_pi, entropy, q, alpha = self._losses(batch, noise)
        return (
            critic_loss - q_pi,
            entropy,
            entropy,
            batch.valid,
            SacLossInfo(
                critic=critic_loss.detach(),
                actor=-q_pi.detach(),
                entropy=entropy.detach(),
                q=q.detach().mean(0),
                alpha=alpha,
            ),
        )

    def _coefficient(
        self, entropy: torch.Tensor, mask: torch.Tensor, extra: SacLossInfo
    ) -> Tuple[torch.Tensor, SacLossInfo]:
        """In the graph: the controller's device step; the new alpha and the actor loss."""
        alpha = device_update(self._entropy_target_algorithm, entropy, mask)
        nb = len(self.batch_shape)
        actor = extra.actor - alpha.reshape(alpha.shape + (1,) * (entropy.dim() - nb)) * entropy
        return alpha, extra._replace(actor=actor)

    def _refresh(self) -> None:
        """Outside the graph: the target networks' weight now (0 between periods)."""
        self._host_updates += 1
        self._pairs()  # the pairs' list built outside the graph (else a guard recompiles)
        self._compiled.set(
            "tau", 0.0 if self._host_updates % self._target_update_period else self._tau
        )

    def train_step(self, inputs: Transition, state: Any = (), rollout_info: Any = ()) -> AlgStep:
        """One gradient update on a batch (see the module docstring).

        Args:
            inputs: a ``Transition`` batch sampled from the replay buffer.
            state: unused.
            rollout_info: unused.

        Returns:
            AlgStep: ``info`` the ``LossInfo`` (``loss`` the minimised scalar, detached).
        """
        if self._compiled is not None:
            loss, extra = self._compiled((inputs, self._noise(inputs)), self._num_skipped)
            loss_info = LossInfo(loss=loss, extra=extra)
        else:
            loss_info, _ = self.update_with_gradient(
                self.calc_loss(inputs),
                valid_masks=inputs.valid,
                max_grad_norm=self._max_grad_norm,
                skipped_counter=self._num_skipped,
            )
            self.update_target_networks()
        if summary.should_record_summaries():
            self._summarize(loss_info, inputs.valid)
        return AlgStep(output=(), state=state, info=loss_info)

    def update_target_networks(self) -> None:
        """Polyak-average the target critics, every ``target_update_period``-th call.

        ``train_step`` calls it after its update, a batch of agents after its own.
        """
        self._host_updates += 1
        if not self._host_updates % self._target_update_period:
            self._lerp_targets(self._tau)

    def _lerp_targets(self, weight: Any) -> None:
        with torch.no_grad():
            for target, source in zip(*self._pairs()):
                target.lerp_(source, weight)

    def _pairs(self) -> tuple:
        """The target critics' parameters and the critics'."""
        if self._target_pairs is None:
            self._target_pairs = (
                list(self._target_critic_networks.parameters()),
                list(self._critic_networks.parameters()),
            )
        return self._target_pairs

    def get_extra_state(self) -> Any:
        """The host-side update count (for the target-update period)."""
        return {"host_updates": self._host_updates}

    def set_extra_state(self, state: Any) -> None:
        """Restore :meth:`get_extra_state`."""
        self._host_updates = int(state["host_updates"])

    def _summarize(self, loss_info: LossInfo, valid: torch.Tensor) -> None:
        extra, controller = loss_info.extra, self._entropy_target_algorithm
        nb = len(self.batch_shape)

        def _mean(x: torch.Tensor) -> torch.Tensor:
            return masked_mean(x, valid, dim=tuple(range(nb, x.dim())) if nb else None)[0]

        summary.scalar("loss/total", loss_info.loss)
        summary.scalar("loss/critic", _mean(extra.critic))
        summary.scalar("loss/actor", _mean(extra.actor))
        summary.scalar("entropy", _mean(extra.entropy))
        summary.scalar("alpha", controller.alpha)
        summary.scalar("target_entropy", controller.target_entropy)
        summary.scalar("stage", controller.stage)
        summary.scalar("q", _mean(extra.q))
        summary.scalar("num_skipped_updates", self._num_skipped)
