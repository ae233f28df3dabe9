"""The training step itself, the pipeline vs the Hugging Face Trainer, with identical settings on
both sides: all-MiniLM-L6-v2 on the built-in WikiQA set, batch 16, lr 1e-4, linear warm-up 0.1,
weight decay 0.01, clipping at 1.0, fused AdamW, the same max_steps, no evaluation or saving in
the timed window (the pipeline counts training steps only; the Trainer evaluates nothing here).
fp32 and bf16 alternate with the two contenders, one torch thread each (`--threads`).
The question: does the pipeline's bf16 path cost more than the Trainer's (bf16 gain per side)?
    python benchmarks/bench_step_vs_trainer.py [--steps 100] [--reps 3] [--precisions fp32,bf16]
"""
import argparse
import statistics

import torch

import trainer_contender
from common import build_model, markdown_table, pipeline_run, quiet, save

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
BATCH, LR, MAX_LENGTH = 16, 1e-4, 128


def trainer(precision: str, steps: int, seed: int) -> float:
    _, _, tokenizer, model, features = build_model("wikiqa", MODEL, MAX_LENGTH, seed, splits=("train",))
    done = trainer_contender.run(model, tokenizer, features["train"], precision=precision, seed=seed,
                                 max_steps=steps, **trainer_contender.recipe(BATCH, LR))
    return done.samples_per_s


def pipeline(precision: str, steps: int, seed: int) -> float:
    figures = pipeline_run(["task=wikiqa", f"model={MODEL}", f"train.batch_size={BATCH}", f"train.lr={LR}",
                            "train.warmup_ratio=0.1", "train.weight_decay=0.01", f"train.max_steps={steps}",
                            f"precision={precision}", f"seed={seed}"])
    return figures["perf/train_samples_per_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(args.threads)
    runs: dict[str, list[float]] = {}
    for rep in range(args.reps):
        for precision in args.precisions.split(","):
            sides = ("pipeline", "Trainer") if rep % 2 == 0 else ("Trainer", "pipeline")  # who goes first alternates
            for side in sides:
                speed = (pipeline if side == "pipeline" else trainer)(precision, args.steps, seed=0)
                runs.setdefault(f"{side} {precision}", []).append(speed)
                print(f"rep {rep + 1} {side} {precision}: {speed:.2f} samples/s", flush=True)
    rows = []
    for precision in args.precisions.split(","):
        mine, theirs = runs[f"pipeline {precision}"], runs[f"Trainer {precision}"]
        rows.append({"precision": precision, "pipeline samples/s": statistics.median(mine),
                     "Trainer samples/s": statistics.median(theirs),
                     "pipeline / Trainer (paired median)": statistics.median(a / b for a, b in zip(mine, theirs)),
                     "per rep": ", ".join(f"{a / b:.2f}" for a, b in zip(mine, theirs))})
    if "fp32" in args.precisions and "bf16" in args.precisions:
        for side in ("pipeline", "Trainer"):
            gains = [b / f for b, f in zip(runs[f"{side} bf16"], runs[f"{side} fp32"])]
            rows.append({"precision": f"{side}: bf16 / fp32", "pipeline / Trainer (paired median)":
                         statistics.median(gains), "per rep": ", ".join(f"{g:.2f}" for g in gains)})
    columns = ["precision", "pipeline samples/s", "Trainer samples/s", "pipeline / Trainer (paired median)", "per rep"]
    save("step_vs_trainer", rows, columns, vars(args), runs)
    print(markdown_table(rows, columns))


if __name__ == "__main__":
    main()
