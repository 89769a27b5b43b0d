"""``alf_entropy.accel``: the fast paths that need torch internals, and their switch."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from alf_entropy import accel
from alf_entropy.networks import ActorDistributionNetwork
from alf_entropy.networks.distributions import (
    Categorical,
    categorical_log_prob_and_entropy,
    sample_categorical,
)
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec

OBS = TensorSpec((4,))
DISCRETE = BoundedTensorSpec((), torch.int64, 0, 2)
BOX = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)

needs_accel = pytest.mark.skipif(not accel.ENABLED, reason="ALF_ENTROPY_ACCEL=0")


def test_switch_is_read_at_import():
    code = (
        "import torch.nn as nn; from alf_entropy import accel; "
        "print(accel.ENABLED, accel.forward_only(nn.Linear(2, 2)))"
    )
    for value, expected in (("0", "False False"), ("1", "True True")):
        env = dict(os.environ, ALF_ENTROPY_ACCEL=value)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert out == expected


@needs_accel
def test_forward_only_sees_hooks():
    layer = nn.Linear(2, 2)
    assert accel.forward_only(layer)
    handle = layer.register_forward_pre_hook(lambda *args: None)
    assert not accel.forward_only(layer)
    handle.remove()
    handle = nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        assert not accel.forward_only(layer)
    finally:
        handle.remove()
    assert accel.forward_only(layer)


@needs_accel
def test_categorical_sample_with_log_prob_is_sample_and_log_prob_of_the_distribution():
    logits = torch.randn(6, 3)
    torch.manual_seed(3)
    dist = Categorical(logits)
    action = dist.sample()
    log_prob = dist.log_prob(action)
    torch.manual_seed(3)
    fast_action, fast_log_prob = accel.categorical_sample_with_log_prob(logits, sample_categorical)
    assert torch.equal(fast_action, action)
    torch.testing.assert_close(fast_log_prob, log_prob)


def test_categorical_sample_with_log_prob_refuses_bad_arguments():
    draw = accel.categorical_sample_with_log_prob
    with pytest.raises(TypeError, match="logits must be a tensor"):
        draw([[0.0, 1.0]], sample_categorical)
    with pytest.raises(TypeError, match="sample must be callable"):
        draw(torch.zeros(2, 3), None)
    with pytest.raises(ValueError, match="logits must be"):
        draw(torch.zeros(3), sample_categorical)


def test_relu_mlp_refuses_bad_arguments():
    x = torch.randn(2, 3)
    params = [torch.randn(2, 3, 1, requires_grad=True), torch.randn(2, 1, 1)]
    with pytest.raises(TypeError, match="mlp_forward must be callable"):
        accel.relu_mlp(x, params, None)
    with pytest.raises(ValueError, match="params must alternate"):
        accel.relu_mlp(x, params[:1], lambda *args: None)


def test_accel_imports_nothing_from_the_package():
    """The networks and algorithms call accel with tensors; never the reverse."""
    lines = pathlib.Path(accel.__file__).read_text().splitlines()
    imports = [line for line in lines if line.lstrip().startswith(("import", "from"))]
    assert imports and not [line for line in imports if "alf_entropy" in line]


@needs_accel
def test_sample_with_log_prob_is_sample_and_log_prob_of_forward():
    net = ActorDistributionNetwork(OBS, DISCRETE, fc_layer_params=(8, 8), activation="relu")
    obs = torch.randn(6, 4)
    for grad_mode in (torch.no_grad, torch.inference_mode):
        with grad_mode():
            torch.manual_seed(3)
            dist = net(obs)
            action = dist.sample()
            log_prob = dist.log_prob(action)
            torch.manual_seed(3)
            fast_action, fast_log_prob = net.sample_with_log_prob(obs)
        assert torch.equal(fast_action, action)
        torch.testing.assert_close(fast_log_prob, log_prob)


@needs_accel
def test_sample_with_log_prob_declines_what_it_does_not_cover():
    discrete = ActorDistributionNetwork(OBS, DISCRETE)

    def draw(net, obs):
        return net.sample_with_log_prob(obs)

    assert draw(discrete, torch.randn(3, 4)) is not None
    assert draw(ActorDistributionNetwork(OBS, BOX), torch.randn(3, 4)) is None
    assert draw(ActorDistributionNetwork(OBS, {"a": DISCRETE}), torch.randn(3, 4)) is None
    multi = ActorDistributionNetwork(OBS, BoundedTensorSpec((2,), torch.int64, 0, 2))
    assert draw(multi, torch.randn(3, 4)) is None
    assert draw(discrete, torch.randn(3, 5)) is None
    assert draw(discrete, torch.randn(3, 4, dtype=torch.float64)) is None
    handle = discrete._encoder.layers[0].register_forward_hook(lambda *args: None)
    assert draw(discrete, torch.randn(3, 4)) is None  # a hook must run
    handle.remove()
    assert draw(discrete, torch.randn(3, 4)) is not None

    class Shifted(ActorDistributionNetwork):
        def forward(self, observation):
            return super().forward(observation + 1.0)

    assert draw(Shifted(OBS, DISCRETE), torch.randn(3, 4)) is None


@pytest.mark.skipif(accel.ENABLED, reason="needs ALF_ENTROPY_ACCEL=0")
def test_switched_off_fast_paths_decline():
    assert accel.categorical_sample_with_log_prob(torch.zeros(2, 3), sample_categorical) is None
    net = ActorDistributionNetwork(OBS, DISCRETE)
    assert net.sample_with_log_prob(torch.randn(3, 4)) is None
    assert net.log_prob_and_entropy(torch.randn(3, 4), torch.zeros(3, dtype=torch.long)) is None


def test_categorical_log_prob_and_entropy_are_the_distributions_bits():
    logits = torch.randn(64, 3) * 4
    logits[0, 1] = -float("inf")  # a masked action: torch's clamp keeps the entropy finite
    action = torch.randint(0, 3, (64,))
    action[0] = 0
    dist = Categorical(logits)
    log_prob, entropy = categorical_log_prob_and_entropy(logits, action)
    assert torch.equal(log_prob, dist.log_prob(action))
    assert torch.equal(entropy, dist.entropy())


@needs_accel
def test_log_prob_and_entropy_are_forwards_with_their_gradients():
    net = ActorDistributionNetwork(OBS, DISCRETE, fc_layer_params=(8, 8))
    obs, action = torch.randn(16, 4), torch.randint(0, 3, (16,))
    dist = net(obs)
    slow = (dist.log_prob(action), dist.entropy())
    fast = net.log_prob_and_entropy(obs, action)
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)
        grads = [
            torch.autograd.grad(x.sum(), list(net.parameters()), retain_graph=True) for x in (a, b)
        ]
        assert all(torch.equal(g, h) for g, h in zip(*grads))
    assert net.log_prob_and_entropy(obs, action[:3]) is None  # not one action a row
    handle = net._heads[0].register_forward_hook(lambda *args: None)
    assert net.log_prob_and_entropy(obs, action) is None  # a hook must run
    handle.remove()
    assert ActorDistributionNetwork(OBS, BOX).log_prob_and_entropy(obs, action) is None


def _adam_pair(**kwargs):
    from alf_entropy.utils.optimizers import FusedAdam

    torch.manual_seed(0)
    shapes = [(8, 4), (8,), (3, 8), (3,)]
    params = [[nn.Parameter(torch.randn(s)) for s in shapes] for _ in range(2)]
    for a, b in zip(*params):
        b.data.copy_(a.data)
    return [(ps, FusedAdam(ps, **kwargs)) for ps in params]


def _steps(pairs, n, first=0):
    """``n`` steps of both with the same gradients: the first through torch's ``Adam.step``
    (around ``FusedAdam.step`` and its fast path), the second through ``FusedAdam.step``."""
    plain, fast = pairs
    for i in range(first, first + n):
        for params, _ in pairs:
            torch.manual_seed(i)
            for p in params:
                p.grad = torch.randn(p.shape)
        torch.optim.Adam.step(plain[1])
        fast[1].step()


def _same(pairs):
    (pa, oa), (pb, ob) = pairs
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))
    for a, b in zip(pa, pb):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(oa.state[a][key], ob.state[b][key])


@needs_accel
def test_fused_adam_step_is_torchs_step_bit_for_bit():
    pairs = _adam_pair(lr=1e-2, eps=1e-5, weight_decay=0.1)
    _steps(pairs, 5)
    _same(pairs)
    fast = pairs[1][1]
    assert "_accel_adam" in fast.__dict__  # it took the fast path after the first step
    for _, opt in pairs:  # a checkpoint loaded: the lists are gathered again
        opt.load_state_dict(opt.state_dict())
    _steps(pairs, 3, first=5)
    _same(pairs)
    extra = [nn.Parameter(torch.ones(2)) for _ in range(2)]
    for (params, opt), p in zip(pairs, extra):  # a new group: stepped too
        opt.add_param_group({"params": [p]})
        params.append(p)
    _steps(pairs, 3, first=8)
    _same(pairs)
    assert len(fast._accel_adam[2]) == 2


@needs_accel
def test_fused_adam_step_leaves_the_rest_to_torch(monkeypatch):
    (params, opt), _ = _adam_pair(lr=1e-2)
    for p in params:
        p.grad = torch.ones_like(p)
    assert not accel.fused_adam_step(opt)  # no state yet: torch's first step makes it
    opt.step()
    assert accel.fused_adam_step(opt)
    params[0].grad = None  # torch skips it, and so must the step
    assert not accel.fused_adam_step(opt)
    params[0].grad = torch.ones_like(params[0])
    opt.found_inf = torch.zeros(())
    assert not accel.fused_adam_step(opt)
    del opt.found_inf
    opt.param_groups[0]["maximize"] = True
    assert not accel.fused_adam_step(opt)
    opt.param_groups[0]["maximize"] = False
    before = [p.detach().clone() for p in params]
    monkeypatch.setattr(accel, "ENABLED", False)
    assert not accel.fused_adam_step(opt)
    assert all(torch.equal(a, b) for a, b in zip(before, params))


@needs_accel
def test_unwrapped_step_only_where_nothing_watches_the_step(monkeypatch):
    from alf_entropy.utils.optimizers import masked_optimizer_step

    (params, opt), (params_b, opt_b) = _adam_pair(lr=1e-2)
    for ps in (params, params_b):
        for p in ps:
            p.grad = torch.ones_like(p)
    assert accel.unwrapped_step(opt)  # torch's first step, without its wrapper
    opt_b.step()
    assert all(torch.equal(a, b) for a, b in zip(params, params_b))
    calls = []
    handle = opt.register_step_pre_hook(lambda *args: calls.append("pre"))
    assert not accel.unwrapped_step(opt)
    masked_optimizer_step([opt], torch.ones((), dtype=torch.bool), sync_free=False)
    assert calls == ["pre"]  # the hook ran: the step went through torch's wrapper
    handle.remove()
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(lambda *args: None)
    try:
        assert not accel.unwrapped_step(opt)
    finally:
        handle.remove()
    with torch.profiler.profile():
        assert not accel.unwrapped_step(opt)  # a profile keeps its "Optimizer.step" range
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # wraps opt.step to count it
    assert not accel.unwrapped_step(opt)
    masked_optimizer_step([opt], torch.ones((), dtype=torch.bool), sync_free=False)
    assert opt._opt_called
    scheduler.step()
    monkeypatch.setattr(accel, "ENABLED", False)
    assert not accel.unwrapped_step(opt)
