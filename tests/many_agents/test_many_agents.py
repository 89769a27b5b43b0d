"""K agents in one batch against K single runs: same start, same first updates, no coupling."""

import copy
import functools
from typing import Any, Callable, List, Sequence, Tuple

import numpy as np
import pytest
import torch

from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm
from alf_entropy.algorithms.many_agents import ManyAgents
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.controllers import EntropyTargetAlgorithm, PIDEntropyTargetAlgorithm
from alf_entropy.data_structures import TimeStep, make_experience
from alf_entropy.environments.agent_envs import AgentEnvs
from alf_entropy.environments.gym_vector_env import GymVectorEnv
from alf_entropy.networks import ActorDistributionNetwork
from alf_entropy.networks.stacked import StackedModule
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
from alf_entropy.trainers.on_policy_trainer import stack_experiences
from alf_entropy.trainers.ranks import seed_all
from alf_entropy.utils import nest
from alf_entropy.utils.optimizers import FusedAdam
from tests.controller_replay import assert_log_alpha_close, record_updates

pytestmark = pytest.mark.usefixtures("one_thread")

ENV, NUM_ENVS, UNROLL = "CartPole-v1", 4, 16
SEEDS = [3, 5, 7]

PPO = functools.partial(PPOAlgorithm, enforce_entropy_target=True)
PPO_PID_PER_ITERATION = functools.partial(
    PPOAlgorithm,
    enforce_entropy_target=True,
    entropy_target_cls=PIDEntropyTargetAlgorithm,
    entropy_target_update="per_iteration",
)
A2C = functools.partial(ActorCriticAlgorithm, entropy_regularization=0.01)
PPO_CAPPED_SCHEDULED_LR = functools.partial(
    PPOAlgorithm,
    enforce_entropy_target=True,
    entropy_target_cls=functools.partial(
        EntropyTargetAlgorithm, max_alpha_change_per_iteration=1.5
    ),
    optimizer=functools.partial(FusedAdam, lr=2e-3, lr_schedule=lambda: 0.5),
)


def record_update_losses(alg: Any) -> List[torch.Tensor]:
    """Every ``update_with_gradient`` of ``alg`` from now on appends the loss it minimised."""
    losses: List[torch.Tensor] = []
    update = alg.update_with_gradient

    def _recording(loss_info: Any, **kwargs: Any) -> Any:
        out = update(loss_info, **kwargs)
        losses.append(out[0].loss.clone())
        return out

    alg.update_with_gradient = _recording
    return losses


def _single_run(
    ctor: Callable[..., Any], seed: int, iterations: int = 1, env_id: str = ENV
) -> Tuple[ActorCriticAlgorithm, torch.Tensor, torch.Tensor]:
    """What OnPolicyTrainer does for a seed: seed, build, reset, unroll, train.

    Returns the algorithm, each update's loss and the actions of the unrolls.
    """
    seed_all(seed)
    env = GymVectorEnv(env_id, num_envs=NUM_ENVS, seed=seed)
    alg = ctor(env.observation_spec, env.action_spec)
    losses = record_update_losses(alg)
    time_step, actions = env.reset(), []
    for _ in range(iterations):
        experiences = []
        with torch.inference_mode():
            for _ in range(UNROLL):
                step = alg.rollout_step(time_step)
                experiences.append(make_experience(time_step._replace(env_info=()), step))
                actions.append(step.output)
                time_step = env.step(step.output)
        alg.train_from_unroll(stack_experiences(experiences), time_step)
    env.close()
    return alg, torch.stack(losses), torch.stack(actions)


def _batched_run(
    ctor: Callable[..., Any],
    seeds: Sequence[int],
    iterations: int = 1,
    before: Callable[[ManyAgents], None] = lambda agents: None,
    env_id: str = ENV,
    **kwargs: Any,
) -> Tuple[ManyAgents, torch.Tensor, torch.Tensor]:
    """The same for K seeds in one ``ManyAgents``; losses ``[U, K]``, actions ``[T, K, B]``."""
    envs = AgentEnvs(env_id, NUM_ENVS, seeds)
    agents = ManyAgents(
        envs.observation_spec, envs.action_spec, seeds, algorithm_ctor=ctor, **kwargs
    )
    before(agents)
    losses = record_update_losses(agents.algorithm)  # the single agent's, on [K] losses
    time_step, actions = envs.reset(), []
    for _ in range(iterations):
        experiences = []
        with torch.inference_mode():
            for _ in range(UNROLL):
                step = agents.rollout_step(time_step)
                experiences.append(make_experience(time_step, step))
                actions.append(step.output)
                time_step = envs.step(step.output)
        agents.train_from_unroll(stack_experiences(experiences), time_step)
    envs.close()
    return agents, torch.stack(losses), torch.stack(actions)


