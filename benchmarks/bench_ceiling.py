"""The paper's memory-ceiling experiment: under a memory cap, the largest micro-batch each precision
reaches with and without activation checkpointing (train.batch_size=auto, train.memory_limit_mb,
train.gradient_checkpointing), then a short job at that ceiling: batch reached, peak memory, samples/s.
The paper (an RTX 4070, 12 GB) raised the batch 16 -> 32 -> 64 -> 128: "batch 128 fits with AMP,
OOM with FP32". The global batch is 16 x --grad-accum rows (the finder splits it), so the ceiling
can reach that many rows.

Each cell is its own process (`python -m pipeline train` in this script's --cell mode): its peak
memory is its own (CPU: the process's peak RSS; GPU: the allocator's peak). --margin adds, per cell,
a second run of the same job whose tensors are counted from start to end (measure/memory.py's
TensorBytes, after the finder): the job's peak against the finder's trial peak is the safety margin
actually used (CPU only: on a GPU the allocator's peak of the timed run is that figure).

Part two (--checkpointing): the cost of train.gradient_checkpointing at one fixed batch on long
sequences, alternating on/off in fresh processes: peak RSS (CPU) or peak allocated (GPU) and
training samples/s, medians over --reps.

    python benchmarks/bench_ceiling.py --cap-mb 384 --margin --checkpointing      # CPU, bangla-small at 256
    python benchmarks/bench_ceiling.py --model preset:bert-base --max-length 256 --cap-mb 12288 \\
        --grad-accum 16 --precisions fp32,tf32,fp16,bf16 --checkpointing          # a GPU as the paper's 12 GB card
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, WORK, long_sentiment_file, median, ratio, save

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def cell_overrides(args, precision: str, checkpointing: bool, max_length: int, data: Path) -> list[str]:
    return [f"model={args.model}", f"train.max_length={max_length}", f"precision={precision}",
            f"data.train={data}", "data.dev=samples", "data.test=samples",
            f"train.gradient_checkpointing={str(checkpointing).lower()}",
            "train.lr=1e-4", "train.log_every=1", "tracking.system_metrics=false"]


def run_cell(overrides: list[str], counted: bool = False) -> dict:
    """One job in a fresh process (this script's --cell mode); its figures, or its refusal."""
    out = Path(tempfile.mkdtemp(dir=WORK))
    command = [sys.executable, __file__, "--cell", json.dumps([*overrides, f"output_dir={out}",
                                                               f"tracking.uri=sqlite:///{WORK / 'mlflow.db'}"])]
    if counted:
        command.append("--counted")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        return {"refused": (error or done.stderr.strip().splitlines()[-1:] or ["failed"])[0][:300]}
    return json.loads(lines[-1])


def cell_main(overrides: list[str], counted: bool) -> None:
    """--cell: a job in this process; prints the finder's choice and the job's figures as JSON.
    --counted: every tensor counted from the finder's end to the job's (TensorBytes)."""
    import contextlib

    from pipeline import names
    from pipeline.config import load_config
    from pipeline.job import batch_finder
    from pipeline.job.run import run
    from pipeline.measure import batch_fit
    from pipeline.measure.memory import MIB, TensorBytes

    found = {}
    counter = TensorBytes([], 2**62) if counted else None
    real_find, real_fit = batch_fit.find, batch_finder.fit_batch

    def find(*args, **kwargs):
        fit = real_find(*args, **kwargs)
        found.update(vars(fit))
        return fit

    def fit_batch(stage):
        fitted = real_fit(stage)
        if counter is not None:
            counter.peak = counter.live  # the job's own peak from here on, not the trials'
        return fitted

    batch_fit.find, batch_finder.fit_batch = find, fit_batch
    with counter if counter is not None else contextlib.nullcontext():
        final = run(load_config(None, overrides))
    figures = {"samples_per_s": final[names.SAMPLES_PER_S], "peak_rss_mb": final.get(names.PEAK_RSS),
               "peak_allocated_mb": final.get(names.PEAK_MEM_ALLOCATED), **found}
    if counter is not None:
        figures["job_tensor_peak_mb"] = counter.peak / MIB
    print(json.dumps(figures, default=float))


def ceiling_table(args) -> tuple[list[dict], dict]:
    import torch

    from pipeline.errors import UserError
    from pipeline.runtime import precision as policies

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows, runs = [], {}
    for precision in args.precisions.split(","):
        try:
            policies.resolve(precision, device)
            cpu_tf32 = precision == "tf32" and device.type == "cpu"
            refused = "no TF32 on a CPU (the same fp32 kernels)" if cpu_tf32 else None
        except UserError as e:
            refused = str(e).split(": ", 1)[-1]
        for checkpointing in (False, True):
            row = {"precision": precision, "checkpointing": "on" if checkpointing else "off"}
            if refused:
                rows.append({**row, "batch reached": f"n/a ({refused})"})
                continue
            overrides = [*cell_overrides(args, precision, checkpointing, args.max_length, long_sentiment_file()),
                         "train.batch_size=auto",
                         f"train.grad_accum={args.grad_accum}", f"train.memory_limit_mb={args.cap_mb}",
                         f"train.max_steps={args.steps}"]
            print(f"{precision} checkpointing={row['checkpointing']}", flush=True)
            timed = run_cell(overrides)
            runs[f"{precision}-{row['checkpointing']}"] = [timed]
            if "refused" in timed:
                rows.append({**row, "batch reached": f"none: {timed['refused']}"})
                continue
            peak = timed["peak_allocated_mb"] if device.type == "cuda" else timed["peak_rss_mb"]
            row.update({"batch reached": timed["largest"], "micro x accum": f"{timed['batch_size']} x "
                        f"{timed['grad_accum']}", "trial peak MiB": round(timed["peak_mb"], 1),
                        "eval batch": timed["eval_batch_size"],
                        ("peak allocated MiB" if device.type == "cuda" else "peak RSS MiB"): round(peak, 1),
                        "samples/s": round(timed["samples_per_s"], 2)})
            if args.margin and device.type == "cpu":
                counted = run_cell(overrides, counted=True)
                runs[f"{precision}-{row['checkpointing']}"].append(counted)
                if "job_tensor_peak_mb" in counted:
                    trial = max(counted["peak_mb"], counted["eval_peak_mb"])
                    row["job tensor peak MiB"] = round(counted["job_tensor_peak_mb"], 1)
                    row["job / trial peak"] = round(counted["job_tensor_peak_mb"] / trial, 3)
            rows.append(row)
    return rows, runs


def checkpointing_cost(args) -> tuple[list[dict], dict]:
    """One fixed batch of rows all --cost-length long, checkpointing off and on alternating, each job
    a fresh process."""
    runs = {"off": [], "on": []}
    long_rows = long_sentiment_file(rows=400, median_words=args.cost_length, sigma=0.05)
    for rep in range(args.reps):
        for state in (("off", "on") if rep % 2 == 0 else ("on", "off")):
            overrides = [*cell_overrides(args, args.cost_precision, state == "on", args.cost_length, long_rows),
                         f"train.batch_size={args.cost_batch}", f"train.max_steps={args.steps}"]
            figures = run_cell(overrides)
            print(f"  rep {rep + 1}/{args.reps} checkpointing {state}: {figures}", flush=True)
            runs[state].append(figures)
    peak_key = "peak_allocated_mb" if runs["off"][0].get("peak_allocated_mb") else "peak_rss_mb"
    rows = [{"checkpointing": state, "batch": args.cost_batch, "peak MiB": round(median(runs[state], peak_key), 1),
             "samples/s": round(median(runs[state], "samples_per_s"), 2)} for state in ("off", "on")]
    rows.append({"checkpointing": "on / off", "batch": args.cost_batch,  # medians of per-repetition ratios
                 "peak MiB": round(ratio(runs["on"], runs["off"], peak_key), 3),
                 "samples/s": round(ratio(runs["on"], runs["off"], "samples_per_s"), 3)})
    return rows, runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="preset:bangla-small")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--cap-mb", type=int, default=384)
    p.add_argument("--grad-accum", type=int, default=8, help="global batch = 16 x this: the highest ceiling")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--steps", type=int, default=3, help="optimizer steps of each short job")
    p.add_argument("--margin", action="store_true", help="CPU: also count the job's tensors (a second run)")
    p.add_argument("--checkpointing", action="store_true", help="also the fixed-batch cost of checkpointing")
    p.add_argument("--cost-batch", type=int, default=16)
    p.add_argument("--cost-length", type=int, default=512, help="every row of the cost runs this many tokens")
    p.add_argument("--cost-precision", default="fp32")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cell", help=argparse.SUPPRESS)
    p.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.cell:
        return cell_main(json.loads(args.cell), args.counted)
    settings = {k: v for k, v in vars(args).items() if k not in ("cell", "counted")}
    rows, runs = ceiling_table(args)
    columns = ["precision", "checkpointing", "batch reached", "micro x accum", "trial peak MiB", "eval batch",
               "peak allocated MiB", "peak RSS MiB", "samples/s", "job tensor peak MiB", "job / trial peak"]
    save(f"ceiling-{args.max_length}-cap{args.cap_mb}", rows, [c for c in columns if any(c in r for r in rows)],
         settings, runs)
    if args.checkpointing:
        cost_rows, cost_runs = checkpointing_cost(args)
        save(f"checkpointing-{args.cost_length}-batch{args.cost_batch}", cost_rows,
             ["checkpointing", "batch", "peak MiB", "samples/s"], settings, cost_runs)


if __name__ == "__main__":
    main()
