"""Where a training job's wall time goes beyond training: `python -m pipeline train` as a user runs
it (its own process, the default MLflow store under the working directory, every default), each
phase timed from inside the process by wrapping the function that does it:

- start-up: the interpreter and the imports, up to the command's first line;
- settle: the config settled, output_dir checked (job/plan.py, job/resume.py);
- data: the splits read and tokenized, the prepared-features cache (stage.py: features.*);
- model: the tokenizer and model built or loaded (models.build);
- run start: output_dir cleared, the MLflow run opened, its tags, params and datasets;
- set-up: the FLOP model's counted steps, the loaders, the optimizer (job_loop.setup);
- training: the epochs' training steps (job_loop.train_epoch);
- dev evaluation, best/ written, epoch checkpoints, final evaluations: test, and dev once more, with
  the best weights, their predictions kept (job_loop.evaluate, BestModel.consider, Checkpointer.save);
- inference bench: what best/ costs to serve (Stage.bench_inference, infer.bench);
- outputs: predictions/, metrics.json, report.txt and their MLflow artifacts, the final metrics and the
  run's end;
- other: the rest of the process's wall time (the loop's own bookkeeping, exit).

Phases nest nowhere: each wrapped function's time is counted once, by the outermost wrapper
running. Default job: the WikiQA comparison's (all-MiniLM-L6-v2 on the built-in WikiQA set, bf16,
batch 16, lr 5e-5, 2 epochs, max_length 128, one torch thread); --overrides adds or replaces keys.
    python benchmarks/bench_job_time.py [--reps 2] [--overrides infer.budget_s=5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, WORK, save

JOB = ["task=wikiqa", "model=sentence-transformers/all-MiniLM-L6-v2", "precision=bf16", "train.batch_size=16",
       "train.lr=5e-5", "train.warmup_ratio=0.1", "train.weight_decay=0.01", "train.epochs=2",
       "train.max_length=128", "seed=0"]
PHASES = ("start-up", "settle", "data", "model", "run start", "set-up", "training", "dev evaluation",
          "best/ written", "checkpoints", "final evaluations", "inference bench", "outputs", "other")


def child(overrides: list[str], started: float) -> None:
    """In the job's process: wrap the phases' functions, run the command, print the seconds."""
    import pipeline.cli  # the command's imports (torch, transformers, mlflow...) happen here
    from pipeline import models
    from pipeline.job import loop, resume, run, stage
    from pipeline.job.parts.best_model import BestModel
    from pipeline.job.parts.checkpoint import Checkpointer
    from pipeline.job.records import stage_outputs
    from pipeline.job.records.metrics import MetricsProcessor
    from pipeline.tracking.tracker import Tracker

    seconds = dict.fromkeys(PHASES, 0.0)
    seconds["start-up"] = time.time() - started
    active = []

    def timed(owner, attribute, phase, pick=None):
        original = getattr(owner, attribute)

        def wrapper(*args, **kwargs):
            if active:  # inside another phase: counted there
                return original(*args, **kwargs)
            name = pick(args, kwargs) if pick else phase
            active.append(name)
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - t0
                active.pop()
        setattr(owner, attribute, wrapper)

    timed(run, "settle", "settle")
    timed(resume, "decide", "settle")
    timed(stage.features, "prepare_train", "data")
    timed(stage.features, "prepare_features", "data")
    timed(models, "build", "model")
    timed(resume.Resume, "start_over", "run start")
    timed(run, "start_stage_run", "run start")
    timed(Tracker, "set_tags", "run start")
    timed(Tracker, "log_datasets", "run start")
    timed(loop, "setup", "set-up")
    timed(loop, "train_epoch", "training")
    timed(loop, "evaluate", "", pick=lambda a, k: "final evaluations" if k.get("keep") else "dev evaluation")
    timed(BestModel, "consider", "best/ written")
    timed(Checkpointer, "save", "checkpoints")
    timed(stage.Stage, "bench_inference", "inference bench")
    timed(MetricsProcessor, "log_final", "outputs")
    for function in ("write_predictions", "write_outputs", "announce"):
        timed(stage_outputs, function, "outputs")
    timed(Tracker, "end", "outputs")
    seconds["start-up"] = time.time() - started  # the interpreter and the imports above
    code = pipeline.cli.main(["train", *overrides])
    print("PHASES " + json.dumps({"exit_code": code, **seconds}), flush=True)


def job(overrides: list[str], threads: int) -> dict:
    """One job in its own process and working directory; its phases and wall seconds."""
    cwd = Path(tempfile.mkdtemp(dir=WORK))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads),
           "PIPELINE_CACHE": str(WORK / "cache")}
    started = time.time()
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(started), *JOB,
                           f"output_dir={cwd / 'out'}", *overrides], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.time() - started
    line = next((l for l in done.stdout.splitlines() if l.startswith("PHASES ")), None)
    if done.returncode or line is None:
        raise SystemExit(f"job failed ({done.returncode}): {done.stderr[-2000:]}")
    phases = json.loads(line[len("PHASES "):])
    phases["other"] = wall - sum(v for k, v in phases.items() if k in PHASES)
    return {"wall_s": wall, **{k: phases[k] for k in PHASES}}


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[3:], float(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--overrides", nargs="*", default=[])
    parser.add_argument("--name", default="job_time-wikiqa")
    args = parser.parse_args()
    runs = []
    for rep in range(args.reps):  # the first job also fills the prepared-features cache
        runs.append(job(args.overrides, args.threads))
        print(f"  rep {rep + 1}/{args.reps}: " + ", ".join(f"{k} {v:.1f}s" for k, v in runs[-1].items()), flush=True)
    rows = []
    for phase in ("wall_s", *PHASES):
        values = [r[phase] for r in runs]
        rows.append({"phase": phase, "seconds (median)": statistics.median(values),
                     "share of wall": statistics.median(v / r["wall_s"] for v, r in zip(values, runs)),
                     "per rep": " ".join(f"{v:.1f}" for v in values)})
    save(args.name, rows, ["phase", "seconds (median)", "share of wall", "per rep"],
         {"job": JOB, "overrides": args.overrides, "threads": args.threads}, {"jobs": runs})


if __name__ == "__main__":
    main()
