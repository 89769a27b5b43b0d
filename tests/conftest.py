"""Fixtures shared by every test: global state that one test must not leave to the next.

gin's bindings and the scheduler progress (with the summary global counter)
are module-level state: a test that parses a config or moves the progress
would change what the next test builds.  ``_clean_gin_and_progress`` runs
around every test.  ``one_thread`` is opt-in: a file that trains or forks
uses it (``pytestmark = pytest.mark.usefixtures("one_thread")``); on a small
machine one intra-op thread per process is faster and a forked child does not
inherit busy OpenMP workers.  ``hold_run_lock`` starts processes that hold a
run directory's lock; ``run_train`` runs ``alf-entropy-train`` in a fresh process.

The package's gin configurables are registered (``alf_entropy.config.configurables``, what
the shipped configs import) for every test, as in a process that parsed a config; what
importing the package alone registers (nothing) is tested in a fresh process.
"""

import os
import subprocess
import sys
from typing import Callable, Iterator

import gin
import pytest
import torch

import alf_entropy.config.configurables  # noqa: F401  (registers the package's configurables)
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


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def run_train() -> Callable[..., subprocess.CompletedProcess]:
    """``run_train(*args, timeout=180)``: ``alf-entropy-train ARGS`` in a fresh process of
    this checkout; its ``CompletedProcess``, with ``error_line`` the last non-empty line
    of its stderr (``""`` if none)."""

    def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run(
            [sys.executable, "-m", "alf_entropy.bin.train", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=REPO_ROOT,
        )
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        proc.error_line = lines[-1] if lines else ""
        return proc

    return run


_HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(os.path.join(sys.argv[1], ".run.lock"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, b"424242 otherhost\\n")
print("locked", flush=True)
time.sleep(120)
"""


@pytest.fixture
def hold_run_lock() -> Iterator[Callable[..., subprocess.Popen]]:
    """``hold(root)`` starts a process holding ``root``'s run lock (recorded as
    pid 424242 on host otherhost) and returns it; any still alive are killed
    after the test."""
    procs = []

    def hold(root) -> subprocess.Popen:
        os.makedirs(root, exist_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD_LOCK, str(root)], stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout.readline().strip() == "locked"
        return proc

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()
