"""``alf_entropy``'s top-level exports."""

import importlib

import pytest

import alf_entropy

EXPECTED = {
    "EntropyTargetAlgorithm",
    "SGDEntropyTargetAlgorithm",
    "NestedEntropyTargetAlgorithm",
    "FixedEntropyCoefficient",
    "EntropyController",
    "PPOAlgorithm",
    "ActorCriticAlgorithm",
    "SacAlgorithm",
    "Scheduler",
    "ConstantScheduler",
    "StepScheduler",
    "LinearScheduler",
    "ExponentialScheduler",
    "CyclicalScheduler",
    "update_progress",
    "TensorSpec",
    "BoundedTensorSpec",
    "from_gym_space",
    "PIDEntropyTargetAlgorithm",
    "SettledAnnealing",
    "greedy_probability_target",
}


def test_all_lists_the_public_api():
    assert EXPECTED <= set(alf_entropy.__all__)
    assert len(alf_entropy.__all__) == len(set(alf_entropy.__all__))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_export_is_the_defining_modules_object(name):
    value = getattr(alf_entropy, name)
    module = importlib.import_module(value.__module__)
    assert getattr(module, name) is value
    assert name in dir(alf_entropy)


def test_star_import_and_unknown_names():
    ns: dict = {}
    exec("from alf_entropy import *", ns)
    assert EXPECTED <= set(ns)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchController'"):
        alf_entropy.NoSuchController
    with pytest.raises(ImportError):
        exec("from alf_entropy import NoSuchController", {})


def test_the_exports_are_gin_configurables():
    import gin

    # Binding through gin by the exported name reaches the exported class.
    gin.parse_config("EntropyTargetAlgorithm.initial_alpha = 0.25")
    import torch

    c = alf_entropy.EntropyTargetAlgorithm(alf_entropy.BoundedTensorSpec((), torch.int64, 0, 1))
    assert abs(c.alpha.item() - 0.25) < 1e-6


def test_alfs_module_paths_resolve_for_every_name_the_package_mirrors():
    """Code ported from ALF changes ``alf.`` to ``alf_entropy.`` and nothing else."""
    import importlib

    names = {
        "algorithms.algorithm": ["Algorithm"],
        "algorithms.entropy_target_algorithm": [
            "EntropyTargetAlgorithm",
            "NestedEntropyTargetAlgorithm",
            "SGDEntropyTargetAlgorithm",
            "EntropyTargetInfo",
            "EntropyTargetLossInfo",
        ],
        "utils.dist_utils": [
            "calc_default_target_entropy",
            "entropy_with_fallback",
            "estimated_entropy",
        ],
        "data_structures": ["AlgStep", "LossInfo", "TimeStep", "StepType", "namedtuple"],
        "utils.schedulers": ["ConstantScheduler", "LinearScheduler", "StepScheduler"],
        "tensor_specs": ["TensorSpec", "BoundedTensorSpec"],
    }
    for module, attrs in names.items():
        mod = importlib.import_module("alf_entropy." + module)
        assert all(callable(getattr(mod, a)) for a in attrs), module
