"""Stable-Baselines3 integration: the coefficient SB3 uses follows the controller.

Each run checks the value inside SB3's loss, not the attribute we set (SB3
issues #628/#1403: setting ``model.ent_coef`` from a callback is easy to get
wrong): a gradient hook on the entropy (PPO/A2C: ``loss = ... + ent_coef *
-mean(entropy)``, so ``d loss / d entropy`` sums to ``-ent_coef``) or on SAC's
``log_prob`` (``actor_loss = mean(ent_coef * log_prob - q)``: sums to
``ent_coef``) recovers the coefficient of every gradient step.  Short runs
(CartPole 2048 steps, Pendulum 600), a few seconds each.
"""

import doctest
import math

import pytest
import torch

pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")

from stable_baselines3 import A2C, DQN, PPO, SAC  # noqa: E402
from stable_baselines3.common.logger import KVWriter, Logger  # noqa: E402

from alf_entropy import (  # noqa: E402
    EntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    LinearScheduler,
    PIDEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.integrations import sb3  # noqa: E402
from alf_entropy.integrations.sb3 import EntropyControllerCallback  # noqa: E402
from alf_entropy.utils import schedulers  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _spy_on_coefficient(model, callback):
    """Record, per ``train()`` call, the controller's alpha and the coefficients SB3's loss used."""
    calls = []
    if isinstance(model, SAC):
        original = model.actor.action_log_prob

        def action_log_prob(obs):
            actions, log_prob = original(obs)
            if log_prob.requires_grad:  # the actor-loss call (the target's is under no_grad)
                log_prob.register_hook(lambda g: calls[-1][1].append(float(g.sum())))
            return actions, log_prob

        model.actor.action_log_prob = action_log_prob
    else:
        original = model.policy.evaluate_actions

        def evaluate_actions(obs, actions):
            values, log_prob, entropy = original(obs, actions)
            entropy.register_hook(lambda g: calls[-1][1].append(float(-g.sum())))
            return values, log_prob, entropy

        model.policy.evaluate_actions = evaluate_actions
    train = model.train

    def spied_train(*args, **kwargs):
        calls.append((float(callback.controller.alpha), []))
        return train(*args, **kwargs)

    model.train = spied_train
    return calls


def _assert_sb3_used_the_controllers_alpha(calls):
    assert calls, "train() never ran"
    for alpha, used in calls:
        assert used, "no gradient step in a train() call"
        for value in used:
            assert value == pytest.approx(alpha, rel=1e-5), (alpha, used)


def _policy_entropy(model):
    with torch.no_grad():
        if isinstance(model, SAC):
            data = model.replay_buffer.sample(1024)
            return -model.actor.action_log_prob(data.observations)[1].mean().item()
        obs = torch.as_tensor(model.rollout_buffer.observations.reshape(-1, 4))
        return model.policy.get_distribution(obs).entropy().mean().item()


def _on_policy(cls):
    env = gym.make("CartPole-v1")
    if cls is PPO:
        return PPO(
            "MlpPolicy", env, n_steps=128, batch_size=64, n_epochs=4, learning_rate=3e-3, seed=0
        )
    return A2C("MlpPolicy", env, n_steps=16, learning_rate=3e-3, seed=0)


def _sac():
    return SAC(
        "MlpPolicy",
        gym.make("Pendulum-v1"),
        learning_starts=100,
        batch_size=64,
        learning_rate=1e-3,
        policy_kwargs=dict(net_arch=[64, 64]),
        seed=0,
    )  # ent_coef="auto"


class _Recorder(KVWriter):
    """An SB3 logger output that keeps every dumped key-value set."""

    def __init__(self):
        self.dumps = []

    def write(self, key_values, key_excluded, step=0):
        self.dumps.append(dict(key_values))


def _train(make, callback, steps, log_interval=1):
    model = make()
    model.recorder = _Recorder()
    model.set_logger(Logger(folder=None, output_formats=[model.recorder]))
    calls = _spy_on_coefficient(model, callback)
    model.learn(steps, callback=callback, log_interval=log_interval)
    return model, calls


@pytest.mark.slow
@pytest.mark.parametrize("cls", [PPO, A2C])
def test_on_policy_coefficient_follows_the_controller_and_raises_the_entropy(cls):
    target = 0.68  # CartPole: log 2 = 0.693 at most; training drives it down
    callback = EntropyControllerCallback(
        EntropyTargetAlgorithm, target_entropy=target, skip_free_stage=True, initial_alpha=0.01
    )
    model, calls = _train(lambda: _on_policy(cls), callback, 2048)
    _assert_sb3_used_the_controllers_alpha(calls)
    alphas = [alpha for alpha, _ in calls]
    assert len(calls) == callback.num_updates  # one controller update before each train()
    assert alphas[-1] > 5 * alphas[0]  # below its target all along: alpha rose
    assert model.ent_coef == alphas[-1]
    # Recorded through SB3's logger: alpha, entropy and target of each update.
    logged = [d for d in model.recorder.dumps if "entropy_controller/alpha" in d]
    assert logged and all(d["entropy_controller/target_entropy"] == target for d in logged)
    assert {d["entropy_controller/alpha"] for d in logged} <= set(alphas)
    assert all(0 < d["entropy_controller/entropy"] < math.log(2) for d in logged)

    fixed = EntropyControllerCallback(FixedEntropyCoefficient, alpha=1e-4)
    fixed_model, fixed_calls = _train(lambda: _on_policy(cls), fixed, 2048)
    _assert_sb3_used_the_controllers_alpha(fixed_calls)
    entropy, fixed_entropy = _policy_entropy(model), _policy_entropy(fixed_model)
    assert entropy > fixed_entropy + 0.03, (entropy, fixed_entropy)
    assert abs(entropy - target) < abs(fixed_entropy - target)


@pytest.mark.slow
def test_sac_coefficient_follows_the_controller_and_raises_the_entropy(tmp_path):
    target = 0.3  # nats in SB3's [-1, 1] action coordinates (at most log 2)
    callback = EntropyControllerCallback(
        EntropyTargetAlgorithm,
        target_entropy=target,
        skip_free_stage=True,
        initial_alpha=0.01,
        slow_update_rate=0.01,
        fast_update_rate=0.01,
    )
    model, calls = _train(_sac, callback, 600)
    assert model.ent_coef_optimizer is None  # SB3's own "auto" rule is off
    _assert_sb3_used_the_controllers_alpha(calls)
    alphas = [alpha for alpha, _ in calls]
    assert len(calls) == callback.num_updates == 500  # one per gradient step after learning_starts
    assert alphas[-1] > 2 * alphas[0]
    assert callback.controller.action_spec.minimum.tolist() == [-1.0]  # squashed coordinates
    # SB3's own log of the coefficient it used agrees (dumped after every episode).
    logged = [d for d in model.recorder.dumps if "train/ent_coef" in d]
    assert logged and all(
        d["train/ent_coef"] == pytest.approx(d["entropy_controller/alpha"]) for d in logged
    )

    # save() stores the coefficient SB3 uses, and load() restores it.
    model.save(tmp_path / "sac")
    loaded = SAC.load(tmp_path / "sac")
    assert loaded.ent_coef_optimizer is None
    assert float(loaded.ent_coef_tensor) == pytest.approx(alphas[-1], rel=1e-6)

    fixed = EntropyControllerCallback(FixedEntropyCoefficient, alpha=1e-4)
    fixed_model, fixed_calls = _train(_sac, fixed, 600)
    _assert_sb3_used_the_controllers_alpha(fixed_calls)
    entropy, fixed_entropy = _policy_entropy(model), _policy_entropy(fixed_model)
    assert entropy > fixed_entropy + 1.0, (entropy, fixed_entropy)


def test_scheduled_target_follows_sb3s_progress():
    schedule = LinearScheduler("percent", [(0.0, 0.6), (1.0, 0.2)])
    callback = EntropyControllerCallback(EntropyTargetAlgorithm, target_entropy=schedule)
    targets = []
    record = callback._record
    callback._record = lambda entropy, alpha: (
        targets.append(callback.controller.target_entropy) or record(entropy, alpha)
    )
    model = A2C("MlpPolicy", gym.make("CartPole-v1"), n_steps=16, seed=0)
    model.learn(320, callback=callback)
    # Rollout k of 20 ends at 16 k steps: the target at that progress.
    assert targets == pytest.approx([0.6 - 0.4 * 16 * k / 320 for k in range(1, 21)], abs=1e-6)
    assert schedulers.get_progress("env_steps") == 320


def test_a_controller_instance_is_used_and_kept_across_learn_calls():
    controller = SGDEntropyTargetAlgorithm(
        sb3_action_spec := EntropyTargetAlgorithm.from_space(gym.spaces.Discrete(2)).action_spec,
        target_entropy=0.5,
    )
    callback = EntropyControllerCallback(controller)
    model = A2C("MlpPolicy", gym.make("CartPole-v1"), n_steps=8, seed=0)
    model.learn(64, callback=callback)
    model.learn(64, callback=callback, reset_num_timesteps=False)
    assert callback.controller is controller and callback.num_updates == 16
    assert controller.action_spec == sb3_action_spec
    assert model.ent_coef == float(controller.alpha)


def test_bad_arguments_name_the_argument():
    with pytest.raises(TypeError, match="controller must be an EntropyController"):
        EntropyControllerCallback(torch.nn.Linear)
    with pytest.raises(TypeError, match="controller_kwargs are for a controller class"):
        EntropyControllerCallback(
            FixedEntropyCoefficient(
                EntropyTargetAlgorithm.from_space(gym.spaces.Discrete(2)).action_spec
            ),
            target_entropy=0.3,
        )
    with pytest.raises(ValueError, match="batch_size"):
        EntropyControllerCallback(batch_size=0)
    with pytest.raises(RuntimeError, match="when training starts"):
        EntropyControllerCallback().controller
    with pytest.raises(TypeError, match="drives PPO, A2C .* and SAC"):
        DQN("MlpPolicy", gym.make("CartPole-v1"), learning_starts=0).learn(
            1, callback=EntropyControllerCallback()
        )


def test_a_sac_controller_for_the_envs_bounds_is_refused_as_tianshou_refuses_it():
    """SAC's log_prob is in squashed [-1, 1] units: an instance built from Pendulum's own
    Box(-2, 2) would hold a target 2 log 2 nats off; refused with check_squashed's message."""
    from alf_entropy.integrations.squashed import check_squashed

    wrong = EntropyTargetAlgorithm.from_space(gym.make("Pendulum-v1").action_space)
    with pytest.raises(ValueError) as refused:
        _sac().learn(1, callback=EntropyControllerCallback(wrong))
    with pytest.raises(ValueError) as tianshou_message:
        check_squashed(wrong.action_spec)
    assert str(refused.value) == str(tianshou_message.value)
    assert "is not [-1, 1]" in str(refused.value) and "Box(-1, 1)" in str(refused.value)
    right = EntropyTargetAlgorithm.from_space(gym.spaces.Box(-1.0, 1.0, (1,)))
    callback = EntropyControllerCallback(right)
    callback.init_callback(_sac())
    assert callback.controller is right


def test_the_docstring_example_runs():
    result = doctest.testmod(sb3, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_entropy_is_not_nan_with_dict_free_rollouts():
    # The mean over the rollout is a plain average (float64 sum): finite and in [0, log 2].
    callback = EntropyControllerCallback(FixedEntropyCoefficient, alpha=0.0)
    model = A2C("MlpPolicy", gym.make("CartPole-v1"), n_steps=8, seed=0)
    model.learn(16, callback=callback)
    entropy = model.logger.name_to_value["entropy_controller/entropy"]
    assert 0.0 <= entropy <= math.log(2) + 1e-6


def _state(controller):
    return {k: v.clone() for k, v in controller.state_dict().items() if torch.is_tensor(v)}


@pytest.mark.parametrize("algo", [PPO, A2C, SAC], ids=lambda a: a.__name__)
@pytest.mark.parametrize(
    "cls",
    [
        EntropyTargetAlgorithm,
        PIDEntropyTargetAlgorithm,
        SGDEntropyTargetAlgorithm,
        FixedEntropyCoefficient,
    ],
    ids=lambda c: c.__name__,
)
def test_model_save_and_load_carry_the_controller(algo, cls, tmp_path):
    """After model.save() / Algo.load() and a callback built as before, the controller starts
    from every buffer it had at save and SB3 uses its alpha; nothing saved by hand."""
    sac = algo is SAC
    env = gym.make("Pendulum-v1" if sac else "CartPole-v1")
    kwargs = dict(target_entropy=-1.0 if sac else 0.6, initial_alpha=0.05, max_alpha=2.0)
    size = dict(learning_starts=32, batch_size=32) if sac else dict(n_steps=32)
    if algo is PPO:  # minibatches that divide the rollout: SB3 warns otherwise
        size["batch_size"] = 32
    model = algo("MlpPolicy", env, seed=0, **size)
    callback = EntropyControllerCallback(cls, **kwargs)
    model.learn(160, callback=callback)
    saved, updates = _state(callback.controller), callback.num_updates
    assert updates > 0
    model.save(tmp_path / "model")
    loaded = algo.load(tmp_path / "model", env=env)
    resumed = EntropyControllerCallback(cls, **kwargs)
    resumed.init_callback(loaded)
    assert resumed.num_updates == updates
    state = _state(resumed.controller)
    assert state.keys() == saved.keys()
    assert all(torch.equal(state[k], v) for k, v in saved.items())
    used = float(loaded.ent_coef_tensor) if sac else loaded.ent_coef
    assert used == pytest.approx(float(resumed.controller.alpha), rel=1e-6)
    loaded.learn(64, callback=resumed, reset_num_timesteps=False)
    assert resumed.num_updates > updates
    with pytest.raises(ValueError, match=f"saved with a {cls.__name__}"):
        other = (
            FixedEntropyCoefficient
            if cls is not FixedEntropyCoefficient
            else EntropyTargetAlgorithm
        )
        EntropyControllerCallback(other).init_callback(algo.load(tmp_path / "model", env=env))


def test_settings_that_would_fail_at_learn_fail_at_construction():
    with pytest.raises(TypeError, match="skip_free_stage"):
        EntropyControllerCallback(PIDEntropyTargetAlgorithm, skip_free_stage=True)
    with pytest.raises(ValueError, match="max_entropy"):
        EntropyControllerCallback(EntropyTargetAlgorithm, target_entropy=1.0, max_entropy=0.5)
    with pytest.raises(ValueError, match="lr"):
        EntropyControllerCallback(SGDEntropyTargetAlgorithm, lr=-1e-3)
    with pytest.raises(ValueError, match="initial_alpha"):
        EntropyControllerCallback(PIDEntropyTargetAlgorithm, initial_alpha=3.0, max_alpha=2.0)
