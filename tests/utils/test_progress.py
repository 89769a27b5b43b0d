"""The training progress has one owner, alf_entropy.utils.progress."""

import pytest

from alf_entropy.utils import progress, schedulers, summary


def test_schedulers_and_summary_hand_out_the_progress_modules_own_functions():
    for name in (
        "update_progress",
        "get_progress",
        "reset_progress",
        "get_all_progress",
        "set_all_progress",
        "progress_was_fed",
        "PROGRESS_TYPES",
    ):
        assert getattr(schedulers, name) is getattr(progress, name)
    for name in ("get_global_counter", "set_global_counter", "increment_global_counter"):
        assert getattr(summary, name) is getattr(progress, name)


def test_the_global_counter_is_one_value_for_progress_schedulers_and_summaries():
    progress.reset_progress()
    schedulers.update_progress("global_counter", 7)
    assert summary.get_global_counter() == 7 == progress.get_progress("global_counter")
    assert summary.increment_global_counter() == 8
    assert schedulers.LinearScheduler("global_counter", [(0, 0.0), (16, 1.0)])() == 0.5
    progress.reset_progress()
    assert summary.get_global_counter() == 0 and not progress.progress_was_fed("iterations")


def test_bad_counters_name_the_argument():
    with pytest.raises(TypeError, match="n must be an int >= 0, got a bool"):
        progress.set_global_counter(True)
    with pytest.raises(ValueError, match="n must be an int >= 0, got -1"):
        progress.set_global_counter(-1)
    with pytest.raises(ValueError, match="progress_type"):
        progress.check_progress_type("epochs")
