"""Tests for alf_entropy.algorithms.ppo_algorithm (PPO-clip)."""

import functools
import math

import gin
import numpy as np
import pytest
import torch

from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm, ActorCriticInfo
from alf_entropy.algorithms.entropy_target_algorithm import EntropyTargetAlgorithm
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.data_structures import Experience, StepType, TimeStep, make_experience
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
from alf_entropy.trainers.on_policy_trainer import stack_experiences
from alf_entropy.utils import summary
from alf_entropy.utils.schedulers import LinearScheduler, update_progress

OBS_SPEC = TensorSpec((4,))
DISCRETE = BoundedTensorSpec((), torch.int64, 0, 1)
F, M, L = StepType.FIRST, StepType.MID, StepType.LAST


def _ppo(**kwargs):
    torch.manual_seed(0)
    kwargs.setdefault("optimizer", functools.partial(torch.optim.Adam, lr=1e-2))
    return PPOAlgorithm(OBS_SPEC, DISCRETE, **kwargs)


def _unroll(alg, step_types, seed=0):
    torch.manual_seed(seed)
    B = len(step_types[0])
    exps = []
    for t, st in enumerate(step_types[:-1]):
        ts = TimeStep(
            step_type=torch.tensor(st),
            reward=torch.full((B,), float(t % 3)),
            discount=torch.ones(B),
            observation=torch.randn(B, 4),
        )
        with torch.no_grad():
            exps.append(make_experience(ts, alg.rollout_step(ts)))
    final = TimeStep(
        step_type=torch.tensor(step_types[-1]),
        reward=torch.ones(B),
        discount=torch.ones(B),
        observation=torch.randn(B, 4),
    )
    return stack_experiences(exps), final


def test_is_an_actor_critic_with_ppo_defaults():
    alg = _ppo()
    assert isinstance(alg, ActorCriticAlgorithm)
    assert alg.settings["num_epochs"] == 4 and alg.settings["num_minibatches"] == 4
    assert alg.importance_ratio_clipping == 0.2


def test_clipped_surrogate_values_and_gradients():
    alg = _ppo(importance_ratio_clipping=0.2)
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 1.5, 0.5, 1.1])).requires_grad_()
    adv = torch.tensor([1.0, -1.0, -1.0, 2.0])
    exp = Experience(rollout_info=ActorCriticInfo(log_prob=old))
    loss = alg._policy_gradient_loss(exp, ActorCriticInfo(log_prob=new), adv)
    # ratio 1.5, A>0: clipped to 1.2; ratio 1.5, A<0: unclipped 1.5 (pessimistic);
    # ratio 0.5, A<0: clipped 0.8; ratio 1.1 inside the range.
    torch.testing.assert_close(loss.detach(), torch.tensor([-1.2, 1.5, 0.8, -2.2]))
    loss.sum().backward()
    grad = new.grad
    assert grad[0] == 0 and grad[2] == 0  # clipped: no gradient
    assert grad[1] != 0 and grad[3] != 0


def test_scheduled_clip_range_is_read_at_each_update():
    clip = LinearScheduler("percent", [(0, 0.2), (1.0, 0.0)])
    alg = _ppo(importance_ratio_clipping=clip)
    old = torch.zeros(2)
    new = torch.log(torch.tensor([1.5, 0.5]))
    adv = torch.tensor([1.0, -1.0])
    exp = Experience(rollout_info=ActorCriticInfo(log_prob=old))
    for percent, eps in ((0.0, 0.2), (0.5, 0.1), (1.0, 0.0)):
        update_progress("percent", percent)
        assert alg.importance_ratio_clipping == pytest.approx(eps)
        loss = alg._policy_gradient_loss(exp, ActorCriticInfo(log_prob=new), adv)
        # ratio 1.5, A>0: clipped to 1 + eps; ratio 0.5, A<0: clipped to 1 - eps.
        torch.testing.assert_close(loss, torch.tensor([-(1 + eps), 1 - eps]))


def test_scheduled_clip_range_out_of_range_raises_at_the_update():
    alg = _ppo(importance_ratio_clipping=LinearScheduler("percent", [(0, 0.2), (1.0, 1.5)]))
    update_progress("percent", 0.9)
    exp = Experience(rollout_info=ActorCriticInfo(log_prob=torch.zeros(1)))
    with pytest.raises(ValueError, match="importance_ratio_clipping"):
        alg._policy_gradient_loss(exp, ActorCriticInfo(log_prob=torch.zeros(1)), torch.ones(1))


