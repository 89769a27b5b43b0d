"""``SacAlgorithm``: soft actor-critic whose temperature comes from a controller.

SAC (Haarnoja et al., 2018) with twin Q critics, Polyak-averaged target
critics and an entropy bonus whose coefficient ``alpha`` is set by any entropy
controller (``entropy_target_cls``): ``SGDEntropyTargetAlgorithm`` (SAC's own
gradient rule, the default), ``EntropyTargetAlgorithm`` (ALF's staged
controller, with a schedulable target) or ``FixedEntropyCoefficient``.

One update's losses: :func:`~alf_entropy.algorithms.sac_losses.sac_losses` (CleanRL-style;
discrete actions as Christodoulou, 2019); the default networks, the policy's sampling and
the target critics' averaging: :mod:`~alf_entropy.algorithms.sac_networks`.

Faults: an update whose loss (or, with clipping, gradient norm) is not finite
is skipped (networks, optimiser states and ``log_alpha`` keep their values)
by ``Algorithm.update_with_gradient``, the one gradient step of every
algorithm, and counted in ``num_skipped_updates``, without reading the flag on
the host on a GPU (see
:func:`~alf_entropy.utils.optimizers.masked_optimizer_step`).
"""

import copy
import functools
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn as nn

from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm
from alf_entropy.algorithms.algorithm import Algorithm, OptimizerArg
from alf_entropy.algorithms.compiled_update import CompiledUpdate
from alf_entropy.algorithms.sac_losses import (
    SacLossInfo,
    actor_loss_in_graph,
    sac_losses,
    summarize_losses,
    update_noise,
)
from alf_entropy.algorithms.sac_networks import (
    TargetUpdater,
    sac_default_actor,
    sac_default_optimizer,
    sample_policy,
)
from alf_entropy.controllers import EntropyController, SGDEntropyTargetAlgorithm
from alf_entropy.data_structures import AlgStep, LossInfo, TimeStep
from alf_entropy.networks.critic_networks import CriticNetworks
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils import nest, summary
from alf_entropy.utils.checks import check_callable, check_int, check_real
from alf_entropy.utils.replay_buffer import Transition

__all__ = ["SacAlgorithm", "SacLossInfo"]


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

    Attributes:
        gamma, reward_scale: as given (checked).

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
        actor_network_ctor: Callable[..., nn.Module] = sac_default_actor,
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
            optimizer=sac_default_optimizer if optimizer is None else optimizer,
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
        self.gamma = check_real("gamma", gamma, minimum=0.0, maximum=1.0)
        tau = check_real("target_update_tau", target_update_tau, above=0.0, maximum=1.0)
        period = check_int("target_update_period", target_update_period, 1)
        self.reward_scale = check_real("reward_scale", reward_scale, positive=True)
        self._max_grad_norm = check_real(
            "max_grad_norm", max_grad_norm, positive=True, allow_none=True
        )
        check_callable("actor_network_ctor", actor_network_ctor)
        check_callable("critic_network_ctor", critic_network_ctor)

        self._action_spec = action_spec

        self._actor_network = actor_network_ctor(observation_spec, action_spec)
        self._critic_networks = critic_network_ctor(observation_spec, action_spec)
        self._target_critic_networks = copy.deepcopy(self._critic_networks)
        self._target_critic_networks.requires_grad_(False)
        self._targets = TargetUpdater(
            self._critic_networks, self._target_critic_networks, tau, period
        )
        self.entropy_target_cls = entropy_target_cls or SGDEntropyTargetAlgorithm
        self._entropy_target_algorithm = self.entropy_target_cls(
            action_spec, debug_summaries=debug_summaries
        )
        self.register_buffer("_num_skipped", torch.zeros(self.batch_shape, dtype=torch.int64))
        self.optimizers()  # fails now, not at the first update, if a parameter has none
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
                functools.partial(actor_loss_in_graph, controller),
                self._max_grad_norm,
                controller,
                after=lambda: self._targets.lerp(self._compiled.scalars["tau"]),
                refresh=lambda: self._compiled.set("tau", self._targets.advance()),
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
    predict_step = ActorCriticAlgorithm.predict_step  # the mode of the policy, for evaluation

    def rollout_step(self, inputs: TimeStep, state: Any = ()) -> AlgStep:
        """A sampled action, for collecting experience (call under no_grad).

        Args:
            inputs: a ``TimeStep`` with a batched ``observation``.
            state: unused.

        Returns:
            AlgStep: ``output`` the action ``[B, ...]``.
        """
        return AlgStep(output=sample_policy(self, inputs.observation, acting=True)[0], state=state)

    # --------------------------------------------------------------- training
    def calc_loss(self, batch: Transition) -> LossInfo:
        """SAC's losses on a batch (advances the controller once).

        Args:
            batch: a ``Transition`` of ``[N, ...]`` tensors.

        Returns:
            LossInfo: ``loss`` the per-row critic + actor loss ``[N]``, ``extra`` a
            ``SacLossInfo`` of detached scalars.
        """
        critic_loss, q_pi, entropy, extra = sac_losses(self, batch)
        li = self._entropy_target_algorithm.entropy_loss(entropy, mask=batch.valid)
        actor_loss = -q_pi + li.loss
        return LossInfo(
            loss=critic_loss + actor_loss, extra=extra._replace(actor=actor_loss.detach())
        )

    def _terms(self, inputs: tuple) -> tuple:
        """``CompiledUpdate``'s terms: ``calc_loss`` but the entropy term (``actor`` is
        ``-min Q`` until :func:`actor_loss_in_graph`)."""
        batch, noise = inputs
        critic_loss, q_pi, entropy, extra = sac_losses(self, batch, noise)
        return (
            critic_loss - q_pi,
            entropy,
            entropy,
            batch.valid,
            extra._replace(actor=-q_pi.detach()),
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
            loss, extra = self._compiled((inputs, update_noise(self, inputs)), self._num_skipped)
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
            summarize_losses(self, loss_info, inputs.valid)
        return AlgStep(output=(), state=state, info=loss_info)

    def update_target_networks(self) -> None:
        """Polyak-average the target critics, every ``target_update_period``-th call.

        ``train_step`` calls it after its update, a batch of agents after its own.
        """
        weight = self._targets.advance()
        if weight:
            self._targets.lerp(weight)

    def get_extra_state(self) -> Any:
        """The host-side update count (for the target-update period)."""
        return {"host_updates": self._targets.updates}

    def set_extra_state(self, state: Any) -> None:
        """Restore :meth:`get_extra_state`."""
        self._targets.updates = int(state["host_updates"])
