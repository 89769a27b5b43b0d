"""Tests for alf_entropy.utils.averager (window and exponential averagers)."""
import contextlib

import pytest
import torch

from alf_entropy.tensor_specs import TensorSpec
from alf_entropy.utils.averager import (
    ScalarWindowAverager,
    WindowAverager,
)


def _close(a, b, tol=1e-6):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64),
                          torch.as_tensor(b, dtype=torch.float64), atol=tol, rtol=0)


# -------------------------------------------------------------- WindowAverager
def test_window_get_is_zero_before_data():
    avg = ScalarWindowAverager(3)
    assert avg.get().shape == ()
    assert avg.get() == 0.0
    vec = WindowAverager(TensorSpec((2,)), 4)
    assert torch.equal(vec.get(), torch.zeros(2))


def test_window_partial_then_sliding_mean():
    avg = ScalarWindowAverager(3)
    values = [1.0, 2.0, 4.0, 8.0, 16.0]
    expected = [1.0, 1.5, 7.0 / 3, 14.0 / 3, 28.0 / 3]
    got = [avg.average(torch.tensor(v)).clone() for v in values]
    for g, e in zip(got, expected):
        assert _close(g, e), (got, expected)
    assert _close(avg.get(), 28.0 / 3)


def test_window_vector_spec_and_outer_dims_are_averaged():
    avg = WindowAverager(TensorSpec((2,)), 2)
    # Outer dims [2, 3] are averaged away first.
    x = torch.arange(12, dtype=torch.float32).reshape(2, 3, 2)
    avg.update(x)
    assert _close(avg.get(), x.mean(dim=(0, 1)))
    avg.update(torch.tensor([[10.0, 20.0]]))
    assert _close(avg.get(), (x.mean(dim=(0, 1)) + torch.tensor([10.0, 20.0])) / 2)


def test_scalar_window_outer_dims_are_averaged():
    avg = ScalarWindowAverager(2)
    avg.update(torch.tensor([1.0, 3.0]))  # mean 2
    avg.update(torch.tensor([[4.0, 6.0], [8.0, 10.0]]))  # mean 7
    assert _close(avg.get(), 4.5)


def test_window_wrong_shape_raises():
    avg = WindowAverager(TensorSpec((2,)), 2)
    with pytest.raises(ValueError, match="spec shape"):
        avg.update(torch.zeros(3))


def test_window_gated_update_false_is_noop():
    avg = ScalarWindowAverager(3)
    avg.update(torch.tensor(2.0))
    avg.update(torch.tensor(4.0))
    before = {k: v.clone() for k, v in avg.state_dict().items()}
    avg.update(torch.tensor(100.0), valid=torch.tensor(False))
    after = avg.state_dict()
    assert set(before) == set(after)
    for k in before:
        assert torch.equal(before[k], after[k]), k
    assert _close(avg.get(), 3.0)
    # A true flag updates as usual.
    avg.update(torch.tensor(9.0), valid=torch.tensor(True))
    assert _close(avg.get(), 5.0)


def test_window_gated_noop_when_buffer_full():
    avg = ScalarWindowAverager(2)
    for v in (1.0, 2.0, 3.0):
        avg.update(torch.tensor(v))
    before = {k: v.clone() for k, v in avg.state_dict().items()}
    avg.update(torch.tensor(-50.0), valid=torch.tensor(False))
    for k, v in avg.state_dict().items():
        assert torch.equal(before[k], v), k
    assert _close(avg.get(), 2.5)


def test_window_state_dict_round_trip_continues_identically():
    a = ScalarWindowAverager(3)
    for v in (1.0, 5.0, 2.0, 7.0):
        a.update(torch.tensor(v))
    b = ScalarWindowAverager(3)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.get(), b.get())
    for v in (3.0, -1.0, 4.0, 10.0):
        ra = a.average(torch.tensor(v))
        rb = b.average(torch.tensor(v))
        assert torch.equal(ra, rb)


def test_window_state_is_in_buffers():
    avg = ScalarWindowAverager(3)
    keys = set(avg.state_dict())
    assert len(keys) >= 2
    assert list(avg.parameters()) == []


@pytest.mark.parametrize("window", [0, -1, 1.5, True])
def test_window_size_invalid_raises(window):
    with pytest.raises(ValueError, match="window_size"):
        ScalarWindowAverager(window)


def test_window_integer_spec_rejected():
    with pytest.raises(TypeError):
        WindowAverager(TensorSpec((), torch.int64), 2)


def test_window_size_one_tracks_last_value():
    avg = ScalarWindowAverager(1)
    assert avg.window_size == 1
    for v in (3.0, -2.0, 7.5):
        assert _close(avg.average(torch.tensor(v)), v)


# ----------------------------------------------------------------- no host sync
_SYNC_METHODS = ("__bool__", "item", "__float__", "__int__", "tolist")


@contextlib.contextmanager
def _forbid_host_sync():
    """Make every tensor->host conversion raise while the block runs."""
    saved = {name: torch.Tensor.__dict__.get(name) for name in _SYNC_METHODS}

    def _raise(*args, **kwargs):
        raise RuntimeError("host sync")

    try:
        for name in _SYNC_METHODS:
            setattr(torch.Tensor, name, _raise)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, value)


def test_forbid_host_sync_is_effective_and_restored():
    t = torch.tensor(1.0)
    caught = []
    with _forbid_host_sync():
        for fn in (bool, float, int, lambda x: x.item(), lambda x: x.tolist()):
            try:
                fn(t)
            except RuntimeError:
                caught.append(True)
    assert caught == [True] * 5
    assert bool(t) and t.item() == 1.0 and float(t) == 1.0 and t.tolist() == 1.0


def _exercise_averagers():
    """Run update/get/average (gated and not) on fresh averagers; return results."""
    window = WindowAverager(TensorSpec((2,)), 3)
    swin = ScalarWindowAverager(2)
    results = []
    for i in range(4):
        x = torch.arange(10, dtype=torch.float32).reshape(5, 2) * (i + 1)
        flag = torch.tensor(i % 2 == 0)
        window.update(x)
        window.update(x, valid=flag)
        swin.update(x[:, 0], valid=flag)
        results.append(
            (window.get(), swin.average(x[1, 0]), swin.average(x[1, 1], flag))
        )
    return results


def test_averagers_do_not_sync_with_host():
    with _forbid_host_sync():
        patched = _exercise_averagers()
    reference = _exercise_averagers()
    assert len(patched) == len(reference) == 4
    for got, want in zip(patched, reference):
        for g, w in zip(got, want):
            assert torch.equal(g, w)
    assert not torch.equal(reference[0][0], reference[-1][0])
