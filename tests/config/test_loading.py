"""Tests for alf_entropy.config.loading, the registration and the shipped gin configs."""

import logging
import os

import gin
import pytest
import torch

from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm
from alf_entropy.algorithms.entropy_target_algorithm import EntropyTargetAlgorithm
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.config.loading import (
    CONFIG_DIR,
    GinConfigError,
    configured_trainer,
    find_gin_file,
    list_configs,
    one_line,
    parse_gin_config,
)
from alf_entropy.trainers.off_policy_trainer import OffPolicyTrainer
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

SHIPPED = [
    "ac_cartpole.gin",
    "ppo_cartpole.gin",
    "ppo_cartpole_scheduled_target.gin",
    "ppo_pendulum.gin",
    "ppo_lunarlander.gin",
]


def test_shipped_configs_are_listed_and_share_the_base():
    configs = list_configs()
    for name in SHIPPED + ["on_policy_base.gin"]:
        assert name in configs
    for name in SHIPPED:
        text = open(os.path.join(CONFIG_DIR, name)).read()
        assert "include 'on_policy_base.gin'" in text or "include 'ppo_cartpole.gin'" in text


def test_find_gin_file_by_path_or_name(tmp_path):
    assert find_gin_file("ppo_cartpole") == os.path.join(CONFIG_DIR, "ppo_cartpole.gin")
    assert find_gin_file("ppo_cartpole.gin") == os.path.join(CONFIG_DIR, "ppo_cartpole.gin")
    mine = tmp_path / "mine.gin"
    mine.write_text("include 'ppo_cartpole.gin'\n")
    assert find_gin_file(str(mine)) == str(mine)
    with pytest.raises(GinConfigError, match="not found.*ppo_cartpole.gin"):
        find_gin_file("nope")


def test_user_file_can_include_shipped_configs(tmp_path):
    mine = tmp_path / "mine.gin"
    mine.write_text("include 'ppo_cartpole.gin'\nPPOAlgorithm.num_epochs = 7\n")
    parse_gin_config([str(mine)])
    assert gin.query_parameter("PPOAlgorithm.num_epochs") == 7
    assert gin.query_parameter("OnPolicyTrainer.env_id") == "CartPole-v1"


def test_default_file_and_params_override():
    paths = parse_gin_config([], ["PPOAlgorithm.num_epochs = 2"])
    assert paths == [os.path.join(CONFIG_DIR, "ppo_cartpole.gin")]
    assert gin.query_parameter("PPOAlgorithm.num_epochs") == 2


@pytest.mark.parametrize(
    "params, match",
    [
        (["PPOAlgorithm.no_such_arg = 1"], "no_such_arg"),
        (["NoSuchThing.x = 1"], "NoSuchThing"),
        (["PPOAlgorithm.num_epochs = = 1"], "num_epochs|line"),
    ],
)
def test_bad_bindings_raise_one_line_errors(params, match):
    with pytest.raises(GinConfigError, match=match) as info:
        parse_gin_config(["ppo_cartpole.gin"], params)
    assert "\n" not in str(info.value)


def test_one_line_keeps_innermost_configurable():
    err = ValueError(
        "x must be > 0, got 0\n  In call to configurable 'A' (<class 'a.A'>)\n"
        "  In call to configurable 'B' (<class 'b.B'>)"
    )
    assert one_line(err) == "x must be > 0, got 0 (In call to configurable 'A')"


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_config_builds_and_trains_one_iteration(name, tmp_path):
    if name == "ppo_lunarlander.gin":
        pytest.importorskip("Box2D", reason="LunarLander needs the box2d extra")
    torch.set_num_threads(1)
    parse_gin_config(
        [name],
        [
            "OnPolicyTrainer.num_env_steps = None",
            "OnPolicyTrainer.num_iterations = 1",
            "OnPolicyTrainer.unroll_length = 8",
            "OnPolicyTrainer.eval_interval = None",
            "OnPolicyTrainer.progress_bar = False",
        ],
    )
    trainer = OnPolicyTrainer(str(tmp_path), device="cpu")
    alg = trainer.algorithm
    expected = ActorCriticAlgorithm if name.startswith("ac_") else PPOAlgorithm
    assert type(alg) is expected
    assert isinstance(alg.entropy_target_algorithm, EntropyTargetAlgorithm)
    assert trainer.train()["iteration"] == 1


