"""Packing a sweep's runs into processes of several agents (``--pack_seeds``, ``--pack_targets``).

The runs of a configuration that differ only in the seed (and, with targets,
the controller's target entropy) train as one ``<trainer>.seeds`` process whose
agent directories are links to the runs' own root dirs: see :func:`pack_seeds`.
"""

import json
import math
import os
import re
from typing import Any, Dict, List, Optional

from alf_entropy.experiments.sweep_spec import PROG, SweepRun, short_names, train_command
from alf_entropy.utils.run_names import dir_safe

__all__ = ["PACKED_DIR", "PACKED_SEED_BINDINGS", "pack_seeds", "link_agent_dirs"]

PACKED_DIR = "_packed"
"""Under ``sweep_dir``: the root dirs of packed processes (``--pack_seeds``)."""
PACKED_SEED_BINDINGS = ("OnPolicyTrainer.seed", "OffPolicyTrainer.seed")
"""The seed bindings whose trainers train several agents in one process (``<trainer>.seeds``)."""
_K_AGENT_BINDING = re.compile(r"\b(?:On|Off)PolicyTrainer\.(num_agents|seeds|target_entropies)\b")


def _why_not_packed(spec):
    """Why the spec's seeds cannot be packed into one process (None: they can)."""
    if spec["seed_binding"] not in PACKED_SEED_BINDINGS:
        return (
            f"seed_binding is {spec['seed_binding']}; only "
            f"{' and '.join(PACKED_SEED_BINDINGS)} (PPO/A2C, SAC) train several agents "
            "in one process"
        )
    for text in list(spec["gin_param"]) + list(spec["parameters"]):
        if _K_AGENT_BINDING.search(text):
            return f"the spec binds {_K_AGENT_BINDING.search(text).group(0)} itself"
    return None


def _target_axis(spec):
    """The spec's packable target binding (``<controller>.target_entropy`` with numbers),
    or None and why there is none."""
    from alf_entropy import controllers

    names = {n for n in controllers.__all__ if isinstance(getattr(controllers, n), type)}
    found = [b for b in spec["parameters"] if b.endswith(".target_entropy")]
    if len(found) != 1:
        return None, f"the grid varies {len(found)} target_entropy bindings, not one"
    binding = found[0]
    if binding.rpartition(".")[0] not in names:
        return None, f"{binding} is no controller's unscoped target_entropy"
    values = spec["parameters"][binding]
    if not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
    ):
        return None, f"{binding} takes values other than finite numbers ({values!r})"
    return binding, ""


