"""verl entropy control: verl 0.9.1's v1 trainer classes on a tiny random LM, on the CPU.

Usage::

    python benchmarks/verl_entropy_control.py --jobs 2
    python benchmarks/verl_entropy_control.py --seeds 0 --lrs 0.01 --controllers none lm
    python benchmarks/verl_entropy_control.py --controllers lm lm:kd=8

Needs the ``verl`` extra (``pip install -e ".[verl]"``).  verl's rollout servers (vLLM,
SGLang) and worker group need GPUs and a Ray cluster; here one process stands in for them
(``ToyActorGroup``), and everything a step of verl's sync trainer computes on the actor's
side is verl's code: its config (``ppo_trainer.yaml``, GRPO), its trainer classes'
``_update_actor`` (``PPOTrainerSync``, or ``EntropyControlTrainer`` with the controller), the
entropy it measures (``agg_loss`` of ``entropy_from_logits``, token-mean, as
``_compute_old_log_prob``), its GRPO advantage, its mini-batch iterator and micro-batching
(4 micro-batches of 8 sequences), ``ppo_loss`` (verl's own with a fixed coefficient, or
``controlled_ppo_loss``), AdamW with its weight decay and gradient clip.

The toy: a random-weight 2-layer GPT-2 with a vocabulary of 64 (``tiny_causal_lm``, no
download, no dropout), 8 prompts of 2 tokens, 4 completions of 8 tokens each per step,
sampled at temperature 1; the reward is the fraction of a completion's tokens equal to its
prompt's first token.  Without a bonus the entropy collapses.  Target ``--target`` nats per
token (at most ln 64 = 4.16).

Controllers: ``none`` (verl's default, coefficient 0); ``fixed_0.001`` / ``fixed_0.01``
(``actor.entropy_coeff`` in the config, verl's own loss); ``delta_0.005`` / ``delta_0.05``
(the ±Δ rule of verl PR #1234, Skywork-OR1's: the coefficient moves by Δ towards more bonus
while the step's entropy is at or below the target, by -Δ above, clipped to [0, 1], and
is applied only at or below the target); ``lm`` (``EntropyControlTrainer`` with
``lm_controller(64, target)``, this package's default); ``lm:kd=8,ki=0.1`` is ``lm`` with
those of its ``LM_SETTINGS`` changed (as in ``llm_entropy_control.py``).

Metrics (``benchmarks/llm_entropy_control.py``'s, over the seeds): tracking RMSE from the
first step the entropy is within 5 % above the target (``reached``: how many seeds got
there), the same over the last half of the run for every row (``RMSE, 2nd half``), the
shares of the tracking squared error above the target (``error above``) and above it after
10 updates without a bonus (``above, held at 0``: a bonus only raises the entropy, so there
no controller of the bonus can do more), the mean entropy of the last 20 steps, seconds per
step and the trainer's ``_update_actor`` without the worker group's update (for ``lm`` the
controller's whole cost) over the step's. A second table gives the goals: the default's
RMSE over the better of the fixed coefficients' and the ±Δ rule's, its mean entropy of the
last half over the target, and the RMSE ratio without the steps held at 0.
"""

import argparse
import contextlib
import math
import multiprocessing
import os
import sys
import time
from functools import partial
from typing import Dict, List
from unittest import mock

import numpy as np
import torch
from llm_entropy_control import LM_NAMES, TRLRule, pid_changes, summarize
from llm_entropy_control import controller_kind as llm_controller_kind
from stamp import stamp

from alf_entropy.experiments import control_metrics
from alf_entropy.integrations.llm import LM_SETTINGS

CONTROLLERS = ("none", "fixed_0.001", "fixed_0.01", "delta_0.005", "delta_0.05", "lm")
PROMPTS, GROUP, LENGTH, VOCAB = 8, 4, 8, 64
HELD = 10  # updates without a bonus after which an entropy above the target is not the bonus's


