"""TRL integration: a controller drives GRPOTrainer's entropy coefficient.

Runs a few GRPO steps of a random-weight 2-layer GPT-2 with a character
tokenizer (``alf_entropy.integrations.toy_lm``; no download).  The
coefficient each micro-batch's loss used is recovered from the gradient of
the loss with respect to TRL's per-token entropies, not read from the
attribute the callback sets.
"""

import inspect
import math
import os

import pytest
import torch

pytest.importorskip("trl", reason="TRL is not installed (pip install -e '.[trl]')")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import trl  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from alf_entropy import (  # noqa: E402
    BoundedTensorSpec,
    EntropyTargetAlgorithm,
    LinearScheduler,
)
from alf_entropy.integrations.toy_lm import (  # noqa: E402
    char_tokenizer,
    tiny_causal_lm,
    toy_dataset,
    toy_reward,
)
from alf_entropy.integrations.trl import (  # noqa: E402
    LM_SETTINGS,
    STATE_KEY,
    SUPPORTED_TRL,
    EntropyControlCallback,
    add_entropy_control,
    check_grpo_config,
    grpo_config_kwargs,
    lm_controller,
)
from tests.nests import assert_nests_equal  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TOKENIZER = char_tokenizer()
SPEC = BoundedTensorSpec((), torch.int64, 0, len(TOKENIZER) - 1)


def _controller(target=2.5, **changes):
    return lm_controller(SPEC, target, **changes)


def _trainer(out, steps=3, accumulation=2, save_steps=None, config=None, **overrides):
    kwargs = dict(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        gradient_accumulation_steps=accumulation,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
    )
    kwargs.update(config or {})
    kwargs.update(overrides)
    return GRPOTrainer(
        model=tiny_causal_lm(0),
        reward_funcs=toy_reward,
        args=GRPOConfig(**kwargs),
        train_dataset=toy_dataset(8),
        processing_class=TOKENIZER,
    )


def _spy_on_coefficient(trainer):
    """Per micro-batch, ``-d loss / d entropies`` summed: the applied coefficient / accumulation."""
    seen = []
    original = trainer._get_per_token_logps_and_entropies

    def spy(*args, **kwargs):
        logps, entropies, aux = original(*args, **kwargs)
        if entropies is not None and entropies.requires_grad and trainer.model.training:
            entropies.register_hook(
                lambda g: seen.append((trainer.state.global_step, -float(g.sum())))
            )
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = spy
    return seen


def test_trl_version_and_internals_are_the_ones_relied_on():
    assert Version(trl.__version__) in SpecifierSet(SUPPORTED_TRL)
    source = inspect.getsource(GRPOTrainer._compute_loss)
    # The measurement, the coefficient applied to every micro-batch, the rule and its clip.
    for line in (
        "self._last_world_entropy = world_entropy",
        "apply_coef = self.entropy_coef if self._last_world_entropy <= "
        "self.args.entropy_target else 0.0",
        "self.entropy_coef + self.args.entropy_coef_delta, self.args.entropy_coef_max",
        'window_stats = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")',
        'self._metrics[mode]["entropy_coef"].append(self.entropy_coef)',
    ):
        assert line in source, line
    init = inspect.getsource(GRPOTrainer.__init__)
    assert (
        "self._entropy_bonus_enabled = self.entropy_coef != 0.0 or self.use_adaptive_entropy"
    ) in init
    assert "entropy_ctrl_state.json" in inspect.getsource(GRPOTrainer._save_checkpoint)


