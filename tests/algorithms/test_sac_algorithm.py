"""SacAlgorithm: learning on one-step bandits with every controller, both action
kinds; skipped non-finite updates; target updates; summaries; bad input."""

import functools

import pytest
import torch
import torch.nn as nn

from alf_entropy import accel
from alf_entropy.algorithms.entropy_target_algorithm import (
    EntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.algorithms.sac_algorithm import SacAlgorithm
from alf_entropy.data_structures import TimeStep
from alf_entropy.networks import ActorDistributionNetwork, CriticNetworks
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
from alf_entropy.utils import summary
from alf_entropy.utils.replay_buffer import Transition

OBS = TensorSpec((2,))
BOX = BoundedTensorSpec((1,), torch.float32, -1.0, 1.0)
DISCRETE = BoundedTensorSpec((), torch.int64, 0, 2)
BEST_BOX_ACTION = 0.5

CONTROLLERS = {
    "sgd": functools.partial(SGDEntropyTargetAlgorithm, initial_alpha=0.05, target_entropy=-2.0),
    "staged": functools.partial(
        EntropyTargetAlgorithm,
        initial_alpha=0.05,
        target_entropy=-2.0,
        skip_free_stage=True,
        slow_update_rate=0.01,
        fast_update_rate=0.01,
    ),
    "fixed": functools.partial(FixedEntropyCoefficient, alpha=0.05),
}
DISCRETE_TARGET = 0.3  # reachable: < log 3


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny networks: one thread (several threads on a loaded 2-core machine
    make every small op wait for the others)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _sac(action_spec, controller, **kwargs):
    if action_spec.is_discrete and controller.func is not FixedEntropyCoefficient:
        controller = functools.partial(controller, target_entropy=DISCRETE_TARGET)
    return SacAlgorithm(
        OBS,
        action_spec,
        actor_network_ctor=functools.partial(
            ActorDistributionNetwork,
            fc_layer_params=(32,),
            activation=nn.ReLU,
            squash_to_spec=True,
            state_dependent_std=True,
        ),
        critic_network_ctor=functools.partial(CriticNetworks, fc_layer_params=(32,)),
        entropy_target_cls=controller,
        optimizer=functools.partial(torch.optim.Adam, lr=3e-3),
        **kwargs,
    )


def _bandit_batch(action_spec, n=64):
    """One-step episodes (discount 0) whose reward depends on the action only."""
    obs = torch.randn(n, 2)
    if action_spec.is_discrete:
        action = torch.randint(0, 3, (n,))
        reward = (action == 2).float()
    else:
        action = torch.rand(n, 1) * 2 - 1
        reward = -4 * (action[:, 0] - BEST_BOX_ACTION) ** 2
    return Transition(
        obs, action, reward, torch.zeros(n), torch.randn(n, 2), torch.ones(n, dtype=torch.bool)
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONTROLLERS))
@pytest.mark.parametrize("kind", ["continuous", "discrete"])
def test_learns_the_bandit_with_every_controller(kind, name):
    torch.manual_seed(0)
    spec = BOX if kind == "continuous" else DISCRETE
    alg = _sac(spec, CONTROLLERS[name])
    alpha0 = float(alg.entropy_coefficient())
    critic_losses = []
    for _ in range(600 if kind == "continuous" else 200):
        info = alg.train_step(_bandit_batch(spec)).info
        critic_losses.append(float(info.extra.critic.mean()))
    obs = torch.randn(256, 2)
    with torch.no_grad():
        mode = alg.predict_step(TimeStep(observation=obs)).output
    if kind == "continuous":
        assert (mode - BEST_BOX_ACTION).abs().mean() < 0.15
    else:
        assert (mode == 2).float().mean() > 0.95
    assert sum(critic_losses[-20:]) < 0.2 * sum(critic_losses[:20])
    alpha = float(alg.entropy_coefficient())
    if name == "fixed":
        assert alpha == pytest.approx(alpha0)
    elif kind == "continuous":
        # the entropy starts far above the target -2: alpha must fall
        assert alpha < alpha0
    else:
        # the greedy discrete policy's entropy falls below the target 0.3: alpha rises
        assert alpha > alpha0
    assert int(alg.num_skipped_updates) == 0


