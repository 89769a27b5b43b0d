"""What a batch of K agents of any algorithm needs: generators, optimiser, update, state.

``ManyAgents`` (actor-critic) and ``ManySacAgents`` (SAC) build K agents as K
single runs would, stack them and train them as one; the pieces here are
theirs alike: their base class :class:`AgentBatch` (the build, the per-agent
properties, agent ``k`` as a single run's algorithm), each agent's generator
(the single run's global generator after its build), the ``BatchedAdam`` that
replaces an agent's Adam, the check that the batch's controller starts as the
agents' controllers, the per-agent gradient step (masked mean, clipping,
non-finite skip) and agent ``k``'s state in a single run's layout.
"""
import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from alf_entropy.controllers.driver import TARGET_STATE
from alf_entropy.data_structures import LossInfo
from alf_entropy.utils import distributed, nest
from alf_entropy.utils.batched_adam import BatchedAdam
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.seeding import seed_all

__all__ = ["AgentBatch", "agent_generator", "agent_state_dict", "batched_adam_like", "build_agents",
           "check_same_start", "update_agents"]


def agent_generator(seed: int, device: torch.device) -> torch.Generator:
    """The generator a single run with ``seed`` samples from, as it is after the build.

    On the CPU that is the global generator's state now (the build drew from
    it); on another device the device's generator, seeded and untouched.
    """
    if device.type == "cpu":
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
        return generator
    return torch.Generator(device).manual_seed(seed)


def build_agents(observation_spec: Any, action_spec: Any, seeds: Sequence[int],
                 algorithm_ctor: Callable[..., Any], cls: type, device: torch.device,
                 batch_name: str, target_entropies: Optional[Sequence[Any]] = None
                 ) -> Tuple[List[Any], List[torch.Generator]]:
    """Agent ``k`` built as a single run with ``seeds[k]`` builds it, and its generator.

    Args:
        observation_spec: the observation spec.
        action_spec: the action spec (not nested).
        seeds: one seed per agent (at least one; distinct unless
            ``target_entropies`` tells the agents with one seed apart: those
            start alike, as the single runs with that seed do).
        algorithm_ctor: ``(observation_spec, action_spec) -> algorithm``.
        cls: the class the agents must be.
        device: where the agents live.
        batch_name: the batch's class name, for messages.
        target_entropies: each agent's own target (None: the configured one).

    Returns:
        ``(agents, generators)``.

    Raises:
        ValueError: for empty ``seeds``, repeated (target, seed) pairs, a
            nested action spec or a data-parallel run.
        TypeError: if ``algorithm_ctor`` builds no ``cls``.
    """
    seeds = [check_int("seeds[i]", s, minimum=0) for s in seeds]
    if not seeds:
        raise ValueError("seeds must hold at least one seed, got []")
    targets = [None] * len(seeds) if target_entropies is None else [
        str(t) for t in target_entropies]
    if len(set(zip(seeds, targets))) != len(seeds):
        raise ValueError(f"seeds must be distinct unless target_entropies gives each agent "
                         f"its own (target, seed), got seeds {seeds} and target_entropies "
                         f"{target_entropies}")
    if nest.is_nested(action_spec):
        raise ValueError(f"{batch_name} does not take a nested action_spec yet")
    if distributed.is_distributed():
        raise ValueError(f"{batch_name} does not run data-parallel (several ranks) yet; run "
                         "it in one process")
    agents, generators = [], []
    for seed in seeds:
        seed_all(seed)
        agent = algorithm_ctor(observation_spec, action_spec)
        if not isinstance(agent, cls):
            raise TypeError(f"algorithm_ctor must build an {cls.__name__}, got "
                            f"{type(agent).__name__}")
        agents.append(agent.to(device))
        generators.append(agent_generator(seed, device))
    return agents, generators