@pytest.mark.parametrize("name", [n for n in list_configs() if n != "entropy_target_defaults.gin"])
def test_every_shipped_config_names_its_trainer(name):
    """``train.trainer`` is what alf-entropy-train builds: SAC configs off-policy."""
    parse_gin_config([name])
    expected = OffPolicyTrainer if name.startswith("sac_") else OnPolicyTrainer
    assert configured_trainer() is expected


def test_a_config_without_a_trainer_or_with_a_wrong_one_is_refused(tmp_path):
    mine = tmp_path / "mine.gin"
    mine.write_text("OnPolicyTrainer.num_iterations = 1\n")
    parse_gin_config([str(mine)])
    with pytest.raises(GinConfigError, match=r"train.trainer = @OnPolicyTrainer"):
        configured_trainer()
    parse_gin_config([str(mine)], ["train.trainer = 3"])
    with pytest.raises(GinConfigError, match="train.trainer must be a trainer class"):
        configured_trainer()
    # A class that is not a trainer: alf-entropy-train refuses it (tests/bin/test_train.py).
    parse_gin_config([str(mine)], ["train.trainer = @PPOAlgorithm"])
    assert configured_trainer() is PPOAlgorithm
    # The override a user gives on top of a shipped config wins.
    parse_gin_config(["ppo_cartpole"], ["train.trainer = @OffPolicyTrainer"])
    assert configured_trainer() is OffPolicyTrainer


def test_a_trainer_built_without_the_cli_leaves_the_binding_unused_silently(tmp_path, caplog):
    parse_gin_config(["ppo_cartpole"], ["OnPolicyTrainer.num_iterations = 1"])
    with caplog.at_level(logging.WARNING):
        OnPolicyTrainer(str(tmp_path / "run"), device="cpu").close()
    assert "train.trainer" not in caplog.text


def test_including_a_shipped_config_logs_no_search_path_errors(tmp_path, monkeypatch, caplog):
    """gin looks for an include in the current directory first; that miss is not logged."""
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine.gin"
    mine.write_text("include 'ppo_cartpole.gin'\n")
    with caplog.at_level(logging.DEBUG):
        parse_gin_config([str(mine)])
    assert gin.query_parameter("OnPolicyTrainer.env_id") == "CartPole-v1"  # via on_policy_base
    assert "Path not found" not in caplog.text and "system_path_file_exists" not in caplog.text
    # A missing include is still one clear error.
    mine.write_text("include 'no_such_config.gin'\n")
    with pytest.raises(GinConfigError, match="no_such_config.gin"):
        parse_gin_config([str(mine)])


def test_read_bindings_reads_gin_text_with_gins_parser():
    from alf_entropy.config.bindings import read_bindings, split_key, write_bindings

    text = (
        "import gin.torch.external_configurables\ninclude 'ppo_cartpole.gin'\n# a comment\n"
        "LR = 1e-3\nA.x = (1,\n    2)\ns/B.opt = @torch.optim.Adam\nC.f = \\\n"
        "    [@lr/Lin(), %LR, 'a = b', None]\n"
    )
    bindings = read_bindings(text)
    assert bindings == {
        "LR": "0.001",
        "A.x": "(1, 2)",
        "s/B.opt": "@torch.optim.Adam",
        "C.f": "[@lr/Lin(), %LR, 'a = b', None]",
    }
    assert read_bindings(write_bindings(bindings)) == bindings
    assert split_key("s/torch.optim.Adam.lr") == ("s", "Adam", "lr")
