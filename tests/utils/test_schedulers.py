"""Tests for ``alf_entropy.utils.schedulers``: values, progress, errors, gin."""

import math

import gin
import pytest

from alf_entropy.utils import schedulers, summary
from alf_entropy.utils.schedulers import (
    ConstantScheduler,
    CyclicalScheduler,
    ExponentialScheduler,
    LinearScheduler,
    Scheduler,
    StepScheduler,
    as_scheduler,
    get_all_progress,
    get_progress,
    reset_progress,
    set_all_progress,
    update_progress,
)

# ----------------------------------------------------------------- progress


@pytest.mark.parametrize("ptype", ["iterations", "env_steps", "percent"])
def test_update_and_get_progress(ptype):
    assert get_progress(ptype) == 0.0
    update_progress(ptype, 7)
    assert get_progress(ptype) == 7.0
    assert isinstance(get_progress(ptype), float)
    # other types untouched
    for other in ("iterations", "env_steps", "percent"):
        if other != ptype:
            assert get_progress(other) == 0.0


def test_global_counter_progress_reads_summary():
    summary.set_global_counter(42)
    assert get_progress("global_counter") == 42.0
    summary.increment_global_counter()
    assert get_progress("global_counter") == 43.0
    update_progress("global_counter", 5)
    assert summary.get_global_counter() == 5


def test_unknown_progress_type_names_it_and_allowed():
    with pytest.raises(ValueError, match="bogus") as e:
        get_progress("bogus")
    for name in schedulers.PROGRESS_TYPES:
        assert name in str(e.value)
    with pytest.raises(ValueError, match="bogus"):
        update_progress("bogus", 1)
    with pytest.raises(ValueError, match="progress_type"):
        LinearScheduler("steps", [(0, 1.0), (1, 2.0)])


