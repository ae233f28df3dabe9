"""One MLflow tracking server on a study's sqlite store while several cells run at once.

Cells that each opened the sqlite file would be that many processes writing one database, where
sqlite answers "database is locked" once a writer waits too long. Through the server every write
goes through one process, MLflow's own `mlflow server`. The experiment is created (with its
artifact location beside the db) before the server starts, so cells still write their artifacts
straight to that folder.

Nothing the runner starts outlives it, even when it is killed with SIGKILL (an out-of-memory kill,
a lost login session), which no `finally` sees. `mlflow server` itself only builds the uvicorn
command and its environment and spawns it as a child (mlflow/server/__init__.py `_run_server`,
through mlflow.utils.process `_exec_cmd`), so killing it orphans the process that serves. The
runner starts this module instead (`python -m pipeline.study.store_server ARGS`): it runs
`mlflow server ARGS` with `_exec_cmd` replaced by an execve, so the process becomes uvicorn itself,
one process (`--workers 1`: uvicorn/main.py runs the server in place, no supervisor), with the
parent-death signal the runner set before the exec (prctl PR_SET_PDEATHSIG survives execve, and
the kernel sends it when the runner's thread that started it dies, however it dies).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 300  # a busy 2-core machine took 12-21 s to answer /health
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@contextlib.contextmanager
def serving(uri: str, log_path: Path) -> Iterator[str]:
    """Serve the sqlite store `uri` on 127.0.0.1 and a free port; yields the server's URI. Other
    stores (a server, a database server) are already safe for several writers: yields `uri`."""
    if not uri.startswith("sqlite:"):
        yield uri
        return
    from pipeline.tracking.ui import free_port, server_env

    port = free_port("127.0.0.1")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pipeline.study.store_server", "--backend-store-uri", uri, "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]
    with log_path.open("w", encoding="utf-8") as log:
        # its own session: stopping it reaches anything it starts, and a Ctrl-C of the study
        # leaves it up until the cells it serves have ended; it dies with this process
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=server_env(), start_new_session=True,
                                preexec_fn=_die_with(os.getpid()))
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(proc, url, log_path)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_until_up(proc: subprocess.Popen, url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=5)
            return
        except OSError:
            why = (f"exited with code {proc.returncode}" if proc.poll() is not None
                   else f"did not answer in {START_TIMEOUT_S} s" if time.monotonic() > deadline else None)
            if why:
                raise RuntimeError(f"the study's MLflow server {why} (log: {log_path})") from None
            time.sleep(0.5)


def _die_with(parent: int):
    """A preexec_fn: SIGKILL this child when `parent`'s starting thread ends (Linux; elsewhere
    the runner's own shutdown is all there is). A parent already gone before prctl ran: exit now."""
    if not sys.platform.startswith("linux"):
        return None

    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return arm


def _exec_in_place(cmd: list[str], *, extra_env: dict | None = None, **_: object) -> None:
    """Stands in for mlflow's `_exec_cmd` when `_run_server` spawns the web server it configured:
    this process becomes that server (execve keeps the pid and the parent-death signal)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(cmd[0], cmd, {**os.environ, **(extra_env or {})})


if __name__ == "__main__":
    import mlflow.server
    from mlflow.cli import cli

    mlflow.server._exec_cmd = _exec_in_place
    cli(["server", *sys.argv[1:]])
