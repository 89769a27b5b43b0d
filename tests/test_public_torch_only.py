"""The package uses torch's public APIs only.

Issue 22: no fast twins beside plain code that reach into torch's private
APIs (hook registries, private kernels, ``__wrapped__``, private attributes
of distributions or optimisers).  The fast paths that need them live in one
module, ``alf_entropy/accel.py``, behind ``ALF_ENTROPY_ACCEL=0``.
"""

import pathlib
import re

import alf_entropy

PRIVATE_TORCH = re.compile(
    r"torch\._[A-Za-z]|__wrapped__|_forward_hooks|_backward_hooks|_forward_pre_hooks"
    r"|_backward_pre_hooks|_compiled_call_impl|_get_tracing_state|aten\."
    r"|_validate_args|_are_functorch|_step_supports_amp_scaling|\._param\b"
)
ALLOWED = "accel.py"


def test_no_private_torch_api_outside_accel():
    root = pathlib.Path(alf_entropy.__file__).parent
    hits = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if PRIVATE_TORCH.search(line):
                hits.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not hits, "private torch APIs outside accel.py:\n" + "\n".join(hits)
