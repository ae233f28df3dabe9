"""A search (TPE + the median pruner) against the grid the same compute buys: the best dev score
each finds per epoch trained, over repetitions.

Both run as search studies of the pipeline (`python -m pipeline study`, one trial at a time) on the
built-in sentiment set cut to a few hundred rows, the tiny preset model, lr x batch size: the grid
is Optuna's GridSampler over LRS x BATCH_SIZES, no pruner; the search is TPE (seeded per
repetition) with the median pruner over the same ranges, asked for as many trials as --search-trials.
Compute is counted in epochs trained (a trial's evaluations: a pruned trial stops early), the unit
both spend alike; the search's figure is its best dev score among the trials completed before it had
trained as many epochs as the whole grid. Wall seconds are shown too (a shared machine: noisy).

    python3 benchmarks/bench_search.py                  # 3 repetitions
    python3 benchmarks/bench_search.py --reps 1 --search-trials 8
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import optuna
import yaml

from common import ROOT, WORK, save

LRS = [1e-4, 1e-3, 3e-3]
BATCH_SIZES = [16, 32]
EPOCHS = 3


def data_overrides() -> list[str]:
    from pipeline.tasks import get_task

    folder = WORK / "data"
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for split, path in get_task("sentiment", {}).write_samples(folder).items():
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text("".join(lines[: {"train": 640}.get(split, 200) + 1]), encoding="utf-8")
        out.append(f"data.{split}={path}")
    return out


def run(name: str, search: dict, data: list[str]) -> dict:
    """One search study, run to its end; its trials' epochs, values and wall time."""
    spec = {"name": name, "output_root": str(WORK / "outputs"), "report_dir": str(WORK / "reports" / name),
            "overrides": ["model=preset:bangla-tiny", "model_config.initializer_range=0.05", "train.max_length=48",
                          f"train.epochs={EPOCHS}", "tracking.system_metrics=false", "infer.bench=false", *data,
                          f"tracking.uri=sqlite:///{WORK / 'mlflow.db'}"],
            "matrix": {"tasks": ["sentiment"]}, "search": search}
    path = WORK / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipeline", "study", str(path)], cwd=ROOT, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    storage = f"sqlite:///{WORK / 'outputs' / name / 'optuna.db'}"
    trials = optuna.load_study(study_name=f"{name}.sentiment", storage=storage).get_trials()
    return {"wall_s": wall, "trials": [(len(t.intermediate_values), t.value, t.state.name) for t in trials]}


def best_within(trials: list, epochs: int) -> tuple[float | None, int]:
    """The best completed trial's value among those run before `epochs` epochs were spent; the epochs spent."""
    spent, best = 0, None
    for n_evals, value, state in trials:
        if spent + n_evals > epochs:
            break
        spent += n_evals
        if state == "COMPLETE":
            best = value if best is None else max(best, value)
    return best, spent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--search-trials", type=int, default=10)
    opts = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    data = data_overrides()
    space = {"train.lr": {"log_uniform": [min(LRS), max(LRS)]}, "train.batch_size": {"categorical": BATCH_SIZES}}
    grid_size = len(LRS) * len(BATCH_SIZES)
    rows, runs = [], {"grid": [], "search": []}
    for rep in range(opts.reps):
        grid = run(f"grid{rep}", {"space": space, "trials": grid_size, "pruner": "none",
                                  "sampler": {"type": "grid", "search_space": {"train.lr": LRS,
                                                                               "train.batch_size": BATCH_SIZES},
                                              "seed": rep}}, data)
        budget = sum(n for n, _, _ in grid["trials"])
        search = run(f"search{rep}", {"space": space, "trials": opts.search_trials,
                                      "sampler": {"type": "tpe", "seed": rep, "n_startup_trials": 4},
                                      "pruner": {"type": "median", "n_startup_trials": 3}}, data)
        g_best, _ = best_within(grid["trials"], budget)
        s_best, _ = best_within(search["trials"], budget)
        all_best = max((v for _, v, s in search["trials"] if s == "COMPLETE"), default=None)
        runs["grid"].append(grid)
        runs["search"].append(search)
        rows.append({"rep": rep + 1, "epochs (grid's budget)": budget, "grid best dev": g_best,
                     "search best dev at that budget": s_best, "search trials in it": _count(search["trials"], budget),
                     "search best dev, all its trials": all_best,
                     "search epochs, all its trials": sum(n for n, _, _ in search["trials"]),
                     "pruned": sum(s == "PRUNED" for _, _, s in search["trials"]),
                     "grid wall s": grid["wall_s"], "search wall s": search["wall_s"]})
        print(rows[-1], flush=True)
    mean = {k: statistics.fmean(r[k] for r in rows if r[k] is not None) for k in rows[0] if k != "rep"}
    rows.append({"rep": "mean", **mean})
    save(f"search-vs-grid-reps{opts.reps}", rows, list(rows[0]),
         {"lrs": LRS, "batch_sizes": BATCH_SIZES, "epochs": EPOCHS, "search_trials": opts.search_trials,
          "data": "built-in sentiment: 640 train, 200 dev, 200 test rows", "model": "preset:bangla-tiny"}, runs)


def _count(trials: list, epochs: int) -> int:
    spent = 0
    for i, (n, _, _) in enumerate(trials):
        if spent + n > epochs:
            return i
        spent += n
    return len(trials)


if __name__ == "__main__":
    main()
