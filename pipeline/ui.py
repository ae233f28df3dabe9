"""`python -m pipeline ui`: the MLflow UI on the project's tracking store, on 127.0.0.1 by default."""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys

from pipeline.errors import UserError
from pipeline.tracking import open_experiment, resolve_uri


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline ui")
    parser.add_argument("--experiment", help="print the URL of this experiment")
    parser.add_argument("--uri", help="tracking URI (default: tracking store of the project)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address; 0.0.0.0 exposes the UI on purpose")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port")
    opts = parser.parse_args(args)
    uri = resolve_uri(opts.uri)
    if not uri.startswith("sqlite:"):
        raise UserError(f"ui: --uri {uri}: is a server already; open it in a browser")
    port = opts.port or free_port(opts.host)
    url = f"http://{opts.host}:{port}/"
    if opts.experiment:
        _, experiment_id = open_experiment(uri, opts.experiment)
        url += f"#/experiments/{experiment_id}"
    print(f"MLflow UI: {url}  (Ctrl-C stops it)", flush=True)
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", opts.host,
           "--port", str(port), "--workers", "1"]
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0
