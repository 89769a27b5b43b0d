"""Entropy control for LLM RL, independent of the trainer: what a trainer adapter needs.

A controller steers the coefficient of an entropy bonus from one number per
optimizer step: the entropy of the step's completion tokens, pooled over its
micro-batches and ranks (a token-weighted mean, i.e. a sum over a count).
:class:`StepEntropyControl` holds the controller and does the rest, so an
adapter for a trainer (``alf_entropy.integrations.trl`` for Hugging Face TRL;
verl or OpenRLHF would need the same few lines) only has to

1. call :meth:`StepEntropyControl.update` once per optimizer step, after the
   step, with the step's entropy sum and token count (already pooled over
   ranks, or per rank with ``all_reduce=True``) and the step number;
2. write the returned coefficient where every micro-batch of the next step
   reads it;
3. save :meth:`StepEntropyControl.state_dict` with its checkpoints (plain
   JSON-able data) and give it back to :meth:`load_state_dict` on resume.

Targets are in nats per completion token at the sampling temperature (the
entropy of the distribution the tokens were drawn from).  A scheduled target
(any zero-argument callable, e.g. ``LinearScheduler("percent", ...)``) reads
the progress fed before each update: ``"iterations"`` is the number of
optimizer steps done and ``"percent"`` their fraction of ``total_steps``.

The controller lives on the CPU and runs on the host: the step's sum and
count arrive as numbers, or as one-element tensors on the trainer's device,
which ``update`` reads once (after reducing them there with
``all_reduce=True``: NCCL reduces CUDA tensors only).
"""

import math
import numbers
from collections.abc import Mapping
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch

from alf_entropy.controllers.base import EntropyController
from alf_entropy.controllers.driver import SHARED_FIELDS
from alf_entropy.controllers.linear_pid import LinearPIDEntropyTargetAlgorithm
from alf_entropy.controllers.nested import NestedEntropyTargetAlgorithm
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils import distributed, schedulers
from alf_entropy.utils.checks import check_int, check_real, is_real

__all__ = [
    "StepEntropyControl",
    "lm_controller",
    "LM_SETTINGS",
    "controller_alpha_bounds",
    "encode_state",
    "decode_state",
]

LM_SETTINGS = dict(
    kp=0.5,
    ki=0.05,
    kd=6.0,
    trend_ema=0.5,
    gain_alpha=0.2,
    min_gain=0.5,
    initial_alpha=0.0,
    min_alpha=-0.05,
    max_alpha=1.0,
)
"""``lm_controller``'s settings of ``LinearPIDEntropyTargetAlgorithm`` (per nat per token)."""

Target = Union[float, Callable[[], float]]
Number = Union[float, torch.Tensor]


def controller_alpha_bounds(controller: EntropyController) -> "tuple[float, float]":
    """The ``(min_alpha, max_alpha)`` an unbatched, non-nested controller can command
    (``inf`` if unbounded; a controller without bounds, the fixed one, gives its ``alpha``
    twice)."""
    settings = controller.settings
    alpha = float(controller.alpha)
    if "min_alpha" not in settings and "max_alpha" not in settings:
        return alpha, alpha
    lo = settings.get("min_alpha")
    hi = settings.get("max_alpha")
    lo = float(lo or 0.0) if controller.SIGNED else max(float(lo or 0.0), 0.0)
    return lo, math.inf if hi is None else float(hi)


def check_step_controller(controller: Any) -> EntropyController:
    """Check that ``controller`` can drive one scalar coefficient from the host.

    Raises:
        TypeError: if it is not an ``EntropyController``, is nested (one
            coefficient per action leaf) or batched (``batch_shape != ()``).
        ValueError: if its state is not on the CPU.
    """
    if isinstance(controller, NestedEntropyTargetAlgorithm):
        raise TypeError(
            "controller must drive one coefficient: a nested controller has one per "
            "action leaf; build it for BoundedTensorSpec((), torch.int64, 0, V - 1)"
        )
    if not isinstance(controller, EntropyController):
        raise TypeError(
            "controller must be an EntropyController (e.g. "
            f"PIDEntropyTargetAlgorithm(...)), got {controller!r}"
        )
    if tuple(controller.batch_shape) != ():
        raise TypeError(
            "controller must drive one coefficient: batch_shape must be (), got "
            f"{tuple(controller.batch_shape)}"
        )
    if controller.alpha.device.type != "cpu":
        raise ValueError(
            "controller must be on the CPU (the entropy arrives as a host float; "
            f"a {controller.alpha.device} controller would sync every step)"
        )
    return controller


