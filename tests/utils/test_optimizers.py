"""Tests for alf_entropy/utils/optimizers.py: FusedAdam is torch's fused Adam, bit for bit;
masked_optimizer_step skips an update exactly, with or without host reads."""
import pickle

import pytest
import torch
import torch.nn as nn

from alf_entropy.utils.optimizers import FusedAdam, masked_optimizer_step

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


def _run(opt, params, steps, start=0):
    for k in range(start, start + steps):
        # A missing gradient once (torch's step then runs) and an lr change.
        _set_grads(params, k, skip=1 if k == 4 else None)
        if k == 6:
            opt.param_groups[0]["lr"] = 5e-4
        opt.step()


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_same_bits_as_torch_fused_adam():
    ours, ref = _params(), _params()
    opt = FusedAdam(_groups(ours), lr=3e-4, eps=1e-5)
    ref_opt = torch.optim.Adam(_groups(ref), lr=3e-4, eps=1e-5, fused=True)
    _run(opt, ours, 10)
    _run(ref_opt, ref, 10)
    assert _same(ours, ref)
    assert opt._lean is not None  # the lean step did run
    a, b = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    assert a.keys() == b.keys()
    for i in a:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(a[i][key], b[i][key]), (i, key)


def test_state_dicts_are_interchangeable_with_torchs():
    ours, ref = _params(), _params()
    opt = FusedAdam(_groups(ours), lr=3e-4)
    ref_opt = torch.optim.Adam(_groups(ref), lr=3e-4, fused=True)
    _run(opt, ours, 5)
    _run(ref_opt, ref, 5)
    # Swap: each continues from the other's state (through a pickle, as a
    # checkpoint would).
    ours2, ref2 = [p.detach().clone().requires_grad_() for p in ours], _params()
    with torch.no_grad():
        for p, q in zip(ref2, ref):
            p.copy_(q)
    opt2 = torch.optim.Adam(_groups(ours2), lr=3e-4, fused=True)
    opt2.load_state_dict(pickle.loads(pickle.dumps(opt.state_dict())))
    ref_opt2 = FusedAdam(_groups(ref2), lr=3e-4)
    ref_opt2.load_state_dict(pickle.loads(pickle.dumps(ref_opt.state_dict())))
    _run(opt2, ours2, 5, start=5)
    _run(ref_opt2, ref2, 5, start=5)
    _run(opt, ours, 5, start=5)
    assert _same(ours, ours2) and _same(ours, ref2)


def test_closure_falls_back_and_hooks_run_once():
    ours, ref = _params(), _params()
    opt = FusedAdam(ours, lr=1e-3)
    ref_opt = torch.optim.Adam(ref, lr=1e-3, fused=True)
    calls = []
    opt.register_step_post_hook(lambda *args: calls.append(1))
    for k in range(3):
        _set_grads(ours, k)
        _set_grads(ref, k)
        assert opt.step(closure=lambda: 7.0) == 7.0
        ref_opt.step()
    assert calls == [1, 1, 1] and _same(ours, ref)
    for k in range(3, 5):  # the lean step: the hook still runs once per step
        _set_grads(ours, k)
        _set_grads(ref, k)
        opt.step()
        ref_opt.step()
    assert opt._lean is not None and calls == [1] * 5 and _same(ours, ref)


def test_grad_scaler_unscales_and_skips_as_with_torchs():
    # GradScaler hands a fused optimiser its scale and inf flag as attributes
    # (``grad_scale``, ``found_inf``) and leaves unscaling and skipping to the
    # kernel: the lean step must pass them on, or it would apply gradients
    # 2**16 times too large and steps with infs.
    results = []
    for cls, kwargs in ((FusedAdam, {}), (torch.optim.Adam, {"fused": True})):
        params = _params()
        opt = cls(_groups(params), lr=3e-4, **kwargs)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
        for k in range(6):
            loss = sum(((p * torch.randn(p.shape, generator=torch.Generator().manual_seed(k))).sum()
                        for p in params))
            if k == 3:
                loss = loss * float("inf")  # this step is skipped, the scale halves
            for p in params:
                p.grad = None
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        results.append((params, opt.state_dict()["state"], scaler.get_scale()))
    (ours, ours_state, ours_scale), (ref, ref_state, ref_scale) = results
    assert ours_scale == ref_scale == 2.0**15
    assert _same(ours, ref)
    for i in ref_state:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(ours_state[i][key], ref_state[i][key]), (i, key)
    assert float(ref_state[0]["step"]) == 5  # the inf step did not count


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
