"""Fixtures of the integration tests."""

from typing import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _sb3_logs_in_pytest_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """SB3's default logger makes a ``SB3-<time>`` folder in the system temp dir at every
    ``learn()``; ``SB3_LOGDIR`` puts them under pytest's temp dir, which pytest cleans."""
    patch = pytest.MonkeyPatch()
    patch.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3_logs")))
    yield
    patch.undo()