def _max_param_diff(a: dict, b: dict) -> float:
    return max(
        float((a[n].double() - b[n].double()).abs().max()) for n in b if b[n].is_floating_point()
    )


def _specs() -> Tuple[TensorSpec, BoundedTensorSpec]:
    return TensorSpec((4,)), BoundedTensorSpec((), torch.int64, 0, 1)


def test_agent_k_starts_as_the_single_run_with_seed_k() -> None:
    agents = ManyAgents(*_specs(), SEEDS, algorithm_ctor=PPO)
    for k, seed in enumerate(SEEDS):
        seed_all(seed)
        single = PPO(*_specs()).state_dict()
        mine = agents.agent_state_dict(k)
        assert mine.keys() == single.keys()
        for name, value in single.items():
            assert torch.equal(mine[name], value), name


@pytest.mark.parametrize(
    "ctor",
    [PPO, PPO_PID_PER_ITERATION, A2C, PPO_CAPPED_SCHEDULED_LR],
    ids=["ppo", "ppo_pid_per_iteration", "a2c", "ppo_capped_scheduled_lr"],
)
def test_agent_k_follows_the_single_run_with_seed_k(
    ctor: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    record_updates(monkeypatch)
    agents, losses, actions = _batched_run(ctor, SEEDS)
    for k, seed in enumerate(SEEDS):
        single, single_losses, single_actions = _single_run(ctor, seed)
        # Same environments and generator: the same actions, hence the same unroll.
        assert torch.equal(actions[:, k], single_actions)
        # Every update of the iteration (the first one included) within 1e-5.
        assert losses.shape[0] == single_losses.shape[0]
        torch.testing.assert_close(losses[:, k], single_losses, rtol=1e-5, atol=1e-5)
        assert _max_param_diff(agents.agent_state_dict(k), single.state_dict()) < 1e-6
        as_single = agents.agent_algorithm(k)  # agent k as a single run's algorithm
        assert _max_param_diff(as_single.state_dict(), single.state_dict()) < 1e-6
        obs = TimeStep(observation=torch.randn(5, 4))
        assert torch.equal(as_single.predict_step(obs).output, single.predict_step(obs).output)
        controller = single.entropy_target_algorithm
        if controller is not None:  # stacked networks: entropies equal to float32 rounding
            assert_log_alpha_close(agents.entropy_target_algorithm, k, controller)


def test_one_agent_matches_the_single_run() -> None:
    """K = 1 through the batch path: the networks, the rollout, the controller and the
    first updates give the single run's bits; BatchedAdam is torch's single-tensor Adam
    bit for bit, where the single run's FusedAdam kernel fuses multiply-adds, so the
    parameters move apart by an ulp (3e-8) now and then.  (A trainer with one agent keeps
    the single-agent path and is bit-identical by construction.)"""
    seed = 2
    agents, losses, actions = _batched_run(PPO, [seed], iterations=2)
    single, single_losses, single_actions = _single_run(PPO, seed, iterations=2)
    assert torch.equal(actions[:, 0], single_actions)
    assert torch.equal(losses[0, 0], single_losses[0])
    torch.testing.assert_close(losses[:, 0], single_losses, rtol=1e-6, atol=0)
    assert _max_param_diff(agents.agent_state_dict(0), single.state_dict()) < 1e-7
    # The networks' arithmetic itself is bit-identical.
    seed_all(seed)
    reference = PPO(*_specs())
    stacked = ManyAgents(*_specs(), [seed], algorithm_ctor=PPO).algorithm
    obs = torch.randn(1, 32, 4)
    with torch.no_grad():
        assert torch.equal(stacked.value_network(obs)[0], reference.value_network(obs[0]))
        assert torch.equal(
            stacked.actor_network(obs).logits[0], reference.actor_network(obs[0]).logits
        )


def test_per_agent_target_entropies(monkeypatch: pytest.MonkeyPatch) -> None:
    record_updates(monkeypatch)
    targets = [0.2, 0.5]
    ctor = functools.partial(
        PPOAlgorithm, enforce_entropy_target=True, entropy_target_cls=PIDEntropyTargetAlgorithm
    )
    agents, losses, _ = _batched_run(ctor, SEEDS[:2], target_entropies=targets)
    assert agents.entropy_target_algorithm.target_entropy.tolist() == pytest.approx(targets)
    for k, (seed, target) in enumerate(zip(SEEDS, targets)):
        single_ctor = functools.partial(
            ctor,
            entropy_target_cls=functools.partial(PIDEntropyTargetAlgorithm, target_entropy=target),
        )
        single, single_losses, _ = _single_run(single_ctor, seed)
        torch.testing.assert_close(losses[:, k], single_losses, rtol=1e-5, atol=1e-5)
        assert_log_alpha_close(agents.entropy_target_algorithm, k, single.entropy_target_algorithm)


def test_a_nan_in_one_agent_changes_no_other_agent() -> None:
    reference, _, _ = _batched_run(PPO, SEEDS)

    def _poison_agent_1(agents: ManyAgents) -> None:
        with torch.no_grad():
            for network in (agents.algorithm.actor_network, agents.algorithm.value_network):
                next(network.parameters())[1].fill_(float("nan"))

    poisoned, losses, _ = _batched_run(PPO, SEEDS, before=_poison_agent_1)
    assert torch.isnan(losses[:, 1]).all() and torch.isfinite(losses[:, [0, 2]]).all()
    assert poisoned.skipped_updates.tolist() == [0, losses.shape[0], 0]
    for k in (0, 2):
        mine, theirs = poisoned.agent_state_dict(k), reference.agent_state_dict(k)
        for name in theirs:
            assert torch.equal(mine[name], theirs[name]), (k, name)
    # Agent 1 skipped every update: its parameters and Adam state are untouched.
    seed_all(SEEDS[1])
    initial = PPO(*_specs()).state_dict()
    after = poisoned.agent_state_dict(1)
    for name, value in initial.items():
        if name.startswith("_value_network") and name.endswith("layers.2.weight"):
            assert torch.equal(after[name], value)
    optimizer = poisoned.algorithm.optimizers()[0]
    for state in optimizer.state.values():
        assert state["step"][1] == 0 and not state["exp_avg"][1].any()


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="seeds"):
        ManyAgents(*_specs(), [])
    with pytest.raises(ValueError, match="seeds"):
        ManyAgents(*_specs(), [1, 1])
    with pytest.raises(ValueError, match=r"seeds\[i\] must be"):
        ManyAgents(*_specs(), [1, 2**32])
    with pytest.raises(TypeError, match="seeds must be a sequence"):
        ManyAgents(*_specs(), 3)
    with pytest.raises(TypeError, match="target_entropies must be a sequence"):
        ManyAgents(*_specs(), [1, 2], algorithm_ctor=PPO, target_entropies=-1.0)
    with pytest.raises(ValueError, match="target_entropies has 1 entries for 2"):
        ManyAgents(*_specs(), [1, 2], algorithm_ctor=PPO, target_entropies=[0.3])
    with pytest.raises(ValueError, match="needs agents with an entropy controller"):
        ManyAgents(*_specs(), [1, 2], target_entropies=[0.3, 0.4])
    with pytest.raises(TypeError, match="ActorCriticAlgorithm"):
        ManyAgents(*_specs(), [1], algorithm_ctor=lambda o, a: torch.nn.Linear(1, 1))
    # The agents' controller factory, its arguments bound, is the batch's too.
    explicit = functools.partial(
        PPOAlgorithm,
        enforce_entropy_target=True,
        entropy_target_cls=functools.partial(EntropyTargetAlgorithm, initial_alpha=0.5),
    )
    assert ManyAgents(
        *_specs(), [1, 2], algorithm_ctor=explicit
    ).entropy_target_algorithm.alpha.tolist() == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError, match="log_alpha"):  # another start than the agents'
        ManyAgents(
            *_specs(),
            [1, 2],
            algorithm_ctor=explicit,
            entropy_target_cls=(functools.partial(EntropyTargetAlgorithm, initial_alpha=0.2)),
        )
    agents = ManyAgents(
        *_specs(),
        [1, 2],
        algorithm_ctor=explicit,
        entropy_target_cls=(functools.partial(EntropyTargetAlgorithm, initial_alpha=0.5)),
    )
    assert agents.entropy_target_algorithm.alpha.tolist() == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError, match="k must be"):
        agents.agent_state_dict(2)
    # AdamW subclasses Adam: its decoupled decay would silently become L2 in the batch.
    for opt in (
        functools.partial(torch.optim.AdamW, lr=1e-3),
        functools.partial(torch.optim.Adam, lr=1e-3, amsgrad=True),
    ):
        with pytest.raises(TypeError, match="optimised by Adam"):
            ManyAgents(*_specs(), [1, 2], algorithm_ctor=functools.partial(PPO, optimizer=opt))