class ToyActorGroup:
    """Stands in for verl's actor worker group: trains the model as ``TrainingWorker`` does."""

    def __init__(self, model, config, lr):
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.utils.losses import ppo_loss

        actor = config.actor_rollout_ref.actor
        self.model, self.grad_clip, self.data, self.update_s = model, actor.grad_clip, None, 0.0
        self.coeffs = []  # the coefficient each update applied
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=lr,
            betas=tuple(actor.optim.betas),
            weight_decay=actor.optim.weight_decay,
        )
        # what verl's worker builds (EntropyControlTrainer swaps it in on_init_end)
        self.loss_fn = partial(ppo_loss, config=omega_conf_to_dataclass(actor))

    def set_loss_fn(self, loss_fn):
        self.loss_fn = loss_fn

    def update_actor(self, batch):
        """``train_mini_batch``: the batch's metadata onto the data, verl's iterator and
        micro-batching, the loss on each micro-batch, one optimizer step."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.engine.utils import prepare_micro_batches

        from alf_entropy.integrations.verl import COEFF_KEY

        fixed = self.loss_fn.keywords["config"].entropy_coeff
        self.coeffs.append(float(batch.extra_info.get(COEFF_KEY, fixed)))
        t0 = time.perf_counter()
        data = self.data.clone()
        for key, value in batch.extra_info.items():  # as verl's TransferQueue bridge does
            tu.assign_non_tensor_data(data, key, value)
        tu.assign_non_tensor(
            data,
            dp_size=1,
            batch_num_tokens=int(data["response_mask"].sum()),
            micro_batch_size_per_gpu=PROMPTS,
            use_dynamic_bsz=False,
        )
        iterator = [
            tu.pop(data, key) for key in ("mini_batch_size", "epochs", "seed", "dataloader_kwargs")
        ]
        for mini in tu.make_iterator(data, *iterator):
            for micro in prepare_micro_batches(mini)[0]:
                loss, _ = self.loss_fn(model_output=model_output(self.model, micro), data=micro)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad()
        self.update_s = time.perf_counter() - t0
        return {"metrics": {"mfu": [0.0]}}


def model_output(model, data):
    """Log-probs and entropies of the sequences' tokens, unpadded (verl's engine's layout)."""
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    ids = torch.cat([data["prompts"], data["responses"]], 1)
    logits = model(input_ids=ids, attention_mask=data["attention_mask"]).logits
    next_ids = torch.cat([ids[:, 1:], ids[:, :1]], 1)
    return {
        "log_probs": logprobs_from_logits(logits, next_ids).reshape(-1),
        "entropy": entropy_from_logits(logits).reshape(-1),
    }


def verl_config(kind: str, target: float):
    """verl's ``ppo_trainer.yaml`` for GRPO with ``kind``'s coefficient settings."""
    import verl.trainer
    from hydra import compose, initialize_config_dir

    coeff = float(kind.split("_")[1]) if kind.startswith("fixed") else 0.0
    overrides = [
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.rollout.n={GROUP}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={PROMPTS}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={PROMPTS}",
        f"actor_rollout_ref.actor.entropy_coeff={coeff}",
        f"actor_rollout_ref.actor.calculate_entropy={kind != 'none'}",
        "trainer.resume_mode=disable",
    ]
    if kind.startswith("lm"):
        overrides += [
            "trainer.v1.trainer_mode=entropy_control",
            f"+entropy_control.target={target}",
        ]
    config_dir = os.path.join(os.path.dirname(verl.trainer.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def make_trainer(kind: str, group: ToyActorGroup, config, steps: int, target: float):
    """verl's trainer for ``kind``, as its ``init()`` leaves it (the Ray part stood in for)."""
    from types import SimpleNamespace

    from verl.trainer.ppo.v1 import PPOTrainerSync

    from alf_entropy.integrations import verl as alf_verl

    if kind.startswith("lm"):
        trainer = alf_verl.EntropyControlTrainer(config)
    elif kind.startswith("delta"):
        rule = TRLRule(float(kind.split("_")[1]), lambda: target)

        class DeltaRuleTrainer(PPOTrainerSync):
            """PR #1234's rule, its coefficient carried to the loss as the controller's is."""

            def on_init_end(self):
                config = group.loss_fn.keywords["config"]
                group.set_loss_fn(partial(alf_verl.controlled_ppo_loss, config=config))

            def _update_actor(self, batch, metrics):
                rule.update(metrics["actor/entropy"])
                batch.extra_info[alf_verl.COEFF_KEY] = rule.applied()
                return super()._update_actor(batch, metrics)

        trainer = DeltaRuleTrainer(config)
    else:
        trainer = PPOTrainerSync(config)
    trainer.actor_rollout_wg, trainer.tokenizer = group, range(VOCAB)
    trainer.total_training_steps, trainer.global_steps = steps, 0
    trainer.checkpoint_manager = SimpleNamespace(update_weights=lambda step: None)
    trainer._load_checkpoint()  # the end of verl's _setup, then what init() does after it
    trainer.on_init_end()
    return trainer


def rollout(model, prompts, gen):
    """``GROUP`` completions of ``LENGTH`` tokens per prompt at temperature 1 (no cache)."""
    ids = prompts.repeat_interleave(GROUP, 0)
    with torch.no_grad():
        for _ in range(LENGTH):
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
            probs = torch.softmax(logits[:, -1], -1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)], 1)
    return ids[:, :2], ids[:, 2:]


