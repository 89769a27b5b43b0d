"""Tests of the shared argument checks and the masked mean."""

import math

import numpy as np
import pytest
import torch

from alf_entropy.utils import schedulers
from alf_entropy.utils.checks import check_callable, check_choice, check_int, check_real, is_real
from alf_entropy.utils.math_ops import masked_mean


def test_check_real_names_the_argument_and_the_range():
    assert check_real("x", np.float32(0.5)) == 0.5 and is_real(np.int64(3)) and not is_real(True)
    with pytest.raises(TypeError, match="rate must be a real number"):
        check_real("rate", "fast")
    with pytest.raises(ValueError, match="rate must be finite"):
        check_real("rate", math.inf)
    with pytest.raises(ValueError, match="rate must be > 0"):
        check_real("rate", 0.0, positive=True)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        check_real("alpha", -1.0, minimum=0.0)
    with pytest.raises(ValueError, match="p must be <= 1"):
        check_real("p", 2.0, maximum=1.0)


def test_check_real_with_none_allowed():
    assert check_real("clip", None, positive=True, allow_none=True) is None
    with pytest.raises(TypeError, match="clip must be a real number or None"):
        check_real("clip", "big", allow_none=True)
    with pytest.raises(TypeError, match="clip must be a real number, got NoneType"):
        check_real("clip", None)


def test_check_callable_and_check_choice_name_the_argument():
    assert check_callable("ctor", len) is len
    with pytest.raises(TypeError, match="ctor must be callable, got 3"):
        check_callable("ctor", 3)
    assert check_choice("mode", "a", ("a", "b")) == "a"
    with pytest.raises(ValueError, match=r"mode must be one of \('a', 'b'\), got 'c'"):
        check_choice("mode", "c", ("a", "b"))


def test_check_int_rejects_bools_floats_and_small_values():
    assert check_int("n", np.int32(3), minimum=1) == 3
    for bad in (True, 2.5, 0):
        with pytest.raises(ValueError, match="n must be an int >= 1"):
            check_int("n", bad, minimum=1)


def test_masked_mean_broadcasts_ignores_nan_and_counts():
    x = torch.tensor([[1.0, float("nan")], [3.0, 5.0]])
    mean, count = masked_mean(x, torch.tensor([True, False]))  # broadcasts over rows
    assert mean.item() == 2.0 and count.item() == 2
    mean, count = masked_mean(x[:, :1], torch.zeros(2, 1))
    assert mean.item() == 0.0 and count.item() == 0
    mean, count = masked_mean(torch.tensor([1.0, 2.0]))
    assert mean.item() == 1.5 and count.item() == 2
    with pytest.raises(ValueError, match="broadcast"):
        masked_mean(x, torch.ones(3))


def test_scheduler_max_value_covers_every_value_it_can_produce():
    assert schedulers.LinearScheduler("percent", [(0, 0.65), (1, 0.8)]).max_value() == 0.8
    assert schedulers.StepScheduler("percent", [(0.5, -1.0), (1, -2.0)]).max_value() == -1.0
    assert schedulers.StepScheduler("iterations", [(5, -1.0)], warm_up_period=2).max_value() == 0.0
    assert schedulers.ConstantScheduler(0.3).max_value() == 0.3
    assert schedulers.ExponentialScheduler("percent", 0.5, 0.5, 1.0).max_value() == 0.5
    assert schedulers.ExponentialScheduler("percent", 0.5, 2.0, 1.0).max_value() == math.inf
    assert schedulers.CyclicalScheduler("iterations", 0.1, 0.4, 5).max_value() == 0.4


def test_progress_was_fed_until_reset():
    schedulers.reset_progress()
    assert not schedulers.progress_was_fed("percent")
    schedulers.update_progress("percent", 0.0)
    assert schedulers.progress_was_fed("percent")
    schedulers.reset_progress()
    assert not schedulers.progress_was_fed("percent")