def test_ppo_summaries_are_each_agents_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from alf_entropy.utils import summary

    seen: dict = {}
    monkeypatch.setattr(summary, "should_record_summaries", lambda: True)
    monkeypatch.setattr(
        summary,
        "scalar",
        lambda name, value, *a, **k: seen.__setitem__(
            name, torch.as_tensor(value).detach().clone()
        ),
    )
    _batched_run(PPO, SEEDS[:2])
    batched = {name: seen[name] for name in ("ppo/approx_kl", "ppo/clip_fraction")}
    for k, seed in enumerate(SEEDS[:2]):
        seen.clear()
        _single_run(PPO, seed)
        for name, value in batched.items():
            assert value.shape == (2,)
            assert float(value[k]) == pytest.approx(float(seen[name]), rel=1e-3, abs=1e-7)


def test_stacking_refuses_a_free_log_std() -> None:
    spec = BoundedTensorSpec((1,), torch.float32, -2.0, 2.0)
    networks = [ActorDistributionNetwork(TensorSpec((3,)), spec) for _ in range(2)]
    with pytest.raises(ValueError, match="log_std"):
        StackedModule(networks)
    # With a state-dependent std every parameter is in an nn.Linear: it stacks, and member
    # k computes network k's distribution.
    networks = [
        ActorDistributionNetwork(TensorSpec((3,)), spec, state_dependent_std=True) for _ in range(2)
    ]
    stacked = StackedModule(networks)
    obs = torch.randn(2, 5, 3)
    with torch.no_grad():
        dist = stacked(obs)
        for k, network in enumerate(networks):
            ref = network(obs[k])
            torch.testing.assert_close(dist.mean[k], ref.mean)
            torch.testing.assert_close(dist.stddev[k], ref.stddev)


