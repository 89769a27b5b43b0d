"""Whether code runs under ``torch.compile`` rather than eagerly.

Hand-written fast paths (the critics' backward, ``FusedAdam``'s lean step)
step aside while dynamo traces, so the compiler sees the plain operations.
"""
import torch

__all__ = ["is_compiling"]


def is_compiling() -> bool:
    """Whether ``torch.compile`` (dynamo) is tracing the caller.

    Returns:
        bool: True while tracing (``torch.compiler.is_compiling``, or
        ``torch._dynamo.is_compiling`` on torch < 2.3).
    """
    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    if check is None:
        check = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
    return bool(check is not None and check())
