"""LLM entropy control: TRL's GRPOTrainer on a tiny LM, and a probe at real vocabulary sizes.

Usage::

    python benchmarks/llm_entropy_control.py --controllers trl_0.005 trl_0.05 lm --jobs 16
    python benchmarks/llm_entropy_control.py --tasks toy --seeds 0 --toy_lrs 0.01

The toy task (``alf_entropy.integrations.toy_lm``, needs the ``trl`` extra): TRL
1.16's ``GRPOTrainer``, unmodified, trains a random-weight 2-layer GPT-2 with a
character tokenizer on a verifiable toy reward (``--toy_task letter``: the
prompt's first letter, 39 tokens, at most ln 39 = 3.66 nats; ``vowel``: a
second task, vowels rewarded, 28 tokens in another order); ``--toy_batch``
completions of 8 tokens per step (32: each of the 8 prompts 4 times, so the
step's prompt mix adds no noise; ``--toy_shuffled`` draws them), Adam at ``--toy_lrs``,
``--toy_steps`` steps.  Without a bonus the entropy collapses.  The package's
controllers go in through ``add_entropy_control``; TRL's rule is TRL's own
code.  Targets: ``--toy_target`` and a linear schedule from ``1.1 x`` to it
(the Entrocraft shape).

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
next step, as the TRL callback does; the same on both tasks):

* ``none``: coefficient 0;
* ``trl_0.005`` / ``trl_0.05``: TRL 1.16's adaptive rule (``coef += delta``
  if ``H <= target`` else ``-= delta``, clipped to ``[0, 1]``; the bonus is
  applied only while the last entropy was at or below the target);
* ``lm``: ``lm_controller(spec, target)``, the LLM default (a PID of the
  coefficient itself, clamped at 0); ``lm:ki=0.05`` changes its settings;
* ``pid``: ``PIDEntropyTargetAlgorithm(spec, target_entropy=target)`` (defaults);
  ``pid:kp=12,kd=5`` is that with those settings changed (with two
  or more such rows, a second table gives each seed's lowest RMSE among
  them: what the best of those settings, chosen per seed after the run,
  would reach);
* ``staged``: ``EntropyTargetAlgorithm(spec, target_entropy=target)`` (defaults).

Probe targets: a constant (``--target``) and a linear schedule from ``1.5 x``
to it over the run.  Metrics
(``alf_entropy.experiments.control_metrics``): tracking RMSE from the first step
the entropy is within 5 % above the target (or below it), relative RMSE
(RMSE over the mean target), the largest overshoot above the target after
that point (as a ratio, max H / target), the fraction of those steps more
than 10 % below the target, the floor (``minimum_variance_floor``: the RMS
error no controller could remove, its action first showing in the entropy
two steps later, estimated from the run itself), how many seeds reached the
target, the mean reward of the last 20 % of steps, the seconds per step (the
median over steps; on the toy task TRL's ``step_time``) and the controller's
seconds per update over the step's (on the toy task the callback's whole
``on_step_end``).  Means over seeds (with the seeds' range of the RMSE and
the worst seed's overshoot) are printed as Markdown, stamped with date,
commit, versions and machine.
"""

import argparse
import contextlib
import math
import multiprocessing
import os
import sys
import tempfile
import time
from typing import Dict, List

import numpy as np
import torch
from stamp import stamp

from alf_entropy import BoundedTensorSpec, EntropyTargetAlgorithm, PIDEntropyTargetAlgorithm
from alf_entropy.experiments import control_metrics
from alf_entropy.integrations.llm import lm_controller
from alf_entropy.utils import schedulers
from alf_entropy.utils.schedulers import LinearScheduler

CONTROLLERS = ("none", "trl_0.005", "trl_0.05", "lm", "pid", "staged")
PID_SETTINGS = (
    "initial_alpha",
    *PIDEntropyTargetAlgorithm(
        BoundedTensorSpec((), torch.int64, 0, 1), target_entropy=0.5
    ).settings,
)
"""What ``pid:name=value`` may change: the PID's constructor settings."""
LM_NAMES = ("initial_alpha", *lm_controller(2, 0.5).settings)
"""What ``lm:name=value`` may change: the linear PID's constructor settings."""


class TRLRule:
    """TRL 1.16's adaptive entropy rule (``GRPOTrainer._compute_loss``), on floats."""

    def __init__(self, delta: float, target, coef: float = 0.0, lo: float = 0.0, hi: float = 1.0):
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


