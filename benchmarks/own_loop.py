"""The plain-loop examples of ``docs/own_loop.md``, run long, over a grid of settings.

That page shows a CleanRL-style PPO loop (CartPole) and SAC loop (Pendulum)
that use an entropy controller instead of a fixed ``ent_coef``/CleanRL's
temperature autotune.  The two functions below are those loops (the same
networks, hyperparameters and controller calls; the page's copies run only
a few iterations so that the test suite can execute them), run here for
their full length for every controller x target x initial alpha x seed.

Controllers (``--ppo_controllers``/``--sac_controllers``, keys of
``PPO_CONTROLLERS``/``SAC_CONTROLLERS``): the PID (``PIDEntropyTargetAlgorithm``
with its defaults) advanced once per rollout (``pid``) or once per minibatch
(``pid_mb``, 16 times per rollout), ALF's staged rule (``staged``), SAC's rule
(``sgd``: ``SGDEntropyTargetAlgorithm``, Adam lr 3e-4 in PPO, CleanRL's 1e-3 in
SAC) and a fixed alpha (``fixed``: CleanRL's ``ent_coef``).  Each runs from
every initial alpha of ``--alphas`` towards every target of ``--ppo_targets``
(``--sac_targets``).

Printed: a Markdown table per task, a row per controller, target and initial
alpha, as mean (min..max) over the seeds:

* **> 5 % below**: the fraction of updates in the second half of the run
  whose entropy is more than 5 % of the target below it;
* **RMSE**: the root mean square of entropy - target over the second half;
* **alpha**: at the start -> at the end (the highest alpha of any run);
* **return**: the mean return of the last 20 episodes;
* **unreachable**: in how many runs the controller warned that the target
  looks unreachable (a warning whose message contains "unreachable");
* **goals met**: in how many runs both > 5 % below <= 10 % and RMSE <= 0.02
  (the goals of issue 30 for PPO).

In PPO an "update" here is a rollout for every cadence: its entropy is the
mean over the rollout's minibatches (so ``pid`` and ``pid_mb`` are measured
alike); in SAC it is an actor update (its batch's mean entropy).

PPO (CartPole-v1): 4 envs x 128 steps per rollout, 4 epochs x 4 minibatches,
Adam lr 2.5e-4, GAE (0.99, 0.95), clip 0.2, value coefficient 0.5, gradient
norm 0.5 (CleanRL's ``ppo.py`` defaults, without the lr annealing).
``--ppo_steps`` env steps (default 100k: 195 rollouts, 3,120 minibatches).

SAC (Pendulum-v1): 256x256 actor and twin critics, batch 256, critics Adam lr
1e-3 (CleanRL's ``q_lr``), actor lr 3e-4 (``policy_lr``), two actor updates
every second step (``policy_frequency=2``), tau 0.005; the controller advances
once per actor update through ``entropy_loss``, whose loss is added to the actor
loss (used alone, the SGD rule steps its own alpha).
``--sac_steps`` env steps (default 10k, the first 1k random; CleanRL runs 1M,
Pendulum is learnt by about 10k).

Usage::

    python benchmarks/own_loop.py --tasks ppo --seeds 1 2          # 4 x 2 x 3 x 2 PPO runs
    python benchmarks/own_loop.py --tasks ppo --ppo_controllers pid pid_mb \\
        --ppo_targets 0.6 --alphas 0.01 --ppo_steps 20000 --seeds 1  # a quick look
    python benchmarks/own_loop.py --tasks sac --alphas 0.1 --seeds 0 --jobs 2

A PPO run takes ~20-40 s, a SAC run ~3.5 min on a busy core; ``--jobs N``
runs N at a time (processes, each single-threaded: ``torch.set_num_threads(1)``).
Another controller (e.g. a prototype) is a new entry of ``PPO_CONTROLLERS``
(``key: (name, factory(space, target, initial_alpha), per_minibatch)``) set
before calling ``main``.
"""

