"""Training speed on CartPole-v1: our PPO vs. Stable-Baselines3's PPO.

For each implementation this measures, in one process and one after the
other:

* env-steps/s: environment steps divided by training time (evaluation time
  excluded), and
* the env steps and wall time until a deterministic evaluation (mean return
  of ``--eval_episodes`` episodes, run every ``--eval_every`` env steps with
  the same evaluation code for both) first reaches ``--threshold`` (475).

Settings are matched: 8 envs x 128 steps per update, 4 epochs of 4
minibatches (256 samples), Adam(lr=3e-4, eps=1e-5), gamma 0.99, GAE lambda
0.95, clip 0.2, value loss 0.5 * MSE, gradient-norm clip 0.5, separate 64x64
tanh actor and critic with orthogonal init, advantages normalised per
minibatch, entropy coefficient 0.01 (fixed for SB3; for ours the entropy
controller starts from alpha = 0.01, as in ``ppo_cartpole.gin``; pass
``--fixed_entropy`` to use a fixed 0.01 instead).  Both run on the CPU with one
torch thread.  Each uses its framework's default environments: ours
gymnasium's NumPy-vectorised ``CartPoleVectorEnv`` (``GymVectorEnv``'s
``"auto"`` mode), SB3 its ``DummyVecEnv`` of ``Monitor``-wrapped envs.

Stable-Baselines3 is optional: without it only our numbers are printed.
Install it without pulling another torch build::

    pip install stable-baselines3 --no-deps

Usage::

    python benchmarks/train_speed.py [--seed 0] [--repeats 3] [--max_steps 300000]
    python benchmarks/train_speed.py --breakdown   # where one iteration of ours goes
    python benchmarks/train_speed.py --phases --repeats 3   # collecting vs training, both

With ``--repeats N`` the two implementations alternate N times (so machine
load hits both alike) and the ratio of their steps/s is printed per run and
as a mean.
"""

import argparse
import contextlib
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import torch

ENV_ID = "CartPole-v1"
NUM_ENVS = 8
N_STEPS = 128
NUM_EPOCHS = 4
NUM_MINIBATCHES = 4
LR = 3e-4


def _evaluate(policy_fn: Callable[[Any], Any], episodes: int, seed: int) -> float:
    from alf_entropy.environments import evaluate

    return evaluate(ENV_ID, policy_fn, num_episodes=episodes, seed=seed, device="cpu")


def run_ours(args: argparse.Namespace) -> Dict[str, Any]:
    """Train our PPO with ``ppo_cartpole.gin`` until the threshold.

    Args:
        args: the parsed command line.

    Returns:
        dict with ``env_steps``, ``wall_time``, ``train_time``, ``eval_return``
        and ``steps_per_sec``.
    """
    from alf_entropy.config.loading import parse_gin_config
    from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

    every = max(1, args.eval_every // (NUM_ENVS * N_STEPS))
    params = [
        "OnPolicyTrainer.num_env_steps = %d" % args.max_steps,
        "OnPolicyTrainer.num_envs = %d" % NUM_ENVS,
        "OnPolicyTrainer.unroll_length = %d" % N_STEPS,
        "OnPolicyTrainer.eval_interval = %d" % every,
        "OnPolicyTrainer.num_eval_episodes = %d" % args.eval_episodes,
        "OnPolicyTrainer.stop_eval_return = %f" % args.threshold,
        "OnPolicyTrainer.checkpoint_interval = None",
        "OnPolicyTrainer.summary_interval = 1000000",
        "OnPolicyTrainer.progress_bar = False",
        "OnPolicyTrainer.seed = %d" % args.seed,
        "PPOAlgorithm.num_epochs = %d" % NUM_EPOCHS,
        "PPOAlgorithm.num_minibatches = %d" % NUM_MINIBATCHES,
        "PPOAlgorithm.debug_summaries = False",
    ]
    if args.fixed_entropy:
        params += [
            "PPOAlgorithm.enforce_entropy_target = False",
            "PPOAlgorithm.entropy_regularization = 0.01",
        ]
    parse_gin_config(["ppo_cartpole.gin"], params)
    with tempfile.TemporaryDirectory() as root_dir:
        trainer = OnPolicyTrainer(root_dir, device="cpu")
        torch.set_num_threads(1)
        result = trainer.train()
    train_time = result["wall_time"] - result["eval_time"]
    return {
        "env_steps": result["env_steps"],
        "wall_time": result["wall_time"],
        "train_time": train_time,
        "eval_return": result["eval_return"],
        "steps_per_sec": result["env_steps"] / train_time,
    }


@contextlib.contextmanager
def _summed_calls(pieces: List[Any], inside_first: bool = False) -> Iterator[Dict[str, List]]:
    """Sum the seconds and calls of each ``(label, cls, name)`` method into the dict yielded
    (``label -> [seconds, calls]``); ``inside_first``: the others count only while the first
    runs.  The methods are restored after."""
    spent: Dict[str, List] = {label: [0.0, 0] for label, _, _ in pieces}
    saved = [(cls, name, getattr(cls, name)) for _, cls, name in pieces]
    inside = [not inside_first]

    def timed(label: str, fn: Callable[..., Any], first: bool) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            if not (first or inside[0]):
                return fn(*a, **k)
            was, inside[0], start = inside[0], True, time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[label][0] += time.perf_counter() - start
                spent[label][1] += 1
                inside[0] = was

        return call

    for k, ((label, cls, name), (_, _, fn)) in enumerate(zip(pieces, saved)):
        setattr(cls, name, timed(label, fn, k == 0))
    try:
        yield spent
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)


