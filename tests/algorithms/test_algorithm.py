"""Tests for alf_entropy.algorithms.algorithm (composition, optimisers, updates)."""

import functools

import pytest
import torch
import torch.nn as nn

from alf_entropy.algorithms.algorithm import Algorithm, combine_loss_infos
from alf_entropy.data_structures import AlgStep, LossInfo

SGD = functools.partial(torch.optim.SGD, lr=0.1)


class Child(Algorithm):
    """A sub-algorithm with a buffer and a Linear layer."""

    def __init__(self, optimizer=None, name="Child"):
        super().__init__(optimizer=optimizer, name=name)
        self.register_buffer("counter", torch.zeros(2))
        self.fc = nn.Linear(2, 1)
        self.after_update_calls = 0

    def after_update(self, *args, **kwargs):
        self.after_update_calls += 1
        super().after_update(*args, **kwargs)


class Parent(Algorithm):
    """An algorithm holding a ``Child`` and one parameter of its own."""

    def __init__(self, optimizer=None, child_optimizer=None):
        super().__init__(optimizer=optimizer, name="Parent")
        self.child = Child(child_optimizer)
        self.w = nn.Parameter(torch.ones(3))


def _ids(params):
    return {id(p) for p in params}


def _opt_param_ids(opt):
    return {id(p) for g in opt.param_groups for p in g["params"]}


# ---------------------------------------------------------------- composition
def test_child_state_is_in_parent_state_dict():
    parent = Parent()
    keys = set(parent.state_dict())
    assert {"w", "child.counter", "child.fc.weight", "child.fc.bias"} <= keys
    assert _ids(parent.child.parameters()) <= _ids(parent.parameters())


def test_state_dict_round_trip_restores_child_buffers_and_params():
    a = Parent()
    a.child.counter.fill_(7.0)
    with torch.no_grad():
        a.child.fc.weight.fill_(0.25)
        a.w.fill_(-3.0)
    b = Parent()
    assert not torch.equal(b.child.counter, a.child.counter)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.child.counter, torch.full((2,), 7.0))
    assert torch.equal(b.child.fc.weight, a.child.fc.weight)
    assert torch.equal(b.w, a.w)


class Holder(Algorithm):
    def __init__(self):
        super().__init__(name="Holder")
        self.algs = nn.ModuleList([Child(name="c0"), Child(name="c1")])
        self.seq = nn.Sequential(nn.Linear(1, 1), Child(name="c2"))
        self.direct = Parent()  # Parent holds its own Child (a grandchild here)


def test_sub_algorithms_finds_children_inside_containers():
    holder = Holder()
    subs = holder.sub_algorithms()
    names = sorted(a.name for a in subs)
    assert names == ["Parent", "c0", "c1", "c2"]
    # Only the nearest algorithms: the Parent's Child is not listed here.
    assert holder.direct.child not in subs
    assert holder.direct.sub_algorithms() == [holder.direct.child]
    assert Child().sub_algorithms() == []


def test_set_on_policy_propagates_to_all_descendants():
    holder = Holder()
    assert holder.on_policy is None
    holder.set_on_policy(True)
    assert holder.on_policy is True
    for alg in holder.modules():
        if isinstance(alg, Algorithm):
            assert alg.on_policy is True, alg.name
    holder.set_on_policy(True)  # same value again is fine
    with pytest.raises(ValueError, match="on_policy"):
        holder.set_on_policy(False)


def test_set_on_policy_conflict_with_child_raises():
    parent = Parent()
    parent.child.set_on_policy(False)
    with pytest.raises(ValueError, match="on_policy"):
        parent.set_on_policy(True)


def test_after_update_reaches_sub_algorithms():
    holder = Holder()
    holder.after_update()
    assert [c.after_update_calls for c in holder.algs] == [1, 1]
    assert holder.direct.child.after_update_calls == 1


