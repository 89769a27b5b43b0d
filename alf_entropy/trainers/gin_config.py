"""Loading gin configs: the package's ``configs/`` directory and clear errors.

``parse_gin_config(gin_files, gin_params)`` is what ``alf-entropy-train``
does before building the trainer, exposed so scripts, tests and benchmarks
configure runs exactly like the command line:

* every module with configurables is imported first (algorithms, entropy
  controllers, networks, environments, schedulers, the trainer) and
  ``torch.optim`` optimisers are registered as ``@torch.optim.Adam`` etc.;
* the package's ``configs/`` directory is added to gin's search path, so a
  ``--gin_file`` may be given by name (``ppo_cartpole.gin`` or
  ``ppo_cartpole``) and config files can ``include`` each other by name;
* a missing file or a misspelt binding raises :class:`GinConfigError` with a
  one-line message;
* where each binding was written is recorded for
  :func:`~alf_entropy.trainers.bindings.check_bindings_used`, which the
  trainer calls to refuse bindings nothing used.

This module imports every configurable, the trainers included; the trainers
import :mod:`alf_entropy.trainers.bindings`, never this module.
"""
import contextlib
import importlib
import logging as py_logging
import os
import re
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence

import gin

from alf_entropy.trainers.bindings import (
    LATE_CONFIGURABLES,
    GinConfigError,
    check_bindings_used,
    one_line,
    record_direct_bindings,
)

__all__ = ["CONFIG_DIR", "DEFAULT_GIN_FILE", "GinConfigError", "LATE_CONFIGURABLES",
           "TRAINER_BINDING", "check_bindings_used", "configured_trainer", "import_configurables",
           "find_gin_file", "list_configs", "parse_gin_config", "one_line"]

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
"""The directory of the shipped ``.gin`` files."""

DEFAULT_GIN_FILE = "ppo_cartpole.gin"
"""The config run when no ``--gin_file`` is given."""

_CONFIGURABLE_MODULES = (
    "alf_entropy.algorithms.entropy_target_algorithm",
    "alf_entropy.algorithms.pid_entropy_target_algorithm",
    "alf_entropy.algorithms.actor_critic_algorithm",
    "alf_entropy.algorithms.ppo_algorithm",
    "alf_entropy.algorithms.sac_algorithm",
    "alf_entropy.networks",
    "alf_entropy.environments",
    "alf_entropy.utils.schedulers",
    "alf_entropy.utils.dist_utils",
    "alf_entropy.trainers.callbacks",
    "alf_entropy.trainers.on_policy_trainer",
    "alf_entropy.trainers.off_policy_trainer",
)


TRAINER_BINDING = "train.trainer"
"""The binding that names the trainer a config runs (``train.trainer =
@OnPolicyTrainer`` or ``@OffPolicyTrainer``); ``alf-entropy-train`` reads it."""


@gin.configurable("train")
def _train(trainer: Any = None) -> Any:
    """What :data:`TRAINER_BINDING` binds (called by :func:`configured_trainer`)."""
    return trainer


def configured_trainer() -> type:
    """The class the parsed config binds with :data:`TRAINER_BINDING`.

    Every shipped config binds it (``on_policy_base.gin``:
    ``@OnPolicyTrainer``; ``sac_pendulum.gin``: ``@OffPolicyTrainer``), so a
    config that includes one of them inherits its trainer.  Whether the class
    is a trainer is the caller's check (``alf-entropy-train`` refuses one that
    is not a :class:`~alf_entropy.trainers.trainer.Trainer`).

    Returns:
        type: the bound class.

    Raises:
        GinConfigError: if the config does not bind it, or binds something
            that is not a class.
    """
    cls = _train()
    if cls is None:
        raise GinConfigError(
            f"the config does not say which trainer runs it: bind {TRAINER_BINDING} = "
            "@OnPolicyTrainer (A2C/PPO) or @OffPolicyTrainer (SAC), or include a shipped "
            "config that does"
        )
    if not isinstance(cls, type):
        raise GinConfigError(
            f"{TRAINER_BINDING} must be a trainer class (@OnPolicyTrainer or "
            f"@OffPolicyTrainer, without parentheses), got {cls!r}"
        )
    return cls