def test_huge_log_ratio_stays_finite():
    alg = _ppo()
    exp = Experience(rollout_info=ActorCriticInfo(log_prob=torch.tensor([-200.0])))
    loss = alg._policy_gradient_loss(
        exp, ActorCriticInfo(log_prob=torch.tensor([0.0])), torch.tensor([-1.0])
    )
    assert torch.isfinite(loss).all()


class _CountingController(EntropyTargetAlgorithm):
    def __init__(self, action_spec, debug_summaries=False):
        super().__init__(action_spec, debug_summaries=debug_summaries)
        self.calls = 0

    def entropy_loss(self, entropy, mask=None, entropy_for_gradient=None, update=True):
        self.calls += update
        return super().entropy_loss(entropy, mask, entropy_for_gradient, update)


def test_controller_adjusts_once_per_minibatch():
    alg = _ppo(
        num_epochs=3,
        num_minibatches=2,
        enforce_entropy_target=True,
        entropy_target_cls=_CountingController,
    )
    exp, final = _unroll(alg, [[F, M]] + [[M, M]] * 5)
    alg.train_from_unroll(exp, final)
    assert alg.entropy_target_algorithm.calls == 6


def test_minibatches_partition_each_epoch():
    alg = _ppo(num_epochs=2, num_minibatches=3)
    seen = []
    original = alg.train_step

    def spy(batch, *a, **k):
        seen.append(batch.rollout_info.advantages.detach().clone())
        return original(batch, *a, **k)

    alg.train_step = spy
    exp, final = _unroll(alg, [[F, M, M]] + [[M, M, M]] * 4)  # 12 samples
    flat = alg.preprocess_experience(exp, final)
    alg.train_from_unroll(exp, final)
    assert [len(s) for s in seen] == [4, 4, 4, 4, 4, 4]
    for epoch in (seen[:3], seen[3:]):
        torch.testing.assert_close(
            torch.sort(torch.cat(epoch)).values, torch.sort(flat.rollout_info.advantages).values
        )


def test_ppo_ignores_ignored_actions_at_last_steps():
    steps = [[F, M], [M, L], [M, F], [L, M], [F, M]]
    params = []
    for flip in (False, True):
        alg = _ppo(num_epochs=2, num_minibatches=1, enforce_entropy_target=True)
        exp, final = _unroll(alg, steps, seed=3)
        if flip:
            is_last = exp.step_type == L
            exp = exp._replace(
                action=torch.where(is_last, 1 - exp.action, exp.action),
                rollout_info=exp.rollout_info._replace(
                    log_prob=torch.where(is_last, -3.0, exp.rollout_info.log_prob)
                ),
            )
        alg.train_from_unroll(exp, final)
        params.append([p.detach().clone() for p in alg.parameters()])
    for a, b in zip(*params):
        torch.testing.assert_close(a, b)


def test_summaries_written_only_when_recording(tmp_path, monkeypatch):
    alg = _ppo(enforce_entropy_target=True, debug_summaries=True)
    exp, final = _unroll(alg, [[F, M]] + [[M, M]] * 4)
    written = []
    original = summary.scalar

    def spy(name, value, step=None):
        written.append(name)
        return original(name, value, step)

    monkeypatch.setattr(summary, "scalar", spy)
    writer = summary.create_summary_writer(str(tmp_path))
    summary.set_default_writer(writer)
    try:
        with summary.record_if(lambda: False):
            alg.train_from_unroll(exp, final)
        assert written == []
        with summary.record_if(lambda: True):
            alg.train_from_unroll(exp, final)
    finally:
        summary.set_default_writer(None)
        writer.close()
    for tag in (
        "alpha",
        "entropy",
        "target_entropy",
        "stage",
        "loss/pg",
        "ppo/approx_kl",
        "ppo/clip_range",
    ):
        assert tag in written


@pytest.mark.parametrize(
    "clip, error", [(0.0, ValueError), (1.0, ValueError), (True, TypeError), ("0.2", TypeError)]
)
def test_bad_clipping(clip, error):
    with pytest.raises(error, match="importance_ratio_clipping"):
        _ppo(importance_ratio_clipping=clip)


