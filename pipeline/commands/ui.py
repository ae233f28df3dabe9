"""`python -m pipeline ui [--experiment NAME | --study NAME] [--uri URI] [--host H] [--port P]`: the
MLflow UI on the project's tracking store (pipeline/tracking/ui.py: the pages it opens, the server's settings).

The server runs in a session of its own with every process it starts (its uvicorn or gunicorn
workers): SIGTERM or SIGINT (Ctrl-C) to this command ends all of them and frees the port, as does
the server ending on its own; no stray server is left on a login node or in a Slurm job."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from pipeline.errors import UserError
from pipeline.tracking import resolve_uri
from pipeline.tracking.ui import free_port, pages_for, server_env


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline ui")
    parser.add_argument("--experiment", help="open this experiment's runs table")
    parser.add_argument("--study", help="open the compare view of this study's finished cells")
    parser.add_argument("--uri", help="tracking URI (default: tracking store of the project)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address; 0.0.0.0 exposes the UI on purpose")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port")
    opts = parser.parse_args(args)
    uri = resolve_uri(opts.uri)
    if not uri.startswith("sqlite:"):
        raise UserError(f"ui: --uri {uri}: is a server already; open it in a browser")
    port = opts.port or free_port(opts.host)
    base = f"http://{opts.host}:{port}/"
    page, models = pages_for(uri, opts.experiment, opts.study)
    if models:
        print(f"its logged models: {base}{models}")
    print(f"MLflow UI: {base}{page}  (Ctrl-C stops it)", flush=True)
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", opts.host,
           "--port", str(port), "--workers", "1"]
    return serve(cmd, server_env())


GRACE_S = 10.0
"""Seconds the server's processes have to exit after a SIGTERM before they are killed."""


def serve(cmd: list[str], env: dict[str, str]) -> int:
    """Run the server in a process group of its own until it ends, or until this process gets a
    SIGTERM or SIGINT (then 0); either way, end every process left in its group."""
    server = subprocess.Popen(cmd, env=env, start_new_session=True)
    stopped: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopped.append(signum)
        _signal_group(server.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = server.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _end_group(server.pid)
    return 0 if stopped else code


def _end_group(pgid: int) -> None:
    """SIGTERM to every process left in the group, SIGKILL to those still there after GRACE_S."""
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while _signal_group(pgid, 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the process group; False when no process is left in it."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
