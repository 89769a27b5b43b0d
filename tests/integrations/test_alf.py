"""The controllers in real ALF (docs/alf.md), no mocks: ALF's own entropy-target unit test with
the integration's classes, ALF's ``Agent`` building each class, ALF's trainer beside ALF's own
class (A2C from docs/alf.md's gin file, PPO from its Python conf), resume and checkpoint
migration through ALF's ``Checkpointer``, and ALF's gin and config names as without the package.

ALF is not on the package registry: these run in the environment that
``../shared/clients/alf/make_env.sh`` builds (``.ci/run`` does), and skip elsewhere. ALF's
trainer runs in subprocesses, as a user runs it, each under its own ``root_dir``, all started
once (``runs``) and shared by the tests, three at a time.
"""

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import unittest
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "alf.algorithms.entropy_target_algorithm",
    reason="ALF is not installed "
    "(.ci/run builds its environment with ../shared/clients/alf/make_env.sh)",
)

import alf  # noqa: E402
import torch  # noqa: E402
from alf.algorithms import entropy_target_algorithm_test  # noqa: E402
from alf.algorithms.actor_critic_algorithm import ActorCriticAlgorithm  # noqa: E402
from alf.algorithms.agent import Agent  # noqa: E402
from alf.algorithms.entropy_target_algorithm import (  # noqa: E402
    EntropyTargetAlgorithm,
    NestedEntropyTargetAlgorithm,
)
from alf.data_structures import StepType  # noqa: E402
from alf.networks import ActorDistributionNetwork, ValueNetwork  # noqa: E402
from alf.tensor_specs import BoundedTensorSpec, TensorSpec  # noqa: E402
from alf.utils.checkpoint_utils import Checkpointer  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

from alf_entropy.integrations import alf as alf_integration  # noqa: E402

# ALF's own: its checkpoints hold numpy objects (its environment loads them with weights_only
# off), and its projection networks take int() of a 1-element array (NumPy 1.25 deprecates it).
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD:UserWarning"
    ),
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "alf.md").read_text(encoding="utf-8")
EXAMPLES = Path(alf.__file__).parent / "examples"
GIN_BLOCKS = re.findall(r"```gin\n(.*?)```", DOC, re.S)
CONF = re.findall(r"```python\n(.*?)```", DOC, re.S)[0]
A2C, PID = GIN_BLOCKS[0], GIN_BLOCKS[1]
# Only what a test needs: one seed, no evaluation, every summary step, the debug summaries.
RUN_GIN = (
    "TrainerConfig.random_seed = 1\nTrainerConfig.evaluate = False\n"
    "TrainerConfig.debug_summaries = True\nTrainerConfig.summary_interval = 1\n"
)
RUN_CONF = (
    "alf.config('TrainerConfig', random_seed=1, evaluate=False, debug_summaries=True, "
    "summary_interval=1)\n"
    # ppo_cart_pole_conf.py spawns its environments' processes (30 s on 2 cores)
    "alf.config('FastParallelEnvironment', start_method='fork')\n"
)
# The PID's run learns faster than ac_cart_pole.gin's (lr 1e-3), so that the entropy reaches
# the target within the run and the controller has to hold it there.
PID_GIN = (
    "".join(line for line in A2C.splitlines(keepends=True) if "AlfEntropyTarget" not in line)
    + PID
    + "ac/Adam.lr = 5e-3\n"
)
STAGED = "EntropyTargetAlgorithm/"
ENV = dict(
    os.environ,
    OMP_NUM_THREADS="1",  # this tree, before any installed copy
    PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
)
CLASSES = [getattr(alf_integration, name) for name in alf_integration.__all__]


def as_alfs(config: str) -> str:
    """``config`` with ALF's own class: the two names docs/alf.md says differ."""
    return config.replace(
        "alf_entropy.integrations.alf", "alf.algorithms.entropy_target_algorithm"
    ).replace("AlfEntropyTargetAlgorithm", "EntropyTargetAlgorithm")


