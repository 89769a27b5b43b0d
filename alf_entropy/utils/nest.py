"""Nest handling: namedtuples, dicts, tuples and lists of tensors.

A thin layer over `optree <https://github.com/metaopt/optree>`_ with ALF's
function names, so algorithm code can say ``nest.map_structure(f, info)``
without caring how the tree is walked.  ``None`` is a leaf, as in ALF
(``flatten(None) == [None]``); ``()`` is an empty node.
"""

from typing import Any, Callable, List, Tuple

import optree

__all__ = [
    "flatten",
    "flatten_with_path",
    "pack_sequence_as",
    "map_structure",
    "assert_same_structure",
    "is_nested",
    "flatten_up_to",
]


def is_nested(value: Any) -> bool:
    """True if ``value`` is a namedtuple, dict, tuple or list (not a leaf)."""
    return isinstance(value, (tuple, list, dict))


def flatten(nest: Any) -> List[Any]:
    """Leaves of ``nest`` in a deterministic order (dicts by sorted key)."""
    return optree.tree_leaves(nest, none_is_leaf=True)


def _entry_str(entry: Any) -> str:
    field = getattr(entry, "field", None)  # namedtuple field name
    if field is not None:
        return str(field)
    key = getattr(entry, "key", None)  # dict key
    if key is not None:
        return str(key)
    return str(entry.entry)  # sequence index


def _accessor_str(accessor: Any) -> str:
    return ".".join(_entry_str(e) for e in accessor)


def flatten_with_path(nest: Any) -> List[Tuple[str, Any]]:
    """``(path, leaf)`` pairs; a path joins keys/field names/indices by ``.``.

    e.g. ``{"a": TimeStep(reward=r)}`` gives ``[("a.reward", r)]``.  A bare
    leaf has path ``""``.
    """
    accessors, leaves, _ = optree.tree_flatten_with_accessor(nest, none_is_leaf=True)
    return [(_accessor_str(a), leaf) for a, leaf in zip(accessors, leaves)]


def pack_sequence_as(structure: Any, flat: List[Any]) -> Any:
    """Inverse of ``flatten``: put ``flat`` leaves into ``structure``'s shape."""
    treespec = optree.tree_structure(structure, none_is_leaf=True)
    flat = list(flat)
    if len(flat) != treespec.num_leaves:
        raise ValueError(
            f"pack_sequence_as: structure has {treespec.num_leaves} leaves but "
            f"{len(flat)} values were given"
        )
    return optree.tree_unflatten(treespec, flat)


def assert_same_structure(nest1: Any, nest2: Any) -> None:
    """Raise ``ValueError`` unless both nests have the same tree structure."""
    s1 = optree.tree_structure(nest1, none_is_leaf=True)
    s2 = optree.tree_structure(nest2, none_is_leaf=True)
    if s1 != s2:
        raise ValueError(f"Nests have different structures: {s1} vs {s2}")


def map_structure(func: Callable[..., Any], *nests: Any) -> Any:
    """Apply ``func`` leaf-wise over nests of the same structure."""
    if not nests:
        raise ValueError("map_structure needs at least one nest")
    if not any(is_nested(n) for n in nests):  # leaves: no tree to walk (the hot case)
        return func(*nests)
    for other in nests[1:]:
        assert_same_structure(nests[0], other)
    return optree.tree_map(func, *nests, none_is_leaf=True)


def flatten_up_to(shallow: Any, nest: Any) -> List[Any]:
    """Flatten ``nest`` only as deep as ``shallow``'s structure goes.

    Each leaf position of ``shallow`` yields the corresponding sub-tree of
    ``nest`` as is, so ``None`` (or a whole distribution) may stand where
    ``shallow`` has a leaf: ``flatten_up_to({"a": s, "b": s}, {"a": None,
    "b": 1.0})`` is ``[None, 1.0]``.

    Raises:
        ValueError: if ``nest`` does not have ``shallow``'s structure down to
            ``shallow``'s leaves.
    """
    try:
        return optree.tree_structure(shallow, none_is_leaf=True).flatten_up_to(nest)
    except (ValueError, TypeError) as e:
        raise ValueError(f"Nest does not match the structure of {shallow!r}: {e}") from e
