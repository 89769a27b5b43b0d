"""Core data structures shared by every algorithm (ALF's names and fields).

``TimeStep`` is what an environment yields, ``AlgStep`` what an algorithm's
``*_step`` methods return, ``LossInfo`` what ``calc_loss`` returns and
``Experience`` what a trainer stores for training.  All are namedtuples whose
fields default to ``()`` (an empty nest), so a caller only fills what it has,
exactly as in ALF.
"""

import collections
from typing import Any, Dict, Optional, Sequence, Union

__all__ = [
    "namedtuple",
    "StepType",
    "TimeStep",
    "AlgStep",
    "LossInfo",
    "Experience",
    "make_experience",
]


def namedtuple(
    typename: str,
    field_names: Union[str, Sequence[str]],
    default_value: Any = None,
    default_values: Optional[Union[Dict[str, Any], Sequence[Any]]] = None,
):
    """``collections.namedtuple`` whose fields all have defaults.

    Args:
        typename: name of the new type.
        field_names: field names, as for ``collections.namedtuple``.
        default_value: default for every field not in ``default_values``.
        default_values: per-field defaults, either a dict keyed by field name
            or a sequence aligned with ``field_names``.

    Returns:
        The new namedtuple class.

    Raises:
        ValueError: if ``default_values`` names an unknown field or has the
            wrong length.
    """
    cls = collections.namedtuple(typename, field_names)
    fields = cls._fields
    defaults = {f: default_value for f in fields}
    if isinstance(default_values, dict):
        unknown = set(default_values) - set(fields)
        if unknown:
            raise ValueError(f"default_values names unknown fields {sorted(unknown)} of {typename}")
        defaults.update(default_values)
    elif default_values is not None:
        default_values = list(default_values)
        if len(default_values) != len(fields):
            raise ValueError(
                f"default_values has {len(default_values)} entries but {typename} "
                f"has {len(fields)} fields"
            )
        defaults.update(zip(fields, default_values))
    cls.__new__.__defaults__ = tuple(defaults[f] for f in fields)
    return cls


class StepType:
    """Where a ``TimeStep`` stands in its episode (plain ints, like ALF).

    ``FIRST`` starts an episode, ``MID`` is any step inside it, ``LAST`` ends
    it (termination or truncation).  Plain ints compare with integer tensors
    without any conversion.
    """

    FIRST = 0
    MID = 1
    LAST = 2

    def __new__(cls, value: int) -> int:
        """Validate and return ``value`` (so ``StepType(1) == StepType.MID``)."""
        if value not in (cls.FIRST, cls.MID, cls.LAST):
            raise ValueError(f"StepType must be 0, 1 or 2, got {value!r}")
        return value


TimeStep = namedtuple(
    "TimeStep",
    [
        "step_type",  # int tensor [B]: StepType
        "reward",  # float tensor [B]
        "discount",  # float tensor [B]: 0 only on true termination
        "observation",  # nest of tensors [B, ...]
        "prev_action",  # nest of tensors [B, ...]
        "env_id",  # int tensor [B]
        "env_info",  # dict of extra per-env information
    ],
    default_value=(),
)
"""What an environment yields at each step (all fields are batched)."""


def _time_step_is_first(self) -> Any:
    return self.step_type == StepType.FIRST


def _time_step_is_last(self) -> Any:
    return self.step_type == StepType.LAST


TimeStep.is_first = _time_step_is_first
TimeStep.is_last = _time_step_is_last

AlgStep = namedtuple("AlgStep", ["output", "state", "info"], default_value=())
"""Result of ``predict_step``/``rollout_step``/``train_step``.

``output`` is what the caller consumes (e.g. an action), ``state`` the next
recurrent state, ``info`` whatever ``calc_loss`` later needs.
"""

LossInfo = namedtuple("LossInfo", ["loss", "scalar_loss", "extra", "priority"], default_value=())
"""Result of ``calc_loss``.

``loss`` is a per-step loss (shape ``[T, B]`` or ``[B]``) that
``Algorithm.update_with_gradient`` averages; ``scalar_loss`` is added as is;
``extra`` holds per-term losses for summaries; ``priority`` is for replay.
"""

Experience = namedtuple(
    "Experience", ["step_type", "time_step", "action", "rollout_info", "state"], default_value=()
)
"""One step of data kept for training.

``step_type`` is repeated from ``time_step`` so that loss functions (such as
``EntropyTargetAlgorithm.calc_loss``) can mask ``LAST`` steps without caring
how the rest of the time step is stored.
"""


def make_experience(time_step, alg_step, state=()) -> "Experience":
    """Build an ``Experience`` from a time step and its rollout ``AlgStep``.

    Args:
        time_step (TimeStep): the time step the algorithm saw.
        alg_step (AlgStep): what ``rollout_step`` returned for it.
        state (nest): the state the algorithm was in before the step.

    Returns:
        Experience: with ``step_type`` taken from ``time_step``.
    """
    return Experience(
        step_type=time_step.step_type,
        time_step=time_step,
        action=alg_step.output,
        rollout_info=alg_step.info,
        state=state,
    )
