"""``alf-entropy-sweep``: train a grid of gin bindings x seeds, then report.

Usage::

    alf-entropy-sweep --spec sweep.json --sweep_dir runs/my_sweep --jobs 2
    alf-entropy-sweep --spec sweep.json --sweep_dir /shared/sweep --ray_address auto

The spec is a small JSON file, in the spirit of ALF's ``grid_search``::

    {
      "gin_file": ["ppo_cartpole.gin"],
      "gin_param": ["OnPolicyTrainer.num_env_steps = 50000"],
      "parameters": {
        "EntropyTargetAlgorithm.target_entropy": [0.5, 0.6],
        "EntropyTargetAlgorithm.fast_update_rate": [0.1, 0.69]
      },
      "seeds": [0, 1, 2]
    }

* ``gin_file`` / ``gin_param`` (optional): passed to every run, as
  ``alf-entropy-train``'s ``--gin_file`` / ``--gin_param``.
* ``parameters``: binding -> list of values (gin literals as JSON numbers,
  strings such as ``"@LinearScheduler()"``, booleans, lists); every
  combination is a configuration.
* ``seeds`` (default ``[0]``): each configuration runs once per seed, bound
  through ``seed_binding`` (default ``"OnPolicyTrainer.seed"``).

Each run has its root dir ``<sweep_dir>/<name>``, named by its bindings'
last parts (whole names where two clash), e.g.
``target_entropy=0.5+fast_update_rate=0.1+seed=1``, and its output in
``<run dir>/train.log``.  A finished run (exit status 0: a run a signal
stopped exits 128 + n) gets a ``sweep_done.json`` marker with its command: a
rerun skips it if the spec gives the same command now, and refuses to start,
writing nothing, if it gives another (use a new ``--sweep_dir`` or delete
those runs); unfinished runs resume from their
checkpoints.  A failed run is reported at the end with its error line
without stopping the others (exit status 1); one whose directory another
process trains in is "already running".  Then ``<sweep_dir>/report`` is
written (``alf-entropy-report``).  Ctrl-C starts no more runs and stops the
running ones after their iteration, with a checkpoint
(:class:`~alf_entropy.experiments.sweep_runs.Launcher`).

``--pack_seeds`` trains the seeds of a configuration as one process of
several agents (``<trainer>.seeds``), each writing to its run's directory
(:func:`pack_seeds`; same runs, markers and report); ``--pack_targets`` also
the configurations that differ only in the controller's target entropy.
Runs are ``--jobs`` local processes, or with ``--ray_address`` (an address,
``auto``, or ``local`` for a private instance) one-CPU Ray tasks on a cluster
sharing ``sweep_dir``'s file system (``pip install -e .[ray]``).
"""

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

from alf_entropy.experiments.packing import link_agent_dirs, pack_seeds
from alf_entropy.experiments.sweep_runs import ALREADY_RUNNING, DONE_FILE, run_local, run_ray
from alf_entropy.experiments.sweep_spec import PROG, SweepRun, check_spec, expand_spec, load_spec
from alf_entropy.utils.checks import check_int

__all__ = ["DONE_FILE", "SweepRun", "load_spec", "expand_spec", "pack_seeds", "run_sweep", "main"]


