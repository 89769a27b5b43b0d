"""Tests of the entropy target controllers.

The contract: for any entropy sequence our controller's trajectory of
``log_alpha``, stage, update rate and max entropy equals ALF's PyTorch version
(``seed_reference.SeedController``) step for step, in both update modes, with
no host synchronisation in the tensor mode.
"""

import contextlib
import math

import gin
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from alf_entropy.algorithms.algorithm import Algorithm
from alf_entropy.algorithms.entropy_target_algorithm import (
    EntropyTargetAlgorithm,
    EntropyTargetInfo,
    EntropyTargetLossInfo,
    NestedEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
    describe_stage,
)
from alf_entropy.data_structures import LossInfo, StepType
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils import schedulers, summary
from tests.controllers.seed_reference import SeedController

DISCRETE4 = BoundedTensorSpec((), torch.int64, 0, 3)  # max entropy log 4
CONT2 = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
MODES = ("host", "tensor")


def _state(alg):
    return (
        alg.log_alpha.clone(),
        alg.stage.clone(),
        alg.update_rate.clone(),
        alg.max_entropy.clone(),
    )


def _seed_state(ref):
    return (ref.log_alpha, ref.stage, ref.update_rate, ref.max_entropy)


def _assert_same(alg, ref, where=""):
    ours, theirs = _state(alg), _seed_state(ref)
    names = ("log_alpha", "stage", "update_rate", "max_entropy")
    for name, a, b in zip(names, ours, theirs):
        assert a.dtype == b.dtype, (where, name)
        assert torch.allclose(a.double(), b.double(), atol=1e-6, rtol=0), (
            f"{where}: {name} {a.item()} != seed {b.item()}"
        )


def _info(neg_entropy):
    return EntropyTargetInfo(
        loss=LossInfo(
            loss=neg_entropy.clone(), extra=EntropyTargetLossInfo(neg_entropy=neg_entropy)
        )
    )


# --------------------------------------------------------------- the numbers
HAND_SEQUENCE = [2.0, 2.0, 1.8, 1.2, 1.0, 0.6, 0.2, 1.4, 1.6, 1.6, 1.2, 0.8, 1.2, 2.0, 0.0, 1.0]
# (log_alpha, stage, update_rate, max_entropy) after each call, computed by
# hand from the seed's rules (window 2, target 1, very slow 0.01, slow 0.125,
# fast 0.5, initial alpha 1):
HAND_TRAJECTORY = [
    (0.0, -3, 0.5, 1.6),  # avg 2.0: max entropy = min(0.8*2, 2/0.8)
    (-0.01, -2, 0.5, 1.6),  # avg 2.0, 2nd estimate -> init runs too: not decreasing, -0.01
    (-0.005, -2, 0.5, 1.6),  # avg 1.9 decreasing: +0.5*0.01; still above max entropy
    (0.0, -1, 0.5, 1.6),  # avg 1.5 < 1.6: +0.005 and on to free; 1.5 > target stays free
    (0.0, -1, 0.5, 1.6),  # avg 1.1: free, alpha fixed
    (0.5, 0, 0.5, 1.6),  # avg 0.8 < 1: free -> adjust in the same call: below & decreasing +1*0.5
    (1.0, 0, 0.5, 1.6),  # avg 0.4: +0.5 (entropy 0.2 < 0.5 keeps the fast rate)
    (0.75, 0, 0.5, 1.6),  # avg 0.8 increasing, below: -0.5*0.5
    (0.3, 1, 0.45, 1.6),  # avg 1.5 crosses above: rate 0.9*0.5, above & increasing -1*0.45
    (-0.15, 1, 0.45, 1.6),  # avg 1.6: -0.45
    (0.075, 1, 0.45, 1.6),  # avg 1.4 decreasing, above: +0.5*0.45
    (0.48, 0, 0.405, 1.6),  # avg 1.0 (not above) crosses: rate 0.405, +1*0.405
    (0.2775, 0, 0.405, 1.6),  # avg 1.0 not decreasing: -0.5*0.405
    (-0.087, 1, 0.3645, 1.6),  # avg 1.6 crosses: 0.3645, -1
    (0.413, 0, 0.5, 1.6),  # avg 1.0 crosses, but entropy 0 < 0.5 = fast threshold: rate 0.5, +1
    (0.913, 0, 0.5, 1.6),  # avg 0.5 decreasing, below: +0.5
]
HAND_KWARGS = dict(
    initial_alpha=1.0,
    target_entropy=1.0,
    very_slow_update_rate=0.01,
    slow_update_rate=0.125,
    fast_update_rate=0.5,
)