import argparse
import copy
import functools
import multiprocessing
import sys
import time
import warnings
from typing import Callable, Dict, List, Tuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from alf_entropy.algorithms.entropy_target_algorithm import (
    EntropyController,
    EntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.controllers import PIDEntropyTargetAlgorithm
from alf_entropy.utils.schedulers import reset_progress, update_progress

MakeController = Callable[[gym.Space], EntropyController]


def ppo_cartpole(
    make_controller: MakeController, seed: int, total_steps: int, per_minibatch: bool = False
) -> Dict[str, object]:
    """The docs' PPO loop for ``total_steps`` env steps (``per_minibatch``:
    the controller advances after every minibatch instead of once per rollout)."""
    torch.manual_seed(seed)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
    actor = nn.Sequential(
        nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2)
    )
    critic = nn.Sequential(
        nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
    )
    params = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=2.5e-4, eps=1e-5)
    controller = make_controller(envs.single_action_space)  # (1)
    initial_alpha = controller.alpha.item()

    num_steps, num_minibatches, update_epochs, gamma, lam = 128, 4, 4, 0.99, 0.95
    num_iterations = total_steps // (4 * num_steps)
    obs, _ = envs.reset(seed=seed)
    prev_done = torch.zeros(4, dtype=torch.bool)
    history, targets, alphas, ep_ret, returns_done = [], [], [], np.zeros(4), []
    for iteration in range(num_iterations):
        update_progress("percent", iteration / num_iterations)  # for a scheduled target
        b_obs, b_act, b_logp, b_rew, b_done, b_valid, b_val = [], [], [], [], [], [], []
        for _ in range(num_steps):
            obs_t = torch.as_tensor(obs, dtype=torch.float32)
            with torch.no_grad():
                dist = torch.distributions.Categorical(logits=actor(obs_t))
                action = dist.sample()
                b_val.append(critic(obs_t).squeeze(-1))
            obs, reward, term, trunc, _ = envs.step(action.numpy())
            done = torch.as_tensor(term | trunc)
            b_obs.append(obs_t)
            b_act.append(action)
            b_logp.append(dist.log_prob(action))
            b_rew.append(torch.as_tensor(reward, dtype=torch.float32))
            b_done.append(done)
            # gymnasium's autoreset step: its action was ignored (ALF's LAST)
            b_valid.append(~prev_done)
            prev_done = done
            ep_ret += reward * b_valid[-1].numpy()
            returns_done += list(ep_ret[done.numpy()])
            ep_ret[done.numpy()] = 0
        with torch.no_grad():  # GAE; a done step does not bootstrap
            next_value = critic(torch.as_tensor(obs, dtype=torch.float32)).squeeze(-1)
        gae, advantages = 0, []
        for r, d, v in zip(reversed(b_rew), reversed(b_done), reversed(b_val)):
            gae = r + gamma * next_value * ~d - v + gamma * lam * ~d * gae
            advantages.insert(0, gae)
            next_value = v
        b_obs, b_act, b_logp, b_adv, b_val, b_valid = (
            torch.stack(x).flatten(0, 1) for x in (b_obs, b_act, b_logp, advantages, b_val, b_valid)
        )
        b_ret = b_adv + b_val
        entropies = []
        for _ in range(update_epochs):
            for mb in torch.randperm(len(b_obs)).chunk(num_minibatches):
                dist = torch.distributions.Categorical(logits=actor(b_obs[mb]))
                value = critic(b_obs[mb]).squeeze(-1)
                valid, entropy = b_valid[mb].float(), dist.entropy()
                adv = b_adv[mb]
                adv = (adv - (adv * valid).sum() / valid.sum()) / (adv[b_valid[mb]].std() + 1e-8)
                ratio = (dist.log_prob(b_act[mb]) - b_logp[mb]).exp()
                pg_loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
                entropies.append((entropy.detach() * valid).sum() / valid.sum())  # (2)
                loss = pg_loss + 0.5 * (value - b_ret[mb]) ** 2 - controller.alpha * entropy  # (3)
                optimizer.zero_grad()
                ((loss * valid).sum() / valid.sum()).backward()
                nn.utils.clip_grad_norm_(params, 0.5)
                optimizer.step()
                if per_minibatch:
                    controller.adjust_alpha(entropies[-1])
                    alphas.append(controller.alpha.item())
        if not per_minibatch:
            controller.adjust_alpha(torch.stack(entropies).mean())  # (4) once per rollout
        alphas.append(controller.alpha.item())
        history.append(torch.stack(entropies).mean().item())
        targets.append(controller.target_entropy)
    return _result(initial_alpha, history, targets, alphas, returns_done)


