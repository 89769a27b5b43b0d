"""``alf-entropy-sweep --pack_targets``: a target sweep (targets x seeds) as one process.

The fast tests check which runs are packed and how (no training); the slow one runs a
tiny 2 targets x 2 seeds sweep packed and unpacked and compares the runs, the report
rows and the first iteration's summaries.
"""

import json
import os

import pytest

from alf_entropy.config.bindings import read_bindings
from alf_entropy.experiments import packing, report, sweep, sweep_spec
from tests.experiments.test_sweep_packing import REPO_ROOT, TINY, _scalars

TARGET = "EntropyTargetAlgorithm.target_entropy"


def _spec(**extra):
    spec = {
        "gin_file": ["ppo_cartpole.gin"],
        "gin_param": list(TINY),
        "parameters": {TARGET: [0.67, 0.69]},
        "seeds": [0, 1],
    }
    spec.update(extra)
    return sweep_spec.check_spec(spec)


def _pack(spec, sweep_dir, runs=None):
    notes = []
    runs = runs or sweep_spec.expand_spec(spec, sweep_dir)
    return runs, packing.pack_seeds(runs, spec, sweep_dir, log=notes.append, targets=True), notes


def _params(task):
    return [task.command[i + 1] for i, a in enumerate(task.command) if a == "--gin_param"]


def test_targets_and_seeds_are_one_process(tmp_path):
    runs, tasks, notes = _pack(_spec(), str(tmp_path))
    assert notes == [] and len(tasks) == 1
    task = tasks[0]
    assert task.name == "target_entropy=0.67_0.69+seeds=0_1"
    assert task.root_dir == os.path.join(str(tmp_path), packing.PACKED_DIR, task.name)
    assert task.members == runs and task.targets == [0.67, 0.67, 0.69, 0.69]
    params = _params(task)
    assert params[-3:] == [
        "OnPolicyTrainer.seeds = [0, 1, 0, 1]",
        f"{TARGET} = 0.67",
        "OnPolicyTrainer.target_entropies = [0.67, 0.67, 0.69, 0.69]",
    ]
    assert [p for p in params if p.startswith(TARGET)] == [f"{TARGET} = 0.67"]
    # Each agent's directory links to its run's root dir, named as the trainer names it.
    packing.link_agent_dirs(task)
    for run in runs:
        link = os.path.join(task.root_dir, run.name)  # target_entropy=T+seed=N
        assert os.path.realpath(link) == os.path.realpath(run.root_dir)


def test_other_axes_stay_separate_processes(tmp_path):
    spec = _spec(
        parameters={TARGET: [0.67, 0.69], "EntropyTargetAlgorithm.fast_update_rate": [0.1, 0.69]}
    )
    runs, tasks, notes = _pack(spec, str(tmp_path))
    assert notes == []
    assert [t.name for t in tasks] == [
        "fast_update_rate=0.1+target_entropy=0.67_0.69+seeds=0_1",
        "fast_update_rate=0.69+target_entropy=0.67_0.69+seeds=0_1",
    ]
    for task in tasks:
        rate = _params(task)[len(TINY)]
        assert rate.startswith("EntropyTargetAlgorithm.fast_update_rate = ")
        assert all(rate in r.bindings for r in task.members) and len(task.members) == 4


def test_what_is_left_is_packed_by_its_agents(tmp_path):
    spec = _spec()
    runs = sweep_spec.expand_spec(spec, str(tmp_path))
    os.makedirs(os.path.join(runs[0].root_dir, "checkpoints"))  # resumes alone
    _, tasks, notes = _pack(spec, str(tmp_path), runs)
    assert [t.name for t in tasks] == [runs[0].name, "target_entropy_seed=0.67=1_0.69=0_0.69=1"]
    assert tasks[1].targets == [0.67, 0.69, 0.69] and "resumes alone" in notes[0]
    assert "OnPolicyTrainer.seeds = [1, 0, 1]" in _params(tasks[1])
    # One target left: the seeds alone, as --pack_seeds packs them.
    left = [r for r in runs if "0.69" in r.name]
    _, tasks, _ = _pack(spec, str(tmp_path), left)
    assert [(t.name, t.command) for t in tasks] == [
        (t.name, t.command) for t in packing.pack_seeds(left, spec, str(tmp_path))
    ]
    assert tasks[0].targets == [None, None]


