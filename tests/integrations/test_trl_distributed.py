"""TRL integration on 2 gloo ranks (127.0.0.1) with gradient accumulation 4.

Two processes (torchrun's environment variables; accelerate joins a gloo
group on the CPU) train the toy GRPO task with ``GRPOTrainer`` and
``lm_controller`` added by ``add_entropy_control``; the random model ends some
completions early, so micro-batches and ranks hold different numbers of
tokens.  Each rank (``tests/integrations/trl_workers.py``) records per
micro-batch the coefficient its loss read and its entropy sum and token
count, per step what ``accelerator.reduce`` pooled, and the callback's
history.  The tests check that

* the coefficient is the same on both ranks, bit for bit, at every micro-batch
  and step, and every micro-batch of step N+1 uses the coefficient set after
  step N;
* the entropy the controller saw is the token-weighted mean over the 4
  micro-batches x 2 ranks of its step (not a mean of per-micro-batch means);
* one process running a fresh controller on each step's pooled entropy sum
  and token count commands the same coefficients.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch

from alf_entropy.integrations.llm import LM_SETTINGS, StepEntropyControl, lm_controller
from tests.distributed.launch import REPO_ROOT, free_port, local_env
from tests.integrations import trl_workers

# Only the ranks import TRL (seconds of CPU); this process checks it is there.
if importlib.util.find_spec("trl") is None:
    pytest.skip("TRL is not installed (pip install -e '.[trl]')", allow_module_level=True)

# Two processes importing TRL and training: 15-60 s on 2 cores.
pytestmark = pytest.mark.slow

WORLD_SIZE = 2


def _run_ranks(out_dir, module="tests.integrations.trl_workers", timeout_s=300.0, grace_s=20.0):
    """Run ``python -m module out_dir`` on ``WORLD_SIZE`` ranks; kill all if one fails or
    time runs out (stdout and stderr go to ``out_dir/rank{r}.out`` and ``.err``).

    Returns:
        Per rank ``(returncode, stderr)``; ``returncode`` is None for a rank
        that was killed.
    """
    port = str(free_port())
    procs, logs = [], []
    for r in range(WORLD_SIZE):
        env = local_env(
            {
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": str(WORLD_SIZE),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
            }
        )
        out = open(os.path.join(out_dir, f"rank{r}.out"), "w")
        err = open(os.path.join(out_dir, f"rank{r}.err"), "w")
        logs.append((out, err))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", module, str(out_dir)],
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=err,
            )
        )
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(code is not None for code in codes):
                break
            if any(code not in (None, 0) for code in codes):
                # A rank failed: the others would wait in a collective forever.
                deadline = min(deadline, time.monotonic() + grace_s)
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        codes = []
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
                codes.append(None)
            else:
                codes.append(p.returncode)
        for out, err in logs:
            out.close()
            err.close()
    results = []
    for r, code in enumerate(codes):
        with open(os.path.join(out_dir, f"rank{r}.err")) as f:
            results.append((code, f.read()))
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("trl_ddp")
    start = time.monotonic()
    results = _run_ranks(out)
    elapsed = time.monotonic() - start
    failed = [(r, code, err) for r, (code, err) in enumerate(results) if code != 0]
    if failed:
        pytest.fail(
            "\n\n".join(
                f"rank {r} "
                + ("was killed (timeout, or a peer failed)" if code is None else f"exited {code}")
                + f"; its stderr ends:\n{err[-4000:]}"
                for r, code, err in failed
            )
        )
    data = []
    for r in range(WORLD_SIZE):
        with open(out / f"rank{r}.json") as f:
            data.append(json.load(f))
    print(f"2-rank GRPO run: {elapsed:.1f} s")
    return data


def _by_step(records, steps):
    return [[m for m in records if m["step"] == k] for k in range(steps)]


def _reference(pooled, steps, vocab_size):
    """A fresh controller in this process, fed ``[(entropy_sum, token_count)]`` per step."""
    control = StepEntropyControl(lm_controller(vocab_size, trl_workers.TARGET))
    first = control.coefficient
    coefs, entropies = [], []
    for k, (entropy_sum, token_count) in enumerate(pooled, start=1):
        coefs.append(control.update(entropy_sum, token_count, k, steps))
        entropies.append(control.entropy)
    return first, coefs, entropies


def test_two_gloo_ranks_with_unequal_completion_lengths(ranks):
    steps, accumulation = trl_workers.STEPS, trl_workers.ACCUMULATION
    for r, data in enumerate(ranks):
        assert data["rank"] == r and data["world_size"] == WORLD_SIZE
        assert data["distributed_type"] == "DistributedType.MULTI_CPU"
        assert data["backend"] == "gloo"
        assert [len(s) for s in _by_step(data["micro_batches"], steps)] == [accumulation] * steps
        assert [h["step"] for h in data["history"]] == list(range(1, steps + 1))
        assert [x["step"] for x in data["reductions"]] == list(range(steps))
    tokens = [[m["tokens"] for m in data["micro_batches"]] for data in ranks]
    full = 4 * 8  # per_device_train_batch_size x max_completion_length
    # Some completions end early (eos), so the micro-batches' token counts differ
    # within a rank and between the ranks, and so do the ranks' step totals.
    for r in range(WORLD_SIZE):
        assert len(set(tokens[r])) > 1 and min(tokens[r]) < full, tokens[r]
    assert tokens[0] != tokens[1]
    window_counts = [[x["sent"][1] for x in data["reductions"]] for data in ranks]
    assert window_counts[0] != window_counts[1]
    lengths = {n for data in ranks for m in data["micro_batches"] for n in m["lengths"]}
    assert min(lengths) < 8 and max(lengths) == 8


def test_coefficient_is_identical_on_both_ranks_and_set_after_the_previous_step(ranks):
    steps = trl_workers.STEPS
    r0, r1 = ranks
    # Bit for bit (JSON round-trips a Python float exactly).
    assert [m["coef"] for m in r0["micro_batches"]] == [m["coef"] for m in r1["micro_batches"]]
    assert r0["history"] == r1["history"]
    assert r0["final_coef"] == r1["final_coef"] == r0["history"][-1]["coef_next"]
    assert r0["controller_state"] == r1["controller_state"]
    first, _, _ = _reference([], steps, r0["vocab_size"])
    for data in ranks:
        history = data["history"]
        applied = [first] + [h["coef_next"] for h in history[:-1]]
        for k, micro in enumerate(_by_step(data["micro_batches"], steps)):
            # Every micro-batch of step k+1 read the coefficient set after step k.
            assert [m["coef"] for m in micro] == [applied[k]] * len(micro), k
            assert history[k]["coef_applied"] == applied[k]
    # The controller moved the coefficient (entropy ~3.6 below the target 3.66), so the
    # comparisons above tell the steps apart.
    assert len({h["coef_next"] for h in r0["history"]}) >= 3


def test_entropy_is_the_token_weighted_mean_over_micro_batches_and_ranks(ranks):
    steps = trl_workers.STEPS
    per_rank = [_by_step(data["micro_batches"], steps) for data in ranks]
    weighting_matters = False
    for k in range(steps):
        micro = [m for r in range(WORLD_SIZE) for m in per_rank[r][k]]
        assert len(micro) == trl_workers.ACCUMULATION * WORLD_SIZE
        entropy_sum = math.fsum(m["entropy_sum"] for m in micro)
        token_count = math.fsum(m["tokens"] for m in micro)
        weighted = entropy_sum / token_count
        for data in ranks:
            assert data["history"][k]["entropy"] == pytest.approx(weighted, rel=1e-6, abs=0)
            # What each rank sent to the reduction is its 4 micro-batches' sums...
            sent = data["reductions"][k]["sent"]
            rank_micro = per_rank[data["rank"]][k]
            assert sent[0] == pytest.approx(
                math.fsum(m["entropy_sum"] for m in rank_micro), rel=1e-6, abs=0
            )
            assert sent[1] == math.fsum(m["tokens"] for m in rank_micro)
        # ... and both ranks got the same total of both ranks back.
        returned = [data["reductions"][k]["returned"] for data in ranks]
        assert returned[0] == returned[1]
        assert returned[0][0] == pytest.approx(entropy_sum, rel=1e-6, abs=0)
        assert returned[0][1] == token_count
        unweighted = sum(m["entropy_sum"] / m["tokens"] for m in micro) / len(micro)
        weighting_matters |= abs(unweighted - weighted) > 1e-5
    # The unequal token counts make the token-weighted mean differ from a mean of
    # micro-batch means by more than the tolerance above, so the test tells them apart.
    assert weighting_matters


def test_one_process_fed_the_pooled_sums_commands_the_same_coefficients(ranks):
    steps = trl_workers.STEPS
    history = ranks[0]["history"]
    trained = [h["coef_next"] for h in history]
    # Fed the pooled float32 window sums as TRL divides them (float32), the fresh
    # controller matches exactly, entropy and coefficient.
    measured = []
    for x in ranks[0]["reductions"]:
        total, count = torch.tensor(x["returned"], dtype=torch.float32)
        measured.append((float(total / count.clamp(min=1.0)), 1.0))
    _, coefs, entropies = _reference(measured, steps, ranks[0]["vocab_size"])
    assert entropies == [h["entropy"] for h in history]
    assert coefs == trained
    # Fed the exact (float64) pooled sums of the micro-batches, it matches to the
    # float32 rounding of TRL's measurement (entropies within rel 1e-6).  The
    # coefficient is I + g kick: an error of e nats in each entropy seen moves it by
    # at most (kp + 2 (1 - trend_ema) kd + steps ki) e (the P term, the smoothed
    # trend's step, the integral's sum; g <= 1) plus |kick| times g's move, at most
    # gslope steps ki e, so its tolerance is that, absolute (a coefficient near 0 has
    # no relative scale; the controller's own float32 rounding, ~1e-7, is far below).
    per_rank = [_by_step(data["micro_batches"], steps) for data in ranks]
    pooled = []
    for k in range(steps):
        micro = [m for r in range(WORLD_SIZE) for m in per_rank[r][k]]
        pooled.append(
            (math.fsum(m["entropy_sum"] for m in micro), math.fsum(m["tokens"] for m in micro))
        )
    _, coefs, entropies = _reference(pooled, steps, ranks[0]["vocab_size"])
    assert entropies == pytest.approx([h["entropy"] for h in history], rel=1e-6, abs=0)
    kp, ki, kd, ema = (LM_SETTINGS[k] for k in ("kp", "ki", "kd", "trend_ema"))
    gslope = (1 - LM_SETTINGS["min_gain"]) / LM_SETTINGS["gain_alpha"]
    kick = kp * max(abs(trl_workers.TARGET - h) for h in entropies) + kd * (1 - ema) * (
        max(entropies) - min(entropies)
    )
    gain = kp + 2 * (1 - ema) * kd + steps * ki * (1 + gslope * kick)
    assert coefs == pytest.approx(trained, rel=0, abs=gain * 1e-6 * max(entropies))
