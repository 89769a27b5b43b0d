"""ALF behaviours of the controllers (mask broadcasting, nested, SGD) and the
safety nets of the target (range checks, clamping, unfed progress)."""

import functools
import math
import warnings

import numpy as np
import pytest
import torch

from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm
from alf_entropy.algorithms.algorithm import Algorithm
from alf_entropy.algorithms.entropy_target_algorithm import (
    EntropyTargetAlgorithm,
    EntropyTargetInfo,
    EntropyTargetLossInfo,
    NestedEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.data_structures import Experience, LossInfo, StepType, TimeStep
from alf_entropy.networks import ActorDistributionNetwork
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
from alf_entropy.utils import dist_utils, schedulers
from tests.controllers.seed_reference import SeedController

DISCRETE2 = BoundedTensorSpec((), torch.int64, 0, 1)  # max entropy log 2
DISCRETE4 = BoundedTensorSpec((), torch.int64, 0, 3)
CONT1 = BoundedTensorSpec((1,), torch.float32, 0.0, 3.0)


def _info(alg, neg_entropy):
    """A ``train_step`` info holding ``neg_entropy`` (as for a Categorical)."""
    return EntropyTargetInfo(
        loss=LossInfo(loss=neg_entropy, extra=EntropyTargetLossInfo(neg_entropy=neg_entropy))
    )


# ---------------------------------------------------------- mask broadcasting
@pytest.mark.parametrize("mode", ["host", "tensor"])
def test_a_scalar_or_batch_step_type_broadcasts_like_the_seed(mode):
    """0-d and [B] step types against [T, B] entropies: the same trajectory as
    the full mask, i.e. the mean over the broadcast steps."""
    rng = np.random.default_rng(0)
    algs = {
        k: EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.6, update_mode=mode)
        for k in ("full", "scalar")
    }
    ref = SeedController(target_entropy=0.6)
    for it in range(25):
        neg = -torch.tensor(rng.uniform(0.2, 1.3, (5, 3)) - it * 0.02, dtype=torch.float32)
        mid = torch.full((5, 3), StepType.MID)
        full = algs["full"].calc_loss(_info(algs["full"], neg)._replace(step_type=mid))
        scalar = algs["scalar"].calc_loss(
            _info(algs["scalar"], neg)._replace(step_type=torch.tensor(StepType.MID))
        )
        ref.calc_loss_entropy(neg, torch.full((5, 3), StepType.MID))
        torch.testing.assert_close(scalar.loss, full.loss)
        assert torch.equal(algs["scalar"].log_alpha, algs["full"].log_alpha)
        assert torch.equal(algs["full"].log_alpha, ref.log_alpha)  # shapes match: seed-exact
    # [B] step type (LAST in column 1) and [B] valid mask (drops column 2):
    # only column 0 counts, averaged over its steps.
    batch = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.6, max_entropy=1.3, update_mode=mode)
    neg = -torch.tensor([[0.2, 9.0, 9.0], [0.4, 9.0, 9.0]])
    info = _info(batch, neg)._replace(step_type=torch.tensor([1, StepType.LAST, 1]))
    batch.calc_loss(info, valid_mask=torch.tensor([1.0, 1.0, 0.0]))
    assert batch.avg_entropy.item() == pytest.approx(0.3)  # a mean, not the seed's sum 0.6


def test_masks_that_do_not_broadcast_are_rejected():
    alg = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5)
    neg = -torch.ones(3, 2)
    with pytest.raises(ValueError, match="shape"):
        alg.calc_loss(_info(alg, neg)._replace(step_type=torch.ones(4)))
    with pytest.raises(ValueError, match="valid_mask"):
        alg.calc_loss(_info(alg, neg)._replace(step_type=torch.ones(3, 2)), torch.ones(3))


def test_alf_style_run_through_every_stage_with_a_normal_policy():
    """ALF's own test, in our signatures: a 0-d MID step type, 100 samples of a
    Normal policy, the stage forced to each of -3..0."""
    from alf_entropy.networks import NormalProjectionNetwork

    torch.manual_seed(0)
    spec = BoundedTensorSpec((1,), torch.float32, 0.0, 3.0)
    alg = EntropyTargetAlgorithm(action_spec=spec)
    dist = NormalProjectionNetwork(10, spec)(10 * torch.rand(100, 10))
    info = alg.train_step((dist, torch.as_tensor(StepType.MID))).info
    assert alg.predict_step((dist, StepType.MID)).info == ()
    for stage in range(-3, 1):
        alg.driver.stage = torch.tensor(stage, dtype=torch.int32)
        loss = alg.calc_loss(info._replace(step_type=torch.as_tensor(StepType.MID)))
        assert loss.loss.shape == (100,) and torch.isfinite(loss.loss).all()


