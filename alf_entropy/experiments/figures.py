"""The report's figures (matplotlib): each control panel against env steps, a group of
runs that differ only in the seed as one curve (mean ± one standard deviation).

A run here is :class:`~alf_entropy.experiments.report.RunData` (its ``get`` and
``env_steps``).
"""

import os
from typing import Any, List

import numpy as np

from alf_entropy.utils.requirements import MissingDependencyError

__all__ = ["REPORT_EXTRA", "PANELS", "write_figures"]

REPORT_EXTRA = 'pip install -e ".[report]"'
"""What installs the report's figures' dependency (matplotlib)."""


def _mean_band(runs, tag):
    """``(x, mean, std, runs)`` of ``tag`` over the group's runs, on the first run's x
    (restricted to the range every run covers): env steps (a ``*_vs_env_steps`` tag is
    logged at them)."""
    curves = []
    for run in runs:
        steps, values = run.get(tag)
        if steps.size == 0:
            continue
        x = steps if tag.endswith("_vs_env_steps") else run.env_steps(steps)
        order = np.argsort(x, kind="stable")
        curves.append((x[order], values[order]))
    if not curves:
        return None
    x0 = curves[0][0]
    hi = min(c[0][-1] for c in curves)
    x0 = x0[x0 <= hi]
    ys = np.stack([np.interp(x0, cx, cy) for cx, cy in curves])
    return x0, ys.mean(0), ys.std(0), len(curves)


def _plot(ax, runs, tag, color, label, log=False, style="-", step=False):
    band = _mean_band(runs, tag)
    if band is None:
        return
    x, mean, std, n = band
    # (a step line is what ax.step(where="post") draws)
    ax.plot(
        x,
        mean,
        color=color,
        linestyle=style,
        label=label,
        drawstyle="steps-post" if step else "default",
    )
    if n > 1:
        lo, hi = mean - std, mean + std
        if log:
            lo = np.maximum(lo, mean * 0.05)
        ax.fill_between(x, lo, hi, color=color, alpha=0.2, linewidth=0)
    if log:
        ax.set_yscale("log")


PANELS = {
    "entropy": "entropy (solid) and target (dashed)",
    "alpha": "alpha (log scale)",
    "stage": "stage (<-2 estimating, -2 init, -1 free, 0/1 adjust)",
    "return": "return (solid) and eval return (dashed)",
}


def _draw(ax, name, groups, labels):
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (runs, group) in enumerate(zip(groups, labels)):
        c = colors[k % len(colors)]
        label = group + (f" ({len(runs)} seeds)" if len(runs) > 1 else "")
        if name == "entropy":
            _plot(ax, runs, "entropy", c, label)
            _plot(ax, runs, "target_entropy", c, None, style="--")
        elif name == "alpha":
            _plot(ax, runs, "alpha", c, label, log=True)
        elif name == "stage":  # levels: one step line per seed, never a mean
            for k_run, run in enumerate(runs):
                _plot(ax, [run], "stage", c, None if k_run else label, step=True)
        else:
            _plot(ax, runs, "return_vs_env_steps", c, label)
            _plot(ax, runs, "eval/return_vs_env_steps", c, None, style="--")
    ax.set_title(PANELS[name], fontsize=9)
    ax.set_xlabel("env steps")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def write_figures(
    groups: List[List[Any]], labels: List[str], out_dir: str, dpi: int = 80
) -> List[str]:
    """Write ``<panel>.png`` of each of :data:`PANELS` and ``overview.png`` (all four).

    Returns:
        list: the figures' paths.

    Raises:
        MissingDependencyError: without matplotlib (the message names :data:`REPORT_EXTRA`).
    """
    try:
        import matplotlib
    except ImportError as e:
        raise MissingDependencyError(
            f"the report's figures need matplotlib, which is not installed: {REPORT_EXTRA}"
        ) from e

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    for name in [*PANELS, "overview"]:
        panels = list(PANELS) if name == "overview" else [name]
        fig, axes = plt.subplots(
            *((2, 2) if len(panels) > 1 else (1, 1)),
            squeeze=False,
            figsize=(11, 6.5) if len(panels) > 1 else (6, 3.6),
        )
        for ax, panel in zip(axes.flat, panels):
            _draw(ax, panel, groups, labels)
        fig.tight_layout()
        figures.append(os.path.join(out_dir, f"{name}.png"))
        fig.savefig(figures[-1], dpi=dpi)
        plt.close(fig)
    return figures
