"""K agents stacked in one batch against K separate single agents, side by side.

For K in {1, 2, 4, 8, 16} (PPO CartPole as ``ppo_cartpole.gin`` trains it:
8 environments per agent, unrolls of 128 steps, 4 epochs x 4 minibatches, the
staged entropy controller), in this one process with one torch thread:

* **acting**: one ``rollout_step`` of all K agents (the stacked batch: one
  call on ``[K, 8]`` observations; separate: K calls of a single agent's);
* **update**: one ``train_from_unroll`` of all K agents on a 128-step unroll
  (16 gradient updates each);
* **env**: one step of the K agents' environment sets (K ``GymVectorEnv`` s,
  the same for both sides: each seed's own episodes), and of one
  NumPy-vectorised CartPole of K * N envs (what one env step for all could
  cost; its resets share one generator, so it is not each seed's episodes);
* **iteration**: whole iterations (collect 128 steps, then train), as
  aggregate env-steps/s of the K agents, and that throughput against one
  single-agent run's (the K = 1 separate row), for the stacked agents on the
  K env sets and on the one K * N env.

Each time is the best of a few rounds in which the sides take turns (the
machine is shared: best-of filters out other processes' bursts, and taking
turns spreads the rest over both sides; still, take ratios as +-15 %).  Ratios
are separate / stacked: how many times cheaper the stacked batch does the
same work.  Start-up (imports, building the agents) is not timed.

With ``--processes``, whole processes instead (start-up included: imports,
building the agents and environments, the final checkpoint): ``OnPolicyTrainer``
runs of ``--iterations`` iterations each (the same PPO, summaries every 10
iterations, no evaluation), timed from launch to exit --

* **one single-agent run** alone (the baseline; after one untimed run, so that no
  timed process pays for compiling the bytecode);
* **K agents in one process** (``OnPolicyTrainer(seeds=...)``, one core);
* **K agents as two processes of K/2**, both at once (both cores; K >= 4);
* **K separate runs, two at a time** (both cores; each pays the start-up);
* PPO, if it is installed: **Stable-Baselines3's PPO**, K runs of the same
  settings (8 envs, 128 steps, 4 epochs of 4 minibatches, 64x64 tanh), two at a time;

as aggregate env-steps/s, that over the single run's, per core, and the
largest peak resident memory of one process.  ``--algorithm sac`` does the same
for SAC Pendulum (``OffPolicyTrainer``, ``sac_pendulum.gin``'s settings: one
env per agent, one update of batch 256 per env step, 256x256 actor and twin
critics, or ``--hidden`` wide; ``--iterations`` env steps per agent, the
first 5 % random as the config's 1,000 of 20,000).  ``--device cuda`` trains every
process on the GPU, ``--jobs N`` runs the separate processes N at a time (for a
machine with more cores: ``--processes --ks 64 --device cuda --jobs 16`` is the GPU
table).

With ``--returns``, the same results as separate runs: ``ppo_cartpole.gin`` at
its full length (about 200k env steps per agent) for ``--seeds`` (default 0-7),
trained both ways with ``alf-entropy-train`` -- one process with
``OnPolicyTrainer.seeds`` = all of them, and one single run per seed
(``OnPolicyTrainer.seed``), two at a time -- then, per seed, the final
``eval/return``, the mean of the last 3 evaluations and of all of them (the
learning speed) both ways, their means over the seeds with 95 % bootstrap intervals
(``control_metrics.bootstrap_ci``), whether the intervals overlap, and each
side's wall time.  ``--returns --algorithm sac`` does the same for
``sac_pendulum.gin`` (``OffPolicyTrainer.seeds`` / ``.seed``; ``--hidden`` and
``--env_steps`` shorten it).

Usage: ``python benchmarks/batched_agents.py [--ks 1,2,4,8,16] [--repeats 3]``,
``python benchmarks/batched_agents.py --processes [--ks 8] [--iterations 10] [--device cuda]
[--jobs 2]``,
``python benchmarks/batched_agents.py --processes --algorithm sac [--iterations 1000]
[--hidden 256]``,
``python benchmarks/batched_agents.py --returns [--seeds 0,1,2,3,4,5,6,7] [--algorithm sac]``
"""

