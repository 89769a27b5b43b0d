"""Start a function of ``tests.distributed.workers`` on N local gloo ranks.

Each rank is a fresh ``python -m tests.distributed.workers NAME OUT_DIR``
subprocess with torchrun's environment variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``) and gloo
bound to the loopback interface, so nothing leaves this machine.
"""

import os
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment for a rank: repo on the path, loopback only, 1 thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def run_ranks(
    name: str,
    out_dir: str,
    world_size: int = 2,
    timeout_s: float = 120.0,
    env: Optional[Dict[str, str]] = None,
) -> List[subprocess.CompletedProcess]:
    """Run ``workers.NAME(out_dir)`` on ``world_size`` ranks and wait for all.

    Returns:
        One ``CompletedProcess`` per rank (``returncode``, ``stdout``,
        ``stderr``); ranks still running after ``timeout_s`` are killed and
        get ``returncode=None``.
    """
    port = str(free_port())
    procs = []
    for r in range(world_size):
        rank_env = local_env(env)
        rank_env.update(
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.distributed.workers", name, out_dir],
                cwd=REPO_ROOT,
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + timeout_s
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            code = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            code = None
        results.append(subprocess.CompletedProcess(p.args, code, out, err))
    return results


def torchrun_cmd(args: List[str]) -> List[str]:
    """The command ``python -m torch.distributed.run --standalone --nproc_per_node 2 ARGS``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        *args,
    ]


def torchrun(
    args: List[str], timeout_s: float = 180.0, env: Optional[Dict[str, str]] = None
) -> subprocess.CompletedProcess:
    """Run :func:`torchrun_cmd` ``(args)`` to completion, capturing its output."""
    return subprocess.run(
        torchrun_cmd(args),
        cwd=REPO_ROOT,
        env=local_env(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
