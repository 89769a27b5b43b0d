"""End-to-end tests of ``alf-entropy-sweep`` and ``alf-entropy-report``.

A tiny sweep (2 target entropies x 2 seeds, 4 short PPO iterations each)
runs as real ``alf-entropy-train`` processes; its report is checked against
the events read independently with ``tbparse``.
"""

import csv
import json
import math
import os

import numpy as np
import pytest

from alf_entropy.experiments import control_metrics as cm
from alf_entropy.experiments import report, sweep, sweep_spec

# Sweeps of real runs: the slow lane (pytest -m slow); plain pytest runs it.
pytestmark = pytest.mark.slow

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = [
    "OnPolicyTrainer.num_env_steps = None",
    "OnPolicyTrainer.num_iterations = 4",
    "OnPolicyTrainer.unroll_length = 16",
    "OnPolicyTrainer.num_envs = 2",
    "OnPolicyTrainer.summary_interval = 1",
    "OnPolicyTrainer.eval_interval = 2",
    "OnPolicyTrainer.num_eval_episodes = 1",
    "OnPolicyTrainer.checkpoint_interval = 2",
    "OnPolicyTrainer.progress_bar = False",
    "PPOAlgorithm.num_epochs = 2",
    "PPOAlgorithm.num_minibatches = 2",
]


