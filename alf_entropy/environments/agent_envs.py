"""``AgentEnvs``: one set of environments per agent, stepped as one batch ``[K, N]``.

Agent ``k`` gets the :class:`~alf_entropy.environments.GymVectorEnv` of ``num_envs``
environments a single run with seed ``seeds[k]`` builds, so it sees that run's episodes
under the same actions.  It speaks ``GymVectorEnv``'s protocol with leaves ``[K, N,
...]``: ``reset``, ``step`` (actions ``[K, N, ...]``), ``get_state``/``set_state`` (one
``bytes``), ``close``; ``pop_episode_statistics`` gives each agent's.  Stepping costs K
vector-env calls (the rest of a step is done once for all K): for cheap environments
(CartPole) the part of acting that grows with K.
"""

import pickle
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from alf_entropy.data_structures import TimeStep
from alf_entropy.environments.env_state import load_env_state
from alf_entropy.environments.gym_vector_env import GymVectorEnv
from alf_entropy.utils import nest
from alf_entropy.utils.checks import check_int

__all__ = ["AgentEnvs", "agent_env_ctor"]


class AgentEnvs:
    """K sets of ``num_envs`` environments, one per seed (module docstring).

    Args:
        env_id: the gymnasium id.
        num_envs: environments per agent ``N``.
        seeds: one seed per agent (``K = len(seeds)``).
        device: where the time steps are placed.
        env_ctor: ``(env_id, num_envs=, seed=, device=) -> env`` (a ``GymVectorEnv``).

    Raises:
        ValueError: if ``seeds`` is empty or ``num_envs < 1``.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seeds: Sequence[int],
        device: Any = "cpu",
        env_ctor: Callable[..., Any] = GymVectorEnv,
    ):
        check_int("num_envs", num_envs, minimum=1)
        seeds = [check_int("seeds[i]", s, minimum=0) for s in seeds]
        if not seeds:
            raise ValueError("seeds must hold at least one seed")
        self._envs = [env_ctor(env_id, num_envs=num_envs, seed=s, device=device) for s in seeds]

    @property
    def envs(self) -> List[Any]:
        """Each agent's environments."""
        return list(self._envs)

    @property
    def num_envs(self) -> int:
        """Environments per agent ``N``."""
        return self._envs[0].num_envs

    @property
    def observation_spec(self) -> Any:
        """One environment's observation spec."""
        return self._envs[0].observation_spec

    @property
    def action_spec(self) -> Any:
        """One environment's action spec."""
        return self._envs[0].action_spec

    def reset(self) -> TimeStep:
        """Reset every set; ``FIRST`` steps ``[K, N]`` (``env_info`` dropped)."""
        return _stack([env.reset() for env in self._envs])

    def step(self, action: Any) -> TimeStep:
        """Step agent ``k``'s environments with ``action[k]`` (a nest of ``[K, N, ...]``).

        Raises:
            ValueError: if an action has the wrong shape or is out of range.
        """
        # The action checked and copied to the host once, the K sets' arrays made into one
        # time step: per step, only the K gymnasium calls grow with K.
        action = self._envs[0].numpy_action(action, lead=(len(self._envs),))
        arrays = [
            env.step_arrays(nest.map_structure(lambda a, k=k: a[k], action))
            for k, env in enumerate(self._envs)
        ]
        stacked = [nest.map_structure(lambda *x: np.stack(x), *part) for part in zip(*arrays)]
        return self._envs[0].time_step(*stacked)._replace(env_info=())

    def pop_episode_statistics(self) -> List[Tuple[List[float], List[int]]]:
        """Each agent's finished episodes (returns, lengths) since the last call."""
        return [stats for env in self._envs for stats in env.pop_episode_statistics()]

    def get_state(self) -> Optional[bytes]:
        """Every set's ``get_state()``, pickled; None if a set cannot be saved."""
        states = [env.get_state() for env in self._envs]
        return None if any(s is None for s in states) else pickle.dumps(states)

    def set_state(self, state: bytes) -> None:
        """Restore what :meth:`get_state` returned.

        Raises:
            ValueError: if ``state`` is not one state per set.
        """
        try:
            states = load_env_state(state)  # a list of bytes: no name to find
        except Exception as e:
            raise ValueError(f"state is not an AgentEnvs state: {e}") from e
        if not isinstance(states, list) or len(states) != len(self._envs):
            raise ValueError(
                f"state does not hold one state for each of {len(self._envs)} sets of environments"
            )
        for env, s in zip(self._envs, states):
            env.set_state(s)

    def close(self) -> None:
        """Close every set."""
        for env in self._envs:
            env.close()


def _stack(time_steps):
    return nest.map_structure(
        lambda *x: torch.stack(x), *[t._replace(env_info=()) for t in time_steps]
    )


def agent_env_ctor(
    env_ctor: Callable[..., Any], seeds: Optional[Sequence[int]], seed: int
) -> Callable[..., Any]:
    """A trainer's ``env_ctor`` for its agents: ``env_ctor`` itself for one agent
    (``seeds`` None); for K an ``AgentEnvs`` ctor that gives agent ``k``, for a trainer's
    ``seed=seed + d``, the seed ``seeds[k] + d`` (as its single run numbers them)."""
    if seeds is None:
        return env_ctor

    def _ctor(env_id: str, num_envs: int, seed: int, device: Any = "cpu") -> AgentEnvs:
        return AgentEnvs(env_id, num_envs, [s + seed for s in offsets], device, env_ctor)

    offsets = [s - seed for s in seeds]
    return _ctor
