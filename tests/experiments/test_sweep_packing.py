"""``alf-entropy-sweep --pack_seeds``: the seeds of a configuration as one process.

The fast tests check which runs are packed and how (no training); the slow one
runs a tiny sweep packed and unpacked and compares the run directories, the
report and the first iteration's summaries.
"""

import json
import os

import pytest

from alf_entropy.experiments import packing, report, sweep, sweep_spec

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = [
    "OnPolicyTrainer.num_env_steps = None",
    "OnPolicyTrainer.num_iterations = 2",
    "OnPolicyTrainer.unroll_length = 16",
    "OnPolicyTrainer.num_envs = 2",
    "OnPolicyTrainer.summary_interval = 1",
    "OnPolicyTrainer.eval_interval = None",
    "OnPolicyTrainer.checkpoint_interval = 1",
    "OnPolicyTrainer.progress_bar = False",
    "PPOAlgorithm.num_epochs = 1",
    "PPOAlgorithm.num_minibatches = 2",
]


def _spec(seeds=(0, 1), **extra):
    spec = {
        "gin_file": ["ppo_cartpole.gin"],
        "gin_param": list(TINY),
        "parameters": {"EntropyTargetAlgorithm.target_entropy": [0.67, 0.69]},
        "seeds": list(seeds),
    }
    spec.update(extra)
    return sweep_spec.check_spec(spec)


def _pack(spec, sweep_dir):
    notes = []
    runs = sweep_spec.expand_spec(spec, sweep_dir)
    return runs, packing.pack_seeds(runs, spec, sweep_dir, log=notes.append), notes


def test_packs_the_seeds_of_each_configuration(tmp_path):
    sweep_dir = str(tmp_path)
    runs, tasks, notes = _pack(_spec(), sweep_dir)
    assert notes == []
    assert [t.name for t in tasks] == [
        "target_entropy=0.67+seeds=0_1",
        "target_entropy=0.69+seeds=0_1",
    ]
    task = tasks[0]
    assert task.root_dir == os.path.join(sweep_dir, packing.PACKED_DIR, task.name)
    assert [r.name for r in task.members] == [
        "target_entropy=0.67+seed=0",
        "target_entropy=0.67+seed=1",
    ]
    params = [task.command[i + 1] for i, a in enumerate(task.command) if a == "--gin_param"]
    assert "OnPolicyTrainer.seeds = [0, 1]" in params
    assert "EntropyTargetAlgorithm.target_entropy = 0.67" in params
    assert not any(p.startswith("OnPolicyTrainer.seed ") for p in params)
    assert task.command[task.command.index("--root_dir") + 1] == task.root_dir
    # The agents' dirs (seed=N under the process's root) are links to the runs' dirs.
    packing.link_agent_dirs(task)
    for run in task.members:
        link = os.path.join(task.root_dir, f"seed={run.seed}")
        assert os.path.islink(link)
        assert os.path.realpath(link) == os.path.realpath(run.root_dir)
    packing.link_agent_dirs(task)  # again: already there
    os.unlink(os.path.join(task.root_dir, "seed=1"))
    os.makedirs(os.path.join(task.root_dir, "seed=1"))
    with pytest.raises(ValueError, match="not a link"):
        packing.link_agent_dirs(task)


def test_no_parameters_packs_every_seed(tmp_path):
    _, tasks, _ = _pack(_spec(seeds=[3, 1, 2], parameters={}), str(tmp_path))
    assert [t.name for t in tasks] == ["seeds=3_1_2"]
    assert [r.name for r in tasks[0].members] == ["seed=3", "seed=1", "seed=2"]


@pytest.mark.parametrize(
    "extra, why",
    [
        ({"seed_binding": "PPOAlgorithm.seed"}, "only OnPolicyTrainer.seed and OffPolicyTrainer"),
        (
            {"gin_param": TINY + ["OnPolicyTrainer.num_agents = 2"]},
            "binds OnPolicyTrainer.num_agents",
        ),
        ({"parameters": {"OnPolicyTrainer.target_entropies": [[0.5, 0.6]]}}, "target_entropies"),
    ],
)
def test_falls_back_to_one_process_per_run(tmp_path, extra, why):
    runs, tasks, notes = _pack(_spec(**extra), str(tmp_path))
    assert tasks == runs and all(not t.members for t in tasks)
    assert len(notes) == 1 and why in notes[0] and "one process per run" in notes[0]


def test_single_seeds_and_runs_with_checkpoints_stay_alone(tmp_path):
    sweep_dir = str(tmp_path)
    runs, tasks, _ = _pack(_spec(seeds=[0]), sweep_dir)
    assert tasks == runs
    runs = sweep_spec.expand_spec(_spec(seeds=[0, 1, 2]), sweep_dir)
    os.makedirs(os.path.join(runs[0].root_dir, "checkpoints"))  # interrupted, unpacked
    notes = []
    tasks = packing.pack_seeds(runs, _spec(seeds=[0, 1, 2]), sweep_dir, log=notes.append)
    assert [t.name for t in tasks] == [
        "target_entropy=0.67+seed=0",
        "target_entropy=0.67+seeds=1_2",
        "target_entropy=0.69+seeds=0_1_2",
    ]
    assert notes == [
        f"{sweep.PROG}: not packing target_entropy=0.67+seed=0: it has "
        "checkpoints of its own (resumes alone)"
    ]