@pytest.fixture(autouse=True)
def _pythonpath(monkeypatch):
    """The runs are subprocesses: let them import this checkout."""
    monkeypatch.setenv("PYTHONPATH", REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _spec(**parameters):
    return {
        "gin_file": ["ppo_cartpole.gin"],
        "gin_param": TINY,
        "parameters": parameters or {"EntropyTargetAlgorithm.target_entropy": [0.67, 0.69]},
        "seeds": [0, 1],
    }


def _read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _tb_scalars(run_dir):
    from tbparse import SummaryReader

    df = SummaryReader(os.path.join(run_dir, "train")).scalars
    return {tag: g.sort_values("step", kind="stable") for tag, g in df.groupby("tag")}


def test_sweep_then_report_end_to_end(tmp_path):
    sweep_dir = str(tmp_path / "sweep")
    lines = []
    result = sweep.run_sweep(_spec(), sweep_dir, jobs=2, log=lines.append)
    names = sorted(r.name for r in result["runs"])
    assert names == [
        "target_entropy=0.67+seed=0",
        "target_entropy=0.67+seed=1",
        "target_entropy=0.69+seed=0",
        "target_entropy=0.69+seed=1",
    ]
    assert result["failed"] == [] and sorted(result["status"]) == names
    for name in names:
        run_dir = os.path.join(sweep_dir, name)
        assert os.path.isfile(os.path.join(run_dir, sweep.DONE_FILE))
        config = open(os.path.join(run_dir, "operative_config.gin")).read()
        seed = name[-1]
        assert f"OnPolicyTrainer.seed = {seed}" in config
        assert f"target_entropy = {name.split('=')[1].split('+')[0]}" in config

    # The report: figures, and one metrics row per run.
    out = os.path.join(sweep_dir, "report")
    for fig in ("entropy", "alpha", "stage", "return", "overview"):
        path = os.path.join(out, fig + ".png")
        assert os.path.getsize(path) > 5000, path
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    rows = {r["run"]: r for r in _read_csv(os.path.join(out, "metrics.csv"))}
    assert sorted(rows) == names
    # runs differing only in the seed share a group (one curve with a band)
    assert rows[names[0]]["group"] == rows[names[1]]["group"] == "target_entropy=0.67"
    assert rows[names[2]]["group"] == rows[names[3]]["group"] == "target_entropy=0.69"
    md = open(os.path.join(out, "metrics.md")).read()
    assert all(f"| {n} |" in md for n in names)
    # ... and one row per group: the mean over its 2 seeds with an interval.
    group_row = next(
        line for line in md.splitlines() if line.startswith("| target_entropy=0.67 | 2 |")
    )
    mean, lo, hi = cm.bootstrap_ci([float(rows[n]["tracking_rmse"]) for n in names[:2]])
    assert f"{mean:.4g} [{lo:.4g}, {hi:.4g}]" in group_row

    # Metric values agree with the events read by another reader (tbparse).
    for name in names:
        row, tb = rows[name], _tb_scalars(os.path.join(sweep_dir, name))
        entropy = tb["entropy"]["value"].to_numpy()
        target = tb["target_entropy"]["value"].to_numpy()
        assert np.allclose(target, float(name.split("=")[1].split("+")[0]), atol=1e-6)
        # the untrained policy's entropy (~0.69) is within 5% of both targets
        assert cm.warmup_end(entropy, target) == 0
        assert float(row["tracking_from_env_step"]) == 2 * 16
        assert row["note"] == ""  # reached: no "target not reached in this run"
        assert float(row["tracking_rmse"]) == pytest.approx(
            math.sqrt(np.mean((entropy - target) ** 2)), rel=1e-6
        )
        assert float(row["frac_5pct_below"]) == pytest.approx(
            np.mean(entropy < 0.95 * target), abs=1e-9
        )
        assert float(row["final_eval_return"]) == tb["eval/return"]["value"].iloc[-1]
        assert int(row["env_steps"]) == 4 * 16 * 2
        alpha = tb["EntropyTargetAlgorithm/alpha"]
        a = alpha["value"].to_numpy()
        assert alpha["step"].tolist() == [s for s in range(4) for _ in range(4)]  # 2x2 updates
        expected = cm.largest_alpha_change(a, alpha["step"].to_numpy())
        assert float(row["max_alpha_change_x"]) == pytest.approx(expected.factor, rel=1e-6)
        assert expected.factor > 1.0

    # Running again skips every finished run.
    result = sweep.run_sweep(_spec(), sweep_dir, jobs=2, log=lines.append)
    assert sorted(result["skipped"]) == names and result["status"] == {}

    # Again, with one run interrupted (no done marker, an older checkpoint)
    # and a new configuration that fails (a target above log 2): the
    # interrupted run resumes from its checkpoint and finishes, the failure
    # is reported and stops nothing.
    victim = os.path.join(sweep_dir, names[0])
    os.remove(os.path.join(victim, sweep.DONE_FILE))
    os.remove(os.path.join(victim, "checkpoints", "ckpt-00000004.pt"))
    spec = _spec(**{"EntropyTargetAlgorithm.target_entropy": [0.67, 0.69, 5.0]})
    spec["seeds"] = [0]
    lines.clear()
    result = sweep.run_sweep(spec, sweep_dir, jobs=2, report=False, log=lines.append)
    assert sorted(result["skipped"]) == [names[2]]
    assert result["status"] == {names[0]: 0, "target_entropy=5.0+seed=0": 2}
    assert result["failed"] == ["target_entropy=5.0+seed=0"]
    assert any("FAILED" in line and "target_entropy=5.0" in line for line in lines)
    log = open(os.path.join(victim, "train.log")).read()
    assert "Resumed from" in log and "ckpt-00000002.pt" in log
    assert "done: 4 iterations" in log
    bad = os.path.join(sweep_dir, "target_entropy=5.0+seed=0")
    assert "above the largest entropy" in open(os.path.join(bad, "train.log")).read()
    assert not os.path.exists(os.path.join(bad, sweep.DONE_FILE))

    # The report CLI on the sweep dir finds the 4 runs with events.
    assert report.main([sweep_dir, "--out_dir", str(tmp_path / "rep")]) == 0
    assert len(_read_csv(str(tmp_path / "rep" / "metrics.csv"))) == 4
    # the sweep CLI's exit status says that a run failed
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    assert sweep.main(["--spec", str(spec_path), "--sweep_dir", sweep_dir, "--no_report"]) == 1


def test_ray_sweep(tmp_path):
    pytest.importorskip("ray")
    spec = _spec(**{"EntropyTargetAlgorithm.target_entropy": [0.67]})
    spec["seeds"] = [0]
    sweep_dir = str(tmp_path / "sweep")
    result = sweep.run_sweep(spec, sweep_dir, ray_address="local", log=lambda s: None)
    assert result["failed"] == [] and result["status"] == {"target_entropy=0.67+seed=0": 0}
    run_dir = os.path.join(sweep_dir, "target_entropy=0.67+seed=0")
    assert os.path.isfile(os.path.join(run_dir, sweep.DONE_FILE))
    assert "done: 4 iterations" in open(os.path.join(run_dir, "train.log")).read()
    rows = _read_csv(os.path.join(sweep_dir, "report", "metrics.csv"))
    assert len(rows) == 1 and float(rows[0]["final_eval_return"]) > 0
    # without a cluster to join, 'auto' is a clear error, not a traceback
    if not os.environ.get("RAY_ADDRESS"):
        with pytest.raises(ValueError, match="cannot connect to Ray"):
            sweep.run_sweep(spec, str(tmp_path / "other"), ray_address="auto", log=lambda s: None)


def test_expand_spec_names_and_commands(tmp_path):
    spec = sweep_spec.check_spec(
        {
            "parameters": {
                "A.lr": [0.1],
                "B.lr": [1, 2],
                "EntropyTargetAlgorithm.target_entropy": ["@LinearScheduler()"],
            },
            "seeds": [3],
        }
    )
    runs = sweep_spec.expand_spec(spec, str(tmp_path))
    # clashing short names keep the whole binding; unsafe characters become _
    assert [r.name for r in runs] == [
        "A.lr=0.1+B.lr=1+target_entropy=_LinearScheduler_+seed=3",
        "A.lr=0.1+B.lr=2+target_entropy=_LinearScheduler_+seed=3",
    ]
    cmd = runs[0].command
    assert cmd[cmd.index("--root_dir") + 1] == os.path.join(str(tmp_path), runs[0].name)
    params = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--gin_param"]
    assert params == [
        "A.lr = 0.1",
        "B.lr = 1",
        "EntropyTargetAlgorithm.target_entropy = @LinearScheduler()",
        "OnPolicyTrainer.seed = 3",
    ]


@pytest.mark.parametrize(
    "spec, word",
    [
        ([1], "JSON object"),
        ({"parameter": {}}, "unknown keys"),
        ({"parameters": {"lr": [1]}}, "parameters"),
        ({"parameters": {"A.lr": []}}, "parameters"),
        ({"seeds": [0, 0]}, "seeds"),
        ({"seeds": [-1]}, "seeds"),
        ({"gin_file": [1]}, "gin_file"),
    ],
)
def test_bad_spec_raises(spec, word):
    with pytest.raises(ValueError, match=word):
        sweep_spec.check_spec(spec)


def test_report_cli_rejects_a_dir_without_runs(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no run" in capsys.readouterr().err


def test_docs_sweep_spec_is_valid(tmp_path):
    import re

    text = open(os.path.join(REPO_ROOT, "docs", "experiments.md"), encoding="utf-8").read()
    blocks = re.findall(r"```json\n(.*?)```", text, re.S)
    assert blocks, "docs/experiments.md has no sweep spec"
    spec = sweep_spec.check_spec(json.loads(blocks[0]))
    runs = sweep_spec.expand_spec(spec, str(tmp_path))
    assert len(runs) == 2 * 2 * 3
    assert runs[-1].name == "target_entropy=0.6+fast_update_rate=0.693+seed=2"


def test_load_run_gives_each_tag_in_step_order_whatever_the_event_files_names(tmp_path):
    """A run resumed within the same second as its last write has two event files whose
    names may sort either way; the report still reads its steps in order."""
    from torch.utils.tensorboard import SummaryWriter

    train = tmp_path / "run" / "train"
    for steps, suffix in (([0, 1], ".b"), ([2], ".a")):  # the later steps' file sorts first
        writer = SummaryWriter(str(train), filename_suffix=suffix)
        for step in steps:
            writer.add_scalar("entropy", 10.0 + step, step)
        writer.close()
    names = sorted(os.listdir(train))
    assert len(names) == 2
    os.rename(train / names[0], train / "events.out.tfevents.1.x.2")  # ".b" file: later name
    os.rename(train / names[1], train / "events.out.tfevents.1.x.1")
    steps, values = report.load_run(str(tmp_path / "run")).scalars["entropy"]
    assert list(steps) == [0, 1, 2] and list(values) == [10.0, 11.0, 12.0]


def test_ctrl_c_on_a_sweep_stops_its_run_which_resumes_later(tmp_path):
    """Issue 63: a Ctrl-C (SIGINT to the sweep's process group, as a terminal sends it)
    stops the running run after its iteration with a checkpoint and no done marker, starts
    no other run, and ends the sweep at once; the same sweep again resumes the run."""
    import signal
    import subprocess
    import sys
    import time

    spec = _spec(**{"EntropyTargetAlgorithm.target_entropy": [0.67]})
    spec["gin_param"] = [p.replace("num_iterations = 4", "num_iterations = 1000000") for p in TINY]
    spec_path, sweep_dir = tmp_path / "spec.json", tmp_path / "sweep"
    spec_path.write_text(json.dumps(spec))
    first, second = (sweep_dir / f"target_entropy=0.67+seed={s}" for s in (0, 1))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "alf_entropy.experiments.sweep",
            "--spec",
            str(spec_path),
            "--sweep_dir",
            str(sweep_dir),
        ],
        cwd=REPO_ROOT,
        process_group=0,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not list((first / "checkpoints").glob("ckpt-*.pt")):  # training is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        start = time.monotonic()
        out, err = proc.communicate(timeout=60)
        seconds = time.monotonic() - start
    finally:
        if proc.poll() is None:  # two more: the sweep stops its runs (own sessions) at once
            for _ in range(2):
                os.killpg(proc.pid, signal.SIGINT)
                time.sleep(1)
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert seconds < 30, seconds  # the run's iteration and checkpoint, not the whole run
    assert err.strip().splitlines()[-1].startswith("alf-entropy-sweep: stopped by SIGINT"), err
    assert f"stopped by SIGINT (resumes on the next run) {first.name}" in out, out
    assert not (first / sweep.DONE_FILE).exists()
    log = (first / "train.log").read_text()
    stop = [ln for ln in log.splitlines() if ln.startswith("alf-entropy-train: stopped by SIGINT")]
    assert len(stop) == 1, log[-3000:]
    stopped = int(stop[0].split("at iteration ")[1].split()[0])
    assert (first / "checkpoints" / f"ckpt-{stopped:08d}.pt").exists()
    assert (second / "train.log").read_text() == ""  # never started: no command in its log
    assert not (second / "checkpoints").exists()

    # The same sweep (to a limit just past the stop) resumes the run from its checkpoint.
    spec["gin_param"] = [
        p.replace("num_iterations = 1000000", f"num_iterations = {stopped + 2}")
        for p in spec["gin_param"]
    ]
    lines = []
    result = sweep.run_sweep(spec, str(sweep_dir), report=False, log=lines.append)
    assert result["skipped"] == [] and result["status"] == {first.name: 0, second.name: 0}
    assert (first / sweep.DONE_FILE).exists() and (second / sweep.DONE_FILE).exists()
    log = (first / "train.log").read_text()
    assert f"ckpt-{stopped:08d}.pt" in log.split(stop[0])[1] and "Resumed from" in log
    assert f"done: {stopped + 2} iterations" in log