@pytest.mark.parametrize(
    "bad, error",
    [
        (-1, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        ("3", TypeError),
        (None, TypeError),
        (True, TypeError),
    ],
)
def test_update_progress_rejects_bad_values(bad, error):
    with pytest.raises(error, match="value"):
        update_progress("iterations", bad)
    assert get_progress("iterations") == 0.0


def test_update_global_counter_rejects_fraction():
    with pytest.raises(ValueError, match="integer"):
        update_progress("global_counter", 1.5)


def test_reset_and_save_restore_all_progress():
    update_progress("iterations", 10)
    update_progress("env_steps", 2000)
    update_progress("percent", 0.25)
    summary.set_global_counter(10)
    saved = get_all_progress()
    assert saved == {
        "iterations": 10.0,
        "env_steps": 2000.0,
        "percent": 0.25,
        "global_counter": 10.0,
    }
    saved["iterations"] = 99.0  # a copy: mutating it changes nothing
    assert get_progress("iterations") == 10.0

    reset_progress()
    assert get_all_progress() == dict.fromkeys(schedulers.PROGRESS_TYPES, 0.0)
    assert summary.get_global_counter() == 0

    set_all_progress({"iterations": 10, "env_steps": 2000, "percent": 0.25, "global_counter": 10})
    assert get_all_progress()["env_steps"] == 2000.0
    assert summary.get_global_counter() == 10


def test_set_all_progress_is_atomic_on_error():
    with pytest.raises(ValueError, match="nope"):
        set_all_progress({"iterations": 3, "nope": 1})
    with pytest.raises(ValueError, match="env_steps"):
        set_all_progress({"iterations": 3, "env_steps": -1})
    assert get_progress("iterations") == 0.0
    with pytest.raises(TypeError, match="mapping"):
        set_all_progress([("iterations", 3)])


def test_schedulers_follow_progress_going_back():
    # progress may go back (checkpoint restore); values must follow it.
    s = StepScheduler("iterations", [(10, 1.0), (20, 2.0), (30, 3.0)])
    lin = LinearScheduler("iterations", [(0, 0.0), (10, 10.0), (20, 0.0)])
    update_progress("iterations", 25)
    assert s() == 3.0 and lin() == 0.0
    update_progress("iterations", 5)
    assert s() == 1.0 and lin() == pytest.approx(5.0)


# ----------------------------------------------------------------- schedulers


def test_constant_scheduler_and_as_scheduler():
    c = ConstantScheduler(3)
    assert c() == 3.0 and isinstance(c(), float)
    assert c.final_value() == 3.0
    assert repr(c) == "3.0"
    s = as_scheduler(0.5)
    assert isinstance(s, ConstantScheduler) and s() == 0.5
    lin = LinearScheduler("iterations", [(0, 1.0), (1, 2.0)])
    assert as_scheduler(lin) is lin
    fn = lambda: 4.0  # noqa: E731
    assert as_scheduler(fn) is fn
    with pytest.raises(TypeError, match="value_or_scheduler"):
        as_scheduler("0.1")
    with pytest.raises(TypeError, match="value"):
        ConstantScheduler(None)


def test_base_scheduler():
    s = Scheduler("env_steps")
    assert s.progress_type == "env_steps"
    update_progress("env_steps", 12)
    assert s.progress() == 12.0
    with pytest.raises(NotImplementedError):
        s()


def test_step_scheduler_at_and_between_knots():
    s = StepScheduler("iterations", [(10, 1.0), (20, 2.0), (30, 3.0)])
    expected = {0: 1.0, 9.99: 1.0, 10: 2.0, 15: 2.0, 19: 2.0, 20: 3.0, 30: 3.0, 1e6: 3.0}
    for p, v in expected.items():
        update_progress("iterations", p)
        assert s() == v, p
    assert s.final_value() == 3.0
    assert repr(s) == (
        "StepScheduler('iterations', [(10.0, 1.0), (20.0, 2.0), "
        "(30.0, 3.0)], warm_up_period=0.0, start=0.0)"
    )


def test_step_scheduler_warm_up():
    s = StepScheduler("iterations", [(10, 2.0), (20, 4.0)], warm_up_period=4, start=2)
    expected = {0: 0.0, 1.9: 0.0, 2: 0.0, 3: 0.5, 5: 1.5, 6: 2.0, 9: 2.0, 10: 4.0}
    for p, v in expected.items():
        update_progress("iterations", p)
        assert s() == pytest.approx(v), p


def test_step_scheduler_errors():
    with pytest.raises(ValueError, match="schedule"):
        StepScheduler("iterations", [])
    with pytest.raises(ValueError, match="sorted"):
        StepScheduler("iterations", [(20, 1.0), (10, 2.0)])
    with pytest.raises(TypeError, match=r"schedule\[1\] value"):
        StepScheduler("iterations", [(10, 1.0), (20, "x")])
    with pytest.raises(ValueError, match="pair"):
        StepScheduler("iterations", [(10, 1.0, 3)])
    with pytest.raises(ValueError, match="warm_up_period"):
        StepScheduler("iterations", [(10, 1.0)], warm_up_period=-1)
    with pytest.raises(ValueError, match="start"):
        StepScheduler("iterations", [(10, 1.0)], warm_up_period=5, start=5)
    with pytest.raises(ValueError, match="first progress"):
        StepScheduler("iterations", [(0, 1.0), (10, 2.0)])


def test_linear_scheduler_at_and_between_knots():
    s = LinearScheduler("percent", [(0, 1.0), (0.5, -1.0), (1.0, 0.0)])
    expected = {0: 1.0, 0.25: 0.0, 0.5: -1.0, 0.75: -0.5, 1.0: 0.0, 2.0: 0.0}
    for p, v in expected.items():
        update_progress("percent", p)
        assert s() == pytest.approx(v), p
    assert s.final_value() == 0.0
    assert repr(s) == ("LinearScheduler('percent', [(0.0, 1.0), (0.5, -1.0), (1.0, 0.0)])")


def test_linear_scheduler_jump_with_repeated_knot():
    s = LinearScheduler("iterations", [(0, 0.0), (10, 1.0), (10, 5.0), (20, 5.0)])
    update_progress("iterations", 9.999)
    assert s() == pytest.approx(0.9999)
    update_progress("iterations", 10)
    assert s() == 5.0


def test_linear_scheduler_errors():
    with pytest.raises(ValueError, match="at least two"):
        LinearScheduler("iterations", [(0, 1.0)])
    with pytest.raises(ValueError, match="first progress"):
        LinearScheduler("iterations", [(1, 1.0), (2, 0.0)])
    with pytest.raises(ValueError, match="sorted"):
        LinearScheduler("iterations", [(0, 1.0), (10, 0.0), (5, 2.0)])
    with pytest.raises(TypeError, match=r"schedule\[0\] progress"):
        LinearScheduler("iterations", [("0", 1.0), (10, 0.0)])
    with pytest.raises(ValueError, match="finite"):
        LinearScheduler("iterations", [(0, 1.0), (10, math.inf)])
    with pytest.raises(ValueError, match="schedule"):
        LinearScheduler("iterations", "0:1")


def test_exponential_scheduler():
    s = ExponentialScheduler("env_steps", initial_value=2.0, decay_rate=0.5, decay_time=100)
    for p, v in {0: 2.0, 100: 1.0, 200: 0.5, 50: 2.0 * 0.5**0.5}.items():
        update_progress("env_steps", p)
        assert s() == pytest.approx(v), p
    assert s.final_value() == 0.0
    assert ExponentialScheduler("env_steps", 2.0, 1.0, 1).final_value() == 2.0
    assert ExponentialScheduler("env_steps", -2.0, 3.0, 1).final_value() == -math.inf
    assert repr(s) == (
        "ExponentialScheduler('env_steps', initial_value=2.0, decay_rate=0.5, decay_time=100.0)"
    )


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        (dict(initial_value=1.0, decay_rate=0.5, decay_time=0), "decay_time"),
        (dict(initial_value=1.0, decay_rate=0.5, decay_time=-3), "decay_time"),
        (dict(initial_value=1.0, decay_rate=0.0, decay_time=1), "decay_rate"),
        (dict(initial_value="1", decay_rate=0.5, decay_time=1), "initial_value"),
    ],
)
def test_exponential_scheduler_errors(kwargs, arg):
    with pytest.raises((TypeError, ValueError), match=arg):
        ExponentialScheduler("iterations", **kwargs)


