"""LLM entropy control: a synthetic probe at real vocabulary sizes (issue 27).

Usage::

    python benchmarks/llm_entropy_control.py                       # 32k and 150k, 3 seeds
    python benchmarks/llm_entropy_control.py --vocab 32000 --seeds 0 --steps 200

The probe needs no transformers: ``B`` positions (contexts), each with its own
logits over a vocabulary of ``V`` tokens, start from a peaked, LM-like
distribution (Gaussian logits with standard deviation ``--logit_std``) and are
trained by Adam under a GRPO-like sharpening force: at each step ``G`` tokens
are sampled per position, a sample is rewarded 1 if it is the position's
initially most likely token, advantages are group-normalised
(``(r - mean) / (std + 1e-4)``) and the loss is ``-mean(A * log p) - coef * H``
with ``H`` the mean per-position entropy over the whole vocabulary (what TRL
computes from the logits).  Without a bonus the entropy collapses.

Controllers (one update per step from that step's entropy, applied at the
next step, as the TRL callback does):

* ``none``: coefficient 0;
* ``trl_0.005`` / ``trl_0.05``: TRL 1.16's adaptive rule (``coef += delta``
  if ``H <= target`` else ``-= delta``, clipped to ``[0, 1]``; the bonus is
  applied only while the last entropy was at or below the target);
* ``pid``: ``PIDEntropyTargetAlgorithm(spec, **lm_pid_settings(target))``;
* ``staged``: ``EntropyTargetAlgorithm(spec, target_entropy=target)`` (defaults).

Targets: a constant (``--target``) and a linear schedule from ``1.5 x`` to
the target over the run (the Entrocraft shape).  Metrics
(``alf_entropy.utils.control_metrics``): tracking RMSE from the first step
the entropy is within 5 % above the target (or below it), relative RMSE
(RMSE over the mean target), the largest overshoot above the target after
that point (as a ratio, max H / target), the fraction of those steps more
than 10 % below the target, the mean reward of the last 20 % of steps, and
the controller's seconds per update against the step's.  Means over seeds
are printed as Markdown, stamped with date, commit, versions and machine.
"""
import argparse
import datetime
import math
import platform
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np
import torch

from alf_entropy import BoundedTensorSpec, EntropyTargetAlgorithm, PIDEntropyTargetAlgorithm
from alf_entropy.integrations.llm import lm_pid_settings
from alf_entropy.utils import control_metrics, schedulers
from alf_entropy.utils.schedulers import LinearScheduler

CONTROLLERS = ("none", "trl_0.005", "trl_0.05", "pid", "staged")


class TRLRule:
    """TRL 1.16's adaptive entropy rule (``GRPOTrainer._compute_loss``), on floats."""

    def __init__(self, delta: float, target, coef: float = 0.0, lo: float = 0.0,
                 hi: float = 1.0):
        self.delta, self.target, self.coef, self.lo, self.hi = delta, target, coef, lo, hi
        self.last = math.inf

    def applied(self) -> float:
        return self.coef if self.last <= self.target() else 0.0

    def update(self, entropy: float) -> None:
        if entropy <= self.target():
            self.coef = min(self.coef + self.delta, self.hi)
        else:
            self.coef = max(self.coef - self.delta, self.lo)
        self.last = entropy


