"""Per-rank bodies of the distributed tests (run by ``launch.run_ranks``).

Each worker joins the group from the environment, does its part and writes
``OUT_DIR/rank{RANK}.pt`` for the test (in the parent process) to compare.
"""

import os
import sys
import time
from typing import Dict, Optional

import torch

from alf_entropy.utils import distributed

DISCRETE4_ARGS = ((), torch.int64, 0, 3)
T, B, STEPS = 8, 3, 12


def rank_batches(rank: int):
    """This rank's controller inputs: ``STEPS`` batches of ``[T, B]`` negative
    entropies (falling over time, different per rank) with LAST steps and a
    valid mask, so each rank counts a different number of steps."""
    g = torch.Generator().manual_seed(1000 + rank)
    batches = []
    for k in range(STEPS):
        entropy = 1.3 - 0.1 * k + 0.3 * torch.rand(T, B, generator=g) + 0.2 * rank
        step_type = torch.randint(0, 3, (T, B), generator=g)
        valid = torch.rand(T, B, generator=g) > 0.3 * rank
        batches.append((-entropy, step_type, valid))
    return batches


def controllers():
    """The controllers under test, freshly built (identically on each rank)."""

    from alf_entropy.algorithms.entropy_target_algorithm import (
        EntropyTargetAlgorithm,
        SGDEntropyTargetAlgorithm,
    )
    from alf_entropy.controllers import PIDEntropyTargetAlgorithm
    from alf_entropy.tensor_specs import BoundedTensorSpec

    spec = BoundedTensorSpec(*DISCRETE4_ARGS)
    return {
        "pid_host": PIDEntropyTargetAlgorithm(spec, target_entropy=0.9, update_mode="host"),
        "pid_tensor": PIDEntropyTargetAlgorithm(spec, target_entropy=0.9, update_mode="tensor"),
        "staged_host": EntropyTargetAlgorithm(spec, target_entropy=0.9, update_mode="host"),
        "staged_tensor": EntropyTargetAlgorithm(spec, target_entropy=0.9, update_mode="tensor"),
        "sgd": SGDEntropyTargetAlgorithm(spec, target_entropy=0.9, optimizer="sgd", lr=0.5),
    }


def feed(alg, neg_entropy, step_type, valid):
    """One controller update on a batch (the SGD one, used alone, takes its step inside)."""
    from alf_entropy.algorithms.entropy_target_algorithm import (
        EntropyTargetInfo,
        EntropyTargetLossInfo,
    )
    from alf_entropy.data_structures import LossInfo

    info = EntropyTargetInfo(
        loss=LossInfo(
            loss=neg_entropy.clone(), extra=EntropyTargetLossInfo(neg_entropy=neg_entropy)
        )
    )
    alg.calc_loss(info._replace(step_type=step_type), valid)


def adjust_alpha_trajectories(entropies):
    """``alpha`` after each ``adjust_alpha(entropy)`` of a staged and an SGD controller."""
    algs = controllers()
    return {
        name: [algs[name].adjust_alpha(torch.tensor(e)).clone() for e in entropies]
        for name in ("staged_host", "sgd")
    }


def controller_state(alg):
    return {k: v.detach().clone() for k, v in alg.state_dict().items() if torch.is_tensor(v)}


MICRO_BATCHES, ACC_STEPS = 4, 6


def micro_batches(rank: int, step: int):
    """Rank ``rank``'s micro-batches of optimizer step ``step``: per-token entropies of
    unequal lengths (as completions of different lengths are)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    return [
        1.4 - 0.15 * step + 0.5 * torch.rand(int(3 + 7 * rank + 5 * m), generator=g)
        for m in range(MICRO_BATCHES)
    ]


def step_control_coefficients(rank: Optional[int]) -> Dict[str, list]:
    """``StepEntropyControl``'s coefficient after each step fed this rank's entropy sum and
    token count with ``all_reduce=True``, as numbers and as tensors; ``rank=None``: one
    process fed both ranks' pooled sums (``all_reduce=False``)."""
    from alf_entropy.integrations.llm import StepEntropyControl, lm_controller

    out = {}
    for form in ("numbers", "tensors"):
        # The target is above every step's entropy (at most 1.9): the coefficient moves.
        control = StepEntropyControl(lm_controller(32_000, 2.0))
        coefs = []
        for step in range(ACC_STEPS):
            tokens = [
                torch.cat(micro_batches(r, step)).to(torch.float64)
                for r in ([0, 1] if rank is None else [rank])
            ]
            # Rank 0's sum plus rank 1's, as the all_reduce adds them.
            total, count = sum(t.sum() for t in tokens), sum(t.numel() for t in tokens)
            if form == "numbers":
                total = float(total)
            else:
                count = torch.tensor(count)
            coefs.append(control.update(total, count, step + 1, all_reduce=rank is not None))
        out[form] = coefs
    return out