@pytest.mark.parametrize(
    "parameters,why",
    [
        ({TARGET: ["@LinearScheduler()", 0.6]}, "values other than finite numbers"),
        ({"Foo.target_entropy": [0.5, 0.6]}, "no controller's unscoped target_entropy"),
        ({"EntropyTargetAlgorithm.fast_update_rate": [0.1, 0.69]}, "0 target_entropy bindings"),
    ],
)
def test_falls_back_to_packing_seeds(tmp_path, parameters, why):
    spec = _spec(parameters=parameters)
    runs, tasks, notes = _pack(spec, str(tmp_path))
    assert len(notes) == 1 and why in notes[0] and "packing the seeds" in notes[0]
    assert [(t.name, t.command) for t in tasks] == [
        (t.name, t.command) for t in packing.pack_seeds(runs, spec, str(tmp_path))
    ]


def test_cli_flag_reaches_the_sweep(tmp_path, monkeypatch):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({"parameters": {TARGET: [0.5, 0.6]}, "seeds": [0, 1]}))
    seen = []
    monkeypatch.setattr(
        sweep, "run_sweep", lambda *args, **kwargs: seen.append(kwargs) or {"failed": []}
    )
    base = ["--spec", str(spec_path), "--sweep_dir", str(tmp_path / "s")]
    assert sweep.main(base + ["--pack_targets"]) == 0 and seen[-1]["pack_targets"] is True
    assert sweep.main(base) == 0 and seen[-1]["pack_targets"] is False


@pytest.mark.slow
def test_packed_target_sweep_is_the_unpacked_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    spec = _spec()
    names = [
        "target_entropy=0.67+seed=0",
        "target_entropy=0.67+seed=1",
        "target_entropy=0.69+seed=0",
        "target_entropy=0.69+seed=1",
    ]
    results, dirs = {}, {}
    for mode in ("unpacked", "packed"):
        dirs[mode] = str(tmp_path / mode)
        lines = []
        results[mode] = sweep.run_sweep(
            spec, dirs[mode], jobs=2, pack_targets=mode == "packed", log=lines.append
        )
        assert results[mode]["failed"] == [] and sorted(results[mode]["status"]) == names, lines
        assert report.find_runs([dirs[mode]]) == [os.path.join(dirs[mode], n) for n in names]
        for run in results[mode]["runs"]:
            with open(os.path.join(run.root_dir, sweep.DONE_FILE)) as f:
                assert json.load(f)["command"] == run.command  # its own, packed or not
    assert any("into one process" in line for line in lines)
    packed_root = os.path.join(
        dirs["packed"], packing.PACKED_DIR, "target_entropy=0.67_0.69+seeds=0_1"
    )
    assert {"checkpoints", "train.log", *names} <= set(os.listdir(packed_root))
    # The same report rows: runs, seeds and groups (2 targets x 2 seeds).
    rows = {mode: results[mode]["report"]["rows"] for mode in results}
    for mode in rows:
        assert sorted((r["run"], r["seed"], r["group"]) for r in rows[mode]) == sorted(
            (r["run"], r["seed"], r["group"]) for r in rows["unpacked"]
        )
        assert len({r["group"] for r in rows[mode]}) == 2
        assert all(r["env_steps"] == 2 * 16 * 2 for r in rows[mode])
    # Agent k's first iteration is the single run's (float rounding aside), its
    # operative config the run's own bindings.
    for name in names:
        configs = [
            read_bindings(open(os.path.join(dirs[mode], name, "operative_config.gin")).read())
            for mode in ("packed", "unpacked")
        ]
        assert list(configs[0].items()) == list(configs[1].items())
        mine = _scalars(os.path.join(dirs["packed"], name))
        theirs = _scalars(os.path.join(dirs["unpacked"], name))
        for tag in (
            "loss/total",
            "loss/pg",
            "loss/td",
            "entropy",
            "alpha",
            "target_entropy",
            "env_steps",
        ):
            assert list(mine[tag][0]) == list(theirs[tag][0]) == [0, 1], tag
            assert mine[tag][1][0] == pytest.approx(theirs[tag][1][0], rel=1e-5, abs=1e-5), tag
    # Done is done: a rerun, packed or not, skips every run.
    for pack_targets in (True, False):
        again = sweep.run_sweep(
            spec, dirs["packed"], pack_targets=pack_targets, report=False, log=lambda line: None
        )
        assert sorted(again["skipped"]) == names and again["status"] == {}
