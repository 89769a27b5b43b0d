"""Every shipped .gin file parses, and the documented defaults are the real ones."""
import glob
import inspect
import os

import gin
import pytest

from alf_entropy.algorithms.entropy_target_algorithm import (
    EntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    NestedEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.trainers.gin_config import CONFIG_DIR, parse_gin_config

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
    for cls in (EntropyTargetAlgorithm, NestedEntropyTargetAlgorithm, SGDEntropyTargetAlgorithm,
                FixedEntropyCoefficient):
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