@pytest.mark.parametrize("mode", MODES)
def test_hand_computed_trajectory_through_all_stages(mode):
    alg = EntropyTargetAlgorithm(DISCRETE4, update_mode=mode, **HAND_KWARGS)
    assert alg.stage.item() == -4  # estimating max entropy for 2 calls
    for i, (entropy, expected) in enumerate(zip(HAND_SEQUENCE, HAND_TRAJECTORY)):
        alpha = alg.adjust_alpha(torch.tensor(entropy))
        la, stage, rate, max_e = expected
        assert alg.log_alpha.item() == pytest.approx(la, abs=1e-6), i
        assert alg.stage.item() == stage, i
        assert alg.update_rate.item() == pytest.approx(rate, abs=1e-6), i
        assert alg.max_entropy.item() == pytest.approx(max_e, abs=1e-6), i
        assert alpha.item() == pytest.approx(math.exp(la), rel=1e-5), i


def test_hand_trajectory_matches_seed_oracle():
    ref = SeedController(**HAND_KWARGS)
    for entropy, (la, stage, rate, max_e) in zip(HAND_SEQUENCE, HAND_TRAJECTORY):
        ref.adjust_alpha(torch.tensor(entropy))
        assert ref.log_alpha.item() == pytest.approx(la, abs=1e-6)
        assert ref.stage.item() == stage


config_strategy = st.fixed_dictionaries(
    {
        "initial_alpha": st.sampled_from([0.01, 0.1, 1.0, 5.0]),
        "target_entropy": st.floats(-2.0, 1.3),
        "average_window": st.integers(1, 4),
        "skip_free_stage": st.booleans(),
        "max_entropy_gap": st.one_of(st.none(), st.floats(0.0, 1.0)),
        "rates": st.sampled_from(
            [(0.001, 0.01, np.log(2)), (0.01, 0.05, 0.5), (0.002, np.float64(0.02), 0.3)]
        ),
        "min_alpha": st.sampled_from([1e-4, 0.05, 0.0, -1.0]),
    }
)


def _make_pair(cfg, mode, target=None):
    very_slow, slow, fast = cfg["rates"]
    kwargs = dict(
        initial_alpha=cfg["initial_alpha"],
        target_entropy=cfg["target_entropy"] if target is None else target,
        average_window=cfg["average_window"],
        skip_free_stage=cfg["skip_free_stage"],
        very_slow_update_rate=very_slow,
        slow_update_rate=slow,
        fast_update_rate=fast,
        min_alpha=cfg["min_alpha"],
    )
    if cfg["max_entropy_gap"] is not None:
        kwargs["max_entropy"] = cfg["target_entropy"] + cfg["max_entropy_gap"]
    if cfg["min_alpha"] > cfg["initial_alpha"]:
        kwargs["min_alpha"] = cfg["initial_alpha"]
    ref = SeedController(**kwargs)
    # A continuous spec: the seed's negative targets are allowed (entropy up to 3 log 10);
    # the seed has no ceiling on alpha (ours: 1e6 by default).
    alg = EntropyTargetAlgorithm(
        BoundedTensorSpec((3,), torch.float32, -5.0, 5.0),
        update_mode=mode,
        max_alpha=3e38,
        **kwargs,
    )
    return alg, ref


@settings(max_examples=60, deadline=None)
@given(cfg=config_strategy, seq=st.lists(st.floats(-3.0, 2.25, width=32), min_size=1, max_size=40))
@pytest.mark.parametrize("mode", MODES)
def test_parity_with_seed_for_any_sequence(mode, cfg, seq):
    alg, ref = _make_pair(cfg, mode)
    for i, entropy in enumerate(seq):
        e = torch.tensor(entropy, dtype=torch.float32)
        ref.adjust_alpha(e)
        alg.adjust_alpha(e)
        _assert_same(alg, ref, f"call {i}")


