"""A run's gin bindings: gin text read with gin's own parser, and the bindings a run left unused.

:func:`read_bindings` reads any gin text (a file, ``gin.config_str()``, a run's
``operative_config.gin``).  :func:`check_bindings_used` (a trainer calls it once it has
built what it builds, before it writes anything) refuses bindings nothing used.  Where
each binding was written (a file, ``--gin_param``) is what the config loader
(:mod:`alf_entropy.config.loading`, which reads the files) noted with :func:`note_sources`.
"""

import inspect
from typing import Any, Dict, List, Sequence, Tuple

import gin
from absl import logging
from gin import config_parser

__all__ = [
    "GinConfigError",
    "LATE_CONFIGURABLES",
    "TRAINER_BINDING",
    "check_bindings_used",
    "note_sources",
    "read_bindings",
    "read_imports",
    "split_key",
    "write_bindings",
]

TRAINER_BINDING = "train.trainer"
"""Names the trainer a config runs (``@OnPolicyTrainer`` or ``@OffPolicyTrainer``)."""

LATE_CONFIGURABLES = frozenset({"evaluate", "estimated_entropy"})
"""Configurables first called during training: :func:`check_bindings_used` cannot judge them."""


class GinConfigError(ValueError):
    """A gin file could not be found or a binding could not be applied or was never used."""


class _Name(str):
    """A reference or macro read from gin text, written back as it was (``@Adam``, ``%LR``)."""

    def __repr__(self):
        return str(self)


class _AsWritten(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_name: str, evaluate: bool) -> _Name:
        return _Name(f"@{scoped_name}{'()' if evaluate else ''}")

    def macro(self, macro_name: str) -> _Name:
        return _Name(f"%{macro_name}")


def read_bindings(text: str) -> Dict[str, str]:
    """The bindings of gin text, by gin's parser (includes are not followed; a reference
    or macro's value is its text, ``@Adam``, ``%LR``).

    Returns:
        ``"scope/Configurable.param"`` (a macro: its name) -> the value's
        canonical text (``(1, 2)`` however it was wrapped, ``@Adam``, ``%LR``).
    """
    out = {}
    for statement in config_parser.ConfigParser(text, _AsWritten()):
        if not isinstance(statement, config_parser.BindingStatement):
            continue
        scope = f"{statement.scope}/" if statement.scope else ""
        param = f".{statement.arg_name}" if statement.arg_name else ""
        out[scope + statement.selector + param] = repr(statement.value)
    return out


def read_imports(text: str) -> List[str]:
    """The modules gin text imports (``import m`` lines), by gin's parser."""
    statements = config_parser.ConfigParser(text, _AsWritten())
    return [s.module for s in statements if isinstance(s, config_parser.ImportStatement)]


def write_bindings(bindings: Dict[str, str], imports: Sequence[str] = ()) -> str:
    """Gin text of ``imports`` and ``bindings`` (as :func:`read_bindings` returns them), one
    per line."""
    lines = [f"import {module}\n" for module in imports]
    return "".join(lines + [f"{key} = {value}\n" for key, value in bindings.items()])


def split_key(key: str) -> Tuple[str, str, str]:
    """``(scope, configurable's last name, parameter)`` of a binding key."""
    scope, _, selector = key.rpartition("/")
    name, _, param = selector.rpartition(".")
    return scope, name.rsplit(".", 1)[-1], param


# The config whose sources were noted, and where each of its bindings was written.
_SOURCES = {}


def note_sources(where: Dict[Tuple[str, str, str], str]) -> None:
    """Note where each binding (:func:`split_key`) of the config now parsed was written
    (the config loader says), for :func:`check_bindings_used`'s messages."""
    _SOURCES.update(config=gin.config_str(), where=where)


def _dropped(key, built, family, bound):
    """Whether ``key`` binds a class of ``family`` other than ``built``'s a parameter that
    ``built`` takes but has no binding of: the run would silently use its default."""
    selector, param = key.rpartition("/")[2].rpartition(".")[::2]
    try:
        found = gin.get_configurable(selector)
    except ValueError:  # a macro
        return False
    cls = type(built)
    return (
        isinstance(found, type)
        and issubclass(found, family)
        and found is not cls
        and param in inspect.signature(cls).parameters
        and (cls.__name__, param) not in bound
    )


def check_bindings_used(constructing: str, built: Any, family: type) -> None:
    """Refuse bindings that no configurable called so far has used.

    One given with ``--gin_param``, or one of a configurable the run called (whose value
    the code passes itself), is an error; so is one of a class of ``family`` that the run
    did not build where the object it ``built`` of that family takes the parameter but
    has no binding of it (a config that swaps the controller class would drop its target).
    Any other one of a configurable the run never built is a warning (a config that
    switches the controller leaves the other one's own settings).
    :data:`LATE_CONFIGURABLES` are not judged.

    Args:
        constructing: a configurable whose call is under way (the trainer calling
            this from its constructor): gin records its parameters when it returns.
        built: what the run built of ``family`` (its entropy controller), or None.
        family: the class whose subclasses' settings a swap must keep.

    Raises:
        GinConfigError: naming the unused bindings that are errors.
    """
    used = {split_key(k) for k in read_bindings(gin.operative_config_str())}
    # The trainer binding is read by alf-entropy-train: a script's trainer leaves it unused.
    skip = {*LATE_CONFIGURABLES, "train", constructing}
    config = {split_key(k): k for k in read_bindings(gin.config_str())}
    unused = [k for k in config if k not in used and k[1] not in skip]
    if not unused:
        return
    where = _SOURCES.get("where", {}) if _SOURCES.get("config") == gin.config_str() else {}
    # (scope, name) of each configurable called: an unscoped binding is judged by unscoped
    # calls (`lr/LinearScheduler` does not make `LinearScheduler.schedule` an error).
    called = {key[:2] for key in used}
    bound = {key[1:] for key in config}
    errors, dropped, alternatives = [], [], []
    for key in unused:
        text = where.get(key, f"{config[key]} (in a gin file)")
        if text.endswith("(--gin_param)") or key[:2] in called:
            errors.append(text)
        elif built is not None and _dropped(config[key], built, family, bound):
            dropped.append(text)
        else:
            alternatives.append(text)
    if alternatives:
        logging.warning(
            "gin bindings of classes this run does not build (left unused): %s",
            ", ".join(alternatives),
        )
    if dropped:
        name = type(built).__name__
        raise GinConfigError(
            f"the run builds {name}, so these bindings of another class would be dropped: "
            f"{', '.join(dropped)}; bind each parameter for {name} too ({name}.<parameter> = "
            "the value, or its default if you mean that)"
        )
    if errors:
        if any(".lr" in e or "Adam" in e for e in errors):
            hint = (
                "the algorithms' default optimiser takes its learning rate from "
                "default_optimizer.lr (A2C/PPO) or sac_default_optimizer.lr (SAC); bind "
                "<Algorithm>.optimizer = @torch.optim.Adam to use torch.optim.Adam's bindings"
            )
        else:
            hint = (
                "check the configurable's name and that the run builds it "
                "(see operative_config.gin)"
            )
        raise GinConfigError(
            f"binding(s) this run never uses: {', '.join(errors)}: nothing reads that parameter "
            "here (another class, or one whose value the code passes itself); " + hint
        )
