"""``ActorDistributionNetwork``: observation -> action distribution (ALF's name).

An ``EncodingNetwork`` torso shared by one projection head per action spec
leaf.  A single spec gives a single distribution; a dict/tuple nest of specs
gives the same nest of distributions (all heads share the encoder).

* Discrete (integer) spec: ``Categorical(logits)``; actions are indices
  ``0..N-1`` and the spec's ``minimum`` must be 0 (``ValueError`` otherwise).
* Continuous spec of shape ``(D,)``: ``Independent(Normal(mean, std), 1)``,
  or, with ``squash_to_spec=True``, that distribution transformed by
  ``[StableTanh(cache_size=1), AffineTransform((M+m)/2, (M-m)/2)]`` so that
  samples lie inside ``[m, M]``.  A squashed distribution has no closed-form
  entropy (use ``utils.dist_utils``' sampled estimate).  Without squashing the
  mean is unbounded and ``GymVectorEnv`` clips actions to the bounds.

Use ``alf_entropy.networks.mode_of`` for the deterministic evaluation action.
For SAC's losses, :meth:`ActorDistributionNetwork.rsample_and_log_prob`
draws a reparameterised continuous action and its log-probability in
closed form; for PPO's acting step,
:meth:`ActorDistributionNetwork.sample_with_log_prob` draws a categorical
action and its log-probability without the distribution object.
"""

from typing import Any, Callable, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from alf_entropy import accel
from alf_entropy.networks.distributions import categorical_log_prob_and_entropy, sample_categorical
from alf_entropy.networks.encoding_network import (
    ActivationArg,
    EncodingNetwork,
    flat_input_size,
    flatten_observation,
)
from alf_entropy.networks.projection_networks import (
    CategoricalProjectionNetwork,
    NormalProjectionNetwork,
)
from alf_entropy.tensor_specs import TensorSpec
from alf_entropy.utils import nest

__all__ = ["ActorDistributionNetwork"]


