"""Tests for alf_entropy.utils.nest (flatten/pack/map over nests)."""

import collections

import numpy as np
import pytest
import torch

from alf_entropy.data_structures import LossInfo, TimeStep
from alf_entropy.utils import nest

Point = collections.namedtuple("Point", ["y", "x"])  # deliberately not sorted


# --------------------------------------------------------------------- flatten
def test_flatten_dict_uses_sorted_keys():
    assert nest.flatten({"b": 1, "a": 2, "c": 3}) == [2, 1, 3]


def test_flatten_namedtuple_uses_field_order():
    assert nest.flatten(Point(y=1, x=2)) == [1, 2]


def test_flatten_list_and_tuple_keep_order_and_recurse():
    assert nest.flatten([3, (1, [2, 5]), 4]) == [3, 1, 2, 5, 4]


def test_flatten_leaf_and_empty_tuple_default_fields():
    t = torch.tensor([1.0])
    assert nest.flatten(t) == [t]
    # TimeStep fields default to (), which holds no leaves.
    assert nest.flatten(TimeStep(reward=5)) == [5]
    assert nest.flatten(()) == []


def test_flatten_mixed_nest():
    n = {"z": Point(y=[1, 2], x=3), "a": (4,)}
    assert nest.flatten(n) == [4, 1, 2, 3]


def test_none_is_a_leaf_as_in_alf():
    assert nest.flatten(None) == [None]
    assert nest.flatten([1, None, 2]) == [1, None, 2]
    assert nest.map_structure(lambda x: x is None, [1, None]) == [False, True]
    assert nest.pack_sequence_as({"a": None, "b": 0}, [7, 8]) == {"a": 7, "b": 8}
    assert nest.flatten_with_path({"a": None}) == [("a", None)]
    nest.assert_same_structure({"a": None}, {"a": 1})
    with pytest.raises(ValueError):
        nest.assert_same_structure([None], [])


def test_is_nested():
    assert nest.is_nested([1])
    assert nest.is_nested((1,))
    assert nest.is_nested({"a": 1})
    assert nest.is_nested(Point(1, 2))
    assert not nest.is_nested(torch.zeros(2))
    assert not nest.is_nested(3)


# ------------------------------------------------------------ flatten_with_path
def test_flatten_with_path_namedtuple_in_dict():
    r = torch.tensor([1.0])
    assert nest.flatten_with_path({"a": TimeStep(reward=r)}) == [("a.reward", r)]


def test_flatten_with_path_mixed():
    n = {"b": [3, (4, {"z": 5, "y": 6})], "a": Point(y=1, x=2)}
    assert nest.flatten_with_path(n) == [
        ("a.y", 1),
        ("a.x", 2),
        ("b.0", 3),
        ("b.1.0", 4),
        ("b.1.1.y", 6),
        ("b.1.1.z", 5),
    ]


def test_flatten_with_path_leaf_has_empty_path():
    assert nest.flatten_with_path(5) == [("", 5)]


def test_flatten_with_path_leaves_match_flatten():
    n = {"q": [1, 2], "p": LossInfo(loss=3, extra={"e": 4})}
    assert [leaf for _, leaf in nest.flatten_with_path(n)] == nest.flatten(n)


# ------------------------------------------------------------ pack_sequence_as
def test_pack_sequence_as_round_trip():
    n = {"b": [1, (2, 3)], "a": Point(y=4, x={"k": 5}), "c": TimeStep(reward=6)}
    flat = nest.flatten(n)
    packed = nest.pack_sequence_as(n, flat)
    assert packed == n
    assert isinstance(packed["a"], Point)
    assert isinstance(packed["c"], TimeStep)
    assert isinstance(packed["b"], list) and isinstance(packed["b"][1], tuple)


def test_pack_sequence_as_places_new_values():
    n = {"b": [0, 0], "a": 0}
    assert nest.pack_sequence_as(n, ["A", "B0", "B1"]) == {"a": "A", "b": ["B0", "B1"]}


@pytest.mark.parametrize("flat", [[1, 2], [1, 2, 3, 4]])
def test_pack_sequence_as_wrong_length_raises(flat):
    with pytest.raises(ValueError, match="3 leaves"):
        nest.pack_sequence_as([0, (0, 0)], flat)


# --------------------------------------------------------------- map_structure
def test_map_structure_single_nest_keeps_types():
    n = Point(y=[1, 2], x={"k": 3})
    out = nest.map_structure(lambda v: v + 1, n)
    assert out == Point(y=[2, 3], x={"k": 4})
    assert isinstance(out, Point)


def test_map_structure_over_two_nests():
    a = {"u": torch.tensor([1.0, 2.0]), "v": (torch.tensor(3.0),)}
    b = {"u": torch.tensor([10.0, 20.0]), "v": (torch.tensor(30.0),)}
    out = nest.map_structure(lambda x, y: x + y, a, b)
    assert torch.equal(out["u"], torch.tensor([11.0, 22.0]))
    assert torch.equal(out["v"][0], torch.tensor(33.0))
    assert isinstance(out["v"], tuple)


@pytest.mark.parametrize(
    "other",
    [
        [1, 2, 3],  # different length
        (1, 2),  # list vs tuple
        {"a": 1, "b": 2},  # different container
        [1, [2]],  # different depth
    ],
)
def test_map_structure_mismatch_raises(other):
    with pytest.raises(ValueError, match="different structures"):
        nest.map_structure(lambda x, y: x, [1, 2], other)


@pytest.mark.parametrize("nests", [(1, [1]), ([1], 1), (None, ())])
def test_map_structure_leaf_against_a_nest_raises(nests):
    with pytest.raises(ValueError, match="different structures"):
        nest.map_structure(lambda x, y: x, *nests)


def test_map_structure_of_leaves_is_the_call():
    a, b = np.arange(3), torch.ones(2)
    assert nest.map_structure(lambda x, y: (x, y), a, b) == (a, b)  # a leaf result: no walk
    assert nest.map_structure(lambda x: x, None) is None


def test_map_structure_mismatched_dict_keys_raises():
    with pytest.raises(ValueError):
        nest.map_structure(lambda x, y: x, {"a": 1}, {"b": 1})


def test_map_structure_needs_a_nest():
    with pytest.raises(ValueError, match="at least one"):
        nest.map_structure(lambda: 0)


def test_assert_same_structure():
    nest.assert_same_structure(Point(1, [2]), Point("a", ["b"]))  # no error
    with pytest.raises(ValueError):
        nest.assert_same_structure(Point(1, [2]), Point(1, 2))
