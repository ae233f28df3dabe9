"""Pipeline overhead vs a bare PyTorch loop, and the pipeline vs the Hugging Face Trainer.

Same model (built by the pipeline's model factory, same seed: common.build_model), same features
(the long-tailed sentiment comments of common.long_sentiment_file), same batch, precision, AdamW +
linear warm-up/decay and clipping; the Trainer is trainer_contender.run on the pipeline's recipe.
Throughput: training steps only (no evaluation), each timed from the first batch drawn to the last
optimizer step.
Targets: pipeline within 5% of the bare loop; at least equal to the Trainer, with the same dev
score within noise (full runs of --score-epochs epochs, best dev epoch of each, one seed per
repetition).
    python benchmarks/bench_overhead.py [--reps 3] [--steps 60] [--precision bf16]
"""
import statistics
import time

import torch
import transformers
from torch.utils.data import DataLoader

import trainer_contender
from common import (
    alternate,
    bare_step,
    build_model,
    long_sentiment_file,
    median,
    parser,
    pipeline_run,
    quiet,
    ratio,
    save,
)

TASK, MODEL, LR = "sentiment", "preset:bangla-small", 3e-4


def build(max_length, seed=0):
    """The model, tokenizer and features every contender starts from."""
    return build_model(TASK, MODEL, max_length, seed, train=str(long_sentiment_file()))


def bare_loop(args) -> dict:
    """The loop a user would write by hand: no logging, no checks, no host syncs."""
    from pipeline.job.parts.optim import param_groups

    task, _, tokenizer, model, features = build(args.max_length)
    loader = DataLoader(features["train"], batch_size=args.batch_size, shuffle=True,
                        collate_fn=task.collator(tokenizer), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=LR)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, int(0.1 * args.steps), args.steps)
    model.train()
    samples, start = 0, time.perf_counter()
    for step, batch in enumerate(loader):
        bare_step(model, optimizer, batch, args.precision)
        scheduler.step()
        samples += len(batch["input_ids"])
        if step + 1 == args.steps:
            break
    return {"samples_per_s": samples / (time.perf_counter() - start)}


def trainer(args, epochs: int | None = None, seed: int = 0) -> dict:
    """The Trainer on the pipeline's recipe: --steps steps, or whole epochs evaluated after each."""
    task, examples, tokenizer, model, features = build(args.max_length, seed)

    def compute_metrics(prediction):
        return task.metrics({"logits": prediction.predictions}, examples["dev"], features["dev"])

    done = trainer_contender.run(
        model, tokenizer, features["train"], precision=args.precision, seed=seed, epochs=epochs,
        max_steps=None if epochs else args.steps, eval_set=features["dev"] if epochs else None,
        compute_metrics=compute_metrics if epochs else None, per_device_eval_batch_size=64,
        **trainer_contender.recipe(args.batch_size, LR))
    figures = {"samples_per_s": done.samples_per_s}
    if epochs:
        figures["dev_macro_f1"] = done.selected((task.main_metric, *task.tie_breakers))["macro_f1"]
    return figures


def pipeline(args, epochs: int | None = None, seed: int = 0) -> dict:
    limit = [f"train.epochs={epochs}"] if epochs else [f"train.max_steps={args.steps}"]
    limit.append(f"seed={seed}")
    figures = pipeline_run([f"task={TASK}", f"model={MODEL}", f"data.train={long_sentiment_file()}",
                            "data.dev=samples", "data.test=samples", f"train.lr={LR}",
                            f"precision={args.precision}",
                            f"train.batch_size={args.batch_size}", f"train.max_length={args.max_length}",
                            "train.log_every=1000", *limit])
    return {"samples_per_s": figures["perf/train_samples_per_s"], "dev_macro_f1": figures["eval/macro_f1"]}


def main():
    options = parser(__doc__)
    options.add_argument("--steps", type=int, default=60)
    options.add_argument("--score-epochs", type=int, default=3, help="full runs for the dev-score comparison (0: skip)")
    options.add_argument("--score-reps", type=int, default=3)
    args = options.parse_args()
    quiet()

    print(f"throughput: pipeline vs bare loop vs Trainer, {args.reps} reps of {args.steps} steps")
    speed = alternate({"pipeline": lambda: pipeline(args), "bare loop": lambda: bare_loop(args),
                       "HF Trainer": lambda: trainer(args)}, args.reps)
    key = "samples_per_s"
    rows = [{"contender": name, "samples/s": median(runs, key),
             "pipeline / contender": ratio(speed["pipeline"], runs, key)} for name, runs in speed.items()]
    runs = {"throughput": speed}
    if args.score_epochs:
        print(f"dev score: pipeline vs Trainer, {args.score_reps} reps of {args.score_epochs} epochs")
        # each repetition a new seed (model init, data order, dropout), the same for both: the
        # spread between seeds is the noise the dev scores are compared against
        seeds = {name: iter(range(args.score_reps)) for name in ("pipeline", "HF Trainer")}
        score = alternate({"pipeline": lambda: pipeline(args, args.score_epochs, next(seeds["pipeline"])),
                           "HF Trainer": lambda: trainer(args, args.score_epochs, next(seeds["HF Trainer"]))},
                          args.score_reps)
        runs["score"] = score
        for row in rows:
            if row["contender"] in score:
                values = [r["dev_macro_f1"] for r in score[row["contender"]]]
                row["dev macro-F1 (full runs)"] = statistics.mean(values)
                row["dev macro-F1 spread"] = max(values) - min(values)
                row["samples/s (full runs)"] = median(score[row["contender"]], key)
    slower = 1 - rows[1]["pipeline / contender"]
    per_rep = [a[key] / b[key] for a, b in zip(speed["pipeline"], speed["bare loop"])]
    verdict = "met" if slower <= 0.05 else "missed"
    if max(per_rep) - min(per_rep) > 0.1:  # the repetitions disagree by more than the target
        verdict = f"not resolvable (per-repetition ratios {min(per_rep):.2f}-{max(per_rep):.2f})"
    rows[1]["target"] = f"within 5%: {verdict} " + \
        (f"(pipeline {slower:.1%} slower)" if slower > 0 else f"(pipeline {-slower:.1%} faster)")
    verdicts = [rows[2]["pipeline / contender"] >= 1]
    if args.score_epochs:  # the full runs count too
        full = ratio(score["pipeline"], score["HF Trainer"], key)
        rows[2]["pipeline / contender (full runs)"] = full
        verdicts.append(full >= 1)
    rows[2]["target"] = f"at least equal: {'met' if all(verdicts) else 'missed'}"
    save(f"overhead-{args.precision}", rows, ["contender", "samples/s", "pipeline / contender",
                                             "dev macro-F1 (full runs)", "dev macro-F1 spread",
                                             "samples/s (full runs)", "pipeline / contender (full runs)", "target"],
         vars(args), runs)


if __name__ == "__main__":
    main()
