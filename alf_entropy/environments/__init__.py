"""Environments: gymnasium vector envs as ALF ``TimeStep``s, gymnasium episode stats, evaluation."""

from alf_entropy.environments.evaluation import evaluate, run_episodes
from alf_entropy.environments.gym_vector_env import GymVectorEnv

__all__ = ["GymVectorEnv", "evaluate", "run_episodes"]