def _recorded_arguments(run):
    """The :func:`_arguments` of the command in the run's done marker: ``None`` if it has
    none, ``[]`` if it is unreadable (no spec's command)."""
    path = os.path.join(run.root_dir, DONE_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            command = json.load(f).get("command")
    except (OSError, ValueError, AttributeError):
        return []
    return _arguments(command) if isinstance(command, list) else []


def _arguments(command):
    """A command's arguments without the interpreter and ``--root_dir DIR``
    (the run's directory is where the marker is, however it was spelt)."""
    args = command[1:]
    while "--root_dir" in args:
        i = args.index("--root_dir")
        args = args[:i] + args[i + 2 :]
    return args


def run_sweep(
    spec: Dict[str, Any],
    sweep_dir: str,
    jobs: int = 1,
    ray_address: Optional[str] = None,
    device: Optional[str] = None,
    report: bool = True,
    log=print,
    pack: bool = False,
    pack_targets: bool = False,
) -> Dict[str, Any]:
    """Run (or continue) a sweep and write its report (see the module docstring).

    Args:
        spec: a spec (checked here).
        sweep_dir: where the runs' root dirs go.
        jobs: parallel local processes (>= 1); ignored with ``ray_address``.
        ray_address: run on Ray instead (``auto``, ``local`` or an address).
        device: ``--device`` for every run.
        report: write ``<sweep_dir>/report`` at the end.
        log: called with progress lines.
        pack: ``--pack_seeds``.
        pack_targets: ``--pack_targets`` (implies ``pack``).

    Returns:
        dict: ``runs`` (all), ``skipped``, ``failed``, ``running`` (names),
        ``status`` (name -> exit status of the runs started now), ``errors`` (name
        -> error line of each that did not succeed), ``report`` (or None).

    Raises:
        ValueError: a bad spec or ``jobs``, Ray missing, or finished runs whose
            recorded command differs (nothing written or run then).
    """
    spec = check_spec(spec)
    check_int("jobs", jobs, minimum=1)
    runs = expand_spec(spec, sweep_dir, device)
    recorded = [_recorded_arguments(r) for r in runs]  # None: not done
    stale = [
        (r, old)
        for r, old in zip(runs, recorded)
        if old is not None and old != _arguments(r.command)
    ]
    if stale:
        run, old = stale[0]
        new = _arguments(run.command)
        was = [a for a in old if a not in new] or "unreadable"
        raise ValueError(
            f"{len(stale)} finished run(s) in {sweep_dir} were made with another command than "
            f"this spec gives (e.g. {run.name}: was {was}, the spec now gives "
            f"{[a for a in new if a not in old]}); use a new --sweep_dir, or delete those run "
            "directories to rerun them"
        )
    os.makedirs(sweep_dir, exist_ok=True)
    with open(os.path.join(sweep_dir, "sweep.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=2)
    todo = [r for r, old in zip(runs, recorded) if old is None]
    skipped = [r.name for r, old in zip(runs, recorded) if old is not None]
    log(f"{PROG}: {len(runs)} runs, {len(skipped)} already done, {len(todo)} to run")
    tasks = (
        pack_seeds(todo, spec, sweep_dir, device, log, targets=pack_targets)
        if pack or pack_targets
        else todo
    )
    for task in tasks:
        if task.members:
            link_agent_dirs(task)
            log(
                f"{PROG}: packing {', '.join(r.name for r in task.members)} into one "
                f"process ({task.root_dir})"
            )
    outcomes = run_ray(tasks, ray_address, log) if ray_address else run_local(tasks, jobs, log)
    status, errors, logs = {}, {}, {}
    for task, (rc, error) in outcomes.items():
        for run in task.members or [task]:
            status[run.name], errors[run.name] = rc, error
            logs[run.name] = os.path.join(task.root_dir, "train.log")
    running = sorted(n for n, rc in status.items() if rc and ALREADY_RUNNING in errors[n])
    failed = sorted(n for n, rc in status.items() if rc != 0 and n not in running)
    result = {
        "runs": runs,
        "skipped": skipped,
        "failed": failed,
        "running": running,
        "status": status,
        "errors": {n: e for n, e in errors.items() if status[n]},
        "report": None,
    }
    with_events = [r.root_dir for r in runs if os.path.isdir(os.path.join(r.root_dir, "train"))]
    if report and with_events:
        from alf_entropy.experiments.report import write_report

        result["report"] = write_report(with_events, os.path.join(sweep_dir, "report"))
        no_figures = result["report"]["no_figures"]
        log(
            f"{PROG}: report in {result['report']['out_dir']}"
            + (f" (tables only, no figures: {no_figures})" if no_figures else "")
        )
    for name in running:
        log(f"{PROG}: already running: {name} (another process trains in its directory)")
    for name in failed:
        log(f"{PROG}: FAILED: {name}: {errors[name]} (see {logs[name]})")
    return result


def main(argv: Optional[List[str]] = None) -> int:
    """``alf-entropy-sweep``: 0 if every run succeeded, 1 if some failed, 2 for bad input,
    130 when stopped by Ctrl-C."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="the sweep's JSON spec")
    parser.add_argument("--sweep_dir", required=True, help="parent dir of the runs")
    parser.add_argument("--jobs", type=int, default=1, help="parallel local runs")
    parser.add_argument("--ray_address", help="run as Ray tasks: an address, 'auto' or 'local'")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--no_report", action="store_true", help="skip the final report")
    parser.add_argument(
        "--pack_seeds",
        action="store_true",
        help="train the seeds of each configuration in one process (OnPolicyTrainer.seeds, "
        "OffPolicyTrainer.seeds)",
    )
    parser.add_argument(
        "--pack_targets",
        action="store_true",
        help="as --pack_seeds, and the configurations that differ only in the controller's "
        "target entropy (a grid binding <controller>.target_entropy of numbers) in one "
        "process too (<trainer>.target_entropies); the seeds alone where the spec has "
        "no such axis",
    )
    args = parser.parse_args(argv)
    try:
        result = run_sweep(
            load_spec(args.spec),
            args.sweep_dir,
            jobs=args.jobs,
            ray_address=args.ray_address,
            device=args.device,
            report=not args.no_report,
            pack=args.pack_seeds,
            pack_targets=args.pack_targets,
        )
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # asked for: one line, not an error or a traceback
        print(
            f"{PROG}: stopped by SIGINT; run the same command to continue (finished runs "
            "are skipped, interrupted ones resume from their checkpoints)",
            file=sys.stderr,
        )
        return 130
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
