"""``update_mode="compiled"``: the tensor step as one ``torch.compile`` graph, with no graph
break (``fullgraph=True``) and no recompile over 50 updates that include a NaN entropy, an empty
batch and a scheduled target; the same bits as the eager tensor step (SGD's Adam: inductor's
``lerp``/``addcmul`` may round its moments 1 ulp apart, so its state is held to a float32
tolerance)."""

import warnings

import pytest
import torch

from alf_entropy.controllers import (
    EntropyTargetAlgorithm,
    FixedEntropyCoefficient,
    LinearPIDEntropyTargetAlgorithm,
    PIDEntropyTargetAlgorithm,
    SGDEntropyTargetAlgorithm,
)
from alf_entropy.tensor_specs import BoundedTensorSpec
from alf_entropy.utils import schedulers

FOUR = BoundedTensorSpec((), torch.int64, 0, 3)
RULES = {
    "staged": (EntropyTargetAlgorithm, dict(skip_free_stage=True)),
    "pid": (PIDEntropyTargetAlgorithm, {}),
    "sgd": (SGDEntropyTargetAlgorithm, dict(lr=0.05)),
    "linear": (LinearPIDEntropyTargetAlgorithm, dict(min_alpha=0.0, max_alpha=2.0)),
    "fixed": (FixedEntropyCoefficient, {}),
    "pid/K=3": (PIDEntropyTargetAlgorithm, dict(batch_shape=(3,))),
}


@pytest.mark.slow
@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_compiled_step_has_no_break_no_recompile_and_the_eager_bits(rule):
    cls, kwargs = RULES[rule]
    schedule = schedulers.LinearScheduler("iterations", [(0, 1.2), (50, 0.6)])
    if cls is not FixedEntropyCoefficient:
        kwargs = dict(kwargs, target_entropy=schedule)
    torch.compiler.reset()
    compiled, eager = (cls(FOUR, update_mode=mode, **kwargs) for mode in ("compiled", "tensor"))
    members = kwargs.get("batch_shape", ())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unfed-progress warning is not the point here
        try:
            for i in range(50):
                schedulers.update_progress("iterations", i)
                entropy = torch.full(members + (4,), float("nan") if i == 7 else 1.3 - 0.02 * i)
                mask = torch.zeros(4) if i == 11 else torch.ones(4)
                losses = [c.entropy_loss(entropy, mask).loss for c in (compiled, eager)]
                if i == 0:  # compiled once: from here on a recompile raises
                    torch.compiler.set_stance("fail_on_recompile")
                exact = dict(rtol=0, atol=0) if rule != "sgd" else {}
                torch.testing.assert_close(*losses, equal_nan=True, **exact)
                for key, value in eager.state_dict().items():
                    torch.testing.assert_close(compiled.state_dict()[key], value, **exact)
        finally:
            torch.compiler.set_stance("default")
    assert compiled.num_nonfinite_entropy.sum().item() == (members[0] if members else 1)
