"""Tests for alf_entropy.trainers.on_policy_trainer (loop, summaries, resume)."""

import copy
import functools
import glob
import os

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.config.loading import parse_gin_config
from alf_entropy.environments import GymVectorEnv
from alf_entropy.storage.checkpoints import atomic_write_bytes, latest_checkpoint
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer, stack_experiences
from alf_entropy.trainers.ranks import resolve_device
from alf_entropy.utils import schedulers

pytestmark = pytest.mark.usefixtures("one_thread")


def _scalars(root_dir):
    ea = EventAccumulator(os.path.join(root_dir, "train"), size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def _ppo_ctor(**kwargs):
    kwargs.setdefault("enforce_entropy_target", True)
    kwargs.setdefault("num_minibatches", 2)
    kwargs.setdefault("num_epochs", 2)
    return functools.partial(PPOAlgorithm, **kwargs)


def _trainer(root_dir, **kwargs):
    kwargs.setdefault("algorithm_ctor", _ppo_ctor())
    kwargs.setdefault("num_envs", 2)
    kwargs.setdefault("unroll_length", 16)
    kwargs.setdefault("progress_bar", False)
    kwargs.setdefault("device", "cpu")
    return OnPolicyTrainer(str(root_dir), **kwargs)


def test_train_writes_summaries_checkpoints_and_config(tmp_path):
    trainer = _trainer(
        tmp_path,
        num_iterations=4,
        summary_interval=2,
        checkpoint_interval=2,
        eval_interval=4,
        num_eval_episodes=2,
    )
    result = trainer.train()
    assert result["iteration"] == 4 and result["env_steps"] == 4 * 16 * 2
    assert result["eval_return"] is not None
    ckpts = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "checkpoints" / "*")))
    assert ckpts == ["ckpt-00000002.pt", "ckpt-00000004.pt"]
    assert os.path.isfile(tmp_path / "operative_config.gin")
    scalars = _scalars(str(tmp_path))
    for tag in (
        "alpha",
        "entropy",
        "target_entropy",
        "stage",
        "loss/total",
        "steps_per_sec",
        "eval/return",
    ):
        assert tag in scalars, tag
    # Gated by summary_interval: iterations 0 and 2 only.
    assert [s for s, _ in scalars["alpha"]] == [0, 2]
    # Eval at the start (untrained) and at the end.
    assert [s for s, _ in scalars["eval/return"]] == [0, 4]
    assert schedulers.get_progress("iterations") == 4
    assert schedulers.get_progress("percent") == 1.0
    assert schedulers.get_progress("env_steps") == 128


def test_stop_eval_return_stops_early(tmp_path):
    trainer = _trainer(
        tmp_path, num_iterations=10, eval_interval=2, num_eval_episodes=2, stop_eval_return=0.0
    )
    result = trainer.train()
    assert result["iteration"] == 2 and result["eval_return"] >= 0.0
    assert 0.0 < result["eval_time"] < result["wall_time"]
    assert latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-00000002.pt")
    with pytest.raises(ValueError, match="eval_interval"):
        _trainer(tmp_path / "x", num_iterations=2, stop_eval_return=1.0)


def test_num_env_steps_rounds_up_to_iterations(tmp_path):
    trainer = _trainer(tmp_path, num_env_steps=100)
    assert trainer.total_iterations == 4  # 32 steps per iteration
    assert trainer.num_iterations is None  # as given


class _Crash(Exception):
    pass


def _crashing_env_ctor(crash_after_steps):
    """A GymVectorEnv whose step() raises after ``crash_after_steps`` calls."""

    class CrashingEnv(GymVectorEnv):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.steps = 0

        def step(self, action):
            self.steps += 1
            if crash_after_steps is not None and self.steps > crash_after_steps:
                raise _Crash("simulated crash")
            return super().step(action)

    return CrashingEnv


def test_resume_after_crash_continues_from_checkpoint(tmp_path, monkeypatch):
    saved = {}
    original_save = OnPolicyTrainer.save_checkpoint

    def recording_save(self):
        controller = self.algorithm.entropy_target_algorithm
        saved[self.iteration] = copy.deepcopy(controller.state_dict())
        return original_save(self)

    monkeypatch.setattr(OnPolicyTrainer, "save_checkpoint", recording_save)
    unroll = 16
    # Crash in the middle of iteration 3 (0-based), after checkpoint 2.
    trainer = _trainer(
        tmp_path,
        num_iterations=6,
        checkpoint_interval=2,
        env_ctor=_crashing_env_ctor(crash_after_steps=3 * unroll + 5),
    )
    with pytest.raises(_Crash):
        trainer.train()
    assert latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-00000002.pt")
    assert list(saved) == [2]

    resumed = _trainer(
        tmp_path,
        num_iterations=6,
        checkpoint_interval=2,
        env_ctor=_crashing_env_ctor(crash_after_steps=None),
    )
    assert resumed.restored_from.endswith("ckpt-00000002.pt")
    assert resumed.iteration == 2 and resumed.env_steps == 2 * unroll * 2
    state = resumed.algorithm.entropy_target_algorithm.state_dict()
    for key, value in saved[2].items():
        torch.testing.assert_close(state[key], value)
    assert schedulers.get_progress("iterations") == 2
    assert schedulers.get_progress("percent") == pytest.approx(2 / 6)

    counted = []
    original_iter = OnPolicyTrainer._train_iteration

    def counting_iter(self, *args):
        counted.append(self.iteration)
        return original_iter(self, *args)

    monkeypatch.setattr(OnPolicyTrainer, "_train_iteration", counting_iter)
    result = resumed.train()
    assert counted == [2, 3, 4, 5]
    assert result["iteration"] == 6
    assert sorted(saved) == [2, 4, 6]


