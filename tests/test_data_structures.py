"""Tests for alf_entropy.data_structures (namedtuples, StepType, experiences)."""

import pytest
import torch

from alf_entropy.data_structures import (
    AlgStep,
    Experience,
    LossInfo,
    StepType,
    TimeStep,
    make_experience,
    namedtuple,
)


# ------------------------------------------------------------------ namedtuple
def test_namedtuple_default_value_applies_to_every_field():
    Pair = namedtuple("Pair", ["a", "b"], default_value=7)
    p = Pair()
    assert p.a == 7 and p.b == 7
    assert Pair(b=1) == (7, 1)
    assert Pair._fields == ("a", "b")


def test_namedtuple_default_is_none_without_arguments():
    Pair = namedtuple("Pair", "a b")
    assert Pair() == (None, None)


def test_namedtuple_default_values_dict_overrides_some_fields():
    T = namedtuple("T", ["a", "b", "c"], default_value=0, default_values={"b": 5})
    assert T() == (0, 5, 0)
    assert T(c=2) == (0, 5, 2)


def test_namedtuple_default_values_sequence_aligned_with_fields():
    T = namedtuple("T", ["a", "b", "c"], default_values=[1, 2, 3])
    assert T() == (1, 2, 3)
    assert T(a=9).a == 9


def test_namedtuple_default_values_unknown_field_raises():
    with pytest.raises(ValueError, match="unknown fields.*zzz"):
        namedtuple("T", ["a", "b"], default_values={"zzz": 1})


def test_namedtuple_default_values_wrong_length_raises():
    with pytest.raises(ValueError, match="2 entries.*3 fields"):
        namedtuple("T", ["a", "b", "c"], default_values=[1, 2])


# -------------------------------------------------------------------- StepType
def test_step_type_values_match_alf():
    assert (StepType.FIRST, StepType.MID, StepType.LAST) == (0, 1, 2)


@pytest.mark.parametrize("value", [0, 1, 2])
def test_step_type_constructor_returns_valid_value(value):
    assert StepType(value) == value
    assert isinstance(StepType(value), int)


@pytest.mark.parametrize("value", [-1, 3, "MID", None])
def test_step_type_constructor_rejects_invalid(value):
    with pytest.raises(ValueError, match="StepType"):
        StepType(value)


def test_step_type_compares_with_int_tensors():
    st = torch.tensor([0, 1, 2, 1])
    assert torch.equal(st == StepType.MID, torch.tensor([False, True, False, True]))


# ---------------------------------------------------------------- namedtuples
def test_time_step_fields_and_defaults():
    assert TimeStep._fields == (
        "step_type",
        "reward",
        "discount",
        "observation",
        "prev_action",
        "env_id",
        "env_info",
    )
    ts = TimeStep()
    assert all(f == () for f in ts)


def test_alg_step_loss_info_experience_defaults():
    assert AlgStep._fields == ("output", "state", "info")
    assert AlgStep() == ((), (), ())
    assert LossInfo._fields == ("loss", "scalar_loss", "extra", "priority")
    assert LossInfo() == ((), (), (), ())
    assert Experience._fields == ("step_type", "time_step", "action", "rollout_info", "state")
    assert Experience() == ((), (), (), (), ())
    # Partial construction keeps the other defaults.
    li = LossInfo(loss=torch.tensor(1.0))
    assert li.scalar_loss == () and li.extra == () and li.priority == ()


def test_time_step_is_first_is_last_on_tensors():
    ts = TimeStep(step_type=torch.tensor([StepType.FIRST, StepType.MID, StepType.LAST]))
    assert torch.equal(ts.is_first(), torch.tensor([True, False, False]))
    assert torch.equal(ts.is_last(), torch.tensor([False, False, True]))


def test_time_step_is_first_is_last_on_2d_tensors():
    st = torch.tensor([[0, 2], [1, 0]])
    ts = TimeStep(step_type=st)
    assert ts.is_first().shape == (2, 2)
    assert torch.equal(ts.is_first(), torch.tensor([[True, False], [False, True]]))
    assert torch.equal(ts.is_last(), torch.tensor([[False, True], [False, False]]))


def test_make_experience_copies_fields():
    step_type = torch.tensor([0, 1])
    ts = TimeStep(step_type=step_type, reward=torch.tensor([1.0, 2.0]))
    action = torch.tensor([3, 4])
    info = {"x": torch.tensor([0.5, 0.25])}
    exp = make_experience(ts, AlgStep(output=action, state=(), info=info), state="s0")
    assert isinstance(exp, Experience)
    assert exp.step_type is step_type
    assert exp.time_step is ts
    assert exp.action is action
    assert exp.rollout_info is info
    assert exp.state == "s0"


def test_make_experience_default_state_is_empty():
    exp = make_experience(TimeStep(step_type=torch.tensor([1])), AlgStep(output=1, info=2))
    assert exp.state == ()
    assert exp.action == 1 and exp.rollout_info == 2
