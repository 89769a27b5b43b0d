"""The package's gin configurables: registered by one module, and by nothing else.

In an ALF process, importing any module of the package must leave ALF's gin names as they
were (gin resolves a bare name to every configurable registered under it); the package's
own gin files import the registration themselves.
"""

import inspect
import json
import os
import subprocess
import sys

import gin
import pytest
import torch

from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.config import CONFIG_DIR, configurables
from alf_entropy.controllers import EntropyTargetAlgorithm
from alf_entropy.tensor_specs import BoundedTensorSpec

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SELECTORS = {c.__name__: f"{c.__module__}.{c.__name__}" for c in configurables.CLASSES}
SELECTORS.update(
    (name or fn.__name__, f"{fn.__module__}.{name or fn.__name__}")
    for fn, name in configurables.FUNCTIONS
)
NAMES = sorted(SELECTORS)

# A fresh process: ALF's clashing names registered first (as ALF's modules do), then
# every module of the package imported but the registration; which of the package's
# names gin then knows, whether ALF's own bindings parse, and a plain constructor error.
_FRESH = """
import importlib, json, pkgutil, sys
import gin, torch

def alf(name, module):
    return gin.external_configurable(type(name, (), {"__init__": lambda self, **kw: None}),
                                     name=name, module=module)

alf("EntropyTargetAlgorithm", "alf.algorithms.entropy_target_algorithm")
gin.configurable("calc_default_target_entropy", module="alf.utils.dist_utils")(
    lambda spec=None, min_prob=0.1: min_prob)
import alf_entropy
for info in pkgutil.walk_packages(alf_entropy.__path__, "alf_entropy."):
    if info.name != "alf_entropy.config.configurables":
        try:
            importlib.import_module(info.name)
        except ImportError:  # an integration whose extra is not installed
            pass

def known(name):
    try:
        gin.get_configurable(name)
    except ValueError:
        return False
    return True

parsed = {}
for line in ("EntropyTargetAlgorithm.min_alpha = 0.1",  # alf/examples/icm_mountain_car.gin
             "calc_default_target_entropy.min_prob = 0.01"):  # ppo_icubwalk.gin
    try:
        gin.parse_config(line)
        parsed[line] = "ok"
    except Exception as e:  # gin: KeyError for an ambiguous name
        parsed[line] = str(e).splitlines()[0]
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.tensor_specs import BoundedTensorSpec
try:
    PPOAlgorithm(BoundedTensorSpec((4,), torch.float32, -1.0, 1.0),
                 BoundedTensorSpec((), torch.int64, 0, 1), num_epochs=0)
except ValueError as e:
    error = [type(e) is ValueError, str(e)]
print(json.dumps(dict(known={n: known(n) for n in sys.argv[1:]}, parsed=parsed, error=error)))
"""


@pytest.fixture(scope="module")
def fresh():
    proc = subprocess.run(
        [sys.executable, "-c", _FRESH, *SELECTORS.values()],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=REPO_ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", NAMES)
def test_importing_the_package_registers_nothing(fresh, name):
    assert not fresh["known"][SELECTORS[name]]


@pytest.mark.parametrize(
    "line",
    ["EntropyTargetAlgorithm.min_alpha = 0.1", "calc_default_target_entropy.min_prob = 0.01"],
)
def test_alfs_own_bindings_stay_unambiguous(fresh, line):
    assert fresh["parsed"][line] == "ok"


def test_a_class_built_from_python_raises_its_own_error(fresh):
    assert fresh["error"][0] and "In call to configurable" not in fresh["error"][1]
    assert fresh["error"][1].startswith("num_epochs must be")


def test_the_registration_knows_every_name_and_keeps_the_signatures():
    for selector in SELECTORS.values():
        gin.get_configurable(selector)  # raises if not registered
    for cls in (PPOAlgorithm, EntropyTargetAlgorithm):
        assert {"initial_alpha" if cls is EntropyTargetAlgorithm else "gamma", "name"} <= set(
            inspect.signature(cls).parameters
        )
    with pytest.raises(ValueError, match="denylisted kwarg 'batch_shape'"):
        gin.parse_config("PPOAlgorithm.batch_shape = (2,)")


def test_a_plain_gin_parse_of_a_shipped_config_registers_and_finds_its_includes():
    code = (
        "import gin, os, sys; gin.parse_config_file(os.path.join(sys.argv[1], "
        "'ppo_cartpole_pid.gin')); print(gin.query_parameter('OnPolicyTrainer.env_id'), "
        "gin.query_parameter('PIDEntropyTargetAlgorithm.initial_alpha'))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, CONFIG_DIR],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=300,
        env=dict(os.environ, PYTHONPATH=REPO_ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["CartPole-v1", "0.1"]


def test_gin_errors_name_the_configurable_and_python_calls_take_the_bindings():
    gin.parse_config("EntropyTargetAlgorithm.initial_alpha = -1")
    spec = BoundedTensorSpec((), torch.int64, 0, 1)
    with pytest.raises(ValueError, match="initial_alpha must be > 0, got -1") as info:
        PPOAlgorithm(
            BoundedTensorSpec((4,), torch.float32, -1.0, 1.0), spec, enforce_entropy_target=True
        )
    assert "In call to configurable 'EntropyTargetAlgorithm'" in str(info.value)
