"""Everything that reads gin: the configs, the bindings in force, and gin's own text.

:func:`parse_gin_config` loads configs as ``alf-entropy-train`` does: every
configurable imported first (``torch.optim`` ones as ``@torch.optim.Adam``),
the package's ``configs/`` on gin's search path (``--gin_file ppo_cartpole``
and ``include 'on_policy_base.gin'`` by name), one-line
:class:`GinConfigError` for a missing file or a bad binding.
:func:`check_bindings_used` (the trainer calls it once it has built what it
builds) refuses bindings nothing used.  :func:`read_bindings` reads any gin
text (a file, ``gin.config_str()``, ``gin.operative_config_str()``) with gin's
own parser.
"""
import contextlib
import importlib
import logging as py_logging
import os
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import gin
from absl import logging
from gin import config_parser

__all__ = ["CONFIG_DIR", "DEFAULT_GIN_FILE", "GinConfigError", "LATE_CONFIGURABLES",
           "TRAINER_BINDING", "check_bindings_used", "configured_trainer", "find_gin_file",
           "import_configurables", "list_configs", "one_line", "parse_gin_config",
           "read_bindings", "split_key", "write_bindings"]

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
"""The directory of the shipped ``.gin`` files."""

DEFAULT_GIN_FILE = "ppo_cartpole.gin"
"""The config run when no ``--gin_file`` is given."""

TRAINER_BINDING = "train.trainer"
"""Names the trainer a config runs (``@OnPolicyTrainer`` or ``@OffPolicyTrainer``)."""

LATE_CONFIGURABLES = frozenset({"evaluate", "estimated_entropy"})
"""Configurables first called during training: :func:`check_bindings_used` cannot judge them."""

# Imported by name (as a gin file's `import` line would) before a config is parsed.
_CONFIGURABLE_MODULES = (
    "alf_entropy.algorithms.entropy_target_algorithm",
    "alf_entropy.algorithms.pid_entropy_target_algorithm",
    "alf_entropy.algorithms.actor_critic_algorithm",
    "alf_entropy.algorithms.ppo_algorithm",
    "alf_entropy.algorithms.sac_algorithm",
    "alf_entropy.networks",
    "alf_entropy.environments",
    "alf_entropy.utils.schedulers",
    "alf_entropy.utils.entropies",
    "alf_entropy.trainers.callbacks",
    "alf_entropy.trainers.on_policy_trainer",
    "alf_entropy.trainers.off_policy_trainer",
    "gin.torch.external_configurables",
)


class GinConfigError(ValueError):
    """A gin file could not be found or a binding could not be applied."""