def accumulate(out_dir: str) -> None:
    """Every controller accumulates 4 micro-batches a step, then steps: alpha after each step;
    and a state_dict taken between accumulate and step is refused."""
    distributed.init_from_env(torch.device("cpu"), timeout_s=60)
    r = distributed.rank()
    algs, out = controllers(), {"alphas": {}}
    for name, alg in algs.items():
        alphas = []
        for step in range(ACC_STEPS):
            for entropy in micro_batches(r, step):
                alg.accumulate(entropy)
            alphas.append(alg.step().clone())
        out["alphas"][name] = alphas
    out["step_control"] = step_control_coefficients(r)
    alg = algs["pid_host"]
    alg.accumulate(torch.ones(3))
    try:
        alg.state_dict()
        out["refused"] = ""
    except RuntimeError as e:
        out["refused"] = str(e)
    torch.save(out, os.path.join(out_dir, f"rank{r}.pt"))
    distributed.shutdown()


def collectives(out_dir: str) -> None:
    """Utilities, controllers fed different entropies, averaged gradients."""
    distributed.init_from_env(torch.device("cpu"), timeout_s=60)
    r, n = distributed.rank(), distributed.world_size()
    out = {
        "rank": r,
        "world_size": n,
        "is_main": distributed.is_main_process(),
        "is_distributed": distributed.is_distributed(),
    }
    out["masked_mean"] = distributed.all_reduce_masked_mean(
        torch.tensor(1.5 + r, dtype=torch.float32), torch.tensor(2 + 3 * r)
    )
    out["plain_mean"] = distributed.all_reduce_masked_mean(torch.tensor(1.5 + r), None)
    out["mean"] = distributed.all_reduce_mean(torch.tensor([float(r), 10.0 * r]))
    out["object"] = distributed.broadcast_object({"from": r})
    out["gathered"] = distributed.gather_object(("rank", r))
    m = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(m.weight, float(r))
    distributed.broadcast_module_(m)
    out["broadcast_weight"] = m.weight.detach().clone()
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([1.0, float("nan") if r == 1 else 2.0, 3.0])
    out["grads_finite_with_nan"] = distributed.all_reduce_gradients_([p])
    p.grad = torch.full((3,), float(r))
    out["grads_finite"] = distributed.all_reduce_gradients_([p])
    out["grad_mean"] = p.grad.clone()

    # Controllers: one trajectory per controller, every buffer after each step.
    torch.manual_seed(0)
    algs = controllers()
    traj = {name: [] for name in algs}
    for neg_entropy, step_type, valid in rank_batches(r):
        for name, alg in algs.items():
            feed(alg, neg_entropy, step_type, valid)
            traj[name].append(controller_state(alg))
    out["trajectories"] = traj
    # adjust_alpha with a different scalar per rank.
    out["adjust_alpha"] = adjust_alpha_trajectories([1.2 - 0.1 * k + 0.4 * r for k in range(6)])

    # Gradients: a tiny regression, each rank on its own half of the data.
    out["regression"] = regression_state(r)
    torch.save(out, os.path.join(out_dir, f"rank{r}.pt"))
    distributed.shutdown()


def peer_dies(out_dir: str) -> None:
    """Rank 1 is SIGKILLed after one collective; rank 0 must fail clearly."""
    _peer_fails(out_dir, hang=False)


def peer_hangs(out_dir: str) -> None:
    """Rank 1 stops responding; rank 0 must fail after the timeout."""
    _peer_fails(out_dir, hang=True)


def _peer_fails(out_dir: str, hang: bool) -> None:
    distributed.init_from_env(torch.device("cpu"))  # timeout from the environment
    x = torch.ones(())
    distributed.all_reduce_masked_mean(x, torch.ones((), dtype=torch.int64))
    if distributed.rank() == 1:
        if hang:  # alive but silent until rank 0 has given up (at most 60 s)
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(out_dir, "error.txt")):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            os._exit(0)
        os.kill(os.getpid(), 9)
    start = time.monotonic()
    try:
        for _ in range(1000):  # the first call after the peer is gone must fail
            distributed.all_reduce_masked_mean(x, torch.ones((), dtype=torch.int64))
            time.sleep(0.01)
    except distributed.DistributedError as e:
        elapsed = time.monotonic() - start
        with open(os.path.join(out_dir, "error.txt"), "w") as f:
            f.write(f"{elapsed}\n{e}")
        distributed.shutdown()
        sys.exit(3)
    sys.exit(0)