import argparse
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from stamp import stamp

from alf_entropy.algorithms.many_agents import ManyAgents
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.controllers import EntropyTargetAlgorithm
from alf_entropy.data_structures import make_experience
from alf_entropy.environments.agent_envs import AgentEnvs
from alf_entropy.environments.gym_vector_env import GymVectorEnv
from alf_entropy.trainers.on_policy_trainer import stack_experiences
from alf_entropy.trainers.ranks import seed_all
from alf_entropy.utils import nest

ENV, NUM_ENVS, UNROLL = "CartPole-v1", 8, 128
SAC_GOAL = 1.8  # K SAC agents in one process against one run: the speed asked of it
PPO = functools.partial(
    PPOAlgorithm,
    enforce_entropy_target=True,
    num_epochs=4,
    num_minibatches=4,
    gamma=0.98,
    td_lambda=0.8,
    entropy_target_cls=functools.partial(
        EntropyTargetAlgorithm, max_alpha_change_per_iteration=2.5
    ),
)


def timed(fn: Callable[[], Any], inner: int = 1) -> float:
    """Seconds per call of ``inner`` calls of ``fn``."""
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def best_interleaved(
    fns: Dict[str, Callable[[], Any]], repeats: int, inner: int = 1
) -> Dict[str, float]:
    """Each function's best time per call over ``repeats`` rounds, the functions taking
    turns within a round (so that a burst of other load falls on both sides alike)."""
    for fn in fns.values():
        fn()  # warm-up
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            best[name] = min(best[name], timed(fn, inner))
    return best


class Separate:
    """K single agents, each with its own environments, run one after the other."""

    def __init__(self, seeds: List[int]):
        self.envs = AgentEnvs(ENV, NUM_ENVS, seeds)
        self.agents = []
        for seed in seeds:
            seed_all(seed)
            self.agents.append(PPO(self.envs.observation_spec, self.envs.action_spec))
        self.singles = self.envs.envs
        self.time_steps = [env.reset() for env in self.singles]

    def act(self) -> None:
        with torch.inference_mode():
            for agent, time_step in zip(self.agents, self.time_steps):
                agent.rollout_step(time_step)

    def env_step(self) -> None:
        for env, time_step in zip(self.singles, self.time_steps):
            env.step(time_step.prev_action)

    def unroll(self) -> List[Tuple[Any, Any]]:
        out = []
        for k, (agent, env) in enumerate(zip(self.agents, self.singles)):
            time_step, experiences = self.time_steps[k], []
            with torch.inference_mode():
                for _ in range(UNROLL):
                    step = agent.rollout_step(time_step)
                    experiences.append(make_experience(time_step._replace(env_info=()), step))
                    time_step = env.step(step.output)
            self.time_steps[k] = time_step
            out.append((stack_experiences(experiences), time_step))
        return out

    def train(self, unrolls: List[Tuple[Any, Any]]) -> None:
        for agent, (experience, final) in zip(self.agents, unrolls):
            agent.train_from_unroll(experience, final)

    def iteration(self) -> None:
        self.train(self.unroll())


