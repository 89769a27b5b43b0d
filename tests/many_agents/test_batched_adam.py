"""BatchedAdam: per member torch's Adam, and members that never touch each other."""

from typing import List

import pytest
import torch

from alf_entropy.networks.batched_adam import BatchedAdam
from alf_entropy.utils.optimizers import FusedAdam, clip_grad_norms_, masked_optimizer_step

K = 3


def _masked_step(adam: BatchedAdam, ok: torch.Tensor, max_grad_norm=None):
    """The K agents' step as ``Algorithm.update_with_gradient`` takes it: each member's
    gradient norm clipped (a non-finite one skipped), then a step where ``ok``, nothing
    read on the host; the norms (None without clipping) and the flags used."""
    params = [p for group in adam.param_groups for p in group["params"]]
    norms = None
    if max_grad_norm is not None:
        norms = clip_grad_norms_(params, max_grad_norm, batch_ndim=1)
        ok = ok & torch.isfinite(norms)
    masked_optimizer_step([adam], ok, sync_free=True)
    return norms, ok


def _grads(steps: int) -> List[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(K, 5, 7, generator=generator) for _ in range(steps)]


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_each_member_is_torch_adam(weight_decay: float) -> None:
    start = torch.randn(K, 5, 7)
    stacked = start.clone().requires_grad_()
    batched = BatchedAdam([stacked], lr=3e-4, eps=1e-5, weight_decay=weight_decay)
    singles = [start[k].clone().requires_grad_() for k in range(K)]
    torch_adams = [
        torch.optim.Adam([p], lr=3e-4, eps=1e-5, weight_decay=weight_decay, foreach=False)
        for p in singles
    ]
    fused = [start[k].clone().requires_grad_() for k in range(K)]
    fused_adams = [FusedAdam([p], lr=3e-4, eps=1e-5, weight_decay=weight_decay) for p in fused]
    for grad in _grads(30):
        stacked.grad = grad.clone()
        batched.step()
        for k in range(K):
            singles[k].grad, fused[k].grad = grad[k].clone(), grad[k].clone()
            torch_adams[k].step()
            fused_adams[k].step()
    for k in range(K):
        assert torch.equal(stacked[k], fused[k])  # FusedAdam's kernel, bit for bit
        torch.testing.assert_close(stacked[k], singles[k], rtol=0, atol=1e-7)  # torch's Adam


def test_a_skipped_member_keeps_everything_and_the_others_do_not_notice() -> None:
    start = torch.randn(K, 5, 7)
    clean, skipping = start.clone().requires_grad_(), start.clone().requires_grad_()
    clean_adam, skipping_adam = BatchedAdam([clean], lr=1e-2), BatchedAdam([skipping], lr=1e-2)
    grads = _grads(10)
    for i, grad in enumerate(grads):
        clean.grad = grad.clone()
        clean_adam.step()
        poisoned = grad.clone()
        skip = i in (3, 4, 7)
        if skip:
            poisoned[1] = float("nan")  # member 1's update this step is not finite
        skipping.grad = poisoned
        _masked_step(skipping_adam, torch.tensor([True, not skip, True]))
        assert torch.isfinite(skipping).all()
    state = skipping_adam.state[skipping]
    assert state["step"].tolist() == [10.0, 7.0, 10.0]  # a counter per member
    for k in (0, 2):  # bit for bit what they do with no member skipping
        assert torch.equal(skipping[k], clean[k])
        assert torch.equal(state["exp_avg"][k], clean_adam.state[clean]["exp_avg"][k])
    assert not state["exp_avg"][1].isnan().any()
    # Member 1 is Adam on the 7 gradients it took (bias correction by its own count).
    alone = start[1].clone().requires_grad_()
    adam = FusedAdam([alone], lr=1e-2)
    for i, grad in enumerate(grads):
        if i not in (3, 4, 7):
            alone.grad = grad[1].clone()
            adam.step()
    assert torch.equal(skipping[1], alone)