def sac_pendulum(
    make_controller: MakeController, seed: int, total_steps: int, learning_starts: int = 1000
) -> Dict[str, object]:
    """The docs' SAC loop for ``total_steps`` env steps."""
    torch.manual_seed(seed)
    env = gym.make("Pendulum-v1")
    actor = nn.Sequential(
        nn.Linear(3, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2)
    )
    qf = nn.ModuleList(
        nn.Sequential(
            nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
        )
        for _ in range(2)
    )
    qf_target = copy.deepcopy(qf)
    q_opt = torch.optim.Adam(qf.parameters(), lr=1e-3)
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    controller = make_controller(env.action_space)  # (1) replaces CleanRL's autotune
    initial_alpha = controller.alpha.item()

    def policy(obs):
        mean, log_std = actor(obs).chunk(2, -1)
        dist = torch.distributions.Normal(mean, log_std.clamp(-5, 2).exp())
        u = dist.rsample()
        log_pi = (dist.log_prob(u) - torch.log(2 * (1 - torch.tanh(u) ** 2) + 1e-6)).sum(-1)
        return 2 * torch.tanh(u), log_pi

    def q(nets, o, a):
        return torch.min(*(net(torch.cat([o, a], -1)).squeeze(-1) for net in nets))

    buffer, (obs, _) = [], env.reset(seed=seed)
    history, targets, alphas, ep_ret, returns_done = [], [], [], 0.0, []
    for step in range(total_steps):
        if step < learning_starts:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                action = policy(torch.as_tensor(obs, dtype=torch.float32))[0].numpy()
        next_obs, reward, term, trunc, _ = env.step(action)
        buffer.append((obs, action, reward, next_obs, term))
        obs, ep_ret = next_obs, ep_ret + reward
        if term or trunc:
            (obs, _), returns_done, ep_ret = env.reset(), returns_done + [ep_ret], 0.0
        if step < learning_starts:
            continue
        batch = [buffer[i] for i in torch.randint(len(buffer), (256,))]
        o, a, r, o2, d = (torch.as_tensor(np.array(x), dtype=torch.float32) for x in zip(*batch))
        with torch.no_grad():
            a2, logp2 = policy(o2)
            y = r + 0.99 * (1 - d) * (q(qf_target, o2, a2) - controller.alpha * logp2)  # (2)
        q_loss = sum(F.mse_loss(net(torch.cat([o, a], -1)).squeeze(-1), y) for net in qf)
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()
        if step % 2 == 0:  # CleanRL's policy_frequency=2: two actor updates every second step
            for _ in range(2):
                pi, log_pi = policy(o)
                bonus = controller.entropy_loss(-log_pi)  # (3) moves alpha once
                # (4) bonus.loss is alpha * log_pi
                actor_loss = (bonus.loss - q(qf, o, pi)).mean()
                a_opt.zero_grad()
                actor_loss.backward()
                a_opt.step()
                history.append(-log_pi.detach().mean().item())
                targets.append(controller.target_entropy)
                alphas.append(controller.alpha.item())
        with torch.no_grad():
            for p, p_target in zip(qf.parameters(), qf_target.parameters()):
                p_target.lerp_(p, 0.005)
    return _result(initial_alpha, history, targets, alphas, returns_done)


