"""Tests for alf_entropy.algorithms.actor_critic_algorithm (A2C with GAE)."""

import functools

import pytest
import torch

from alf_entropy import accel
from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm
from alf_entropy.algorithms.entropy_target_algorithm import (
    EntropyTargetAlgorithm,
    NestedEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.data_structures import StepType, TimeStep, make_experience
from alf_entropy.networks import ActorDistributionNetwork
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
from alf_entropy.trainers.on_policy_trainer import stack_experiences
from alf_entropy.utils import nest, value_ops

OBS_SPEC = TensorSpec((4,))
DISCRETE = BoundedTensorSpec((), torch.int64, 0, 1)
CONTINUOUS = BoundedTensorSpec((2,), torch.float32, -2.0, 2.0)
F, M, L = StepType.FIRST, StepType.MID, StepType.LAST


def _time_step(step_type, obs=None, reward=None, discount=None, B=3):
    step_type = torch.as_tensor(step_type, dtype=torch.int64)
    return TimeStep(
        step_type=step_type,
        reward=torch.zeros(B) if reward is None else torch.as_tensor(reward, dtype=torch.float32),
        discount=(
            torch.ones(B) if discount is None else torch.as_tensor(discount, dtype=torch.float32)
        ),
        observation=torch.randn(B, 4) if obs is None else obs,
    )


def _unroll(alg, step_types, rewards=None, discounts=None, seed=0):
    """A [T, B] experience from rollout_step on random observations."""
    torch.manual_seed(seed)
    T, B = len(step_types) - 1, len(step_types[0])
    exps = []
    for t in range(T):
        ts = _time_step(
            step_types[t],
            reward=None if rewards is None else rewards[t],
            discount=None if discounts is None else discounts[t],
            B=B,
        )
        with torch.no_grad():
            exps.append(make_experience(ts, alg.rollout_step(ts)))
    final = _time_step(
        step_types[T],
        reward=None if rewards is None else rewards[T],
        discount=None if discounts is None else discounts[T],
        B=B,
    )
    return stack_experiences(exps), final


def _alg(**kwargs):
    kwargs.setdefault("optimizer", functools.partial(torch.optim.SGD, lr=0.1))
    torch.manual_seed(0)
    return ActorCriticAlgorithm(OBS_SPEC, kwargs.pop("action_spec", DISCRETE), **kwargs)


def test_rollout_and_predict_shapes_discrete_and_squashed():
    alg = _alg()
    ts = _time_step([F, M, L])
    step = alg.rollout_step(ts)
    assert step.output.shape == (3,) and step.output.dtype == torch.int64
    assert step.info.log_prob.shape == (3,)
    assert step.info.value == ()  # computed for the whole unroll in preprocess_experience
    assert torch.all(step.info.log_prob <= 0)

    alg = _alg(
        action_spec=CONTINUOUS,
        actor_network_ctor=functools.partial(
            ActorDistributionNetwork, squash_to_spec=True, init_log_std=1.0
        ),
    )
    ts = _time_step([M] * 3)
    out = alg.rollout_step(ts).output
    assert out.shape == (3, 2) and torch.all(out.abs() <= 2.0)
    mode = alg.predict_step(ts).output
    assert mode.shape == (3, 2) and torch.all(mode.abs() <= 2.0)


def test_preprocess_bootstraps_and_matches_value_ops():
    alg = _alg(gamma=0.9, td_lambda=0.8)
    steps = [[F, M], [M, M], [L, M], [F, M], [M, L]]  # T = 4 stored, final LAST
    rewards = [[0, 0], [1, 2], [3, 4], [0, 5], [6, 7]]
    discounts = [[1, 1], [1, 1], [0, 1], [1, 1], [1, 1]]
    exp, final = _unroll(alg, steps, rewards, discounts)
    flat = alg.preprocess_experience(exp, final)
    assert flat.step_type.shape == (8,)
    assert flat.time_step.observation.shape == (8, 4)
    with torch.no_grad():
        v_final = alg.value_network(final.observation)
        value = torch.stack([alg.value_network(o) for o in exp.time_step.observation])
    # The batched values equal one forward pass per step.
    torch.testing.assert_close(flat.rollout_info.value, value.reshape(-1))
    values = torch.cat([value, v_final[None]])
    expected = value_ops.generalized_advantage_estimation(
        torch.tensor(rewards, dtype=torch.float32),
        values,
        torch.tensor(steps),
        torch.tensor(discounts, dtype=torch.float32) * 0.9,
        td_lambda=0.8,
    )
    torch.testing.assert_close(flat.rollout_info.advantages, expected.reshape(-1))
    torch.testing.assert_close(flat.rollout_info.returns, (expected + value).reshape(-1))
    # The LAST step (t=2, env 0) gets no advantage; the step before it is not
    # bootstrapped (terminated: discount 0).
    adv = flat.rollout_info.advantages.reshape(4, 2)
    assert adv[2, 0] == 0
    assert adv[1, 0].item() == pytest.approx(3.0 - value[1, 0].item(), abs=1e-5)
    # The last stored step of env 1 is bootstrapped from the final time step
    # (a truncation there: LAST with discount 1).
    assert adv[3, 1].item() == pytest.approx(
        7.0 + 0.9 * v_final[1].item() - value[3, 1].item(), abs=1e-5
    )


def test_last_steps_do_not_affect_the_update():
    """Changing what was stored at a LAST step (its ignored action) changes nothing."""
    steps = [[F, M, M], [M, L, M], [M, F, M], [M, M, L], [M, M, F]]
    rewards = [[0, 0, 0], [1, 1, 1], [1, 0, 1], [1, 1, 1], [1, 1, 0]]
    results = []
    for flip in (False, True):
        alg = _alg(enforce_entropy_target=True, normalize_advantages=True)
        exp, final = _unroll(alg, steps, rewards, seed=1)
        if flip:
            is_last = exp.step_type == L
            action = torch.where(is_last, 1 - exp.action, exp.action)
            info = exp.rollout_info._replace(
                log_prob=torch.where(
                    is_last,
                    torch.full_like(exp.rollout_info.log_prob, -5.0),
                    exp.rollout_info.log_prob,
                )
            )
            exp = exp._replace(action=action, rollout_info=info)
        alg.train_from_unroll(exp, final)
        results.append(
            (
                [p.detach().clone() for p in alg.parameters()],
                alg.entropy_target_algorithm.state_dict(),
            )
        )
    for a, b in zip(results[0][0], results[1][0]):
        torch.testing.assert_close(a, b)
    for k in results[0][1]:
        torch.testing.assert_close(results[0][1][k], results[1][1][k])


def test_a2c_update_raises_log_prob_of_advantageous_action():
    alg = _alg(td_loss_weight=0.0)
    steps = [[F] * 4] + [[M] * 4] * 6
    rewards = [[0] * 4] + [[1.0] * 4] * 6
    exp, final = _unroll(alg, steps, rewards)
    # Make every reward depend on the action: +1 for action 1, -1 for action 0.
    signed = torch.where(exp.action == 1, 1.0, -1.0)
    rew = torch.cat([torch.zeros(1, 4), signed[:-1]])
    exp = exp._replace(time_step=exp.time_step._replace(reward=rew))
    final = final._replace(reward=signed[-1])
    obs = exp.time_step.observation.reshape(-1, 4)
    before = alg.actor_network(obs).probs[:, 1].mean()
    for _ in range(20):
        alg.train_from_unroll(exp, final)
    after = alg.actor_network(obs).probs[:, 1].mean()
    assert after > before + 0.05


def test_fixed_entropy_regularization_term():
    base = _alg()
    reg = _alg(entropy_regularization=0.5)
    exp, final = _unroll(base, [[F, M], [M, M], [M, M]], seed=2)
    batch = base.preprocess_experience(exp, final)
    info = base.train_step(batch).info
    l0 = base.calc_loss(batch, info).loss
    l1 = reg.calc_loss(batch, info).loss
    torch.testing.assert_close(l1 - l0, -0.5 * info.entropy_for_gradient)
    assert reg.entropy_coefficient() == 0.5 and base.entropy_coefficient() == 0.0


def test_scheduled_entropy_regularization():
    from alf_entropy.utils import schedulers

    sched = schedulers.LinearScheduler("percent", [(0, 1.0), (1.0, 0.0)])
    alg = _alg(entropy_regularization=sched)
    schedulers.update_progress("percent", 0.25)
    try:
        assert alg.entropy_coefficient() == pytest.approx(0.75)
    finally:
        schedulers.reset_progress()


def test_controller_is_a_sub_algorithm_in_state_dict():
    alg = _alg(enforce_entropy_target=True)
    controller = alg.entropy_target_algorithm
    assert isinstance(controller, EntropyTargetAlgorithm)
    assert controller in alg.children()
    keys = alg.state_dict().keys()
    assert any(k.endswith("driver.log_alpha") for k in keys)
    assert any(k.endswith("driver.stage") for k in keys)
    # The update moves the controller's state (the stage machine starts by
    # estimating max entropy from the first calls).
    stage0 = controller.stage.clone()
    exp, final = _unroll(alg, [[F, M], [M, M], [M, M]])
    alg.train_from_unroll(exp, final)
    assert controller.stage != stage0


def test_nested_spec_uses_nested_controller_and_summed_log_prob():
    spec = {"a": DISCRETE, "b": BoundedTensorSpec((), torch.int64, 0, 2)}
    alg = _alg(action_spec=spec, enforce_entropy_target=True)
    assert isinstance(alg.entropy_target_algorithm, NestedEntropyTargetAlgorithm)
    ts = _time_step([F, M, M])
    step = alg.rollout_step(ts)
    assert set(step.output) == {"a", "b"}
    dist = alg.actor_network(ts.observation)
    expected = dist["a"].log_prob(step.output["a"]) + dist["b"].log_prob(step.output["b"])
    torch.testing.assert_close(step.info.log_prob, expected)
    exp, final = _unroll(alg, [[F, M, M], [M, M, L], [M, M, F]])
    alg.train_from_unroll(exp, final)
    assert float(alg.entropy_coefficient()) > 0


@pytest.mark.parametrize("lr", [3e-4, 0.1])
def test_entropy_target_cls_swaps_in_sgd_controller(lr):
    # The controller steps log_alpha with its own Adam; the parent's optimiser never holds it.
    cls = functools.partial(SGDEntropyTargetAlgorithm, lr=lr)
    alg = _alg(enforce_entropy_target=True, entropy_target_cls=cls)
    controller = alg.entropy_target_algorithm
    assert isinstance(controller, SGDEntropyTargetAlgorithm)
    assert len(alg.optimizers()) == 1
    assert not any(
        p is controller.log_alpha
        for o in alg.optimizers()
        for g in o.param_groups
        for p in g["params"]
    )
    before = controller.log_alpha.clone()
    exp, final = _unroll(alg, [[F, M], [M, M], [M, M]])
    alg.train_from_unroll(exp, final)
    assert controller.log_alpha != before


class _CountingController(EntropyTargetAlgorithm):
    """Same interface; records the masks of its updates."""

    def __init__(self, action_spec, debug_summaries=False):
        super().__init__(action_spec, debug_summaries=debug_summaries)
        self.masks = []

    def entropy_loss(self, entropy, mask=None, entropy_for_gradient=None, update=True):
        self.masks.append(mask)
        return super().entropy_loss(entropy, mask, entropy_for_gradient, update)


def test_custom_controller_class_and_valid_mask():
    alg = _alg(enforce_entropy_target=True, entropy_target_cls=_CountingController)
    exp, final = _unroll(alg, [[F, M], [L, M], [F, M]])
    alg.train_from_unroll(exp, final)
    (mask,) = alg.entropy_target_algorithm.masks
    assert mask.tolist() == [True, True, False, True]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(gamma=1.5), "gamma"),
        (dict(td_lambda=-0.1), "td_lambda"),
        (dict(td_loss_weight=-1.0), "td_loss_weight"),
        (dict(max_grad_norm=0.0), "max_grad_norm"),
        (dict(reward_scale=0.0), "reward_scale"),
        (dict(num_epochs=0), "num_epochs"),
        (dict(num_minibatches=1.5), "num_minibatches"),
        (dict(entropy_regularization=-0.1), "entropy_regularization"),
        (dict(entropy_regularization=0.1, enforce_entropy_target=True), "entropy_regularization"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _alg(**kwargs)


def test_too_few_samples_for_minibatches():
    alg = _alg(num_minibatches=64)
    exp, final = _unroll(alg, [[F, M], [M, M], [M, M]])
    with pytest.raises(ValueError, match="num_minibatches"):
        alg.train_from_unroll(exp, final)


@pytest.mark.skipif(not accel.ENABLED, reason="ALF_ENTROPY_ACCEL=0")
def test_fast_acting_gives_the_distribution_paths_draws():
    """rollout_step through accel.categorical_sample_with_log_prob (the
    default) gives the distribution path's actions and log-probabilities
    (same draws)."""
    fast_alg = _alg(enforce_entropy_target=True)
    slow_alg = _alg(enforce_entropy_target=True, fast_acting=False)
    slow_alg.load_state_dict(fast_alg.state_dict())
    ts = _time_step([F, M, L])
    built = []
    slow_alg.actor_network.register_forward_hook(lambda *args: built.append(1))
    with torch.no_grad():
        torch.manual_seed(1)
        fast = fast_alg.rollout_step(ts)
        torch.manual_seed(1)
        slow = slow_alg.rollout_step(ts)
    assert built == [1]  # only the slow path built the distribution
    assert torch.equal(fast.output, slow.output)
    torch.testing.assert_close(fast.info.log_prob, slow.info.log_prob)


@pytest.mark.skipif(not accel.ENABLED, reason="ALF_ENTROPY_ACCEL=0")
@pytest.mark.parametrize("controller", [True, False])
def test_fast_training_gives_the_distribution_paths_losses_and_gradients(controller):
    """train_step through the actor's log_prob_and_entropy (no distribution object) gives
    the distribution path's infos, losses and gradients bit for bit."""
    kwargs = dict(enforce_entropy_target=True) if controller else dict(entropy_regularization=0.01)
    fast_alg, slow_alg = _alg(**kwargs), _alg(fast_acting=False, **kwargs)
    slow_alg.load_state_dict(fast_alg.state_dict())
    exp, final = _unroll(fast_alg, [[F, M, M], [M, M, L], [M, F, M], [M, M, M]])
    batch = fast_alg.preprocess_experience(exp, final)
    built = []
    fast_alg.actor_network.register_forward_pre_hook(lambda *args: built.append(1))
    grads = []
    for alg in (fast_alg, slow_alg):
        info = alg.train_step(batch).info
        loss = alg.calc_loss(batch, info)
        loss.loss.sum().backward()
        grads.append((info, loss, [p.grad for p in alg.parameters()]))
    assert built == [1]  # the hook makes the fast path step aside: the distribution is built
    (fast_info, fast_loss, fast_grads), (slow_info, slow_loss, slow_grads) = grads
    for a, b in zip(fast_info, slow_info):
        assert all(torch.equal(x, y) for x, y in zip(nest.flatten(a), nest.flatten(b)))
    assert torch.equal(fast_loss.loss, slow_loss.loss)
    assert all(torch.equal(g, h) for g, h in zip(fast_grads, slow_grads))


def test_a_controller_with_its_own_entropy_gets_the_distribution_in_training():
    class Watching(EntropyTargetAlgorithm):
        def entropy(self, distribution):
            self.seen = distribution
            return super().entropy(distribution)

    alg = _alg(enforce_entropy_target=True, entropy_target_cls=Watching)
    exp, final = _unroll(alg, [[F, M, M], [M, M, L]])
    alg.train_step(alg.preprocess_experience(exp, final))
    assert alg.entropy_target_algorithm.seen.batch_shape == (3,)
