"""SAC training speed on Pendulum-v1: our SacAlgorithm vs. Stable-Baselines3's SAC.

For each seed, both implementations train for ``--steps`` env steps at the
same time, in two single-threaded worker processes, so that both see the same
background load of a shared machine (run one after the other, a change of
load between the two runs shows up as a speed ratio).  With ``--threads``
larger than half the cores, or ``--device cuda``, running both at once would
make them fight over the cores (or the GPU), so they run one after the other
instead, the order alternating from seed to seed.  This prints:

* env-steps/s: env steps divided by training wall time (no evaluation inside),
  and the same ratio in process CPU time (on a shared machine the two
  processes may get different shares of a core; CPU time is what each
  implementation itself costs);
* the eval return after training: mean return of ``--eval_episodes``
  deterministic episodes, with the same evaluation code and seeds for both.

Matched settings (SB3's defaults, CleanRL's too): one env, 256x256 ReLU actor
and twin critics, tanh-squashed Gaussian policy with state-dependent std,
batch 256, Adam(lr=3e-4) everywhere, gamma 0.99, tau 0.005, one gradient step
per env step after ``--learning_starts`` random steps, automatic temperature
starting at alpha = 1 with target entropy -1 (SAC's rule: our
``SGDEntropyTargetAlgorithm``), replay buffer 1M, CPU with one torch thread
(``--device``, ``--threads``).
Ours is ``sac_pendulum.gin`` run by ``OffPolicyTrainer`` (checkpoints and
summaries off, as SB3's defaults have none).

Where the speed comes from (no change to the maths): the twin critics are one
batched module (one ``baddbmm`` per hidden layer for both) with a hand-written
ReLU backward (one graph node, masks applied in place; ``alf_entropy/accel.py``,
off with ``ALF_ENTROPY_ACCEL=0``), actor, critic and
temperature losses take one backward and one optimiser step, the actor loss
evaluates the critics with detached weights (no wasted critic weight
gradients), Adam is torch's fused kernel, the squashed-Normal sample and log-probability
are computed in closed form (no ``torch.distributions`` objects), and the
replay buffer samples tensors in place (no NumPy round trip).

Stable-Baselines3 is needed (``pip install stable-baselines3 --no-deps``).

Usage::

    python benchmarks/sac_speed.py [--seeds 0 1] [--steps 6000] [--threads 1] [--device cpu]
    python benchmarks/sac_speed.py --updates_only [--batch_sizes 256 8]  # updates alone
"""

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Dict, List

import numpy as np
import torch

ENV_ID = "Pendulum-v1"
EVAL_SEED = 1_000_003


def _evaluate(policy_fn: Callable[[Any], Any], args: argparse.Namespace) -> float:
    from alf_entropy.environments import evaluate

    return evaluate(
        ENV_ID, policy_fn, num_episodes=args.eval_episodes, seed=EVAL_SEED, device=args.device
    )


def _ours(
    root: str, seed: int, args: argparse.Namespace, num_env_steps: int, compile_update: bool = False
) -> Any:
    """An ``OffPolicyTrainer`` for ``sac_pendulum.gin`` with the matched settings."""
    import gin

    from alf_entropy.config.loading import parse_gin_config
    from alf_entropy.trainers.off_policy_trainer import OffPolicyTrainer

    gin.clear_config()
    parse_gin_config(
        ["sac_pendulum.gin"],
        [
            f"OffPolicyTrainer.num_env_steps = {num_env_steps}",
            f"OffPolicyTrainer.initial_collect_steps = {args.learning_starts}",
            f"OffPolicyTrainer.seed = {seed}",
            "OffPolicyTrainer.eval_interval = None",
            "OffPolicyTrainer.checkpoint_interval = None",
            "OffPolicyTrainer.summary_interval = 1000000000",
            "OffPolicyTrainer.progress_bar = False",
            f"OffPolicyTrainer.device = '{args.device}'",
            f"OffPolicyTrainer.num_threads = {args.threads}",
            f"SacAlgorithm.compile_update = {compile_update}",
        ],
    )
    return OffPolicyTrainer(root_dir=root)


def _sb3(seed: int, args: argparse.Namespace, batch_size: int = 256) -> Any:
    """Stable-Baselines3's SAC with the matched settings."""
    from stable_baselines3 import SAC

    return SAC(
        "MlpPolicy",
        ENV_ID,
        learning_rate=3e-4,
        buffer_size=1_000_000,
        learning_starts=args.learning_starts,
        batch_size=batch_size,
        tau=0.005,
        gamma=0.99,
        train_freq=1,
        gradient_steps=1,
        ent_coef="auto_1.0",
        target_entropy=-1.0,
        policy_kwargs={"net_arch": [256, 256]},
        seed=seed,
        device=args.device,
        verbose=0,
    )


