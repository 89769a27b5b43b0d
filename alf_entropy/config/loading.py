"""Loading configs as ``alf-entropy-train`` does.

:func:`parse_gin_config` registers the package's configurables
(:mod:`~alf_entropy.config.configurables`: the package's ``configs/`` on gin's search
path too), finds ``--gin_file ppo_cartpole`` by name, and turns a missing file or a bad
binding into one :class:`GinConfigError` line; it notes where each binding was written
(:func:`binding_sources`), which a trainer's unused-binding check names.
"""

import contextlib
import logging as py_logging
import os
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import gin

from alf_entropy.config import CONFIG_DIR
from alf_entropy.config.bindings import (
    TRAINER_BINDING,
    GinConfigError,
    note_sources,
    read_bindings,
    split_key,
)

__all__ = [
    "CONFIG_DIR",
    "DEFAULT_GIN_FILE",
    "GinConfigError",
    "TRAINER_BINDING",
    "binding_sources",
    "configured_trainer",
    "find_gin_file",
    "list_configs",
    "one_line",
    "parse_gin_config",
]

DEFAULT_GIN_FILE = "ppo_cartpole.gin"
"""The config run when no ``--gin_file`` is given."""


def one_line(error: BaseException) -> str:
    """``error``'s message on one line; of gin's "In call to configurable" lines only the
    innermost configurable's name is kept."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    calls = [line for line in lines if line.startswith("In call to configurable")]
    text = " ".join(line for line in lines if line not in calls)
    if calls:
        text += f" ({calls[0].split(' (')[0]})"
    return text or type(error).__name__


def configured_trainer() -> type:
    """The class the parsed config binds with :data:`TRAINER_BINDING`.

    Raises:
        GinConfigError: if it binds none, or something that is not a class.
    """
    from alf_entropy.config.configurables import trainer_binding

    cls = trainer_binding()
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


def list_configs() -> List[str]:
    """The shipped ``*.gin`` file names, sorted."""
    if not os.path.isdir(CONFIG_DIR):
        return []
    return sorted(f for f in os.listdir(CONFIG_DIR) if f.endswith(".gin"))


def find_gin_file(name: str) -> str:
    """A path, or a shipped config's name (``.gin`` optional), as an existing file's path.

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


def binding_sources(paths: Sequence[str], params: Sequence[str]) -> Dict[Tuple[str, str, str], str]:
    """Where each binding (:func:`~alf_entropy.config.bindings.split_key`) of the files at
    ``paths``, then of ``params`` (``--gin_param``), was written: ``"A.x (in f.gin)"``,
    ``"A.x = 1 (--gin_param)"``; the last one wins."""
    where = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            where.update(
                (split_key(k), f"{k} (in {os.path.basename(path)})")
                for k in read_bindings(f.read())
            )
    for param in params:
        where.update(
            (split_key(k), f"{' '.join(param.split())} (--gin_param)") for k in read_bindings(param)
        )
    return where


@contextlib.contextmanager
def _quiet_include_search() -> Iterator[None]:
    """Drop the "Path not found" line gin's resource reader logs (through the root logger)
    for each search-path entry that lacks an included file the next entry has."""

    def quiet(record: py_logging.LogRecord) -> bool:
        return record.module != "resource_reader"

    root = py_logging.getLogger()
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
    """Clear gin, then parse ``gin_files`` (paths or shipped names; ``default_file`` when
    empty) and ``gin_params`` (bindings applied after the files).

    Returns:
        The resolved paths parsed.

    Raises:
        GinConfigError: a missing file, an unknown configurable or parameter, a syntax error.
    """
    import alf_entropy.config.configurables  # noqa: F401  (registers them; imports torch)

    gin.clear_config()
    files = list(gin_files or ([default_file] if default_file is not None else []))
    paths = [os.path.abspath(find_gin_file(f)) for f in files]
    try:
        with _quiet_include_search():
            gin.parse_config_files_and_bindings(paths, list(gin_params or []))
    except (ValueError, TypeError, KeyError, IOError, SyntaxError) as e:
        raise GinConfigError(one_line(e)) from e
    note_sources(binding_sources(paths, gin_params or []))
    return paths
