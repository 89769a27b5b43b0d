"""One interface test over every entropy controller.

Each controller (staged, SGD, nested, fixed, PID, linear PID) is driven through the same calls
with no ``isinstance`` checks: ``adjust_alpha`` with a float or a tensor,
``entropy_loss`` with and without a mask, ALF's ``rollout_step``/``calc_loss``,
``predict_step``, the common properties and ``from_space``, on the CPU and
(where available) on CUDA.
"""

import contextlib

import gin
import gymnasium as gym
import pytest
import torch

from alf_entropy.algorithms.entropy_target_algorithm import (
    EntropyController,
    EntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    NestedEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.controllers import LinearPIDEntropyTargetAlgorithm, PIDEntropyTargetAlgorithm
from alf_entropy.data_structures import AlgStep, StepType
from alf_entropy.tensor_specs import BoundedTensorSpec

SPACE = gym.spaces.Discrete(4)
FACTORIES = {
    "staged": lambda: EntropyTargetAlgorithm.from_space(
        SPACE, target_entropy=0.5, skip_free_stage=True
    ),
    "sgd": lambda: SGDEntropyTargetAlgorithm.from_space(
        SPACE, target_entropy=0.5, optimizer="sgd", lr=0.5
    ),
    "nested": lambda: NestedEntropyTargetAlgorithm.from_space(
        gym.spaces.Dict({"a": SPACE}), target_entropy={"a": 0.5}, skip_free_stage=True
    ),
    "fixed": lambda: FixedEntropyCoefficient.from_space(SPACE, alpha=0.2),
    "pid": lambda: PIDEntropyTargetAlgorithm.from_space(SPACE, target_entropy=0.5),
    "linear_pid": lambda: LinearPIDEntropyTargetAlgorithm.from_space(SPACE, target_entropy=0.5),
}
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    ),
]


def _entropy(controller, value):
    """``value`` in the form ``adjust_alpha`` takes for this controller's spec."""
    spec = controller.action_spec
    return value if not isinstance(spec, dict) else {k: value for k in spec}