def batched_adam_like(opt: torch.optim.Optimizer) -> Callable[..., BatchedAdam]:
    """A factory ``params -> BatchedAdam`` with a single agent's Adam settings.

    Raises:
        TypeError: if ``opt`` is not Adam.
    """
    if not isinstance(opt, torch.optim.Adam):
        raise TypeError(f"the batch needs agents optimised by Adam (FusedAdam), got "
                        f"{type(opt).__name__}")
    group = opt.param_groups[0]
    return functools.partial(
        BatchedAdam, lr=group.get("initial_lr", group["lr"]), betas=group["betas"],
        eps=group["eps"], weight_decay=group["weight_decay"],
        lr_schedule=getattr(opt, "lr_schedule", None))


def update_agents(optimizer: BatchedAdam, loss_info: LossInfo, valid_mask: torch.Tensor,
                  max_grad_norm: Optional[float], skipped: torch.Tensor) -> torch.Tensor:
    """One gradient step of every agent on its own loss; a non-finite one is skipped.

    Per agent, as ``Algorithm.update_with_gradient`` for one: the masked mean
    of its loss (plus ``scalar_loss``), its global gradient norm clipped to
    ``max_grad_norm``, and a skip (parameters and Adam state kept,
    ``skipped[k]`` counted) when the loss or the norm is not finite.  Reads
    nothing on the host.

    Args:
        optimizer: the batch's optimiser.
        loss_info: ``loss`` ``[K, n]`` (and ``scalar_loss``).
        valid_mask: bool ``[K, n]``.
        max_grad_norm: clip each agent's gradient norm to this (None: no clipping).
        skipped: int ``[K]``, each agent's count of skipped updates.

    Returns:
        torch.Tensor: ``[K]`` the losses minimised (detached).
    """
    loss = loss_info.loss
    mask = valid_mask.to(loss.dtype)
    per_agent = (loss * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    if isinstance(loss_info.scalar_loss, torch.Tensor):
        per_agent = per_agent + loss_info.scalar_loss
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None
    per_agent.sum().backward()
    _, ok = optimizer.masked_step(torch.isfinite(per_agent.detach()), max_grad_norm=max_grad_norm)
    skipped.add_((~ok).to(skipped.dtype))
    return per_agent.detach()


def agent_state_dict(single: nn.Module, batched: nn.Module, k: int, num_agents: int
                     ) -> Dict[str, Any]:
    """Member ``k`` of ``batched`` in ``single``'s ``state_dict`` layout.

    A value of ``batched`` with a leading ``num_agents`` more than ``single``'s
    gives its ``[k]`` (also inside extra states: an optimiser's, where a value
    ``single`` lacks is taken as per agent if it leads with ``num_agents``);
    others are copied.  ``StackedModule``'s ``.inner.`` is dropped from the names.

    Raises:
        ValueError: if ``k`` is out of range.
    """
    check_int("k", k, minimum=0, below=num_agents)

    def _member(value: Any, ref: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if isinstance(ref, torch.Tensor):
                per_agent = value.shape == (num_agents, *ref.shape)
            else:  # state the single one has not made yet (an optimiser's before its step)
                per_agent = value.dim() > 0 and value.shape[0] == num_agents
            return (value[k] if per_agent else value).detach().clone()
        if isinstance(value, dict):
            ref = ref if isinstance(ref, dict) else {}
            return {key: _member(v, ref.get(key)) for key, v in value.items()}
        return value

    state = {name.replace(".inner.", "."): v for name, v in batched.state_dict().items()}
    return {name: _member(state[name], ref) for name, ref in single.state_dict().items()}


def check_same_start(singles: List[Any], batched: Any, own_targets: bool) -> None:
    """The batch's controller starts as the K agents' controllers (settings and state)."""
    if batched.settings != singles[0].settings:
        raise ValueError(f"the batch's controller has settings {batched.settings}, the agents' "
                         f"{singles[0].settings}: give ManyAgents the agents' controller "
                         "(entropy_target_cls) or bind its arguments in gin")
    state = batched.state_dict()
    for k, single in enumerate(singles):
        for name, value in single.state_dict().items():
            target_state = own_targets and name.rpartition(".")[2] in TARGET_STATE
            if target_state or not isinstance(value, torch.Tensor):
                continue
            mine = state[name]
            mine = mine[k] if mine.shape == (len(singles), *value.shape) else mine
            if not torch.equal(mine, value):
                raise ValueError(
                    f"the batch's controller starts with {name} = {mine.tolist()} for agent {k}, "
                    f"the agent's controller with {value.tolist()}: give ManyAgents the agents' "
                    "controller (entropy_target_cls) or bind its arguments in gin")


class AgentBatch(nn.Module):
    """The base of a batch of K agents (``ManyAgents``, ``ManySacAgents``).

    A subclass calls :meth:`_build_agents` in its constructor, builds the
    batched algorithm around the agents' stacked networks and keeps it as
    ``self._alg``.

    Args:
        device: where the agents live.
    """

    def __init__(self, device: Any = "cpu"):
        super().__init__()
        self._device = torch.device(device)
        self._alg: Any = None

    def _build_agents(self, observation_spec: Any, action_spec: Any, seeds: Sequence[int],
                      algorithm_ctor: Callable[..., Any], cls: type,
                      target_entropies: Optional[Sequence[Any]]) -> List[Any]:
        """The K agents, built as single runs (:func:`build_agents`); keeps their generators.

        Raises:
            ValueError: see :func:`build_agents`; also ``target_entropies`` not one per agent.
            TypeError: see :func:`build_agents`.
        """
        if target_entropies is not None and len(target_entropies) != len(seeds):
            raise ValueError(f"target_entropies has {len(target_entropies)} entries for "
                             f"{len(seeds)} agents")
        agents, self._generators = build_agents(observation_spec, action_spec, seeds,
                                                algorithm_ctor, cls, self._device,
                                                type(self).__name__, target_entropies)
        self._seeds = [int(s) for s in seeds]
        self._template = (agents[0],)  # agent 0 as built: the single-run layout
        self.register_buffer("skipped_updates", torch.zeros(len(seeds), dtype=torch.int64,
                                                            device=self._device))
        return agents

    @property
    def num_agents(self) -> int:
        """K."""
        return len(self._seeds)

    @property
    def seeds(self) -> List[int]:
        """Each agent's seed."""
        return list(self._seeds)

    @property
    def algorithm(self) -> Any:
        """The batched algorithm (stacked networks, batched controller, ``BatchedAdam``)."""
        return self._alg

    @property
    def entropy_target_algorithm(self) -> Any:
        """The batched controller (``batch_shape == (K,)``), or None."""
        return self._alg.entropy_target_algorithm

    @property
    def generators(self) -> List[torch.Generator]:
        """Each agent's random generator."""
        return list(self._generators)

    def optimizers(self) -> List[torch.optim.Optimizer]:
        """The batched algorithm's optimizers (one ``BatchedAdam``): what a checkpoint saves."""
        return self._alg.optimizers()

    def agent_algorithm(self, k: int) -> Any:
        """Agent ``k`` as a single run's algorithm (for evaluation: ``predict_step``).

        One algorithm is shared by every ``k``: it holds agent ``k``'s current
        state until the next call (its optimizer is not the agent's).

        Args:
            k: the agent, ``0 <= k < K``.

        Returns:
            The algorithm a single run builds, loaded with :meth:`agent_state_dict` ``(k)``.

        Raises:
            ValueError: if ``k`` is out of range.
        """
        single = self._template[0]
        single.load_state_dict(self.agent_state_dict(k))
        return single

    def agent_state_dict(self, k: int) -> Dict[str, Any]:
        """Agent ``k``'s state in a single run's layout (its algorithm's ``state_dict``).

        Args:
            k: the agent, ``0 <= k < K``.

        Returns:
            dict: loadable into the algorithm a single run builds.

        Raises:
            ValueError: if ``k`` is out of range.
        """
        return agent_state_dict(self._template[0], self._alg, k, self.num_agents)
