"""``alf-entropy-report``: figures and a control-metrics table for training runs.

Usage::

    alf-entropy-report runs/ppo_cartpole              # -> runs/ppo_cartpole/report/
    alf-entropy-report runs/my_sweep                  # every run under a sweep dir
    alf-entropy-report runs/a runs/b --out_dir runs/cmp

A ``RUN_DIR`` has ``train/`` TensorBoard events (read with TensorBoard's
``EventAccumulator``; steps rewritten after a resume replace the orphaned
ones); a directory without stands for its sub-directories that have them.
The output directory (default ``report/`` under the runs' common parent, or
the run) gets ``entropy.png`` (and target), ``alpha.png``, ``stage.png``,
``return.png`` (and eval return) against env steps, ``overview.png`` with all
four, and ``metrics.csv``/``metrics.md``: one row per run of
:mod:`~alf_entropy.experiments.control_metrics` on the logged iterations
(``summary_interval = 1`` for exact numbers): where tracking starts, its RMSE
and fraction > 5% below target, settling times after target jumps, the
largest alpha change in one iteration, the final (eval) return, and a note
where the entropy never reached the band.  Runs whose configs differ only in
the seed are one curve (mean ± one standard deviation; the stage one line
per seed) and one row of the across-seeds table.

Needs matplotlib: ``pip install -e ".[report]"``.
"""
import argparse
import csv
import math
import os
import re
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from alf_entropy.experiments import control_metrics as cm
from alf_entropy.storage.bindings import read_bindings, write_bindings
from alf_entropy.utils.requirements import MissingDependencyError

__all__ = ["RunData", "find_runs", "load_run", "run_metrics", "write_report", "main"]

PROG = "alf-entropy-report"
TOL = 0.05
_SEED_NAME = re.compile(r"(^|[+,_/-])seed=?\d+")
REPORT_EXTRA = 'pip install -e ".[report]"'
"""What installs the report's figures' dependency (matplotlib)."""
METRIC_COLUMNS = ["run", "group", "seed", "env_steps", "tracking_from_env_step", "tracking_rmse",
                  "frac_5pct_below", "settle_env_steps", "max_alpha_change_x", "max_alpha_change",
                  "final_eval_return", "final_return", "note"]
NOT_REACHED = "target not reached in this run"
"""The ``note`` of a run whose entropy never came within the band or below it."""
COUNT_COLUMNS = frozenset({"seed", "env_steps", "tracking_from_env_step"})
"""Columns of env-step (or seed) counts: printed as integers, never ``1.229e+04``."""


