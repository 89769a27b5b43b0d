"""Fixtures shared by every test: global state that one test must not leave to the next.

gin's bindings and the scheduler progress (with the summary global counter)
are module-level state: a test that parses a config or moves the progress
would change what the next test builds.  ``_clean_gin_and_progress`` runs
around every test.  ``one_thread`` is opt-in: a file that trains or forks
uses it (``pytestmark = pytest.mark.usefixtures("one_thread")``); on a small
machine one intra-op thread per process is faster and a forked child does not
inherit busy OpenMP workers.
"""
from typing import Iterator

import gin
import pytest
import torch

from alf_entropy.utils import schedulers


@pytest.fixture(autouse=True)
def _clean_gin_and_progress() -> Iterator[None]:
    """Every test starts with no gin bindings; its bindings and progress go afterwards."""
    gin.clear_config()
    yield
    gin.clear_config()
    schedulers.reset_progress()


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch intra-op thread for the test, the previous count restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
