"""The pipeline vs the Hugging Face Trainer end to end on long-tailed real-length comments
(common.long_sentiment_file), each with its own defaults and then each at its best settings:
same model (the pipeline's factory, same seed), precision and epochs; full runs, one seed per
repetition, dev macro-F1 of the best epoch compared against the spread between seeds, and every
dev metric's mean and spread (the epoch each side's model selection keeps, by the pipeline's rule).

Contenders:
- pipeline defaults: `train task=sentiment` as shipped (batch 16, lr 3e-4 for a preset, warm-up
  0.1, weight decay 0.01, length grouping: the sentiment task's default);
- pipeline defaults without grouping: the same with train.group_by_length=false (does
  grouping change the dev score beyond the seed spread?);
- Trainer defaults: TrainingArguments as shipped (batch 8, lr 5e-5, no warm-up, no weight decay,
  fused AdamW, random sampling);
- best: both at batch 32, lr 3e-4, warm-up 0.1, weight decay 0.01, length grouping;
- pipeline bf16-pure: the defaults with precision=bf16-pure (bf16 module weights, fp32 masters in
  the optimizer): bf16 devices only, so run only when --only names it;
- Trainer compiled: `torch_compile=True` with the pipeline's recipe (batch, lr 3e-4, warm-up 0.1,
  weight decay 0.01, random sampling): the Trainer as a user who wants speed on a GPU runs it.
Throughput: training steps only (the Trainer's evaluations subtracted, as the pipeline counts), and
for both sides the time Dynamo spent compiling left out (its own clock, the same for both).
Target: pipeline defaults >= 1.25x the Trainer's samples/s at an equal dev score; on a GPU against
the compiled Trainer in bf16.
    python benchmarks/bench_vs_trainer.py [--seeds 3] [--epochs 2] [--precision bf16]
    python benchmarks/bench_vs_trainer.py --precision bf16 --only "pipeline defaults" "Trainer compiled"  # a GPU
With --only, the results file names the contenders run: vs_trainer-bf16-pipeline-trainer-compiled-MACHINE-DATE.json.
"""
import re
import statistics

import torch

import trainer_contender
from common import alternate, build_model, long_sentiment_file, parser, pipeline_run, quiet, save

TASK, MODEL = "sentiment", "preset:bangla-small"
DEV_METRICS = ("macro_f1", "micro_f1", "accuracy")
"""The task's metrics, each side's selected epoch's (the pipeline's rule on both: the main metric, then its
tie-breakers): every one's mean and spread over the seeds is reported."""
BEST = {"batch_size": 32, "lr": 3e-4, "warmup": 0.1, "weight_decay": 0.01, "grouped": True}


def pipeline(args, seed: int, overrides: list[str]) -> dict:
    torch._dynamo.reset()
    figures = pipeline_run([f"task={TASK}", f"model={MODEL}", f"data.train={long_sentiment_file()}",
                            "data.dev=samples", "data.test=samples",
                            f"precision={args.precision}", f"train.epochs={args.epochs}", f"seed={seed}",
                            f"train.max_length={args.max_length}", "train.log_every=1000", *overrides])
    return {"samples_per_s": figures["perf/train_samples_per_s"], "compile_s": figures.get("perf/compile_s", 0.0),
            **{f"dev_{name}": figures[f"eval/{name}"] for name in DEV_METRICS}}


def trainer(args, seed: int, best: bool, compiled: bool = False) -> dict:
    """The Trainer as shipped (TrainingArguments' defaults), at the best settings (grouped), or
    compiled on the pipeline's recipe at --batch-size."""
    torch._dynamo.reset()
    task, _, tokenizer, model, features = build_model(TASK, MODEL, args.max_length, seed,
                                                      train=str(long_sentiment_file()))

    def compute_metrics(prediction):
        # the labels in the order the Trainer evaluated: with group_by_length it reorders the dev set too
        return task.metrics({"logits": prediction.predictions}, [{"label": int(y)} for y in prediction.label_ids],
                            None)

    tuned = {}
    if best:
        tuned = trainer_contender.recipe(BEST["batch_size"], BEST["lr"], BEST["warmup"], BEST["weight_decay"])
    if compiled:  # the pipeline's recipe, compiled
        tuned = {**trainer_contender.recipe(args.batch_size, BEST["lr"], BEST["warmup"], BEST["weight_decay"]),
                 "torch_compile": True}
    done = trainer_contender.run(model, tokenizer, features["train"], precision=args.precision, seed=seed,
                                 epochs=args.epochs, eval_set=features["dev"], compute_metrics=compute_metrics,
                                 group_by_length=best and BEST["grouped"], **tuned)
    selected = done.selected((task.main_metric, *task.tie_breakers))
    return {"samples_per_s": done.samples_per_s, "compile_s": done.compile_s,
            **{f"dev_{name}": selected[name] for name in DEV_METRICS}}


