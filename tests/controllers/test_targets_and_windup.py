"""Targets users can state, annealing when settled, the windup watch and the
per-iteration cap on alpha, over every adaptive controller."""

import math
import warnings

import numpy as np
import pytest
import torch

from alf_entropy.algorithms.entropy_target_algorithm import (
    EntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.controllers import (
    MAX_ALPHA,
    WINDUP_WINDOW,
    FixedEntropyCoefficient,
    LinearPIDEntropyTargetAlgorithm,
    PIDEntropyTargetAlgorithm,
)
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils import summary
from alf_entropy.utils.dist_utils import greedy_probability_target
from alf_entropy.utils.schedulers import SettledAnnealing
from tests.controllers.test_entropy_target_algorithm import _forbid_host_sync

TWO = BoundedTensorSpec((), torch.int64, 0, 1)
ADAPTIVE = {
    "staged": lambda **kw: EntropyTargetAlgorithm(TWO, skip_free_stage=True, **kw),
    "sgd": lambda **kw: SGDEntropyTargetAlgorithm(TWO, **kw),
    "pid": lambda **kw: PIDEntropyTargetAlgorithm(TWO, **kw),
}


@pytest.mark.parametrize(
    "n, p, want",
    [
        (2, 0.5, math.log(2)),
        (2, 1.0, 0.0),
        (4, 0.25, math.log(4)),
        (4, 0.7, -0.7 * math.log(0.7) - 0.3 * math.log(0.1)),
        (18, 0.9, -0.9 * math.log(0.9) - 0.1 * math.log(0.1 / 17)),
    ],
)
def test_greedy_probability_target(n, p, want):
    assert greedy_probability_target(p, n) == pytest.approx(want)


def test_greedy_probability_target_rejects_bad_input():
    with pytest.raises(ValueError, match="num_actions"):
        greedy_probability_target(0.9, 1)
    with pytest.raises(ValueError, match=r"p must be in \[1/num_actions, 1\]"):
        greedy_probability_target(0.2, 4)
    with pytest.raises(TypeError, match="p must be a real number"):
        greedy_probability_target("0.9", 4)


@pytest.mark.parametrize("cls", [EntropyTargetAlgorithm, PIDEntropyTargetAlgorithm])
def test_greedy_probability_target_is_refused_for_another_action_spec(cls):
    target = greedy_probability_target(0.8, 4)
    c = cls(BoundedTensorSpec((), torch.int64, 0, 3), target_entropy=target)
    assert float(c.target_entropy) == pytest.approx(float(target))
    with pytest.raises(ValueError, match="continuous actions"):
        cls(BoundedTensorSpec((2,), torch.float32, -1.0, 1.0), target_entropy=target)
    with pytest.raises(ValueError, match="for 4 actions, but the action spec has 6"):
        cls(BoundedTensorSpec((), torch.int64, 0, 5), target_entropy=target)
    import copy
    import pickle

    for twin in (copy.deepcopy(target), pickle.loads(pickle.dumps(target))):
        assert twin == target and twin.num_actions == 4


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"factor": 1.0}, "factor"),
        ({"tolerance": 0.0}, "tolerance"),
        ({"window": 0}, "window"),
        ({"final": 2.0}, "final"),
    ],
)
def test_settled_annealing_rejects_bad_arguments(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        SettledAnnealing(0.6, **kwargs)


@pytest.mark.parametrize("kind", sorted(ADAPTIVE))
def test_settled_annealing_lowers_the_target_once_settled(kind):
    controller = ADAPTIVE[kind](
        target_entropy=SettledAnnealing(0.6, factor=0.5, window=20, final=0.2)
    )
    for _ in range(10):
        controller.adjust_alpha(0.3)  # far from the target: no step
    assert controller.target_entropy == pytest.approx(0.6)
    for _ in range(400):  # the smoothed entropy settles, 20 updates in the band: 0.6 -> 0.3
        controller.adjust_alpha(0.6)
    assert controller.target_entropy == pytest.approx(0.3)
    for _ in range(1000):
        controller.adjust_alpha(controller.target_entropy)
    assert controller.target_entropy == pytest.approx(0.2)  # the floor
    # The target it is at is state: a fresh controller resumes there.
    resumed = ADAPTIVE[kind](target_entropy=SettledAnnealing(0.6, factor=0.5, window=20, final=0.2))
    resumed.load_state_dict(controller.state_dict())
    assert resumed.target_entropy == pytest.approx(0.2)


def test_annealing_runs_without_host_reads():
    pid = PIDEntropyTargetAlgorithm(
        TWO, target_entropy=SettledAnnealing(0.6, window=3), update_mode="tensor"
    )
    with _forbid_host_sync():
        for _ in range(10):
            pid.entropy_loss(torch.full((4,), 0.6))
    # One step (0.6 -> 0.54): the entropy, still 0.6, is then outside the new band.
    assert pid.target_entropy == pytest.approx(0.54, rel=1e-6)


@pytest.mark.parametrize("kind", sorted(ADAPTIVE))
def test_every_adaptive_controller_warns_once_about_an_unreachable_target(kind, tmp_path):
    """Pinned far below its target; the SGD rule (no host path) speaks at summary steps."""
    kw = {"optimizer": "sgd", "lr": 0.05} if kind == "sgd" else {}
    # At max_alpha below the target for WINDUP_WINDOW updates: alpha can do no more.
    controller = ADAPTIVE[kind](target_entropy=0.68, initial_alpha=0.01, max_alpha=5.0, **kw)
    summary.set_default_writer(summary.create_summary_writer(str(tmp_path)))
    try:
        with warnings.catch_warnings(record=True) as caught, summary.record_if(lambda: True):
            warnings.simplefilter("always")
            for k in range(2000):  # creeping down: ALF's rule climbs too
                controller.adjust_alpha(0.25 - 1e-5 * k)
    finally:
        summary.set_default_writer(None)
    messages = [str(w.message) for w in caught if "unreachable" in str(w.message)]
    assert len(messages) == 1, messages
    assert bool(controller.unreachable_target)


@pytest.mark.parametrize("kind", sorted(ADAPTIVE))
def test_a_reachable_target_does_not_warn(kind):
    controller = ADAPTIVE[kind](target_entropy=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in range(500):
            controller.adjust_alpha(0.5 + 0.1 * math.sin(k / 10))
    assert not bool(controller.unreachable_target)


@pytest.mark.parametrize("kind", sorted(ADAPTIVE))
def test_the_alpha_change_per_iteration_holds_over_every_update_between_steps(kind):
    kw = {"optimizer": "sgd", "lr": 5.0} if kind == "sgd" else {}
    controller = ADAPTIVE[kind](target_entropy=0.6, **kw)
    start = controller.log_alpha.item()
    controller.configure(max_alpha_change_per_iteration=math.exp(0.2))
    seen = [start]
    for k in range(30):
        h = 0.1 - 1e-3 * k if k < 15 else 0.69  # pushes alpha up hard, then down
        seen.append(controller.adjust_alpha(h).log().item())
        assert max(seen) - min(seen) <= 0.2 + 1e-6, seen
    assert max(seen) - min(seen) > 0.1  # it did move
    end = controller.step().log().item()  # an iteration's end: a new span starts ...
    assert end < controller.adjust_alpha(0.07).log().item() <= end + 0.2 + 1e-6  # ... from here
    controller.configure(max_alpha_change_per_iteration=None)
    for k in range(30):
        controller.adjust_alpha(0.07 - 1e-3 * k)
    assert controller.log_alpha.item() > start + 0.2


@pytest.mark.parametrize("kind", sorted(ADAPTIVE))
def test_the_watch_smooths_the_entropy(kind):
    """The watch compares a smoothed entropy (WATCH_EMA), not each noisy batch."""
    from alf_entropy.controllers import WATCH_EMA

    controller = ADAPTIVE[kind](target_entropy=0.6)
    controller.adjust_alpha(0.5)
    controller.adjust_alpha(1.0)
    controller.adjust_alpha(float("nan"))  # not counted
    assert controller.driver.count.item() == 2
    assert controller.driver.ema.item() == pytest.approx(WATCH_EMA * 0.5 + (1 - WATCH_EMA) * 1.0)


def test_settled_annealing_steps_down_a_target_out_of_reach():
    """Pinned at 0.3 under a 0.68 target: alpha at its ceiling (a stall) counts as settled,
    so the target steps down to the entropy (then on down, settled)."""
    pid = PIDEntropyTargetAlgorithm(
        TWO,
        initial_alpha=0.1,
        max_alpha=1.0,
        target_entropy=SettledAnnealing(0.68, factor=0.9, window=100, final=0.2),
    )
    with pytest.warns(UserWarning, match="unreachable"):  # once, before it steps down
        alphas = [pid.adjust_alpha(0.3).item() for _ in range(3000)]
    assert 0.2 <= pid.target_entropy < 0.3
    assert max(alphas) <= 1.0 + 1e-6
    assert not bool(pid.unreachable_target)


def test_a_nested_controller_reports_any_leaf_unreachable():
    from alf_entropy.algorithms.entropy_target_algorithm import NestedEntropyTargetAlgorithm

    nested = NestedEntropyTargetAlgorithm(
        {"a": TWO, "b": TWO},
        leaf_cls=PIDEntropyTargetAlgorithm,
        target_entropy={"a": 0.68, "b": 0.4},
        initial_alpha=0.01,
        max_alpha=1.0,
    )
    with pytest.warns(UserWarning, match="unreachable"):
        for _ in range(2000):  # "a" pinned far below its target, "b" on it
            nested.adjust_alpha({"a": 0.3, "b": 0.4})
    leaves = nested.leaf_algorithms()
    assert bool(leaves["a"].unreachable_target) and not bool(leaves["b"].unreachable_target)
    assert bool(nested.unreachable_target)
    nested.adjust_alpha({"a": float("nan"), "b": 0.4})
    assert nested.num_nonfinite_entropy.item() == 1


@pytest.mark.parametrize(
    "spec, hint, not_hint",
    [
        (
            BoundedTensorSpec((2,), torch.float32, -1.0, 1.0),
            "bounds of the continuous actions",
            "log N",
        ),
        (TWO, "log N for N discrete actions", "continuous"),
    ],
)
def test_a_target_over_the_maximum_names_the_bound_of_its_own_action_kind(spec, hint, not_hint):
    with pytest.raises(ValueError, match="above the largest entropy") as info:
        EntropyTargetAlgorithm(spec, target_entropy=5.0)
    assert hint in str(info.value) and not_hint not in str(info.value)


@pytest.mark.parametrize("share, fires", [(0.66, True), (0.4, False)])
def test_the_watch_counts_a_stall_that_noise_keeps_interrupting(share, fires):
    """Alpha at its ceiling for 66 % of 2,000 updates, never 500 in a row (discrete SAC on
    CartPole, noise knocking alpha off the ceiling): a stall for most of the window is found;
    40 % is not."""
    from alf_entropy.controllers.driver import state_type
    from alf_entropy.controllers.ops import ScalarOps
    from alf_entropy.controllers.watch import anneal_of, watch_rule

    at_ceiling = np.random.default_rng(0).random(2000) < share
    runs = np.diff(np.flatnonzero(np.diff(np.r_[0, at_ceiling.astype(int), 0])))[::2]
    assert runs.max() < WINDUP_WINDOW
    state = state_type("State")(0.0, 0.68, 0.3, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0)
    for at in at_ceiling:
        state = watch_rule(
            ScalarOps, state._replace(log_alpha=0.0 if at else -1.0), 0.3, anneal_of(None), 0.0
        )
    assert (state.stalled_for >= WINDUP_WINDOW) == fires


def test_a_plant_that_never_answers_is_flagged_with_alpha_finite_and_at_most_1e6():
    """No max_alpha, entropy readings fixed at 0.5 under a target of 0.679, the PID's defaults:
    alpha stops at the default ceiling (MAX_ALPHA = 1e6), the watch flags the target within
    2,000 updates, with one warning; no state ever holds inf or NaN (it reached inf at update
    ~420 when the ceiling was infinite).  (ALF's staged rule lowers alpha on a flat reading,
    and the SGD and linear rules climb by about lr or ki per update: see docs/controllers.md.)"""
    controller = PIDEntropyTargetAlgorithm(TWO, target_entropy=0.679)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flagged = None
        for k in range(2000):
            controller.adjust_alpha(0.5)
            assert all(torch.isfinite(v).all() for v in controller.driver.state), k
            assert controller.alpha.item() <= MAX_ALPHA * (1 + 1e-6)
            if flagged is None and bool(controller.unreachable_target):
                flagged = k
    assert flagged is not None and flagged < 2000
    assert controller.alpha.item() == pytest.approx(MAX_ALPHA, rel=1e-6)
    assert len([w for w in caught if "unreachable" in str(w.message)]) == 1


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (LinearPIDEntropyTargetAlgorithm, dict(min_alpha=0.0, initial_alpha=0.0)),
        (FixedEntropyCoefficient, dict(alpha=0.0)),
        (EntropyTargetAlgorithm, dict(min_alpha=0.0, initial_alpha=1e-30, skip_free_stage=True)),
    ],
)
def test_an_alpha_of_zero_or_at_the_floor_is_a_finite_state(cls, kwargs):
    """A coefficient of exactly 0 is ``log_alpha = LOG_ZERO`` (its exp is 0 in float32), and
    ``min_alpha <= 0`` floors a log-space rule at exp(-100), as ALF documents: never -inf."""
    controller = cls(TWO, target_entropy=0.3, **kwargs)
    for _ in range(300):
        controller.adjust_alpha(0.69)  # far above the target: down to the floor
    assert all(torch.isfinite(v).all() for v in controller.driver.state)
    expected = 0.0 if cls is not EntropyTargetAlgorithm else math.exp(-100)
    assert controller.alpha.item() == pytest.approx(expected, abs=1e-45)
