"""`python -m pipeline report --experiment NAME [--uri URI] [--out DIR] [--no-timing] [--device D]`:
a study's runs compared (pipeline/report/, whose docstring lists what it writes)."""
from __future__ import annotations

import argparse

from pipeline.report import write_report


def main(args: list[str]) -> int:
    from pipeline.tracking import resolve_uri

    parser = argparse.ArgumentParser(prog="python -m pipeline report")
    parser.add_argument("--experiment", required=True, help="MLflow experiment (a study's name)")
    parser.add_argument("--uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else the project's store)")
    parser.add_argument("--out", help="output directory (default: reports/EXPERIMENT)")
    parser.add_argument("--no-timing", action="store_true",
                        help="do not time the KD section's models side by side; use the record beside the report "
                             "if it measured the same runs")
    parser.add_argument("--device", help="where to time them: cpu or cuda[:N] (default: cuda if there is one)")
    opts = parser.parse_args(args)
    out = write_report(resolve_uri(opts.uri), opts.experiment, opts.out, timing=not opts.no_timing,
                       device=opts.device)
    print(f"report: {out / 'report.md'}")
    return 0