@pytest.mark.parametrize("mode", MODES)
def test_parity_on_a_long_drifting_run_with_min_alpha_floor(mode):
    rng = np.random.default_rng(1)
    cfg = dict(
        initial_alpha=0.2,
        target_entropy=-0.5,
        average_window=3,
        skip_free_stage=True,
        max_entropy_gap=None,
        rates=(0.001, 0.01, np.log(2)),
        min_alpha=0.05,
    )
    alg, ref = _make_pair(cfg, mode)
    entropy, floor_hit = 0.0, False
    for i in range(400):
        # Rising above the target first (alpha pressed onto the floor), then falling.
        entropy += rng.normal(0.02 if i < 150 else -0.03, 0.15)
        e = torch.tensor(entropy, dtype=torch.float32)
        ref.adjust_alpha(e)
        alg.adjust_alpha(e)
        _assert_same(alg, ref, f"call {i}")
        floor_hit |= bool(abs(alg.alpha.item() - 0.05) < 1e-6)
    assert floor_hit, "the run should have pressed alpha onto min_alpha"


@pytest.mark.parametrize("mode", MODES)
def test_parity_with_a_target_that_changes_every_call(mode):
    sched = schedulers.LinearScheduler("iterations", [(0, 1.2), (50, 0.0)])
    cfg = dict(
        initial_alpha=0.1,
        target_entropy=1.2,
        average_window=2,
        skip_free_stage=False,
        max_entropy_gap=None,
        rates=(0.001, 0.01, np.log(2)),
        min_alpha=1e-4,
    )
    alg, ref = _make_pair(cfg, mode, target=sched)
    rng = np.random.default_rng(2)
    entropy = 1.8
    for i in range(80):
        schedulers.update_progress("iterations", i)
        entropy += rng.normal(-0.03, 0.1)
        e = torch.tensor(entropy, dtype=torch.float32)
        ref.adjust_alpha(e)
        alg.adjust_alpha(e)
        _assert_same(alg, ref, f"call {i}")
        assert alg.target_entropy == pytest.approx(sched())
    assert alg.stage.item() in (0, 1)


@pytest.mark.parametrize("mode", MODES)
def test_calc_loss_masks_last_steps_and_valid_mask_like_the_seed(mode):
    torch.manual_seed(0)
    alg = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.6, update_mode=mode)
    ref = SeedController(target_entropy=0.6)
    for it in range(30):
        neg = -(torch.rand(5, 3) * 1.2 + 0.8 - it * 0.03)
        step_type = torch.randint(0, 3, (5, 3))
        valid = torch.rand(5, 3) > 0.3
        mask_arg = valid if it % 2 else valid.float()
        alpha_ref = ref.calc_loss_entropy(neg, step_type, valid)
        loss = alg.calc_loss(_info(neg)._replace(step_type=step_type), mask_arg)
        _assert_same(alg, ref, f"iter {it}")
        torch.testing.assert_close(loss.loss, neg * alpha_ref)
        assert loss.extra.neg_entropy is not None


# ------------------------------------------------------------------- gating
@pytest.mark.parametrize("mode", MODES)
def test_empty_mask_changes_nothing(mode):
    alg = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, update_mode=mode)
    for e in (1.2, 1.1, 0.9):
        alg.adjust_alpha(torch.tensor(e))
    before = {k: v.clone() for k, v in alg.state_dict().items()}
    neg = -torch.ones(4, 2)
    all_last = torch.full((4, 2), StepType.LAST)
    alg.calc_loss(_info(neg)._replace(step_type=all_last))
    mid = torch.full((4, 2), StepType.MID)
    alg.calc_loss(_info(neg)._replace(step_type=mid), torch.zeros(4, 2, dtype=torch.bool))
    for k, v in alg.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("mode", MODES)
def test_nonfinite_entropy_changes_nothing_and_is_counted(mode):
    alg = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, update_mode=mode)
    alg.adjust_alpha(torch.tensor(1.0))
    before = {k: v.clone() for k, v in alg.state_dict().items() if k != "driver.nonfinite"}
    alg.adjust_alpha(torch.tensor(float("nan")))
    neg = -torch.ones(3, 2)
    neg[1, 0] = float("inf")
    alg.calc_loss(_info(neg)._replace(step_type=torch.ones(3, 2, dtype=torch.int64)))
    for k, v in alg.state_dict().items():
        if k != "driver.nonfinite":
            assert torch.equal(v, before[k]), k
    assert alg.num_nonfinite_entropy.item() == 2


