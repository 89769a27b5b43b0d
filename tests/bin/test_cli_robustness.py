"""Issue 21 at the command line: what users and clusters do to runs.

Most checks call ``alf-entropy-train``'s main in this process (cheap: torch
is imported once); the signal and lock tests use real subprocesses.  A
hypothesis test feeds random bad values for the shipped configs' public
parameters and expects exit status 2, one error line, no traceback and no
run directory left behind.
"""

import errno
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from absl import flags
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alf_entropy.bin import sweep
from alf_entropy.bin import train as train_cli
from alf_entropy.storage import checkpoints as ckpt
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer
from alf_entropy.trainers.trainer import TrainingAborted

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "alf-entropy-train: error:"

TINY = [
    "OnPolicyTrainer.num_env_steps = None",
    "OnPolicyTrainer.num_iterations = 2",
    "OnPolicyTrainer.unroll_length = 8",
    "OnPolicyTrainer.num_envs = 2",
    "OnPolicyTrainer.eval_interval = None",
    "OnPolicyTrainer.checkpoint_interval = 1",
    "OnPolicyTrainer.progress_bar = False",
    "PPOAlgorithm.num_epochs = 1",
    "PPOAlgorithm.num_minibatches = 2",
]


def _params(params):
    out = []
    for p in params:
        out += ["--gin_param", p]
    return out


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _restore_absl_level():
    # Parsing absl's flags sets the absl logger's level from --verbosity:
    # put it back so that later tests' caplog sees INFO records.
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    yield
    absl_logger.setLevel(level)


def cli(*argv):
    """Run ``alf-entropy-train ARGV`` in this process; return its exit status."""
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["alf-entropy-train", *argv])
    try:
        train_cli._run(["alf-entropy-train"])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    finally:
        flags.FLAGS.unparse_flags()
    return 0


def _error_lines(err):
    return [line for line in err.splitlines() if line.startswith(PREFIX)]


def _one_error(capsys, status, expected_status=2):
    out, err = capsys.readouterr()
    assert status == expected_status, err[-2000:]
    assert "Traceback" not in err
    lines = _error_lines(err)
    assert len(lines) == 1, err[-2000:]
    return lines[0]


def _subprocess_env():
    return dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


# ------------------------------------------------------- damaged checkpoints
def test_damaged_newest_checkpoint_falls_back_then_none_is_one_line(tmp_path, capsys, caplog):
    root = str(tmp_path / "run")
    assert cli("--root_dir", root, "--device", "cpu", *_params(TINY)) == 0
    newest = os.path.join(root, "checkpoints", "ckpt-00000002.pt")
    with open(newest, "r+b") as f:
        f.truncate(100)
    capsys.readouterr()
    more = [p.replace("num_iterations = 2", "num_iterations = 3") for p in TINY]
    assert cli("--root_dir", root, "--device", "cpu", *_params(more)) == 0
    out, err = capsys.readouterr()
    assert "done: 3 iterations" in out
    warnings = [r.getMessage() for r in caplog.records if "Skipped" in r.getMessage()]
    assert len(warnings) == 1 and "ckpt-00000002.pt cannot be read" in warnings[0]
    assert "ckpt-00000001.pt instead" in warnings[0]
    assert os.path.exists(newest)
    # Now no checkpoint loads: one line, status 2.
    for path in ckpt.checkpoints_newest_first(os.path.join(root, "checkpoints")):
        with open(path, "wb") as f:
            f.write(b"junk")
    line = _one_error(capsys, cli("--root_dir", root, "--device", "cpu", *_params(more)))
    assert "no checkpoint" in line and "can be loaded" in line


def test_full_disk_is_one_line_and_keeps_earlier_checkpoints(tmp_path, capsys, monkeypatch):
    real_save = torch.save
    calls = []

    def save(obj, f):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", save)
    root = str(tmp_path / "run")
    line = _one_error(capsys, cli("--root_dir", root, "--device", "cpu", *_params(TINY)), 1)
    assert "No space left on device" in line and "intact" in line
    assert os.listdir(os.path.join(root, "checkpoints")) == ["ckpt-00000001.pt"]


def test_config_without_a_trainer_binding_is_one_line(tmp_path, capsys):
    mine = tmp_path / "mine.gin"
    mine.write_text("OnPolicyTrainer.env_id = 'CartPole-v1'\n")
    root = tmp_path / "run"
    line = _one_error(
        capsys,
        cli("--root_dir", str(root), "--device", "cpu", "--gin_file", str(mine), *_params(TINY)),
    )
    assert "train.trainer = @OnPolicyTrainer" in line
    assert not root.exists()