def breakdown(args: argparse.Namespace) -> None:
    """``--breakdown``: where one iteration of ours goes (timers around each call, summed
    over a 60-iteration run, evaluations not counted); prints ms per iteration and us per call."""
    from alf_entropy.algorithms import actor_critic_algorithm
    from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm
    from alf_entropy.algorithms.algorithm import Algorithm
    from alf_entropy.environments import GymVectorEnv
    from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

    pieces = [
        ("iteration", OnPolicyTrainer, "_train_iteration"),
        ("acting (rollout_step)", ActorCriticAlgorithm, "rollout_step"),
        ("environment (step)", GymVectorEnv, "step"),
        ("values and GAE", ActorCriticAlgorithm, "preprocess_experience"),
        ("minibatch split", actor_critic_algorithm, "minibatches"),  # on_policy_unroll's
        ("forward (train_step)", ActorCriticAlgorithm, "train_step"),
        ("losses + controller", ActorCriticAlgorithm, "calc_loss"),
        ("backward, clip, Adam", Algorithm, "update_with_gradient"),
    ]
    with _summed_calls(pieces, inside_first=True) as spent:  # not the evaluations' calls
        run_ours(
            argparse.Namespace(
                **{
                    **vars(args),
                    "max_steps": 60 * NUM_ENVS * N_STEPS,
                    "threshold": 1e9,
                    "eval_every": 10**9,
                }
            )
        )
    iterations = spent["iteration"][1]
    print(f"{'piece':<24} {'ms/iteration':>12} {'us/call':>9} {'calls/iteration':>16}")
    for label, *_ in pieces:
        seconds, calls = spent[label]
        print(
            f"{label:<24} {seconds / iterations * 1e3:>12.2f} "
            f"{seconds / calls * 1e6 if calls else 0:>9.1f} {calls / iterations:>16.1f}"
        )


