"""``alf-entropy-train`` with the SAC configs: one iteration each, and clear
one-line errors for bad off-policy settings (subprocesses)."""

import os
import subprocess
import sys

import pytest

# The CLI in subprocesses: the slow lane (pytest -m slow); plain pytest runs it.
pytestmark = pytest.mark.slow

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# One iteration: initial_collect_steps must fit in it (a run that ends before
# learning starts is refused).
QUICK = [
    "--gin_param",
    "OffPolicyTrainer.num_iterations = 1",
    "--gin_param",
    "OffPolicyTrainer.initial_collect_steps = 1",
    "--gin_param",
    "OffPolicyTrainer.num_eval_episodes = 2",
    "--gin_param",
    "OffPolicyTrainer.progress_bar = False",
]


@pytest.mark.parametrize("config", ["sac_pendulum", "sac_pendulum_staged", "sac_cartpole"])
def test_each_sac_config_runs_one_iteration(run_train, tmp_path, config):
    root = tmp_path / "run"
    proc = run_train("--device", "cpu", "--root_dir", str(root), "--gin_file", config, *QUICK)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: 1 iterations" in proc.stdout and "eval return" in proc.stdout
    assert os.path.isfile(root / "checkpoints" / "ckpt-00000001.pt")
    config_text = open(root / "operative_config.gin").read()
    assert "OffPolicyTrainer.initial_collect_steps" in config_text
    assert "SacAlgorithm.entropy_target_cls" in config_text


def test_halfcheetah_config_runs_one_iteration(run_train, tmp_path):
    # CI installs the mujoco extra (.ci/run), so this runs there.
    pytest.importorskip("mujoco", reason="needs pip install -e .[mujoco]")
    root = tmp_path / "run"
    proc = run_train(
        "--device", "cpu", "--root_dir", str(root), "--gin_file", "sac_halfcheetah", *QUICK
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: 1 iterations" in proc.stdout and "eval return" in proc.stdout
    assert os.path.isfile(root / "checkpoints" / "ckpt-00000001.pt")


def test_halfcheetah_without_mujoco_fails_in_one_line(tmp_path):
    # The CLI as a user without the extra runs it: importing mujoco fails.
    code = (
        "import sys; sys.modules['mujoco'] = None; "
        "from alf_entropy.bin.train import main; "
        "sys.argv = ['alf-entropy-train'] + sys.argv[1:]; main()"
    )
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "--device",
            "cpu",
            "--root_dir",
            str(tmp_path / "run"),
            "--gin_file",
            "sac_halfcheetah",
            *QUICK,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 2
    line = [x for x in proc.stderr.splitlines() if x.strip()][-1]
    assert line.startswith("alf-entropy-train: error:") and "HalfCheetah-v5" in line
    assert "mujoco" in line.lower()


@pytest.mark.parametrize(
    "config, params, expected",
    [
        (
            "sac_pendulum",
            ["OffPolicyTrainer.replay_buffer_length = 100"],
            "mini_batch_size (256) must be <= replay_buffer_length (100)",
        ),
        (
            "sac_pendulum",
            ["OffPolicyTrainer.num_env_steps = 500"],
            "initial_collect_steps (1000) must be <= the env steps the run takes "
            "(500: num_iterations=None, num_env_steps=500",
        ),
        # SAC's continuous target (-1) given the discrete CartPole action
        (
            "sac_cartpole",
            ["SacAlgorithm.entropy_target_cls = @SGDEntropyTargetAlgorithm"],
            "below 0 for a discrete action",
        ),
        # a target above the largest entropy of Box(-2, 2) (log 4 = 1.39)
        (
            "sac_pendulum_staged",
            ["EntropyTargetAlgorithm.target_entropy = 2.0"],
            "above the largest entropy",
        ),
        # a discrete config's target (0.98 log 2) on the continuous env is
        # reachable, but the discrete SAC target on a 2-action env is not:
        (
            "sac_cartpole",
            ["EntropyTargetAlgorithm.target_entropy = 0.7"],
            "above the largest entropy",
        ),
    ],
)
def test_bad_settings_exit_with_one_clear_line(run_train, tmp_path, config, params, expected):
    args = ["--root_dir", str(tmp_path / "run"), "--gin_file", config]
    for p in params:
        args += ["--gin_param", p]
    proc = run_train("--device", "cpu", *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.error_line
    assert line.startswith("alf-entropy-train: error:") and expected in line, line
    assert "Traceback" not in proc.stderr
