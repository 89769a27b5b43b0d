"""Callbacks: the hooks, a stopping callback, gin binding, and docs/callbacks.md's example."""

import csv
import gc
import os
import pathlib
import re

import gin
import pytest

from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.config.loading import parse_gin_config
from alf_entropy.environments import GymVectorEnv
from alf_entropy.storage import checkpoints as ckpt
from alf_entropy.trainers import Callback, EvaluationCallback, OnPolicyTrainer, TimeBudgetCallback
from alf_entropy.trainers import trainer as trainer_module
from tests.trainers.test_on_policy_trainer import _trainer

pytestmark = pytest.mark.usefixtures("one_thread")

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "callbacks.md"


class Recorder(Callback):
    """Records every hook call; stops after iteration ``stop_at``."""

    def __init__(self, stop_at=None):
        self.calls = []
        self.stop_at = stop_at

    def on_training_start(self, trainer):
        self.calls.append(("start", trainer.iteration))

    def on_iteration_start(self, trainer):
        self.calls.append(("iteration_start", trainer.iteration))

    def on_iteration_end(self, trainer):
        self.calls.append(("iteration_end", trainer.iteration))
        return trainer.iteration != self.stop_at

    def on_training_end(self, trainer):
        self.calls.append(("end", trainer.iteration))


def test_hooks_run_in_order_around_each_iteration(tmp_path):
    recorder = Recorder()
    _trainer(tmp_path, num_iterations=2, callbacks=[recorder]).train()
    assert recorder.calls == [
        ("start", 0),
        ("iteration_start", 0),
        ("iteration_end", 1),
        ("iteration_start", 1),
        ("iteration_end", 2),
        ("end", 2),
    ]


def test_false_stops_the_run_with_a_checkpoint_that_resumes(tmp_path):
    recorder = Recorder(stop_at=2)
    result = _trainer(
        tmp_path, num_iterations=5, checkpoint_interval=None, callbacks=[recorder]
    ).train()
    assert result["iteration"] == 2 and not result["already_done"]
    assert result["stopped_by"] is None  # not a signal
    assert result["checkpoint"] == ckpt.Checkpointer(str(tmp_path / "checkpoints")).path(2)
    assert recorder.calls[-1] == ("end", 2)
    resumed = _trainer(tmp_path, num_iterations=5, checkpoint_interval=None)
    assert resumed.iteration == 2 and resumed.train()["iteration"] == 5


def test_on_training_end_runs_after_an_error(tmp_path, monkeypatch):
    recorder = Recorder()

    def fail(self):
        raise RuntimeError("boom")

    trainer = _trainer(tmp_path, num_iterations=3, callbacks=[recorder])
    monkeypatch.setattr(OnPolicyTrainer, "_train_iteration", fail)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert recorder.calls == [("start", 0), ("iteration_start", 0), ("end", 0)]


class FailsAtTheEnd(Callback):
    def on_training_end(self, trainer):
        raise RuntimeError("end failed")


def test_a_failing_on_training_end_leaves_the_rest_of_the_cleanup_done(tmp_path, monkeypatch):
    """The later callbacks still end (a signal handler restored, a file closed), the envs close,
    and the callback's error is raised -- unless the run already failed: then the run's."""
    recorder, closed = Recorder(), []

    class Env(GymVectorEnv):
        def close(self):
            closed.append(1)
            super().close()

    trainer = _trainer(
        tmp_path, num_iterations=1, callbacks=[FailsAtTheEnd(), recorder], env_ctor=Env
    )
    with pytest.raises(RuntimeError, match="end failed"):
        trainer.train()
    assert recorder.calls[-1][0] == "end" and closed

    def fail(self):
        raise ValueError("the run's own")

    trainer = _trainer(tmp_path / "b", num_iterations=1, callbacks=[FailsAtTheEnd(), Recorder()])
    monkeypatch.setattr(OnPolicyTrainer, "_train_iteration", fail)
    with pytest.raises(ValueError, match="the run's own"):
        trainer.train()


def test_evaluation_runs_on_the_trainers_env_ctor(tmp_path):
    made = []

    class Env(GymVectorEnv):
        def __init__(self, *args, **kwargs):
            made.append(kwargs.get("seed"))
            super().__init__(*args, **kwargs)

    trainer = _trainer(tmp_path, num_iterations=1, env_ctor=Env)
    made.clear()
    trainer.evaluate(2)
    assert made  # the evaluation's envs come from the same ctor as training's
    trainer.close()


def test_the_episodes_per_evaluation_are_the_trainers_alone(tmp_path, monkeypatch):
    """``EvaluationCallback`` took a ``num_episodes`` that nothing read: it is gone (a
    ``TypeError``), and evaluations run the trainer's ``num_eval_episodes``."""
    with pytest.raises(TypeError):
        EvaluationCallback(5, num_episodes=3)
    asked = []
    real = trainer_module.run_episodes
    monkeypatch.setattr(
        trainer_module,
        "run_episodes",
        lambda *args, num_episodes, **kwargs: (
            asked.append(num_episodes),
            real(*args, num_episodes=num_episodes, **kwargs),
        )[1],
    )
    _trainer(tmp_path, num_iterations=2, eval_interval=1, num_eval_episodes=3).train()
    assert asked and set(asked) == {3}


