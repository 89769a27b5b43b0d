"""``alf-entropy-sweep``: train a grid of gin bindings x seeds, then report.

Usage::

    alf-entropy-sweep --spec sweep.json --sweep_dir runs/my_sweep --jobs 2
    alf-entropy-sweep --spec sweep.json --sweep_dir /shared/sweep --ray_address auto

The spec is a small JSON file, in the spirit of ALF's ``grid_search``::

    {
      "gin_file": ["ppo_cartpole.gin"],
      "gin_param": ["OnPolicyTrainer.num_env_steps = 50000"],
      "parameters": {
        "EntropyTargetAlgorithm.target_entropy": [0.5, 0.6],
        "EntropyTargetAlgorithm.fast_update_rate": [0.1, 0.69]
      },
      "seeds": [0, 1, 2]
    }

* ``gin_file`` / ``gin_param`` (optional): passed to every run, as
  ``alf-entropy-train``'s ``--gin_file`` / ``--gin_param``.
* ``parameters``: binding -> list of values (gin literals as JSON numbers,
  strings such as ``"@LinearScheduler()"``, booleans, lists); every
  combination is a configuration.
* ``seeds`` (default ``[0]``): each configuration runs once per seed, bound
  through ``seed_binding`` (default ``"OnPolicyTrainer.seed"``).

Each run gets its own root dir ``<sweep_dir>/<name>``, named by its bindings
(the last part of each binding's name, or the whole name where two would
clash), e.g. ``target_entropy=0.5+fast_update_rate=0.1+seed=1``.  A run that
finishes gets a ``sweep_done.json`` marker holding its command; running the
sweep again skips those whose recorded command is the one the spec gives now,
and the others start again (``alf-entropy-train`` resumes an interrupted run
from its latest checkpoint).  A finished run whose recorded command differs
(a fixed binding of the spec was changed) is never counted as done: the sweep
refuses to start, naming the runs and the difference, before it writes
anything (use a new ``--sweep_dir``, or delete those run directories to
rerun them).  A run's output goes to ``<run dir>/train.log``; a failed run is
reported at the end with its own error line and does not stop the others
(the exit status is then 1); a run whose directory another process is
training in is reported as "already running", not as failed.  Finally the
report of all the runs is written to ``<sweep_dir>/report`` (see
``alf-entropy-report``).

With ``--pack_seeds`` the seeds of each configuration train as one process
of several agents (``OnPolicyTrainer.seeds`` or ``OffPolicyTrainer.seeds``,
as the spec's ``seed_binding`` names the trainer) where the spec allows, each
agent writing to its run's directory (see :func:`pack_seeds`); the runs,
their done markers and the report are those of the unpacked sweep.  With
``--pack_targets`` the configurations that differ only in the controller's
target entropy are one process too (``<trainer>.target_entropies``).

Runs execute as ``--jobs`` parallel local processes by default.  With
``--ray_address`` (an address, ``auto`` for the cluster this machine is part
of, or ``local`` to start a private Ray instance) each run is a Ray task (one
CPU each) on that cluster; ``sweep_dir`` must then be on a file system every
node shares.  Ray is an extra: ``pip install -e .[ray]``.
"""
import argparse
import concurrent.futures
import itertools
import json
import math
import os
import re
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from alf_entropy.utils.checks import check_int

__all__ = ["SweepRun", "load_spec", "expand_spec", "pack_seeds", "is_done", "stale_runs",
           "run_sweep", "main"]

PROG = "alf-entropy-sweep"
DONE_FILE = "sweep_done.json"
PACKED_DIR = "_packed"
"""Under ``sweep_dir``: the root dirs of packed processes (``--pack_seeds``)."""
PACKED_SEED_BINDINGS = ("OnPolicyTrainer.seed", "OffPolicyTrainer.seed")
"""The seed bindings whose trainers train several agents in one process (``<trainer>.seeds``)."""
_K_AGENT_BINDING = re.compile(
    r"\b(?:On|Off)PolicyTrainer\.(num_agents|seeds|target_entropies)\b")
