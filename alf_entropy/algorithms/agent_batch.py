"""``AgentBatch``: K agents as one algorithm that speaks the single agent's protocol.

``ManyAgents`` (A2C/PPO) and ``ManySacAgents`` (SAC) build agent ``k`` as a single run
with seed ``seeds[k]`` builds it (under that seed), stack the K agents' networks and let
the same ``algorithm_ctor`` build one more algorithm around them with
``batch_shape=(K,)``: a :class:`~alf_entropy.networks.batched_adam.BatchedAdam` with the
agents' Adam settings and a controller of the agents' class with ``batch_shape=(K,)``
(``target_entropies``: a target per agent).  Agent ``k`` draws from its own generator,
in the state the global one has right after agent ``k`` was built: a single run's draws.

Every call of the protocol (``rollout_step``, ``predict_step``, ``train_from_unroll`` or
``train_step``, ``optimizers``, ``state_dict``) is that algorithm's: the training step,
the gradient step and the summaries are the single agent's code on ``[K, ...]``
tensors, each reduction per agent, so nothing mixes two agents.  Agent ``k`` follows
the single run with seed ``seeds[k]`` up to float rounding (batched products may round
otherwise; ``tests/many_agents`` holds the first iteration within 1e-5).

Not yet: several ranks and nested action specs are refused; a free (state-independent)
``log_std`` cannot be stacked (``StackedModule`` says so).
"""

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.nn as nn

from alf_entropy.algorithms.algorithm import Algorithm
from alf_entropy.data_structures import AlgStep
from alf_entropy.networks.batched_adam import batched_adam_like
from alf_entropy.utils import distributed, nest
from alf_entropy.utils.checks import check_callable, check_int
from alf_entropy.utils.run_names import dir_safe
from alf_entropy.utils.seeding import MAX_SEED, seed_all

__all__ = ["check_agent_seeds", "AgentBatch", "agent_dir", "agent_generator", "agent_state_dict"]


def agent_generator(seed: int, device: torch.device) -> torch.Generator:
    """The generator a single run with ``seed`` samples from, as it is after the build:
    on the CPU the global generator's state now, elsewhere the device's, seeded."""
    if device.type == "cpu":
        generator = torch.Generator()
        generator.set_state(torch.get_rng_state())
        return generator
    return torch.Generator(device).manual_seed(seed)


def agent_dir(seed: int, target: Any = None) -> str:
    """Agent ``(target, seed)``'s name, as a sweep names its run directory: ``seed=N``
    (``target_entropy=T+seed=N`` for a ``target`` of its own)."""
    own = "" if target is None else f"target_entropy={dir_safe(str(target))}+"
    return f"{own}seed={seed}"


def check_agent_seeds(seeds: Sequence[int], targets: Optional[Sequence[Any]] = None) -> List[int]:
    """The agents' seeds, checked: a non-empty sequence of ints in ``[0, MAX_SEED)``, one
    per target if ``targets``, no two agents of one name (:func:`agent_dir`).

    Raises:
        TypeError: if ``seeds`` or ``targets`` is not a sequence.
        ValueError: for out-of-range or repeated seeds, or as many targets as seeds.
    """
    for arg, value in (("seeds", seeds), ("target_entropies", targets)):
        if value is not None and not hasattr(value, "__len__"):
            raise TypeError(f"{arg} must be a sequence (one per agent), got {value!r}")
    seeds = [check_int("seeds[i]", s, minimum=0, below=MAX_SEED) for s in seeds]
    if not seeds:
        raise ValueError("seeds must hold at least one seed, got []")
    if targets is not None and len(targets) != len(seeds):
        raise ValueError(f"target_entropies has {len(targets)} entries for {len(seeds)} agents")
    names = [agent_dir(s, t) for s, t in zip(seeds, targets or [None] * len(seeds))]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"seeds must be distinct unless target_entropies gives each agent "
            f"distinct (target, seed) pairs, got {twice[0]} twice (seeds {seeds}, "
            f"target_entropies {targets})"
        )
    return seeds


