"""SAC's networks: the default actor and optimiser, the policy's one sampling path, and the
target critics' Polyak averaging (ALF's ``common.get_target_updater``)."""

from typing import Any, List, Optional

import torch
import torch.nn as nn

from alf_entropy.algorithms.compiled_update import rsample_with
from alf_entropy.networks import ActorDistributionNetwork
from alf_entropy.networks.stacked import draw
from alf_entropy.utils.checks import check_real
from alf_entropy.utils.optimizers import FusedAdam

__all__ = ["TargetUpdater", "sac_default_actor", "sac_default_optimizer", "sample_policy"]


def sac_default_actor(observation_spec: Any, action_spec: Any) -> nn.Module:
    """SAC's actor when none is given: a 256x256 ReLU ``ActorDistributionNetwork`` with a
    tanh-squashed Normal and state-dependent std."""
    return ActorDistributionNetwork(
        observation_spec,
        action_spec,
        fc_layer_params=(256, 256),
        activation=nn.ReLU,
        squash_to_spec=True,
        state_dependent_std=True,
    )


def sac_default_optimizer(params: List[nn.Parameter], lr: float = 3e-4) -> torch.optim.Optimizer:
    """SAC's optimiser when none is given: Adam with ``lr`` (gin:
    ``sac_default_optimizer.lr``)."""
    return FusedAdam(params, lr=check_real("sac_default_optimizer.lr", lr, positive=True))


def sample_policy(alg: Any, observation: Any, acting: bool = False, noise: Any = None) -> tuple:
    """The one sampling path of ``alg``'s (a ``SacAlgorithm``'s) policy:
    ``(action_or_probs, log_prob)``.

    Continuous: a reparameterised sample and its log-probability (acting:
    a plain sample, no log-probability); from the standard-normal draws ``noise`` if
    given (a compiled update's).  Discrete (not acting): all
    probabilities and log-probs ``[B, A]``.  One explicit choice: a continuous action of
    an ``ActorDistributionNetwork`` drawn from torch's generator is drawn in closed form,
    from the same distribution without building it; the network returns None for what it
    does not cover (a hook registered later, ``ALF_ENTROPY_ACCEL=0``), which is asked per
    call for that reason.  Draws come from ``alg``'s generators (None: torch's).
    """
    actor, generators = alg.actor_network, alg.generators
    discrete = alg.action_spec.is_discrete
    closed_form = not discrete and isinstance(actor, ActorDistributionNetwork)
    if closed_form and generators is None and noise is None:
        drawn = actor.rsample_and_log_prob(observation, log_prob=not acting)
        if drawn is not None:
            return drawn
    dist = actor(observation)
    if acting:
        return draw(dist, generators), None
    if discrete:
        log_probs = dist.logits  # torch normalises Categorical logits
        return log_probs.exp(), log_probs
    if noise is None:
        action = draw(dist, generators, reparameterize=True)
    else:
        action = rsample_with(dist, noise)
    return action, dist.log_prob(action)


class TargetUpdater:
    """Polyak-averages ``target``'s parameters towards ``source``'s by ``tau`` every
    ``period``-th update, counted on the host: no tensor is read to decide.

    Args:
        source: the trained module.
        target: its copy that follows it.
        tau: the weight of an average, in ``(0, 1]``.
        period: average every this many updates.
    """

    def __init__(self, source: nn.Module, target: nn.Module, tau: float, period: int):
        self.tau, self.period = tau, period
        self.updates = 0  # a checkpoint's (the module's extra state)
        self._modules = (target, source)
        self._pairs: Optional[tuple] = None

    def pairs(self) -> tuple:
        """The target's parameters and the source's."""
        if self._pairs is None:
            self._pairs = tuple(list(m.parameters()) for m in self._modules)
        return self._pairs

    def advance(self) -> float:
        """Count an update; the weight of its average: ``tau`` every ``period``-th, else 0.

        The pairs are listed here, outside a compiled graph (else a guard recompiles)."""
        self.updates += 1
        self.pairs()
        return 0.0 if self.updates % self.period else self.tau

    def lerp(self, weight: Any) -> None:
        """Move the target towards the source by ``weight`` (a float or 0-d tensor)."""
        with torch.no_grad():
            for target, source in zip(*self.pairs()):
                target.lerp_(source, weight)
