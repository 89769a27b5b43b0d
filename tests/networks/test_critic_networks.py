"""CriticNetworks: equal to separate nn.Linear stacks; detached weights; specs."""

import pytest
import torch
import torch.nn.functional as F

from alf_entropy import accel
from alf_entropy.networks import CriticNetworks
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec

OBS = TensorSpec((3,))
BOX = BoundedTensorSpec((2,), torch.float32, -1.0, 1.0)
DISCRETE = BoundedTensorSpec((), torch.int64, 0, 3)


def _reference(net, k, x, detach=False):
    """Critic ``k`` computed as a plain stack of linear layers (plain autograd)."""
    n = len(net.weights)
    for i in range(n):
        w, b = net.weights[i][k], net.biases[i][k, 0]
        if detach:
            w, b = w.detach(), b.detach()
        x = F.linear(x, w.t(), b)
        if i < n - 1:
            x = torch.relu(x)
    return x


def test_continuous_critics_equal_separate_linear_stacks():
    torch.manual_seed(0)
    net = CriticNetworks(OBS, BOX, fc_layer_params=(8, 5), num_critics=3)
    obs, act = torch.randn(4, 3), torch.rand(4, 2)
    q = net(obs, act)
    assert q.shape == (3, 4)
    x = torch.cat([obs, act], -1)
    for k in range(3):
        torch.testing.assert_close(q[k], _reference(net, k, x).squeeze(-1))
    # independently initialised critics differ
    assert not torch.allclose(q[0], q[1])


def test_discrete_critics_give_one_value_per_action():
    net = CriticNetworks(OBS, DISCRETE, fc_layer_params=(8,))
    obs = torch.randn(5, 3)
    q = net(obs)
    assert q.shape == (2, 5, 4)
    for k in range(2):
        torch.testing.assert_close(q[k], _reference(net, k, obs))


def test_detached_weights_send_gradients_to_the_inputs_only():
    net = CriticNetworks(OBS, BOX, fc_layer_params=(8,))
    act = torch.rand(4, 2, requires_grad=True)
    net(torch.randn(4, 3), act, detach_params=True).sum().backward()
    assert act.grad is not None and act.grad.abs().sum() > 0
    assert all(p.grad is None for p in net.parameters())
    net(torch.randn(4, 3), act).sum().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_bad_specs():
    with pytest.raises(TypeError, match="single BoundedTensorSpec"):
        CriticNetworks(OBS, {"a": BOX})
    with pytest.raises(ValueError, match="scalar"):
        CriticNetworks(OBS, BoundedTensorSpec((2,), torch.int64, 0, 3))
    with pytest.raises(ValueError, match="num_critics"):
        CriticNetworks(OBS, BOX, num_critics=0)
    with pytest.raises(ValueError, match="fc_layer_params"):
        CriticNetworks(OBS, BOX, fc_layer_params=(0,))


def _autograd_reference(net, obs, act, detach):
    """All critics through plain ops (autograd's own backward)."""
    x = obs if act is None else torch.cat([obs, act], -1)
    q = torch.stack([_reference(net, k, x, detach) for k in range(net.num_critics)])
    return q if act is None else q.squeeze(-1)


@pytest.mark.parametrize("spec", [BOX, DISCRETE], ids=["continuous", "discrete"])
@pytest.mark.parametrize("layers", [(), (7,), (6, 5, 4)])
@pytest.mark.parametrize("detach", [False, True])
def test_hand_written_backward_equals_autograd(spec, layers, detach):
    """The ReLU critics' fused backward gives autograd's gradients (float64)."""
    torch.manual_seed(1)
    net = CriticNetworks(OBS, spec, fc_layer_params=layers, num_critics=3).double()
    obs = torch.randn(9, 3, dtype=torch.float64, requires_grad=True)
    act = torch.rand(9, 2, dtype=torch.float64, requires_grad=True) if spec is BOX else None
    weight = torch.randn(3, 9, *(() if spec is BOX else (4,)), dtype=torch.float64)
    inputs = [obs] + ([act] if act is not None else []) + ([] if detach else list(net.parameters()))

    q = net(obs, act, detach_params=detach)
    got = torch.autograd.grad((q * weight).sum(), inputs)
    ref_q = _autograd_reference(net, obs, act, detach)
    want = torch.autograd.grad((ref_q * weight).sum(), inputs)
    torch.testing.assert_close(q, ref_q)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert any(g.abs().sum() > 0 for g in got)


def test_inputs_without_grad_and_no_grad_mode():
    """No input gradient is computed when none is needed; no_grad gives the same values."""
    net = CriticNetworks(OBS, BOX, fc_layer_params=(8,))
    obs, act = torch.randn(4, 3), torch.rand(4, 2)
    q = net(obs, act)
    q.sum().backward()
    assert q.requires_grad and all(p.grad is not None for p in net.parameters())
    with torch.no_grad():
        torch.testing.assert_close(net(obs, act), q.detach())