@contextlib.contextmanager
def _no_host_sync(device):
    """On CUDA, make any synchronising call inside the block raise."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_every_controller_has_the_same_interface(kind, device):
    controller = FACTORIES[kind]().to(device)
    assert isinstance(controller, (EntropyController, NestedEntropyTargetAlgorithm))
    alpha0 = controller.alpha.clone()
    assert alpha0.shape == () and alpha0.device.type == device
    assert isinstance(controller.target_entropy, float)
    assert controller.stage.shape == ()
    assert controller.predict_step(None) == AlgStep()
    assert controller.rollout_step((None, None)) == AlgStep()  # ALF's: not on-policy yet
    controller.set_on_policy(True)
    tensor_entropy = torch.tensor(1.35, device=device)
    ent = torch.full((3, 2), 0.9, device=device)
    ent[:, 1] = float("nan")  # masked out below: ignored
    ent.requires_grad_()
    mask = torch.tensor([True, False], device=device)  # broadcasts over time
    logits = torch.zeros(3, 2, 4, device=device)
    dist = _entropy(controller, torch.distributions.Categorical(logits=logits))
    step_type = torch.full((3, 2), StepType.MID, device=device)
    with _no_host_sync(device):
        a1 = controller.adjust_alpha(_entropy(controller, 1.3))  # a Python float
        a2 = controller.adjust_alpha(_entropy(controller, tensor_entropy))
        alpha_before_loss = controller.alpha.clone()
        li = controller.entropy_loss(_entropy(controller, ent), mask)
        alpha_after_loss = controller.alpha.clone()
        info = controller.rollout_step((dist, step_type)).info
        li2 = controller.calc_loss(info._replace(step_type=step_type))
        alpha_before_nan = controller.alpha.clone()
        controller.adjust_alpha(_entropy(controller, float("nan")))  # counted, changes nothing
        controller.entropy_loss(_entropy(controller, ent), torch.zeros_like(mask))  # empty: not
    # A NaN/inf entropy from a non-empty batch is counted (every leaf of a
    # nested controller; a fixed coefficient too: the same driver) and left out.
    nonfinite = controller.num_nonfinite_entropy
    assert nonfinite.dtype == torch.int64 and nonfinite.device.type == device
    assert nonfinite.item() == 1
    unreachable = controller.unreachable_target
    assert unreachable.dtype == torch.bool and unreachable.shape == ()
    assert unreachable.device.type == device and not unreachable.item()
    assert torch.equal(controller.alpha, alpha_before_nan)
    for a in (a1, a2):
        assert a.shape == () and a.device.type == device
    # adjust_alpha returns the new alpha.
    assert torch.equal(a2, alpha_before_loss)
    # Entropy far above the target lowers alpha (the fixed one stays put).
    if kind == "fixed":
        assert a2.item() == pytest.approx(0.2)
    else:
        assert a2.item() < alpha0.item()
    # entropy_loss moves every adaptive controller's alpha (the SGD rule by
    # its own optimiser step: used alone, nothing else trains log_alpha) ...
    assert (kind == "fixed") == torch.equal(alpha_after_loss, alpha_before_loss)
    # ... and returns -alpha * entropy per element.
    assert li.loss.shape == (3, 2)
    alpha_used = alpha_after_loss  # every controller alike (SAC's actor loss too)
    if kind != "nested":  # the nested loss sums its leaves' alphas
        expected = (-alpha_used * 0.9).expand(3)
        torch.testing.assert_close(li.loss[:, 0].detach(), expected)
    assert li2.loss.shape == (3, 2)
    # The loss is all there is: no parent's optimiser trains these controllers.
    for loss_info in (li, li2):
        assert loss_info.loss.device.type == device and loss_info.scalar_loss == ()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_half_precision_entropies_move_alpha_as_their_float32_values(kind, dtype):
    """An autocast policy's bf16/fp16 entropies are taken in float32."""
    half, ref = FACTORIES[kind](), FACTORIES[kind]()
    for h in (1.2, 0.9, 0.4, 0.3, 0.6):
        entropies = torch.full((8,), h).to(dtype)
        half.entropy_loss(_entropy(half, entropies))
        ref.entropy_loss(_entropy(ref, entropies.float()))
        assert torch.equal(half.alpha, ref.alpha), h


def test_sgd_adjust_alpha_steps_its_optimiser_in_the_gradient_direction():
    sgd = SGDEntropyTargetAlgorithm(
        BoundedTensorSpec((), torch.int64, 0, 3),
        target_entropy=0.5,
        optimizer="sgd",
        lr=0.5,
        initial_alpha=1.0,
    )
    sgd.adjust_alpha(1.5)  # loss log_alpha * (1.5 - 0.5): gradient 1, step -0.5
    assert sgd.log_alpha.item() == pytest.approx(-0.5)
    sgd.adjust_alpha(0.0)  # gradient -0.5: step +0.25
    assert sgd.log_alpha.item() == pytest.approx(-0.25)


def test_bad_entropy_input_is_rejected():
    controller = FACTORIES["staged"]()
    with pytest.raises(TypeError, match="entropy"):
        controller.adjust_alpha("high")
    with pytest.raises(ValueError, match="entropy"):
        controller.adjust_alpha(torch.ones(3))
    with pytest.raises(ValueError, match="broadcast"):
        controller.entropy_loss(torch.ones(3, 2), torch.ones(3, dtype=torch.bool))


def test_gin_fixed_coefficient_is_a_constant_entropy_bonus_in_ppo():
    from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
    from alf_entropy.tensor_specs import TensorSpec

    gin.parse_config(
        """
        import alf_entropy.algorithms.entropy_target_algorithm
        PPOAlgorithm.enforce_entropy_target = True
        PPOAlgorithm.entropy_target_cls = @FixedEntropyCoefficient
        FixedEntropyCoefficient.alpha = 0.05
        """
    )
    alg = PPOAlgorithm(TensorSpec((4,)), BoundedTensorSpec((), torch.int64, 0, 1))
    controller = alg.entropy_target_algorithm
    assert isinstance(controller, FixedEntropyCoefficient)
    assert float(alg.entropy_coefficient()) == pytest.approx(0.05)
