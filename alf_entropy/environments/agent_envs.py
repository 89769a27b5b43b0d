"""``AgentEnvs``: one set of environments per agent, stepped as one batch ``[K, N]``.

Agent ``k`` gets its own :class:`~alf_entropy.environments.GymVectorEnv` of
``num_envs`` environments seeded with ``seeds[k]`` -- exactly the
environments a single run with that seed builds -- so agent ``k`` of a batch
sees the episodes (resets, episode ends) that single run sees under the same
actions.  ``reset``/``step`` give ``TimeStep`` s whose leaves are ``[K, N,
...]`` (agent-major); ``step`` takes actions ``[K, N, ...]``.

Stepping costs K environment steps (one per set): for environments that are
cheap to step in one NumPy-vectorised batch (CartPole) that is the part of
acting that grows linearly with K.
"""
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from alf_entropy.data_structures import TimeStep
from alf_entropy.environments.gym_vector_env import GymVectorEnv
from alf_entropy.utils import nest
from alf_entropy.utils.checks import check_int

__all__ = ["AgentEnvs"]


class AgentEnvs:
    """K sets of ``num_envs`` environments, one per seed (module docstring).

    Args:
        env_id: the gymnasium id.
        num_envs: environments per agent ``N``.
        seeds: one seed per agent (``K = len(seeds)``).
        device: where the time steps are placed.
        env_ctor: ``(env_id, num_envs=, seed=, device=) -> env`` (a
            ``GymVectorEnv`` or one like it).

    Raises:
        ValueError: if ``seeds`` is empty or ``num_envs < 1``.
    """

    def __init__(self, env_id: str, num_envs: int, seeds: Sequence[int], device: Any = "cpu",
                 env_ctor: Callable[..., Any] = GymVectorEnv):
        check_int("num_envs", num_envs, minimum=1)
        seeds = [check_int("seeds[i]", s, minimum=0) for s in seeds]
        if not seeds:
            raise ValueError("seeds must hold at least one seed")
        self._envs: List[Any] = [env_ctor(env_id, num_envs=num_envs, seed=s, device=device)
                                 for s in seeds]

    @property
    def envs(self) -> List[Any]:
        """Each agent's environments."""
        return list(self._envs)

    @property
    def num_agents(self) -> int:
        """K."""
        return len(self._envs)

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
        """Step agent ``k``'s environments with ``action[k]``.

        Args:
            action: a nest of ``[K, N, ...]`` tensors.

        Returns:
            TimeStep: leaves ``[K, N, ...]`` (``env_info`` dropped).
        """
        return _stack([env.step(nest.map_structure(lambda a, k=k: a[k], action))
                       for k, env in enumerate(self._envs)])

    def pop_episode_statistics(self) -> List[Tuple[List[float], List[int]]]:
        """Each agent's finished episodes (returns, lengths) since the last call."""
        return [env.pop_episode_statistics() for env in self._envs]

    def get_state(self) -> List[Optional[bytes]]:
        """Each set's ``GymVectorEnv.get_state()`` (None for a set that cannot be pickled)."""
        return [env.get_state() for env in self._envs]

    def set_state(self, states: Sequence[bytes]) -> None:
        """Restore what :meth:`get_state` returned.

        Args:
            states: one state per set.

        Raises:
            ValueError: if there is not one state per set, or a state is not one.
        """
        if len(states) != len(self._envs):
            raise ValueError(f"states has {len(states)} entries for {len(self._envs)} sets")
        for env, state in zip(self._envs, states):
            env.set_state(state)

    def close(self) -> None:
        """Close every set."""
        for env in self._envs:
            env.close()


def _stack(time_steps: List[TimeStep]) -> TimeStep:
    return nest.map_structure(lambda *x: torch.stack(x),
                              *[t._replace(env_info=()) for t in time_steps])