def phases(args: argparse.Namespace) -> None:
    """``--phases``: each implementation's collection and training per iteration (60
    iterations, no evaluations), alternating ``--repeats`` times; prints ms per iteration."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

    from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm
    from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

    short = argparse.Namespace(
        **{
            **vars(args),
            "max_steps": 60 * NUM_ENVS * N_STEPS,
            "threshold": 1e9,
            "eval_every": 10**9,
        }
    )
    print(
        f"{'round':>5} {'ours collect':>13} {'ours train':>11} {'SB3 collect':>12} "
        f"{'SB3 train':>10} {'collect SB3/ours':>17} {'train SB3/ours':>15} {'ratio':>6}"
    )
    for k in range(args.repeats):
        with _summed_calls(
            [
                ("iteration", OnPolicyTrainer, "_train_iteration"),
                ("train", ActorCriticAlgorithm, "train_from_unroll"),
            ]
        ) as ours:
            run_ours(short)
        with _summed_calls(
            [("collect", OnPolicyAlgorithm, "collect_rollouts"), ("train", PPO, "train")]
        ) as sb3:
            run_sb3(short)
        o_train = ours["train"][0] / ours["train"][1] * 1e3
        o_collect = ours["iteration"][0] / ours["iteration"][1] * 1e3 - o_train
        s_collect, s_train = (sb3[p][0] / sb3[p][1] * 1e3 for p in ("collect", "train"))
        print(
            f"{k + 1:>5} {o_collect:>13.2f} {o_train:>11.2f} {s_collect:>12.2f} "
            f"{s_train:>10.2f} {s_collect / o_collect:>16.2f}x {s_train / o_train:>14.2f}x "
            f"{(s_collect + s_train) / (o_collect + o_train):>5.2f}x"
        )


def run_sb3(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """Train SB3's PPO with matched settings until the threshold.

    Args:
        args: the parsed command line.

    Returns:
        The same dict as :func:`run_ours`, or ``None`` if SB3 is missing.
    """
    try:
        import stable_baselines3 as sb3
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.env_util import make_vec_env
    except ImportError:
        return None

    torch.set_num_threads(1)
    env = make_vec_env(ENV_ID, n_envs=NUM_ENVS, seed=args.seed)
    model = sb3.PPO(
        "MlpPolicy",
        env,
        learning_rate=LR,
        n_steps=N_STEPS,
        batch_size=NUM_ENVS * N_STEPS // NUM_MINIBATCHES,
        n_epochs=NUM_EPOCHS,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        normalize_advantage=True,
        policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh),
        seed=args.seed,
        device="cpu",
        verbose=0,
    )

    def policy_fn(obs: torch.Tensor) -> torch.Tensor:
        action, _ = model.predict(obs.numpy(), deterministic=True)
        return torch.as_tensor(action)

    class StopAtThreshold(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.eval_time = 0.0
            self.eval_return: Optional[float] = None
            self.next_eval = args.eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next_eval:
                return True
            self.next_eval += args.eval_every
            start = time.time()
            self.eval_return = _evaluate(policy_fn, args.eval_episodes, args.seed + 1_000_003)
            self.eval_time += time.time() - start
            return self.eval_return < args.threshold

    callback = StopAtThreshold()
    start = time.time()
    model.learn(total_timesteps=args.max_steps, callback=callback)
    wall = time.time() - start
    env.close()
    train_time = wall - callback.eval_time
    return {
        "env_steps": model.num_timesteps,
        "wall_time": wall,
        "train_time": train_time,
        "eval_return": callback.eval_return,
        "steps_per_sec": model.num_timesteps / train_time,
    }


def _row(name: str, r: Dict[str, Any], threshold: float) -> str:
    reached = r["eval_return"] is not None and r["eval_return"] >= threshold
    return (
        f"{name:<22} {r['steps_per_sec']:>10.0f} {r['env_steps']:>10d} "
        f"{r['wall_time']:>9.1f} "
        f"{r['eval_return'] if r['eval_return'] is not None else float('nan'):>9.1f}"
        f"  {'yes' if reached else 'NO (max_steps hit)'}"
    )


def _mean_spread(values: List[float]) -> str:
    mean = float(np.mean(values))
    spread = max(abs(v - mean) for v in values) / mean * 100 if mean else 0.0
    return f"{mean:,.0f} (±{spread:.0f}%)"


def main() -> None:
    """Parse arguments, run both trainings (alternating) and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max_steps", type=int, default=300_000)
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument("--eval_every", type=int, default=10_240, help="env steps between evals")
    parser.add_argument("--eval_episodes", type=int, default=10)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run each implementation this many times, alternating",
    )
    parser.add_argument(
        "--fixed_entropy",
        action="store_true",
        help="ours with a fixed entropy coefficient 0.01 instead of the controller",
    )
    parser.add_argument("--skip_sb3", action="store_true")
    parser.add_argument(
        "--breakdown", action="store_true", help="print where one iteration of ours goes, then stop"
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="each implementation's ms per iteration collecting and training",
    )
    args = parser.parse_args()
    np.random.seed(args.seed)
    if args.breakdown:
        breakdown(args)
        return
    if args.phases:
        phases(args)
        return

    ours_runs, sb3_runs = [], []
    for _ in range(args.repeats):
        ours_runs.append(run_ours(args))
        sb3 = None if args.skip_sb3 else run_sb3(args)
        if sb3 is not None:
            sb3_runs.append(sb3)
    header = (
        f"{'implementation':<22} {'steps/s':>10} {'steps':>10} {'wall s':>9} {'eval':>9}  "
        f"reached {args.threshold:g}"
    )
    print(header)
    print("-" * len(header))
    label = "alf_entropy PPO" + (" (fixed)" if args.fixed_entropy else "")
    for r in ours_runs:
        print(_row(label, r, args.threshold))
    for r in sb3_runs:
        print(_row("stable-baselines3 PPO", r, args.threshold))
    if not sb3_runs:
        print(
            "SB3 rows skipped: "
            + (
                "--skip_sb3"
                if args.skip_sb3
                else "stable-baselines3 not installed (pip install stable-baselines3 --no-deps)"
            )
        )
        return
    ours_sps = [r["steps_per_sec"] for r in ours_runs]
    sb3_sps = [r["steps_per_sec"] for r in sb3_runs]
    ratios = [a / b for a, b in zip(ours_sps, sb3_sps)]
    print(f"seed {args.seed}, {args.repeats} run(s) each, mean (largest deviation from it):")
    print(f"  steps/s: ours {_mean_spread(ours_sps)}, SB3 {_mean_spread(sb3_sps)}")
    print(
        f"  ratio ours/SB3 steps/s: x{np.mean(ratios):.2f} "
        f"(per run: {', '.join(f'x{r:.2f}' for r in ratios)})"
    )
    wall_ratio = np.mean([r["wall_time"] for r in ours_runs]) / np.mean(
        [r["wall_time"] for r in sb3_runs]
    )
    print(f"  wall time to threshold ours/SB3: x{wall_ratio:.2f} (lower is better)")


if __name__ == "__main__":
    main()
