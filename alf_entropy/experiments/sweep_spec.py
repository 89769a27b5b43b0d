"""A sweep's spec (the JSON file of ``alf-entropy-sweep``) and the runs it expands to.

See :mod:`alf_entropy.experiments.sweep` for the spec's keys; :func:`expand_spec`
gives one :class:`SweepRun` per configuration and seed.
"""

import collections
import dataclasses
import itertools
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from alf_entropy.utils.run_names import dir_safe

__all__ = [
    "PROG",
    "SweepRun",
    "gin_literal",
    "load_spec",
    "check_spec",
    "short_names",
    "expand_spec",
    "train_command",
]

PROG = "alf-entropy-sweep"
_SPEC_KEYS = {"gin_file", "gin_param", "parameters", "seeds", "seed_binding"}


@dataclasses.dataclass(eq=False)  # a run is itself, not its fields (a dict key)
class SweepRun:
    """One run of a sweep, or one packed process of several (``members``).

    Attributes:
        name: its directory name.
        root_dir: ``<sweep_dir>/<name>`` (a packed process:
            ``<sweep_dir>/_packed/<name>``).
        command: the ``alf-entropy-train`` command line (a list).
        seed: its seed (None for a packed process).
        bindings: its ``--gin_param`` bindings without the seed.
        members: a packed process's runs (each agent is one); ``[]`` for a run.
        targets: a packed process's target entropy of each member (None each
            where it packs seeds only).
    """

    name: str
    root_dir: str
    command: List[str]
    seed: Optional[int] = None
    bindings: List[str] = dataclasses.field(default_factory=list)
    members: List["SweepRun"] = dataclasses.field(default_factory=list)
    targets: List[Any] = dataclasses.field(default_factory=list)


def gin_literal(value: Any) -> str:
    """A JSON value as gin text (strings such as ``@Foo()`` or ``'x'`` as written)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "None"
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(gin_literal(v) for v in value) + (",)" if len(value) == 1 else ")")
    return repr(value)


def load_spec(path: str) -> Dict[str, Any]:
    """Read and check a sweep spec (JSON); ``ValueError`` if unreadable or malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read sweep spec {path!r}: {e}") from e
    return check_spec(spec)


def check_spec(spec: Any) -> Dict[str, Any]:
    """A checked copy of a parsed spec, defaults filled in; ``ValueError`` naming the key."""
    if not isinstance(spec, dict):
        raise ValueError(f"the sweep spec must be a JSON object, got {type(spec).__name__}")
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise ValueError(
            f"unknown keys in the sweep spec: {sorted(unknown)}; allowed: {sorted(_SPEC_KEYS)}"
        )
    out = {
        "gin_file": spec.get("gin_file", []),
        "gin_param": spec.get("gin_param", []),
        "parameters": spec.get("parameters", {}),
        "seeds": spec.get("seeds", [0]),
        "seed_binding": spec.get("seed_binding", "OnPolicyTrainer.seed"),
    }
    for key in ("gin_file", "gin_param"):
        if isinstance(out[key], str):
            out[key] = [out[key]]
        if not isinstance(out[key], list) or not all(isinstance(s, str) for s in out[key]):
            raise ValueError(f"{key} must be a string or a list of strings, got {out[key]!r}")
    params = out["parameters"]
    if not isinstance(params, dict) or not all(
        isinstance(k, str) and "." in k and isinstance(v, list) and v for k, v in params.items()
    ):
        raise ValueError(
            "parameters must map bindings ('Class.arg') to non-empty lists of values, "
            f"got {params!r}"
        )
    seeds = out["seeds"]
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise ValueError(f"seeds must be a non-empty list of distinct ints >= 0, got {seeds!r}")
    if not isinstance(out["seed_binding"], str) or "." not in out["seed_binding"]:
        raise ValueError(f"seed_binding must be a 'Class.arg' string, got {out['seed_binding']!r}")
    return out


def short_names(bindings: Sequence[str]) -> Dict[str, str]:
    """The last part of each binding, or the whole binding where that clashes."""
    last = {b: b.rsplit(".", 1)[-1] for b in bindings}
    counts = collections.Counter(last.values())
    return {b: (s if counts[s] == 1 else b) for b, s in last.items()}


def expand_spec(
    spec: Dict[str, Any], sweep_dir: str, device: Optional[str] = None
) -> List[SweepRun]:
    """The runs of a checked spec under ``sweep_dir``: its grid in order, seeds innermost
    (``device``: every run's ``--device``)."""
    bindings = list(spec["parameters"])
    short = short_names(bindings + [spec["seed_binding"]])
    runs = []
    for values in itertools.product(*(spec["parameters"][b] for b in bindings)):
        for seed in spec["seeds"]:
            pairs = list(zip(bindings, values)) + [(spec["seed_binding"], seed)]
            name = "+".join(f"{short[b]}={dir_safe(gin_literal(v))}" for b, v in pairs)
            root_dir = os.path.join(sweep_dir, name)
            params = [f"{b} = {gin_literal(v)}" for b, v in pairs]
            runs.append(
                SweepRun(
                    name,
                    root_dir,
                    train_command(spec, device, root_dir, params),
                    seed=seed,
                    bindings=params[:-1],
                )
            )
    return runs


def train_command(
    spec: Dict[str, Any], device: Optional[str], root_dir: str, params: List[str]
) -> List[str]:
    """The command line of a run (or packed process) of the spec: its files and bindings,
    ``device``, ``root_dir``, then ``params`` (more ``--gin_param`` bindings)."""
    flags = [("--gin_file", f) for f in spec["gin_file"]]
    flags += [("--gin_param", p) for p in spec["gin_param"]]
    if device is not None:
        flags.append(("--device", device))
    flags.append(("--root_dir", root_dir))
    flags += [("--gin_param", p) for p in params]
    return [sys.executable, "-m", "alf_entropy.bin.train"] + [a for flag in flags for a in flag]
