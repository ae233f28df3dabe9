"""A recipe over seeds: does it learn on every seed, or do some stall? Each contender (a set of
config overrides) is trained once per seed through the real pipeline in this process; per run the
best dev main metric, the test main metric (and test MAP where the task has it) and whether the
run was tagged stalled (pipeline/measure/collapse.py: the best model's test predictions collapsed).
Per contender: dev mean ± std, minimum, and stalled seeds out of the seeds run. The results go to
benchmarks/studies/results/NAME-SEEDS-MACHINE-DATE.json (SEEDS: `seeds1-10`, `seeds3+5+6+9`).
    python benchmarks/studies/bench_recipes.py --name recipes-sentiment-demo-fp32 --seeds 1-10 \
        --overrides task=sentiment model=preset:bangla-tiny train.epochs=3 train.batch_size=32 train.max_length=64 \
        train.lr=1e-3 precision=fp32 --contenders before: after:model_config.initializer_range=0.05
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import STUDY_RESULTS, last_run, pipeline_run, quiet, save, seed_list, seeds_label  # noqa: E402


def contender(spec: str) -> tuple[str, list[str]]:
    """NAME:k=v,k=v -> (name, overrides)."""
    name, _, overrides = spec.partition(":")
    return name, [o for o in overrides.split(",") if o]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--overrides", nargs="*", default=[], help="for every run, e.g. task=ner")
    parser.add_argument("--contenders", nargs="+", default=["default:"])
    parser.add_argument("--seeds", default="1-10")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one core each run)")
    parser.add_argument("--name", default="recipes",
                        help="the study: recipes-TASK-CONFIG (the results file adds the seeds, machine and date)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quiet()
    runs: dict[str, list[dict]] = {}
    seeds = seed_list(args.seeds)
    for seed in seeds:
        for name, overrides in map(contender, args.contenders):
            start = time.perf_counter()
            metrics = pipeline_run([*args.overrides, *overrides, f"seed={seed}"])
            tags = last_run()[1].data.tags
            run = {"seed": seed, "dev": metrics.get("eval/main"), "test": metrics.get("test/main"),
                   "test_map": metrics.get("test/map"), "stalled": tags.get("stalled") == "true",
                   "stall_reason": tags.get("stall_reason", ""), "wall_s": time.perf_counter() - start}
            runs.setdefault(name, []).append(run)
            print(f"  {name} seed {seed}: dev {run['dev']:.4f} test {run['test']:.4f}"
                  + (f" MAP {run['test_map']:.4f}" if run["test_map"] is not None else "")
                  + (f" STALLED ({run['stall_reason']})" if run["stalled"] else "") + f"  {run['wall_s']:.0f}s",
                  flush=True)
    rows = []
    for name, overrides in map(contender, args.contenders):
        done = runs[name]
        dev = [r["dev"] for r in done]
        maps = [r["test_map"] for r in done if r["test_map"] is not None]
        rows.append({"contender": name, "overrides": " ".join(overrides) or "(none)", "seeds": len(done),
                     "dev mean": statistics.mean(dev), "dev std": statistics.stdev(dev) if len(dev) > 1 else None,
                     "dev min": min(dev), "stalled": sum(r["stalled"] for r in done),
                     "test MAP mean": statistics.mean(maps) if maps else None,
                     "test MAP std": statistics.stdev(maps) if len(maps) > 1 else None,
                     "dev per seed": " ".join(f"{v:.3f}" for v in dev)})
    columns = ["contender", "overrides", "seeds", "dev mean", "dev std", "dev min", "stalled", "test MAP mean",
               "test MAP std", "dev per seed"]
    save(f"{args.name}-{seeds_label(seeds)}", rows, columns,
         {"overrides": args.overrides, "contenders": args.contenders, "seeds": args.seeds, "threads": args.threads},
         runs, results=STUDY_RESULTS)


if __name__ == "__main__":
    main()
