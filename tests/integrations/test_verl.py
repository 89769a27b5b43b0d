"""verl's v1 trainer with a controller: verl's own loss, trainer classes, config and Ray.

verl's worker group and rollout servers need a Ray cluster with GPUs: the trainer's hooks
run here against a stand-in for the worker group (``ActorGroup``); everything else is verl's
code (its config, ``ppo_loss``, micro-batching, ``PPOTrainerSync``, checkpoint folders).
"""

import json
import os
from types import SimpleNamespace

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install -e '.[verl]')")

import torch  # noqa: E402
import verl.trainer  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits  # noqa: E402
from verl.workers.engine.utils import prepare_micro_batches  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from alf_entropy import LinearScheduler  # noqa: E402
from alf_entropy.integrations import verl as alf_verl  # noqa: E402
from alf_entropy.integrations.llm import lm_controller  # noqa: E402
from alf_entropy.integrations.toy_lm import tiny_causal_lm  # noqa: E402

CONFIG_DIR = os.path.join(os.path.dirname(verl.trainer.__file__), "config")
OVERRIDES = [
    "algorithm.adv_estimator=grpo",
    "trainer.v1.trainer_mode=entropy_control",
    "actor_rollout_ref.actor.calculate_entropy=True",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
]
TARGET = "+entropy_control.target=2.5"
SCHEDULED = "+entropy_control.controller=tests.integrations.test_verl.scheduled_controller"
alf_verl.register()  # what Ray's worker_process_setup_hook does in verl's processes


def verl_config(*overrides, control=TARGET):
    """verl's own ``ppo_trainer.yaml`` with ``OVERRIDES``, ``control`` and ``overrides``."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=[*OVERRIDES, *filter(None, [control]), *overrides])


def scheduled_controller(vocabulary):
    """A user's ``entropy_control.controller``: a target from 3.0 down to 2.5 over the run."""
    return lm_controller(vocabulary, LinearScheduler("percent", [(0.0, 3.0), (1.0, 2.5)]))


# -- the loss -------------------------------------------------------------------------------