def test_agent_envs_are_the_single_runs_envs() -> None:
    envs = AgentEnvs(ENV, NUM_ENVS, SEEDS)
    singles = [GymVectorEnv(ENV, num_envs=NUM_ENVS, seed=s) for s in SEEDS]
    batch = envs.reset()
    for k, env in enumerate(singles):
        assert torch.equal(batch.observation[k], env.reset().observation)
    rng = np.random.default_rng(0)
    for _ in range(60):  # long enough for episodes to end and reset
        action = torch.as_tensor(rng.integers(0, 2, size=(len(SEEDS), NUM_ENVS)))
        batch = envs.step(action)
        for k, env in enumerate(singles):
            one = env.step(action[k])._replace(env_info=())
            mine = nest.map_structure(lambda x, k=k: x[k], batch)
            for a, b in zip(nest.flatten(mine), nest.flatten(one)):
                assert a.dtype == b.dtype and torch.equal(a, b)
    assert envs.pop_episode_statistics() == [
        s for env in singles for s in env.pop_episode_statistics()
    ]
    with pytest.raises(ValueError, match=r"\(K, num_envs"):
        envs.step(action[0])
    envs.close()
    for env in singles:
        env.close()


def test_acting_without_the_fast_path_draws_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    from alf_entropy import accel
    from alf_entropy.data_structures import TimeStep

    agents = ManyAgents(*_specs(), SEEDS, algorithm_ctor=PPO)
    states = [g.get_state() for g in agents.generators]
    time_step = TimeStep(observation=torch.randn(len(SEEDS), 6, 4))
    with torch.no_grad():
        fast = agents.rollout_step(time_step)
        for g, state in zip(agents.generators, states):
            g.set_state(state)
        monkeypatch.setattr(accel, "ENABLED", False)
        slow = agents.rollout_step(time_step)
    assert torch.equal(fast.output, slow.output)
    torch.testing.assert_close(fast.info.log_prob, slow.info.log_prob)