def test_controller_sees_sac_entropy_and_summaries_are_written(tmp_path, monkeypatch):
    torch.manual_seed(0)
    alg = _sac(BOX, CONTROLLERS["staged"])
    seen = []
    original = alg.entropy_target_algorithm.entropy_loss
    monkeypatch.setattr(
        alg.entropy_target_algorithm,
        "entropy_loss",
        lambda entropy, mask=None, **kw: (
            seen.append(entropy.detach()) or original(entropy, mask=mask, **kw)
        ),
    )
    recorded = {}
    monkeypatch.setattr(
        summary, "scalar", lambda name, value, step=None: recorded.__setitem__(name, value)
    )
    writer = summary.create_summary_writer(str(tmp_path))
    summary.set_default_writer(writer)
    try:
        with summary.record_if(lambda: True):
            alg.train_step(_bandit_batch(BOX))
    finally:
        summary.set_default_writer(None)
        writer.close()
    assert len(seen) == 1 and seen[0].shape == (64,)  # -log pi of 64 fresh samples
    for name in ("alpha", "entropy", "target_entropy", "stage", "loss/critic", "loss/actor"):
        assert name in recorded
    assert float(recorded["target_entropy"]) == -2.0


def test_target_critics_follow_by_polyak_averaging():
    torch.manual_seed(0)
    alg = _sac(BOX, CONTROLLERS["fixed"], target_update_tau=0.25, target_update_period=2)
    target = [p.clone() for p in alg.target_critic_networks.parameters()]
    alg.train_step(_bandit_batch(BOX))
    assert all(torch.equal(a, b) for a, b in zip(target, alg.target_critic_networks.parameters()))
    alg.train_step(_bandit_batch(BOX))
    for old, new, p in zip(
        target, alg.target_critic_networks.parameters(), alg.critic_networks.parameters()
    ):
        torch.testing.assert_close(new, old + 0.25 * (p.detach() - old))
    assert not any(p.requires_grad for p in alg.target_critic_networks.parameters())
    # the host-side period counter is in the state dict
    clone = _sac(BOX, CONTROLLERS["fixed"], target_update_tau=0.25, target_update_period=2)
    clone.load_state_dict(alg.state_dict())
    assert clone.get_extra_state() == alg.get_extra_state() == {"host_updates": 2}


def test_nan_in_an_invalid_row_skips_the_update():
    # Masking by selection would drop the row from the loss but not from the
    # weight gradients (0 * NaN): the loss must be non-finite instead.
    torch.manual_seed(0)
    alg = _sac(BOX, CONTROLLERS["sgd"])
    alg.train_step(_bandit_batch(BOX))
    trained = [p for name, p in alg.named_parameters() if "target" not in name]
    before = [p.detach().clone() for p in trained]
    bad = _bandit_batch(BOX)
    bad.observation[3] = float("nan")
    bad.valid[3] = False
    alg.train_step(bad)
    assert int(alg.num_skipped_updates) == 1
    assert all(torch.equal(b, p) for b, p in zip(before, trained))
    assert all(torch.isfinite(p).all() for p in alg.parameters())


