"""Every gin configurable of the package, registered here and by no other module.

The package's gin files start with ``import alf_entropy.config.configurables`` (gin's own
``import``), and :func:`~alf_entropy.config.loading.parse_gin_config` imports it first, so
``gin.parse_config_file`` of a shipped config works as ``alf-entropy-train`` does.  Importing
any other module of the package registers nothing with gin: in an ALF process ALF's
``EntropyTargetAlgorithm``, ``LinearScheduler`` or ``calc_default_target_entropy`` stay the
only configurables of those names (gin resolves a bare name to every registered one).

Registering is what ``@gin.configurable`` on each definition would do: a class's ``__init__``
is wrapped in place, a base before its subclasses (whose wrappers call the base's); a
function is replaced by gin's wrapper in every module of the package that holds it.
Without the ``train`` extra (gymnasium<1.1, as CleanRL pins) the controllers, algorithms,
networks and schedulers are registered, the environments and trainers are not.
"""

import sys
import warnings
from typing import Any, Callable, Optional

import gin

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # gin touches deprecated torch classes
    import gin.torch.external_configurables  # noqa: F401  (``@torch.optim.Adam`` and the like)

from alf_entropy import controllers
from alf_entropy.algorithms import sac_algorithm, sac_networks
from alf_entropy.algorithms.actor_critic_algorithm import ActorCriticAlgorithm
from alf_entropy.algorithms.algorithm import Algorithm
from alf_entropy.algorithms.many_agents import ManyAgents
from alf_entropy.algorithms.many_sac_agents import ManySacAgents
from alf_entropy.algorithms.ppo_algorithm import PPOAlgorithm
from alf_entropy.config import CONFIG_DIR
from alf_entropy.networks import (
    ActorDistributionNetwork,
    CategoricalProjectionNetwork,
    CriticNetworks,
    EncodingNetwork,
    NormalProjectionNetwork,
    ValueNetwork,
)
from alf_entropy.networks.batched_adam import BatchedAdam
from alf_entropy.utils import dist_utils, optimizers, schedulers
from alf_entropy.utils.requirements import MissingDependencyError, require_train_extra

__all__ = ["CLASSES", "FUNCTIONS", "trainer_binding"]


CLASSES = [
    Algorithm,
    ActorCriticAlgorithm,
    PPOAlgorithm,
    sac_algorithm.SacAlgorithm,
    ManyAgents,
    ManySacAgents,
    optimizers.FusedAdam,
    BatchedAdam,
    EncodingNetwork,
    ActorDistributionNetwork,
    CategoricalProjectionNetwork,
    NormalProjectionNetwork,
    ValueNetwork,
    CriticNetworks,
    schedulers.ConstantScheduler,
    schedulers.SettledAnnealing,
    schedulers.StepScheduler,
    schedulers.LinearScheduler,
    schedulers.ExponentialScheduler,
    schedulers.CyclicalScheduler,
    controllers.EntropyTargetAlgorithm,
    controllers.PIDEntropyTargetAlgorithm,
    controllers.LinearPIDEntropyTargetAlgorithm,
    controllers.SGDEntropyTargetAlgorithm,
    controllers.NestedEntropyTargetAlgorithm,
    controllers.FixedEntropyCoefficient,
]
try:  # the `sb3` extra (Stable-Baselines3 and its gymnasium)
    from alf_entropy.integrations.sb3 import EntropyControllerCallback
except ImportError:
    pass
else:
    CLASSES.append(EntropyControllerCallback)

_BATCHED = (Algorithm, ActorCriticAlgorithm, PPOAlgorithm, sac_algorithm.SacAlgorithm)
"""Their ``batch_shape`` is the K-agent batch's to set, not gin's."""

FUNCTIONS = [
    (optimizers.default_optimizer, None),
    (sac_networks.sac_default_optimizer, None),
    (dist_utils.greedy_probability_target, None),
    (dist_utils.calc_default_target_entropy, None),
    (dist_utils.calc_default_max_entropy, None),
    (dist_utils.estimated_entropy, None),
]
try:  # the `train` extra: environments and trainers (a CleanRL user's gymnasium 0.29 has none)
    require_train_extra()
except MissingDependencyError:
    pass
else:
    from alf_entropy.environments import evaluation
    from alf_entropy.environments.gym_vector_env import GymVectorEnv
    from alf_entropy.trainers import callbacks
    from alf_entropy.trainers.off_policy_trainer import OffPolicyTrainer
    from alf_entropy.trainers.on_policy_trainer import OnPolicyTrainer

    CLASSES += [
        GymVectorEnv,
        callbacks.SummaryCallback,
        callbacks.ProgressBarCallback,
        callbacks.EvaluationCallback,
        callbacks.CheckpointCallback,
        callbacks.TimeBudgetCallback,
        OnPolicyTrainer,
        OffPolicyTrainer,
    ]
    FUNCTIONS.append((evaluation.evaluate, None))


def _registered(obj: Any) -> bool:
    try:
        gin.get_configurable(obj)
    except ValueError:
        return False
    return True


def _register_function(fn: Callable[..., Any], name: Optional[str]) -> None:
    """Register ``fn`` and put gin's wrapper where the package's modules hold ``fn``."""
    wrapper = gin.configurable(name or fn.__name__, module=fn.__module__)(fn)
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("alf_entropy"):
            for attr, value in list(vars(module).items()):
                if value is fn:
                    setattr(module, attr, wrapper)


# A base before its subclasses (a shorter MRO); each once: one registered already (the
# controllers, while their modules still decorate them) is left as it is.
for _cls in sorted(CLASSES, key=lambda cls: len(cls.__mro__)):
    if not _registered(_cls):
        gin.configurable(_cls, denylist=["batch_shape"] if _cls in _BATCHED else None)
for _fn, _name in FUNCTIONS:
    if not _registered(_fn):
        _register_function(_fn, _name)
gin.add_config_file_search_path(CONFIG_DIR)  # after ".": `include 'ppo_cartpole.gin'` finds it


@gin.configurable("train")
def trainer_binding(trainer: Any = None) -> Any:
    """What ``train.trainer`` binds (``alf-entropy-train`` builds it)."""
    return trainer
