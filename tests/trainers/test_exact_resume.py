"""Exact resume (issue 8.2): a run killed with SIGKILL and restarted with the
same arguments ends with the same checkpoint, tensor for tensor, as a run that
never stopped; a kill during a checkpoint write leaves no partial checkpoint.

Each training runs in a forked child process (fast to start: torch is already
imported), which is what gets ``SIGKILL``-ed.
"""

import functools
import glob
import multiprocessing
import os
import random
import signal
import time

import gin
import pytest
import torch

from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.environments import GymVectorEnv
from alf_entropy.storage import checkpoints as ckpt
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer
from alf_entropy.utils import schedulers
from tests.nests import assert_nests_equal

# Fork children inherit the thread pool settings; one thread also avoids
# forking a process with busy OpenMP workers.
# Killed and restarted child processes: the slow lane (pytest -m slow).
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

_CTX = multiprocessing.get_context("fork")
NUM_ITERATIONS = 12


def _train(root_dir: str, env_id: str) -> None:
    """The training "command": always the same arguments (child process)."""
    torch.set_num_threads(1)
    gin.clear_config()
    extra = {}
    if env_id == "Pendulum-v1":
        from alf_entropy.networks import ActorDistributionNetwork

        extra["actor_network_ctor"] = functools.partial(
            ActorDistributionNetwork, squash_to_spec=True
        )
    trainer = OnPolicyTrainer(
        root_dir,
        env_id=env_id,
        num_envs=2,
        unroll_length=40,  # CartPole episodes end inside iterations; Pendulum's 200-step ones too
        num_iterations=NUM_ITERATIONS,
        algorithm_ctor=functools.partial(
            PPOAlgorithm, enforce_entropy_target=True, num_epochs=2, num_minibatches=2, **extra
        ),
        checkpoint_interval=1,
        summary_interval=3,
        progress_bar=False,
        device="cpu",
        seed=7,
    )
    trainer.train()


def _latest_iteration(root_dir: str) -> int:
    path = ckpt.latest_checkpoint(os.path.join(root_dir, "checkpoints"))
    return -1 if path is None else int(os.path.basename(path)[5:13])


def run_killing(train, root_dir: str, kills: int = 0, rng=None, iteration_time: float = 0.0) -> int:
    """Run ``train(root_dir)`` in a forked process; ``kills`` times, SIGKILL it and restart.

    Each kill waits until the process has written a new checkpoint (so the
    run progresses), then a random time of up to one iteration (so the kill
    lands anywhere in an iteration, checkpoint writes included).  Returns the
    number of kills done.
    """
    done = 0
    while True:
        proc = _CTX.Process(target=train, args=(root_dir,))
        start = _latest_iteration(root_dir)
        proc.start()
        if done < kills:
            deadline = time.time() + 120
            while (
                proc.is_alive() and _latest_iteration(root_dir) <= start and time.time() < deadline
            ):
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, iteration_time))
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                proc.join()
                done += 1
                continue
        proc.join(300)
        assert proc.exitcode == 0, (
            f"training process exited with {proc.exitcode} after {done} kills, "
            f"at iteration {_latest_iteration(root_dir)}"
        )
        return done


def _run_to_completion(
    root_dir: str, env_id: str, kills: int = 0, rng=None, iteration_time: float = 0.0
) -> int:
    """:func:`run_killing` of this file's training run on ``env_id``."""
    train = functools.partial(_train, env_id=env_id)
    return run_killing(train, root_dir, kills, rng, iteration_time)


def _final_state(root_dir: str) -> dict:
    path = ckpt.latest_checkpoint(os.path.join(root_dir, "checkpoints"))
    assert path.endswith(f"ckpt-{NUM_ITERATIONS:08d}.pt"), path
    return ckpt.load_checkpoint(path)


