"""``ManyAgents``: K independent actor-critic (A2C/PPO) agents trained as one batch.

A seed sweep trains K agents that differ only in their seed (and perhaps their
target entropy).  ``ManyAgents`` holds them in one module: every tensor gets a
leading agent dimension ``K`` and each small operation runs once for all K
instead of K times, which is what costs on a CPU (per-call overhead) and on a
GPU (kernel launches).

How the agents are built (``seeds[k]`` for agent ``k``):

1. Under ``torch.manual_seed(seeds[k])`` (and NumPy's, Python's) the
   ``algorithm_ctor`` builds agent ``k`` as a single run with that seed
   builds it, so its initial parameters are that run's.
2. The K agents' networks are stacked
   (:class:`~alf_entropy.networks.stacked.StackedModule`: each ``nn.Linear``
   becomes one batched matrix product for all K) and ``algorithm_ctor``
   builds one more algorithm around them: the *batched algorithm*, with
   ``normalize_advantages=False`` (done per agent here), a
   :class:`~alf_entropy.utils.batched_adam.BatchedAdam` and, if the agents
   have an entropy controller, one controller of the same class with
   ``batch_shape=(K,)`` (K controllers, each with its own state and target:
   ``target_entropies``).
3. Agent ``k`` samples from its own ``torch.Generator``, whose state is the
   global generator's right after agent ``k`` was built: the random draws
   (actions, minibatch permutations) of a single run with that seed.

Training runs the batched algorithm's own ``train_step`` and ``calc_loss``
(the same loss code as a single agent, on ``[K, n]`` tensors: everything in
them is per element, except the controller's statistics, which the batched
controller keeps per member) and, per agent: GAE
(:func:`~alf_entropy.utils.value_ops.generalized_advantage_estimation` on
``[T, K, B]``), the minibatch permutation, advantage normalisation, the
masked mean of the loss, the global gradient norm and its clipping, the skip
of a non-finite update and Adam's state.  Nothing mixes two agents, so a NaN,
a divergence or an early solve in one leaves the others as they were.

Agent ``k`` follows a single run with seed ``seeds[k]`` (given the same
environments, :class:`~alf_entropy.environments.agent_envs.AgentEnvs`) up to
float rounding: batched matrix products may round differently from
``F.linear`` (for K = 1 on the CPU they do not), per-agent reductions may sum
in another order, and ``BatchedAdam`` is torch's single-tensor Adam where the
single run's ``FusedAdam`` kernel fuses multiply-adds (an ulp now and then).
``tests/many_agents`` holds every update of a first iteration within 1e-5.

Not yet: a data-parallel run (several ranks) and nested action specs are
refused; actor networks with a free (state-independent) ``log_std`` cannot be
stacked (``StackedModule`` says so).
"""
import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import gin
import torch
import torch.distributions as td

from alf_entropy import accel
from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm, ActorCriticInfo
from alf_entropy.algorithms.agent_batch import (
    AgentBatch,
    batched_adam_like,
    check_same_start,
    update_agents,
)
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.data_structures import AlgStep, Experience, LossInfo, TimeStep
from alf_entropy.networks import (
    ActorDistributionNetwork,
    CategoricalProjectionNetwork,
    EncodingNetwork,
    mode_of,
)
from alf_entropy.networks.stacked import (
    StackedModule,
    sample_categorical_members,
    sample_members,
)
from alf_entropy.tensor_specs import TensorSpec
from alf_entropy.utils import nest, value_ops
from alf_entropy.utils.math_ops import masked_mean

__all__ = ["ManyAgents"]


