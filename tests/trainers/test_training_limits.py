"""Issue 13: either training limit, whichever is reached first (ALF's rule)."""

import functools

import pytest

from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.storage.checkpoints import latest_checkpoint
from alf_entropy.trainers import callbacks as callbacks_module
from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer
from alf_entropy.utils import schedulers
from tests.trainers.test_on_policy_trainer import _trainer as small_trainer

STEPS_PER_ITERATION = 2 * 16


pytestmark = pytest.mark.usefixtures("one_thread")


def _trainer(root_dir, **kwargs):
    """The on-policy tests' small trainer, with one cheap update per iteration."""
    kwargs.setdefault(
        "algorithm_ctor", functools.partial(PPOAlgorithm, num_epochs=1, num_minibatches=1)
    )
    return small_trainer(root_dir, **kwargs)


def _record_progress(monkeypatch):
    """Record ``percent`` at the start of every iteration."""
    seen = []
    original = OnPolicyTrainer._train_iteration

    def recording(self):
        seen.append(schedulers.get_progress("percent"))
        return original(self)

    monkeypatch.setattr(OnPolicyTrainer, "_train_iteration", recording)
    return seen


@pytest.mark.parametrize(
    "limits, iterations",
    [
        (dict(num_iterations=3), 3),
        (dict(num_iterations=3, num_env_steps=None), 3),
        (dict(num_iterations=3, num_env_steps=0), 3),
        (dict(num_env_steps=100), 4),  # 100 / 32 rounded up
        (dict(num_iterations=0, num_env_steps=64), 2),
        (dict(num_iterations=2, num_env_steps=10_000), 2),  # iterations bind
        (dict(num_iterations=50, num_env_steps=64), 2),  # env steps bind
    ],
)
def test_the_first_limit_reached_ends_the_run(tmp_path, monkeypatch, limits, iterations):
    seen = _record_progress(monkeypatch)
    trainer = _trainer(tmp_path, checkpoint_interval=None, **limits)
    assert trainer.total_iterations == iterations
    assert trainer.num_iterations == (limits.get("num_iterations") or None)  # as given
    result = trainer.train()
    assert result["iteration"] == iterations
    assert result["env_steps"] == iterations * STEPS_PER_ITERATION
    assert not result["already_done"]
    assert len(seen) == iterations
    assert schedulers.get_progress("percent") == 1.0


@pytest.mark.parametrize(
    "limits, expected",
    [
        # iterations bind: percent = iterations / num_iterations
        (dict(num_iterations=4, num_env_steps=10_000), [0, 0.25, 0.5, 0.75]),
        # env steps bind: percent = env_steps / num_env_steps
        (dict(num_iterations=50, num_env_steps=128), [0, 0.25, 0.5, 0.75]),
        # env steps bind, not a multiple of an iteration: the last one ends past it
        (dict(num_iterations=50, num_env_steps=80), [0, 0.4, 0.8]),
        # both bind at once
        (dict(num_iterations=2, num_env_steps=64), [0, 0.5]),
    ],
)
def test_percent_follows_the_binding_limit(tmp_path, monkeypatch, limits, expected):
    seen = _record_progress(monkeypatch)
    _trainer(tmp_path, checkpoint_interval=None, **limits).train()
    assert seen == pytest.approx(expected)
    assert schedulers.get_progress("percent") == 1.0


def test_a_percent_schedule_spans_the_run_under_either_limit(tmp_path, monkeypatch):
    scheduler = schedulers.LinearScheduler("percent", [(0, 1.0), (1, 0.0)])
    for name, limits in [
        ("it", dict(num_iterations=4, num_env_steps=10_000)),
        ("steps", dict(num_iterations=100, num_env_steps=128)),
    ]:
        values = []
        original = OnPolicyTrainer._train_iteration

        def recording(self, original=original):
            values.append(scheduler())
            return original(self)

        monkeypatch.setattr(OnPolicyTrainer, "_train_iteration", recording)
        _trainer(tmp_path / name, checkpoint_interval=None, **limits).train()
        monkeypatch.setattr(OnPolicyTrainer, "_train_iteration", original)
        assert values == pytest.approx([1.0, 0.75, 0.5, 0.25]), name
        assert scheduler() == 0.0


def test_progress_bar_total_is_the_binding_limit(tmp_path, monkeypatch):
    totals = []
    real_tqdm = callbacks_module.tqdm

    def recording_tqdm(*args, **kwargs):
        totals.append((kwargs["total"], kwargs["initial"]))
        return real_tqdm(*args, **kwargs)

    monkeypatch.setattr(callbacks_module, "tqdm", recording_tqdm)
    _trainer(tmp_path / "a", num_iterations=3, num_env_steps=10_000, progress_bar=True).train()
    _trainer(tmp_path / "b", num_iterations=30, num_env_steps=64, progress_bar=True).train()
    assert totals == [(3, 0), (2, 0)]


