"""Tests of the control-quality metrics on synthetic series with known answers."""

import math

import numpy as np
import pytest

from alf_entropy.experiments import control_metrics as cm


def test_warmup_end_first_sample_near_or_below_target():
    entropy = [1.0, 0.9, 0.52, 0.4, 0.6]
    assert cm.warmup_end(entropy, 0.5) == 2  # 0.52 <= 0.5 * 1.05
    assert cm.warmup_end(entropy, 0.5, tol=0.0) == 3
    assert cm.warmup_end([1.0, 0.9], 0.5) == 2  # never reached


def test_tracking_rmse_known_value():
    entropy = np.array([2.0, 0.5, 0.6, 0.4, 0.5])
    # after the first sample: errors 0, .1, -.1, 0 -> rmse sqrt(0.02 / 4)
    assert cm.tracking_rmse(entropy, 0.5, start=1) == pytest.approx(math.sqrt(0.005))
    assert cm.tracking_rmse(entropy, [0.5] * 5) == pytest.approx(math.sqrt((1.5**2 + 0.02) / 5))
    assert math.isnan(cm.tracking_rmse(entropy, 0.5, start=5))


def test_fraction_below_counts_more_than_tol_below():
    target = np.full(10, 1.0)
    entropy = np.array([1.0, 0.96, 0.94, 0.5, 1.2, 1.0, 0.9, 1.0, 1.0, 0.951])
    # below 0.95: 0.94, 0.5, 0.9 -> 3 of 10
    assert cm.fraction_below(entropy, target) == pytest.approx(0.3)
    assert cm.fraction_below(entropy, target, start=5) == pytest.approx(0.2)
    # negative targets: the band is relative to |target|
    assert cm.fraction_below([-2.2, -2.05], -2.0) == pytest.approx(0.5)


def _ar1(a, sigma, n, seed=0):
    rng = np.random.default_rng(seed)
    noise = rng.normal(0.0, sigma, n)
    y = np.zeros(n)
    for i in range(1, n):
        y[i] = a * y[i - 1] + noise[i]
    return y


@pytest.mark.parametrize("a", [0.0, 0.8, 0.97])
def test_minimum_variance_floor_of_a_known_process(a):
    """AR(1) with innovations of std 0.1: unpredictable 2 samples ahead is 0.1 * sqrt(1 + a^2),
    1 sample ahead 0.1; a target (and an offset) changes nothing."""
    y = _ar1(a, 0.1, 6000)
    assert cm.minimum_variance_floor(3.0 + y, 3.0, delay=2) == pytest.approx(
        0.1 * math.sqrt(1 + a * a), rel=0.04
    )
    assert cm.minimum_variance_floor(3.2 + y, np.full(y.size, 3.0), delay=1) == pytest.approx(
        0.1, rel=0.04
    )
    assert cm.minimum_variance_floor(y, 0.0, delay=3, order=1) == pytest.approx(
        0.1 * math.sqrt(1 + a * a + a**4), rel=0.04
    )


def test_minimum_variance_floor_counts_from_start_and_needs_samples():
    y = np.r_[np.full(50, 10.0), _ar1(0.5, 0.1, 3000)]
    floor = cm.minimum_variance_floor(y, 0.0, start=50)
    assert floor == pytest.approx(0.1 * math.sqrt(1.25), rel=0.05)
    assert cm.minimum_variance_floor(y, 0.0) > 2 * floor  # the jump at sample 50 counts too
    assert math.isnan(cm.minimum_variance_floor(np.arange(9.0), 0.0, order=4, delay=2))
    with pytest.raises(ValueError, match="delay"):
        cm.minimum_variance_floor(y, 0.0, delay=0)
    with pytest.raises(ValueError, match="order"):
        cm.minimum_variance_floor(y, 0.0, order=0)


def test_target_changes_ignores_a_ramp_finds_steps():
    ramp = np.linspace(1.2, 0.3, 4000)
    assert cm.target_changes(ramp).size == 0
    step = np.r_[np.full(100, 0.6), np.full(100, 1.0), np.full(50, 0.5)]
    assert cm.target_changes(step).tolist() == [100, 200]


