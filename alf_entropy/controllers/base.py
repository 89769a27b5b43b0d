"""``EntropyController``: the shared arguments and the interface of every controller."""

import math
from typing import Any, Dict, Optional, Sequence, Union

import torch
import torch.nn as nn

from alf_entropy.controllers.alf import AlfSubAlgorithm
from alf_entropy.controllers.driver import LOG_ZERO, MAX_ALPHA, UPDATE_MODES, Consts, Driver
from alf_entropy.controllers.ops import f32, member_mean
from alf_entropy.controllers.target import Target
from alf_entropy.controllers.watch import WINDUP_WINDOW, WarnOnce, anneal_of, report, scalars
from alf_entropy.data_structures import LossInfo
from alf_entropy.utils import distributed, summary
from alf_entropy.utils.checks import check_batch_shape, check_choice, check_name, check_real

__all__ = ["EntropyController", "arguments", "NO_SPAN", "MIN_LOG_ALPHA"]

NO_SPAN = 1e30
"""The span of ``log_alpha`` between two ``step()`` calls when there is no limit (finite)."""
MIN_LOG_ALPHA = -100.0
"""The floor of ``log_alpha`` for ``min_alpha <= 0`` (ALF's ``exp(-100)``)."""


def arguments(local_vars: Dict[str, Any], *construction: str) -> Dict[str, Any]:
    """A constructor's ``locals()`` for its base class's (a rule's for ``EntropyController``),
    less ``construction``."""
    return {k: v for k, v in local_vars.items() if k not in ("self", "__class__", *construction)}


