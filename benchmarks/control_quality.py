"""Control-quality benchmark: how well does each controller hold the entropy?

Usage::

    python benchmarks/control_quality.py                 # (a) synthetic, ~10-25 min on 2 busy cores
    python benchmarks/control_quality.py --ppo           # + (b) PPO CartPole, ~15 min more
    python benchmarks/control_quality.py --no_synthetic --ppo --ppo_only staged responsive
    python benchmarks/control_quality.py --no_synthetic --sac --seeds 0  # (c) SAC Pendulum
    python benchmarks/control_quality.py --out_dir /tmp/cq --seeds 0 1 2 --jobs 4

Controllers: the staged controller (``EntropyTargetAlgorithm`` with the seed
defaults: initial alpha 0.1, rates 0.001/0.01/log 2), SAC's gradient rule
(``SGDEntropyTargetAlgorithm``, Adam on ``log_alpha``) at several learning
rates, a fixed alpha (``FixedEntropyCoefficient``; in (b) SAC's rule with
learning rate 0, so that the target is still logged), and the staged
controller with ``track_target_changes=True`` (in (b) also ``max_alpha=1``).

Tasks:

(a) a synthetic collapsing policy (the probe of issue 11 and of the
    controller's tests): 4 actions, logits trained by Adam (lr 0.05) to
    maximise P(action 0) plus the entropy bonus ``alpha * H`` over a batch of
    8 samples per update.  4,000 updates with a constant target
    (0.8), a ramp (1.2 -> 0.3 over the run) and a step (0.6 -> 1.0 at update
    2,000).
(b) PPO on CartPole with a scheduled target (``ppo_cartpole_scheduled_target.gin``
    with the schedule 0.68 -> 0.58, above the entropy PPO reaches by itself,
    over 100k env steps, summaries every iteration), run with
    ``alf-entropy-sweep``; metrics per logged iteration, from the report.  The
    shipped config as it is (0.65 -> 0.45, 200k steps) runs once too.
(c) SAC on Pendulum (``sac_pendulum.gin``, target entropy -1, 10k env
    steps, one update per env step, summaries every update): the staged
    controller as in ``sac_pendulum_staged.gin`` (``skip_free_stage=True``,
    rates 4 x SAC's lr), SAC's rule as shipped, and a fixed alpha (SAC's
    rule with learning rate 0 from alpha 0.05, so that the target is still
    logged); run with ``alf-entropy-sweep``, metrics from the report.

Metrics (``alf_entropy.experiments.control_metrics``, band ±5% of the target):
tracking RMSE after warm-up (from the first update whose entropy is within
the band or below it), fraction of those updates more than 5% below target,
settling time after the step, largest alpha change within one iteration
(for (a) one iteration is one update), final evaluation return for (b).
Means over seeds are printed as a Markdown table; the figure of (a) (seed 0)
is written to ``<out_dir>/control_quality.png``.
"""

import argparse
import functools
import inspect
import math
import os
import shutil
import sys
import time

import numpy as np
import torch

