"""``ManyAgents``: K independent actor-critic (A2C/PPO) agents trained as one batch.

An :class:`~alf_entropy.algorithms.agent_batch.AgentBatch` (read its docstring) whose
actor and value networks are :class:`~alf_entropy.networks.stacked.StackedModule` s:
each ``nn.Linear`` of the K agents becomes one batched product for all K.  GAE, the
minibatch permutations, advantage normalisation, the loss's mean, gradient clipping,
the skip of a non-finite update and Adam's state are each agent's own.
"""

from typing import Any, Callable, Dict, List, Optional, Sequence

import torch.nn as nn

from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm
from alf_entropy.algorithms.agent_batch import AgentBatch
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.networks.stacked import StackedModule

__all__ = ["ManyAgents"]


class ManyAgents(AgentBatch):
    """K independent A2C/PPO agents as one batch (``AgentBatch``'s arguments; the
    default ``algorithm_ctor`` is ``PPOAlgorithm``)."""

    agent_cls = ActorCriticAlgorithm

    def __init__(
        self,
        observation_spec: Any,
        action_spec: Any,
        seeds: Sequence[int],
        algorithm_ctor: Callable[..., ActorCriticAlgorithm] = PPOAlgorithm,
        target_entropies: Optional[Sequence[Any]] = None,
        entropy_target_cls: Optional[Callable[..., Any]] = None,
        device: Any = "cpu",
    ):
        super().__init__(
            observation_spec,
            action_spec,
            seeds,
            algorithm_ctor,
            target_entropies,
            entropy_target_cls,
            device,
        )

    def _stacked(self, agents: List[Any]) -> Dict[str, Callable[..., nn.Module]]:
        return dict(
            actor_network_ctor=lambda *a: StackedModule([g.actor_network for g in agents]),
            value_network_ctor=lambda *a: StackedModule([g.value_network for g in agents]),
        )
