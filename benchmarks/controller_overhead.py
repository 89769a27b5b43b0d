"""Per-call cost of the entropy controller's ``calc_loss``, side by side.

Compares, in one run, for T x B in {1x1, 32x64, 256x1024}:

* ``ours/auto``: ``EntropyTargetAlgorithm`` as users get it (on the CPU the
  plain-Python update over CPU buffers; on CUDA the tensor path),
* ``ours/tensor``: the ``torch.where`` stage machine (what runs on a GPU),
* ``branchy``: a straightforward implementation of the same rule that
  branches in Python on tensor values (ALF's code with ``if valid_mask``
  fixed), kept here for comparison.

It prints microseconds per call, the ratio to ``branchy`` and how many times
per call each reads a tensor value on the host (``bool()``/``.item()``/
``.numpy()``/...).  On a GPU every such read is a device synchronisation; on
the CPU it is a plain memory read, which is why ``auto`` may use them there.

A second table gives the cost of one ``adjust_alpha`` of every rule (staged,
PID, SGD) for one controller and for a batch of K = 8 (``batch_shape=(8,)``),
on the host path (``auto`` on the CPU) and the tensor path, and the ratio of
K = 8 to K = 1.  With ``--compare REV`` that table is measured for this checkout and for
the package at git revision ``REV``, in separate processes taking turns (three rounds, the
best of each), with the ratio now / then.

Usage: ``python benchmarks/controller_overhead.py [--iters N] [--device cpu|cuda|all]
[--compare REV]``
"""

import argparse
import contextlib
import functools
import time
import warnings
from typing import Callable, Dict, List

import numpy as np
import torch
from absl import logging as absl_logging

from alf_entropy.algorithms.entropy_target_algorithm import (
    EntropyTargetAlgorithm,
    EntropyTargetInfo,
    EntropyTargetLossInfo,
)
from alf_entropy.controllers import PIDEntropyTargetAlgorithm, SGDEntropyTargetAlgorithm
from alf_entropy.data_structures import LossInfo, StepType
from alf_entropy.tensor_specs import BoundedTensorSpec


class BranchyController(torch.nn.Module):
    """The seed's rule written the obvious way: Python ``if`` on tensors."""

    def __init__(self, target_entropy: float, device: torch.device, window: int = 2):
        super().__init__()
        dev = dict(device=device)
        self.log_alpha = torch.tensor(np.log(0.1), dtype=torch.float32, **dev)
        self.stage = torch.tensor(-2 - window, dtype=torch.int32, **dev)
        self.update_rate = torch.tensor(np.log(2), dtype=torch.float32, **dev)
        self.max_entropy = torch.tensor(0.0, **dev)
        self.buf = torch.zeros(window, **dev)
        self.count = torch.zeros((), dtype=torch.int64, **dev)
        self.window = window
        self.target = target_entropy
        self.min_log_alpha = torch.tensor(np.log(1e-4), **dev)
        self.slow = torch.tensor(0.01, **dev)
        self.fast = torch.tensor(np.log(2), **dev)

    def _avg(self) -> torch.Tensor:
        return self.buf.sum() * (1.0 / self.count.clamp(1, self.window).float())

    def calc_loss(self, info, valid_mask=None) -> LossInfo:
        """ALF's ``calc_loss`` statistics, then ``adjust_alpha`` if any step counts."""
        loss_info = info.loss
        mask = (info.step_type != StepType.LAST).float()
        if valid_mask is not None:
            mask = mask * valid_mask.float()
        entropy = -loss_info.extra.neg_entropy * mask
        num = torch.sum(mask)
        if num > 0:
            self.adjust_alpha(torch.sum(entropy) / num)
        return loss_info._replace(loss=loss_info.loss * torch.exp(self.log_alpha))

    def adjust_alpha(self, entropy: torch.Tensor) -> None:
        """ALF's stage machine, one Python ``if`` (a host read) per stage."""
        prev = self._avg()
        self.buf[self.count % self.window] = entropy
        self.count += 1
        avg = self._avg()
        target = self.target
        thresh = 0.5 * target if target > 0 else 2.0 * target
        if self.stage < -2:
            self.max_entropy.fill_(torch.min(0.8 * avg, avg / 0.8))
            self.stage.add_(1)
        if self.stage == -2:
            decreasing = (avg < prev).float()
            self.stage.add_((avg < self.max_entropy).int())
            self.log_alpha.fill_(
                torch.max(self.log_alpha + (-1 + 1.5 * decreasing) * 0.001, self.min_log_alpha)
            )
        if self.stage == -1:
            self.stage.add_((avg < target).int())
        if self.stage >= 0:
            prev_above = self.stage.bool()
            above = avg > target
            self.stage.fill_(above.int())
            rate = torch.where(above != prev_above, 0.9 * self.update_rate, self.update_rate)
            rate = torch.where(entropy < thresh, self.fast, torch.max(rate, self.slow))
            self.update_rate.fill_(rate)
            above = above.float()
            below = 1 - above
            dec = (avg < prev).float()
            step = ((below + 0.5 * above) * dec - (above + 0.5 * below) * (1 - dec)) * rate
            self.log_alpha.fill_(torch.max(self.log_alpha + step, self.min_log_alpha))


