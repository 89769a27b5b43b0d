"""SAC Pendulum for ``batched_agents.py --processes --algorithm sac`` (see its docstring).

``sac_pendulum.gin``'s SAC with ``hidden`` x ``hidden`` networks: a whole training
process (:func:`train_sac`, one agent or K), and where one env step's time goes
per agent, one single agent against K stacked (:func:`sac_parts`), and the update's
arithmetic against this core's matrix-product peak (:func:`update_ceiling`).
"""

import functools
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch.utils.flop_counter import FlopCounterMode

from alf_entropy.environments.agent_envs import AgentEnvs
from alf_entropy.trainers.ranks import seed_all
from alf_entropy.utils import nest

MATRIX_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def sac_ctor(hidden: int) -> Callable[..., Any]:
    """``sac_pendulum.gin``'s SAC (SAC's temperature rule, alpha from 1, target -1) with
    ``hidden`` x ``hidden`` ReLU actor and critics."""
    from alf_entropy.algorithms.sac_algorithm import SacAlgorithm
    from alf_entropy.controllers import SGDEntropyTargetAlgorithm
    from alf_entropy.networks import ActorDistributionNetwork
    from alf_entropy.networks.critic_networks import CriticNetworks

    return functools.partial(
        SacAlgorithm,
        actor_network_ctor=functools.partial(
            ActorDistributionNetwork,
            fc_layer_params=(hidden, hidden),
            activation="relu",
            squash_to_spec=True,
            state_dependent_std=True,
        ),
        critic_network_ctor=functools.partial(CriticNetworks, fc_layer_params=(hidden, hidden)),
        entropy_target_cls=functools.partial(
            SGDEntropyTargetAlgorithm, initial_alpha=1.0, target_entropy=-1.0
        ),
    )


def train_sac(root_dir: str, iterations: int, hidden: int, **common: Any) -> None:
    """One whole SAC Pendulum run of ``iterations`` env steps per agent (the first 5 %
    random, as the config's 1,000 of 20,000); ``common``: ``OffPolicyTrainer``'s other
    arguments (``seed`` or ``seeds``, ...)."""
    from alf_entropy.trainers.off_policy_trainer import OffPolicyTrainer

    OffPolicyTrainer(
        root_dir,
        env_id="Pendulum-v1",
        num_envs=1,
        algorithm_ctor=sac_ctor(hidden),
        initial_collect_steps=iterations // 20,
        replay_buffer_length=max(iterations, 256),
        mini_batch_size=256,
        summary_interval=1000,
        **common,
    ).train()


def sac_parts(
    k: int,
    hidden: int,
    best_interleaved: Callable[..., Dict[str, float]],
    repeats: int = 3,
    budget: Optional[Tuple[float, float, int]] = None,
) -> None:
    """Where a SAC env step's time goes: one single agent against K stacked, per agent
    (``best_interleaved``: ``batched_agents``' timer); ``budget``: see
    :func:`update_ceiling`."""
    from alf_entropy.algorithms.many_sac_agents import ManySacAgents
    from alf_entropy.data_structures import TimeStep
    from alf_entropy.utils.replay_buffer import ReplayBuffer, Transition

    ctor, seeds = sac_ctor(hidden), list(range(k))
    envs = AgentEnvs("Pendulum-v1", 1, seeds)
    seed_all(0)
    single, batch = (
        ctor(envs.observation_spec, envs.action_spec),
        ManySacAgents(envs.observation_spec, envs.action_spec, seeds, algorithm_ctor=ctor),
    )
    gens = batch.generators
    obs = envs.reset().observation  # [K, 1, 3]
    rows = Transition(
        observation=obs,
        action=torch.zeros(k, 1, 1),
        reward=torch.zeros(k, 1),
        discount=torch.ones(k, 1),
        next_observation=obs,
        valid=torch.ones(k, 1, dtype=torch.bool),
    )
    one, many = ReplayBuffer(2000), ReplayBuffer(2000)
    for _ in range(1000):
        one.add(nest.map_structure(lambda x: x[0], rows))
        many.add(nest.map_structure(lambda x: x.transpose(0, 1), rows))
    sample_one, sample_many = one.sample(256), many.sample_members(256, gens)
    action = torch.zeros(k, 1, 1)

    def act_one() -> None:
        with torch.no_grad():
            single.rollout_step(TimeStep(observation=obs[0]))

    def act_many() -> None:
        with torch.no_grad():
            batch.rollout_step(TimeStep(observation=obs))

    parts = {
        "act": (act_one, act_many),
        "env step": (lambda: envs.envs[0].step(action[0]), lambda: envs.step(action)),
        "replay add + sample": (
            lambda: (one.add(nest.map_structure(lambda x: x[0], rows)), one.sample(256)),
            lambda: (
                many.add(nest.map_structure(lambda x: x.transpose(0, 1), rows)),
                many.sample_members(256, gens),
            ),
        ),
        "update": (lambda: single.train_step(sample_one), lambda: batch.train_step(sample_many)),
    }
    print(
        f"\nOne env step of SAC ({hidden}x{hidden}) in one process, per agent: one single "
        f"agent against {k} stacked (best of {repeats} interleaved rounds):\n"
    )
    print("| part | single us | stacked us per agent | single / stacked |")
    print("|---|---|---|---|")
    total = [0.0, 0.0]
    for name, (fn_one, fn_many) in parts.items():
        inner = 10 if name == "update" else 200
        t = best_interleaved({"one": fn_one, "many": fn_many}, repeats, inner)
        t1, tk = t["one"] * 1e6, t["many"] * 1e6 / k
        total = [total[0] + t1, total[1] + tk]
        print(f"| {name} | {t1:.0f} | {tk:.0f} | {t1 / tk:.2f} |")
    print(f"| all | {total[0]:.0f} | {total[1]:.0f} | {total[0] / total[1]:.2f} |")
    update_ceiling(k, parts["update"], best_interleaved, repeats, budget)