class EntropyController(AlfSubAlgorithm, nn.Module):
    """The shared arguments of every controller (docs/controllers.md), checked at construction;
    a rule gives ``State``, ``rule`` and ``_constants`` and calls ``make_state`` once."""

    SUMMARY = summary  # alf_entropy's summaries, or (a subclass's) ALF's
    CLAMPED = True  # alpha stays in [min_alpha, max_alpha] (not a fixed coefficient)
    ZERO_ALPHA = False  # alpha may be 0 (a log-space rule cannot start there)
    SIGNED = False  # a min_alpha < 0 is alpha's floor (a penalty; log_alpha: its positive part's)
    STAGE = 1  # the stage of a rule without stages (a fixed coefficient's: -1)

    def __init__(
        self,
        action_spec: Any,
        target_entropy: Any = None,
        initial_alpha: float = 0.1,
        min_alpha: float = 1e-4,
        max_alpha: Optional[float] = None,
        max_alpha_change_per_iteration: Optional[float] = None,
        update_mode: str = "auto",
        batch_shape: Sequence[int] = (),
        debug_summaries: bool = False,
        name: str = "EntropyController",
        **settings: Any,
    ):
        super().__init__()
        self.batch_shape = check_batch_shape(batch_shape)
        self.action_spec = action_spec
        self.name = check_name("name", name)
        self.debug_summaries = bool(debug_summaries)
        self._mode = check_choice("update_mode", update_mode, UPDATE_MODES)
        self.warn = WarnOnce(name)
        self._target = Target(target_entropy, action_spec, self.batch_shape, self.warn)
        self._configure(
            dict(
                min_alpha=min_alpha,
                max_alpha=max_alpha,
                max_alpha_change_per_iteration=max_alpha_change_per_iteration,
                **settings,
            )
        )
        alpha = check_real(
            "initial_alpha", initial_alpha, positive=not self.ZERO_ALPHA, minimum=0.0
        )
        if self.CLAMPED and not min_alpha <= alpha <= (max_alpha or MAX_ALPHA):
            raise ValueError(
                f"initial_alpha ({initial_alpha}) must be in [min_alpha, max_alpha] "
                f"= [{min_alpha}, {max_alpha or MAX_ALPHA}]"
            )
        self._initial_log_alpha = math.log(alpha) if alpha > 0 else LOG_ZERO

    def make_state(self, **own: Any) -> None:
        """Make the state: the shared fields, then the rule's ``own`` (as ``Driver`` takes them)."""
        self.driver = Driver(
            self.State,
            self.batch_shape,
            self._mode,
            self._initial_log_alpha,
            self._target.initial,
            **own,
        )

    def _configure(self, settings):
        """Check and take ``settings``: ``log_alpha``'s floor, ceiling and span from them."""
        low = check_real("min_alpha", settings["min_alpha"])
        high = check_real("max_alpha", settings["max_alpha"], positive=True, allow_none=True)
        if high is not None and high < low:
            raise ValueError(f"min_alpha ({low}) must be <= max_alpha ({high})")
        change = check_real(
            "max_alpha_change_per_iteration",
            settings["max_alpha_change_per_iteration"],
            above=1.0,
            allow_none=True,
        )
        lo = f32(math.log(low)) if low > 0 else (LOG_ZERO if self.ZERO_ALPHA else MIN_LOG_ALPHA)
        hi = f32(math.log(high or MAX_ALPHA))
        span = NO_SPAN if change is None else math.log(change)
        rule = self._constants(settings, lo, hi)
        if not self.CLAMPED:
            lo, hi = -math.inf, math.inf
        self._settings = settings
        self.consts = Consts(rule, lo, hi, span, anneal_of(self._target.annealing))
        self.scheduled_target = not self._target.constant

    @property
    def updates(self) -> int:
        """Updates so far (a host count: empty and NaN ones too)."""
        return self._target.updates

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
        return self._target.now(self.driver.target)

    @target_entropy.setter
    def target_entropy(self, target: Any) -> None:
        self._target.set(target, self.driver.target)
        self._configure(self._settings)

    @property
    def settings(self) -> Dict[str, Any]:
        """What ``configure`` changes."""
        return dict(self._settings)

    def configure(self, **changes: Any) -> None:
        """Change settings mid-run, checked as at construction (an error changes nothing)."""
        unknown = sorted(set(changes) - set(self._settings))
        if unknown:
            raise TypeError(
                f"{self.name}: {unknown} are not settings; the settings are "
                f"{sorted(self._settings)}"
            )
        self._configure({**self._settings, **changes})

    @property
    def stage(self) -> torch.Tensor:
        """The stage (int32; ``describe_stage``; ``STAGE`` for a rule without stages)."""
        return torch.full_like(self.driver.count, self.STAGE, dtype=torch.int32)

    @property
    def unreachable_target(self) -> torch.Tensor:
        """Whether the entropy stayed below the target at the ceiling for ``WINDUP_WINDOW``."""
        return self.driver.stalled_for >= WINDUP_WINDOW

    @property
    def num_nonfinite_entropy(self) -> torch.Tensor:
        """Updates with a NaN/inf entropy from a non-empty batch (int64)."""
        return self.driver.nonfinite

    def adjust_alpha(self, entropy: Union[float, Sequence[float], torch.Tensor]) -> torch.Tensor:
        """One update from the batch-mean entropy (a batch's: one each, or shared); new alpha."""
        members = math.prod(self.batch_shape)
        if not isinstance(entropy, torch.Tensor):
            try:
                entropy = torch.tensor(entropy, dtype=torch.float32)
            except (TypeError, ValueError, RuntimeError) as e:
                raise TypeError(f"entropy must be a number or a tensor, got {entropy!r}") from e
        if entropy.numel() not in (1, members):
            raise ValueError(
                f"entropy must be a number or a tensor of {members} element(s), "
                f"got shape {tuple(entropy.shape)}"
            )
        entropy = entropy.detach().to(self.log_alpha.device, torch.float32).reshape(-1)
        entropy = entropy.expand(members).reshape(self.batch_shape)
        return self._update(distributed.all_reduce_masked_mean(entropy, None)[0], None)

    def entropy_loss(
        self,
        entropy: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        entropy_for_gradient: Optional[torch.Tensor] = None,
        update: bool = True,
    ) -> LossInfo:
        """One update from the masked mean of ``entropy``: ``-alpha * entropy_for_gradient``."""
        grad = entropy if entropy_for_gradient is None else entropy_for_gradient
        alpha = self.alpha
        if update:
            mean, count = member_mean(entropy.detach(), mask, len(self.batch_shape))
            alpha = self._update(*distributed.all_reduce_masked_mean(mean, count))
            if self.debug_summaries and self.SUMMARY.should_record_summaries():
                square = member_mean(entropy.detach() ** 2, mask, len(self.batch_shape))[0]
                scalars(self, entropy_std=torch.sqrt(torch.clamp(square - mean * mean, min=0.0)))
        alpha = alpha.reshape(self.batch_shape + (1,) * (grad.dim() - len(self.batch_shape)))
        return LossInfo(loss=-grad * alpha)

    def accumulate(self, entropy: torch.Tensor, mask: Optional[torch.Tensor] = None) -> None:
        """Add a micro-batch's entropies (as ``entropy_loss``'s) to the next ``step``'s."""
        self.driver.accumulate(*member_mean(entropy.detach().double(), mask, len(self.batch_shape)))

    def step(self) -> torch.Tensor:
        """One update from what was accumulated, pooled over ranks; an iteration's end."""
        return self._update(*self.driver.pooled(), restart=True)

    def refresh_target(self) -> None:
        """Fill the scheduled target's value now into its buffer (on the host)."""
        self._target.refresh(self.driver.target)

    def _update(self, entropy, count, restart=False):
        """The scheduled target, the device step, the report; the new alpha."""
        self.refresh_target()
        self.driver.update(self.rule, self.consts, entropy, count, restart)
        report(self, count)
        return self.alpha  # read eagerly, outside a compiled graph

    def check_progress(self) -> None:
        """A rule's own warnings (``report`` calls it where reading costs nothing)."""

    def debug_values(self) -> Dict[str, torch.Tensor]:
        """The rule's own debug summaries."""
        return {}