def test_cyclical_scheduler_step_mode():
    s = CyclicalScheduler("iterations", base_lr=1.0, bound_lr=0.0, half_cycle_size=1)
    values = []
    for p in range(6):
        update_progress("iterations", p)
        values.append(s())
    assert values == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    s3 = CyclicalScheduler("iterations", 0.1, 0.5, half_cycle_size=3)
    values = []
    for p in range(8):
        update_progress("iterations", p)
        values.append(s3())
    assert values == [0.1, 0.1, 0.1, 0.5, 0.5, 0.5, 0.1, 0.1]
    with pytest.raises(RuntimeError):
        s.final_value()


def test_cyclical_scheduler_linear_mode():
    s = CyclicalScheduler("iterations", 0.0, 1.0, half_cycle_size=4, switch_mode="linear")
    expected = {0: 0.0, 1: 0.25, 2: 0.5, 4: 1.0, 5: 0.75, 6: 0.5, 8: 0.0, 10: 0.5, 12: 1.0}
    for p, v in expected.items():
        update_progress("iterations", p)
        assert s() == pytest.approx(v), p
    assert repr(s) == (
        "CyclicalScheduler('iterations', base_lr=0.0, bound_lr=1.0, "
        "half_cycle_size=4.0, switch_mode='linear')"
    )


