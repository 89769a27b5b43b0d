"""PIDEntropyTargetAlgorithm: the rule, its bounds, anti-windup, paths and state."""

import math
import warnings

import gin
import numpy as np
import pytest
import torch

from alf_entropy.algorithms.entropy_target_algorithm import NestedEntropyTargetAlgorithm
from alf_entropy.controllers import WINDUP_WINDOW, PIDEntropyTargetAlgorithm
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils.dist_utils import entropy_per_log_alpha
from tests.controllers.test_entropy_target_algorithm import _forbid_host_sync

TWO = BoundedTensorSpec((), torch.int64, 0, 1)
FOUR = BoundedTensorSpec((), torch.int64, 0, 3)
GAUSS6 = BoundedTensorSpec((6,), torch.float32, -1.0, 1.0)


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"kp": -1.0}, "kp"),
        ({"ki": -0.1}, "ki"),
        ({"kd": float("nan")}, "kd"),
        ({"error_ema": 1.0}, "error_ema"),
        ({"trend_emas": (0.9, 0.5)}, "trend_emas"),
        ({"max_alpha_change": 1.0}, "max_alpha_change"),
        ({"min_alpha": float("inf")}, "min_alpha"),
        ({"min_alpha": 0.5, "max_alpha": 0.2}, "max_alpha"),
        ({"initial_alpha": 5.0, "max_alpha": 1.0}, "initial_alpha"),
        ({"error_scale": 0.0}, "error_scale"),
        ({"update_mode": "fast"}, "update_mode"),
        ({"target_entropy": 2.0}, "target_entropy"),  # above log 4
    ],
)
def test_bad_arguments_are_value_errors_naming_them(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        PIDEntropyTargetAlgorithm(FOUR, **kwargs)


def test_wrong_types_are_type_errors():
    with pytest.raises(TypeError, match="kp"):
        PIDEntropyTargetAlgorithm(FOUR, kp="1")
    with pytest.raises(TypeError, match="trend_emas"):
        PIDEntropyTargetAlgorithm(FOUR, trend_emas=0.5)


def test_error_scale_from_the_spec():
    assert entropy_per_log_alpha(TWO) == pytest.approx(0.5 * math.log(2))
    assert entropy_per_log_alpha(GAUSS6) == pytest.approx(3.0)
    assert entropy_per_log_alpha({"a": TWO, "b": GAUSS6}) == pytest.approx(3.0 + 0.5 * math.log(2))
    assert PIDEntropyTargetAlgorithm(TWO, error_scale=0.2).error_scale == 0.2


def _plant(alpha):
    """A policy whose entropy follows alpha at half the nominal sensitivity."""
    return 0.5 + 0.35 * math.log(alpha / 0.1)


def test_alpha_moves_toward_the_target_within_its_bounds():
    pid = PIDEntropyTargetAlgorithm(FOUR, target_entropy=1.3, min_alpha=0.05, max_alpha=0.5)
    alphas, alpha = [], 0.1
    for _ in range(300):  # the target needs alpha 1.0: alpha rises to max_alpha, not beyond
        alpha = pid.adjust_alpha(_plant(alpha)).item()
        alphas.append(alpha)
    assert alphas[-1] == pytest.approx(0.5)
    assert np.diff(np.log([0.1] + alphas)).max() <= math.log(1.25) + 1e-6  # x1.25 per update
    pid2 = PIDEntropyTargetAlgorithm(FOUR, target_entropy=0.3, min_alpha=0.2, initial_alpha=1.0)
    alphas, alpha = [], 1.0
    for _ in range(300):  # the target needs alpha 0.056: alpha falls to min_alpha
        alpha = pid2.adjust_alpha(_plant(alpha)).item()
        alphas.append(alpha)
    assert alphas[-1] == pytest.approx(0.2)
    assert np.diff(np.log(alphas)).min() >= -math.log(1.25) - 1e-6
    assert int(pid.stage) == 1


def test_back_calculation_leaves_no_windup_at_the_bounds():
    """After a long spell at max_alpha, alpha leaves it as soon as the error flips."""
    pid = PIDEntropyTargetAlgorithm(FOUR, target_entropy=1.3, max_alpha=0.5)
    alpha = 0.1
    with pytest.warns(UserWarning, match="unreachable"):  # at the ceiling for 500 updates
        for _ in range(600):  # the target needs alpha 1.0: a long spell at the ceiling
            alpha = pid.adjust_alpha(_plant(alpha)).item()
    assert alpha == pytest.approx(0.5)
    pid.adjust_alpha(1.35)
    pid.adjust_alpha(1.35)
    assert pid.alpha.item() < 0.45


def test_unreachable_target_is_found_at_the_ceiling_and_warned_once():
    """A policy pinned below its target: alpha climbs to max_alpha, not beyond; after
    WINDUP_WINDOW updates there the target is reported unreachable, once."""
    pid = PIDEntropyTargetAlgorithm(TWO, target_entropy=0.68, initial_alpha=0.01, max_alpha=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alphas = [pid.adjust_alpha(0.3).item() for _ in range(3000)]
    unreachable = [w for w in caught if "unreachable" in str(w.message)]
    assert len(unreachable) == 1
    assert bool(pid.unreachable_target) and int(pid.driver.stalled_for) >= WINDUP_WINDOW
    assert max(alphas) == pytest.approx(1.0) and alphas[-1] == pytest.approx(1.0)
    first_at_ceiling = int(np.argmax(np.isclose(alphas, 1.0)))
    assert first_at_ceiling < 3000 - WINDUP_WINDOW


def _slow_plant(alpha, entropy):
    """PPO-like: the entropy ignores alpha below 0.03, then answers it over ~10 updates."""
    return entropy + 0.1 * (0.56 + 0.3 * max(0.0, math.log(alpha / 0.03)) - entropy)


def _run_slow_plant(pid, alpha, updates=300):
    entropy, seen = 0.56, []
    for _ in range(updates):
        entropy = _slow_plant(alpha, entropy)
        alpha = pid.adjust_alpha(entropy).item()
        seen.append(entropy)
    return np.array(seen[updates // 2 :])


@pytest.mark.parametrize("initial_alpha", [1e-3, 1e-2, 0.1])
def test_a_slow_plant_is_held_from_any_initial_alpha_without_a_false_alarm(initial_alpha):
    """Alpha must climb up to x30 before the entropy answers: the integral's rate grows while
    the entropy stays below the target without rising, so the target is held in the second
    half of 300 updates (one per rollout of a 100k-step PPO run), with no warning."""
    pid = PIDEntropyTargetAlgorithm(TWO, target_entropy=0.6, initial_alpha=initial_alpha)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second_half = _run_slow_plant(pid, initial_alpha)
    assert np.sqrt(np.mean((second_half - 0.6) ** 2)) < 0.006
    assert np.mean(second_half < 0.95 * 0.6) == 0.0
    assert not bool(pid.unreachable_target)


def test_without_the_growing_rate_the_slow_plant_is_not_reached():
    pid = PIDEntropyTargetAlgorithm(
        TWO, target_entropy=0.6, initial_alpha=1e-3, integral_growth=1.0
    )
    assert np.mean(_run_slow_plant(pid, 1e-3) < 0.95 * 0.6) > 0.9


@pytest.mark.parametrize("growth_band, grows", [(None, True), (0.02, False)])
def test_the_rate_grows_outside_one_percent_below_the_target(growth_band, grows):
    """PPO's entropy drifts 1-2 % under the target while alpha is far below its equilibrium:
    the default band (1 %) starts the growth there, a 2 % band would wait."""
    kwargs = {} if growth_band is None else {"growth_band": growth_band}
    pid = PIDEntropyTargetAlgorithm(TWO, target_entropy=0.6, initial_alpha=1e-3, **kwargs)
    for _ in range(30):
        pid.adjust_alpha(0.6 * 0.985)
    assert (abs(float(pid.driver.gain)) > 2.0) == grows


def test_host_and_tensor_paths_agree_bit_for_bit():
    rng = np.random.default_rng(0)
    seq = list(1.3 + np.cumsum(rng.normal(-0.01, 0.05, 300)))
    seq[50] = float("nan")
    host = PIDEntropyTargetAlgorithm(FOUR, target_entropy=0.7, update_mode="host")
    tensor = PIDEntropyTargetAlgorithm(FOUR, target_entropy=0.7, update_mode="tensor")
    for k, h in enumerate(seq):
        entropy = torch.full((4,), h)
        mask = torch.zeros(4, dtype=torch.bool) if k == 80 else None  # an empty batch
        host.entropy_loss(entropy, mask)
        tensor.entropy_loss(entropy, mask)
        for (key, a), b in zip(host.state_dict().items(), tensor.state_dict().values()):
            assert torch.equal(a, b), (k, key)
    assert host.num_nonfinite_entropy.item() == 1


def test_tensor_path_never_reads_the_host():
    pid = PIDEntropyTargetAlgorithm(FOUR, target_entropy=0.7, update_mode="tensor")
    entropy = torch.linspace(1.0, 0.2, 8)
    with _forbid_host_sync():
        for _ in range(20):
            pid.entropy_loss(entropy)
            pid.adjust_alpha(entropy[0])


def test_state_dict_resumes_the_exact_trajectory():
    seq = [1.3 - 0.01 * k + 0.05 * math.sin(k) for k in range(120)]
    full = PIDEntropyTargetAlgorithm(FOUR, target_entropy=0.7)
    part = PIDEntropyTargetAlgorithm(FOUR, target_entropy=0.7)
    for h in seq[:60]:
        full.adjust_alpha(h)
        part.adjust_alpha(h)
    resumed = PIDEntropyTargetAlgorithm(FOUR, target_entropy=0.7)
    resumed.load_state_dict(part.state_dict())
    for h in seq[60:]:
        assert torch.equal(full.adjust_alpha(h), resumed.adjust_alpha(h))
    keys = {"driver." + k for k in ("log_alpha", "integral", "err_ema", "fast", "slow", "count")}
    assert keys <= set(full.state_dict())


def _closed_loop(spec, dist_fn, params, target, updates=600):
    """A policy pushed toward one action (or a narrow Gaussian) plus the bonus."""
    torch.manual_seed(0)
    pid = PIDEntropyTargetAlgorithm(spec, target_entropy=target)
    opt = torch.optim.Adam(params, lr=0.05)
    entropies = []
    for _ in range(updates):
        dist, task_loss = dist_fn()
        loss = task_loss + pid.entropy_loss(dist.entropy().expand(8)).loss.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        entropies.append(dist.entropy().item())
    return np.array(entropies)


def test_one_setting_holds_a_categorical_and_a_gaussian():
    """The same default gains hold a 2-action Categorical and a 6-d Gaussian."""
    logits = torch.nn.Parameter(torch.zeros(2))

    def categorical():
        dist = torch.distributions.Categorical(logits=logits)
        return dist, -dist.probs[0]

    log_std = torch.nn.Parameter(torch.zeros(6))

    def gaussian():
        dist = torch.distributions.Independent(
            torch.distributions.Normal(torch.zeros(6), log_std.exp()), 1
        )
        return dist, log_std.exp().square().sum()  # pushes the std down

    for spec, fn, params, target in (
        (TWO, categorical, [logits], 0.5),
        (GAUSS6, gaussian, [log_std], 2.0),
    ):
        entropy = _closed_loop(spec, fn, params, target)
        tail = entropy[-200:]
        assert np.abs(tail - target).max() < 0.05 * abs(target), (spec, tail[-5:])


def test_nested_per_action_pid_controllers():
    nested = NestedEntropyTargetAlgorithm(
        {"a": TWO, "b": GAUSS6},
        leaf_cls=PIDEntropyTargetAlgorithm,
        target_entropy={"a": 0.5, "b": -3.0},
    )
    leaves = nested.leaf_algorithms()
    assert all(isinstance(x, PIDEntropyTargetAlgorithm) for x in leaves.values())
    for _ in range(5):
        nested.adjust_alpha({"a": 0.2, "b": 0.0})  # a below its target, b above
    assert leaves["a"].alpha.item() > 0.1 > leaves["b"].alpha.item()


def test_bindable_in_gin_inside_ppo():
    from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
    from alf_entropy.tensor_specs import TensorSpec

    gin.parse_config("""
        import alf_entropy.controllers
        import alf_entropy.utils.dist_utils
        PPOAlgorithm.enforce_entropy_target = True
        PPOAlgorithm.entropy_target_cls = @PIDEntropyTargetAlgorithm
        PIDEntropyTargetAlgorithm.target_entropy = @greedy_probability_target()
        greedy_probability_target.p = 0.8
        greedy_probability_target.num_actions = 2
        PIDEntropyTargetAlgorithm.kp = 1.0
    """)
    alg = PPOAlgorithm(TensorSpec((4,)), TWO)
    controller = alg.entropy_target_algorithm
    assert isinstance(controller, PIDEntropyTargetAlgorithm)
    assert controller.target_entropy == pytest.approx(0.5004, abs=1e-4)


@pytest.mark.parametrize("lag, noise", [(0.3, 0.05), (0.1, 0.2), (0.03, 0.05)])
def test_a_tracked_target_and_its_step_up_raise_no_warning(lag, noise):
    """A noisy, lagging policy tracks 0.6, then 1.2 after a x5.5 climb of
    alpha: the watch never finds a stall and never warns."""
    box = {"target": 0.6}
    pid = PIDEntropyTargetAlgorithm(FOUR, target_entropy=lambda: box["target"])
    gen = torch.Generator().manual_seed(0)
    alpha, entropy, held = pid.alpha.item(), 0.5, 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in range(3000):
            box["target"] = 0.6 if k < 1500 else 1.2
            entropy += lag * (_plant(alpha) - entropy)  # the policy lags alpha
            alpha = pid.adjust_alpha(entropy + noise * torch.randn((), generator=gen)).item()
            held += bool(pid.driver.stalled_for)
            assert not bool(pid.unreachable_target), k
    assert held < WINDUP_WINDOW // 10  # at the ceiling below the target only briefly
    assert entropy == pytest.approx(1.2, abs=0.1)


def _noisy_plant(pid, sigma, lag, alpha, updates=2000, seed=0):
    """SAC's cadence: the entropy follows -1 + 0.5 log(alpha / 0.2) (a 1-d squashed action)
    with a first-order lag of ``lag`` updates, read with Gaussian noise of ``sigma`` nats."""
    rng, entropy = np.random.default_rng(seed), -1.0 + 0.5 * math.log(alpha / 0.2)
    entropies, alphas = [], []
    for _ in range(updates):
        entropy += (-1.0 + 0.5 * math.log(alpha / 0.2) - entropy) / lag
        alpha = pid.adjust_alpha(entropy + sigma * rng.standard_normal()).item()
        entropies.append(entropy)
        alphas.append(alpha)
    return np.array(entropies), np.array(alphas)


@pytest.mark.parametrize("sigma", [0.05, 0.3])
@pytest.mark.parametrize("lag", [1, 20])
@pytest.mark.parametrize("initial_alpha", [1.0, 1e-3])
def test_noisy_readings_do_not_reach_alpha(sigma, lag, initial_alpha):
    """Per-batch noise of 0.05-0.3 nats at one update per gradient step: alpha moves by at
    most 3 % per update in the second half and stays within x1.5 of the equilibrium (0.2),
    the entropy reaches its 10 % band within 600 updates and alpha overshoots 0.2 by less
    than x10 on the way in."""
    spec = BoundedTensorSpec((1,), torch.float32, -1.0, 1.0)
    pid = PIDEntropyTargetAlgorithm(spec, target_entropy=-1.0, initial_alpha=initial_alpha)
    entropy, alpha = _noisy_plant(pid, sigma, lag, initial_alpha)
    late = np.log(alpha[1000:])
    assert np.median(np.abs(np.diff(late))) <= 0.03
    assert np.all(np.abs(late - math.log(0.2)) <= math.log(1.5))
    assert np.sqrt(np.mean((entropy[1000:] + 1.0) ** 2)) <= 0.05
    assert np.argmax(np.abs(entropy + 1.0) <= 0.1) <= 600
    overshoot = alpha.max() / 0.2 if initial_alpha < 0.2 else 0.2 / alpha.min()
    assert overshoot < 10
