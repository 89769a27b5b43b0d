"""TorchRL's SACLoss/DiscreteSACLoss read the controller's alpha; their checkpoint carries it."""

import copy
import inspect
import io
import math

import pytest

pytest.importorskip(
    "torchrl",
    reason="TorchRL is not installed (pip install -e '.[torchrl]'; .ci/run tests it in a venv)",
)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402
from tensordict.nn.distributions import NormalParamExtractor  # noqa: E402
from torch import nn  # noqa: E402
from torchrl.data import (  # noqa: E402
    Binary,
    Bounded,
    Categorical,
    Composite,
    LazyTensorStorage,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    ReplayBuffer,
    Unbounded,
)
from torchrl.envs import GymEnv  # noqa: E402
from torchrl.modules import (  # noqa: E402
    MLP,
    OneHotCategorical,
    ProbabilisticActor,
    TanhNormal,
    ValueOperator,
)
from torchrl.objectives import DiscreteSACLoss, SACLoss, SoftUpdate  # noqa: E402

from alf_entropy.controllers import (  # noqa: E402
    EntropyTargetAlgorithm,
    LinearPIDEntropyTargetAlgorithm,
    PIDEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.integrations import torchrl as alf_torchrl  # noqa: E402
from alf_entropy.integrations.torchrl import (  # noqa: E402
    CONTROLLER_NAME,
    SUPPORTED_TORCHRL,
    control_alpha,
)
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec  # noqa: E402
from tests.nests import assert_nests_equal  # noqa: E402

CONTROLLERS = {
    "pid": lambda spec: PIDEntropyTargetAlgorithm.from_space(spec, initial_alpha=1.0),
    "staged": lambda spec: EntropyTargetAlgorithm.from_space(
        spec, initial_alpha=1.0, skip_free_stage=True
    ),
    "sgd": lambda spec: SGDEntropyTargetAlgorithm.from_space(spec, initial_alpha=1.0),
}


def _sac(discrete: bool = False, seed: int = 0, **loss_kwargs):
    """A small SAC loss (Pendulum, or CartPole's one-hot actions) and a replay buffer of one
    random-policy rollout, as TorchRL's examples build them."""
    torch.manual_seed(seed)
    env = GymEnv("CartPole-v1" if discrete else "Pendulum-v1")
    env.set_seed(seed)
    spec = env.action_spec_unbatched
    if discrete:
        n = spec.space.n
        actor = ProbabilisticActor(
            TensorDictModule(
                MLP(num_cells=[32], out_features=n), in_keys=["observation"], out_keys=["logits"]
            ),
            in_keys=["logits"],
            spec=spec,
            distribution_class=OneHotCategorical,
        )
        qvalue = TensorDictModule(
            MLP(num_cells=[32], out_features=n), in_keys=["observation"], out_keys=["action_value"]
        )
    else:
        actor = ProbabilisticActor(
            TensorDictModule(
                nn.Sequential(MLP(num_cells=[32], out_features=2), NormalParamExtractor()),
                in_keys=["observation"],
                out_keys=["loc", "scale"],
            ),
            in_keys=["loc", "scale"],
            spec=spec,
            distribution_class=TanhNormal,
            distribution_kwargs={"low": spec.space.low, "high": spec.space.high},
        )
        qvalue = ValueOperator(
            MLP(num_cells=[32], out_features=1), in_keys=["observation", "action"]
        )
    with torch.no_grad():
        td = actor(env.reset())
        qvalue(td)
        buffer = ReplayBuffer(storage=LazyTensorStorage(1000), batch_size=32)
        buffer.extend(env.rollout(200, actor, break_when_any_done=False).reshape(-1))
    if discrete:
        loss = DiscreteSACLoss(actor, qvalue, action_space=spec, num_actions=n, **loss_kwargs)
    else:
        loss = SACLoss(actor, qvalue, **loss_kwargs)
    loss.make_value_estimator(gamma=0.99)
    return env, loss, buffer


def _train(loss_module, alpha_step, batches, optimizer, check=None, reduce=torch.sum):
    """The example's update (one optimiser over everything, soft target update), then the
    controller's step; ``check(loss_td)`` sees each update's output before the step."""
    updater = SoftUpdate(loss_module, eps=0.99)
    for batch in batches:
        loss_td = loss_module(batch)
        reduce(loss_td["loss_actor"] + loss_td["loss_qvalue"] + loss_td["loss_alpha"]).backward()
        optimizer.step()
        optimizer.zero_grad()
        updater.step()
        if check is not None:
            check(loss_td)
        alpha_step(loss_td["entropy"])


def test_torchrl_version_and_the_seams_relied_on():
    import torchrl

    assert Version(torchrl.__version__) in SpecifierSet(SUPPORTED_TORCHRL)
    for cls in (SACLoss, DiscreteSACLoss):
        # _alpha reads log_alpha (clamped only with min/max_alpha, refused at wiring).
        assert isinstance(inspect.getattr_static(cls, "_alpha"), property)
        source = inspect.getsource(cls._alpha.fget)
        assert "alpha = self.log_alpha.exp()" in source
        assert "if self.min_log_alpha is not None or self.max_log_alpha is not None:" in source
        init = inspect.getsource(cls.__init__)
        assert 'self.register_buffer("alpha_init", torch.tensor(alpha_init, device=device))' in init
        assert "self.fixed_alpha = fixed_alpha" in init
        forward = inspect.getsource(cls.forward)
        assert 'out["alpha"] = self._alpha' in forward
        assert 'out["entropy"] = entropy.detach().mean()' in forward
    assert "self._alpha * log_prob" in inspect.getsource(SACLoss.actor_loss)
    assert "self._alpha * log_prob" in inspect.getsource(DiscreteSACLoss.actor_loss)
    _, loss, _ = _sac()
    assert all(hasattr(loss, a) for a in alf_torchrl._LOSS_ATTRIBUTES)


def test_the_torchrl_extra_pins_the_tested_versions():
    from tests.test_dependencies import setup_kwargs

    assert setup_kwargs()["extras_require"]["torchrl"] == [
        f"torchrl{SUPPORTED_TORCHRL}",
        "tensordict==0.14.3",
    ]


def test_from_space_reads_torchrl_specs():
    pendulum = PIDEntropyTargetAlgorithm.from_space(Bounded(-2.0, 2.0, shape=(1,)))
    spec = pendulum.action_spec
    assert isinstance(spec, BoundedTensorSpec) and spec.dtype == torch.float32
    assert spec.minimum.tolist() == [-2.0] and spec.maximum.tolist() == [2.0]
    cases = [  # TorchRL spec, and the shape, minimum, maximum of the controller's int64 spec
        (Categorical(4), (), 0, 3),
        (OneHot(4), (), 0, 3),
        (Binary(3), (3,), 0, 1),
        (MultiCategorical([2, 3]), (2,), [0, 0], [1, 2]),
        (MultiOneHot([2, 3]), (2,), [0, 0], [1, 2]),
    ]
    for torchrl_spec, shape, lo, hi in cases:
        spec = PIDEntropyTargetAlgorithm.from_space(torchrl_spec).action_spec
        assert (spec.shape, spec.dtype) == (shape, torch.int64), torchrl_spec
        for got, want in ((spec.minimum, lo), (spec.maximum, hi)):
            assert np.array_equal(np.broadcast_to(got, shape), np.broadcast_to(want, shape))
    # Four discrete actions have the same default target however TorchRL encodes them.
    assert PIDEntropyTargetAlgorithm.from_space(OneHot(4)).target_entropy == pytest.approx(
        PIDEntropyTargetAlgorithm.from_space(Categorical(4)).target_entropy
    )
    nested = PIDEntropyTargetAlgorithm.from_space(
        Composite(move=Bounded(-1.0, 1.0, shape=(2,)), pick=Categorical(3))
    )
    assert sorted(nested.action_spec) == ["move", "pick"]
    unbounded = SGDEntropyTargetAlgorithm.from_space(Unbounded(shape=(2,)), target_entropy=-2.0)
    assert type(unbounded.action_spec) is TensorSpec  # no bounds: no default target
    with pytest.raises(ValueError, match="finite minimum and maximum"):
        SGDEntropyTargetAlgorithm.from_space(Unbounded(shape=(2,)))
    with pytest.raises(TypeError, match="Unsupported TorchRL spec NonTensor"):
        PIDEntropyTargetAlgorithm.from_space(NonTensor(shape=()))


def test_the_default_target_is_in_the_envs_action_units():
    # TorchRL's TanhNormal(low, high) log_prob includes the rescaling to the env's bounds:
    # on [-2, 2] it is log 2 per dimension below that of the same action on [-1, 1] ...
    loc, scale = torch.zeros(1), torch.ones(1)
    wide = TanhNormal(loc, scale, low=-2.0, high=2.0).log_prob(torch.tensor([0.5]))
    unit = TanhNormal(loc, scale, low=-1.0, high=1.0).log_prob(torch.tensor([0.25]))
    assert float(unit - wide) == pytest.approx(math.log(2.0), abs=1e-5)
    # ... so the controller is built from the env's own spec, and its default target too.
    env = GymEnv("Pendulum-v1")
    controller = PIDEntropyTargetAlgorithm.from_space(env.action_spec_unbatched)
    assert controller.target_entropy == pytest.approx(math.log(4.0) + math.log(0.1))


@pytest.mark.parametrize("name", sorted(CONTROLLERS))
def test_the_loss_uses_the_controllers_alpha_at_every_update(name, one_thread):
    env, loss, buffer = _sac()
    # The example's optimisers: TorchRL's alpha optimiser, built before and after wiring.
    before = torch.optim.Adam([loss.log_alpha], lr=0.1)
    controller = CONTROLLERS[name](env.action_spec_unbatched)
    alpha_step = control_alpha(loss, controller)
    after = torch.optim.Adam([loss.log_alpha], lr=0.1)
    assert "log_alpha" not in dict(loss.named_parameters())
    seen = []

    def check(loss_td):
        assert torch.equal(loss_td["alpha"], controller.alpha)  # bit for bit
        assert not loss_td["loss_alpha"].requires_grad  # TorchRL's rule has nothing to train
        before.step()
        after.step()
        seen.append(float(loss_td["alpha"]))

    _train(
        loss,
        alpha_step,
        [buffer.sample() for _ in range(12)],
        torch.optim.Adam(loss.parameters(), lr=1e-3),
        check,
    )
    assert len(set(seen)) > 5  # alpha moved: the equality above was not of a constant
    assert torch.equal(loss.log_alpha, controller.log_alpha)


def test_the_actor_loss_moves_by_the_change_of_alpha_times_log_prob(one_thread):
    env, loss, buffer = _sac()
    controller = PIDEntropyTargetAlgorithm.from_space(env.action_spec_unbatched, initial_alpha=1.0)
    alpha_step = control_alpha(loss, controller)
    batch = buffer.sample()

    def actor_loss():
        torch.manual_seed(1)  # the same reparameterised actions
        return loss(batch.clone()).detach()

    first = actor_loss()
    for _ in range(3):
        alpha_step(first["entropy"] + 0.5)  # entropy above the target: alpha falls
    second = actor_loss()
    d_alpha = float(second["alpha"]) - float(first["alpha"])
    assert d_alpha < -1e-3 and float(second["alpha"]) == float(controller.alpha)
    # loss_actor = mean(alpha * log_prob - min Q), log_prob = -entropy
    expected = -d_alpha * float(first["entropy"])
    assert float(second["loss_actor"] - first["loss_actor"]) == pytest.approx(expected, rel=1e-4)


def test_the_discrete_loss_uses_the_controllers_alpha_at_every_update(one_thread):
    # fixed_alpha=True (log_alpha a buffer already) and the per-sample output wire alike.
    env, loss, buffer = _sac(
        discrete=True,
        target_entropy=0.5,
        fixed_alpha=True,
        reduction="none",
        scalar_output_mode="non_tensor",
    )
    controller = PIDEntropyTargetAlgorithm.from_space(
        env.action_spec_unbatched, initial_alpha=1.0, target_entropy=0.5
    )
    assert controller.action_spec.shape == () and int(controller.action_spec.maximum) == 1
    alpha_step = control_alpha(loss, controller)
    seen = []

    def check(loss_td):
        assert torch.equal(loss_td["alpha"], controller.alpha)
        assert 0.0 <= float(loss_td["entropy"]) <= math.log(2.0) + 1e-6  # the exact entropy
        seen.append(float(loss_td["alpha"]))

    _train(
        loss,
        alpha_step,
        [buffer.sample() for _ in range(8)],
        torch.optim.Adam(loss.parameters(), lr=1e-3),
        check,
        reduce=torch.mean,
    )
    assert len(set(seen)) > 4


@pytest.mark.parametrize("discrete,name", [(False, "pid"), (False, "sgd"), (True, "staged")])
def test_resume_from_the_losss_checkpoint_restores_the_controller_exactly(
    discrete, name, one_thread
):
    def build():
        env, loss, buffer = _sac(discrete=discrete, seed=0)
        controller = CONTROLLERS[name](env.action_spec_unbatched)
        step = control_alpha(loss, controller)
        return loss, step, buffer, torch.optim.Adam(loss.parameters(), lr=1e-3)

    loss, step, buffer, optimizer = build()
    batches = [buffer.sample() for _ in range(10)]
    _train(loss, step, batches[:5], optimizer)
    checkpoint = io.BytesIO()
    torch.save(
        {
            "loss": loss.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state(),
        },
        checkpoint,
    )
    saved = copy.deepcopy(step.controller.state_dict())
    _train(loss, step, batches[5:], optimizer)

    resumed_loss, resumed_step, _, resumed_optimizer = build()
    checkpoint.seek(0)
    state = torch.load(checkpoint, weights_only=False)
    assert any(k.startswith(CONTROLLER_NAME + ".") for k in state["loss"])
    resumed_loss.load_state_dict(state["loss"])
    resumed_optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    assert_nests_equal(resumed_step.controller.state_dict(), saved, "loaded")
    assert torch.equal(resumed_loss.log_alpha, resumed_step.controller.log_alpha)
    _train(resumed_loss, resumed_step, batches[5:], resumed_optimizer)
    assert_nests_equal(
        resumed_step.controller.state_dict(), step.controller.state_dict(), "resumed"
    )


@pytest.mark.parametrize(
    "loss_kwargs,controller_kwargs,error,match",
    [
        ({"min_alpha": 0.01}, {}, ValueError, "min_alpha/max_alpha"),
        ({"max_alpha": 10.0}, {}, ValueError, "min_alpha/max_alpha"),
        ({}, {"initial_alpha": 0.1}, ValueError, r"alpha_init \(1\) differs .* alpha \(0.1\)"),
        ({"reduction": "none", "scalar_output_mode": "exclude"}, {}, ValueError, "no 'entropy'"),
        ({}, {"batch_shape": (2,)}, ValueError, "batch"),
    ],
)
def test_wiring_refuses_what_would_make_the_loss_use_another_alpha(
    loss_kwargs, controller_kwargs, error, match
):
    env, loss, _ = _sac(**loss_kwargs)
    controller = PIDEntropyTargetAlgorithm.from_space(
        env.action_spec_unbatched, **{"initial_alpha": 1.0, **controller_kwargs}
    )
    with pytest.raises(error, match=match):
        control_alpha(loss, controller)
    assert isinstance(loss.log_alpha, nn.Parameter)  # left as it was


def test_wiring_refuses_a_controller_whose_alpha_can_go_below_zero():
    env, loss, _ = _sac()
    controller = LinearPIDEntropyTargetAlgorithm.from_space(
        env.action_spec_unbatched, initial_alpha=1.0, min_alpha=-0.1
    )
    with pytest.raises(ValueError, match="min_alpha must be >= 0"):
        control_alpha(loss, controller)
    assert isinstance(loss.log_alpha, nn.Parameter)


def test_wiring_refuses_other_types_and_a_second_wiring():
    env, loss, _ = _sac()
    controller = PIDEntropyTargetAlgorithm.from_space(env.action_spec_unbatched, initial_alpha=1.0)
    with pytest.raises(TypeError, match="SACLoss or DiscreteSACLoss"):
        control_alpha(nn.Linear(1, 1), controller)
    with pytest.raises(TypeError, match="EntropyController"):
        control_alpha(loss, 1.0)
    control_alpha(loss, controller)
    with pytest.raises(ValueError, match="wired already"):
        control_alpha(loss, controller)


@pytest.mark.slow
def test_the_compiled_loss_reads_the_controllers_alpha(one_thread):
    """TorchRL's example compiles its update; the controller's step runs after it returns, and
    the next compiled call reads the new alpha (aot_eager: the graph capture inductor gets)."""
    env, loss, buffer = _sac()
    controller = PIDEntropyTargetAlgorithm.from_space(env.action_spec_unbatched, initial_alpha=1.0)
    alpha_step = control_alpha(loss, controller)
    compiled = torch.compile(lambda batch: loss(batch).detach(), backend="aot_eager")
    seen = []
    for _ in range(6):
        expected = controller.alpha
        loss_td = compiled(buffer.sample())
        assert torch.equal(loss_td["alpha"], expected)
        seen.append(float(alpha_step(loss_td["entropy"])))
    assert len(set(seen)) >= 5  # the PID's first update leaves alpha as it is


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a CUDA graph)")
def test_the_step_refuses_to_run_inside_a_cuda_graph_capture():
    env, loss, buffer = _sac()
    loss = loss.to("cuda")
    controller = PIDEntropyTargetAlgorithm.from_space(env.action_spec_unbatched, initial_alpha=1.0)
    alpha_step = control_alpha(loss, controller)
    assert controller.log_alpha.is_cuda
    entropy = torch.zeros((), device="cuda")
    alpha_step(entropy)  # outside a capture: fine
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="after the CUDA-graph/compiled update"):
        with torch.cuda.graph(graph):
            alpha_step(entropy)
