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
  one-line message.
"""
import importlib
import os
import warnings
from typing import List, Optional, Sequence

import gin

__all__ = [
    "CONFIG_DIR",
    "DEFAULT_GIN_FILE",
    "GinConfigError",
    "import_configurables",
    "find_gin_file",
    "list_configs",
    "parse_gin_config",
    "one_line",
]

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
    "alf_entropy.trainers.on_policy_trainer",
    "alf_entropy.trainers.off_policy_trainer",
)


class GinConfigError(ValueError):
    """A gin file could not be found or a binding could not be applied."""


def one_line(error: BaseException) -> str:
    """An exception's message collapsed to a single line.

    Args:
        error: any exception (gin appends "In call to configurable ..." lines
            to errors raised inside configurables).

    Returns:
        str: the message with all whitespace runs replaced by one space.
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    # gin appends one "In call to configurable 'X' (<class ...>)" line per
    # enclosing configurable; keep the innermost configurable's name only.
    calls = [line for line in lines if line.startswith("In call to configurable")]
    text = " ".join(line for line in lines if line not in calls)
    if calls:
        text += f" ({calls[0].split(' (')[0]})"
    return text or type(error).__name__


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


def _add_config_dir_to_search_path() -> None:
    """Put :data:`CONFIG_DIR` first on gin's include search path (once).

    First, not last (``gin.add_config_file_search_path`` appends): gin tries
    the prefixes in order and logs an error line for every prefix where an
    included file is missing, so with the current directory first each
    ``include 'on_policy_base.gin'`` would log a spurious "Path not found".
    """
    prefixes = getattr(gin.config, "_LOCATION_PREFIXES", None)
    if isinstance(prefixes, list):
        if CONFIG_DIR not in prefixes:
            prefixes.insert(0, CONFIG_DIR)
    else:  # a gin version without the list: appending still works, noisily
        gin.add_config_file_search_path(CONFIG_DIR)


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
        gin.parse_config_files_and_bindings(paths, list(gin_params or []))
    except (ValueError, TypeError, KeyError, IOError, SyntaxError) as e:
        raise GinConfigError(one_line(e)) from e
    return paths