@pytest.mark.slow  # torch.compile
def test_train_step_compiles():
    """``torch.compile(alg.train_step)`` traces the whole update (the critics'
    and FusedAdam's hand-written fast paths step aside) and it still trains."""
    torch.manual_seed(0)
    alg = SacAlgorithm(OBS, BOX)  # the defaults: FusedAdam, ReLU critics, SAC's rule
    for _ in range(2):  # the optimiser state, then FusedAdam's cached lean lists, exist
        alg.train_step(_bandit_batch(BOX))
    before = [p.detach().clone() for p in alg.parameters()]
    step = torch.compile(alg.train_step)
    for _ in range(2):
        step(_bandit_batch(BOX))
    after = list(alg.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert sum(not torch.equal(b, p) for b, p in zip(before, after)) >= len(after) - 1
    assert int(alg.num_skipped_updates) == 0


_NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
_DEVICES = [
    "cpu",  # the flag is read on the host
    pytest.param("cuda", marks=_NO_CUDA),  # skipped in the optimiser's kernel, no host read
]


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("name", ["sgd", "staged"])
@pytest.mark.parametrize("max_grad_norm", [None, 1.0])
def test_nonfinite_loss_skips_the_update(name, max_grad_norm, device):
    torch.manual_seed(0)

    def batch(nan=False):
        b = _bandit_batch(BOX)
        if nan:
            b.reward[3] = float("nan")
        return Transition(*(t.to(device) for t in b))

    alg = _sac(BOX, CONTROLLERS[name], max_grad_norm=max_grad_norm).to(device)
    alg.train_step(batch())
    params = {k: v.clone() for k, v in alg.state_dict().items() if torch.is_tensor(v)}
    opt_state = [
        {k: v.clone() for k, v in s.items()} for opt in alg.optimizers() for s in opt.state.values()
    ]
    bad = batch(nan=True)
    if device == "cuda":
        torch.cuda.set_sync_debug_mode("error")
    try:
        alg.train_step(bad)
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode(0)
    assert int(alg.num_skipped_updates) == 1
    for k, v in alg.state_dict().items():
        if torch.is_tensor(v) and k in params and not k.endswith(("_num_skipped",)):
            if "target_critic" in k:
                continue  # lerp towards the unchanged critics
            if "_entropy_target_algorithm" in k and not k.endswith("driver.log_alpha"):
                continue  # its averages advanced on the (finite) entropy before the loss
            if k.endswith("driver.log_alpha"):
                continue  # the controller moves log_alpha there too (on the finite entropy)
            assert torch.equal(v, params[k]), k
    after = [s for opt in alg.optimizers() for s in opt.state.values()]
    for old, new in zip(opt_state, after):
        assert all(torch.equal(old[k], new[k]) for k in old)
    assert torch.isfinite(alg.entropy_coefficient())
    assert all(torch.isfinite(p).all() for p in alg.parameters())
    alg.train_step(batch())  # and training goes on
    assert int(alg.num_skipped_updates) == 1


def test_bad_inputs():
    with pytest.raises(TypeError, match="single BoundedTensorSpec"):
        SacAlgorithm(OBS, {"a": BOX, "b": DISCRETE})
    with pytest.raises(ValueError, match="scalar"):
        SacAlgorithm(OBS, BoundedTensorSpec((2,), torch.int64, 0, 2))
    with pytest.raises(ValueError, match="target_update_tau"):
        SacAlgorithm(OBS, BOX, target_update_tau=0.0)
    with pytest.raises(ValueError, match="gamma"):
        SacAlgorithm(OBS, BOX, gamma=1.5)
    with pytest.raises(ValueError, match="target_update_period"):
        SacAlgorithm(OBS, BOX, target_update_period=0)
    # A continuous-action target (SAC's -dim(A)) for a discrete action: an
    # entropy is never below 0, so alpha would sink forever.
    with pytest.raises(ValueError, match="discrete"):
        SacAlgorithm(
            OBS,
            DISCRETE,
            entropy_target_cls=functools.partial(SGDEntropyTargetAlgorithm, target_entropy=-1.0),
        )
    # A target above the largest entropy the spec allows (log 3 here).
    with pytest.raises(ValueError, match="target_entropy"):
        SacAlgorithm(
            OBS,
            DISCRETE,
            entropy_target_cls=functools.partial(EntropyTargetAlgorithm, target_entropy=1.2),
        )


class _CountingActor(ActorDistributionNetwork):
    """An actor whose ``forward`` is overridden (here only to count calls)."""

    calls = 0

    def forward(self, observation):
        type(self).calls += 1
        return super().forward(observation)


@pytest.mark.skipif(not accel.ENABLED, reason="ALF_ENTROPY_ACCEL=0: no closed form")
def test_closed_form_policy_only_for_an_unmodified_actor():
    torch.manual_seed(0)
    batch = _bandit_batch(BOX)
    plain = _sac(BOX, CONTROLLERS["sgd"])
    assert plain.actor_network.rsample_and_log_prob(batch.observation) is not None
    custom = SacAlgorithm(
        OBS,
        BOX,
        actor_network_ctor=functools.partial(
            _CountingActor, fc_layer_params=(32,), squash_to_spec=True, state_dependent_std=True
        ),
        critic_network_ctor=functools.partial(CriticNetworks, fc_layer_params=(32,)),
    )
    # An overridden forward must run: SAC falls back to the distribution it returns.
    assert custom.actor_network.rsample_and_log_prob(batch.observation) is None
    custom.calc_loss(batch)
    with torch.no_grad():
        action = custom.rollout_step(TimeStep(observation=batch.observation)).output
    assert _CountingActor.calls == 3  # o' and o in the loss, o for acting
    assert action.shape == (64, 1) and torch.all(action.abs() <= 1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", sorted(CONTROLLERS))
@pytest.mark.parametrize("kind", ["continuous", "discrete"])
def test_cuda_updates_read_nothing_back_to_the_host(kind, name):
    """On a GPU an update is sync-free (CUDA's sync debug mode raises on any
    device-to-host read) and still trains every parameter."""
    torch.manual_seed(0)
    spec = BOX if kind == "continuous" else DISCRETE
    alg = _sac(spec, CONTROLLERS[name]).cuda()
    batches = [Transition(*(t.cuda() for t in _bandit_batch(spec))) for _ in range(3)]
    alg.train_step(batches[0])  # creates the optimiser state
    before = [p.detach().clone() for p in alg.parameters()]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch in batches[1:]:
            alg.train_step(batch)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    changed = [not torch.equal(b, p) for b, p in zip(before, alg.parameters())]
    assert all(p.is_cuda for p in alg.parameters()) and sum(changed) >= len(changed) - 1
    assert int(alg.num_skipped_updates) == 0