class ActorDistributionNetwork(nn.Module):
    """Policy network producing a (nest of) action distribution(s).

    Args:
        input_tensor_spec: observation ``TensorSpec`` (or a nest of them; each
            leaf is flattened and the leaves concatenated).
        action_spec: a ``BoundedTensorSpec`` or a dict/tuple nest of them.
        fc_layer_params: hidden layer sizes of the shared encoder.
        activation: hidden activation (class, factory or name such as
            ``"relu"``; see ``get_activation``).
        squash_to_spec: squash continuous actions into their bounds with
            tanh (see the module docstring).
        init_log_std: initial ``log(std)`` of continuous actions.
        state_dependent_std: make ``log_std`` an output of the network
            instead of a free parameter.
        min_log_std: lower clamp of ``log_std``.
        max_log_std: upper clamp of ``log_std``.

    Raises:
        TypeError: if a spec leaf is not a ``BoundedTensorSpec``
            (``action_spec``) or ``TensorSpec`` (``input_tensor_spec``).
        ValueError: for invalid sizes, bounds or std settings (see the
            projection networks).
    """

    def __init__(
        self,
        input_tensor_spec: Any,
        action_spec: Any,
        fc_layer_params: Sequence[int] = (64, 64),
        activation: ActivationArg = nn.Tanh,
        squash_to_spec: bool = False,
        init_log_std: float = 0.0,
        state_dependent_std: bool = False,
        min_log_std: float = -20.0,
        max_log_std: float = 2.0,
    ):
        super().__init__()
        input_size = flat_input_size(input_tensor_spec)
        action_leaves = nest.flatten(action_spec)
        if not action_leaves:
            raise ValueError("action_spec must contain at least one BoundedTensorSpec")
        self._input_tensor_spec = input_tensor_spec
        self._action_spec = action_spec
        self._encoder = EncodingNetwork(
            input_size, fc_layer_params=fc_layer_params, activation=activation
        )
        hidden = self._encoder.output_size
        heads = []
        for spec in action_leaves:  # a head's TypeError names a leaf that is no BoundedTensorSpec
            if getattr(spec, "is_discrete", False):
                heads.append(CategoricalProjectionNetwork(hidden, spec))
            else:
                heads.append(
                    NormalProjectionNetwork(
                        hidden,
                        spec,
                        squash_to_spec=squash_to_spec,
                        init_log_std=init_log_std,
                        state_dependent_std=state_dependent_std,
                        min_log_std=min_log_std,
                        max_log_std=max_log_std,
                    )
                )
        self._heads = nn.ModuleList(heads)
        # A bare (non-nested) action spec: ``forward`` returns the one head's
        # distribution directly (what ``pack_sequence_as`` would give).
        self._single_head = not nest.is_nested(action_spec)

    def rsample_and_log_prob(
        self, observation: Any, log_prob: bool = True
    ) -> Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
        """A reparameterised action and its log-probability, for SAC.

        See :meth:`NormalProjectionNetwork.rsample_and_log_prob`: the same
        distribution as ``forward(observation)``, without building it.  When
        calling this network or its head would run more than the stock
        ``forward`` (a subclass overrides it, a hook is registered, see
        :func:`alf_entropy.accel.forward_only`) or ``ALF_ENTROPY_ACCEL=0``,
        this returns None and the caller uses ``forward``.

        Args:
            observation: tensor ``[B, *obs_shape]`` (or nest matching
                ``input_tensor_spec``).
            log_prob: False to skip the log-probability (acting needs none).

        Returns:
            tuple: the action ``[B, *action_shape]`` and its log-probability
            ``[B]`` (None when ``log_prob`` is False); or None (see above).

        Raises:
            TypeError: unless the action spec is a single continuous spec.
        """
        head = self._heads[0]
        if not (self._single_head and isinstance(head, NormalProjectionNetwork)):
            raise TypeError(
                "rsample_and_log_prob needs a single continuous action spec, got "
                f"{self._action_spec!r}"
            )
        if (
            type(self).forward is not ActorDistributionNetwork.forward
            or type(head).forward is not NormalProjectionNetwork.forward
            or not accel.forward_only(self, head)
        ):
            return None  # an overridden forward or a hook must run
        x = flatten_observation(observation, self._input_tensor_spec, self._encoder.dtype)
        return head.rsample_and_log_prob(self._encoder(x), log_prob)

    def sample_with_log_prob(
        self, observation: Any, sample: Callable[[torch.Tensor], torch.Tensor] = sample_categorical
    ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """One draw from ``forward(observation)`` and its log-probability, cheaply.

        For this class itself with one scalar categorical head over a flat tensor
        observation, and modules that run only their ``forward``
        (:func:`alf_entropy.accel.forward_only`): what ``dist = self(observation);
        action = dist.sample(); dist.log_prob(action)`` gives, the same draws, without
        the module-call frames and the distribution object.  Anything else, or
        ``ALF_ENTROPY_ACCEL=0``, gives None (the caller then calls the network).

        Args:
            observation: tensor ``[B, *obs_shape]`` (a nest gives None).
            sample: draws indices ``[B]`` from probabilities ``[B, n]`` (default
                ``Categorical.sample``'s; a batch of agents passes each one's generator).

        Returns:
            tuple: the action (int64 ``[B]``) and its log-probability ``[B]``; or None.
        """
        logits = self._fast_logits(observation)
        return None if logits is None else accel.categorical_sample_with_log_prob(logits, sample)

    def log_prob_and_entropy(
        self, observation: Any, action: torch.Tensor
    ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """``(dist.log_prob(action), dist.entropy())`` of ``dist = self(observation)``, the same
        bits, without building ``dist``; None where ``sample_with_log_prob`` is."""
        logits = self._fast_logits(observation)
        if logits is None or action.shape != logits.shape[:1]:
            return None
        return categorical_log_prob_and_entropy(logits, action)

    def _fast_logits(self, observation: Any) -> Optional[torch.Tensor]:
        """The single categorical head's logits without module calls, or None (see
        ``sample_with_log_prob``)."""
        if not (
            accel.ENABLED
            and type(self) is ActorDistributionNetwork
            and isinstance(observation, torch.Tensor)
            and self._single_head
        ):
            return None
        head, encoder, spec = self._heads[0], self._encoder, self._input_tensor_spec
        if (
            type(head) is not CategoricalProjectionNetwork
            or head.action_spec_shape
            or type(encoder) is not EncodingNetwork
            or not isinstance(spec, TensorSpec)
            or observation.dim() != 2
            or observation.shape[1:] != spec.shape
            or observation.dtype != encoder.dtype
        ):
            return None
        layers, linear = encoder.layers, head.linear
        if not accel.forward_only(self, encoder, head, linear, *layers):
            return None  # a hook (or a compiled module) must run
        x = observation  # flatten_observation would return it as it is
        for layer in layers:
            x = layer.forward(x)
        return linear.forward(x)

    def forward(self, observation: Any) -> Any:
        """Compute the action distribution(s).

        Args:
            observation: tensor ``[B, *obs_shape]`` (or nest matching
                ``input_tensor_spec``).

        Returns:
            A ``torch.distributions.Distribution`` with batch shape ``[B]``, or
            a nest of them mirroring ``action_spec``.

        Raises:
            ValueError: if the observation does not match the spec.
        """
        x = flatten_observation(observation, self._input_tensor_spec, self._encoder.dtype)
        encoding = self._encoder(x)
        if self._single_head:
            return self._heads[0](encoding)
        dists = [head(encoding) for head in self._heads]
        return nest.pack_sequence_as(self._action_spec, dists)
