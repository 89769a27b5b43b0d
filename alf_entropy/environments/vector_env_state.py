"""A ``GymVectorEnv``'s state for an exact resume: every space seeded, the whole gymnasium
vector env pickled with the wrapper's flags, and restored from a checkpoint's bytes finding
only what an env's state holds (:func:`~alf_entropy.environments.env_state.load_env_state`).
"""

import pickle
from typing import Any, Iterator, Optional, Tuple

import gymnasium as gym
from gymnasium.utils import EzPickle
from gymnasium.vector import AsyncVectorEnv

from alf_entropy.environments.env_state import load_env_state

__all__ = ["seed_spaces", "dump_state", "load_state"]

_SPACES = ("single_observation_space", "single_action_space", "observation_space", "action_space")


def _env_chain(gym_env: Any) -> Iterator[Any]:
    """The vector env, each env in it, and every wrapper around either."""
    for env in (gym_env, *getattr(gym_env, "envs", [])):
        while env is not None:
            yield env
            env = getattr(env, "env", None)


def seed_spaces(gym_env: Any, seed: int) -> None:
    """Seed every space (the vector env's, each env's and wrapper's): their pickled
    state, part of :func:`dump_state`'s, is then the same for two envs of one seed."""
    seen = set()
    for layer in _env_chain(gym_env):
        for name in _SPACES:
            space = getattr(layer, name, None)
            if isinstance(space, gym.spaces.Space) and id(space) not in seen:
                seen.add(id(space))
                space.seed(seed)


def dump_state(gym_env: Any, flags: Tuple[Any, ...]) -> Optional[bytes]:
    """The whole vector env (episodes, RNGs, statistics) and ``flags`` pickled; ``None``
    where that is not their state (``EzPickle`` envs: Box2D, MuJoCo, toy text;
    subprocesses) or they cannot be pickled."""
    if isinstance(gym_env, AsyncVectorEnv) or any(
        isinstance(env, EzPickle) for env in _env_chain(gym_env)
    ):
        return None  # pickling these does not capture their state
    try:
        return pickle.dumps((gym_env, *flags))
    except Exception:  # pickling can fail with any error type (Box2D: AssertionError)
        return None


def load_state(gym_env: Any, state: bytes, num_flags: int) -> Tuple[Any, ...]:
    """``(env, *flags)`` from :func:`dump_state`'s ``state``, to replace ``gym_env``.

    Raises:
        ValueError: if ``state`` is not such a state (of as many envs and ``num_flags``).
    """
    try:  # only what an env state holds: a crafted checkpoint runs nothing
        env, *flags = load_env_state(
            state, {type(env).__module__ for env in _env_chain(gym_env)}
        )  # the live env's
        if len(flags) != num_flags:
            raise ValueError(f"{len(flags)} flags, not {num_flags}")
    except Exception as e:
        raise ValueError(f"state is not a GymVectorEnv state: {e}") from e
    if not isinstance(env, gym.vector.VectorEnv) or env.num_envs != gym_env.num_envs:
        raise ValueError(
            f"state holds {getattr(env, 'num_envs', '?')} envs, this env has {gym_env.num_envs}"
        )
    return (env, *flags)
