"""Whole training jobs through `python -m pipeline train`, contender against contender: a config
(default: configs/demo.yaml, the default sentiment job) in each precision under each contender's
overrides, e.g. eager vs CUDA graphs. Each job is its own process; figures are the job's own
(metrics.json: training samples/s with compile time left out, compile seconds, MFU, dev and test
score) plus the process's wall time, which includes start-up, data preparation and compilation.
A contender `before=PATH` runs the pipeline package found under PATH (another checkout's
`pipeline/`, e.g. from `git archive`), so two versions of the code can be measured side by side.
    python benchmarks/bench_train.py --contenders eager:train.compile=off graphs:train.compile=reduce-overhead
    python benchmarks/bench_train.py --quick   # CPU smoke run: 1 epoch of a tiny model
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, WORK, markdown_table, median, ratio, save

FIGURES = {"samples/s": "perf/train_samples_per_s", "tokens/s": "perf/train_tokens_per_s", "MFU": "perf/mfu",
           "MFU padded": "perf/mfu_padded",
           "compile s": "perf/compile_s", "compiles": "perf/compiles", "train s": "perf/train_time_s",
           "dev": "eval/main", "test": "test/main"}


def contender(spec: str) -> tuple[str, list[str], str | None]:
    """NAME:k=v,k=v or NAME=PATH:k=v (code from PATH) -> (name, overrides, pythonpath)."""
    head, _, overrides = spec.partition(":")
    name, _, path = head.partition("=")
    return name, [o for o in overrides.split(",") if o], path or None


def run_job(config: str, overrides: list[str], pythonpath: str | None, tag: str) -> dict:
    out = WORK / tag
    # `python -m` puts its working directory first on sys.path: that contender's code runs from its folder
    cwd = Path(pythonpath).resolve() if pythonpath else ROOT
    command = [sys.executable, "-m", "pipeline", "train", str((ROOT / config).resolve()), *overrides,
               f"output_dir={out}", f"tracking.uri=sqlite:///{WORK / 'mlflow.db'}", "tracking.system_metrics=false"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {"wall_s": wall, **{label: metrics.get(key) for label, key in FIGURES.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--overrides", nargs="*", default=[], help="for every job, e.g. train.epochs=3")
    parser.add_argument("--contenders", nargs="+", default=["eager:train.compile=off",
                                                             "graphs:train.compile=reduce-overhead"])
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--name", default="train", help="the benchmark's name in results/NAME-MACHINE-DATE.json")
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: 1 epoch of preset:bangla-tiny")
    args = parser.parse_args()
    if args.quick:
        args.overrides += ["model=preset:bangla-tiny", "train.epochs=1"]
        args.precisions, args.name = "fp32", "train-quick"
    jobs = [(c, p) for c in map(contender, args.contenders) for p in args.precisions.split(",")]
    runs: dict[str, list[dict]] = {f"{c[0]} {p}": [] for c, p in jobs}
    for rep in range(args.reps):  # contenders alternate, the first one rotates
        for (name, overrides, path), p in jobs[rep % len(jobs):] + jobs[:rep % len(jobs)]:
            label = f"{name} {p}"
            figures = run_job(args.config, [*args.overrides, f"precision={p}", *overrides], path,
                              f"{label.replace(' ', '-')}-{rep}")
            runs[label].append(figures)
            print(label, figures, flush=True)
    first = next(iter(runs))
    rows = [{"contender": label, **{k: median(r, k) if r[0].get(k) is not None else None
                                    for k in ("wall_s", *FIGURES)},
             f"samples/s vs {first}": ratio(r, runs[first], "samples/s")} for label, r in runs.items()]
    columns = ["contender", "samples/s", f"samples/s vs {first}", "tokens/s", "MFU", "MFU padded", "compile s",
               "compiles", "train s", "wall_s", "dev", "test"]
    save(args.name, rows, columns, vars(args), runs)
    print(markdown_table(rows, columns))


if __name__ == "__main__":
    main()
