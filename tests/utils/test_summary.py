"""Tests for ``alf_entropy.utils.summary``: event files, gating, scopes, counter."""

import numbers

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from alf_entropy.utils import summary


@pytest.fixture(autouse=True)
def _clean_state():
    summary.set_default_writer(None)
    summary.enable_summary(True)
    summary.set_global_counter(0)
    yield
    summary.close()
    summary.enable_summary(True)
    summary.set_global_counter(0)


@pytest.fixture
def writer(tmp_path):
    w = summary.create_summary_writer(str(tmp_path), flush_secs=1)
    summary.set_default_writer(w)
    return w


def _load(path) -> EventAccumulator:
    summary.flush()
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def _scalars(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


class _Untouchable:
    """A value whose every conversion raises: proves it was never looked at."""

    def _boom(self, *args, **kwargs):
        raise AssertionError("summary touched a value while summaries were off")

    __float__ = __int__ = __index__ = __bool__ = __array__ = item = detach = _boom
    cpu = numpy = tolist = __len__ = __iter__ = _boom


# Pretend to be a number, so that only the summaries-off guard can skip it.
numbers.Real.register(_Untouchable)


def test_default_writer_set_get():
    assert summary.get_default_writer() is None
    assert not summary.should_record_summaries()


def test_scalar_events_written_and_readable(tmp_path, writer):
    assert summary.get_default_writer() is writer
    summary.scalar("a", 1.5)  # step = global counter = 0
    summary.set_global_counter(3)
    summary.scalar("a", torch.tensor(2.5))  # 0-d tensor
    summary.scalar("a", torch.tensor([4.0], requires_grad=True) * 2, step=7)
    summary.scalar("b", np.float32(0.25), step=1)
    acc = _load(tmp_path)
    assert _scalars(acc, "a") == [(0, 1.5), (3, 2.5), (7, 8.0)]
    assert _scalars(acc, "b") == [(1, 0.25)]


def test_scopes_join_with_slash(tmp_path, writer):
    with summary.scope("outer") as prefix:
        assert prefix == "outer/"
        summary.scalar("x", 1.0)
        with summary.scope("/inner/"):
            summary.scalar("y", 2.0)
        summary.scalar("z", 3.0)
    summary.scalar("top", 4.0)
    acc = _load(tmp_path)
    tags = acc.Tags()
    assert set(tags["scalars"]) == {"outer/x", "outer/inner/y", "outer/z", "top"}


def test_should_record_requires_writer_enabled_and_cond(tmp_path):
    assert not summary.should_record_summaries()  # no writer
    summary.set_default_writer(summary.create_summary_writer(str(tmp_path)))
    assert summary.should_record_summaries()
    summary.enable_summary(False)
    assert not summary.is_summary_enabled()
    assert not summary.should_record_summaries()
    summary.enable_summary(True)
    with summary.record_if(lambda: False):
        assert not summary.should_record_summaries()
        with summary.record_if(lambda: True):  # innermost wins
            assert summary.should_record_summaries()
        assert not summary.should_record_summaries()
    assert summary.should_record_summaries()


def test_record_if_gating_of_events(tmp_path, writer):
    with summary.record_if(lambda: summary.get_global_counter() % 2 == 0):
        for _ in range(5):
            summary.scalar("gated", float(summary.get_global_counter()))
            summary.increment_global_counter()
    summary.enable_summary(False)
    summary.scalar("disabled", 1.0)
    summary.enable_summary(True)
    summary.scalar("enabled", 1.0)
    acc = _load(tmp_path)
    assert _scalars(acc, "gated") == [(0, 0.0), (2, 2.0), (4, 4.0)]
    assert "disabled" not in acc.Tags()["scalars"]
    assert "enabled" in acc.Tags()["scalars"]


def test_no_conversion_when_off(tmp_path):
    value = _Untouchable()
    # no writer
    summary.scalar("v", value)
    # writer but disabled
    summary.set_default_writer(summary.create_summary_writer(str(tmp_path)))
    summary.enable_summary(False)
    summary.scalar("v", value)
    # enabled but record_if false
    summary.enable_summary(True)
    with summary.record_if(lambda: False):
        summary.scalar("v", value)
    # and when on, the same object is indeed looked at (the guard is real)
    with pytest.raises(AssertionError, match="touched"):
        summary.scalar("v", value)


def test_tensor_not_synced_when_off(monkeypatch, tmp_path):
    t = torch.tensor(1.0)
    calls = []
    monkeypatch.setattr(torch.Tensor, "item", lambda self: calls.append(1) or 0.0)
    monkeypatch.setattr(torch.Tensor, "detach", lambda self: calls.append(1) or self)
    summary.set_default_writer(summary.create_summary_writer(str(tmp_path)))
    with summary.record_if(lambda: False):
        summary.scalar("t", t)
    assert calls == []
    summary.scalar("t", t)  # on: the tensor is now read
    assert calls


def test_global_counter():
    assert summary.get_global_counter() == 0
    assert summary.increment_global_counter() == 1
    assert summary.increment_global_counter() == 2
    summary.set_global_counter(np.int64(10))
    assert summary.get_global_counter() == 10
    assert type(summary.get_global_counter()) is int
    with pytest.raises(ValueError, match="n"):
        summary.set_global_counter(-1)
    with pytest.raises(TypeError, match="n"):
        summary.set_global_counter(1.5)
    with pytest.raises(TypeError, match="n"):
        summary.set_global_counter(True)


def test_bad_arguments(tmp_path, writer):
    with pytest.raises(ValueError, match="scope name"):
        summary.scope("")
    with pytest.raises(ValueError, match="scope name"):
        summary.scope("//")
    with pytest.raises(TypeError, match="cond"):
        summary.record_if(True)
    with pytest.raises(TypeError, match="flag"):
        summary.enable_summary(1)
    with pytest.raises(TypeError, match="writer"):
        summary.set_default_writer("not a writer")
    with pytest.raises(ValueError, match="flush_secs"):
        summary.create_summary_writer(str(tmp_path), flush_secs=0)
    with pytest.raises(ValueError, match="root_dir"):
        summary.create_summary_writer("")
    summary.scalar("v", torch.arange(3.0))  # one writer, K values: a tag per member
    assert [summary.last_scalars()[f"v/{k}"] for k in range(3)] == [[0.0], [1.0], [2.0]]
    with pytest.raises(TypeError, match="real number"):
        summary.scalar("v", "1.0")
    with pytest.raises(ValueError, match="step"):
        summary.scalar("v", 1.0, step=-2)
    with pytest.raises(ValueError, match="name"):
        summary.scalar("", 1.0)


def test_close_unsets_writer(tmp_path, writer):
    summary.scalar("a", 1.0)
    summary.close()
    assert summary.get_default_writer() is None
    assert not summary.should_record_summaries()
    summary.close()  # no-op
    summary.flush()  # no-op
    acc = _load(tmp_path)
    assert _scalars(acc, "a") == [(0, 1.0)]


def _events(path):
    """The summary events of the event files under ``path``: (step, [(tag, value), ...])."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    files = sorted(p for p in path.iterdir() if "tfevents" in p.name)
    events = [Event.FromString(r) for f in files for r in RawEventFileLoader(str(f)).Load()]
    return [
        (e.step, [(v.tag, v.simple_value) for v in e.summary.value])
        for e in events
        if e.summary.value
    ]


def test_one_event_a_step_per_writer(tmp_path):
    """A step's scalars go out as one event, written when another step comes or on flush;
    readers see every point."""
    writers = [summary.create_summary_writer(str(tmp_path / f"w{k}")) for k in range(2)]
    summary.set_default_writer(writers)
    for _ in range(3):  # three updates of one step, as a controller's minibatches write
        summary.scalar("alpha", torch.tensor([0.5, 2.0]))
        summary.scalar("stage", 1)
    summary.scalar("return_vs_env_steps", [7.0, None], step=100)
    summary.set_global_counter(1)
    summary.scalar("alpha", torch.tensor([0.25, 4.0]))
    writers[0].flush()  # writes every writer's pending step (step 1's)
    assert _events(tmp_path / "w0") == [
        (0, [("alpha", 0.5), ("stage", 1.0)] * 3),
        (100, [("return_vs_env_steps", 7.0)]),
        (1, [("alpha", 0.25)]),
    ]
    writers[1].flush()
    assert _events(tmp_path / "w1") == [
        (0, [("alpha", 2.0), ("stage", 1.0)] * 3),
        (1, [("alpha", 4.0)]),
    ]
    assert _scalars(_load(tmp_path / "w1"), "alpha") == [(0, 2.0)] * 3 + [(1, 4.0)]


def test_pending_step_written_when_the_writer_changes(tmp_path):
    first = summary.create_summary_writer(str(tmp_path / "first"))
    summary.set_default_writer(first)
    summary.scalar("a", 1.0)
    summary.set_default_writer(summary.create_summary_writer(str(tmp_path / "second")))
    first.flush()
    assert _events(tmp_path / "first") == [(0, [("a", 1.0)])]


def test_the_pending_step_survives_a_writer_closed_by_its_owner(tmp_path):
    """``create_summary_writer``'s writer writes the pending step when it is flushed or
    closed; a plain ``SummaryWriter`` closed behind the module's back is opened again."""
    from torch.utils.tensorboard import SummaryWriter

    ours = summary.create_summary_writer(str(tmp_path / "ours"))
    summary.set_default_writer(ours)
    summary.scalar("a", 1.0)
    ours.flush()
    assert _events(tmp_path / "ours") == [(0, [("a", 1.0)])]
    summary.scalar("a", 2.0)
    ours.close()
    assert _events(tmp_path / "ours") == [(0, [("a", 1.0)]), (0, [("a", 2.0)])]
    plain = SummaryWriter(str(tmp_path / "plain"))
    summary.set_default_writer(plain)
    summary.scalar("b", 3.0, step=5)
    plain.close()
    summary.set_default_writer(None)  # writes "b" through add_scalar, which reopens
    plain.close()
    assert _events(tmp_path / "plain") == [(5, [("b", 3.0)])]