def pid_changes(kind: str) -> Dict[str, float]:
    """The settings ``pid:kp=12,kd=5`` (or ``lm:kd=1``) changes (``{}`` for ``pid``)."""
    changes = kind.partition(":")[2]
    return {k: float(v) for k, v in (item.split("=") for item in changes.split(",") if item)}


def controller_kind(text: str) -> str:
    """``argparse`` type of ``--controllers``: a name of ``CONTROLLERS`` or ``pid:k=v,...``."""
    name, _, changes = text.partition(":")
    try:
        names = {"pid": PID_SETTINGS, "lm": LM_NAMES}.get(name, ())
        valid = name in CONTROLLERS and pid_changes(text).keys() <= set(names)
    except ValueError:
        valid = False
    if not valid:
        raise argparse.ArgumentTypeError(
            f"{text!r}: one of {CONTROLLERS}, or pid:name=value,... (lm:name=value,...) with "
            f"names of PIDEntropyTargetAlgorithm's (LinearPIDEntropyTargetAlgorithm's) "
            f"settings, e.g. pid:kp=12,kd=5"
        )
    return text


def make_controller(kind: str, spec: BoundedTensorSpec, target):
    """The package's controller for ``kind`` (``None`` for ``none`` and TRL's rule)."""
    if kind.partition(":")[0] == "pid":
        return PIDEntropyTargetAlgorithm(spec, target_entropy=target, **pid_changes(kind))
    if kind.partition(":")[0] == "lm":
        return lm_controller(spec, target, **pid_changes(kind))
    if kind == "staged":
        return EntropyTargetAlgorithm(spec, target_entropy=target)
    return None


def make_target(value: float, start: float, steps: int, scheduled: bool):
    """A constant target, or a linear schedule from ``start`` to ``value`` over ``steps``."""
    if scheduled:
        return LinearScheduler("iterations", [(0, start), (steps, value)])
    return lambda: value


def summarize(entropies, targets, rewards, step_s, ctl_s) -> Dict[str, float]:
    """The table's metrics of one run (NaN where the target was never reached)."""
    e, t = np.asarray(entropies, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    start = control_metrics.warmup_end(e, t)
    reached = start < len(e)
    nan = math.nan
    rmse = control_metrics.tracking_rmse(e, t, start) if reached else nan
    return {
        "rmse": rmse,
        "rel_rmse": rmse / float(np.mean(t[start:])) if reached else nan,
        "overshoot": float(np.max(e[start:] / t[start:])) if reached else nan,
        "below10": control_metrics.fraction_below(e, t, 0.10, start) if reached else nan,
        "floor": control_metrics.minimum_variance_floor(e, t, start) if reached else nan,
        # the readings' noise: second differences of white noise have 6x its variance
        "noise": float(np.sqrt(np.mean(np.diff(e[start:], 2) ** 2) / 6)) if reached else nan,
        "reached": float(reached),
        "reward": float(np.mean(rewards[int(0.8 * len(e)) :])),
        "final_h": float(np.mean(e[-20:])),
        "step_s": float(np.median(step_s)),
        "ctl_s": float(np.median(ctl_s)),
    }


def run_probe(
    kind: str,
    vocab: int,
    lr: float,
    seed: int,
    steps: int,
    target_value: float,
    scheduled: bool,
    positions: int,
    group: int,
    logit_std: float,
) -> Dict[str, float]:
    """One synthetic-probe run; returns its metrics."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.nn.Parameter(torch.randn(positions, vocab, generator=gen) * logit_std)
    best = logits.detach().argmax(-1)
    opt = torch.optim.Adam([logits], lr=lr)
    target = make_target(target_value, 1.5 * target_value, steps, scheduled)
    controller = make_controller(kind, BoundedTensorSpec((), torch.int64, 0, vocab - 1), target)
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
    return summarize(entropies, targets, rewards, step_s, ctl_s)


def run_toy(
    kind: str,
    lr: float,
    seed: int,
    steps: int,
    target_value: float,
    scheduled: bool,
    batch: int,
    out_dir: str,
    task: str = "letter",
    shuffled: bool = False,
) -> Dict[str, float]:
    """One GRPO run of TRL's ``GRPOTrainer`` on the toy task; returns its metrics.

    The package's controllers go in through ``add_entropy_control``; TRL's own
    rule is TRL's code (a callback moves ``args.entropy_target`` along a
    schedule).  The controller's cost is the time of the callback's
    ``on_step_end``; a step's is TRL's ``step_time``.  The prompts come in the dataset's
    order, so each step of 32 completions holds each of the 8 prompts once; ``shuffled``
    draws them at random (TRL's ``shuffle_dataset``).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from alf_entropy.integrations.toy_lm import (
        LETTERS,
        char_tokenizer,
        tiny_causal_lm,
        toy_dataset,
        toy_reward,
        vowel_reward,
    )
    from alf_entropy.integrations.trl import add_entropy_control, grpo_config_kwargs

    transformers.logging.set_verbosity_error()
    tokenizer = char_tokenizer() if task == "letter" else char_tokenizer(LETTERS)
    target = make_target(target_value, 1.1 * target_value, steps, scheduled)
    controller = make_controller(
        kind, BoundedTensorSpec((), torch.int64, 0, len(tokenizer) - 1), target
    )
    if controller is not None:
        extra = grpo_config_kwargs(controller)
    elif kind.startswith("trl"):
        extra = dict(
            use_adaptive_entropy=True,
            entropy_coef_delta=float(kind.split("_")[1]),
            entropy_target=float(target()),
            entropy_coef=0.0,
        )
    else:
        extra = {}
    config = GRPOConfig(
        output_dir=out_dir,
        max_steps=steps,
        learning_rate=lr,
        lr_scheduler_type="constant",
        per_device_train_batch_size=batch,
        num_generations=4,
        max_completion_length=8,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=seed,
        data_seed=seed,
        disable_tqdm=True,
        shuffle_dataset=shuffled,
        **extra,
    )
    trainer = GRPOTrainer(
        model=tiny_causal_lm(seed, len(tokenizer)),
        reward_funcs=toy_reward if task == "letter" else vowel_reward,
        args=config,
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)
    targets, ctl_s = [], []

    class Progress(TrainerCallback):
        """Feeds the step to the schedulers; moves TRL's target along the schedule."""

        def on_step_begin(self, args, state, control, **kwargs):
            schedulers.update_progress("iterations", state.global_step)
            targets.append(float(target()))
            if kind.startswith("trl"):
                args.entropy_target = targets[-1]

    trainer.add_callback(Progress())
    if controller is not None:
        callback = add_entropy_control(trainer, controller)
        step_end = callback.on_step_end

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            step_end(*args, **kwargs)
            ctl_s.append(time.perf_counter() - t0)

        callback.on_step_end = timed
    trainer.train()
    logs = [log for log in trainer.state.log_history if "entropy" in log]
    return summarize(
        [log["entropy"] for log in logs],
        targets[: len(logs)],
        [log["reward"] for log in logs],
        [log["step_time"] for log in logs],
        ctl_s or [0.0],
    )