def run(kind: str, lr: float, seed: int, steps: int, target: float) -> Dict[str, float]:
    """One run of ``steps`` steps; returns ``summarize``'s metrics and ``h2`` (the entropy
    over the last half)."""
    from tensordict import TensorDict
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.core_algos import agg_loss, compute_grpo_outcome_advantage

    from alf_entropy.integrations import verl as alf_verl
    from alf_entropy.integrations.toy_lm import tiny_causal_lm

    alf_verl.register()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = tiny_causal_lm(seed, vocab_size=VOCAB).eval()  # no dropout
    config = verl_config(kind, target)
    group = ToyActorGroup(model, config, lr)
    trainer = make_trainer(kind, group, config, steps, target)
    prompts = torch.randint(2, VOCAB, (PROMPTS, 2), generator=gen)
    entropies, rewards, step_s, hook_s = [], [], [], []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        prompt_ids, responses = rollout(model, prompts, gen)
        mask = torch.ones_like(responses)
        ones = torch.ones(len(responses), 2 + LENGTH, dtype=torch.long)
        data = TensorDict(
            {
                "prompts": prompt_ids,
                "responses": responses,
                "response_mask": mask,
                "attention_mask": ones,
            },
            batch_size=[len(responses)],
        )
        with torch.no_grad():
            out = model_output(model, data)
        width = 2 + LENGTH
        data["old_log_probs"] = out["log_probs"].reshape(-1, width)[:, 1:-1]
        entropy = out["entropy"].reshape(-1, width)[:, 1:-1]
        metrics = {"actor/entropy": agg_loss(entropy, mask, "token-mean").item()}
        reward = (responses == prompt_ids[:, :1]).float().mean(1)
        scores = torch.zeros_like(responses, dtype=torch.float32)
        scores[:, -1] = reward
        data["advantages"], _ = compute_grpo_outcome_advantage(
            scores, mask, np.arange(len(responses)) // GROUP
        )
        group.data = data
        trainer.global_steps = step
        t1 = time.perf_counter()
        trainer._update_actor(KVBatchMeta(partition_id="train"), metrics)
        hook_s.append(time.perf_counter() - t1 - group.update_s)
        step_s.append(time.perf_counter() - t0)
        entropies.append(metrics["actor/entropy"])
        rewards.append(float(reward.mean()))
    result = summarize(entropies, [target] * steps, rewards, step_s, hook_s)
    late = np.asarray(entropies[steps // 2 :])
    result["rmse2"] = float(np.sqrt(np.mean((late - target) ** 2)))
    result["mean2"] = float(np.mean(late))
    result.update(error_shares(entropies, group.coeffs, target))
    return result


def error_shares(entropies, coeffs, target, held=HELD) -> Dict[str, float]:
    """Of the tracking squared error: the share above the target (``above``), and the share
    above it after ``held`` updates without any bonus (``at0``: a bonus can only raise the
    entropy, so there the controller was already doing the most it could)."""
    e, c = np.asarray(entropies) - target, np.asarray(coeffs)
    start = control_metrics.warmup_end(entropies, target)
    if start == len(e):
        return {"above": math.nan, "at0": math.nan, "rmse_acting": math.nan}
    idle = np.array([t >= held and not c[t - held : t].any() for t in range(start, len(e))])
    sq = e[start:] ** 2
    up = e[start:] > 0
    at0 = up & idle
    return {
        "above": float(sq[up].sum() / sq.sum()),
        "at0": float(sq[at0].sum() / sq.sum()),
        # the tracking RMSE without those steps' error
        "rmse_acting": float(np.sqrt(sq[~at0].sum() / len(sq))),
    }


HEADER = (
    "| lr | controller | RMSE [seeds' range] | reached | RMSE, 2nd half [seeds' range] "
    "| noise | floor | error above | above, held at 0 | mean H, 2nd half | final H | reward "
    "| s / step | hook s / step s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def mean(rows, key):
    kept = [r[key] for r in rows if not math.isnan(r[key])]
    return float(np.mean(kept)) if kept else math.nan


def spread(rows, key):
    kept = [r[key] for r in rows if not math.isnan(r[key])]
    return f"{mean(rows, key):.3f} [{min(kept):.2f}, {max(kept):.2f}]" if kept else "nan"


def row(lr: float, kind: str, rows: List[Dict[str, float]]) -> str:
    return (
        f"| {lr:g} | {kind} | {spread(rows, 'rmse')} | "
        f"{sum(r['reached'] for r in rows):.0f}/{len(rows)} | {spread(rows, 'rmse2')} | "
        f"{mean(rows, 'noise'):.3f} | {mean(rows, 'floor'):.3f} | "
        f"{mean(rows, 'above'):.0%} | {mean(rows, 'at0'):.0%} | "
        f"{mean(rows, 'mean2'):.3f} | {mean(rows, 'final_h'):.3f} | "
        f"{mean(rows, 'reward'):.2f} | {mean(rows, 'step_s'):.3g} | "
        f"{mean(rows, 'ctl_s') / mean(rows, 'step_s'):.2%} |"
    )


def _call(args: tuple) -> Dict[str, float]:
    with mock.patch.dict(LM_SETTINGS, pid_changes(args[0])):  # lm:name=value,...
        return run(*args)


def controller_kind(text: str) -> str:
    """``argparse`` type of ``--controllers``: a name of ``CONTROLLERS`` or ``lm:k=v,...``."""
    with contextlib.suppress(argparse.ArgumentTypeError):
        if text in CONTROLLERS or llm_controller_kind(text).startswith("lm:"):
            return text
    raise argparse.ArgumentTypeError(
        f"{text!r}: one of {CONTROLLERS}, or lm:name=value,... with names of {LM_NAMES}"
    )


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--controllers", nargs="+", default=list(CONTROLLERS), type=controller_kind)
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-3, 1e-2])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--target", type=float, default=2.5)
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
    print(
        f"verl entropy control ({stamp(['verl', 'transformers'])}); seeds {args.seeds}, "
        f"{args.steps} steps, target {args.target}\n"
    )
    print(HEADER)
    runs = [
        (k, lr, s, args.steps, args.target)
        for lr in args.lrs
        for k in args.controllers
        for s in args.seeds
    ]
    with (
        multiprocessing.get_context("spawn").Pool(args.jobs, torch.set_num_threads, (1,))
        if args.jobs > 1
        else contextlib.nullcontext()
    ) as pool:
        results = iter((pool.imap if pool else map)(_call, runs))
        table = {}
        for lr in args.lrs:
            for kind in args.controllers:
                table[lr, kind] = [next(results) for _ in args.seeds]
                print(row(lr, kind, table[lr, kind]), flush=True)
    baselines = [k for k in args.controllers if k.startswith(("fixed", "delta"))]
    if "lm" not in args.controllers or not baselines:
        return
    print(
        "\nGoals: the default's RMSE over the better baseline's (fixed coefficients and the "
        "±Δ rule; the tracking RMSE where every seed reached the target, else the 2nd "
        "half's), its mean entropy of the 2nd half over the target:\n"
    )
    print(
        "| lr | better baseline | its RMSE | lm RMSE | ratio (goal <= 0.5) | "
        "lm mean H / target (goal 0.9-1.1) | ratio, less the steps held at 0 |\n"
        "|---|---|---|---|---|---|---|"
    )
    for lr in args.lrs:

        def rmse(kind):
            rows = table[lr, kind]
            key = "rmse" if all(r["reached"] for r in rows) else "rmse2"
            return mean(rows, key), key

        best = min(baselines, key=lambda k: rmse(k)[0])
        base, key = rmse(best)
        lm = mean(table[lr, "lm"], key)
        print(
            f"| {lr:g} | {best} | {base:.3f} ({key}) | {lm:.3f} | {lm / base:.2f} | "
            f"{mean(table[lr, 'lm'], 'mean2') / args.target:.3f} | "
            f"{mean(table[lr, 'lm'], 'rmse_acting') / mean(table[lr, best], 'rmse_acting'):.2f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
