"""The controller contract: one vocabulary, checked at construction; SGD's Adam as a rule equal
to torch.optim.Adam; copies that never alias; an empty batch that changes nothing."""

import copy
import inspect

import gin
import pytest
import torch

import alf_entropy.controllers as controllers
from alf_entropy.controllers import (
    EntropyController,
    EntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    LinearPIDEntropyTargetAlgorithm,
    NestedEntropyTargetAlgorithm,
    PIDEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.tensor_specs import BoundedTensorSpec

FOUR = BoundedTensorSpec((), torch.int64, 0, 3)
CLASSES = [
    EntropyTargetAlgorithm,
    PIDEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    LinearPIDEntropyTargetAlgorithm,
    NestedEntropyTargetAlgorithm,
]
SHARED = (
    "target_entropy",
    "initial_alpha",
    "min_alpha",
    "max_alpha",
    "update_mode",
    "batch_shape",
    "debug_summaries",
)
# A real signature: a misspelt argument is Python's own error, naming it.


def _buffers(c):
    return {k: v.clone() for k, v in c.state_dict().items() if torch.is_tensor(v)}


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_controller_takes_the_shared_arguments_with_the_same_defaults(cls):
    base = inspect.signature(EntropyController.__init__).parameters
    ours = inspect.signature(cls.__init__).parameters
    for name in SHARED:
        assert ours[name].default == base[name].default, name
    c = cls(FOUR, target_entropy=0.5, initial_alpha=0.05, min_alpha=1e-3, max_alpha=2.0)
    assert torch.allclose(c.alpha, torch.tensor(0.05))
    assert c.settings["min_alpha"] == 1e-3 and c.settings["max_alpha"] == 2.0


@pytest.mark.parametrize(
    "cls, setting, owner",
    [
        (PIDEntropyTargetAlgorithm, dict(skip_free_stage=True), "EntropyTargetAlgorithm"),
        (EntropyTargetAlgorithm, dict(kp=1.0), "PIDEntropyTargetAlgorithm"),
        (FixedEntropyCoefficient, dict(lr=0.1), "SGDEntropyTargetAlgorithm"),
        (SGDEntropyTargetAlgorithm, dict(average_window=3), "EntropyTargetAlgorithm"),
        (NestedEntropyTargetAlgorithm, dict(kd=0.1), "PIDEntropyTargetAlgorithm"),
    ],
)
def test_another_rules_setting_is_a_type_error_naming_it(cls, setting, owner):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{next(iter(setting))}'"):
        cls(FOUR, target_entropy=0.5, **setting)
    assert next(iter(setting)) in inspect.signature(getattr(controllers, owner)).parameters


@pytest.mark.parametrize(
    "kwargs, error, word",
    [
        (dict(lr=-1e-3), ValueError, "lr"),
        (dict(lr="fast"), TypeError, "lr"),
        (dict(optimizer="rmsprop"), ValueError, "optimizer"),
        (dict(optimizer=lambda p: torch.optim.Adam(p)), ValueError, "optimizer"),
        (dict(min_alpha=0.5, max_alpha=0.2), ValueError, "max_alpha"),
        (dict(initial_alpha=3.0, max_alpha=2.0), ValueError, "initial_alpha"),
    ],
)
def test_settings_that_would_fail_later_fail_at_construction(kwargs, error, word):
    with pytest.raises(error, match=word):
        SGDEntropyTargetAlgorithm(FOUR, target_entropy=0.5, **kwargs)


def test_sgd_learning_rate_is_a_gin_binding():
    with gin.unlock_config():
        gin.parse_config("SGDEntropyTargetAlgorithm.lr = 0.01")
    try:
        assert SGDEntropyTargetAlgorithm(FOUR, target_entropy=0.5).settings["lr"] == 0.01
    finally:
        gin.clear_config()


@pytest.mark.parametrize("mode", ["host", "tensor"])
@pytest.mark.parametrize("batch", [(), (8,)])
def test_sgd_adam_is_torch_optim_adam_bit_for_bit(batch, mode):
    """The rule's Adam against torch.optim.Adam stepping a parameter with the same gradient
    (H - target) from the same log(alpha), 400 updates (the bounds never reached)."""
    sgd = SGDEntropyTargetAlgorithm(
        FOUR,
        target_entropy=0.5,
        initial_alpha=0.5,
        lr=1e-2,
        batch_shape=batch,
        update_mode=mode,
        min_alpha=0.0,
    )
    param = sgd.log_alpha.clone().requires_grad_(True)
    adam = torch.optim.Adam([param], lr=1e-2)
    g = torch.Generator().manual_seed(3)
    for step in range(400):
        entropy = 0.5 + 0.3 * torch.randn(batch, generator=g)
        sgd.adjust_alpha(entropy)
        param.grad = entropy - 0.5
        adam.step()
        assert torch.equal(sgd.log_alpha, param.detach()), step
    assert torch.equal(sgd.driver.adam_step, torch.full(batch, 400))


@pytest.mark.parametrize("cls", CLASSES[:5], ids=lambda c: c.__name__)
def test_a_loaded_live_state_is_copied_not_shared(cls):
    """A PBT exploit step in one process: loading a live controller's state_dict() into
    another, then stepping both, gives what a deep copy gives."""
    source = cls(FOUR, target_entropy=0.5)
    for k in range(30):
        source.adjust_alpha(0.3 + 0.01 * k)
    copied, twin = cls(FOUR, target_entropy=0.5), copy.deepcopy(source)
    copied.load_state_dict(source.state_dict())
    for k in range(20):
        for c in (source, copied, twin):
            c.adjust_alpha(0.6 - 0.01 * k)
    assert all(torch.equal(v, _buffers(twin)[k]) for k, v in _buffers(copied).items())
    assert all(torch.equal(v, _buffers(twin)[k]) for k, v in _buffers(source).items())


@pytest.mark.parametrize("mode", ["host", "tensor"])
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_an_empty_batch_changes_nothing_not_even_first(cls, mode):
    c = cls(FOUR, target_entropy=0.5, update_mode=mode)
    c.step()  # a window of log_alpha starts
    before = _buffers(c)
    entropy = torch.full((6,), 0.9)
    c.entropy_loss(entropy, mask=torch.zeros(6, dtype=torch.bool))
    c.accumulate(entropy, mask=torch.zeros(6))
    c.step()
    assert all(torch.equal(v, _buffers(c)[k]) for k, v in before.items())


@pytest.mark.parametrize("cls", CLASSES[:5], ids=lambda c: c.__name__)
def test_the_loss_uses_alpha_after_the_update_for_every_controller(cls):
    c = cls(FOUR, target_entropy=0.5)
    entropy = torch.full((4,), 1.2, requires_grad=True)
    info = c.entropy_loss(entropy)
    assert torch.equal(info.loss.detach(), (-c.alpha * 1.2).expand(4))
    alpha = c.adjust_alpha(0.3)
    assert torch.equal(alpha, c.alpha)


@pytest.mark.parametrize("mode", ["host", "tensor"])
def test_the_linear_pid_reaches_zero_above_the_target_and_rebuilds_from_it(mode):
    """A one-sided actuator: above the target the coefficient is 0 exactly, and the integral,
    clamped at 0, does not wind down below it, so a fall under the target is answered at once."""
    pid = LinearPIDEntropyTargetAlgorithm(
        FOUR, target_entropy=1.0, initial_alpha=0.2, min_alpha=0.0, max_alpha=1.0, update_mode=mode
    )
    for _ in range(50):
        pid.adjust_alpha(1.3)
    assert float(pid.alpha) == 0.0 and float(pid.integral) == 0.0
    assert float(pid.adjust_alpha(0.9)) > 0.0
    for _ in range(200):
        pid.adjust_alpha(0.2)
    assert float(pid.alpha) == 1.0 and float(pid.integral) == 1.0  # clamped: no windup
    alphas = [float(pid.adjust_alpha(1.5)) for _ in range(100)]  # unwinds from the ceiling
    assert alphas[-1] == 0.0 and alphas.index(0.0) < 100


@pytest.mark.parametrize("mode", ["host", "tensor"])
def test_the_linear_pid_goes_down_to_a_negative_min_alpha_and_back(mode):
    """``min_alpha < 0``: while the entropy rises above the target with the integral at 0, alpha
    falls to it exactly (an entropy penalty, with ``log_alpha`` its positive part's) and the
    loss pushes the entropy down; above the target but flat or falling, or in a bonus's
    overshoot (the integral above 0), no penalty; below, a bonus.  The integral stays >= 0."""
    pid = LinearPIDEntropyTargetAlgorithm(
        FOUR, target_entropy=1.0, initial_alpha=0.0, min_alpha=-0.2, max_alpha=1.0, update_mode=mode
    )
    assert float(pid.alpha) == 0.0
    rising = [float(pid.adjust_alpha(1.5 + 0.1 * i)) for i in range(10)]
    floor = torch.tensor(-0.2).item()  # min_alpha in float32
    assert rising[0] == 0.0 and rising[1:] == [floor] * 9  # the first update has no trend
    assert float(pid.integral) == 0.0 and float(pid.log_alpha) < -100  # the positive part: 0
    info = pid.entropy_loss(torch.full((4,), 1.2), update=False)
    assert torch.equal(info.loss, -pid.alpha * torch.full((4,), 1.2)) and info.loss[0] > 0
    falling = [float(pid.adjust_alpha(2.4 - 0.04 * i)) for i in range(30)]  # to 1.24
    assert min(falling[5:]) >= 0.0  # once the smoothed entropy falls
    flat = [float(pid.adjust_alpha(1.3)) for _ in range(40)]
    assert flat[-1] == 0.0 and float(pid.integral) == 0.0
    alphas = [float(pid.adjust_alpha(0.4)) for _ in range(30)]
    assert alphas[-1] > 0.0 and min(alphas) >= 0.0
    overshoot = [float(pid.adjust_alpha(1.1 + 0.05 * i)) for i in range(3)]
    assert min(overshoot) == 0.0 and float(pid.integral) > 0.0
    with pytest.raises(ValueError, match="max_alpha_change_per_iteration must be None"):
        LinearPIDEntropyTargetAlgorithm(FOUR, target_entropy=1.0, max_alpha_change_per_iteration=2)


def test_a_linear_pid_state_saved_without_alpha_loads_it_from_log_alpha():
    """A checkpoint of the linear PID from before ``alpha`` was a field of its own (it held
    ``exp(log_alpha)``) resumes at the same coefficient."""
    pid = LinearPIDEntropyTargetAlgorithm(FOUR, target_entropy=1.0, min_alpha=0.0, max_alpha=1.0)
    for h in (0.5, 0.6, 0.7):
        pid.adjust_alpha(h)
    old = {k: v for k, v in pid.state_dict().items() if k != "driver.alpha"}
    resumed = LinearPIDEntropyTargetAlgorithm(
        FOUR, target_entropy=1.0, min_alpha=0.0, max_alpha=1.0
    )
    resumed.load_state_dict(old)
    assert float(pid.alpha) > 0 and torch.equal(resumed.alpha, pid.log_alpha.exp())
    assert torch.equal(resumed.adjust_alpha(0.8), pid.adjust_alpha(0.8))


@pytest.mark.parametrize("mode", ["host", "tensor"])
def test_the_linear_pids_kicks_shrink_with_the_integral(mode):
    """Below ``gain_alpha`` the P and D terms act at a share falling to ``min_gain`` at an
    integral of 0; from ``gain_alpha`` on, in full, as without the option."""

    def first_alpha(integral, **gain):
        pid = LinearPIDEntropyTargetAlgorithm(
            FOUR,
            target_entropy=1.0,
            initial_alpha=integral,
            kp=1.0,
            ki=0.0,
            min_alpha=0.0,
            max_alpha=1.0,
            update_mode=mode,
            **gain,
        )
        return float(pid.adjust_alpha(0.8))  # e = 0.2: alpha = I + share * kp * e

    gain = dict(gain_alpha=0.2, min_gain=0.5)
    assert first_alpha(0.0) == pytest.approx(0.2)
    assert first_alpha(0.0, **gain) == pytest.approx(0.1)
    assert first_alpha(0.1, **gain) == pytest.approx(0.1 + 0.75 * 0.2)
    assert first_alpha(0.3, **gain) == pytest.approx(first_alpha(0.3))
    for bad in (dict(min_gain=0.0), dict(min_gain=1.5), dict(gain_alpha=-0.1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LinearPIDEntropyTargetAlgorithm(FOUR, target_entropy=1.0, **bad)
