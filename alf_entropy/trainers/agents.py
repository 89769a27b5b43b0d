"""K agents in one trainer: the arguments, run directories, envs, checkpoints and evaluation.

:class:`AgentsTrainerMixin` is what ``OnPolicyTrainer`` and ``OffPolicyTrainer``
share for ``num_agents = K > 1`` (or ``seeds``): the argument checks, each
agent's run directory (``seed=N``, ``target_entropy=T+seed=N``), each agent's
summaries (:class:`~alf_entropy.trainers.agent_summaries.AgentSummaryCallback`),
each agent's ``operative_config.gin`` (:func:`agent_operative_config`), the K
sets of environments (:class:`~alf_entropy.environments.agent_envs.AgentEnvs`),
the agents' generators in the checkpoint and each agent's evaluation.  A trainer lists it
before ``Trainer``, calls :meth:`AgentsTrainerMixin._init_agents` before and
:meth:`AgentsTrainerMixin._agent_callbacks` after ``Trainer.__init__``, and
writes ``_build_agents``.  For one agent (``K = 1``) every method is
``Trainer``'s own.
"""
import os
import re
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gin
import torch
from absl import logging

from alf_entropy.data_structures import TimeStep
from alf_entropy.environments import evaluate
from alf_entropy.environments.agent_envs import AgentEnvs
from alf_entropy.trainers import callbacks as callbacks_lib
from alf_entropy.trainers import checkpoint as ckpt
from alf_entropy.trainers import ranks
from alf_entropy.trainers.agent_summaries import AgentSummaryCallback
from alf_entropy.trainers.trainer import EVAL_SEED_OFFSET
from alf_entropy.utils import distributed, schedulers
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.run_names import dir_safe

__all__ = ["AgentsTrainerMixin", "agent_dir", "agent_operative_config", "agent_seeds"]

_SECTION = re.compile(r"^# Parameters for (?:[\w.]+/)*([\w.]+):")
_BINDING = re.compile(r"^((?:[\w.]+/)*([\w.]+))\s*=")
BATCH_CONFIGURABLES = frozenset({"ManyAgents", "ManySacAgents", "BatchedAdam"})
"""The configurables of a batch of agents, which a single run does not build."""


def agent_operative_config(text: str, trainer: str, seed: int, controller: Optional[str] = None,
                           target: Any = None) -> str:
    """An agent's ``operative_config.gin``: the batch's, as a single run of the agent has it.

    The trainer's ``seed`` is the agent's, its ``num_agents``, ``seeds`` and
    ``target_entropies`` a single run's (1, None, None), the batch's own
    configurables (:data:`BATCH_CONFIGURABLES`) are left out and, for a
    per-agent target, ``<controller>.target_entropy`` is the agent's (a binding
    is added where the batch's config has none).  A batch configured in gin
    thus gives each agent the text of the single run with its seed (and
    target), so the report reads its seed and groups it with that run (but
    for what only the configured target builds: a scheduler's bindings stay).

    Args:
        text: the batch's operative config (``gin.operative_config_str()``).
        trainer: the trainer's configurable name (``OnPolicyTrainer``).
        seed: the agent's seed.
        controller: the controller's configurable name, for ``target``.
        target: the agent's own target entropy (None: the configured one); a
            number is written as a binding, anything else as a comment.

    Returns:
        str: the agent's config text.
    """
    values = {f"{trainer}.seed": str(seed), f"{trainer}.num_agents": "1",
              f"{trainer}.seeds": "None", f"{trainer}.target_entropies": "None"}
    if controller is not None and target is not None:
        number = isinstance(target, (int, float)) and not isinstance(target, bool)
        values[f"{controller}.target_entropy"] = repr(target) if number else None
        comment = f"# {controller}.target_entropy: {target} (this agent's)"
    out: List[str] = []
    seen, dropped, continued = set(), False, False
    for line in text.splitlines():
        section = _SECTION.match(line)
        if section:
            dropped = section.group(1) in BATCH_CONFIGURABLES
        if dropped or (continued and line[:1].isspace() and line.strip()):
            continue
        continued = False
        binding = _BINDING.match(line)
        name = binding.group(2) if binding else None
        if name in values:
            seen.add(name)
            continued = True
            value = values[name]
            out.append(comment if value is None else f"{binding.group(1)} = {value}")
            continue
        out.append(line)
    missing = [name for name in values if name not in seen and not name.endswith(
        ("num_agents", "seeds", "target_entropies"))]
    if missing:
        out += ["", "# The agent's own bindings:"] + [
            comment if values[n] is None else f"{n} = {values[n]}" for n in missing]
    return "\n".join(out) + "\n"


def agent_dir(seed: int, target: Any = None) -> str:
    """An agent's run directory under the batch's root dir (named as a sweep names runs).

    Args:
        seed: the agent's seed.
        target: its own target entropy (None: the configured one).

    Returns:
        ``seed=N``, or ``target_entropy=T+seed=N`` for a target of its own.
    """
    if target is None:
        return f"seed={seed}"
    return f"target_entropy={dir_safe(str(target))}+seed={seed}"