class _NoCoefficient(PPOAlgorithm):
    """A user's algorithm: no ``entropy_coefficient()`` (not part of the protocol), its own
    summaries."""

    def __getattribute__(self, name):
        if name == "entropy_coefficient":
            raise AttributeError(name)
        return super().__getattribute__(name)

    def summarize_train(self, *args):
        pass


def test_an_algorithm_without_entropy_coefficient_trains_and_logs(tmp_path):
    trainer = _trainer(
        tmp_path,
        num_iterations=2,
        eval_interval=1,
        summary_interval=1,
        algorithm_ctor=_NoCoefficient,
    )
    assert trainer.train()["iteration"] == 2
    assert "alpha" not in trainer.metrics and "steps_per_sec" in trainer.metrics


def test_a_callback_that_is_not_one_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="callbacks must be Callback instances"):
        _trainer(tmp_path, num_iterations=1, callbacks=[lambda trainer: True])
    assert not os.path.exists(tmp_path / "checkpoints")


def test_time_budget_stops_the_run(tmp_path):
    result = _trainer(
        tmp_path, num_iterations=50, callbacks=[TimeBudgetCallback(max_seconds=1e-9)]
    ).train()
    assert result["iteration"] == 1  # the budget is spent after the first iteration
    with pytest.raises(ValueError, match="max_seconds must be > 0"):
        TimeBudgetCallback(max_seconds=0)


def test_callbacks_bind_in_gin_and_may_change_on_resume(tmp_path):
    params = [
        "OnPolicyTrainer.num_iterations = 3",
        "OnPolicyTrainer.num_envs = 2",
        "OnPolicyTrainer.unroll_length = 8",
        "PPOAlgorithm.num_epochs = 1",
        "OnPolicyTrainer.progress_bar = False",
    ]
    parse_gin_config(
        ["ppo_cartpole"],
        params
        + [
            "OnPolicyTrainer.callbacks = [@TimeBudgetCallback()]",
            "TimeBudgetCallback.max_seconds = 1e-9",
        ],
    )
    assert OnPolicyTrainer(str(tmp_path), device="cpu").train()["iteration"] == 1
    gin.clear_config()
    parse_gin_config(["ppo_cartpole"], params)  # no callbacks now: the same run goes on
    assert OnPolicyTrainer(str(tmp_path), device="cpu").train()["iteration"] == 3


@pytest.mark.slow
def test_the_docs_example_runs_and_does_what_it_says(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    runs = []
    for _ in range(2):  # pasted twice: a second fresh run, not the first one resumed
        ns: dict = {}
        exec(compile(blocks[0], str(DOC), "exec"), ns)
        runs.append((ns, capsys.readouterr().out))
    (ns, out), (again, out_again) = runs
    assert "stopped after" in out and out_again == out
    assert again["root_dir"] != ns["root_dir"] and os.listdir(tmp_path) == []
    result = ns["result"]
    # It stopped at the target, before the limit.
    assert result["iteration"] < 40 and result["last_return"] >= 60.0
    with open(os.path.join(ns["root_dir"], "alpha.csv"), newline="") as f:
        rows = list(csv.reader(f))
    assert [int(r[0]) for r in rows] == list(range(1, result["iteration"] + 1))
    alphas = [float(r[2]) for r in rows]
    assert all(a > 0 for a in alphas) and len(set(alphas)) > 1  # the controller moved alpha


@pytest.mark.parametrize("agents", [{}, {"seeds": [1, 2]}], ids=["one", "two_agents"])
def test_each_evaluation_line_shows_the_control(tmp_path, caplog, agents):
    """Issue 40 item 8: every periodic log line shows the eval return, alpha, entropy and
    target; with K agents each as min/mean/max, labelled."""
    import functools as ft
    import logging

    from alf_entropy import PPOAlgorithm

    ppo = ft.partial(PPOAlgorithm, enforce_entropy_target=True, num_epochs=1)
    with caplog.at_level(logging.INFO):
        _trainer(
            tmp_path,
            num_iterations=2,
            eval_interval=1,
            num_eval_episodes=2,
            summary_interval=1,
            algorithm_ctor=ppo,
            **agents,
        ).train()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("iteration ")]
    assert len(lines) == 3, lines  # the start, iterations 1 and 2
    number = r"-?\d+(\.\d+)?(e-?\d+)?"
    value = f"{number}/{number}/{number}" if agents else number
    label = " min/mean/max " if agents else " "
    for line in lines[1:]:
        for name in ("eval return", "alpha", "entropy", "target"):
            assert re.search(f"{name}{label}{value}( |$)", line), (name, line)
    assert re.search(f"eval return{label}{value} alpha{label}{value} target", lines[0])


def test_the_heap_is_frozen_while_the_loop_runs_and_a_hosts_freeze_is_kept(tmp_path):
    """Full collections skip what existed before the loop (``gc.freeze``), and only then."""

    class Frozen(Callback):
        seen = []

        def on_iteration_start(self, trainer):
            self.seen.append(gc.get_freeze_count())

    gc.unfreeze()
    _trainer(tmp_path / "a", num_iterations=2, callbacks=[Frozen()]).train()
    assert len(Frozen.seen) == 2 and min(Frozen.seen) > 0 and gc.get_freeze_count() == 0
    gc.freeze()  # a host's own freeze: left as it is
    try:
        _trainer(tmp_path / "b", num_iterations=1, callbacks=[Frozen()]).train()
        assert gc.get_freeze_count() > 0  # not unfrozen by the trainer
    finally:
        gc.unfreeze()
