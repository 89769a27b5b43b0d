"""Each client's SAC on Pendulum: its own alpha tuning vs the PID vs the staged rule.

TorchRL's ``SACLoss`` (its learned ``log_alpha``, Adam 3e-4, as in
``sota-implementations/sac``) and Tianshou's ``SAC`` (``AutoAlpha``, Adam 3e-4,
as in ``test/continuous/test_sac_with_il.py``) against the same loss wired to
``PIDEntropyTargetAlgorithm`` (its defaults) or ``EntropyTargetAlgorithm`` (the
staged rule with SAC's settings: ``skip_free_stage=True``, rates 4 x 3e-4)
through ``alf_entropy.integrations.torchrl`` / ``.tianshou``.  Every rule starts
from the client's alpha of 1 and aims at the client's own default target,
``-dim(A) = -1`` (TorchRL: in the env's action units; Tianshou: in its squashed
``[-1, 1]`` units).

Both clients: 256x256 actor and twin critics, batch 256, gamma 0.99, one
gradient step per env step after ``--random_steps`` uniformly random ones,
``--steps`` env steps in all.  TorchRL: lr 3e-4, polyak 0.995, 100 frames per
collector batch then 100 updates.  Tianshou: lr 1e-3 (its script's), tau
0.005, 3-step returns, 10 env steps per collect then 10 updates.  The entropy
of each update is that batch's mean ``-log_prob``, as the rule saw it.

Printed per client, a row per rule, mean (min..max) over ``--seeds``:

* **steps to band**: the first update at which the mean entropy of the last
  ``WINDOW`` updates is within ±10 % of the target ("never": n/a in that seed);
* **RMSE**: root mean square of entropy - target over the second half;
* **median |Δ log α|**: alpha's step-to-step change over the second half;
* **alpha**: 1 -> at the end;
* **return**: the mean return of the last 10 training episodes.

Usage (in an environment with the ``torchrl`` and ``tianshou`` extras)::

    python benchmarks/clients.py                                  # 2 x 3 x 3 seeds, 10k steps
    python benchmarks/clients.py --clients tianshou --rules own pid --seeds 0 --steps 1500
    python benchmarks/clients.py --jobs 2                         # two runs at a time

Each run is single-threaded (``torch.set_num_threads(1)``); ``--jobs N`` runs N at
a time.  A 10k-step run takes 5-6 min on a busy core (~35 ms an update in either
client): the default 18 runs take ~1 h with ``--jobs 2`` on 2 free cores.
"""

import argparse
import multiprocessing
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from stamp import stamp

from alf_entropy.controllers import (
    EntropyController,
    EntropyTargetAlgorithm,
    PIDEntropyTargetAlgorithm,
)
from alf_entropy.experiments import control_metrics

TARGET = -1.0  # both clients' default: -dim(A) for Pendulum
INITIAL_ALPHA = 1.0  # both clients' start (TorchRL's alpha_init, Tianshou's log_alpha=0)
TEMPERATURE_LR = 3e-4  # both clients' alpha optimiser
WINDOW = 100  # updates averaged for "steps to band"
BAND = 0.10
HIDDEN = [256, 256]
BATCH = 256

# A rule builds a controller for the client's action space, or None: the client's own.
RULES: Dict[str, Callable[[object], Optional[EntropyController]]] = {
    "own": lambda space: None,
    "pid": lambda space: PIDEntropyTargetAlgorithm.from_space(
        space, target_entropy=TARGET, initial_alpha=INITIAL_ALPHA
    ),
    "staged": lambda space: EntropyTargetAlgorithm.from_space(
        space,
        target_entropy=TARGET,
        initial_alpha=INITIAL_ALPHA,
        skip_free_stage=True,
        slow_update_rate=4 * TEMPERATURE_LR,
        fast_update_rate=4 * TEMPERATURE_LR,
    ),
}
RULE_NAMES = {
    "own": "the client's own (Adam 3e-4 on log alpha)",
    "pid": "PID (defaults)",
    "staged": "staged, skip_free_stage, rates 1.2e-3",
}


