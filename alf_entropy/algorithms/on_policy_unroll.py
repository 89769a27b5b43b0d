"""An on-policy unroll as training data: the per-step infos, GAE advantages and returns,
time folded into rows and the shuffled minibatches of an epoch (``ActorCriticAlgorithm``'s
and ``PPOAlgorithm``'s).  K agents: every leaf leads with ``batch_shape`` (``nb`` dims)."""

from typing import Any, List

import torch

from alf_entropy.data_structures import Experience, TimeStep, namedtuple
from alf_entropy.utils import nest, value_ops
from alf_entropy.utils.seeding import per_member

__all__ = [
    "ActorCriticInfo",
    "ActorCriticLossInfo",
    "time_into_rows",
    "with_advantages",
    "minibatches",
]

ActorCriticInfo = namedtuple(
    "ActorCriticInfo",
    ["value", "log_prob", "advantages", "returns", "entropy", "entropy_for_gradient"],
    default_value=(),
)
"""Per step: ``value`` V(o), ``log_prob``; GAE ``advantages`` and ``returns``
(``preprocess_experience``); ``entropy`` and ``entropy_for_gradient`` (``train_step``; nests
like the action spec for a nested controller)."""

ActorCriticLossInfo = namedtuple(
    "ActorCriticLossInfo", ["pg_loss", "td_loss", "entropy"], default_value=()
)
"""Per-step loss terms (``LossInfo.extra`` of ``calc_loss``)."""


def time_into_rows(x: torch.Tensor, nb: int) -> torch.Tensor:
    """``[T, *batch, B, ...]`` as ``[*batch, T * B, ...]`` (``nb = len(batch)``)."""
    return x.movedim(0, nb).flatten(nb, nb + 1)


def with_advantages(
    experience: Experience, final_time_step: TimeStep, values: torch.Tensor, settings: dict
) -> Experience:
    """The unroll with ``value``, GAE ``advantages`` and ``returns`` from ``values``
    ``[T + 1, ...]`` (the last bootstraps), by ``settings`` (``ActorCriticAlgorithm``'s):
    rewards times ``reward_scale``, discounts times ``gamma``, and ``td_lambda``."""
    time_step, s = experience.time_step, settings

    def _with_final(x: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, final.unsqueeze(0)], dim=0)

    advantages = value_ops.generalized_advantage_estimation(
        _with_final(time_step.reward, final_time_step.reward).to(values.dtype) * s["reward_scale"],
        values,
        _with_final(experience.step_type, final_time_step.step_type),
        _with_final(time_step.discount, final_time_step.discount).to(values.dtype) * s["gamma"],
        td_lambda=s["td_lambda"],
    )
    value = values[:-1]
    return experience._replace(
        rollout_info=experience.rollout_info._replace(
            value=value, advantages=advantages, returns=advantages + value
        )
    )


def minibatches(alg: Any, exp: Experience) -> List[Experience]:
    """One epoch's minibatches of ``exp`` (``[*batch, N, ...]``) for ``alg`` (an
    ``ActorCriticAlgorithm``: its ``num_minibatches``): each member's rows permuted once
    (from its generators), then split; the whole unroll, unshuffled, for one minibatch in
    one epoch.

    Raises:
        ValueError: for fewer rows than ``num_minibatches``.
    """
    nb, settings = len(alg.batch_shape), alg.settings
    k = settings["num_minibatches"]
    n = exp.step_type.shape[nb]
    if k == 1 and settings["num_epochs"] == 1:
        return [exp]
    if n < k:
        raise ValueError(
            f"{alg.name}: an unroll of {n} steps cannot be split into num_minibatches={k}"
        )
    perm = per_member(
        lambda g: torch.randperm(n, device=exp.step_type.device, generator=g), alg.generators
    )
    shuffled = nest.map_structure(
        lambda x: x.gather(
            nb, perm.reshape(perm.shape + (1,) * (x.dim() - nb - 1)).expand(x.shape)
        ),
        exp,
    )
    splits = [x.tensor_split(k, dim=nb) for x in nest.flatten(shuffled)]
    return [nest.pack_sequence_as(shuffled, leaves) for leaves in zip(*splits)]