from alf_entropy.algorithms.entropy_target_algorithm import (
    EntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.controllers import PIDEntropyTargetAlgorithm
from alf_entropy.data_structures import StepType
from alf_entropy.experiments import control_metrics as cm
from alf_entropy.tensor_specs import BoundedTensorSpec

NUM_ACTIONS = 4
BATCH = 8
POLICY_LR = 0.05
NUM_UPDATES = 4000
STEP_AT = 2000
TOL = 0.05
LATE = 500


def _targets(n: int = NUM_UPDATES):
    return {
        "constant 0.8": np.full(n, 0.8),
        "ramp 1.2->0.3": np.linspace(1.2, 0.3, n),
        "step 0.6->1.0": np.where(np.arange(n) < STEP_AT, 0.6, 1.0),
        "step 1.0->0.3": np.where(np.arange(n) < STEP_AT, 1.0, 0.3),
    }


def _controllers():
    spec = BoundedTensorSpec((), torch.int64, 0, NUM_ACTIONS - 1)
    ctrls = {
        "PID (defaults)": lambda t: PIDEntropyTargetAlgorithm(spec, target_entropy=t),
        "staged (seed defaults)": lambda t: EntropyTargetAlgorithm(spec, target_entropy=t),
    }
    params = inspect.signature(EntropyTargetAlgorithm.__init__).parameters
    if "track_target_changes" in params:
        ctrls["staged, track_target_changes"] = lambda t: EntropyTargetAlgorithm(
            spec, target_entropy=t, track_target_changes=True
        )
    for lr in (3e-4, 3e-3, 3e-2):
        ctrls[f"SAC rule, lr {lr:g}"] = functools.partial(
            lambda t, lr: SGDEntropyTargetAlgorithm(
                spec, target_entropy=t, optimizer=functools.partial(torch.optim.Adam, lr=lr)
            ),
            lr=lr,
        )
    ctrls["fixed alpha 0.1"] = lambda t: FixedEntropyCoefficient(spec, alpha=0.1)
    return ctrls, spec


def run_synthetic(make_ctrl, spec, target: np.ndarray, seed: int):
    """One run of task (a); returns per-update ``(entropy, alpha)`` arrays."""
    torch.manual_seed(seed)
    # the task is deterministic: seed 0 starts uniform, other seeds from
    # random logits
    init = 0.5 * torch.randn(NUM_ACTIONS) if seed else torch.zeros(NUM_ACTIONS)
    logits = torch.nn.Parameter(init)
    policy_opt = torch.optim.Adam([logits], lr=POLICY_LR)
    box = {"i": 0}
    ctrl = make_ctrl(lambda: float(target[box["i"]]))
    step_type = torch.full((BATCH,), int(StepType.MID))
    n = target.size
    entropies, alphas = np.zeros(n), np.zeros(n)
    for i in range(n):
        box["i"] = i
        dist = torch.distributions.Categorical(logits=logits.expand(BATCH, NUM_ACTIONS))
        task_loss = -dist.probs[:, 0].mean()  # maximise P(action 0): collapses the entropy
        info = ctrl.train_step((dist, step_type)).info
        loss_info = ctrl.calc_loss(info)
        # The same call site for every controller: calc_loss moves alpha (the
        # SAC rule by its own Adam step).
        loss = task_loss + loss_info.loss.mean()
        policy_opt.zero_grad()
        loss.backward()
        policy_opt.step()
        # the entropy the controller saw at this update, and its alpha after it
        entropies[i] = float(-info.loss.extra.neg_entropy[0].detach())
        alphas[i] = float(ctrl.alpha)
    return entropies, alphas


def synthetic_metrics(entropy, alpha, target):
    start = cm.warmup_end(entropy, target, TOL)
    settle = cm.settling_times(entropy, target, tol=TOL)
    second = slice(STEP_AT, None)
    return {
        "rmse": cm.tracking_rmse(entropy, target, start),
        # after the first acquisition of the target (the policy collapses
        # from uniform at the start): how well it is then held
        "rmse_late": cm.tracking_rmse(entropy, target, max(start, LATE)),
        "below": cm.fraction_below(entropy, target, TOL, start),
        "below_2nd_half": cm.fraction_below(entropy[second], target[second], TOL),
        "settle": settle[0] if settle else math.nan,
        "alpha_x": cm.largest_alpha_change(alpha).factor,
        "final_alpha": float(alpha[-1]),
    }


def _fmt(v, digits=3, nan="never"):
    if isinstance(v, float) and math.isnan(v):
        return nan
    return f"{v:.{digits}g}"


def benchmark_synthetic(seeds, out_dir, only=None):
    ctrls, spec = _controllers()
    if only:
        ctrls = {k: v for k, v in ctrls.items() if any(o in k for o in only)}
    targets = _targets()
    curves = {}
    rows = []
    for task, target in targets.items():
        for name, make in ctrls.items():
            ms = []
            for seed in seeds:
                entropy, alpha = run_synthetic(make, spec, target, seed)
                ms.append(synthetic_metrics(entropy, alpha, target))
                if seed == seeds[0]:
                    curves[(task, name)] = (entropy, alpha)
            mean = {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}
            mean["rmse_ci"] = cm.bootstrap_ci([m["rmse"] for m in ms])[1:]
            mean["alpha_x"] = float(np.max([m["alpha_x"] for m in ms]))  # worst seed
            # settling: mean over seeds that settled, and how many did
            settled = [m["settle"] for m in ms if not math.isnan(m["settle"])]
            mean["settle"] = float(np.mean(settled)) if settled else math.nan
            mean["settled"] = f"{len(settled)}/{len(ms)}"
            rows.append((task, name, mean))
            print(f"  {task:14s} {name:30s} rmse {mean['rmse']:.3f}", file=sys.stderr)
    print(
        f"\n(a) synthetic collapsing policy, mean over seeds {list(seeds)} "
        "(95% bootstrap interval in brackets); alpha change: the worst seed\n"
    )
    print(
        f"| task | controller | tracking RMSE | RMSE after update {LATE} | frac >5% below | "
        "settle (updates) | largest alpha change / update | final alpha |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for task, name, m in rows:
        settle = (
            "–"
            if not task.startswith("step")
            else (f"{_fmt(m['settle'], 4)} ({m['settled']} settled)")
        )
        below = f"{m['below']:.2f}"
        if task.startswith("step"):
            below += f" (2nd half {m['below_2nd_half']:.2f})"
        lo, hi = m["rmse_ci"]
        print(
            f"| {task} | {name} | {m['rmse']:.3f} [{lo:.3f}, {hi:.3f}] | {m['rmse_late']:.4f} | "
            f"{below} | {settle} | "
            f"×{m['alpha_x']:.2f} | {_fmt(m['final_alpha'])} |"
        )
    _plot_synthetic(curves, targets, ctrls, os.path.join(out_dir, "control_quality.png"))


def _plot_synthetic(curves, targets, ctrls, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(targets), figsize=(13, 5.5), sharex=True)
    for col, (task, target) in enumerate(targets.items()):
        ax, ax2 = axes[0, col], axes[1, col]
        for name in ctrls:
            entropy, alpha = curves[(task, name)]
            ax.plot(entropy, lw=0.9, label=name)
            ax2.plot(alpha, lw=0.9, label=name)
        ax.plot(target, "k--", lw=1.2, label="target")
        ax.set_title(f"{task}: entropy", fontsize=9)
        ax.set_ylim(0, math.log(NUM_ACTIONS) + 0.05)
        ax2.set_yscale("log")
        ax2.set_title("alpha (log)", fontsize=9)
        ax2.set_xlabel("update")
        ax.grid(alpha=0.3)
        ax2.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)
    print(f"\nfigure: {path}")


PPO_COMMON = [
    "OnPolicyTrainer.num_env_steps = 100000",
    # Above the entropy PPO settles at by itself (~0.52), so the controller
    # has to act for most of the run.
    "LinearScheduler.schedule = [(0, 0.68), (1.0, 0.58)]",
    "OnPolicyTrainer.summary_interval = 1",
    "OnPolicyTrainer.progress_bar = False",
]
# The SGD controller's settings, only for the runs that use it (a binding a
# run never uses is refused).
PPO_SGD = [
    "PPOAlgorithm.entropy_target_cls = @SGDEntropyTargetAlgorithm",
    "SGDEntropyTargetAlgorithm.target_entropy = @LinearScheduler()",
    "SGDEntropyTargetAlgorithm.initial_alpha = 0.1",
]


def _group_table(markdown_path):
    """The across-seed table alf-entropy-report wrote (mean [95% bootstrap interval])."""
    text = open(markdown_path, encoding="utf-8").read()
    return text[text.index("Across seeds") :] if "Across seeds" in text else ""


def _last_evals(run_dir, k=3):
    """Mean of the last ``k`` evaluation returns of a run."""
    from alf_entropy.experiments.report import load_run

    values = load_run(run_dir).get("eval/return")[1]
    return float(np.mean(values[-k:])) if values.size else math.nan


def _run_sweeps(sweeps, out_dir, jobs):
    from alf_entropy.experiments.sweep import run_sweep

    dirs = []
    for name, spec in sweeps.items():
        start = time.time()
        result = run_sweep(
            spec,
            os.path.join(out_dir, name),
            jobs=jobs,
            report=False,
            log=lambda s: print(s, file=sys.stderr),
        )
        print(f"  {name}: {time.time() - start:.0f}s, failed {result['failed']}", file=sys.stderr)
        dirs += [r.root_dir for r in result["runs"]]
    return dirs


def benchmark_ppo(seeds, out_dir, jobs, only=None):
    from alf_entropy.experiments.report import write_report

    base = {"gin_file": ["ppo_cartpole.gin"], "seeds": list(seeds)}
    sgd = PPO_SGD
    sweeps = {
        "pid": dict(base, gin_file=["ppo_cartpole_pid.gin"], gin_param=PPO_COMMON),
        "staged": dict(base, gin_param=PPO_COMMON),
        # ALF's defaults: init and free stages, no cap on alpha's moves.
        "staged_alf": dict(
            base,
            gin_param=PPO_COMMON
            + [
                "EntropyTargetAlgorithm.skip_free_stage = False",
                "EntropyTargetAlgorithm.max_alpha_change_per_iteration = None",
            ],
        ),
        "sac_rule": dict(
            base,
            gin_param=PPO_COMMON + sgd,
            parameters={"SGDEntropyTargetAlgorithm.lr": [3e-4, 3e-3, 3e-2]},
        ),
        # Adam with lr 0 never moves log_alpha: a fixed alpha (0.1) whose
        # summaries still carry the target.
        "fixed": dict(
            base, gin_param=PPO_COMMON + sgd, parameters={"SGDEntropyTargetAlgorithm.lr": [0.0]}
        ),
    }
    if only:
        sweeps = {k: v for k, v in sweeps.items() if k in only}
    dirs = _run_sweeps(sweeps, os.path.join(out_dir, "ppo"), jobs)
    rep = write_report(dirs, os.path.join(out_dir, "ppo", "report"))
    print(
        f"\n(b) PPO CartPole, scheduled target 0.68 -> 0.58 over 100k env steps, "
        f"seeds {list(seeds)}\n"
    )
    print(
        "| run | tracking RMSE | frac >5% below | largest alpha change in one iteration | "
        "final eval return |"
    )
    print("| --- | --- | --- | --- | --- |")
    for row in rep["rows"]:
        print(
            f"| {row['run']} | {row['tracking_rmse']:.3f} | {row['frac_5pct_below']:.2f} | "
            f"×{row['max_alpha_change_x']:.3g} ({row['max_alpha_change']}) | "
            f"{row['final_eval_return']:.1f} |"
        )
    print("\n" + _group_table(rep["markdown"]))


def benchmark_main_job(seeds, out_dir, jobs):
    """The shipped main job (ppo_cartpole.gin, staged) and its PID twin, as shipped."""
    from alf_entropy.experiments.report import write_report

    quiet = ["OnPolicyTrainer.progress_bar = False"]
    sweeps = {
        name: {"gin_file": [gin], "seeds": list(seeds), "gin_param": quiet}
        for name, gin in (("main_staged", "ppo_cartpole.gin"), ("main_pid", "ppo_cartpole_pid.gin"))
    }
    dirs = _run_sweeps(sweeps, os.path.join(out_dir, "main"), jobs)
    rep = write_report(dirs, os.path.join(out_dir, "main", "report"))
    print(
        f"\n(e) the main job as shipped (200k env steps, target 0.68 -> 0.52), "
        f"seeds {list(seeds)}\n"
    )
    print(
        "| run | mean of the last 3 evals | tracking RMSE | frac >5% below | "
        "largest alpha change in one iteration |"
    )
    print("| --- | --- | --- | --- | --- |")
    common = os.path.commonpath([os.path.abspath(d) for d in dirs])
    for row in rep["rows"]:
        last = _last_evals(os.path.join(common, row["run"]))
        print(
            f"| {row['run']} | {last:.1f} | {row['tracking_rmse']:.3f} | "
            f"{row['frac_5pct_below']:.2f} | "
            f"×{row['max_alpha_change_x']:.3g} |"
        )
    print("\n" + _group_table(rep["markdown"]))


SAC_COMMON = ["OffPolicyTrainer.summary_interval = 1", "OffPolicyTrainer.progress_bar = False"]


def benchmark_sac(seeds, out_dir, jobs, steps=10000, only=None):
    from alf_entropy.experiments.report import write_report
    from alf_entropy.experiments.sweep import run_sweep

    common = SAC_COMMON + [f"OffPolicyTrainer.num_env_steps = {steps}"]
    base = {"seeds": list(seeds), "seed_binding": "OffPolicyTrainer.seed"}
    sweeps = {
        "pid": dict(base, gin_file=["sac_pendulum_pid.gin"], gin_param=common),
        "staged": dict(base, gin_file=["sac_pendulum_staged.gin"], gin_param=common),
        "sac_rule": dict(
            base,
            gin_file=["sac_pendulum.gin"],
            gin_param=common,
            parameters={"SGDEntropyTargetAlgorithm.lr": [3e-4, 3e-3, 3e-2]},
        ),
        # Adam with lr 0 never moves log_alpha: a fixed alpha whose summaries
        # still carry the target.
        "fixed": dict(
            base,
            gin_file=["sac_pendulum.gin"],
            gin_param=common
            + [
                "SGDEntropyTargetAlgorithm.initial_alpha = 0.05",
                "SGDEntropyTargetAlgorithm.lr = 0.0",
            ],
        ),
    }
    if only:
        sweeps = {k: v for k, v in sweeps.items() if k in only}
    dirs = []
    for name, spec in sweeps.items():
        start = time.time()
        result = run_sweep(
            spec,
            os.path.join(out_dir, "sac", name),
            jobs=jobs,
            report=False,
            log=lambda s: print(s, file=sys.stderr),
        )
        print(f"  {name}: {time.time() - start:.0f}s, failed {result['failed']}", file=sys.stderr)
        dirs += [r.root_dir for r in result["runs"]]
    from alf_entropy.experiments.report import load_run

    rep = write_report(dirs, os.path.join(out_dir, "sac", "report"), dpi=60)
    print(f"\n(c) SAC Pendulum, target entropy -1, {steps} env steps, seeds {list(seeds)}\n")
    print(
        "| controller | reaches target (env step) | tracking RMSE | frac >5% below | "
        "mean entropy, last 1k steps | largest alpha change in one iteration | final alpha | "
        "final eval return |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    common = os.path.commonpath([os.path.abspath(d) for d in dirs])
    for row in rep["rows"]:
        run = load_run(os.path.join(common, row["run"]) if len(dirs) > 1 else dirs[0])
        ent_steps, ent = run.get("entropy")
        alpha = run.get("alpha")[1]
        last = ent[ent_steps > ent_steps[-1] - 1000] if ent.size else ent
        print(
            f"| {row['run']} | {_fmt(row['tracking_from_env_step'], 5)} | "
            f"{_fmt(row['tracking_rmse'], nan='–')} | "
            f"{_fmt(row['frac_5pct_below'], 2, '–')} | "
            f"{_fmt(float(np.mean(last)) if last.size else math.nan, nan='–')} | "
            f"×{row['max_alpha_change_x']:.4f} ({row['max_alpha_change']}) | "
            f"{_fmt(float(alpha[-1]) if alpha.size else math.nan)} | "
            f"{row['final_eval_return']:.1f} |"
        )
    fig = os.path.join(out_dir, "control_quality_sac.png")
    shutil.copy(os.path.join(rep["out_dir"], "overview.png"), fig)
    print(f"\nreport: {rep['out_dir']}; figure: {fig}")


def benchmark_discrete_sac(seeds, out_dir, jobs, steps=18000, only=None):
    """(d) discrete SAC on CartPole at SAC's usual target 0.98 log 2, no max_alpha."""
    from alf_entropy.experiments.report import load_run, write_report

    target = 0.98 * math.log(2)
    common = SAC_COMMON + [
        f"OffPolicyTrainer.num_env_steps = {steps}",
        "OffPolicyTrainer.summary_interval = 100",
    ]
    base = {
        "seeds": list(seeds),
        "seed_binding": "OffPolicyTrainer.seed",
        "gin_file": ["sac_cartpole.gin"],
    }
    sweeps = {
        "pid": dict(
            base,
            gin_param=common
            + [
                "SacAlgorithm.entropy_target_cls = @PIDEntropyTargetAlgorithm",
                f"PIDEntropyTargetAlgorithm.target_entropy = {target}",
                "PIDEntropyTargetAlgorithm.initial_alpha = 0.1",
            ],
        ),
        "sac_rule": dict(
            base,
            gin_param=common
            + [
                "SacAlgorithm.entropy_target_cls = @SGDEntropyTargetAlgorithm",
                f"SGDEntropyTargetAlgorithm.target_entropy = {target}",
                "SGDEntropyTargetAlgorithm.initial_alpha = 0.1",
            ],
        ),
        "staged": dict(
            base,
            gin_param=common
            + [
                f"EntropyTargetAlgorithm.target_entropy = {target}",
                "EntropyTargetAlgorithm.initial_alpha = 0.1",
            ],
        ),
    }
    if only:
        sweeps = {k: v for k, v in sweeps.items() if k in only}
    dirs = _run_sweeps(sweeps, os.path.join(out_dir, "dsac"), jobs)
    rep = write_report(dirs, os.path.join(out_dir, "dsac", "report"), dpi=60)
    print(
        f"\n(d) discrete SAC CartPole, target 0.98 log 2 = {target:.4f}, no max_alpha, "
        f"{steps} env steps, seeds {list(seeds)}\n"
    )
    print("| run | largest alpha | final alpha | unreachable-target flag | final eval return |")
    print("| --- | --- | --- | --- | --- |")
    common_dir = os.path.commonpath([os.path.abspath(d) for d in dirs])
    for row in rep["rows"]:
        run = load_run(os.path.join(common_dir, row["run"]))
        alpha = run.get("alpha")[1]
        flags = [v for tag, (_, v) in run.scalars.items() if tag.endswith("unreachable_target")]
        flagged = "yes" if flags and max(float(f.max()) for f in flags) > 0 else "no"
        print(
            f"| {row['run']} | {float(alpha.max()):.3g} | {float(alpha[-1]):.3g} | {flagged} | "
            f"{row['final_eval_return']:.1f} |"
        )


def benchmark_annealing(seeds, out_dir, jobs, steps=100000):
    """(d') discrete SAC from the same target with SettledAnnealing: solved within ``steps``?"""
    from alf_entropy.experiments.report import load_run

    target = 0.98 * math.log(2)
    sweeps = {
        "pid_annealed": {
            "seeds": list(seeds),
            "seed_binding": "OffPolicyTrainer.seed",
            "gin_file": ["sac_cartpole.gin"],
            "gin_param": SAC_COMMON
            + [
                f"OffPolicyTrainer.num_env_steps = {steps}",
                "OffPolicyTrainer.summary_interval = 1000",
                "SacAlgorithm.entropy_target_cls = @PIDEntropyTargetAlgorithm",
                "PIDEntropyTargetAlgorithm.target_entropy = @SettledAnnealing()",
                f"SettledAnnealing.initial = {target}",
                "SettledAnnealing.final = 0.2",
                "PIDEntropyTargetAlgorithm.initial_alpha = 0.1",
            ],
        }
    }
    dirs = _run_sweeps(sweeps, os.path.join(out_dir, "anneal"), jobs)
    print(
        f"\n(d') discrete SAC CartPole, SettledAnnealing from {target:.4f} (final 0.2), "
        f"up to {steps} env steps (stops at eval 475), seeds {list(seeds)}\n"
    )
    print("| run | env steps to eval >= 475 | last target | largest alpha |")
    print("| --- | --- | --- | --- |")
    for d in dirs:
        run = load_run(d)
        steps_, evals = run.get("eval/return_vs_env_steps")
        solved = [s for s, v in zip(steps_, evals) if v >= 475]
        target_now = run.get("target_entropy")[1]
        print(
            f"| {os.path.basename(d)} | {int(solved[0]) if solved else 'not solved'} | "
            f"{float(target_now[-1]):.3f} | {float(run.get('alpha')[1].max()):.3g} |"
        )


NOISY_TARGET, NOISY_ALPHA, NOISY_SLOPE = -1.0, 0.2, 0.5


def run_noisy_plant(make_ctrl, sigma, lag, alpha0, seed, updates=3000):
    """(f): the entropy -1 + 0.5 log(alpha / 0.2) (a 1-d squashed action: alpha 0.2 holds the
    target -1) after a first-order lag of ``lag`` updates, read with N(0, sigma^2) noise."""
    rng = np.random.default_rng(seed)
    ctrl = make_ctrl(alpha0)
    alpha = alpha0
    entropy = NOISY_TARGET + NOISY_SLOPE * math.log(alpha / NOISY_ALPHA)
    entropies, alphas = np.zeros(updates), np.zeros(updates)
    for i in range(updates):
        entropy += (NOISY_TARGET + NOISY_SLOPE * math.log(alpha / NOISY_ALPHA) - entropy) / lag
        alpha = float(ctrl.adjust_alpha(entropy + sigma * rng.standard_normal()))
        entropies[i], alphas[i] = entropy, alpha
    return entropies, alphas


def noisy_metrics(entropy, alpha, alpha0):
    """The goals of the SAC-cadence issue: 2nd-half median |d log alpha|, share within x1.5 of
    the equilibrium, entropy RMSE; first update in the 10 % band; overshoot on the way in."""
    late = np.log(alpha[alpha.size // 2 :])
    band = np.abs(entropy - NOISY_TARGET) <= 0.1 * abs(NOISY_TARGET)
    return {
        "dlog": float(np.median(np.abs(np.diff(late)))),
        "within": float(np.mean(np.abs(late - math.log(NOISY_ALPHA)) <= math.log(1.5))),
        "rmse": float(np.sqrt(np.mean((entropy[entropy.size // 2 :] - NOISY_TARGET) ** 2))),
        "band": int(np.argmax(band)) if band.any() else math.nan,
        "over": float(
            alpha.max() / NOISY_ALPHA if alpha0 < NOISY_ALPHA else NOISY_ALPHA / alpha.min()
        ),
    }


def benchmark_noisy(seeds):
    """(f) noisy plants at SAC's cadence: the PID against SAC's rule and the staged rule."""
    spec = BoundedTensorSpec((1,), torch.float32, -1.0, 1.0)
    ctrls = {
        "PID (defaults)": lambda a: PIDEntropyTargetAlgorithm(
            spec, target_entropy=NOISY_TARGET, initial_alpha=a
        ),
        "SAC rule, lr 3e-4": lambda a: SGDEntropyTargetAlgorithm(
            spec, target_entropy=NOISY_TARGET, initial_alpha=a
        ),
        "staged, SAC settings": lambda a: EntropyTargetAlgorithm(
            spec,
            target_entropy=NOISY_TARGET,
            initial_alpha=a,
            skip_free_stage=True,
            slow_update_rate=1.2e-3,
            fast_update_rate=1.2e-3,
        ),
    }
    print(
        f"\n(f) noisy plants at SAC's cadence, 3,000 updates, mean over seeds {list(seeds)} "
        "(band: the slowest seed; overshoot: the worst)\n"
    )
    print(
        "| controller | noise (nats) | lag (updates) | alpha0 | median abs d log alpha "
        "(2nd half) | within x1.5 of 0.2 | entropy RMSE (2nd half) | in the 10 % band at | "
        "overshoot |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, make in ctrls.items():
        for sigma in (0.05, 0.1, 0.3):
            for lag in (1, 20, 50):
                for alpha0 in (1.0, 1e-3):
                    ms = [
                        noisy_metrics(*run_noisy_plant(make, sigma, lag, alpha0, seed), alpha0)
                        for seed in seeds
                    ]
                    m = {k: float(np.mean([x[k] for x in ms])) for k in ("dlog", "within", "rmse")}
                    band = max(x["band"] for x in ms)
                    print(
                        f"| {name} | {sigma} | {lag} | {alpha0:g} | {m['dlog']:.4f} | "
                        f"{m['within']:.2f} | {m['rmse']:.3f} | {_fmt(band, 4)} | "
                        f"×{max(x['over'] for x in ms):.3g} |"
                    )


def sac_cadence_metrics(run, min_alpha=1e-4):
    """Alpha's step-to-step change (median |d log alpha|, 2nd half), the share of updates at
    the floor, the overshoot of its settled value (median of the last quarter) on the way in,
    the first env step in the 10 % band and the final evaluation return."""
    steps, alpha = run.get("alpha")
    ent_steps, entropy = run.get("entropy")
    target = run.get("target_entropy")[1]
    settled = float(np.median(alpha[-alpha.size // 4 :]))
    lo, hi = float(alpha.min()), float(alpha.max())
    over = hi / settled if alpha[0] < settled else settled / lo
    band = np.abs(entropy - target[: entropy.size]) <= 0.1 * np.abs(target[: entropy.size])
    return {
        "dlog": float(np.median(np.abs(np.diff(np.log(alpha[alpha.size // 2 :]))))),
        "floor": float(np.mean(alpha <= 1.05 * min_alpha)),
        "over": over,
        "band": float(ent_steps[np.argmax(band)]) if band.any() else math.nan,
        "ret": float(run.get("eval/return")[1][-1]),
        "settled": settled,
    }


def benchmark_sac_cadence(seeds, out_dir, jobs, steps=10000):
    """(g) SAC's cadence on real tasks: Pendulum (target -1) and discrete CartPole (SAC's
    0.98 log 2), the PID and SAC's own rule, from alpha 1 and 1e-3 (no max_alpha)."""
    from alf_entropy.experiments.report import load_run

    tasks = {
        "Pendulum": ("sac_pendulum.gin", -1.0),
        "CartPole (discrete)": ("sac_cartpole.gin", 0.98 * math.log(2)),
    }
    rules = {
        "PID (defaults)": "PIDEntropyTargetAlgorithm",
        "SAC rule, lr 3e-4": "SGDEntropyTargetAlgorithm",
    }
    common = SAC_COMMON + [
        f"OffPolicyTrainer.num_env_steps = {steps}",
        "OffPolicyTrainer.eval_interval = 1000",
    ]
    runs = {}
    for task, (gin, target) in tasks.items():
        for rule, cls in rules.items():
            for alpha0 in (1.0, 1e-3):
                spec = {
                    "seeds": list(seeds),
                    "seed_binding": "OffPolicyTrainer.seed",
                    "gin_file": [gin],
                    "gin_param": common
                    + [
                        f"SacAlgorithm.entropy_target_cls = @{cls}",
                        f"{cls}.target_entropy = {target}",
                        f"{cls}.initial_alpha = {alpha0}",
                    ],
                }
                name = f"{gin[:-4]}_{cls[:3].lower()}_{alpha0:g}"
                runs[(task, rule, alpha0)] = _run_sweeps(
                    {name: spec}, os.path.join(out_dir, "sac_cadence"), jobs
                )
    print(
        f"\n(g) SAC's cadence, {steps} env steps, one update per step, mean over seeds "
        f"{list(seeds)} (overshoot: the worst seed)\n"
    )
    print(
        "| task | controller | alpha0 | median abs d log alpha (2nd half) | updates at the "
        "floor | overshoot of settled alpha | settled alpha | in the 10 % band at (env step) "
        "| final eval return |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, dirs in runs.items():
        ms = [sac_cadence_metrics(load_run(d)) for d in dirs]
        m = {k: float(np.mean([x[k] for x in ms])) for k in ("dlog", "floor", "settled")}
        rets, bands = [x["ret"] for x in ms], [x["band"] for x in ms]
        band = max(bands)  # the slowest seed (nan if one never got there)
        print(
            f"| {key[0]} | {key[1]} | {key[2]:g} | {m['dlog']:.4f} | {m['floor']:.2f} | "
            f"×{max(x['over'] for x in ms):.3g} | {m['settled']:.3g} | {_fmt(band, 5)} | "
            f"{np.mean(rets):.1f} ({min(rets):.1f}..{max(rets):.1f}) |"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out_dir", default="control_quality_out")
    parser.add_argument("--ppo", action="store_true", help="also run (b), PPO CartPole")
    parser.add_argument("--sac", action="store_true", help="also run (c), SAC Pendulum")
    parser.add_argument("--sac_steps", type=int, default=10000, help="(c): env steps per run")
    parser.add_argument(
        "--sac_only",
        nargs="+",
        default=None,
        help="(c): only these sweeps (pid, staged, sac_rule, fixed)",
    )
    parser.add_argument("--dsac", action="store_true", help="also run (d), discrete SAC CartPole")
    parser.add_argument(
        "--dsac_only", nargs="+", default=None, help="(d): only these (pid, sac_rule, staged)"
    )
    parser.add_argument(
        "--main_job", action="store_true", help="also run (e), the main job as shipped"
    )
    parser.add_argument(
        "--anneal", action="store_true", help="also run (d'), discrete SAC annealed"
    )
    parser.add_argument("--no_synthetic", action="store_true", help="skip (a)")
    parser.add_argument("--noisy", action="store_true", help="also run (f), noisy plants")
    parser.add_argument(
        "--sac_cadence",
        action="store_true",
        help="also run (g), SAC's cadence on Pendulum and discrete CartPole",
    )
    parser.add_argument("--jobs", type=int, default=2, help="parallel PPO runs")
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="(a): only controllers whose name contains one of these",
    )
    parser.add_argument(
        "--ppo_only",
        nargs="+",
        default=None,
        help="(b): only these sweeps (pid, staged, staged_alf, sac_rule, fixed)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out_dir, exist_ok=True)
    if not args.no_synthetic:
        benchmark_synthetic(args.seeds, args.out_dir, args.only)
    if args.ppo:
        benchmark_ppo(args.seeds, args.out_dir, args.jobs, args.ppo_only)
    if args.sac:
        benchmark_sac(args.seeds, args.out_dir, args.jobs, args.sac_steps, args.sac_only)
    if args.dsac:
        benchmark_discrete_sac(args.seeds, args.out_dir, args.jobs, only=args.dsac_only)
    if args.main_job:
        benchmark_main_job(args.seeds, args.out_dir, args.jobs)
    if args.anneal:
        benchmark_annealing(args.seeds, args.out_dir, args.jobs)
    if args.noisy:
        benchmark_noisy(args.seeds)
    if args.sac_cadence:
        benchmark_sac_cadence(args.seeds, args.out_dir, args.jobs)


if __name__ == "__main__":
    main()