def assert_same_final_checkpoint(reference_dir: str, killed_dir: str, iterations: int) -> None:
    """The two runs' latest checkpoints are at ``iterations`` and equal bit for bit
    (parameters, optimisers, RNG, the trainer's extra state, the environments' time step)."""
    expected, got = [
        ckpt.load_checkpoint(ckpt.latest_checkpoint(os.path.join(d, "checkpoints")))
        for d in (reference_dir, killed_dir)
    ]
    assert got["iteration"] == expected["iteration"] == iterations
    for key in ("algorithm", "optimizers", "rng", "extra"):
        assert_nests_equal(got[key], expected[key])
    assert_nests_equal(got["env"]["time_step"], expected["env"]["time_step"])


def _continue(state: dict, env_id: str) -> list:
    """Observations and rewards of 300 steps of the saved envs under fixed actions."""
    env = GymVectorEnv(env_id, num_envs=2, seed=123)
    env.set_state(ckpt.tensor_to_bytes(state["env"]["state"]))
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(300):
        if env_id == "CartPole-v1":
            action = torch.randint(0, 2, (2,), generator=gen)
        else:
            action = torch.rand(2, 1, generator=gen) * 4 - 2
        ts = env.step(action)
        out += [ts.observation, ts.reward, ts.step_type]
    out.append(env.pop_episode_statistics())
    env.close()
    return out


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_sigkill_and_restart_gives_the_uninterrupted_checkpoint(tmp_path, env_id):
    schedulers.reset_progress()
    reference = str(tmp_path / "reference")
    _run_to_completion(reference, env_id)
    expected = _final_state(reference)
    # One iteration's time, from the spacing of the last checkpoints (one per
    # iteration): the whole run's time over its iterations would include the
    # process start and let a "random moment" span several iterations.
    saved = glob.glob(os.path.join(reference, "checkpoints", "ckpt-*.pt"))
    mtimes = sorted(os.path.getmtime(path) for path in saved)
    iteration_time = (mtimes[-1] - mtimes[0]) / max(len(mtimes) - 1, 1)

    interrupted = str(tmp_path / "interrupted")
    kills = _run_to_completion(
        interrupted, env_id, kills=3, rng=random.Random(env_id), iteration_time=iteration_time
    )
    assert kills == 3, f"only {kills} kills: the run ended first"
    got = _final_state(interrupted)
    assert_nests_equal(got["algorithm"], expected["algorithm"])
    assert_nests_equal(got["optimizers"], expected["optimizers"])
    assert_nests_equal(got["rng"], expected["rng"])
    assert_nests_equal(got["env"]["time_step"], expected["env"]["time_step"])
    # The pickled envs differ in wall-clock episode start times only: they
    # must continue identically.
    assert_nests_equal(_continue(got, env_id), _continue(expected, env_id))
    assert got["progress"] == expected["progress"]
    assert (got["iteration"], got["env_steps"]) == (expected["iteration"], expected["env_steps"])


def _train_with_slow_third_save(root_dir: str, marker: str) -> None:
    """Train, but hang in the middle of writing the third checkpoint (child process)."""
    real_save = torch.save
    calls = []

    def slow_save(obj, f):
        calls.append(1)
        if len(calls) < 3:
            return real_save(obj, f)
        import io

        buffer = io.BytesIO()
        real_save(obj, buffer)
        data = buffer.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        open(marker, "w").close()
        time.sleep(120)  # killed here

    torch.save = slow_save
    _train(root_dir, "CartPole-v1")


