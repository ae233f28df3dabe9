"""`python -m pipeline sync RUN_DIR|FILE.jsonl [--uri URI]`: a run's journal uploaded to MLflow."""
from __future__ import annotations

import argparse


def main(args: list[str]) -> int:
    from pipeline.tracking import sync

    parser = argparse.ArgumentParser(prog="python -m pipeline sync")
    parser.add_argument("run_dir", help="a stage's output_dir (it holds journal.jsonl)")
    parser.add_argument("--uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else the journal's)")
    opts = parser.parse_args(args)
    run_id = sync(opts.run_dir, opts.uri)
    print(f"synced {opts.run_dir} into MLflow run {run_id}")
    return 0