@gin.configurable
class ManyAgents(AgentBatch):
    """K independent A2C/PPO agents as one batch (see the module docstring).

    Args:
        observation_spec: the observation spec (one environment's).
        action_spec: the action spec (one environment's; not nested).
        seeds: one seed per agent; ``K = len(seeds)``.
        algorithm_ctor: ``(observation_spec, action_spec, **overrides) ->``
            an ``ActorCriticAlgorithm`` (e.g. ``PPOAlgorithm``, configured in
            gin as for a single run); it must take ``actor_network_ctor``,
            ``value_network_ctor``, ``entropy_target_cls``,
            ``normalize_advantages``, ``optimizer`` and ``fast_acting``.
        target_entropies: one target per agent (a number, scheduler, ...; see
            the controllers' ``target_entropy``), or None for the configured
            one.  Needs agents with an entropy controller.
        entropy_target_cls: ``(action_spec, batch_shape=, debug_summaries=,
            [target_entropy=]) ->`` the batch's controller, or None for the
            agents' controller's class (with its gin bindings).  The batch's
            controller must start as the agents' do (same settings and state,
            but for ``target_entropies``): a ``ValueError`` says where not.
        device: where the agents live.

    Raises:
        ValueError: for an empty ``seeds`` (or a repeated seed without its own
            target), targets of the wrong length or without a controller, a nested action spec, or a
            data-parallel run, or a batch controller that differs from the
            agents' controllers.
        TypeError: if ``algorithm_ctor`` builds no ``ActorCriticAlgorithm`` or
            its optimiser is not Adam.
    """

    def __init__(self, observation_spec: Any, action_spec: Any, seeds: Sequence[int],
                 algorithm_ctor: Callable[..., ActorCriticAlgorithm] = PPOAlgorithm,
                 target_entropies: Optional[Sequence[Any]] = None,
                 entropy_target_cls: Optional[Callable[..., Any]] = None, device: Any = "cpu"):
        super().__init__(device)
        agents = self._build_agents(observation_spec, action_spec, seeds, algorithm_ctor,
                                    ActorCriticAlgorithm, target_entropies)
        self._settings = agents[0].settings
        controller = agents[0].entropy_target_algorithm
        overrides: Dict[str, Any] = {}
        if target_entropies is not None:
            if controller is None:
                raise ValueError("target_entropies needs agents with an entropy controller "
                                 "(enforce_entropy_target=True)")
            overrides["target_entropy"] = list(target_entropies)
        if controller is not None:
            entropy_target_cls = functools.partial(
                entropy_target_cls or type(controller), batch_shape=(len(seeds),), **overrides)
        self._alg = algorithm_ctor(
            observation_spec, action_spec,
            actor_network_ctor=lambda *a: StackedModule([g.actor_network for g in agents]),
            value_network_ctor=lambda *a: StackedModule([g.value_network for g in agents]),
            entropy_target_cls=entropy_target_cls, normalize_advantages=False,
            optimizer=batched_adam_like(agents[0].optimizers()[0]),
            fast_acting=False).to(self._device)
        if controller is not None:
            check_same_start([g.entropy_target_algorithm for g in agents],
                              self._alg.entropy_target_algorithm, target_entropies is not None)

    # ---------------------------------------------------------------- acting
    def _sample(self, dist: td.Distribution) -> torch.Tensor:
        """A draw for each agent from its own generator: what ``dist.sample()`` of a single
        agent draws.  ``dist`` has batch ``[K * B, ...]`` (member-major rows)."""
        return sample_members(dist, self._generators)

    def _sample_categorical(self, probs: torch.Tensor) -> torch.Tensor:
        """``sample_categorical`` on ``[K * B, n]`` probabilities, each agent's rows
        from its own generator."""
        return sample_categorical_members(probs, self._generators)

    def _fast_acting(self, observation: Any) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """``ActorDistributionNetwork.sample_with_log_prob``'s path (the single agent's
        acting: the same arithmetic, no module calls, no distribution object) with each
        agent's generator, for a stacked plain ``ActorDistributionNetwork`` with one scalar
        categorical head; else None."""
        inner = self._alg.actor_network.inner
        if not (accel.ENABLED and type(inner) is ActorDistributionNetwork
                and isinstance(observation, torch.Tensor) and observation.dim() == 3
                and isinstance(inner.input_tensor_spec, TensorSpec)
                and observation.shape[2:] == inner.input_tensor_spec.shape
                and not nest.is_nested(inner.action_spec)):
            return None
        children = list(inner.children())  # the encoder, then the heads
        if len(children) != 2 or len(children[1]) != 1:
            return None
        encoder, head = children[0], children[1][0]
        if (type(encoder) is not EncodingNetwork or type(head) is not CategoricalProjectionNetwork
                or head.action_spec_shape or observation.dtype != encoder.dtype
                or not accel.forward_only(inner, encoder, head, head.linear, *encoder.layers)):
            return None
        x = observation.reshape(-1, observation.shape[-1])
        for layer in encoder.layers:
            x = layer.forward(x)
        return accel.categorical_sample_with_log_prob(head.linear.forward(x),
                                                      self._sample_categorical)

    def rollout_step(self, inputs: TimeStep, state: Any = ()) -> AlgStep:
        """Each agent samples its action (from its own generator); keep the log-probability.

        Call it under ``torch.no_grad()`` or ``torch.inference_mode()``.

        Args:
            inputs: a ``TimeStep`` whose ``observation`` is ``[K, B, ...]``.
            state: unused.

        Returns:
            AlgStep: ``output`` the actions ``[K, B, ...]``, ``info`` an
            ``ActorCriticInfo(log_prob=[K, B])``.
        """
        k = self.num_agents
        fast = self._fast_acting(inputs.observation)
        if fast is not None:
            action, log_prob = fast
        else:
            dist = self._alg.actor_network.forward_rows(inputs.observation)
            action = self._sample(dist)
            log_prob = dist.log_prob(action)
        return AlgStep(output=action.reshape(k, -1, *action.shape[1:]), state=state,
                       info=ActorCriticInfo(log_prob=log_prob.reshape(k, -1)))

    def predict_step(self, inputs: TimeStep, state: Any = ()) -> AlgStep:
        """Each agent's deterministic (greedy) action, for evaluation.

        Args:
            inputs: a ``TimeStep`` whose ``observation`` is ``[K, B, ...]``.
            state: unused.

        Returns:
            AlgStep: ``output`` the actions ``[K, B, ...]``.
        """
        return AlgStep(output=mode_of(self._alg.actor_network(inputs.observation)), state=state)

    # -------------------------------------------------------------- training
    def preprocess_experience(self, experience: Experience,
                              final_time_step: TimeStep) -> Experience:
        """Values, GAE advantages and returns per agent; ``[T, K, B]`` to ``[K, T * B]``.

        Agent ``k``'s rows are what ``ActorCriticAlgorithm.preprocess_experience``
        gives a single agent (``t * B + b``): the same
        :meth:`~ActorCriticAlgorithm.with_advantages` on ``[T, K, B]``.

        Args:
            experience: the unroll, leaves ``[T, K, B, ...]``, ``rollout_info``
                an ``ActorCriticInfo`` of ``rollout_step``.
            final_time_step: the time step after the unroll, leaves ``[K, B, ...]``.

        Returns:
            Experience: leaves ``[K, T * B, ...]`` with ``value``,
            ``advantages`` and ``returns`` filled in.
        """
        with torch.no_grad():
            t, k, b = experience.step_type.shape[:3]
            observations = nest.map_structure(
                lambda x, y: torch.cat([x, y.unsqueeze(0)]).transpose(0, 1).reshape(
                    k, (t + 1) * b, *x.shape[3:]),
                experience.time_step.observation, final_time_step.observation)
            values = self._alg.value_network(observations).reshape(k, t + 1, b).transpose(0, 1)
            experience = self._alg.with_advantages(experience, final_time_step, values)
            return nest.map_structure(
                lambda x: x.transpose(0, 1).reshape(k, t * b, *x.shape[3:]), experience)

    def _minibatches(self, exp: Experience) -> List[Experience]:
        """Each agent's shuffled split, from its own generator (as a single agent's)."""
        s = self._settings
        k, n = exp.step_type.shape[:2]
        if s["num_minibatches"] == 1 and s["num_epochs"] == 1:
            return [exp]
        if n < s["num_minibatches"]:
            raise ValueError(f"ManyAgents: an unroll of {n} steps cannot be split into "
                             f"num_minibatches={s['num_minibatches']}")
        device = exp.step_type.device
        perm = torch.stack([torch.randperm(n, device=device, generator=g)
                            for g in self._generators])

        def _gather(x: torch.Tensor) -> torch.Tensor:
            index = perm.reshape(k, n, *(1,) * (x.dim() - 2)).expand(x.shape)
            return x.gather(1, index)

        shuffled = nest.map_structure(_gather, exp)
        splits = [x.tensor_split(s["num_minibatches"], dim=1) for x in nest.flatten(shuffled)]
        return [nest.pack_sequence_as(shuffled, leaves) for leaves in zip(*splits)]

    def update(self, loss_info: LossInfo, valid_mask: torch.Tensor) -> torch.Tensor:
        """One gradient step of every agent on its own loss; a non-finite one is skipped.

        Per agent, as ``Algorithm.update_with_gradient`` for one: the masked
        mean of its loss (plus ``scalar_loss``), its global gradient norm
        clipped to ``max_grad_norm``, and a skip (parameters and Adam state
        kept, ``skipped_updates[k]`` counted) when the loss or the norm is
        not finite.  Reads nothing on the host.

        Args:
            loss_info: ``calc_loss``'s, ``loss`` ``[K, n]``.
            valid_mask: bool ``[K, n]``.

        Returns:
            torch.Tensor: ``[K]`` the losses minimised (detached).
        """
        return update_agents(self._alg.optimizers()[0], loss_info, valid_mask,
                             self._settings["max_grad_norm"], self.skipped_updates)

    def train_from_unroll(self, experience: Experience, final_time_step: TimeStep
                          ) -> Tuple[LossInfo, ActorCriticInfo, torch.Tensor]:
        """Train every agent on its unroll: ``num_epochs`` x ``num_minibatches`` updates.

        Args:
            experience: the unroll, leaves ``[T, K, B, ...]``.
            final_time_step: the time step after it, leaves ``[K, B, ...]``.

        Returns:
            ``(loss_info, train_info, valid_mask)`` of the last minibatch;
            ``loss_info.loss`` is ``[K]``, each agent's minimised loss.
        """
        s, alg = self._settings, self._alg
        exp = self.preprocess_experience(experience, final_time_step)
        controller = alg.entropy_target_algorithm
        once_per_unroll = s["entropy_target_update"] == "per_iteration" and controller is not None
        means = []
        loss_info = train_info = mask = None
        with alg.alpha_change_capped():
            for _ in range(s["num_epochs"]):
                for batch in self._minibatches(exp):
                    mask = alg.valid_mask(batch)
                    if s["normalize_advantages"]:
                        info = batch.rollout_info
                        batch = batch._replace(rollout_info=info._replace(advantages=torch.vmap(
                            value_ops.normalize_advantages)(info.advantages, mask)))
                    train_info = alg.train_step(batch).info
                    loss_info = alg.calc_loss(batch, train_info)
                    if once_per_unroll:
                        neg_entropy = train_info.entropy_target.loss.extra.neg_entropy.detach()
                        means.append(masked_mean(-neg_entropy, mask, dim=1)[0])
                    loss_info = loss_info._replace(loss=self.update(loss_info, mask))
                    alg.after_update()
            if once_per_unroll:
                controller.adjust_alpha(torch.stack(means).mean(0))
        return loss_info, train_info, mask

    def summary_values(self, loss_info: LossInfo, train_info: ActorCriticInfo,
                       mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Each agent's training summaries of an iteration, as a single run writes them.

        ``loss/total``, ``loss/pg``, ``loss/td`` and ``entropy`` (masked means over the
        last minibatch), ``alpha`` and, with a controller, ``target_entropy`` and
        ``stage``: what ``ActorCriticAlgorithm.summarize_train`` writes for one agent.

        Args:
            loss_info: :meth:`train_from_unroll`'s ``loss_info`` (``loss`` ``[K]``).
            train_info: its ``train_info`` (leaves ``[K, n]``).
            mask: its valid mask ``[K, n]``.

        Returns:
            dict: tag -> ``[K]`` tensor (on the device; nothing is read on the host).
        """
        k = self.num_agents
        weights = mask.to(loss_info.loss.dtype)
        count = weights.sum(1).clamp(min=1.0)

        def _mean(x: torch.Tensor) -> torch.Tensor:
            return (x.reshape(k, -1) * weights).sum(1) / count

        extra = loss_info.extra
        main = extra["main"] if isinstance(extra, dict) else extra
        out = {"loss/total": loss_info.loss.detach(), "loss/pg": _mean(main.pg_loss.detach()),
               "loss/td": _mean(main.td_loss.detach()),
               "entropy": _mean(train_info.entropy.detach())}
        controller = self._alg.entropy_target_algorithm
        alpha = self._alg.entropy_coefficient()
        out["alpha"] = torch.as_tensor(alpha, dtype=weights.dtype,
                                       device=weights.device).detach().expand(k)
        if controller is not None:
            out["target_entropy"] = torch.as_tensor(
                controller.target_entropy, device=weights.device).detach().expand(k)
            out["stage"] = torch.as_tensor(controller.stage,
                                           device=weights.device).detach().expand(k)
        return out