def run_ours(seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    """Train ``sac_pendulum.gin`` for ``args.steps`` env steps.

    Args:
        seed: the run's seed.
        args: the parsed command line.

    Returns:
        dict with ``steps_per_sec`` (wall clock), ``cpu_steps_per_sec``
        (process CPU time) and ``eval_return``.
    """
    from alf_entropy.data_structures import TimeStep

    with tempfile.TemporaryDirectory() as root:
        trainer = _ours(root, seed, args, args.steps)
        cpu_start = time.process_time()
        result = trainer.train()
        cpu = time.process_time() - cpu_start
        alg = trainer.algorithm
        alg.eval()

        def policy(obs: torch.Tensor) -> torch.Tensor:
            return alg.predict_step(TimeStep(observation=obs)).output

        eval_return = _evaluate(policy, args)
    # The final checkpoint is in wall_time too: a few ms.
    return {
        "steps_per_sec": args.steps / result["wall_time"],
        "cpu_steps_per_sec": args.steps / cpu,
        "eval_return": eval_return,
    }


def run_sb3(seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    """Train Stable-Baselines3's SAC with the matched settings.

    Args:
        seed: the run's seed.
        args: the parsed command line.

    Returns:
        dict with ``steps_per_sec`` (wall clock), ``cpu_steps_per_sec``
        (process CPU time) and ``eval_return``.
    """
    model = _sb3(seed, args)
    start, cpu_start = time.time(), time.process_time()
    model.learn(total_timesteps=args.steps)
    wall, cpu = time.time() - start, time.process_time() - cpu_start

    def policy(obs: torch.Tensor) -> np.ndarray:
        action, _ = model.predict(obs.cpu().numpy(), deterministic=True)
        return action

    return {
        "steps_per_sec": args.steps / wall,
        "cpu_steps_per_sec": args.steps / cpu,
        "eval_return": _evaluate(policy, args),
    }


def time_updates(args: argparse.Namespace) -> None:
    """``--updates_only``: gradient updates alone, alternating in this process.

    Both fill their buffers with ``--learning_starts`` random steps (seed
    0), then take turns: ``--updates`` of ours (``train_step`` on a fresh
    sample), the same number of SB3's (``train()``), ``--rounds`` times, for
    each of ``--batch_sizes``; with ``--compile_update`` a third, ours with
    ``compile_update=True``, takes its turn too (its compile time, the first ``train()``'s
    wall time less eager's, apart).  Prints the median ms per update, and (CPU) the ms the
    profiler gives the matrix products in one more pass of each: their ratio is what
    the speed ratio would be without any other overhead.  At a small
    batch the products cost next to nothing and this measures the
    per-operation overhead, which is what an update costs on a GPU.

    Args:
        args: the parsed command line.
    """
    torch.set_num_threads(args.threads)
    print(
        f"SAC updates alone, {args.device}, {args.threads} torch thread(s), "
        f"{args.rounds} rounds of {args.updates}, alternating; median ms per update"
    )
    print(
        "| batch | ours ms/update | SB3 ms/update | ratio | ours products ms | SB3 products ms "
        "| products ratio | compiled ms/update | compiled ratio to SB3 | compile s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch in args.batch_sizes:
        with tempfile.TemporaryDirectory() as root:
            start = time.perf_counter()
            trainer = _ours(root, 0, args, args.learning_starts + 1)
            trainer.train()
            eager_s = time.perf_counter() - start
            alg, buffer = trainer.algorithm, trainer.replay_buffer
            compiled, compile_s = [], 0.0
            if args.compile_update:
                start = time.perf_counter()
                trainer_c = _ours(
                    os.path.join(root, "c"), 0, args, args.learning_starts + 1, compile_update=True
                )
                trainer_c.train()
                compile_s = time.perf_counter() - start - eager_s
                alg_c, buffer_c = trainer_c.algorithm, trainer_c.replay_buffer
                for _ in range(3):  # CUDA: the graph is captured at the fourth call
                    alg_c.train_step(buffer_c.sample(batch))
            model = _sb3(0, args, batch_size=batch)
            model.learn(total_timesteps=args.learning_starts + 1)
            ours, sb3 = [], []
            for _ in range(args.rounds):
                start = time.perf_counter()
                for _ in range(args.updates):
                    alg.train_step(buffer.sample(batch))
                if args.device == "cuda":
                    torch.cuda.synchronize()
                ours.append((time.perf_counter() - start) / args.updates * 1e3)
                start = time.perf_counter()
                model.train(gradient_steps=args.updates, batch_size=batch)
                if args.device == "cuda":
                    torch.cuda.synchronize()
                sb3.append((time.perf_counter() - start) / args.updates * 1e3)
                if args.compile_update:
                    start = time.perf_counter()
                    for _ in range(args.updates):
                        alg_c.train_step(buffer_c.sample(batch))
                    if args.device == "cuda":
                        torch.cuda.synchronize()
                    compiled.append((time.perf_counter() - start) / args.updates * 1e3)
            # The matrix products' own time (the profiler's, CPU only): the part of an
            # update no overhead trimming can remove.
            po = _products_ms(
                lambda: [alg.train_step(buffer.sample(batch)) for _ in range(args.updates)], args
            )
            pb = _products_ms(
                lambda: model.train(gradient_steps=args.updates, batch_size=batch), args
            )
        o, b = statistics.median(ours), statistics.median(sb3)
        products = f"{po:.2f} | {pb:.2f} | {pb / po:.2f}x" if po else "n/a | n/a | n/a"
        c = statistics.median(compiled) if compiled else float("nan")
        print(
            f"| {batch} | {o:.2f} | {b:.2f} | {b / o:.2f}x | {products} | {c:.2f} | "
            f"{b / c:.2f}x | {compile_s:.1f} |",
            flush=True,
        )


def _products_ms(run: Callable[[], Any], args: argparse.Namespace) -> float:
    """Per update, the ms the profiler gives matrix products in ``run`` (0 on CUDA)."""
    if args.device != "cpu":
        return 0.0
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    names = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
    return sum(e.self_cpu_time_total for e in prof.events() if e.name in names) / (
        args.updates * 1e3
    )


def _worker(name: str, seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    """Run one implementation in a worker process (``args.threads`` torch threads)."""
    torch.set_num_threads(args.threads)
    return (run_ours if name == "ours" else run_sb3)(seed, args)


def main() -> None:
    """Run both implementations for every seed and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--learning_starts", type=int, default=1000)
    parser.add_argument("--eval_episodes", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--updates_only", action="store_true", help="time gradient updates alone (see time_updates)"
    )
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[256, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--compile_update",
        action="store_true",
        help="--updates_only: also time SacAlgorithm(compile_update=True)",
    )
    parser.add_argument("--updates", type=int, default=300)
    args = parser.parse_args()
    for name in ("threads", "rounds", "updates"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if min(args.batch_sizes) < 1:
        parser.error(f"--batch_sizes must be >= 1, got {args.batch_sizes}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.updates_only:
        time_updates(args)
        return
    at_once = args.device == "cpu" and 2 * args.threads <= (os.cpu_count() or 1)

    rows: List[Dict[str, Any]] = []
    ctx = multiprocessing.get_context("spawn")
    for i, seed in enumerate(args.seeds):
        # One after the other: alternate which goes first, so a drifting load
        # favours neither.
        order = ["ours", "sb3"] if at_once or i % 2 == 0 else ["sb3", "ours"]
        with ProcessPoolExecutor(max_workers=2 if at_once else 1, mp_context=ctx) as pool:
            futures = {name: pool.submit(_worker, name, seed, args) for name in order}
            out = {name: f.result() for name, f in futures.items()}
        row = {
            "seed": seed,
            "ours_sps": out["ours"]["steps_per_sec"],
            "sb3_sps": out["sb3"]["steps_per_sec"],
            "ours_eval": out["ours"]["eval_return"],
            "sb3_eval": out["sb3"]["eval_return"],
        }
        row["ratio"] = row["ours_sps"] / row["sb3_sps"]
        row["cpu_ratio"] = out["ours"]["cpu_steps_per_sec"] / out["sb3"]["cpu_steps_per_sec"]
        rows.append(row)
        print(
            f"seed {seed}: ours {row['ours_sps']:.1f} steps/s eval {row['ours_eval']:.1f} | "
            f"sb3 {row['sb3_sps']:.1f} steps/s eval {row['sb3_eval']:.1f} | "
            f"ratio {row['ratio']:.2f}x (CPU time {row['cpu_ratio']:.2f}x)",
            flush=True,
        )

    how = "both at once" if at_once else "one after the other"
    print(
        f"\nSAC on {ENV_ID}, {args.steps} env steps ({args.learning_starts} random), "
        f"{args.device}, {how}, {args.threads} torch thread(s) each"
    )
    print(
        "| seed | ours env-steps/s | SB3 env-steps/s | ratio | ratio in CPU time "
        "| ours eval return | SB3 eval return |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['seed']} | {r['ours_sps']:.1f} | {r['sb3_sps']:.1f} | {r['ratio']:.2f}x | "
            f"{r['cpu_ratio']:.2f}x | "
            f"{r['ours_eval']:.1f} | {r['sb3_eval']:.1f} |"
        )
    if len(rows) > 1:
        ratios = [r["ratio"] for r in rows]
        print(
            f"| mean | | | {statistics.mean(ratios):.2f}x | "
            f"{statistics.mean(r['cpu_ratio'] for r in rows):.2f}x | "
            f"{statistics.mean(r['ours_eval'] for r in rows):.1f} | "
            f"{statistics.mean(r['sb3_eval'] for r in rows):.1f} |"
        )


if __name__ == "__main__":
    main()
