"""``GymVectorEnv``: a gymnasium vector env (``NEXT_STEP`` autoreset) yielding ALF ``TimeStep``s.

``reset()`` gives ``FIRST`` steps (reward 0, discount 1, zero ``prev_action``);
``step(action)`` gives ``MID``, or ``LAST`` on termination or truncation (discount 0 only
on termination); the step after a ``LAST`` is that env's reset, ``FIRST`` (its action
ignored).  The first ``reset()`` seeds env ``i`` with ``seed + i`` and every space with
``seed``.  Episode statistics are ``RecordEpisodeStatistics``' at less cost
(``docs/benchmarks/ppo_speed.md``); :meth:`GymVectorEnv.get_state` pickles the whole
vector env for an exact resume.  Only the actions are moved to the host.
"""

import collections
import functools
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from alf_entropy.utils.requirements import require_train_extra

# gymnasium < 1.1 (e.g. CleanRL's 0.29) lacks AutoresetMode: say what to install
# instead of failing on the import below.
require_train_extra("alf_entropy.environments (the trainers' environments)")

import gymnasium as gym  # noqa: E402  (after the version check)
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv  # noqa: E402

from alf_entropy.data_structures import StepType, TimeStep  # noqa: E402
from alf_entropy.environments.vector_env_state import (  # noqa: E402
    dump_state,
    load_state,
    seed_spaces,
)
from alf_entropy.tensor_specs import from_gym_space  # noqa: E402
from alf_entropy.utils import nest  # noqa: E402
from alf_entropy.utils.checks import check_choice, check_int  # noqa: E402

__all__ = ["GymVectorEnv"]


def _make_env(env_id, max_episode_steps, env_kwargs):
    """Build one environment (module level so ``AsyncVectorEnv`` can pickle it)."""
    return gym.make(env_id, max_episode_steps=max_episode_steps, **env_kwargs)


_VECTORIZATION_MODES = ("auto", "sync", "async", "vector_entry_point")
_MAX_EPISODES = 10_000  # finished episodes kept for pop_episode_statistics
_STATE = ("_autoreset", "_seeded", "_started", "_episode_returns", "_episode_lengths", "_finished")
"""The wrapper's part of :meth:`GymVectorEnv.get_state`, after the vector env."""


def _make_vector_env(env_id, num_envs, mode, max_episode_steps, env_kwargs):
    """The gymnasium vector env (``NEXT_STEP`` autoreset) for ``mode``."""
    if mode == "auto":
        spec = gym.spec(env_id)  # gym.error.Error for an unknown id
        mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
    if mode == "vector_entry_point":
        kwargs = dict(env_kwargs)
        if max_episode_steps is not None:
            kwargs["max_episode_steps"] = max_episode_steps
        env = gym.make_vec(
            env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs
        )
        if env.metadata.get("autoreset_mode") != AutoresetMode.NEXT_STEP:
            raise ValueError(
                f"{env_id}'s vector env does not use NEXT_STEP autoreset; use "
                "vectorization_mode='sync'"
            )
        return env
    env_fns = [
        functools.partial(_make_env, env_id, max_episode_steps, env_kwargs) for _ in range(num_envs)
    ]
    cls = AsyncVectorEnv if mode == "async" else SyncVectorEnv
    return cls(env_fns, copy=False, autoreset_mode=AutoresetMode.NEXT_STEP)


def _numpy_dtype(spec):
    return torch.empty((), dtype=spec.dtype).numpy().dtype


