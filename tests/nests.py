"""The suite's one check that two nests (state dicts, checkpoints) are bit-identical."""

from typing import Any

import torch

from alf_entropy.utils import nest


def assert_nests_equal(got: Any, want: Any, where: str = "") -> None:
    """The same paths, and at each the same leaf: a tensor of one dtype, shape and bits, else ==.

    Args:
        got: the nest under test (dicts, lists, tuples, named tuples; any dict type).
        want: the expected nest.
        where: a name for the failure message.
    """
    got_leaves, want_leaves = dict(nest.flatten_with_path(got)), dict(nest.flatten_with_path(want))
    assert got_leaves.keys() == want_leaves.keys(), (
        f"{where}: paths differ: {sorted(got_leaves.keys() ^ want_leaves.keys())}"
    )
    for path, b in want_leaves.items():
        a, name = got_leaves[path], f"{where}:{path}"
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor) and (a.dtype, a.shape) == (b.dtype, b.shape), (
                f"{name}: {a!r} is not a {b.dtype} tensor of shape {tuple(b.shape)}"
            )
            assert torch.equal(a, b), (
                f"{name}: max |diff| {(a.double() - b.double()).abs().max().item()}"
            )
        else:
            assert a == b, f"{name}: {a!r} != {b!r}"