def _check_same_start(singles: List[Any], batched: Any) -> None:
    """The batch's controller (its target aside) starts as the agents' controllers."""
    advice = (
        "give the batch the agents' controller (entropy_target_cls) or bind its arguments in gin"
    )
    if batched.settings != singles[0].settings:
        raise ValueError(
            f"the batch's controller has settings {batched.settings}, the agents' "
            f"{singles[0].settings}: {advice}"
        )
    state = batched.state_dict()
    for k, single in enumerate(singles):
        for name, value in single.state_dict().items():
            if not isinstance(value, torch.Tensor):
                continue
            mine = state[name]
            mine = mine[k] if mine.shape == (len(singles), *value.shape) else mine
            if not torch.equal(mine, value.to(mine.device)):
                raise ValueError(
                    f"the batch's controller starts with {name} = {mine.tolist()} "
                    f"for agent {k}, the agent's controller with "
                    f"{value.tolist()}: {advice}"
                )


def agent_state_dict(
    single: nn.Module, batched: nn.Module, k: int, num_agents: int
) -> Dict[str, Any]:
    """Member ``k`` of ``batched`` in ``single``'s ``state_dict`` layout.

    A value with a leading ``num_agents`` more than ``single``'s gives its ``[k]`` (also
    inside extra states; a value ``single`` lacks is per agent if it leads with
    ``num_agents``); others are copied.  ``StackedModule``'s ``.inner.`` is dropped.

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


class AgentBatch(Algorithm):
    """K agents of one algorithm as one (module docstring); ``ManyAgents`` and
    ``ManySacAgents`` say what to stack.

    Args:
        observation_spec: the observation spec (one environment's).
        action_spec: the action spec (one environment's; not nested).
        seeds: one seed per agent (``K = len(seeds)``; distinct unless
            ``target_entropies`` tells the agents with one seed apart).
        algorithm_ctor: ``(observation_spec, action_spec, **overrides) -> algorithm``
            (configured as for a single run); it must take ``batch_shape``,
            ``entropy_target_cls``, ``optimizer`` and the network ctors stacked.  None:
            the class's ``default_algorithm_ctor``.
        target_entropies: one target per agent (a number, scheduler, ...), or None.
        entropy_target_cls: ``(action_spec, batch_shape=, debug_summaries=,
            [target_entropy=]) ->`` the batch's controller, or None for the agents'
            class (with its gin bindings); it must start as theirs do.
        device: where the agents live.

    Raises:
        ValueError: for empty ``seeds``, repeated (target, seed) pairs, targets of the
            wrong length or without a controller, a nested action spec, several ranks,
            or a batch controller that starts unlike the agents'.
        TypeError: if ``algorithm_ctor`` is not callable or builds no ``agent_cls`` or no
            Adam.
    """

    agent_cls: type = Algorithm
    """The class the agents must be."""
    default_algorithm_ctor: Optional[Callable[..., Any]] = None
    """The ``algorithm_ctor`` of None (``ManyAgents``: ``PPOAlgorithm``; SAC's: its own)."""

    def __init__(
        self,
        observation_spec: Any,
        action_spec: Any,
        seeds: Sequence[int],
        algorithm_ctor: Optional[Callable[..., Any]] = None,
        target_entropies: Optional[Sequence[Any]] = None,
        entropy_target_cls: Optional[Callable[..., Any]] = None,
        device: Any = "cpu",
    ):
        algorithm_ctor = algorithm_ctor or self.default_algorithm_ctor
        check_callable("algorithm_ctor", algorithm_ctor)
        seeds = check_agent_seeds(seeds, target_entropies)
        super().__init__(
            optimizer=None,
            debug_summaries=False,
            name=type(self).__name__,
            batch_shape=(len(seeds),),
        )
        device = torch.device(device)
        if nest.is_nested(action_spec):
            raise ValueError(f"{self.name} does not take a nested action_spec yet")
        if distributed.env_world_size() > 1:
            raise ValueError(
                f"{self.name} does not run data-parallel (several ranks, WORLD_SIZE > "
                "1): run the K agents in one process, or one agent per rank"
            )
        # Agent k as a single run with seeds[k] builds it; its generator as that run's after.
        agents, self._generators = [], []
        for seed in seeds:
            seed_all(seed)
            agent = algorithm_ctor(observation_spec, action_spec)
            if not isinstance(agent, self.agent_cls):
                raise TypeError(
                    f"algorithm_ctor must build an {self.agent_cls.__name__}, got "
                    f"{type(agent).__name__}"
                )
            agents.append(agent.to(device))
            self._generators.append(agent_generator(seed, device))
        self._seeds, self._template = seeds, (agents[0],)  # agent 0 as built: the layout
        self._alg = algorithm_ctor(
            observation_spec,
            action_spec,
            batch_shape=self.batch_shape,
            entropy_target_cls=self._controller_cls(agents, entropy_target_cls, target_entropies),
            optimizer=batched_adam_like(agents[0].optimizers()[0]),
            **self._stacked(agents),
        ).to(device)
        self._after_build(agents)
        self.use_generators(self._generators)

    def _controller_cls(
        self, agents: List[Any], cls: Optional[Callable[..., Any]], targets: Optional[Sequence[Any]]
    ) -> Optional[Callable[..., Any]]:
        """The batch's controller factory; checks that it starts as the agents' do."""
        controller = agents[0].entropy_target_algorithm
        if controller is None:
            if targets is not None:
                raise ValueError(
                    "target_entropies needs agents with an entropy controller "
                    "(enforce_entropy_target=True)"
                )
            return None
        cls = cls or getattr(agents[0], "entropy_target_cls", None) or type(controller)
        cls = functools.partial(cls, batch_shape=self.batch_shape)
        _check_same_start(
            [a.entropy_target_algorithm for a in agents],
            cls(agents[0].action_spec, debug_summaries=controller.debug_summaries),
        )
        return cls if targets is None else functools.partial(cls, target_entropy=list(targets))

    def _stacked(self, agents: List[Any]) -> Dict[str, Callable[..., nn.Module]]:
        """The batched algorithm's network ctors (``*_network_ctor=``) from the agents'."""
        raise NotImplementedError

    def _after_build(self, agents: List[Any]) -> None:
        """What the batched algorithm takes from the agents after its build."""

    def use_generators(self, generators: Optional[List[torch.Generator]]) -> None:
        super().use_generators(generators)
        self._alg.use_generators(generators)

    def get_extra_state(self) -> torch.Tensor:
        """Each agent's generator state (a checkpoint resumes its draws)."""
        return torch.stack([g.get_state() for g in self._generators])

    def set_extra_state(self, state: torch.Tensor) -> None:
        """Restore :meth:`get_extra_state`."""
        if state.shape[0] != len(self._generators):
            raise ValueError(
                f"it holds the generators of {state.shape[0]} agents, not {len(self._generators)}"
            )
        for generator, s in zip(self._generators, state):
            generator.set_state(s.clone())

    # ------------------------------------------------------ the protocol
    def rollout_step(self, inputs: Any, state: Any = ()) -> AlgStep:
        """Each agent's ``rollout_step`` (leaves ``[K, B, ...]``)."""
        return self._alg.rollout_step(inputs, state)

    def predict_step(self, inputs: Any, state: Any = ()) -> AlgStep:
        """Each agent's deterministic action (leaves ``[K, B, ...]``)."""
        return self._alg.predict_step(inputs, state)

    def train_step(self, inputs: Any, state: Any = (), rollout_info: Any = ()) -> AlgStep:
        """Each agent's ``train_step`` (SAC: one update of each on its rows ``[K, M]``)."""
        return self._alg.train_step(inputs, state, rollout_info)

    def train_from_unroll(self, experience: Any, final_time_step: Any) -> Any:
        """Each agent's ``train_from_unroll`` (A2C/PPO; leaves ``[T, K, B, ...]``)."""
        return self._alg.train_from_unroll(experience, final_time_step)

    def entropy_coefficient(self) -> Any:
        """Each agent's entropy coefficient ``[K]``."""
        return self._alg.entropy_coefficient()

    # --------------------------------------------------------- the agents
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
        """The batched algorithm (stacked networks, batch controller, ``BatchedAdam``)."""
        return self._alg

    @property
    def entropy_target_algorithm(self) -> Any:
        """The batch's controller (``batch_shape == (K,)``), or None."""
        return self._alg.entropy_target_algorithm

    @property
    def skipped_updates(self) -> torch.Tensor:
        """Each agent's count of skipped (non-finite) updates ``[K]``."""
        return self._alg.num_skipped_updates

    def agent_algorithm(self, k: int) -> Any:
        """Agent ``k`` as a single run's algorithm, loaded with its state (one object for
        every ``k``, its optimiser not the agent's).

        Raises:
            ValueError: if ``k`` is out of range.
        """
        single = self._template[0]
        single.load_state_dict(self.agent_state_dict(k))
        return single

    def agent_state_dict(self, k: int) -> Dict[str, Any]:
        """Agent ``k``'s state in a single run's ``state_dict`` layout.

        Raises:
            ValueError: if ``k`` is out of range.
        """
        return agent_state_dict(self._template[0], self._alg, k, self.num_agents)
