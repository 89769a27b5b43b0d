"""OnPolicyTrainer with K agents: agent k is the single run with seed k; each agent is a run."""

import functools
import os
import random
from typing import Any, List, Tuple

import gin
import pytest
import torch

from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.controllers import PIDEntropyTargetAlgorithm
from alf_entropy.trainers import Callback
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer
from alf_entropy.trainers.ranks import MAX_SEED
from alf_entropy.utils import summary
from tests.controller_replay import assert_log_alpha_close, record_updates
from tests.many_agents.test_many_agents import record_update_losses
from tests.trainers.test_exact_resume import assert_same_final_checkpoint, run_killing

pytestmark = pytest.mark.usefixtures("one_thread")

PPO = functools.partial(PPOAlgorithm, enforce_entropy_target=True)
SMALL = dict(
    env_id="CartPole-v1",
    num_envs=4,
    unroll_length=16,
    algorithm_ctor=PPO,
    progress_bar=False,
    device="cpu",
    checkpoint_interval=None,
)


def _recording_losses(trainer: OnPolicyTrainer) -> List[torch.Tensor]:
    """Record every update's loss: ``[K]`` per update for K agents, a scalar for one."""
    alg = trainer.algorithm
    return record_update_losses(alg.algorithm if trainer.num_agents > 1 else alg)


def _max_param_diff(a: dict, b: dict) -> float:
    return max(
        float((a[n].double() - b[n].double()).abs().max()) for n in b if b[n].is_floating_point()
    )


def _single(tmp_path: Any, seed: int, **kwargs: Any) -> Tuple[OnPolicyTrainer, torch.Tensor]:
    trainer = OnPolicyTrainer(str(tmp_path / f"single{seed}"), seed=seed, **{**SMALL, **kwargs})
    losses = _recording_losses(trainer)
    trainer.train()
    return trainer, torch.stack(losses)


def test_agent_k_of_a_batch_follows_the_single_trainer_with_seed_k(tmp_path: Any) -> None:
    trainer = OnPolicyTrainer(
        str(tmp_path / "batch"), seed=3, num_agents=3, num_iterations=1, **SMALL
    )
    assert trainer.num_agents == 3 and trainer.seeds == [3, 4, 5]
    losses = _recording_losses(trainer)
    result = trainer.train()
    assert result["iteration"] == 1 and result["env_steps"] == 16 * 4  # one agent's steps
    losses = torch.stack(losses)
    for k, seed in enumerate(trainer.seeds):
        single, single_losses = _single(tmp_path, seed, num_iterations=1)
        assert losses.shape[0] == single_losses.shape[0]  # every update of the iteration
        torch.testing.assert_close(losses[:, k], single_losses, rtol=1e-5, atol=1e-5)
        assert (
            _max_param_diff(trainer.algorithm.agent_state_dict(k), single.algorithm.state_dict())
            < 1e-6
        )


