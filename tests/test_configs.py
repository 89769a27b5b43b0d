"""Every shipped .gin file parses, and the documented defaults are the real ones."""

import glob
import inspect
import os
import re

import gin
import pytest
import torch

from alf_entropy.algorithms.entropy_target_algorithm import (
    EntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    NestedEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.config.loading import CONFIG_DIR, parse_gin_config
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
from alf_entropy.utils.optimizers import FusedAdam
from alf_entropy.utils.schedulers import update_progress

SHIPPED = sorted(glob.glob(os.path.join(CONFIG_DIR, "*.gin")))


def test_configs_dir_ships_the_expected_files():
    names = {os.path.basename(p) for p in SHIPPED}
    assert {
        "entropy_target_defaults.gin",
        "ac_cartpole.gin",
        "ppo_cartpole.gin",
        "ppo_cartpole_scheduled_target.gin",
        "ppo_pendulum.gin",
        "ppo_lunarlander.gin",
    } <= names


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_every_shipped_gin_file_parses(path):
    parse_gin_config([path], [])
    assert gin.config_str().strip(), f"{path} bound nothing"


def test_entropy_target_defaults_file_states_the_true_defaults():
    parse_gin_config([os.path.join(CONFIG_DIR, "entropy_target_defaults.gin")], [])
    checked = 0
    for cls in (
        EntropyTargetAlgorithm,
        NestedEntropyTargetAlgorithm,
        SGDEntropyTargetAlgorithm,
        FixedEntropyCoefficient,
    ):
        params = inspect.signature(cls.__init__).parameters
        for name, param in params.items():
            try:
                bound = gin.query_parameter(f"{cls.__name__}.{name}")
            except ValueError:
                continue  # not bound in the file (e.g. fast_update_rate, see its comment)
            assert bound == param.default, (
                f"{cls.__name__}.{name}: file {bound!r} != {param.default!r}"
            )
            checked += 1
    assert checked >= 18


def test_main_job_anneals_learning_rate_and_clip_range_to_zero():
    """ppo_cartpole.gin, built as the trainer builds it: lr 1e-3 and clip 0.2 at the start,
    half at half-way, 0 at the end; the target goes 0.68 -> 0.58."""
    parse_gin_config(["ppo_cartpole.gin"], [])
    alg = PPOAlgorithm(TensorSpec((4,)), BoundedTensorSpec((), torch.int64, 0, 1))
    (opt,) = alg.optimizers()  # the default optimiser, so default_optimizer.lr still binds
    assert isinstance(opt, FusedAdam)
    controller = alg.entropy_target_algorithm
    for percent, lr, clip, target in (
        (0.0, 1e-3, 0.2, 0.68),
        (0.5, 5e-4, 0.1, 0.63),
        (1.0, 0.0, 0.0, 0.58),
    ):
        update_progress("percent", percent)
        assert alg.importance_ratio_clipping == pytest.approx(clip)
        assert float(controller.target_entropy) == pytest.approx(target)
        for p in alg.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        assert opt.param_groups[0]["lr"] == pytest.approx(lr)


def test_main_job_comment_states_the_bound_target():
    """The comment's "from A to B" is the binding's schedule, so the two cannot drift apart."""
    text = open(os.path.join(CONFIG_DIR, "ppo_cartpole.gin"), encoding="utf-8").read()
    stated = re.search(r"# The target goes from ([\d.]+) .*? to ([\d.]+)", text, re.S)
    parse_gin_config(["ppo_cartpole.gin"], [])
    schedule = gin.query_parameter("LinearScheduler.schedule")
    assert (float(stated[1]), float(stated[2])) == (schedule[0][1], schedule[-1][1])
