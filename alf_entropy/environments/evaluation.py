"""Policy evaluation: run whole episodes on a fresh environment.

``run_episodes`` plays ``num_episodes`` episodes in parallel, one per environment of a
dedicated ``GymVectorEnv`` (or ``env_ctor``'s env: K agents' ``AgentEnvs``), and keeps
only each env's *first* episode, so short episodes are not over-represented.
``evaluate`` returns the mean return.  Not on the training path: it checks for finished
episodes on the host every step.
"""

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from alf_entropy.data_structures import StepType
from alf_entropy.environments.gym_vector_env import GymVectorEnv
from alf_entropy.utils.checks import check_int

__all__ = ["evaluate", "run_episodes"]


def run_episodes(
    env_id: str,
    policy_fn: Callable[[Any], Any],
    num_episodes: int = 10,
    seed: Optional[int] = 0,
    device: Any = "cpu",
    env_kwargs: Optional[Dict[str, Any]] = None,
    max_episode_steps: Optional[int] = None,
    pass_time_step: bool = False,
    max_steps: int = 100_000,
    env_ctor: Callable[..., Any] = GymVectorEnv,
) -> Tuple[List[Any], List[Any]]:
    """Play ``num_episodes`` episodes and report their returns and lengths.

    Args:
        env_id: gymnasium id.
        policy_fn: maps the batched observation ``[num_episodes, ...]`` (or,
            with ``pass_time_step``, the whole ``TimeStep``) to a batched
            action accepted by ``GymVectorEnv.step``.  Called under
            ``torch.no_grad()``.
        num_episodes: number of episodes (= number of parallel envs).
        seed: base seed of the evaluation envs.
        device: device of the observations given to ``policy_fn``.
        env_kwargs: extra ``gymnasium.make`` arguments.
        max_episode_steps: time-limit override.
        pass_time_step: give ``policy_fn`` the ``TimeStep`` instead of the
            observation.
        max_steps: safety bound on the number of vector steps; episodes not
            finished by then are reported with their partial return.
        env_ctor: ``(env_id, num_envs=, seed=, device=, **options) -> env``.

    Returns:
        ``(returns, lengths)``, one entry per episode, in env order (an env with
        leaves ``[K, N]``: one list per agent).

    Raises:
        ValueError: if ``num_episodes`` or ``max_steps`` is not positive.
    """
    check_int("num_episodes", num_episodes, minimum=1)
    check_int("max_steps", max_steps, minimum=1)
    options = {
        k: v
        for k, v in (("env_kwargs", env_kwargs), ("max_episode_steps", max_episode_steps))
        if v is not None
    }
    env = env_ctor(env_id, num_envs=num_episodes, seed=seed, device=device, **options)
    try:
        time_step = env.reset()
        shape = time_step.step_type.shape
        returns = torch.zeros(shape, dtype=torch.float64)
        lengths = torch.zeros(shape, dtype=torch.int64)
        done = torch.zeros(shape, dtype=torch.bool)
        with torch.no_grad():
            for _ in range(max_steps):
                action = policy_fn(time_step if pass_time_step else time_step.observation)
                time_step = env.step(action)
                active = ~done
                reward = time_step.reward.detach().cpu().to(torch.float64)
                returns += torch.where(active, reward, 0.0)
                lengths += active.to(torch.int64)
                done |= time_step.step_type.cpu() == StepType.LAST
                if bool(done.all()):
                    break
    finally:
        env.close()
    return returns.tolist(), lengths.tolist()


def evaluate(
    env_id: str,
    policy_fn: Callable[[Any], Any],
    num_episodes: int = 10,
    seed: Optional[int] = 0,
    device: Any = "cpu",
    env_kwargs: Optional[Dict[str, Any]] = None,
    max_episode_steps: Optional[int] = None,
    pass_time_step: bool = False,
    max_steps: int = 100_000,
    env_ctor: Callable[..., Any] = GymVectorEnv,
) -> float:
    """Mean return of :func:`run_episodes`: the same arguments, one number.

    Make ``policy_fn`` deterministic (e.g. via ``mode_of``) for a clean
    metric, and give ``seed`` a value different from the training seed.

    Raises:
        ValueError: if ``num_episodes`` or ``max_steps`` is not positive.
    """
    returns, _ = run_episodes(**locals())  # evaluate's arguments are run_episodes'

    return float(sum(returns) / len(returns))