HEADER = (
    "| task | target | lr | controller | RMSE [seeds' range] | noise | RMSE / mean target "
    "| max H / target (worst seed) | steps >10% below | floor | reached | reward | final H "
    "| s / step | controller s / step s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def row(task: str, target: str, lr: float, kind: str, rows: List[Dict[str, float]]) -> str:
    """A table row: the means over seeds (of the seeds that reached the target), with the
    seeds' range of the RMSE and the worst seed's overshoot."""

    def values(key):
        return [r[key] for r in rows if not math.isnan(r[key])]

    def mean(key):
        kept = values(key)
        return float(np.mean(kept)) if kept else math.nan

    rmse = values("rmse")
    spread = f" [{min(rmse):.2f}, {max(rmse):.2f}]" if rmse else ""
    worst = f" ({max(values('overshoot')):.2f})" if rmse else ""
    return (
        f"| {task} | {target} | {lr:g} | {kind} | {mean('rmse'):.3f}{spread} | "
        f"{mean('noise'):.3f} | "
        f"{mean('rel_rmse'):.1%} | {mean('overshoot'):.2f}{worst} | {mean('below10'):.1%} | "
        f"{mean('floor'):.3f} | "
        f"{sum(r['reached'] for r in rows):.0f}/{len(rows)} | {mean('reward'):.2f} | "
        f"{mean('final_h'):.3f} | {mean('step_s'):.3g} | "
        f"{mean('ctl_s') / mean('step_s'):.2%} |"
    )


def _call(run: tuple) -> Dict[str, float]:
    """``fn(*args)`` for a run ``(fn, *args)`` (a pool's worker takes one argument)."""
    return run[0](*run[1:])


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["toy", "probe"], choices=["toy", "probe"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--controllers", nargs="+", default=list(CONTROLLERS), type=controller_kind)
    parser.add_argument("--no_schedule", action="store_true")
    parser.add_argument("--toy_lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    parser.add_argument("--toy_steps", type=int, default=300)
    parser.add_argument("--toy_target", type=float, default=3.0)
    parser.add_argument(
        "--toy_task",
        default="letter",
        choices=["letter", "vowel"],
        help="the reward: the prompt's first letter (39 tokens), or vowels (a "
        "second task: 28 tokens, another order)",
    )
    parser.add_argument(
        "--toy_batch",
        type=int,
        default=32,
        help="completions per step (4 per prompt: 32 is 8 prompts)",
    )
    parser.add_argument(
        "--toy_shuffled",
        action="store_true",
        help="draw each step's prompts "
        "at random (the toy before 2026-12-04): the prompt mix adds noise",
    )
    parser.add_argument("--vocab", type=int, nargs="+", default=[32_000, 150_000])
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.03, 0.1, 0.3])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--target", type=float, default=1.0)
    parser.add_argument("--positions", type=int, default=8)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--logit_std", type=float, default=4.0)
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at a time, each in its own "
        "process of one torch thread (the rows are the same as with 1)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    torch.set_num_threads(1)
    schedules = [False] if args.no_schedule else [False, True]
    print(
        f"LLM entropy control ({stamp(['trl', 'transformers'])}); seeds {args.seeds}"
        f"{f', {args.jobs} processes' if args.jobs > 1 else ''}\n"
    )
    print(HEADER)
    pids = [kind for kind in args.controllers if kind.partition(":")[0] in ("pid", "lm")]
    best = []  # per (task, target, lr): each seed's lowest RMSE among the PID rows
    cells = []  # (task, target's name, lr, [(fn, kind, *args) per controller and seed])

    def add_cell(task, name, lr, fn, seed_args):
        cells.append(
            (
                task,
                name,
                lr,
                [(fn, kind, *seed_args(s)) for kind in args.controllers for s in args.seeds],
            )
        )

    with tempfile.TemporaryDirectory() as out_dir:
        if "toy" in args.tasks:
            for scheduled in schedules:
                t = args.toy_target
                name = f"{1.1 * t:g} -> {t:g}" if scheduled else f"{t:g}"
                for lr in args.toy_lrs:
                    add_cell(
                        f"tiny GPT-2, {args.toy_task}",
                        name,
                        lr,
                        run_toy,
                        lambda s: (
                            lr,
                            s,
                            args.toy_steps,
                            t,
                            scheduled,
                            args.toy_batch,
                            out_dir,
                            args.toy_task,
                            args.toy_shuffled,
                        ),
                    )
        if "probe" in args.tasks:
            for vocab in args.vocab:
                for scheduled in schedules:
                    t = args.target
                    name = f"{1.5 * t:g} -> {t:g}" if scheduled else f"{t:g}"
                    for lr in args.lrs:
                        add_cell(
                            f"probe V={vocab}",
                            name,
                            lr,
                            run_probe,
                            lambda s: (
                                vocab,
                                lr,
                                s,
                                args.steps,
                                t,
                                scheduled,
                                args.positions,
                                args.group,
                                args.logit_std,
                            ),
                        )
        with (
            multiprocessing.get_context("spawn").Pool(args.jobs, torch.set_num_threads, (1,))
            if args.jobs > 1
            else contextlib.nullcontext()
        ) as pool:
            # in order, as they complete: each cell's rows print once its runs are in
            results = (pool.imap if pool else map)(_call, [r for *_, runs in cells for r in runs])
            for task, name, lr, runs in cells:
                done = [next(results) for _ in runs]
                by_kind = {
                    k: done[i * len(args.seeds) : (i + 1) * len(args.seeds)]
                    for i, k in enumerate(args.controllers)
                }
                for kind, rows in by_kind.items():
                    print(row(task, name, lr, kind, rows), flush=True)
                if len(pids) > 1:
                    per_seed = zip(*([r["rmse"] for r in by_kind[k]] for k in pids))
                    lowest = [
                        min(v for v in rmses if not math.isnan(v))
                        for rmses in per_seed
                        if not all(math.isnan(v) for v in rmses)
                    ]
                    spread = f" [{min(lowest):.2f}, {max(lowest):.2f}]" if lowest else ""
                    best.append(
                        f"| {task} | {name} | {lr:g} | "
                        f"{float(np.mean(lowest)) if lowest else math.nan:.3f}{spread} | "
                        f"{len(lowest)}/{len(args.seeds)} |"
                    )
    if best:
        print(f"\nEach seed's lowest RMSE among {', '.join(pids)} (chosen after the run):\n")
        print("| task | target | lr | RMSE [seeds' range] | reached |\n|---|---|---|---|---|")
        print("\n".join(best))


if __name__ == "__main__":
    main(sys.argv[1:])
