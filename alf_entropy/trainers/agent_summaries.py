"""Summaries of a trainer of K agents: each agent's in its own run directory."""
import os
import time
from typing import Any, List, Sequence

import numpy as np

from alf_entropy.trainers.callbacks import SummaryCallback
from alf_entropy.utils import summary

__all__ = ["AgentSummaryCallback"]


class AgentSummaryCallback(SummaryCallback):
    """A trainer of K agents: each agent's summaries in its own run directory.

    Agent ``k`` writes to ``root_dir/<trainer.agent_dirs[k]>/train`` what a
    single run writes to ``root_dir/train`` (the tags of the batch's
    ``summary_values``: ``ManyAgents``' or ``ManySacAgents``'; ``env_steps``,
    ``steps_per_sec``, ``return``, ``episode_length``, ``return_vs_env_steps``;
    evaluations through
    :meth:`write`), so the report reads each agent as a run.  Nothing is written
    to ``root_dir/train``.  ``trainer.metrics`` gets the agents' means (and
    ``steps_per_sec`` of all agents together).  Built by the trainer in place of
    :class:`SummaryCallback`; it needs a trainer with ``agent_dirs`` and
    ``agent_summary_values()``.

    Args:
        interval: iterations between summaries.
        flush_secs: how often the writers flush to disk.
    """

    def __init__(self, interval: int = 10, flush_secs: float = 10.0):
        super().__init__(interval, flush_secs)
        self._writers: List[Any] = []

    @classmethod
    def like(cls, other: SummaryCallback) -> "AgentSummaryCallback":
        """One with ``other``'s interval and flush period."""
        return cls(other.interval, other.flush_secs)

    def on_training_start(self, trainer: Any) -> None:
        self._writers = [summary.create_summary_writer(
            os.path.join(trainer.root_dir, name, "train"), flush_secs=self.flush_secs)
            for name in trainer.agent_dirs]
        summary.set_default_writer(None)  # the batch's own summary calls go nowhere
        self._since = (time.time(), trainer.env_steps)

    def write(self, tag: str, values: Sequence[float], step: int) -> None:
        """Write ``values[k]`` as agent ``k``'s scalar ``tag`` at ``step``."""
        for writer, value in zip(self._writers, values):
            writer.add_scalar(tag, float(value), global_step=step)

    def _write(self, trainer: Any) -> None:
        """Each agent's summaries (reads them on the host: summary time only)."""
        now, steps = time.time(), trainer.env_steps
        sps = (steps - self._since[1]) / max(now - self._since[0], 1e-9)
        self._since = (now, steps)
        step = trainer.iteration - 1  # the summary step of the iteration just done
        values = {tag: v.tolist() for tag, v in trainer.agent_summary_values().items()}
        for tag, per_agent in values.items():
            self.write(tag, per_agent, step)
        k = len(self._writers)
        self.write("env_steps", [steps] * k, step)
        self.write("steps_per_sec", [sps] * k, step)
        trainer.metrics["steps_per_sec"] = sps * k
        means = []
        for writer, (returns, lengths) in zip(self._writers,
                                              trainer.env.pop_episode_statistics()):
            if returns:
                mean = float(np.mean(returns))
                means.append(mean)
                writer.add_scalar("return", mean, global_step=step)
                writer.add_scalar("episode_length", float(np.mean(lengths)), global_step=step)
                writer.add_scalar("return_vs_env_steps", mean, global_step=steps)
        if means:
            trainer.metrics["return"] = float(np.mean(means))
        if "alpha" in values:
            trainer.metrics["alpha"] = float(np.mean(values["alpha"]))

    def on_training_end(self, trainer: Any) -> None:
        self._close_gate()
        for writer in self._writers:
            writer.close()
        self._writers = []