def test_config_kwargs_and_wrong_settings(tmp_path):
    pid = _controller()
    kwargs = grpo_config_kwargs(pid)
    assert kwargs == dict(
        use_adaptive_entropy=True,
        entropy_coef_delta=0.0,
        entropy_target=math.inf,
        entropy_coef=0.0,
        entropy_coef_min=pytest.approx(LM_SETTINGS["min_alpha"]),
        entropy_coef_max=1.0,
    )
    args = GRPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, **kwargs)
    check_grpo_config(args, pid)
    cases = [
        (dict(entropy_coef_max=0.5), "entropy_coef_max .*max_alpha"),
        (dict(use_adaptive_entropy=False), "use_adaptive_entropy"),
        (dict(entropy_coef_delta=0.005), "entropy_coef_delta"),
        (dict(entropy_target=0.2), "entropy_target"),
        (dict(entropy_coef_min=0.01), "entropy_coef_min"),
        (dict(top_entropy_quantile=0.2), "top_entropy_quantile"),
    ]
    for change, match in cases:
        bad = GRPOConfig(
            output_dir=str(tmp_path), report_to=[], use_cpu=True, **{**kwargs, **change}
        )
        with pytest.raises(ValueError, match=match):
            check_grpo_config(bad, pid)
    quantile = GRPOConfig(
        output_dir=str(tmp_path),
        report_to=[],
        use_cpu=True,
        **{**kwargs, "top_entropy_quantile": 0.2},
    )
    check_grpo_config(quantile, pid, allow_top_entropy_quantile=True)
    # A controller that may go below 0 (the default's penalty) needs TRL not to clip it at 0.
    assert LM_SETTINGS["min_alpha"] < 0
    bonus_only = lm_controller(SPEC, 2.0, min_alpha=0.0)
    assert grpo_config_kwargs(bonus_only)["entropy_coef_min"] == 0.0
    clipped = GRPOConfig(
        output_dir=str(tmp_path), report_to=[], use_cpu=True, **grpo_config_kwargs(bonus_only)
    )
    check_grpo_config(clipped, bonus_only)
    with pytest.raises(ValueError, match="entropy_coef_min"):
        check_grpo_config(clipped, pid)
    # An unbounded controller needs entropy_coef_max=inf (grpo_config_kwargs gives it).
    staged = EntropyTargetAlgorithm(SPEC, target_entropy=2.0)
    assert grpo_config_kwargs(staged)["entropy_coef_max"] == math.inf
    with pytest.raises(ValueError, match="entropy_coef_max"):
        check_grpo_config(args, staged)
    with pytest.raises(TypeError, match="GRPOConfig"):
        check_grpo_config(object(), pid)


def test_bonus_not_enabled_at_construction_is_an_error(tmp_path):
    pid = _controller()
    trainer = _trainer(tmp_path)  # entropy_coef=0, not adaptive: the bonus is frozen off
    with pytest.raises(ValueError, match="not enabled when the trainer was built"):
        add_entropy_control(trainer, pid)
    with pytest.raises(TypeError, match="lacks"):
        add_entropy_control(object(), pid)
    callback = EntropyControlCallback(pid)
    with pytest.raises(RuntimeError, match="not bound"):
        callback.on_step_end(None, None, None)