_SPEC_KEYS = {"gin_file", "gin_param", "parameters", "seeds", "seed_binding"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


class SweepRun:
    """One run of a sweep, or one packed process of several (``members``).

    Attributes:
        name: its directory name.
        root_dir: ``<sweep_dir>/<name>`` (a packed process:
            ``<sweep_dir>/_packed/<name>``).
        command: the ``alf-entropy-train`` command line (a list).
        config: the name of its bindings without the seed (``""`` if none).
        seed: its seed (None for a packed process).
        bindings: its ``--gin_param`` bindings without the seed.
        members: a packed process's runs (each agent is one); ``[]`` for a run.
        targets: a packed process's target entropy of each member (None each
            where it packs seeds only).
    """

    def __init__(self, name: str, root_dir: str, command: List[str], config: str = "",
                 seed: Optional[int] = None, bindings: Optional[List[str]] = None,
                 members: Optional[List["SweepRun"]] = None,
                 targets: Optional[List[Any]] = None):
        self.name = name
        self.root_dir = root_dir
        self.command = command
        self.config = config
        self.seed = seed
        self.bindings = list(bindings or [])
        self.members = list(members or [])
        self.targets = list(targets) if targets is not None else [None] * len(self.members)

    def __repr__(self) -> str:
        return f"SweepRun({self.name!r})"


def _gin_literal(value: Any) -> str:
    """A JSON value as gin text (strings such as ``@Foo()`` or ``'x'`` as written)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "None"
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_gin_literal(v) for v in value) + (",)" if len(value) == 1 else ")")
    return repr(value)


def load_spec(path: str) -> Dict[str, Any]:
    """Read and check a sweep spec.

    Args:
        path: the JSON file.

    Returns:
        dict: the spec with defaults filled in.

    Raises:
        ValueError: for an unreadable file or a malformed spec.
    """
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read sweep spec {path!r}: {e}") from e
    return check_spec(spec)


def check_spec(spec: Any) -> Dict[str, Any]:
    """Check a sweep spec (a dict as in the module docstring); fill in defaults.

    Args:
        spec: the parsed spec.

    Returns:
        dict: a checked copy.

    Raises:
        ValueError: naming the offending key.
    """
    if not isinstance(spec, dict):
        raise ValueError(f"the sweep spec must be a JSON object, got {type(spec).__name__}")
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise ValueError(
            f"unknown keys in the sweep spec: {sorted(unknown)}; allowed: {sorted(_SPEC_KEYS)}"
        )
    out = {
        "gin_file": spec.get("gin_file", []),
        "gin_param": spec.get("gin_param", []),
        "parameters": spec.get("parameters", {}),
        "seeds": spec.get("seeds", [0]),
        "seed_binding": spec.get("seed_binding", "OnPolicyTrainer.seed"),
    }
    for key in ("gin_file", "gin_param"):
        if isinstance(out[key], str):
            out[key] = [out[key]]
        if not isinstance(out[key], list) or not all(isinstance(s, str) for s in out[key]):
            raise ValueError(f"{key} must be a string or a list of strings, got {out[key]!r}")
    params = out["parameters"]
    if not isinstance(params, dict) or not all(
        isinstance(k, str) and "." in k and isinstance(v, list) and v for k, v in params.items()
    ):
        raise ValueError(
            "parameters must map bindings ('Class.arg') to non-empty lists of values, "
            f"got {params!r}"
        )
    seeds = out["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds
    ) or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be a non-empty list of distinct ints >= 0, got {seeds!r}")
    if not isinstance(out["seed_binding"], str) or "." not in out["seed_binding"]:
        raise ValueError(f"seed_binding must be a 'Class.arg' string, got {out['seed_binding']!r}")
    return out


def _short_names(bindings: Sequence[str]) -> Dict[str, str]:
    """The last part of each binding, or the whole binding where that clashes."""
    last = {b: b.rsplit(".", 1)[-1] for b in bindings}
    counts: Dict[str, int] = {}
    for s in last.values():
        counts[s] = counts.get(s, 0) + 1
    return {b: (s if counts[s] == 1 else b) for b, s in last.items()}


def expand_spec(
    spec: Dict[str, Any], sweep_dir: str, device: Optional[str] = None
) -> List[SweepRun]:
    """All the runs of a (checked) spec: the grid of parameters x seeds.

    Args:
        spec: as returned by :func:`check_spec`.
        sweep_dir: the parent of the runs' root dirs.
        device: passed as ``--device`` if given.

    Returns:
        list: the runs, configurations in grid order, seeds innermost.
    """
    bindings = list(spec["parameters"])
    short = _short_names(bindings + [spec["seed_binding"]])
    base = _base_command(spec, device)
    runs = []
    for values in itertools.product(*(spec["parameters"][b] for b in bindings)):
        for seed in spec["seeds"]:
            pairs = list(zip(bindings, values)) + [(spec["seed_binding"], seed)]
            parts = [f"{short[b]}={_UNSAFE.sub('_', _gin_literal(v))}" for b, v in pairs]
            name = "+".join(parts)
            root_dir = os.path.join(sweep_dir, name)
            command = base + ["--root_dir", root_dir]
            params = [f"{b} = {_gin_literal(v)}" for b, v in pairs]
            for p in params:
                command += ["--gin_param", p]
            runs.append(SweepRun(name, root_dir, command, config="+".join(parts[:-1]),
                                 seed=seed, bindings=params[:-1]))
    return runs


def _base_command(spec: Dict[str, Any], device: Optional[str]) -> List[str]:
    """The command line every run of the spec starts with."""
    base = [sys.executable, "-m", "alf_entropy.bin.train"]
    for f in spec["gin_file"]:
        base += ["--gin_file", f]
    for p in spec["gin_param"]:
        base += ["--gin_param", p]
    if device is not None:
        base += ["--device", device]
    return base


def _why_not_packed(spec: Dict[str, Any]) -> Optional[str]:
    """Why the spec's seeds cannot be packed into one process (None: they can)."""
    if spec["seed_binding"] not in PACKED_SEED_BINDINGS:
        return (f"seed_binding is {spec['seed_binding']}; only "
                f"{' and '.join(PACKED_SEED_BINDINGS)} (PPO/A2C, SAC) train several agents "
                "in one process")
    for text in list(spec["gin_param"]) + list(spec["parameters"]):
        if _K_AGENT_BINDING.search(text):
            return f"the spec binds {_K_AGENT_BINDING.search(text).group(0)} itself"
    return None


def _target_axis(spec: Dict[str, Any]) -> Tuple[Optional[str], str]:
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
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in values):
        return None, f"{binding} takes values other than finite numbers ({values!r})"
    return binding, ""


