"""A sweep's training processes: each run's ``alf-entropy-train`` (its output in
``<run dir>/train.log``, ``sweep_done.json`` when it exits 0), ``jobs`` at a time here or
as Ray tasks; Ctrl-C starts no more and stops the running ones with a checkpoint."""

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Dict, List, Optional, Tuple

from alf_entropy.experiments.sweep_spec import PROG, SweepRun

__all__ = ["DONE_FILE", "ALREADY_RUNNING", "Launcher", "execute_run", "run_local", "run_ray"]

DONE_FILE = "sweep_done.json"
_ERROR_PREFIX = "alf-entropy-train: error:"
STOPPING = (
    f"{PROG}: SIGINT: no run starts any more; the running ones write a checkpoint "
    "and stop (Ctrl-C again: at once, without one)"
)
ALREADY_RUNNING = "already in use by another run"
"""Part of ``alf-entropy-train``'s error line for a locked run directory."""


def _error_line(log_path, offset):
    """The run's error line in its log after ``offset`` (or its last line)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(_ERROR_PREFIX)]
    return (errors or lines or [""])[-1][:500]


class Launcher:
    """Starts the runs' training processes, each in a session of its own: a Ctrl-C reaches
    only the sweep, which passes one SIGINT to each running process (:meth:`interrupt`), so
    each ends its iteration, writes a checkpoint and exits 130; after that none starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = set()
        self._stopped = False

    def call(self, command: List[str], log: BinaryIO) -> Optional[int]:
        """Run ``command`` (written, then its output, to ``log``) to its end; its exit status,
        or ``None`` if interrupted before it started."""
        with self._lock:
            if self._stopped:
                return None
            log.write(("$ " + " ".join(command) + "\n").encode())
            log.flush()
            # A Ray worker blocks SIGINT and a child inherits the mask: not the run's.
            mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
            try:
                proc = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            self._running.add(proc)
        try:
            while True:
                try:  # with a timeout: Ray's cancel (a KeyboardInterrupt) comes between waits
                    return proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    continue
                except KeyboardInterrupt:  # a Ray task cancelled: stop its run as a Ctrl-C
                    self.interrupt()
        finally:
            with self._lock:
                self._running.discard(proc)

    def interrupt(self) -> None:
        """No run starts any more; each running one gets a SIGINT (a second: stops at once)."""
        with self._lock:
            self._stopped = True
            for proc in self._running:
                proc.send_signal(signal.SIGINT)


def execute_run(
    run: SweepRun, launcher: Optional[Launcher] = None
) -> Tuple[Optional[int], float, str]:
    """Run one training process (output appended to ``<root_dir>/train.log``); mark its runs
    (a packed process's members) done if it exits 0 (a run stopped by a signal exits
    128 + n).  Also the Ray task's body.

    Returns:
        ``(exit status, seconds, error line)``: the status is ``None`` if the sweep was
        interrupted before the run started (``launcher``: a new one if ``None``); the error
        line is the last ``alf-entropy-train: error:`` line (or last output line) of a failed
        run, else ``""``.
    """
    os.makedirs(run.root_dir, exist_ok=True)
    start = time.time()
    log_path = os.path.join(run.root_dir, "train.log")
    with open(log_path, "ab") as log:
        offset = log.tell()
        rc = (launcher or Launcher()).call(run.command, log)
    seconds = time.time() - start
    if rc != 0:
        return rc, seconds, _error_line(log_path, offset)
    for member in run.members or [run]:
        marker = {"command": member.command, "seconds": seconds}
        if run.members:
            marker["packed_in"] = run.root_dir
        with open(os.path.join(member.root_dir, DONE_FILE), "w", encoding="utf-8") as f:
            json.dump(marker, f)
    return rc, seconds, ""


def _log_outcome(log, name, rc, seconds, error):
    """The run's progress line: its outcome (from its exit status and error line)."""
    if rc == 0:
        outcome = "done"
    elif rc in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        outcome = f"stopped by {signal.Signals(rc - 128).name} (resumes on the next run)"
    elif ALREADY_RUNNING in error:
        outcome = "already running"
    else:
        outcome = f"FAILED (exit {rc})"
    log(f"{outcome} {name} in {seconds:.1f}s" + (f": {error}" if error else ""))


Outcomes = Dict[SweepRun, Tuple[int, str]]


def _collect(futures: Dict[concurrent.futures.Future, SweepRun], log, stop) -> Outcomes:
    """Each started run's ``(exit status, error line)`` as its future ends; on Ctrl-C
    ``stop()`` (again on a second one) and, once all have ended, ``KeyboardInterrupt``."""
    outcomes, pending, interrupted = {}, set(futures), None
    while pending:
        try:
            for future in concurrent.futures.as_completed(set(pending)):
                pending.discard(future)
                try:
                    rc, seconds, error = future.result()
                except Exception as e:  # a lost Ray node or worker: report, keep going
                    if interrupted is not None:  # a Ray task cancelled before it started
                        continue
                    rc, seconds, error = -1, 0.0, f"ray task failed: {e}"
                if rc is not None:  # None: not started
                    outcomes[futures[future]] = rc, error
                    _log_outcome(log, futures[future].name, rc, seconds, error)
        except KeyboardInterrupt as e:
            if interrupted is None:
                log(STOPPING)
            interrupted = e
            stop()
    if interrupted is not None:
        raise interrupted
    return outcomes


def run_local(runs: List[SweepRun], jobs: int, log) -> Outcomes:
    """Run ``runs``, ``jobs`` at a time; on Ctrl-C none starts any more and the running ones
    checkpoint and stop (a second Ctrl-C: at once), then ``KeyboardInterrupt`` is raised."""
    launcher = Launcher()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(execute_run, r, launcher): r for r in runs}
        return _collect(futures, log, launcher.interrupt)


def run_ray(runs: List[SweepRun], address: str, log) -> Outcomes:
    """:func:`run_local` as one-CPU Ray tasks (``address``: an address, ``auto`` or
    ``local``); a cancelled task stops its run as a Ctrl-C would (:class:`Launcher`)."""
    try:
        import ray
    except ImportError as e:
        raise ValueError("--ray_address needs Ray: pip install -e '.[ray]'") from e
    started = not ray.is_initialized()
    if started:
        # Workers import alf_entropy like this process does.
        env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            ray.init(
                address=None if address == "local" else address,
                runtime_env={"env_vars": env},
                include_dashboard=False,
                log_to_driver=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ValueError(f"cannot connect to Ray at --ray_address={address!r}: {e}") from e
    try:
        task = ray.remote(num_cpus=1)(execute_run)
        refs = {task.remote(r): r for r in runs}
        return _collect(
            {ref.future(): r for ref, r in refs.items()},
            log,
            lambda: [ray.cancel(ref) for ref in refs],
        )
    finally:
        if started:
            ray.shutdown()
