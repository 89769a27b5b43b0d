"""Issue 21 under ``torchrun`` (gloo, 127.0.0.1): a SIGTERM to one rank stops
every rank at the same iteration with one checkpoint, and a configuration
error is printed once (by rank 0) without tracebacks from the ranks."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from alf_entropy.storage import checkpoints as ckpt
from tests.distributed import workers
from tests.distributed.launch import REPO_ROOT, free_port, local_env, torchrun_cmd

# torchrun: the slow lane (pytest -m slow); plain pytest runs it.
pytestmark = pytest.mark.slow


def _gin_args(iterations):
    args = ["--gin_file", "ppo_cartpole", "--device", "cpu"]
    for p in workers.PPO_PARAMS + [f"OnPolicyTrainer.num_iterations = {iterations}"]:
        args += ["--gin_param", p]
    return args


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def test_sigterm_to_one_rank_stops_all_at_one_iteration(tmp_path):
    root = tmp_path / "run"
    cmd = torchrun_cmd(
        ["-m", "alf_entropy.bin.train", "--root_dir", str(root), *_gin_args(100_000)]
    )
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=local_env({"ALF_ENTROPY_DIST_TIMEOUT_S": "60"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not glob.glob(str(root / "checkpoints" / "ckpt-*.pt")):  # training is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        ranks = _children(proc.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[1], signal.SIGTERM)  # rank 1 only (a preempted node)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # Not finished: the ranks exit 143 (rank 0 first, torchrun then ends the other), so
    # torchrun fails (its report names 143) and whatever runs it does not count it done.
    assert proc.returncode != 0 and "exitcode  : 143" in err, err[-4000:]
    lines = [line for line in err.splitlines() if line.startswith("alf-entropy-train:")]
    assert len(lines) == 1 and "stopped by SIGTERM at iteration" in lines[0], err[-4000:]
    stopped = int(lines[0].split("at iteration ")[1].split()[0])
    state = ckpt.load_checkpoint(root / "checkpoints" / f"ckpt-{stopped:08d}.pt")
    # Both ranks' state at that iteration, taken between iterations (exact).
    assert state["iteration"] == stopped and state["world_size"] == 2
    assert state["env"] and state["rank_states"][0]["env"]
    tracebacks = err.split("Traceback (most recent call last)")[1:]
    assert all("ChildFailedError" in t for t in tracebacks), err[-4000:]  # torchrun's only


def test_config_error_is_printed_once_without_rank_tracebacks(tmp_path):
    """SAC's configs use one env: 2 ranks cannot split it."""
    port = str(free_port())
    procs = []
    for r in range(2):
        env = local_env(
            {
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            }
        )
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "alf_entropy.bin.train",
                    "--root_dir",
                    str(tmp_path / "run"),
                    "--gin_file",
                    "sac_pendulum",
                    "--device",
                    "cpu",
                ],
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert [rc for _, _, rc in results] == [2, 2]
    errors = [
        line
        for _, err, _ in results
        for line in err.splitlines()
        if line.startswith("alf-entropy-train: error:")
    ]
    assert len(errors) == 1, results
    assert "num_envs (1)" in errors[0] and "'OffPolicyTrainer.num_envs = 2'" in errors[0]
    assert errors[0] in results[0][1]  # rank 0's
    assert all("Traceback" not in err for _, err, _ in results)
    assert not os.path.exists(tmp_path / "run")