def update_ceiling(
    k: int,
    updates: Any,
    best_interleaved: Callable[..., Dict[str, float]],
    repeats: int,
    budget: Optional[Tuple[float, float, int]] = None,
) -> None:
    """The update's floating-point work (``FlopCounterMode``) and rate, single and stacked,
    against the best rate of one ``torch.mm`` on this core: no layout of the same products
    can run faster than that, so it bounds what stacking can save per agent.  Also the
    time of the update's matrix products alone (``torch.profiler``), and, given
    ``budget = (goal, seconds, iterations)`` (the K-agent process ran ``seconds`` longer
    than ``goal`` x one run allows, over ``iterations`` updates per agent), the update
    time per agent that the goal needs."""
    flops, products, kernels = [], [], []
    for fn in updates:
        with FlopCounterMode(display=False) as counter:
            fn()
        flops.append(counter.get_total_flops())
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                fn()
        events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
        products.append(
            sum(e.self_cpu_time_total for e in events if e.key in MATRIX_PRODUCTS) / 5e6
        )
        kernels.append(sum(e.self_cpu_time_total for e in events) / 5e6)
    t = best_interleaved({"one": updates[0], "many": updates[1]}, repeats, 10)
    peak = 0.0
    for n in (256, 512, 1024):
        a, b = torch.randn(n, n), torch.randn(n, n)
        inner = max(3, 10**9 // n**3)
        peak = max(peak, 2 * n**3 / best_interleaved({"mm": lambda: a @ b}, repeats, inner)["mm"])
    one, many = flops[0] / t["one"], flops[1] / t["many"]
    at_peak = flops[1] / k / peak
    print(
        f"\nThe update's arithmetic: {flops[0] / 1e9:.3f} GFLOP per agent "
        f"({flops[1] / k / 1e9:.3f} stacked); single {one / 1e9:.1f} GFLOP/s, stacked "
        f"{many / 1e9:.1f} GFLOP/s; this core's best torch.mm rate {peak / 1e9:.1f} GFLOP/s "
        f"(256-1024 square). At that rate, with every other operation free, an update "
        f"would take {at_peak * 1e3:.2f} ms per agent: at most "
        f"{t['one'] / at_peak:.2f}x the single agent's {t['one'] * 1e3:.2f} ms."
    )
    print(
        f"Its matrix products alone (torch.profiler, self time of {', '.join(MATRIX_PRODUCTS)})"
        f": single {products[0] * 1e3:.2f} ms ({products[0] / t['one']:.0%} of its update), "
        f"stacked {products[1] / k * 1e3:.2f} ms per agent "
        f"({products[1] / t['many']:.0%} of its update). All its aten operators (their self "
        f"time: the arithmetic, no Python): single {kernels[0] * 1e3:.2f} ms, stacked "
        f"{kernels[1] / k * 1e3:.2f} ms per agent."
    )
    if budget is not None and budget[1] <= 0:
        print(f"The {k}-agent process reached {budget[0]:g}x one run.")
    elif budget is not None:
        goal, over_s, iterations = budget
        need = t["many"] / k - over_s / (k * iterations)
        print(
            f"For {goal:g}x one run, the {k}-agent process would have had to be {over_s:.1f} s "
            f"shorter: a stacked update of at most {need * 1e3:.2f} ms per agent, "
            f"{need / (products[1] / k):.2f}x the time of its matrix products alone, "
            f"{need / (kernels[1] / k):.2f}x that of all its operators."
        )