class RunData:
    """One run's scalars (tag -> ``(steps, values)`` float64 arrays) and
    ``operative_config.gin`` text (``''`` if missing): its ``seed`` (None if unbound) and
    ``group`` (equal for runs that differ only in the seed)."""

    def __init__(self, run_dir: str, scalars: Dict[str, Tuple[np.ndarray, np.ndarray]],
                 config: str):
        self.run_dir = run_dir
        self.name = os.path.basename(os.path.normpath(run_dir))
        self.scalars = scalars
        self.config = config
        bindings = read_bindings(config)
        seeds = [k for k, v in bindings.items() if k.endswith(".seed") and v.isdigit()]
        self.seed: Optional[int] = int(bindings[seeds[0]]) if seeds else None
        rest = {k: v for k, v in bindings.items() if k not in seeds}
        self.group = write_bindings(rest) if config else _SEED_NAME.sub("", self.name)

    def get(self, tag: str) -> Tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of ``tag`` (empty arrays if it was not logged)."""
        empty = np.zeros(0)
        return self.scalars.get(tag, (empty, empty))

    def env_steps(self, steps: np.ndarray) -> np.ndarray:
        """Map summary steps (iterations) to env steps via the ``env_steps`` scalar."""
        it, val = self.get("env_steps")
        if it.size == 0:
            return np.asarray(steps, dtype=np.float64)
        return np.interp(steps, np.r_[-1.0, it], np.r_[0.0, val])

    def controller_alpha(self) -> Tuple[np.ndarray, np.ndarray]:
        """Per-update alpha ``(iteration, alpha)`` of the controller if it
        wrote debug summaries, else the per-iteration ``alpha``."""
        for tag in sorted(self.scalars):
            if tag.endswith("/alpha") and tag.count("/") == 1 and not tag.startswith("alpha/"):
                return self.scalars[tag]
        return self.get("alpha")


def find_runs(paths: Sequence[str]) -> List[str]:
    """Run dirs (with ``train/``) of the given paths, in order (a sweep's sorted);
    ``ValueError`` if a path holds none."""
    runs: List[str] = []
    for path in paths:
        if os.path.isdir(os.path.join(path, "train")):
            runs.append(path)
            continue
        subs = sorted(os.path.join(path, d) for d in (os.listdir(path) if os.path.isdir(path)
                                                      else [])
                      if os.path.isdir(os.path.join(path, d, "train")))
        if not subs:
            raise ValueError(f"no run (a directory with train/ TensorBoard events) in {path!r}")
        runs.extend(subs)
    return runs


def load_run(run_dir: str) -> RunData:
    """Read all scalar summaries (and the config) of a trainer's root dir."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(os.path.join(run_dir, "train"), size_guidance={ea.SCALARS: 0},
                              purge_orphaned_data=True)
    acc.Reload()
    scalars = {}
    for tag in acc.Tags()["scalars"]:
        # In step order: a run resumed within the same second as its last write has two
        # event files whose names may sort either way.
        events = sorted(acc.Scalars(tag), key=lambda e: e.step)
        scalars[tag] = (np.array([e.step for e in events], dtype=np.float64),
                        np.array([e.value for e in events], dtype=np.float64))
    config_path = os.path.join(run_dir, "operative_config.gin")
    config = ""
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = f.read()
    return RunData(run_dir, scalars, config)


