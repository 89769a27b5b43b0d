"""Tests for alf_entropy/utils/optimizers.py: FusedAdam is torch's fused Adam;
masked_optimizer_step skips an update exactly, with or without host reads."""

import pickle

import pytest
import torch
import torch.nn as nn

from alf_entropy.utils.optimizers import FusedAdam, masked_optimizer_step
from alf_entropy.utils.schedulers import LinearScheduler, update_progress

SHAPES = [(64, 4), (64,), (64, 64), (2, 64), (2,)]


def _params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


def _groups(params):
    # Two groups with their own options, as a user might build them.
    return [{"params": params[:3]}, {"params": params[3:], "lr": 1e-2, "weight_decay": 0.1}]


def _set_grads(params, step, skip=None):
    gen = torch.Generator().manual_seed(100 + step)
    for i, p in enumerate(params):
        p.grad = None if i == skip else torch.randn(p.shape, generator=gen)


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_fused_adam_is_torchs_fused_adam():
    params = _params()
    opt = FusedAdam(_groups(params), lr=3e-4, eps=1e-5)
    assert all(g["fused"] for g in opt.param_groups)
    ref = _params()
    ref_opt = torch.optim.Adam(_groups(ref), lr=3e-4, eps=1e-5, fused=True)
    for k in range(3):
        _set_grads(params, k)
        _set_grads(ref, k)
        opt.step()
        ref_opt.step()
    assert _same(params, ref)
    # A checkpoint of one loads into the other.
    ref_opt.load_state_dict(pickle.loads(pickle.dumps(opt.state_dict())))


def test_fused_adam_follows_its_lr_schedule():
    factor = LinearScheduler("iterations", [(0, 1.0), (10, 0.0)])
    params, ref = _params(), _params()
    opt = FusedAdam(_groups(params), lr=3e-3, eps=1e-5, lr_schedule=factor)
    assert opt.lr_schedule is factor and FusedAdam(_params()).lr_schedule is None
    ref_opt = torch.optim.Adam(_groups(ref), lr=3e-3, eps=1e-5, fused=True)
    for k, it in enumerate((0, 5, 10)):
        update_progress("iterations", it)
        for g, base in zip(ref_opt.param_groups, (3e-3, 1e-2)):
            g["lr"] = base * (1 - it / 10)
        _set_grads(params, k)
        _set_grads(ref, k)
        opt.step()
        ref_opt.step()
        # Each group's own learning rate, scaled.
        assert [g["lr"] for g in opt.param_groups] == pytest.approx(
            [3e-3 * (1 - it / 10), 1e-2 * (1 - it / 10)]
        )
        assert _same(params, ref)
    # At factor 0 a step moves nothing.
    before = [p.detach().clone() for p in params]
    _set_grads(params, 3)
    opt.step()
    assert _same(params, before)
    # A checkpoint carries the unscaled rates: a restored optimiser scales the same ones.
    update_progress("iterations", 5)
    restored = FusedAdam(_groups(_params()), lr=1.0, lr_schedule=factor)
    restored.load_state_dict(pickle.loads(pickle.dumps(opt.state_dict())))
    _set_grads(_params(), 0)
    restored.step()
    assert [g["lr"] for g in restored.param_groups] == pytest.approx([1.5e-3, 5e-3])


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"lr": -1e-3}, ValueError, "lr"),
        ({"lr": "1e-3"}, TypeError, "lr"),
        ({"lr_schedule": 0.5}, TypeError, "lr_schedule"),
    ],
)
def test_fused_adam_rejects_bad_arguments(kwargs, error, name):
    with pytest.raises(error, match=name):
        FusedAdam(_params(), **kwargs)


def test_fused_adam_rejects_a_negative_scheduled_factor_at_the_step():
    opt = FusedAdam(_params(), lr_schedule=LinearScheduler("iterations", [(0, 1.0), (10, -1.0)]))
    update_progress("iterations", 8)
    with pytest.raises(ValueError, match="lr_schedule"):
        opt.step()


_OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.1),  # restored with torch.where
    "fused": lambda ps: FusedAdam(ps, lr=0.1),  # skips in its kernel (found_inf)
    "torch_fused": lambda ps: torch.optim.Adam(ps, lr=0.1, fused=True),
}


@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize("kind", sorted(_OPTIMIZERS))
def test_masked_optimizer_step_restores_params_and_state(sync_free, kind):
    p = nn.Parameter(torch.ones(3))
    opt = _OPTIMIZERS[kind]([p])
    for ok, expect_change in ((False, False), (True, True), (False, False), (True, True)):
        before = p.detach().clone()
        state = {k: v.clone() for k, v in opt.state.get(p, {}).items()}
        p.grad = torch.tensor([1.0, float("nan") if not ok else 2.0, 3.0])
        with torch.profiler.profile() as prof:
            masked_optimizer_step([opt], torch.tensor(ok), sync_free=sync_free)
        # Fused optimisers skip in their kernel: no copies to restore.
        restored = any(e.name == "aten::where" for e in prof.events())
        assert restored == (sync_free and kind == "adam")
        assert torch.equal(p.detach(), before) != expect_change
        if not expect_change:
            for k, v in opt.state.get(p, {}).items():
                assert torch.equal(v, state.get(k, torch.zeros_like(v))), k
        assert not hasattr(opt, "found_inf")
    assert float(opt.state[p]["step"]) == 2  # skipped steps do not count
    # The same parameters as two plain steps on the same gradients.
    q = nn.Parameter(torch.ones(3))
    ref = _OPTIMIZERS[kind]([q])
    for grad in ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]):
        q.grad = torch.tensor(grad)
        ref.step()
    assert torch.equal(p.detach(), q.detach())
