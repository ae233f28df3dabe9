"""A study one cell at a time vs several at once: wall time, and whether the report's figures agree.

Runs a study (default: the demo, launch/studies/demo.yaml) with each --jobs value given, each into
its own outputs, reports and tracking store (a copy of the study file pointing there), and one
PIPELINE_CACHE for all (features and teacher logits are keyed by content, so the first run's
preparation would otherwise be charged to it alone: a warm-up run fills the cache first unless
--no-warm-up). Quality figures (every cell's status and test scores) must be the same whatever
the concurrency; timing figures are not compared (cells that share cores run slower each).

    python3 benchmarks/bench_study_jobs.py                     # demo, --jobs 1 vs 2
    python3 benchmarks/bench_study_jobs.py --jobs 1,2,4 --study launch/studies/demo.yaml
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from common import ROOT, WORK, save

QUALITY = ["status", "main", "test_scores", "stalled"]
"""cells.csv columns that depend on the training alone, not on how fast it ran."""


def run(study: Path, jobs: int, tag: str) -> dict:
    spec = yaml.safe_load(study.read_text())
    spec["output_root"] = str(WORK / tag / "outputs")
    spec["report_dir"] = str(WORK / tag / "report")
    if spec.get("config"):
        found = next(c for c in (Path(spec["config"]), study.parent / spec["config"]) if c.is_file())
        spec["config"] = str(found.resolve())
    copy = WORK / tag / study.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(yaml.safe_dump(spec, sort_keys=False))
    cmd = [sys.executable, "-m", "pipeline", "study", str(copy), "--jobs", str(jobs),
           f"tracking.uri=sqlite:///{WORK / tag / 'mlflow.db'}"]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (WORK / tag / "study.log").write_text(done.stdout + done.stderr)
    import pandas as pd

    cells = pd.read_csv(WORK / tag / "report" / "cells.csv", keep_default_na=False).set_index("cell")
    return {"jobs": jobs, "exit_code": done.returncode, "wall_s": round(wall, 1),
            "quality": {c: {k: str(cells.loc[c, k]) for k in QUALITY} for c in cells.index},
            "log": str(WORK / tag / "study.log")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--study", default=str(ROOT / "launch" / "studies" / "demo.yaml"))
    p.add_argument("--jobs", default="1,2", help="comma-separated --jobs values, the first is the reference")
    p.add_argument("--no-warm-up", action="store_true", help="skip the run that fills the shared cache first")
    opts = p.parse_args()
    study = Path(opts.study).resolve()
    values = [int(j) for j in opts.jobs.split(",")]
    os.environ.setdefault("PIPELINE_CACHE", str(WORK / "cache"))
    if not opts.no_warm_up:
        run(study, max(values), "warm-up")
    results = [run(study, jobs, f"jobs{jobs}") for jobs in values]
    reference = results[0]
    rows = []
    for r in results:
        differ = [c for c in reference["quality"] if r["quality"].get(c) != reference["quality"][c]]
        rows.append({"jobs": r["jobs"], "exit_code": r["exit_code"], "wall_s": r["wall_s"],
                     "speed-up": round(reference["wall_s"] / r["wall_s"], 2),
                     "cells": len(r["quality"]), "same quality figures": "yes" if not differ else
                     f"no: {', '.join(differ)}"})
    save("study_jobs", rows, ["jobs", "exit_code", "wall_s", "speed-up", "cells", "same quality figures"],
         {"study": str(study.relative_to(ROOT) if study.is_relative_to(ROOT) else study), "jobs": values,
          "warm_up": not opts.no_warm_up}, runs={f"jobs{r['jobs']}": r for r in results})
    print(json.dumps({r["jobs"]: r["log"] for r in results}))


if __name__ == "__main__":
    main()