class Stacked:
    """The same K agents as one ``ManyAgents``."""

    def __init__(self, seeds: List[int]):
        self.envs = AgentEnvs(ENV, NUM_ENVS, seeds)
        self.agents = ManyAgents(
            self.envs.observation_spec, self.envs.action_spec, seeds, algorithm_ctor=PPO
        )
        self.time_step = self.envs.reset()

    def act(self) -> None:
        with torch.inference_mode():
            self.agents.rollout_step(self.time_step)

    def env_step(self) -> None:
        self.envs.step(self.time_step.prev_action)

    def unroll(self) -> Tuple[Any, Any]:
        time_step, experiences = self.time_step, []
        with torch.inference_mode():
            for _ in range(UNROLL):
                step = self.agents.rollout_step(time_step)
                experiences.append(make_experience(time_step, step))
                time_step = self.envs.step(step.output)
        self.time_step = time_step
        return stack_experiences(experiences), time_step

    def train(self, unroll: Tuple[Any, Any]) -> None:
        self.agents.train_from_unroll(*unroll)

    def iteration(self) -> None:
        self.train(self.unroll())


class OneVectorEnv:
    """One ``GymVectorEnv`` of K * N environments seen as ``[K, N]``: the env step stacking
    could have (CartPole's NumPy-vectorised env steps all K * N in one call), but with one
    reset generator for all, so agent k's episodes are not the single run's."""

    def __init__(self, k: int):
        self.k = k
        self.env = GymVectorEnv(ENV, num_envs=k * NUM_ENVS, seed=0)
        self.observation_spec, self.action_spec = self.env.observation_spec, self.env.action_spec

    def _split(self, time_step: Any) -> Any:
        return nest.map_structure(
            lambda x: x.reshape(self.k, NUM_ENVS, *x.shape[1:]), time_step._replace(env_info=())
        )

    def reset(self) -> Any:
        return self._split(self.env.reset())

    def step(self, action: torch.Tensor) -> Any:
        return self._split(self.env.step(action.reshape(-1, *action.shape[2:])))


class StackedOneEnv(Stacked):
    """The stacked agents on :class:`OneVectorEnv`."""

    def __init__(self, seeds: List[int]):
        self.envs = OneVectorEnv(len(seeds))
        self.agents = ManyAgents(
            self.envs.observation_spec, self.envs.action_spec, seeds, algorithm_ctor=PPO
        )
        self.time_step = self.envs.reset()


def measure(k: int, repeats: int) -> Dict[str, float]:
    seeds = list(range(k))
    sep, stk, one = Separate(seeds), Stacked(seeds), StackedOneEnv(seeds)
    row = {}
    for kind, fns, inner in (
        ("act", {"separate": sep.act, "stacked": stk.act}, 100),
        ("env", {"stacked": stk.env_step, "stacked_one_env": one.env_step}, 100),
    ):
        row.update({f"{kind}/{n}": t for n, t in best_interleaved(fns, repeats, inner).items()})
    unrolls = {"separate": sep.unroll(), "stacked": stk.unroll()}
    row.update(
        {
            f"update/{n}": t
            for n, t in best_interleaved(
                {
                    "separate": lambda: sep.train(unrolls["separate"]),
                    "stacked": lambda: stk.train(unrolls["stacked"]),
                },
                repeats,
            ).items()
        }
    )
    row.update(
        {
            f"iteration/{n}": t
            for n, t in best_interleaved(
                {
                    "separate": sep.iteration,
                    "stacked": stk.iteration,
                    "stacked_one_env": one.iteration,
                },
                max(1, repeats - 1),
            ).items()
        }
    )
    return row