def test_resume_within_and_past_the_limit(tmp_path, caplog):
    assert _trainer(tmp_path, num_iterations=2).train()["iteration"] == 2
    first = latest_checkpoint(str(tmp_path / "checkpoints"))

    # Already at (or past) the limit: nothing is done, no checkpoint written.
    for limits in (
        dict(num_iterations=2),
        dict(num_iterations=1),
        dict(num_env_steps=2 * STEPS_PER_ITERATION),
    ):
        trainer = _trainer(tmp_path, **limits)
        with caplog.at_level("INFO"):
            result = trainer.train()
        assert result["already_done"] and result["iteration"] == 2
        assert latest_checkpoint(str(tmp_path / "checkpoints")) == first
        assert "Nothing to do" in caplog.text and "already at" in caplog.text
        caplog.clear()

    # A larger limit (either one) continues from iteration 2.
    trainer = _trainer(tmp_path, num_iterations=3, num_env_steps=10_000)
    assert trainer.iteration == 2
    result = trainer.train()
    assert not result["already_done"] and result["iteration"] == 3
    trainer = _trainer(tmp_path, num_env_steps=5 * STEPS_PER_ITERATION)
    assert trainer.train()["iteration"] == 5
    assert latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-00000005.pt")


@pytest.mark.parametrize(
    "limits, match",
    [
        (dict(), "at least one of num_iterations and num_env_steps must be positive"),
        (dict(num_iterations=0, num_env_steps=0), "at least one"),
        (dict(num_iterations=None, num_env_steps=None), "at least one"),
        (
            dict(num_iterations=-3),
            r"num_iterations must be an int >= 0 or None \(0 or None: no limit\)",
        ),
        (
            dict(num_iterations=2, num_env_steps=-1),
            r"num_env_steps must be an int >= 0 or None \(0 or None: no limit\)",
        ),
        (dict(num_iterations=True), "num_iterations must be"),
    ],
)
def test_no_positive_limit_is_a_clear_error(tmp_path, limits, match):
    with pytest.raises(ValueError, match=match):
        _trainer(tmp_path, **limits)


@pytest.mark.parametrize("absl_handler", [False, True])
def test_log_lines_are_written_through_the_progress_bar(
    tmp_path, capsys, monkeypatch, absl_handler
):
    """A log line during training starts on its own line, not after the bar's text
    (a plain console handler, or absl's, which ``app.run`` installs)."""
    import logging
    import sys

    from absl.logging import ABSLHandler

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the bar shows on a terminal only
    root = logging.getLogger()
    console = logging.StreamHandler(sys.stderr)  # the captured stderr, as a terminal's
    console.setFormatter(logging.Formatter("LOG %(message)s"))
    if absl_handler:
        console = ABSLHandler(logging.Formatter("LOG %(message)s"))
        console.python_handler.stream = sys.stderr
    root.addHandler(console)
    absl_logger = logging.getLogger("absl")
    levels = (root.level, absl_logger.level)
    root.setLevel(logging.INFO)
    absl_logger.setLevel(logging.INFO)
    try:
        _trainer(
            tmp_path,
            num_iterations=3,
            checkpoint_interval=None,
            eval_interval=1,
            num_eval_episodes=1,
            progress_bar=True,
        ).train()
        # Training is over: the console handler is back, and only it.
        assert console in root.handlers
        assert not any(type(h).__name__ == "_TqdmLoggingHandler" for h in root.handlers)
    finally:
        root.removeHandler(console)
        root.setLevel(levels[0])
        absl_logger.setLevel(levels[1])
    err = capsys.readouterr().err
    logged = [line for line in err.split("\n") if "LOG iteration" in line]
    assert len(logged) >= 3, err[-2000:]  # the evaluations after iterations 1, 2, 3
    bar_shown = [line for line in err.split("\n") if "it/s" in line or "s/it" in line]
    assert bar_shown, err[-2000:]
    for line in logged:
        # tqdm.write clears the bar (a carriage return) before the line.
        assert line.rsplit("\r", 1)[-1].startswith("LOG iteration"), repr(line)
    glued = [
        seg
        for line in err.split("\n")
        for seg in line.split("\r")
        if ("it/s" in seg or "s/it" in seg) and ("LOG" in seg or "WARNING" in seg)
    ]
    assert not glued, glued


def test_no_progress_bar_where_stderr_is_not_a_terminal(tmp_path, capsys):
    """``alf-entropy-train ... 2> log``: the log gets no bar updates."""
    _trainer(
        tmp_path, num_iterations=3, checkpoint_interval=None, eval_interval=None, progress_bar=True
    ).train()
    err = capsys.readouterr().err
    assert not [line for line in err.split("\n") if "it/s" in line or "s/it" in line], err
