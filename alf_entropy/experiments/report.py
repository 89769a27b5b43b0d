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

The figures need matplotlib (``pip install -e ".[report]"``); without it the
tables are written alone, with one line saying so.
"""

import argparse
import math
import os
import re
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from alf_entropy.config.bindings import read_bindings, write_bindings
from alf_entropy.experiments import control_metrics as cm
from alf_entropy.experiments.figures import write_figures
from alf_entropy.experiments.report_tables import METRIC_COLUMNS, TOL, grouped, write_tables
from alf_entropy.utils.requirements import MissingDependencyError

__all__ = ["RunData", "find_runs", "load_run", "run_metrics", "write_report", "main"]

PROG = "alf-entropy-report"
_SEED_NAME = re.compile(r"(^|[+,_/-])seed=?\d+")
NOT_REACHED = "target not reached in this run"
"""The ``note`` of a run whose entropy never came within the band or below it."""
STOPPED_EARLY = "stopped before its limit"
"""The ``note`` of a run whose logged iterations end before its limit (stopped, or resumable)."""


class RunData:
    """One run's scalars (tag -> ``(steps, values)`` float64 arrays) and
    ``operative_config.gin`` text (``''`` if missing): its ``seed`` (None if unbound) and
    ``group`` (equal for runs that differ only in the seed)."""

    def __init__(
        self, run_dir: str, scalars: Dict[str, Tuple[np.ndarray, np.ndarray]], config: str
    ):
        self.run_dir = run_dir
        self.name = os.path.basename(os.path.normpath(run_dir))
        self.scalars = scalars
        self.config = config
        self.bindings = read_bindings(config)
        seeds = [k for k, v in self.bindings.items() if k.endswith(".seed") and v.isdigit()]
        self.seed: Optional[int] = int(self.bindings[seeds[0]]) if seeds else None
        rest = {k: v for k, v in self.bindings.items() if k not in seeds}
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
    runs = []
    for path in paths:
        if os.path.isdir(os.path.join(path, "train")):
            runs.append(path)
            continue
        subs = sorted(
            os.path.join(path, d)
            for d in (os.listdir(path) if os.path.isdir(path) else [])
            if os.path.isdir(os.path.join(path, d, "train"))
        )
        if not subs:
            raise ValueError(f"no run (a directory with train/ TensorBoard events) in {path!r}")
        runs.extend(subs)
    return runs


def load_run(run_dir: str) -> RunData:
    """Read all scalar summaries (and the config) of a trainer's root dir."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(
        os.path.join(run_dir, "train"), size_guidance={ea.SCALARS: 0}, purge_orphaned_data=True
    )
    acc.Reload()
    scalars = {}
    for tag in acc.Tags()["scalars"]:
        # In step order: a run resumed within the same second as its last write has two
        # event files whose names may sort either way.
        events = sorted(acc.Scalars(tag), key=lambda e: e.step)
        scalars[tag] = (
            np.array([e.step for e in events], dtype=np.float64),
            np.array([e.value for e in events], dtype=np.float64),
        )
    config_path = os.path.join(run_dir, "operative_config.gin")
    config = ""
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = f.read()
    return RunData(run_dir, scalars, config)


def _aligned(run, a, b):
    """Steps logged for both ``a`` and ``b`` and their values there (last per step)."""
    da, db = dict(zip(*run.get(a))), dict(zip(*run.get(b)))
    steps = sorted(set(da) & set(db))
    return (
        np.array(steps, dtype=np.float64),
        np.array([da[s] for s in steps]),
        np.array([db[s] for s in steps]),
    )


def run_metrics(run: RunData, tol: float = TOL) -> Dict[str, Any]:
    """One run's row, keyed by ``METRIC_COLUMNS`` (``tol``: the relative band): NaN where
    the run lacks the data; ``note`` is ``NOT_REACHED`` (with the final entropy and target)
    where the entropy never came within the band or below it."""
    steps, entropy, target = _aligned(run, "entropy", "target_entropy")
    x = run.env_steps(steps)
    nan = math.nan
    env = run.get("env_steps")[1]
    row = dict.fromkeys(METRIC_COLUMNS, nan)
    row.update(
        run=run.name, group="", seed=run.seed, env_steps=int(env[-1]) if env.size else nan, note=""
    )
    if steps.size:
        start = cm.warmup_end(entropy, target, tol)
        row["tracking_from_env_step"] = int(round(float(x[start]))) if start < x.size else nan
        row["tracking_rmse"] = cm.tracking_rmse(entropy, target, start)
        row["frac_5pct_below"] = cm.fraction_below(entropy, target, tol, start)
        settle = cm.settling_times(entropy, target, tol=tol, x=x)
        row["settle_env_steps"] = ";".join("never" if math.isnan(s) else f"{s:.0f}" for s in settle)
        if start == steps.size:  # its tracking metrics are empty: say why
            row["note"] = (
                f"{NOT_REACHED} (final entropy {entropy[-1]:.3g}, target {target[-1]:.3g})"
            )
    row["note"] = "; ".join(n for n in (row["note"], limit_note(run)) if n)
    groups, alpha = run.controller_alpha()
    if alpha.size:
        change = cm.largest_alpha_change(alpha, groups)
        row["max_alpha_change_x"] = change.factor
        row["max_alpha_change"] = (
            f"{change.before:.3g} -> {change.after:.3g} in iteration {change.group:.0f}"
        )
    row["final_eval_return"] = cm.final_value(run.get("eval/return")[1])
    row["final_return"] = cm.final_value(run.get("return")[1])
    return row


