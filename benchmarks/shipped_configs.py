"""The shipped configs as shipped, over several seeds: evaluation returns and the controller.

Each config runs through ``alf-entropy-sweep`` (one run per seed, the
config's own settings) and ``alf-entropy-report``; the script prints a stamp
(date, commit, versions, machine), one table with every run (its evaluations,
the mean of its last 3, its training time from the first to the last summary,
which leaves out the start-up) and the across-seed means with 95% bootstrap
intervals.  LunarLander (1M env steps), HalfCheetah and discrete SAC on
CartPole are long; name them with ``--configs`` to include them.

Usage::

    python benchmarks/shipped_configs.py --out_dir shipped --jobs 2
    python benchmarks/shipped_configs.py --configs ppo_cartpole --seeds 0 1 2 3 4 \
        --jobs 1 --out_dir shipped_main   # the main job (the default config)
    python benchmarks/shipped_configs.py --configs sac_halfcheetah \
        --gin_param "OffPolicyTrainer.num_env_steps = 100000"   # a shorter run
"""

import argparse
import os
import sys
import time

import numpy as np
from stamp import stamp

CONFIGS = {
    "ppo_cartpole": ("ppo_cartpole.gin", "OnPolicyTrainer.seed"),
    "ac_cartpole": ("ac_cartpole.gin", "OnPolicyTrainer.seed"),
    "ppo_cartpole_scheduled_target": ("ppo_cartpole_scheduled_target.gin", "OnPolicyTrainer.seed"),
    "ppo_pendulum": ("ppo_pendulum.gin", "OnPolicyTrainer.seed"),
    "sac_pendulum": ("sac_pendulum.gin", "OffPolicyTrainer.seed"),
    "sac_pendulum_staged": ("sac_pendulum_staged.gin", "OffPolicyTrainer.seed"),
    "sac_pendulum_pid": ("sac_pendulum_pid.gin", "OffPolicyTrainer.seed"),
    "ppo_lunarlander": ("ppo_lunarlander.gin", "OnPolicyTrainer.seed"),
    "sac_cartpole": ("sac_cartpole.gin", "OffPolicyTrainer.seed"),
    "sac_halfcheetah": ("sac_halfcheetah.gin", "OffPolicyTrainer.seed"),
}
DEFAULT = [
    "ac_cartpole",
    "ppo_cartpole_scheduled_target",
    "ppo_pendulum",
    "sac_pendulum",
    "sac_pendulum_staged",
]


def train_seconds(run_dir: str) -> float:
    """Seconds from a run's first to its last summary (its training, without the start-up)."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(os.path.join(run_dir, "train"), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    times = [e.wall_time for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)]
    return max(times) - min(times)


def main() -> None:
    from alf_entropy.experiments.report import load_run, write_report
    from alf_entropy.experiments.sweep import run_sweep

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=DEFAULT, choices=sorted(CONFIGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="parallel runs")
    parser.add_argument("--out_dir", default="shipped_configs_out")
    parser.add_argument(
        "--gin_param",
        action="append",
        default=[],
        help="a binding added to every run (e.g. a shorter num_env_steps); "
        "the table's title lists them",
    )
    args = parser.parse_args()

    dirs = []
    for name in args.configs:
        gin_file, seed_binding = CONFIGS[name]
        start = time.time()
        trainer = seed_binding.split(".")[0]
        spec = {
            "gin_file": [gin_file],
            "gin_param": [f"{trainer}.progress_bar = False", *args.gin_param],
            "seeds": list(args.seeds),
            "seed_binding": seed_binding,
        }
        result = run_sweep(
            spec,
            os.path.join(args.out_dir, name),
            jobs=args.jobs,
            report=False,
            log=lambda s: print(s, file=sys.stderr),
        )
        if result["failed"]:
            raise SystemExit(f"{name}: runs failed: {result['errors']}")
        print(f"  {name}: {time.time() - start:.0f}s", file=sys.stderr)
        dirs += [r.root_dir for r in result["runs"]]

    rep = write_report(dirs, os.path.join(args.out_dir, "report"), dpi=60)
    how = f"with {'; '.join(args.gin_param)}" if args.gin_param else "as shipped"
    print(f"\nShipped configs {how}, seeds {list(args.seeds)}, {args.jobs} at a time; {stamp()}\n")
    print(
        "| run | env steps | first eval | best eval | mean of last 3 evals | final eval | "
        "final alpha | final entropy (target) | training s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    common = os.path.commonpath([os.path.abspath(d) for d in dirs])
    for row in rep["rows"]:
        run = load_run(os.path.join(common, row["run"]))
        evals = run.get("eval/return")[1]
        alpha = run.get("alpha")[1]
        entropy = run.get("entropy")[1]
        target = run.get("target_entropy")[1]
        first, best, last3 = (
            (f"{evals[0]:.1f}", f"{np.max(evals):.1f}", f"{np.mean(evals[-3:]):.1f}")
            if evals.size
            else ("–",) * 3
        )
        tail = f"{entropy[-1]:.3g} ({target[-1]:.3g})" if entropy.size and target.size else "–"
        print(
            f"| {row['run']} | {row['env_steps']} | {first} | {best} | {last3} | "
            f"{row['final_eval_return']:.1f} | "
            f"{alpha[-1]:.3g} | {tail} | {train_seconds(run.run_dir):.0f} |"
        )
    text = open(rep["markdown"], encoding="utf-8").read()
    if "Across seeds" in text:
        print("\n" + text[text.index("Across seeds") :])


if __name__ == "__main__":
    main()