class GymVectorEnv:
    """Batched gymnasium environments producing batched ``TimeStep`` tensors.

    Args:
        env_id: a registered gymnasium id such as ``"CartPole-v1"``.
        num_envs: number of parallel environments ``B``.
        seed: base seed (env ``i`` gets ``seed + i``; a ``"vector_entry_point"`` env one
            generator seeded with ``seed``); ``None`` for random seeding.
        device: where the ``TimeStep`` tensors are placed.
        vectorization_mode: ``"sync"``, ``"async"`` (a subprocess each),
            ``"vector_entry_point"`` (gymnasium's NumPy-vectorised env, e.g. CartPole's:
            several times faster) or ``"auto"`` (that where the id has one, else sync).
        env_kwargs: extra keyword arguments for ``gymnasium.make``.
        max_episode_steps: override the registered time limit (truncation: ``LAST``,
            discount 1).

    Attributes:
        env_id, num_envs, device: as given.
        observation_spec, action_spec: one environment's specs (nests).
        gym_env: the gymnasium vector environment.

    Raises:
        ValueError: for ``num_envs < 1``, a negative ``max_episode_steps`` or an
            ``env_id`` gymnasium cannot make.
        TypeError: if ``env_kwargs`` is not a dict or a space is unsupported.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int = 8,
        seed: Optional[int] = 0,
        device: Any = "cpu",
        vectorization_mode: str = "auto",
        env_kwargs: Optional[Dict[str, Any]] = None,
        max_episode_steps: Optional[int] = None,
    ):
        check_int("num_envs", num_envs, minimum=1)
        check_int(
            "max_episode_steps",
            max_episode_steps,
            minimum=1,
            allow_none=True,
            none_means="the env's own limit",
        )
        env_kwargs = {} if env_kwargs is None else env_kwargs
        if not isinstance(env_kwargs, dict):
            raise TypeError(f"env_kwargs must be a dict, got {type(env_kwargs).__name__}")
        self._seed = check_int("seed", seed, minimum=0, allow_none=True, none_means="unseeded")
        check_choice("vectorization_mode", vectorization_mode, _VECTORIZATION_MODES)
        self.env_id, self.num_envs, self.device = env_id, num_envs, torch.device(device)
        try:
            self.gym_env = _make_vector_env(
                env_id, num_envs, vectorization_mode, max_episode_steps, dict(env_kwargs)
            )
        except gym.error.Error as e:
            raise ValueError(f"env_id {env_id!r}: gymnasium cannot make it: {e}") from e
        # Each env's running return (float64, as gymnasium's) and length; finished episodes.
        self._episode_returns = np.zeros(num_envs, dtype=np.float64)
        self._episode_lengths = np.zeros(num_envs, dtype=np.int64)
        self._finished = collections.deque(maxlen=_MAX_EPISODES)
        self.observation_spec = from_gym_space(self.gym_env.single_observation_space)
        self.action_spec = from_gym_space(self.gym_env.single_action_space)
        self._obs_np_dtypes = nest.map_structure(_numpy_dtype, self.observation_spec)
        if self._seed is not None:
            seed_spaces(self.gym_env, self._seed)
        self._seeded = self._closed = self._started = False
        # Envs whose previous step was LAST: gymnasium resets them on the next step.
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self._env_ids_np = np.arange(num_envs, dtype=np.int64)
        # ``step``'s fast paths: no structure check for a tensor action, no ``.to`` on the CPU.
        self._action_is_leaf = not nest.is_nested(self.action_spec)
        self._on_cpu = self.device.type == "cpu"
        self._action_np_dtypes = nest.map_structure(_numpy_dtype, self.action_spec)

    def _tensor(self, array):
        """``array`` (which the caller owns: it is not copied) as a tensor on ``device``."""
        tensor = torch.from_numpy(array)
        return tensor if self._on_cpu else tensor.to(self.device)

    def _to_device(self, array, dtype):
        # ``np.array(copy=True)`` so CPU tensors never alias gymnasium's buffers.
        return self._tensor(np.array(array, dtype=dtype, copy=True))

    def _convert_action_leaf(self, spec, action, lead=()):
        if isinstance(action, torch.Tensor):
            # ``force=True``: ``detach().cpu()`` (the one device->host copy of
            # the step) in a single call; shares memory for CPU tensors.
            array = action.numpy(force=True)
        else:
            array = np.asarray(action)
        expected = lead + (self.num_envs,) + spec.shape
        if array.shape != expected:
            names = "K, " * len(lead)
            raise ValueError(
                f"action must have shape {expected} ({names}num_envs, "
                f"*action_spec.shape), got {array.shape}"
            )
        if spec.is_discrete:
            if array.dtype.kind not in "iu":  # not an integer dtype
                rounded = np.rint(array)
                if not np.array_equal(rounded, array):
                    raise ValueError(f"discrete action must hold integers, got {array}")
                array = rounded
            # No copy: gymnasium only reads it; prev_action is built from a fresh array.
            array = array.astype(np.int64, copy=False)
            if np.count_nonzero((array < spec.minimum) | (array > spec.maximum)):
                raise ValueError(
                    f"discrete action must be in [{spec.minimum.tolist()}, "
                    f"{spec.maximum.tolist()}], got {array.tolist()}"
                )
            return array
        # (gymnasium's spaces are bounded specs: from_gym_space)
        return np.clip(array.astype(np.float32), spec.minimum, spec.maximum).astype(
            np.float32, copy=False
        )

    def time_step(self, *arrays: Any) -> TimeStep:
        """The ``TimeStep`` of :meth:`step_arrays`' arrays, or of K sets' stacked (leaves
        ``[K, N, ...]``); all but the observation are fresh (owned, not copied)."""
        step_type, reward, discount, obs, prev_action = arrays
        return TimeStep(
            step_type=self._tensor(step_type.astype(np.int64, copy=False)),
            reward=self._tensor(reward.astype(np.float32, copy=False)),
            discount=self._tensor(discount.astype(np.float32, copy=False)),
            observation=nest.map_structure(self._to_device, obs, self._obs_np_dtypes),
            prev_action=nest.map_structure(self._tensor, prev_action),
            env_id=self._tensor(np.broadcast_to(self._env_ids_np, step_type.shape).copy()),
            env_info={},
        )

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("GymVectorEnv is closed")

    def reset(self) -> TimeStep:
        """Reset every env (the first call seeds them): ``FIRST`` steps.

        Raises:
            RuntimeError: if the environment was closed.
        """
        self._check_open()
        obs, _ = self.gym_env.reset(seed=None if self._seeded else self._seed)
        self._seeded = True
        self._autoreset = np.zeros(self.num_envs, dtype=bool)
        self._episode_returns[:] = 0.0  # episodes in progress are dropped
        self._episode_lengths[:] = 0
        self._started = True
        b = self.num_envs
        return self.time_step(
            np.full(b, StepType.FIRST, dtype=np.int64),
            np.zeros(b, dtype=np.float32),
            np.ones(b, dtype=np.float32),
            obs,
            nest.map_structure(
                lambda s, d: np.zeros((b,) + s.shape, d), self.action_spec, self._action_np_dtypes
            ),
        )

    def step(self, action: Any) -> TimeStep:
        """Step every env with ``action`` (``[B, *action_spec.shape]`` or a nest, any device).

        Raises:
            RuntimeError: if ``reset()`` was never called or the env is closed.
            ValueError: if an action has the wrong shape or is out of range.
        """
        return self.time_step(*self.step_arrays(self.numpy_action(action)))

    def numpy_action(self, action: Any, lead: Tuple[int, ...] = ()) -> Any:
        """``action`` (``[*lead, B, *action_spec.shape]`` or a nest, any device) checked, as
        the NumPy arrays gymnasium takes.

        Raises:
            ValueError: if an action has the wrong shape or is out of range.
        """
        if self._action_is_leaf and isinstance(action, torch.Tensor):
            # A tensor is a leaf: it matches a single action spec.
            return self._convert_action_leaf(self.action_spec, action, lead)
        try:
            nest.assert_same_structure(self.action_spec, action)
        except ValueError as e:
            raise ValueError(f"action does not match action_spec: {e}") from e
        return nest.map_structure(
            lambda spec, a: self._convert_action_leaf(spec, a, lead), self.action_spec, action
        )

    def step_arrays(self, np_action: Any) -> Tuple[Any, ...]:
        """Step every env with :meth:`numpy_action`'s arrays: :meth:`time_step`'s arguments.

        Raises:
            RuntimeError: if ``reset()`` was never called or the env is closed.
        """
        if self._closed or not self._started:
            self._check_open()
            raise RuntimeError("call reset() before step()")
        obs, reward, terminated, truncated, _ = self.gym_env.step(np_action)
        # ``_autoreset`` is rebound below and in ``reset``, never changed in place: no copy.
        first = self._autoreset
        not_first = ~first
        terminated = np.asarray(terminated, dtype=bool) & not_first
        done = (terminated | np.asarray(truncated, dtype=bool)) & not_first
        # FIRST (0) where first, else MID (1) + 1 where done (LAST, 2).
        step_type = done.astype(np.int64)
        step_type += not_first
        reward = np.asarray(reward)
        self._record_episodes(reward, not_first, done)
        # Same values as computing in float64 and casting: 0 is exact.
        reward = np.where(first, np.float32(0.0), reward.astype(np.float32, copy=False))
        discount = (~terminated).astype(np.float32)  # 0 only on termination
        self._autoreset = done
        prev_action = nest.map_structure(
            lambda a, dtype: self._prev_action(a, first, dtype), np_action, self._action_np_dtypes
        )
        return step_type, reward, discount, obs, prev_action

    def _record_episodes(self, reward, not_first, done):
        """Add the step to the running episodes (a ``FIRST`` step, the reset, counts for
        neither); keep the finished ones."""
        returns, lengths = self._episode_returns, self._episode_lengths
        np.add(returns, reward, out=returns, where=not_first)
        lengths += not_first
        if np.count_nonzero(done):
            index = np.flatnonzero(done)
            self._finished.extend(zip(returns[index].tolist(), lengths[index].tolist()))
            returns[index] = 0.0
            lengths[index] = 0

    def _prev_action(self, action, first, dtype):
        """The action taken (``[B, ...]``), zeroed for envs whose step is ``FIRST``."""
        if action.ndim > 1:
            first = first.reshape((-1,) + (1,) * (action.ndim - 1))
        # ``np.where`` returns a fresh array: no other copy.
        return np.where(first, 0, action).astype(dtype, copy=False)

    def pop_episode_statistics(self) -> List[Tuple[List[float], List[int]]]:
        """Each agent's ``(returns, lengths)`` of the episodes finished since the last call (a
        list of one, as ``AgentEnvs``' of K; at most the 10,000 latest), in completion order."""
        returns = [r for r, _ in self._finished]
        lengths = [n for _, n in self._finished]
        self._finished.clear()
        return [(returns, lengths)]

    def get_state(self) -> Optional[bytes]:
        """The whole vector env (episodes, RNGs, statistics) and this wrapper's flags,
        pickled; ``None`` where that is not their state (``EzPickle`` envs: Box2D, MuJoCo,
        toy text; subprocesses) or they cannot be pickled."""
        self._check_open()
        return dump_state(self.gym_env, tuple(getattr(self, name) for name in _STATE))

    def set_state(self, state: bytes) -> None:
        """Restore what :meth:`get_state` returned (replacing the envs).

        Raises:
            ValueError: if ``state`` is not such a state (of as many envs).
        """
        self._check_open()
        env, *flags = load_state(self.gym_env, state, len(_STATE))
        self.gym_env.close()
        self.gym_env = env
        for name, value in zip(_STATE, flags):
            setattr(self, name, value)

    def sample_random_action(self) -> Any:
        """Uniformly random actions ``[B, ...]`` (seeded by ``seed``) on ``device``."""
        return nest.map_structure(
            self._to_device, self.gym_env.action_space.sample(), self._action_np_dtypes
        )

    def close(self) -> None:
        """Close the environments (idempotent)."""
        if not self._closed:
            self.gym_env.close()
            self._closed = True

    def __enter__(self) -> "GymVectorEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
