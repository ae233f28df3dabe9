"""DDP: 2 processes vs 1 on the same global batch, and the all-reduce share of a step.

The long-tailed sentiment comments of common.long_sentiment_file. Throughput: the real
launchers (`python -m pipeline train` vs `torchrun --nproc_per_node 2`),
global batch --batch-size in both, perf/train_samples_per_s from metrics.json. The all-reduce
share: under torchrun, the same DDP model times steps with the gradient all-reduce and steps
under no_sync() (none), alternating; share = 1 - t(no_sync) / t(sync).
On one machine the processes share its cores (torchrun gives each 1 thread unless
OMP_NUM_THREADS is set), so the ratio says what DDP costs here, not what more GPUs give.
    python benchmarks/bench_ddp.py [--reps 3] [--steps 30]
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

from common import ROOT, WORK, alternate, long_sentiment_file, median, parser, quiet, ratio, save

MODEL = "preset:bangla-small"


def stage(nproc: int, args) -> dict:
    out = Path(tempfile.mkdtemp(dir=WORK))
    overrides = ["task=sentiment", f"model={MODEL}", f"data.train={long_sentiment_file()}",
                 "data.dev=samples", "data.test=samples",
                 f"train.batch_size={args.batch_size // nproc}",
                 f"train.max_steps={args.steps}", f"train.max_length={args.max_length}", f"precision={args.precision}",
                 "train.log_every=1000", f"output_dir={out}", f"tracking.uri=sqlite:///{out}/m.db",
                 "tracking.system_metrics=false"]
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "-m"] if nproc > 1 else \
        [sys.executable, "-m"]
    done = subprocess.run([*launcher, "pipeline", "train", *overrides], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise SystemExit(f"{nproc}-process run failed:\n{done.stderr[-3000:]}")
    return {"samples_per_s": json.loads((out / "metrics.json").read_text())["perf/train_samples_per_s"]}


def probe(args) -> None:
    """Under torchrun: time DDP steps with and without the gradient all-reduce."""
    import torch
    import torch.distributed as torch_dist
    import transformers
    from torch.nn.parallel import DistributedDataParallel

    from pipeline import models
    from pipeline.tasks import get_task

    torch_dist.init_process_group("gloo")
    task = get_task("sentiment")
    examples = task.load(str(long_sentiment_file()), "train")
    transformers.set_seed(0)
    tokenizer, model = models.build(MODEL, task, task.texts(examples), {}, args.max_length)
    features = task.featurize(examples[: args.batch_size], tokenizer, args.max_length, "train")
    batch = task.collator(tokenizer)([features[i] for i in range(len(features))][torch_dist.get_rank()::2])
    batch.pop("idx")
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(sync: bool) -> float:
        torch_dist.barrier()
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = ddp(**batch).loss
        if sync:
            loss.backward()
        else:
            with ddp.no_sync():
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    step(True), step(False)  # warm-up
    timings = {True: [], False: []}
    for _ in range(args.steps):
        for sync in (True, False):
            timings[sync].append(step(sync))
    if torch_dist.get_rank() == 0:
        share = 1 - statistics.median(timings[False]) / statistics.median(timings[True])
        Path(args.probe).write_text(json.dumps({"step_s_sync": statistics.median(timings[True]),
                                                "step_s_no_sync": statistics.median(timings[False]),
                                                "allreduce_share": share}))
    torch_dist.destroy_process_group()


def main():
    options = parser(__doc__)  # --batch-size is the global batch
    options.add_argument("--steps", type=int, default=30)
    options.add_argument("--probe", help=argparse.SUPPRESS)  # internal: the all-reduce probe under torchrun
    args = options.parse_args()
    quiet()
    if args.probe:
        return probe(args)
    print(f"1 vs 2 processes, global batch {args.batch_size}, {args.reps} reps of {args.steps} steps")
    result = alternate({"1 process": lambda: stage(1, args), "2 processes (DDP)": lambda: stage(2, args)}, args.reps)
    path = WORK / "probe.json"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", __file__, "--probe", str(path),
                    f"--steps={args.steps}", f"--batch-size={args.batch_size}", f"--max-length={args.max_length}",
                    f"--precision={args.precision}"], cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    share = json.loads(path.read_text())
    one = result["1 process"]
    rows = [{"launch": name, "samples/s": median(runs, "samples_per_s"),
             "vs 1 process": ratio(runs, one, "samples_per_s")} for name, runs in result.items()]
    rows[1].update({"all-reduce share of a step": share["allreduce_share"], "step s (sync)": share["step_s_sync"],
                    "step s (no_sync)": share["step_s_no_sync"]})
    save(f"ddp-{args.precision}", rows, ["launch", "samples/s", "vs 1 process", "all-reduce share of a step",
                                        "step s (sync)", "step s (no_sync)"], vars(args), {**result, "probe": share})


if __name__ == "__main__":
    main()
