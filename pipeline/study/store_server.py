"""One MLflow tracking server on a study's sqlite store while several cells run at once.

Cells that each opened the sqlite file would be that many processes writing one database, where
sqlite answers "database is locked" once a writer waits too long. Through the server every write
goes through one process, MLflow's own `mlflow server`. The experiment is created (with its
artifact location beside the db) before the server starts, so cells still write their artifacts
straight to that folder.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 300  # a busy 2-core machine took 12-21 s to answer /health


@contextlib.contextmanager
def serving(uri: str, log_path: Path) -> Iterator[str]:
    """Serve the sqlite store `uri` on 127.0.0.1 and a free port; yields the server's URI. Other
    stores (a server, a database server) are already safe for several writers: yields `uri`."""
    if not uri.startswith("sqlite:"):
        yield uri
        return
    from pipeline.ui import free_port, server_env

    port = free_port("127.0.0.1")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]
    with log_path.open("w", encoding="utf-8") as log:
        # its own session: stopping it reaches the workers it starts, and a Ctrl-C of the study
        # leaves it up until the cells it serves have ended
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=server_env(), start_new_session=True)
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