def train(root: Path, config: str, iterations: int) -> Path:
    """ALF's trainer on ``config`` (a gin file's text, or a conf's if it imports alf)."""
    conf = config.startswith("import alf\n")
    path = root.parent / f"{root.name}-{iterations}.{'py' if conf else 'gin'}"
    path.write_text(
        config
        + (
            RUN_CONF + f"alf.config('TrainerConfig', num_iterations={iterations})\n"
            if conf
            else RUN_GIN + f"TrainerConfig.num_iterations = {iterations}\n"
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "alf.bin.train",
            "--nostore_snapshot",
            f"--root_dir={root}",
            f"--{'conf' if conf else 'gin_file'}={path}",
        ],
        cwd=EXAMPLES,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def names(mode: str) -> dict:
    """How ALF resolves its gin files' selectors and config names (``alf_names.py``)."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("alf_names.py")), mode],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def resumed(tmp: Path, config: str, name: str) -> dict:
    """Stopped at 100 iterations, resumed to 150 from the same ``root_dir``; for ALF's class,
    its checkpoint at 100 resumed with ours too (``migrated``)."""
    train(tmp / name, config, 100)
    if name == "resume_ours":
        return {name: train(tmp / name, config, 150)}
    shutil.copytree(tmp / name, tmp / "migrated")
    return {name: train(tmp / name, config, 150), "migrated": train(tmp / "migrated", A2C, 150)}


def one(name: str, job: Any, *args: Any) -> dict:
    return {name: job(*args)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every trainer run and name check, three at a time (the longest chains first):
    ``{name: future of {name: result}}``."""
    tmp = tmp_path_factory.mktemp("alf_runs")
    jobs = [
        ("resume_alf migrated", resumed, tmp, as_alfs(A2C), "resume_alf"),
        ("resume_ours", resumed, tmp, A2C, "resume_ours"),
        ("pid", one, "pid", train, tmp / "pid", PID_GIN, 150),
        ("a2c_alf", one, "a2c_alf", train, tmp / "a2c_alf", as_alfs(A2C), 150),
        ("a2c_ours", one, "a2c_ours", train, tmp / "a2c_ours", A2C, 150),
        ("ppo_alf", one, "ppo_alf", train, tmp / "ppo_alf", as_alfs(CONF), 40),
        ("ppo_ours", one, "ppo_ours", train, tmp / "ppo_ours", CONF, 40),
    ] + [(f"names_{m}", one, f"names_{m}", names, m) for m in ("none", "package", "all")]
    pool = ThreadPoolExecutor(3)
    futures = {}
    for keys, *job in jobs:
        future = pool.submit(*job)
        futures.update(dict.fromkeys(keys.split(), future))
    yield futures
    pool.shutdown()


def result(runs: dict, name: str) -> Any:
    """What run ``name`` gave (a ``root_dir``, or ``names``'s answer); it waits for it."""
    return runs[name].result()[name]


def scalars(root: Path, tag: str) -> dict:
    """``{step: value}`` of one TensorBoard tag over every event file of the run."""
    events = EventAccumulator(str(root / "train"), size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def checkpoint(root: Path, step: int) -> dict:
    state = torch.load(root / "train" / "algorithm" / f"ckpt-{step}", weights_only=False)
    prefix = "_entropy_target_algorithm."
    return {k[len(prefix) :]: v for k, v in state["algorithm"].items() if k.startswith(prefix)}


def test_alfs_own_unit_test_passes_with_the_integrations_classes(monkeypatch):
    built = []

    def counted(cls: type) -> type:
        def build(*args, **kwargs):
            built.append(cls)
            return cls(*args, **kwargs)

        return build

    for name in ("EntropyTargetAlgorithm", "NestedEntropyTargetAlgorithm"):
        monkeypatch.setattr(
            entropy_target_algorithm_test, name, counted(getattr(alf_integration, "Alf" + name))
        )
    suite = unittest.defaultTestLoader.loadTestsFromModule(entropy_target_algorithm_test)
    result = unittest.TestResult()
    suite.run(result)
    assert (result.testsRun, result.failures, result.errors) == (5, [], [])
    assert sorted(c.__name__ for c in built) == ["AlfEntropyTargetAlgorithm"] * 4 + [
        "AlfNestedEntropyTargetAlgorithm"
    ]


def _agent(cls: type) -> Agent:
    action = BoundedTensorSpec((), dtype="int64", minimum=0, maximum=1)
    if cls is alf_integration.AlfNestedEntropyTargetAlgorithm:
        action = dict(a=action, b=BoundedTensorSpec((), dtype="int64", minimum=0, maximum=2))
    return Agent(
        observation_spec=TensorSpec((4,)),
        action_spec=action,
        reward_spec=TensorSpec(()),
        rl_algorithm_cls=functools.partial(
            ActorCriticAlgorithm,
            actor_network_ctor=ActorDistributionNetwork,
            value_network_ctor=ValueNetwork,
        ),
        entropy_target_cls=cls,
        optimizer=alf.optimizers.Adam(lr=1e-3),
    )


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_alfs_agent_builds_each_class_and_checkpoints_its_state(cls, tmp_path):
    agent = _agent(cls)
    controller = agent._entropy_target_algorithm
    assert type(controller) is cls and controller.on_policy is True  # A2C trains on-policy
    logits = torch.randn(5, 4, 2)
    distribution = torch.distributions.Categorical(logits=logits)
    if cls is alf_integration.AlfNestedEntropyTargetAlgorithm:
        distribution = dict(
            a=distribution, b=torch.distributions.Categorical(logits=torch.randn(5, 4, 3))
        )
    step_type = torch.full((5, 4), int(StepType.MID))
    step_type[-1] = int(StepType.LAST)
    assert controller.predict_step((distribution, step_type), ()).info == ()
    info = controller.rollout_step((distribution, step_type), ()).info
    assert torch.equal(info.step_type, step_type)
    for _ in range(3):
        loss = controller.calc_loss(info)
    assert loss.loss.shape == (5, 4) and bool(torch.isfinite(loss.loss).all())
    if cls is not alf_integration.AlfNestedEntropyTargetAlgorithm:
        entropy = distribution.entropy()
        assert torch.allclose(loss.loss, -controller.alpha * entropy, rtol=1e-6)
    Checkpointer(str(tmp_path), algorithm=agent).save(3)
    restored = _agent(cls)
    Checkpointer(str(tmp_path), algorithm=restored).load(3)
    saved = controller.state_dict()
    assert saved.keys() == restored._entropy_target_algorithm.state_dict().keys()
    for key, value in restored._entropy_target_algorithm.state_dict().items():
        assert torch.equal(value, saved[key]), key
    off_policy = cls(agent._action_spec)
    off_policy.set_on_policy(False)  # ALF's off-policy parents: rollout_step does nothing
    assert off_policy.rollout_step((distribution, step_type)).info == ()


def test_a_checkpoint_of_alfs_nested_class_is_refused_not_half_loaded(tmp_path):
    spec = dict(a=BoundedTensorSpec((), dtype="int64", minimum=0, maximum=1))
    Checkpointer(
        str(tmp_path), alg=NestedEntropyTargetAlgorithm(spec, target_entropy=dict(a=None))
    ).save(1)
    ours = alf_integration.AlfNestedEntropyTargetAlgorithm(spec)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(RuntimeError, match="Missing key"):
        Checkpointer(str(tmp_path), alg=ours).load(1)
    assert all(torch.equal(v, before[k]) for k, v in ours.state_dict().items())


def test_alf_config_binds_the_integrations_classes_and_leaves_alfs_alone():
    spec = BoundedTensorSpec((), dtype="int64", minimum=0, maximum=1)
    alf.reset_configs()  # ALF refuses to configure what was built already (the tests above)
    try:
        alf.config("AlfPIDEntropyTargetAlgorithm", kp=0.5)
        alf.config("EntropyTargetAlgorithm", initial_alpha=0.5)
        assert alf_integration.AlfPIDEntropyTargetAlgorithm(spec).settings["kp"] == 0.5
        assert float(EntropyTargetAlgorithm(spec)._log_alpha.exp()) == pytest.approx(0.5)
        assert float(alf_integration.AlfEntropyTargetAlgorithm(spec).alpha) == pytest.approx(0.1)
    finally:
        alf.reset_configs()
    ours = [n for n in alf.get_all_config_names() if n.startswith("alf_entropy.")]
    assert "alf_entropy.integrations.alf.AlfPIDEntropyTargetAlgorithm.kp" in ours
    assert all(n.startswith("alf_entropy.integrations.alf.Alf") for n in ours)


@pytest.mark.slow
def test_a2c_from_the_docs_gin_file_gives_alfs_alpha_at_every_summary_step(runs):
    ours, alfs = result(runs, "a2c_ours"), result(runs, "a2c_alf")
    for tag in ("alpha", "stage", "avg_entropy", "update_rate"):
        assert scalars(ours, STAGED + tag) == scalars(alfs, STAGED + tag), tag  # bit for bit
    assert len(scalars(ours, STAGED + "alpha")) == 150
    stages = set(scalars(ours, STAGED + "stage").values())
    assert {-2, -1, 0, 1} <= stages  # init, free, adjust below and above the target: all ran
    # The summaries reach ALF's TensorBoard under ALF's scope: ALF's class's tags, and ours.
    events = EventAccumulator(str(alfs / "train"))
    events.Reload()
    alfs_tags = {t for t in events.Tags()["scalars"] if t.startswith(STAGED)}
    events = EventAccumulator(str(ours / "train"))
    events.Reload()
    assert {
        STAGED + t for t in ("alpha", "stage", "avg_entropy", "update_rate", "entropy_std")
    } <= alfs_tags
    assert alfs_tags | {STAGED + "nonfinite_entropy", STAGED + "unreachable_target"} == {
        t for t in events.Tags()["scalars"] if t.startswith(STAGED)
    }


@pytest.mark.slow
def test_ppo_from_the_docs_conf_gives_alfs_alpha_at_every_summary_step(runs):
    ours, alfs = result(runs, "ppo_ours"), result(runs, "ppo_alf")
    for tag in ("alpha", "stage", "update_rate"):
        assert scalars(ours, STAGED + tag) == scalars(alfs, STAGED + tag), tag  # bit for bit
    assert set(scalars(ours, STAGED + "stage").values()) == {0, 1}  # crossed the target


@pytest.mark.slow
def test_the_pid_holds_its_target_over_the_last_third(runs):
    root = result(runs, "pid")
    entropy = {s: -h for s, h in scalars(root, "loss/entropy_target.neg_entropy").items()}
    alpha = scalars(root, "PIDEntropyTargetAlgorithm/alpha")
    assert len(alpha) == 150
    last = [entropy[s] for s in sorted(entropy) if s > 100]
    target = 0.5
    assert abs(sum(last) / len(last) - target) <= 0.2 * target
    assert entropy[min(entropy)] > 1.2 * target  # it started above the band: it had to move


@pytest.mark.slow
def test_a_resumed_run_equals_alfs_resumed_run(runs):
    ours, alfs = result(runs, "resume_ours"), result(runs, "resume_alf")
    for tag in ("alpha", "stage", "update_rate", "avg_entropy"):
        a, b = scalars(ours, STAGED + tag), scalars(alfs, STAGED + tag)
        assert sorted(a) == list(range(1, 151))  # the second process went on from step 101
        assert a == b, tag
    final_ours, final_alfs = checkpoint(ours, 150), checkpoint(alfs, 150)
    assert torch.equal(final_ours["driver.log_alpha"], final_alfs["_log_alpha"])
    # ALF does not checkpoint its environments: a resumed run is not the uninterrupted one
    uninterrupted = scalars(result(runs, "a2c_alf"), STAGED + "alpha")
    assert scalars(alfs, STAGED + "alpha") != uninterrupted


@pytest.mark.slow
def test_alfs_checkpoint_resumes_with_ours_as_with_alfs_class(runs):
    migrated, alfs = result(runs, "migrated"), result(runs, "resume_alf")
    for tag in ("alpha", "stage", "update_rate", "avg_entropy"):
        a, b = scalars(migrated, STAGED + tag), scalars(alfs, STAGED + tag)
        assert {s: a[s] for s in a if s > 100} == {s: b[s] for s in b if s > 100}, tag
    ours, theirs = checkpoint(migrated, 150), checkpoint(alfs, 150)
    assert "_log_alpha" in checkpoint(migrated, 100)  # it started from ALF's checkpoint
    for alf_name, field in alf_integration.ALF_STAGED_STATE.items():
        assert torch.equal(
            ours["driver." + field].flatten().to(theirs[alf_name].dtype), theirs[alf_name].flatten()
        ), field


@pytest.mark.slow
def test_alfs_gin_files_resolve_as_without_the_package(runs):
    without, package, everything = (result(runs, f"names_{m}") for m in ("none", "package", "all"))
    assert len(package["imported"]) >= 80  # every module whose dependencies ALF's venv has
    assert {m for m in package["failed"] if m.startswith("alf_entropy")} <= {
        f"alf_entropy.integrations.{client}"
        for client in ("sb3", "tianshou", "torchrl", "toy_lm", "trl", "verl")
    }
    assert package["selectors"] == without["selectors"]
    assert package["parse"] == without["parse"]
    assert package["qualified"] == without["qualified"]  # ALF's own ambiguity ('load') only
    assert {k: package["alf_config"][k] for k in without["alf_config"]} == without["alf_config"]
    added = set(package["alf_config_names"]) - set(without["alf_config_names"])
    assert added and all(n.startswith("alf_entropy.integrations.alf.Alf") for n in added)
    # With the package's gin registration imported too, ALF's bare names clash; the qualified
    # names in docs/alf.md resolve to ALF's.
    qualified = everything["qualified"]
    for line in GIN_BLOCKS[2].splitlines():
        name = line.split("=")[0].strip().rsplit(".", 1)[0]
        assert qualified[name.rsplit(".", 1)[-1]] == {name: name}