def test_kill_during_a_checkpoint_write_leaves_no_partial_checkpoint(tmp_path):
    root = str(tmp_path / "run")
    marker = str(tmp_path / "writing")
    proc = _CTX.Process(target=_train_with_slow_third_save, args=(root, marker))
    proc.start()
    deadline = time.time() + 120
    while not os.path.exists(marker) and time.time() < deadline and proc.is_alive():
        time.sleep(0.02)
    assert os.path.exists(marker), "the child never reached the third checkpoint write"
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()

    ckpt_dir = os.path.join(root, "checkpoints")
    names = sorted(os.listdir(ckpt_dir))
    partial = [n for n in names if n.endswith(".tmp")]
    assert len(partial) == 1 and partial[0].startswith(".ckpt-00000003.pt")
    # Only complete checkpoints carry the final name, and each one loads.
    assert [n for n in names if not n.endswith(".tmp")] == ["ckpt-00000001.pt", "ckpt-00000002.pt"]
    for name in ("ckpt-00000001.pt", "ckpt-00000002.pt"):
        assert ckpt.load_checkpoint(os.path.join(ckpt_dir, name))["iteration"] == int(name[5:13])
    assert ckpt.latest_checkpoint(ckpt_dir).endswith("ckpt-00000002.pt")

    # The same command resumes from iteration 2 and removes the partial file.
    _run_to_completion(root, "CartPole-v1")
    names = sorted(os.listdir(ckpt_dir))
    assert not [n for n in names if n.endswith(".tmp")], names
    assert _final_state(root)["iteration"] == NUM_ITERATIONS


class _UnpicklableEnv(GymVectorEnv):
    """Stands for an environment whose state cannot be saved (e.g. Box2D's)."""

    def get_state(self):
        return None


def test_unsaveable_envs_restart_episodes_with_one_warning(tmp_path, caplog):
    kwargs = dict(
        num_envs=2,
        unroll_length=16,
        env_ctor=_UnpicklableEnv,
        progress_bar=False,
        device="cpu",
        algorithm_ctor=functools.partial(PPOAlgorithm, num_epochs=1),
    )
    OnPolicyTrainer(str(tmp_path), num_iterations=2, **kwargs).train()
    assert ckpt.load_checkpoint(ckpt.latest_checkpoint(str(tmp_path / "checkpoints")))["env"] == {}
    caplog.clear()
    with caplog.at_level("WARNING"):
        result = OnPolicyTrainer(str(tmp_path), num_iterations=4, **kwargs).train()
    assert result["iteration"] == 4
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "episodes restart" in warnings[0].getMessage()


def test_box2d_envs_are_not_saveable_and_classic_control_ones_are():
    pytest.importorskip("Box2D")
    for env_id, saveable in [
        ("LunarLander-v3", False),
        ("CartPole-v1", True),
        ("Pendulum-v1", True),
    ]:
        with GymVectorEnv(env_id, num_envs=2) as env:
            env.reset()
            assert (env.get_state() is not None) == saveable, env_id


def test_a_restored_time_step_moves_to_the_device_nested_fields_too() -> None:
    """Dict observations and actions of a restored time step (read on the CPU) go to the
    run's device like its top-level fields ('meta' stands in for a GPU)."""
    import types

    from alf_entropy.storage import checkpoints as ckpt
    from alf_entropy.trainers.run import Run

    restored = dict(
        step_type=torch.zeros(2, dtype=torch.int64),
        reward=torch.zeros(2),
        discount=torch.ones(2),
        observation={"pos": torch.zeros(2, 3), "vel": torch.zeros(2, 3)},
        prev_action={"a": torch.zeros(2)},
        env_id=torch.arange(2),
        env_info={},
    )
    env = types.SimpleNamespace(set_state=lambda state: None)
    run = types.SimpleNamespace(
        _env_ctor=lambda *args, **kwargs: env,
        _env_id="X",
        _num_envs=2,
        device=torch.device("meta"),
        _agents=types.SimpleNamespace(seed=0),
        iteration=0,
        _restored_env={"state": ckpt.bytes_to_tensor(b"x"), "time_step": restored},
    )
    _, time_step = Run._start_env(run)
    leaves = [time_step.reward, *time_step.observation.values(), time_step.prev_action["a"]]
    assert {leaf.device.type for leaf in leaves} == {"meta"}