def slug(contender: str) -> str:
    """A contender in a results file's name: "Trainer compiled" -> trainer-compiled, "pipeline
    defaults" -> pipeline."""
    return re.sub(r"[^a-z0-9]+", "-", contender.lower().replace("defaults", "")).strip("-")


def summary(runs: list[dict]) -> dict:
    row = {"samples/s": statistics.median(r["samples_per_s"] for r in runs),
           "samples/s spread": max(r["samples_per_s"] for r in runs) - min(r["samples_per_s"] for r in runs),
           "compile s": statistics.median(r.get("compile_s", 0.0) for r in runs)}
    for name in DEV_METRICS:
        scores = [r[f"dev_{name}"] for r in runs]
        label = "dev macro-F1" if name == "macro_f1" else f"dev {name}"
        row.update({label: statistics.mean(scores), f"{label} spread": max(scores) - min(scores)})
    return row


def main():
    options = parser(__doc__, batch_size=16)
    options.add_argument("--seeds", type=int, default=3)
    options.add_argument("--epochs", type=int, default=2)
    options.add_argument("--only", nargs="*", help="run only these contenders (names as in the table)")
    args = options.parse_args()
    quiet()
    best = [f"train.batch_size={BEST['batch_size']}", f"train.lr={BEST['lr']}", "train.group_by_length=true"]
    contenders = {
        "pipeline defaults": lambda seed: pipeline(args, seed, []),
        "pipeline defaults without grouping": lambda seed: pipeline(args, seed, ["train.group_by_length=false"]),
        "Trainer defaults": lambda seed: trainer(args, seed, best=False),
        "pipeline best": lambda seed: pipeline(args, seed, best),
        "Trainer best": lambda seed: trainer(args, seed, best=True),
        "Trainer compiled": lambda seed: trainer(args, seed, best=False, compiled=True),
    }
    if "pipeline bf16-pure" in (args.only or []):  # a bf16 device only: run when named
        contenders["pipeline bf16-pure"] = lambda seed: pipeline(args, seed, ["precision=bf16-pure"])
    if args.only:  # a part of the table
        contenders = {name: fn for name, fn in contenders.items() if name in args.only}
    # one seed per round, the same seed for every contender in it: the seed spread is the noise
    seeds = {name: iter(range(args.seeds)) for name in contenders}
    runs = alternate({name: (lambda name=name, fn=fn: fn(next(seeds[name]))) for name, fn in contenders.items()},
                     args.seeds)
    rows = [{"contender": name, **summary(r)} for name, r in runs.items()]
    by_name = {row["contender"]: row for row in rows}
    baseline = "Trainer compiled" if "Trainer compiled" in by_name else "Trainer defaults"
    result = f"vs_trainer-{args.precision}"
    if args.only:  # a part of the table: the results file names its contenders
        result += "".join(f"-{slug(c)}" for c in contenders)
    if not {"pipeline defaults", baseline} <= set(by_name):  # no target to judge
        save(result, rows, list(rows[0]), vars(args), runs)
        return

    def paired(a, b):  # median of per-seed ratios (the two ran in the same round)
        return statistics.median(x["samples_per_s"] / y["samples_per_s"] for x, y in zip(runs[a], runs[b]))

    for row in rows:
        other = "Trainer best" if "best" in row["contender"] else baseline
        if row["contender"].startswith("pipeline") and other in runs:
            row["vs Trainer"] = f"{paired(row['contender'], other):.3g}x {other}"
    mine, theirs = by_name["pipeline defaults"], by_name[baseline]
    spread = max(mine["dev macro-F1 spread"], theirs["dev macro-F1 spread"])
    gap = mine["dev macro-F1"] - theirs["dev macro-F1"]
    equal = gap >= -spread  # at an equal score: not lower by more than the seed spread
    speed = paired("pipeline defaults", baseline)
    verdict = "met" if speed >= 1.25 and equal else "missed"
    mine["target"] = (f">= 1.25x {baseline} at an equal score: {verdict} ({speed:.2f}x; dev macro-F1 "
                      f"{mine['dev macro-F1']:.3f} vs {theirs['dev macro-F1']:.3f}, {gap:+.3f} with a seed spread "
                      f"of {spread:.3f})")
    if "pipeline defaults without grouping" in by_name:
        grouped, plain = by_name["pipeline defaults"], by_name["pipeline defaults without grouping"]
        plain["target"] = (f"grouping moves dev macro-F1 by {grouped['dev macro-F1'] - plain['dev macro-F1']:+.3f} "
                           f"(seed spread {max(plain['dev macro-F1 spread'], grouped['dev macro-F1 spread']):.3f})")
    columns = ["contender", "samples/s", "samples/s spread", "dev macro-F1", "dev macro-F1 spread",
               "dev micro_f1", "dev micro_f1 spread", "dev accuracy", "dev accuracy spread", "compile s",
               "vs Trainer", "target"]
    save(result, rows, columns, vars(args), runs)


if __name__ == "__main__":
    main()
