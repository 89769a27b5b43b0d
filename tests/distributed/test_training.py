"""Data-parallel PPO and SAC on two gloo ranks (127.0.0.1): one model, one alpha,
resume, faults.

``ppo_run`` trains the shipped PPO CartPole config on two ranks for a few
iterations; the tests compare the ranks with each other, resume it with
``torchrun`` and kill a rank of a ``torchrun`` run.  ``test_sac_...`` does
the same comparison for SAC Pendulum with the staged controller.
"""

import glob
import math
import os
import shutil
import signal
import subprocess
import time

import pytest
import torch

from alf_entropy.storage import checkpoints as ckpt
from tests.distributed import workers
from tests.distributed.launch import REPO_ROOT, local_env, run_ranks, torchrun, torchrun_cmd
from tests.nests import assert_nests_equal

# torchrun: the slow lane (pytest -m slow); plain pytest runs it.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ppo")
    results = run_ranks("ppo_train", str(out), timeout_s=240)
    for r, res in enumerate(results):
        assert res.returncode == 0, f"rank {r} exited {res.returncode}:\n{res.stderr[-4000:]}"
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_parameters_and_controller_bit_identical_across_ranks(ppo_run):
    out, (r0, r1) = ppo_run
    assert r0["result"]["iteration"] == r1["result"]["iteration"] == workers.PPO_ITERATIONS
    # env_steps and scheduler progress count the global batch: 4 envs x 16 steps.
    assert r0["result"]["env_steps"] == r1["result"]["env_steps"] == workers.PPO_ITERATIONS * 64
    assert_nests_equal(r0["algorithm"], r1["algorithm"], "algorithm")
    for i, (o0, o1) in enumerate(zip(r0["optimizers"], r1["optimizers"])):
        for p, (s0, s1) in enumerate(zip(o0["state"].values(), o1["state"].values())):
            assert_nests_equal(s0, s1, f"optimizer {i} param {p}")
    controller = {k: v for k, v in r0["algorithm"].items() if "_entropy_target" in k}
    assert any(k.endswith("driver.log_alpha") for k in controller), list(r0["algorithm"])
    # The run trained: alpha moved away from the configured 0.01.
    log_alpha = next(v for k, v in controller.items() if k.endswith("driver.log_alpha"))
    assert abs(log_alpha.exp().item() - 0.01) > 1e-6
    # The checkpoint (rank 0's) holds the same model and both ranks' RNGs/envs.
    state = ckpt.load_checkpoint(os.path.join(out, "run", "checkpoints", "ckpt-00000004.pt"))
    assert_nests_equal(state["algorithm"], r0["algorithm"], "checkpoint")
    assert state["world_size"] == 2 and len(state["rank_states"]) == 1
    assert not torch.equal(state["rng"]["torch"], state["rank_states"][0]["rng"]["torch"])
    assert state["env"] and state["rank_states"][0]["env"]


def test_rank_zero_alone_writes_files(ppo_run):
    out, _ = ppo_run
    run = out / "run"
    assert len(glob.glob(str(run / "train" / "events.out.tfevents.*"))) == 1
    assert (run / "operative_config.gin").exists()
    assert sorted(os.listdir(run / "checkpoints")) == ["ckpt-00000002.pt", "ckpt-00000004.pt"]


def _gin_args(iterations):
    args = ["--gin_file", "ppo_cartpole", "--device", "cpu"]
    for p in workers.PPO_PARAMS + [f"OnPolicyTrainer.num_iterations = {iterations}"]:
        args += ["--gin_param", p]
    return args


