"""One call site for every controller.

The same training loop, written once, drives each controller: a synthetic
collapsing policy (4-way softmax logits pushed by Adam to one action, as in
``benchmarks/control_quality.py``) with the entropy bonus
``bonus = controller.entropy_loss(entropy)``, ``loss = task + bonus.loss.mean()`` (or
``controller.adjust_alpha(mean entropy)`` and ``-controller.alpha * entropy``).  Every
adaptive controller must raise ``alpha`` as the entropy collapses below its target; the fixed
one must not move.  Add a controller by adding a factory to ``CONTROLLERS``.
"""

import functools
from typing import Callable, List, NamedTuple

import gymnasium as gym
import pytest
import torch

from alf_entropy.algorithms.algorithm import Algorithm
from alf_entropy.algorithms.entropy_target_algorithm import (
    EntropyController,
    EntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    NestedEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.controllers import PIDEntropyTargetAlgorithm
from alf_entropy.tensor_specs import BoundedTensorSpec

SPACE = gym.spaces.Discrete(4)
TARGET = 0.6
INITIAL_ALPHA = 0.01
NUM_UPDATES = 400


class Factory(NamedTuple):
    name: str
    make: Callable[[], EntropyController]
    adaptive: bool  # whether alpha must follow the entropy
    holds: bool = False  # whether it must hold the entropy near the target within NUM_UPDATES


CONTROLLERS: List[Factory] = [
    Factory(
        "staged",
        lambda: EntropyTargetAlgorithm.from_space(
            SPACE, target_entropy=TARGET, initial_alpha=INITIAL_ALPHA
        ),
        adaptive=True,
        holds=True,
    ),
    Factory(
        "sgd, own Adam",
        lambda: SGDEntropyTargetAlgorithm.from_space(
            SPACE, target_entropy=TARGET, initial_alpha=INITIAL_ALPHA, lr=0.01
        ),
        adaptive=True,
    ),
    Factory(
        "sgd, built-in Adam(3e-4)",
        lambda: SGDEntropyTargetAlgorithm.from_space(
            SPACE, target_entropy=TARGET, initial_alpha=INITIAL_ALPHA
        ),
        adaptive=True,
    ),
    Factory(
        "nested",
        lambda: NestedEntropyTargetAlgorithm.from_space(
            gym.spaces.Dict({"a": SPACE}), target_entropy={"a": TARGET}, initial_alpha=INITIAL_ALPHA
        ),
        adaptive=True,
        holds=True,
    ),
    Factory(
        "pid",
        lambda: PIDEntropyTargetAlgorithm.from_space(
            SPACE, target_entropy=TARGET, initial_alpha=INITIAL_ALPHA
        ),
        adaptive=True,
        holds=True,
    ),
    Factory(
        "nested pid",
        lambda: NestedEntropyTargetAlgorithm.from_space(
            gym.spaces.Dict({"a": SPACE}),
            leaf_cls=PIDEntropyTargetAlgorithm,
            target_entropy={"a": TARGET},
            initial_alpha=INITIAL_ALPHA,
        ),
        adaptive=True,
        holds=True,
    ),
    Factory(
        "fixed",
        lambda: FixedEntropyCoefficient.from_space(SPACE, alpha=INITIAL_ALPHA),
        adaptive=False,
    ),
]


def _as_spec(controller: EntropyController, entropy):
    """``entropy`` shaped like the controller's action spec (a nest for the nested one)."""
    spec = controller.action_spec
    return {key: entropy for key in spec} if isinstance(spec, dict) else entropy


def _train(controller: EntropyController, call_site: str, num_updates: int = NUM_UPDATES):
    """The one training loop; returns the entropy of each update."""
    torch.manual_seed(0)
    logits = torch.nn.Parameter(torch.zeros(4))
    policy_opt = torch.optim.Adam([logits], lr=0.05)
    entropies = []
    for _ in range(num_updates):
        dist = torch.distributions.Categorical(logits=logits.expand(8, 4))
        entropy = dist.entropy()
        task_loss = -dist.probs[:, 0].mean()  # pushes the policy to action 0
        if call_site == "entropy_loss":
            bonus = controller.entropy_loss(_as_spec(controller, entropy))
            loss = task_loss + bonus.loss.mean()
        else:
            controller.adjust_alpha(_as_spec(controller, entropy.detach().mean()))
            loss = task_loss - (controller.alpha * entropy).mean()
        policy_opt.zero_grad()
        loss.backward()
        policy_opt.step()
        entropies.append(entropy.detach().mean().item())
    return entropies


@pytest.mark.parametrize("call_site", ["entropy_loss", "adjust_alpha"])
@pytest.mark.parametrize("factory", CONTROLLERS, ids=[f.name for f in CONTROLLERS])
def test_one_unchanged_loop_moves_alpha_for_every_adaptive_controller(factory, call_site):
    torch.set_num_threads(1)
    controller = factory.make()
    alpha0 = controller.alpha.item()
    entropies = _train(controller, call_site)
    alpha = controller.alpha.item()
    assert min(entropies) < TARGET  # the task did push the entropy below the target
    if factory.adaptive:
        assert alpha > 1.05 * alpha0, f"{factory.name}: alpha stayed at {alpha} (from {alpha0})"
    else:
        assert alpha == alpha0
        assert sum(entropies[-100:]) / 100 < 0.1  # nothing held it: it collapsed
    if factory.holds:
        last = entropies[-100:]
        assert abs(sum(last) / len(last) - TARGET) < 0.05, (factory.name, sum(last) / len(last))


def test_the_loss_carries_the_gradient_to_the_entropy_for_every_controller():
    for factory in CONTROLLERS:
        controller = factory.make()
        entropy = torch.full((5,), 1.0, requires_grad=True)
        controller.entropy_loss(_as_spec(controller, entropy)).loss.mean().backward()
        torch.testing.assert_close(entropy.grad, -controller.alpha.expand(5) / 5)
        no_update = controller.entropy_loss(_as_spec(controller, entropy), update=False)
        assert no_update.loss.shape == (5,), factory.name


# ------------------------------------------------- who steps the SGD rule's alpha
DISCRETE4 = BoundedTensorSpec((), torch.int64, 0, 3)
SGD = functools.partial(torch.optim.SGD, lr=0.5)


class _Parent(Algorithm):
    """An ALF-style parent with its own optimiser, which never holds the controller's log_alpha."""

    def __init__(self):
        super().__init__(optimizer=SGD, name="parent")
        self.w = torch.nn.Parameter(torch.ones(2))
        self.controller = SGDEntropyTargetAlgorithm(
            DISCRETE4, target_entropy=0.5, initial_alpha=1.0, optimizer="sgd", lr=0.5
        )
        self.optimizers()


def test_sgd_in_a_parent_steps_once_per_update_and_the_parent_does_not_step_it_again():
    parent = _Parent()
    entropy = torch.full((4,), 1.5) * parent.w[0]  # gradient 1.5 - 0.5 = 1
    li = parent.controller.entropy_loss(entropy)
    assert parent.controller.log_alpha.item() == pytest.approx(-0.5)  # one step of lr 0.5
    parent.update_with_gradient(li)
    assert parent.controller.log_alpha.item() == pytest.approx(-0.5)


def test_sgd_alone_steps_itself_once_even_if_the_caller_also_minimises_the_loss():
    sgd = SGDEntropyTargetAlgorithm(
        DISCRETE4, target_entropy=0.5, initial_alpha=1.0, optimizer="sgd", lr=0.5
    )
    assert list(sgd.parameters()) == []  # log_alpha is state: no optimiser of the caller's holds it
    li = sgd.entropy_loss(torch.full((4,), 1.5, requires_grad=True))
    assert sgd.log_alpha.item() == pytest.approx(-0.5)
    li.loss.mean().backward()
    assert sgd.log_alpha.item() == pytest.approx(-0.5)


def test_sgd_builtin_adam_matches_torch_adam():
    ours = SGDEntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, initial_alpha=1.0)
    ref = SGDEntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, initial_alpha=1.0, lr=3e-4)
    for h in (1.5, 0.2, 0.9, 0.1, 3.0):
        ours.entropy_loss(torch.full((3,), h))
        ref.adjust_alpha(h)
        torch.testing.assert_close(ours.log_alpha, ref.log_alpha, rtol=0, atol=1e-7)