def _scalars(run_dir):
    return report.load_run(run_dir).scalars


@pytest.mark.slow
def test_packed_sweep_is_the_unpacked_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    spec = _spec(parameters={"EntropyTargetAlgorithm.target_entropy": [0.67]})
    results, dirs = {}, {}
    for mode in ("unpacked", "packed"):
        dirs[mode] = str(tmp_path / mode)
        lines = []
        results[mode] = sweep.run_sweep(
            spec, dirs[mode], jobs=2, pack=mode == "packed", log=lines.append
        )
        assert results[mode]["failed"] == [], lines
    names = ["target_entropy=0.67+seed=0", "target_entropy=0.67+seed=1"]
    for mode in ("unpacked", "packed"):
        assert sorted(results[mode]["status"]) == names
        assert report.find_runs([dirs[mode]]) == [os.path.join(dirs[mode], n) for n in names]
        for name in names:
            with open(os.path.join(dirs[mode], name, sweep.DONE_FILE)) as f:
                marker = json.load(f)
            # The marker holds the run's own command, packed or not.
            run = next(r for r in results[mode]["runs"] if r.name == name)
            assert marker["command"] == run.command
            assert os.path.isdir(os.path.join(dirs[mode], name, "train"))
    # The packed process's own dir: checkpoints, config and log, and the agents' links.
    packed_root = os.path.join(dirs["packed"], packing.PACKED_DIR, "target_entropy=0.67+seeds=0_1")
    assert {"checkpoints", "train.log", "seed=0", "seed=1"} <= set(os.listdir(packed_root))
    # The report reads the same runs, grouped alike (the seeds of the target as one curve).
    rows = {mode: results[mode]["report"]["rows"] for mode in results}
    for mode in rows:
        assert sorted(r["run"] for r in rows[mode]) == names
        assert len({r["group"] for r in rows[mode]}) == 1
        assert all(r["env_steps"] == 2 * 16 * 2 for r in rows[mode])
    # Each agent's operative config is its run's: the same seeds, the same groups.
    assert sorted((r["run"], r["seed"], r["group"]) for r in rows["packed"]) == sorted(
        (r["run"], r["seed"], r["group"]) for r in rows["unpacked"]
    )
    assert sorted(r["seed"] for r in rows["packed"]) == [0, 1]
    # Agent k's first iteration is the single run's (float rounding aside).
    for name in names:
        mine = _scalars(os.path.join(dirs["packed"], name))
        theirs = _scalars(os.path.join(dirs["unpacked"], name))
        for tag in ("loss/total", "loss/pg", "loss/td", "entropy", "alpha", "env_steps"):
            assert list(mine[tag][0]) == list(theirs[tag][0]) == [0, 1], tag
            assert mine[tag][1][0] == pytest.approx(theirs[tag][1][0], rel=1e-5, abs=1e-5), tag
    # Done is done, whichever way it ran: a rerun (packed or not) skips every run.
    for mode in ("packed", "unpacked"):
        again = sweep.run_sweep(
            spec, dirs["packed"], pack=mode == "packed", report=False, log=lambda line: None
        )
        assert sorted(again["skipped"]) == names and again["status"] == {}
    # A packed process that stopped before writing its markers is started again
    # under the same root dir and resumes from its checkpoint (here: the last
    # one, so it only writes the markers; no summaries are written twice).
    for name in names:
        os.remove(os.path.join(dirs["packed"], name, sweep.DONE_FILE))
    again = sweep.run_sweep(spec, dirs["packed"], pack=True, report=False, log=lambda line: None)
    assert again["status"] == {name: 0 for name in names}
    for name in names:
        assert os.path.isfile(os.path.join(dirs["packed"], name, sweep.DONE_FILE))
        assert list(_scalars(os.path.join(dirs["packed"], name))["loss/total"][0]) == [0, 1]


def test_cli_flag_reaches_the_sweep(tmp_path, monkeypatch):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({"parameters": {}, "seeds": [0, 1]}))
    seen = []
    monkeypatch.setattr(
        sweep, "run_sweep", lambda *args, **kwargs: seen.append(kwargs) or {"failed": []}
    )
    base = ["--spec", str(spec_path), "--sweep_dir", str(tmp_path / "s")]
    assert sweep.main(base + ["--pack_seeds"]) == 0 and seen[-1]["pack"] is True
    assert sweep.main(base) == 0 and seen[-1]["pack"] is False