class _RecordingController(EntropyTargetAlgorithm):
    """Counts updates and records alpha after each."""

    def __init__(self, action_spec, debug_summaries=False):
        super().__init__(
            action_spec,
            target_entropy=0.6,
            initial_alpha=0.01,
            skip_free_stage=True,
            debug_summaries=debug_summaries,
        )
        self.alphas = []

    def _update(self, entropy, count, restart=False):
        alpha = super()._update(entropy, count, restart)
        if count is None or count > 0:  # an update from entropies (not an empty step())
            self.alphas.append(alpha.item())
        return alpha


def test_entropy_target_update_frequency_on_cartpole(tmp_path):
    from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

    torch.set_num_threads(1)
    iterations, epochs, minibatches = 3, 2, 4
    alphas = {}
    for frequency in ("per_minibatch", "per_iteration"):
        ctor = functools.partial(
            PPOAlgorithm,
            enforce_entropy_target=True,
            entropy_target_cls=_RecordingController,
            num_epochs=epochs,
            num_minibatches=minibatches,
            entropy_target_update=frequency,
        )
        trainer = OnPolicyTrainer(
            str(tmp_path / frequency),
            algorithm_ctor=ctor,
            num_envs=2,
            unroll_length=16,
            num_iterations=iterations,
            progress_bar=False,
            device="cpu",
            eval_interval=None,
        )
        trainer.train()
        alphas[frequency] = np.array([0.01] + trainer.algorithm.entropy_target_algorithm.alphas)
    # One update per minibatch (ALF's default) or one per unroll.
    assert len(alphas["per_minibatch"]) == 1 + iterations * epochs * minibatches
    assert len(alphas["per_iteration"]) == 1 + iterations
    for a in alphas.values():  # each update moves log_alpha by at most log 2
        log_steps = np.abs(np.diff(np.log(a)))
        assert (log_steps <= math.log(2) + 1e-5).all() and (log_steps > 0).any()
    spread = {k: np.log(a.max() / a.min()) for k, a in alphas.items()}
    assert spread["per_iteration"] < spread["per_minibatch"]


def test_entropy_target_update_must_be_known():
    with pytest.raises(ValueError, match="entropy_target_update"):
        _ppo(entropy_target_update="per_epoch")


def test_gin_bindings_of_actor_critic_do_not_reach_ppo():
    """PPO names only what differs from ActorCriticAlgorithm, yet, as when it
    listed every argument, ``ActorCriticAlgorithm.*`` bindings configure A2C
    alone and ``PPOAlgorithm.*`` ones every PPO argument."""
    gin.parse_config("ActorCriticAlgorithm.gamma = 0.5\nPPOAlgorithm.td_lambda = 0.9")
    ppo = _ppo()
    assert ppo.settings["gamma"] == 0.99 and ppo.settings["td_lambda"] == 0.9


@pytest.mark.parametrize("cap", [None, 1.5])
def test_max_alpha_change_per_iteration_bounds_any_controller(cap):
    """ALF's fast rate (log 2 per update) moves alpha x2 per update; the cap
    keeps the spread of alpha over a whole iteration (16 updates) within x1.5."""
    alg = _ppo(
        enforce_entropy_target=True,
        entropy_target_cls=functools.partial(
            EntropyTargetAlgorithm,
            target_entropy=0.69,
            skip_free_stage=True,
            max_alpha_change_per_iteration=cap,
        ),
    )
    exp, final = _unroll(alg, [[F] * 4] + [[M] * 4] * 16)
    before = alg.entropy_target_algorithm.alpha.item()
    alg.train_from_unroll(exp, final)
    ratio = alg.entropy_target_algorithm.alpha.item() / before
    assert (ratio <= 1.5 + 1e-5) == (cap is not None), ratio
    driver = alg.entropy_target_algorithm.driver  # the next iteration's span starts here
    assert driver.span_lo == driver.span_hi == driver.log_alpha


def test_max_alpha_change_per_iteration_must_exceed_one():
    with pytest.raises(ValueError, match="max_alpha_change_per_iteration"):
        EntropyTargetAlgorithm(DISCRETE, max_alpha_change_per_iteration=1.0)