def agent_seeds(num_agents: int, seeds: Optional[Sequence[int]], seed: int,
                target_entropies: Optional[Sequence[Any]] = None) -> Optional[List[int]]:
    """The K agents' seeds, or None for a single run.

    Args:
        num_agents: K; with ``seeds`` None the seeds are ``seed, ..., seed + K - 1``.
        seeds: the seeds instead (at least two; distinct, or repeated where
            ``target_entropies`` gives the agents distinct run directories:
            each agent's (target, seed) its own); ``num_agents`` is then 1 or
            ``len(seeds)``.
        seed: the trainer's seed.
        target_entropies: each agent's target (None: the configured one).

    Returns:
        The seeds, or None for one agent.

    Raises:
        ValueError: for out-of-range seeds, repeated seeds without distinct
            (target, seed) run directories, or a ``num_agents`` that
            disagrees with ``seeds``.
    """
    num_agents = check_int("num_agents", num_agents, minimum=1)
    if seeds is None:
        if num_agents == 1:
            return None
        check_int("seed + num_agents - 1", seed + num_agents - 1, minimum=0,
                  below=ranks.MAX_SEED)
        return [seed + k for k in range(num_agents)]
    seeds = [check_int("seeds[i]", s, minimum=0, below=ranks.MAX_SEED) for s in seeds]
    if len(seeds) < 2:
        raise ValueError(f"seeds must be at least two seeds (for one agent use seed), got "
                         f"{seeds}")
    if num_agents not in (1, len(seeds)):
        raise ValueError(f"num_agents is {num_agents} but seeds has {len(seeds)} entries")
    if len(set(seeds)) != len(seeds):
        if target_entropies is None or len(target_entropies) != len(seeds):
            raise ValueError(f"seeds must be distinct unless target_entropies gives each "
                             f"agent its own (target, seed), got seeds {seeds}")
        dirs = [agent_dir(s, t) for s, t in zip(seeds, target_entropies)]
        twice = sorted({d for d in dirs if dirs.count(d) > 1})
        if twice:
            raise ValueError(f"seeds and target_entropies must give distinct (target, seed) "
                             f"pairs, got {twice[0]} twice (seeds {seeds})")
    return seeds