_READS = ("__bool__", "item", "__float__", "__int__", "__index__", "tolist", "numpy")


@contextlib.contextmanager
def count_host_reads(counter: List[int]):
    """Count every tensor->host value read while inside."""
    originals = {name: getattr(torch.Tensor, name) for name in _READS}

    def wrap(orig: Callable) -> Callable:
        def f(*args, **kwargs):
            counter[0] += 1
            return orig(*args, **kwargs)

        return f

    for name, orig in originals.items():
        setattr(torch.Tensor, name, wrap(orig))
    try:
        yield
    finally:
        for name, orig in originals.items():
            setattr(torch.Tensor, name, orig)


def _inputs(T: int, B: int, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    neg = -(torch.rand(T, B, generator=g) + 0.5).to(device)
    step_type = torch.ones(T, B, dtype=torch.int64).to(device)
    if T > 1:
        step_type[-1, : max(B // 4, 1)] = StepType.LAST  # some episode ends
    return EntropyTargetInfo(
        step_type=step_type,
        loss=LossInfo(loss=neg.clone(), extra=EntropyTargetLossInfo(neg_entropy=neg)),
    )


def _time_interleaved(
    fns: Dict[str, Callable[[], object]], iters: int, device: torch.device, repeats: int = 7
) -> Dict[str, float]:
    """Median microseconds per call of each function.

    The functions take turns (one block of ``iters`` calls each, ``repeats``
    rounds), so a noisy neighbour slows all of them alike and the ratios stay
    meaningful on a shared machine.
    """
    for fn in fns.values():
        for _ in range(max(iters // 10, 5)):
            fn()
    results: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            results[name].append((time.perf_counter() - t0) / iters * 1e6)
    return {name: float(np.median(r)) for name, r in results.items()}


def run(device: torch.device, iters: int) -> List[Dict[str, object]]:
    """Benchmark every implementation on ``device``."""
    spec = BoundedTensorSpec((), torch.int64, 0, 3)
    rows = []
    for T, B in ((1, 1), (32, 64), (256, 1024)):
        n = iters if T * B < 100000 else max(iters // 20, 20)
        n = max(n // 7, 10)
        info = _inputs(T, B, device)
        impls = {
            "ours/auto": EntropyTargetAlgorithm(spec, target_entropy=0.3).to(device),
            "ours/tensor": EntropyTargetAlgorithm(
                spec, target_entropy=0.3, update_mode="tensor"
            ).to(device),
            "branchy": BranchyController(0.3, device),
        }
        timings = _time_interleaved(
            {name: functools.partial(impl.calc_loss, info) for name, impl in impls.items()},
            n,
            device,
        )
        reads = {}
        for name, impl in impls.items():
            counter = [0]
            with count_host_reads(counter):
                for _ in range(10):
                    impl.calc_loss(info)
            reads[name] = counter[0] / 10
        for name in impls:
            rows.append(
                dict(
                    device=device.type,
                    shape=f"{T}x{B}",
                    impl=name,
                    us=timings[name],
                    ratio=timings[name] / timings["branchy"],
                    reads=reads[name],
                )
            )
    return rows


def run_batches(device: torch.device, iters: int) -> List[Dict[str, object]]:
    """``adjust_alpha`` of every rule for K = 1 and K = 8 members, host and tensor paths."""
    spec = BoundedTensorSpec((), torch.int64, 0, 3)
    rules = {
        "staged": functools.partial(EntropyTargetAlgorithm, skip_free_stage=True),
        "pid": PIDEntropyTargetAlgorithm,
        "sgd": SGDEntropyTargetAlgorithm,
    }
    modes = ["tensor"] + (["auto"] if device.type == "cpu" else [])
    fns, rows = {}, []
    for rule, cls in rules.items():
        for mode in modes:
            for k in (1, 8):
                shape = () if k == 1 else (k,)
                ctrl = cls(
                    spec, target_entropy=0.6, batch_shape=shape, update_mode=mode, max_alpha=1.0
                )
                entropy = torch.full(shape, 0.5).to(device)
                fns[(rule, mode, k)] = functools.partial(ctrl.to(device).adjust_alpha, entropy)
    timings = _time_interleaved(fns, max(iters // 7, 10), device)
    for (rule, mode, k), us in timings.items():
        rows.append(
            dict(
                device=device.type,
                rule=rule,
                mode=mode,
                k=k,
                us=us,
                ratio=us / timings[(rule, mode, 1)],
            )
        )
    return rows


def compare(rev: str, iters: int, rounds: int = 3) -> None:
    """``run_batches`` on the CPU for this checkout and for ``rev``'s package, taking turns."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    old = tempfile.mkdtemp(prefix="alf_entropy_rev_")
    archive = subprocess.run(
        ["git", "-C", root, "archive", rev, "alf_entropy"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
    best: Dict[str, Dict[tuple, float]] = {"now": {}, "then": {}}
    for _ in range(rounds):
        for who, path in (("then", old), ("now", root)):
            out = subprocess.run(
                [sys.executable, __file__, "--batches_json", "--iters", str(iters)],
                env={**os.environ, "PYTHONPATH": path},
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            for r in json.loads(out.splitlines()[-1]):
                key = (r["rule"], r["mode"], r["k"])
                best[who][key] = min(best[who].get(key, float("inf")), r["us"])
    print(f"\nadjust_alpha on the CPU, this checkout (now) and {rev} (then), best of {rounds}")
    print(f"{'rule':7} {'path':7} {'K':>3} {'now us':>8} {'then us':>8} {'now/then':>9}")
    for key, us in sorted(best["now"].items()):
        print(
            f"{key[0]:7} {key[1]:7} {key[2]:3d} {us:8.1f} {best['then'][key]:8.1f} "
            f"{us / best['then'][key]:9.2f}"
        )


def main() -> None:
    """Parse the flags, run every implementation and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--device", default="all", choices=["cpu", "cuda", "all"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--compare", metavar="REV", help="also time REV's package (git)")
    parser.add_argument("--batches_json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # the controllers' unreachable-target warning
    absl_logging.set_verbosity(absl_logging.ERROR)
    if args.batches_json:  # one side of --compare
        import json

        print(json.dumps(run_batches(torch.device("cpu"), args.iters)))
        return
    devices = [torch.device("cpu")]
    if args.device == "cuda" or (args.device == "all" and torch.cuda.is_available()):
        devices = (
            [torch.device("cuda")] if args.device == "cuda" else devices + [torch.device("cuda")]
        )
    elif args.device == "cpu":
        devices = [torch.device("cpu")]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, iters {args.iters}")
    header = (
        f"{'device':6} {'T x B':>9} {'impl':14} {'us/call':>9} {'vs branchy':>10} "
        f"{'host reads/call':>15}"
    )
    print(header)
    print("-" * len(header))
    for device in devices:
        for r in run(device, args.iters):
            print(
                f"{r['device']:6} {r['shape']:>9} {r['impl']:14} {r['us']:9.1f} "
                f"{r['ratio']:10.2f} {r['reads']:15.1f}"
            )
    print(
        "host reads: tensor->host value reads per call; each is a GPU sync on CUDA. "
        "'auto' reads only on the CPU, where no device exists to wait for."
    )
    print(f"\n{'device':6} {'rule':7} {'path':7} {'K':>3} {'us/update':>10} {'vs K=1':>7}")
    for device in devices:
        for r in run_batches(device, args.iters):
            print(
                f"{r['device']:6} {r['rule']:7} {r['mode']:7} {r['k']:3d} {r['us']:10.1f} "
                f"{r['ratio']:7.2f}"
            )
    if args.compare:
        compare(args.compare, args.iters)


if __name__ == "__main__":
    main()
