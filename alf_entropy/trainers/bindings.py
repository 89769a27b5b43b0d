"""The gin bindings in force: refuse the ones nothing used; one-line errors.

:func:`check_bindings_used` (the trainer calls it once it has built
everything it builds before training) refuses a binding that nothing used:
one given with ``--gin_param``, or one in a gin file for a configurable the
run did call (whose value the code then passes itself), is an error naming
it; one in a gin file for a configurable the run never builds is a warning
(a config that switches the controller leaves the other controller's
settings bound).  Configurables first called during training
(:data:`LATE_CONFIGURABLES`) cannot be judged then and are left out.

:mod:`alf_entropy.trainers.gin_config`, which loads config files (and
imports the trainers), records here where each binding was written.
"""
import re
from typing import Dict, Optional, Set, Tuple

import gin
from absl import logging

from alf_entropy.trainers.run_dir import parse_operative_config

__all__ = ["GinConfigError", "LATE_CONFIGURABLES", "check_bindings_used", "one_line",
           "record_direct_bindings"]

LATE_CONFIGURABLES = frozenset({"evaluate", "estimated_entropy"})
"""Configurables first called during training, not when the trainer is built:
:func:`check_bindings_used` cannot tell whether their bindings are used."""

_Key = Tuple[str, str, str]
# What the last parsed config was (its text, to tell whether gin has been
# reconfigured since) and where each of its direct bindings was written.
_DIRECT: Dict[str, object] = {}
_HEADER = re.compile(r"^# Parameters for (.+):$")


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


def _normalize(key: str) -> _Key:
    """``(scope, configurable's last name, parameter)`` of a binding key."""
    scope, _, selector = key.rpartition("/")
    name, _, param = selector.rpartition(".")
    return scope, name.rsplit(".", 1)[-1], param


def record_direct_bindings(where: Dict[str, str]) -> None:
    """Remember where the config just parsed wrote each binding.

    Args:
        where: binding key -> where it was written (``"key (in file.gin)"``,
            ``"key = value (--gin_param)"``).
    """
    _DIRECT.clear()
    _DIRECT.update(config=gin.config_str(), bindings={_normalize(k): v for k, v in where.items()})


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
            and those of configurables that were called but did not take the
            bound value; unused bindings of configurables never called are
            logged as a warning.
    """
    bound = parse_operative_config(gin.config_str())
    operative = gin.operative_config_str()
    used_keys: Set[_Key] = {_normalize(k) for k in parse_operative_config(operative)}
    # The trainer binding is read by alf-entropy-train, not by the trainer:
    # a script that builds a trainer itself leaves it unused.
    skip = set(LATE_CONFIGURABLES) | {"train"} | ({constructing} if constructing else set())
    unused = [k for k in bound if _normalize(k) not in used_keys and _normalize(k)[1] not in skip]
    if not unused:
        return
    direct = _DIRECT.get("bindings", {}) if _DIRECT.get("config") == gin.config_str() else {}
    # (scope, name) of each configurable called: an unscoped binding is judged
    # by unscoped calls, so `lr/LinearScheduler` using its own bindings does not
    # make an unused `LinearScheduler.schedule` (for a target set to a number)
    # an error.
    called = {_normalize(m.group(1) + ".")[:2]
              for m in map(_HEADER.match, map(str.strip, operative.splitlines())) if m}
    errors, alternatives = [], []
    for key in unused:
        norm = _normalize(key)
        where = direct.get(norm, f"{key} (in a gin file)")
        if where.endswith("(--gin_param)") or norm[:2] in called:
            errors.append(where)  # asked for on the command line, or overridden by the code
        else:
            alternatives.append(where)  # a class this run does not build
    if alternatives:
        logging.warning(
            "gin bindings of classes this run does not build (left unused): %s",
            ", ".join(alternatives),
        )
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