def _aligned(run: RunData, a: str, b: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps logged for both ``a`` and ``b`` and their values there (last per step)."""
    sa, va = run.get(a)
    sb, vb = run.get(b)
    da, db = dict(zip(sa, va)), dict(zip(sb, vb))
    steps = np.array(sorted(set(da) & set(db)), dtype=np.float64)
    return steps, np.array([da[s] for s in steps]), np.array([db[s] for s in steps])


def run_metrics(run: RunData, tol: float = TOL) -> Dict[str, Any]:
    """One run's row, keyed by ``METRIC_COLUMNS`` (``tol``: the relative band): NaN where
    the run lacks the data; ``note`` is ``NOT_REACHED`` (with the final entropy and target)
    where the entropy never came within the band or below it."""
    steps, entropy, target = _aligned(run, "entropy", "target_entropy")
    x = run.env_steps(steps)
    nan = math.nan
    row: Dict[str, Any] = {c: nan for c in METRIC_COLUMNS}
    row["note"] = ""
    it, env = run.get("env_steps")
    row.update(run=run.name, group="", seed=run.seed, env_steps=int(env[-1]) if env.size else nan)
    if steps.size:
        start = cm.warmup_end(entropy, target, tol)
        row["tracking_from_env_step"] = int(round(float(x[start]))) if start < x.size else nan
        row["tracking_rmse"] = cm.tracking_rmse(entropy, target, start)
        row["frac_5pct_below"] = cm.fraction_below(entropy, target, tol, start)
        settle = cm.settling_times(entropy, target, tol=tol, x=x)
        row["settle_env_steps"] = ";".join("never" if math.isnan(s) else f"{s:.0f}" for s in settle)
        if start == steps.size:  # its tracking metrics are empty: say why
            row["note"] = (f"{NOT_REACHED} (final entropy {entropy[-1]:.3g}, "
                           f"target {target[-1]:.3g})")
    groups, alpha = run.controller_alpha()
    if alpha.size:
        change = cm.largest_alpha_change(alpha, groups)
        row["max_alpha_change_x"] = change.factor
        row["max_alpha_change"] = (f"{change.before:.3g} -> {change.after:.3g} in iteration "
                                   f"{change.group:.0f}")
    row["final_eval_return"] = cm.final_value(run.get("eval/return")[1])
    row["final_return"] = cm.final_value(run.get("return")[1])
    return row


def _fmt(value: Any, column: str = "") -> str:
    """A table cell: counts (``COUNT_COLUMNS``) as integers, other numbers to 4 significant
    digits, "–" when missing (NaN, None or "")."""
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "–"
        if column in COUNT_COLUMNS and math.isfinite(value):
            return f"{value:.0f}"
        return f"{value:.4g}"
    return "–" if value is None or value == "" else str(value)


def _write_tables(rows: List[Dict[str, Any]], out_dir: str) -> Tuple[str, str]:
    csv_path = os.path.join(out_dir, "metrics.csv")
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=METRIC_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    md_path = os.path.join(out_dir, "metrics.md")
    table = _markdown(METRIC_COLUMNS, [[_fmt(r[c], c) for c in METRIC_COLUMNS] for r in rows])
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(f"Control metrics (band ±{TOL:.0%} of the target; computed on the logged "
                "iterations; tracking starts when the entropy first comes within the band "
                f"or below it).\n\n{table}\n" + _group_table(rows))
    return csv_path, md_path


def _markdown(header: Sequence[str], rows: List[List[str]]) -> str:
    return "\n".join("| " + " | ".join(map(str, r)) + " |"
                     for r in [header, ["---"] * len(header), *rows])


GROUP_COLUMNS = ("tracking_rmse", "frac_5pct_below", "max_alpha_change_x", "final_eval_return")
"""The metrics summarised over the seeds of each group."""


def _group_table(rows: List[Dict[str, Any]]) -> str:
    """Mean and 95% bootstrap interval over the seeds of each group of >= 2 runs."""
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    groups = {g: rs for g, rs in groups.items() if len(rs) > 1}
    if not groups:
        return ""
    lines = []
    for group, rs in groups.items():
        cells = [group, len(rs)]
        for col in GROUP_COLUMNS:
            mean, lo, hi = cm.bootstrap_ci([r[col] for r in rs])
            cells.append("–" if math.isnan(mean) else f"{mean:.4g} [{lo:.4g}, {hi:.4g}]")
        lines.append(cells)
    return ("\nAcross seeds: mean [95% bootstrap interval] per group.\n\n"
            + _markdown(["group", "seeds", *GROUP_COLUMNS], lines) + "\n")


def _group_label(runs: List[RunData], parent: str) -> str:
    """The group's name: its runs' name without the seed, else ``parent``
    (seeds of one sweep named only ``seed=N``), else the first run's name."""
    names = [_SEED_NAME.sub("", r.name).strip("+,_-/") for r in runs]
    return names[0] or parent or runs[0].name


def _mean_band(runs: List[RunData], tag: str, x_tag: Optional[str] = None):
    """``(x, mean, std)`` of ``tag`` over the group's runs, on the first run's x
    (restricted to the range every run covers)."""
    curves = []
    for run in runs:
        steps, values = run.get(tag)
        if steps.size == 0:
            continue
        x = run.env_steps(steps) if x_tag is None else steps  # *_vs_env_steps: env steps
        order = np.argsort(x, kind="stable")
        curves.append((x[order], values[order]))
    if not curves:
        return None
    x0 = curves[0][0]
    hi = min(c[0][-1] for c in curves)
    x0 = x0[x0 <= hi]
    ys = np.stack([np.interp(x0, cx, cy) for cx, cy in curves])
    return x0, ys.mean(0), ys.std(0), len(curves)


def _plot(ax, runs, tag, color, label, log=False, style="-", x_tag=None, step=False):
    band = _mean_band(runs, tag, x_tag)
    if band is None:
        return
    x, mean, std, n = band
    kw = dict(color=color, linestyle=style, label=label)
    if step:
        ax.step(x, mean, where="post", **kw)
    else:
        ax.plot(x, mean, **kw)
    if n > 1:
        lo, hi = mean - std, mean + std
        if log:
            lo = np.maximum(lo, mean * 0.05)
        ax.fill_between(x, lo, hi, color=color, alpha=0.2, linewidth=0)
    if log:
        ax.set_yscale("log")


_PANELS = {
    "entropy": "entropy (solid) and target (dashed)",
    "alpha": "alpha (log scale)",
    "stage": "stage (<-2 estimating, -2 init, -1 free, 0/1 adjust)",
    "return": "return (solid) and eval return (dashed)",
}


def _draw(ax, name: str, groups: List[List[RunData]], labels: List[str]) -> None:
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
            _plot(ax, runs, "return_vs_env_steps", c, label, x_tag="env")
            _plot(ax, runs, "eval/return_vs_env_steps", c, None, style="--", x_tag="env")
    ax.set_title(_PANELS[name], fontsize=9)
    ax.set_xlabel("env steps")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _group(runs: List[RunData]) -> List[List[RunData]]:
    groups: Dict[str, List[RunData]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    return list(groups.values())


def write_report(
    run_dirs: Sequence[str], out_dir: Optional[str] = None, dpi: int = 80
) -> Dict[str, Any]:
    """Write the figures and metric tables of some runs (see the module docstring).

    Returns:
        dict: ``out_dir``, ``figures`` (paths), ``csv``, ``markdown`` and ``rows``.

    Raises:
        ValueError: if a path holds no run.
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

    dirs = find_runs(run_dirs)
    runs = [load_run(d) for d in dirs]
    common = dirs[0] if len(dirs) == 1 else os.path.commonpath([os.path.abspath(d) for d in dirs])
    if len(dirs) > 1:
        # Runs are named by their path below the common parent (sweep/run).
        for run in runs:
            run.name = os.path.relpath(os.path.abspath(run.run_dir), common)
    if out_dir is None:
        out_dir = os.path.join(common, "report")
    os.makedirs(out_dir, exist_ok=True)
    groups = _group(runs)
    parent = os.path.basename(common) if len(dirs) > 1 else ""
    labels = [_group_label(runs_of_group, parent) for runs_of_group in groups]
    rows = []
    for runs_of_group, label in zip(groups, labels):
        for run in runs_of_group:
            row = run_metrics(run)
            row["group"] = label
            rows.append(row)
    csv_path, md_path = _write_tables(rows, out_dir)
    figures = []
    for name in [*_PANELS, "overview"]:
        panels = list(_PANELS) if name == "overview" else [name]
        fig, axes = plt.subplots(*((2, 2) if len(panels) > 1 else (1, 1)), squeeze=False,
                                 figsize=(11, 6.5) if len(panels) > 1 else (6, 3.6))
        for ax, panel in zip(axes.flat, panels):
            _draw(ax, panel, groups, labels)
        fig.tight_layout()
        figures.append(os.path.join(out_dir, f"{name}.png"))
        fig.savefig(figures[-1], dpi=dpi)
        plt.close(fig)
    return {"out_dir": out_dir, "figures": figures, "csv": csv_path, "markdown": md_path,
            "rows": rows}


def main(argv: Optional[List[str]] = None) -> int:
    """``alf-entropy-report``: exit status 0, 2 for bad input or a missing dependency, 130
    when stopped by Ctrl-C."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run dirs or dirs of runs")
    parser.add_argument("--out_dir", default=None,
                        help="output dir (default: <common parent>/report)")
    parser.add_argument("--dpi", type=int, default=80, help="PNG resolution")
    args = parser.parse_args(argv)
    try:
        result = write_report(args.run_dirs, args.out_dir, dpi=args.dpi)
    except (ValueError, MissingDependencyError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # asked for: one line, not an error or a traceback
        print(f"{PROG}: stopped by SIGINT; run the same command to write the report",
              file=sys.stderr)
        return 130
    with open(result["markdown"], encoding="utf-8") as f:
        print(f.read())
    print(f"{PROG}: wrote {len(result['figures'])} figures and metrics to {result['out_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
