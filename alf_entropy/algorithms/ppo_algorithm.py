"""``PPOAlgorithm``: proximal policy optimisation with the clipped surrogate.

A subclass of :class:`~alf_entropy.algorithms.actor_critic_algorithm.
ActorCriticAlgorithm` (same networks, rollout, GAE, masking and entropy
handling) that changes two things:

* the policy-gradient term is PPO's clipped surrogate (Schulman et al.,
  2017)::

      ratio = exp(log_prob - rollout_log_prob)
      pg_loss = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)

* each unroll is trained on for ``num_epochs`` passes of
  ``num_minibatches`` shuffled minibatches, with advantages normalised per
  minibatch (by default).

The clip range may be a scheduler, as rl-zoo's tuned CartPole PPO anneals it
linearly to 0 (with the learning rate: see ``FusedAdam.lr_schedule``)::

    PPOAlgorithm.importance_ratio_clipping = @clip/LinearScheduler()
    clip/LinearScheduler.progress_type = 'percent'
    clip/LinearScheduler.schedule = [(0, 0.2), (1.0, 0.0)]

With an entropy controller its ``calc_loss`` runs, and adjusts ``alpha``, once
per minibatch.
"""

from typing import Any, Callable, Optional, Tuple, Union

import torch
import torch.nn as nn

from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm, ActorCriticInfo
from alf_entropy.algorithms.algorithm import OptimizerArg
from alf_entropy.controllers.base import arguments
from alf_entropy.data_structures import Experience, LossInfo
from alf_entropy.networks import ActorDistributionNetwork, ValueNetwork
from alf_entropy.utils import schedulers, summary
from alf_entropy.utils.checks import check_real

__all__ = ["PPOAlgorithm"]


class PPOAlgorithm(ActorCriticAlgorithm):
    """PPO-clip (see the module docstring).

    Takes ``ActorCriticAlgorithm``'s arguments (``gamma``, ``td_lambda``,
    ``entropy_target_cls``, ``max_grad_norm``, ...), with PPO's defaults for
    four of them (``normalize_advantages``, ``num_epochs``, ``num_minibatches``,
    ``name``), and adds the clip range.

    Args:
        importance_ratio_clipping: the clip range ``eps``: a number in
            ``(0, 1)``, or a scheduler (any zero-argument callable) whose
            values lie in ``[0, 1)``, read once per update.

    Raises:
        ValueError: for out-of-range arguments (see also
            ``ActorCriticAlgorithm``), and from an update whose scheduled
            clip range is outside ``[0, 1)``.
        TypeError: if ``importance_ratio_clipping`` is neither a real number
            nor a callable.

    Examples:
        >>> import torch
        >>> from alf_entropy.data_structures import TimeStep
        >>> from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
        >>> ppo = PPOAlgorithm(TensorSpec((4,)), BoundedTensorSpec((), torch.int64, 0, 1),
        ...                    enforce_entropy_target=True, gamma=0.98)
        >>> ppo.rollout_step(TimeStep(observation=torch.randn(8, 4))).output.shape
        torch.Size([8])
        >>> type(ppo.entropy_target_algorithm).__name__  # the default controller
        'EntropyTargetAlgorithm'
    """

    def __init__(
        self,
        observation_spec: Any,
        action_spec: Any,
        *,
        actor_network_ctor: Callable[..., nn.Module] = ActorDistributionNetwork,
        value_network_ctor: Callable[..., nn.Module] = ValueNetwork,
        optimizer: OptimizerArg = None,
        gamma: float = 0.99,
        td_lambda: float = 0.95,
        normalize_advantages: bool = True,
        td_loss_weight: float = 0.5,
        reward_scale: float = 1.0,
        entropy_regularization: Optional[Union[float, Callable[[], float]]] = None,
        enforce_entropy_target: bool = False,
        entropy_target_cls: Optional[Callable] = None,
        entropy_target_update: str = "per_minibatch",
        max_grad_norm: Optional[float] = 0.5,
        num_epochs: int = 4,
        num_minibatches: int = 4,
        fast_acting: bool = True,
        debug_summaries: bool = False,
        name: str = "PPOAlgorithm",
        batch_shape: Tuple[int, ...] = (),
        importance_ratio_clipping: Union[float, Callable[[], float]] = 0.2,
    ):
        if callable(importance_ratio_clipping):
            self._clip_schedule = importance_ratio_clipping
        else:
            self._clip_schedule = schedulers.ConstantScheduler(
                check_real(
                    "importance_ratio_clipping", importance_ratio_clipping, above=0.0, below=1.0
                )
            )
        # Every argument passed on: ActorCriticAlgorithm's gin bindings stay A2C's.
        super().__init__(**arguments(locals(), "importance_ratio_clipping"))

    @property
    def importance_ratio_clipping(self) -> float:
        """The clip range ``eps`` now (a scheduled one at the current progress).

        Raises:
            ValueError: if a scheduled value is outside ``[0, 1)``.
        """
        # A host-side float: reading a scheduler touches no tensor.
        return check_real(
            "importance_ratio_clipping (scheduled)", self._clip_schedule(), minimum=0.0, below=1.0
        )

    def _policy_gradient_loss(
        self, experience: Experience, train_info: ActorCriticInfo, advantages: torch.Tensor
    ) -> torch.Tensor:
        """Per-step clipped surrogate loss.

        Args:
            experience: the minibatch (``rollout_info.log_prob`` is the
                behaviour policy's log-probability).
            train_info: ``train_step``'s info.
            advantages: the (possibly normalised) advantages.

        Returns:
            torch.Tensor: ``[N]`` loss.
        """
        eps = self.importance_ratio_clipping
        log_ratio = train_info.log_prob - experience.rollout_info.log_prob
        # Bound the log-ratio so exp() cannot overflow; the clipped objective
        # gives no gradient that far outside [1 - eps, 1 + eps] anyway.
        ratio = torch.exp(log_ratio.clamp(max=20.0))
        clipped = ratio.clamp(1.0 - eps, 1.0 + eps)
        return -torch.min(ratio * advantages, clipped * advantages)

    def summarize_train(
        self,
        experience: Experience,
        loss_info: LossInfo,
        train_info: ActorCriticInfo,
        mask: torch.Tensor,
    ) -> None:
        """Actor-critic summaries plus ``approx_kl``, ``clip_fraction`` and
        ``clip_range`` (the clip range of this update).

        Args:
            experience: the minibatch of the last update.
            loss_info: its ``LossInfo`` (after ``update_with_gradient``).
            train_info: its ``train_step`` info.
            mask: its valid mask.
        """
        super().summarize_train(experience, loss_info, train_info, mask)
        log_ratio = (train_info.log_prob - experience.rollout_info.log_prob).detach()
        # The k3 estimator of KL(old || new) (Schulman's blog; CleanRL).
        summary.scalar("ppo/approx_kl", self._mean(log_ratio.exp() - 1 - log_ratio, mask))
        eps = self.importance_ratio_clipping
        clipped = (log_ratio.exp() - 1).abs() > eps
        summary.scalar("ppo/clip_fraction", self._mean(clipped.float(), mask))
        summary.scalar("ppo/clip_range", eps)