def pack_seeds(
    runs: List[SweepRun], spec: Dict[str, Any], sweep_dir: str,
    device: Optional[str] = None, log=print, targets: bool = False,
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
    short = _short_names(list(spec["parameters"]) + [spec["seed_binding"]])
    by_group: Dict[str, List[SweepRun]] = {}
    for run in runs:
        by_group.setdefault("\n".join(b for b in run.bindings if _name_of(b) != target),
                            []).append(run)
    base = _base_command(spec, device)
    trainer = spec["seed_binding"].rpartition(".")[0]
    out: List[SweepRun] = []
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
        parts = [f"{short[b]}={_UNSAFE.sub('_', v)}" for b, v in _pairs(members[0])
                 if not values or b != target]
        tail = "seeds=" + "_".join(map(str, seeds))
        if values:  # agent 0's target bound too: the agents' configs are the runs' own
            params += [f"{target} = {values[0]}",
                       f"{trainer}.target_entropies = [{', '.join(values)}]"]
            tail = _agents_name(short[target], values, seeds)
        name = "+".join(parts + [tail])
        root_dir = os.path.join(sweep_dir, PACKED_DIR, name)
        command = base + ["--root_dir", root_dir]
        for p in params:
            command += ["--gin_param", p]
        targets = [json.loads(v) for v in values] if values else [None] * len(members)
        out += alone + [SweepRun(name, root_dir, command, config="+".join(parts),
                                 members=members, targets=targets)]
    return out


def _agents_name(short: str, values: List[str], seeds: List[int]) -> str:
    """A target-packed process's name for its agents: ``<short>=T1_T2+seeds=S1_S2`` for
    every target with every seed (in that order), else ``<short>_seed=T1=S1_T2=S2...``."""
    def safe(v: Any) -> str:
        return _UNSAFE.sub("_", str(v))
    targets, unique_seeds = list(dict.fromkeys(values)), list(dict.fromkeys(seeds))
    if list(zip(values, seeds)) == [(t, s) for t in targets for s in unique_seeds]:
        return (f"{short}={'_'.join(map(safe, targets))}+seeds="
                + "_".join(map(str, unique_seeds)))
    return f"{short}_seed=" + "_".join(f"{safe(t)}={s}" for t, s in zip(values, seeds))


def _name_of(binding: str) -> str:
    """``'Class.arg = value'``'s ``Class.arg``."""
    return binding.partition(" = ")[0]


def _pairs(run: SweepRun) -> List[Tuple[str, str]]:
    """A run's bindings (but the seed) as ``(name, gin text of the value)``."""
    return [(_name_of(b), b.partition(" = ")[2]) for b in run.bindings]


def _link_agent_dirs(task: SweepRun) -> None:
    """Make a packed process's agent dirs (``seed=N``, ``target_entropy=T+seed=N``) links
    to its runs' root dirs.

    Raises:
        ValueError: if an agent dir exists and is not that link.
    """
    from alf_entropy.trainers.agents import agent_dir

    os.makedirs(task.root_dir, exist_ok=True)
    for run, target in zip(task.members, task.targets):
        os.makedirs(run.root_dir, exist_ok=True)
        link = os.path.join(task.root_dir, agent_dir(run.seed, target))
        target_dir = os.path.relpath(run.root_dir, task.root_dir)
        if os.path.islink(link) and os.path.realpath(link) == os.path.realpath(run.root_dir):
            continue
        if os.path.lexists(link):
            raise ValueError(f"{link} exists and is not a link to {run.root_dir}: move it "
                             "away or run without --pack_seeds")
        os.symlink(target_dir, link, target_is_directory=True)


def _recorded_command(run: SweepRun) -> Optional[List[str]]:
    """The command in the run's done marker, or ``None`` if it has none."""
    path = os.path.join(run.root_dir, DONE_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            command = json.load(f).get("command")
    except (OSError, ValueError, AttributeError):
        return []  # an unreadable marker: not the spec's command
    return command if isinstance(command, list) else []


def _arguments(command: List[str]) -> List[str]:
    """A command's arguments without the interpreter and ``--root_dir DIR``
    (the run's directory is where the marker is, however it was spelt)."""
    out, args = [], command[1:]
    i = 0
    while i < len(args):
        if args[i] == "--root_dir":
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def _same_command(a: List[str], b: List[str]) -> bool:
    """Whether two commands agree (the interpreter's and run dir's paths aside)."""
    return _arguments(a) == _arguments(b)


def is_done(run: SweepRun) -> bool:
    """Whether the run finished in an earlier invocation with the same command."""
    recorded = _recorded_command(run)
    return recorded is not None and _same_command(recorded, run.command)


def stale_runs(runs: List[SweepRun]) -> List[Tuple[SweepRun, str]]:
    """Finished runs whose recorded command differs from the spec's.

    Returns:
        list: ``(run, what differs)`` pairs.
    """
    out = []
    for run in runs:
        recorded = _recorded_command(run)
        if recorded is None or _same_command(recorded, run.command):
            continue
        old = [a for a in _arguments(recorded) if a not in _arguments(run.command)]
        new = [a for a in _arguments(run.command) if a not in _arguments(recorded)]
        out.append((run, f"was {old or 'unreadable'}, the spec now gives {new}"))
    return out


_ERROR_PREFIX = "alf-entropy-train: error:"
ALREADY_RUNNING = "already in use by another run"
"""Part of ``alf-entropy-train``'s error line for a locked run directory."""


def _error_line(log_path: str, offset: int) -> str:
    """The run's error line in its log after ``offset`` (or its last line)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    errors = [ln for ln in lines if ln.startswith(_ERROR_PREFIX)]
    return (errors or lines or [""])[-1][:500]


def execute_run(
    name: str, root_dir: str, command: List[str],
    members: Optional[List[Tuple[str, List[str]]]] = None,
) -> Tuple[str, int, float, str]:
    """Run one training process; write the done marker if it succeeds.

    Output goes to ``<root_dir>/train.log`` (appended).  This is also the body
    of the Ray task, so it takes and returns plain values.

    Args:
        name: the run's name.
        root_dir: its root dir.
        command: the command line.
        members: a packed process's runs as ``(root dir, command)``: each gets
            the done marker (with its own command, as if it ran alone)
            instead of ``root_dir``.

    Returns:
        ``(name, exit status, seconds, error line)``; the error line is the
        run's last ``alf-entropy-train: error:`` line (or its last output
        line) when it failed, else ``""``.
    """
    os.makedirs(root_dir, exist_ok=True)
    start = time.time()
    log_path = os.path.join(root_dir, "train.log")
    with open(log_path, "ab") as log:
        offset = log.tell()
        log.write(("$ " + " ".join(command) + "\n").encode())
        log.flush()
        rc = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.time() - start
    if rc == 0:
        for run_dir, run_command in members or [(root_dir, command)]:
            marker = {"command": run_command, "seconds": seconds}
            if members:
                marker["packed_in"] = root_dir
            with open(os.path.join(run_dir, DONE_FILE), "w", encoding="utf-8") as f:
                json.dump(marker, f)
        return name, rc, seconds, ""
    return name, rc, seconds, _error_line(log_path, offset)


def _outcome(rc: int, error: str) -> str:
    """The progress-line word for a run's exit status and error line."""
    if rc == 0:
        return "done"
    if ALREADY_RUNNING in error:
        return "already running"
    return f"FAILED (exit {rc})"


def _members(task: SweepRun) -> Optional[List[Tuple[str, List[str]]]]:
    """A packed process's runs as :func:`execute_run` takes them (None for a run)."""
    return [(r.root_dir, r.command) for r in task.members] or None


def _run_local(runs: List[SweepRun], jobs: int, log) -> Tuple[Dict[str, int], Dict[str, str]]:
    status, errors = {}, {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(execute_run, r.name, r.root_dir, r.command, _members(r))
                   for r in runs]
        for future in concurrent.futures.as_completed(futures):
            name, rc, seconds, error = future.result()
            status[name], errors[name] = rc, error
            log(f"{_outcome(rc, error)} {name} in {seconds:.1f}s" + (f": {error}" if rc else ""))
    return status, errors


def _run_ray(
    runs: List[SweepRun], address: str, log
) -> Tuple[Dict[str, int], Dict[str, str]]:
    try:
        import ray
    except ImportError as e:
        raise ValueError("--ray_address needs Ray: pip install -e '.[ray]'") from e
    started = not ray.is_initialized()
    if started:
        # Workers import alf_entropy like this process does.
        env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        kwargs = dict(runtime_env={"env_vars": env}, include_dashboard=False, log_to_driver=False)
        try:
            ray.init(**kwargs) if address == "local" else ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ValueError(f"cannot connect to Ray at --ray_address={address!r}: {e}") from e
    try:
        task = ray.remote(num_cpus=1)(execute_run)
        pending = {task.remote(r.name, r.root_dir, r.command, _members(r)): r.name
                   for r in runs}
        status, errors = {}, {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            ref = ready[0]
            name = pending.pop(ref)
            try:
                _, rc, seconds, error = ray.get(ref)
            except Exception as e:  # a lost node or worker: report, keep going
                rc, seconds, error = -1, 0.0, f"ray task failed: {e}"
                log(f"ray task of {name} failed: {e}")
            status[name], errors[name] = rc, error
            log(f"{_outcome(rc, error)} {name} in {seconds:.1f}s" + (f": {error}" if rc else ""))
        return status, errors
    finally:
        if started:
            ray.shutdown()


def run_sweep(
    spec: Dict[str, Any],
    sweep_dir: str,
    jobs: int = 1,
    ray_address: Optional[str] = None,
    device: Optional[str] = None,
    report: bool = True,
    log=print,
    pack: bool = False,
    pack_targets: bool = False,
) -> Dict[str, Any]:
    """Run (or continue) a sweep and write its report.

    Args:
        spec: a spec (checked here).
        sweep_dir: where the runs' root dirs go.
        jobs: parallel local processes (>= 1); ignored with ``ray_address``.
        ray_address: run on Ray instead (``auto``, ``local`` or an address).
        device: ``--device`` for every run.
        report: write ``<sweep_dir>/report`` at the end.
        log: called with progress lines.
        pack: train the seeds of each configuration in one process where
            the spec allows (see :func:`pack_seeds`); the runs' directories,
            done markers and report are the same as without.
        pack_targets: also train the configurations that differ only in the
            controller's target entropy in one process, where the spec
            allows (implies ``pack``; see :func:`pack_seeds`).

    Returns:
        dict: ``runs`` (all), ``skipped``, ``failed`` and ``running``
        (names; ``running``: runs another process is training in now),
        ``status`` (name -> exit status of the runs started now), ``errors``
        (name -> the error line of each run that did not succeed) and
        ``report`` (the report's result, or None).

    Raises:
        ValueError: for a bad spec or ``jobs``, Ray missing, or finished runs
            in ``sweep_dir`` whose recorded command differs from the spec's
            (nothing is written or run then).
    """
    spec = check_spec(spec)
    check_int("jobs", jobs, minimum=1)
    runs = expand_spec(spec, sweep_dir, device)
    stale = stale_runs(runs)
    if stale:
        run, diff = stale[0]
        raise ValueError(
            f"{len(stale)} finished run(s) in {sweep_dir} were made with another command than "
            f"this spec gives (e.g. {run.name}: {diff}); use a new --sweep_dir, or delete "
            "those run directories to rerun them"
        )
    os.makedirs(sweep_dir, exist_ok=True)
    with open(os.path.join(sweep_dir, "sweep.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=2)
    todo = [r for r in runs if not is_done(r)]
    skipped = [r.name for r in runs if is_done(r)]
    log(f"{PROG}: {len(runs)} runs, {len(skipped)} already done, {len(todo)} to run")
    tasks = (pack_seeds(todo, spec, sweep_dir, device, log, targets=pack_targets)
             if pack or pack_targets else todo)
    for task in tasks:
        if task.members:
            _link_agent_dirs(task)
            log(f"{PROG}: packing {', '.join(r.name for r in task.members)} into one "
                f"process ({task.root_dir})")
    if ray_address:
        task_status, task_errors = _run_ray(tasks, ray_address, log)
    else:
        task_status, task_errors = _run_local(tasks, jobs, log)
    status, errors, logs = {}, {}, {}
    for task in tasks:
        if task.name not in task_status:
            continue
        for run in task.members or [task]:
            status[run.name], errors[run.name] = task_status[task.name], task_errors[task.name]
            logs[run.name] = os.path.join(task.root_dir, "train.log")
    running = sorted(n for n, rc in status.items() if rc and ALREADY_RUNNING in errors[n])
    failed = sorted(n for n, rc in status.items() if rc != 0 and n not in running)
    result = {
        "runs": runs, "skipped": skipped, "failed": failed, "running": running,
        "status": status, "errors": {n: e for n, e in errors.items() if status[n]},
        "report": None,
    }
    with_events = [r.root_dir for r in runs if os.path.isdir(os.path.join(r.root_dir, "train"))]
    if report and with_events:
        from alf_entropy.experiments.report import write_report

        result["report"] = write_report(with_events, os.path.join(sweep_dir, "report"))
        log(f"{PROG}: report in {result['report']['out_dir']}")
    for name in running:
        log(f"{PROG}: already running: {name} (another process trains in its directory)")
    for name in failed:
        log(
            f"{PROG}: FAILED: {name}: {errors[name]} (see {logs[name]})"
        )
    return result


def main(argv: Optional[List[str]] = None) -> int:
    """Console-script entry point (``alf-entropy-sweep``).

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        int: 0 if every run succeeded, 1 if some failed, 2 for bad input,
        130 when stopped by Ctrl-C.
    """
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="the sweep's JSON spec")
    parser.add_argument("--sweep_dir", required=True, help="parent dir of the runs")
    parser.add_argument("--jobs", type=int, default=1, help="parallel local runs")
    parser.add_argument(
        "--ray_address", default=None, help="run as Ray tasks: an address, 'auto' or 'local'"
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None)
    parser.add_argument("--no_report", action="store_true", help="skip the final report")
    parser.add_argument(
        "--pack_seeds", action="store_true",
        help="train the seeds of each configuration in one process (OnPolicyTrainer.seeds, "
             "OffPolicyTrainer.seeds)",
    )
    parser.add_argument(
        "--pack_targets", action="store_true",
        help="as --pack_seeds, and the configurations that differ only in the controller's "
             "target entropy (a grid binding <controller>.target_entropy of numbers) in one "
             "process too (<trainer>.target_entropies); the seeds alone where the spec has "
             "no such axis",
    )
    args = parser.parse_args(argv)
    try:
        result = run_sweep(
            load_spec(args.spec),
            args.sweep_dir,
            jobs=args.jobs,
            ray_address=args.ray_address,
            device=args.device,
            report=not args.no_report,
            pack=args.pack_seeds,
            pack_targets=args.pack_targets,
        )
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # asked for: one line, not an error or a traceback
        print(f"{PROG}: stopped by SIGINT; run the same command to continue (finished runs "
              "are skipped, interrupted ones resume from their checkpoints)", file=sys.stderr)
        return 130
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