PPO_ITERATIONS = 4
PPO_PARAMS = [
    "OnPolicyTrainer.num_envs = 4",  # 2 per rank
    "OnPolicyTrainer.unroll_length = 16",
    "OnPolicyTrainer.num_env_steps = 0",
    "OnPolicyTrainer.summary_interval = 1",
    "OnPolicyTrainer.eval_interval = 2",
    "OnPolicyTrainer.num_eval_episodes = 1",
    "OnPolicyTrainer.stop_eval_return = 1e9",
    "OnPolicyTrainer.checkpoint_interval = 2",
    "OnPolicyTrainer.progress_bar = False",
    "PPOAlgorithm.num_minibatches = 2",
    "PPOAlgorithm.num_epochs = 2",
]
"""gin bindings of the 2-rank PPO runs (plus ``num_iterations``)."""


def ppo_train(out_dir: str) -> None:
    """``PPO_ITERATIONS`` of 2-rank PPO CartPole in ``out_dir/run`` with the
    shipped config; saves this rank's final algorithm and optimiser state."""
    from alf_entropy.config.loading import parse_gin_config
    from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

    torch.set_num_threads(1)
    parse_gin_config(
        ["ppo_cartpole"], PPO_PARAMS + [f"OnPolicyTrainer.num_iterations = {PPO_ITERATIONS}"]
    )
    trainer = OnPolicyTrainer(os.path.join(out_dir, "run"), device="cpu")
    _save_final(trainer, trainer.train(), out_dir)


def _save_final(trainer, result, out_dir: str) -> None:
    """Save this rank's result, algorithm and optimiser state; leave the group."""
    alg = trainer.algorithm
    torch.save(
        {
            "result": result,
            "algorithm": {
                k: v.clone() for k, v in alg.state_dict().items() if isinstance(v, torch.Tensor)
            },
            "optimizers": [opt.state_dict() for opt in alg.optimizers()],
        },
        os.path.join(out_dir, f"rank{distributed.rank()}.pt"),
    )
    distributed.shutdown()


SAC_PARAMS = [
    "OffPolicyTrainer.num_envs = 2",  # 1 per rank
    "OffPolicyTrainer.num_iterations = 40",  # 80 env steps over both ranks
    "OffPolicyTrainer.num_env_steps = 0",
    "OffPolicyTrainer.initial_collect_steps = 32",
    "OffPolicyTrainer.replay_buffer_length = 200",
    "OffPolicyTrainer.mini_batch_size = 16",
    "OffPolicyTrainer.summary_interval = 10",
    "OffPolicyTrainer.eval_interval = None",
    "OffPolicyTrainer.checkpoint_interval = None",
    "OffPolicyTrainer.progress_bar = False",
    "ActorDistributionNetwork.fc_layer_params = (32, 32)",
    "CriticNetworks.fc_layer_params = (32, 32)",
    "SacAlgorithm.entropy_target_cls = @EntropyTargetAlgorithm",
    "EntropyTargetAlgorithm.target_entropy = -1.0",  # sac_pendulum.gin's, for this class
    "EntropyTargetAlgorithm.initial_alpha = 1.0",
]
"""gin bindings of the 2-rank SAC run (the staged controller: it would drift apart)."""


def sac_train(out_dir: str) -> None:
    """2-rank SAC Pendulum in ``out_dir/run``; saves this rank's final state."""
    from alf_entropy.config.loading import parse_gin_config
    from alf_entropy.trainers.off_policy_trainer import OffPolicyTrainer

    torch.set_num_threads(1)
    parse_gin_config(["sac_pendulum"], SAC_PARAMS)
    trainer = OffPolicyTrainer(os.path.join(out_dir, "run"), device="cpu")
    _save_final(trainer, trainer.train(), out_dir)


def regression_state(rank: Optional[int]) -> Dict[str, torch.Tensor]:
    """Five Adam steps of a tiny linear regression; its final ``state_dict``.

    Args:
        rank: train on this rank's half of the data, or None for all of it
            (what one process with the pooled batch does).

    Returns:
        The trained parameters (cloned).
    """
    from alf_entropy.algorithms.algorithm import Algorithm
    from alf_entropy.data_structures import LossInfo

    torch.manual_seed(0)
    alg = Algorithm(optimizer=lambda p: torch.optim.Adam(p, lr=0.1))
    alg.net = torch.nn.Linear(3, 1)
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(2, 16, 3, generator=g), torch.randn(2, 16, 1, generator=g)
    if rank is None:
        x, y = x.reshape(32, 3), y.reshape(32, 1)
    else:
        x, y = x[rank], y[rank]
    for _ in range(5):
        loss = (alg.net(x) - y).square().squeeze(-1)
        alg.update_with_gradient(LossInfo(loss=loss), max_grad_norm=0.5)
    return {k: v.detach().clone() for k, v in alg.state_dict().items()}


if __name__ == "__main__":
    globals()[sys.argv[1]](sys.argv[2])
