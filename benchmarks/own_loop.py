"""The plain-loop examples of ``docs/own_loop.md``, run long.

That page shows a CleanRL-style PPO loop (CartPole) and SAC loop (Pendulum)
that use an entropy controller instead of a fixed ``ent_coef``/CleanRL's
temperature autotune.  The two functions below are those loops (the same
networks, hyperparameters and controller calls; the page's copies run only
a few iterations so that the test suite can execute them), run here for
their full length with several seeds and controller settings (the loops
here also record the entropy, alpha and episode returns, feed a scheduled
target's progress, and can advance the PPO controller per minibatch).
Printed: a Markdown table per task with, as mean (min..max) over the seeds,
the mean entropy over the last quarter of the run against the target (its
mean there, for a schedule), the controller's stage and alpha at the end,
the lowest and highest alpha of any run (after each update), the mean return
of the last 20 episodes, and in how many runs the controller warned that it
was stuck before its adjust stage.

PPO (CartPole-v1): 4 envs x 128 steps per rollout, 4 epochs x 4 minibatches,
Adam lr 2.5e-4, GAE (0.99, 0.95), clip 0.2, value coefficient 0.5, gradient
norm 0.5 (CleanRL's ``ppo.py`` defaults, without the lr annealing), target
entropy 0.6; the controller advances once per rollout with the mean entropy
of its minibatches.  ``--ppo_steps`` env steps (default 100k: 195 rollouts).

SAC (Pendulum-v1): 256x256 actor and twin critics, batch 256, critics Adam lr
1e-3 (CleanRL's ``q_lr``), actor lr 3e-4 (``policy_lr``), two actor updates
every second step (``policy_frequency=2``), tau 0.005, target entropy -1; the
controller advances once per actor update through ``entropy_loss`` and its
``scalar_loss`` is added to the actor loss (zero: used alone, the SGD rule
steps its own alpha).
CleanRL trains its temperature with ``q_lr`` = 1e-3, so "4 x SAC's learning
rate" for the staged controller's rates can mean 4 x 3e-4 or 4 x 1e-3: both
are run, and the staged controller with its defaults (free stage kept,
initial alpha 0.1) and SAC's rule (Adam lr 1e-3) through the same call site.
``--sac_steps`` env steps (default 10k, the first 1k random; CleanRL
runs 1M, Pendulum is learnt by about 10k).

Usage::

    python benchmarks/own_loop.py       # both tasks, seeds 0 1 2 (~50 min on a busy core:
                                        # PPO ~20 s a run, SAC ~3.5 min a run)
    python benchmarks/own_loop.py --tasks ppo --seeds 0 1 2 --ppo_steps 100000
    python benchmarks/own_loop.py --tasks sac --sac_steps 10000

Single-threaded (``torch.set_num_threads(1)``).
"""
import argparse
import copy
import functools
import sys
import time
import warnings
from typing import Callable, Dict, List

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
from alf_entropy.utils.schedulers import LinearScheduler, reset_progress, update_progress

MakeController = Callable[[gym.Space], EntropyController]


def ppo_cartpole(make_controller: MakeController, seed: int, total_steps: int,
                 per_minibatch: bool = False) -> Dict[str, object]:
    """The docs' PPO loop for ``total_steps`` env steps (``per_minibatch``:
    the controller advances after every minibatch instead of once per rollout)."""
    torch.manual_seed(seed)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
    actor = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 2))
    critic = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                           nn.Linear(64, 1))
    params = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=2.5e-4, eps=1e-5)
    controller = make_controller(envs.single_action_space)                                     # (1)

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
            torch.stack(x).flatten(0, 1)
            for x in (b_obs, b_act, b_logp, advantages, b_val, b_valid))
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
                entropies.append((entropy.detach() * valid).sum() / valid.sum())             # (2)
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
    return _result(controller, history, targets, alphas, returns_done)


def sac_pendulum(make_controller: MakeController, seed: int, total_steps: int,
                 learning_starts: int = 1000) -> Dict[str, object]:
    """The docs' SAC loop for ``total_steps`` env steps."""
    torch.manual_seed(seed)
    env = gym.make("Pendulum-v1")
    actor = nn.Sequential(nn.Linear(3, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 2))
    qf = nn.ModuleList(nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                     nn.Linear(256, 1)) for _ in range(2))
    qf_target = copy.deepcopy(qf)
    q_opt = torch.optim.Adam(qf.parameters(), lr=1e-3)
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    controller = make_controller(env.action_space)  # (1) replaces CleanRL's autotune

    def policy(obs):
        mean, log_std = actor(obs).chunk(2, -1)
        dist = torch.distributions.Normal(mean, log_std.clamp(-5, 2).exp())
        u = dist.rsample()
        log_pi = (dist.log_prob(u) - torch.log(2 * (1 - torch.tanh(u) ** 2) + 1e-6)).sum(-1)
        return 2 * torch.tanh(u), log_pi

    def q(nets, o, a):
        return torch.min(*(net(torch.cat([o, a], -1)).squeeze(-1) for net in nets))

    buffer, (obs, _) = [], env.reset(seed=seed)
    history, alphas, ep_ret, returns_done = [], [], 0.0, []
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
                actor_loss = (bonus.loss - q(qf, o, pi)).mean() + bonus.scalar_loss
                a_opt.zero_grad()
                actor_loss.backward()
                a_opt.step()
                history.append(-log_pi.detach().mean().item())
                alphas.append(controller.alpha.item())
        with torch.no_grad():
            for p, p_target in zip(qf.parameters(), qf_target.parameters()):
                p_target.lerp_(p, 0.005)
    return _result(controller, history, [controller.target_entropy], alphas, returns_done)