@pytest.mark.parametrize("mode", MODES)
def test_nan_in_a_masked_out_step_is_ignored(mode):
    alg = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, update_mode=mode)
    ref = SeedController(target_entropy=0.5)
    neg = -torch.full((2, 2), 1.0)
    neg[0, 1] = float("nan")
    step_type = torch.tensor([[1, StepType.LAST], [1, 1]])
    alg.calc_loss(_info(neg)._replace(step_type=step_type))
    ref.adjust_alpha(torch.tensor(1.0))
    _assert_same(alg, ref)
    assert alg.num_nonfinite_entropy.item() == 0


# -------------------------------------------------------------- no host sync
@contextlib.contextmanager
def _forbid_host_sync():
    """Make every device->host conversion (and host tensor creation) raise."""

    def _boom(name):
        def f(*args, **kwargs):
            raise AssertionError(f"host sync: {name}")

        return f

    patched = {
        (torch.Tensor, "__bool__"): None,
        (torch.Tensor, "item"): None,
        (torch.Tensor, "__float__"): None,
        (torch.Tensor, "__int__"): None,
        (torch.Tensor, "__index__"): None,
        (torch.Tensor, "tolist"): None,
        (torch.Tensor, "numpy"): None,
        (torch, "tensor"): None,
        (torch, "as_tensor"): None,
    }
    for owner, name in patched:
        patched[(owner, name)] = getattr(owner, name)
        setattr(owner, name, _boom(name))
    try:
        yield
    finally:
        for (owner, name), orig in patched.items():
            setattr(owner, name, orig)


def test_forbid_host_sync_really_catches_syncs():
    with _forbid_host_sync():
        with pytest.raises(AssertionError):
            torch.ones(()).item()
        with pytest.raises(AssertionError):
            bool(torch.ones(()) > 0)
        with pytest.raises(AssertionError):
            torch.tensor(1.0)


def test_tensor_mode_never_syncs():
    sched = schedulers.LinearScheduler("iterations", [(0, 1.0), (10, 0.2)])
    algs = [
        EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, update_mode="tensor"),
        EntropyTargetAlgorithm(
            DISCRETE4,
            target_entropy=sched,
            update_mode="tensor",
            skip_free_stage=True,
            max_entropy=1.2,
        ),
        NestedEntropyTargetAlgorithm({"a": DISCRETE4, "b": CONT2}, update_mode="tensor"),
        # (Adam reads its step count on the host: a CPU tensor unless on a GPU, where the
        # default optimiser is capturable.)
        SGDEntropyTargetAlgorithm(
            DISCRETE4, target_entropy=sched, update_mode="tensor", optimizer="sgd", lr=0.1
        ),
    ]
    logits = torch.randn(6, 4, 4)
    loc = torch.zeros(6, 4, 2)
    step_type = torch.ones(6, 4, dtype=torch.int64)
    valid = torch.ones(6, 4, dtype=torch.bool)
    for alg in algs:
        before = [v.clone() for v in alg.state_dict().values() if torch.is_tensor(v)]
        if isinstance(alg, NestedEntropyTargetAlgorithm):
            dist = {
                "a": torch.distributions.Categorical(logits=logits),
                "b": torch.distributions.Independent(torch.distributions.Normal(loc, 1.0), 1),
            }
        else:
            dist = torch.distributions.Categorical(logits=logits)
        alg.set_on_policy(True)
        with _forbid_host_sync():
            for i in range(12):
                schedulers.update_progress("iterations", i)
                step = alg.rollout_step((dist, step_type))
                step = alg.train_step((dist, step_type))
                loss = alg.calc_loss(step.info._replace(step_type=step_type), valid)
                if isinstance(alg, EntropyTargetAlgorithm):
                    alg.adjust_alpha(torch.ones(()) * 0.1)
        assert loss.loss.shape == (6, 4)
        after = [v for v in alg.state_dict().values() if torch.is_tensor(v)]
        if not isinstance(alg, SGDEntropyTargetAlgorithm):
            assert any(not torch.equal(a, b) for a, b in zip(before, after)), type(alg)


