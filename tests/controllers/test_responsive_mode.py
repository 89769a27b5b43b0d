"""Tests of the opt-in responsive mode (``track_target_changes``) and ``max_alpha``."""

import math

import numpy as np
import pytest
import torch

from alf_entropy.algorithms.entropy_target_algorithm import EntropyTargetAlgorithm
from alf_entropy.experiments import control_metrics as cm
from alf_entropy.tensor_specs import BoundedTensorSpec

DISCRETE4 = BoundedTensorSpec((), torch.int64, 0, 3)


def _step_task(steps: int, step_at: int, **kwargs):
    """The collapsing 4-action policy (maximise P(action 0), Adam 0.05, 8
    samples per update) with a target stepping from 0.6 to 1.0."""
    torch.manual_seed(0)
    target = np.where(np.arange(steps) < step_at, 0.6, 1.0)
    box = {"i": 0}
    controller = EntropyTargetAlgorithm(
        DISCRETE4, target_entropy=lambda: float(target[box["i"]]), **kwargs
    )
    logits = torch.zeros(4, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.05)
    step_type = torch.ones(8, dtype=torch.int64)
    entropies, alphas = [], []
    for i in range(steps):
        box["i"] = i
        dist = torch.distributions.Categorical(logits=logits.expand(8, 4))
        info = controller.train_step((dist, step_type)).info
        loss = controller.calc_loss(info._replace(step_type=step_type)).loss
        opt.zero_grad()
        (-dist.probs[:, 0] + loss).mean().backward()
        opt.step()
        entropies.append(float(dist.entropy()[0].detach()))
        alphas.append(float(controller.alpha))
    return np.array(entropies), target, np.array(alphas), controller


@pytest.mark.slow
def test_responsive_mode_settles_a_step_within_300_updates():
    fast, target, _, ctrl = _step_task(1300, 800, track_target_changes=True)
    slow, _, _, _ = _step_task(1300, 800)
    [settle_fast] = cm.settling_times(fast, target)
    [settle_slow] = cm.settling_times(slow, target)
    assert settle_fast <= 300, settle_fast
    # ALF's mode is slower here (or has not settled at all by the end)
    assert math.isnan(settle_slow) or settle_slow > 300, settle_slow
    assert ctrl.stage.item() in (0, 1)


def _drive(mode: str, entropies, targets, **kwargs):
    box = {"i": 0}
    ctrl = EntropyTargetAlgorithm(
        DISCRETE4, target_entropy=lambda: float(targets[box["i"]]), update_mode=mode, **kwargs
    )
    trace = []
    for i, e in enumerate(entropies):
        box["i"] = i
        ctrl.adjust_alpha(torch.tensor(e, dtype=torch.float32))
        trace.append(
            (
                ctrl.log_alpha.item(),
                ctrl.stage.item(),
                ctrl.update_rate.item(),
                ctrl.driver.ref_target.item() if kwargs.get("track_target_changes") else 0.0,
            )
        )
    return trace


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(track_target_changes=True),
        dict(track_target_changes=True, max_alpha=0.5),
        dict(max_alpha=0.3),
    ],
)
def test_host_and_tensor_paths_agree_bit_for_bit(kwargs):
    rng = np.random.default_rng(1)
    n = 400
    entropies = np.clip(
        0.7 + 0.3 * np.sin(np.arange(n) / 15) + 0.05 * rng.standard_normal(n), 0.01, 1.3
    )
    targets = np.where(np.arange(n) < 150, 0.6, np.where(np.arange(n) < 300, 1.0, 0.4))
    host = _drive("host", entropies, targets, **kwargs)
    tensor = _drive("tensor", entropies, targets, **kwargs)
    assert host == tensor
    if kwargs.get("track_target_changes"):
        # the reference target follows the steps: 0.6, then 1.0, then 0.4
        assert {round(t[3], 6) for t in host} == {0.6, 1.0, 0.4}


def test_tracking_restarts_the_adjust_stage_rate_on_a_target_move():
    # below-target entropies put the controller in the adjust stage; constant
    # entropy crossings decay the rate; a 50% target move restarts it at 0.1
    targets = [0.5] * 60 + [0.75] * 5
    entropies = [0.6, 0.7] + [0.45, 0.55] * 29 + [0.6] * 5
    trace = _drive(
        "host", entropies, targets, track_target_changes=True, max_entropy=1.0, average_window=1
    )
    rate_before = trace[59][2]
    assert rate_before == pytest.approx(0.01)  # decayed to slow_update_rate
    assert trace[60][2] == pytest.approx(0.1 * 0.9, rel=1e-6)  # restarted, then one crossing
    default = _drive("host", entropies, targets, max_entropy=1.0, average_window=1)
    assert default[60][2] == pytest.approx(0.01)  # ALF's mode stays slow