def _result(
    initial_alpha: float,
    history: List[float],
    targets: List[float],
    alphas: List[float],
    returns: List[float],
) -> Dict[str, object]:
    """The metrics of one run (see the module docstring)."""
    half = len(history) // 2
    entropy, target = np.array(history[half:]), np.array(targets[half:])
    return {
        "below": float(np.mean(entropy < target - 0.05 * np.abs(target))),
        "rmse": float(np.sqrt(np.mean((entropy - target) ** 2))),
        "alpha_start": initial_alpha,
        "alpha_end": alphas[-1],
        "alpha_peak": max(alphas),
        "return": float(np.mean(returns[-20:])) if returns else float("nan"),
    }


# ----------------------------------------------------------------- controllers
# A factory takes (action space, target entropy, initial alpha).
Factory = Callable[[gym.Space, float, float], EntropyController]


def pid(space, target, alpha):
    return PIDEntropyTargetAlgorithm.from_space(space, target_entropy=target, initial_alpha=alpha)


def staged(space, target, alpha):
    return EntropyTargetAlgorithm.from_space(space, target_entropy=target, initial_alpha=alpha)


def staged_sac(space, target, alpha):  # as sac_pendulum_staged.gin: rates 4 x CleanRL's 1e-3
    return EntropyTargetAlgorithm.from_space(
        space,
        target_entropy=target,
        initial_alpha=alpha,
        skip_free_stage=True,
        slow_update_rate=4e-3,
        fast_update_rate=4e-3,
    )


def sgd(space, target, alpha, lr=3e-4):
    return SGDEntropyTargetAlgorithm.from_space(
        space,
        target_entropy=target,
        initial_alpha=alpha,
        optimizer=functools.partial(torch.optim.Adam, lr=lr),
    )


def fixed(space, target, alpha):
    return FixedEntropyCoefficient.from_space(space, alpha=alpha, target_entropy=target)


PPO_CONTROLLERS: Dict[str, Tuple[str, Factory, bool]] = {  # key: (name, factory, per minibatch)
    "pid": ("PID (defaults), per rollout", pid, False),
    "pid_mb": ("PID (defaults), per minibatch", pid, True),
    "staged": ("staged (defaults), per rollout", staged, False),
    "staged_mb": ("staged (defaults), per minibatch", staged, True),
    "sgd": ("SAC's rule (Adam 3e-4), per rollout", sgd, False),
    "sgd_mb": ("SAC's rule (Adam 3e-4), per minibatch", sgd, True),
    "fixed": ("fixed alpha (CleanRL's ent_coef)", fixed, False),
}

SAC_CONTROLLERS: Dict[str, Tuple[str, Factory, bool]] = {
    "pid": ("PID (defaults)", pid, False),
    "staged": ("staged, skip_free_stage, rates 4e-3", staged_sac, False),
    "sgd": (
        "SAC's rule (Adam 1e-3, CleanRL's autotune lr)",
        functools.partial(sgd, lr=1e-3),
        False,
    ),
    "fixed": ("fixed alpha", fixed, False),
}


