"""A staged controller that never reaches its adjust stage says so, once."""

import logging
import warnings

import pytest
import torch

from alf_entropy.algorithms.entropy_target_algorithm import STUCK_UPDATES, EntropyTargetAlgorithm
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils import summary

DISCRETE4 = BoundedTensorSpec((), torch.int64, 0, 3)


def _run(controller, entropies):
    """Feed ``entropies`` (one update each); return the warnings' messages."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for h in entropies:
            controller.entropy_loss(torch.full((4,), h))
    return [str(w.message) for w in record]


def test_a_controller_stuck_in_its_init_stage_warns_once_why_and_what_to_do(caplog):
    # The entropy stays at 1.0, above the max_entropy estimated from it (0.8).
    controller = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5)
    with caplog.at_level(logging.WARNING):
        messages = _run(controller, [1.0] * (STUCK_UPDATES - 1))
        assert messages == []  # not before the threshold
        messages = _run(controller, [1.0] * (2 * STUCK_UPDATES))
    assert controller.stage.item() == -2
    assert len(messages) == 1, messages
    (message,) = messages
    for part in (
        "init stage",
        f"after {STUCK_UPDATES} updates",
        "average entropy (1.000)",
        "max_entropy 0.800 (estimated",
        "target (0.500)",
        "give max_entropy",
        "skip_free_stage=True",
        "smaller initial_alpha",
    ):
        assert part in message, (part, message)
    assert [r.getMessage() for r in caplog.records if "init stage" in r.getMessage()] == [message]


def test_a_controller_stuck_in_its_free_stage_warns_once():
    # max_entropy given: init ends at once, but the entropy never falls below the target.
    controller = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, max_entropy=1.2)
    messages = _run(controller, [1.0] * (STUCK_UPDATES + 10))
    assert controller.stage.item() == -1
    assert len(messages) == 1 and "free stage" in messages[0]
    for part in (
        "average entropy (1.000)",
        "target (0.500)",
        "max_entropy 1.200 (given)",
        "skip_free_stage=True",
        "smaller initial_alpha",
    ):
        assert part in messages[0], (part, messages[0])


def test_a_controller_that_acts_is_silent():
    controller = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5)
    # Falls below the estimated max_entropy and the target: adjusting after a few updates.
    messages = _run(controller, [1.0, 1.0] + [0.4, 0.55] * STUCK_UPDATES)
    assert controller.stage.item() >= 0
    assert messages == []
    skipping = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, skip_free_stage=True)
    assert _run(skipping, [1.0] * (STUCK_UPDATES + 10)) == []  # adjusting from the start


def test_the_threshold_grows_with_a_long_average_window():
    window = STUCK_UPDATES // 5  # 10 windows: 2 * STUCK_UPDATES updates
    controller = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, average_window=window)
    assert _run(controller, [1.0] * (2 * STUCK_UPDATES - 1)) == []
    assert len(_run(controller, [1.0])) == 1


@pytest.mark.parametrize("recording", [False, True])
def test_the_tensor_path_checks_only_where_summaries_are_recorded(recording, tmp_path):
    """On the tensor path (a GPU's) the stage is read only at a recorded summary step."""
    controller = EntropyTargetAlgorithm(DISCRETE4, target_entropy=0.5, update_mode="tensor")
    summary.set_default_writer(summary.create_summary_writer(str(tmp_path)))
    try:
        with summary.record_if(lambda: recording):
            messages = _run(controller, [1.0] * (STUCK_UPDATES + 10))
    finally:
        summary.get_default_writer().close()
        summary.set_default_writer(None)
    assert len(messages) == (1 if recording else 0)
    assert ("stuck" in controller.warn.said) == recording
