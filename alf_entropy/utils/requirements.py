"""Optional dependencies: what the trainers need beyond the controller.

The controller (``alf_entropy.algorithms``, ``tensor_specs``, ``utils``) needs
only torch, gin-config, absl-py, tensorboard, numpy and optree, so it installs
next to any gymnasium (0.29 for CleanRL, 1.x) or none.  The trainers and
environments need ``gymnasium>=1.1`` (its ``AutoresetMode``) and ``tqdm``:
``pip install -e ".[train]"``.  :func:`require_train_extra` checks for
them and raises one :class:`MissingDependencyError` that says what to install.

Examples:
    >>> from alf_entropy.utils.requirements import version_tuple
    >>> version_tuple("0.29.1"), version_tuple("1.1.0rc1")
    ((0, 29, 1), (1, 1, 0))
"""

import importlib
import importlib.metadata
import importlib.util
import re
from typing import Optional, Tuple

__all__ = [
    "MIN_GYMNASIUM",
    "TRAIN_EXTRA",
    "MissingDependencyError",
    "gymnasium_version",
    "require_train_extra",
    "version_tuple",
]

MIN_GYMNASIUM = (1, 1)
"""The oldest gymnasium the trainers run with (``AutoresetMode``; setup.py's ``train`` extra)."""

TRAIN_EXTRA = 'pip install -e ".[train]"'
"""The install command that brings the trainers' dependencies."""


class MissingDependencyError(ImportError):
    """An optional dependency is missing or too old; the message says what to install."""


def version_tuple(version: str) -> Tuple[int, ...]:
    """The leading numeric components of a version string (``"1.2.0rc1"``: ``(1, 2, 0)``;
    ``()`` if it starts with no number)."""
    parts = []
    for piece in str(version).split("."):
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match.group()))
        if match.end() != len(piece):
            break
    return tuple(parts)


def gymnasium_version() -> Optional[str]:
    """The installed gymnasium's version, or None when it is not installed.

    Reads the distribution metadata, falling back to ``gymnasium.__version__``
    (for a source checkout without metadata); either way without importing
    gymnasium when the metadata is there.  A gymnasium that cannot be found
    by the import system (``sys.modules["gymnasium"] = None`` included) is
    not installed, whatever metadata is left behind.
    """
    try:
        if importlib.util.find_spec("gymnasium") is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        return importlib.metadata.version("gymnasium")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return str(importlib.import_module("gymnasium").__version__)
    except ImportError:
        return None


def require_train_extra(what: str = "the trainer") -> None:
    """Raise :class:`MissingDependencyError` (naming ``what`` needs it and :data:`TRAIN_EXTRA`)
    unless ``gymnasium>=1.1`` and ``tqdm`` are there."""
    found = gymnasium_version()
    wanted = ".".join(map(str, MIN_GYMNASIUM))
    if found is None:
        problem = f"gymnasium>={wanted}, which is not installed"
    elif version_tuple(found)[: len(MIN_GYMNASIUM)] < MIN_GYMNASIUM:
        problem = f"gymnasium>={wanted} (AutoresetMode), found gymnasium {found}"
    else:
        try:
            importlib.import_module("tqdm")
            return
        except ImportError:
            problem = "tqdm, which is not installed"
    raise MissingDependencyError(
        f"{what} needs {problem}: {TRAIN_EXTRA} (the entropy controllers alone work "
        "with any gymnasium, or none)"
    )