def test_cyclical_scheduler_percent_rounding():
    # 0.3 % 0.1 is 0.0999... in floating point; ALF rounds so 0.3 is a boundary.
    s = CyclicalScheduler("percent", 1.0, 2.0, half_cycle_size=0.1)
    update_progress("percent", 0.3)
    assert s() == 2.0
    update_progress("percent", 0.4)
    assert s() == 1.0


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        (dict(base_lr=1.0, bound_lr=0.0, half_cycle_size=0), "half_cycle_size"),
        (dict(base_lr=1.0, bound_lr=0.0, half_cycle_size=-1), "half_cycle_size"),
        (dict(base_lr=1.0, bound_lr=0.0, half_cycle_size=1, switch_mode="cos"), "switch_mode"),
        (dict(base_lr=None, bound_lr=0.0, half_cycle_size=1), "base_lr"),
    ],
)
def test_cyclical_scheduler_errors(kwargs, arg):
    with pytest.raises((TypeError, ValueError), match=arg):
        CyclicalScheduler("iterations", **kwargs)


# ----------------------------------------------------------------- gin


@gin.configurable
def _scheduled_consumer(x=None):
    return x


def _parse_and_build(bindings: str):
    gin.parse_config(bindings)
    return _scheduled_consumer()


def test_gin_linear_scheduler():
    s = _parse_and_build("""
        _scheduled_consumer.x = @LinearScheduler()
        LinearScheduler.progress_type = "percent"
        LinearScheduler.schedule = [(0, 1.0), (1000, -1.0)]
    """)
    assert isinstance(s, LinearScheduler)
    update_progress("percent", 500)
    assert s() == pytest.approx(0.0)


def test_gin_step_scheduler():
    s = _parse_and_build("""
        _scheduled_consumer.x = @StepScheduler()
        StepScheduler.progress_type = "iterations"
        StepScheduler.schedule = [(10, 1.0), (20, 2.0)]
        StepScheduler.warm_up_period = 2
    """)
    assert isinstance(s, StepScheduler)
    update_progress("iterations", 1)
    assert s() == pytest.approx(0.5)
    update_progress("iterations", 15)
    assert s() == 2.0


def test_gin_exponential_scheduler():
    s = _parse_and_build("""
        _scheduled_consumer.x = @ExponentialScheduler()
        ExponentialScheduler.progress_type = "env_steps"
        ExponentialScheduler.initial_value = 1.0
        ExponentialScheduler.decay_rate = 0.1
        ExponentialScheduler.decay_time = 10
    """)
    update_progress("env_steps", 20)
    assert s() == pytest.approx(0.01)


def test_gin_cyclical_scheduler():
    s = _parse_and_build("""
        _scheduled_consumer.x = @CyclicalScheduler()
        CyclicalScheduler.progress_type = "global_counter"
        CyclicalScheduler.base_lr = 0.0
        CyclicalScheduler.bound_lr = 2.0
        CyclicalScheduler.half_cycle_size = 2
        CyclicalScheduler.switch_mode = "linear"
    """)
    summary.set_global_counter(1)
    assert s() == pytest.approx(1.0)
    summary.set_global_counter(3)
    assert s() == pytest.approx(1.0)
    summary.set_global_counter(2)
    assert s() == pytest.approx(2.0)


def test_gin_constant_scheduler():
    s = _parse_and_build("""
        _scheduled_consumer.x = @ConstantScheduler()
        ConstantScheduler.value = 0.25
    """)
    assert isinstance(s, ConstantScheduler) and s() == 0.25


def test_gin_invalid_binding_raises_value_error():
    gin.parse_config("""
        _scheduled_consumer.x = @LinearScheduler()
        LinearScheduler.progress_type = "epochs"
        LinearScheduler.schedule = [(0, 1.0), (1, 0.0)]
    """)
    with pytest.raises(ValueError, match="epochs"):
        _scheduled_consumer()