def one_line(error: BaseException) -> str:
    """``error``'s message on one line; of gin's "In call to configurable" lines only the
    innermost configurable's name is kept."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    calls = [line for line in lines if line.startswith("In call to configurable")]
    text = " ".join(line for line in lines if line not in calls)
    if calls:
        text += f" ({calls[0].split(' (')[0]})"
    return text or type(error).__name__


# ------------------------------------------------------------------ gin text
class _Name(str):
    """A reference or macro read from gin text, written back as it was (``@Adam``, ``%LR``)."""

    def __repr__(self) -> str:
        return str(self)


class _AsWritten(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_name: str, evaluate: bool) -> _Name:
        return _Name(f"@{scoped_name}{'()' if evaluate else ''}")

    def macro(self, macro_name: str) -> _Name:
        return _Name(f"%{macro_name}")


def read_bindings(text: str) -> Dict[str, str]:
    """The bindings of gin text, read by gin's parser (includes are not followed).

    Returns:
        ``"scope/Configurable.param"`` (a macro: its name) -> the value's
        canonical text (``(1, 2)`` however it was wrapped, ``@Adam``, ``%LR``).
    """
    out = {}
    for statement in config_parser.ConfigParser(text, _AsWritten()):
        if isinstance(statement, config_parser.BindingStatement):
            scope = f"{statement.scope}/" if statement.scope else ""
            param = f".{statement.arg_name}" if statement.arg_name else ""
            out[scope + statement.selector + param] = repr(statement.value)
    return out


def write_bindings(bindings: Dict[str, str]) -> str:
    """Gin text of ``bindings`` (as :func:`read_bindings` returns them), one per line."""
    return "".join(f"{key} = {value}\n" for key, value in bindings.items())


def split_key(key: str) -> Tuple[str, str, str]:
    """``(scope, configurable's last name, parameter)`` of a binding key."""
    scope, _, selector = key.rpartition("/")
    name, _, param = selector.rpartition(".")
    return scope, name.rsplit(".", 1)[-1], param


# ------------------------------------------------------------ loading configs
@gin.configurable("train")
def _train(trainer: Any = None) -> Any:
    """What :data:`TRAINER_BINDING` binds."""
    return trainer


def configured_trainer() -> type:
    """The class the parsed config binds with :data:`TRAINER_BINDING`.

    Raises:
        GinConfigError: if it binds none, or something that is not a class.
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
    """Import every module that registers gin configurables (idempotent)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gin touches deprecated torch classes
        for name in _CONFIGURABLE_MODULES:
            importlib.import_module(name)


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


# Whether CONFIG_DIR is on gin's search path; the last parsed config's text and where
# each of its bindings was written.
_PARSED: Dict[str, Any] = {}


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
    import_configurables()
    gin.clear_config()
    if not _PARSED.get("search_path"):  # gin appends: the current directory is searched first
        gin.add_config_file_search_path(CONFIG_DIR)
        _PARSED["search_path"] = True
    files = list(gin_files or ([default_file] if default_file is not None else []))
    paths = [os.path.abspath(find_gin_file(f)) for f in files]
    try:
        with _quiet_include_search():
            gin.parse_config_files_and_bindings(paths, list(gin_params or []))
    except (ValueError, TypeError, KeyError, IOError, SyntaxError) as e:
        raise GinConfigError(one_line(e)) from e
    direct: Dict[str, str] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            name = os.path.basename(path)
            direct.update((k, f"{k} (in {name})") for k in read_bindings(f.read()))
    for param in gin_params or []:
        direct.update((k, f"{' '.join(param.split())} (--gin_param)") for k in read_bindings(param))
    _PARSED.update(config=gin.config_str(), bindings={split_key(k): v for k, v in direct.items()})
    return paths


# ---------------------------------------------------------- unused bindings

def check_bindings_used(constructing: Optional[str] = None) -> None:
    """Refuse bindings that no configurable called so far has used.

    One given with ``--gin_param``, or one of a configurable the run called
    (whose value the code passes itself), is an error; one of a configurable
    the run never built is a warning (a config that switches the controller
    leaves the other one's settings).  :data:`LATE_CONFIGURABLES` are not judged.

    Args:
        constructing: a configurable whose call is under way (the trainer calling
            this from its constructor): gin records its parameters when it returns.

    Raises:
        GinConfigError: naming the unused bindings that are errors.
    """
    used = read_bindings(gin.operative_config_str())
    used_keys = {split_key(k) for k in used}
    # The trainer binding is read by alf-entropy-train: a script's trainer leaves it unused.
    skip = set(LATE_CONFIGURABLES) | {"train"} | ({constructing} if constructing else set())
    unused = [k for k in read_bindings(gin.config_str())
              if split_key(k) not in used_keys and split_key(k)[1] not in skip]
    if not unused:
        return
    direct = _PARSED.get("bindings", {}) if _PARSED.get("config") == gin.config_str() else {}
    # (scope, name) of each configurable called: an unscoped binding is judged by unscoped
    # calls (`lr/LinearScheduler` does not make `LinearScheduler.schedule` an error).
    called = {key[:2] for key in used_keys}
    errors, alternatives = [], []
    for key in unused:
        where = direct.get(split_key(key), f"{key} (in a gin file)")
        if where.endswith("(--gin_param)") or split_key(key)[:2] in called:
            errors.append(where)
        else:
            alternatives.append(where)
    if alternatives:
        logging.warning("gin bindings of classes this run does not build (left unused): %s",
                        ", ".join(alternatives))
    if errors:
        if any(".lr" in e or "Adam" in e for e in errors):
            hint = ("the algorithms' default optimiser takes its learning rate from "
                    "default_optimizer.lr (A2C/PPO) or sac_default_optimizer.lr (SAC); bind "
                    "<Algorithm>.optimizer = @torch.optim.Adam to use torch.optim.Adam's bindings")
        else:
            hint = ("check the configurable's name and that the run builds it "
                    "(see operative_config.gin)")
        raise GinConfigError(
            f"binding(s) this run never uses: {', '.join(errors)}: nothing reads that parameter "
            "here (another class, or one whose value the code passes itself); " + hint
        )
