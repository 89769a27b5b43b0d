"""``alf-entropy-sweep --pack_seeds`` packs SAC seeds (``OffPolicyTrainer.seeds``) too."""

import os

import pytest

from alf_entropy.config.bindings import read_bindings
from alf_entropy.experiments import packing, report, sweep, sweep_spec

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY_SAC = [
    "OffPolicyTrainer.num_env_steps = None",
    "OffPolicyTrainer.num_iterations = 12",
    "OffPolicyTrainer.initial_collect_steps = 8",
    "OffPolicyTrainer.mini_batch_size = 16",
    "OffPolicyTrainer.summary_interval = 1",
    "OffPolicyTrainer.eval_interval = None",
    "OffPolicyTrainer.checkpoint_interval = None",
    "OffPolicyTrainer.progress_bar = False",
    "ActorDistributionNetwork.fc_layer_params = (16, 16)",
    "CriticNetworks.fc_layer_params = (16, 16)",
]


def _spec(**extra):
    spec = {
        "gin_file": ["sac_pendulum.gin"],
        "gin_param": list(TINY_SAC),
        "parameters": {"SGDEntropyTargetAlgorithm.target_entropy": [-1.0, -0.5]},
        "seeds": [0, 1],
        "seed_binding": "OffPolicyTrainer.seed",
    }
    spec.update(extra)
    return sweep_spec.check_spec(spec)


def test_sac_seeds_are_packed_as_off_policy_trainer_seeds(tmp_path):
    spec = _spec()
    notes = []
    tasks = packing.pack_seeds(
        sweep_spec.expand_spec(spec, str(tmp_path)), spec, str(tmp_path), log=notes.append
    )
    assert notes == []
    assert [t.name for t in tasks] == [
        "target_entropy=-1.0+seeds=0_1",
        "target_entropy=-0.5+seeds=0_1",
    ]
    params = [tasks[0].command[i + 1] for i, a in enumerate(tasks[0].command) if a == "--gin_param"]
    assert "OffPolicyTrainer.seeds = [0, 1]" in params
    assert not any(
        p.startswith(("OffPolicyTrainer.seed ", "OnPolicyTrainer.seeds")) for p in params
    )
    # A spec binding the K-agent arguments itself still runs one process per run.
    spec = _spec(gin_param=TINY_SAC + ["OffPolicyTrainer.num_agents = 2"])
    runs = sweep_spec.expand_spec(spec, str(tmp_path))
    notes = []
    assert packing.pack_seeds(runs, spec, str(tmp_path), log=notes.append) == runs
    assert "binds OffPolicyTrainer.num_agents" in notes[0]


@pytest.mark.slow
def test_packed_sac_sweep_is_the_unpacked_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    spec = _spec(parameters={"SGDEntropyTargetAlgorithm.target_entropy": [-1.0]})
    names = ["target_entropy=-1.0+seed=0", "target_entropy=-1.0+seed=1"]
    dirs = {mode: str(tmp_path / mode) for mode in ("unpacked", "packed")}
    for mode, path in dirs.items():
        lines = []
        result = sweep.run_sweep(spec, path, jobs=2, pack=mode == "packed", log=lines.append)
        assert result["failed"] == [] and sorted(result["status"]) == names, lines
        assert report.find_runs([path]) == [os.path.join(path, n) for n in names]
    packed_root = os.path.join(dirs["packed"], packing.PACKED_DIR, "target_entropy=-1.0+seeds=0_1")
    assert {"checkpoints", "seed=0", "seed=1"} <= set(os.listdir(packed_root))
    for name in names:  # agent k's summaries are the single run's (float rounding aside)
        mine = report.load_run(os.path.join(dirs["packed"], name)).scalars
        theirs = report.load_run(os.path.join(dirs["unpacked"], name)).scalars
        for tag in ("loss/total", "loss/critic", "entropy", "alpha", "env_steps"):
            assert list(mine[tag][0]) == list(theirs[tag][0]), tag
            assert mine[tag][1] == pytest.approx(theirs[tag][1], rel=1e-5, abs=1e-5), tag
        # Its operative config holds the single run's bindings (the report's seed and group).
        with open(os.path.join(dirs["packed"], name, "operative_config.gin")) as f:
            packed_config = read_bindings(f.read())
        with open(os.path.join(dirs["unpacked"], name, "operative_config.gin")) as f:
            assert list(packed_config.items()) == list(read_bindings(f.read()).items())
