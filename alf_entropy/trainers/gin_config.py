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

:func:`check_bindings_used` (the trainer calls it once it has built
everything it builds before training) refuses a binding that nothing used:
one given with ``--gin_param``, or one in a gin file for a configurable the
run did call (whose value the code then passes itself), is an error naming
it; one in a gin file for a configurable the run never builds is a warning
(a config that switches the controller leaves the other controller's
settings bound).  Configurables first called during training (:data:`LATE_CONFIGURABLES`:
the evaluation, ...) cannot be judged then and are left out.
"""
import contextlib
import importlib
import logging as py_logging
import os
import re
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import gin
from absl import logging

from alf_entropy.trainers.run_dir import parse_operative_config

__all__ = [
    "CONFIG_DIR",
    "DEFAULT_GIN_FILE",
    "GinConfigError",
    "LATE_CONFIGURABLES",
    "TRAINER_BINDING",
    "check_bindings_used",
    "configured_trainer",
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


LATE_CONFIGURABLES = frozenset({"evaluate", "estimated_entropy"})
"""Configurables first called during training, not when the trainer is built:
:func:`check_bindings_used` cannot tell whether their bindings are used."""


TRAINER_BINDING = "train.trainer"
"""The binding that names the trainer a config runs (``train.trainer =
@OnPolicyTrainer`` or ``@OffPolicyTrainer``); ``alf-entropy-train`` reads it."""


class GinConfigError(ValueError):
    """A gin file could not be found or a binding could not be applied."""


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
    is not a :class:`~alf_entropy.trainers.trainer.Trainer`): this module is
    below the trainer, which imports it.

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
    direct: Dict[Tuple[str, str, str], str] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for key in _binding_keys(f.read()):
                direct[_normalize(key)] = f"{key} (in {os.path.basename(path)})"
    for param in gin_params or []:
        for key in _binding_keys(param):
            direct[_normalize(key)] = f"{' '.join(param.split())} (--gin_param)"
    _DIRECT.clear()
    _DIRECT.update(config=gin.config_str(), bindings=direct)
    return paths


# What the last parse_gin_config parsed: its config text (to tell whether
# gin has been reconfigured since) and its direct bindings.
_DIRECT: Dict[str, object] = {}
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


def _normalize(key: str) -> Tuple[str, str, str]:
    """``(scope, configurable's last name, parameter)`` of a binding key."""
    scope, _, selector = key.rpartition("/")
    name, _, param = selector.rpartition(".")
    return scope, name.rsplit(".", 1)[-1], param


def check_bindings_used(constructing: Optional[str] = None) -> None:
    """Refuse bindings that no configurable called so far has used.

    Call it once everything configured before training has been built.
    Bindings of :data:`LATE_CONFIGURABLES` are not judged.

    Args:
        constructing: the name of a configurable whose call is still under
            way (the trainer calling this from its constructor): gin records
            its parameters only when the call returns, and gin has already
            checked that each of its bound parameters exists.

    Raises:
        GinConfigError: naming the unused bindings given with ``--gin_param``
            (to the last :func:`parse_gin_config`) and those of configurables
            that were called but did not take the bound value; unused
            bindings of configurables never called are logged as a warning.
    """
    bound = parse_operative_config(gin.config_str())
    used = parse_operative_config(gin.operative_config_str())
    used_keys: Set[Tuple[str, str, str]] = {_normalize(k) for k in used}
    # The trainer binding is read by alf-entropy-train, not by the trainer:
    # a script that builds a trainer itself leaves it unused.
    skip = set(LATE_CONFIGURABLES) | {"train"} | ({constructing} if constructing else set())
    unused = [k for k in bound if _normalize(k) not in used_keys and _normalize(k)[1] not in skip]
    if not unused:
        return
    direct = _DIRECT.get("bindings", {}) if _DIRECT.get("config") == gin.config_str() else {}
    called = _called_configurables(gin.operative_config_str())
    errors, alternatives = [], []
    for key in unused:
        norm = _normalize(key)
        where = direct.get(norm, f"{key} (in a gin file)")
        if where.endswith("(--gin_param)") or norm[1] in called:
            errors.append(where)  # asked for on the command line, or overridden by the code
        else:
            alternatives.append(where)  # a class this run does not build
    if alternatives:
        logging.warning(
            "gin bindings of classes this run does not build (left unused): %s",
            ", ".join(alternatives),
        )
    if errors:
        raise GinConfigError(
            f"binding(s) this run never uses: {', '.join(errors)}: nothing reads that parameter "
            "here (another class, or one whose value the code passes itself); "
            + _hint(errors)
        )


_HEADER = re.compile(r"^# Parameters for (.+):$")


def _called_configurables(operative: str) -> Set[str]:
    """The last names of the configurables gin's operative config lists (called)."""
    names = set()
    for line in operative.splitlines():
        m = _HEADER.match(line.strip())
        if m:
            names.add(m.group(1).rsplit("/", 1)[-1].rsplit(".", 1)[-1])
    return names


def _hint(errors: List[str]) -> str:
    """A pointer to the usual fix for an unused binding."""
    if any(".lr" in e or "Adam" in e for e in errors):
        return (
            "the algorithms' default optimiser takes its learning rate from "
            "default_optimizer.lr (A2C/PPO) or sac_default_optimizer.lr (SAC); bind "
            "<Algorithm>.optimizer = @torch.optim.Adam to use torch.optim.Adam's bindings"
        )
    return "check the configurable's name and that the run builds it (see operative_config.gin)"