def test_torchrun_resume_equals_uninterrupted_run(ppo_run, tmp_path):
    """Restart from the 2-rank run's checkpoint at iteration 2 under torchrun:
    the final checkpoint equals the uninterrupted run's, tensor for tensor."""
    out, _ = ppo_run
    root = tmp_path / "resumed"
    os.makedirs(root / "checkpoints")
    shutil.copy(out / "run" / "checkpoints" / "ckpt-00000002.pt", root / "checkpoints")
    res = torchrun(
        ["-m", "alf_entropy.bin.train", "--root_dir", str(root), *_gin_args(workers.PPO_ITERATIONS)]
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert res.stderr.count("Resumed from") == 2  # both ranks
    assert res.stdout.count("alf-entropy-train: done: 4 iterations") == 1  # rank 0 reports
    want = ckpt.load_checkpoint(out / "run" / "checkpoints" / "ckpt-00000004.pt")
    got = ckpt.load_checkpoint(root / "checkpoints" / "ckpt-00000004.pt")
    assert_nests_equal(got["algorithm"], want["algorithm"], "resumed algorithm")
    assert got["env_steps"] == want["env_steps"] and got["progress"] == want["progress"]
    for a, b in zip(
        [got["rng"]] + [s["rng"] for s in got["rank_states"]],
        [want["rng"]] + [s["rng"] for s in want["rank_states"]],
    ):
        assert torch.equal(a["torch"], b["torch"])


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def test_torchrun_killed_rank_fails_the_run(tmp_path):
    """SIGKILL one rank mid-run: the run exits non-zero in bounded time and says why."""
    root = tmp_path / "killed"
    args = _gin_args(10_000)
    cmd = torchrun_cmd(["-m", "alf_entropy.bin.train", "--root_dir", str(root), *args])
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=local_env({"ALF_ENTROPY_DIST_TIMEOUT_S": "10"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not glob.glob(str(root / "checkpoints" / "ckpt-*.pt")):  # training is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.2)
        ranks = _children(proc.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[1], signal.SIGKILL)
        killed_at = time.monotonic()
        output, _ = proc.communicate(timeout=60)
        elapsed = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    assert elapsed < 30
    assert "Signal 9 (SIGKILL)" in output or "exitcode  : -9" in output, output[-4000:]


def test_num_envs_must_divide_over_the_ranks(monkeypatch, tmp_path):
    from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

    monkeypatch.setenv("WORLD_SIZE", "2")  # checked before any process group is made
    with pytest.raises(
        ValueError,
        match=r"num_envs \(3\) is the total over all ranks and "
        r"must be divisible by the number of ranks \(2\)",
    ):
        OnPolicyTrainer(str(tmp_path), num_envs=3, num_iterations=1, device="cpu")


def test_sac_parameters_and_controller_bit_identical_across_ranks(tmp_path):
    results = run_ranks("sac_train", str(tmp_path), timeout_s=240)
    for r, res in enumerate(results):
        assert res.returncode == 0, f"rank {r} exited {res.returncode}:\n{res.stderr[-4000:]}"
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2))
    assert r0["result"]["env_steps"] == r1["result"]["env_steps"] == 80  # global count
    assert_nests_equal(r0["algorithm"], r1["algorithm"], "algorithm")
    for i, (o0, o1) in enumerate(zip(r0["optimizers"], r1["optimizers"])):
        for p, (s0, s1) in enumerate(zip(o0["state"].values(), o1["state"].values())):
            assert_nests_equal(s0, s1, f"optimizer {i} param {p}")
    (log_alpha,) = [v for k, v in r0["algorithm"].items() if k.endswith("driver.log_alpha")]
    assert abs(log_alpha.item() - math.log(0.1)) > 1e-6  # the staged controller moved
    # Each rank's replay buffer (its own transitions) is in rank 0's checkpoint.
    state = ckpt.load_checkpoint(tmp_path / "run" / "checkpoints" / "ckpt-00000040.pt")
    bufs = [state["extra"]["replay_buffer"], state["rank_states"][0]["extra"]["replay_buffer"]]
    assert [b["size"] for b in bufs] == [40, 40]  # one env per rank, 40 iterations
    # The ranks stepped different envs: their transitions differ.
    assert not torch.equal(bufs[0]["data"][0], bufs[1]["data"][0])


def test_torchrun_resumes_a_single_process_checkpoint(tmp_path):
    """A 1-process run continued on 2 ranks: shared state restored, episodes restart."""

    from alf_entropy.config.loading import parse_gin_config
    from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

    root = tmp_path / "grown"
    parse_gin_config(["ppo_cartpole"], workers.PPO_PARAMS + ["OnPolicyTrainer.num_iterations = 2"])
    single = OnPolicyTrainer(str(root), device="cpu")
    single.train()
    saved = ckpt.load_checkpoint(root / "checkpoints" / "ckpt-00000002.pt")
    res = torchrun(["-m", "alf_entropy.bin.train", "--root_dir", str(root), *_gin_args(3)])
    assert res.returncode == 0, res.stderr[-4000:]
    assert "was written by 1 rank(s), this run has 2" in res.stderr
    final = ckpt.load_checkpoint(root / "checkpoints" / "ckpt-00000003.pt")
    assert final["world_size"] == 2 and final["env_steps"] == saved["env_steps"] + 64
    # Training went on from the restored networks.
    assert any(
        not torch.equal(final["algorithm"][k], v)
        for k, v in saved["algorithm"].items()
        if v.is_floating_point()
    )