# ------------------------------------------------------- min_alpha / max_alpha
def test_sgd_min_and_max_alpha_are_honoured():
    sgd = SGDEntropyTargetAlgorithm(
        DISCRETE4,
        optimizer="sgd",
        lr=1.0,
        target_entropy=0.5,
        initial_alpha=0.1,
        min_alpha=0.05,
        max_alpha=0.2,
    )
    for _ in range(5):
        sgd.entropy_loss(torch.full((4,), 1.4))  # far above the target: alpha falls ...
    assert sgd.alpha.item() == pytest.approx(0.05)  # ... to min_alpha, not below
    assert sgd.driver.log_alpha.item() == pytest.approx(torch.tensor(0.05).log().item())
    for _ in range(5):
        sgd.entropy_loss(torch.full((4,), 0.0))  # far below: alpha rises to max_alpha
    assert sgd.alpha.item() == pytest.approx(0.2)
    sgd.adjust_alpha(0.0)
    assert sgd.alpha.item() == pytest.approx(0.2)


def test_sgd_alpha_bounds_are_validated():
    with pytest.raises(ValueError, match=r"min_alpha \(0.5\).*max_alpha \(0.2\)"):
        SGDEntropyTargetAlgorithm(DISCRETE4, min_alpha=0.5, max_alpha=0.2)
    with pytest.raises(ValueError, match="min_alpha"):
        SGDEntropyTargetAlgorithm(DISCRETE4, min_alpha=float("nan"))
    with pytest.raises(ValueError, match="max_alpha"):
        SGDEntropyTargetAlgorithm(DISCRETE4, max_alpha=-1.0)
    with pytest.raises(TypeError, match="max_alpha"):
        SGDEntropyTargetAlgorithm(DISCRETE4, max_alpha="1")
    with pytest.raises(ValueError, match="initial_alpha"):
        SGDEntropyTargetAlgorithm(DISCRETE4, initial_alpha=1.0, max_alpha=0.5)
    with pytest.raises(ValueError, match="initial_alpha"):
        SGDEntropyTargetAlgorithm(DISCRETE4, initial_alpha=0.01, min_alpha=0.05)
    SGDEntropyTargetAlgorithm(DISCRETE4, initial_alpha=0.1, min_alpha=0.1, max_alpha=0.1)  # fixed
