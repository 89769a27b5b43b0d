"""Errors outside gin read as plain Python errors (issue 20, part 3)."""
import gin
import pytest
import torch

from alf_entropy import (
    BoundedTensorSpec,
    EntropyTargetAlgorithm,
    LinearScheduler,
    PPOAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.networks.encoding_network import EncodingNetwork
from alf_entropy.utils.gin_errors import PlainGinErrors, plain_error

SPEC = BoundedTensorSpec((), torch.int64, 0, 3)
GIN_TEXT = "In call to configurable"


def test_direct_call_raises_the_plain_error():
    with pytest.raises(ValueError) as info:
        EntropyTargetAlgorithm(SPEC, initial_alpha=-1)
    assert str(info.value) == "initial_alpha must be > 0, got -1"
    assert type(info.value) is ValueError  # not gin's dynamically made subclass
    # The traceback still reaches the check that raised it.
    assert info.traceback[-1].name == "check_real"


@pytest.mark.parametrize("make, message", [
    (lambda: SGDEntropyTargetAlgorithm(SPEC, target_entropy=10.0), "above the largest entropy"),
    (lambda: EntropyTargetAlgorithm(SPEC, average_window=0), "average_window"),
    (lambda: LinearScheduler("percent", [(0.5, 1.0), (0.1, 2.0)]), "schedule"),
    (lambda: EncodingNetwork(4, fc_layer_params=(-3,)), "fc_layer_params must be positive ints"),
])
def test_other_classes_and_schedulers_are_plain(make, message):
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert message in str(info.value)
    assert GIN_TEXT not in str(info.value)


def test_gin_supplied_argument_keeps_gins_context():
    gin.parse_config("EntropyTargetAlgorithm.initial_alpha = -1")
    with pytest.raises(ValueError) as info:
        EntropyTargetAlgorithm(SPEC)
    assert "initial_alpha must be > 0, got -1" in str(info.value)
    assert f"{GIN_TEXT} 'EntropyTargetAlgorithm'" in str(info.value)


def test_binding_overridden_by_the_caller_is_not_gins_doing():
    gin.parse_config("EntropyTargetAlgorithm.initial_alpha = 0.5")
    with pytest.raises(ValueError) as info:
        EntropyTargetAlgorithm(SPEC, initial_alpha=-2)
    assert str(info.value) == "initial_alpha must be > 0, got -2"


def test_nested_gin_configured_sub_algorithm_keeps_its_context():
    # PPO called from Python; its controller built from gin's (bad) binding.
    gin.parse_config("EntropyTargetAlgorithm.initial_alpha = -1")
    obs = BoundedTensorSpec((4,), torch.float32, -1.0, 1.0)
    with pytest.raises(ValueError) as info:
        PPOAlgorithm(obs, BoundedTensorSpec((), torch.int64, 0, 1), enforce_entropy_target=True)
    text = str(info.value)
    assert "initial_alpha must be > 0" in text
    assert f"{GIN_TEXT} 'EntropyTargetAlgorithm'" in text  # gin's, kept
    assert f"{GIN_TEXT} 'PPOAlgorithm'" not in text  # PPO's caller gave everything


def test_metaclass_on_an_unregistered_class_and_foreign_errors():
    class NotConfigurable(metaclass=PlainGinErrors):
        def __init__(self, x):
            raise KeyError(x)

    with pytest.raises(KeyError):
        NotConfigurable(3)
    error = RuntimeError("not gin's")
    assert plain_error(error, NotConfigurable, (), {}) is error
