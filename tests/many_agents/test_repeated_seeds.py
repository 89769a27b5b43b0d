"""One process holds a target sweep: seeds repeat across targets (``target_entropy=T+seed=N``).

Agents with the same seed and their own targets start alike (the single runs with that
seed do) and each follows the single run with its seed and target; the report groups
them as the unpacked sweep's targets x seeds.
"""

import functools
from typing import Any

import pytest
import torch

from alf_entropy.algorithms.agent_batch import check_agent_seeds
from alf_entropy.algorithms.many_sac_agents import ManySacAgents
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.controllers import PIDEntropyTargetAlgorithm, SGDEntropyTargetAlgorithm
from alf_entropy.experiments.report import find_runs, load_run, write_report
from alf_entropy.trainers.off_policy_trainer import OffPolicyTrainer
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer
from tests.controller_replay import assert_log_alpha_close, record_updates
from tests.many_agents.test_many_sac_agents import (
    PENDULUM_ACTION,
    PENDULUM_OBS,
    SAC,
    TRAINER,
    _max_diff,
    _recording,
    _train,
)
from tests.trainers.test_many_agents_trainer import SMALL, _recording_losses, _single

pytestmark = pytest.mark.usefixtures("one_thread")

SEEDS = [0, 1, 0, 1]


def _networks(state: dict) -> dict:
    """The agent's network parameters (not its controller's, whose targets differ)."""
    return {
        n: v
        for n, v in state.items()
        if "entropy_target" not in n and isinstance(v, torch.Tensor) and v.is_floating_point()
    }


def _same_start(trainer: Any) -> None:
    for k, j in [(0, 2), (1, 3)]:  # one seed, two targets: identical parameters
        mine, theirs = (_networks(trainer.algorithm.agent_state_dict(i)) for i in (k, j))
        assert mine and mine.keys() == theirs.keys()
        assert all(torch.equal(mine[n], theirs[n]) for n in mine)
    assert torch.equal(
        trainer.algorithm.generators[0].get_state(), trainer.algorithm.generators[2].get_state()
    )
    assert not all(
        torch.equal(a, b)
        for a, b in zip(
            _networks(trainer.algorithm.agent_state_dict(0)).values(),
            _networks(trainer.algorithm.agent_state_dict(1)).values(),
        )
    )


def _report_groups(root: Any, tmp_path: Any, names: list) -> None:
    """The report reads 4 runs, 2 targets x 2 seeds, grouped by target as a sweep's."""
    runs = find_runs([str(root)])
    assert [r[len(str(root)) + 1 :] for r in runs] == sorted(names)
    loaded = {r[len(str(root)) + 1 :]: load_run(r) for r in runs}
    assert [loaded[n].seed for n in names] == SEEDS
    groups = [loaded[n].group for n in names]
    assert groups[0] == groups[1] != groups[2] == groups[3]
    rows = write_report([str(root)], str(tmp_path / "report"))["rows"]
    by_group: dict = {}
    for row in rows:
        by_group.setdefault(row["group"], []).append(row["seed"])
    assert sorted(map(sorted, by_group.values())) == [[0, 1], [0, 1]]


def test_argument_errors() -> None:
    assert check_agent_seeds([0, 1, 0, 1], [0.3, 0.3, 0.6, 0.6]) == SEEDS
    with pytest.raises(ValueError, match="seeds must be distinct unless target_entropies"):
        check_agent_seeds([0, 0])
    with pytest.raises(
        ValueError, match="distinct \\(target, seed\\) pairs, got target_entropy=0.3\\+seed=0 twice"
    ):
        check_agent_seeds([0, 0, 1], [0.3, 0.3, 0.3])
    with pytest.raises(ValueError, match="seeds must be distinct unless target_entropies"):
        ManySacAgents(
            PENDULUM_OBS, PENDULUM_ACTION, [1, 1], algorithm_ctor=SAC, target_entropies=[-1.0, -1.0]
        )
    agents = ManySacAgents(
        PENDULUM_OBS, PENDULUM_ACTION, [1, 1], algorithm_ctor=SAC, target_entropies=[-1.0, -0.5]
    )
    assert agents.seeds == [1, 1]
    assert agents.entropy_target_algorithm.target_entropy.tolist() == [-1.0, -0.5]


def test_ppo_target_sweep_in_one_process(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    record_updates(monkeypatch)
    ctor = functools.partial(
        PPOAlgorithm, enforce_entropy_target=True, entropy_target_cls=PIDEntropyTargetAlgorithm
    )
    targets = [0.3, 0.3, 0.6, 0.6]
    root = tmp_path / "batch"
    common = dict(SMALL, algorithm_ctor=ctor, num_iterations=1, summary_interval=1)
    trainer = OnPolicyTrainer(str(root), seeds=SEEDS, target_entropies=targets, **common)
    names = [
        "target_entropy=0.3+seed=0",
        "target_entropy=0.3+seed=1",
        "target_entropy=0.6+seed=0",
        "target_entropy=0.6+seed=1",
    ]
    assert trainer.agent_dirs == names and trainer.seeds == SEEDS
    _same_start(trainer)
    losses = _recording_losses(trainer)
    trainer.train()
    losses = torch.stack(losses)
    for k, (seed, target) in enumerate(zip(SEEDS, targets)):
        single_ctor = functools.partial(
            ctor,
            entropy_target_cls=functools.partial(PIDEntropyTargetAlgorithm, target_entropy=target),
        )
        single, single_losses = _single(
            tmp_path / f"t{target}", seed, **dict(common, algorithm_ctor=single_ctor)
        )
        torch.testing.assert_close(losses[:, k], single_losses, rtol=1e-5, atol=1e-5)
        assert_log_alpha_close(
            trainer.algorithm.entropy_target_algorithm, k, single.algorithm.entropy_target_algorithm
        )
    assert not torch.equal(losses[:, 0], losses[:, 2])  # same start, own targets
    _report_groups(root, tmp_path, names)


def test_sac_target_sweep_in_one_process(tmp_path: Any) -> None:
    targets = [-1.0, -1.0, -0.5, -0.5]
    ctor = functools.partial(SAC, entropy_target_cls=SGDEntropyTargetAlgorithm)
    root = tmp_path / "batch"
    common = dict(algorithm_ctor=ctor, num_iterations=12)
    batch = OffPolicyTrainer(
        str(root), seeds=SEEDS, target_entropies=targets, **{**TRAINER, **common}
    )
    names = [
        "target_entropy=-1.0+seed=0",
        "target_entropy=-1.0+seed=1",
        "target_entropy=-0.5+seed=0",
        "target_entropy=-0.5+seed=1",
    ]
    assert batch.agent_dirs == names
    _same_start(batch)
    losses = _recording(batch)
    batch.train()
    losses = torch.stack(losses)
    for k, (seed, target) in enumerate(zip(SEEDS, targets)):
        single_ctor = functools.partial(
            SAC,
            entropy_target_cls=functools.partial(SGDEntropyTargetAlgorithm, target_entropy=target),
        )
        single, single_losses = _train(
            tmp_path / f"t{target}s{seed}", seed=seed, **dict(common, algorithm_ctor=single_ctor)
        )
        torch.testing.assert_close(losses[:, k], single_losses, rtol=1e-5, atol=1e-5)
        assert _max_diff(batch.algorithm.agent_state_dict(k), single.algorithm.state_dict()) < 1e-5
    _report_groups(root, tmp_path, names)