def lm_controller(
    vocabulary: Any, target_entropy: Target, **changes: Any
) -> LinearPIDEntropyTargetAlgorithm:
    """The recommended controller of an LLM's entropy bonus, for every learning rate.

    A bonus can raise an LM's entropy, and only its absence lets it fall: above the target the
    coefficient must be 0, not small.  So the controller is a PID of the coefficient itself,
    clamped at 0 and at TRL's ``entropy_coef_max`` of 1 (``LinearPIDEntropyTargetAlgorithm``
    with ``LM_SETTINGS``).  One exception: while the entropy rises above the target with no
    bonus behind it, a rise no bonus can stop, the coefficient goes down to a penalty of 0.05
    (``min_alpha``; ``min_alpha=0`` is a bonus only, docs/llm_rl.md#an-entropy-penalty).

    Args:
        vocabulary: the token spec (``BoundedTensorSpec((), torch.int64, 0, V - 1)``) or the
            vocabulary size ``V``.
        target_entropy: nats per completion token at the sampling temperature, or a schedule.
        **changes: settings that differ from ``LM_SETTINGS``.

    Examples:
        >>> lm = lm_controller(151_936, 0.5)
        >>> [round(float(lm.adjust_alpha(h)), 4) for h in (0.6, 0.8)]  # rising above the target
        [0.0, -0.05]
        >>> float(lm.adjust_alpha(0.3)) > 0  # below it
        True
        >>> bonus_only = lm_controller(151_936, 0.5, min_alpha=0.0)
        >>> [round(float(bonus_only.adjust_alpha(h)), 4) for h in (0.6, 0.8)]
        [0.0, 0.0]
    """
    if isinstance(vocabulary, numbers.Integral) and not isinstance(vocabulary, bool):
        vocabulary = BoundedTensorSpec(
            (), torch.int64, 0, check_int("vocabulary", vocabulary, minimum=2) - 1
        )
    return LinearPIDEntropyTargetAlgorithm(
        vocabulary, target_entropy=target_entropy, **{**LM_SETTINGS, **changes}
    )


