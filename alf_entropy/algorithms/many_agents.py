"""``ManyAgents``: K independent actor-critic (A2C/PPO) agents trained as one batch.

An :class:`~alf_entropy.algorithms.agent_batch.AgentBatch` (read its docstring) whose
actor and value networks are :class:`~alf_entropy.networks.stacked.StackedModule` s:
each ``nn.Linear`` of the K agents becomes one batched product for all K.  GAE, the
minibatch permutations, advantage normalisation, the loss's mean, gradient clipping,
the skip of a non-finite update and Adam's state are each agent's own.
"""

from typing import Any, Callable, Dict, List

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
    default_algorithm_ctor = PPOAlgorithm

    def _stacked(self, agents: List[Any]) -> Dict[str, Callable[..., nn.Module]]:
        return dict(
            actor_network_ctor=lambda *a: StackedModule([g.actor_network for g in agents]),
            value_network_ctor=lambda *a: StackedModule([g.value_network for g in agents]),
        )
