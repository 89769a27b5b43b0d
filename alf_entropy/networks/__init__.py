"""Networks: encoders, actor distribution networks, value and critic networks."""

from alf_entropy.networks.actor_distribution_network import ActorDistributionNetwork
from alf_entropy.networks.critic_networks import CriticNetworks
from alf_entropy.networks.distributions import StableTanh, mode_of
from alf_entropy.networks.encoding_network import (
    MLP,
    EncodingNetwork,
    flat_input_size,
    flatten_observation,
    get_activation,
)
from alf_entropy.networks.projection_networks import (
    CategoricalProjectionNetwork,
    NormalProjectionNetwork,
)
from alf_entropy.networks.value_network import ValueNetwork

__all__ = [
    "ActorDistributionNetwork",
    "CategoricalProjectionNetwork",
    "CriticNetworks",
    "EncodingNetwork",
    "MLP",
    "NormalProjectionNetwork",
    "StableTanh",
    "ValueNetwork",
    "flat_input_size",
    "flatten_observation",
    "get_activation",
    "mode_of",
]
