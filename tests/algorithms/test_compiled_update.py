"""``compile_update=True``: SAC's whole update (one agent or K) as one
``torch.compile(fullgraph=True)`` graph (a graph break raises), with no recompile over 50
updates, the tensors a CUDA graph holds kept in place, fewer operator calls than eager, and
the eager update's losses and parameters within float32 rounding.

Tolerances.  The equality tests train with Adam's ``eps = 1``: Adam's step
``lr * m / (sqrt(v) + eps)`` is scale-free while ``eps << sqrt(v)``, so a gradient element
that is itself rounding noise (a sum that cancels) gets a step of about ``lr`` whose sign is
that noise, and two correct float32 updates part by ``O(lr)`` there (measured with the
default ``eps``: one element 0.3 ``lr`` apart after 99 SAC updates, all others within an
ulp).  With ``eps = 1`` the step is linear in the gradient, so the two runs differ by
rounding only: each of ``T`` updates rounds each parameter once on each side (``2 T u``
relative, ``u = 2^-24``), and an element near 0 moves by steps computed at the scale of the
largest parameter (``2 T u max|p|`` absolute).  A loss is a mean over ``N`` rows of terms
from parameters that close: ``N u`` more.  The staged controller decides on comparisons
(``avg < prev_avg``) that one ulp of the entropy can flip, so these tests use SAC's gradient
rule and the PID, whose updates are continuous in the entropy.

Operator counts: ``TorchDispatchMode`` (``torch.utils._python_dispatch``) is private and
``torch.compile`` refuses to run under it, so both sides are counted with the public
``torch.profiler``: the ``aten::`` calls made by the code (the profiler's top-level
``aten::`` events, not the ops those call inside), the same counter for eager and compiled.
"""

import copy
import functools

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from alf_entropy.algorithms.many_sac_agents import ManySacAgents
from alf_entropy.algorithms.sac_algorithm import SacAlgorithm
from alf_entropy.controllers import SGDEntropyTargetAlgorithm
from alf_entropy.controllers.driver import Inputs, _compiled
from alf_entropy.networks import ActorDistributionNetwork
from alf_entropy.networks.critic_networks import CriticNetworks
from alf_entropy.tensor_specs import BoundedTensorSpec, TensorSpec
from alf_entropy.utils import nest
from alf_entropy.utils.optimizers import FusedAdam
from alf_entropy.utils.replay_buffer import Transition

BOX = BoundedTensorSpec((1,), torch.float32, -2.0, 2.0)
U = 2.0**-24
LINEAR_ADAM = functools.partial(FusedAdam, lr=1e-3, eps=1.0)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _sac(compile_update, device="cpu", **kwargs):
    torch.manual_seed(0)
    networks = dict(
        actor_network_ctor=lambda o, a: ActorDistributionNetwork(
            o,
            a,
            fc_layer_params=(32, 32),
            activation=torch.nn.ReLU,
            squash_to_spec=True,
            state_dependent_std=True,
        ),
        critic_network_ctor=lambda o, a: CriticNetworks(o, a, fc_layer_params=(32, 32)),
    )
    return SacAlgorithm(
        TensorSpec((3,)), BOX, compile_update=compile_update, **{**networks, **kwargs}
    ).to(device)


def _batch(i, n=64, members=(), device="cpu"):
    g = torch.Generator().manual_seed(i)
    shape = members + (n,)
    batch = Transition(
        observation=torch.randn(shape + (3,), generator=g),
        action=torch.rand(shape + (1,), generator=g) * 4 - 2,
        reward=torch.randn(shape, generator=g),
        discount=torch.ones(shape),
        next_observation=torch.randn(shape + (3,), generator=g),
        valid=torch.rand(shape, generator=g) > 0.1,
    )
    return nest.map_structure(lambda x: x.to(device), batch)


def _top_level_ops(fn):
    """The ``aten::`` operators ``fn`` calls (not those they call inside)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    count = 0
    for event in prof.events():
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        count += event.name.startswith("aten::") and parent is None
    return count


def _held(alg):
    """Every tensor a captured update reads or writes: parameters, buffers, optimiser
    state, the static batch."""
    tensors = list(alg.parameters()) + list(alg.buffers())
    for opt in alg.optimizers():
        tensors += [v for state in opt.state.values() for v in state.values()]
    return tensors + nest.flatten(alg._compiled._static)


def _assert_trains_alike(compiled, eager, updates, update, n):
    """``updates`` updates of each from one state, held to the module docstring's rounding."""
    for i in range(updates):
        loss_c, loss_e = update(compiled, i), update(eager, i)
        if i == 0:  # compiled once: from here on a recompile raises
            torch.compiler.set_stance("fail_on_recompile")
        rtol = 2 * (i + 1) * U
        torch.testing.assert_close(loss_c, loss_e, rtol=rtol + n * U, atol=0.0)
        scale = max(float(p.detach().abs().max()) for p in eager.parameters())
        for p_c, p_e in zip(compiled.parameters(), eager.parameters()):
            torch.testing.assert_close(p_c, p_e, rtol=rtol, atol=rtol * scale)
        torch.testing.assert_close(
            compiled.entropy_coefficient(), eager.entropy_coefficient(), rtol=rtol, atol=0.0
        )