def test_continuous_actions_follow_the_single_runs() -> None:
    """Pendulum: a state-dependent std (every parameter in an nn.Linear) stacks; agent k
    draws its Normal samples from its own generator as the single run does."""
    ctor = functools.partial(
        PPOAlgorithm,
        enforce_entropy_target=True,
        actor_network_ctor=functools.partial(ActorDistributionNetwork, state_dependent_std=True),
    )
    agents, losses, actions = _batched_run(ctor, SEEDS[:2], env_id="Pendulum-v1")
    for k, seed in enumerate(SEEDS[:2]):
        single, single_losses, single_actions = _single_run(ctor, seed, env_id="Pendulum-v1")
        torch.testing.assert_close(actions[:, k], single_actions, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(losses[:, k], single_losses, rtol=1e-5, atol=1e-5)


def test_agent_k_starts_as_the_trainer_with_seed_k(tmp_path: Any) -> None:
    """The contract with OnPolicyTrainer: a trainer with seed k builds agent k's parameters,
    and its global generator, when training starts, is agent k's generator."""
    from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

    agents = ManyAgents(*_specs(), SEEDS[:2], algorithm_ctor=PPO)
    for k, seed in enumerate(SEEDS[:2]):
        trainer = OnPolicyTrainer(
            str(tmp_path / f"seed={seed}"),
            env_id=ENV,
            num_envs=NUM_ENVS,
            algorithm_ctor=PPO,
            num_iterations=1,
            seed=seed,
            progress_bar=False,
            device="cpu",
        )
        single = trainer.algorithm.state_dict()
        mine = agents.agent_state_dict(k)
        for name, value in single.items():
            assert torch.equal(mine[name], value), name
        assert torch.equal(agents.generators[k].get_state(), torch.get_rng_state())


def test_the_batch_resumes_exactly() -> None:
    """Everything a checkpoint of the batch holds -- the module's state_dict (networks,
    controller, skip counts), BatchedAdam's, each agent's generator and environments --
    continues bit for bit in a freshly built batch."""
    seeds = SEEDS[:2]

    def _iteration(agents: ManyAgents, envs: AgentEnvs, time_step: Any) -> Any:
        experiences = []
        with torch.inference_mode():
            for _ in range(UNROLL):
                step = agents.rollout_step(time_step)
                experiences.append(make_experience(time_step, step))
                time_step = envs.step(step.output)
        agents.train_from_unroll(stack_experiences(experiences), time_step)
        return time_step

    def _build() -> Tuple[ManyAgents, AgentEnvs]:
        envs = AgentEnvs(ENV, NUM_ENVS, seeds)
        return ManyAgents(envs.observation_spec, envs.action_spec, seeds, PPO), envs

    agents, envs = _build()
    time_step = _iteration(agents, envs, envs.reset())
    saved = (
        copy.deepcopy(agents.state_dict()),
        copy.deepcopy(agents.algorithm.optimizers()[0].state_dict()),
        [g.get_state() for g in agents.generators],
        envs.get_state(),
        time_step,
    )
    _iteration(agents, envs, time_step)

    resumed, resumed_envs = _build()
    state, optimizer_state, generator_states, env_states, time_step = saved
    resumed.load_state_dict(state)
    resumed.algorithm.optimizers()[0].load_state_dict(optimizer_state)
    for generator, generator_state in zip(resumed.generators, generator_states):
        generator.set_state(generator_state)
    resumed_envs.set_state(env_states)
    _iteration(resumed, resumed_envs, time_step)
    for name, value in agents.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
