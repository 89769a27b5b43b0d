"""The tables of ``alf-entropy-report``: ``metrics.csv`` and ``metrics.md``, one row per run of
the control metrics and, in the Markdown, one per group of seeds (mean and 95% bootstrap
interval)."""

import csv
import math
import os
from typing import Any

import numpy as np

from alf_entropy.experiments import control_metrics as cm

__all__ = [
    "TOL",
    "METRIC_COLUMNS",
    "GROUP_COLUMNS",
    "format_cell",
    "grouped",
    "write_tables",
]

TOL = 0.05
"""The band of the control metrics: within ``TOL`` of the target, relatively."""
METRIC_COLUMNS = [
    "run",
    "group",
    "seed",
    "env_steps",
    "tracking_from_env_step",
    "tracking_rmse",
    "frac_5pct_below",
    "settle_env_steps",
    "max_alpha_change_x",
    "max_alpha_change",
    "final_eval_return",
    "final_return",
    "note",
]
COUNT_COLUMNS = frozenset({"seed", "env_steps", "tracking_from_env_step"})
"""Columns of env-step (or seed) counts: printed as integers, never ``1.229e+04``."""


def format_cell(value: Any, column: str = "") -> str:
    """A table cell: counts (``COUNT_COLUMNS``) as integers, other numbers to 4 significant
    digits, "–" when missing (NaN, None or "")."""
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "–"
        if column in COUNT_COLUMNS:  # (an infinite count prints as inf either way)
            return f"{value:.0f}"
        return f"{value:.4g}"
    return "–" if value is None or value == "" else str(value)


def write_tables(rows, out_dir):
    """Write ``rows`` (``METRIC_COLUMNS``) to ``out_dir``'s ``metrics.csv`` and ``metrics.md``;
    their paths."""
    csv_path = os.path.join(out_dir, "metrics.csv")
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=METRIC_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)  # None as ""
    md_path = os.path.join(out_dir, "metrics.md")
    table = _markdown(
        METRIC_COLUMNS, [[format_cell(r[c], c) for c in METRIC_COLUMNS] for r in rows]
    )
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(
            f"Control metrics (band ±{TOL:.0%} of the target; computed on the logged "
            "iterations; tracking starts when the entropy first comes within the band "
            f"or below it).\n\n{table}\n" + _group_table(rows)
        )
    return csv_path, md_path


def _markdown(header, rows):
    return "\n".join(
        "| " + " | ".join(map(str, r)) + " |" for r in [header, ["---"] * len(header), *rows]
    )


GROUP_COLUMNS = ("tracking_rmse", "frac_5pct_below", "max_alpha_change_x", "final_eval_return")
"""The metrics summarised over the seeds of each group."""


def _group_cell(values):
    """The mean and 95% bootstrap interval of a group's values, with their count where some
    are missing; from one value the mean alone."""
    finite = [v for v in values if math.isfinite(v)]
    mean, lo, hi = cm.bootstrap_ci(finite)
    count = f"{len(finite)} of {len(values)} seeds"
    if len(finite) < 2:
        return f"{mean:.4g} ({count}: no interval)" if finite else "–"
    interval = f"{mean:.4g} [{lo:.4g}, {hi:.4g}]"
    return interval if len(finite) == len(values) else f"{interval} ({count})"


def _group_table(rows):
    """Mean and 95% bootstrap interval over the seeds of each group of >= 2 runs."""
    groups = [rs for rs in grouped(rows, lambda row: row["group"]) if len(rs) > 1]
    if not groups:
        return ""
    lines = []
    for rs in groups:
        cells = [_group_cell([r[col] for r in rs]) for col in GROUP_COLUMNS]
        lines.append([rs[0]["group"], len(rs), *cells])
    return (
        "\nAcross seeds: mean [95% bootstrap interval] per group.\n\n"
        + _markdown(["group", "seeds", *GROUP_COLUMNS], lines)
        + "\n"
    )


def grouped(items, key):
    """``items`` in groups of equal ``key``, in order of first appearance."""
    groups = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.values())