def micro_batches(coeff):
    """A mini-batch of 8 sequences (prompts of 2 tokens, responses of 2-6) with ``coeff`` in
    its metadata, as the worker gets it, split by verl's iterator and micro-batching."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([6, 2, 5, 3, 6, 4, 2, 5])
    mask = (torch.arange(6) < lengths[:, None]).long()
    data = TensorDict(
        {
            "prompts": torch.randint(2, 64, (8, 2), generator=gen),
            "responses": torch.randint(2, 64, (8, 6), generator=gen) * mask,
            "attention_mask": torch.cat([torch.ones(8, 2, dtype=torch.long), mask], 1),
            "response_mask": mask,
            "old_log_probs": -3 * torch.rand(8, 6, generator=gen),
            "advantages": torch.randn(8, 1, generator=gen).expand(8, 6).clone(),
        },
        batch_size=[8],
    )
    tu.assign_non_tensor(
        data,
        dp_size=1,
        batch_num_tokens=int(mask.sum()),
        global_batch_size=8,
        micro_batch_size_per_gpu=2,
        use_dynamic_bsz=False,
    )
    if coeff is not None:
        tu.assign_non_tensor_data(data, alf_verl.COEFF_KEY, coeff)
    (mini_batch,) = tu.make_iterator(data, mini_batch_size=8, epochs=1, seed=0)
    return prepare_micro_batches(mini_batch)[0]


def model_output(model, data):
    """Log-probs and entropies of the sequences' tokens, unpadded, as verl's engine gives."""
    ids = torch.cat([data["prompts"], data["responses"]], 1)
    logits = model(input_ids=ids, attention_mask=data["attention_mask"]).logits
    next_ids = torch.cat([ids[:, 1:], ids[:, :1]], 1)
    valid = data["attention_mask"].bool()
    return {
        "log_probs": logprobs_from_logits(logits, next_ids)[valid],
        "entropy": entropy_from_logits(logits)[valid],
    }


def losses_and_grads(loss_fn, coeff):
    model = tiny_causal_lm(0, vocab_size=64).eval()  # no dropout: the two runs draw alike
    losses = []
    for data in micro_batches(coeff):
        loss, _ = loss_fn(model_output=model_output(model, data), data=data)
        loss.backward()
        losses.append(loss.detach())
    return losses, [p.grad for p in model.parameters()]


def test_loss_with_the_coefficient_from_the_metadata_is_verls_with_it_in_the_config():
    actor = verl_config().actor_rollout_ref.actor
    controlled = lambda **kw: alf_verl.controlled_ppo_loss(omega_conf_to_dataclass(actor), **kw)  # noqa: E731
    configured = omega_conf_to_dataclass(
        verl_config("actor_rollout_ref.actor.entropy_coeff=0.07").actor_rollout_ref.actor
    )
    verls = lambda **kw: ppo_loss(configured, **kw)  # noqa: E731
    loss, grads = losses_and_grads(controlled, 0.07)
    verl_loss, verl_grads = losses_and_grads(verls, None)
    assert len(loss) == 4  # verl's micro-batching kept the coefficient in every micro-batch
    assert all(torch.equal(a, b) for a, b in zip(loss, verl_loss))
    assert all(torch.equal(a, b) for a, b in zip(grads, verl_grads))
    # the coefficient acts: 0 gives another loss and other gradients
    zero_loss, zero_grads = losses_and_grads(controlled, 0.0)
    assert not torch.equal(zero_loss[0], loss[0])
    assert not all(torch.equal(a, b) for a, b in zip(zero_grads, grads))
    with pytest.raises(RuntimeError, match="alf_entropy_coeff"):
        losses_and_grads(controlled, None)
    # a penalty (min_alpha < 0) is verl's loss with that negative coefficient
    penalty = omega_conf_to_dataclass(
        verl_config("actor_rollout_ref.actor.entropy_coeff=-0.07").actor_rollout_ref.actor
    )
    loss, grads = losses_and_grads(controlled, -0.07)
    verl_loss, verl_grads = losses_and_grads(lambda **kw: ppo_loss(penalty, **kw), None)
    assert all(torch.equal(a, b) for a, b in zip(loss, verl_loss))
    assert all(torch.equal(a, b) for a, b in zip(grads, verl_grads))


# -- the trainer's hooks --------------------------------------------------------------------


class ActorGroup:
    """Stands in for verl's remote worker group (a Ray cluster of GPU workers): it records
    what the driver sends."""

    def __init__(self):
        self.loss_fn, self.sent, self.loaded = None, [], []

    def set_loss_fn(self, loss_fn):
        self.loss_fn = loss_fn

    def update_actor(self, batch):
        self.sent.append(dict(batch.extra_info))
        return {"metrics": {"mfu": [0.5], "pg_loss": [0.0]}}

    def save_checkpoint(self, local_path, hdfs_path, global_step, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.loaded.append(local_path)


class DataLoader:
    """Stands in for the trainer's dataloader: checkpointed with it."""

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def trainer(tmp_path, *overrides, control=TARGET, steps=8):
    """``EntropyControlTrainer`` as verl's ``init()`` leaves it, the Ray part of
    ``_setup`` replaced by stand-ins."""
    config = verl_config(f"trainer.default_local_dir={tmp_path}", *overrides, control=control)
    made = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
    made.actor_rollout_wg, made.train_dataloader = ActorGroup(), DataLoader()
    made.tokenizer, made.total_training_steps = range(64), steps
    made.checkpoint_manager = SimpleNamespace(update_weights=lambda step: None)
    made._load_checkpoint()  # the end of verl's _setup
    made.on_init_end()
    return made


def run(made, entropies, save_at=()):
    """verl's steps from ``made.global_steps + 1``: ``entropies`` as ``actor/entropy``."""
    logged = []
    for entropy in entropies:
        made.global_steps += 1
        metrics = {"actor/entropy": entropy}
        made._update_actor(KVBatchMeta(partition_id="train"), metrics)
        logged.append(metrics)
        if made.global_steps in save_at:
            made._save_checkpoint()
    return logged


