"""``EntropyController``: the shared arguments and the interface of every controller."""
import math
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from alf_entropy.controllers.alf import AlfSubAlgorithm
from alf_entropy.controllers.driver import (
    NO_SPAN,
    UPDATE_MODES,
    Consts,
    Driver,
    Inputs,
    state_type,
)
from alf_entropy.controllers.ops import f32
from alf_entropy.controllers.target import Target
from alf_entropy.controllers.watch import (
    WINDUP_WINDOW,
    WarnOnce,
    anneal_of,
    unreachable_message,
)
from alf_entropy.data_structures import LossInfo
from alf_entropy.tensor_specs import TensorSpec, from_gym_space
from alf_entropy.utils import distributed, nest, summary
from alf_entropy.utils.checks import check_choice, check_int, check_real, is_real
from alf_entropy.utils.dist_utils import entropy_with_fallback
from alf_entropy.utils.math_ops import masked_mean

__all__ = ["EntropyController", "UPDATE_MODES", "NO_SPAN", "MAX_ALPHA", "MIN_LOG_ALPHA",
           "LOG_ZERO"]

MAX_ALPHA = 1e6
"""The ceiling of ``alpha`` when ``max_alpha`` is None: alpha stays finite on any plant."""
MIN_LOG_ALPHA = -100.0
"""The floor of ``log_alpha`` for ``min_alpha <= 0`` (ALF's ``exp(-100)``)."""
LOG_ZERO = -110.0
"""``log_alpha`` of an ``alpha`` of 0 (its ``exp`` is 0 in float32), for rules that reach 0."""