def child(
    root_dir: str,
    seeds: List[int],
    iterations: int,
    algorithm: str,
    hidden: int,
    device: str = "cpu",
) -> None:
    """One whole training process (``--child``): a single run, or K agents in one."""
    agents = dict(seed=seeds[0]) if len(seeds) == 1 else dict(seeds=seeds)
    common = dict(
        num_iterations=iterations,
        progress_bar=False,
        device=device,
        num_threads=1,
        checkpoint_interval=None,
        **agents,
    )
    if algorithm == "sac":
        from batched_sac import train_sac

        train_sac(root_dir, iterations, hidden, **common)
        return
    if algorithm == "sb3":  # SB3's PPO with the same settings, for the SB3 rows
        import stable_baselines3 as sb3
        from stable_baselines3.common.env_util import make_vec_env

        sb3.PPO(
            "MlpPolicy",
            make_vec_env(ENV, n_envs=NUM_ENVS, seed=seeds[0]),
            n_steps=UNROLL,
            batch_size=NUM_ENVS * UNROLL // 4,
            n_epochs=4,
            gamma=0.98,
            gae_lambda=0.8,
            policy_kwargs=dict(
                net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh
            ),
            seed=seeds[0],
            device=device,
        ).learn(iterations * NUM_ENVS * UNROLL)
        return
    from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

    OnPolicyTrainer(
        root_dir, env_id=ENV, num_envs=NUM_ENVS, unroll_length=UNROLL, algorithm_ctor=PPO, **common
    ).train()


def run_commands(commands: List[List[str]], jobs: int) -> Tuple[float, float]:
    """Run the commands, ``jobs`` at a time, with one OpenMP thread each.

    Returns:
        (wall seconds from the first launch to the last exit, the largest peak
        resident memory of one process in MiB).
    """
    pending, running, peak = list(commands), set(), 0.0
    start = time.perf_counter()
    while pending or running:
        while pending and len(running) < jobs:
            running.add(
                subprocess.Popen(pending.pop(0), env=dict(os.environ, OMP_NUM_THREADS="1")).pid
            )
        pid, status, usage = os.wait4(-1, 0)
        if pid in running:
            running.remove(pid)
            if os.waitstatus_to_exitcode(status) != 0:
                raise RuntimeError(f"a training process exited with status {status}")
            peak = max(peak, usage.ru_maxrss / 1024)
    return time.perf_counter() - start, peak


