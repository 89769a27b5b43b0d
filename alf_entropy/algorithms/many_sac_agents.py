"""``ManySacAgents``: K independent SAC agents trained as one batch.

The SAC counterpart of :class:`~alf_entropy.algorithms.many_agents.ManyAgents`
(read its docstring first): agent ``k`` is built under ``seeds[k]`` as a single
run with that seed builds it, the K agents' networks are stacked -- the actor
with :class:`~alf_entropy.networks.stacked.StackedModule`, the twin critics
and their target copies with
:class:`~alf_entropy.networks.critic_networks.StackedCritics` -- and
``algorithm_ctor`` builds one more ``SacAlgorithm`` around them (the *batched
algorithm*) with a :class:`~alf_entropy.utils.batched_adam.BatchedAdam` and
one controller of the agents' class with ``batch_shape=(K,)`` (its own state,
optimiser state and target per agent: ``target_entropies``).

Training runs the batched algorithm's own ``calc_loss`` on ``[K, M, ...]``
batches (every term of SAC's loss is per row; the controller advances each
member on its own rows), then per agent: the masked mean of the loss, the
gradient norm and its clipping, the skip of a non-finite update and Adam's
state (:func:`~alf_entropy.algorithms.agent_batch.update_agents`); the
Polyak update of the target critics is per element.  Agent ``k`` draws from
its own ``torch.Generator`` (in the state a single run's global generator has
after the build): its actions, its critics' TD-target and actor-loss samples
(through :meth:`SacAlgorithm.use_sampler`), and -- in ``OffPolicyTrainer`` --
its random actions before learning starts and its replay rows
(:meth:`~alf_entropy.utils.replay_buffer.ReplayBuffer.sample_members`).
Nothing mixes two agents, so a NaN or a divergence in one leaves the others
as they were.

Agent ``k`` follows the single run with seed ``seeds[k]`` up to float
rounding: the batch draws through the distribution (``rsample``) where the
single run uses the network's closed form, and ``BatchedAdam`` rounds as
torch's single-tensor Adam; ``tests/many_agents`` holds the first updates
within 1e-5.
"""
import functools
from typing import Any, Callable, Dict, Optional, Sequence

import gin
import torch

from alf_entropy.algorithms.agent_batch import (
    AgentBatch,
    batched_adam_like,
    check_same_start,
    update_agents,
)
from alf_entropy.algorithms.sac_algorithm import SacAlgorithm
from alf_entropy.data_structures import AlgStep, LossInfo, TimeStep
from alf_entropy.networks.critic_networks import StackedCritics
from alf_entropy.networks.stacked import StackedModule, sample_members
from alf_entropy.utils.replay_buffer import Transition

__all__ = ["ManySacAgents"]


