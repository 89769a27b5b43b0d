"""K agents of a shipped config in one process against one run of it, as shipped.

``alf-entropy-train --gin_file ppo_cartpole.gin`` (or ``sac_pendulum.gin``) with the
config's own summaries, evaluations and checkpoints, only the length set
(``--iterations``): one single-agent run (``seed = 0``) and one process of K agents
(``num_agents = K``), whole processes timed from launch to exit, one torch thread each,
taking turns for ``--repeats`` rounds (after one untimed run of each).  Per round: the
walls, K agents' env-steps/s over the single run's (the goal: 3x for PPO, 1.8x for SAC at
K = 8), and what agent 0's event file holds against the single run's (tags, points): each
agent's file must hold the single run's tags, not every agent's.

Usage: ``python benchmarks/shipped_agents.py [--algorithm ppo|sac] [--k 8]
[--iterations 60] [--repeats 3] [--gin_param BINDING]...``
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import List, Tuple

from batched_agents import run_commands
from stamp import stamp

CONFIGS = {
    "ppo": ("ppo_cartpole.gin", "OnPolicyTrainer", 60, 3.0, 1024),
    "sac": ("sac_pendulum.gin", "OffPolicyTrainer", 3000, 1.8, 1),
}
"""Per algorithm: the config, its trainer, default iterations, the goal at K = 8, env
steps per iteration of one agent."""


def _command(root: str, config: str, trainer: str, bindings: List[str]) -> List[str]:
    train = (
        "import os, sys; fd = os.open(os.devnull, os.O_WRONLY); os.dup2(fd, 1); "
        "os.dup2(fd, 2); from alf_entropy.bin.train import main; main()"
    )
    args = ["--root_dir", root, "--device", "cpu", "--gin_file", config]
    for binding in [f"{trainer}.progress_bar = False", *bindings]:
        args += ["--gin_param", binding]
    return [sys.executable, "-c", train, *args]


def _events(run_dir: str) -> Tuple[int, int]:
    """(tags, points) of a run directory's training event file."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(os.path.join(run_dir, "train"), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    return len(tags), sum(len(acc.Scalars(t)) for t in tags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", choices=sorted(CONFIGS), default="ppo")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--gin_param",
        action="append",
        default=[],
        help="a binding for both sides (what a row leaves out, e.g. summaries)",
    )
    args = parser.parse_args()
    config, trainer, iterations, goal, steps = CONFIGS[args.algorithm]
    iterations = args.iterations or iterations
    length = [
        f"{trainer}.num_env_steps = None",
        f"{trainer}.num_iterations = {iterations}",
        *args.gin_param,
    ]
    runs = {
        "one": length + [f"{trainer}.seed = 0"],
        "K": length + [f"{trainer}.num_agents = {args.k}"],
    }
    started, scratch = time.perf_counter(), tempfile.mkdtemp(prefix="shipped_agents_")
    changed = f" but {'; '.join(args.gin_param)}" if args.gin_param else ""
    print(
        f"{config} as shipped{changed}, {iterations} iterations ({iterations * steps} env "
        f"steps) per agent: one run against {args.k} agents in one process, whole "
        f"processes, one torch thread each, {args.repeats} rounds.\n"
    )
    print(
        "| round | one run s | K agents s | x one run's env-steps/s | agent 0's tags / points "
        "| one run's tags / points |"
    )
    print("|---|---|---|---|---|---|")
    ratios = []
    try:
        for round_ in range(args.repeats + 1):  # round 0: untimed (bytecode, file caches)
            walls, events = {}, {}
            for name, bindings in runs.items():
                root = os.path.join(scratch, f"{name}{round_}")
                walls[name] = run_commands([_command(root, config, trainer, bindings)], 1)[0]
                events[name] = _events(root if name == "one" else os.path.join(root, "seed=0"))
            if round_:
                ratios.append(args.k * walls["one"] / walls["K"])
                print(
                    f"| {round_} | {walls['one']:.1f} | {walls['K']:.1f} | {ratios[-1]:.2f} "
                    f"| {events['K'][0]} / {events['K'][1]} "
                    f"| {events['one'][0]} / {events['one'][1]} |"
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    median = statistics.median(ratios)
    print(
        f"\nK = {args.k} agents: x{median:.2f} one run's env-steps/s (median of "
        f"{len(ratios)} rounds; goal x{goal}: {'met' if median >= goal else 'not met'}). "
        f"Load average (1 min) at the end {os.getloadavg()[0]:.2f}."
    )
    print(f"Measured {stamp()}; the benchmark took {time.perf_counter() - started:.0f} s.")


if __name__ == "__main__":
    main()