def test_explicit_seeds_and_targets(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    record_updates(monkeypatch)
    ctor = functools.partial(
        PPOAlgorithm, enforce_entropy_target=True, entropy_target_cls=PIDEntropyTargetAlgorithm
    )
    targets = [0.3, 0.6]
    trainer = OnPolicyTrainer(
        str(tmp_path / "batch"),
        seeds=[7, 2],
        target_entropies=targets,
        num_iterations=1,
        **{**SMALL, "algorithm_ctor": ctor},
    )
    assert trainer.agent_dirs == ["target_entropy=0.3+seed=7", "target_entropy=0.6+seed=2"]
    losses = _recording_losses(trainer)
    trainer.train()
    losses = torch.stack(losses)
    for k, (seed, target) in enumerate(zip([7, 2], targets)):
        single_ctor = functools.partial(
            ctor,
            entropy_target_cls=functools.partial(PIDEntropyTargetAlgorithm, target_entropy=target),
        )
        single, single_losses = _single(
            tmp_path, seed, num_iterations=1, algorithm_ctor=single_ctor
        )
        torch.testing.assert_close(losses[:, k], single_losses, rtol=1e-5, atol=1e-5)
        assert_log_alpha_close(
            trainer.algorithm.entropy_target_algorithm, k, single.algorithm.entropy_target_algorithm
        )


def test_argument_errors(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(tmp_path / "r")
    with pytest.raises(ValueError, match="num_agents"):
        OnPolicyTrainer(root, num_agents=0, num_iterations=1, **SMALL)
    with pytest.raises(ValueError, match="seed \\+ num_agents - 1"):
        OnPolicyTrainer(root, num_agents=3, seed=MAX_SEED - 2, num_iterations=1, **SMALL)
    with pytest.raises(ValueError, match="distinct"):
        OnPolicyTrainer(root, seeds=[1, 1], num_iterations=1, **SMALL)
    with pytest.raises(ValueError, match="at least two"):
        OnPolicyTrainer(root, seeds=[1], num_iterations=1, **SMALL)
    with pytest.raises(ValueError, match="num_agents is 3 but seeds has 2"):
        OnPolicyTrainer(root, num_agents=3, seeds=[1, 2], num_iterations=1, **SMALL)
    with pytest.raises(ValueError, match="target_entropies needs num_agents > 1"):
        OnPolicyTrainer(root, target_entropies=[0.3], num_iterations=1, **SMALL)
    with pytest.raises(ValueError, match="target_entropies has 1 entries for 2"):
        OnPolicyTrainer(root, num_agents=2, target_entropies=[0.3], num_iterations=1, **SMALL)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="several ranks"):
        OnPolicyTrainer(root, num_agents=2, num_iterations=1, **SMALL)


def test_num_agents_is_bound_in_gin(tmp_path: Any) -> None:
    import gin

    gin.parse_config("OnPolicyTrainer.num_agents = 2")
    trainer = OnPolicyTrainer(str(tmp_path / "batch"), seed=4, num_iterations=1, **SMALL)
    assert trainer.seeds == [4, 5] and trainer.algorithm.num_agents == 2


def _scalars(run_dir: str) -> dict:
    from alf_entropy.experiments.report import load_run

    return load_run(run_dir).scalars


def test_each_agent_is_a_run_the_report_reads(tmp_path: Any) -> None:
    """Agent k's summaries are a run of their own (root/target_entropy=T+seed=N): the
    report finds K runs, computes their control metrics, and agent k's first summaries are
    the single run's."""
    from alf_entropy.experiments.report import find_runs, load_run, run_metrics, write_report

    ctor = functools.partial(
        PPOAlgorithm, enforce_entropy_target=True, entropy_target_cls=PIDEntropyTargetAlgorithm
    )
    targets, seeds = [0.3, 0.6, 0.6], [1, 2, 3]
    root = tmp_path / "batch"
    common = dict(
        SMALL,
        algorithm_ctor=ctor,
        num_iterations=4,
        summary_interval=1,
        eval_interval=2,
        num_eval_episodes=2,
    )
    trainer = OnPolicyTrainer(str(root), seeds=seeds, target_entropies=targets, **common)
    result = trainer.train()
    assert not (root / "train").exists()  # no run of its own: K runs below it
    runs = find_runs([str(root)])
    assert [r[len(str(root)) + 1 :] for r in runs] == sorted(trainer.agent_dirs)
    rows = [run_metrics(load_run(r)) for r in runs]
    # Each agent's operative config gives the report its seed; the seeds of one target
    # are one group (one curve), as a sweep's runs are.
    by_dir = {r[len(str(root)) + 1 :]: load_run(r) for r in runs}
    assert [by_dir[d].seed for d in trainer.agent_dirs] == seeds
    groups = [by_dir[d].group for d in trainer.agent_dirs]
    assert groups[1] == groups[2] != groups[0]
    assert sorted(row["seed"] for row in rows) == seeds
    assert all(row["env_steps"] == 4 * 16 * 4 for row in rows)
    report = write_report([str(root)], str(tmp_path / "report"))
    assert sorted(row["seed"] for row in report["rows"]) == seeds
    evals = []
    for k, seed in enumerate(seeds):
        mine = _scalars(str(root / trainer.agent_dirs[k]))
        for tag in (
            "loss/total",
            "entropy",
            "alpha",
            "target_entropy",
            "env_steps",
            "return",
            "eval/return",
        ):
            assert tag in mine, tag
        assert mine["target_entropy"][1][0] == pytest.approx(targets[k])
        assert list(mine["entropy"][0]) == [0, 1, 2, 3]
        assert list(mine["eval/return"][0]) == [0, 2, 4]
        evals.append(mine["eval/return"][1][-1])
        single_ctor = functools.partial(
            ctor,
            entropy_target_cls=functools.partial(
                PIDEntropyTargetAlgorithm, target_entropy=targets[k]
            ),
        )
        single_dir = tmp_path / f"single{seed}"
        OnPolicyTrainer(
            str(single_dir), seed=seed, **dict(common, algorithm_ctor=single_ctor, num_iterations=1)
        ).train()
        theirs = _scalars(str(single_dir))
        for tag in ("loss/total", "loss/pg", "loss/td", "entropy", "alpha"):
            assert mine[tag][1][0] == pytest.approx(theirs[tag][1][0], rel=1e-5, abs=1e-5), tag
        assert mine["eval/return"][1][0] == theirs["eval/return"][1][0]  # the untrained policy
    # eval/return in the metrics is the lowest agent's (stop_eval_return: all must reach it).
    assert result["eval_return"] == pytest.approx(min(evals))


def test_stop_eval_return_waits_for_every_agent(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alf_entropy.trainers import trainer as trainer_module

    solved = {1}  # agent seed 1 solves at once, agent seed 2 never

    def _episodes(env_id: str, policy: Any, num_episodes: int, **kw: Any) -> Any:
        return [[500.0 if s in solved else 10.0] * num_episodes for s in (1, 2)], None

    monkeypatch.setattr(trainer_module, "run_episodes", _episodes)  # each agent's returns
    common = dict(SMALL, num_iterations=3, eval_interval=1, stop_eval_return=400.0)
    result = OnPolicyTrainer(str(tmp_path / "a"), seeds=[1, 2], **common).train()
    assert result["iteration"] == 3 and result["eval_return"] == 10.0  # agent 2 kept going
    solved.add(2)
    result = OnPolicyTrainer(str(tmp_path / "b"), seeds=[1, 2], **common).train()
    assert result["iteration"] == 1 and result["eval_return"] == 500.0  # both solved


def _batch(root: Any, num_iterations: int) -> OnPolicyTrainer:
    ctor = functools.partial(
        PPOAlgorithm, enforce_entropy_target=True, num_epochs=2, num_minibatches=2
    )
    return OnPolicyTrainer(
        str(root),
        seeds=[3, 8],
        target_entropies=[0.4, 0.5],
        num_iterations=num_iterations,
        **dict(SMALL, algorithm_ctor=ctor, unroll_length=40, summary_interval=1),
    )


def test_the_batch_resumes_exactly(tmp_path: Any) -> None:
    """2 iterations, stop, resume for 1 more == 3 straight, bit for bit (parameters, Adam
    state, controllers, each agent's generator and environments)."""
    straight = _batch(tmp_path / "straight", 3)
    straight.train()
    first = _batch(tmp_path / "resumed", 2)
    assert first.train()["iteration"] == 2
    resumed = _batch(tmp_path / "resumed", 3)
    assert resumed.iteration == 2 and resumed.restored_from is not None
    result = resumed.train()
    assert result["iteration"] == 3 and result["env_steps"] == 3 * 40 * 4
    mine, theirs = resumed.algorithm.state_dict(), straight.algorithm.state_dict()
    assert mine.keys() == theirs.keys()
    for name, value in theirs.items():
        assert torch.equal(mine[name], value), name
    opt_mine = resumed.algorithm.optimizers()[0].state_dict()["state"]
    opt_theirs = straight.algorithm.optimizers()[0].state_dict()["state"]
    for key, state in opt_theirs.items():
        for name, value in state.items():
            assert torch.equal(opt_mine[key][name], value), (key, name)
    for g, h in zip(resumed.algorithm.generators, straight.algorithm.generators):
        assert torch.equal(g.get_state(), h.get_state())
    # Each agent's summaries continue its run: one value per iteration, none repeated.
    steps = _scalars(str(tmp_path / "resumed" / resumed.agent_dirs[1]))["entropy"][0]
    assert list(steps) == [0, 1, 2]


def test_a_checkpoint_of_other_agents_does_not_load(tmp_path: Any) -> None:
    _batch(tmp_path / "run", 1).train()
    with pytest.raises(ValueError, match="does not match this run"):
        OnPolicyTrainer(
            str(tmp_path / "run"),
            seeds=[3, 8, 9],
            num_iterations=2,
            **dict(SMALL, unroll_length=40, allow_config_change=True),
        )


_KILL_ITERATIONS = 12


def _train_batch_child(root_dir: str) -> None:
    """The batch's training "command" in a forked child: always the same arguments."""
    torch.set_num_threads(1)
    gin.clear_config()
    ctor = functools.partial(
        PPOAlgorithm, enforce_entropy_target=True, num_epochs=2, num_minibatches=2
    )
    OnPolicyTrainer(
        root_dir,
        seeds=[3, 8],
        num_iterations=_KILL_ITERATIONS,
        **dict(
            SMALL, algorithm_ctor=ctor, unroll_length=40, summary_interval=3, checkpoint_interval=1
        ),
    ).train()


@pytest.mark.slow
def test_sigkill_and_restart_of_the_batch_gives_the_uninterrupted_checkpoint(tmp_path: Any) -> None:
    run_killing(_train_batch_child, str(tmp_path / "reference"))
    assert (
        run_killing(
            _train_batch_child, str(tmp_path / "killed"), 2, random.Random(1), iteration_time=0.3
        )
        == 2
    )
    assert_same_final_checkpoint(
        str(tmp_path / "reference"), str(tmp_path / "killed"), _KILL_ITERATIONS
    )


def test_each_agent_has_the_operative_config_of_its_single_run(tmp_path: Any) -> None:
    """A K = 2 batch configured in gin, each agent with its own target: agent k's
    ``operative_config.gin`` holds the bindings, in order, of the config the single run
    with its seed and target writes, so the report fills its seed column and groups it
    exactly as that run."""
    from alf_entropy.config.bindings import read_bindings
    from alf_entropy.config.loading import CONFIG_DIR, parse_gin_config
    from alf_entropy.experiments.report import find_runs, write_report

    tiny = [
        "OnPolicyTrainer.num_env_steps = None",
        "OnPolicyTrainer.num_iterations = 1",
        "OnPolicyTrainer.unroll_length = 16",
        "OnPolicyTrainer.num_envs = 2",
        "OnPolicyTrainer.progress_bar = False",
        "OnPolicyTrainer.summary_interval = 1",
        "OnPolicyTrainer.eval_interval = None",
        "PPOAlgorithm.num_minibatches = 2",
        "EntropyTargetAlgorithm.target_entropy = 0.67",
    ]  # not the shipped schedule
    seeds, targets = [3, 4], [0.5, 0.6]
    parse_gin_config(
        [f"{CONFIG_DIR}/ppo_cartpole.gin"],
        tiny
        + [f"OnPolicyTrainer.seeds = {seeds}", f"OnPolicyTrainer.target_entropies = {targets}"],
    )
    root = tmp_path / "batch"
    batch = OnPolicyTrainer(str(root))
    batch.train()
    configs = [(root / d / "operative_config.gin").read_text() for d in batch.agent_dirs]
    for seed, target, config in zip(seeds, targets, configs):
        gin.clear_config()
        parse_gin_config(
            [f"{CONFIG_DIR}/ppo_cartpole.gin"],
            tiny
            + [
                f"OnPolicyTrainer.seed = {seed}",
                f"EntropyTargetAlgorithm.target_entropy = {target}",
            ],
        )
        single = tmp_path / f"single{seed}"
        OnPolicyTrainer(str(single))
        single_config = read_bindings((single / "operative_config.gin").read_text())
        assert list(read_bindings(config).items()) == list(single_config.items())
    rows = write_report(find_runs([str(root)]), str(tmp_path / "report"))["rows"]
    assert [(row["run"], row["seed"]) for row in rows] == list(zip(batch.agent_dirs, seeds))
    assert rows[0]["group"] != rows[1]["group"]


class _PerMemberStatistic(Callback):
    """Writes one per-member statistic as one ``[K]`` tensor, as a controller of K agents
    does (``summary.scalar(tag, value)``: element k to agent k's writer)."""

    def on_log(self, trainer: Any, logs: Any) -> None:
        summary.scalar("Controller/alpha", torch.arange(trainer.num_agents) + 1.0)


def _tags(run_dir: str) -> dict:
    """Each tag of ``run_dir``'s train events: its (step, value) points."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.join(run_dir, "train"), size_guidance={"scalars": 0})
    events.Reload()
    return {t: [(e.step, e.value) for e in events.Scalars(t)] for t in events.Tags()["scalars"]}


@pytest.mark.parametrize("k, controller", [(2, False), (3, False), (2, True)])
def test_each_agents_events_hold_the_single_runs_tags(
    tmp_path: Any, k: int, controller: bool
) -> None:
    """Agent j's event file holds the tags of the single run with its seed j, as many
    points each (not every agent's tags: K^2 writes), and the per-member value j + 1."""
    kwargs = dict(
        SMALL,
        algorithm_ctor=functools.partial(PPOAlgorithm, enforce_entropy_target=controller),
        num_iterations=2,
        summary_interval=1,
        eval_interval=2,
        num_eval_episodes=1,
        callbacks=[_PerMemberStatistic()],
    )
    batch = OnPolicyTrainer(str(tmp_path / "batch"), num_agents=k, **kwargs)
    batch.train()
    for j, name in enumerate(batch.agent_dirs):
        OnPolicyTrainer(str(tmp_path / name), seed=j, **kwargs).train()
        single = _tags(str(tmp_path / name))
        assert {"return", "loss/total", "eval/return", "Controller/alpha"} <= set(single)
        mine = _tags(str(tmp_path / "batch" / name))
        assert {t: len(p) for t, p in mine.items()} == {t: len(p) for t, p in single.items()}
        assert {v for _, v in mine["Controller/alpha"]} == {j + 1.0}


def test_agent_configs_keep_imports_every_scope_and_numpy_seeds(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's config keeps the batch's gin imports (a user's module registering its own
    configurables), gives every scope's trainer seed the agent's, and writes a NumPy seed
    as gin reads it."""
    import numpy as np

    from alf_entropy.config.bindings import read_bindings, read_imports
    from alf_entropy.trainers.agents import Agents

    batch = (
        "import my_pkg.configurables\n"
        "OnPolicyTrainer.seed = 0\n"
        "eval/OnPolicyTrainer.seed = 0\n"
        "OnPolicyTrainer.num_agents = 2\n"
        "ManyAgents.share = 1\n"
    )
    monkeypatch.setattr(gin, "operative_config_str", lambda: batch)
    agents = Agents(1, (np.int64(5), np.int64(6)), None, 0)
    for name in agents.dirs:
        (tmp_path / name).mkdir()
    controller = type("Ctl", (), {})()
    agents.write_configs(
        str(tmp_path), "OnPolicyTrainer", type("A", (), {"entropy_target_algorithm": controller})
    )
    text = (tmp_path / agents.dirs[1] / "operative_config.gin").read_text()
    assert read_imports(text) == ["my_pkg.configurables"]
    assert read_bindings(text) == {
        "OnPolicyTrainer.seed": "6",
        "eval/OnPolicyTrainer.seed": "6",
        "OnPolicyTrainer.num_agents": "1",
    }