def torchrl_sac(rule: str, seed: int, steps: int, random_steps: int) -> Dict[str, List[float]]:
    """TorchRL's SAC example's loop on Pendulum; the series of one run."""
    from tensordict.nn import TensorDictModule
    from tensordict.nn.distributions import NormalParamExtractor
    from torch import nn
    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.envs import GymEnv, RewardSum, TransformedEnv
    from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
    from torchrl.objectives import SACLoss, SoftUpdate

    from alf_entropy.integrations.torchrl import control_alpha

    torch.manual_seed(seed)
    env = TransformedEnv(GymEnv("Pendulum-v1"), RewardSum())
    env.set_seed(seed)
    spec = env.action_spec_unbatched
    actor = ProbabilisticActor(
        TensorDictModule(
            nn.Sequential(MLP(num_cells=HIDDEN, out_features=2), NormalParamExtractor()),
            in_keys=["observation"],
            out_keys=["loc", "scale"],
        ),
        in_keys=["loc", "scale"],
        spec=spec,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": spec.space.low, "high": spec.space.high},
    )
    qvalue = ValueOperator(MLP(num_cells=HIDDEN, out_features=1), in_keys=["observation", "action"])
    with torch.no_grad():
        qvalue(actor(env.reset()))
    loss = SACLoss(
        actor, qvalue, alpha_init=INITIAL_ALPHA, target_entropy=TARGET, loss_function="l2"
    )
    loss.make_value_estimator(gamma=0.99)
    controller = RULES[rule](spec)
    alpha_step = None if controller is None else control_alpha(loss, controller)
    updater = SoftUpdate(loss, eps=0.995)
    optimizers = [
        torch.optim.Adam(list(p.flatten_keys().values()), lr=3e-4)
        for p in (loss.actor_network_params, loss.qvalue_network_params)
    ]
    optimizers.append(torch.optim.Adam([loss.log_alpha], lr=TEMPERATURE_LR))
    buffer = ReplayBuffer(storage=LazyTensorStorage(steps), batch_size=BATCH)
    collector = Collector(
        env, actor, frames_per_batch=100, total_frames=steps, init_random_frames=random_steps
    )
    out = {"entropy": [], "alpha": [], "returns": []}
    for data in collector:
        buffer.extend(data.reshape(-1))
        out["returns"] += data["next", "episode_reward"][data["next", "done"]].tolist()
        if len(buffer) <= random_steps:  # the random frames' batches: no update yet
            continue
        for _ in range(data.numel()):
            loss_td = loss(buffer.sample())
            (loss_td["loss_actor"] + loss_td["loss_qvalue"] + loss_td["loss_alpha"]).backward()
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
            updater.step()
            if alpha_step is not None:
                alpha_step(loss_td["entropy"])
            out["entropy"].append(float(loss_td["entropy"]))
            out["alpha"].append(float(loss.log_alpha.detach().exp()))
    collector.shutdown()
    return out