def pack_seeds(
    runs: List[SweepRun],
    spec: Dict[str, Any],
    sweep_dir: str,
    device: Optional[str] = None,
    log=print,
    targets: bool = False,
) -> List[SweepRun]:
    """Pack the runs of each configuration that differ only in the seed into one process.

    The process trains them as ``<trainer>.seeds = [...]`` (the trainer of the
    spec's ``seed_binding``: ``OnPolicyTrainer`` or ``OffPolicyTrainer``) with root dir
    ``<sweep_dir>/_packed/<configuration>+seeds=<s1>_<s2>...`` (holding the
    batch's checkpoints, config and ``train.log``), whose agent directories
    (``seed=N``, ``target_entropy=T+seed=N``) are links to the runs' own root
    dirs, so every agent's summaries land where the unpacked sweep puts that
    run's.  With ``targets`` the runs that differ only in the seed and the
    controller's target entropy (a grid binding ``<controller>.target_entropy``
    of numbers, e.g. ``EntropyTargetAlgorithm.target_entropy``) are one
    process too, the targets given as ``<trainer>.target_entropies`` (and agent
    0's as the binding, so each agent's ``operative_config.gin`` is its run's); where
    the spec has no such axis the seeds alone are packed (with a logged note).
    Runs stay separate processes (with a logged note) when the spec's seed
    is not one of those trainers' or it binds ``num_agents``/``seeds``/
    ``target_entropies`` itself, when only one run of a group is left to
    run, or when a run already has checkpoints of its own (an interrupted
    unpacked run resumes alone).

    Args:
        runs: the runs to do (as :func:`expand_spec` gives them).
        spec: the checked spec.
        sweep_dir: the sweep's dir.
        device: passed as ``--device`` if given.
        log: called with the notes.
        targets: pack the target axis too, where the spec allows.

    Returns:
        list: the processes to start: packed ones (with ``members``) and
        single runs.
    """
    why = _why_not_packed(spec)
    if why is not None:
        if len(runs) > 1:
            log(f"{PROG}: not packing seeds: {why}; one process per run")
        return list(runs)
    target = None
    if targets:
        target, why = _target_axis(spec)
        if target is None:
            log(f"{PROG}: not packing targets: {why}; packing the seeds of each configuration")
    short = short_names(list(spec["parameters"]) + [spec["seed_binding"]])
    by_group = {}
    for run in runs:
        by_group.setdefault("\n".join(b for b in run.bindings if _name_of(b) != target), []).append(
            run
        )
    trainer = spec["seed_binding"].rpartition(".")[0]
    out = []
    for members in by_group.values():
        alone = [r for r in members if os.path.isdir(os.path.join(r.root_dir, "checkpoints"))]
        for run in alone:
            log(f"{PROG}: not packing {run.name}: it has checkpoints of its own (resumes alone)")
        members = [r for r in members if r not in alone]
        if len(members) < 2:
            out += alone + members
            continue
        seeds = [r.seed for r in members]
        values = [dict(_pairs(r))[target] for r in members] if target else []
        values = values if len(set(values)) > 1 else []  # one target: seeds alone
        bindings = [b for b in members[0].bindings if not values or _name_of(b) != target]
        params = bindings + [f"{trainer}.seeds = {seeds!r}"]
        parts = [
            f"{short[b]}={dir_safe(v)}" for b, v in _pairs(members[0]) if not values or b != target
        ]
        tail = "seeds=" + "_".join(map(str, seeds))
        if values:  # agent 0's target bound too: the agents' configs are the runs' own
            params += [
                f"{target} = {values[0]}",
                f"{trainer}.target_entropies = [{', '.join(values)}]",
            ]
            tail = _agents_name(short[target], values, seeds)
        name = "+".join(parts + [tail])
        root_dir = os.path.join(sweep_dir, PACKED_DIR, name)
        targets = [json.loads(v) for v in values] if values else [None] * len(members)
        out += alone + [
            SweepRun(
                name,
                root_dir,
                train_command(spec, device, root_dir, params),
                members=members,
                targets=targets,
            )
        ]
    return out


def _agents_name(short, values, seeds):
    """A target-packed process's name for its agents: ``<short>=T1_T2+seeds=S1_S2`` for
    every target with every seed (in that order), else ``<short>_seed=T1=S1_T2=S2...``."""
    targets, unique_seeds = list(dict.fromkeys(values)), list(dict.fromkeys(seeds))
    if list(zip(values, seeds)) == [(t, s) for t in targets for s in unique_seeds]:
        return f"{short}={'_'.join(map(dir_safe, targets))}+seeds=" + "_".join(
            map(str, unique_seeds)
        )
    return f"{short}_seed=" + "_".join(f"{dir_safe(t)}={s}" for t, s in zip(values, seeds))


def _name_of(binding):
    """``'Class.arg = value'``'s ``Class.arg``."""
    return binding.partition(" = ")[0]


def _pairs(run):
    """A run's bindings (but the seed) as ``(name, gin text of the value)``."""
    return [(_name_of(b), b.partition(" = ")[2]) for b in run.bindings]


def link_agent_dirs(task: SweepRun) -> None:
    """Make a packed process's agent dirs (``seed=N``, ``target_entropy=T+seed=N``) links
    to its runs' root dirs.

    Raises:
        ValueError: if an agent dir exists and is not that link.
    """
    from alf_entropy.algorithms.agent_batch import agent_dir

    os.makedirs(task.root_dir, exist_ok=True)
    for run, target in zip(task.members, task.targets):
        os.makedirs(run.root_dir, exist_ok=True)
        link = os.path.join(task.root_dir, agent_dir(run.seed, target))
        target_dir = os.path.relpath(run.root_dir, task.root_dir)
        if os.path.islink(link) and os.path.realpath(link) == os.path.realpath(run.root_dir):
            continue
        if os.path.lexists(link):
            raise ValueError(
                f"{link} exists and is not a link to {run.root_dir}: move it "
                "away or run without --pack_seeds"
            )
        os.symlink(target_dir, link, target_is_directory=True)