class EntropyController(AlfSubAlgorithm, nn.Module):
    """The base of every controller.  Its arguments are the shared ones, described once, in the
    table of docs/controllers.md ("The shared arguments"); a bad one raises a ``TypeError`` or
    ``ValueError`` naming it."""

    State = state_type("State")
    SUMMARY = summary  # where the summaries go: alf_entropy's or (a subclass's) ALF's
    CLAMPED = True  # alpha stays in [min_alpha, max_alpha] (not a fixed coefficient)
    ZERO_ALPHA = False  # alpha may be 0 (a log-space rule cannot start there)

    def __init__(self, action_spec: Any, target_entropy: Any = None, initial_alpha: float = 0.1,
                 min_alpha: float = 1e-4, max_alpha: Optional[float] = None,
                 max_alpha_change_per_iteration: Optional[float] = None,
                 update_mode: str = "auto", batch_shape: Sequence[int] = (),
                 debug_summaries: bool = False, name: str = "EntropyController",
                 **settings: Any):
        super().__init__()
        specs = nest.flatten(action_spec)
        if not specs or not all(isinstance(s, TensorSpec) for s in specs):
            raise TypeError(f"action_spec must be a non-empty nest of TensorSpec: {action_spec!r}")
        if not isinstance(batch_shape, (tuple, list)) or len(batch_shape) > 1:
            raise ValueError(f"batch_shape must be () or (K,), got {batch_shape!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        self._action_spec = action_spec
        self._batch = tuple(check_int("batch_shape[0]", k, minimum=1) for k in batch_shape)
        self._mode = check_choice("update_mode", update_mode, UPDATE_MODES)
        self._name = name
        self._debug_summaries = bool(debug_summaries)
        self._warn = WarnOnce(name)
        self._target = Target(target_entropy, action_spec, self._batch, self._warn)
        self._configure(dict(min_alpha=min_alpha, max_alpha=max_alpha,
                             max_alpha_change_per_iteration=max_alpha_change_per_iteration,
                             **settings))
        alpha = check_real("initial_alpha", initial_alpha, positive=not self.ZERO_ALPHA,
                           minimum=0.0)
        if self.CLAMPED and not min_alpha <= alpha <= (max_alpha or MAX_ALPHA):
            raise ValueError(f"initial_alpha ({initial_alpha}) must be in [min_alpha, max_alpha] "
                             f"= [{min_alpha}, {max_alpha or MAX_ALPHA}]")
        self._initial_log_alpha = math.log(alpha) if alpha > 0 else LOG_ZERO
        self.register_state_dict_pre_hook(_refuse_pending_accumulation)

    def _start(self, **own: torch.Tensor) -> None:
        """Make the state: the shared fields, then the rule's ``own`` initial values."""
        log_alpha = self._full(self._initial_log_alpha)
        shared = dict(
            log_alpha=log_alpha, target=self._full(self._target.initial), ema=self._full(0.0),
            stalled_for=self._full(0, torch.int64), count=self._full(0, torch.int64),
            settled=self._full(0, torch.int64), nonfinite=self._full(0, torch.int64),
            span_lo=log_alpha.clone(), span_hi=log_alpha.clone(),
            acc_sum=self._full(0.0, torch.float64), acc_count=self._full(0.0, torch.float64))
        self.driver = Driver(self.State(**shared, **own), self._mode)

    def _full(self, value: Union[float, Sequence[float]],
              dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """A tensor of ``batch_shape`` (float32 unless ``dtype``) on the state's device."""
        driver = getattr(self, "driver", None)
        device = None if driver is None else driver.log_alpha.device
        if isinstance(value, (list, tuple)):
            return torch.tensor(value, dtype=dtype, device=device).reshape(self._batch)
        return torch.full(self._batch, value, dtype=dtype or torch.float32, device=device)

    def _configure(self, settings: Dict[str, Any]) -> None:
        """Check and take ``settings``: the rule's constants, the bounds and span of alpha."""
        low = check_real("min_alpha", settings["min_alpha"])
        high = check_real("max_alpha", settings["max_alpha"], positive=True, allow_none=True)
        if high is not None and high < low:
            raise ValueError(f"min_alpha ({low}) must be <= max_alpha ({high})")
        change = check_real("max_alpha_change_per_iteration",
                            settings["max_alpha_change_per_iteration"], above=1.0,
                            allow_none=True)
        lo = f32(math.log(low)) if low > 0 else (LOG_ZERO if self.ZERO_ALPHA else MIN_LOG_ALPHA)
        hi = f32(math.log(high or MAX_ALPHA))
        rule = self._constants(settings, lo, hi)
        if not self.CLAMPED:
            lo, hi = -math.inf, math.inf
        self._settings = settings
        self._consts = Consts(rule, lo, hi, NO_SPAN if change is None else math.log(change),
                              anneal_of(self._target.annealing))

    def _constants(self, settings: Dict[str, Any], lo: float, hi: float) -> Any:
        """Check the rule's settings; its constants (Python floats; ``lo``, ``hi``: the bounds
        of ``log_alpha``)."""
        return ()

    @staticmethod
    def rule(x: Any, s: Any, entropy: Any, c: Any) -> Any:
        """The control law (``x``: the ops; ``c``: the constants): the new state (here: the
        same)."""
        return s

    @classmethod
    def from_space(cls, space: Any, **kwargs: Any) -> "EntropyController":
        """``cls(from_gym_space(space), **kwargs)`` for a gymnasium space or a TorchRL spec."""
        return cls(from_gym_space(space), **kwargs)

    @property
    def action_spec(self) -> Any:
        """The action spec."""
        return self._action_spec

    @property
    def name(self) -> str:
        """The name (the summaries' scope)."""
        return self._name

    @property
    def batch_shape(self) -> Tuple[int, ...]:
        """``()`` for one controller, ``(K,)`` for K."""
        return self._batch

    @property
    def debug_summaries(self) -> bool:
        """Whether the rule's debug summaries are written."""
        return self._debug_summaries

    @property
    def log_alpha(self) -> torch.Tensor:
        """``log(alpha)``, detached."""
        return self.driver.log_alpha.detach()

    @property
    def alpha(self) -> torch.Tensor:
        """The entropy coefficient, detached."""
        return self.log_alpha.exp()

    @property
    def target_entropy(self) -> Union[float, torch.Tensor]:
        """The target now (a tensor for a batch); settable."""
        if self._target.annealing is not None:  # the annealed target is state
            target = self.driver.target
            return float(target) if self._batch == () else target.clone()
        values = self._target.values()
        return values[0] if self._batch == () else self._full(values)

    @target_entropy.setter
    def target_entropy(self, target: Any) -> None:
        self._target.set(target)
        with torch.no_grad():
            self.driver.target.copy_(self._full(self._target.initial))
        self._configure(self._settings)

    @property
    def settings(self) -> Dict[str, Any]:
        """What ``configure`` changes."""
        return dict(self._settings)

    def configure(self, **changes: Any) -> None:
        """Change settings mid-run, checked as at construction (an error changes nothing)."""
        unknown = sorted(set(changes) - set(self._settings))
        if unknown:
            raise TypeError(f"{self._name}: {unknown} are not settings; the settings are "
                            f"{sorted(self._settings)}")
        self._configure({**self._settings, **changes})

    @property
    def stage(self) -> torch.Tensor:
        """The stage (int32; ``describe_stage``): < -2 estimating, -2 init, -1 free (a fixed
        alpha), 0/1 adjust (an unstaged rule)."""
        return torch.ones_like(self.driver.count, dtype=torch.int32)

    @property
    def unreachable_target(self) -> torch.Tensor:
        """Whether the entropy stayed below the target at the ceiling for ``WINDUP_WINDOW``."""
        return self.driver.stalled_for >= WINDUP_WINDOW

    @property
    def num_nonfinite_entropy(self) -> torch.Tensor:
        """Updates with a NaN/inf entropy from a non-empty batch (int64)."""
        return self.driver.nonfinite

    def leaf_algorithms(self) -> Dict[str, "EntropyController"]:
        """The per-action controllers by path in the spec (``{"": self}`` unless nested)."""
        return {"": self}

    def entropy(self, distribution: Any) -> Tuple[Any, Any]:
        """``(entropy, entropy_for_gradient)`` of the policy's distribution, as ``entropy_loss``
        takes them."""
        return entropy_with_fallback(distribution, action_spec=self._action_spec)

    def adjust_alpha(self, entropy: Union[float, Sequence[float], torch.Tensor]) -> torch.Tensor:
        """One update from the batch-mean entropy (a batch's: one each, or shared); new alpha."""
        members = math.prod(self._batch)
        if isinstance(entropy, torch.Tensor):
            if entropy.numel() != members:
                raise ValueError(f"entropy must be a number or a tensor of {members} "
                                 f"element(s), got shape {tuple(entropy.shape)}")
            entropy = entropy.detach().reshape(self._batch)
        elif is_real(entropy) or (isinstance(entropy, (list, tuple)) and self._batch != ()):
            entropy = self._full(entropy if is_real(entropy) else [float(e) for e in entropy])
        else:
            raise TypeError(f"entropy must be a number or a tensor, got {type(entropy).__name__}")
        entropy = distributed.all_reduce_masked_mean(entropy.to(self.log_alpha.device), None)[0]
        return self._update(entropy, None)

    def entropy_loss(self, entropy: torch.Tensor, mask: Optional[torch.Tensor] = None,
                     entropy_for_gradient: Optional[torch.Tensor] = None,
                     update: bool = True) -> LossInfo:
        """One update from the masked mean of ``entropy`` (``[*batch_shape, ...]`` for a batch;
        ``mask`` bool or 0/1, broadcastable; ``update=False``: none); ``LossInfo(loss=-alpha *
        entropy_for_gradient)`` per element with the post-update ``alpha`` (detached)."""
        grad = entropy if entropy_for_gradient is None else entropy_for_gradient
        alpha = self.alpha
        if update:
            x, m, dim = self._member_dims(entropy.detach(), mask)
            mean, count = masked_mean(x, m, dim=dim)
            alpha = self._update(*distributed.all_reduce_masked_mean(mean, count))
            if self._debug_summaries and self.SUMMARY.should_record_summaries():
                square = masked_mean(x * x, m, dim=dim)[0]
                self._scalars(entropy_std=torch.sqrt(torch.clamp(square - mean * mean, min=0.0)))
        alpha = alpha.reshape(self._batch + (1,) * (grad.dim() - len(self._batch)))
        return LossInfo(loss=-grad * alpha)

    def _member_dims(self, x: torch.Tensor, mask: Optional[torch.Tensor]) -> Tuple:
        """``(x, mask, dims to reduce)``, each member with an element dim."""
        if self._batch == ():
            return x, mask, None
        if x.dim() == len(self._batch):
            x, mask = x.unsqueeze(-1), None if mask is None else mask.unsqueeze(-1)
        return x, mask, tuple(range(len(self._batch), x.dim()))

    def accumulate(self, entropy: torch.Tensor, mask: Optional[torch.Tensor] = None) -> None:
        """Add a micro-batch's entropies (as ``entropy_loss``'s) to the next ``step``'s."""
        x, m, dim = self._member_dims(entropy.detach().to(torch.float64), mask)
        mean, count = masked_mean(x, m, dim=dim)
        with torch.no_grad():
            self.driver.acc_sum.add_(mean * count)
            self.driver.acc_count.add_(count)

    def step(self) -> torch.Tensor:
        """One update from what was accumulated, pooled over ranks (none if nothing was), and
        the end of an iteration (of ``max_alpha_change_per_iteration``); the new alpha."""
        s = self.driver.state
        total, count = distributed.all_reduce_sum(
            torch.stack([s.acc_sum, s.acc_count]), "all_reduce of the entropy").unbind()
        with torch.no_grad():
            s.acc_sum.zero_()
            s.acc_count.zero_()
        return self._update((total / count.clamp(min=1)).to(torch.float32), count, restart=True)

    def _update(self, entropy: torch.Tensor, count: Optional[torch.Tensor],
                restart: bool = False) -> torch.Tensor:
        """One update: the host's part (the target's schedule, summaries, warnings) around the
        device step; the new alpha."""
        values = self._target.refresh()
        driver = self.driver
        if values is not None:  # fill_ from host floats: no copy that would wait for a GPU
            with torch.no_grad():
                if len(set(values)) == 1:
                    driver.target.fill_(values[0])
                for k, value in enumerate(values if len(set(values)) > 1 else ()):
                    driver.target.view(-1)[k].fill_(value)
        entropy = entropy.detach().to(driver.log_alpha.device, torch.float32)
        count = entropy.new_ones(()) if count is None else count
        alpha = driver.update(self.rule, self._consts,
                              Inputs(entropy, count, torch.full_like(count, restart, dtype=bool)))
        self._after_update()
        return alpha

    def _after_update(self) -> None:
        """Summaries; warnings where reading costs nothing (the host path, a summary step)."""
        record = self.SUMMARY.should_record_summaries()
        if record:
            values = {"unreachable_target": self.unreachable_target}
            if self._debug_summaries:
                values.update(alpha=self.alpha, nonfinite_entropy=self.driver.nonfinite,
                              **self._debug_values())
            if not self._target.constant or self._target.annealing:
                values["target_entropy"] = self.driver.target
            self._scalars(**values)
        if not (record or self.driver.on_host()):
            return
        if "unreachable" not in self._warn.said and bool(self.unreachable_target.any()):
            s = self.driver.state
            self._warn("unreachable", unreachable_message(s.ema, s.target, s.stalled_for,
                                                          self.alpha))
        self._check_progress()

    def _check_progress(self) -> None:
        """A rule's own warnings (run where reading costs nothing)."""

    def _scalars(self, **values: torch.Tensor) -> None:
        """Summaries under the controller's name (a batch's: one value a member)."""
        with self.SUMMARY.scope(self._name):
            for tag, value in values.items():
                self.SUMMARY.scalar(tag, value)

    def _debug_values(self) -> Dict[str, torch.Tensor]:
        """The rule's own debug summaries."""
        return {}


def _refuse_pending_accumulation(module: EntropyController, prefix: str, keep_vars: bool) -> None:
    if distributed.is_distributed() and bool((module.driver.acc_count > 0).any()):
        raise RuntimeError(f"{module.name}: state_dict() between accumulate() and step() in a "
                           "multi-rank run would save one rank's partial entropy sum; call "
                           "step() first (save between optimizer steps)")