def _result(controller: EntropyController, history: List[float], targets: List[float],
            alphas: List[float], returns: List[float]) -> Dict[str, object]:
    quarter = len(history) * 3 // 4
    return {
        "entropy": float(np.mean(history[quarter:])),
        "alpha_range": (min(alphas), max(alphas)),
        "target": float(np.mean(targets[quarter:] if len(targets) > 1 else targets)),
        "stage": int(controller.stage),
        "alpha": float(controller.alpha),
        "return": float(np.mean(returns[-20:])) if returns else float("nan"),
    }


def _staged(**kwargs):
    return functools.partial(EntropyTargetAlgorithm.from_space, **kwargs)


PPO_CONTROLLERS = {
    "staged, initial_alpha 0.1 (an earlier default)": _staged(target_entropy=0.6),
    "staged, initial_alpha 0.01": _staged(target_entropy=0.6, initial_alpha=0.01),
    "staged, initial_alpha 0.1, skip_free_stage": _staged(target_entropy=0.6, skip_free_stage=True),
    "staged, initial_alpha 0.01, target 0.65 -> 0.45 (scheduled)": _staged(
        target_entropy=LinearScheduler("percent", [(0, 0.65), (1, 0.45)]), initial_alpha=0.01),
    "staged, initial_alpha 0.01, advanced per minibatch": (
        _staged(target_entropy=0.6, initial_alpha=0.01), dict(per_minibatch=True)),
    "fixed alpha 0.01 (CleanRL's ent_coef)": functools.partial(
        FixedEntropyCoefficient.from_space, alpha=0.01, target_entropy=0.6),
}

SAC_CONTROLLERS = {
    "staged, defaults (free stage kept)": _staged(target_entropy=-1.0),
    "staged, rates 4 x 3e-4": _staged(target_entropy=-1.0, skip_free_stage=True,
                                      slow_update_rate=1.2e-3, fast_update_rate=1.2e-3),
    "staged, rates 4 x 1e-3": _staged(target_entropy=-1.0, skip_free_stage=True,
                                      slow_update_rate=4e-3, fast_update_rate=4e-3),
    "SAC's rule, Adam lr 1e-3 (CleanRL's autotune lr)": functools.partial(
        SGDEntropyTargetAlgorithm.from_space, target_entropy=-1.0,
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3)),
}


def _span(values: List[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    mean = float(np.mean(values))
    return f"{mean:{fmt}} ({lo:{fmt}}..{hi:{fmt}})" if len(values) > 1 else f"{mean:{fmt}}"


def _table(title: str, rows: Dict[str, List[Dict[str, object]]]) -> None:
    print(f"\n{title}\n")
    print("| controller | target, last quarter | entropy, last quarter | stage at the end "
          "| alpha at the end | alpha, lowest..highest in a run | return, last 20 episodes "
          "| warned stuck |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, results in rows.items():
        stages = sorted({r["stage"] for r in results})
        lo = min(r["alpha_range"][0] for r in results)
        hi = max(r["alpha_range"][1] for r in results)
        print(f"| {name} | {results[0]['target']:.3g} "
              f"| {_span([r['entropy'] for r in results], '.3f')} "
              f"| {', '.join(map(str, stages))} | {_span([r['alpha'] for r in results], '.3g')} "
              f"| {lo:.3g}..{hi:.3g} | {_span([r['return'] for r in results], '.0f')} "
              f"| {sum(r['warned'] for r in results)}/{len(results)} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["ppo", "sac"], choices=["ppo", "sac"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--ppo_steps", type=int, default=100_000)
    parser.add_argument("--sac_steps", type=int, default=10_000)
    parser.add_argument("--only", nargs="*", default=None, help="substrings of controller names")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    tasks = {
        "ppo": (f"PPO CartPole-v1, {args.ppo_steps} env steps, seeds {args.seeds}",
                PPO_CONTROLLERS, functools.partial(ppo_cartpole, total_steps=args.ppo_steps)),
        "sac": (f"SAC Pendulum-v1, {args.sac_steps} env steps, seeds {args.seeds}",
                SAC_CONTROLLERS, functools.partial(sac_pendulum, total_steps=args.sac_steps)),
    }
    for task in args.tasks:
        title, controllers, run = tasks[task]
        rows = {}
        for name, make in controllers.items():
            if args.only and not any(o in name for o in args.only):
                continue
            make, kwargs = make if isinstance(make, tuple) else (make, {})
            rows[name] = []
            for seed in args.seeds:
                start = time.time()
                reset_progress()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    rows[name].append(run(make, seed, **kwargs))
                rows[name][-1]["warned"] = any("stage after" in str(w.message) for w in caught)
                print(f"{task} | {name} | seed {seed}: {rows[name][-1]} "
                      f"({time.time() - start:.0f} s)",
                      file=sys.stderr, flush=True)
        _table(title, rows)


if __name__ == "__main__":
    main()