def test_name_and_flags():
    alg = Algorithm(debug_summaries=True, name="foo")
    assert alg.name == "foo" and alg.debug_summaries is True
    with pytest.raises(ValueError, match="name"):
        Algorithm(name="")


# ----------------------------------------------------------------- optimizers
def test_parent_optimizer_covers_child_without_optimizer():
    parent = Parent(optimizer=SGD)
    opts = parent.optimizers()
    assert len(opts) == 1
    assert _opt_param_ids(opts[0]) == _ids(parent.parameters())
    # Created once: a second call returns the same object.
    assert parent.optimizers()[0] is opts[0]


def test_child_with_own_optimizer_keeps_params_out_of_parent():
    parent = Parent(optimizer=SGD, child_optimizer=functools.partial(torch.optim.Adam, lr=1e-3))
    opts = parent.optimizers()
    assert len(opts) == 2
    parent_opt, child_opt = opts
    assert isinstance(parent_opt, torch.optim.SGD)
    assert isinstance(child_opt, torch.optim.Adam)
    assert _opt_param_ids(parent_opt) == {id(parent.w)}
    assert _opt_param_ids(child_opt) == _ids(parent.child.parameters())
    assert not (_opt_param_ids(parent_opt) & _opt_param_ids(child_opt))


def test_tree_walks_follow_the_module_tree():
    parent = Parent(optimizer=SGD)
    first = parent.sub_algorithms()
    assert first == [parent.child]
    first.append("not part of the tree")  # callers get their own list
    assert parent.sub_algorithms() == [parent.child]
    opts = parent.optimizers()
    parent.other = Child(optimizer=SGD, name="other")
    assert parent.sub_algorithms() == [parent.child, parent.other]
    new_opts = parent.optimizers()
    assert new_opts[0] is opts[0] and len(new_opts) == 2
    assert _opt_param_ids(new_opts[1]) == _ids(parent.other.parameters())
    del parent.other
    assert parent.sub_algorithms() == [parent.child]
    parent.child = None  # a registered sub-module replaced by None leaves the tree too
    assert parent.sub_algorithms() == []
    parent.add_module("late", Child(name="late"))  # added through nn.Module's API
    assert parent.sub_algorithms() == [parent.late]


def test_fixed_tree_walks_once_and_lets_go_after(monkeypatch):
    parent = Parent(optimizer=SGD, child_optimizer=SGD)
    walks = []
    collect = Algorithm._collect_optimizers
    monkeypatch.setattr(
        Algorithm,
        "_collect_optimizers",
        lambda self, *a, **k: walks.append(self) or collect(self, *a, **k),
    )
    with parent.fixed_tree():
        walks.clear()
        opts = parent.optimizers()
        for _ in range(3):
            assert parent.optimizers() == opts and parent.sub_algorithms() == [parent.child]
            parent.after_update()
        parent.optimizers().append("not part of the tree")  # callers get their own list
        parent.other = Child(optimizer=SGD, name="other")  # not seen inside the block
        assert parent.sub_algorithms() == [parent.child] and len(parent.optimizers()) == 2
    assert walks == [] and parent.child.after_update_calls == 3
    assert parent.sub_algorithms() == [parent.child, parent.other]
    assert len(parent.optimizers()) == 3


def test_root_without_optimizer_but_trainable_params_raises():
    with pytest.raises(ValueError, match="no optimizer"):
        Parent().optimizers()
    # Even if the child has one, the parent's own parameter is orphaned.
    with pytest.raises(ValueError, match="1 trainable"):
        Parent(child_optimizer=SGD).optimizers()


def test_root_without_optimizer_is_fine_when_nothing_is_orphaned():
    parent = Parent(child_optimizer=SGD)
    parent.w.requires_grad_(False)
    opts = parent.optimizers()
    assert len(opts) == 1
    assert _opt_param_ids(opts[0]) == _ids(parent.child.parameters())


