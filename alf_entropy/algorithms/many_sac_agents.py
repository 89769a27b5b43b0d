"""``ManySacAgents``: K independent SAC agents trained as one batch.

An :class:`~alf_entropy.algorithms.agent_batch.AgentBatch` (read its docstring): the
actor is a :class:`~alf_entropy.networks.stacked.StackedModule`, the twin critics and
their target copies are :class:`~alf_entropy.networks.critic_networks.StackedCritics`.
Agent ``k`` draws its actions and its losses' samples from its own generator, and -- in
``OffPolicyTrainer`` -- its random actions before learning starts and its replay rows.
"""

from typing import Any, Callable, Dict, List

import torch.nn as nn

from alf_entropy.algorithms.agent_batch import AgentBatch
from alf_entropy.algorithms.sac_algorithm import SacAlgorithm
from alf_entropy.networks.critic_networks import StackedCritics
from alf_entropy.networks.stacked import StackedModule

__all__ = ["ManySacAgents"]


class ManySacAgents(AgentBatch):
    """K independent SAC agents as one batch (``AgentBatch``'s arguments; the critics must
    be ``CriticNetworks``)."""

    agent_cls = SacAlgorithm
    default_algorithm_ctor = SacAlgorithm

    def _stacked(self, agents: List[Any]) -> Dict[str, Callable[..., nn.Module]]:
        return dict(
            actor_network_ctor=lambda *a: StackedModule([g.actor_network for g in agents]),
            critic_network_ctor=lambda *a: StackedCritics([g.critic_networks for g in agents]),
        )

    def _after_build(self, agents: List[Any]) -> None:
        self._alg.target_critic_networks.load_state_dict(
            StackedCritics([g.target_critic_networks for g in agents]).state_dict()
        )