def test_auto_mode_uses_host_path_on_cpu_and_rejects_host_mode_elsewhere():
    alg = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5)
    assert alg.driver.on_host()
    alg_t = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, update_mode="tensor")
    assert not alg_t.driver.on_host()


# -------------------------------------------------------------------- state
@pytest.mark.parametrize(
    "mode_a,mode_b", [("host", "host"), ("host", "tensor"), ("tensor", "host")]
)
def test_state_dict_mid_run_continues_the_exact_trajectory(mode_a, mode_b):
    rng = np.random.default_rng(3)
    seq = [float(x) for x in 1.6 + np.cumsum(rng.normal(-0.04, 0.1, 60))]
    full = EntropyTargetAlgorithm(
        DISCRETE4, target_entropy=0.4, average_window=3, update_mode=mode_a
    )
    half = EntropyTargetAlgorithm(
        DISCRETE4, target_entropy=0.4, average_window=3, update_mode=mode_a
    )
    for e in seq[:25]:
        full.adjust_alpha(torch.tensor(e))
        half.adjust_alpha(torch.tensor(e))
    sd = half.state_dict()
    assert {"driver." + field for field in EntropyTargetAlgorithm.State._fields} == set(sd)
    fresh = EntropyTargetAlgorithm(
        DISCRETE4, target_entropy=0.4, average_window=3, update_mode=mode_b
    )
    fresh.load_state_dict(sd)
    for e in seq[25:]:
        full.adjust_alpha(torch.tensor(e))
        fresh.adjust_alpha(torch.tensor(e))
        for a, b in zip(_state(full), _state(fresh)):
            assert torch.equal(a, b)


def test_parent_state_dict_holds_the_controller():
    class Parent(Algorithm):
        def __init__(self):
            super().__init__(name="parent")
            self.entropy_target = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5)

    p = Parent()
    p.entropy_target.adjust_alpha(torch.tensor(1.0))
    keys = set(p.state_dict())
    assert "entropy_target.driver.log_alpha" in keys and "entropy_target.driver.window" in keys


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "kwargs,exc,word",
    [
        (dict(initial_alpha=0.0), ValueError, "initial_alpha"),
        (dict(initial_alpha=-1.0), ValueError, "initial_alpha"),
        (dict(initial_alpha="big"), TypeError, "initial_alpha"),
        (dict(slow_update_rate=0.0), ValueError, "slow_update_rate"),
        (dict(fast_update_rate=-0.1), ValueError, "fast_update_rate"),
        (dict(very_slow_update_rate=float("nan")), ValueError, "very_slow_update_rate"),
        (dict(average_window=0), ValueError, "average_window"),
        (dict(average_window=2.5), ValueError, "average_window"),
        (dict(target_entropy=0.9, max_entropy=0.5), ValueError, "max_entropy"),
        (dict(target_entropy=lambda: "high"), ValueError, "target_entropy"),
        (dict(target_entropy=lambda: float("inf")), ValueError, "target_entropy"),
        (dict(target_entropy=[1.0]), TypeError, "target_entropy"),
        (dict(target_entropy=1.5), ValueError, "largest entropy"),  # > log 4
        (dict(update_mode="fast"), ValueError, "update_mode"),
        (dict(initial_alpha=1e-5, min_alpha=1e-4), ValueError, "min_alpha"),
    ],
)
def test_user_errors_name_the_argument(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        EntropyTargetAlgorithm(DISCRETE4, **kwargs)


def test_bad_action_spec_and_bad_shapes():
    with pytest.raises(TypeError, match="action_spec"):
        EntropyTargetAlgorithm("discrete", target_entropy=0.1)
    alg = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.1)
    neg = -torch.ones(3, 2)
    with pytest.raises(ValueError, match="valid_mask"):
        alg.calc_loss(_info(neg)._replace(step_type=torch.ones(3, 2)), torch.ones(3))
    with pytest.raises(ValueError, match="shape"):
        alg.calc_loss(_info(neg)._replace(step_type=torch.ones(3)))


def test_scheduled_target_above_reachable_warns():
    with pytest.warns(UserWarning, match="largest entropy"):
        EntropyTargetAlgorithm(DISCRETE4, target_entropy=lambda: 2.0)