# ------------------------------------------------------------ run directories
def test_root_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("x")
    line = _one_error(capsys, cli("--root_dir", str(path), "--device", "cpu", *_params(TINY)))
    assert "is not a directory" in line


def test_reused_run_directory_is_refused_unless_allowed(tmp_path, capsys, caplog):
    root = str(tmp_path / "quick")
    assert cli("--root_dir", root, "--device", "cpu", *_params(TINY)) == 0
    config = open(os.path.join(root, "operative_config.gin")).read()
    # The docs' quick PPO run, then SAC on the same directory:
    line = _one_error(
        capsys,
        cli(
            "--root_dir",
            root,
            "--device",
            "cpu",
            "--gin_file",
            "sac_pendulum",
            "--gin_param",
            "OffPolicyTrainer.num_iterations = 3000",
        ),
    )
    assert "another configuration" in line and "new --root_dir" in line
    assert "OffPolicyTrainer" in line
    # ... and A2C on PPO's directory (it used to resume PPO's checkpoint silently):
    a2c = [p for p in TINY if not p.startswith("PPOAlgorithm")]
    line = _one_error(
        capsys,
        cli("--root_dir", root, "--device", "cpu", "--gin_file", "ac_cartpole", *_params(a2c)),
    )
    assert "OnPolicyTrainer.algorithm_ctor: @PPOAlgorithm -> @ActorCriticAlgorithm" in line
    assert open(os.path.join(root, "operative_config.gin")).read() == config
    # A larger limit is not a different run.
    more = [p.replace("num_iterations = 2", "num_iterations = 3") for p in TINY]
    assert cli("--root_dir", root, "--device", "cpu", *_params(more)) == 0
    # A change, explicitly allowed, is logged.
    changed = more + ["PPOAlgorithm.gamma = 0.9"]
    assert (
        cli("--root_dir", root, "--device", "cpu", "--allow_config_change", *_params(changed)) == 0
    )
    assert "allow_config_change: resuming" in caplog.text


def test_a_binding_nothing_uses_is_one_line(tmp_path, capsys):
    root = tmp_path / "run"
    line = _one_error(
        capsys,
        cli(
            "--root_dir",
            str(root),
            "--device",
            "cpu",
            *_params(TINY),
            "--gin_param",
            "torch.optim.Adam.lr = -1e-3",
        ),
    )
    assert "torch.optim.Adam.lr = -1e-3" in line and "default_optimizer.lr" in line
    assert not root.exists()


def test_a_binding_the_command_line_overrides_is_one_line(tmp_path, capsys):
    line = _one_error(
        capsys,
        cli(
            "--root_dir",
            str(tmp_path / "run"),
            "--device",
            "cpu",
            *_params(TINY),
            "--gin_param",
            "OnPolicyTrainer.device = 'cpu'",
        ),
    )
    assert "--device" in line and "OnPolicyTrainer.device" in line


def test_sac_num_iterations_below_initial_collect_steps_is_one_line(tmp_path, capsys):
    line = _one_error(
        capsys,
        cli(
            "--root_dir",
            str(tmp_path / "run"),
            "--device",
            "cpu",
            "--gin_file",
            "sac_pendulum",
            "--gin_param",
            "OffPolicyTrainer.num_iterations = 300",
        ),
    )
    assert "initial_collect_steps (1000) must be <=" in line and "num_iterations" in line


def test_second_writer_is_one_line_naming_the_first(tmp_path, capsys, hold_run_lock):
    root = tmp_path / "run"
    holder = hold_run_lock(root)
    try:
        line = _one_error(capsys, cli("--root_dir", str(root), "--device", "cpu", *_params(TINY)))
    finally:
        holder.kill()
        holder.wait()
    assert "pid 424242 on host otherhost" in line
    assert sorted(os.listdir(root)) == [".run.lock"]


