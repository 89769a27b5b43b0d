"""Data-parallel scaling of PPO CartPole: env-steps/s on 1 vs 2 ranks, side by side.

Each setting runs ``alf_entropy``'s ``OnPolicyTrainer`` with
``ppo_cartpole.gin`` (8 envs x 128 steps per rank and iteration, 4 epochs of
4 minibatches, one torch thread per rank, no evaluation, no checkpoints but
the last) under ``torchrun --standalone`` on this machine:

* ``1 rank``: the baseline, ``--envs_per_rank`` envs.
* ``2 independent 1-rank runs (bound)``: two baseline runs at the same
  time, env-steps/s summed: what this machine gives two processes with no
  communication at all, the upper bound for 2 ranks here.
* ``2 ranks, same per-rank batch`` (weak scaling, the usual reason to add
  ranks: more envs and a bigger global batch): ``2 x --envs_per_rank`` envs.
* ``2 ranks, same global batch`` (strong scaling): ``--envs_per_rank`` envs
  split over the two ranks.

It prints env-steps/s (global env steps / rank 0's training wall time; the
best of ``--repeats`` runs, the settings taking turns so that load from other
jobs hits all alike) and the ratio to one rank, and where rank 0's time goes
in that run: collecting (policy +
env steps), training (epochs x minibatches, including the gradient
all-reduce) and waiting in all-reduce (the collective's own cost plus any
wait for the slower rank).

Usage::

    python benchmarks/ddp_scaling.py [--iterations 20] [--repeats 3] [--device cpu|cuda]

On CUDA each rank takes one GPU (``cuda:LOCAL_RANK``); with one GPU only the
1-rank row can run.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from stamp import stamp

SETTINGS = [
    # (label, ranks, global envs as a multiple of --envs_per_rank, independent runs)
    ("1 rank", 1, 1, 1),
    ("2 independent 1-rank runs (bound)", 1, 1, 2),
    ("2 ranks, same per-rank batch", 2, 2, 1),
    ("2 ranks, same global batch", 2, 1, 1),
]


def _worker(args: argparse.Namespace) -> None:
    """One rank of a setting (started by torchrun): train and report timings."""
    import torch
    import torch.distributed as dist

    from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm
    from alf_entropy.config.loading import parse_gin_config
    from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer
    from alf_entropy.utils import distributed

    torch.set_num_threads(1)
    times = {"train": 0.0, "all_reduce": 0.0}
    all_reduce = dist.all_reduce

    def timed_all_reduce(*a, **kw):
        start = time.perf_counter()
        try:
            return all_reduce(*a, **kw)
        finally:
            times["all_reduce"] += time.perf_counter() - start

    dist.all_reduce = timed_all_reduce
    train_from_unroll = ActorCriticAlgorithm.train_from_unroll

    def timed_train(self, *a, **kw):
        start = time.perf_counter()
        try:
            return train_from_unroll(self, *a, **kw)
        finally:
            times["train"] += time.perf_counter() - start

    ActorCriticAlgorithm.train_from_unroll = timed_train
    parse_gin_config(
        ["ppo_cartpole"],
        [
            f"OnPolicyTrainer.num_envs = {args.num_envs}",
            f"OnPolicyTrainer.num_iterations = {args.iterations}",
            "OnPolicyTrainer.num_env_steps = 0",
            "OnPolicyTrainer.eval_interval = None",
            "OnPolicyTrainer.checkpoint_interval = None",
            "OnPolicyTrainer.summary_interval = 1000000",
            "OnPolicyTrainer.progress_bar = False",
        ],
    )
    trainer = OnPolicyTrainer(args.root_dir, device=args.device)
    result = trainer.train()
    times["total"] = result["wall_time"]
    times["env_steps"] = result["env_steps"]
    gathered = distributed.gather_object(times)
    if distributed.is_main_process():
        with open(args.out, "w") as f:
            json.dump(gathered, f)
    distributed.shutdown()


def _run_setting(ranks: int, num_envs: int, copies: int, args: argparse.Namespace) -> list:
    """Rank 0's timings of each of ``copies`` concurrent torchrun runs."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        procs, outs = [], []
        for i in range(copies):
            outs.append(os.path.join(tmp, f"times{i}.json"))
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                str(ranks),
                os.path.abspath(__file__),
                "--worker",
                "--num_envs",
                str(num_envs),
                "--iterations",
                str(args.iterations),
                "--device",
                args.device,
                "--root_dir",
                os.path.join(tmp, f"run{i}"),
                "--out",
                outs[-1],
            ]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL))
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError(f"{p.args} exited {p.returncode}")
        result = []
        for out in outs:
            with open(out) as f:
                result.append(json.load(f))
        return result


def main() -> None:
    """Run every setting and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--envs_per_rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--num_envs", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--root_dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    print(
        f"PPO CartPole, {args.iterations} iterations x 128 steps, device {args.device}, "
        f"{os.cpu_count()} CPUs, best of {args.repeats}, load average "
        f"{os.getloadavg()[0]:.1f} at the start; {stamp()}"
    )
    header = (
        f"{'setting':36s} {'envs':>5s} {'env-steps/s':>12s} {'vs 1 rank':>9s} "
        f"{'collect s':>9s} {'train s':>8s} {'all-reduce s':>12s}"
    )
    print(header)
    print("-" * len(header))
    best = {}
    for _ in range(args.repeats):
        for label, ranks, mult, copies in SETTINGS:
            runs = _run_setting(ranks, args.envs_per_rank * mult, copies, args)
            # Rank 0's timings; env-steps/s summed over independent copies.
            t0 = dict(runs[0][0], sps=sum(r[0]["env_steps"] / r[0]["total"] for r in runs))
            if label not in best or t0["sps"] > best[label]["sps"]:
                best[label] = t0
    base = None
    for label, _ranks, mult, copies in SETTINGS:
        num_envs = args.envs_per_rank * mult * copies
        t0 = best[label]
        sps = t0["sps"]
        base = base or sps
        print(
            f"{label:36s} {num_envs:5d} {sps:12.0f} {sps / base:8.2f}x "
            f"{t0['total'] - t0['train']:9.2f} {t0['train']:8.2f} {t0['all_reduce']:12.2f}"
        )


if __name__ == "__main__":
    main()