def tianshou_sac(rule: str, seed: int, steps: int, random_steps: int) -> Dict[str, List[float]]:
    """Tianshou's SAC test script's loop on Pendulum; the series of one run."""
    import gymnasium as gym
    from tianshou.algorithm import SAC
    from tianshou.algorithm.modelfree.sac import AutoAlpha, SACPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, CollectStats, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import ContinuousActorProbabilistic, ContinuousCritic
    from tianshou.utils.torch_utils import policy_within_training_step, torch_train_mode

    from alf_entropy.integrations.squashed import squashed_space
    from alf_entropy.integrations.tianshou import ControllerAlpha

    torch.manual_seed(seed)
    np.random.seed(seed)
    env = gym.make("Pendulum-v1")
    envs = DummyVectorEnv([lambda: gym.make("Pendulum-v1")])
    envs.seed(seed)
    obs, act = env.observation_space.shape, env.action_space.shape
    critics = [
        ContinuousCritic(
            preprocess_net=Net(state_shape=obs, action_shape=act, hidden_sizes=HIDDEN, concat=True)
        )
        for _ in range(2)
    ]
    controller = RULES[rule](squashed_space(env.action_space))
    alpha = (
        AutoAlpha(TARGET, float(np.log(INITIAL_ALPHA)), AdamOptimizerFactory(lr=TEMPERATURE_LR))
        if controller is None
        else ControllerAlpha(controller)
    )
    out = {"entropy": [], "alpha": [], "returns": []}
    update = alpha.update

    def recorded(entropy: torch.Tensor):  # the alpha protocol's call, once per gradient step
        result = update(entropy)
        out["entropy"].append(float(entropy.mean()))
        out["alpha"].append(alpha.value)
        return result

    alpha.update = recorded
    algorithm = SAC(
        policy=SACPolicy(
            actor=ContinuousActorProbabilistic(
                preprocess_net=Net(state_shape=obs, hidden_sizes=HIDDEN),
                action_shape=act,
                unbounded=True,
            ),
            action_space=env.action_space,
        ),
        policy_optim=AdamOptimizerFactory(lr=1e-3),
        critic=critics[0],
        critic_optim=AdamOptimizerFactory(lr=1e-3),
        critic2=critics[1],
        critic2_optim=AdamOptimizerFactory(lr=1e-3),
        tau=0.005,
        gamma=0.99,
        alpha=alpha,
        n_step_return_horizon=3,
    )
    buffer = VectorReplayBuffer(steps, 1)
    collector = Collector[CollectStats](algorithm, envs, buffer)
    with policy_within_training_step(algorithm.policy):
        with torch_train_mode(algorithm, False):
            stats = collector.collect(n_step=random_steps, random=True, reset_before_collect=True)
        out["returns"] += list(stats.returns)
        for _ in range((steps - random_steps) // 10):
            with torch_train_mode(algorithm, False):
                stats = collector.collect(n_step=10)
            out["returns"] += list(stats.returns)
            for _ in range(10):
                algorithm.update(buffer=buffer, sample_size=BATCH)
    return out


CLIENTS = {"torchrl": torchrl_sac, "tianshou": tianshou_sac}


def metrics(run: Dict[str, List[float]]) -> Dict[str, float]:
    """One run's row entries (see the module docstring)."""
    entropy, log_alpha = np.asarray(run["entropy"]), np.log(np.asarray(run["alpha"]))
    half = len(entropy) // 2
    mean = np.convolve(entropy, np.ones(WINDOW) / WINDOW, mode="valid")
    inside = np.nonzero(np.abs(mean - TARGET) <= BAND * abs(TARGET))[0]
    return {
        "to_band": float(inside[0] + WINDOW) if inside.size else float("nan"),
        "rmse": control_metrics.tracking_rmse(entropy, TARGET, start=half),
        "d_log_alpha": float(np.median(np.abs(np.diff(log_alpha[half:])))),
        "alpha_end": float(run["alpha"][-1]),
        "return": float(np.mean(run["returns"][-10:])) if run["returns"] else float("nan"),
        "updates": float(len(entropy)),
    }


def run_one(client: str, rule: str, seed: int, steps: int, random_steps: int) -> Dict:
    torch.set_num_threads(1)
    started = time.time()
    result = metrics(CLIENTS[client](rule, seed, steps, random_steps))
    result["seconds"] = time.time() - started
    print(
        f"{client} | {rule} | seed {seed}: { {k: round(v, 4) for k, v in result.items()} }",
        file=sys.stderr,
        flush=True,
    )
    return result


def _cell(values: List[float], fmt: str) -> str:
    finite = [v for v in values if np.isfinite(v)]
    never = len(values) - len(finite)
    if not finite:
        return "never"
    text = f"{np.mean(finite):{fmt}}"
    if len(finite) > 1:
        text += f" ({min(finite):{fmt}}..{max(finite):{fmt}})"
    return text + (f", never in {never}" if never else "")


def main(argv=None) -> Dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=list(CLIENTS))
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=10_000, help="env steps per run")
    parser.add_argument("--random_steps", type=int, default=1_000)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (processes)")
    args = parser.parse_args(argv)
    if not 0 < args.random_steps < args.steps:
        parser.error("need 0 < --random_steps < --steps")
    started = time.time()
    runs = [
        (c, r, s, args.steps, args.random_steps)
        for c in args.clients
        for r in args.rules
        for s in args.seeds
    ]
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.starmap(run_one, runs)
    else:
        results = [run_one(*run) for run in runs]
    tables: Dict = {}
    for (client, rule, *_), result in zip(runs, results):
        tables.setdefault(client, {}).setdefault(rule, []).append(result)
    print(
        f"SAC on Pendulum-v1 in each client, {args.steps} env steps "
        f"({args.random_steps} random), target {TARGET:g}, alpha from {INITIAL_ALPHA:g}, "
        f"seeds {args.seeds}; "
        f"{stamp(['torchrl', 'tensordict', 'tianshou', 'gymnasium'])}"
    )
    for client, rows in tables.items():
        print(f"\n{client}\n")
        print(
            "| rule | steps to ±10 % band | RMSE (2nd half) | median abs(Δ log α) (2nd half) "
            "| alpha 1 -> end | return, last 10 episodes |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for rule, seeds in rows.items():
            column = {k: [r[k] for r in seeds] for k in seeds[0]}
            print(
                f"| {RULE_NAMES[rule]} | {_cell(column['to_band'], '.0f')} "
                f"| {_cell(column['rmse'], '.3f')} | {_cell(column['d_log_alpha'], '.2g')} "
                f"| {_cell(column['alpha_end'], '.3g')} | {_cell(column['return'], '.0f')} |"
            )
    print(
        f"\nThe benchmark took {time.time() - started:.0f} s "
        f"({np.mean([r['seconds'] for r in results]):.0f} s a run)."
    )
    return tables


if __name__ == "__main__":
    main()