def test_min_alpha_zero_floors_at_exp_minus_100_not_minus_inf():
    for mode in MODES:
        alg = EntropyTargetAlgorithm(
            DISCRETE4,
            initial_alpha=1.0,
            min_alpha=0.0,
            skip_free_stage=True,
            target_entropy=0.1,
            slow_update_rate=30.0,
            fast_update_rate=30.0,
            update_mode=mode,
        )
        for e in np.linspace(1.0, 1.3, 10):
            alg.adjust_alpha(torch.tensor(float(e)))  # above and increasing: down
        assert alg.log_alpha.item() == pytest.approx(-100.0)
        assert math.isfinite(alg.log_alpha.item())


def test_default_target_comes_from_the_action_spec():
    alg = EntropyTargetAlgorithm(
        {"d": DISCRETE4, "c": BoundedTensorSpec((), torch.float32, 0.0, 3.0)}
    )
    assert alg.target_entropy == pytest.approx(0.435 - 1.204, abs=1e-3)


def test_skip_free_stage_starts_in_adjust():
    alg = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, skip_free_stage=True)
    assert alg.stage.item() == 1
    alg.adjust_alpha(torch.tensor(1.0))  # above & increasing from 0 -> alpha down
    assert alg.alpha.item() < 0.1


# -------------------------------------------------------------- summaries
def test_debug_summaries_write_the_controller_tags(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = summary.create_summary_writer(str(tmp_path))
    summary.set_default_writer(writer)
    try:
        sched = schedulers.LinearScheduler("iterations", [(0, 1.0), (10, 0.5)])
        alg = EntropyTargetAlgorithm(
            DISCRETE4, target_entropy=sched, debug_summaries=True, name="ent"
        )
        step_type = torch.ones(3, 2, dtype=torch.int64)
        for i in range(4):
            summary.set_global_counter(i)
            schedulers.update_progress("iterations", i)
            alg.calc_loss(_info(-torch.rand(3, 2))._replace(step_type=step_type))
        summary.flush()
    finally:
        summary.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in (
        "alpha",
        "avg_entropy",
        "stage",
        "update_rate",
        "entropy_std",
        "target_entropy",
        "nonfinite_entropy",
    ):
        assert f"ent/{tag}" in tags, tags
    targets = [e.value for e in acc.Scalars("ent/target_entropy")]
    assert targets == pytest.approx([1.0, 0.95, 0.9, 0.85])


def test_constant_target_writes_no_target_summary(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary.set_default_writer(summary.create_summary_writer(str(tmp_path)))
    try:
        alg = EntropyTargetAlgorithm(
            DISCRETE4, target_entropy=0.5, debug_summaries=True, name="ent"
        )
        alg.adjust_alpha(torch.tensor(1.0))
        summary.flush()
    finally:
        summary.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert "ent/alpha" in tags and "ent/target_entropy" not in tags


# -------------------------------------------------------------------- gin
def test_bind_from_gin_with_a_scheduled_target():
    gin.parse_config(
        """
        EntropyTargetAlgorithm.initial_alpha = 0.5
        EntropyTargetAlgorithm.skip_free_stage = True
        EntropyTargetAlgorithm.target_entropy = @LinearScheduler()
        LinearScheduler.progress_type = "percent"
        LinearScheduler.schedule = [(0, 1.0), (1, 0.2)]
        """
    )
    alg = EntropyTargetAlgorithm(DISCRETE4)
    schedulers.update_progress("percent", 0.5)
    assert alg.alpha.item() == pytest.approx(0.5)
    assert alg.stage.item() == 1
    assert alg.target_entropy == pytest.approx(0.6)


# ----------------------------------------------------------------- nested
def test_nested_feeds_each_leaf_its_own_entropy():
    spec = {"grip": DISCRETE4, "arm": CONT2}
    nested = NestedEntropyTargetAlgorithm(
        spec, target_entropy={"grip": 0.5, "arm": None}, update_mode="tensor", name="nest"
    )
    leaves = nested.leaf_algorithms()
    assert set(leaves) == {"grip", "arm"}
    assert leaves["grip"].name == "nest/grip"
    assert leaves["grip"].target_entropy == 0.5
    assert leaves["arm"].target_entropy == pytest.approx(2 * (math.log(2) + math.log(0.1)))
    assert nested.target_entropy == pytest.approx(0.5 + 2 * (math.log(2) + math.log(0.1)))
    solo_grip = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5)
    solo_arm = EntropyTargetAlgorithm(CONT2)
    step_type = torch.ones(4, 3, dtype=torch.int64)
    torch.manual_seed(0)
    for it in range(6):
        logits = torch.randn(4, 3, 4) * (1 + it)
        scale = torch.full((4, 3, 2), 1.0 / (1 + it))
        dist = {
            "grip": torch.distributions.Categorical(logits=logits),
            "arm": torch.distributions.Independent(
                torch.distributions.Normal(torch.zeros(4, 3, 2), scale), 1
            ),
        }
        info = nested.train_step((dist, step_type)).info
        loss = nested.calc_loss(info._replace(step_type=step_type))
        lg = solo_grip.calc_loss(solo_grip.train_step((dist["grip"], step_type)).info)
        la = solo_arm.calc_loss(solo_arm.train_step((dist["arm"], step_type)).info)
        torch.testing.assert_close(loss.loss, lg.loss + la.loss)
        assert set(loss.extra.neg_entropy) == {"grip", "arm"}
    assert torch.equal(leaves["grip"].log_alpha, solo_grip.log_alpha)
    assert torch.equal(leaves["arm"].log_alpha, solo_arm.log_alpha)
    assert "_leaves.grip.driver.log_alpha" in nested.state_dict()


def test_nested_rejects_misshaped_targets():
    with pytest.raises(ValueError, match="target_entropy"):
        NestedEntropyTargetAlgorithm({"a": DISCRETE4, "b": CONT2}, target_entropy={"a": 0.1})


# -------------------------------------------------------------------- SGD
def test_sgd_variant_moves_alpha_towards_the_target():
    class Parent(Algorithm):
        def __init__(self):
            super().__init__(optimizer=lambda p: torch.optim.SGD(p, lr=0.0), name="p")
            self.logits = torch.nn.Parameter(torch.zeros(4))
            self.entropy_target = SGDEntropyTargetAlgorithm(
                DISCRETE4, target_entropy=0.5, optimizer="sgd", lr=0.1
            )

    step_type = torch.ones(5, 2, dtype=torch.int64)
    # Uniform policy: entropy log 4 > 0.5, alpha must fall; peaked: must rise.
    for base, direction in ((torch.zeros(4), -1), (torch.tensor([10.0, 0, 0, 0]), 1)):
        parent = Parent()
        start = parent.entropy_target.log_alpha.clone()
        for _ in range(3):
            dist = torch.distributions.Categorical(logits=(base + parent.logits).expand(5, 2, 4))
            info = parent.entropy_target.train_step((dist, step_type)).info
            loss = parent.entropy_target.calc_loss(info._replace(step_type=step_type))
            parent.update_with_gradient(loss)
        moved = parent.entropy_target.log_alpha - start
        assert torch.sign(moved).item() == direction
        assert len(parent.optimizers()) == 1  # the controller steps its own
        assert "entropy_target.driver.log_alpha" in parent.state_dict()


# ------------------------------------------------------------------- CUDA
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_cuda_tensor_path_matches_cpu_and_never_syncs():
    rng = np.random.default_rng(5)
    seq = [float(x) for x in 1.4 + np.cumsum(rng.normal(-0.03, 0.1, 50))]
    cpu = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.4)
    gpu = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.4).to("cuda")
    assert not gpu.driver.on_host()
    assert all(b.device.type == "cuda" for b in gpu.buffers())
    step_type = torch.ones(4, 3, dtype=torch.int64)
    entropies = [torch.full((4, 3), -e) for e in seq]
    gpu_inputs = [(x.cuda(), step_type.cuda()) for x in entropies]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for neg, st_ in gpu_inputs:
            gpu.calc_loss(_info(neg)._replace(step_type=st_))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for neg in entropies:
        cpu.calc_loss(_info(neg)._replace(step_type=step_type))
    for a, b in zip(_state(cpu), _state(gpu)):
        torch.testing.assert_close(a, b.cpu(), atol=1e-6, rtol=0)