def test_settling_time_of_a_first_order_response():
    n = 400
    target = np.r_[np.full(100, 0.6), np.full(n - 100, 1.0)]
    entropy = target.copy()
    k = np.arange(n - 100)
    entropy[100:] = 1.0 - 0.4 * 0.9**k  # within 5% (0.05) once 0.4*0.9^k <= 0.05
    expected = int(np.ceil(np.log(0.05 / 0.4) / np.log(0.9)))
    assert cm.settling_times(entropy, target) == [float(expected)]
    # in env-step units
    x = np.arange(n) * 1024
    assert cm.settling_times(entropy, target, x=x) == [float(expected * 1024)]
    # a late excursion out of the band resets the settling time
    entropy[300] = 0.5
    assert cm.settling_times(entropy, target) == [201.0]
    # never settled: outside the band at the end
    entropy[-1] = 0.5
    assert math.isnan(cm.settling_times(entropy, target)[0])


def test_largest_alpha_change_within_one_iteration():
    # 3 iterations of 4 updates; iteration 1 doubles alpha 4 times from 0.01
    alpha = [0.01, 0.01, 0.01, 0.01, 0.02, 0.04, 0.08, 0.16, 0.15, 0.14, 0.13, 0.12]
    group = [0] * 4 + [1] * 4 + [2] * 4
    change = cm.largest_alpha_change(alpha, group)
    assert change.factor == pytest.approx(16.0)  # from the last value of iteration 0
    assert (change.group, change.before, change.after) == (1.0, 0.01, 0.16)
    # a drop is a change too; before/after keep the time order
    change = cm.largest_alpha_change([3.3, 3.3, 0.0013], [5, 6, 6])
    assert change.factor == pytest.approx(3.3 / 0.0013)
    assert (change.before, change.after) == (3.3, 0.0013)
    # a logged gap: the previous value is not from iteration g - 1, not counted
    change = cm.largest_alpha_change([0.01, 1.0, 1.1], [0, 10, 10])
    assert change.factor == pytest.approx(1.1)
    # one update per iteration: the largest step-to-step factor
    assert cm.largest_alpha_change([1.0, 2.0, 8.0, 4.0]).factor == pytest.approx(4.0)
    assert math.isnan(cm.largest_alpha_change([]).factor)


def test_final_value_skips_nan():
    assert cm.final_value([1.0, 500.0, math.nan]) == 500.0
    assert math.isnan(cm.final_value([]))


@pytest.mark.parametrize(
    "call",
    [
        lambda: cm.tracking_rmse([1.0, 2.0], [1.0, 2.0, 3.0]),
        lambda: cm.fraction_below([1.0], 1.0, tol=1.5),
        lambda: cm.fraction_below([1.0], 1.0, start=-1),
        lambda: cm.target_changes([1.0, 2.0], min_change=0),
        lambda: cm.settling_times([1.0, 2.0], [1.0, 2.0], x=[0.0]),
        lambda: cm.largest_alpha_change([1.0, 0.0]),
        lambda: cm.largest_alpha_change([1.0, 2.0], [0]),
    ],
)
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_bootstrap_ci_brackets_the_mean_and_is_reproducible():
    mean, lo, hi = cm.bootstrap_ci([0.1, 0.2, 0.6, float("nan")])
    assert mean == pytest.approx(0.3)
    assert 0.1 <= lo < mean < hi <= 0.6
    assert cm.bootstrap_ci([0.1, 0.2, 0.6]) == (mean, lo, hi)
    mean, lo, hi = cm.bootstrap_ci([2.0, math.nan])  # one value: its mean, no interval
    assert mean == 2.0 and math.isnan(lo) and math.isnan(hi)
    assert all(math.isnan(v) for v in cm.bootstrap_ci([]))
    with pytest.raises(ValueError, match="confidence"):
        cm.bootstrap_ci([1.0], confidence=1.0)
    with pytest.raises(ValueError, match="resamples"):
        cm.bootstrap_ci([1.0], resamples=0)