def test_keyboard_interrupt_saves_a_checkpoint(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, num_iterations=5, checkpoint_interval=None)
    original_iter = OnPolicyTrainer._train_iteration

    def interrupting_iter(self, *args):
        if self.iteration == 2:
            raise KeyboardInterrupt
        return original_iter(self, *args)

    monkeypatch.setattr(OnPolicyTrainer, "_train_iteration", interrupting_iter)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-00000002.pt")
    monkeypatch.setattr(OnPolicyTrainer, "_train_iteration", original_iter)
    resumed = _trainer(tmp_path, num_iterations=5, checkpoint_interval=None)
    torch.testing.assert_close(
        resumed.algorithm.state_dict()["_entropy_target_algorithm.driver.log_alpha"],
        trainer.algorithm.state_dict()["_entropy_target_algorithm.driver.log_alpha"],
    )
    assert resumed.train()["iteration"] == 5


def test_rng_and_optimizer_state_restored(tmp_path):
    trainer = _trainer(tmp_path, num_iterations=2, checkpoint_interval=None)
    trainer.train()
    rng_after = torch.get_rng_state()
    opt_state = trainer.algorithm.optimizers()[0].state_dict()
    torch.manual_seed(1234)  # scramble
    resumed = _trainer(tmp_path, num_iterations=3)
    assert torch.equal(torch.get_rng_state(), rng_after)
    new_state = resumed.algorithm.optimizers()[0].state_dict()
    some = next(iter(opt_state["state"]))
    torch.testing.assert_close(
        new_state["state"][some]["exp_avg"], opt_state["state"][some]["exp_avg"]
    )


def test_checkpoint_mismatch_is_a_clear_error(tmp_path):
    _trainer(tmp_path, num_iterations=1).train()
    a2c = functools.partial(ActorCriticAlgorithm, enforce_entropy_target=False)
    # The run directory's config names the other algorithm: refused first.
    with pytest.raises(ValueError, match="another configuration"):
        _trainer(tmp_path, num_iterations=2, algorithm_ctor=a2c)
    # Allowed to change the config, the checkpoint still cannot fit A2C.
    with pytest.raises(ValueError, match="does not match"):
        _trainer(tmp_path, num_iterations=2, algorithm_ctor=a2c, allow_config_change=True)


def test_atomic_write_leaves_no_partial_file(tmp_path):
    path = str(tmp_path / "f.bin")

    def failing(f):
        f.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write_bytes(path, failing)
    assert os.listdir(tmp_path) == []
    atomic_write_bytes(path, lambda f: f.write(b"ok"))
    assert open(path, "rb").read() == b"ok"
    assert os.listdir(tmp_path) == ["f.bin"]


def test_max_checkpoints_keeps_the_latest(tmp_path):
    _trainer(tmp_path, num_iterations=5, checkpoint_interval=1, max_checkpoints=2).train()
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert names == ["ckpt-00000004.pt", "ckpt-00000005.pt"]


def test_stack_experiences():
    nests = [{"a": torch.full((2,), float(t)), "b": (torch.zeros(2, 3),)} for t in range(4)]
    stacked = stack_experiences(nests)
    assert stacked["a"].shape == (4, 2) and stacked["b"][0].shape == (4, 2, 3)
    assert stacked["a"][:, 0].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        stack_experiences([])


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            resolve_device("cuda")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(), "at least one of num_iterations and num_env_steps"),
        (dict(num_iterations=0, num_env_steps=None), "at least one"),
        (dict(num_iterations=-1, num_env_steps=10), "num_iterations must be"),
        (dict(num_env_steps=2.5), "num_env_steps must be"),
        (dict(num_iterations=2, unroll_length=0), "unroll_length"),
        (dict(num_iterations=2, summary_interval=-1), "summary_interval"),
        (dict(num_iterations=2, summary_flush_secs=-1), "summary_flush_secs"),
        (dict(num_iterations=2, seed=-1), "seed"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _trainer(tmp_path, **kwargs)


def test_scheduled_target_config_follows_the_schedule(tmp_path):
    parse_gin_config(
        ["ppo_cartpole_scheduled_target.gin"],
        [
            "OnPolicyTrainer.num_env_steps = None",
            "OnPolicyTrainer.num_iterations = 5",
            "OnPolicyTrainer.unroll_length = 16",
            "OnPolicyTrainer.num_envs = 2",
            "OnPolicyTrainer.summary_interval = 1",
            "OnPolicyTrainer.eval_interval = None",
            "OnPolicyTrainer.progress_bar = False",
        ],
    )
    trainer = OnPolicyTrainer(str(tmp_path), device="cpu")
    trainer.train()
    target = dict(_scalars(str(tmp_path))["target_entropy"])
    assert sorted(target) == [0, 1, 2, 3, 4]
    for step, value in target.items():
        percent = step / 5
        assert value == pytest.approx(0.65 + (0.45 - 0.65) * percent, abs=1e-6)


@pytest.mark.slow
def test_seeded_ppo_cartpole_learns(tmp_path):
    """A few thousand steps of seeded PPO clearly beat the untrained policy."""
    trainer = _trainer(
        tmp_path,
        algorithm_ctor=_ppo_ctor(
            num_epochs=4, num_minibatches=4, optimizer=functools.partial(torch.optim.Adam, lr=3e-3)
        ),
        num_envs=8,
        unroll_length=64,
        num_iterations=8,  # 4096 env steps
        summary_interval=100,
        eval_interval=8,
        num_eval_episodes=8,
        seed=3,
    )
    before = trainer.evaluate()
    after = trainer.train()["eval_return"]
    # The untrained policy is near-uniform and its mode keeps pushing one
    # way (~9-10 steps); the trained one balances many times longer.
    assert before < 30
    assert after > 3 * before and after > 60, (before, after)