def run_processes(
    groups: List[List[int]],
    iterations: int,
    jobs: int,
    algorithm: str = "ppo",
    hidden: int = 256,
    device: str = "cpu",
) -> Tuple[float, float]:
    """Train each group of seeds in a process of its own (``--child``), ``jobs`` at a time.

    Returns:
        what :func:`run_commands` returns.
    """
    scratch = tempfile.mkdtemp(prefix="batched_agents_")
    try:
        return run_commands(
            [
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--child",
                    os.path.join(scratch, "_".join(map(str, seeds))),
                    "--seeds",
                    ",".join(map(str, seeds)),
                    "--iterations",
                    str(iterations),
                    "--algorithm",
                    algorithm,
                    "--hidden",
                    str(hidden),
                    "--device",
                    device,
                ]
                for seeds in groups
            ],
            jobs,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def processes_main(
    ks: List[int], iterations: int, algorithm: str, hidden: int, device: str = "cpu", jobs: int = 2
) -> None:
    started = time.perf_counter()
    run = functools.partial(
        run_processes, iterations=iterations, algorithm=algorithm, hidden=hidden, device=device
    )
    if algorithm == "sac":
        per_run = iterations
        what = (
            f"SAC Pendulum, 1 env per agent, one update of batch 256 per env step, "
            f"{hidden}x{hidden} actor and critics, {iterations} env steps per agent (the "
            f"first {iterations // 20} random)"
        )
    else:
        per_run = iterations * NUM_ENVS * UNROLL
        what = (
            f"PPO CartPole, {NUM_ENVS} envs per agent, unroll {UNROLL}, 4x4 minibatches, "
            f"{iterations} iterations ({per_run} env steps) per agent"
        )
    run([[0]], jobs=1)  # untimed: the first process after a change compiles the bytecode
    load = os.getloadavg()[0]
    single_wall, single_mem = run([[0]], jobs=1)
    single = per_run / single_wall
    print(
        f"Whole processes (start-up included): {what}, one torch thread per process, on {device}.\n"
    )
    print(
        f"One single-agent run: {single_wall:.1f} s, {single:.0f} env-steps/s, "
        f"peak {single_mem:.0f} MiB.\n"
    )
    print(
        "| K | layout | cores | wall s | env-steps/s | x one run | x one run per core "
        "| peak MiB per process |"
    )
    print("|---|---|---|---|---|---|---|---|")
    one_process_wall: Dict[int, float] = {}
    for k in ks:
        seeds = list(range(k))
        layouts = [("K in one process", [seeds], 1)]
        if k >= 4:  # (for K = 2 it is the separate runs)
            layouts.append(("two processes of K/2", [seeds[: k // 2], seeds[k // 2 :]], 2))
        layouts.append((f"K separate runs, {jobs} at a time", [[s] for s in seeds], jobs))
        if algorithm == "ppo" and importlib.util.find_spec("stable_baselines3"):
            layouts.append((f"SB3: K separate runs, {jobs} at a time", [[s] for s in seeds], jobs))
        for name, groups, at_once in layouts:
            wall, mem = run(groups, jobs=at_once, algorithm="sb3" if "SB3" in name else algorithm)
            if at_once == 1:
                one_process_wall[k] = wall
            rate = k * per_run / wall
            cores = min(at_once, len(groups))
            print(
                f"| {k} | {name} | {cores} | {wall:.1f} | {rate:.0f} | {rate / single:.2f} | "
                f"{rate / single / cores:.2f} | {mem:.0f} |"
            )
    print(
        "\n'x one run': aggregate env-steps/s over one single-agent run's (alone, one core); "
        "'per core': divided by the cores the layout keeps busy. One measurement each, on a "
        "machine shared with other jobs: take ratios as +-15 %."
    )
    print(f"Load average (1 min): {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end.")
    if algorithm == "sac" and device == "cpu":  # (sac_parts times the CPU's parts)
        from batched_sac import sac_parts

        k = max(ks)
        sac_parts(
            k,
            hidden,
            best_interleaved,
            budget=(SAC_GOAL, one_process_wall[k] - k * single_wall / SAC_GOAL, iterations),
        )
    print(f"Measured {stamp()}; the benchmark took {time.perf_counter() - started:.0f} s.")


RETURNS_CONFIGS = {
    "ppo": ("ppo_cartpole.gin", "OnPolicyTrainer", "PPO CartPole"),
    "sac": ("sac_pendulum.gin", "OffPolicyTrainer", "SAC Pendulum"),
}
"""``--returns``: per algorithm, the shipped config, its trainer and a name."""


def train_command(
    root_dir: str, bindings: List[str], log: str, algorithm: str = "ppo"
) -> List[str]:
    """``alf-entropy-train`` of the algorithm's config with ``bindings``, its output to ``log``."""
    config, trainer, _ = RETURNS_CONFIGS[algorithm]
    train = (
        f"import os; fd = os.open({log!r}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC); "
        "os.dup2(fd, 1); os.dup2(fd, 2); from alf_entropy.bin.train import main; main()"
    )
    return [
        sys.executable,
        "-c",
        train,
        "--root_dir",
        root_dir,
        "--device",
        "cpu",
        "--gin_file",
        config,
        "--gin_param",
        f"{trainer}.progress_bar = False",
    ] + [arg for b in bindings for arg in ("--gin_param", b)]


def eval_returns(run_dir: str) -> np.ndarray:
    """A run's ``eval/return`` values, in order."""
    from alf_entropy.experiments.report import load_run

    values = load_run(run_dir).get("eval/return")[1]
    if not values.size:
        raise RuntimeError(f"{run_dir} logged no eval/return")
    return values


def returns_main(
    seeds: List[int], env_steps: Optional[int], algorithm: str = "ppo", hidden: Optional[int] = None
) -> None:
    from alf_entropy.experiments.control_metrics import bootstrap_ci

    started = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix="batched_returns_")
    config, trainer, what = RETURNS_CONFIGS[algorithm]
    extra = [] if env_steps is None else [f"{trainer}.num_env_steps = {env_steps}"]
    if hidden is not None:
        extra += [
            f"{net}.fc_layer_params = ({hidden}, {hidden})"
            for net in ("ActorDistributionNetwork", "CriticNetworks")
        ]
    try:
        batch_dir = os.path.join(scratch, "batched")
        os.makedirs(batch_dir)
        batch_log = os.path.join(scratch, "batched.log")
        batch_wall, _ = run_commands(
            [
                train_command(
                    batch_dir, [f"{trainer}.seeds = {seeds}"] + extra, batch_log, algorithm
                )
            ],
            1,
        )
        single_dirs = {s: os.path.join(scratch, f"single_seed={s}") for s in seeds}
        for d in single_dirs.values():
            os.makedirs(d)
        single_wall, _ = run_commands(
            [
                train_command(d, [f"{trainer}.seed = {s}"] + extra, d + ".log", algorithm)
                for s, d in single_dirs.items()
            ],
            2,
        )
        batched = {s: eval_returns(os.path.join(batch_dir, f"seed={s}")) for s in seeds}
        single = {s: eval_returns(d) for s, d in single_dirs.items()}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    num_evals = len(next(iter(batched.values())))
    print(
        f"{what} ({config}{' '.join([','] + extra) if extra else ''}; {num_evals} "
        f"evaluations of 10 deterministic episodes per run), seeds "
        f"{', '.join(map(str, seeds))}: one process of "
        f"{len(seeds)} agents against {len(seeds)} single runs, two at a time; one torch "
        "thread per process.\n"
    )
    print(
        "| seed | final eval, batched | final eval, single "
        "| mean of last 3 evals, batched | mean of last 3 evals, single "
        "| mean of all evals, batched | mean of all evals, single |"
    )
    print("|---|---|---|---|---|---|---|")
    for s in seeds:
        print(
            f"| {s} | {batched[s][-1]:.1f} | {single[s][-1]:.1f} | "
            f"{batched[s][-3:].mean():.1f} | {single[s][-3:].mean():.1f} | "
            f"{batched[s].mean():.1f} | {single[s].mean():.1f} |"
        )
    print(
        f"\n| over the {len(seeds)} seeds | batched: mean [95 % CI] "
        "| single: mean [95 % CI] | intervals overlap |"
    )
    print("|---|---|---|---|")
    for name, metric in (
        ("final eval", lambda v: v[-1]),
        ("mean of last 3 evals", lambda v: v[-3:].mean()),
        ("mean of all evals", lambda v: v.mean()),
    ):
        b = bootstrap_ci([metric(batched[s]) for s in seeds])
        o = bootstrap_ci([metric(single[s]) for s in seeds])
        overlap = "yes" if b[1] <= o[2] and o[1] <= b[2] else "no"
        print(
            f"| {name} | {b[0]:.1f} [{b[1]:.1f}, {b[2]:.1f}] "
            f"| {o[0]:.1f} [{o[1]:.1f}, {o[2]:.1f}] | {overlap} |"
        )
    same = sum(int(np.array_equal(batched[s], single[s])) for s in seeds)
    gap = max(
        float(np.abs(batched[s] - single[s]).max())
        if batched[s].shape == single[s].shape
        else float("inf")
        for s in seeds
    )
    print(
        f"\nEvery evaluation the same both ways for {same} of {len(seeds)} seeds; the largest "
        f"difference of one evaluation's return between the ways: {gap:.1f}."
    )
    print(
        f"Wall time: batched (one process, one core) {batch_wall:.0f} s; single runs "
        f"(two at a time, two cores) {single_wall:.0f} s."
    )
    print(f"Measured {stamp()}; the benchmark took {time.perf_counter() - started:.0f} s.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", default=None, help="default 1,2,4,8,16 (--processes: 8)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--processes", action="store_true", help="whole training processes, start-up included"
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="--processes: iterations per run (default 10; SAC: 1000)",
    )
    parser.add_argument(
        "--algorithm",
        choices=("ppo", "sac", "sb3"),
        default="ppo",
        help="--processes: PPO CartPole or SAC Pendulum (sb3: the SB3 rows)",
    )
    parser.add_argument("--device", default="cpu", help="--processes: the trainers' device")
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="--processes: separate processes run this many at a time",
    )
    parser.add_argument(
        "--hidden", type=int, default=256, help="--algorithm sac: the networks' width"
    )
    parser.add_argument(
        "--returns",
        action="store_true",
        help="final returns of full-length runs, batched vs single",
    )
    parser.add_argument(
        "--env_steps",
        type=int,
        default=None,
        help="--returns: env steps per agent (default: the config's)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seeds", default=None, help="--returns: default 0,1,...,7")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.returns:
        returns_main(
            [int(s) for s in (args.seeds or "0,1,2,3,4,5,6,7").split(",")],
            args.env_steps,
            args.algorithm,
            args.hidden if args.algorithm == "sac" and args.hidden != 256 else None,
        )
        return
    if args.child is not None:
        child(
            args.child,
            [int(s) for s in (args.seeds or "0").split(",")],
            args.iterations,
            args.algorithm,
            args.hidden,
            args.device,
        )
        return
    ks = [int(k) for k in (args.ks or ("8" if args.processes else "1,2,4,8,16")).split(",")]
    if args.processes:
        processes_main(
            ks,
            args.iterations or (1000 if args.algorithm == "sac" else 10),
            args.algorithm,
            args.hidden,
            args.device,
            args.jobs,
        )
        return
    started = time.perf_counter()
    rows = {k: measure(k, args.repeats) for k in ks}
    single = None
    print(
        f"K agents (PPO CartPole, {NUM_ENVS} envs each, unroll {UNROLL}, 4x4 minibatches): "
        "one stacked batch vs K separate agents in one process, one torch thread.\n"
    )
    print(
        "| K | act us sep | act us stk | act x | update ms sep | update ms stk | update x "
        "| env us: K sets | env us: one K*N env | iter steps/s sep | iter steps/s stk | iter x "
        "| stk vs one run | stk, one env, vs one run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for k, r in rows.items():
        steps = k * NUM_ENVS * UNROLL
        sep_rate, stk_rate = steps / r["iteration/separate"], steps / r["iteration/stacked"]
        one_env_rate = steps / r["iteration/stacked_one_env"]
        if k == 1:
            single = sep_rate
        print(
            f"| {k} | {r['act/separate'] * 1e6:.0f} | {r['act/stacked'] * 1e6:.0f} | "
            f"{r['act/separate'] / r['act/stacked']:.2f} | "
            f"{r['update/separate'] * 1e3:.1f} | {r['update/stacked'] * 1e3:.1f} | "
            f"{r['update/separate'] / r['update/stacked']:.2f} | "
            f"{r['env/stacked'] * 1e6:.0f} | {r['env/stacked_one_env'] * 1e6:.0f} | "
            f"{sep_rate:.0f} | {stk_rate:.0f} | {stk_rate / sep_rate:.2f} | "
            + (f"{stk_rate / single:.2f} | {one_env_rate / single:.2f} |" if single else "- | - |")
        )
    print(
        "\nx: separate time / stacked time for the same work (acting: one step of the K "
        "agents' policies; update: one train_from_unroll of all K). 'vs one run': the K "
        "agents' aggregate env-steps/s over one single-agent run's (the K = 1 separate row). "
        "'one env': the stacked agents on one NumPy-vectorised CartPole of K*N envs (one "
        "reset generator, so not each seed's episodes). Best of a few repeats on a machine "
        "shared with other jobs: the numbers are noisy (+-15 %, more for the small ones)."
    )
    print(f"Measured {stamp()}; the benchmark took {time.perf_counter() - started:.0f} s.")


if __name__ == "__main__":
    main()