# ------------------------------------------------------------------ signals
@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_143_with_one_line(tmp_path):
    """Stopped before its limit: 128 + 15, never 0 (a sweep or scheduler would count it done)."""
    root = str(tmp_path / "run")
    args = [
        sys.executable,
        "-m",
        "alf_entropy.bin.train",
        "--root_dir",
        root,
        "--device",
        "cpu",
        *_params(p.replace("num_iterations = 2", "num_iterations = 100000") for p in TINY),
    ]
    proc = subprocess.Popen(
        args,
        cwd=REPO_ROOT,
        env=_subprocess_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # Any checkpoint (the oldest are deleted within milliseconds at this pace).
    checkpoints = os.path.join(root, "checkpoints")
    deadline = time.monotonic() + 120
    while (
        not (os.path.isdir(checkpoints) and ckpt.latest_checkpoint(checkpoints))
        and proc.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert out == ""
    lines = [line for line in err.splitlines() if line.startswith("alf-entropy-train:")]
    assert len(lines) == 1 and lines[0].startswith("alf-entropy-train: stopped by SIGTERM"), err
    stopped = int(lines[0].split("at iteration ")[1].split()[0])
    assert 1 <= stopped < 100000
    path = os.path.join(root, "checkpoints", f"ckpt-{stopped:08d}.pt")
    assert path in lines[0] and ckpt.load_checkpoint(path)["env"]  # env state: exact
    assert "Traceback" not in err
    # (that such a checkpoint resumes exactly: tests/trainers/test_robustness.py)


def _stop_line(capsys, status, signum):
    """The one line of a stop the user asked for: not an error, status 128 + signum."""
    out, err = capsys.readouterr()
    assert status == 128 + signum, err[-2000:]
    assert "Traceback" not in err and PREFIX not in err, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("alf-entropy-train:")]
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith(f"alf-entropy-train: stopped by {signal.Signals(signum).name}")
    return lines[0]


def test_ctrl_c_while_starting_is_a_clean_stop_not_an_error(tmp_path, capsys, monkeypatch):
    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(OnPolicyTrainer, "__init__", interrupted)
    status = cli("--root_dir", str(tmp_path / "run"), "--device", "cpu", *_params(TINY))
    line = _stop_line(capsys, status, signal.SIGINT)
    assert "before training started" in line and "run the same command" in line


def test_sigterm_while_starting_is_a_clean_stop_not_an_error(tmp_path, capsys, monkeypatch):
    def terminated(self, *args, **kwargs):
        # The CLI's handler is installed (the default one would end pytest).
        assert signal.getsignal(signal.SIGTERM) is train_cli._raise_terminated
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        raise AssertionError("SIGTERM was not delivered")

    monkeypatch.setattr(OnPolicyTrainer, "__init__", terminated)
    previous = signal.getsignal(signal.SIGTERM)
    status = cli("--root_dir", str(tmp_path / "run"), "--device", "cpu", *_params(TINY))
    assert signal.getsignal(signal.SIGTERM) is previous  # put back
    _stop_line(capsys, status, signal.SIGTERM)


def test_a_second_signal_is_a_clean_stop_with_128_plus_n(tmp_path, capsys, monkeypatch):
    def aborted(self):
        raise TrainingAborted(signal.SIGTERM)

    monkeypatch.setattr(OnPolicyTrainer, "train", aborted)
    status = cli("--root_dir", str(tmp_path / "run"), "--device", "cpu", *_params(TINY))
    line = _stop_line(capsys, status, signal.SIGTERM)
    assert "a second signal" in line and "no checkpoint written" in line


# --------------------------------------------------- bad input: one line
def _bad_ints(minimum):
    return st.one_of(
        st.integers(max_value=minimum - 1).map(str),
        st.floats(allow_nan=False, allow_infinity=False)
        .filter(lambda x: x != int(x) if abs(x) < 1e15 else True)
        .map(repr),
        st.sampled_from(["''", "'abc'", "nan", "1e999", "-1e999", "(1, 2)", "True"]),
    )


def _bad_reals():
    return st.one_of(
        st.floats(max_value=0.0).map(repr),
        st.sampled_from(["''", "'x'", "nan", "1e999", "-1e999", "None", "[0.1]"]),
    )


_HUGE = st.integers(min_value=2**31, max_value=2**200).map(str)

# (config, binding, bad values) for public parameters of the shipped configs.
_CASES = [
    ("ppo_cartpole", "OnPolicyTrainer.num_envs", _bad_ints(1)),
    ("ppo_cartpole", "OnPolicyTrainer.unroll_length", _bad_ints(1)),
    ("ppo_cartpole", "OnPolicyTrainer.summary_interval", _bad_ints(1)),
    ("ppo_cartpole", "OnPolicyTrainer.num_eval_episodes", _bad_ints(1)),
    ("ppo_cartpole", "OnPolicyTrainer.num_iterations", _bad_ints(0)),
    ("ppo_cartpole", "OnPolicyTrainer.seed", st.one_of(_bad_ints(0), _HUGE)),
    ("ppo_cartpole", "PPOAlgorithm.num_epochs", _bad_ints(1)),
    ("ppo_cartpole", "PPOAlgorithm.num_minibatches", _bad_ints(1)),
    (
        "ppo_cartpole",
        "EntropyTargetAlgorithm.target_entropy",
        st.one_of(
            st.sampled_from(["''", "'x'", "nan", "1e999", "-1e999"]),
            st.floats(min_value=0.7, max_value=1e300).map(repr),
        ),
    ),
    ("ppo_cartpole", "default_optimizer.lr", _bad_reals()),
    ("ac_cartpole", "OnPolicyTrainer.num_envs", _bad_ints(1)),
    ("sac_pendulum", "OffPolicyTrainer.mini_batch_size", st.one_of(_bad_ints(1), _HUGE)),
    ("sac_pendulum", "OffPolicyTrainer.initial_collect_steps", st.one_of(_bad_ints(0), _HUGE)),
    ("sac_pendulum", "sac_default_optimizer.lr", _bad_reals()),
]


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    case=st.sampled_from(range(len(_CASES))).flatmap(lambda i: st.tuples(st.just(i), _CASES[i][2]))
)
def test_random_bad_values_exit_2_with_one_line(tmp_path, capsys, case):
    index, value = case
    config, binding, _ = _CASES[index]
    root = tmp_path / "bad"
    capsys.readouterr()
    status = cli(
        "--root_dir",
        str(root),
        "--device",
        "cpu",
        "--gin_file",
        config,
        "--gin_param",
        f"{binding} = {value}",
    )
    line = _one_error(capsys, status)
    assert line.startswith(PREFIX) and len(line) > len(PREFIX) + 5
    assert not root.exists(), f"{binding} = {value} left {sorted(os.listdir(root))}"