def import_configurables() -> None:
    """Import every module that registers gin configurables (idempotent).

    Also registers ``torch.optim`` optimisers and learning-rate schedulers
    under ``torch.optim.*`` (gin's own ``gin.torch.external_configurables``).
    """
    for name in _CONFIGURABLE_MODULES:
        importlib.import_module(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gin touches deprecated torch classes
        importlib.import_module("gin.torch.external_configurables")


def list_configs() -> List[str]:
    """Names of the shipped config files.

    Returns:
        List[str]: sorted ``*.gin`` file names in :data:`CONFIG_DIR`.
    """
    if not os.path.isdir(CONFIG_DIR):
        return []
    return sorted(f for f in os.listdir(CONFIG_DIR) if f.endswith(".gin"))


def find_gin_file(name: str) -> str:
    """Resolve a gin file given as a path or as a shipped config's name.

    Args:
        name: a path, or the name of a file in :data:`CONFIG_DIR` (the
            ``.gin`` suffix may be left out).

    Returns:
        str: an existing file path.

    Raises:
        GinConfigError: if no such file exists.
    """
    candidates = [name, os.path.join(CONFIG_DIR, name)]
    if not name.endswith(".gin"):
        candidates += [name + ".gin", os.path.join(CONFIG_DIR, name + ".gin")]
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise GinConfigError(
        f"gin file {name!r} not found (neither a path nor one of the shipped configs: "
        f"{', '.join(list_configs())})"
    )


_search_path_added = False


def _add_config_dir_to_search_path() -> None:
    """Add :data:`CONFIG_DIR` to gin's include search path (once per process).

    gin's public ``add_config_file_search_path`` appends: an ``include`` is
    looked up relative to the current directory first, then here.
    """
    global _search_path_added
    if not _search_path_added:
        gin.add_config_file_search_path(CONFIG_DIR)
        _search_path_added = True


class _NoSearchPathNoise(py_logging.Filter):
    """Drops gin's resource reader's lines while gin searches its path.

    For every search-path entry that lacks an included file (the current
    directory, before :data:`CONFIG_DIR`) gin's ``resource_reader`` logs an
    error line ("Path not found: on_policy_base.gin") although the next
    entry has it; a file found nowhere is a :class:`GinConfigError` anyway.
    """

    def filter(self, record: py_logging.LogRecord) -> bool:
        return record.module != "resource_reader"


@contextlib.contextmanager
def _quiet_include_search() -> Iterator[None]:
    """While parsing, gin's include search logs nothing (see :class:`_NoSearchPathNoise`)."""
    root = py_logging.getLogger()  # gin's resource_reader logs through the root logger
    quiet = _NoSearchPathNoise()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


def parse_gin_config(
    gin_files: Optional[Sequence[str]] = None,
    gin_params: Optional[Sequence[str]] = None,
    default_file: Optional[str] = DEFAULT_GIN_FILE,
) -> List[str]:
    """Clear gin, then parse ``gin_files`` and ``gin_params``.

    Args:
        gin_files: paths or names of shipped configs; if empty,
            ``default_file`` is used (if not None).
        gin_params: extra bindings such as ``"OnPolicyTrainer.num_iterations
            = 10"``, applied after the files.
        default_file: the file used when ``gin_files`` is empty.

    Returns:
        List[str]: the resolved file paths that were parsed.

    Raises:
        GinConfigError: for a missing file, an unknown configurable or
            parameter, or a syntax error (one-line message).
    """
    import_configurables()
    gin.clear_config()
    _add_config_dir_to_search_path()
    files = list(gin_files or [])
    if not files and default_file is not None:
        files = [default_file]
    # Absolute paths are opened directly (gin searches its prefixes only for
    # relative ones, i.e. for ``include`` lines).
    paths = [os.path.abspath(find_gin_file(f)) for f in files]
    try:
        with _quiet_include_search():
            gin.parse_config_files_and_bindings(paths, list(gin_params or []))
    except (ValueError, TypeError, KeyError, IOError, SyntaxError) as e:
        raise GinConfigError(one_line(e)) from e
    direct: Dict[str, str] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for key in _binding_keys(f.read()):
                direct[key] = f"{key} (in {os.path.basename(path)})"
    for param in gin_params or []:
        for key in _binding_keys(param):
            direct[key] = f"{' '.join(param.split())} (--gin_param)"
    record_direct_bindings(direct)
    return paths


_BINDING_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:/[\w.]+)*)\s*=")


def _binding_keys(text: str) -> List[str]:
    """The binding keys written in gin text (not in the files it includes)."""
    keys = []
    for line in text.splitlines():
        if line[:1].isspace():  # a continuation line of a multi-line value
            continue
        m = _BINDING_LINE.match(line)
        if m:
            keys.append(m.group(1))
    return keys