def limit_note(run: RunData) -> str:
    """``STOPPED_EARLY`` with the run's limits and logged progress if its logged iterations
    end before its limits (``num_iterations``/``num_env_steps`` of its config; the last
    ``summary_interval - 1`` iterations may go unlogged), else ``""``."""
    it, env = run.get("env_steps")
    values = {k.rsplit(".", 1)[-1]: int(v) for k, v in run.bindings.items() if v.isdigit()}
    limits = {k: values[k] for k in ("num_iterations", "num_env_steps") if values.get(k)}
    if not (it.size and limits):
        return ""
    iterations = int(it[-1]) + 1  # the step is the iteration's index
    most = iterations + values.get("summary_interval", 1) - 1  # done, at most
    if most >= limits.get("num_iterations", math.inf) or env[-1] / iterations * most >= limits.get(
        "num_env_steps", math.inf
    ):
        return ""
    return (
        f"{STOPPED_EARLY} ({', '.join(f'{k} = {v}' for k, v in limits.items())}): "
        f"{iterations} iterations, {env[-1]:.0f} env steps logged"
    )


def _group_label(runs, parent):
    """The group's name: its first run's name without the seed, else ``parent``
    (seeds of one sweep named only ``seed=N``), else the first run's name."""
    name = _SEED_NAME.sub("", runs[0].name).strip("+,_-/")
    return name or parent or runs[0].name


def write_report(
    run_dirs: Sequence[str], out_dir: Optional[str] = None, dpi: int = 80
) -> Dict[str, Any]:
    """Write the metric tables and figures of some runs (see the module docstring).

    Returns:
        dict: ``out_dir``, ``figures`` (paths; none without matplotlib), ``no_figures``
        (why there are none, else None), ``csv``, ``markdown`` and ``rows``.

    Raises:
        ValueError: if a path holds no run.
    """
    dirs = find_runs(run_dirs)
    runs = [load_run(d) for d in dirs]
    common, parent = dirs[0], ""
    if len(dirs) > 1:
        common = os.path.commonpath([os.path.abspath(d) for d in dirs])
        parent = os.path.basename(common)
        # Runs are named by their path below the common parent (sweep/run).
        for run in runs:
            run.name = os.path.relpath(os.path.abspath(run.run_dir), common)
    if out_dir is None:
        out_dir = os.path.join(common, "report")
    os.makedirs(out_dir, exist_ok=True)
    groups = grouped(runs, lambda run: run.group)
    labels = [_group_label(runs_of_group, parent) for runs_of_group in groups]
    rows = [
        {**run_metrics(run), "group": label}
        for runs_of_group, label in zip(groups, labels)
        for run in runs_of_group
    ]
    csv_path, md_path = write_tables(rows, out_dir)
    try:
        figures, no_figures = write_figures(groups, labels, out_dir, dpi), None
    except MissingDependencyError as e:  # the tables need no figures
        figures, no_figures = [], str(e)
    return {
        "out_dir": out_dir,
        "figures": figures,
        "no_figures": no_figures,
        "csv": csv_path,
        "markdown": md_path,
        "rows": rows,
    }


def main(argv: Optional[List[str]] = None) -> int:
    """``alf-entropy-report``: exit status 0 (also with the tables alone, without
    matplotlib), 2 for bad input, 130 when stopped by Ctrl-C."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run dirs or dirs of runs")
    parser.add_argument("--out_dir", help="output dir (default: <common parent>/report)")
    parser.add_argument("--dpi", type=int, default=80, help="PNG resolution")
    args = parser.parse_args(argv)
    try:
        result = write_report(args.run_dirs, args.out_dir, dpi=args.dpi)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # asked for: one line, not an error or a traceback
        print(
            f"{PROG}: stopped by SIGINT; run the same command to write the report", file=sys.stderr
        )
        return 130
    with open(result["markdown"], encoding="utf-8") as f:
        print(f.read())
    if result["no_figures"]:
        print(
            f"{PROG}: wrote the metrics to {result['out_dir']}, no figures: {result['no_figures']}",
            file=sys.stderr,
        )
    else:
        print(f"{PROG}: wrote {len(result['figures'])} figures and metrics to {result['out_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