@gin.configurable
class ManySacAgents(AgentBatch):
    """K independent SAC agents as one batch (see the module docstring).

    Args:
        observation_spec: the observation spec (one environment's).
        action_spec: the action spec (one environment's; a single bounded spec).
        seeds: one seed per agent; ``K = len(seeds)``.
        algorithm_ctor: ``(observation_spec, action_spec, **overrides) ->`` a
            ``SacAlgorithm`` (configured in gin as for a single run); it must take
            ``actor_network_ctor``, ``critic_network_ctor``, ``entropy_target_cls``
            and ``optimizer``.  The critics must be ``CriticNetworks``.
        target_entropies: one target per agent (a number, scheduler, ...), or
            None for the configured one.
        entropy_target_cls: ``(action_spec, batch_shape=, debug_summaries=,
            [target_entropy=]) ->`` the batch's controller, or None for the
            agents' controller's class (with its gin bindings); it must start as
            the agents' controllers do (``ValueError`` otherwise).
        device: where the agents live.

    Raises:
        ValueError: for empty ``seeds`` (or a repeated seed without its own
            target), targets of the wrong length (or below 0 for a discrete
            action), a nested action spec, a data-parallel run, or a batch
            controller unlike the agents'.
        TypeError: if ``algorithm_ctor`` builds no ``SacAlgorithm`` or its
            optimiser is not Adam.
    """

    def __init__(self, observation_spec: Any, action_spec: Any, seeds: Sequence[int],
                 algorithm_ctor: Callable[..., SacAlgorithm] = SacAlgorithm,
                 target_entropies: Optional[Sequence[Any]] = None,
                 entropy_target_cls: Optional[Callable[..., Any]] = None, device: Any = "cpu"):
        super().__init__(device)
        agents = self._build_agents(observation_spec, action_spec, seeds, algorithm_ctor,
                                    SacAlgorithm, target_entropies)
        overrides: Dict[str, Any] = {}
        if target_entropies is not None:
            overrides["target_entropy"] = list(target_entropies)
        self._alg = algorithm_ctor(
            observation_spec, action_spec,
            actor_network_ctor=lambda *a: StackedModule([g.actor_network for g in agents]),
            critic_network_ctor=lambda *a: StackedCritics([g.critic_networks for g in agents]),
            entropy_target_cls=functools.partial(
                entropy_target_cls or agents[0].entropy_target_cls, batch_shape=(len(seeds),),
                **overrides),
            optimizer=batched_adam_like(agents[0].optimizers()[0])).to(self._device)
        batched = self._alg.entropy_target_algorithm
        check_same_start([g.entropy_target_algorithm for g in agents], batched,
                         target_entropies is not None)
        self._alg.target_critic_networks.load_state_dict(
            StackedCritics([g.target_critic_networks for g in agents]).state_dict())
        self._alg.use_sampler(self._draw)
        self._max_grad_norm = agents[0].max_grad_norm

    def _draw(self, dist: Any, reparameterize: bool) -> torch.Tensor:
        return sample_members(dist, self._generators, reparameterize)

    # ------------------------------------------------------------ acting
    def rollout_step(self, inputs: TimeStep, state: Any = ()) -> AlgStep:
        """Each agent's sampled action (from its own generator); call under no_grad.

        Args:
            inputs: a ``TimeStep`` whose ``observation`` is ``[K, B, ...]``.
            state: unused.

        Returns:
            AlgStep: ``output`` the actions ``[K, B, ...]``.
        """
        return self._alg.rollout_step(inputs, state)

    def predict_step(self, inputs: TimeStep, state: Any = ()) -> AlgStep:
        """Each agent's deterministic action (``observation`` ``[K, B, ...]``)."""
        return self._alg.predict_step(inputs, state)

    # ------------------------------------------------------------ training
    def train_step(self, inputs: Transition, state: Any = (), rollout_info: Any = ()) -> AlgStep:
        """One update of every agent on its own rows.

        Args:
            inputs: a ``Transition`` of ``[K, M, ...]`` (agent ``k``'s rows at ``k``).
            state: unused.
            rollout_info: unused.

        Returns:
            AlgStep: ``info`` the ``LossInfo`` (``loss`` ``[K]``, each agent's
            minimised loss; ``extra`` per row ``[K, M]``).
        """
        alg = self._alg
        loss_info = alg.calc_loss(inputs)
        loss = update_agents(alg.optimizers()[0], loss_info, inputs.valid, self._max_grad_norm,
                             self.skipped_updates)
        alg.update_target_networks()
        return AlgStep(output=(), state=state, info=loss_info._replace(loss=loss))

    def summary_values(self, loss_info: LossInfo, valid: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Each agent's training summaries, the tags a single SAC run writes.

        Args:
            loss_info: :meth:`train_step`'s ``info``.
            valid: the batch's ``valid`` ``[K, M]``.

        Returns:
            dict: tag -> ``[K]`` tensor (nothing is read on the host).
        """
        k, extra = self.num_agents, loss_info.extra
        weights = valid.to(extra.critic.dtype)
        count = weights.sum(1).clamp(min=1.0)

        def _mean(x: torch.Tensor) -> torch.Tensor:
            return (x * weights).sum(1) / count

        controller = self._alg.entropy_target_algorithm
        device = weights.device
        return {"loss/total": loss_info.loss, "loss/critic": _mean(extra.critic),
                "loss/actor": _mean(extra.actor), "entropy": _mean(extra.entropy),
                "q": _mean(extra.q), "alpha": controller.alpha.expand(k),
                "target_entropy": torch.as_tensor(controller.target_entropy,
                                                  device=device).expand(k),
                "stage": torch.as_tensor(controller.stage, device=device).expand(k),
                "num_skipped_updates": self.skipped_updates.clone()}
