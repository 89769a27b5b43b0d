"""Tianshou's SAC/DiscreteSAC use ControllerAlpha's alpha; their checkpoint carries the controller.

The alpha each actor loss used is recovered from the gradient of the loss with
respect to the policy's ``log_prob`` (SAC) or entropy (DiscreteSAC), not read
from ``value``.
"""

import copy
import inspect
import io
import math

import pytest

pytest.importorskip(
    "tianshou",
    reason="Tianshou is not installed (pip install -e '.[tianshou]'; .ci/run tests it in a venv)",
)
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402
from tianshou.algorithm import SAC, DiscreteSAC  # noqa: E402
from tianshou.algorithm.modelfree.discrete_sac import DiscreteSACPolicy  # noqa: E402
from tianshou.algorithm.modelfree.sac import Alpha, SACPolicy  # noqa: E402
from tianshou.algorithm.optim import AdamOptimizerFactory  # noqa: E402
from tianshou.data import Collector, CollectStats, VectorReplayBuffer  # noqa: E402
from tianshou.env import DummyVectorEnv  # noqa: E402
from tianshou.utils.net.common import Net  # noqa: E402
from tianshou.utils.net.continuous import (  # noqa: E402
    ContinuousActorProbabilistic,
    ContinuousCritic,
)
from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic  # noqa: E402
from tianshou.utils.torch_utils import policy_within_training_step, torch_train_mode  # noqa: E402