def test_clipping_is_per_member_and_a_group_steps_as_one() -> None:
    """Two parameters of different shapes; member 1's gradients are huge, member 2's
    infinite: 1 is clipped to norm 1 (as clip_grad_norm_ clips one model), 2 skipped,
    0 (small gradients) untouched by either."""
    a, b = torch.zeros(K, 4, 3, requires_grad=True), torch.zeros(K, 5, requires_grad=True)
    adam = BatchedAdam([a, b], lr=0.1)
    a.grad, b.grad = torch.full((K, 4, 3), 0.01), torch.full((K, 5), 0.01)
    a.grad[1] *= 1e6
    b.grad[2, 0] = float("inf")
    norms, ok = _masked_step(adam, torch.ones(K, dtype=torch.bool), max_grad_norm=1.0)
    assert ok.tolist() == [True, True, False]
    torch.testing.assert_close(
        norms[:2], torch.tensor([(17 * 1e-4) ** 0.5, (12 * 1e8 + 5 * 1e-4) ** 0.5])
    )
    assert not b[2].any() and not a[2].any()  # skipped
    # The first Adam step moves every element by lr (m / sqrt(v) = sign): members 0 and 1
    # alike, whatever their (clipped) scale.
    torch.testing.assert_close(a[:2], torch.full((2, 4, 3), -0.1))
    _masked_step(adam, torch.tensor([True, False, True]))  # the same gradients again
    assert adam.state[a]["step"].tolist() == [2.0, 1.0, 1.0]


def test_a_parameter_without_gradient_is_left_alone_as_torch_adam_does() -> None:
    """An agent's parameter that its loss does not reach (``grad`` None): torch's Adam skips
    it (value, moments and counter), so the batch must too for agent k to equal its run."""
    a, b = torch.zeros(K, 4, requires_grad=True), torch.ones(K, 2, requires_grad=True)
    single_a, single_b = torch.zeros(4, requires_grad=True), torch.ones(2, requires_grad=True)
    adam, single = BatchedAdam([a, b], lr=0.1), FusedAdam([single_a, single_b], lr=0.1)
    for step in range(3):
        a.grad, single_a.grad = torch.full((K, 4), 0.5), torch.full((4,), 0.5)
        b.grad = single_b.grad = None
        if step == 2:  # b gets a gradient from the third step on
            b.grad, single_b.grad = torch.full((K, 2), 0.5), torch.full((2,), 0.5)
        adam.step()
        single.step()
    for k in range(K):
        assert torch.equal(a[k], single_a) and torch.equal(b[k], single_b)
    assert adam.state[a]["step"].tolist() == [3.0] * K
    assert adam.state[b]["step"].tolist() == [1.0] * K  # counted only where it had a gradient


def test_scheduled_learning_rate_and_arguments() -> None:
    factors = iter([0.5, 0.0])
    p = torch.zeros(2, 3, requires_grad=True)
    adam = BatchedAdam([p], lr=0.2, lr_schedule=lambda: next(factors))  # FusedAdam's factor
    p.grad = torch.ones(2, 3)
    adam.step()  # lr 0.2 * 0.5: the first Adam step moves by lr
    torch.testing.assert_close(p, torch.full((2, 3), -0.1))
    adam.step()  # factor 0: nothing moves
    torch.testing.assert_close(p, torch.full((2, 3), -0.1))
    assert adam.param_groups[0]["initial_lr"] == 0.2
    with pytest.raises(ValueError, match="lr"):
        BatchedAdam([p], lr=-1.0)
    with pytest.raises(TypeError, match="lr_schedule"):
        BatchedAdam([p], lr_schedule=0.5)
    with pytest.raises(ValueError, match="leading dimension"):
        BatchedAdam([torch.zeros(2, 3, requires_grad=True), torch.zeros(3, requires_grad=True)])
