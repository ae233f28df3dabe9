"""`python -m pipeline ui [--experiment NAME | --study NAME] [--uri URI] [--host H] [--port P]`: the
MLflow UI on the project's tracking store (pipeline/ui.py: the pages it opens, the server's settings)."""
from __future__ import annotations

import argparse
import subprocess
import sys

from pipeline.errors import UserError
from pipeline.tracking import resolve_uri
from pipeline.ui import free_port, pages_for, server_env


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
    try:
        return subprocess.call(cmd, env=server_env())
    except KeyboardInterrupt:
        return 0