def test_small_schedule_drift_does_not_restart_until_it_adds_up_to_5_percent():
    n = 100
    targets = np.linspace(0.60, 0.57, n)  # 5% in total, reached at the very end
    entropies = [0.5] * n
    trace = _drive("host", entropies, targets, track_target_changes=True, skip_free_stage=True)
    refs = [t[3] for t in trace]
    assert refs[-2] == pytest.approx(0.60)
    assert len(set(refs)) <= 2


def test_max_alpha_bounds_a_runaway_alpha():
    entropies = [0.3 - 0.001 * i for i in range(200)]  # always below the target, falling
    free = _drive("host", entropies, [0.6] * 200, skip_free_stage=True)
    bounded = _drive("host", entropies, [0.6] * 200, skip_free_stage=True, max_alpha=2.0)
    assert math.exp(free[-1][0]) > 1e3  # doubles every update without a ceiling
    assert max(t[0] for t in bounded) == np.float32(math.log(2.0))
    assert bounded[-1][0] == np.float32(math.log(2.0))


def test_default_state_dict_is_unchanged_and_tracking_state_is_saved():
    plain = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5)
    bounded = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, max_alpha=1.0)
    # max_alpha is a constant, not state; the state's layout does not depend on options
    assert set(bounded.state_dict()) == set(plain.state_dict())
    assert not any("max_log_alpha" in k for k in plain.state_dict())
    tracking = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, track_target_changes=True)
    tracking.driver.ref_target.fill_(0.42)
    restored = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, track_target_changes=True)
    restored.load_state_dict(tracking.state_dict())
    assert restored.driver.ref_target.item() == pytest.approx(0.42)


@pytest.mark.parametrize(
    "kwargs, error, word",
    [
        (dict(track_target_changes=1), TypeError, "track_target_changes"),
        (dict(retarget_update_rate=0.0), ValueError, "retarget_update_rate"),
        (dict(max_alpha=0.05, initial_alpha=0.1), ValueError, "max_alpha"),
        (dict(max_alpha=-1.0), ValueError, "max_alpha"),
    ],
)
def test_bad_arguments(kwargs, error, word):
    with pytest.raises(error, match=word):
        EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, **kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_responsive_mode_matches_the_cpu_and_never_syncs():
    from alf_entropy.algorithms.entropy_target_algorithm import (
        EntropyTargetInfo,
        EntropyTargetLossInfo,
    )
    from alf_entropy.data_structures import LossInfo

    n = 120
    rng = np.random.default_rng(3)
    seq = np.clip(0.7 + 0.3 * np.sin(np.arange(n) / 9) + 0.05 * rng.standard_normal(n), 0.05, 1.3)
    targets = np.where(np.arange(n) < 60, 0.6, 1.0)
    kwargs = dict(track_target_changes=True, max_alpha=0.5)
    box = {"i": 0}
    cpu = EntropyTargetAlgorithm(
        DISCRETE4, target_entropy=lambda: float(targets[box["i"]]), **kwargs
    )
    gpu = EntropyTargetAlgorithm(
        DISCRETE4, target_entropy=lambda: float(targets[box["i"]]), **kwargs
    ).to("cuda")
    step_type = torch.ones(4, 3, dtype=torch.int64)

    def info(neg):
        return EntropyTargetInfo(
            loss=LossInfo(loss=neg.clone(), extra=EntropyTargetLossInfo(neg_entropy=neg))
        )

    negs = [torch.full((4, 3), -float(e)) for e in seq]
    gpu_inputs = [(x.cuda(), step_type.cuda()) for x in negs]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i, (neg, st_) in enumerate(gpu_inputs):
            box["i"] = i
            gpu.calc_loss(info(neg)._replace(step_type=st_))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for i, neg in enumerate(negs):
        box["i"] = i
        cpu.calc_loss(info(neg)._replace(step_type=step_type))
    cpu_state, gpu_state = cpu.state_dict(), gpu.state_dict()
    assert cpu_state.keys() == gpu_state.keys() and len(cpu_state) > 0
    for name, value in cpu_state.items():
        torch.testing.assert_close(value, gpu_state[name].cpu(), atol=1e-6, rtol=0, msg=name)
