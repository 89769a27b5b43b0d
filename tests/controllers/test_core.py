"""The controller core: one driver over every rule, on the host and tensor paths; a batch of
controllers; accumulate-then-step; settings changed mid-run."""

import functools
import warnings

import pytest
import torch

from alf_entropy.controllers import (
    EntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    LinearPIDEntropyTargetAlgorithm,
    PIDEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils.schedulers import SettledAnnealing

TWO = BoundedTensorSpec((), torch.int64, 0, 1)
RULES = {
    "staged": functools.partial(EntropyTargetAlgorithm, TWO, skip_free_stage=True, max_alpha=50.0),
    "staged/alf": functools.partial(EntropyTargetAlgorithm, TWO, average_window=3),
    "staged/track": functools.partial(
        EntropyTargetAlgorithm, TWO, skip_free_stage=True, track_target_changes=True
    ),
    "pid": functools.partial(PIDEntropyTargetAlgorithm, TWO, max_alpha=50.0),
    "sgd": functools.partial(
        SGDEntropyTargetAlgorithm, TWO, optimizer="sgd", lr=0.05, max_alpha=50.0
    ),
    "sgd/adam": functools.partial(SGDEntropyTargetAlgorithm, TWO, window_size=2),
    "fixed": functools.partial(FixedEntropyCoefficient, TWO),
    "linear": functools.partial(
        LinearPIDEntropyTargetAlgorithm, TWO, min_alpha=0.0, max_alpha=5.0, kd=0.5
    ),
    "linear/penalty": functools.partial(
        LinearPIDEntropyTargetAlgorithm, TWO, min_alpha=-0.5, max_alpha=5.0, kd=0.5
    ),
    "linear/gain": functools.partial(
        LinearPIDEntropyTargetAlgorithm,
        TWO,
        min_alpha=0.0,
        max_alpha=5.0,
        kd=0.5,
        gain_alpha=0.2,
        min_gain=0.5,
    ),
}
ADAPTIVE = [k for k in RULES if k != "fixed"]


def _tensors(controller):
    return {k: v for k, v in controller.state_dict().items() if torch.is_tensor(v)}


def _entropy(k, noise):
    """Pinned low (a stall), then answering, then near the target; NaNs now and then."""
    h = 0.3 if k < 600 else (0.3 + 4e-4 * (k - 600) if k < 1000 else 0.5)
    return float("nan") if k % 97 == 5 else h + noise[k].item()


@pytest.mark.parametrize("rule", sorted(RULES))
def test_host_and_tensor_paths_are_bit_identical_for_every_rule(rule):
    """1,500 updates through a stall, a recovery, NaNs, empty batches, annealing and the span
    limit: every buffer of the host path equals the tensor path's at every step."""
    kw = (
        {}
        if rule == "fixed"
        else dict(target_entropy=SettledAnnealing(0.68, factor=0.9, window=60, final=0.3))
    )
    pair = [
        RULES[rule](update_mode=mode, **kw) if rule != "fixed" else RULES[rule]()
        for mode in ("host", "tensor")
    ]
    if rule == "fixed":
        pair[1].driver.mode = "tensor"
    noise = torch.randn(1500, generator=torch.Generator().manual_seed(0)) * 0.02
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unreachable-target warning
        for k in range(1500):
            if k % 100 == 0 and rule != "fixed":  # an iteration's end; a capped one or not
                for c in pair:
                    if not rule.startswith("linear"):  # the linear PID refuses a span
                        c.configure(max_alpha_change_per_iteration=None if k % 200 else 1.35)
                    c.step()
            mask = torch.zeros(4) if k % 89 == 7 else torch.ones(4)  # an empty batch
            for c in pair:
                c.entropy_loss(torch.full((4,), _entropy(k, noise)), mask=mask)
            host, tensor = (_tensors(c) for c in pair)
            for key in host:
                assert torch.equal(host[key], tensor[key]), (k, key)
    assert pair[0].driver.on_host() and not pair[1].driver.on_host()
    assert pair[0].num_nonfinite_entropy.item() == len(
        [k for k in range(1500) if k % 97 == 5 and k % 89 != 7]
    )


@pytest.mark.parametrize("mode", ["host", "tensor"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_member_of_a_batch_equals_a_scalar_controller(rule, mode):
    """K=3 members with their own targets, fed their own entropies (NaN in one member at a
    time): each member's state equals, bit for bit, a scalar controller's fed the same."""
    targets = [0.6, 0.45, 0.3]
    kw = (lambda t: {}) if rule == "fixed" else (lambda t: dict(target_entropy=t, update_mode=mode))
    batch = RULES[rule](batch_shape=(3,), **kw(targets))
    scalars = [RULES[rule](**kw(t)) for t in targets]
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(300):
            h = 0.7 - 0.002 * k + 0.05 * torch.randn(3, generator=g)
            if k % 31 == 4:
                h[k % 3] = float("nan")
            batch.adjust_alpha(h)
            for m, c in enumerate(scalars):
                c.adjust_alpha(h[m])
            ours = _tensors(batch)
            for m, c in enumerate(scalars):
                for key, value in _tensors(c).items():
                    assert torch.equal(ours[key][m], value), (k, m, key)
    assert batch.alpha.shape == (3,) and batch.unreachable_target.shape == (3,)


@pytest.mark.parametrize("rule", ADAPTIVE)
def test_a_batch_takes_per_member_entropies_in_entropy_loss_and_saves_its_state(rule):
    batch = RULES[rule](batch_shape=(2,), target_entropy=[0.6, 0.3])
    entropy = torch.tensor([[0.2, 0.4, 9.0], [0.5, 0.5, 0.5]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    info = batch.entropy_loss(entropy, mask)
    assert info.loss.shape == (2, 3)
    # Every rule's loss (SAC's actor loss too) uses alpha after its update.
    assert torch.equal(info.loss[:, 0], -batch.alpha * entropy.detach()[:, 0])
    scalar = RULES[rule](target_entropy=0.6)
    scalar.entropy_loss(torch.tensor([0.2, 0.4]))
    assert torch.allclose(batch.alpha[0], scalar.alpha, rtol=1e-6)
    restored = RULES[rule](batch_shape=(2,), target_entropy=[0.6, 0.3])
    restored.load_state_dict(batch.state_dict())
    for key, value in _tensors(batch).items():
        assert torch.equal(_tensors(restored)[key], value), key
    assert torch.equal(batch.target_entropy, torch.tensor([0.6, 0.3]))


def test_batch_arguments_are_checked():
    with pytest.raises(ValueError, match="target_entropy has 2 entries for a batch of 3"):
        PIDEntropyTargetAlgorithm(TWO, batch_shape=(3,), target_entropy=[0.5, 0.4])
    with pytest.raises(ValueError, match="batch_shape"):
        PIDEntropyTargetAlgorithm(TWO, batch_shape=(2, 2))
    with pytest.raises(ValueError, match="batch_shape"):
        PIDEntropyTargetAlgorithm(TWO, batch_shape=(0,))
    with pytest.raises(TypeError, match="target_entropy"):
        PIDEntropyTargetAlgorithm(TWO, target_entropy=[0.5])  # a list needs a batch
    with pytest.raises(ValueError, match="3 element"):
        PIDEntropyTargetAlgorithm(TWO, batch_shape=(3,)).adjust_alpha(torch.ones(2))


@pytest.mark.parametrize("rule", ADAPTIVE)
def test_accumulate_then_step_is_one_update_on_the_count_weighted_mean(rule):
    """Micro-batches of unequal lengths: the mean over every token, not a mean of means;
    nothing counted leaves the controller as it is; a checkpoint mid-accumulation resumes
    exactly."""
    g = torch.Generator().manual_seed(2)
    ours, ref = RULES[rule](target_entropy=0.5), RULES[rule](target_entropy=0.5)
    for step in range(20):
        parts = [0.2 + torch.rand(n, generator=g) for n in (3, 11, 7)]
        for part in parts:
            ours.accumulate(part)
        ours.step()
        ref.adjust_alpha(torch.cat(parts).double().mean().float())
        assert torch.equal(ours.alpha, ref.alpha), step
    before = _tensors(ours)
    ours.accumulate(torch.ones(4), mask=torch.zeros(4))  # nothing counts
    ours.step()
    assert all(
        torch.equal(v, _tensors(ours)[k])
        for k, v in before.items()
        if not k.startswith("driver.acc")
    )
    ours.accumulate(torch.full((5,), 0.3))
    resumed = RULES[rule](target_entropy=0.5)
    resumed.load_state_dict(ours.state_dict())
    for c in (ours, resumed):
        c.accumulate(torch.full((2,), 0.9))
    assert torch.equal(ours.step(), resumed.step())


@pytest.mark.parametrize("rule", ["staged", "pid", "sgd"])
def test_settings_change_mid_run_without_resetting_the_state(rule):
    """Population-based training: copy a checkpoint, scale the settings, go on."""
    changes = {
        "staged": dict(slow_update_rate=0.012, fast_update_rate=0.6, max_alpha=40.0),
        "pid": dict(kp=2.4, ki=0.04, kd=0.6, max_alpha_change=1.5, min_alpha=2e-4),
        "sgd": dict(min_alpha=1e-3, max_alpha=40.0),
    }[rule]
    source = RULES[rule](target_entropy=0.5)
    for k in range(50):
        source.adjust_alpha(0.3 + 0.004 * k)
    copy = RULES[rule](target_entropy=0.5)
    copy.load_state_dict(source.state_dict())
    before = _tensors(copy)
    copy.configure(**changes)
    copy.target_entropy = 0.5 * 0.8
    for key, value in _tensors(copy).items():
        if key != "driver.target":
            assert torch.equal(value, before[key]), key
    # The next update is the one a controller built with the new settings takes.
    fresh = RULES[rule](target_entropy=0.4, **changes)
    fresh.load_state_dict(copy.state_dict())
    assert copy.settings == {**source.settings, **changes}
    assert torch.equal(copy.adjust_alpha(0.35), fresh.adjust_alpha(0.35))


def test_bad_settings_are_refused_and_change_nothing():
    pid = PIDEntropyTargetAlgorithm(TWO, target_entropy=0.5)
    with pytest.raises(TypeError, match="'gain'.*are not settings"):
        pid.configure(gain=1.0)
    with pytest.raises(ValueError, match="kp must be >= 0"):
        pid.configure(kp=-1.0)
    with pytest.raises(ValueError, match="max_alpha"):
        pid.configure(max_alpha=1e-5)
    assert pid.settings["kp"] == 2.0 and pid.settings["max_alpha"] is None
    with pytest.raises(ValueError, match="largest entropy"):
        pid.target_entropy = 5.0
    assert pid.target_entropy == 0.5


def test_fixed_coefficient_has_a_log_alpha_and_changes_at_once():
    fixed = FixedEntropyCoefficient(TWO, alpha=0.05)
    assert torch.allclose(fixed.log_alpha.exp(), torch.tensor(0.05))
    fixed.configure(alpha=0.2)
    assert torch.allclose(fixed.alpha, torch.tensor(0.2))
    fixed.configure(alpha=0.0)  # no bonus at all
    assert fixed.entropy_loss(torch.ones(3)).loss.abs().sum() == 0


def test_a_batch_takes_a_schedule_per_member_and_writes_summaries_per_member(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from alf_entropy.utils import schedulers, summary

    falling = schedulers.LinearScheduler("iterations", [(0, 0.6), (10, 0.4)])
    batch = PIDEntropyTargetAlgorithm(
        TWO, batch_shape=(2,), target_entropy=[falling, 0.3], debug_summaries=True, name="pid"
    )
    summary.set_default_writer(summary.create_summary_writer(str(tmp_path)))
    try:
        for i in range(4):
            summary.set_global_counter(i)
            schedulers.update_progress("iterations", i)
            batch.entropy_loss(torch.full((2, 5), 0.5))
        summary.flush()
    finally:
        summary.close()
    assert torch.allclose(batch.target_entropy, torch.tensor([0.54, 0.3]))
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"pid/alpha/0", "pid/alpha/1", "pid/entropy_std/1", "pid/integral/0"} <= tags, tags
    assert [e.value for e in acc.Scalars("pid/target_entropy/0")] == pytest.approx(
        [0.6, 0.58, 0.56, 0.54]
    )
    assert [e.value for e in acc.Scalars("pid/target_entropy/1")] == pytest.approx([0.3] * 4)


@pytest.mark.parametrize("mode", ["host", "tensor"])
def test_the_next_update_reads_any_write_to_the_state(mode):
    """An assigned buffer (as ALF's own test does with ``_stage``) or an in-place write is what
    the next update reads, on either path."""
    staged = RULES["staged"](target_entropy=0.5, update_mode=mode)
    twin = RULES["staged"](target_entropy=0.5, update_mode=mode)
    staged.driver.stage = torch.tensor(-1, dtype=torch.int32)  # assigned: a new tensor
    twin.driver.stage.fill_(-1)  # in place
    for c in (staged, twin):
        c.adjust_alpha(0.9)  # free stage, above the target: alpha stays
        assert c.stage.item() == -1 and c.alpha.item() == pytest.approx(0.1)
        c.driver.log_alpha.fill_(0.0)
        c.adjust_alpha(0.0)  # the average (0.45) below the target: adjusting from alpha 1
        assert c.stage.item() == 0 and c.alpha.item() > 1.0