@cuda
def test_cuda_nested_and_sgd_variants_run_on_device():
    spec = {"a": DISCRETE4, "b": CONT2}
    nested = NestedEntropyTargetAlgorithm(spec).to("cuda")
    sgd = SGDEntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5).to("cuda")
    step_type = torch.ones(3, 2, dtype=torch.int64, device="cuda")
    dist = {
        "a": torch.distributions.Categorical(logits=torch.zeros(3, 2, 4, device="cuda")),
        "b": torch.distributions.Independent(
            torch.distributions.Normal(torch.zeros(3, 2, 2, device="cuda"), 1.0), 1
        ),
    }
    info = nested.train_step((dist, step_type)).info
    loss = nested.calc_loss(info._replace(step_type=step_type))
    assert loss.loss.device.type == "cuda"
    loss = sgd.calc_loss(sgd.train_step((dist["a"], step_type)).info)
    assert loss.loss.device.type == "cuda"


def test_float64_entropy_is_treated_as_float32_on_both_paths():
    algs = {m: EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, update_mode=m) for m in MODES}
    for e in (1.3, 1.1000000000001, 0.4, 0.2, 0.9):
        for alg in algs.values():
            alg.adjust_alpha(torch.tensor(e, dtype=torch.float64))
    for a, b in zip(_state(algs["host"]), _state(algs["tensor"])):
        assert torch.equal(a, b)