# ----------------------------------------------------------------- the grid
def run_one(
    task: str, key: str, target: float, alpha: float, seed: int, steps: int
) -> Dict[str, object]:
    """One run of ``task`` ("ppo" or "sac") with controller ``key``; its metrics."""
    torch.set_num_threads(1)
    _, factory, per_minibatch = (PPO_CONTROLLERS if task == "ppo" else SAC_CONTROLLERS)[key]
    make = functools.partial(_call, factory, target=target, alpha=alpha)
    start = time.time()
    reset_progress()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if task == "ppo":
            result = ppo_cartpole(make, seed, steps, per_minibatch=per_minibatch)
        else:
            result = sac_pendulum(make, seed, steps)
    result["unreachable"] = any("unreachable" in str(w.message) for w in caught)
    print(
        f"{task} | {key} | target {target} | alpha {alpha} | seed {seed}: "
        f"{ {k: round(v, 4) for k, v in result.items()} } ({time.time() - start:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    return result


def _call(factory: Factory, space: gym.Space, target: float, alpha: float) -> EntropyController:
    return factory(space, target, alpha)


def _span(values: List[float], fmt: str) -> str:
    lo, hi, mean = min(values), max(values), float(np.mean(values))
    return f"{mean:{fmt}} ({lo:{fmt}}..{hi:{fmt}})" if len(values) > 1 else f"{mean:{fmt}}"


def _table(title: str, rows: Dict[Tuple[str, float, float], List[Dict[str, object]]]) -> None:
    print(f"\n{title}\n")
    print(
        "| controller | target | > 5 % below (2nd half) | RMSE (2nd half) "
        "| alpha start -> end (peak) | return, last 20 episodes | unreachable | goals met |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (name, target, alpha), results in rows.items():
        met = sum(r["below"] <= 0.10 and r["rmse"] <= 0.02 for r in results)
        print(
            f"| {name} | {target:g} | {_span([r['below'] for r in results], '.0%')} "
            f"| {_span([r['rmse'] for r in results], '.3f')} "
            f"| {alpha:g} -> {_span([r['alpha_end'] for r in results], '.3g')} "
            f"({max(r['alpha_peak'] for r in results):.3g}) "
            f"| {_span([r['return'] for r in results], '.0f')} "
            f"| {sum(r['unreachable'] for r in results)}/{len(results)} "
            f"| {met}/{len(results)} |"
        )


def main(argv=None) -> Dict[str, Dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["ppo", "sac"], choices=["ppo", "sac"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--alphas", nargs="+", type=float, default=[1e-3, 1e-2, 0.1], help="initial alphas"
    )
    parser.add_argument(
        "--ppo_controllers",
        nargs="+",
        default=["pid", "pid_mb", "staged", "sgd"],
        help=f"of {list(PPO_CONTROLLERS)}",
    )
    parser.add_argument("--ppo_targets", nargs="+", type=float, default=[0.6, 0.5])
    parser.add_argument("--ppo_steps", type=int, default=100_000)
    parser.add_argument(
        "--sac_controllers",
        nargs="+",
        default=["pid", "staged", "sgd"],
        help=f"of {list(SAC_CONTROLLERS)}",
    )
    parser.add_argument("--sac_targets", nargs="+", type=float, default=[-1.0])
    parser.add_argument("--sac_steps", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (processes)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    tasks = {
        "ppo": (
            f"PPO CartPole-v1, {args.ppo_steps} env steps, seeds {args.seeds}",
            PPO_CONTROLLERS,
            args.ppo_controllers,
            args.ppo_targets,
            args.ppo_steps,
        ),
        "sac": (
            f"SAC Pendulum-v1, {args.sac_steps} env steps, seeds {args.seeds}",
            SAC_CONTROLLERS,
            args.sac_controllers,
            args.sac_targets,
            args.sac_steps,
        ),
    }
    tables = {}
    for task in args.tasks:
        title, controllers, keys, targets, steps = tasks[task]
        unknown = set(keys) - set(controllers)
        if unknown:
            parser.error(f"unknown {task} controllers {sorted(unknown)}; of {list(controllers)}")
        grid = [(key, target, alpha) for key in keys for target in targets for alpha in args.alphas]
        runs = [
            (task, key, target, alpha, seed, steps)
            for key, target, alpha in grid
            for seed in args.seeds
        ]
        if args.jobs > 1:
            with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
                results = pool.starmap(run_one, runs)
        else:
            results = [run_one(*run) for run in runs]
        rows = {}
        for (_, key, target, alpha, _, _), result in zip(runs, results):
            rows.setdefault((controllers[key][0], target, alpha), []).append(result)
        _table(title, rows)
        tables[task] = rows
    return tables


if __name__ == "__main__":
    main()