# ------------------------------------------------------------------- nested
def test_nested_the_alf_way_one_max_entropy_per_leaf_lists_and_nested_extra():
    spec = {"a": CONT1, "b": DISCRETE4}
    nested = NestedEntropyTargetAlgorithm(
        spec, target_entropy=[0.2, 0.5], max_entropy=1.2, skip_free_stage=False
    )
    leaves = nested.leaf_algorithms()
    assert [leaves[k].target_entropy for k in ("a", "b")] == [0.2, 0.5]
    assert all(leaves[k].max_entropy.item() == pytest.approx(1.2) for k in ("a", "b"))
    assert all(leaves[k].stage.item() == -2 for k in ("a", "b"))  # max_entropy given
    assert nested.target_entropy == pytest.approx(0.7)
    defaults = NestedEntropyTargetAlgorithm(spec, target_entropy={"a": None, "b": None})
    assert defaults.leaf_algorithms()["b"].target_entropy == pytest.approx(
        dist_utils.calc_default_target_entropy(DISCRETE4)
    )
    entropy = {"a": torch.full((4, 2), 1.0), "b": torch.full((4, 2), 1.3)}
    li = nested.entropy_loss(entropy, torch.ones(4, 2, dtype=torch.bool))
    torch.testing.assert_close(
        li.loss, -(leaves["a"].alpha * 1.0 + leaves["b"].alpha * 1.3).expand(4, 2)
    )
    nested.adjust_alpha({"a": 0.9, "b": torch.tensor(1.2)})
    assert nested.stage.item() == min(leaves["a"].stage.item(), leaves["b"].stage.item())
    torch.testing.assert_close(nested.alpha, (leaves["a"].alpha + leaves["b"].alpha) / 2)
    with pytest.raises(ValueError, match="max_entropy"):
        NestedEntropyTargetAlgorithm(spec, max_entropy=[1.0, 2.0, 3.0])


# ---------------------------------------------------------------------- SGD
def test_sgd_window_size_averages_the_entropy_before_the_gradient():
    # Used alone, entropy_loss steps log_alpha with the gradient H_avg - target.
    sgd = SGDEntropyTargetAlgorithm(
        DISCRETE4, target_entropy=0.5, window_size=2, initial_alpha=1.0, optimizer="sgd", lr=1.0
    )
    sgd.entropy_loss(torch.full((3,), 1.0))  # average 1.0: gradient 0.5
    assert sgd.log_alpha.item() == pytest.approx(-0.5)
    sgd.entropy_loss(torch.full((3,), 2.0))  # average (1 + 2) / 2: gradient 1.0
    assert sgd.log_alpha.item() == pytest.approx(-1.5)


class _SGDParent(Algorithm):
    """A parent whose optimiser (built in its constructor) trains an SGD controller."""

    def __init__(self, lr=0.5, **controller_kwargs):
        super().__init__(optimizer=functools.partial(torch.optim.SGD, lr=lr), name="p")
        self.w = torch.nn.Parameter(torch.ones(2))
        self.controller = SGDEntropyTargetAlgorithm(
            DISCRETE4, target_entropy=0.5, initial_alpha=1.0, **controller_kwargs
        )
        self.optimizers()


def test_sgd_steps_its_own_optimiser_and_a_parents_never_holds_log_alpha():
    parent = _SGDParent()
    (opt,) = parent.optimizers()  # the parent's: w only
    assert [p for g in opt.param_groups for p in g["params"]] == [parent.w]
    parent.w.grad = torch.full((2,), 7.0)
    parent.controller.adjust_alpha(1.5)  # gradient 1.0: SAC's Adam(3e-4) steps log_alpha
    assert parent.controller.log_alpha.item() == pytest.approx(-3e-4, rel=1e-3)
    assert torch.equal(parent.w.detach(), torch.ones(2))  # untouched ...
    assert torch.equal(parent.w.grad, torch.full((2,), 7.0))  # ... and its gradient kept


# ------------------------------------------------------------------- targets
@pytest.mark.parametrize("cls", [EntropyTargetAlgorithm, SGDEntropyTargetAlgorithm])
def test_every_knot_of_a_schedule_is_checked_against_the_reachable_entropy(cls):
    climbing = schedulers.LinearScheduler("percent", [(0, 0.65), (1, 0.8)])  # log 2 = 0.693
    with pytest.raises(ValueError, match="largest entropy"):
        cls(DISCRETE2, target_entropy=climbing)
    with pytest.raises(ValueError, match="largest entropy"):
        cls(DISCRETE2, target_entropy=schedulers.StepScheduler("percent", [(0.5, 0.3), (1, 0.9)]))
    cls(DISCRETE2, target_entropy=schedulers.LinearScheduler("percent", [(0, 0.65), (1, 0.3)]))