def test_optimizer_instance_is_used_as_is():
    child = Child()
    opt = torch.optim.SGD(child.parameters(), lr=0.5)
    alg = Child(optimizer=opt)
    assert alg.optimizers() == [opt]


def test_optimizer_factory_must_return_optimizer():
    with pytest.raises(TypeError, match="not a torch Optimizer"):
        Child(optimizer=lambda params: "nope").optimizers()


# -------------------------------------------------------- update_with_gradient
class Quadratic(Algorithm):
    def __init__(self, init, optimizer=SGD):
        super().__init__(optimizer=optimizer, name="Quadratic")
        self.x = nn.Parameter(torch.tensor(init))


def test_update_with_gradient_descends_on_quadratic():
    alg = Quadratic([3.0, -2.0])
    target = torch.tensor([1.0, 1.0])

    def per_step_loss():
        return (alg.x - target) ** 2

    before = per_step_loss().mean().item()
    x0 = alg.x.detach().clone()
    info, params = alg.update_with_gradient(LossInfo(loss=per_step_loss()))
    # loss = mean((x - t)^2) -> grad = (x - t); SGD(lr=0.1) step.
    assert torch.allclose(alg.x.detach(), x0 - 0.1 * (x0 - target))
    assert per_step_loss().mean().item() < before
    assert info.loss.shape == () and not info.loss.requires_grad
    assert abs(info.loss.item() - before) < 1e-6
    assert _ids(params) == {id(alg.x)}


def test_update_with_gradient_adds_scalar_loss():
    alg = Quadratic([1.0, 1.0])
    scalar = (alg.x * torch.tensor([2.0, -4.0])).sum()
    info, _ = alg.update_with_gradient(LossInfo(scalar_loss=scalar))
    assert torch.allclose(alg.x.detach(), torch.tensor([1.0 - 0.2, 1.0 + 0.4]))
    assert abs(info.loss.item() - (-2.0)) < 1e-6


def test_update_with_gradient_without_any_loss_raises():
    alg = Quadratic([1.0])
    with pytest.raises(ValueError, match="neither loss nor scalar_loss"):
        alg.update_with_gradient(LossInfo())


def test_valid_masks_weighting():
    alg = Quadratic([1.0, 2.0, 3.0, 4.0])
    mask = torch.tensor([1.0, 0.0, 1.0, 0.0])
    x0 = alg.x.detach().clone()
    info, _ = alg.update_with_gradient(LossInfo(loss=alg.x**2), valid_masks=mask)
    # loss = sum(x^2 * mask) / sum(mask) -> grad = 2 x mask / 2.
    assert torch.allclose(alg.x.grad, torch.tensor([1.0, 0.0, 3.0, 0.0]))
    assert torch.equal(alg.x.detach()[mask == 0], x0[mask == 0])
    assert torch.allclose(alg.x.detach(), x0 - 0.1 * x0 * mask)
    assert abs(info.loss.item() - (1.0 + 9.0) / 2) < 1e-6


def test_valid_masks_bool_and_all_masked():
    alg = Quadratic([1.0, 2.0])
    alg.update_with_gradient(LossInfo(loss=alg.x**2), valid_masks=torch.tensor([False, True]))
    assert torch.allclose(alg.x.grad, torch.tensor([0.0, 4.0]))
    alg2 = Quadratic([1.0, 2.0])
    info, _ = alg2.update_with_gradient(LossInfo(loss=alg2.x**2), valid_masks=torch.zeros(2))
    assert info.loss.item() == 0.0
    assert torch.equal(alg2.x.detach(), torch.tensor([1.0, 2.0]))