def test_per_dimension_distribution_is_summed_over_the_action_dims():
    alg = EntropyTargetAlgorithm(CONT2)
    scale = torch.full((5, 4, 2), 0.5)
    plain = torch.distributions.Normal(torch.zeros(5, 4, 2), scale)
    indep = torch.distributions.Independent(plain, 1)
    a = alg.train_step((plain, torch.ones(5, 4))).info.loss.extra.neg_entropy
    b = alg.train_step((indep, torch.ones(5, 4))).info.loss.extra.neg_entropy
    assert a.shape == (5, 4)
    torch.testing.assert_close(a, b)


def _train_softmax_policy(controlled: bool, steps: int = 1200):
    """A 4-way policy whose task (maximise P(action 0)) drives entropy to 0."""
    torch.manual_seed(0)
    logits = torch.zeros(4, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.05)
    controller = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.6, initial_alpha=0.01)
    step_type = torch.ones(1, 8, dtype=torch.int64)
    entropies = []
    for _ in range(steps):
        dist = torch.distributions.Categorical(logits=logits.expand(1, 8, 4))
        task_loss = -dist.probs[..., 0]
        if controlled:
            info = controller.train_step((dist, step_type)).info
            entropy_loss = controller.calc_loss(info._replace(step_type=step_type)).loss
        else:
            entropy_loss = -0.01 * dist.entropy()  # the controller's initial alpha, fixed
        opt.zero_grad()
        (task_loss + entropy_loss).mean().backward()
        opt.step()
        entropies.append(dist.entropy().mean().item())
    return np.array(entropies), controller


@pytest.mark.slow
def test_controller_holds_the_entropy_at_the_target_on_a_collapsing_task():
    fixed, _ = _train_softmax_policy(controlled=False)
    held, controller = _train_softmax_policy(controlled=True)
    assert fixed[-300:].mean() < 0.05  # without control the entropy collapses
    tail = held[-300:]
    assert abs(tail.mean() - 0.6) < 0.03 and tail.min() > 0.5 and tail.max() < 0.7
    assert controller.stage.item() in (0, 1) and controller.alpha.item() > 0.01


def test_describe_stage_says_each_stage_in_words():
    alg = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, average_window=3)
    assert describe_stage(alg.stage).startswith("stage -5: estimating max_entropy (3 more updates)")
    assert describe_stage(torch.tensor(-2)).startswith("stage -2: init")
    assert describe_stage(-1).startswith("stage -1: free")
    assert describe_stage(np.int32(0)) == (
        "stage 0: adjust (the average entropy is at or below the target)"
    )
    assert describe_stage(1) == "stage 1: adjust (the average entropy is above the target)"
    for bad in (1.0, True, "1", torch.tensor([0, 1]), torch.tensor(0.5)):
        with pytest.raises(TypeError, match="stage"):
            describe_stage(bad)