def run(kind: str, vocab: int, lr: float, seed: int, steps: int, target_value: float,
        scheduled: bool, positions: int, group: int, logit_std: float) -> Dict[str, float]:
    """One probe run; returns its metrics."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.nn.Parameter(torch.randn(positions, vocab, generator=gen) * logit_std)
    best = logits.detach().argmax(-1)
    opt = torch.optim.Adam([logits], lr=lr)
    if scheduled:
        target = LinearScheduler("iterations", [(0, 1.5 * target_value), (steps, target_value)])
    else:
        def target():
            return target_value
    spec = BoundedTensorSpec((), torch.int64, 0, vocab - 1)
    controller = None
    if kind == "pid":
        controller = PIDEntropyTargetAlgorithm(spec, **lm_pid_settings(target))
    elif kind == "staged":
        controller = EntropyTargetAlgorithm(spec, target_entropy=target)
    trl_rule = TRLRule(float(kind.split("_")[1]), target) if kind.startswith("trl") else None
    coef = float(controller.alpha) if controller is not None else 0.0
    entropies, targets, rewards, step_s, ctl_s = [], [], [], [], []
    for step in range(steps):
        schedulers.update_progress("iterations", step)
        t0 = time.perf_counter()
        log_p = torch.log_softmax(logits, -1)
        p = log_p.exp()
        entropy = -(p * log_p).sum(-1).mean()
        with torch.no_grad():
            samples = torch.multinomial(p, group, replacement=True, generator=gen)
        reward = (samples == best[:, None]).float()
        adv = (reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-4)
        pg = -(adv * log_p.gather(1, samples)).mean()
        applied = trl_rule.applied() if trl_rule is not None else coef
        loss = pg - applied * entropy
        opt.zero_grad()
        loss.backward()
        opt.step()
        h = float(entropy.detach())
        t1 = time.perf_counter()
        if controller is not None:
            coef = float(controller.adjust_alpha(h))
        elif trl_rule is not None:
            trl_rule.update(h)
        t2 = time.perf_counter()
        entropies.append(h)
        targets.append(target())
        rewards.append(float(reward.mean()))
        step_s.append(t1 - t0)
        ctl_s.append(t2 - t1)
    e, t = np.asarray(entropies), np.asarray(targets)
    start = control_metrics.warmup_end(e, t)
    rmse = control_metrics.tracking_rmse(e, t, start) if start < len(e) else math.nan
    after = slice(start, None)
    reached = start < len(e)
    return {"rmse": rmse, "rel_rmse": rmse / float(np.mean(t[after])) if reached else math.nan,
            "overshoot": float(np.max(e[after] / t[after])) if start < len(e) else math.nan,
            "below10": control_metrics.fraction_below(e, t, 0.10, start) if start < len(e)
            else math.nan,
            "reward": float(np.mean(rewards[int(0.8 * steps):])),
            "final_h": float(np.mean(e[-20:])),
            "step_s": float(np.median(step_s)), "ctl_s": float(np.median(ctl_s))}


def stamp() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return (f"{datetime.date.today().isoformat()}, commit {commit}, Python "
            f"{platform.python_version()}, torch {torch.__version__}, {platform.machine()} "
            f"{platform.processor() or platform.platform()}, {torch.get_num_threads()} threads")


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32_000, 150_000])
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.03, 0.1, 0.3])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--target", type=float, default=1.0)
    parser.add_argument("--positions", type=int, default=8)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--logit_std", type=float, default=4.0)
    parser.add_argument("--controllers", nargs="+", default=list(CONTROLLERS),
                        choices=CONTROLLERS)
    parser.add_argument("--no_schedule", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"Synthetic LLM probe ({stamp()}); {args.positions} positions x {args.group} "
          f"samples, {args.steps} steps, seeds {args.seeds}, logit std {args.logit_std}\n")
    print("| V | target | Adam lr | controller | RMSE | RMSE / mean target | max H / target "
          "| steps >10% below | reward | final H | controller s / step s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for vocab in args.vocab:
        for scheduled in ([False] if args.no_schedule else [False, True]):
            name = (f"{1.5 * args.target:g} -> {args.target:g}" if scheduled
                    else f"{args.target:g}")
            for lr in args.lrs:
                for kind in args.controllers:
                    rows = [run(kind, vocab, lr, s, args.steps, args.target, scheduled,
                                args.positions, args.group, args.logit_std) for s in args.seeds]
                    m = {k: float(np.nanmean([r[k] for r in rows])) for k in rows[0]}
                    print(f"| {vocab} | {name} | {lr:g} | {kind} | {m['rmse']:.3f} | "
                          f"{m['rel_rmse']:.1%} | {m['overshoot']:.2f} | {m['below10']:.1%} | "
                          f"{m['reward']:.2f} | {m['final_h']:.3f} | "
                          f"{m['ctl_s'] / m['step_s']:.2%} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
