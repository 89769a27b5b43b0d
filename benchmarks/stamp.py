"""The stamp every benchmark prints with its tables: date, commit, versions, machine.

``from stamp import stamp`` in a script under ``benchmarks/`` (run as
``python benchmarks/<script>.py``, its folder is on ``sys.path``).
"""

import datetime
import importlib.metadata
import os
import platform
import subprocess
from typing import Sequence

import torch

__all__ = ["stamp"]


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=here,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return commit + (" (with uncommitted changes)" if dirty else "")


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def stamp(packages: Sequence[str] = ("gymnasium",)) -> str:
    """``"<UTC date and time>, commit <c>; torch .., <packages>.., numpy .., Python ..; <CPU>"``.

    Args:
        packages: the distributions whose versions matter besides torch and
            numpy (``"absent"`` if not installed).

    Returns:
        One line for the heading of a benchmark's output.
    """
    versions = ", ".join(f"{name} {_version(name)}" for name in ("torch", *packages, "numpy"))
    return (
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit "
        f"{_commit()}; {versions}, Python {platform.python_version()}; {_cpu()}, "
        f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads"
    )
