"""Per-rank body of ``test_trl_distributed.py``: GRPO on 2 gloo ranks with entropy control.

Run as ``python -m tests.integrations.trl_workers OUT_DIR`` with torchrun's
environment variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``); accelerate reads them and joins a
gloo group on the CPU.  Each rank trains the toy GRPO task
(``alf_entropy.integrations.toy_lm``) with ``lm_controller`` added by
``add_entropy_control`` and writes ``OUT_DIR/rank{RANK}.json`` with, per
micro-batch, what it measured and the coefficient its loss read, per window
reduction what ``accelerator.reduce`` got and returned, and the callback's
history, for the test (in the parent process) to compare across ranks.
"""

import faulthandler
import gc
import json
import os
import sys

STEPS = 4
ACCUMULATION = 4
TARGET = 3.66  # above the random model's entropy (~3.6, at most ln 39): the coefficient moves


def train(out_dir: str) -> None:
    """Train on this rank and write ``OUT_DIR/rank{RANK}.json``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    from alf_entropy import BoundedTensorSpec
    from alf_entropy.integrations.toy_lm import (
        char_tokenizer,
        tiny_causal_lm,
        toy_dataset,
        toy_reward,
    )
    from alf_entropy.integrations.trl import add_entropy_control, grpo_config_kwargs, lm_controller

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()

    class RecordingGRPOTrainer(GRPOTrainer):
        """Records, per micro-batch of training, the step, the coefficient the loss
        reads, and ``(entropies * completion_mask).sum()`` and ``completion_mask.sum()``
        (TRL's own window statistics, recomputed here from its entropies)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.micro_batches = []
            self._current = None

        def _compute_loss(self, model, inputs):
            self._current = {
                "step": self.state.global_step,
                "coef": float(self.entropy_coef),
                "mask": inputs["completion_mask"],
            }
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self._current = None

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            logps, entropies, aux = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            current = self._current
            if current is not None and entropies is not None and self.model.training:
                mask = current["mask"]
                self.micro_batches.append(
                    {
                        "step": current["step"],
                        "coef": current["coef"],
                        "entropy_sum": float((entropies.detach() * mask).sum()),
                        "tokens": float(mask.sum()),
                        "lengths": [int(n) for n in mask.sum(1).tolist()],
                    }
                )
            return logps, entropies, aux

    tokenizer = char_tokenizer()
    spec = BoundedTensorSpec((), torch.int64, 0, len(tokenizer) - 1)
    pid = lm_controller(spec, TARGET)
    config = GRPOConfig(
        output_dir=os.path.join(out_dir, "trainer"),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        gradient_accumulation_steps=ACCUMULATION,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        **grpo_config_kwargs(pid),
    )
    trainer = RecordingGRPOTrainer(
        model=tiny_causal_lm(0),
        reward_funcs=toy_reward,
        args=config,
        train_dataset=toy_dataset(8),
        processing_class=tokenizer,
    )
    callback = add_entropy_control(trainer, pid)

    accelerator = trainer.accelerator
    reductions = []
    original_reduce = accelerator.reduce

    def recording_reduce(tensor, *args, **kwargs):
        window = tensor is trainer._entropy_window_stats
        sent = tensor.tolist() if window else None
        result = original_reduce(tensor, *args, **kwargs)
        if window:
            reductions.append(
                {
                    "step": trainer.state.global_step,
                    "dtype": str(result.dtype),
                    "sent": sent,
                    "returned": result.tolist(),
                }
            )
        return result

    accelerator.reduce = recording_reduce
    trainer.train()

    result = {
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type),
        "backend": str(torch.distributed.get_backend())
        if torch.distributed.is_initialized()
        else None,
        "vocab_size": len(tokenizer),
        "max_steps": STEPS,
        "accumulation": ACCUMULATION,
        "target": TARGET,
        "micro_batches": trainer.micro_batches,
        "reductions": reductions,
        "history": callback.history,
        "final_coef": float(trainer.entropy_coef),
        "controller_state": callback.control.state_dict(),
    }
    path = os.path.join(out_dir, f"rank{accelerator.process_index}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    accelerator.wait_for_everyone()


def main(out_dir: str) -> None:
    faulthandler.enable()  # a fatal signal prints every thread's Python stack to stderr
    train(out_dir)
    # Leave the gloo group while the interpreter is alive. The trainer's DDP model holds the
    # group: destroy_process_group with the trainer still referenced left the gloo threads
    # running until interpreter exit, where tearing them down can abort rank 0 (-6,
    # "terminate called without an active exception"; seen twice in CI). Collecting the
    # trainer (train's locals, in reference cycles) first ends them here.
    gc.collect()
    from alf_entropy.utils import distributed

    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