@pytest.fixture(autouse=True)
def _fresh_compiler():
    torch.compiler.reset()
    yield
    torch.compiler.set_stance("default")


def test_bad_compile_update_settings_fail_at_construction():
    with pytest.raises(TypeError, match="compile_update needs Adam"):
        _sac(True, optimizer=functools.partial(torch.optim.SGD, lr=0.1))


@pytest.mark.slow
def test_sac_update_is_one_graph_without_recompile_in_place_and_with_fewer_ops():
    sac, eager = _sac(True), _sac(False)
    sac.train_step(_batch(0))
    torch.compiler.set_stance("fail_on_recompile")
    addresses = None
    for i in range(1, 50):
        batch = _batch(i)
        if i == 7:  # a non-finite loss: the update is skipped, no new graph
            batch = batch._replace(reward=batch.reward.clone().fill_(float("nan")))
        sac.train_step(batch)
        if i == 30:
            addresses = [t.data_ptr() for t in _held(sac)]
    assert [t.data_ptr() for t in _held(sac)] == addresses  # 20 updates, nothing moved
    assert int(sac.num_skipped_updates) == 1
    assert all(bool(torch.isfinite(p).all()) for p in sac.parameters())
    eager.train_step(_batch(0))
    ops = [_top_level_ops(lambda alg=alg: alg.train_step(_batch(50))) for alg in (sac, eager)]
    assert ops[0] <= ops[1], ops  # measured: 55 against 384 (the products are 38 of the 55)


@pytest.mark.slow
def test_the_compiled_controller_step_calls_at_most_two_operators():
    controller = SGDEntropyTargetAlgorithm(BOX, update_mode="compiled")
    for _ in range(2):
        controller.adjust_alpha(0.3)
    inputs = Inputs(torch.tensor(0.3), torch.tensor(1.0), torch.tensor(False))
    step = _compiled("cpu")
    ops = _top_level_ops(
        lambda: step(controller.driver, controller.rule, controller.consts, inputs)
    )
    assert ops <= 2, ops  # one fused kernel; the 2 are its guards' reads of CPU buffers


@pytest.mark.slow
def test_sac_compiled_trains_as_eager_over_100_updates():
    def update(alg, i):
        torch.manual_seed(1000 + i)  # the policy's draws: the same on both sides
        return alg.train_step(_batch(i)).info.loss

    _assert_trains_alike(
        _sac(True, optimizer=LINEAR_ADAM), _sac(False, optimizer=LINEAR_ADAM), 100, update, 64
    )


@pytest.mark.slow
def test_k_sac_agents_compiled_train_as_eager():
    def make(compile_update):
        ctor = functools.partial(_sac, compile_update, optimizer=LINEAR_ADAM)
        return ManySacAgents(
            TensorSpec((3,)), BOX, seeds=[1, 2], algorithm_ctor=lambda o, a, **kw: ctor(**kw)
        )

    def update(alg, i):
        return alg.train_step(_batch(i, members=(2,))).info.loss  # each agent's generator

    _assert_trains_alike(make(True), make(False), 30, update, 64)


@CUDA
@pytest.mark.slow
def test_sac_compile_update_on_cuda_replays_one_graph_and_captures_again_after_a_load():
    compiled, eager = (
        _sac(True, "cuda", optimizer=LINEAR_ADAM),
        _sac(False, "cuda", optimizer=LINEAR_ADAM),
    )

    def update(alg, i):
        torch.manual_seed(1000 + i)
        return alg.train_step(_batch(i, device="cuda")).info.loss

    _assert_trains_alike(compiled, eager, 10, update, 64)
    assert compiled._compiled._graph is not None  # captured after three compiled calls
    compiled.load_state_dict(eager.state_dict())
    compiled.optimizers()[0].load_state_dict(copy.deepcopy(eager.optimizers()[0].state_dict()))
    for i in range(10, 16):
        torch.testing.assert_close(update(compiled, i), update(eager, i), rtol=1e-4, atol=0.0)
    assert compiled._compiled._graph is not None  # captured again: the state moved
