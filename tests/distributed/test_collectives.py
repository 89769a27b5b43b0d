"""Two gloo ranks on 127.0.0.1: collectives, one alpha, averaged gradients, faults.

The ranks run ``tests.distributed.workers`` in subprocesses; the parent
compares what they saved with each other and with a single process that
sees the pooled batch.
"""

import pytest
import torch

from alf_entropy.utils import distributed
from tests.distributed import workers
from tests.distributed.launch import run_ranks

# torchrun/process groups: the slow lane (pytest -m slow); plain pytest runs it.
pytestmark = pytest.mark.slow


def _assert_ok(results):
    for r, res in enumerate(results):
        assert res.returncode == 0, f"rank {r} exited {res.returncode}:\n{res.stderr[-3000:]}"


def _same_bits(a, b, where):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same_bits(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same_bits(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{where}: {a} != {b}"
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("collectives")
    _assert_ok(run_ranks("collectives", str(out)))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_single_process_is_a_no_op():
    assert not distributed.is_distributed()
    assert (distributed.world_size(), distributed.rank()) == (1, 0)
    assert distributed.is_main_process()
    mean, count = torch.tensor(2.5), torch.tensor(3)
    assert distributed.all_reduce_masked_mean(mean, count) == (mean, count)  # same objects
    x = torch.ones(2)
    assert distributed.all_reduce_mean(x) is x
    assert distributed.gather_object(5) == [5] and distributed.broadcast_object(7) == 7
    assert distributed.init_from_env(torch.device("cpu")) == torch.device("cpu")
    assert distributed.rank_device(torch.device("cuda")) == torch.device("cuda")
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), 3.0)
    assert distributed.all_reduce_gradients_([p]) is None and p.grad.tolist() == [3.0, 3.0]


def test_bad_environment_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(ValueError, match="RANK must be in \\[0, 2\\)"):
        distributed.init_from_env(torch.device("cpu"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="MASTER_ADDR must be set"):
        distributed.init_from_env(torch.device("cpu"))
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE must be an integer"):
        distributed.env_world_size()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "-3")
    with pytest.raises(ValueError, match=r"ALF_ENTROPY_DIST_TIMEOUT_S \(seconds\) must be > 0"):
        distributed.init_from_env(torch.device("cpu"))
    assert not distributed.is_distributed()


def test_utilities(ranks):
    for r, out in enumerate(ranks):
        assert (out["rank"], out["world_size"], out["is_main"]) == (r, 2, r == 0)
        assert out["is_distributed"]
        mean, count = out["masked_mean"]  # ranks: 1.5 over 2, 2.5 over 5
        assert mean.dtype == torch.float32 and count.dtype == torch.int64
        assert (mean.item(), count.item()) == (torch.tensor(15.5 / 7).item(), 7)
        assert out["plain_mean"][0].item() == 2.0 and out["plain_mean"][1] is None
        assert out["mean"].tolist() == [0.5, 5.0]
        assert out["object"] == {"from": 0}
        assert torch.equal(out["broadcast_weight"], torch.zeros(2, 2))
        # A NaN gradient on one rank is seen by all, so all skip alike.
        assert not out["grads_finite_with_nan"] and out["grads_finite"]
        assert out["grad_mean"].tolist() == [0.5, 0.5, 0.5]
    assert ranks[0]["gathered"] == [("rank", 0), ("rank", 1)] and ranks[1]["gathered"] is None


def test_controllers_bit_identical_across_ranks(ranks):
    _same_bits(ranks[0]["trajectories"], ranks[1]["trajectories"], "trajectories")
    _same_bits(ranks[0]["adjust_alpha"], ranks[1]["adjust_alpha"], "adjust_alpha")
    # The ranks' entropies differ, so a missing reduction would show.
    staged = ranks[0]["trajectories"]["staged_host"]
    assert len({round(s["driver.log_alpha"].item(), 6) for s in staged}) > 3
    assert {s["driver.stage"].item() for s in staged} >= {-1, 0}


def test_controllers_equal_single_process_on_pooled_batch(ranks):
    """Each rank's controller equals one process fed both ranks' batches."""
    pooled = [
        tuple(torch.cat([a, b], dim=1) for a, b in zip(x0, x1))
        for x0, x1 in zip(workers.rank_batches(0), workers.rank_batches(1))
    ]
    torch.manual_seed(0)
    algs = workers.controllers()
    for k, (neg_entropy, step_type, valid) in enumerate(pooled):
        for name, alg in algs.items():
            workers.feed(alg, neg_entropy, step_type, valid)
            want = workers.controller_state(alg)
            got = ranks[0]["trajectories"][name][k]
            assert want.keys() == got.keys()
            for key in want:
                torch.testing.assert_close(
                    got[key], want[key], rtol=0, atol=1e-6, msg=f"{name} step {k} {key}"
                )
    # adjust_alpha: the ranks' scalars are averaged.
    want = workers.adjust_alpha_trajectories([1.2 - 0.1 * k + 0.2 for k in range(6)])
    for name in want:
        torch.testing.assert_close(ranks[0]["adjust_alpha"][name], want[name], rtol=0, atol=1e-6)
        assert len({a.item() for a in want[name]}) > 2  # alpha moved


def test_gradients_averaged(ranks):
    _same_bits(ranks[0]["regression"], ranks[1]["regression"], "regression")
    # Equal to one process minimising the mean loss over both halves.
    for key, value in workers.regression_state(None).items():
        torch.testing.assert_close(ranks[0]["regression"][key], value, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fault", ["dies", "hangs"])
def test_failed_peer_makes_others_fail_in_bounded_time(tmp_path, fault):
    results = run_ranks(
        f"peer_{fault}", str(tmp_path), timeout_s=90, env={distributed.TIMEOUT_ENV: "3"}
    )
    assert results[0].returncode == 3, results[0].stderr[-3000:]
    elapsed, message = (tmp_path / "error.txt").read_text().split("\n", 1)
    assert "rank 0/2" in message and "another rank died" in message and "3s timeout" in message
    assert float(elapsed) < (10 if fault == "hangs" else 5)
    if fault == "dies":
        assert results[1].returncode == -9


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("accumulate")
    _assert_ok(run_ranks("accumulate", str(out)))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_accumulate_then_step_pools_every_micro_batch_of_every_rank(accumulated):
    """2 ranks x 4 micro-batches of unequal lengths a step: one alpha on both ranks, equal to
    one process fed the concatenated batch (the count-weighted mean, not a mean of means)."""
    out = accumulated
    _same_bits(out[0]["alphas"], out[1]["alphas"], "alphas")
    single = workers.controllers()
    for name, alg in single.items():
        for step, alpha in enumerate(out[0]["alphas"][name]):
            pooled = torch.cat([e for r in range(2) for e in workers.micro_batches(r, step)])
            alg.accumulate(pooled)
            assert torch.allclose(alg.step(), alpha, rtol=1e-6, atol=0), (name, step)
    assert "call step() first" in out[0]["refused"] and out[1]["refused"]


def test_step_entropy_control_all_reduce_pools_the_ranks_sums_and_counts(accumulated):
    """``StepEntropyControl.update(..., all_reduce=True)`` fed each rank's own sum and count
    (unequal counts), as numbers and as tensors: the same coefficients on both ranks, those of
    one process fed the pooled sums."""
    single = workers.step_control_coefficients(None)
    assert len(set(single["numbers"])) > 3  # the coefficient moved: the steps differ
    for data in accumulated:
        assert data["step_control"]["numbers"] == single["numbers"]
        assert data["step_control"]["tensors"] == single["numbers"]