ENTROPIES = [3.5, 3.0, 2.4, 2.2, 2.0, 2.3, 2.6, 2.4]


def test_trainer_sets_the_coefficient_of_each_step_from_the_controller(tmp_path):
    made = trainer(tmp_path)
    assert isinstance(made, PPOTrainerSync) and made.trainer_mode == "sync"
    assert type(made.replay_buffer) is type(
        PPOTrainerSync(verl_config("trainer.v1.trainer_mode=sync")).replay_buffer
    )  # verl's sync replay buffer
    loss_fn = made.actor_rollout_wg.loss_fn
    assert loss_fn.func is alf_verl.controlled_ppo_loss
    assert loss_fn.keywords["config"].loss_agg_mode == "token-mean"
    logged = run(made, ENTROPIES)
    reference = lm_controller(64, 2.5)
    expected = [float(reference.adjust_alpha(h)) for h in ENTROPIES]
    sent = made.actor_rollout_wg.sent
    assert [s[alf_verl.COEFF_KEY] for s in sent] == expected
    assert expected[0] == 0.0 and max(expected) > 0  # above the target 0, below it a bonus
    assert all(s["calculate_entropy"] for s in sent)  # verl asks the workers for the entropy
    for metrics, h, coeff in zip(logged, ENTROPIES, expected):
        assert metrics["entropy_control/coef"] == coeff
        assert metrics["entropy_control/entropy"] == h
        assert metrics["entropy_control/target"] == 2.5
        assert metrics["perf/mfu/actor"] == 0.5  # verl's own _update_actor ran
    with pytest.raises(RuntimeError, match="actor/entropy"):
        made._update_actor(KVBatchMeta(partition_id="train"), {})


def test_settings_of_the_default_controller_come_from_the_config_a_penalty_too(tmp_path):
    """``entropy_control.settings`` changes ``LM_SETTINGS``: the default's penalty (the
    entropy rising above the target, no bonus behind it) reaches the workers, and
    ``min_alpha=0`` leaves a bonus only."""
    rising = [2.6, 3.0, *ENTROPIES]
    for changes in ({}, {"min_alpha": 0.0}):
        overrides = [f"+entropy_control.settings.{k}={v}" for k, v in changes.items()]
        made = trainer(tmp_path / str(len(changes)), *overrides, steps=len(rising))
        run(made, rising)
        reference = lm_controller(64, 2.5, **changes)
        expected = [float(reference.adjust_alpha(h)) for h in rising]
        assert [s[alf_verl.COEFF_KEY] for s in made.actor_rollout_wg.sent] == expected
        assert (min(expected) < 0) == (not changes) and max(expected) > 0
    with pytest.raises(ValueError, match="kp must be >= 0"):
        trainer(tmp_path / "bad", "+entropy_control.settings.kp=-1")


def test_resume_gives_the_uninterrupted_coefficients_on_a_scheduled_target(tmp_path):
    whole = trainer(tmp_path / "whole", control=SCHEDULED)
    logged = run(whole, ENTROPIES, save_at=(4,))
    targets = [m["entropy_control/target"] for m in logged]
    assert targets[-1] == 2.5 and targets[0] == pytest.approx(3.0 - 0.5 / 8)  # step / 8
    stopped = trainer(tmp_path / "resumed", control=SCHEDULED)
    run(stopped, ENTROPIES[:4], save_at=(4,))
    folder = tmp_path / "resumed" / "global_step_4"
    assert json.loads((folder / alf_verl.STATE_FILE).read_text())["step"] == 4
    resumed = trainer(tmp_path / "resumed", control=SCHEDULED)  # resume_mode auto: step 4
    assert resumed.global_steps == 4
    assert resumed.actor_rollout_wg.loaded == [os.path.join(str(folder), "actor")]
    run(resumed, ENTROPIES[4:])
    coeffs = [s[alf_verl.COEFF_KEY] for s in whole.actor_rollout_wg.sent]
    assert [s[alf_verl.COEFF_KEY] for s in resumed.actor_rollout_wg.sent] == coeffs[4:]
    assert max(coeffs[4:]) > 0
    # a checkpoint without the controller's state: a warning, and the controller afresh
    os.remove(folder / alf_verl.STATE_FILE)
    with pytest.warns(UserWarning, match="without alf_entropy_control.json"):
        afresh = trainer(tmp_path / "resumed", control=SCHEDULED)
    assert afresh.control.step == 0
    # resume_path names the folder
    os.remove(tmp_path / "resumed" / "latest_checkpointed_iteration.txt")
    by_path = trainer(
        tmp_path / "whole",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={tmp_path / 'whole' / 'global_step_4'}",
        control=SCHEDULED,
    )
    run(by_path, ENTROPIES[4:])
    assert [s[alf_verl.COEFF_KEY] for s in by_path.actor_rollout_wg.sent] == coeffs[4:]


