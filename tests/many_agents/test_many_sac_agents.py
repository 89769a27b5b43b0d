"""K SAC agents in one batch against K single runs: same start, same first updates, no coupling."""

import functools
from typing import Any, Dict, List, Tuple

import gin
import pytest
import torch

from alf_entropy.algorithms.many_sac_agents import ManySacAgents
from alf_entropy.algorithms.sac_algorithm import SacAlgorithm
from alf_entropy.config.loading import CONFIG_DIR, parse_gin_config
from alf_entropy.controllers import (
    EntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    PIDEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.networks import ActorDistributionNetwork
from alf_entropy.networks.critic_networks import CriticNetworks, StackedCritics
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
from alf_entropy.trainers.off_policy_trainer import OffPolicyTrainer
from alf_entropy.trainers.ranks import MAX_SEED, seed_all
from alf_entropy.utils.replay_buffer import ReplayBuffer, Transition
from tests.controller_replay import assert_log_alpha_close, record_updates
from tests.nests import assert_nests_equal

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL_NETS = dict(
    actor_network_ctor=functools.partial(
        ActorDistributionNetwork,
        fc_layer_params=(32, 32),
        squash_to_spec=True,
        state_dependent_std=True,
    ),
    critic_network_ctor=functools.partial(CriticNetworks, fc_layer_params=(32, 32)),
)
SAC = functools.partial(SacAlgorithm, **SMALL_NETS)
DISCRETE_SAC = functools.partial(  # sac_cartpole.gin's controller
    SacAlgorithm,
    entropy_target_cls=functools.partial(
        EntropyTargetAlgorithm, target_entropy=0.2, initial_alpha=0.01, skip_free_stage=True
    ),
    **SMALL_NETS,
)
TRAINER = dict(
    env_id="Pendulum-v1",
    num_envs=2,
    initial_collect_steps=8,
    mini_batch_size=16,
    replay_buffer_length=1000,
    progress_bar=False,
    device="cpu",
    checkpoint_interval=None,
    summary_interval=1,
)
PENDULUM_OBS, PENDULUM_ACTION = TensorSpec((3,)), BoundedTensorSpec((1,), torch.float32, -2.0, 2.0)


def _recording(trainer: OffPolicyTrainer) -> List[torch.Tensor]:
    """Every update's loss: ``[K]`` for K agents, a scalar for one."""
    losses: List[torch.Tensor] = []
    alg = trainer.algorithm
    train_step = alg.train_step

    def _step(batch: Any, *args: Any, **kwargs: Any) -> Any:
        out = train_step(batch, *args, **kwargs)
        losses.append(out.info.loss.clone())
        return out

    alg.train_step = _step
    return losses


def _max_diff(mine: Dict[str, Any], theirs: Dict[str, Any]) -> float:
    return max(
        float((mine[n].double() - v.double()).abs().max())
        for n, v in theirs.items()
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    )


def _train(root: Any, **kwargs: Any) -> Tuple[OffPolicyTrainer, torch.Tensor]:
    trainer = OffPolicyTrainer(str(root), **{**TRAINER, **kwargs})
    losses = _recording(trainer)
    trainer.train()
    return trainer, torch.stack(losses)


@pytest.mark.parametrize(
    "ctor,env_id",
    [(SAC, "Pendulum-v1"), (SacAlgorithm, "Pendulum-v1"), (DISCRETE_SAC, "CartPole-v1")],
    ids=["small", "default", "discrete"],
)
def test_agent_k_follows_the_single_trainer_with_seed_k(
    tmp_path: Any, ctor: Any, env_id: str
) -> None:
    """Same initial parameters, same random actions, replay rows and samples: the first
    updates' losses match the single run's to 1e-5."""
    common = dict(algorithm_ctor=ctor, env_id=env_id, num_iterations=12)
    batch = OffPolicyTrainer(str(tmp_path / "batch"), seeds=[3, 5], **{**TRAINER, **common})
    starts = [batch.algorithm.agent_state_dict(k) for k in range(2)]
    losses = _recording(batch)
    assert batch.train()["env_steps"] == 12 * 2  # one agent's steps
    losses = torch.stack(losses)
    assert losses.shape == (12 - 3, 2)  # updates from the 4th iteration (8 rows)
    for k, seed in enumerate([3, 5]):
        single, single_losses = _train(tmp_path / f"single{seed}", seed=seed, **common)
        seed_all(seed)
        fresh = ctor(batch._observation_spec, batch._action_spec).state_dict()
        assert_nests_equal(starts[k], fresh)
        torch.testing.assert_close(losses[:, k], single_losses, rtol=1e-5, atol=1e-5)
        mine, theirs = batch.algorithm.agent_state_dict(k), single.algorithm.state_dict()
        assert _max_diff(mine, theirs) < 1e-5
        # The controller's own state (SAC's rule: its Adam on log_alpha) is the agent's.
        name = "_entropy_target_algorithm._extra_state"
        if isinstance(theirs.get(name), dict):
            assert _max_diff(mine[name]["state"][0], theirs[name]["state"][0]) < 1e-6
        seed_all(seed)
        fresh = ctor(batch._observation_spec, batch._action_spec)
        fresh.load_state_dict(mine)  # loadable into the algorithm a single run builds
        assert _max_diff(fresh.state_dict(), theirs) < 1e-5


def test_the_shipped_pendulum_config_batched(tmp_path: Any) -> None:
    """``sac_pendulum.gin`` with ``OffPolicyTrainer.num_agents = 2``: agent 1 is seed 1's run."""
    overrides = [
        "OffPolicyTrainer.num_env_steps = 0",
        "OffPolicyTrainer.num_iterations = 6",
        "OffPolicyTrainer.initial_collect_steps = 4",
        "OffPolicyTrainer.mini_batch_size = 32",
        "OffPolicyTrainer.eval_interval = None",
        "OffPolicyTrainer.progress_bar = False",
        "OffPolicyTrainer.device = 'cpu'",
    ]
    parse_gin_config(
        [f"{CONFIG_DIR}/sac_pendulum.gin"], overrides + ["OffPolicyTrainer.num_agents = 2"]
    )
    batch = OffPolicyTrainer(str(tmp_path / "batch"))
    assert batch.seeds == [0, 1]
    assert float(batch.algorithm.entropy_target_algorithm.alpha[1]) == 1.0  # the config's
    losses = _recording(batch)
    batch.train()
    gin.clear_config()
    parse_gin_config([f"{CONFIG_DIR}/sac_pendulum.gin"], overrides + ["OffPolicyTrainer.seed = 1"])
    single = OffPolicyTrainer(str(tmp_path / "single"))
    single_losses = _recording(single)
    single.train()
    torch.testing.assert_close(
        torch.stack(losses)[:, 1], torch.stack(single_losses), rtol=1e-5, atol=1e-5
    )


def _transitions(k: int, n: int = 32) -> Transition:
    gen = torch.Generator().manual_seed(11)
    return Transition(
        observation=torch.randn(k, n, 3, generator=gen),
        action=torch.rand(k, n, 1, generator=gen) * 4 - 2,
        reward=torch.randn(k, n, generator=gen),
        discount=torch.ones(k, n),
        next_observation=torch.randn(k, n, 3, generator=gen),
        valid=torch.ones(k, n, dtype=torch.bool),
    )


def test_a_nan_in_one_agent_changes_no_other_agent() -> None:
    seeds = [3, 5, 7]
    clean = ManySacAgents(PENDULUM_OBS, PENDULUM_ACTION, seeds, algorithm_ctor=SAC)
    poisoned = ManySacAgents(PENDULUM_OBS, PENDULUM_ACTION, seeds, algorithm_ctor=SAC)
    before = poisoned.agent_state_dict(1)
    for step in range(3):
        batch = _transitions(3)
        clean.train_step(batch)
        if step == 1:  # agent 1 sees a NaN reward once
            batch = batch._replace(
                reward=batch.reward.clone().index_put_(
                    (torch.tensor([1]), torch.tensor([4])), torch.tensor(float("nan"))
                )
            )
        poisoned.train_step(batch)
    assert poisoned.skipped_updates.tolist() == [0, 1, 0]
    for k in (0, 2):
        assert_nests_equal(poisoned.agent_state_dict(k), clean.agent_state_dict(k), f"agent {k}")
    # Agent 1 took its other two updates: its networks moved, and stayed finite.
    after = poisoned.agent_state_dict(1)
    assert not torch.equal(
        after["_critic_networks.weights.0"], before["_critic_networks.weights.0"]
    )
    assert all(
        torch.isfinite(v).all()
        for v in after.values()
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    )


@pytest.mark.parametrize(
    "controller",
    [
        SGDEntropyTargetAlgorithm,
        EntropyTargetAlgorithm,
        PIDEntropyTargetAlgorithm,
        FixedEntropyCoefficient,
    ],
)
def test_per_agent_targets(controller: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Agent k with target t_k updates as a single agent whose controller has target t_k."""
    record_updates(monkeypatch)
    targets, seeds = [-1.0, 0.5], [2, 9]
    ctor = functools.partial(SAC, entropy_target_cls=controller)
    agents = ManySacAgents(
        PENDULUM_OBS, PENDULUM_ACTION, seeds, algorithm_ctor=ctor, target_entropies=targets
    )
    assert agents.entropy_target_algorithm.target_entropy.tolist() == targets
    losses = torch.stack([agents.train_step(_transitions(2)).info.loss for _ in range(3)])
    for k, (seed, target) in enumerate(zip(seeds, targets)):
        seed_all(seed)
        single = SAC(
            PENDULUM_OBS,
            PENDULUM_ACTION,
            entropy_target_cls=functools.partial(controller, target_entropy=target),
        )
        mine = torch.stack(
            [
                single.train_step(Transition(*[x[k] for x in _transitions(2)])).info.loss
                for _ in range(3)
            ]
        )
        torch.testing.assert_close(losses[:, k], mine, rtol=1e-5, atol=1e-5)
        # The stacked networks' batched matmuls and one agent's are not bit-identical: on an
        # Intel Xeon agent 1's entropies differ in the last bits, and so may alpha, by the
        # controller's gain times that gap (tests/controller_replay.py).
        assert_log_alpha_close(agents.entropy_target_algorithm, k, single.entropy_target_algorithm)


def _batch(root: Any, num_iterations: int) -> OffPolicyTrainer:
    return OffPolicyTrainer(
        str(root),
        seeds=[3, 8],
        target_entropies=[-1.0, -0.5],
        num_iterations=num_iterations,
        **{**TRAINER, "algorithm_ctor": SAC, "initial_collect_steps": 4},
    )


def test_the_batch_resumes_exactly(tmp_path: Any) -> None:
    """2 iterations, stop, resume for 1 more == 3 straight, bit for bit (parameters, target
    critics, Adam and controller state, replay buffer, generators, environments)."""
    straight = _batch(tmp_path / "straight", 3)
    straight.train()
    assert _batch(tmp_path / "resumed", 2).train()["iteration"] == 2
    resumed = _batch(tmp_path / "resumed", 3)
    assert resumed.iteration == 2 and resumed.restored_from is not None
    assert resumed.train()["iteration"] == 3
    assert_nests_equal(resumed.algorithm.state_dict(), straight.algorithm.state_dict())
    assert_nests_equal(
        resumed.algorithm.optimizers()[0].state_dict(),
        straight.algorithm.optimizers()[0].state_dict(),
    )
    assert_nests_equal(resumed.replay_buffer.state_dict(), straight.replay_buffer.state_dict())
    for g, h in zip(resumed.algorithm.generators, straight.algorithm.generators):
        assert torch.equal(g.get_state(), h.get_state())


def test_each_agent_is_a_run_the_report_reads(tmp_path: Any) -> None:
    from alf_entropy.experiments.report import find_runs, load_run, run_metrics

    root = tmp_path / "batch"
    trainer = OffPolicyTrainer(
        str(root),
        seeds=[1, 2],
        target_entropies=[-1.0, -0.5],
        num_iterations=10,
        eval_interval=5,
        num_eval_episodes=1,
        **{**TRAINER, "algorithm_ctor": SAC},
    )
    assert trainer.agent_dirs == ["target_entropy=-1.0+seed=1", "target_entropy=-0.5+seed=2"]
    trainer.train()
    assert not (root / "train").exists()
    runs = find_runs([str(root)])
    assert [r[len(str(root)) + 1 :] for r in runs] == sorted(trainer.agent_dirs)
    for k, run in enumerate(
        sorted(runs, key=lambda r: trainer.agent_dirs.index(r[len(str(root)) + 1 :]))
    ):
        scalars = load_run(run).scalars
        for tag in (
            "loss/total",
            "loss/critic",
            "entropy",
            "alpha",
            "target_entropy",
            "q",
            "env_steps",
            "eval/return",
        ):
            assert tag in scalars, tag
        assert scalars["target_entropy"][1][-1] == pytest.approx([-1.0, -0.5][k])
        assert list(scalars["eval/return"][0]) == [0, 5, 10]
        assert run_metrics(load_run(run))["env_steps"] == 10 * 2


def test_argument_errors(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(tmp_path / "r")
    common = {**TRAINER, "num_iterations": 10}
    for kwargs, match in [
        (dict(num_agents=0), "num_agents"),
        (dict(num_agents=3, seed=MAX_SEED - 2), "seed \\+ num_agents - 1"),
        (dict(seeds=[1, 1]), "distinct"),
        (dict(seeds=[1]), "at least two"),
        (dict(num_agents=3, seeds=[1, 2]), "num_agents is 3 but seeds has 2"),
        (dict(target_entropies=[0.3]), "target_entropies needs num_agents > 1"),
        (dict(num_agents=2, target_entropies=[0.3]), "target_entropies has 1 entries for 2"),
    ]:
        with pytest.raises(ValueError, match=match):
            OffPolicyTrainer(root, **common, **kwargs)
    cartpole = BoundedTensorSpec((), torch.int64, 0, 1)
    with pytest.raises(ValueError, match="below 0 for a discrete action"):
        ManySacAgents(
            TensorSpec((4,)),
            cartpole,
            [1, 2],
            algorithm_ctor=DISCRETE_SAC,
            target_entropies=[0.2, -0.1],
        )
    with pytest.raises(ValueError, match="distinct"):
        ManySacAgents(PENDULUM_OBS, PENDULUM_ACTION, [1, 1], algorithm_ctor=SAC)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="several ranks"):
        OffPolicyTrainer(root, num_agents=2, **common)


@pytest.mark.parametrize("detach", [False, True])
def test_stacked_critics_backward_equals_autograd(detach: bool) -> None:
    """The stacked ReLU critics' hand-written backward gives plain autograd's gradients."""
    torch.manual_seed(3)
    nets = {
        fused: StackedCritics(
            [
                CriticNetworks(
                    PENDULUM_OBS, PENDULUM_ACTION, fc_layer_params=(6, 5), fused_backward=fused
                ).double()
                for _ in range(3)
            ]
        )
        for fused in (True, False)
    }
    nets[False].load_state_dict(nets[True].state_dict())
    obs = torch.randn(3, 4, 3, dtype=torch.float64, requires_grad=True)
    act = torch.randn(3, 4, 1, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 3, 4, dtype=torch.float64)
    grads = {}
    for fused, net in nets.items():
        inputs = [obs, act] + ([] if detach else list(net.parameters()))
        q = net(obs, act, detach_params=detach)
        grads[fused] = (q, torch.autograd.grad((q * weight).sum(), inputs))
    torch.testing.assert_close(grads[True][0], grads[False][0])
    for got, want in zip(grads[True][1], grads[False][1]):
        torch.testing.assert_close(got, want)
    assert all(g.abs().sum() > 0 for g in grads[True][1])


def test_stacked_critics_and_member_sampling() -> None:
    """``StackedCritics`` member k is critic k; ``sample_members`` needs K member rows."""
    critics = [
        CriticNetworks(PENDULUM_OBS, PENDULUM_ACTION, fc_layer_params=(8,)) for _ in range(3)
    ]
    obs, act = torch.randn(3, 5, 3), torch.randn(3, 5, 1)
    out = StackedCritics(critics)(obs, act)
    assert out.shape == (2, 3, 5)
    for k, critic in enumerate(critics):
        torch.testing.assert_close(out[:, k], critic(obs[k], act[k]), rtol=0, atol=1e-6)
    with pytest.raises(TypeError, match="CriticNetworks"):
        StackedCritics([torch.nn.Linear(2, 2)])
    buffer = ReplayBuffer(10)
    buffer.add({"x": torch.arange(6.0).reshape(3, 2)})  # 3 rows of 2 members
    gens = [torch.Generator().manual_seed(s) for s in (1, 2)]
    sample = buffer.sample_members(4, gens)["x"]
    assert sample.shape == (2, 4) and bool((sample[0] % 2 == 0).all())
    with pytest.raises(ValueError, match="do not hold 3 members"):
        buffer.sample_members(4, gens + [torch.Generator()])


_KILL_ITERATIONS = 60


def _train_batch_child(root_dir: str) -> None:
    """The batch's training "command" in a forked child: always the same arguments."""
    torch.set_num_threads(1)
    gin.clear_config()
    OffPolicyTrainer(
        root_dir,
        seeds=[3, 8],
        num_iterations=_KILL_ITERATIONS,
        **{**TRAINER, "algorithm_ctor": SAC, "checkpoint_interval": 5, "summary_interval": 7},
    ).train()


@pytest.mark.slow
def test_sigkill_and_restart_of_the_batch_gives_the_uninterrupted_checkpoint(tmp_path: Any) -> None:
    import random

    from tests.trainers.test_exact_resume import assert_same_final_checkpoint, run_killing

    run_killing(_train_batch_child, str(tmp_path / "reference"))
    assert (
        run_killing(
            _train_batch_child, str(tmp_path / "killed"), 3, random.Random(2), iteration_time=0.05
        )
        == 3
    )
    assert_same_final_checkpoint(
        str(tmp_path / "reference"), str(tmp_path / "killed"), _KILL_ITERATIONS
    )