def test_other_activations_use_autograd():
    """A non-ReLU critic still gets correct gradients (plain autograd path)."""
    torch.manual_seed(2)
    net = CriticNetworks(OBS, BOX, fc_layer_params=(5,), activation="tanh").double()
    obs, act = torch.randn(6, 3, dtype=torch.float64), torch.rand(6, 2, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a: net(obs, a), (act.requires_grad_(),))


def test_double_backward_is_refused_clearly_or_done_by_autograd():
    """A gradient penalty never silently loses its graph."""
    torch.manual_seed(3)
    obs, act = torch.randn(4, 3), torch.rand(4, 2, requires_grad=True)
    net = CriticNetworks(OBS, BOX, fc_layer_params=(8,))
    if accel.ENABLED:  # ALF_ENTROPY_ACCEL=0: autograd does it
        with pytest.raises(RuntimeError, match="fused_backward=False"):
            torch.autograd.grad(net(obs, act).sum(), act, create_graph=True)
    plain = CriticNetworks(OBS, BOX, fc_layer_params=(8,), fused_backward=False)
    (g,) = torch.autograd.grad(plain(obs, act).sum(), act, create_graph=True)
    g.square().sum().backward()
    assert plain.weights[0].grad is not None and plain.weights[0].grad.abs().sum() > 0


def test_torch_func_transforms_work():
    """``torch.func.grad``/``vmap`` (ensembles, meta-gradients) get plain ops
    and the same values as autograd through the ordinary call."""
    torch.manual_seed(4)
    net = CriticNetworks(OBS, BOX, fc_layer_params=(8, 5))
    obs, act = torch.randn(6, 3), torch.rand(6, 2)
    params = dict(net.named_parameters())

    def total_q(p, a):
        return torch.func.functional_call(net, p, (obs, a)).sum()

    grads = torch.func.grad(total_q)(params, act)
    total_q(params, act).backward()  # the hand-written backward
    for name, p in net.named_parameters():
        torch.testing.assert_close(grads[name], p.grad)
    per_row = torch.func.vmap(lambda o, a: net(o[None], a[None])[:, 0])(obs, act)
    torch.testing.assert_close(per_row, net(obs, act).t())


def test_autocast_gets_autograds_values():
    """Under autocast (mixed dtypes) the critics run plain ops: the same
    values and gradients as ``fused_backward=False``."""
    torch.manual_seed(5)
    net = CriticNetworks(OBS, BOX, fc_layer_params=(16, 16))
    plain = CriticNetworks(OBS, BOX, fc_layer_params=(16, 16), fused_backward=False)
    plain.load_state_dict(net.state_dict())
    obs, act = torch.randn(8, 3), torch.rand(8, 2)
    results = []
    for m in (net, plain):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q = m(obs, act)
        q.float().sum().backward()
        results.append((q, [p.grad for p in m.parameters()]))
    (q, grads), (q_ref, grads_ref) = results
    assert q.dtype == torch.bfloat16
    torch.testing.assert_close(q, q_ref, rtol=0, atol=0)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=0, atol=0)


def test_min_over_detached_critics_gives_autograds_gradient():
    """SAC's actor loss: min over critics, so each row's gradient reaches one
    critic (zero rows in the incoming gradient); the result equals autograd's."""
    torch.manual_seed(0)  # a seed where each critic is the minimum for some rows
    net = CriticNetworks(OBS, BOX, fc_layer_params=(6, 5), num_critics=2).double()
    obs = torch.randn(11, 3, dtype=torch.float64)
    act = torch.rand(11, 2, dtype=torch.float64, requires_grad=True)
    q = net(obs, act, detach_params=True)
    weight = torch.randn(11, dtype=torch.float64)
    (got,) = torch.autograd.grad((q.min(dim=0).values * weight).sum(), act)
    ref = _autograd_reference(net, obs, act, detach=True)
    (want,) = torch.autograd.grad((ref.min(dim=0).values * weight).sum(), act)
    picked = q.argmin(dim=0)
    assert 0 < int(picked.sum()) < 11  # both critics are the minimum somewhere
    torch.testing.assert_close(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("detach", [False, True])
def test_hand_written_backward_on_cuda_equals_autograd(detach):
    """The same on a GPU."""
    torch.manual_seed(5)
    net = CriticNetworks(OBS, BOX, fc_layer_params=(16, 8)).double().cuda()
    obs = torch.randn(12, 3, dtype=torch.float64, device="cuda")
    act = torch.rand(12, 2, dtype=torch.float64, device="cuda", requires_grad=True)
    inputs = [act] + ([] if detach else list(net.parameters()))
    got = torch.autograd.grad(net(obs, act, detach_params=detach).min(0).values.sum(), inputs)
    ref = _autograd_reference(net, obs, act, detach).min(0).values.sum()
    for g, w in zip(got, torch.autograd.grad(ref, inputs)):
        torch.testing.assert_close(g, w)