def test_out_of_memory_is_one_line(tmp_path, capsys, monkeypatch):
    # What numpy raises for e.g. num_envs = 3000000000000 (10.9 TiB of CartPole state).
    def iteration(self):
        raise MemoryError("Unable to allocate 10.9 TiB")

    monkeypatch.setattr(OnPolicyTrainer, "_train_iteration", iteration)
    line = _one_error(
        capsys, cli("--root_dir", str(tmp_path / "run"), "--device", "cpu", *_params(TINY)), 1
    )
    assert "out of memory" in line and "num_envs" in line


# ------------------------------------------------------------------- sweeps
SWEEP_TINY = [p for p in TINY if "checkpoint_interval" not in p]


def _spec(gin_param=SWEEP_TINY, targets=(0.6,)):
    return {
        "gin_file": ["ppo_cartpole.gin"],
        "gin_param": list(gin_param),
        "parameters": {"EntropyTargetAlgorithm.target_entropy": list(targets)},
        "seeds": [0],
    }


@pytest.fixture
def _pythonpath(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", _subprocess_env()["PYTHONPATH"])


@pytest.mark.slow
def test_sweep_knows_its_runs(tmp_path, _pythonpath, hold_run_lock):
    """A finished run is done only for the same command; a failed run's own error
    line is in the summary; a run another process trains in is "already running"."""
    sweep_dir = tmp_path / "sweep"
    lines = []
    result = sweep.run_sweep(_spec(), str(sweep_dir), report=False, log=lines.append)
    assert result["failed"] == [] and list(result["status"].values()) == [0]
    holder = hold_run_lock(sweep_dir / "target_entropy=0.65+seed=0")
    lines.clear()
    try:
        result = sweep.run_sweep(
            _spec(targets=(0.6, 5.0, 0.65)), str(sweep_dir), jobs=2, report=False, log=lines.append
        )
    finally:
        holder.kill()
        holder.wait()
    assert result["skipped"] == ["target_entropy=0.6+seed=0"]
    assert result["running"] == ["target_entropy=0.65+seed=0"]
    assert result["failed"] == ["target_entropy=5.0+seed=0"]
    failed = [line for line in lines if line.startswith("alf-entropy-sweep: FAILED")]
    assert len(failed) == 1 and "above the largest entropy" in failed[0], lines
    assert any(line.startswith("already running target_entropy=0.65") for line in lines), lines
    # A fixed binding changed: the finished run is not "done", the sweep refuses.
    spec_json = open(sweep_dir / "sweep.json").read()
    changed = [p.replace("num_epochs = 1", "num_epochs = 2") for p in SWEEP_TINY]
    with pytest.raises(ValueError, match=r"another command.*num_epochs = 2.*new --sweep_dir"):
        sweep.run_sweep(_spec(changed), str(sweep_dir), report=False, log=lines.append)
    assert open(sweep_dir / "sweep.json").read() == spec_json  # not overwritten
