"""Commands the GPU check runs (launchers, pytest, the benchmark), each in its own process group with its
whole output in a log file, and stopped whole: a launcher's workers (torchrun's start their own sessions,
pytest's xdist workers start jobs of their own) go with it, so nothing keeps running on the GPU after a
check is stopped at its budget."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil

GRACE_S = 5
"""After SIGTERM (torchrun and the deepspeed launcher pass it to their workers), before SIGKILL."""


def stop(pid: int, grace_s: float | None = None) -> None:
    """SIGTERM, then after `grace_s` (default GRACE_S) SIGKILL, to the process `pid`, every process
    descending from it (found before the first signal, whatever their session) and its process group."""
    grace_s = GRACE_S if grace_s is None else grace_s
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in tree:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):  # the group is gone (or was never its own)
            pass
        if sig == signal.SIGTERM:
            _, alive = psutil.wait_procs(tree, timeout=grace_s)
            tree = alive
            if not tree:
                break
    psutil.wait_procs(tree, timeout=grace_s)


def run(cmd: list[str], log: Path, timeout: float, cwd: Path, env: dict | None = None) -> tuple[bool, str]:
    """(exit code 0, the log's tail) of `cmd` with its output in `log`, stopped whole (stop) at `timeout`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
        try:
            proc.wait(timeout=timeout)
            late = False
        except subprocess.TimeoutExpired:
            late = True
            stop(proc.pid)
            proc.wait()
    tail = log.read_text(errors="replace")[-3000:]
    if late:
        return False, f"stopped after {timeout:.0f} s (its process tree with it): {tail[-1500:]}"
    return proc.returncode == 0, tail

