"""The ``Examples:`` blocks of the public classes run as written (doctest)."""

import doctest
import importlib

import pytest

MODULES = [
    "alf_entropy",  # the top-level exports
    "alf_entropy.controllers.fixed",
    "alf_entropy.controllers.staged",
    "alf_entropy.controllers.sgd",
    "alf_entropy.controllers.pid",
    "alf_entropy.algorithms.sac_algorithm",
    "alf_entropy.algorithms.ppo_algorithm",
    "alf_entropy.networks.critic_networks",
    "alf_entropy.utils.replay_buffer",
    "alf_entropy.utils.schedulers",
    "alf_entropy.utils.requirements",
    "alf_entropy.integrations.llm",
]


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name):
    # An example may move the global progress: the autouse fixture resets it.
    result = doctest.testmod(
        importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.attempted > 0, f"{name}: no examples found"
    assert result.failed == 0, f"{name}: {result.failed} example(s) failed (see stdout)"