from alf_entropy.controllers import (  # noqa: E402
    EntropyTargetAlgorithm,
    PIDEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.integrations.tianshou import SUPPORTED_TIANSHOU, ControllerAlpha  # noqa: E402
from tests.nests import assert_nests_equal  # noqa: E402

BATCH = 32


def _algorithm(alpha, discrete: bool = False, seed: int = 0):
    """Tianshou's own test scripts' SAC (Pendulum) or DiscreteSAC (CartPole), small."""
    torch.manual_seed(seed)
    env = gym.make("CartPole-v1" if discrete else "Pendulum-v1")
    obs, act = env.observation_space.shape, env.action_space
    optim = AdamOptimizerFactory(lr=1e-3)
    if discrete:
        n = int(act.n)
        policy = DiscreteSACPolicy(
            actor=DiscreteActor(
                preprocess_net=Net(state_shape=obs, hidden_sizes=[32]),
                action_shape=n,
                softmax_output=False,
            ),
            action_space=act,
        )
        critics = [
            DiscreteCritic(preprocess_net=Net(state_shape=obs, hidden_sizes=[32]), last_size=n)
            for _ in range(2)
        ]
        cls = DiscreteSAC
    else:
        policy = SACPolicy(
            actor=ContinuousActorProbabilistic(
                preprocess_net=Net(state_shape=obs, hidden_sizes=[32]),
                action_shape=act.shape,
                unbounded=True,
            ),
            action_space=act,
        )
        critics = [
            ContinuousCritic(
                preprocess_net=Net(
                    state_shape=obs, action_shape=act.shape, hidden_sizes=[32], concat=True
                )
            )
            for _ in range(2)
        ]
        cls = SAC
    return cls(
        policy=policy,
        policy_optim=optim,
        critic=critics[0],
        critic_optim=optim,
        critic2=critics[1],
        critic2_optim=optim,
        alpha=alpha,
    )


def _filled_buffer(algorithm, discrete: bool, seed: int = 0):
    task = "CartPole-v1" if discrete else "Pendulum-v1"
    envs = DummyVectorEnv([lambda: gym.make(task) for _ in range(2)])
    envs.seed(seed)
    buffer = VectorReplayBuffer(1000, 2)
    np.random.seed(seed)
    with policy_within_training_step(algorithm.policy), torch_train_mode(algorithm, False):
        Collector[CollectStats](algorithm, envs, buffer).collect(
            n_step=200, random=True, reset_before_collect=True
        )
    return buffer


def _updates(algorithm, buffer, n: int) -> None:
    """``n`` gradient steps as Tianshou's off-policy trainer takes them."""
    with policy_within_training_step(algorithm.policy):
        for _ in range(n):
            algorithm.update(buffer=buffer, sample_size=BATCH)


def _spy_on_the_actor_loss(algorithm, controller, discrete: bool):
    """Record (alpha in the actor loss's gradient, the controller's alpha) at each actor step."""
    seen, policy = [], algorithm.policy
    forward = policy.forward

    def hooked(*args, **kwargs):
        result = forward(*args, **kwargs)
        if not torch.is_grad_enabled():
            return result
        alpha_now = float(controller.alpha)
        if discrete:  # actor_loss = -mean(alpha * entropy + E_pi[Q])
            dist, entropy = result.dist, result.dist.entropy

            def hooked_entropy():
                h = entropy()
                h.register_hook(lambda g: seen.append((-float(g[0]) * len(g), alpha_now)))
                return h

            dist.entropy = hooked_entropy
        else:  # actor_loss = mean(alpha * log_prob - min Q)
            result.log_prob.register_hook(
                lambda g: seen.append((float(g.flatten()[0]) * g.numel(), alpha_now))
            )
        return result

    policy.forward = hooked
    return seen


def test_tianshou_version_and_the_alpha_protocol_relied_on():
    import tianshou

    assert Version(tianshou.__version__) in SpecifierSet(SUPPORTED_TIANSHOU)
    assert Alpha.__abstractmethods__ == {"value", "update"}
    assert "self.alpha = Alpha.from_float_or_instance(alpha)" in inspect.getsource(SAC.__init__)
    sac = inspect.getsource(SAC._update_with_batch)
    assert "self.alpha.value * obs_result.log_prob.flatten()" in sac
    assert "entropy = -obs_result.log_prob.detach()" in sac
    assert "alpha_loss = self.alpha.update(entropy)" in sac
    assert "- self.alpha.value * act_batch.log_prob" in inspect.getsource(
        SAC._target_q_compute_value
    )
    discrete = inspect.getsource(DiscreteSAC._update_with_batch)
    assert "-(self.alpha.value * entropy + (dist.probs * q).sum(dim=-1)).mean()" in discrete
    assert "alpha_loss = self.alpha.update(entropy.detach())" in discrete
    # SAC's log_prob is that of the tanh-squashed action, before rescaling to the env's bounds.
    assert (
        "log_prob = correct_log_prob_gaussian_tanh(log_prob, squashed_action)"
        in inspect.getsource(SACPolicy.forward)
    )


def test_the_tianshou_extra_pins_the_tested_version():
    from tests.test_dependencies import REPO, setup_kwargs

    assert setup_kwargs()["extras_require"]["tianshou"] == [f"tianshou{SUPPORTED_TIANSHOU}"]
    assert "torchrl,tianshou" in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_a_class_is_built_for_the_squashed_box_and_a_discrete_space_as_it_is():
    alpha = ControllerAlpha(
        PIDEntropyTargetAlgorithm, gym.spaces.Box(-2.0, 2.0, (1,)), initial_alpha=1.0
    )
    assert isinstance(alpha, Alpha) and isinstance(alpha, torch.nn.Module)
    spec = alpha.controller.action_spec
    assert spec.minimum.tolist() == [-1.0] and spec.maximum.tolist() == [1.0]
    assert alpha.controller.target_entropy == pytest.approx(math.log(2.0) + math.log(0.1))
    assert alpha.value == 1.0 and isinstance(alpha.value, float)  # AutoAlpha(log_alpha=0)'s start
    discrete = ControllerAlpha(EntropyTargetAlgorithm, gym.spaces.Discrete(4))
    assert int(discrete.controller.action_spec.maximum) == 3


def test_an_instance_for_the_envs_bounds_and_other_misuse_are_refused():
    with pytest.raises(ValueError, match=r"not \[-1, 1\]"):
        ControllerAlpha(PIDEntropyTargetAlgorithm.from_space(gym.spaces.Box(-2.0, 2.0, (1,))))
    box = gym.spaces.Box(-1.0, 1.0, (1,))
    instance = PIDEntropyTargetAlgorithm.from_space(box)
    assert ControllerAlpha(instance).controller is instance
    with pytest.raises(TypeError, match="for a controller class"):
        ControllerAlpha(instance, box)
    with pytest.raises(TypeError, match="needs the env's action_space"):
        ControllerAlpha(PIDEntropyTargetAlgorithm)
    with pytest.raises(TypeError, match="EntropyController"):
        ControllerAlpha(0.2)
    with pytest.raises(ValueError, match="batch"):
        ControllerAlpha(PIDEntropyTargetAlgorithm, box, batch_shape=(2,))


@pytest.mark.parametrize("discrete", [False, True])
def test_the_actor_loss_uses_the_controllers_alpha_at_every_gradient_step(discrete, one_thread):
    alpha = ControllerAlpha(
        PIDEntropyTargetAlgorithm,
        gym.spaces.Discrete(2) if discrete else gym.spaces.Box(-2.0, 2.0, (1,)),
        initial_alpha=1.0,
        **({"target_entropy": 0.5} if discrete else {}),
    )
    algorithm = _algorithm(alpha, discrete)
    assert algorithm.alpha is alpha
    buffer = _filled_buffer(algorithm, discrete)
    seen = _spy_on_the_actor_loss(algorithm, alpha.controller, discrete)
    _updates(algorithm, buffer, 12)
    assert len(seen) == 12
    for used, controller_alpha in seen:
        assert used == pytest.approx(controller_alpha, rel=1e-5)
    assert len({a for _, a in seen}) > 5  # alpha moved
    assert isinstance(alpha.value, float) and alpha.value == float(alpha.controller.alpha)


@pytest.mark.parametrize(
    "discrete,cls", [(False, SGDEntropyTargetAlgorithm), (True, PIDEntropyTargetAlgorithm)]
)
def test_resume_from_the_algorithms_checkpoint_restores_the_controller_exactly(
    discrete, cls, one_thread
):
    def build():
        space = gym.spaces.Discrete(2) if discrete else gym.spaces.Box(-2.0, 2.0, (1,))
        return _algorithm(ControllerAlpha(cls, space, initial_alpha=1.0), discrete)

    algorithm = build()
    buffer = _filled_buffer(algorithm, discrete)
    _updates(algorithm, buffer, 5)
    checkpoint = io.BytesIO()
    torch.save({"algorithm": algorithm.state_dict(), "torch": torch.get_rng_state()}, checkpoint)
    saved = copy.deepcopy(algorithm.alpha.controller.state_dict())
    saved_buffer = copy.deepcopy(buffer)  # its sampling generator too
    _updates(algorithm, buffer, 5)

    resumed = build()
    checkpoint.seek(0)
    state = torch.load(checkpoint, weights_only=False)
    assert any(k.startswith("alpha.controller.") for k in state["algorithm"])
    resumed.load_state_dict(state["algorithm"])
    torch.set_rng_state(state["torch"])
    assert_nests_equal(resumed.alpha.controller.state_dict(), saved, "loaded")
    _updates(resumed, saved_buffer, 5)
    assert_nests_equal(
        resumed.alpha.controller.state_dict(), algorithm.alpha.controller.state_dict(), "resumed"
    )


def test_the_page_names_the_pins_that_downgrade_a_shared_environment():
    """Tianshou's own upper bounds on packages another extra brings newer (pandas: TRL's
    datasets brings 3) are on docs/tianshou.md and in the README, with the way around."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    page = open("docs/tianshou.md", encoding="utf-8").read()
    readme = open("README.md", encoding="utf-8").read()
    pins = {r.name: r for r in map(Requirement, requires("tianshou")) if not r.marker}
    for name in ("pandas", "virtualenv"):
        upper = [Version(s.version).major for s in pins[name].specifier if s.operator == "<"]
        assert upper and f"`{name}<{upper[0]}`" in page, name
    assert "downgrades pandas" in page
    assert "--system-site-packages" in page
    assert "pins `pandas<3`" in readme and "downgrades pandas" in readme
