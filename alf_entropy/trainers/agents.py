"""K agents in one trainer: their seeds, run directories and operative configs.

:class:`Agents` is what a trainer knows of its agents: the seeds (``None``: one agent),
each one's target and run directory (one agent: ``root_dir`` itself), the algorithm ctor
(one agent's, or the batch's) and each agent's ``operative_config.gin``.
"""
import os
import re
from typing import Any, Callable, List, Optional, Sequence

import gin
import torch

from alf_entropy.algorithms.agent_batch import check_agent_seeds
from alf_entropy.storage import checkpoints as ckpt
from alf_entropy.trainers import ranks
from alf_entropy.utils import distributed
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.run_names import dir_safe

__all__ = ["Agents", "agent_dir", "agent_operative_config", "agent_seeds"]

_SECTION = re.compile(r"^# Parameters for (?:[\w.]+/)*([\w.]+):")
_BINDING = re.compile(r"^((?:[\w.]+/)*([\w.]+))\s*=")
BATCH_CONFIGURABLES = frozenset({"ManyAgents", "ManySacAgents", "BatchedAdam"})
"""The configurables of a batch of agents, which a single run does not build."""


def agent_operative_config(text: str, trainer: str, seed: int, controller: Optional[str] = None,
                           target: Any = None) -> str:
    """An agent's ``operative_config.gin``: the batch's ``text`` as the single run of the
    agent has it -- the ``trainer``'s ``seed`` the agent's, ``num_agents``, ``seeds`` and
    ``target_entropies`` a single run's, the batch's own configurables
    (:data:`BATCH_CONFIGURABLES`) left out, ``<controller>.target_entropy`` the agent's own
    ``target`` (a number as a binding, anything else as a comment); so the report reads
    its seed and groups it with that run."""
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
    """An agent's run directory, as a sweep names runs: ``seed=N`` (``target_entropy=T+
    seed=N`` for a ``target`` of its own)."""
    own = "" if target is None else f"target_entropy={dir_safe(str(target))}+"
    return f"{own}seed={seed}"


def agent_seeds(num_agents: int, seeds: Optional[Sequence[int]], seed: int,
                target_entropies: Optional[Sequence[Any]] = None) -> Optional[List[int]]:
    """The K agents' seeds (None: one agent, a single run): ``seed, ..., seed + K - 1``
    for ``num_agents = K``, or ``seeds`` (at least two; ``num_agents`` 1 or ``len(seeds)``;
    a seed may repeat where ``target_entropies`` gives each agent its own (target, seed)).

    Raises:
        ValueError: for out-of-range or repeated seeds, ``num_agents`` unlike ``seeds``, or
            ``target_entropies`` not one per agent.
    """
    num_agents = check_int("num_agents", num_agents, minimum=1)
    if seeds is None:
        if num_agents == 1:
            return None
        check_int("seed + num_agents - 1", seed + num_agents - 1, minimum=0,
                  below=ranks.MAX_SEED)
        seeds = [seed + k for k in range(num_agents)]
    elif hasattr(seeds, "__len__"):  # not a sequence: check_agent_seeds says so
        if len(seeds) < 2:
            raise ValueError(f"seeds must be at least two seeds (for one agent use seed), got "
                             f"{seeds}")
        if num_agents not in (1, len(seeds)):
            raise ValueError(f"num_agents is {num_agents} but seeds has {len(seeds)} entries")
    return check_agent_seeds(seeds, target_entropies, ranks.MAX_SEED, agent_dir)


class Agents:
    """A trainer's agents (module docstring), from the trainers' arguments.

    Raises:
        ValueError: see :func:`agent_seeds` (targets of the wrong length too); also K > 1
            on several ranks, or ``target_entropies`` for one agent.
    """

    def __init__(self, num_agents: int, seeds: Optional[Sequence[int]],
                 target_entropies: Optional[Sequence[Any]], seed: int):
        self.seeds = agent_seeds(num_agents, seeds, seed, target_entropies)
        self.targets = None if target_entropies is None else list(target_entropies)
        if self.seeds is None and self.targets is not None:
            raise ValueError("target_entropies needs num_agents > 1 (or seeds); for one agent "
                             "bind the controller's target_entropy")
        if self.seeds is not None and distributed.env_world_size() > 1:
            raise ValueError(f"num_agents = {len(self.seeds)} does not run on several ranks "
                             "(WORLD_SIZE > 1): run K agents in one process, or one agent per "
                             "rank")

    @property
    def dirs(self) -> List[str]:
        """Each agent's run directory, relative to ``root_dir`` (one agent: ``[""]``)."""
        return [""] if self.seeds is None else [
            agent_dir(s, t) for s, t in zip(self.seeds, self.targets or [None] * len(self.seeds))]

    def algorithm_ctor(self, batch_cls: Callable[..., Any], algorithm_ctor: Callable[..., Any],
                       device: torch.device) -> Callable[..., Any]:
        """``algorithm_ctor`` for one agent, else a ctor of ``batch_cls`` of the K agents."""
        if self.seeds is None:
            return algorithm_ctor
        return lambda observation_spec, action_spec: batch_cls(
            observation_spec, action_spec, self.seeds, algorithm_ctor=algorithm_ctor,
            target_entropies=self.targets, device=device)

    def write_configs(self, root_dir: str, trainer: str, algorithm: Any) -> None:
        """Each agent's ``operative_config.gin`` in its directory (one agent: none but the
        run's own)."""
        if self.seeds is None or not distributed.is_main_process():
            return
        controller = type(algorithm.entropy_target_algorithm).__name__
        text = gin.operative_config_str()
        for name, seed, target in zip(self.dirs, self.seeds,
                                      self.targets or [None] * len(self.seeds)):
            config = agent_operative_config(text, trainer, seed, controller, target).encode()
            ckpt.atomic_write_bytes(os.path.join(root_dir, name, "operative_config.gin"),
                                    lambda f, config=config: f.write(config))