@pytest.mark.parametrize(
    "override, control, message",
    [
        (
            "actor_rollout_ref.actor.calculate_entropy=False",
            TARGET,
            "actor_rollout_ref.actor.calculate_entropy must be True",
        ),
        (
            "actor_rollout_ref.actor.entropy_coeff=0.001",
            TARGET,
            r"actor_rollout_ref.actor.entropy_coeff must be 0 \(got 0.001\)",
        ),
        (
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum",
            TARGET,
            "actor_rollout_ref.actor.loss_agg_mode is 'seq-mean-token-sum'",
        ),
        ("actor_rollout_ref.actor.loss_agg_mode=token-sum", TARGET, "allow_loss_agg_mode"),
        (
            "algorithm.rollout_correction.bypass_mode=True",
            TARGET,
            "algorithm.rollout_correction.bypass_mode must be False",
        ),
        ("distillation.enabled=True", TARGET, "distillation.enabled must be False"),
        ("trainer.v1.trainer_mode=entropy_control", None, "entropy_control needs one of target"),
        (SCHEDULED, TARGET, "entropy_control needs one of target"),
    ],
)
def test_config_check_names_what_would_silently_break_control(override, control, message):
    config = verl_config(override, control=control)
    with pytest.raises(ValueError, match=message):
        alf_verl.EntropyControlTrainer(config)


def test_config_check_accepts_the_allowed_settings():
    for control in (TARGET, SCHEDULED):
        alf_verl.check_verl_config(verl_config(control=control))
    alf_verl.check_verl_config(
        verl_config(
            "actor_rollout_ref.actor.loss_agg_mode=token-sum",
            "+entropy_control.allow_loss_agg_mode=True",
        )
    )
    alf_verl.check_verl_config(
        verl_config("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")
    )  # nats per token too


# -- Ray ------------------------------------------------------------------------------------

HOOK = (
    "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook="
    "alf_entropy.integrations.verl.register"
)


@pytest.mark.slow
def test_ray_setup_hook_makes_verls_trainer_process_find_the_mode():
    """verl's own ``run_ppo`` starts a local Ray cluster (on 127.0.0.1) with the page's hook;
    its task runner, a Ray actor, looks the mode up as verl's ``TaskRunnerV1`` does and
    builds the trainer, whose config check fails there and reaches the caller."""
    import ray
    from verl.trainer.main_ppo import run_ppo

    @ray.remote(num_cpus=1)
    class TaskRunner:  # verl's TaskRunnerV1.run up to the trainer (the rest needs GPUs)
        def run(self, config):
            get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)

    config = verl_config(
        "actor_rollout_ref.actor.calculate_entropy=False",
        "ray_kwargs.ray_init.num_cpus=1",
        HOOK,
        "+ray_kwargs.ray_init.include_dashboard=False",
        "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
    )
    try:
        with pytest.raises(ValueError, match="calculate_entropy must be True"):
            run_ppo(config, task_runner_class=TaskRunner)
    finally:
        ray.shutdown()
