"""The trainer-independent part of LLM entropy control (no TRL needed)."""

import json
import math

import pytest
import torch

from alf_entropy import (
    BoundedTensorSpec,
    EntropyTargetAlgorithm,
    LinearScheduler,
    NestedEntropyTargetAlgorithm,
    PIDEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.integrations.llm import (
    StepEntropyControl,
    decode_state,
    encode_state,
    lm_controller,
)
from tests.nests import assert_nests_equal

SPEC = BoundedTensorSpec((), torch.int64, 0, 31_999)


def _controllers():
    return [
        lm_controller(SPEC, 1.0),
        PIDEntropyTargetAlgorithm(SPEC, target_entropy=1.0),
        EntropyTargetAlgorithm(SPEC, target_entropy=1.0),
        SGDEntropyTargetAlgorithm(SPEC, target_entropy=1.0, lr=1e-2),
    ]


def test_update_is_the_token_weighted_mean():
    a = StepEntropyControl(lm_controller(SPEC, 1.0))
    b = lm_controller(SPEC, 1.0)
    for step, (s, n) in enumerate([(37 * 0.8 + 5 * 1.4, 42), (10.0, 20), (3.0, 1)], 1):
        coef = a.update(s, n, step)
        assert coef == float(b.adjust_alpha(s / n))
        assert a.entropy == s / n and a.step == step
    with pytest.raises(ValueError, match="token_count"):
        a.update(1.0, 0, 4)
    with pytest.raises(ValueError, match="step"):
        a.update(1.0, 1, -1)


def test_tensors_are_read_once_and_reduced_on_their_own_device(monkeypatch):
    """A trainer's on-device sum and count give the bits of the same numbers; under
    ``all_reduce`` the pair is reduced on the inputs' device (CUDA under NCCL, which cannot
    reduce CPU tensors): here the meta device, with the collective faked."""
    a, b = (StepEntropyControl(lm_controller(SPEC, 1.0)) for _ in range(2))
    for step, (s, n) in enumerate([(33.6, 42), (10.0, 20), (3.0, 1)], 1):
        assert a.update(torch.tensor(s, dtype=torch.float64), torch.tensor(n), step) == b.update(
            s, n, step
        )
        assert a.entropy == b.entropy
    seen = []

    def fake_all_reduce_sum(value, what):
        seen.append((value.device.type, value.dtype, tuple(value.shape)))
        return torch.tensor([2.0 * 21.0, 2.0 * 30.0], dtype=torch.float64)  # two equal ranks

    monkeypatch.setattr("alf_entropy.utils.distributed.all_reduce_sum", fake_all_reduce_sum)
    a.update(torch.empty((), device="meta"), 30, 4, all_reduce=True)
    a.update(21.0, torch.empty(1, device="meta"), 5, all_reduce=True)
    b.update(21.0, 30, 6, all_reduce=True)  # numbers: on the controller's device
    assert seen == [("meta", torch.float64, (2,))] * 2 + [("cpu", torch.float64, (2,))]
    assert a.entropy == b.entropy == 0.7
    with pytest.raises(ValueError, match="entropy_sum must be a number or a one-element"):
        a.update(torch.ones(2), 2, 7)
    with pytest.raises(TypeError, match="token_count must be a number or a one-element"):
        a.update(1.0, "2", 7)


def test_scheduled_target_reads_the_fed_progress():
    target = LinearScheduler("percent", [(0, 3.0), (1, 2.0)])
    control = StepEntropyControl(lm_controller(SPEC, target))
    targets = []
    for step in range(1, 11):
        control.update(2.5, 1, step, total_steps=10)
        targets.append(control.record()["target"])
    assert targets == pytest.approx([3.0 - s / 10 for s in range(1, 11)])


@pytest.mark.parametrize("index", range(4))
def test_state_round_trips_through_json_exactly(index):
    first, second = _controllers()[index], _controllers()[index]
    a, b = StepEntropyControl(first), StepEntropyControl(second)
    entropies = [1.5 - 0.05 * k for k in range(30)]
    for step, h in enumerate(entropies[:15], 1):
        a.update(h, 1, step)
    saved = json.loads(json.dumps(a.state_dict()))
    b.load_state_dict(saved)
    assert b.step == 15
    for step, h in enumerate(entropies[15:], 16):
        assert a.update(h, 1, step) == b.update(h, 1, step)
    assert_nests_equal(second.state_dict(), first.state_dict(), "loaded controller")


def test_encode_decode_keeps_dtypes_shapes_and_nesting():
    state = {
        "a": torch.tensor([[1.5, float("nan")]], dtype=torch.float64),
        "b": torch.tensor(3, dtype=torch.int64),
        "c": (1, [2.0, None], "x"),
        "d": {1: torch.tensor(True)},
    }
    back = decode_state(json.loads(json.dumps(encode_state(state))))
    assert back["a"].dtype == torch.float64 and back["a"].shape == (1, 2)
    assert torch.equal(back["a"][:, :1], state["a"][:, :1]) and math.isnan(back["a"][0, 1])
    assert back["b"].dtype == torch.int64 and back["c"] == (1, [2.0, None], "x")
    assert bool(back["d"][1])
    with pytest.raises(TypeError, match="encode"):
        encode_state(object())
    with pytest.raises(ValueError, match="encoded"):
        decode_state({"x": 1})


def test_record_has_the_logged_values():
    control = StepEntropyControl(lm_controller(SPEC, 1.0))
    control.update(0.5, 1, 1)
    rec = control.record()
    for key in (
        "coef",
        "target",
        "entropy",
        "stage",
        "unreachable_target",
        "state/integral",
        "state/log_alpha",
    ):
        assert key in rec
    assert rec["entropy"] == 0.5 and rec["coef"] == control.coefficient


def test_bad_controllers_are_clear_errors():
    with pytest.raises(TypeError, match="EntropyController"):
        StepEntropyControl("pid")
    with pytest.raises(TypeError, match="nested"):
        StepEntropyControl(NestedEntropyTargetAlgorithm({"a": SPEC, "b": SPEC}))
    with pytest.raises(TypeError, match="batch_shape"):
        StepEntropyControl(PIDEntropyTargetAlgorithm(SPEC, target_entropy=1.0, batch_shape=(2,)))
