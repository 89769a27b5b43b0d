"""SAC's losses per row: the soft TD target, the twin critics' loss and the actor's terms.

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
"""

from typing import Any, Tuple

import torch

from alf_entropy.algorithms.compiled_update import device_update
from alf_entropy.algorithms.sac_networks import sample_policy
from alf_entropy.controllers import EntropyController
from alf_entropy.controllers.ops import member_mean
from alf_entropy.data_structures import LossInfo, namedtuple
from alf_entropy.utils import summary
from alf_entropy.utils.replay_buffer import Transition
from alf_entropy.utils.seeding import per_member

__all__ = [
    "SacLossInfo",
    "sac_losses",
    "update_noise",
    "actor_loss_in_graph",
    "summarize_losses",
]

SacLossInfo = namedtuple(
    "SacLossInfo", ["critic", "actor", "entropy", "q", "alpha"], default_value=()
)
"""``LossInfo.extra`` of an update, for summaries: detached per-row ``[N]``
tensors, and ``alpha`` (0-d)."""


def sac_losses(
    alg: Any, batch: Transition, noise: Any = ()
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, SacLossInfo]:
    """The terms of an update of ``alg`` (a ``SacAlgorithm``) but the entropy's (see the
    module docstring): its policy's samples, critics, target critics, controller's alpha
    (detached), ``gamma`` and ``reward_scale``.

    Args:
        alg: the ``SacAlgorithm``.
        batch: a ``Transition`` of ``[N, ...]`` (K agents: ``[K, N, ...]``) tensors.
        noise: the standard-normal draws of the two samples (``o'``, then ``o``;
            :func:`update_noise`), or ``()`` to draw them.

    Returns:
        Per row: the critic loss, ``min_i Q_i(o, a~)``, the entropy, and a ``SacLossInfo``
        of them detached (its ``actor`` left to the caller).
    """
    critics, targets = alg.critic_networks, alg.target_critic_networks
    discrete, alpha = alg.action_spec.is_discrete, alg.entropy_target_algorithm.alpha.detach()

    next_noise, noise = noise or (None, None)
    with torch.no_grad():
        next_a, next_logp = sample_policy(alg, batch.next_observation, noise=next_noise)
        # K agents (a batch controller): alpha [K] against rows [K, N, ...].
        a = alpha.reshape(*alpha.shape, *(1,) * (next_logp.dim() - 1)) if alpha.dim() else alpha
        if discrete:
            target_q = targets(batch.next_observation).min(dim=0).values  # [N, A]
            next_v = (next_a * (target_q - a * next_logp)).sum(-1)
        else:
            target_q = targets(batch.next_observation, next_a).min(dim=0).values
            next_v = target_q - a * next_logp
        y = alg.reward_scale * batch.reward + alg.gamma * batch.discount.to(next_v.dtype) * next_v
    if discrete:
        q_all = critics(batch.observation)  # [n, N, A]
        index = batch.action.long().unsqueeze(-1).expand(*q_all.shape[:-1], 1)
        q = q_all.gather(-1, index).squeeze(-1)
        probs, logp = sample_policy(alg, batch.observation)
        q_pi = (probs * q_all.detach().min(dim=0).values).sum(-1)
        entropy = -(probs * logp).sum(-1)
    else:
        q = critics(batch.observation, batch.action)  # [n, N]
        action, logp = sample_policy(alg, batch.observation, noise=noise)
        q_pi = critics(batch.observation, action, detach_params=True).min(dim=0).values
        entropy = -logp
    critic_loss = 0.5 * (q - y.unsqueeze(0)).square().sum(0)
    extra = SacLossInfo(
        critic=critic_loss.detach(), entropy=entropy.detach(), q=q.detach().mean(0), alpha=alpha
    )
    return critic_loss, q_pi, entropy, extra


def update_noise(alg: Any, batch: Transition) -> Tuple[torch.Tensor, ...]:
    """The standard-normal draws of the two samples (``o'``, then ``o``) of ``alg``'s update
    on ``batch``, from its generators, in the order that eager's samples draw them (none
    for a discrete action)."""
    if alg.action_spec.is_discrete:
        return ()
    action = batch.action
    shape = action.shape[len(alg.batch_shape) :]
    return tuple(
        per_member(
            lambda g: torch.randn(shape, dtype=torch.float32, device=action.device, generator=g),
            alg.generators,
        )
        for _ in range(2)
    )


def actor_loss_in_graph(
    controller: EntropyController, entropy: torch.Tensor, mask: torch.Tensor, extra: SacLossInfo
) -> Tuple[torch.Tensor, SacLossInfo]:
    """A compiled update's entropy term, in its graph: the controller's device step; the new
    alpha, and ``extra`` with ``actor`` (``-min Q`` until now) less ``alpha * entropy``."""
    alpha = device_update(controller, entropy, mask)
    shape = alpha.shape + (1,) * (entropy.dim() - len(controller.batch_shape))
    actor = extra.actor - alpha.reshape(shape) * entropy
    return alpha, extra._replace(actor=actor)


def summarize_losses(alg: Any, loss_info: LossInfo, valid: torch.Tensor) -> None:
    """The summaries of ``alg``'s (a ``SacAlgorithm``'s) update: its losses' and entropy's
    means over the ``valid`` rows (per agent), the controller's ``alpha``, target and stage,
    and the count of skipped updates."""
    extra, controller = loss_info.extra, alg.entropy_target_algorithm

    def _mean(x: torch.Tensor) -> torch.Tensor:
        return member_mean(x, valid, len(alg.batch_shape))[0]

    summary.scalar("loss/total", loss_info.loss)
    summary.scalar("loss/critic", _mean(extra.critic))
    summary.scalar("loss/actor", _mean(extra.actor))
    summary.scalar("entropy", _mean(extra.entropy))
    summary.scalar("alpha", controller.alpha)
    summary.scalar("target_entropy", controller.target_entropy)
    summary.scalar("stage", controller.stage)
    summary.scalar("q", _mean(extra.q))
    summary.scalar("num_skipped_updates", alg.num_skipped_updates)
