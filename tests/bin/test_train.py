"""End-to-end tests of the ``alf-entropy-train`` command line (subprocesses)."""

import os
import re

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# The CLI in subprocesses: the slow lane (pytest -m slow); plain pytest runs it.
pytestmark = pytest.mark.slow


TINY = [
    "--gin_param",
    "OnPolicyTrainer.num_env_steps = None",
    "--gin_param",
    "OnPolicyTrainer.num_iterations = 3",
    "--gin_param",
    "OnPolicyTrainer.unroll_length = 16",
    "--gin_param",
    "OnPolicyTrainer.num_envs = 2",
    "--gin_param",
    "OnPolicyTrainer.summary_interval = 1",
    "--gin_param",
    "OnPolicyTrainer.eval_interval = 3",
    "--gin_param",
    "OnPolicyTrainer.num_eval_episodes = 2",
    "--gin_param",
    "OnPolicyTrainer.progress_bar = False",
]


def test_default_config_end_to_end(run_train, tmp_path):
    root = str(tmp_path / "run")
    proc = run_train("--root_dir", root, "--device", "cpu", *TINY)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: 3 iterations" in proc.stdout
    ea = EventAccumulator(os.path.join(root, "train"), size_guidance={"scalars": 0})
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    for tag in (
        "alpha",
        "entropy",
        "target_entropy",
        "EntropyTargetAlgorithm/alpha",
        "return",
        "eval/return",
    ):
        assert tag in tags, (tag, sorted(tags))
    assert [e.step for e in ea.Scalars("alpha")] == [0, 1, 2]
    assert os.path.isfile(os.path.join(root, "checkpoints", "ckpt-00000003.pt"))
    config = open(os.path.join(root, "operative_config.gin")).read()
    assert "PPOAlgorithm.enforce_entropy_target = True" in config
    assert "OnPolicyTrainer.num_iterations = 3" in config

    # Running again with more iterations resumes from iteration 3.
    more = [a.replace("num_iterations = 3", "num_iterations = 4") for a in TINY]
    proc = run_train("--root_dir", root, "--device", "cpu", *more)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: 4 iterations" in proc.stdout
    assert "Resumed from" in proc.stderr
    assert os.path.isfile(os.path.join(root, "checkpoints", "ckpt-00000004.pt"))


@pytest.mark.parametrize(
    "agents", [[], ["--gin_param", "OnPolicyTrainer.seeds = [0, 1]"]], ids=["one", "two_agents"]
)
def test_each_periodic_log_line_shows_the_control(run_train, tmp_path, agents):
    """Issue 40 item 8: each evaluation's log line of the main job shows alpha, entropy and
    target beside the eval return; with K agents each as labelled min/mean/max."""
    proc = run_train("--root_dir", str(tmp_path / "run"), "--device", "cpu", *TINY, *agents)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "] iteration 3 env_steps" in line]
    assert len(lines) == 1, proc.stderr[-2000:]
    label = " min/mean/max " if agents else " "
    value = r"[-\d.e]+/[-\d.e]+/[-\d.e]+" if agents else r"[-\d.e]+"
    for name in ("eval return", "alpha", "entropy", "target"):
        assert re.search(f"{name}{label}{value}", lines[0]), (name, lines[0])
    done = [line for line in proc.stdout.splitlines() if ": done: " in line]
    said = "the lowest of 2 agents' eval return " if agents else ", eval return "
    assert len(done) == 1 and said in done[0], proc.stdout


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--gin_param", "PPOAlgorithm.num_epoch = 3"], "num_epoch"),
        (["--gin_param", "PPOAlgorith.num_epochs = 3"], "PPOAlgorith"),
        (["--gin_param", "PPOAlgorithm.num_epochs = 0"], "num_epochs must be"),
        (["--gin_file", "no_such_config.gin"], "not found"),
        (["--gin_param", "train.trainer = @PPOAlgorithm"], "train.trainer must be a trainer"),
    ],
)
def test_bad_config_exits_with_one_clear_line(run_train, tmp_path, args, expected):
    proc = run_train("--root_dir", str(tmp_path / "bad"), "--device", "cpu", *args)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    line = proc.error_line
    assert line.startswith("alf-entropy-train: error:"), line
    assert expected in line, line


def test_quick_run_with_num_iterations_only(run_train, tmp_path):
    """Issue 13: the shipped config binds num_env_steps; num_iterations alone still works."""
    root = str(tmp_path / "quick")
    args = [
        "--root_dir",
        root,
        "--device",
        "cpu",
        "--gin_param",
        "OnPolicyTrainer.num_iterations = 3",
    ]
    proc = run_train(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: 3 iterations, 3072 env steps" in proc.stdout
    assert os.path.isfile(os.path.join(root, "checkpoints", "ckpt-00000003.pt"))
    # The same command again: already at the limit, one line, exit status 0.
    proc = run_train(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "nothing to do" in lines[0] and "3 iterations" in lines[0], lines


def test_help_exits_0_and_lists_the_shipped_configs(run_train):
    from alf_entropy.config.loading import list_configs

    proc = run_train("--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--root_dir" in proc.stdout and "Shipped configs" in proc.stdout
    assert list_configs() and all(name in proc.stdout for name in list_configs())