def test_an_arbitrary_callable_is_clamped_with_one_warning():
    schedulers.reset_progress()
    values = iter([0.5, 0.9, 1.0, 0.2] + [0.9] * 20)
    with pytest.warns(UserWarning, match="largest entropy") as record:
        alg = EntropyTargetAlgorithm(
            DISCRETE2, target_entropy=lambda: next(values), skip_free_stage=True
        )
        targets = []
        for _ in range(20):
            alg.adjust_alpha(0.6)
            targets.append(alg.driver.target.item())
    assert len([w for w in record if "largest entropy" in str(w.message)]) == 1
    assert max(targets) == pytest.approx(math.log(2))


def test_unfed_progress_warns_once_naming_update_progress():
    schedulers.reset_progress()
    sched = schedulers.LinearScheduler("percent", [(0, 1.0), (1, 0.2)])
    alg = EntropyTargetAlgorithm(DISCRETE4, target_entropy=sched)
    with pytest.warns(UserWarning, match="update_progress") as record:
        for _ in range(30):
            alg.adjust_alpha(1.0)
    assert len(record) == 1
    fed = EntropyTargetAlgorithm(DISCRETE4, target_entropy=sched)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(30):
            schedulers.update_progress("percent", i / 30)
            fed.adjust_alpha(1.0)
    schedulers.reset_progress()


# ------------------------------------------------------------- actor-critic
def test_actor_critic_computes_the_entropy_once_and_logs_what_it_controls(monkeypatch):
    calls = []
    original = dist_utils.entropy_with_fallback

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    import alf_entropy.controllers.alf as ec

    monkeypatch.setattr(dist_utils, "entropy_with_fallback", counting)
    monkeypatch.setattr(ec, "entropy_with_fallback", counting)
    torch.manual_seed(0)
    spec = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
    alg = ActorCriticAlgorithm(
        TensorSpec((3,)),
        spec,
        enforce_entropy_target=True,
        actor_network_ctor=functools.partial(ActorDistributionNetwork, squash_to_spec=True),
    )
    exp = Experience(
        time_step=TimeStep(
            observation=torch.randn(6, 3), step_type=torch.ones(6, dtype=torch.int64)
        ),
        action=torch.zeros(6, 2),
    )
    info = alg.train_step(exp).info
    # tanh-squashed: a sampled estimate, drawn once; the logged and the controlled entropy are
    # the same sample.
    assert len(calls) == 1 and info.entropy.shape == (6,)


@pytest.mark.parametrize("mode", ["host", "tensor"])
def test_init_stage_moves_down_while_the_entropy_rises_and_up_by_half_while_it_falls(mode):
    """docs/controllers.md's description of stage 0 (it once said 'drifts down')."""
    alg = EntropyTargetAlgorithm(
        DISCRETE4,
        initial_alpha=1.0,
        max_entropy=0.5,
        target_entropy=0.2,
        very_slow_update_rate=0.01,
        update_mode=mode,
    )
    steps = []
    for entropy in (1.2, 1.3, 1.3, 1.1, 1.0):  # rises, holds, falls, falls; all above max
        before = alg.log_alpha.item()
        alg.adjust_alpha(entropy)
        steps.append(round(alg.log_alpha.item() - before, 6))
        assert alg.stage.item() == -2
    assert steps == [-0.01, -0.01, -0.01, 0.005, 0.005]


def test_actor_critic_entropy_equals_the_analytic_one_with_and_without_controller():
    torch.manual_seed(0)
    obs = torch.randn(5, 3)
    exp = Experience(
        time_step=TimeStep(observation=obs, step_type=torch.ones(5, dtype=torch.int64)),
        action=torch.zeros(5, dtype=torch.int64),
    )
    infos = []
    for enforce in (False, True):
        torch.manual_seed(1)
        alg = ActorCriticAlgorithm(TensorSpec((3,)), DISCRETE4, enforce_entropy_target=enforce)
        infos.append((alg.train_step(exp).info, alg.actor_network(obs)))
    (plain, dist), (controlled, _) = infos
    torch.testing.assert_close(plain.entropy, dist.entropy(), rtol=0, atol=0)
    assert torch.equal(controlled.entropy, plain.entropy)
    assert torch.equal(controlled.entropy_for_gradient, plain.entropy_for_gradient)