class AgentsTrainerMixin:
    """The K-agent part of a trainer (module docstring); ``Trainer`` must follow it."""

    _seeds: Optional[List[int]]

    def _init_agents(self, num_agents: int, seeds: Optional[Sequence[int]],
                     target_entropies: Optional[Sequence[Any]], seed: int) -> None:
        """Check and keep the agent arguments (before ``Trainer.__init__``).

        Raises:
            ValueError: see :func:`agent_seeds`; also K > 1 on several ranks, or
                ``target_entropies`` for one agent or of the wrong length.
        """
        self._seeds = agent_seeds(num_agents, seeds, seed, target_entropies)
        self._target_entropies = None if target_entropies is None else list(target_entropies)
        self._last_train: Optional[Tuple[Any, ...]] = None
        if self._seeds is None:
            if target_entropies is not None:
                raise ValueError("target_entropies needs num_agents > 1 (or seeds); for one "
                                 "agent bind the controller's target_entropy")
            return
        if distributed.env_world_size() > 1:
            raise ValueError(f"num_agents = {len(self._seeds)} does not run on several ranks "
                             "(WORLD_SIZE > 1): run K agents in one process, or one agent "
                             "per rank")
        if self._target_entropies is not None and len(self._target_entropies) != len(self._seeds):
            raise ValueError(f"target_entropies has {len(self._target_entropies)} entries "
                             f"for {len(self._seeds)} agents")

    def _agent_callbacks(self) -> None:
        """K agents: each agent's summaries and ``operative_config.gin`` in its own run
        directory (after ``Trainer.__init__``, which writes the batch's config)."""
        if self._seeds is None:
            return
        self._callbacks = [
            AgentSummaryCallback.like(c)
            if type(c) is callbacks_lib.SummaryCallback else c for c in self._callbacks]
        controller = self._algorithm.entropy_target_algorithm
        text = gin.operative_config_str()
        targets = self._target_entropies or [None] * len(self._seeds)
        for name, seed, target in zip(self.agent_dirs, self._seeds, targets):
            config = agent_operative_config(text, type(self).__name__, seed,
                                            type(controller).__name__, target).encode("utf-8")
            os.makedirs(os.path.join(self.root_dir, name), exist_ok=True)
            ckpt.atomic_write_bytes(os.path.join(self.root_dir, name, "operative_config.gin"),
                                    lambda f, config=config: f.write(config))

    def _build_agents(self, observation_spec: Any, action_spec: Any) -> Any:
        """The batch of agents (``ManyAgents`` or the like) on ``self._device``."""
        raise NotImplementedError

    @property
    def num_agents(self) -> int:
        """K, the agents trained side by side (1: a single run)."""
        return 1 if self._seeds is None else len(self._seeds)

    @property
    def seeds(self) -> List[int]:
        """Each agent's seed (``[seed]`` for a single run)."""
        return [self._seed] if self._seeds is None else list(self._seeds)

    @property
    def agent_dirs(self) -> List[str]:
        """Each agent's run directory, relative to ``root_dir`` (``""`` for a single run)."""
        if self._seeds is None:
            return [""]
        targets = self._target_entropies or [None] * len(self._seeds)
        return [agent_dir(s, t) for s, t in zip(self._seeds, targets)]

    def agent_summary_values(self) -> Dict[str, torch.Tensor]:
        """K agents: each agent's training summaries of the last iteration (tag -> ``[K]``)."""
        if self._seeds is None or self._last_train is None:
            return {}
        return self._algorithm.summary_values(*self._last_train)

    def _build(self) -> Tuple[Any, Any, Any]:
        if self._seeds is None:
            return super()._build()
        ranks.seed_all(self._seed)
        schedulers.reset_progress()
        probe = self._env_ctor(self._env_id, num_envs=1, seed=self._seeds[0],
                               device=self._device)
        observation_spec, action_spec = probe.observation_spec, probe.action_spec
        probe.close()
        return observation_spec, action_spec, self._build_agents(observation_spec, action_spec)

    def _start_env(self) -> Tuple[Any, TimeStep]:
        if self._seeds is None:
            return super()._start_env()
        # As a single run numbers its env seeds: seed + iteration * num_envs.
        env = AgentEnvs(self._env_id, self._num_envs,
                        [s + self._iteration * self._num_envs for s in self._seeds],
                        device=self._device, env_ctor=self._env_ctor)
        restored, self._restored_env = self._restored_env, None
        if restored:
            env.set_state([ckpt.tensor_to_bytes(t) for t in restored["state"]])
            return env, TimeStep(**{
                k: v.to(self._device) if isinstance(v, torch.Tensor) else v
                for k, v in restored["time_step"].items()
            })
        if restored is not None:
            logging.warning("The checkpoint holds no state of the %s environments: their "
                            "episodes restart, so the resumed run is not bit-exact with an "
                            "uninterrupted one.", self._env_id)
        return env, env.reset()

    def _env_state(self) -> Dict[str, Any]:
        if self._seeds is None:
            return super()._env_state()
        if self._env is None or self._in_iteration:
            return {}
        states = self._env.get_state()
        if any(state is None for state in states):
            return {}
        return {"state": [ckpt.bytes_to_tensor(state) for state in states],
                "time_step": self._time_step._asdict()}

    def _load_own(self, state: Dict[str, Any]) -> None:
        if self._seeds is None:
            return super()._load_own(state)
        env_state = state.get("env") or {}
        if env_state:
            if (not isinstance(env_state["state"], (list, tuple))
                    or len(env_state["state"]) != len(self._seeds)):
                raise ValueError(f"its environment state is not one per agent of "
                                 f"{len(self._seeds)}")
            TimeStep(**env_state["time_step"])
        self._load_extra_state(state.get("extra") or {})

    def _extra_state(self) -> Dict[str, Any]:
        if self._seeds is None:
            return super()._extra_state()
        return {"generators": [g.get_state() for g in self._algorithm.generators]}

    def _load_extra_state(self, state: Dict[str, Any]) -> None:
        if self._seeds is None:
            return super()._load_extra_state(state)
        generators = state.get("generators")
        if generators is None or len(generators) != len(self._seeds):
            raise ValueError(f"it holds no generator state for each of {len(self._seeds)} "
                             "agents")
        for generator, generator_state in zip(self._algorithm.generators, generators):
            generator.set_state(generator_state)

    def evaluate(self, num_episodes: Optional[int] = None) -> float:
        """The deterministic policy's mean return (see ``Trainer.evaluate``).

        K agents: each agent on its own environments (seeded as its single
        run's), written to its summaries; returns (and puts in
        ``metrics["eval/return"]``) the lowest agent's mean return.
        """
        if self._seeds is None:
            return super().evaluate(num_episodes)
        start, values = time.time(), []
        try:
            for k, seed in enumerate(self._seeds):
                agent = self._algorithm.agent_algorithm(k)
                agent.eval()

                def _policy(observation: Any, agent: Any = agent) -> Any:
                    return agent.predict_step(TimeStep(observation=observation)).output

                values.append(evaluate(self._env_id, _policy, seed=seed + EVAL_SEED_OFFSET,
                                       num_episodes=num_episodes or self._num_eval_episodes,
                                       device=self._device))
        finally:
            self._algorithm.train()
        for callback in self._callbacks:
            if isinstance(callback, AgentSummaryCallback):
                callback.write("eval/return", values, self._iteration)
                callback.write("eval/return_vs_env_steps", values, self._env_steps)
        self.metrics["eval/return"] = min(values)
        self._eval_time += time.time() - start
        return min(values)
