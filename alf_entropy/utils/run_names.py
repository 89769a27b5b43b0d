"""How runs name their directories: one rule for a sweep's run dirs and a batch's agent dirs.

A packed sweep (K agents in one process) must write each agent where the
unpacked sweep writes that run, so both name directories with :func:`dir_safe`.
"""

import re

__all__ = ["dir_safe"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


def dir_safe(text: str) -> str:
    """``text`` with every run of characters unsafe in a directory name replaced by ``_``.

    Args:
        text: a binding's value as written, e.g. ``"@LinearScheduler()"``.

    Returns:
        str: the text with only letters, digits and ``._=+-`` left.
    """
    return _UNSAFE.sub("_", text)