def test_every_micro_batch_of_a_step_uses_the_coefficient_of_the_previous_step(tmp_path):
    # Above the entropy (ln 39 = 3.664 at most): the coefficient climbs.  It starts at 1e-2, not
    # 0, so the first step's micro-batches carry a bonus gradient to check too.
    pid = _controller(target=3.66, initial_alpha=1e-2)
    trainer = _trainer(tmp_path, steps=4, accumulation=2, config=grpo_config_kwargs(pid))
    callback = add_entropy_control(trainer, pid)
    seen = _spy_on_coefficient(trainer)
    trainer.train()
    history = callback.history
    assert [h["step"] for h in history] == [1, 2, 3, 4]
    assert history[0]["coef_applied"] == pytest.approx(1e-2)
    for before, after in zip(history, history[1:]):
        assert after["coef_applied"] == before["coef_next"]
    assert history[-1]["coef_next"] > 1e-2
    # Two micro-batches per step, each with coefficient / 2 as d(-loss)/d(entropies) in total.
    assert len(seen) == 8
    for k, (step, grad) in enumerate(seen):
        assert step == k // 2
        assert grad == pytest.approx(history[k // 2]["coef_applied"] / 2, rel=1e-5)
    logs = [entry for entry in trainer.state.log_history if "entropy_coef" in entry]
    assert [entry["entropy_coef"] for entry in logs] == pytest.approx(
        [h["coef_applied"] for h in history]
    )
    for entry, h in zip(logs, history):
        assert entry["entropy_control/coef_applied"] == pytest.approx(h["coef_applied"])
        assert entry["entropy_control/entropy"] == pytest.approx(h["entropy"])
        assert entry["entropy_control/target"] == pytest.approx(3.66)
        assert "entropy_control/state/integral" in entry and "entropy_control/stage" in entry
        assert 0 < h["entropy"] < math.log(len(TOKENIZER)) + 1e-3


def test_without_control_no_bonus_gradient(tmp_path):
    trainer = _trainer(tmp_path, steps=2, accumulation=1)
    seen = _spy_on_coefficient(trainer)
    trainer.train()
    assert seen == []  # the bonus is off: no gradient reaches the entropies
    assert all("entropy_control/coef" not in entry for entry in trainer.state.log_history)


def test_scheduled_target_follows_training_progress(tmp_path):
    target = LinearScheduler("percent", [(0, 3.0), (1, 2.0)])
    pid = _controller(target)
    trainer = _trainer(tmp_path, steps=4, accumulation=1, config=grpo_config_kwargs(pid))
    callback = add_entropy_control(trainer, pid)
    trainer.train()
    assert [h["target"] for h in callback.history] == pytest.approx([2.75, 2.5, 2.25, 2.0])


def test_resumed_run_equals_uninterrupted(tmp_path):
    def run(out, resume=None, restore_callbacks=False):
        pid = _controller(target=3.66)  # above the entropy: the coefficient moves
        trainer = _trainer(
            out,
            steps=4,
            accumulation=2,
            save_steps=2,
            config=grpo_config_kwargs(pid),
            restore_callback_states_from_checkpoint=restore_callbacks,
        )
        callback = add_entropy_control(trainer, pid)
        trainer.train(resume_from_checkpoint=resume)
        assert callback in trainer.callback_handler.callbacks
        return callback, pid

    full, full_pid = run(tmp_path / "full")
    # The coefficient moved at every step, so a resume that lost the controller's state shows.
    assert len({h["coef_next"] for h in full.history}) == 4 and full.history[-1]["coef_next"] > 0
    resumed, resumed_pid = run(tmp_path / "full", resume=str(tmp_path / "full" / "checkpoint-2"))
    assert [h["step"] for h in resumed.history] == [3, 4]
    assert resumed.history == full.history[2:]
    assert_nests_equal(resumed_pid.state_dict(), full_pid.state_dict(), "resumed controller")
    # Trainer's own restore of callback states (which re-creates the callbacks it knows) leaves
    # this one, which restores itself, in place and exact.
    restored, _ = run(
        tmp_path / "full", resume=str(tmp_path / "full" / "checkpoint-2"), restore_callbacks=True
    )
    assert restored.history == full.history[2:]
    # A checkpoint without controller state resumes with a warning.
    import json

    path = tmp_path / "full" / "checkpoint-2" / "trainer_state.json"
    state = json.loads(path.read_text())
    del state["stateful_callbacks"][STATE_KEY]
    path.write_text(json.dumps(state))
    with pytest.warns(UserWarning, match="without controller state"):
        run(tmp_path / "full", resume=str(tmp_path / "full" / "checkpoint-2"))


def test_the_trl_extra_is_the_supported_range():
    from tests.test_dependencies import REPO, setup_kwargs

    assert setup_kwargs()["extras_require"]["trl"] == [f"trl{SUPPORTED_TRL}"]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert ",trl," in ci
