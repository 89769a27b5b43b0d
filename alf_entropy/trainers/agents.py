"""K agents in one trainer: their seeds, run directories and operative configs.

:class:`Agents` is what a trainer knows of its agents: the seeds (``None``: one agent),
each one's target and run directory (one agent: ``root_dir`` itself) and each agent's
``operative_config.gin``.  The run builds the K agents as one batch, which checks the
seeds and targets further.
"""

import os
from typing import Any, Optional, Sequence

import gin

from alf_entropy.algorithms.agent_batch import agent_dir
from alf_entropy.config.bindings import read_bindings, read_imports, split_key, write_bindings
from alf_entropy.storage import checkpoints as ckpt
from alf_entropy.utils import distributed
from alf_entropy.utils.checks import check_int
from alf_entropy.utils.seeding import MAX_SEED

__all__ = ["Agents"]

BATCH_CONFIGURABLES = frozenset({"ManyAgents", "ManySacAgents", "BatchedAdam"})
"""The configurables of a batch of agents, which a single run does not build."""


class Agents:
    """A trainer's agents (module docstring), from the trainers' arguments: ``seed`` for
    one, K from ``seed, ..., seed + K - 1`` for ``num_agents = K``, or ``seeds`` (at least
    two; ``num_agents`` 1 or ``len(seeds)``), one target each if ``target_entropies``.

    Raises:
        ValueError: for an out-of-range ``seed`` or ``num_agents``, ``num_agents`` unlike
            ``seeds``, or ``target_entropies`` for one agent (the batch checks the rest).
    """

    def __init__(
        self,
        num_agents: int,
        seeds: Optional[Sequence[int]],
        target_entropies: Optional[Sequence[Any]],
        seed: int,
    ):
        self.seed = check_int("seed", seed, minimum=0, below=MAX_SEED)
        num_agents = check_int("num_agents", num_agents, minimum=1)
        if seeds is None and num_agents > 1:
            check_int("seed + num_agents - 1", seed + num_agents - 1, minimum=0, below=MAX_SEED)
            seeds = list(range(seed, seed + num_agents))
        elif hasattr(seeds, "__len__"):  # not a sequence: the batch says so
            if len(seeds) < 2:
                raise ValueError(
                    f"seeds must be at least two seeds (for one agent use seed), got {seeds}"
                )
            if num_agents not in (1, len(seeds)):
                raise ValueError(f"num_agents is {num_agents} but seeds has {len(seeds)} entries")
        if seeds is None and target_entropies is not None:
            raise ValueError(
                "target_entropies needs num_agents > 1 (or seeds); for one agent "
                "bind the controller's target_entropy"
            )
        self.seeds, self.targets = seeds, target_entropies
        self._targets = target_entropies or [None] * len(seeds or [])
        self.dirs = (
            [""] if seeds is None else [agent_dir(s, t) for s, t in zip(seeds, self._targets)]
        )
        """Each agent's run directory, relative to ``root_dir`` (one agent: ``[""]``)."""

    def write_configs(self, root_dir: str, trainer: str, algorithm: Any) -> None:
        """Each agent's ``operative_config.gin`` in its directory (one agent: none but the
        run's own): the batch's imports and bindings (read by gin's parser) as the single run of
        the agent has them -- the ``trainer``'s ``seed`` the agent's, ``num_agents``,
        ``seeds`` and ``target_entropies`` a single run's, the batch's own configurables
        (:data:`BATCH_CONFIGURABLES`) left out, the controller's ``target_entropy`` the
        agent's own target (a number as a binding, anything else as a comment) -- one per
        line in gin's order, the batch's: the report reads its seed and groups it with
        that run."""
        if self.seeds is None or not distributed.is_main_process():
            return
        controller = type(algorithm.entropy_target_algorithm).__name__
        text = gin.operative_config_str()
        batch, imports = read_bindings(text), read_imports(text)
        for name, seed, target in zip(self.dirs, self.seeds, self._targets):
            own = {
                f"{trainer}.seed": str(int(seed)),
                f"{trainer}.num_agents": "1",
                f"{trainer}.seeds": "None",
                f"{trainer}.target_entropies": "None",
            }
            number = isinstance(target, (int, float)) and not isinstance(target, bool)
            if target is not None:
                own[f"{controller}.target_entropy"] = repr(target) if number else None
            bindings, seen = {}, set()
            for key, value in batch.items():
                if split_key(key)[1] not in BATCH_CONFIGURABLES:
                    unscoped = key.rpartition("/")[2]  # every scope's binding is the agent's
                    seen.add(unscoped)
                    bindings[key] = own.get(unscoped, value)
            bindings.update(
                (k, v)
                for k, v in own.items()
                if k not in seen and k.endswith((".seed", ".target_entropy"))
            )
            bindings = {k: v for k, v in bindings.items() if v is not None}
            config = write_bindings(bindings, imports)
            if target is not None and not number:
                config += f"# {controller}.target_entropy: {target} (this agent's)\n"
            ckpt.atomic_write_bytes(
                os.path.join(root_dir, name, "operative_config.gin"),
                lambda f: f.write(config.encode()),
            )