def encode_state(value: Any) -> Any:
    """A ``state_dict`` as JSON-able data (tensors exactly, as lists with dtype and shape)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if torch.is_tensor(value):
        t = value.detach().cpu()
        flat = [t.tolist()] if t.dim() == 0 else t.reshape(-1).tolist()
        return {"__tensor__": flat, "dtype": str(t.dtype)[len("torch.") :], "shape": list(t.shape)}
    if isinstance(value, Mapping):
        return {"__dict__": [[encode_state(k), encode_state(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"__list__": [encode_state(v) for v in value], "tuple": isinstance(value, tuple)}
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"cannot encode a {type(value).__name__} of a controller state")


def decode_state(value: Any) -> Any:
    """The inverse of :func:`encode_state`."""
    if isinstance(value, dict):
        if "__tensor__" in value:
            dtype = getattr(torch, value["dtype"])
            return torch.tensor(value["__tensor__"], dtype=dtype).reshape(value["shape"])
        if "__dict__" in value:
            return {decode_state(k): decode_state(v) for k, v in value["__dict__"]}
        if "__list__" in value:
            items = [decode_state(v) for v in value["__list__"]]
            return tuple(items) if value.get("tuple") else items
        raise ValueError(f"not an encoded controller state: keys {sorted(value)}")
    return value


def _read_sum_and_count(
    entropy_sum: Number, token_count: Number, all_reduce: bool, device: torch.device
) -> Tuple[float, float]:
    """The step's entropy sum and token count as floats, summed over the ranks first if
    ``all_reduce`` (in float64 on the device of whichever is a tensor, ``device`` if
    neither), with one read on the host."""
    on = None
    for name, value in (("entropy_sum", entropy_sum), ("token_count", token_count)):
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"{name} must be a number or a one-element tensor, got shape "
                    f"{tuple(value.shape)}"
                )
            on = value.device
        elif not is_real(value):
            raise TypeError(
                f"{name} must be a number or a one-element tensor, got {type(value).__name__}"
            )
    if on is None and not all_reduce:
        return float(entropy_sum), float(token_count)
    on = device if on is None else on
    pair = torch.stack(
        [
            torch.as_tensor(v, dtype=torch.float64, device=on).reshape(())
            for v in (entropy_sum, token_count)
        ]
    ).detach()
    if all_reduce:
        pair = distributed.all_reduce_sum(pair, "all_reduce of the step's entropy")
    entropy_sum, token_count = pair.tolist()
    return entropy_sum, token_count


class StepEntropyControl:
    """One controller update per optimizer step from the step's entropy sum and token count.

    Args:
        controller: an unbatched, non-nested ``EntropyController`` on the CPU
            (e.g. ``lm_controller(V, 0.5)``).

    Raises:
        TypeError: if ``controller`` is not such a controller.
        ValueError: if it is not on the CPU.

    Examples:
        >>> control = StepEntropyControl(lm_controller(151_936, 1.0))
        >>> for step in (1, 2):                # 0.4 nats per token, below 1.0
        ...     coef = control.update(entropy_sum=40.0, token_count=100, step=step)
        >>> coef > 0                           # a bonus (from 0)
        True
    """

    def __init__(self, controller: EntropyController):
        self._controller = check_step_controller(controller)
        self._step = 0
        self._entropy = math.nan

    @property
    def controller(self) -> EntropyController:
        """The controller."""
        return self._controller

    @property
    def coefficient(self) -> float:
        """The coefficient the next optimizer step uses (the controller's ``alpha``)."""
        return float(self._controller.alpha)

    @property
    def step(self) -> int:
        """The optimizer step of the last update (0: none yet)."""
        return self._step

    @property
    def entropy(self) -> float:
        """The entropy of the last update (nats per token; NaN before the first)."""
        return self._entropy

    def update(
        self,
        entropy_sum: Number,
        token_count: Number,
        step: int,
        total_steps: Optional[int] = None,
        all_reduce: bool = False,
    ) -> float:
        """Advance the controller once from optimizer step ``step``'s entropy.

        Args:
            entropy_sum: the sum of the per-token entropies of the step's
                completion tokens (over all its micro-batches; over all ranks
                unless ``all_reduce``): a number or a one-element tensor.
            token_count: how many tokens that sum covers (> 0), likewise.
            step: the number of optimizer steps done (this one included); fed
                to the schedulers as ``"iterations"``.
            total_steps: the planned number of steps; if given, ``step /
                total_steps`` is fed as ``"percent"``.
            all_reduce: sum both over the ``torch.distributed`` ranks first (pass per-rank
                values), on the device of whichever is a tensor (CUDA tensors under NCCL;
                numbers are reduced on the CPU, which needs gloo).

        Returns:
            The coefficient for the next step (the same on every rank).

        Raises:
            TypeError: if ``entropy_sum`` or ``token_count`` is neither a number nor a tensor.
            ValueError: if a tensor has more than one element, ``token_count`` is not
                positive, ``step`` is negative or ``total_steps`` not positive.
        """
        step = check_int("step", step, minimum=0)
        if total_steps is not None:
            total_steps = check_int("total_steps", total_steps, minimum=1)
        entropy_sum, token_count = _read_sum_and_count(
            entropy_sum, token_count, all_reduce, self._controller.log_alpha.device
        )
        check_real("token_count", token_count, positive=True)
        schedulers.update_progress("iterations", step)
        if total_steps is not None:
            schedulers.update_progress("percent", min(1.0, step / total_steps))
        self._entropy = entropy_sum / token_count
        coefficient = float(self._controller.adjust_alpha(self._entropy))
        self._step = step
        return coefficient

    def record(self) -> Dict[str, float]:
        """The last update's values, for a trainer's logs.

        Returns:
            ``coef`` (for the next step), ``target`` (at the last update),
            ``entropy`` (measured), ``stage``, ``unreachable_target`` (0/1),
            ``nonfinite_entropy`` (count) and the controller's scalar state
            (``state/<name>``, e.g. ``state/integral`` for the PID).
        """
        c = self._controller
        logs = {
            "coef": self.coefficient,
            "target": float(c.target_entropy),
            "entropy": self._entropy,
            "stage": float(c.stage),
            "unreachable_target": float(c.unreachable_target),
            "nonfinite_entropy": float(c.num_nonfinite_entropy),
        }
        for name, value in c.driver.state._asdict().items():
            if (name == "log_alpha" or name not in SHARED_FIELDS) and value.dim() == 0:
                logs[f"state/{name}"] = float(value)
        return logs

    def state_dict(self) -> Dict[str, Any]:
        """JSON-able state: the controller's ``state_dict``, the step, the last entropy."""
        return {
            "step": self._step,
            "entropy": self._entropy,
            "controller": encode_state(self._controller.state_dict()),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            ValueError: if ``state`` lacks a key of :meth:`state_dict`.
        """
        missing = {"step", "entropy", "controller"} - set(state)
        if missing:
            raise ValueError(f"state is missing {sorted(missing)}")
        self._controller.load_state_dict(decode_state(state["controller"]))
        self._step = int(state["step"])
        self._entropy = float(state["entropy"])