def test_max_grad_norm_clips_global_norm():
    alg = Quadratic([0.0] * 4, optimizer=functools.partial(torch.optim.SGD, lr=1.0))
    alg.update_with_gradient(LossInfo(scalar_loss=(alg.x * 100.0).sum()), max_grad_norm=1.0)
    assert abs(alg.x.grad.norm().item() - 1.0) < 1e-4
    assert torch.allclose(alg.x.detach(), torch.full((4,), -0.5), atol=1e-5)

    unclipped = Quadratic([0.0] * 4, optimizer=functools.partial(torch.optim.SGD, lr=1.0))
    unclipped.update_with_gradient(LossInfo(scalar_loss=(unclipped.x * 100.0).sum()))
    assert torch.allclose(unclipped.x.detach(), torch.full((4,), -100.0))


def test_update_with_gradient_steps_every_optimizer():
    parent = Parent(optimizer=SGD, child_optimizer=SGD)
    w0 = parent.w.detach().clone()
    fc0 = parent.child.fc.weight.detach().clone()
    loss = parent.w.sum() + parent.child.fc(torch.ones(1, 2)).sum()
    parent.update_with_gradient(LossInfo(scalar_loss=loss))
    assert torch.allclose(parent.w.detach(), w0 - 0.1)
    assert torch.allclose(parent.child.fc.weight.detach(), fc0 - 0.1)


def test_gradients_are_zeroed_between_updates():
    alg = Quadratic([1.0])
    alg.update_with_gradient(LossInfo(scalar_loss=alg.x.sum() * 5.0))
    alg.update_with_gradient(LossInfo(scalar_loss=alg.x.sum()))
    assert torch.allclose(alg.x.grad, torch.tensor([1.0]))
    assert torch.allclose(alg.x.detach(), torch.tensor([1.0 - 0.5 - 0.1]))


# ---------------------------------------------------------- combine_loss_infos
def test_combine_loss_infos_sums_and_keeps_extras():
    main = LossInfo(
        loss=torch.tensor([1.0, 2.0]),
        scalar_loss=torch.tensor(0.5),
        extra={"pg": torch.tensor(3.0)},
        priority=torch.tensor([9.0]),
    )
    ent = LossInfo(loss=torch.tensor([10.0, 20.0]), extra="ent_extra")
    reg = LossInfo(scalar_loss=torch.tensor(2.0), extra="reg_extra")
    out = combine_loss_infos(main, entropy=ent, reg=reg)
    assert torch.equal(out.loss, torch.tensor([11.0, 22.0]))
    assert torch.equal(out.scalar_loss, torch.tensor(2.5))
    assert set(out.extra) == {"main", "entropy", "reg"}
    assert out.extra["main"] is main.extra
    assert out.extra["entropy"] == "ent_extra"
    assert out.extra["reg"] == "reg_extra"
    assert out.priority is main.priority


def test_combine_loss_infos_with_empty_main():
    sub = LossInfo(loss=torch.tensor([1.0]), extra=())
    out = combine_loss_infos(LossInfo(), sub=sub)
    assert "main" not in out.extra
    assert torch.equal(out.loss, torch.tensor([1.0]))
    assert out.scalar_loss == ()
    assert out.extra == {"sub": ()}


# ------------------------------------------------------------ step defaults
class Doubler(Algorithm):
    def __init__(self):
        super().__init__(name="Doubler")
        self.calls = []

    def train_step(self, inputs, state=(), rollout_info=()):
        self.calls.append("train")
        return AlgStep(output=inputs * 2, state=state, info="info")


def test_predict_and_rollout_default_to_train_step():
    alg = Doubler()
    step = alg.predict_step(3, state="s")
    assert step == AlgStep(output=6, state="s", info="info")
    assert alg.rollout_step(4).output == 8
    assert alg.calls == ["train", "train"]


def test_base_train_step_and_calc_loss_not_implemented():
    alg = Algorithm()
    with pytest.raises(NotImplementedError, match="train_step"):
        alg.train_step(1)
    with pytest.raises(NotImplementedError, match="train_step"):
        alg.predict_step(1)
    with pytest.raises(NotImplementedError, match="calc_loss"):
        alg.calc_loss(())
