"""OffPolicyTrainer: buffer and limits, checkpoints holding the buffer, exact
resume after SIGKILL, bad inputs."""

import glob
import os
import random
import signal
import subprocess
import sys
import time

import gin
import pytest
import torch

from alf_entropy.config.loading import parse_gin_config
from alf_entropy.environments.gym_vector_env import GymVectorEnv
from alf_entropy.storage.checkpoints import latest_checkpoint, load_checkpoint
from alf_entropy.trainers.off_policy_trainer import OffPolicyTrainer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# sac_pendulum.gin shrunk to a few seconds: small networks and batches.
SMALL = [
    "OffPolicyTrainer.num_env_steps = 240",
    "OffPolicyTrainer.initial_collect_steps = 100",
    "OffPolicyTrainer.mini_batch_size = 32",
    "OffPolicyTrainer.summary_interval = 50",
    "OffPolicyTrainer.eval_interval = None",
    "OffPolicyTrainer.checkpoint_interval = 40",
    "OffPolicyTrainer.progress_bar = False",
    "OffPolicyTrainer.device = 'cpu'",
    "ActorDistributionNetwork.fc_layer_params = (16,)",
    "CriticNetworks.fc_layer_params = (16,)",
]


def _trainer(root, gin_file="sac_pendulum.gin", params=(), **kwargs):
    parse_gin_config([gin_file], SMALL + list(params))
    return OffPolicyTrainer(root_dir=str(root), **kwargs)


def test_random_then_policy_actions_fill_the_buffer_and_train(tmp_path):
    trainer = _trainer(tmp_path, num_env_steps=150)
    critic0 = [p.clone() for p in trainer.algorithm.critic_networks.parameters()]
    trainer.train()
    buf = trainer.replay_buffer
    assert buf.size == 150 and trainer.env_steps == 150
    data = buf.state_dict()["data"]
    actions = [x for x in data if x.shape == (150, 1)][0]
    assert actions.abs().max() <= 2.0 and actions.std() > 0.5  # uniform on [-2, 2] first
    # 51 updates (from the 100th step on) changed the critics
    critic = trainer.algorithm.critic_networks.parameters()
    assert any(not torch.equal(a, b) for a, b in zip(critic0, critic))
    ckpt = load_checkpoint(latest_checkpoint(str(tmp_path / "checkpoints")))
    assert ckpt["extra"]["replay_buffer"]["size"] == 150


def test_discrete_actions_and_num_iterations_limit(tmp_path):
    trainer = _trainer(
        tmp_path,
        "sac_cartpole.gin",
        [
            "OffPolicyTrainer.num_iterations = 60",
            "OffPolicyTrainer.initial_collect_steps = 20",
            "OffPolicyTrainer.stop_eval_return = None",
        ],
        num_envs=2,
    )
    result = trainer.train()
    assert result["iteration"] == 60 and result["env_steps"] == 120  # num_iterations binds
    actions = [x for x in trainer.replay_buffer.state_dict()["data"] if x.dtype == torch.int64][0]
    assert set(actions.tolist()) == {0, 1}


def test_checkpoint_without_buffer_warns_and_refills(tmp_path, caplog):
    trainer = _trainer(tmp_path, checkpoint_replay_buffer=False, num_env_steps=120)
    trainer.train()
    latest = load_checkpoint(latest_checkpoint(str(tmp_path / "checkpoints")))
    assert "replay_buffer" not in latest["extra"]
    gin.clear_config()
    resumed = _trainer(tmp_path, checkpoint_replay_buffer=False, num_env_steps=200)
    assert resumed.replay_buffer.size == 0
    assert "not bit-exact" in caplog.text or "approximate" in caplog.text
    critic = [p.clone() for p in resumed.algorithm.critic_networks.parameters()]
    resumed.train()  # 80 steps: fewer than the 100 to refill, so no update
    resumed_critic = resumed.algorithm.critic_networks.parameters()
    assert all(torch.equal(a, b) for a, b in zip(critic, resumed_critic))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mini_batch_size": 64, "replay_buffer_length": 32}, "mini_batch_size"),
        ({"num_envs": 8, "replay_buffer_length": 4, "mini_batch_size": 4}, "num_envs"),
        ({"initial_collect_steps": 500}, "initial_collect_steps"),
        ({"initial_collect_steps": -1}, "initial_collect_steps"),
        ({"num_updates_per_train_iter": 0}, "num_updates_per_train_iter"),
        ({"num_env_steps": None, "num_iterations": None}, "at least one"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    """Refused before anything is built or set: no environment, the thread count kept."""
    built, threads = [], torch.get_num_threads()

    def env_ctor(*args, **ctor_kwargs):
        built.append(args)
        return GymVectorEnv(*args, **ctor_kwargs)

    with pytest.raises(ValueError, match=match):
        _trainer(tmp_path, env_ctor=env_ctor, num_threads=threads + 1, **kwargs)
    assert built == [] and torch.get_num_threads() == threads


def _cli(root, extra=()):
    args = [
        sys.executable,
        "-m",
        "alf_entropy.bin.train",
        "--root_dir",
        str(root),
        "--gin_file",
        "sac_pendulum.gin",
    ]
    for p in SMALL + list(extra):
        args += ["--gin_param", p]
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return args, env


@pytest.mark.slow
def test_kill_and_restart_gives_the_uninterrupted_final_checkpoint(tmp_path):
    """SIGKILL a SAC run at random moments, restart it with the same command:
    its final checkpoint equals an uninterrupted run's, tensor for tensor."""
    args, env = _cli(tmp_path / "straight")
    subprocess.run(args, env=env, check=True, capture_output=True, timeout=300)
    straight = os.path.join(tmp_path, "straight", "checkpoints")
    reference = load_checkpoint(os.path.join(straight, "ckpt-00000240.pt"))
    # The time between two checkpoints of that run: a kill at a random moment
    # within half of it lands before the next checkpoint, whatever the load.
    mtimes = sorted(os.path.getmtime(p) for p in glob.glob(os.path.join(straight, "ckpt-*.pt")))
    between = (mtimes[-1] - mtimes[0]) / max(len(mtimes) - 1, 1)

    rng = random.Random(0)
    args, env = _cli(tmp_path / "killed")
    ckpt_dir = tmp_path / "killed" / "checkpoints"
    for kill in range(2):
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 240
        # wait for a new checkpoint, then kill at a random moment after it
        start = latest_checkpoint(str(ckpt_dir))
        while (
            latest_checkpoint(str(ckpt_dir)) == start
            and proc.poll() is None
            and time.time() < deadline
        ):
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5 * between))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL  # killed mid-run, not finished
        assert latest_checkpoint(str(ckpt_dir)) != os.path.join(ckpt_dir, "ckpt-00000240.pt")
    subprocess.run(args, env=env, check=True, capture_output=True, timeout=300)
    final = load_checkpoint(os.path.join(ckpt_dir, "ckpt-00000240.pt"))

    def _tensors(state, prefix=""):
        if torch.is_tensor(state):
            yield prefix, state
        elif isinstance(state, dict):
            for k, v in state.items():
                yield from _tensors(v, f"{prefix}/{k}")
        elif isinstance(state, (list, tuple)):
            for i, v in enumerate(state):
                yield from _tensors(v, f"{prefix}/{i}")

    ref = dict(_tensors({k: reference[k] for k in ("algorithm", "optimizers", "extra", "rng")}))
    got = dict(_tensors({k: final[k] for k in ("algorithm", "optimizers", "extra", "rng")}))
    assert ref.keys() == got.keys()
    assert len(ref) > 30
    for k in ref:
        assert torch.equal(ref[k], got[k]), k
